//! Write-back: small writes acknowledged once held in memory, written to the members by a pool of threads.
//!
//! Why: a client that waits for each write before sending the next (queue depth 1: a database's page cleaner, a
//! file system's metadata, `fio --iodepth=1`) pays the whole partial-stripe write path for every one: read the old
//! data and parity, write the partial parity log's record, write in place. Three device round trips, one at a
//! time, with nothing for write gathering or the log's group commit to share. A block device may answer a write
//! before it is durable (a drive with a volatile cache does; NBD and ublk promise durability only for FLUSH and
//! FUA), so the array can take the write, answer, and do the rest while the client sends the next: the client's
//! queue depth 1 becomes the engine's queue depth N, where gathering and the log's rounds share work.
//!
//! Fault model and what survives it (docs/reliability.md, "Write-back"):
//! * A write answered here and not yet flushed may be lost by a power loss; the block device contract allows that
//!   (it is what a drive's cache may drop), and the partial parity log still closes the write hole for every
//!   stripe the background writes touch, so what was durable stays intact. A kill of the process loses nothing
//!   answered where write-back has a store (`with_store`, held.rs: shared memory that outlives the process, which
//!   the next start writes from); without one, a kill loses what was held, as a power loss would. Everything
//!   a FLUSH acknowledged, and every FUA write, is durable as without write-back: a FLUSH first waits for every
//!   write answered before it began to be written in place, then flushes the members (`Array::flush`); FUA writes
//!   take the ordinary path.
//! * Reads never see an older value than one answered: a read (or block status, write-zeroes, discard, or a write
//!   taking the ordinary path) that overlaps a write not yet written in place waits for it. A write overlapping
//!   one not yet written waits before it is taken, so writes to the same bytes reach the members in the order
//!   they were answered, and the held writes never overlap (which is what makes the overlap test one map lookup).
//!   All of this by 4 KiB page, not by byte: two writes into different bytes of one page reach it in the order
//!   answered, as without write-back (a FUA write of part of a page carries the held bytes beside it).
//! * A held write that fails cannot be reported to its writer. Within the level's tolerance the write path does
//!   not fail (members are evicted, the write completes degraded); beyond it the data is lost as a drive's cache
//!   would lose it, and from then on every request fails with that error until the array is served again
//!   (sticky: a flush must never say "durable" after a lost write, and a read must not return what the lost
//!   write replaced, which a client was told is gone), as the array beyond its tolerance serves nothing.
//! * Bounded: at most one held write per thread (and `limit_bytes`). The pool starts with one thread and grows
//!   while held writes wait and no thread is idle, up to `WriteBackConfig::threads`: an array whose writes
//!   seldom come this way (journal mode's lone answers are written on the caller's thread) keeps one. A write
//!   that finds every thread busy takes the ordinary path on its own thread instead of waiting for room: a client
//!   that already keeps many writes in flight gains nothing from holding more (it would only lengthen the next
//!   flush's wait and add a copy), and a flush never waits for more than one write per thread. Writes larger than
//!   `max_write_bytes` (whole stripes, which log nothing and gain little) take the ordinary path too, saving the
//!   copy.
//!
//! Journal mode (`Answer::FromLog`, with `AssembleOptions::journal`): the same pool, but a held write is answered
//! only once its data is durable in the partial parity log (`Array::write_answering`), before its in-place writes;
//! a write that cannot be answered that way is answered when it is done, and its error, if any, goes to its
//! writer. Nothing answered is lost by a kill or a power loss (recovery rolls the log forward), at one device
//! round trip less per small write than the log costs without write-back; reads and flushes wait for held writes
//! as above, and a write answered from the log that then fails beyond the level's tolerance is sticky as above.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

use super::held::HeldStore;
use super::{AllocationExtent, Array};
use crate::buf::{round_down, round_up, AlignedBuf};
use crate::error::EngineError;
use crate::layout::PAGE_BYTES;

