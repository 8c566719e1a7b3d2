//! A running array: the read, write, flush and discard paths over `MemberIo`.

mod allocation;
mod background;
mod bitmap;
mod check;
mod discard;
mod gather;
pub mod held;
mod members;
mod ppl;
mod queueing;
mod read;
mod rebuild;
mod resync;
mod slow;
pub mod state;
mod stripe_cache;
mod write;
mod write_back;

pub use allocation::AllocationExtent;
pub(crate) use bitmap::MIN_PPL_BYTES;
pub use check::CheckFinding;
pub use gather::{GatherStats, COMBINE_ENV, GATHER_ENV};
pub(crate) use ppl::one_request_pages;
pub use ppl::{
    default_log_rounds_in_flight, log_deep_writers_from_env, log_rounds_in_flight_from_env,
    lone_answers_auto_by_env, LONE_ANSWERS_ENV, PARITY_ALONE_ENV, PPL_ROUNDS_ENV, SPREAD_ENV,
};
pub(crate) use resync::set_integrity_layout;
pub use resync::{journal_from_env, IntegrityReport, JOURNAL_ENV, PPL_ENV, PPL_STREAMS_ENV};
pub use slow::SlowMemberStats;
pub use stripe_cache::{
    default_stripe_cache_bytes, stripe_cache_bytes_from_env, StripeCacheStats,
    DEFAULT_STRIPE_CACHE_BYTES, STRIPE_CACHE_ENV,
};

use std::ops::Range;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard};

pub use members::{AddOutcome, DEFAULT_ERROR_THRESHOLD};
use members::{Health, SlotRuntime, NO_TARGET};
use state::Jobs;
pub use state::Progress;
pub use write_back::{
    Answer, Answered, WriteBack, WriteBackConfig, WriteBackStats, WRITE_BACK_ENV,
};

use crate::buf::{round_down, round_up};
use crate::error::{EngineError, MemberOp};
use crate::layout::{Geometry, Layout, Level, PAGE_BYTES};
use crate::lock::{StripeLockStats, StripeLocks};
use crate::member::{IoReq, MemberIo};
use crate::superblock::{ArrayState, SlotState, Superblock};
use crate::uuid::Uuid;

/// A default-off switch from the environment (`PARAID_WRITE_BACK`, `PARAID_JOURNAL`): "1", "on", "true" or "yes"
/// (any case) turn it on, anything else or nothing leaves it off.
pub(crate) fn switched_on_by_env(var: &str) -> bool {
    std::env::var(var)
        .map(|v| matches!(v.to_ascii_lowercase().as_str(), "1" | "on" | "true" | "yes"))
        .unwrap_or(false)
}

/// Turns off ("0", "off", "false", "no") that the members' queues decide journal mode's early answers beside the
/// gate on spare CPU (`AssembleOptions::watch_member_queues`, array/queueing.rs): to measure against.
pub const MEMBER_QUEUES_ENV: &str = "PARAID_MEMBER_QUEUES";

/// A default-on switch from the environment (`PARAID_PPL`, `PARAID_GATHER`): "0", "off", "false" or "no" (any
/// case) turn it off, anything else or nothing leaves it on.
pub(crate) fn switch_on_by_env(var: &str) -> bool {
    !matches!(
        std::env::var(var)
            .as_deref()
            .map(str::to_ascii_lowercase)
            .as_deref(),
        Ok("0" | "off" | "false" | "no")
    )
}

/// A running array. Cheap handles to the same array are shared with its background jobs (rebuild, check):
/// the handle returned by `assemble` owns it, and dropping that one stops the jobs.
pub struct Array {
    core: Arc<ArrayCore>,
    /// The handle given to the caller (not a job's): dropping it ends the background jobs.
    owner: bool,
}

/// Everything a running array holds; `Array` dereferences to it.
#[doc(hidden)]
pub struct ArrayCore {
    io: Arc<dyn MemberIo>,
    geometry: Geometry,
    data_offset_bytes: u64,
    parity: Arc<dyn paraid_parity::Backend>,
    /// The parity backend lends memory (`Backend::alloc_host`: a GPU computes on it in place): the RAID5/6 write
    /// path then computes in such memory too (write/parity.rs).
    parity_lends_memory: bool,
    uuid: Uuid,
    /// What the members said when this array was assembled, before it wrote anything (held.rs).
    found: FoundAtAssembly,
    /// This start's `Superblock::serve_nonce` (0 read-only: nothing is written).
    serve_nonce: u64,
    /// Per data slot: state (only `Active` slots are read), error count, rebuild target.
    slots: Vec<SlotRuntime>,
    health: Health,
    /// Shared by every request and rebuild batch; exclusive while members move or detach.
    membership: RwLock<()>,
    /// Shared by a RAID5/6 discard while it deallocates whole stripes (discard.rs), exclusive while a member
    /// leaves (`evict`, a failed superblock write, an aborted rebuild; `lock_meta_to_change`): a member leaving
    /// between the discard's check that every member is in and its hole punches would leave those stripes
    /// deallocated on the survivors only, not yet durable, with the missing member's chunk living in parity that
    /// a power loss can tear (simulation seed 9930938).
    dealloc_gate: RwLock<()>,
    /// The superblock contents kept on every member (events, state, slot table); updates are serialized here.
    meta: Mutex<Superblock>,
    locks: StripeLocks,
    jobs: Jobs,
    /// Write-intent bitmap and partial parity log (resync.rs).
    integrity: resync::Integrity,
    /// Sequential partial-stripe writes in flight together, combined (gather.rs).
    gather: gather::Gatherer,
    /// What RAID5/6 writes last put on their stripes' chunks (stripe_cache.rs).
    stripe_cache: stripe_cache::StripeCache,
    /// Served read-only (`AssembleOptions::read_only`): nothing is ever written to a member.
    read_only: bool,
    /// Journal mode: the gate an early answer must pass (`AssembleOptions::spare_cpu`).
    spare_cpu: Option<Arc<dyn crate::spare_cpu::SpareCpu>>,
    /// Journal mode gated on spare CPU: whether the members queue requests, the gate's second half at depth
    /// (queueing.rs).
    member_queues: Option<queueing::MemberQueues>,
    /// Rebuild progress between checkpoints (rebuild.rs; tests make it one batch).
    rebuild_checkpoint_bytes: std::sync::atomic::AtomicU64,
    /// The most rows in one rebuild batch (rebuild.rs; the simulator makes batches small, so that its small
    /// arrays rebuild in several).
    rebuild_batch_rows_max: std::sync::atomic::AtomicU64,
    /// The member reads are served around, if one is far slower than the others (slow.rs).
    slow: slow::SlowMember,
}

