//! Rebuild: brings a slot's new member (a spare that took over, a re-added or added member, or a replacement
//! being built beside a member that still serves) in sync, on a background thread while the array serves.
//!
//! The target's data area is rebuilt in batches of whole rows (up to 64 rows and 4 MiB of the target each, at
//! most 32 MiB of buffers). Several batches are in flight at once, one per worker thread (each with its own
//! buffers and io_uring): while one batch's survivors are read, another's parity is recovered and its target
//! written, so the survivors and the target all stay busy. Each batch holds the stripe locks of its rows from
//! its reads to its commit: a foreground write to those rows waits, and one to a row below the progress
//! (`target_rows`) also goes to the target (`Array::write_targets`), one above skips it: the batch that reaches
//! that row later reads what the write left. Batches commit (advance `target_rows`) strictly in row order.
//! RAID5/6 rows are read from every other active member (RAID6 with only this slot missing leaves out the Q
//! that a row does not need) and recovered through the parity backend's batch call;
//! RAID1/10 cells are copied from another copy; a replacement whose old member is still active copies from it.
//!
//! The checkpoint (slot state `rebuilding` and `recovery_offset_bytes` in every superblock) is written every
//! 64 MiB or second and when the array stops: a restart resumes there.
//!
//! A member back in the slot it left (a re-add, members.rs `returning_member`) holds the array's bytes wherever
//! the write-intent bitmap marks no write since it left (below the checkpoint of its own rebuild, if it left in
//! the middle of one): its batches are one bitmap region at most, and a batch there whose regions are all
//! unmarked under its stripe locks is committed without I/O (`Progress::in_sync_bytes`).
//!
//! A survivor that cannot read a page (a latent sector error) is one more erasure for that page: RAID6 still
//! recovers it (and rewrites the survivor's page); RAID5 cannot, and records exactly the array bytes now
//! unreadable in `Progress::unreadable`. Such a rebuild never activates its target (nothing guessed is served):
//! the slot stays `rebuilding` with its checkpoint before the first unreadable row, and the array keeps serving
//! every other byte. Another member failing during the rebuild just leaves it out (RAID6), or takes the array
//! beyond tolerance and ends the rebuild (the checkpoint stays).

use std::sync::atomic::Ordering;
use std::sync::{Condvar, Mutex, MutexGuard, RwLockReadGuard};
use std::time::{Duration, Instant};

use paraid_parity::StripeRecover;

use super::members::NO_TARGET;
use super::state::{Job, JobProgress};
use super::Array;
use crate::buf::{AlignedBuf, BatchBuf};
use crate::error::EngineError;
use crate::layout::{ChunkAddr, Geometry, Level, Role, PAGE_BYTES};
use crate::lock::StripeGuard;
use crate::member::IoReq;
use crate::superblock::{SlotEntry, SlotState};

/// Bytes of the rebuilt member per batch: large enough that each member request is a long sequential
/// transfer, small enough that a foreground write to a batch's rows waits only briefly.
const TARGET_BATCH_BYTES: u64 = 4 << 20;
/// At most this much buffer per worker (every member's rows of its batch).
const WORKER_BUFFER_BYTES: u64 = 32 << 20;
/// And at most this many rows (stripe locks held at once; the fault tests time their failures by it).
const MAX_BATCH_ROWS: u64 = 64;
/// Batches in flight at once (helper threads, plus the job's own thread): while one batch's survivors are
/// read, another's parity is computed and its target written, so every member stays busy.
const HELPER_WORKERS: usize = 2;
/// The checkpoint is written after this much progress, or this much time.
pub(super) const CHECKPOINT_BYTES: u64 = 64 << 20;
const CHECKPOINT_INTERVAL: Duration = Duration::from_secs(1);

/// Queues a rebuild job (callers go through `Array::want_rebuild`).
pub(super) fn queue(array: &Array) -> Result<(), EngineError> {
    array.queue_job("rebuild", None, 0, true, run)
}

/// One job: put spares to use, rebuild the first slot that needs it, then queue again if more is to do.
fn run(array: &Array, mut job: Job<'_>) {
    array.health.rebuild_wanted.store(false, Ordering::SeqCst);
    if !job.stopping() {
        array.take_spares();
    }
    match next_slot(array) {
        Some(slot) if !job.stopping() => {
            let outcome = rebuild_slot(array, &mut job, slot);
            job.finish(&outcome);
        }
        _ => job.discard(),
    }
    array.health.rebuild_active.store(false, Ordering::SeqCst);
    let more = array.health.rebuild_wanted.load(Ordering::SeqCst) || next_slot(array).is_some();
    if more && !array.jobs_stopping() {
        array.want_rebuild();
    }
}