/// Environment switch for `paraid serve` (`PARAID_WRITE_BACK=on` turns it on, as `--write-back` does).
pub const WRITE_BACK_ENV: &str = "PARAID_WRITE_BACK";
/// Environment override of `DEFAULT.threads` (for measuring; `from_env` and `on` read it).
pub const WRITE_BACK_THREADS_ENV: &str = "PARAID_WRITE_BACK_THREADS";

/// When a held write is answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// Once held in memory (write-back).
    WhenHeld,
    /// Once its data is durable in the log (journal mode), or else when it is done.
    FromLog,
}

/// What became of one write (`WriteBack::write_answered`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answered {
    /// Written (in place, or by the ordinary path) before it was answered.
    Written,
    /// Answered while held in memory: durable after the next flush.
    Held,
    /// Answered once durable in the log, while its in-place writes went on: durable when answered.
    FromLog,
}

/// How much write-back holds and how it writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriteBackConfig {
    /// Threads writing held writes to the members, and the most writes held at once; 0 turns write-back off
    /// (every write takes the ordinary path).
    pub threads: usize,
    /// Bytes of writes held at once; a write beyond it takes the ordinary path.
    pub limit_bytes: usize,
    /// Writes longer than this take the ordinary path.
    pub max_write_bytes: usize,
    /// When a held write is answered.
    pub answer: Answer,
}

impl WriteBackConfig {
    /// On: 128 threads, 16 MiB (128 writes of the largest size held), writes up to 128 KiB. Threads because
    /// the writes a client at queue depth 1 leaves in the engine are what the log's rounds share: on disks held
    /// to their IOPS (bench/vm/writehole) the log cost small writes at QD1 -15 % with 32, -11 % with 128 and
    /// -10 % with 256 (docs/reliability.md, "Write-back").
    pub const DEFAULT: WriteBackConfig = WriteBackConfig {
        threads: 128,
        limit_bytes: 16 << 20,
        max_write_bytes: 128 << 10,
        answer: Answer::WhenHeld,
    };

    /// Journal mode's pool (module doc): as many threads, each write answered once durable in the log.
    pub const JOURNAL: WriteBackConfig = WriteBackConfig {
        answer: Answer::FromLog,
        ..WriteBackConfig::DEFAULT
    };

    pub const OFF: WriteBackConfig = WriteBackConfig {
        threads: 0,
        limit_bytes: 0,
        max_write_bytes: 0,
        answer: Answer::WhenHeld,
    };

    /// `DEFAULT` where the environment has `PARAID_WRITE_BACK=on` (or 1, true, yes), else `OFF`: off unless
    /// asked for, because it gives up one guarantee the array otherwise keeps (a write answered survives a kill
    /// of the process even unflushed).
    pub fn from_env() -> WriteBackConfig {
        if super::switched_on_by_env(WRITE_BACK_ENV) {
            WriteBackConfig::on()
        } else {
            WriteBackConfig::OFF
        }
    }

    /// `DEFAULT`, with `PARAID_WRITE_BACK_THREADS` threads where the environment sets it (at least 1).
    pub fn on() -> WriteBackConfig {
        let threads = std::env::var(WRITE_BACK_THREADS_ENV)
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            .map_or(WriteBackConfig::DEFAULT.threads, |n| n.max(1));
        WriteBackConfig {
            threads,
            ..WriteBackConfig::DEFAULT
        }
    }

    pub fn is_on(&self) -> bool {
        self.threads > 0
    }
}

/// Counters for tests and status.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct WriteBackStats {
    /// Writes answered before they were written in place.
    pub held_writes: u64,
    /// Requests that waited for a held write they overlapped.
    pub overlap_waits: u64,
    /// Writes small enough to hold that took the ordinary path because every thread was busy (or
    /// `limit_bytes` was reached).
    pub passed_through: u64,
    /// Held writes that failed in the background.
    pub failed_writes: u64,
    /// Journal mode: writes answered once durable in the log, before their in-place writes.
    pub answered_from_log: u64,
}

