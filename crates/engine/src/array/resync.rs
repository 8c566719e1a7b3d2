//! Consistency after an unclean stop: the write-intent bitmap and the partial parity log of a running array
//! (`Integrity`), what assembly does with them, the background resync of dirty regions, and the clean stop.
//!
//! At assembly of a dirty array: every stripe the partial parity log names is made consistent before the array
//! serves (from the log where a member is missing); then, with every member present, the regions the bitmap
//! marks are resynced in the background (job kind "resync"), their bits kept until done. A clean stop lets a
//! running resync finish, clears the bitmap and retires the log before the superblocks say clean.

use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::background::Background;
use super::bitmap::{integrity_layout, Bitmap};
use super::check::{batch_stripes, verify_stripes, CheckFinding, Fix};
use super::ppl::{FlushMark, LogOptions, LogRecovery, LogStats, Ppl};
use super::{Array, ArrayCore};
use crate::buf::AlignedBuf;
use crate::error::EngineError;
use crate::layout::{Geometry, PAGE_BYTES};
use crate::member::IoReq;
use crate::superblock::{ArrayState, Superblock, FORMAT_VERSION};

/// How often the background tick looks for bits to clear and log records to retire.
const TICK: Duration = Duration::from_secs(1);
/// Environment variable that turns the partial parity log off ("0", "off", "false"): for measuring its cost.
pub const PPL_ENV: &str = "PARAID_PPL";
/// Environment variable that turns the log's stream entries off: for measuring what they gain.
pub const PPL_STREAMS_ENV: &str = "PARAID_PPL_STREAMS";
/// Environment variable that turns journal mode on ("1", "on", "true", "yes"): `AssembleOptions::journal`.
pub const JOURNAL_ENV: &str = "PARAID_JOURNAL";

/// What `PARAID_JOURNAL` says (off unless set to "1", "on", "true" or "yes", any case).
pub fn journal_from_env() -> bool {
    super::switched_on_by_env(JOURNAL_ENV)
}

/// Gives a superblock the version 2 bitmap and partial parity log layout (at create, and when assembly upgrades a
/// version 1 array: its area between the superblock and the data was zeroed by create and never used).
pub(crate) fn set_integrity_layout(sb: &mut Superblock) {
    let layout = integrity_layout(&sb.geometry(), sb.data_offset_bytes);
    sb.format_version = FORMAT_VERSION;
    sb.bitmap_chunk_bytes = layout.bitmap_chunk_bytes;
    sb.bitmap_bytes = layout.bitmap_bytes;
    sb.ppl_offset_bytes = layout.ppl_offset_bytes;
    sb.ppl_bytes = layout.ppl_bytes;
}