/// A slot whose target still has rows to build, or is built and has not joined: a restart between the last
/// checkpoint (which names every row) and the completion resumes with nothing left to build, and the rebuild
/// must still complete it (flushes, bitmap and ring, the slot made active), or it would stay rebuilding for
/// good. Not a slot whose rebuild stopped at rows it could not read (it waits for a restart).
fn next_slot(array: &Array) -> Option<usize> {
    (0..array.geometry.members).find(|&slot| {
        let rt = &array.slots[slot];
        let target = rt.target_io.load(Ordering::Acquire);
        target != NO_TARGET
            && (rt.target_rows.load(Ordering::Acquire) < array.geometry.rows
                || (target == slot
                    && array.slot_state(slot) == SlotState::Rebuilding
                    && rt.first_bad_row.load(Ordering::Acquire) == u64::MAX))
    })
}

/// Member rows one bitmap region of `region_stripes` stripes spans, at least 1 (a RAID10 row holds `members / 2`
/// chunks, each a stripe; see `lock_range`).
fn region_rows(g: &Geometry, region_stripes: u64) -> u64 {
    let stripes_per_row = match g.level {
        Level::Raid10 => (g.members as u64 / 2).max(1),
        _ => 1,
    };
    (region_stripes / stripes_per_row).max(1)
}

/// The stripes (lock ids) whose cells lie in rows `r0..r1` of `slot`.
fn lock_range(g: &Geometry, r0: u64, r1: u64) -> (u64, u64) {
    match g.level {
        Level::Raid10 => {
            let n = g.members as u64;
            let first = r0 * n / 2;
            let last = ((r1 * n - 1) / 2).min(g.data_chunks() - 1);
            (first, last + 1 - first)
        }
        _ => (r0, r1 - r0),
    }
}

fn rebuild_slot(array: &Array, job: &mut Job<'_>, slot: usize) -> String {
    let g = array.geometry;
    let cb = g.chunk_bytes;
    let rt = &array.slots[slot];
    job.set_target(Some(slot), g.member_data_bytes());
    let start_rows = rt.target_rows.load(Ordering::Acquire);
    job.resume_at(start_rows * cb);
    let target = rt.target_io.load(Ordering::Acquire);
    let replacing = target != slot;
    log::warn!(
        "rebuilding slot {slot} onto {}{} from byte {} of {}",
        array.io.label(target),
        if replacing { " (replacement)" } else { "" },
        start_rows * cb,
        g.member_data_bytes()
    );
    let in_sync_below_rows = if !replacing && array.integrity.has_bitmap() {
        rt.in_sync_below_rows.load(Ordering::Acquire).min(g.rows)
    } else {
        0
    };
    let in_sync_outside_bitmap = in_sync_below_rows > 0;
    let mut batch_rows = (TARGET_BATCH_BYTES / cb)
        .min(WORKER_BUFFER_BYTES / (cb * g.members as u64))
        .min(array.rebuild_batch_rows_max.load(Ordering::Relaxed))
        .clamp(1, MAX_BATCH_ROWS);
    if in_sync_outside_bitmap {
        // A batch is skipped only when every region it touches is unmarked: batches of one region's rows at
        // most, so that one marked region costs its own rows only.
        if let Some(region_stripes) = array.integrity.bitmap_region_stripes() {
            batch_rows = batch_rows.min(region_rows(&g, region_stripes));
        }
    }
    let region_bytes = (batch_rows * cb) as usize;
    // A member back in the slot it left holds what it held then: only rows the bitmap marks as written since
    // need building (members.rs, `returning_member`).
    if in_sync_outside_bitmap {
        log::warn!(
            "slot {slot}: its member came back; rows {}in regions the write-intent bitmap marks as unwritten \
             since it left are in sync and skipped",
            if in_sync_below_rows < g.rows {
                format!("below byte {} ", in_sync_below_rows * cb)
            } else {
                String::new()
            }
        );
    }
    let pipe = Pipe {
        array,
        slot,
        replacing,
        in_sync_below_rows,
        batch_rows,
        region_bytes,
        report: job.progress_handle(),
        job: Mutex::new(job),
        next_row: Mutex::new(start_rows),
        commit: Mutex::new(Commit {
            rows: start_rows,
            failed: None,
            interrupted: false,
        }),
        committed: Condvar::new(),
        checkpoint: Mutex::new((start_rows, Instant::now())),
    };
    std::thread::scope(|scope| {
        for w in 0..HELPER_WORKERS {
            let pipe = &pipe;
            let spawned = std::thread::Builder::new()
                .name(format!("rebuild-{w}"))
                .spawn_scoped(scope, move || pipe.work());
            if let Err(e) = spawned {
                // Fewer workers only cost speed; with none at all the batches run on this thread below.
                log::warn!("rebuild: cannot start worker {w}: {e}");
            }
        }
        // This thread builds batches too (all of them when no helper could start).
        pipe.work();
    });
    let commit = pipe.commit.into_inner().unwrap_or_else(|e| e.into_inner());
    if let Some(why) = commit.failed {
        return why;
    }
    if commit.interrupted {
        persist_checkpoint(array, slot);
        return "interrupted".to_string();
    }
    debug_assert!(
        rt.target_rows.load(Ordering::Acquire) >= g.rows
            || rt.target_io.load(Ordering::Acquire) == NO_TARGET
    );
    let job = pipe.job.into_inner().unwrap_or_else(|e| e.into_inner());
    if in_sync_outside_bitmap {
        log::warn!(
            "slot {slot}: {} of {} bytes were in sync (the write-intent bitmap); the rest was rebuilt",
            job.in_sync_bytes(),
            g.member_data_bytes()
        );
    }
    complete(array, slot, job)
}