/// The newest superblock's events counter and state as the members held them when the array was assembled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FoundAtAssembly {
    pub events: u64,
    /// The serve nonce of the start that wrote it (`Superblock::serve_nonce`).
    pub serve_nonce: u64,
    /// Left dirty: the serve before this one did not stop cleanly (or was stopped by a kill or a power loss).
    pub dirty: bool,
}

/// A random serve nonce, never 0 (which means "none").
fn new_serve_nonce() -> Result<u64, EngineError> {
    let uuid = Uuid::random().map_err(|source| EngineError::GenerateUuid { source })?;
    let mut word = [0u8; 8];
    word.copy_from_slice(&uuid.0[..8]);
    Ok(u64::from_le_bytes(word).max(1))
}

impl std::ops::Deref for Array {
    type Target = ArrayCore;
    fn deref(&self) -> &ArrayCore {
        &self.core
    }
}

impl Drop for Array {
    fn drop(&mut self) {
        if self.owner {
            self.jobs.stop_all();
            self.integrity.stop_ticker();
            self.stop_prober();
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct MemberDetail {
    pub slot: usize,
    pub path: String,
    pub state: SlotState,
    /// Failed I/Os (after retry) since assembly.
    pub errors: u32,
    /// Rebuilding: bytes of the slot's data area in sync.
    pub recovery_offset_bytes: Option<u64>,
    /// Moving average of its read and write latency, microseconds (0 where nothing was measured: members in
    /// memory).
    pub latency_us: u64,
    /// Far slower than the other members: reads are served around it where the level can check them (slow.rs).
    pub slow: bool,
    /// No longer slow and getting its reads back over a few seconds (slow.rs, "returns gradually"); the same slot
    /// as `SlowMemberStats::returning_slot`, given per member so that a reader of one member needs nothing else.
    pub returning: bool,
    /// The new member a live replacement is building for this slot (`paraid replace`), until it takes over.
    pub replacement: Option<String>,
}

/// What names an array and gives its shape, as its newest superblock records it: the first fields of the running
/// array's detail and of the offline description of a member set (`inspect`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ArrayIdentity {
    pub uuid: String,
    pub name: String,
    pub level: Level,
    pub layout: Layout,
    pub chunk_bytes: u64,
    pub size_bytes: u64,
    pub state: ArrayState,
    pub events: u64,
}

impl ArrayIdentity {
    pub(crate) fn of(superblock: &crate::superblock::Superblock) -> ArrayIdentity {
        ArrayIdentity {
            uuid: superblock.uuid.to_string(),
            name: superblock.name.clone(),
            level: superblock.level,
            layout: superblock.layout,
            chunk_bytes: superblock.chunk_bytes,
            size_bytes: superblock.geometry().array_bytes(),
            state: superblock.state,
            events: superblock.events,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ArrayDetail {
    #[serde(flatten)]
    pub identity: ArrayIdentity,
    pub members: Vec<MemberDetail>,
    pub parity_backend: String,
    /// The parity backend in one line: for a GPU, where its batches went so far (on the GPU, of those in place,
    /// on the CPU) and whether it is still on.
    pub parity_detail: String,
    /// Where the parity backend's batches ran so far; None for a backend that keeps no count (the CPU's).
    pub parity_batches: Option<paraid_parity::BatchCounts>,
    /// How the array stays consistent across an unclean stop (docs/reliability.md, "Write hole"): "ppl"
    /// (write-intent bitmap and partial parity log: no write hole), "journal" (ppl whose log carries the data of
    /// small writes, answered once durable there: docs/reliability.md, "Journal mode"), "bitmap" (bitmap and resync only: the write
    /// hole stays open for a member missing at restart), "none" (RAID0: nothing to keep consistent).
    pub consistency_policy: String,
    /// Hot spares (their paths or labels).
    pub spares: Vec<String>,
    /// The running background job (rebuild, check, resync), if any.
    pub progress: Option<Progress>,
    /// Jobs waiting behind it, oldest first: "replace slot 3", "check".
    pub queued_jobs: Vec<String>,
    /// Beyond tolerance: the array serves nothing any more.
    pub failed: bool,
    /// Served read-only: nothing is written to the members (`AssembleOptions::read_only`).
    pub read_only: bool,
    pub sync_speed_min_bytes_per_s: u64,
    pub sync_speed_max_bytes_per_s: u64,
    /// What write gathering did since assembly (gather.rs).
    pub gather: GatherStats,
    /// What the stripe cache holds and served since assembly (stripe_cache.rs).
    pub stripe_cache: StripeCacheStats,
    /// Requests that waited for a stripe another held, since assembly (lock.rs).
    pub stripe_locks: StripeLockStats,
    /// The write-intent bitmap and the partial parity log: their state and what they wrote since assembly.
    pub integrity: IntegrityReport,
    /// The member reads are served around (far slower than the others), and how many reads were (slow.rs).
    pub slow_member: SlowMemberStats,
}

/// Scratch bytes one window of a request may use; larger requests are cut into windows of whole pieces.
const WINDOW_BYTES: usize = 8 << 20;
/// Stripes one window may lock (well below the lock table size, so a window never waits on itself).
const WINDOW_STRIPES: u64 = 256;

/// The part of a request that falls in one data chunk: in-chunk bytes `lo..hi`, at `buf_at` in the caller's
/// buffer.
#[derive(Debug, Clone, Copy)]
struct Piece {
    chunk: u64,
    lo: u64,
    hi: u64,
    buf_at: usize,
}

impl Piece {
    /// The piece widened to whole pages (what member I/O can address).
    fn aligned(&self) -> (u64, u64) {
        (
            round_down(self.lo, PAGE_BYTES),
            round_up(self.hi, PAGE_BYTES),
        )
    }

    fn len(&self) -> usize {
        (self.hi - self.lo) as usize
    }
}

/// Cuts `offset_bytes..offset_bytes + len_bytes` at chunk boundaries.
fn pieces(chunk_bytes: u64, offset_bytes: u64, len_bytes: u64) -> impl Iterator<Item = Piece> {
    let end = offset_bytes + len_bytes;
    let mut at = offset_bytes;
    std::iter::from_fn(move || {
        if at >= end {
            return None;
        }
        let chunk = at / chunk_bytes;
        let lo = at % chunk_bytes;
        let hi = (end - chunk * chunk_bytes).min(chunk_bytes);
        let piece = Piece {
            chunk,
            lo,
            hi,
            buf_at: (at - offset_bytes) as usize,
        };
        at = chunk * chunk_bytes + hi;
        Some(piece)
    })
}

impl Array {
    /// Member byte offset of in-chunk byte `in_chunk` of `row`.
    fn member_offset(&self, row: u64, in_chunk: u64) -> u64 {
        debug_assert!(row < self.geometry.rows && in_chunk <= self.geometry.chunk_bytes);
        self.data_offset_bytes + row * self.geometry.chunk_bytes + in_chunk
    }

    /// Starts an array over `io` (slots in order, spares at entries beyond) described by `newest`: present
    /// slots become what the slot table says (active, or rebuilding from its checkpoint), slots in `re_add` are
    /// rebuilt from row 0 (below the row given, only where the bitmap marks rows written: a member back in its
    /// slot, `assemble::in_sync_outside_bitmap_rows`), absent slots are missing; spares are the present entries
    /// the table calls spare. Writes the dirty superblock (events + 1) to every member, then starts the rebuilds
    /// that are due. The options left unset take defaults by `members_in_memory` (every member a file on tmpfs or
    /// ramfs).
    pub(crate) fn start(
        io: Arc<dyn MemberIo>,
        newest: Superblock,
        re_add: &[(usize, u64)],
        opts: &crate::AssembleOptions,
        members_in_memory: bool,
    ) -> Result<Array, EngineError> {
        // What the options leave open follows from where the members live (stripe_cache.rs, ppl/mod.rs).
        let stripe_cache_bytes = opts
            .stripe_cache_bytes
            .unwrap_or_else(|| default_stripe_cache_bytes(members_in_memory));
        let log_rounds_in_flight = opts
            .log_rounds_in_flight
            .unwrap_or_else(|| default_log_rounds_in_flight(members_in_memory));
        let parity = opts.parity.clone();
        let geometry = newest.geometry();
        let was_dirty = newest.state == ArrayState::Dirty;
        let found = FoundAtAssembly {
            events: newest.events,
            serve_nonce: newest.serve_nonce,
            dirty: was_dirty,
        };
        // Read-only, whatever the start must write (the log's recovery) is applied in memory (member/overlay.rs).
        let io: Arc<dyn MemberIo> = if opts.read_only {
            Arc::new(crate::member::OverlayMembers::new(io))
        } else {
            io
        };
        let mut meta = newest;
        // Every superblock this start writes says it wrote it (held.rs tells a killed serve's held writes from
        // an older serve's by it); served read-only nothing is written.
        meta.serve_nonce = if opts.read_only {
            0
        } else {
            new_serve_nonce()?
        };
        if meta.format_version < crate::superblock::FORMAT_VERSION {
            set_integrity_layout(&mut meta); // version 1: its zeroed bitmap area becomes bitmap and log
        }
        let integrity = resync::Integrity::new(
            &geometry,
            &meta,
            ppl::LogOptions {
                enabled: opts.write_hole_log,
                streams: opts.log_streams,
                journal: opts.journal,
                rounds_in_flight: log_rounds_in_flight,
                // With a gate on spare CPU the gate stands in for the depth (both guess whether the CPU is the
                // limit; the gate measures it), unless the caller names a depth.
                deep_writers: opts
                    .log_deep_writers
                    .unwrap_or(if opts.spare_cpu.is_some() {
                        usize::MAX
                    } else {
                        ppl::DEEP_WRITERS_DEFAULT
                    }),
                parity_alone: opts.journal_parity_alone,
                lone_answers: opts.journal_lone_answers,
                spread: opts.log_spread,
            },
        );
        let slots: Vec<SlotRuntime> = (0..geometry.members)
            .map(|slot| start_state(&geometry, &meta, io.as_ref(), slot, re_add))
            .collect();
        for entry in geometry.members..meta.slots.len() {
            if meta.slots[entry].state == SlotState::Spare && !io.present(entry) {
                meta.slots[entry] = crate::superblock::SlotEntry::UNUSED;
            }
        }
        let array = Array {
            core: Arc::new(ArrayCore {
                io,
                geometry,
                data_offset_bytes: meta.data_offset_bytes,
                parity_lends_memory: parity.alloc_host(PAGE_BYTES as usize).is_some(),
                parity,
                uuid: meta.uuid,
                found,
                serve_nonce: meta.serve_nonce,
                slots,
                health: Health::new(),
                membership: RwLock::new(()),
                dealloc_gate: RwLock::new(()),
                meta: Mutex::new(meta),
                locks: StripeLocks::new(),
                jobs: Jobs::new(),
                integrity,
                gather: gather::Gatherer::new(
                    geometry.level,
                    opts.gather_writes,
                    opts.combine_queued_writes,
                ),
                stripe_cache: stripe_cache::StripeCache::new(
                    if geometry.level.has_parity() {
                        stripe_cache_bytes
                    } else {
                        0
                    },
                    geometry.data_per_stripe() + geometry.level.parity_chunks(),
                    geometry.chunk_bytes,
                ),
                read_only: opts.read_only,
                spare_cpu: opts.spare_cpu.clone(),
                member_queues: (opts.spare_cpu.is_some()
                    && opts.journal
                    && opts.watch_member_queues)
                    .then(|| queueing::MemberQueues::new(geometry.members)),
                rebuild_checkpoint_bytes: std::sync::atomic::AtomicU64::new(
                    rebuild::CHECKPOINT_BYTES,
                ),
                rebuild_batch_rows_max: std::sync::atomic::AtomicU64::new(u64::MAX),
                slow: slow::SlowMember::new(),
            }),
            owner: true,
        };
        let missing: Vec<usize> = (0..geometry.members)
            .filter(|s| !array.is_active(*s))
            .collect();
        if !missing.is_empty() {
            log::warn!(
                "array {} starts degraded: slots {missing:?} not in sync ({} tolerates {}); {}",
                array.uuid,
                geometry.level,
                geometry.tolerated_missing(),
                if array.read_only {
                    "served read-only, nothing is rebuilt"
                } else if array.spares().is_empty() {
                    "add a member to rebuild"
                } else {
                    "a spare takes over"
                }
            );
        }
        array.start_prober();
        if array.read_only {
            array.start_integrity_read_only(was_dirty, &missing)?;
            return Ok(array);
        }
        array.update_superblocks(ArrayState::Dirty)?;
        array.start_integrity(was_dirty)?;
        if !missing.is_empty() {
            array.want_rebuild();
        }
        Ok(array)
    }

    pub fn size_bytes(&self) -> u64 {
        self.geometry.array_bytes()
    }

    pub fn geometry(&self) -> Geometry {
        self.geometry
    }

    pub fn data_offset_bytes(&self) -> u64 {
        self.data_offset_bytes
    }

    /// Memory for the payloads a frontend receives for `write`, where the parity backend lends some (a GPU's
    /// host memory, which it computes on in place): whole stripes written from it are computed without a copy
    /// to the GPU or a CPU pass over the data. None where the backend lends none; ordinary memory then serves
    /// the same.
    pub fn payload_memory(&self, len_bytes: usize) -> Option<paraid_parity::HostBuf> {
        if self.parity_lends_memory {
            self.parity.alloc_host(len_bytes)
        } else {
            None
        }
    }

    /// The member I/O layer (for tests and tools that inspect members directly).
    pub fn members(&self) -> &Arc<dyn MemberIo> {
        &self.io
    }

    /// Reads `buf.len()` bytes at any byte offset.
    pub fn read(&self, offset_bytes: u64, buf: &mut [u8]) -> Result<(), EngineError> {
        self.jobs.note_foreground();
        self.check_range(offset_bytes, buf.len() as u64)?;
        let _shared = self.shared()?;
        read::read(self, offset_bytes, buf)
    }

    /// Several reads at once, each `buf.len()` bytes at its byte offset: those the members can serve directly go
    /// out together (read.rs `read_many`), the rest as `read` serves them. One result per read, in order.
    pub fn read_many(&self, reads: &mut [(u64, &mut [u8])]) -> Vec<Result<(), EngineError>> {
        self.jobs.note_foreground();
        let refused: Vec<Option<EngineError>> = reads
            .iter()
            .map(|(offset_bytes, buf)| self.check_range(*offset_bytes, buf.len() as u64).err())
            .collect();
        if refused.iter().any(Option::is_some) {
            // A client's bad range is refused before it gets here; one by one keeps each read's own error.
            return reads
                .iter_mut()
                .zip(refused)
                .map(|((offset_bytes, buf), refusal)| match refusal {
                    Some(error) => Err(error),
                    None => self.read(*offset_bytes, buf),
                })
                .collect();
        }
        let _shared = match self.shared() {
            Ok(shared) => shared,
            Err(_) => {
                return reads
                    .iter_mut()
                    .map(|(o, buf)| self.read(*o, buf))
                    .collect()
            }
        };
        read::read_many(self, reads)
    }

    /// Writes `buf` at any byte offset; with `fua` the data is durable on return. Sequential partial-stripe
    /// writes in flight together may be combined into one stripe write (gather.rs).
    pub fn write(&self, offset_bytes: u64, buf: &[u8], fua: bool) -> Result<(), EngineError> {
        self.admit_write(offset_bytes, buf.len() as u64)?;
        gather::write(self, offset_bytes, buf, fua)
    }

    /// What every client write goes through first: refused read-only or out of range; counted as foreground.
    fn admit_write(&self, offset_bytes: u64, len_bytes: u64) -> Result<(), EngineError> {
        self.refuse_if_read_only("write")?;
        self.jobs.note_foreground();
        self.check_range(offset_bytes, len_bytes)
    }

    /// `write` without FUA that calls `answer` as soon as the write is durable, which in journal mode
    /// (`AssembleOptions::journal`) may be before its in-place writes are done: once the log holds its data
    /// (array/ppl/). Called at most once; not called when the write was not answerable early (a write of more
    /// than one window, a full stripe, a level or policy without the journal): the caller answers when this
    /// returns. A write answered early that then fails was durable when answered but is not in place: the
    /// caller must not let anything read the array as if it were (write_back.rs).
    pub fn write_answering(
        &self,
        offset_bytes: u64,
        buf: &[u8],
        answer: &dyn Fn(),
    ) -> Result<(), EngineError> {
        let Some(ppl) = self.integrity.ppl().filter(|p| p.journal()) else {
            return self.write(offset_bytes, buf, false);
        };
        use crate::spare_cpu::Spare;
        let spare = self.spare_cpu.as_ref().map(|gate| gate.spare());
        let load = self.member_load();
        if self.counted_refusal(spare, load) {
            // The CPU is the limit (spare_cpu.rs): the early answer's copies would cost more than its round trip
            // saves; or the members have no time to spare (queueing.rs): its records would take the place of
            // in-place writes. The log's own way, answered when this returns.
            return self.write(offset_bytes, buf, false);
        }
        // Otherwise early answers for every write, or for a lone write only (`Ppl::await_answer`).
        // At depth only where the members do not queue requests (queueing.rs): on members bound by their rate the
        // early answers' records take the place of in-place writes.
        let for_all = spare == Some(Spare::ForAll);
        let members_queue = for_all && load == queueing::Load::Queueing;
        let awaited = ppl.await_answer(for_all && !members_queue);
        if !awaited.may_answer() {
            if members_queue {
                ppl.note_members_queue();
            }
            // Lone answers: another write awaits its answer beside this one. The log's own way (gathered, partial
            // parity alone where no entry is live), answered when this returns.
            return self.write(offset_bytes, buf, false);
        }
        self.admit_write(offset_bytes, buf.len() as u64)?;
        let answer_and_count = || {
            awaited.answered();
            answer();
        };
        let sequential = ppl.note_waited_for(offset_bytes, buf.len() as u64);
        let early = write::EarlyAnswer::new(&answer_and_count, sequential);
        // Not gathered: the write is answered from its own log round, before any combined write could go out.
        self.write_now(offset_bytes, buf, false, Some(&early))
    }

    /// Journal mode gated on spare CPU (`AssembleOptions::spare_cpu`): true where no write may be answered early
    /// now, so that a write through `write_answering` would take the log's own way: the gate says the CPU is the
    /// limit (counted `log_cpu_busy`), or the members are saturated (queueing.rs; counted `log_members_queue`).
    /// Write-back asks first (write_back.rs), so that such a write is neither copied into its pool nor held for
    /// an answer that will not come early: at queue depth 32 on two cores that bookkeeping cost the gated journal
    /// 2-9 % of the log's IOPS (docs/benchmarks.md, "The gated journal as the default (stop 52)").
    pub fn early_answers_refused(&self) -> bool {
        self.counted_refusal(
            self.spare_cpu.as_ref().map(|gate| gate.spare()),
            self.member_load(),
        )
    }

    /// What the members' queues say (queueing.rs); free where they are not watched.
    fn member_load(&self) -> queueing::Load {
        self.member_queues
            .as_ref()
            .map_or(queueing::Load::Free, |q| q.load())
    }

    /// Whether the gate's answer `spare` and the members' `load` refuse every early answer; such a write is
    /// counted (`log_cpu_busy` where the CPU is busy, else `log_members_queue`). Without a gate nothing is
    /// refused.
    fn counted_refusal(
        &self,
        spare: Option<crate::spare_cpu::Spare>,
        load: queueing::Load,
    ) -> bool {
        let Some(spare) = spare else {
            return false;
        };
        let ppl = self.integrity.ppl();
        if spare == crate::spare_cpu::Spare::Busy {
            if let Some(ppl) = ppl {
                ppl.note_cpu_busy();
            }
            return true;
        }
        if load == queueing::Load::Saturated {
            if let Some(ppl) = ppl {
                ppl.note_members_queue();
            }
            return true;
        }
        false
    }

    /// What the members said when this array was assembled (held.rs: whether held writes left by a kill are
    /// this array's newest).
    pub fn found_at_assembly(&self) -> FoundAtAssembly {
        self.found
    }

    /// This start's serve nonce (`Superblock::serve_nonce`), in every superblock it writes; 0 read-only.
    pub fn serve_nonce(&self) -> u64 {
        self.serve_nonce
    }

    /// The array's UUID.
    pub fn uuid(&self) -> Uuid {
        self.uuid
    }

    /// Whether writes through `write_answering` may be answered before they are written in place (journal
    /// mode on a RAID5/6 array with the partial parity log on).
    pub fn answers_from_log(&self) -> bool {
        self.integrity.ppl().is_some_and(|p| p.journal())
    }

    /// Journal mode with lone answers (`AssembleOptions::journal_lone_answers`): only a write that no other
    /// awaits an answer beside is answered from the log. A frontend that knows its client waits for a write's
    /// answer (nothing else in flight or queued) sends that write through `write_answering`, the others through
    /// `write`, and write-back holds none (write_back.rs).
    ///
    /// Not with a gate on spare CPU (`AssembleOptions::spare_cpu`): the gate, not the frontend's look at its queue,
    /// decides there, so every write comes through `write_answering`.
    pub fn answers_lone_writes_only(&self) -> bool {
        self.spare_cpu.is_none() && self.integrity.ppl().is_some_and(|p| p.lone_answers())
    }

    /// What `write` refuses before it writes anything (range, read-only, beyond tolerance), for write-back
    /// (write_back.rs), which answers a write before it is written.
    pub(crate) fn check_write(&self, offset_bytes: u64, len_bytes: u64) -> Result<(), EngineError> {
        self.refuse_if_read_only("write")?;
        self.check_range(offset_bytes, len_bytes)?;
        self.check_serving()
    }

    /// The frontend began reading a WRITE off its client (`true`: its payload is on its way) or handed it to
    /// `write` (or dropped it: `false`). Write gathering's leaders keep waiting while one is (array/gather.rs,
    /// `Gatherer::parked`): a 1 MiB continuation read off a socket takes hundreds of microseconds on a busy
    /// machine, milliseconds in an emulated one.
    pub fn note_write_arriving(&self, arriving: bool) {
        self.gather.note_arriving(arriving);
    }

    /// The frontend holds a WRITE that starts at `offset_bytes`, right behind the one it is about to hand to
    /// `write`, which ends there: the client sent it already. Write gathering lets the earlier write's last
    /// stripe wait for it (array/gather.rs, "Continuations the frontend has seen"). Forgotten when a write that
    /// starts there comes, or after the longest a gather waits.
    pub fn note_write_follows(&self, offset_bytes: u64) {
        self.gather.note_follows(offset_bytes);
    }

    /// What write gathering did so far.
    pub fn gather_stats(&self) -> GatherStats {
        self.gather.stats()
    }

    /// `write` of one request (or of a gathered stripe), range already checked; `answer` for `write_answering`.
    fn write_now<'a>(
        &'a self,
        offset_bytes: u64,
        buf: &[u8],
        fua: bool,
        answer: Option<&write::EarlyAnswer<'a>>,
    ) -> Result<(), EngineError> {
        let _shared = self.shared()?;
        let _intent = self
            .integrity
            .begin_write(self, offset_bytes, buf.len() as u64)?;
        write::write(self, offset_bytes, buf, fua, answer)
    }

    /// `write_now` of several extents of `buf` (sorted, apart, each chunk touched by one at most) as one write:
    /// writes combined by gather.rs. The write intent covers the stripes from the first extent to the last.
    fn write_now_extents(
        &self,
        offset_bytes: u64,
        buf: &[u8],
        extents: &[Range<usize>],
    ) -> Result<(), EngineError> {
        let (Some(first), Some(last)) = (extents.first(), extents.last()) else {
            return Ok(());
        };
        let _shared = self.shared()?;
        let _intent = self.integrity.begin_write(
            self,
            offset_bytes + first.start as u64,
            (last.end - first.start) as u64,
        )?;
        write::write_extents(self, offset_bytes, buf, extents)
    }

    /// Makes every write acknowledged so far durable on every member (read-only: nothing to do).
    pub fn flush(&self) -> Result<(), EngineError> {
        self.jobs.note_foreground();
        let _shared = self.shared()?;
        if self.read_only {
            return Ok(());
        }
        self.flush_shared()
    }

    /// `flush` for a caller that already holds the membership lock shared. Taking it a second time can deadlock:
    /// std's RwLock makes a new reader wait behind a waiting writer (a spare being taken in), which waits for us.
    pub(crate) fn flush_shared(&self) -> Result<(), EngineError> {
        let token = self.integrity.flush_begin();
        // Rows rebuild targets had built when the flush began: durable once it completes, so the next
        // checkpoint may name them (members.rs, `durable_rows`).
        let built: Vec<(usize, usize, u64)> = (0..self.geometry.members)
            .map(|s| {
                let rt = &self.slots[s];
                (
                    s,
                    rt.target_io.load(Ordering::Acquire),
                    rt.target_rows.load(Ordering::Acquire),
                )
            })
            .filter(|&(_, target, _)| target != NO_TARGET)
            .collect();
        let reqs: Vec<IoReq<'_>> = (0..self.io.slots().max(self.geometry.members))
            .filter(|&i| self.holds_data(i))
            .map(IoReq::flush)
            .collect();
        // A member whose flush fails is evicted: what it cached is covered by the others' redundancy.
        self.submit_tolerant(reqs);
        let durable = self.wait_durable();
        if durable.is_ok() {
            for (slot, target, rows) in built {
                let rt = &self.slots[slot];
                if rt.target_io.load(Ordering::Acquire) == target {
                    rt.durable_rows.fetch_max(rows, Ordering::AcqRel);
                }
            }
        }
        self.integrity.flush_done(token, durable.is_ok());
        durable
    }

    /// Deallocates a range; it reads back as zeros afterwards and parity stays right.
    pub fn discard(&self, offset_bytes: u64, len_bytes: u64) -> Result<(), EngineError> {
        self.refuse_if_read_only("discard")?;
        self.jobs.note_foreground();
        self.check_range(offset_bytes, len_bytes)?;
        let _shared = self.shared()?;
        let _intent = self.integrity.begin_write(self, offset_bytes, len_bytes)?;
        discard::discard(self, offset_bytes, len_bytes, false)?;
        self.wait_durable()
    }

    /// Writes zeros over a range (deallocating whole stripes where members can).
    pub fn write_zeroes(
        &self,
        offset_bytes: u64,
        len_bytes: u64,
        fua: bool,
    ) -> Result<(), EngineError> {
        self.refuse_if_read_only("write zeroes")?;
        self.jobs.note_foreground();
        self.check_range(offset_bytes, len_bytes)?;
        let _shared = self.shared()?;
        let _intent = self.integrity.begin_write(self, offset_bytes, len_bytes)?;
        discard::discard(self, offset_bytes, len_bytes, fua)?;
        self.wait_durable()
    }

    pub fn detail(&self) -> ArrayDetail {
        let meta = self.lock_meta();
        ArrayDetail {
            identity: ArrayIdentity::of(&meta),
            members: (0..self.geometry.members)
                .map(|slot| MemberDetail {
                    slot,
                    path: if self.io.present(slot) {
                        self.io.label(slot)
                    } else {
                        String::new()
                    },
                    state: self.slot_state(slot),
                    errors: self.slot_errors(slot),
                    recovery_offset_bytes: (self.slot_state(slot) == SlotState::Rebuilding).then(
                        || {
                            self.slots[slot].target_rows.load(Ordering::Acquire)
                                * self.geometry.chunk_bytes
                        },
                    ),
                    replacement: self
                        .replacement_target(slot)
                        .map(|entry| self.io.label(entry)),
                    latency_us: self.slot_latency_ns(slot) / 1000,
                    slow: self.slow.slot() == Some(slot),
                    returning: self.returning_slot() == Some(slot),
                })
                .collect(),
            parity_backend: self.parity.name().to_string(),
            parity_detail: self.parity.describe(),
            parity_batches: self.parity.batch_counts(),
            consistency_policy: self.integrity.policy().to_string(),
            spares: {
                drop(meta);
                self.spares()
            },
            progress: self.progress(),
            queued_jobs: self.jobs.queued_descriptions(),
            failed: self.health.failed.load(Ordering::Acquire),
            read_only: self.read_only,
            sync_speed_min_bytes_per_s: self.sync_speed().0,
            sync_speed_max_bytes_per_s: self.sync_speed().1,
            gather: self.gather.stats(),
            stripe_cache: self.stripe_cache.stats(),
            stripe_locks: self.locks.stats(),
            integrity: self.integrity(),
            slow_member: self.slow.stats(),
        }
    }

    /// Another handle to this array, for a background job.
    fn handle(&self) -> Array {
        Array {
            core: self.core.clone(),
            owner: false,
        }
    }

    /// Ends the background jobs (a rebuild keeps its checkpoint), flushes, then marks the array clean
    /// (events + 1) on every member; returns the state recorded: clean, or dirty when a resync of dirty regions
    /// was cut short (the next assembly resumes it). An array that stopped serving (beyond tolerance) is left as
    /// it is; one served read-only writes nothing and returns the state its members hold.
    pub fn stop(self) -> Result<ArrayState, EngineError> {
        if self.read_only {
            // Nothing was written: the members keep the state they were found in.
            self.jobs.stop_all();
            return Ok(self.lock_meta().state);
        }
        self.integrity_before_stop();
        self.jobs.stop_all();
        self.check_serving()?;
        self.flush()?;
        let state = self.integrity_stop()?;
        self.update_superblocks(state)?;
        Ok(state)
    }

    /// Whether the array is served read-only (`AssembleOptions::read_only`).
    pub fn is_read_only(&self) -> bool {
        self.read_only
    }

    /// `ChangeReadOnly` for `action` when the array is served read-only.
    pub(crate) fn refuse_if_read_only(&self, action: &'static str) -> Result<(), EngineError> {
        if self.read_only {
            return Err(EngineError::ChangeReadOnly { action });
        }
        Ok(())
    }

    /// The shared hold on the membership every request keeps, once the array is known to serve.
    fn shared(&self) -> Result<RwLockReadGuard<'_, ()>, EngineError> {
        self.check_serving()?;
        Ok(self.membership.read().unwrap_or_else(|e| e.into_inner()))
    }

    fn lock_meta(&self) -> std::sync::MutexGuard<'_, Superblock> {
        self.meta.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `meta` held to change member states or write superblocks (which mark a member faulty when its write
    /// fails): with the dealloc gate, taken first, exclusively, unless this thread is the discard holding it.
    fn lock_meta_to_change(&self) -> members::MetaChange<'_> {
        let gate = (!discard::deallocating_here())
            .then(|| self.dealloc_gate.write().unwrap_or_else(|e| e.into_inner()));
        members::MetaChange {
            meta: self.lock_meta(),
            _gate: gate,
        }
    }

    /// Bumps the event counter, records `state` and the slot table, and writes the superblock to every member
    /// durably (a member whose write fails is marked faulty).
    fn update_superblocks(&self, state: ArrayState) -> Result<(), EngineError> {
        let mut meta = self.lock_meta_to_change();
        self.persist_locked(&mut meta, state)
    }

    pub fn slot_state(&self, slot: usize) -> SlotState {
        SlotState::from_code(self.slots[slot].state.load(Ordering::Acquire))
            .unwrap_or(SlotState::Faulty)
    }

    /// Whether `slot` is in sync: read and written.
    fn is_active(&self, slot: usize) -> bool {
        self.slots[slot].state.load(Ordering::Acquire) == SlotState::Active.code()
    }

    /// Every data slot active: nothing missing, faulty or being rebuilt.
    fn all_in_sync(&self) -> bool {
        (0..self.geometry.members).all(|s| self.is_active(s))
    }

    fn active_slots(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.geometry.members).filter(|s| self.is_active(*s))
    }

    /// The rebuild target of `slot` and how far below `end_row` it takes writes: (`NO_TARGET`, 0) if none.
    fn target_below(&self, slot: usize, end_row: u64) -> (usize, u64) {
        let rt = &self.slots[slot];
        let target = rt.target_io.load(Ordering::Acquire);
        if target == NO_TARGET || (target == slot && self.is_active(slot)) {
            return (NO_TARGET, 0);
        }
        (target, end_row.min(rt.target_rows.load(Ordering::Acquire)))
    }

    /// Whether io index `i` holds data that must be flushed: an active slot or a rebuild target.
    fn holds_data(&self, i: usize) -> bool {
        if i < self.geometry.members && self.is_active(i) {
            return true;
        }
        (0..self.geometry.members).any(|s| self.slots[s].target_io.load(Ordering::Acquire) == i)
    }

    /// The io indices that take a write of `slot`'s contents at member `row`: the slot itself when active, and
    /// its rebuild target when the rebuild has passed the row (evaluated under the row's stripe lock, which the
    /// rebuild holds while it moves past). Up to two; `NO_TARGET` marks an unused place.
    fn write_targets(&self, slot: usize, row: u64) -> [usize; 2] {
        let mut out = [NO_TARGET; 2];
        if self.is_active(slot) {
            out[0] = slot;
        }
        let rt = &self.slots[slot];
        let target = rt.target_io.load(Ordering::Acquire);
        if target != NO_TARGET && target != out[0] && row < rt.target_rows.load(Ordering::Acquire) {
            out[1] = target;
        }
        out
    }

    fn check_range(&self, offset_bytes: u64, len_bytes: u64) -> Result<(), EngineError> {
        let array_bytes = self.size_bytes();
        match offset_bytes.checked_add(len_bytes) {
            Some(end) if end <= array_bytes => Ok(()),
            _ => Err(EngineError::CheckRange {
                offset_bytes,
                len_bytes,
                array_bytes,
            }),
        }
    }

    /// Submits `reqs` as one batch (nothing when empty), each failed request retried once. A write, flush or
    /// discard that still fails evicts its member (the others carry the data: not an error); a read that still
    /// fails is an error naming its member. Returns once the member states it relied on are durable.
    fn run(&self, reqs: Vec<IoReq<'_>>) -> Result<(), EngineError> {
        let failures = self.submit_tolerant(reqs);
        if let Some(f) = failures.iter().find(|f| f.op == MemberOp::Read) {
            return Err(EngineError::AccessMember {
                op: f.op,
                slot: f.slot,
                path: self.io.label(f.slot),
                source: std::io::Error::from_raw_os_error(libc::EIO),
            });
        }
        self.wait_durable()
    }
}

// The array is shared by every connection thread.
const _: fn() = || {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Array>();
};

/// The state a data slot starts in (see `Array::start`).
fn start_state(
    geometry: &Geometry,
    meta: &Superblock,
    io: &dyn MemberIo,
    slot: usize,
    re_add: &[(usize, u64)],
) -> SlotRuntime {
    if !io.present(slot) {
        return SlotRuntime::new(SlotState::Missing);
    }
    // `in_sync_rows`: the slot's own member came back, in sync below that row where the bitmap marks no write
    // (rebuild.rs).
    let rebuild_from = |rows: u64, in_sync_rows: u64| {
        let rt = SlotRuntime::new(SlotState::Rebuilding);
        // The checkpoint it resumes from was durable when it was written.
        rt.set_target(slot, rows, in_sync_rows);
        rt
    };
    if let Some(&(_, in_sync_rows)) = re_add.iter().find(|(s, _)| *s == slot) {
        log::warn!(
            "{} (slot {slot}) re-added: rebuilding {}",
            io.label(slot),
            if in_sync_rows >= geometry.rows {
                "the regions written since it left".to_string()
            } else if in_sync_rows > 0 {
                format!(
                    "the regions written since it left below byte {} (where its own rebuild had come), the rest \
                     completely",
                    in_sync_rows * geometry.chunk_bytes
                )
            } else {
                "it completely".to_string()
            }
        );
        return rebuild_from(0, in_sync_rows);
    }
    let entry = &meta.slots[slot];
    match entry.state {
        SlotState::Active => SlotRuntime::new(SlotState::Active),
        SlotState::Rebuilding => {
            let rows = (entry.recovery_offset_bytes / geometry.chunk_bytes).min(geometry.rows);
            log::warn!(
                "{} (slot {slot}) resumes its rebuild at byte {} of {}{}",
                io.label(slot),
                rows * geometry.chunk_bytes,
                geometry.member_data_bytes(),
                if entry.rebuild_from_bitmap {
                    ", where the bitmap marks writes (a re-add)"
                } else {
                    ""
                }
            );
            // The slot has not been active since its member left, so the bitmap has kept every bit since.
            rebuild_from(
                rows,
                if entry.rebuild_from_bitmap {
                    geometry.rows
                } else {
                    0
                },
            )
        }
        state => {
            // Present with the newest events, yet the table says it left the array: never trust its data.
            log::warn!(
                "{} (slot {slot}) is recorded {state}: not trusted, rebuilding it completely",
                io.label(slot)
            );
            rebuild_from(0, 0)
        }
    }
}