/// The bitmap, the log and what they did, as `Array::integrity` reports them.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct IntegrityReport {
    /// Bitmap regions, array bytes per region, regions whose bit is set now, bitmap page writes so far.
    pub bitmap_regions: u64,
    pub region_bytes: u64,
    pub dirty_regions: u64,
    pub bitmap_pages_written: u64,
    /// Whether writes are logged (RAID5/6 with a log ring, not turned off).
    pub log_enabled: bool,
    pub log_rounds: u64,
    pub log_entries: u64,
    pub log_payload_bytes: u64,
    pub log_record_writes: u64,
    pub log_retirements: u64,
    pub log_retire_flushes: u64,
    /// Read-modify-writes the log turned into reconstruct-writes (a chunk of the stripe not yet durable).
    pub log_rmw_to_rcw: u64,
    /// Flushes of every member the background tick made for chunks not yet durable (see `integrity_tick`).
    pub log_tick_flushes: u64,
    /// Stripes written without a log entry of their own, riding a stream entry; stream entries extended ahead.
    pub log_rides: u64,
    pub log_stream_extensions: u64,
    /// Journal mode: writes whose data was logged before they read anything, and answered then.
    pub log_data_first: u64,
    /// Journal mode: writes that logged their partial parity alone, the log being deep (or, with lone answers,
    /// the write not alone), and were answered once written in place.
    pub log_parity_alone: u64,
    /// Journal mode with lone answers: writes that found another awaiting its answer and took the log's own way
    /// instead of an answer from the log.
    pub log_not_lone: u64,
    /// Full-stripe writes into a stripe whose newest live entry was a whole marker already, which logged none.
    pub log_markers_skipped: u64,
    /// Journal mode with a gate on spare CPU (`AssembleOptions::spare_cpu`): writes waited for that found the CPU
    /// busy and took the log's own way.
    pub log_cpu_busy: u64,
    /// Journal mode gated on spare CPU: writes the CPU allowed an early answer beside others awaiting theirs that
    /// took the log's own way because the members queue requests (array/queueing.rs).
    pub log_members_queue: u64,
    /// Writes whose log entries borrowed a chunk another write left not yet durable; those of them that waited
    /// for a client flush under way, and their wait (µs); client flushes that waited for such writes in flight,
    /// and their wait (µs). Borrowers and flushes wait for each other so that no flushed chunk leans on parity
    /// a torn write could change (docs/reliability.md).
    pub log_borrowing: u64,
    pub log_borrowing_waits: u64,
    pub log_borrowing_wait_us: u64,
    pub log_barrier_waits: u64,
    pub log_barrier_wait_us: u64,
    /// RAID5: stripes whose entries went to a written chunk's member's ring, not the P member's (ppl/spread.rs).
    pub log_entries_off_parity: u64,
    /// What assembly recovered from the log (a dirty array).
    pub log_recovered_stripes: u64,
    pub log_recovered_pages: u64,
    pub log_solved_chunks: u64,
    /// Journal mode: chunk pages written in place from the log's data entries (rolled forward).
    pub log_pages_rolled_forward: u64,
    /// Journal mode is on (`AssembleOptions::journal`, and the log writes entries).
    pub journal: bool,
    /// Journal mode: which writes may be answered early: "every" (every small write), "lone" (a write no other
    /// awaits an answer beside, `AssembleOptions::journal_lone_answers`), "spare-cpu" (as the machine's idle CPU
    /// allows, `AssembleOptions::spare_cpu`); empty without the journal.
    pub journal_answers: &'static str,
    /// Journal mode gated on spare CPU under a CPU quota (cpu_quota.rs): the quota, in thousandths of a CPU; 0
    /// where the gate reads the machine's idle share alone (or there is no gate).
    pub spare_cpu_quota_millicpus: u64,
    /// Journal mode gated on spare CPU: what the members' queues say now (array/queueing.rs: "free", "queueing",
    /// "saturated"; empty without the gate); the windows of member batches fitted since assembly, of which so many
    /// ended queueing (saturated included) and saturated; the last window's time per request ahead (µs) and its
    /// busiest member's estimated busy share (per mille).
    pub member_load: &'static str,
    pub member_queue_windows: u64,
    pub member_queue_windows_queueing: u64,
    pub member_queue_windows_saturated: u64,
    pub member_queue_slope_us: u64,
    pub member_busy_permille: u64,
    /// Stripes verified by resyncs since assembly, and stripes they rewrote.
    pub resync_stripes: u64,
    pub resync_rewritten: u64,
}

/// The integrity state of a running array.
pub(crate) struct Integrity {
    bitmap: Option<Bitmap>,
    ppl: Option<Ppl>,
    findings: Mutex<Vec<CheckFinding>>,
    recovery: Mutex<Option<LogRecovery>>,
    resync_stripes: AtomicU64,
    resync_rewritten: AtomicU64,
    /// A resync job is queued or running.
    resync_queued: AtomicBool,
    /// The background tick may do its work (a deterministic simulation turns it off).
    tick_enabled: AtomicBool,
    ticker: Background,
}

/// A write counted in the bitmap; dropping it ends the count.
pub(super) struct WriteIntent<'a> {
    bitmap: Option<&'a Bitmap>,
    regions: Range<u64>,
}

impl Drop for WriteIntent<'_> {
    fn drop(&mut self) {
        if let Some(b) = self.bitmap {
            b.end(self.regions.clone());
        }
    }
}

/// Taken before a flush of every member, handed back after it.
pub(super) struct FlushToken {
    bitmap_ms: u64,
    ppl: Option<FlushMark>,
}