/// The batches of one rebuild, shared by its workers. Each worker claims the next rows (in order, under
/// `next_row`, taking the membership lock shared and the rows' stripe locks before the next claim), builds
/// them with its own buffers and io_uring, then commits them in row order: `target_rows` only ever grows over
/// built rows, so writes above it still skip the target and the checkpoint never covers a gap.
///
/// Why this cannot deadlock: a worker waiting to commit holds its rows and the membership shared, and waits
/// only for batches claimed before it, whose workers already hold everything they need (they take nothing
/// more before committing). `job` (throttle, stop requests) is taken only with nothing else held, and
/// `next_row` only under `job`.
struct Pipe<'p, 'j> {
    array: &'p Array,
    slot: usize,
    replacing: bool,
    /// The target is the slot's own member come back, in sync below this row (0: not such a member): batches of
    /// rows below it that no bitmap region marks as written are in sync on it and are committed without I/O.
    in_sync_below_rows: u64,
    batch_rows: u64,
    region_bytes: usize,
    /// Progress and unreadable ranges, recorded by workers while another may sleep in the throttle.
    report: JobProgress<'j>,
    /// The job handle, for the throttle: a batch is counted toward the speed limit when it is claimed, so the
    /// sleep before the next claim spaces the starts as the limit asks, however many are in flight.
    job: Mutex<&'p mut Job<'j>>,
    /// The first row no worker has claimed yet.
    next_row: Mutex<u64>,
    commit: Mutex<Commit>,
    /// Signalled at every commit and failure.
    committed: Condvar,
    /// Rows and time of the last checkpoint written.
    checkpoint: Mutex<(u64, Instant)>,
}

struct Commit {
    /// Rows built and published (`target_rows`).
    rows: u64,
    /// The first failure: no batch commits after it.
    failed: Option<String>,
    /// A stop request was seen: nothing more is claimed, what was claimed still commits.
    interrupted: bool,
}

/// One row's recovery as the batch call gets it: its chunks, the missing stripe indices, whether Q is among the
/// chunks.
type RecoverList<'c, 'm> = (Vec<&'c mut [u8]>, &'m Vec<usize>, bool);

/// A claimed batch: its rows and the locks that keep foreground writes out of them.
struct Claim<'a> {
    r0: u64,
    r1: u64,
    target: usize,
    /// In sync on the target already (`Pipe::in_sync_below_rows`): nothing to read or write.
    in_sync: bool,
    _rows: StripeGuard<'a>,
    _shared: RwLockReadGuard<'a, ()>,
}

impl Pipe<'_, '_> {
    /// Whether the rows up to `r1` lie where the returning target is in sync outside the bitmap.
    fn in_sync_below(&self, r1: u64) -> bool {
        r1 <= self.in_sync_below_rows
    }

    fn lock_commit(&self) -> MutexGuard<'_, Commit> {
        self.commit.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn fail(&self, why: String) {
        let mut commit = self.lock_commit();
        commit.failed.get_or_insert(why);
        drop(commit);
        self.committed.notify_all();
    }

    /// One worker: claims, builds and commits batches until none is left or the rebuild ends.
    fn work(&self) {
        let g = self.array.geometry;
        // In the parity backend's own memory where it has some: a GPU then rebuilds each batch in place.
        let mut buf =
            BatchBuf::for_backend(self.array.parity.as_ref(), self.region_bytes * g.members);
        let mut lost: Vec<(u64, u64)> = Vec::new();
        while let Some(claim) = self.claim() {
            if claim.in_sync {
                self.report
                    .add_in_sync((claim.r1 - claim.r0) * g.chunk_bytes);
                if !self.commit(claim, Ok(())) {
                    return;
                }
                continue;
            }
            let batch = Batch {
                array: self.array,
                slot: self.slot,
                target: claim.target,
                r0: claim.r0,
                r1: claim.r1,
            };
            let built = match g.level {
                Level::Raid5 | Level::Raid6 => batch.parity(&mut buf, self.region_bytes, &mut lost),
                Level::Raid1 | Level::Raid10 => batch.copies(&mut buf, &mut lost),
                Level::Raid0 => Err("RAID0 keeps no redundancy to rebuild from".to_string()),
            };
            for (at, len) in lost.drain(..) {
                self.report.add_unreadable(at, len);
            }
            if !self.commit(claim, built) {
                return;
            }
        }
    }

