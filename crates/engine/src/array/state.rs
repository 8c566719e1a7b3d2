//! Background work of a running array (rebuild, check, repair, resync): one job runs at a time, like md's sync
//! thread; each reports a `Progress`, honours the sync speed limits and stops when asked.
//!
//! How a job is written (rebuild.rs, check.rs, resync.rs):
//!
//! ```ignore
//! array.queue_job("check", None, total_bytes, |array, job| {
//!     while !job.stopping() && more_to_do {
//!         /* ... a batch ... */
//!         job.advance(batch_bytes);       // progress and rate
//!         job.add_mismatches(n);          // check/repair figures
//!         job.throttle();                 // sync_speed_min/max against foreground I/O
//!     }
//!     job.finish("completed")             // or "interrupted", "aborted: <why>"
//! })?;
//! ```
//!
//! Rate limit (md's sync_speed_min/max): while foreground I/O arrived since the last batch, a job runs no faster
//! than `min` (guaranteed: it is never slowed below it); when the array is otherwise idle it runs up to `max`
//! (0 = unlimited). The rate is measured over a sliding window of about a second.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::Array;
use crate::error::EngineError;

/// Default sync_speed_min: what a job keeps even under foreground load. md's 1000 KiB/s is a disk-era figure;
/// an NVMe member rebuilds at hundreds of MiB/s without hurting the foreground much.
pub const DEFAULT_SYNC_SPEED_MIN_BYTES_PER_S: u64 = 64 << 20;
/// Default sync_speed_max: unlimited.
pub const DEFAULT_SYNC_SPEED_MAX_BYTES_PER_S: u64 = 0;
/// The rate window: the limits are enforced over roughly this much recent time.
const RATE_WINDOW: Duration = Duration::from_secs(1);
/// Longest single sleep of `throttle` (so a stop request or a speed change is noticed soon).
const THROTTLE_SLEEP_MAX: Duration = Duration::from_millis(100);

/// Progress of a background job, and (from `last_result`) its final figures.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Progress {
    /// "rebuild" | "check" | "repair" | "resync".
    pub kind: &'static str,
    /// The slot being rebuilt.
    pub slot: Option<usize>,
    /// Bytes done and to do: member data-area bytes of the target for a rebuild, array stripes' member bytes
    /// for check/resync (each job says what it counts; done/total is the fraction).
    pub done_bytes: u64,
    pub total_bytes: u64,
    pub rate_bytes_per_s: u64,
    pub eta_s: Option<u64>,
    /// check/repair: stripes whose parity did not match; repaired: stripes rewritten.
    pub mismatches: u64,
    pub repaired: u64,
    /// Array byte ranges `(offset_bytes, len_bytes)` that could be neither read nor reconstructed (a rebuild of
    /// RAID5 meeting a latent sector error on a survivor), sorted and merged.
    pub unreadable: Vec<(u64, u64)>,
    /// A rebuild onto the slot's own member come back: target bytes found in sync by the write-intent bitmap and
    /// not rebuilt (counted in `done_bytes` too).
    pub in_sync_bytes: u64,
    /// None while running; then "completed", "interrupted" (stopped or preempted, resumable) or
    /// "aborted: <why>".
    pub outcome: Option<String>,
}

impl Progress {
    pub fn new(kind: &'static str, slot: Option<usize>, total_bytes: u64) -> Progress {
        Progress {
            kind,
            slot,
            done_bytes: 0,
            total_bytes,
            rate_bytes_per_s: 0,
            eta_s: None,
            mismatches: 0,
            repaired: 0,
            unreadable: Vec::new(),
            in_sync_bytes: 0,
            outcome: None,
        }
    }
}

/// Adds `(offset, len)` to sorted, merged ranges.
fn add_range(ranges: &mut Vec<(u64, u64)>, offset_bytes: u64, len_bytes: u64) {
    if len_bytes == 0 {
        return;
    }
    ranges.push((offset_bytes, len_bytes));
    ranges.sort_unstable();
    let mut merged: Vec<(u64, u64)> = Vec::with_capacity(ranges.len());
    for &(at, len) in ranges.iter() {
        match merged.last_mut() {
            Some((m_at, m_len)) if at <= *m_at + *m_len => {
                *m_len = (*m_len).max(at + len - *m_at);
            }
            _ => merged.push((at, len)),
        }
    }
    *ranges = merged;
}

struct Running {
    progress: Progress,
    started: Instant,
    /// `done_bytes` when this run started (a resumed rebuild starts at its checkpoint): the rate counts only
    /// what this run did.
    done_at_start: u64,
}

