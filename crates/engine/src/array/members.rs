//! Member failure and membership changes of a running array.
//!
//! * Every member I/O that fails is retried once (a transient error must not evict: faults.md row 10).
//! * A read that still fails counts against its member and is served by reconstruction (read.rs), and the
//!   recovered block is written back (a drive remaps an unreadable sector when it is written); once a member has
//!   failed reads at `error_threshold` distinct places it is evicted (marked faulty). Reading a known bad spot
//!   again does not count again (md records it as a bad block): a latent sector error that the last redundancy
//!   cannot cover must not turn into the loss of the whole array because a client retries it. A write (or flush, discard) that still fails
//!   evicts its member at once, as md does without a bad-block log: the member now holds stale bytes, and nothing
//!   on disk could stop a later assembly from trusting them; and a member that cannot even rewrite an unreadable
//!   block is dying, not showing a latent sector error.
//! * Eviction is durable before anything relies on it: the state change bumps `epoch` before it is visible, and
//!   every data-path request, before it is acknowledged, waits until the superblocks recording that epoch are
//!   written (`wait_durable`). The change and its superblock write happen under one hold of the `meta` lock.
//! * Beyond the level's tolerance the array stops serving: every request fails (EIO) with one clear logged line.
//!
//! Lock order: `membership` (shared by every request and rebuild batch, exclusive for moving or detaching members)
//! → stripe locks → `dealloc_gate` → `meta`. Every change of member states takes the gate exclusively with `meta`
//! (`MetaChange`); a discard holds it shared while it deallocates whole stripes and, on its own thread, changes
//! states without waiting for it.

use std::io;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, RwLockWriteGuard};

use super::Array;
use crate::error::{EngineError, MemberOp};
use crate::member::{IoOp, IoReq, NewMember};
use crate::superblock::{now_unix, SlotEntry, SlotState, Superblock, SUPERBLOCK_BYTES};
use crate::uuid::Uuid;

/// `meta` held for a change of member states (`ArrayCore::lock_meta_to_change`), with the dealloc gate held
/// exclusively unless this thread is the discard that holds it shared. `meta` is released first.
pub(crate) struct MetaChange<'a> {
    pub(super) meta: MutexGuard<'a, Superblock>,
    pub(super) _gate: Option<RwLockWriteGuard<'a, ()>>,
}

impl std::ops::Deref for MetaChange<'_> {
    type Target = Superblock;
    fn deref(&self) -> &Superblock {
        &self.meta
    }
}

impl std::ops::DerefMut for MetaChange<'_> {
    fn deref_mut(&mut self) -> &mut Superblock {
        &mut self.meta
    }
}

/// Failed I/Os (after their retry) that evict a member, md's max_read_errors in spirit.
pub const DEFAULT_ERROR_THRESHOLD: u32 = 8;
/// No io index (no rebuild target).
pub(crate) const NO_TARGET: usize = usize::MAX;

/// What the array knows of one data slot while it runs.
pub(crate) struct SlotRuntime {
    /// `SlotState::code`: Active (read and written), Rebuilding (written below `target_rows` only), Faulty or
    /// Missing (neither).
    pub(crate) state: AtomicU8,
    /// Failed reads after retry since assembly, at distinct member offsets (`failed_at`).
    pub(crate) errors: AtomicU32,
    /// Member offsets of the failed reads counted in `errors`.
    pub(crate) failed_at: Mutex<Vec<u64>>,
    /// The io index of the member being built to hold this slot's contents: the slot itself for a rebuild in
    /// place, a spare position for a replacement; `NO_TARGET` if none.
    pub(crate) target_io: AtomicUsize,
    /// Rows of the target already built: writes to rows below go to it too.
    pub(crate) target_rows: AtomicU64,
    /// Rows of the target known durable: built, then flushed with every member they were computed from
    /// (rebuild.rs, `persist_checkpoint`). The checkpoint in the superblocks never passes it, so a power loss
    /// cannot leave it naming rows the target's write cache lost.
    pub(crate) durable_rows: AtomicU64,
    /// The target is the slot's own member re-added (it left while the write-intent bitmap kept every bit): its
    /// rows below this one in regions whose bit is clear are in sync already, and the rebuild skips them (`rows`
    /// when all of it; the checkpoint of its own rebuild when it left in the middle of one; 0 for any other
    /// target).
    pub(crate) in_sync_below_rows: AtomicU64,
    /// First row the rebuild could not reconstruct (a RAID5 latent sector error); `u64::MAX` if none. The
    /// checkpoint persisted never passes it.
    pub(crate) first_bad_row: AtomicU64,
    /// Moving average of the member's read and write latency, nanoseconds (slow.rs).
    pub(crate) latency_ns: AtomicU64,
}

impl SlotRuntime {
    /// A new member in the slot: its errors and its latency are its own, from zero.
    pub(crate) fn reset_errors(&self) {
        self.latency_ns.store(0, Ordering::Relaxed);
        self.errors.store(0, Ordering::Release);
        self.failed_at
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
    }

    /// Makes io index `target` the slot's rebuild target, built (and durable) below member row `rows`; a non-zero
    /// `in_sync_rows` makes it the slot's own member come back, in sync below that row where the bitmap marks no
    /// write. The target is published last: whoever sees it sees the rest.
    pub(crate) fn set_target(&self, target: usize, rows: u64, in_sync_rows: u64) {
        self.target_rows.store(rows, Ordering::Release);
        self.durable_rows.store(rows, Ordering::Release);
        self.first_bad_row.store(u64::MAX, Ordering::Release);
        self.in_sync_below_rows
            .store(in_sync_rows, Ordering::Release);
        self.target_io.store(target, Ordering::Release);
    }