impl Integrity {
    /// The bitmap and log `meta` describes (empty until `start` reads them from the members).
    pub(super) fn new(geometry: &Geometry, meta: &Superblock, log: LogOptions) -> Integrity {
        let bitmap = (meta.bitmap_chunk_bytes != 0).then(|| {
            Bitmap::new(
                geometry,
                meta.bitmap_offset_bytes,
                meta.bitmap_chunk_bytes,
                &[],
            )
        });
        let ppl = Ppl::new(
            geometry,
            meta.uuid,
            meta.ppl_offset_bytes,
            meta.ppl_bytes,
            log,
        );
        Integrity {
            bitmap,
            ppl,
            findings: Mutex::new(Vec::new()),
            recovery: Mutex::new(None),
            resync_stripes: AtomicU64::new(0),
            resync_rewritten: AtomicU64::new(0),
            resync_queued: AtomicBool::new(false),
            tick_enabled: AtomicBool::new(true),
            ticker: Background::new(),
        }
    }

    /// Whether `stripe` (a chunk, for RAID1/10) waits for the resync after an unclean stop: its copies may still
    /// differ (the resync copies the first present copy over the others), or its parity may still disagree with
    /// its data. A RAID1/10 read then goes to the copy the resync copies from; a RAID5/6 write must not take the
    /// old parity as a base (read-modify-write) but computes parity from the data (reconstruct-write), so that what
    /// it writes, and the partial parity it logs, hold whatever the old parity said (concurrent simulation, seed
    /// 114034: a write beside the resync logged a partial parity derived from torn parity, and a member missing
    /// after the next power loss was solved from it).
    pub(super) fn awaits_resync(&self, stripe: u64) -> bool {
        self.bitmap
            .as_ref()
            .is_some_and(|b| b.resync_pending(stripe / b.region_stripes()))
    }

    /// A member is about to join (a rebuild onto it is complete): it gets the whole bitmap (its area knows
    /// nothing of this array's life, while bits in memory may have been set long ago and never written again)
    /// and a partial parity log ring: the ring of the member it replaces (live replacement), else an empty one
    /// (old records of its could be taken for live ones).
    pub(super) fn member_joined(&self, array: &Array, slot: usize) -> Result<(), EngineError> {
        if let Some(bitmap) = &self.bitmap {
            bitmap.write_all_to(array, slot)?;
        }
        if let Some(ppl) = &self.ppl {
            // A live replacement (io index `slot` is the rebuild target of another, active slot) takes over
            // that slot's ring; a member rebuilt into its own slot starts empty.
            let g = array.geometry;
            let replaced = (0..g.members)
                .find(|&s| s != slot && array.is_active(s) && array.target_below(s, 0).0 == slot);
            match replaced {
                Some(from) => ppl.hand_over_ring(array, from, slot)?,
                None => {
                    // Its earlier occupant's ring may hold halves of live RAID6 entries whose other halves are
                    // on present members: once the slot is active again with an empty ring, recovery would take
                    // such an entry for one whose round never finished (`Ppl::pair_halves`). The caller holds
                    // requests off and flushed every member, so every round can be retired first.
                    ppl.retire_all(array)?;
                    ppl.reset_member(array, slot)?
                }
            }
        }
        Ok(())
    }

    /// The log, when it writes entries (the write path asks).
    pub(super) fn ppl(&self) -> Option<&Ppl> {
        self.ppl.as_ref().filter(|p| p.enabled())
    }