/// A write held and not yet written in place.
struct Held {
    seq: u64,
    offset_bytes: u64,
    len: usize,
    data: AlignedBuf,
    /// Journal mode: where the writer waits for its answer.
    answer: Option<Arc<AnswerSlot>>,
    /// Where the write is kept against a kill of the process (held.rs), if write-back has a store.
    slot: Option<usize>,
}

/// A journal-mode writer's answer, given once (by the worker): early from the log, or with the write's outcome.
#[derive(Default)]
struct AnswerSlot {
    state: Mutex<Option<Result<Answered, EngineError>>>,
    given: AtomicBool,
    ready: Condvar,
}

impl AnswerSlot {
    fn give(&self, answer: Result<Answered, EngineError>) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        debug_assert!(!self.given.load(Ordering::Relaxed), "answered twice");
        *state = Some(answer);
        self.given.store(true, Ordering::Release);
        self.ready.notify_all();
    }

    /// Whether the answer was given.
    fn given(&self) -> bool {
        self.given.load(Ordering::Acquire)
    }

    fn take(&self) -> Result<Answered, EngineError> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some(answer) = state.take() {
                return answer;
            }
            state = self.ready.wait(state).unwrap_or_else(|p| p.into_inner());
        }
    }
}

#[derive(Default)]
struct State {
    next_seq: u64,
    /// Held writes by start, to their end (exclusive) and sequence number. Disjoint (see the module notes).
    ranges: BTreeMap<u64, (u64, u64)>,
    /// Sequence numbers of held writes (queued or being written): a flush waits for those below its own.
    seqs: BTreeSet<u64>,
    queue: VecDeque<Held>,
    held_bytes: usize,
    /// The first held write that failed: every later request fails with it.
    failure: Option<String>,
    closing: bool,
    /// The store's slots no held write is in (held.rs).
    free_slots: Vec<usize>,
    /// Threads started (`WriteBack::grow`), and of those the ones that will take the next queued write without
    /// a write of their own first (started, or waiting for work).
    workers: usize,
    idle_workers: usize,
}

impl State {
    /// Whether a held write overlaps `offset_bytes..end_bytes` (disjoint ranges: only the last one starting
    /// before `end_bytes` can).
    fn overlaps(&self, offset_bytes: u64, end_bytes: u64) -> bool {
        self.ranges
            .range(..end_bytes)
            .next_back()
            .is_some_and(|(_, &(end, _))| end > offset_bytes)
    }

    /// Whether one more held write of `len` bytes fits: a thread for it, and bytes under the limit.
    fn has_room(&self, len: usize, config: &WriteBackConfig) -> bool {
        self.seqs.len() < config.threads && self.held_bytes + len <= config.limit_bytes
    }

    fn failed(&self) -> Result<(), EngineError> {
        match &self.failure {
            None => Ok(()),
            Some(why) => Err(EngineError::WriteBehind { why: why.clone() }),
        }
    }
}

struct Shared {
    array: Array,
    config: WriteBackConfig,
    /// Held writes (answered when held) are kept here too until they are in place, so that a kill of the process
    /// does not lose them (held.rs); None: they die with the process.
    store: Option<HeldStore>,
    state: Mutex<State>,
    /// A held write was written (or failed): waiters on overlaps, room and flushes look again.
    written: Condvar,
    /// Work was queued or closing began.
    queued: Condvar,
    /// Held writes now (lets reads skip the lock when nothing is held).
    held_now: AtomicUsize,
    /// Whether small writes are held now (`set_holding`).
    holding: AtomicBool,
    /// A held write failed (`State::failure` says which): every request fails from then on.
    lost: AtomicBool,
    held_writes: AtomicU64,
    overlap_waits: AtomicU64,
    passed_through: AtomicU64,
    failed_writes: AtomicU64,
    answered_from_log: AtomicU64,
}