#[derive(Default)]
struct JobsState {
    running: Option<Running>,
    /// Jobs queued (threads waiting for their turn), the running one included.
    pending: usize,
    /// Jobs waiting for their turn, oldest first: (id, kind, slot, total bytes); `progress` shows the first while
    /// nothing runs, so that a job just queued is never mistaken for an idle array.
    queued: Vec<(u64, &'static str, Option<usize>, u64)>,
    next_id: u64,
    last: Option<Progress>,
    threads: Vec<JoinHandle<()>>,
}

/// The array's background job slot, rate limits and foreground activity counter.
pub(crate) struct Jobs {
    state: Mutex<JobsState>,
    changed: Condvar,
    speed_min_bytes_per_s: AtomicU64,
    speed_max_bytes_per_s: AtomicU64,
    /// Foreground requests so far (reads, writes, flushes, discards): a job yields to them down to `min`.
    foreground_ops: AtomicU64,
    /// The array is stopping: every job ends at its next batch.
    stop: AtomicBool,
    /// A job of higher priority (rebuild) waits: a check or resync should end early ("interrupted").
    preempt: AtomicBool,
}

impl Jobs {
    pub(crate) fn new() -> Jobs {
        Jobs {
            state: Mutex::new(JobsState::default()),
            changed: Condvar::new(),
            speed_min_bytes_per_s: AtomicU64::new(DEFAULT_SYNC_SPEED_MIN_BYTES_PER_S),
            speed_max_bytes_per_s: AtomicU64::new(DEFAULT_SYNC_SPEED_MAX_BYTES_PER_S),
            foreground_ops: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            preempt: AtomicBool::new(false),
        }
    }

    /// Records the end of a rebuild of `slot` that no job is running (its new member failed before a job
    /// started on it) as `last_result()`. A job already rebuilding `slot` records its own end instead.
    pub(crate) fn record_unstarted_rebuild(&self, slot: usize, total_bytes: u64, outcome: String) {
        let mut state = self.lock();
        let running_it = state
            .running
            .as_ref()
            .is_some_and(|r| r.progress.kind == "rebuild" && r.progress.slot == Some(slot));
        if running_it {
            return;
        }
        let mut progress = Progress::new("rebuild", Some(slot), total_bytes);
        progress.outcome = Some(outcome);
        log::info!(
            "rebuild of slot {slot} ended before a job started on it: {outcome}",
            outcome = progress.outcome.as_deref().unwrap_or("")
        );
        state.last = Some(progress);
        drop(state);
        self.changed.notify_all();
    }

    fn lock(&self) -> MutexGuard<'_, JobsState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Counts one foreground request (called by the data path).
    pub(crate) fn note_foreground(&self) {
        self.foreground_ops.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn progress(&self) -> Option<Progress> {
        let state = self.lock();
        match &state.running {
            Some(r) => {
                let mut p = r.progress.clone();
                let (rate, eta) = rate_and_eta(r);
                p.rate_bytes_per_s = rate;
                p.eta_s = eta;
                Some(p)
            }
            None => state
                .queued
                .first()
                .map(|&(_, kind, slot, total)| Progress::new(kind, slot, total)),
        }
    }

    /// The jobs waiting for their turn, oldest first ("rebuild slot 2"); one waiting while nothing runs is shown
    /// as the progress instead (`progress`), so it is left out here.
    pub(crate) fn queued_descriptions(&self) -> Vec<String> {
        let state = self.lock();
        let skip = usize::from(state.running.is_none());
        state
            .queued
            .iter()
            .skip(skip)
            .map(|&(_, kind, slot, _)| match slot {
                Some(slot) => format!("{kind} slot {slot}"),
                None => kind.to_string(),
            })
            .collect()
    }

    /// The kinds of the running job and of the jobs queued behind it, running first.
    pub(crate) fn kinds_underway(&self) -> Vec<&'static str> {
        let state = self.lock();
        let running = state.running.as_ref().map(|r| r.progress.kind);
        running
            .into_iter()
            .chain(state.queued.iter().map(|q| q.1))
            .collect()
    }