    /// The consistency policy in force, as `ArrayDetail::consistency_policy` names it.
    pub(super) fn policy(&self) -> &'static str {
        match (self.ppl(), self.bitmap.is_some()) {
            (Some(ppl), _) if ppl.journal() => "journal",
            (Some(_), _) => "ppl",
            (None, true) => "bitmap",
            (None, false) => "none",
        }
    }

    /// Counts a foreground write (or discard) of array bytes `offset..offset + len` and makes sure the bitmap
    /// marks its regions on every active member first.
    pub(super) fn begin_write<'a>(
        &'a self,
        array: &Array,
        offset_bytes: u64,
        len_bytes: u64,
    ) -> Result<WriteIntent<'a>, EngineError> {
        let Some(bitmap) = self.bitmap.as_ref().filter(|_| len_bytes > 0) else {
            return Ok(WriteIntent {
                bitmap: None,
                regions: 0..0,
            });
        };
        let stripe_bytes = array.geometry.stripe_bytes();
        let first = offset_bytes / stripe_bytes;
        let last = (offset_bytes + len_bytes - 1) / stripe_bytes;
        let regions = bitmap.regions_of(first, last - first + 1);
        let intent = WriteIntent {
            bitmap: Some(bitmap),
            regions: regions.clone(),
        };
        bitmap.begin(array, regions)?;
        Ok(intent)
    }

    /// Whether a write-intent bitmap is kept (RAID1/5/6/10).
    pub(super) fn has_bitmap(&self) -> bool {
        self.bitmap.is_some()
    }

    /// Stripes per bitmap region; None without a bitmap.
    pub(super) fn bitmap_region_stripes(&self) -> Option<u64> {
        self.bitmap.as_ref().map(|b| b.region_stripes())
    }

    /// Whether any bitmap region of stripes `first..first + count` is marked written (true without a bitmap:
    /// nothing is known to be in sync). A rebuild of a re-added member asks with the stripes' locks held: a write
    /// sets its bits before it takes them (`begin_write`), so one that the answer misses comes after the rebuild
    /// passed those rows, and goes to the member itself.
    pub(super) fn any_written(&self, first: u64, count: u64) -> bool {
        match &self.bitmap {
            Some(bitmap) => bitmap.any_set(bitmap.regions_of(first, count)),
            None => true,
        }
    }

    /// The same for writes of the array's own (repair, resync) to stripes `first..first + count`.
    pub(super) fn begin_internal_write(
        &self,
        array: &Array,
        first: u64,
        count: u64,
    ) -> Result<Option<Range<u64>>, EngineError> {
        // A repair changes what chunks hold; the caller holds the stripes' locks (stripe_cache.rs).
        array.stripe_cache.forget(first, count);
        let Some(bitmap) = self.bitmap.as_ref() else {
            return Ok(None);
        };
        let regions = bitmap.regions_of(first, count);
        if let Err(e) = bitmap.begin(array, regions.clone()) {
            bitmap.end(regions);
            return Err(e);
        }
        Ok(Some(regions))
    }

    pub(super) fn end_internal_write(&self, regions: Option<Range<u64>>) {
        if let (Some(bitmap), Some(regions)) = (self.bitmap.as_ref(), regions) {
            bitmap.end(regions);
        }
    }

    pub(super) fn flush_begin(&self) -> FlushToken {
        FlushToken {
            bitmap_ms: self.bitmap.as_ref().map_or(0, |b| b.flush_started()),
            ppl: self.ppl.as_ref().map(|p| p.barrier_begin()),
        }
    }

    /// Ends a flush begun by `flush_begin`; `completed` when every member's flush succeeded (otherwise nothing
    /// is taken as durable, and only the log's barrier is lifted).
    pub(super) fn flush_done(&self, token: FlushToken, completed: bool) {
        if let Some(b) = self.bitmap.as_ref().filter(|_| completed) {
            b.flushed(token.bitmap_ms);
        }
        if let (Some(p), Some(mark)) = (&self.ppl, token.ppl) {
            p.barrier_done(mark, completed);
        }
    }

    pub(super) fn clear_findings(&self) {
        self.findings
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
    }

    pub(super) fn add_findings(&self, found: Vec<CheckFinding>, keep: usize) {
        let mut findings = self.findings.lock().unwrap_or_else(|e| e.into_inner());
        let room = keep.saturating_sub(findings.len());
        findings.extend(found.into_iter().take(room));
    }

    pub(super) fn findings(&self) -> Vec<CheckFinding> {
        self.findings
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn report(&self) -> IntegrityReport {
        let log: LogStats = self.ppl.as_ref().map(|p| p.stats()).unwrap_or_default();
        let recovery = self
            .recovery
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .unwrap_or_default();
        IntegrityReport {
            bitmap_regions: self.bitmap.as_ref().map_or(0, |b| b.regions()),
            region_bytes: 0,
            dirty_regions: self
                .bitmap
                .as_ref()
                .map_or(0, |b| b.dirty_regions().len() as u64),
            bitmap_pages_written: self.bitmap.as_ref().map_or(0, |b| b.pages_written()),
            log_enabled: self.ppl().is_some(),
            log_rounds: log.rounds,
            log_entries: log.entries,
            log_payload_bytes: log.payload_bytes,
            log_record_writes: log.record_writes,
            log_retirements: log.retirements,
            log_retire_flushes: log.retire_flushes,
            log_tick_flushes: log.tick_flushes,
            log_rmw_to_rcw: log.rmw_to_rcw,
            log_rides: log.rides,
            log_stream_extensions: log.stream_extensions,
            log_data_first: log.data_first,
            log_parity_alone: log.parity_alone,
            log_not_lone: log.not_lone,
            log_markers_skipped: log.markers_skipped,
            log_cpu_busy: log.cpu_busy,
            log_members_queue: log.members_queue,
            log_borrowing: log.borrowing,
            log_borrowing_waits: log.borrowing_waits,
            log_borrowing_wait_us: log.borrowing_wait_us,
            log_barrier_waits: log.barrier_waits,
            log_barrier_wait_us: log.barrier_wait_us,
            log_entries_off_parity: log.entries_off_parity,
            log_recovered_stripes: recovery.stripes,
            log_recovered_pages: recovery.pages,
            log_solved_chunks: recovery.solved_from_log,
            log_pages_rolled_forward: recovery.pages_rolled_forward,
            journal: self.ppl().is_some_and(|p| p.journal()),
            // Set by `Array::integrity`, which knows the gate on spare CPU.
            journal_answers: "",
            spare_cpu_quota_millicpus: 0,
            member_load: "",
            member_queue_windows: 0,
            member_queue_windows_queueing: 0,
            member_queue_windows_saturated: 0,
            member_queue_slope_us: 0,
            member_busy_permille: 0,
            resync_stripes: self.resync_stripes.load(Ordering::Relaxed),
            resync_rewritten: self.resync_rewritten.load(Ordering::Relaxed),
        }
    }

    /// Ends the background tick and waits for it.
    pub(super) fn stop_ticker(&self) {
        self.ticker.stop("the bitmap tick");
    }
}