    pub(crate) fn new(state: SlotState) -> SlotRuntime {
        SlotRuntime {
            state: AtomicU8::new(state.code()),
            errors: AtomicU32::new(0),
            failed_at: Mutex::new(Vec::new()),
            target_io: AtomicUsize::new(NO_TARGET),
            target_rows: AtomicU64::new(0),
            durable_rows: AtomicU64::new(0),
            first_bad_row: AtomicU64::new(u64::MAX),
            in_sync_below_rows: AtomicU64::new(0),
            latency_ns: AtomicU64::new(0),
        }
    }
}

/// A member back in the slot it left (`Array::returning_member`).
struct ReturningMember {
    slot: usize,
    member_uuid: Uuid,
    events: u64,
    /// Rows in sync where the bitmap marks no write (`assemble::in_sync_outside_bitmap_rows`), at least one.
    in_sync_rows: u64,
}

/// Failure bookkeeping of the whole array.
pub(crate) struct Health {
    /// Bumped before every state change a request may rely on.
    pub(crate) epoch: AtomicU64,
    /// The highest epoch whose state is in the superblocks.
    pub(crate) durable_epoch: AtomicU64,
    /// Beyond tolerance: nothing is served any more.
    pub(crate) failed: AtomicBool,
    pub(crate) error_threshold: AtomicU32,
    /// A rebuild job is queued or running; `rebuild_wanted`: someone asked for one since it last looked.
    pub(crate) rebuild_active: AtomicBool,
    pub(crate) rebuild_wanted: AtomicBool,
}

impl Health {
    pub(crate) fn new() -> Health {
        Health {
            epoch: AtomicU64::new(0),
            durable_epoch: AtomicU64::new(0),
            failed: AtomicBool::new(false),
            error_threshold: AtomicU32::new(DEFAULT_ERROR_THRESHOLD),
            rebuild_active: AtomicBool::new(false),
            rebuild_wanted: AtomicBool::new(false),
        }
    }
}

/// A member I/O that failed twice.
#[derive(Debug)]
pub(crate) struct Failure {
    /// Position of the request in the batch.
    pub(crate) index: usize,
    pub(crate) slot: usize,
    pub(crate) op: MemberOp,
}

/// What `add_member` did with the new member.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "became", rename_all = "lowercase")]
pub enum AddOutcome {
    /// It took over a faulty or missing slot; a rebuild onto it started.
    Rebuilding { slot: usize },
    /// It is the member that left `slot` and came back while the write-intent bitmap kept track of every region
    /// written since: a rebuild of those regions alone started (md's re-add with a bitmap).
    ReAdded { slot: usize },
    /// It waits as a hot spare in slot table entry `entry` (at or beyond the member count).
    Spare { entry: usize },
}

impl AddOutcome {
    pub fn rebuilding_slot(&self) -> Option<usize> {
        match self {
            AddOutcome::Rebuilding { slot } | AddOutcome::ReAdded { slot } => Some(*slot),
            AddOutcome::Spare { .. } => None,
        }
    }
}

fn offset_of(op: &IoOp<'_>) -> u64 {
    match op {
        IoOp::Read { offset_bytes, .. }
        | IoOp::Write { offset_bytes, .. }
        | IoOp::Discard { offset_bytes, .. } => *offset_bytes,
        IoOp::Flush => 0,
    }
}