    /// The next batch, throttled, with its locks held; `None` when nothing is left or the rebuild ends.
    fn claim(&self) -> Option<Claim<'_>> {
        let array = self.array;
        let g = array.geometry;
        let rt = &array.slots[self.slot];
        let mut job = self.job.lock().unwrap_or_else(|e| e.into_inner());
        job.throttle();
        if job.stopping() {
            drop(job);
            self.lock_commit().interrupted = true;
            return None;
        }
        {
            let commit = self.lock_commit();
            if commit.failed.is_some() || commit.interrupted {
                return None;
            }
        }
        let mut next_row = self.next_row.lock().unwrap_or_else(|e| e.into_inner());
        let r0 = *next_row;
        if r0 >= g.rows {
            return None;
        }
        let r1 = (r0 + self.batch_rows).min(g.rows);
        let (first, count) = lock_range(&g, r0, r1);
        // Rows in sync on a returning member move nothing, so they do not count toward the speed limit. No bit is
        // cleared while a slot is rebuilt (bitmap.rs, `tick`), only set, so the only rows that move uncounted are
        // those unmarked now and marked by the time the locks below are held.
        let unmarked = self.in_sync_below(r1) && !array.integrity.any_written(first, count);
        if !unmarked {
            job.count_started((r1 - r0) * g.chunk_bytes);
        }
        drop(job);
        let shared = array.membership.read().unwrap_or_else(|e| e.into_inner());
        if array.check_serving().is_err() {
            drop(next_row);
            self.fail("aborted: the array stopped serving".to_string());
            return None;
        }
        let target = rt.target_io.load(Ordering::Acquire);
        if target == NO_TARGET {
            drop(next_row);
            self.fail("aborted: the new member failed".to_string());
            return None;
        }
        let rows = array.locks.lock(first, count);
        // Asked with the rows' locks held: a write sets its bits before taking them, so a write these rows get
        // from now on either shows in the answer or finds them committed (and goes to the target itself).
        let in_sync = self.in_sync_below(r1) && !array.integrity.any_written(first, count);
        *next_row = r1;
        Some(Claim {
            r0,
            r1,
            target,
            in_sync,
            _rows: rows,
            _shared: shared,
        })
    }

    /// Publishes a built batch once every batch below it is published. Returns whether to go on.
    fn commit(&self, claim: Claim<'_>, built: Result<(), String>) -> bool {
        let array = self.array;
        let g = array.geometry;
        let rt = &array.slots[self.slot];
        let mut commit = self.lock_commit();
        while commit.rows != claim.r0 && commit.failed.is_none() {
            commit = self
                .committed
                .wait(commit)
                .unwrap_or_else(|e| e.into_inner());
        }
        if commit.failed.is_some() {
            return false; // an earlier batch failed: this one stays unpublished
        }
        let failure = match built {
            Err(why) => Some(format!("aborted: {why}")),
            Ok(()) if rt.target_io.load(Ordering::Acquire) != claim.target => {
                Some("aborted: the new member failed".to_string())
            }
            Ok(()) => None,
        };
        if let Some(why) = failure {
            commit.failed = Some(why);
            drop(commit);
            self.committed.notify_all();
            return false;
        }
        // Still under the rows' stripe locks: writes to these rows from now on include the target.
        debug_assert_eq!(rt.target_rows.load(Ordering::Acquire), claim.r0);
        rt.target_rows.store(claim.r1, Ordering::Release);
        commit.rows = claim.r1;
        drop(commit);
        self.committed.notify_all();
        let r1 = claim.r1;
        self.report.advance((claim.r1 - claim.r0) * g.chunk_bytes);
        drop(claim);
        if !self.replacing {
            let mut checkpoint = self.checkpoint.lock().unwrap_or_else(|e| e.into_inner());
            let (rows, at) = *checkpoint;
            if r1 > rows
                && ((r1 - rows) * g.chunk_bytes
                    >= array.rebuild_checkpoint_bytes.load(Ordering::Relaxed)
                    || at.elapsed() >= CHECKPOINT_INTERVAL)
            {
                // Whatever is committed by now (a later batch may have committed meanwhile), made durable first.
                let rows = persist_checkpoint(array, self.slot);
                *checkpoint = (rows, Instant::now());
            }
        }
        true
    }
}

/// Writes the rebuild checkpoint of `slot`: the rows committed now, once they are durable. The target's rows may
/// still sit in its write cache, and so may survivor writes they were computed from (the rows are consistent
/// with the survivors' caches, not their media): a checkpoint written before a flush of both could name rows a
/// power loss then takes from the target, or leaves inconsistent with a survivor, and the restarted rebuild
/// would resume past them and activate a member holding wrong bytes. The array's flush (every active member and
/// every target) is what makes rows durable (`flush_shared` advances `durable_rows`, which caps the checkpoint);
/// a target that fails it is let go (`abort_target`). Returns the rows committed when it began.
fn persist_checkpoint(array: &Array, slot: usize) -> u64 {
    let rows = array.slots[slot].target_rows.load(Ordering::Acquire);
    {
        let _shared = array.membership.read().unwrap_or_else(|e| e.into_inner());
        let _ = array.flush_shared();
    }
    let _ = array.persist_now();
    rows
}