/// Reads the bitmap areas of every active member (their union is what the array starts from).
fn read_bitmap(array: &Array, meta_offset: u64, bytes: u64) -> Result<Vec<u8>, EngineError> {
    let slots: Vec<usize> = array.active_slots().collect();
    let len = bytes as usize;
    let mut areas: Vec<AlignedBuf> = slots.iter().map(|_| AlignedBuf::zeroed(len)).collect();
    let reqs: Vec<IoReq<'_>> = areas
        .iter_mut()
        .zip(&slots)
        .map(|(a, &slot)| IoReq::read(slot, meta_offset, &mut a[..len]))
        .collect();
    array.run(reqs)?;
    let mut union = vec![0u8; len];
    for a in &areas {
        for (u, b) in union.iter_mut().zip(a.iter()) {
            *u |= *b;
        }
    }
    Ok(union)
}

/// Whether a resync can check the stripes: every member present, or (RAID6) one missing, whose chunks are
/// solved as reads solve them while the other parity is checked. With no redundancy left beyond the missing
/// members (RAID5 degraded, RAID6 with two missing) there is nothing to check against, and a member missing
/// at restart must not have its chunk (which lives only in the parity) recomputed away: the partial parity log
/// recovered the stripes being written, and a rebuild makes the rest consistent by construction.
fn can_resync(array: &Array) -> bool {
    let g = array.geometry;
    let missing = g.members - array.active_slots().count();
    !g.level.has_parity() || missing < g.level.parity_chunks()
}

/// The resync job: every stripe of `regions`, batch by batch under the stripe locks; a region's bit may go once
/// it is done. Returns the regions left when a rebuild preempted it.
fn resync_regions(
    array: &Array,
    bitmap: &Bitmap,
    regions: &[u64],
    span: impl Fn(u64) -> Range<u64>,
    mut job: super::state::Job<'_>,
) -> Option<Vec<u64>> {
    let g = array.geometry;
    let batch = batch_stripes(array);
    for (n, &region) in regions.iter().enumerate() {
        // A rebuild waiting goes first and the rest of the resync queues up behind it; a stopping array ends it
        // (its bits stay set: the next assembly resumes it).
        if job.preempted() {
            job.finish("interrupted");
            return Some(regions[n..].to_vec());
        }
        if job.stopping() {
            job.finish("interrupted");
            return None;
        }
        if !can_resync(array) {
            for &r in &regions[n..] {
                bitmap.resync_done(r);
            }
            job.finish("aborted: too many members missing (their rebuild recomputes the stripes)");
            return None;
        }
        let mut s = span(region).start;
        while s < span(region).end {
            let count = batch.min(span(region).end - s);
            match verify_stripes(array, s, count, Fix::Resync) {
                Ok(r) => {
                    job.add_mismatches(r.mismatches);
                    job.add_repaired(r.repaired);
                    array
                        .integrity
                        .resync_stripes
                        .fetch_add(r.stripes, Ordering::Relaxed);
                    array
                        .integrity
                        .resync_rewritten
                        .fetch_add(r.repaired, Ordering::Relaxed);
                }
                Err(e) => {
                    log::error!("resync stopped at stripe {s}: {e}");
                    job.finish(&format!("aborted: {e}"));
                    return None;
                }
            }
            job.advance(count * g.stripe_bytes());
            job.throttle();
            s += count;
        }
        bitmap.resync_done(region);
    }
    job.finish("completed");
    None
}