    /// Whether the array is stopping (no job may start or queue more work).
    pub(crate) fn stopping(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    /// Asks every job to end at its next batch and waits for their threads.
    pub(crate) fn stop_all(&self) {
        self.stop.store(true, Ordering::SeqCst);
        self.changed.notify_all();
        let threads = std::mem::take(&mut self.lock().threads);
        for t in threads {
            if t.join().is_err() {
                log::error!("a background job panicked");
            }
        }
    }
}

fn rate_and_eta(r: &Running) -> (u64, Option<u64>) {
    let secs = r.started.elapsed().as_secs_f64();
    let done = r.progress.done_bytes.saturating_sub(r.done_at_start);
    if secs <= 0.0 || done == 0 {
        return (0, None);
    }
    let rate = (done as f64 / secs) as u64;
    let left = r.progress.total_bytes.saturating_sub(r.progress.done_bytes);
    let eta = left.checked_div(rate);
    (rate, eta)
}

fn with_running<R>(jobs: &Jobs, f: impl FnOnce(&mut Progress) -> R) -> R {
    let mut state = jobs.lock();
    let running = state
        .running
        .as_mut()
        .expect("a job handle exists only while running");
    f(&mut running.progress)
}

/// Progress updates of a running job, for its helper threads (`Job::progress_handle`).
#[derive(Clone, Copy)]
pub(crate) struct JobProgress<'a> {
    jobs: &'a Jobs,
}

impl JobProgress<'_> {
    /// Records `bytes` more done (started ones were counted by `Job::count_started`).
    pub(crate) fn advance(&self, bytes: u64) {
        with_running(self.jobs, |p| {
            p.done_bytes = (p.done_bytes + bytes).min(p.total_bytes)
        });
    }

    /// Records target bytes found in sync without being rebuilt (they still count as done through `advance`).
    pub(crate) fn add_in_sync(&self, bytes: u64) {
        with_running(self.jobs, |p| p.in_sync_bytes += bytes);
    }

    /// Records array bytes that could be neither read nor reconstructed.
    pub(crate) fn add_unreadable(&self, offset_bytes: u64, len_bytes: u64) {
        with_running(self.jobs, |p| {
            add_range(&mut p.unreadable, offset_bytes, len_bytes)
        });
    }
}

/// The running job's handle: progress updates, throttling, stop requests.
pub(crate) struct Job<'a> {
    jobs: &'a Jobs,
    /// Rate window: start and bytes done in it.
    window_start: Instant,
    window_bytes: u64,
    foreground_seen: u64,
    finished: bool,
}

impl<'a> Job<'a> {
    /// Whether the job should end now, resumable: the array stops, or (for a check or resync) a rebuild waits
    /// for it to yield.
    pub(crate) fn stopping(&self) -> bool {
        self.jobs.stop.load(Ordering::Relaxed) || self.preempted()
    }

    /// Whether a higher-priority job (rebuild) waits for this one.
    pub(crate) fn preempted(&self) -> bool {
        self.jobs.preempt.load(Ordering::Relaxed)
    }

    /// Names what the job works on once it knows (a rebuild picks its slot when it starts).
    pub(crate) fn set_target(&mut self, slot: Option<usize>, total_bytes: u64) {
        self.with(|p| {
            p.slot = slot;
            p.total_bytes = total_bytes;
        });
    }

    /// Ends a job that found nothing to do: no `last_result` is recorded.
    pub(crate) fn discard(mut self) {
        self.finished = true;
        self.jobs.lock().running = None;
        self.jobs.changed.notify_all();
    }

    fn with<R>(&self, f: impl FnOnce(&mut Progress) -> R) -> R {
        with_running(self.jobs, f)
    }