/// The target is built: it becomes the slot's active member (a replacement moves into the slot and the old
/// member is detached). With unreadable rows it does not: see the module comment.
fn complete(array: &Array, slot: usize, job: &Job<'_>) -> String {
    let rt = &array.slots[slot];
    let target = rt.target_io.load(Ordering::Acquire);
    if target == NO_TARGET {
        return "aborted: the new member failed".to_string();
    }
    let bad_row = rt.first_bad_row.load(Ordering::Acquire);
    if bad_row != u64::MAX {
        let ranges = job.unreadable().len();
        if target == slot {
            persist_checkpoint(array, slot);
            log::error!(
                "rebuild of slot {slot}: {ranges} array byte ranges are unreadable (a survivor could not read them \
                 and no redundancy was left); the slot stays rebuilding from byte {} and is never read; rewrite \
                 those ranges, then restart the array to finish",
                bad_row * array.geometry.chunk_bytes
            );
        } else {
            array.abort_target(slot, &format!("{ranges} array byte ranges unreadable"));
        }
        return format!("aborted: {ranges} unreadable ranges");
    }
    // What the rebuild wrote may still sit in the new member's write cache: it must be durable before the
    // superblocks name the member active, or a power loss would leave a trusted member holding stale bytes. So
    // must what it was computed from: a survivor's write not yet durable when the rebuild read it could be lost
    // to a power loss while the new member keeps parity derived from it, and a member missing at restart would
    // then be solved from that mismatch (sim seed 8983). A survivor whose flush fails is evicted (the rebuild
    // still completes if the array tolerates it).
    // Requests are held off from here until the slot is active: a write planned while the slot was rebuilding
    // counts its chunk there as missing in the partial parity log (the new value in the partial parity, its page
    // not tracked as unflushed), so it must complete before these flushes, or a power loss could drop the page
    // while a live entry takes it as durable (concurrent simulation, seed 102624; the test
    // `write_landing_after_a_rebuild_completes_survives_power_loss`). It also keeps log entries out of the ring
    // `member_joined` writes.
    let _exclusive = array.exclusive();
    let survivors: Vec<IoReq<'_>> = array.active_slots().map(IoReq::flush).collect();
    array.submit_tolerant(survivors);
    // A failed I/O on the new member is not returned as a failure: it aborts the rebuild where it is noticed
    // (`note_failure` calls `abort_target`, which unsets the slot's target). So after each step the target is
    // checked, and a member that failed its flush, bitmap or ring never joins.
    let target_failed = || rt.target_io.load(Ordering::Acquire) != target;
    array.submit_tolerant(vec![IoReq::flush(target)]);
    if target_failed() {
        return "aborted: the new member failed its flush".to_string();
    }
    // The new member gets the write-intent bitmap and an empty partial parity log ring before it serves
    // (resync.rs).
    if let Err(e) = array.integrity.member_joined(array, target) {
        array.abort_target(slot, &format!("cannot write its bitmap and log ring: {e}"));
        return "aborted: the new member failed".to_string();
    }
    if target_failed() {
        return "aborted: the new member failed writing its bitmap and log ring".to_string();
    }
    if target == slot {
        let mut meta = array.lock_meta_to_change();
        if target_failed() {
            return "aborted: the new member failed".to_string();
        }
        array.health.epoch.fetch_add(1, Ordering::SeqCst);
        rt.target_io.store(NO_TARGET, Ordering::Release);
        rt.reset_errors();
        array.set_state(slot, SlotState::Active);
        let state = meta.state;
        let _ = array.persist_locked(&mut meta, state);
    } else {
        let mut meta = array.lock_meta_to_change();
        if rt.target_io.load(Ordering::Acquire) != target {
            return "aborted: the new member failed".to_string();
        }
        let old = array.io.label(slot);
        array.io.detach(slot);
        if let Err(e) = array.io.move_member(target, slot) {
            log::error!("cannot move the replacement into slot {slot}: {e}");
            rt.target_io.store(NO_TARGET, Ordering::Release);
            return format!("aborted: cannot move the replacement into slot {slot}: {e}");
        }
        array.health.epoch.fetch_add(1, Ordering::SeqCst);
        meta.slots[slot].member_uuid = meta.slots[target].member_uuid;
        meta.slots[target] = SlotEntry::UNUSED;
        rt.target_io.store(NO_TARGET, Ordering::Release);
        rt.reset_errors();
        array.set_state(slot, SlotState::Active);
        log::warn!(
            "{} replaced {old} in slot {slot}; {old} is detached",
            array.io.label(slot)
        );
        let state = meta.state;
        let _ = array.persist_locked(&mut meta, state);
    }
    let whole = (0..array.geometry.members).all(|s| array.slot_state(s) == SlotState::Active);
    log::warn!(
        "slot {slot} rebuilt{}",
        if whole {
            ": the array is whole again"
        } else {
            ""
        }
    );
    "completed".to_string()
}