impl Array {
    /// Assembly, once the dirty superblocks are written: loads the bitmap, recovers what the partial parity log
    /// names (a dirty array), queues the resync of dirty regions, and starts the background tick.
    pub(super) fn start_integrity(&self, was_dirty: bool) -> Result<(), EngineError> {
        let integrity = &self.integrity;
        if let Some(bitmap) = &integrity.bitmap {
            self.load_bitmap(bitmap)?;
            bitmap.persist_loaded(self)?;
        }
        if let Some(ppl) = &integrity.ppl {
            if was_dirty {
                self.recover_from_log(ppl)?;
            } else {
                ppl.resume(self)?;
            }
        }
        if let Some(bitmap) = &integrity.bitmap {
            let dirty = bitmap.dirty_regions();
            if was_dirty && !dirty.is_empty() && can_resync(self) {
                log::warn!(
                    "array was not stopped cleanly: resyncing {} of {} regions in the background",
                    dirty.len(),
                    bitmap.regions()
                );
                self.queue_resync(dirty)?;
            } else if was_dirty && !dirty.is_empty() {
                log::warn!(
                    "array was not stopped cleanly and runs degraded: {} dirty regions cannot be resynced \
                     (no redundancy left to check them against; the partial parity log covered the stripes being \
                     written, and a rebuild recomputes the rest)",
                    dirty.len()
                );
            }
        } else if was_dirty {
            log::warn!(
                "array was not stopped cleanly; it keeps no bitmap (nothing to resync for RAID0)"
            );
        }
        self.start_ticker()
    }

    /// `start_integrity` for an array served read-only, whose members sit behind an overlay that keeps every
    /// write in memory (member/overlay.rs): the bitmap is read and, after an unclean stop, the partial parity log
    /// recovers the stripes being written at the crash as a read-write start does, into the overlay, so that a
    /// missing member's chunks are solved from consistent parity; nothing is resynced. The dirty regions stay
    /// marked as awaiting a resync where that decides what a read returns: RAID1/10 read there the copy a resync
    /// would copy from, and a RAID5/6 array without the log (consistency policy "bitmap") solves no chunk there
    /// (with a member missing it is refused: nothing made its stripes consistent).
    pub(super) fn start_integrity_read_only(
        &self,
        was_dirty: bool,
        missing: &[usize],
    ) -> Result<(), EngineError> {
        if !was_dirty {
            return Ok(());
        }
        // Without the log on, this array's writes were not logged (the consistency policy is the operator's
        // word for how it ran): its stripes being written at the crash cannot be made consistent.
        let unrecovered = self.geometry.level.has_parity()
            && !self.integrity.ppl.as_ref().is_some_and(|p| p.enabled());
        if unrecovered && !missing.is_empty() {
            return Err(EngineError::AssembleReadOnly {
                why: format!(
                    "it was not stopped cleanly, slots {missing:?} are not in sync, and it keeps no partial parity \
                     log to make the stripes being written at the crash consistent before their chunks are solved"
                ),
            });
        }
        // As at a read-write start: the bitmap first, then the log's recovery (into the overlay).
        if let Some(bitmap) = &self.integrity.bitmap {
            self.load_bitmap(bitmap)?;
        }
        if let Some(ppl) = &self.integrity.ppl {
            self.recover_from_log(ppl)?;
        }
        let Some(bitmap) = &self.integrity.bitmap else {
            return Ok(());
        };
        let dirty = bitmap.dirty_regions();
        if !dirty.is_empty() {
            log::warn!(
                "array was not stopped cleanly and is served read-only: {} of {} regions are not resynced{}",
                dirty.len(),
                bitmap.regions(),
                if !self.geometry.level.has_parity() {
                    " (reads there take the copy a resync would copy from)"
                } else if unrecovered {
                    " (a read there that would need a chunk solved from parity fails instead)"
                } else {
                    ""
                }
            );
            if !self.geometry.level.has_parity() || unrecovered {
                bitmap.set_resync_pending(&dirty);
            }
        }
        Ok(())
    }