    /// A handle for the job's helper threads: they record progress while the job itself may sleep in
    /// `throttle` (a rebuild keeps several batches in flight).
    pub(crate) fn progress_handle(&self) -> JobProgress<'a> {
        JobProgress { jobs: self.jobs }
    }

    /// Counts `bytes` just started toward the speed limit, without counting them done: a job with work in
    /// flight counts it when it starts (so `throttle` spaces the starts) and reports it done through
    /// `JobProgress::advance` when it is.
    pub(crate) fn count_started(&mut self, bytes: u64) {
        self.window_bytes += bytes;
    }

    /// Records `bytes` more done.
    pub(crate) fn advance(&mut self, bytes: u64) {
        self.window_bytes += bytes;
        self.with(|p| p.done_bytes = (p.done_bytes + bytes).min(p.total_bytes));
    }

    pub(crate) fn add_mismatches(&self, n: u64) {
        self.with(|p| p.mismatches += n);
    }

    pub(crate) fn add_repaired(&self, n: u64) {
        self.with(|p| p.repaired += n);
    }

    pub(crate) fn unreadable(&self) -> Vec<(u64, u64)> {
        self.with(|p| p.unreadable.clone())
    }

    /// Target bytes found in sync so far (`JobProgress::add_in_sync`).
    pub(crate) fn in_sync_bytes(&self) -> u64 {
        self.with(|p| p.in_sync_bytes)
    }

    /// Sleeps as the sync speed limits ask: down to `min` while foreground I/O arrived since the last call, up
    /// to `max` (if set) otherwise.
    pub(crate) fn throttle(&mut self) {
        let foreground = self.jobs.foreground_ops.load(Ordering::Relaxed);
        let busy = foreground != self.foreground_seen;
        self.foreground_seen = foreground;
        let min = self.jobs.speed_min_bytes_per_s.load(Ordering::Relaxed);
        let max = self.jobs.speed_max_bytes_per_s.load(Ordering::Relaxed);
        let limit = match (busy, max) {
            (true, 0) => min,
            (true, max) => min.min(max),
            (false, max) => max,
        };
        if limit > 0 && self.window_bytes > 0 {
            // In short sleeps, so that a stop request or a new speed is noticed soon.
            let needed = Duration::from_secs_f64(self.window_bytes as f64 / limit as f64);
            loop {
                let elapsed = self.window_start.elapsed();
                if elapsed >= needed || self.stopping() {
                    break;
                }
                std::thread::sleep((needed - elapsed).min(THROTTLE_SLEEP_MAX));
                let (min_now, max_now) = (
                    self.jobs.speed_min_bytes_per_s.load(Ordering::Relaxed),
                    self.jobs.speed_max_bytes_per_s.load(Ordering::Relaxed),
                );
                if (min_now, max_now) != (min, max) {
                    break;
                }
            }
        }
        let elapsed = self.window_start.elapsed();
        if elapsed >= RATE_WINDOW {
            // Keep the window's rate, forget its length: a new window starts where the limit left off.
            let keep = RATE_WINDOW.as_secs_f64() / 2.0 / elapsed.as_secs_f64();
            self.window_bytes = (self.window_bytes as f64 * keep) as u64;
            self.window_start = Instant::now() - RATE_WINDOW / 2;
        }
    }

    /// Ends the job: its final figures become `last_result()`.
    pub(crate) fn finish(mut self, outcome: &str) {
        self.end(outcome);
    }

    fn end(&mut self, outcome: &str) {
        if self.finished {
            return;
        }
        self.finished = true;
        let mut state = self.jobs.lock();
        if let Some(r) = state.running.take() {
            let (rate, _) = rate_and_eta(&r);
            let mut p = r.progress;
            p.rate_bytes_per_s = rate;
            p.eta_s = None;
            p.outcome = Some(outcome.to_string());
            log::info!(
                "{}{} {}: {} of {} bytes, {} mismatches, {} repaired, {} unreadable ranges",
                p.kind,
                p.slot.map(|s| format!(" of slot {s}")).unwrap_or_default(),
                outcome,
                p.done_bytes,
                p.total_bytes,
                p.mismatches,
                p.repaired,
                p.unreadable.len()
            );
            state.last = Some(p);
        }
        drop(state);
        self.jobs.changed.notify_all();
    }
}

impl Drop for Job<'_> {
    fn drop(&mut self) {
        // A job that returned (or panicked) without finishing was cut short.
        self.end("interrupted");
    }
}

impl Array {
    /// The running background job's progress; None when idle.
    pub fn progress(&self) -> Option<Progress> {
        self.jobs.progress()
    }

    /// The last finished job's final figures (check mismatches, rebuild unreadable ranges, ...).
    pub fn last_result(&self) -> Option<Progress> {
        self.jobs.lock().last.clone()
    }

    /// md's sync_speed_min/max in bytes per second: `min` is kept even under foreground I/O, `max` caps an
    /// otherwise idle array (0 = unlimited).
    pub fn set_sync_speed(&self, min_bytes_per_s: u64, max_bytes_per_s: u64) {
        self.jobs
            .speed_min_bytes_per_s
            .store(min_bytes_per_s, Ordering::Relaxed);
        self.jobs
            .speed_max_bytes_per_s
            .store(max_bytes_per_s, Ordering::Relaxed);
    }

    /// (min, max) sync speed in bytes per second.
    pub fn sync_speed(&self) -> (u64, u64) {
        (
            self.jobs.speed_min_bytes_per_s.load(Ordering::Relaxed),
            self.jobs.speed_max_bytes_per_s.load(Ordering::Relaxed),
        )
    }