/// One batch: rows `r0..r1` of `slot`, built onto io index `target`.
struct Batch<'a> {
    array: &'a Array,
    slot: usize,
    target: usize,
    r0: u64,
    r1: u64,
}

impl Batch<'_> {
    fn rows(&self) -> usize {
        (self.r1 - self.r0) as usize
    }

    /// Writes the built rows to the target. Its failure aborts the target (`submit_tolerant`).
    fn write_target(&self, bytes: &[u8]) -> Result<(), String> {
        let at = self.array.member_offset(self.r0, 0);
        let failures =
            self.array
                .submit_tolerant(vec![IoReq::write(self.target, at, bytes, false)]);
        if failures.is_empty()
            && self.array.slots[self.slot]
                .target_io
                .load(Ordering::Acquire)
                == self.target
        {
            Ok(())
        } else {
            Err("the new member failed".to_string())
        }
    }

    /// Records the array bytes of stripe index `index` of row `row`, page `page`, as unreadable (data only).
    fn unreadable(&self, lost: &mut Vec<(u64, u64)>, row: u64, index: usize, page: usize) {
        let g = &self.array.geometry;
        let k = g.data_per_stripe();
        if index < k {
            let chunk = row * k as u64 + index as u64;
            let at = chunk * g.chunk_bytes + page as u64 * PAGE_BYTES;
            lost.push((at, PAGE_BYTES));
        }
        self.array.slots[self.slot]
            .first_bad_row
            .fetch_min(row, Ordering::AcqRel);
    }

    /// RAID5/6: copy from the slot itself while it is active (a replacement), else recover every row from the
    /// other members.
    fn parity(
        &self,
        buf: &mut [u8],
        region_bytes: usize,
        lost: &mut Vec<(u64, u64)>,
    ) -> Result<(), String> {
        let array = self.array;
        let g = array.geometry;
        let cb = g.chunk_bytes as usize;
        let span = self.rows() * cb;
        let at = array.member_offset(self.r0, 0);
        let mut regions: Vec<&mut [u8]> = buf
            .chunks_mut(region_bytes)
            .map(|r| &mut r[..span])
            .collect();
        if array.is_active(self.slot) {
            let read = vec![IoReq::read(self.slot, at, &mut *regions[self.slot])];
            if array.submit_tolerant(read).is_empty() {
                return self.write_target(&*regions[self.slot]);
            }
            // The old member cannot read these rows: rebuild them from the others.
        }
        let k = g.data_per_stripe();
        let np = g.level.parity_chunks();
        let has_q = g.level == Level::Raid6;
        let sources: Vec<usize> = (0..g.members)
            .filter(|&m| m != self.slot && array.is_active(m))
            .collect();
        if g.members - sources.len() > np {
            return Err(format!(
                "{} members are not in sync, {} cannot rebuild",
                g.members - sources.len(),
                g.level
            ));
        }
        // RAID6 with only this slot missing: a row whose missing chunk is data or P is solved from the data and
        // P alone, so its Q is not read (one of that row's five survivor reads). Should any read fail, every row
        // is read whole again and recovered as below, unreadable pages and all.
        let mut skip: Vec<Option<usize>> = (0..self.rows())
            .map(|j| {
                if !has_q || sources.len() + 1 != g.members {
                    return None;
                }
                let q_member = g.stripe_member(self.r0 + j as u64, k + 1);
                (q_member != self.slot).then_some(q_member)
            })
            .collect();
        if skip.iter().any(Option::is_some) {
            let mut reqs: Vec<IoReq<'_>> = Vec::new();
            for (m, region) in regions.iter_mut().enumerate() {
                if !sources.contains(&m) {
                    continue;
                }
                // Runs of rows this member is read for, each one request.
                let mut rest: &mut [u8] = &mut region[..];
                let mut row = 0usize;
                while row < self.rows() {
                    let first = row;
                    while row < self.rows() && skip[row] != Some(m) {
                        row += 1;
                    }
                    let (run, tail) = std::mem::take(&mut rest).split_at_mut((row - first) * cb);
                    if !run.is_empty() {
                        reqs.push(IoReq::read(m, at + (first * cb) as u64, run));
                    }
                    if row < self.rows() {
                        rest = &mut tail[cb..]; // the skipped row's cell
                        row += 1;
                    } else {
                        rest = tail;
                    }
                }
            }
            if !array.submit_tolerant(reqs).is_empty() {
                skip.iter_mut().for_each(|s| *s = None);
            }
        }
        let failed: Vec<usize> = if skip.iter().any(Option::is_some) {
            Vec::new()
        } else {
            let reqs: Vec<IoReq<'_>> = regions
                .iter_mut()
                .enumerate()
                .filter(|(m, _)| sources.contains(m))
                .map(|(m, r)| IoReq::read(m, at, r))
                .collect();
            array.submit_tolerant(reqs).iter().map(|f| f.slot).collect()
        };
        // Pages each failed source could not read: (member, row, page).
        let mut bad: Vec<(usize, usize, usize)> = Vec::new();
        let pages = cb / PAGE_BYTES as usize;
        if !failed.is_empty() {
            let mut reqs: Vec<IoReq<'_>> = Vec::new();
            let mut which: Vec<(usize, usize, usize)> = Vec::new();
            for (m, region) in regions.iter_mut().enumerate() {
                if !failed.contains(&m) {
                    continue;
                }
                for (i, page) in region.chunks_mut(PAGE_BYTES as usize).enumerate() {
                    let (row, p) = (i / pages, i % pages);
                    reqs.push(IoReq::read(m, at + (i as u64) * PAGE_BYTES, page));
                    which.push((m, row, p));
                }
            }
            for f in array.submit_tolerant(reqs) {
                bad.push(which[f.index]);
            }
        }
        // Every row: its chunks in stripe index order, cut from the members' regions.
        let mut cells: Vec<Vec<Option<&mut [u8]>>> = regions
            .into_iter()
            .map(|r| r.chunks_mut(cb).map(Some).collect())
            .collect();
        let mut rows: Vec<Vec<&mut [u8]>> = (0..self.rows())
            .map(|j| {
                let stripe = self.r0 + j as u64;
                (0..k + np)
                    .map(|i| {
                        cells[g.stripe_member(stripe, i)][j]
                            .take()
                            .expect("each cell once")
                    })
                    .collect()
            })
            .collect();
        let missing_of = |stripe: u64| -> Vec<usize> {
            (0..k + np)
                .filter(|&i| !sources.contains(&g.stripe_member(stripe, i)))
                .collect()
        };
        let missing: Vec<Vec<usize>> = (0..self.rows())
            .map(|j| missing_of(self.r0 + j as u64))
            .collect();
        // Rows without unreadable pages: one batch call.
        let clean: Vec<bool> = (0..self.rows())
            .map(|j| !bad.iter().any(|b| b.1 == j))
            .collect();
        {
            // Reborrowed per batch call: `StripeRecover` ties its slices' lifetime to the list's borrow.
            // A row whose Q was not read is recovered as RAID5 (the data and P; its missing chunk is one of them).
            let mut lists: Vec<RecoverList<'_, '_>> = rows
                .iter_mut()
                .zip(&missing)
                .zip(&clean)
                .zip(&skip)
                .filter(|((_, clean), _)| **clean)
                .map(|(((chunks, missing), _), skip)| {
                    let used = if skip.is_some() { k + 1 } else { k + np };
                    debug_assert!(skip.is_none() || missing.iter().all(|&i| i <= k));
                    (
                        chunks.iter_mut().take(used).map(|c| &mut **c).collect(),
                        missing,
                        has_q && skip.is_none(),
                    )
                })
                .collect();
            let mut batch: Vec<StripeRecover<'_>> = lists
                .iter_mut()
                .map(|(chunks, missing, has_q)| StripeRecover {
                    chunks: chunks.as_mut_slice(),
                    has_q: *has_q,
                    missing,
                })
                .collect();
            array
                .parity
                .recover_batch(&mut batch)
                .map_err(|e| format!("recovery failed: {e}"))?;
        }
        // Rows with unreadable pages: page by page, each bad page one more erasure.
        let mut fixes: Vec<(usize, u64, Vec<u8>)> = Vec::new();
        for (j, chunks) in rows.iter_mut().enumerate() {
            if clean[j] {
                continue;
            }
            let stripe = self.r0 + j as u64;
            for p in 0..pages {
                let mut miss = missing[j].clone();
                let failed_here: Vec<usize> = bad
                    .iter()
                    .filter(|b| b.1 == j && b.2 == p)
                    .map(|b| b.0)
                    .collect();
                for &m in &failed_here {
                    miss.push(g.stripe_index(stripe, m));
                }
                miss.sort_unstable();
                let lo = p * PAGE_BYTES as usize;
                let hi = lo + PAGE_BYTES as usize;
                if miss.len() > np {
                    for &i in &miss {
                        let m = g.stripe_member(stripe, i);
                        if m == self.slot || failed_here.contains(&m) || !array.is_active(m) {
                            self.unreadable(lost, stripe, i, p);
                        }
                    }
                    chunks[g.stripe_index(stripe, self.slot)][lo..hi].fill(0);
                    continue;
                }
                let mut sub: Vec<&mut [u8]> = chunks.iter_mut().map(|c| &mut c[lo..hi]).collect();
                array
                    .parity
                    .recover(&mut sub, has_q, &miss)
                    .map_err(|e| format!("recovery failed: {e}"))?;
                // Read-error correction on the survivor, as a foreground read would do.
                for &m in &failed_here {
                    let i = g.stripe_index(stripe, m);
                    let member_at = array.member_offset(stripe, lo as u64);
                    fixes.push((m, member_at, sub[i].to_vec()));
                }
            }
        }
        drop(rows);
        if !fixes.is_empty() {
            let mut pages_buf = AlignedBuf::zeroed(fixes.len() * PAGE_BYTES as usize);
            for (b, (_, _, bytes)) in pages_buf.chunks_mut(PAGE_BYTES as usize).zip(&fixes) {
                b.copy_from_slice(bytes);
            }
            let reqs: Vec<IoReq<'_>> = pages_buf
                .chunks(PAGE_BYTES as usize)
                .zip(&fixes)
                .filter(|(_, (m, _, _))| array.is_active(*m))
                .map(|(b, (m, member_at, _))| IoReq::write(*m, *member_at, b, false))
                .collect();
            array.submit_tolerant(reqs);
        }
        let region = &buf[self.slot * region_bytes..self.slot * region_bytes + span];
        self.write_target(region)
    }

    /// RAID1/10: each cell of the slot copied from another active copy (or from the slot itself while it is
    /// active: a replacement); a cell no copy can read is retried page by page.
    fn copies(&self, buf: &mut [u8], lost: &mut Vec<(u64, u64)>) -> Result<(), String> {
        let array = self.array;
        let g = array.geometry;
        let cb = g.chunk_bytes as usize;
        let span = self.rows() * cb;
        let out = &mut buf[..span];
        // Sources of each row's cell, best first.
        let sources: Vec<Vec<ChunkAddr>> = (0..self.rows())
            .map(|j| {
                let row = self.r0 + j as u64;
                match g.role(ChunkAddr {
                    member: self.slot,
                    row,
                }) {
                    Role::Data { chunk, copy } => {
                        let mut s = Vec::new();
                        if array.is_active(self.slot) {
                            s.push(ChunkAddr {
                                member: self.slot,
                                row,
                            });
                        }
                        s.extend(
                            (0..g.copies())
                                .filter(|c| *c != copy)
                                .map(|c| g.chunk_copy(chunk, c))
                                .filter(|a| array.is_active(a.member)),
                        );
                        s
                    }
                    _ => Vec::new(), // an unused cell: zeros
                }
            })
            .collect();
        let mut pending: Vec<usize> = Vec::new();
        {
            let mut reqs: Vec<IoReq<'_>> = Vec::new();
            let mut rows_of: Vec<usize> = Vec::new();
            for (j, cell) in out.chunks_mut(cb).enumerate() {
                match sources[j].first() {
                    Some(a) => {
                        reqs.push(IoReq::read(a.member, array.member_offset(a.row, 0), cell));
                        rows_of.push(j);
                    }
                    None => {
                        cell.fill(0);
                        if matches!(
                            g.role(ChunkAddr {
                                member: self.slot,
                                row: self.r0 + j as u64
                            }),
                            Role::Data { .. }
                        ) {
                            pending.push(j);
                        }
                    }
                }
            }
            for f in array.submit_tolerant(reqs) {
                pending.push(rows_of[f.index]);
            }
        }
        // Cells the first source could not read: page by page, over every source.
        for j in pending {
            let row = self.r0 + j as u64;
            let cell = &mut out[j * cb..(j + 1) * cb];
            for (p, page) in cell.chunks_mut(PAGE_BYTES as usize).enumerate() {
                let offset = p as u64 * PAGE_BYTES;
                let mut read = false;
                for a in &sources[j] {
                    let reqs = vec![IoReq::read(
                        a.member,
                        array.member_offset(a.row, offset),
                        &mut *page,
                    )];
                    if array.submit_tolerant(reqs).is_empty() {
                        read = true;
                        break;
                    }
                }
                if !read {
                    page.fill(0);
                    if let Role::Data { chunk, .. } = g.role(ChunkAddr {
                        member: self.slot,
                        row,
                    }) {
                        lost.push((chunk * g.chunk_bytes + offset, PAGE_BYTES));
                    }
                    array.slots[self.slot]
                        .first_bad_row
                        .fetch_min(row, Ordering::AcqRel);
                }
            }
        }
        self.write_target(&buf[..span])
    }
}

impl Array {
    /// Rebuild progress between two checkpoints (default 64 MiB, or a second; tests make it every batch, so
    /// that a power loss in the middle of a rebuild finds checkpoints to resume from).
    #[doc(hidden)]
    pub fn set_rebuild_checkpoint_bytes(&self, bytes: u64) {
        self.rebuild_checkpoint_bytes
            .store(bytes.max(1), Ordering::Relaxed);
    }

    /// The most rows a rebuild batch builds (default: as many as 4 MiB of the target hold); the simulator's small
    /// arrays rebuild in one batch otherwise.
    #[doc(hidden)]
    pub fn set_rebuild_batch_rows(&self, rows: u64) {
        self.rebuild_batch_rows_max
            .store(rows.max(1), Ordering::Relaxed);
    }

    /// Whether the array is stopping (jobs must not queue more work).
    fn jobs_stopping(&self) -> bool {
        self.jobs.stopping()
    }
}