    /// After an unclean stop: the stripes the log's live records name made consistent (into the overlay of an
    /// array served read-only), logged and kept for the report.
    fn recover_from_log(&self, ppl: &Ppl) -> Result<(), EngineError> {
        let recovery = ppl.recover(self)?;
        if recovery.stripes > 0 {
            log::warn!(
                "partial parity log: {} stripes ({} pages) of an unclean stop made consistent{}, {} chunks of missing \
                 members solved from the log, {} pages rolled forward from the journal",
                recovery.stripes,
                recovery.pages,
                if self.read_only {
                    " in memory (served read-only: the members are left as they are)"
                } else {
                    ""
                },
                recovery.solved_from_log,
                recovery.pages_rolled_forward
            );
        }
        *self
            .integrity
            .recovery
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some(recovery);
        Ok(())
    }

    /// Loads the bitmap from the members' bitmap areas (the union of their bits).
    fn load_bitmap(&self, bitmap: &Bitmap) -> Result<(), EngineError> {
        let (bitmap_offset, bitmap_bytes) = {
            let meta = self.lock_meta();
            (meta.bitmap_offset_bytes, meta.bitmap_bytes)
        };
        let bytes = bitmap
            .regions()
            .div_ceil(8)
            .next_multiple_of(PAGE_BYTES)
            .min(bitmap_bytes);
        bitmap.load(&read_bitmap(self, bitmap_offset, bytes)?);
        Ok(())
    }

    /// Queues the resync of `regions` (their bits stay set until each is done).
    fn queue_resync(&self, regions: Vec<u64>) -> Result<(), EngineError> {
        let Some(bitmap) = &self.integrity.bitmap else {
            return Ok(());
        };
        bitmap.set_resync_pending(&regions);
        let g = self.geometry;
        let stripes = g.stripes();
        let rs = bitmap.region_stripes();
        let span = move |r: u64| r * rs..((r + 1) * rs).min(stripes);
        let total: u64 = regions
            .iter()
            .map(|&r| (span(r).end - span(r).start) * g.stripe_bytes())
            .sum();
        self.integrity.resync_queued.store(true, Ordering::SeqCst);
        let queued = self.queue_job("resync", None, total, false, move |array, job| {
            let Some(bitmap) = &array.integrity.bitmap else {
                return;
            };
            let rest = resync_regions(array, bitmap, &regions, span, job);
            array.integrity.resync_queued.store(false, Ordering::SeqCst);
            if let Some(rest) = rest {
                // A rebuild went first; the rest of the resync queues up behind it.
                if let Err(e) = array.queue_resync(rest) {
                    log::error!("resync could not be queued again: {e}");
                }
            }
        });
        if queued.is_err() {
            self.integrity.resync_queued.store(false, Ordering::SeqCst);
        }
        queued
    }

    fn start_ticker(&self) -> Result<(), EngineError> {
        if self.integrity.bitmap.is_none() && self.integrity.ppl().is_none() {
            return Ok(());
        }
        let core: std::sync::Weak<ArrayCore> = Arc::downgrade(&self.core);
        let started = self.integrity.ticker.start("paraid-bitmap", move |stop| {
            let mut failures = 0u32;
            loop {
                if stop.wait(TICK) {
                    return;
                }
                let Some(core) = core.upgrade() else {
                    return;
                };
                let array = Array { core, owner: false };
                if !array.integrity.tick_enabled.load(Ordering::Relaxed) {
                    continue;
                }
                if let Err(e) = array.integrity_tick() {
                    failures += 1;
                    if failures <= 3 {
                        log::warn!("bitmap tick: {e}");
                    }
                }
            }
        });
        started.map_err(|source| EngineError::StartJob {
            kind: "bitmap tick",
            why: format!("cannot start a thread: {source}"),
        })
    }