    /// Waits until no background job runs or waits to run; false on timeout.
    pub fn wait_idle(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut state = self.jobs.lock();
        while state.pending > 0 {
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            state = self
                .jobs
                .changed
                .wait_timeout(state, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        true
    }

    /// Runs `work` on a background thread once no other job runs (jobs run one at a time, in order). `kind` and
    /// `slot` name it in `progress()`; `total_bytes` is what 100 % means. With `preempt`, a running job that is
    /// not a rebuild is asked to end early (a rebuild restores redundancy: it goes first, as in md).
    pub(crate) fn queue_job<F>(
        &self,
        kind: &'static str,
        slot: Option<usize>,
        total_bytes: u64,
        preempt: bool,
        work: F,
    ) -> Result<(), EngineError>
    where
        F: FnOnce(&Array, Job<'_>) + Send + 'static,
    {
        if self.jobs.stop.load(Ordering::SeqCst) {
            return Err(EngineError::StartJob {
                kind,
                why: "the array is stopping".to_string(),
            });
        }
        let handle = self.handle();
        let mut state = self.jobs.lock();
        state.pending += 1;
        let id = state.next_id;
        state.next_id += 1;
        state.queued.push((id, kind, slot, total_bytes));
        if preempt
            && state
                .running
                .as_ref()
                .is_some_and(|r| r.progress.kind != "rebuild")
        {
            self.jobs.preempt.store(true, Ordering::SeqCst);
        }
        let spawned = std::thread::Builder::new()
            .name(format!("paraid-{kind}"))
            .spawn(move || {
                let jobs = &handle.jobs;
                {
                    let mut state = jobs.lock();
                    while state.running.is_some() && !jobs.stop.load(Ordering::SeqCst) {
                        state = jobs.changed.wait(state).unwrap_or_else(|e| e.into_inner());
                    }
                    state.queued.retain(|q| q.0 != id);
                    if jobs.stop.load(Ordering::SeqCst) {
                        state.pending -= 1;
                        drop(state);
                        jobs.changed.notify_all();
                        return;
                    }
                    if preempt {
                        jobs.preempt.store(false, Ordering::SeqCst);
                    }
                    let mut progress = Progress::new(kind, slot, total_bytes);
                    progress.outcome = None;
                    state.running = Some(Running {
                        progress,
                        started: Instant::now(),
                        done_at_start: 0,
                    });
                }
                let job = Job {
                    jobs,
                    window_start: Instant::now(),
                    window_bytes: 0,
                    foreground_seen: jobs.foreground_ops.load(Ordering::Relaxed),
                    finished: false,
                };
                work(&handle, job);
                let mut state = jobs.lock();
                state.pending -= 1;
                drop(state);
                jobs.changed.notify_all();
            });
        match spawned {
            Ok(thread) => {
                state.threads.retain(|t| !t.is_finished());
                state.threads.push(thread);
                Ok(())
            }
            Err(source) => {
                state.pending -= 1;
                state.queued.retain(|q| q.0 != id);
                Err(EngineError::StartJob {
                    kind,
                    why: format!("cannot start a thread: {source}"),
                })
            }
        }
    }
}

impl Job<'_> {
    /// Marks where a resumed job starts (its checkpoint): progress starts there, the rate counts from there.
    pub(crate) fn resume_at(&mut self, done_bytes: u64) {
        let mut state = self.jobs.lock();
        if let Some(r) = state.running.as_mut() {
            r.progress.done_bytes = done_bytes;
            r.done_at_start = done_bytes;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_merge() {
        let mut r = Vec::new();
        add_range(&mut r, 100, 10);
        add_range(&mut r, 0, 10);
        add_range(&mut r, 110, 5);
        add_range(&mut r, 8, 4);
        add_range(&mut r, 50, 0);
        assert_eq!(r, vec![(0, 12), (100, 15)]);
    }

    #[test]
    fn a_rebuild_aborted_before_its_job_started_is_the_last_result() {
        let jobs = Jobs::new();
        jobs.lock().last = Some(Progress {
            outcome: Some("completed".to_string()),
            ..Progress::new("resync", None, 10)
        });
        jobs.record_unstarted_rebuild(2, 100, "aborted: x".to_string());
        let last = jobs.lock().last.clone().expect("a result");
        assert_eq!(
            (last.kind, last.slot, last.outcome.as_deref()),
            ("rebuild", Some(2), Some("aborted: x"))
        );
        // A job rebuilding the slot records its own end.
        jobs.lock().running = Some(Running {
            progress: Progress::new("rebuild", Some(3), 100),
            started: Instant::now(),
            done_at_start: 0,
        });
        jobs.record_unstarted_rebuild(3, 100, "aborted: y".to_string());
        let last = jobs.lock().last.clone().expect("a result");
        assert_eq!(last.outcome.as_deref(), Some("aborted: x"));
    }
}