impl Array {
    /// Submits `reqs`, retries each failed one once, and deals with what still fails (counts, evicts, aborts a
    /// rebuild target). Returns the failures on array members (not on rebuild targets) so that the caller can
    /// serve around them.
    pub(crate) fn submit_tolerant<'a>(&self, mut reqs: Vec<IoReq<'a>>) -> Vec<Failure> {
        if reqs.is_empty() {
            return Vec::new();
        }
        let started = self.member_queues.as_ref().and_then(|q| q.begin(&reqs));
        self.io.submit(&mut reqs);
        if let (Some(queues), Some(started)) = (&self.member_queues, started) {
            queues.end(&reqs, started);
        }
        self.note_latencies(&reqs);
        let failed_at: Vec<usize> = (0..reqs.len())
            .filter(|i| reqs[*i].result.is_err())
            .collect();
        if failed_at.is_empty() {
            return Vec::new();
        }
        let mut retry: Vec<IoReq<'a>> = reqs.extract_if(.., |r| r.result.is_err()).collect();
        for req in &mut retry {
            req.result = Err(crate::member::not_submitted());
        }
        self.io.submit(&mut retry);
        let mut failures = Vec::new();
        for (index, req) in failed_at.into_iter().zip(retry) {
            let Err(source) = req.result else {
                log::info!(
                    "{} at byte {} of {} (slot {}) succeeded on retry",
                    req.op.kind(),
                    offset_of(&req.op),
                    self.io.label(req.slot),
                    req.slot
                );
                continue;
            };
            let op = req.op.kind();
            if self.note_failure(req.slot, op, offset_of(&req.op), &source) {
                failures.push(Failure {
                    index,
                    slot: req.slot,
                    op,
                });
            }
        }
        failures
    }

    /// Accounts for a member I/O that failed after its retry. Returns whether the request was on an array
    /// member (the caller must serve around it) rather than on a rebuild target.
    fn note_failure(
        &self,
        io_index: usize,
        op: MemberOp,
        offset_bytes: u64,
        source: &io::Error,
    ) -> bool {
        let label = self.io.label(io_index);
        if let Some(slot) = self.target_owner(io_index) {
            self.abort_target(
                slot,
                &format!("{op} at byte {offset_bytes} of the new member {label} failed: {source}"),
            );
            return false;
        }
        if io_index >= self.geometry.members {
            return false;
        }
        let slot = io_index;
        if !self.is_active(slot) {
            return true; // it left the array meanwhile: the caller re-plans
        }
        log::warn!(
            "{op} at byte {offset_bytes} of {label} (slot {slot}) failed after a retry: {source}"
        );
        if op == MemberOp::Read {
            let rt = &self.slots[slot];
            {
                let mut seen = rt.failed_at.lock().unwrap_or_else(|e| e.into_inner());
                if seen.contains(&offset_bytes) {
                    return true; // a known bad spot: served around, not counted again
                }
                seen.push(offset_bytes);
            }
            let errors = rt.errors.fetch_add(1, Ordering::AcqRel) + 1;
            let threshold = self.health.error_threshold.load(Ordering::Relaxed);
            if errors >= threshold {
                self.evict(
                    slot,
                    &format!(
                        "{errors} failed I/Os (threshold {threshold}), the last: {op}: {source}"
                    ),
                );
            }
        } else {
            self.evict(slot, &format!("{op} failed after a retry: {source}"));
        }
        true
    }

    /// The slot whose rebuild target sits at `io_index`, if any.
    fn target_owner(&self, io_index: usize) -> Option<usize> {
        (0..self.geometry.members).find(|&slot| {
            self.slots[slot].target_io.load(Ordering::Acquire) == io_index
                && (io_index != slot || self.slot_state(slot) == SlotState::Rebuilding)
        })
    }

    /// Marks `slot` faulty (if it is active or rebuilding) and records it in the superblocks before returning.
    pub(crate) fn evict(&self, slot: usize, why: &str) {
        // Not while a discard deallocates whole stripes (`dealloc_gate`), unless this is that discard's own
        // failure: it then redoes its window through the write path after this flushes the survivors.
        let mut meta = self.lock_meta_to_change();
        self.evict_locked(&mut meta, slot, why);
        drop(meta);
        self.want_rebuild();
    }

    /// `evict` with the superblock lock held (the rebuild it wants is the caller's to ask for).
    fn evict_locked(&self, meta: &mut MetaChange<'_>, slot: usize, why: &str) {
        let state = self.slot_state(slot);
        if state != SlotState::Active && state != SlotState::Rebuilding {
            return;
        }
        self.health.epoch.fetch_add(1, Ordering::SeqCst);
        log::error!(
            "member {} (slot {slot}) marked faulty: {why}",
            self.io.label(slot)
        );
        self.note_tolerance(&[slot]);
        self.set_state(slot, SlotState::Faulty);
        if self.slots[slot].target_io.load(Ordering::Acquire) == slot {
            self.slots[slot]
                .target_io
                .store(NO_TARGET, Ordering::Release);
        }
        for (failed, source) in self.flush_survivors() {
            self.evict_locked(
                meta,
                failed,
                &format!("flush failed after a retry (as slot {slot} left): {source}"),
            );
        }
        let state = meta.state;
        let _ = self.persist_locked(meta, state);
    }

    /// After a data slot left the array: its chunks now live only in the parity, including pages it took without
    /// a flush since. Makes the survivors durable, or a power loss could tear that parity and leave those chunks
    /// neither old nor new (the partial parity log counts a chunk written before its member left as modified,
    /// and recomputes it from the parity as found). Returns the members whose flush failed, retried once as every
    /// member I/O is: the caller evicts them (it may hold the superblock lock). Left to the next request, such a
    /// member served on with writes it may have lost, and a step with no later flush never found it (simulation
    /// seed 54300577: a new member that failed its flush here, after a member left beside its rebuild).
    #[must_use]
    pub(crate) fn flush_survivors(&self) -> Vec<(usize, io::Error)> {
        if !self.geometry.level.has_parity() {
            return Vec::new();
        }
        let mut flushes: Vec<IoReq<'_>> = self.active_slots().map(IoReq::flush).collect();
        self.io.submit(&mut flushes);
        let mut retries: Vec<IoReq<'_>> = flushes
            .iter()
            .filter(|req| req.result.is_err())
            .map(|req| IoReq::flush(req.slot))
            .collect();
        if retries.is_empty() {
            return Vec::new();
        }
        self.io.submit(&mut retries);
        retries
            .into_iter()
            .filter_map(|req| req.result.err().map(|error| (req.slot, error)))
            .collect()
    }

    /// Ends the rebuild or replacement target of `slot` (its new member failed).
    pub(crate) fn abort_target(&self, slot: usize, why: &str) {
        let mut meta = self.lock_meta_to_change();
        let target = self.slots[slot].target_io.load(Ordering::Acquire);
        if target == NO_TARGET {
            return;
        }
        self.health.epoch.fetch_add(1, Ordering::SeqCst);
        self.slots[slot]
            .target_io
            .store(NO_TARGET, Ordering::Release);
        if target == slot {
            self.set_state(slot, SlotState::Faulty);
        } else if target < meta.slots.len() {
            meta.slots[target].state = SlotState::Faulty;
        }
        log::error!(
            "rebuild of slot {slot} onto {} aborted: {why}",
            self.io.label(target)
        );
        let state = meta.state;
        let _ = self.persist_locked(&mut meta, state);
        drop(meta);
        // A rebuild job on the slot records its own end; one aborted before its job started must be recorded
        // here, or whoever waits for it would read the job before it (a resync, say) as its result.
        self.jobs.record_unstarted_rebuild(
            slot,
            self.geometry.member_data_bytes(),
            format!("aborted: {why}"),
        );
    }

    /// Sets `failed` (with one log line) if the array is beyond its tolerance once the slots `leaving` are out.
    /// Called before their state changes: whoever sees a slot out sees `failed` too, if that slot failed the
    /// array. Writes rely on it: a write that saw the slot out planned, logged or wrote in place as if its
    /// chunks lived in the parity, and must not touch the members of a failed array (see `check_serving`).
    fn note_tolerance(&self, leaving: &[usize]) {
        let missing: Vec<bool> = (0..self.geometry.members)
            .map(|s| !self.is_active(s) || leaving.contains(&s))
            .collect();
        if self.geometry.survives(&missing) || self.health.failed.swap(true, Ordering::SeqCst) {
            return;
        }
        let gone: Vec<usize> = (0..self.geometry.members).filter(|s| missing[*s]).collect();
        log::error!(
            "array {}: {} cannot run without slots {gone:?} (tolerates {}): it stops serving, every request \
             fails with EIO",
            self.lock_uuid(),
            self.geometry.level,
            self.geometry.tolerated_missing()
        );
    }

    fn lock_uuid(&self) -> String {
        // Called with the meta lock held by the caller's caller at most once: read the immutable UUID copy.
        self.uuid.to_string()
    }

    pub(crate) fn set_state(&self, slot: usize, state: SlotState) {
        self.slots[slot]
            .state
            .store(state.code(), Ordering::Release);
    }

    /// Err once the array is beyond tolerance.
    pub(crate) fn check_serving(&self) -> Result<(), EngineError> {
        if !self.health.failed.load(Ordering::Acquire) {
            return Ok(());
        }
        Err(EngineError::ServeRequest {
            level: self.geometry.level,
            faulty_slots: (0..self.geometry.members)
                .filter(|s| !self.is_active(*s))
                .collect(),
        })
    }

    /// Waits until every state change a request may have relied on is in the superblocks; call before
    /// acknowledging.
    pub(crate) fn wait_durable(&self) -> Result<(), EngineError> {
        let epoch = self.health.epoch.load(Ordering::SeqCst);
        if self.health.durable_epoch.load(Ordering::SeqCst) < epoch {
            // State changes and their superblock writes happen under one hold of `meta`.
            drop(self.lock_meta());
        }
        self.check_serving()?;
        if self.health.durable_epoch.load(Ordering::SeqCst) < epoch {
            return Err(EngineError::WriteSuperblock {
                path: "every member".into(),
                slot: 0,
                source: io::Error::other("the member state could not be recorded on any member"),
            });
        }
        Ok(())
    }

    /// Members that carry the array's superblock: active and rebuilding slots, spares, replacement targets.
    fn carriers(&self, meta: &Superblock) -> Vec<usize> {
        let members = self.geometry.members;
        let mut carriers: Vec<usize> = (0..members)
            .filter(|&s| {
                matches!(
                    self.slot_state(s),
                    SlotState::Active | SlotState::Rebuilding
                ) && self.io.present(s)
            })
            .collect();
        carriers.extend(
            (members..meta.slots.len())
                .filter(|&e| meta.slots[e].state == SlotState::Spare && self.io.present(e)),
        );
        carriers
    }

    /// Copies the runtime slot states and rebuild checkpoints into `meta`'s slot table.
    fn sync_slot_table(&self, meta: &mut Superblock) {
        for slot in 0..self.geometry.members {
            let state = self.slot_state(slot);
            meta.slots[slot].state = state;
            meta.slots[slot].recovery_offset_bytes = if state == SlotState::Rebuilding {
                self.checkpoint_rows(slot) * self.geometry.chunk_bytes
            } else {
                0
            };
            let rt = &self.slots[slot];
            // Only a member in sync below every row is recorded so: a restart resumes such a rebuild from the
            // bitmap, any other whole from its checkpoint (what the bound held is not kept).
            meta.slots[slot].rebuild_from_bitmap = state == SlotState::Rebuilding
                && rt.target_io.load(Ordering::Acquire) == slot
                && rt.in_sync_below_rows.load(Ordering::Acquire) >= self.geometry.rows;
        }
    }

    /// The rebuild checkpoint of `slot` in rows: what is built and durable, short of any row the rebuild could
    /// not build.
    pub(crate) fn checkpoint_rows(&self, slot: usize) -> u64 {
        let rt = &self.slots[slot];
        rt.target_rows
            .load(Ordering::Acquire)
            .min(rt.durable_rows.load(Ordering::Acquire))
            .min(rt.first_bad_row.load(Ordering::Acquire))
    }

    /// Bumps the events, records `state` and the slot table, and writes the superblock to every carrier. A
    /// carrier whose write fails (after a retry) is marked faulty and the write is redone without it.
    pub(crate) fn persist_locked(
        &self,
        meta: &mut MetaChange<'_>,
        state: crate::superblock::ArrayState,
    ) -> Result<(), EngineError> {
        if self.read_only {
            // Served read-only: member states change in memory only (`detail` shows them), nothing is written.
            meta.state = state;
            self.sync_slot_table(meta);
            return Ok(());
        }
        loop {
            let epoch = self.health.epoch.load(Ordering::SeqCst);
            meta.events += 1;
            if meta.bitmap_kept_since_events == 0 && meta.bitmap_chunk_bytes > 0 {
                // From now on this build keeps the bitmap's bits while degraded (bitmap.rs, `tick`).
                meta.bitmap_kept_since_events = meta.events;
            }
            meta.state = state;
            meta.updated_unix = now_unix();
            self.sync_slot_table(meta);
            let carriers = self.carriers(meta);
            if carriers.is_empty() {
                return Err(EngineError::WriteSuperblock {
                    path: "every member".into(),
                    slot: 0,
                    source: io::Error::other("no member is left to record the array state"),
                });
            }
            let failed = self.write_superblocks_to(meta, &carriers);
            if failed.is_empty() {
                self.health.durable_epoch.fetch_max(epoch, Ordering::SeqCst);
                return Ok(());
            }
            self.health.epoch.fetch_add(1, Ordering::SeqCst);
            // Members whose superblock write failed leave; when a data slot leaves, the survivors are flushed, as
            // `evict` does and for the same reason, and a member whose flush fails there leaves in turn. Then the
            // superblocks are written again.
            let mut leaving: Vec<(usize, io::Error, bool)> = failed
                .into_iter()
                .map(|(slot, source)| (slot, source, true))
                .collect();
            while !leaving.is_empty() {
                let data_slots: Vec<usize> = leaving
                    .iter()
                    .map(|(slot, _, _)| *slot)
                    .filter(|&slot| slot < self.geometry.members)
                    .collect();
                self.note_tolerance(&data_slots);
                let mut data_slot_left = false;
                for (slot, source, superblock) in leaving {
                    let what = if superblock {
                        "cannot write the superblock of"
                    } else {
                        "after a retry, cannot flush"
                    };
                    log::error!(
                        "{what} {} (slot {slot}): {source}; marked faulty",
                        self.io.label(slot)
                    );
                    if slot < self.geometry.members {
                        data_slot_left |= self.slot_state(slot) == SlotState::Active;
                        self.set_state(slot, SlotState::Faulty);
                        // A superblock it cannot carry ends its replacement too; a failed flush, as in `evict`,
                        // only its own rebuild.
                        if superblock || self.slots[slot].target_io.load(Ordering::Acquire) == slot
                        {
                            self.slots[slot]
                                .target_io
                                .store(NO_TARGET, Ordering::Release);
                        }
                    } else {
                        meta.slots[slot].state = SlotState::Faulty;
                        if let Some(owner) = self.target_owner(slot) {
                            self.slots[owner]
                                .target_io
                                .store(NO_TARGET, Ordering::Release);
                        }
                    }
                }
                leaving = if data_slot_left {
                    self.flush_survivors()
                        .into_iter()
                        .map(|(slot, source)| (slot, source, false))
                        .collect()
                } else {
                    Vec::new()
                };
            }
        }
    }

    /// Records the current member states and rebuild checkpoints in the superblocks.
    pub(crate) fn persist_now(&self) -> Result<(), EngineError> {
        let mut meta = self.lock_meta_to_change();
        let state = meta.state;
        self.persist_locked(&mut meta, state)
    }

    /// Writes `meta` (with each member's own slot and UUID) to `slots`, retrying once; returns what failed.
    fn write_superblocks_to(&self, meta: &Superblock, slots: &[usize]) -> Vec<(usize, io::Error)> {
        let mut blocks = crate::buf::AlignedBuf::zeroed(SUPERBLOCK_BYTES * slots.len());
        for (block, &slot) in blocks.chunks_mut(SUPERBLOCK_BYTES).zip(slots) {
            let mut sb = meta.clone();
            sb.slot = slot;
            sb.member_uuid = meta.slots[slot].member_uuid;
            block.copy_from_slice(&sb.encode());
        }
        let mut failed = Vec::new();
        let mut pending: Vec<usize> = (0..slots.len()).collect();
        for _attempt in 0..2 {
            let mut reqs: Vec<IoReq<'_>> = blocks
                .chunks(SUPERBLOCK_BYTES)
                .enumerate()
                .filter(|(i, _)| pending.contains(i))
                .map(|(i, block)| IoReq::write(slots[i], 0, block, true))
                .collect();
            self.io.submit(&mut reqs);
            let mut still = Vec::new();
            failed.clear();
            for (req, &i) in reqs.into_iter().zip(&pending) {
                if let Err(source) = req.result {
                    still.push(i);
                    failed.push((slots[i], source));
                }
            }
            pending = still;
            if pending.is_empty() {
                break;
            }
        }
        failed
    }

    /// Asks for the rebuild job to look for work (spares to use, slots to rebuild).
    pub(crate) fn want_rebuild(&self) {
        if self.read_only {
            return; // nothing is rebuilt: it would write
        }
        self.health.rebuild_wanted.store(true, Ordering::SeqCst);
        if self.health.failed.load(Ordering::SeqCst)
            || self.health.rebuild_active.swap(true, Ordering::SeqCst)
        {
            return;
        }
        if let Err(e) = super::rebuild::queue(self) {
            self.health.rebuild_active.store(false, Ordering::SeqCst);
            log::error!("{e}");
        }
    }

    /// Holds off every request and rebuild batch (for moving or detaching members).
    pub(crate) fn exclusive(&self) -> RwLockWriteGuard<'_, ()> {
        self.membership.write().unwrap_or_else(|e| e.into_inner())
    }

    /// Puts a spare into every faulty or missing slot it can take (the faulty member is detached), each as a
    /// rebuild target from row 0. Call without holding `membership`.
    pub(crate) fn take_spares(&self) {
        let _exclusive = self.exclusive();
        let mut meta = self.lock_meta_to_change();
        let members = self.geometry.members;
        let mut changed = false;
        for slot in 0..members {
            if !matches!(
                self.slot_state(slot),
                SlotState::Faulty | SlotState::Missing
            ) {
                continue;
            }
            let busy: Vec<usize> = (0..members)
                .map(|s| self.slots[s].target_io.load(Ordering::Acquire))
                .collect();
            let Some(entry) = (members..meta.slots.len()).find(|e| {
                meta.slots[*e].state == SlotState::Spare && self.io.present(*e) && !busy.contains(e)
            }) else {
                break;
            };
            let old = self.io.label(slot);
            self.io.detach(slot);
            if let Err(e) = self.io.move_member(entry, slot) {
                log::error!(
                    "cannot move spare {} into slot {slot}: {e}",
                    self.io.label(entry)
                );
                continue;
            }
            self.health.epoch.fetch_add(1, Ordering::SeqCst);
            meta.slots[slot].member_uuid = meta.slots[entry].member_uuid;
            meta.slots[entry] = SlotEntry::UNUSED;
            let rt = &self.slots[slot];
            rt.reset_errors();
            rt.set_target(slot, 0, 0);
            self.set_state(slot, SlotState::Rebuilding);
            log::warn!(
                "spare {} takes over slot {slot} (was {old}); rebuilding it",
                self.io.label(slot)
            );
            changed = true;
        }
        if changed {
            let state = meta.state;
            let _ = self.persist_locked(&mut meta, state);
        }
    }

    // -----------------------------------------------------------------------------------------------------
    // Administration

    fn check_slot(&self, slot: usize) -> Result<(), EngineError> {
        if slot < self.geometry.members {
            Ok(())
        } else {
            Err(EngineError::ChangeMember {
                slot,
                why: format!(
                    "no such slot: the array has slots 0..{}",
                    self.geometry.members
                ),
            })
        }
    }

    /// Marks `slot` faulty (the admin's `fail`), durably. Refused when it would take the array beyond its
    /// tolerance. Failing a rebuilding slot aborts its rebuild.
    pub fn fail_member(&self, slot: usize) -> Result<(), EngineError> {
        self.refuse_if_read_only("fail")?;
        self.check_slot(slot)?;
        {
            // The tolerance is checked and the member evicted under one hold of the superblock lock: two fails at
            // once must not each find the other's member still in.
            let mut meta = self.lock_meta_to_change();
            match self.slot_state(slot) {
                SlotState::Active => {
                    let missing: Vec<bool> = (0..self.geometry.members)
                        .map(|s| s == slot || !self.is_active(s))
                        .collect();
                    if !self.geometry.survives(&missing) {
                        return Err(EngineError::ChangeMember {
                            slot,
                            why: format!(
                                "failing it would leave {} beyond its tolerance",
                                self.geometry.level
                            ),
                        });
                    }
                    self.evict_locked(&mut meta, slot, "failed by the administrator");
                }
                SlotState::Rebuilding => {
                    self.evict_locked(&mut meta, slot, "failed by the administrator")
                }
                _ => {}
            }
        }
        self.want_rebuild();
        self.wait_durable().or_else(|e| match e {
            EngineError::ServeRequest { .. } => Ok(()),
            e => Err(e),
        })
    }

    /// Detaches the member of a faulty or missing slot, or a spare (an entry at or beyond the member count).
    pub fn remove_member(&self, slot: usize) -> Result<(), EngineError> {
        self.refuse_if_read_only("remove")?;
        let members = self.geometry.members;
        if slot >= crate::superblock::SLOT_ENTRIES {
            return Err(EngineError::ChangeMember {
                slot,
                why: "no such slot table entry".to_string(),
            });
        }
        let _exclusive = self.exclusive();
        let mut meta = self.lock_meta_to_change();
        if slot < members {
            match self.slot_state(slot) {
                SlotState::Faulty | SlotState::Missing => {}
                state => {
                    return Err(EngineError::ChangeMember {
                        slot,
                        why: format!("it is {state}: fail it first"),
                    })
                }
            }
            if self.slots[slot].target_io.load(Ordering::Acquire) != NO_TARGET {
                return Err(EngineError::ChangeMember {
                    slot,
                    why: "its replacement is being built".to_string(),
                });
            }
            let label = self.io.label(slot);
            self.io.detach(slot);
            self.set_state(slot, SlotState::Missing);
            log::warn!("member {label} removed from slot {slot}");
        } else {
            let entry = meta.slots[slot].state;
            let busy =
                (0..members).any(|s| self.slots[s].target_io.load(Ordering::Acquire) == slot);
            if busy || !matches!(entry, SlotState::Spare | SlotState::Faulty) {
                return Err(EngineError::ChangeMember {
                    slot,
                    why: if busy {
                        "it is a replacement being built".to_string()
                    } else {
                        "no spare there".to_string()
                    },
                });
            }
            log::warn!("spare {} removed (entry {slot})", self.io.label(slot));
            self.io.detach(slot);
            meta.slots[slot] = SlotEntry::UNUSED;
        }
        self.health.epoch.fetch_add(1, Ordering::SeqCst);
        let state = meta.state;
        self.persist_locked(&mut meta, state)
    }

    /// Adds a member: it takes over a faulty or missing slot whose member was removed (a rebuild onto it
    /// starts at once), or else waits as a hot spare (taking over the next slot that fails).
    pub fn add_member(&self, member: NewMember) -> Result<AddOutcome, EngineError> {
        self.refuse_if_read_only("add")?;
        self.check_serving()?;
        if self.geometry.tolerated_missing() == 0 {
            return Err(EngineError::AddMember {
                member: member.to_string(),
                why: format!(
                    "{} keeps no redundancy, so it could never be rebuilt onto",
                    self.geometry.level
                ),
            });
        }
        let members = self.geometry.members;
        let open_slot = |s: usize| {
            matches!(self.slot_state(s), SlotState::Faulty | SlotState::Missing)
                && !self.io.present(s)
                && self.slots[s].target_io.load(Ordering::Acquire) == NO_TARGET
        };
        // The member that left a slot, back with what it held then: its own slot, and only the regions written
        // since are rebuilt, where the bitmap shows them all.
        let returning = self.returning_member(&member).filter(|r| open_slot(r.slot));
        let into_slot = match &returning {
            Some(r) => Some(r.slot),
            None => (0..members).find(|&s| open_slot(s)),
        };
        let at = match into_slot {
            Some(slot) => slot,
            None => self.free_entry()?,
        };
        let new_uuid = self.attach_new(at, &member)?;
        let _exclusive = self.exclusive();
        let mut meta = self.lock_meta_to_change();
        self.health.epoch.fetch_add(1, Ordering::SeqCst);
        let outcome = if at < members {
            // Checked again under the lock: the slot still records this member as the one that left it.
            let re_added = returning
                .as_ref()
                .filter(|r| meta.slots[at].member_uuid == r.member_uuid && !self.is_active(at));
            let rt = &self.slots[at];
            rt.reset_errors();
            rt.set_target(at, 0, re_added.map_or(0, |r| r.in_sync_rows));
            self.set_state(at, SlotState::Rebuilding);
            match re_added {
                Some(r) => {
                    meta.slots[at].member_uuid = r.member_uuid;
                    if r.in_sync_rows >= self.geometry.rows {
                        log::warn!(
                            "{member} re-added in slot {at}, which it left at events {}: rebuilding only the \
                             regions the write-intent bitmap marks as written since",
                            r.events
                        );
                    } else {
                        log::warn!(
                            "{member} re-added in slot {at}, which it left at events {} in the middle of its \
                             rebuild: rebuilding the regions the write-intent bitmap marks as written since below \
                             byte {} (where that rebuild had come), the rest completely",
                            r.events,
                            r.in_sync_rows * self.geometry.chunk_bytes
                        );
                    }
                    AddOutcome::ReAdded { slot: at }
                }
                None => {
                    meta.slots[at].member_uuid = new_uuid;
                    log::warn!("{member} added in slot {at}; rebuilding it");
                    AddOutcome::Rebuilding { slot: at }
                }
            }
        } else {
            meta.slots[at] = SlotEntry {
                state: SlotState::Spare,
                recovery_offset_bytes: 0,
                member_uuid: new_uuid,
                rebuild_from_bitmap: false,
            };
            log::info!("{member} added as a spare (entry {at})");
            AddOutcome::Spare { entry: at }
        };
        let state = meta.state;
        let persisted = self.persist_locked(&mut meta, state);
        drop(meta);
        drop(_exclusive);
        persisted?;
        self.want_rebuild();
        Ok(outcome)
    }

    /// Builds a copy of `slot` on `member` while the current member goes on serving; once it is in sync the
    /// new member takes the slot and the old one is detached. A restart before that leaves the new member a
    /// spare.
    pub fn replace_member(&self, slot: usize, member: NewMember) -> Result<(), EngineError> {
        self.refuse_if_read_only("replace")?;
        self.check_slot(slot)?;
        self.check_serving()?;
        if self.geometry.tolerated_missing() == 0 {
            return Err(EngineError::ChangeMember {
                slot,
                why: format!(
                    "{} keeps no redundancy to build a replacement from",
                    self.geometry.level
                ),
            });
        }
        if self.slot_state(slot) != SlotState::Active {
            return Err(EngineError::ChangeMember {
                slot,
                why: format!(
                    "it is {}: only an active member is replaced",
                    self.slot_state(slot)
                ),
            });
        }
        if self.slots[slot].target_io.load(Ordering::Acquire) != NO_TARGET {
            return Err(EngineError::ChangeMember {
                slot,
                why: "a replacement is already being built".to_string(),
            });
        }
        let entry = self.free_entry()?;
        let uuid = self.attach_new(entry, &member)?;
        let mut meta = self.lock_meta_to_change();
        self.health.epoch.fetch_add(1, Ordering::SeqCst);
        meta.slots[entry] = SlotEntry {
            state: SlotState::Spare,
            recovery_offset_bytes: 0,
            member_uuid: uuid,
            rebuild_from_bitmap: false,
        };
        let rt = &self.slots[slot];
        rt.set_target(entry, 0, 0);
        log::warn!(
            "replacing {} (slot {slot}) by {member}: building the copy",
            self.io.label(slot)
        );
        let state = meta.state;
        let persisted = self.persist_locked(&mut meta, state);
        drop(meta);
        persisted?;
        self.want_rebuild();
        Ok(())
    }

    /// Fails or succeeds `evict`-style after `threshold` failed I/Os per member (default 8).
    pub fn set_error_threshold(&self, failed_ios: u32) {
        self.health
            .error_threshold
            .store(failed_ios.max(1), Ordering::Relaxed);
    }

    /// A free slot table entry at or beyond the member count (for a spare or a replacement).
    fn free_entry(&self) -> Result<usize, EngineError> {
        let meta = self.lock_meta();
        (self.geometry.members..meta.slots.len())
            .find(|e| meta.slots[*e].state == SlotState::Unused && !self.io.present(*e))
            .ok_or(EngineError::ChangeMember {
                slot: self.geometry.members,
                why: "every slot table entry is in use".to_string(),
            })
    }

    /// What `member`'s own superblock says, if it is this array's member that left one of its slots while
    /// the write-intent bitmap kept every bit (`Superblock::bitmap_kept_since_events`): it was active there in its
    /// own view (or rebuilding, up to its checkpoint), the slot table still records it as the slot's member, and
    /// the bits have been kept since before it left. Such a member holds everything written before it left (below
    /// the checkpoint), and the bitmap marks every region written since. None for anything else (a blank member,
    /// another array's, one that left before the bits were kept).
    fn returning_member(&self, member: &NewMember) -> Option<ReturningMember> {
        if !self.integrity.has_bitmap() {
            return None;
        }
        let sb = match member {
            NewMember::Path(path) => crate::assemble::examine(path).ok()?,
            NewMember::Existing { image, .. } => {
                Superblock::decode(image.get(..SUPERBLOCK_BYTES)?).ok()?
            }
            NewMember::Image { .. } => return None,
        };
        let in_sync_rows = crate::assemble::in_sync_outside_bitmap_rows(&self.lock_meta(), &sb);
        (in_sync_rows > 0).then_some(ReturningMember {
            slot: sb.slot,
            member_uuid: sb.member_uuid,
            events: sb.events,
            in_sync_rows,
        })
    }

    /// Attaches `member` at io index `at`, checks it (size, not another array's member), zeroes its reserved
    /// area and gives it a fresh member UUID (written with the next superblock update).
    fn attach_new(&self, at: usize, member: &NewMember) -> Result<Uuid, EngineError> {
        let refuse = |why: String| EngineError::AddMember {
            member: member.to_string(),
            why,
        };
        self.io
            .attach(at, member)
            .map_err(|e| refuse(format!("cannot attach it: {e}")))?;
        let checked = (|| {
            let meta = self.lock_meta().clone();
            let need = meta.required_member_bytes();
            let have = self.io.size_bytes(at);
            if have < need {
                return Err(refuse(format!(
                    "it is {have} bytes, the array needs {need} per member"
                )));
            }
            let mut block = crate::buf::AlignedBuf::zeroed(SUPERBLOCK_BYTES);
            let failures = self.submit_plain(vec![IoReq::read(at, 0, &mut block)]);
            if let Some(e) = failures {
                return Err(refuse(format!("cannot read it: {e}")));
            }
            if let Ok(sb) = Superblock::decode(&block) {
                if sb.uuid != meta.uuid {
                    return Err(refuse(format!(
                        "it holds a member of another array ({}); wipe its first 4 KiB to reuse it",
                        sb.uuid
                    )));
                }
            }
            // The reserved area (bitmap, log) of a new member starts zeroed, as `create` leaves it.
            let zero = vec![IoReq::discard(at, 0, meta.data_offset_bytes)];
            if let Some(e) = self.submit_plain(zero) {
                return Err(refuse(format!("cannot zero its reserved area: {e}")));
            }
            Uuid::random().map_err(|source| EngineError::GenerateUuid { source })
        })();
        if checked.is_err() {
            self.io.detach(at);
        }
        checked
    }

    /// Submits requests outside the failure accounting (a member not yet in the array); the first error.
    fn submit_plain(&self, mut reqs: Vec<IoReq<'_>>) -> Option<io::Error> {
        self.io.submit(&mut reqs);
        reqs.into_iter().find_map(|r| r.result.err())
    }

    /// Labels of the hot spares.
    pub fn spares(&self) -> Vec<String> {
        self.spare_entries()
            .into_iter()
            .map(|(_, label)| label)
            .collect()
    }

    /// The hot spares with their slot table entries (what `remove_member` takes to detach one).
    pub fn spare_entries(&self) -> Vec<(usize, String)> {
        let meta = self.lock_meta();
        (self.geometry.members..meta.slots.len())
            .filter(|e| meta.slots[*e].state == SlotState::Spare)
            .filter(|e| {
                !(0..self.geometry.members)
                    .any(|s| self.slots[s].target_io.load(Ordering::Acquire) == *e)
            })
            .map(|e| (e, self.io.label(e)))
            .collect()
    }

    /// The slot table entry of the member a live replacement builds for `slot`, if one does.
    pub(crate) fn replacement_target(&self, slot: usize) -> Option<usize> {
        let target = self.slots[slot].target_io.load(Ordering::Acquire);
        (target != NO_TARGET && target >= self.geometry.members).then_some(target)
    }

    /// Failed I/Os (after retry) counted against `slot` since assembly.
    pub fn slot_errors(&self, slot: usize) -> u32 {
        self.slots[slot].errors.load(Ordering::Acquire)
    }
}