/// The whole pages `offset_bytes..+len_bytes` touches (at least one). Held writes are kept apart by page, not
/// by byte: the array writes whole pages, so a later write into another part of a held write's page (a FUA write
/// above all) reads and writes that page after it, as it would without write-back, never before it.
fn page_span(offset_bytes: u64, len_bytes: u64) -> std::ops::Range<u64> {
    let end = offset_bytes.saturating_add(len_bytes.max(1));
    round_down(offset_bytes, PAGE_BYTES)..round_up(end, PAGE_BYTES)
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits until no held write overlaps the range's pages; returns the lock.
    fn wait_clear(&self, offset_bytes: u64, len_bytes: u64) -> MutexGuard<'_, State> {
        let pages = page_span(offset_bytes, len_bytes);
        let mut state = self.lock();
        if state.overlaps(pages.start, pages.end) {
            self.overlap_waits.fetch_add(1, Ordering::Relaxed);
            while state.overlaps(pages.start, pages.end) {
                state = self.written.wait(state).unwrap_or_else(|p| p.into_inner());
            }
        }
        state
    }

    /// `wait_clear` that skips the lock when nothing is held (a held write that starts after this look is
    /// concurrent with the request, whose order a block device leaves open); fails once a held write was lost.
    fn settle_range(&self, offset_bytes: u64, len_bytes: u64) -> Result<(), EngineError> {
        if self.held_now.load(Ordering::Acquire) != 0 || self.lost.load(Ordering::Acquire) {
            self.wait_clear(offset_bytes, len_bytes).failed()?;
        }
        Ok(())
    }

    /// A pool thread. It counts as idle (`State::idle_workers`) from when it is started (`WriteBack::grow`) or
    /// lets a write go until it takes the next: a write queued meanwhile is one it will take, so the pool need
    /// not grow for it.
    fn worker(&self) {
        loop {
            let held = {
                let mut state = self.lock();
                loop {
                    if let Some(held) = state.queue.pop_front() {
                        state.idle_workers -= 1;
                        break held;
                    }
                    if state.closing {
                        state.idle_workers -= 1;
                        return;
                    }
                    state = self.queued.wait(state).unwrap_or_else(|p| p.into_inner());
                }
            };
            let bytes = &held.data[..held.len];
            let result = match &held.answer {
                None => self.array.write(held.offset_bytes, bytes, false),
                Some(slot) => {
                    let early = || {
                        slot.give(Ok(Answered::FromLog));
                        self.answered_from_log.fetch_add(1, Ordering::Relaxed);
                    };
                    let result = self.array.write_answering(held.offset_bytes, bytes, &early);
                    if slot.given() {
                        result // answered: a failure now is one behind the writer's back
                    } else {
                        // Not answered early: the writer gets the outcome, a failure included.
                        slot.give(result.map(|()| Answered::Written));
                        Ok(())
                    }
                }
            };
            self.release(
                held.seq,
                held.offset_bytes,
                held.len,
                held.len,
                held.slot,
                result.err().as_ref(),
                true,
            );
        }
    }

    /// Takes the pages of a write of `len` bytes at `offset_bytes` as held (nothing held overlaps them: the caller
    /// waited under this lock), `bytes` of it counted against `limit_bytes`; returns its sequence number.
    fn hold(&self, state: &mut State, offset_bytes: u64, len: usize, bytes: usize) -> u64 {
        let pages = page_span(offset_bytes, len as u64);
        debug_assert!(!state.overlaps(pages.start, pages.end));
        let seq = state.next_seq;
        state.next_seq += 1;
        state.ranges.insert(pages.start, (pages.end, seq));
        state.seqs.insert(seq);
        state.held_bytes += bytes;
        self.held_now.fetch_add(1, Ordering::Release);
        self.held_writes.fetch_add(1, Ordering::Relaxed);
        seq
    }

    /// A held write (`hold`) is done: a failure, which its writer can no longer be told of, makes every later
    /// request fail; its pages are let go and the requests waiting for them woken. Its store slot is cleared
    /// before the pages are let go (a later write to them must not be undone by a replay of this one), and only
    /// once the write is in place: a failed write stays in the store, for the next serve to write. `by_worker`:
    /// released by a pool thread, idle from now on (counted under the same lock that lets the write go).
    #[allow(clippy::too_many_arguments)]
    fn release(
        &self,
        seq: u64,
        offset_bytes: u64,
        len: usize,
        bytes: usize,
        slot: Option<usize>,
        failure: Option<&EngineError>,
        by_worker: bool,
    ) {
        let freed = match (&self.store, slot) {
            (Some(store), Some(slot)) if failure.is_none() => {
                store.clear(slot);
                Some(slot)
            }
            _ => None,
        };
        let mut state = self.lock();
        state.free_slots.extend(freed);
        if let Some(e) = failure {
            self.failed_writes.fetch_add(1, Ordering::Relaxed);
            log::error!(
                "a write of {len} bytes at {offset_bytes} answered before it was in place failed: {e}"
            );
            if state.failure.is_none() {
                state.failure = Some(format!("write of {len} bytes at {offset_bytes}: {e}"));
                self.lost.store(true, Ordering::Release);
            }
        }
        let removed = state
            .ranges
            .remove(&page_span(offset_bytes, len as u64).start);
        debug_assert_eq!(removed.map(|(_, seq)| seq), Some(seq));
        state.seqs.remove(&seq);
        state.held_bytes -= bytes;
        state.idle_workers += usize::from(by_worker);
        self.held_now.fetch_sub(1, Ordering::Release);
        drop(state);
        self.written.notify_all();
    }
}