    /// One background tick: clears the bits of idle regions, flushes the members if the log holds chunks not
    /// yet durable, and retires flushed log records.
    fn integrity_tick(&self) -> Result<(), EngineError> {
        if let Some(bitmap) = &self.integrity.bitmap {
            bitmap.tick(self)?;
        }
        if let Some(ppl) = self.integrity.ppl() {
            // A chunk written since the last flush may still be only in its member's cache, so the log must
            // leave it out of every later partial parity of its stripe: a read-modify-write there becomes a
            // reconstruct-write, reading the whole stripe (ppl/entries.rs, `rmw_allowed`). A client that never
            // flushes (O_DIRECT writes between a database's checkpoints, a benchmark) would keep its stripes that
            // way for good: on an array whose members bound the rate, a RAID5 of five then needs six requests
            // for a small write instead of five. One flush of every member a tick lets them go; it is a client's
            // flush in all but who asked (the same barrier and the same eviction of a member whose flush fails),
            // and clients may flush at any moment.
            if ppl.tick_flush_wanted() {
                let _shared = self.shared()?;
                self.flush_shared()?;
                ppl.count_tick_flush();
            }
            ppl.retire_flushed(self)?;
        }
        Ok(())
    }

    /// Before a clean stop: a running resync finishes (a clean array promises matching parity everywhere).
    pub(super) fn integrity_before_stop(&self) {
        // Wait while the resync runs or is about to (not while another job, a rebuild, holds it back).
        while self.integrity.resync_queued.load(Ordering::SeqCst)
            && self.progress().is_none_or(|p| p.kind == "resync")
        {
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// The clean stop, after the final flush: ends the tick, clears the bitmap and retires the log. Returns the
    /// state the superblocks get: dirty if a resync is still owed (its bits stay for the next assembly).
    pub(super) fn integrity_stop(&self) -> Result<ArrayState, EngineError> {
        self.integrity.stop_ticker();
        self.stop_prober();
        if let Some(ppl) = &self.integrity.ppl {
            ppl.retire_all(self)?;
        }
        match &self.integrity.bitmap {
            Some(b) if b.any_resync_pending() => Ok(ArrayState::Dirty),
            // Degraded, the bits say what a member that comes back must be rebuilt in (bitmap.rs, `tick`): they
            // stay. A clean array's bits ask for no resync at the next assembly.
            Some(_) if !self.all_in_sync() => Ok(ArrayState::Clean),
            Some(b) => {
                b.clear_all(self)?;
                Ok(ArrayState::Clean)
            }
            None => Ok(ArrayState::Clean),
        }
    }

    /// The write-intent bitmap and partial parity log figures.
    pub fn integrity(&self) -> IntegrityReport {
        let mut report = self.integrity.report();
        report.region_bytes = self
            .integrity
            .bitmap
            .as_ref()
            .map_or(0, |b| b.region_stripes() * self.geometry.stripe_bytes());
        report.journal_answers = match self.integrity.ppl().filter(|p| p.journal()) {
            None => "",
            Some(_) if self.spare_cpu.is_some() => "spare-cpu",
            Some(p) if p.lone_answers() => "lone",
            Some(_) => "every",
        };
        report.spare_cpu_quota_millicpus = self
            .spare_cpu
            .as_ref()
            .and_then(|gate| gate.quota_millicpus())
            .unwrap_or(0);
        if let Some(queues) = &self.member_queues {
            let q = queues.report();
            report.member_load = match q.load {
                super::queueing::Load::Free => "free",
                super::queueing::Load::Queueing => "queueing",
                super::queueing::Load::Saturated => "saturated",
            };
            report.member_queue_windows = q.windows;
            report.member_queue_windows_queueing = q.windows_queueing;
            report.member_queue_windows_saturated = q.windows_saturated;
            report.member_queue_slope_us = q.last_slope_ns / 1000;
            report.member_busy_permille = q.last_busy_permille;
        }
        report
    }

    /// How long a region must be idle before its bit is cleared (default 5 s; tests shorten it).
    #[doc(hidden)]
    pub fn set_bitmap_idle_clear(&self, idle: Duration) {
        if let Some(b) = &self.integrity.bitmap {
            b.set_idle_clear(idle);
        }
    }

    /// Runs one background tick now (tests).
    #[doc(hidden)]
    pub fn run_integrity_tick(&self) -> Result<(), EngineError> {
        self.integrity_tick()
    }

    /// Turns the once-a-second background tick (bitmap clearing, log retirement) off or on: the one source of
    /// member I/O not driven by requests, so a deterministic simulation turns it off (and calls
    /// `run_integrity_tick` when it wants one). Bits then stay set until a clean stop, and log records are retired
    /// only when the ring runs short.
    #[doc(hidden)]
    pub fn set_integrity_tick(&self, on: bool) {
        self.integrity.tick_enabled.store(on, Ordering::Relaxed);
    }
}