/// An array's client side with write-back (module notes). Dropping it writes every held write and ends its
/// threads; `close` does the same and reports a failure of any of them.
pub struct WriteBack {
    shared: Arc<Shared>,
    /// The pool's threads (module notes: started on demand).
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl WriteBack {
    /// Write-back in front of `array` (a handle to it: stop the array only after this is closed or dropped).
    pub fn new(array: &Array, config: WriteBackConfig) -> WriteBack {
        WriteBack::with_store(array, config, None)
    }

    /// `new`, keeping every write answered when held in `store` as well until it is in place, so that a kill of
    /// the process does not lose it (held.rs). The store needs a slot per thread, each as large as
    /// `config.max_write_bytes`; write what an earlier store held first (`held::replay`).
    pub fn with_store(
        array: &Array,
        config: WriteBackConfig,
        store: Option<HeldStore>,
    ) -> WriteBack {
        if let Some(store) = &store {
            assert!(
                store.slots() >= config.threads
                    && store.slot_data_bytes() >= config.max_write_bytes,
                "a held-write store of {} slots of {} bytes for {} threads and writes of {} bytes",
                store.slots(),
                store.slot_data_bytes(),
                config.threads,
                config.max_write_bytes
            );
        }
        let free_slots = store
            .as_ref()
            .map_or(Vec::new(), |store| (0..store.slots()).rev().collect());

        let shared = Arc::new(Shared {
            array: array.handle(),
            config,
            store,
            state: Mutex::new(State {
                free_slots,
                ..State::default()
            }),
            written: Condvar::new(),
            queued: Condvar::new(),
            held_now: AtomicUsize::new(0),
            holding: AtomicBool::new(true),
            lost: AtomicBool::new(false),
            held_writes: AtomicU64::new(0),
            overlap_waits: AtomicU64::new(0),
            passed_through: AtomicU64::new(0),
            failed_writes: AtomicU64::new(0),
            answered_from_log: AtomicU64::new(0),
        });
        let write_back = WriteBack {
            shared,
            threads: Mutex::new(Vec::new()),
        };
        if config.threads > 0 {
            // One at once: a held write then always has a thread to write it, whatever later starts refuse.
            let mut state = write_back.lock();
            state.workers = 1;
            state.idle_workers = 1;
            drop(state);
            write_back
                .start_thread()
                .expect("spawning the first write-back thread");
        }
        write_back
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.shared.lock()
    }

    fn start_thread(&self) -> std::io::Result<()> {
        let mut threads = self.threads.lock().unwrap_or_else(|p| p.into_inner());
        let shared = self.shared.clone();
        let thread = std::thread::Builder::new()
            .name(format!("paraid-wb{}", threads.len()))
            .spawn(move || shared.worker())?;
        threads.push(thread);
        Ok(())
    }

    /// One more thread where the queue holds more writes than threads wait for work, up to the configured number
    /// (counted in `state` under its lock, started after it is let go). A thread that cannot be started leaves
    /// its writes to the threads there are.
    fn grow(&self, mut state: MutexGuard<'_, State>) {
        let wanted =
            state.queue.len() > state.idle_workers && state.workers < self.shared.config.threads;
        if !wanted {
            return;
        }
        state.workers += 1;
        state.idle_workers += 1;
        drop(state);
        if let Err(e) = self.start_thread() {
            let mut state = self.lock();
            state.workers -= 1;
            state.idle_workers -= 1;
            drop(state);
            log::warn!("write-back: could not start another thread ({e}); the pool stays as it is");
        }
    }

    /// Threads the pool has now (started on demand, module notes).
    pub fn threads(&self) -> usize {
        self.lock().workers
    }

    pub fn stats(&self) -> WriteBackStats {
        let s = &self.shared;
        WriteBackStats {
            held_writes: s.held_writes.load(Ordering::Relaxed),
            overlap_waits: s.overlap_waits.load(Ordering::Relaxed),
            passed_through: s.passed_through.load(Ordering::Relaxed),
            failed_writes: s.failed_writes.load(Ordering::Relaxed),
            answered_from_log: s.answered_from_log.load(Ordering::Relaxed),
        }
    }

    /// Writes held now.
    pub fn held(&self) -> usize {
        self.shared.held_now.load(Ordering::Acquire)
    }

    /// Whether a write of `len` bytes is one to hold (write-back being on); `caller_answers` for
    /// `write_answering`, which holds it on the caller's thread.
    fn holds(&self, len: usize, fua: bool, caller_answers: bool) -> bool {
        !fua && len > 0
            && len <= self.shared.config.max_write_bytes
            && self.shared.holding.load(Ordering::Relaxed)
            // Journal mode holds only what the array can answer from its log; with lone answers, in the pool
            // nothing: a write that reaches `write` there is one whose client does not wait for its answer
            // (`write_answering`, on the caller's thread, takes the others), so an answer from the log would buy
            // nothing for the copy and hand-offs.
            && match self.shared.config.answer {
                Answer::WhenHeld => true,
                // Asked last: the gate counts a write it refuses.
                Answer::FromLog => {
                    self.shared.array.answers_from_log()
                        && (caller_answers || !self.shared.array.answers_lone_writes_only())
                        && !self.shared.array.early_answers_refused()
                }
            }
    }

    /// A write not held (`holds` said no): after every held write it overlaps, through the array on this thread.
    /// Without a lock where nothing is held (`settle_range`).
    fn write_unheld(&self, offset_bytes: u64, buf: &[u8], fua: bool) -> Result<(), EngineError> {
        let s = &*self.shared;
        s.settle_range(offset_bytes, buf.len() as u64)?;
        s.array.write(offset_bytes, buf, fua)
    }

    /// Holds small writes again (true, as at start) or sends every write the ordinary path from now on (false;
    /// writes held already are still written in the background). For a caller that knows writes may fail now and
    /// wants each failure reported to its writer (the simulator, while an unreadable page meets an array without
    /// redundancy left).
    pub fn set_holding(&self, on: bool) {
        self.shared.holding.store(on, Ordering::Relaxed);
    }

    /// Writes `buf` at `offset_bytes`: held and answered at once when it is small, not FUA, and a thread is free
    /// (module notes), else through the array on this thread after every held write it overlaps.
    pub fn write(&self, offset_bytes: u64, buf: &[u8], fua: bool) -> Result<(), EngineError> {
        self.write_answered(offset_bytes, buf, fua).map(|_| ())
    }

    /// `write`, saying how the write was answered: a write answered `FromLog` (or written with FUA) is durable.
    pub fn write_answered(
        &self,
        offset_bytes: u64,
        buf: &[u8],
        fua: bool,
    ) -> Result<Answered, EngineError> {
        let s = &*self.shared;
        if s.config.threads == 0 {
            // Off: nothing is ever held, so there is nothing to wait for.
            return s
                .array
                .write(offset_bytes, buf, fua)
                .map(|()| Answered::Written);
        }
        let len = buf.len();
        if !self.holds(len, fua, false) {
            return self
                .write_unheld(offset_bytes, buf, fua)
                .map(|()| Answered::Written);
        }
        let state = s.wait_clear(offset_bytes, len as u64);
        state.failed()?;
        if !state.has_room(len, &s.config) {
            s.passed_through.fetch_add(1, Ordering::Relaxed);
            drop(state);
            return s
                .array
                .write(offset_bytes, buf, fua)
                .map(|()| Answered::Written);
        }
        drop(state);
        // Refused here as the array would: range, read-only, beyond tolerance.
        s.array.check_write(offset_bytes, len as u64)?;
        let mut data = AlignedBuf::for_overwrite(len);
        data[..len].copy_from_slice(buf);
        let mut state = s.wait_clear(offset_bytes, len as u64);
        state.failed()?;
        if !state.has_room(len, &s.config) {
            // Taken by other writers meanwhile.
            s.passed_through.fetch_add(1, Ordering::Relaxed);
            drop(state);
            return s
                .array
                .write(offset_bytes, buf, fua)
                .map(|()| Answered::Written);
        }
        let seq = s.hold(&mut state, offset_bytes, len, len);
        let answer = (s.config.answer == Answer::FromLog).then(|| Arc::new(AnswerSlot::default()));
        // Answered when held: kept in the store too, before it is answered or queued (a worker that wrote it and
        // cleared its slot before the copy went in would leave an old write there for a replay).
        let slot = match (&s.store, &answer) {
            (Some(store), None) => {
                let slot = state.free_slots.pop();
                debug_assert!(slot.is_some(), "a slot per thread, a held write per thread");
                if let Some(slot) = slot {
                    drop(state);
                    store.put(slot, seq, offset_bytes, &data[..len]);
                    state = s.lock();
                }
                slot
            }
            _ => None,
        };
        if s.store.is_some() && answer.is_none() && slot.is_none() {
            // No slot to keep it in: not held after all.
            drop(state);
            s.release(seq, offset_bytes, len, len, None, None, false);
            return s
                .array
                .write(offset_bytes, buf, fua)
                .map(|()| Answered::Written);
        }
        state.queue.push_back(Held {
            seq,
            offset_bytes,
            len,
            data,
            answer: answer.clone(),
            slot,
        });
        s.queued.notify_one();
        self.grow(state);
        match answer {
            None => Ok(Answered::Held),
            Some(slot) => slot.take(),
        }
    }

    /// Journal mode, on the caller's thread: a write the pool would hold (`Answer::FromLog`) is held here instead,
    /// written by this thread, and `answered` is called once it is durable in the log, before its in-place writes;
    /// this returns when the write is done. A frontend that can reply from `answered` saves the pool's copy and two
    /// thread hand-offs per write. Reads, flushes and overlapping writes wait for it as for any held write; a
    /// failure after `answered` is sticky as a pool write's. Any other write is `write`, and `answered` is not
    /// called.
    pub fn write_answering(
        &self,
        offset_bytes: u64,
        buf: &[u8],
        fua: bool,
        answered: &dyn Fn(),
    ) -> Result<(), EngineError> {
        let s = &*self.shared;
        let len = buf.len();
        if s.config.threads == 0 || s.config.answer != Answer::FromLog {
            return self.write(offset_bytes, buf, fua);
        }
        if !self.holds(len, fua, true) {
            // Not `write`, which would ask `holds` (and the gate) again.
            return self.write_unheld(offset_bytes, buf, fua);
        }
        s.array.check_write(offset_bytes, len as u64)?;
        let mut state = s.wait_clear(offset_bytes, len as u64);
        state.failed()?;
        // Not counted against `limit_bytes`: nothing is copied, the writer's buffer is written.
        let seq = s.hold(&mut state, offset_bytes, len, 0);
        drop(state);
        let early = std::cell::Cell::new(false);
        let hook = || {
            // `Array::write_answering` calls it at most once.
            early.set(true);
            s.answered_from_log.fetch_add(1, Ordering::Relaxed);
            answered();
        };
        let result = s.array.write_answering(offset_bytes, buf, &hook);
        // Only a failure after the answer is one the writer cannot be told of; before it, the writer gets it.
        let unreported = result.as_ref().err().filter(|_| early.get());
        s.release(seq, offset_bytes, len, 0, None, unreported, false);
        result
    }

    /// Fills `buf` from `offset_bytes` once no held write overlaps it.
    pub fn read(&self, offset_bytes: u64, buf: &mut [u8]) -> Result<(), EngineError> {
        self.shared.settle_range(offset_bytes, buf.len() as u64)?;
        self.shared.array.read(offset_bytes, buf)
    }

    /// `read` of several ranges at once (`Array::read_many`), each once no held write overlaps it. One result
    /// per read, in order.
    pub fn read_many(&self, reads: &mut [(u64, &mut [u8])]) -> Vec<Result<(), EngineError>> {
        let settled: Vec<Result<(), EngineError>> = reads
            .iter()
            .map(|(offset_bytes, buf)| self.shared.settle_range(*offset_bytes, buf.len() as u64))
            .collect();
        if settled.iter().all(Result::is_ok) {
            return self.shared.array.read_many(reads);
        }
        reads
            .iter_mut()
            .zip(settled)
            .map(|((offset_bytes, buf), settled)| {
                settled.and_then(|()| self.shared.array.read(*offset_bytes, buf))
            })
            .collect()
    }

    /// Every write answered before this call written in place, then `Array::flush`; fails when a held write
    /// failed (ever, since this write-back began), as every other request then does.
    pub fn flush(&self) -> Result<(), EngineError> {
        let s = &*self.shared;
        let mut state = s.lock();
        let below = state.next_seq;
        while state.seqs.first().is_some_and(|&seq| seq < below) {
            state = s.written.wait(state).unwrap_or_else(|p| p.into_inner());
        }
        state.failed()?;
        drop(state);
        s.array.flush()
    }

    pub fn discard(&self, offset_bytes: u64, len_bytes: u64) -> Result<(), EngineError> {
        self.shared.settle_range(offset_bytes, len_bytes)?;
        self.shared.array.discard(offset_bytes, len_bytes)
    }

    pub fn write_zeroes(
        &self,
        offset_bytes: u64,
        len_bytes: u64,
        fua: bool,
    ) -> Result<(), EngineError> {
        self.shared.settle_range(offset_bytes, len_bytes)?;
        self.shared.array.write_zeroes(offset_bytes, len_bytes, fua)
    }

    /// Block status once no held write overlaps the range (a held write may fill a hole).
    pub fn allocation(
        &self,
        offset_bytes: u64,
        len_bytes: u64,
    ) -> Result<Vec<AllocationExtent>, EngineError> {
        self.shared.settle_range(offset_bytes, len_bytes)?;
        self.shared.array.allocation(offset_bytes, len_bytes)
    }

    /// Waits until every held write is written in place (or failed).
    pub fn settle(&self) {
        let s = &*self.shared;
        let mut state = s.lock();
        while !state.seqs.is_empty() {
            state = s.written.wait(state).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Writes every held write, ends the threads, and reports the first held write that failed, if any.
    pub fn close(mut self) -> Result<(), EngineError> {
        self.end_threads();
        self.shared.lock().failed()
    }

    fn end_threads(&mut self) {
        self.shared.lock().closing = true;
        self.shared.queued.notify_all();
        let threads = std::mem::take(self.threads.get_mut().unwrap_or_else(|p| p.into_inner()));
        for thread in threads {
            if let Err(panic) = thread.join() {
                std::panic::resume_unwind(panic);
            }
        }
    }
}

impl Drop for WriteBack {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            self.end_threads();
        }
    }
}
