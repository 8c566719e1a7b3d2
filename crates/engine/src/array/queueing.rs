//! Whether the members queue requests: the second half of journal mode's gate on early answers at depth
//! (spare_cpu.rs is the first).
//!
//! Why: at depth the CPU gate's `Spare::ForAll` answers every small write from the log, not only a lone one. That
//! pays where the members' latency bounds the writers: an answer one round trip sooner lets the client send its
//! next write sooner, and the members serve the extra log records side by side with the rest
//! (`writehole_cost latency:100`, four writers: −15..−21 % against the bitmap alone, where the log costs
//! −40..−43 %). Where the members' request rate bounds the writers (a drive at its IOPS limit, a cloud volume at
//! its quota, disks QEMU holds to 400 requests/s), an early answer's data records are requests the members serve
//! instead of in-place writes, while the CPU idles: RAID5 with four writers on rate-bound members cost 8.5 % more
//! than the log (stop 51), and in the VM at QD32 −13.5 % against the log's −8.0 % (stop 52). The CPU's idle
//! share cannot tell the two apart; the members' latency against their queues can.
//!
//! How: every batch of member reads and writes (`Array::submit_tolerant`) is a sample: x, the most requests
//! already in flight on any one member the batch sends to, when it starts; y, how long the batch took. Members
//! that serve one request after another take about (x + 1) service times, so the least-squares line through the
//! samples has a slope about its intercept; members that serve requests side by side take about the same whatever
//! x is (a slope about 0). Every `WINDOW_SAMPLES` samples the line is fitted, and the members count as queueing
//! from a slope of `ON_RATIO` times the intercept until it falls below `OFF_RATIO` times (hysteresis: the early
//! answers the state allows change the queues it is read from). A window whose x hardly varies (one writer: every
//! batch finds the members idle) says nothing and keeps the state. Members in memory on CPU-bound cores queue
//! this way too (their threads share the cores); the CPU gate says busy there anyway.
//!
//! While the members queue, `Spare::ForAll` counts as `Spare::ForLone` (`Array::write_answering`): a lone write
//! (queue depth 1) is still answered from the log, which gains on rate-bound members that have time to spare
//! (`writehole_cost rate:5000` at QD1: −4..−8 % against the bitmap alone, where the log costs −34 %), because its
//! client waits for that answer and the requests it adds are served while the members would idle.
//!
//! Saturated: members that queue and have no time to spare at all, where even a lone write's records take the
//! place of in-place writes. In the VM, on disks QEMU holds to 400 requests/s (a token bucket: a request is served
//! at once while the bucket has tokens), RAID5 with the bitmap alone reached the disks' rate at QD1 already (500
//! writes/s of four requests on five disks), and lone answers cost −44 % against the log's −29 % (stop 53). A
//! member's busy share is the part of the window during which it had a request in flight (for members that serve
//! one request after another, how much of their time is spent); from `SATURATED_ON` of the busiest member's time
//! queueing members count as saturated, below `SATURATED_OFF` no longer, and every write takes the log's own way
//! meanwhile. The gap is wide because the log's own way at QD1 in that VM keeps the disks 80 % busy: it must not
//! read as room for early answers that would saturate them again. (A first version estimated the busy share as
//! requests per second times the fitted slope: at QD1, where a window's requests hardly overlap, the slope was
//! too noisy, and a third to a half of the windows let lone answers through.) A request counts as in flight
//! until its whole batch is done, since the members report a batch at once.
//!
//! Samples are taken with `try_lock`: a batch that finds another thread adding its own drops its sample rather
//! than wait on the data path (the fit needs many, not all).
//!
//! When the load changes (stop 56). A window that spans a pause in the array's work (no batch ending for
//! `IDLE_GAP_NS`) would fit the load before the pause and the load after it as one, and count the pause as idle
//! members: in the VM, after a sequential prefill, the first window of random writes at QD32 ran 1.8 s and said
//! `Free`, and a QD1 job's first window, 7 % busy, said `Queueing`; early answers went out for a second into
//! members at their rate, each costing records on three rings. So a sample that starts after such a pause begins
//! a new window, and a window whose first `QUICK_SAMPLES` already say fewer early answers than the state allows
//! (`next_load` more restrictive) ends there: the gate learns that the members filled within a tenth of a
//! window's time, while a window that would allow more early answers still waits for all its samples.
//!
//! A lone writer (stop 62). Its batches find nothing ahead, so its windows fit no line and used to keep whatever
//! state came before: after a sequential fill had saturated the members, a QD1 client's writes never got their
//! early answers again, with the members a third busy. A window without a line now ends a saturation where the
//! busiest member's busy share is under `SATURATED_OFF`. That is a guess (`Probe`): on members bound by their rate
//! the guess's early answers saturate them again, which the next window with a line shows, and each such return
//! makes the next guess wait longer (4, 8, 16 ... 64 windows).

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use crate::member::{IoOp, IoReq};

/// Samples per fitted window.
pub const WINDOW_SAMPLES: u64 = 256;
/// Samples from which a window may end early, where its verdict allows fewer early answers than the state does.
pub const QUICK_SAMPLES: u64 = 64;
/// A pause with no batch ending for this long starts a new window at the next batch (module doc).
pub const IDLE_GAP_NS: u64 = 100_000_000;
/// The slope, as a share of the intercept, from which the members count as queueing...
pub const ON_RATIO: f64 = 0.5;
/// ...and below which they stop. Members that serve side by side show about 0; members held to a rate, at
/// their rate, 0.25 to several in the VM (single windows down to 0.245, where the old 0.25 let them read as free).
pub const OFF_RATIO: f64 = 0.15;
/// The least variance of x (requests ahead) a window must show to say anything.
pub const MIN_AHEAD_VARIANCE: f64 = 0.25;
/// The busiest member's estimated busy share from which queueing members count as saturated...
pub const SATURATED_ON: f64 = 0.85;
/// ...and below which they no longer do.
pub const SATURATED_OFF: f64 = 0.5;
/// Windows that may not leave a saturation without a line after the first time that leaving it proved wrong
/// (`Probe`); doubled at each further time, up to `PROBE_BACKOFF_MAX_WINDOWS`.
pub const PROBE_BACKOFF_FIRST_WINDOWS: u32 = 4;
pub const PROBE_BACKOFF_MAX_WINDOWS: u32 = 64;

/// What the members' queues say about more requests (module doc).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
pub enum Load {
    /// The members serve requests side by side, or nothing says otherwise: early answers as the CPU allows.
    #[default]
    Free,
    /// The members serve one request after another: early answers for lone writes only.
    Queueing,
    /// ...and have no time to spare: no early answers.
    Saturated,
}

/// A window's sums for the least-squares line of y (batch time, ns) over x (requests ahead).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Sums {
    pub n: u64,
    pub x: u64,
    pub y: u64,
    pub xx: u64,
    pub xy: u64,
}

/// A fitted line: batch time (ns) = `intercept_ns` + `slope_ns` per request ahead.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Line {
    pub slope_ns: f64,
    pub intercept_ns: f64,
}

impl Line {
    /// The slope over the intercept (per request ahead). A line that rises but meets x = 0 at or below zero
    /// counts as infinitely steep: no time at all with nothing ahead is queueing alone.
    pub fn slope_per_intercept(&self) -> f64 {
        if self.slope_ns <= 0.0 {
            0.0
        } else if self.intercept_ns <= 0.0 {
            f64::INFINITY
        } else {
            self.slope_ns / self.intercept_ns
        }
    }
}

impl Sums {
    pub fn add(&mut self, ahead: u64, took_ns: u64) {
        self.n += 1;
        self.x += ahead;
        self.y += took_ns;
        self.xx += ahead * ahead;
        self.xy += ahead * took_ns;
    }

    /// The least-squares line; None where x hardly varies.
    pub fn line(&self) -> Option<Line> {
        if self.n < 2 {
            return None;
        }
        let n = self.n as f64;
        let mean_x = self.x as f64 / n;
        let mean_y = self.y as f64 / n;
        let var_x = self.xx as f64 / n - mean_x * mean_x;
        if var_x < MIN_AHEAD_VARIANCE {
            return None;
        }
        let slope_ns = (self.xy as f64 / n - mean_x * mean_y) / var_x;
        Some(Line {
            slope_ns,
            intercept_ns: mean_y - slope_ns * mean_x,
        })
    }
}

/// The load after a window, from the load before (hysteresis), the window's fitted line (`Sums::line`; None: the
/// window says nothing), and the busiest member's busy share over it (0 to 1).
pub fn next_load(before: Load, line: Option<Line>, busiest_busy: f64) -> Load {
    let Some(line) = line else {
        // Nothing ahead of any batch (one writer): nothing said about queueing, so the state holds, but not a
        // saturation its members' time now denies. Without this a single writer after a saturating load (a
        // sequential fill, then writes at QD1) never left it: on the host's disk every lone write took the log's
        // way with the busiest member 34-48 % busy, where its early answer was 38 % faster (stop 62). A guess
        // where the members are bound by their rate: `MemberQueues` backs off from it when it proves wrong (`Probe`).
        if before == Load::Saturated && busiest_busy < SATURATED_OFF {
            return Load::Queueing;
        }
        return before;
    };
    let queueing = line.slope_per_intercept()
        >= if before >= Load::Queueing {
            OFF_RATIO
        } else {
            ON_RATIO
        };
    if !queueing {
        return Load::Free;
    }
    if busiest_busy
        >= if before == Load::Saturated {
            SATURATED_OFF
        } else {
            SATURATED_ON
        }
    {
        Load::Saturated
    } else {
        Load::Queueing
    }
}

/// A batch's start, for `MemberQueues::end`.
pub(crate) struct Started {
    ahead: u64,
    at_ns: u64,
}

/// A window being filled: its sums, when it began, and when its last sample's batch ended (ns since the epoch).
struct Window {
    sums: Sums,
    began_ns: u64,
    last_end_ns: u64,
    probe: Probe,
}

/// Leaving a saturation on a window without a line (`next_load`) is a guess: a lone writer's batches find nothing
/// ahead, so the members' busy share alone says they have time. Where that is so (latency-bound members), the lone
/// writes answered from the log then keep the state out of saturation. Where the members are bound by their
/// request rate instead (the VM's disks held to 400 requests/s: the busy share of a lone writer's members is low
/// there too, the emulated CPU taking most of the time), the early answers' records take the place of in-place
/// writes, and the next window with a line finds the members saturated again. Such a return proves the guess wrong,
/// and the next few windows without a line keep the saturation (`backoff_left`), twice as many at each further
/// return: in that VM a lone writer's RAID6 writes cost the bitmap alone −35.5 % with the guess made at every such
/// window, against −30.1 % when none was (stop 62). A pause, after which the load may be another, forgets it all.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Probe {
    /// A saturation was left on a window without a line, and no window with a line has said since.
    open: bool,
    /// Windows without a line the next return must wait for (0: none since the last good guess)...
    backoff: u32,
    /// ...and those still to wait now.
    backoff_left: u32,
}

impl Probe {
    /// The state after a window, from `next_load`'s verdict: leaving a saturation without a line only where no
    /// backoff is left, and a return to it from an open guess counted as a wrong one.
    fn settle(&mut self, before: Load, with_line: bool, verdict: Load) -> Load {
        if !with_line {
            if before == Load::Saturated && verdict != Load::Saturated {
                if self.backoff_left > 0 {
                    self.backoff_left -= 1;
                    return Load::Saturated;
                }
                self.open = true;
            }
            return verdict;
        }
        if self.open {
            self.open = false;
            if verdict == Load::Saturated {
                self.backoff = (self.backoff * 2)
                    .clamp(PROBE_BACKOFF_FIRST_WINDOWS, PROBE_BACKOFF_MAX_WINDOWS);
                self.backoff_left = self.backoff;
            } else {
                self.backoff = 0;
            }
        }
        verdict
    }
}

/// The members' queues as the array's batches find them (module doc).
pub(crate) struct MemberQueues {
    /// Times are ns since this.
    epoch: Instant,
    /// Per member slot, reads and writes submitted and not yet completed; since when it has had one in flight
    /// (while it has); and its time with one in flight in this window, periods still open left out.
    in_flight: Vec<AtomicU64>,
    busy_since_ns: Vec<AtomicU64>,
    busy_ns: Vec<AtomicU64>,
    window: Mutex<Window>,
    /// `Load as u8`.
    load: AtomicU8,
    /// Windows fitted, and of them those that ended queueing (saturated too) and saturated.
    windows: AtomicU64,
    windows_queueing: AtomicU64,
    windows_saturated: AtomicU64,
    /// The last fitted window's slope (ns per request ahead) and its busiest member's busy share (per mille).
    last_slope_ns: AtomicU64,
    last_busy_permille: AtomicU64,
}

/// What `MemberQueues::report` tells `paraid status`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct QueuesReport {
    pub load: Load,
    pub windows: u64,
    pub windows_queueing: u64,
    pub windows_saturated: u64,
    pub last_slope_ns: u64,
    pub last_busy_permille: u64,
}

fn measured(req: &IoReq<'_>) -> bool {
    matches!(req.op, IoOp::Read { .. } | IoOp::Write { .. })
}

impl MemberQueues {
    pub(crate) fn new(members: usize) -> MemberQueues {
        let counters = || (0..members).map(|_| AtomicU64::new(0)).collect();
        MemberQueues {
            epoch: Instant::now(),
            in_flight: counters(),
            busy_since_ns: counters(),
            busy_ns: counters(),
            window: Mutex::new(Window {
                sums: Sums::default(),
                began_ns: 0,
                last_end_ns: 0,
                probe: Probe::default(),
            }),
            load: AtomicU8::new(Load::Free as u8),
            windows: AtomicU64::new(0),
            windows_queueing: AtomicU64::new(0),
            windows_saturated: AtomicU64::new(0),
            last_slope_ns: AtomicU64::new(0),
            last_busy_permille: AtomicU64::new(0),
        }
    }

    /// Counts `reqs` in flight; None where the batch has no read or write (a flush waits for whatever its member
    /// still had to write: no sample).
    pub(crate) fn begin(&self, reqs: &[IoReq<'_>]) -> Option<Started> {
        self.begin_at(reqs, self.now_ns())
    }

    /// `begin` at `at_ns` (ns since `epoch`): for tests that set the clock.
    fn begin_at(&self, reqs: &[IoReq<'_>], at_ns: u64) -> Option<Started> {
        let mut ahead = None;
        for req in reqs.iter().filter(|r| measured(r)) {
            let Some(count) = self.in_flight.get(req.slot) else {
                continue;
            };
            let before = count.fetch_add(1, Ordering::Relaxed);
            if before == 0 {
                self.busy_since_ns[req.slot].store(at_ns, Ordering::Relaxed);
            }
            ahead = Some(ahead.unwrap_or(0).max(before));
        }
        ahead.map(|ahead| Started { ahead, at_ns })
    }

    fn now_ns(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// The batch `begin` counted is done: no longer in flight, and its time a sample.
    pub(crate) fn end(&self, reqs: &[IoReq<'_>], started: Started) {
        self.end_at(reqs, started, self.now_ns());
    }

    /// `end` at `now_ns` (ns since `epoch`).
    fn end_at(&self, reqs: &[IoReq<'_>], started: Started, now_ns: u64) {
        let took_ns = now_ns.saturating_sub(started.at_ns);
        for req in reqs.iter().filter(|r| measured(r)) {
            if let Some(count) = self.in_flight.get(req.slot) {
                if count.fetch_sub(1, Ordering::Relaxed) == 1 {
                    let since = self.busy_since_ns[req.slot].load(Ordering::Relaxed);
                    self.busy_ns[req.slot]
                        .fetch_add(now_ns.saturating_sub(since), Ordering::Relaxed);
                }
            }
        }
        let Ok(mut window) = self.window.try_lock() else {
            return;
        };
        let paused = started.at_ns.saturating_sub(window.last_end_ns) > IDLE_GAP_NS;
        if paused {
            window.probe = Probe::default();
        }
        if window.sums.n > 0 && paused {
            // After a pause: what came before says nothing about the load now (module doc). The members' busy
            // time so far is dropped with it.
            for slot in 0..self.in_flight.len() {
                self.take_busy_ns(slot, window.began_ns, started.at_ns);
            }
            window.sums = Sums::default();
            window.began_ns = started.at_ns;
        } else if window.sums.n == 0 {
            // A window's time starts with its first batch, not with the quiet before it.
            window.began_ns = window.began_ns.max(started.at_ns);
        }
        window.last_end_ns = now_ns;
        // A second is beyond any batch a fit should weigh (a member timing out); capped so the sums cannot wrap.
        window
            .sums
            .add(started.ahead.min(1 << 10), took_ns.min(1_000_000_000));
        if window.sums.n < QUICK_SAMPLES {
            return;
        }
        let before = self.load();
        let window_ns = now_ns.saturating_sub(window.began_ns).max(1);
        let busy_share = |busy_ns: u64| (busy_ns as f64 / window_ns as f64).min(1.0);
        let line = window.sums.line();
        if window.sums.n < WINDOW_SAMPLES {
            let busiest_ns = (0..self.in_flight.len())
                .map(|slot| self.peek_busy_ns(slot, window.began_ns, now_ns))
                .max()
                .unwrap_or(0);
            if next_load(before, line, busy_share(busiest_ns)) <= before {
                return;
            }
        }
        let busiest_ns = (0..self.in_flight.len())
            .map(|slot| self.take_busy_ns(slot, window.began_ns, now_ns))
            .max()
            .unwrap_or(0);
        let busiest_busy = busy_share(busiest_ns);
        let now = window.probe.settle(
            before,
            line.is_some(),
            next_load(before, line, busiest_busy),
        );
        log::trace!(
            "members: window of {} batches over {} us: {line:?}, mean requests ahead {:.2}, mean batch {} us, \
             busiest member busy {:.0} %: {now:?}",
            window.sums.n,
            window_ns / 1000,
            window.sums.x as f64 / window.sums.n as f64,
            window.sums.y / window.sums.n / 1000,
            busiest_busy * 100.0
        );
        if let Some(line) = line {
            self.last_slope_ns
                .store(line.slope_ns.max(0.0) as u64, Ordering::Relaxed);
        }
        self.last_busy_permille
            .store((busiest_busy * 1000.0) as u64, Ordering::Relaxed);
        *window = Window {
            sums: Sums::default(),
            began_ns: now_ns,
            last_end_ns: now_ns,
            probe: window.probe,
        };
        drop(window);
        self.windows.fetch_add(1, Ordering::Relaxed);
        if now >= Load::Queueing {
            self.windows_queueing.fetch_add(1, Ordering::Relaxed);
        }
        if now == Load::Saturated {
            self.windows_saturated.fetch_add(1, Ordering::Relaxed);
        }
        if now != before {
            self.load.store(now as u8, Ordering::Relaxed);
            log::debug!(
                "members: {now:?} (were {before:?}; {} ns per request ahead, busiest member busy {:.0} %)",
                self.last_slope_ns.load(Ordering::Relaxed),
                busiest_busy * 100.0
            );
        }
    }

    /// A member's time with a request in flight in the window that ends at `now_ns`, taken (the next window
    /// starts from nothing): the periods that ended, and the one still open as far as it lies in the window
    /// (which the next window then counts from `now_ns`). Counters another thread moves meanwhile cost a sample's
    /// worth of accuracy, not correctness.
    fn take_busy_ns(&self, slot: usize, began_ns: u64, now_ns: u64) -> u64 {
        let mut busy = self.busy_ns[slot].swap(0, Ordering::Relaxed);
        if self.in_flight[slot].load(Ordering::Relaxed) > 0 {
            let since = self.busy_since_ns[slot].swap(now_ns, Ordering::Relaxed);
            busy += now_ns.saturating_sub(since.max(began_ns));
        }
        busy
    }

    /// What `take_busy_ns` would take now, left in place (for a window that may end early).
    fn peek_busy_ns(&self, slot: usize, began_ns: u64, now_ns: u64) -> u64 {
        let mut busy = self.busy_ns[slot].load(Ordering::Relaxed);
        if self.in_flight[slot].load(Ordering::Relaxed) > 0 {
            let since = self.busy_since_ns[slot].load(Ordering::Relaxed);
            busy += now_ns.saturating_sub(since.max(began_ns));
        }
        busy
    }

    /// What the members' queues say now (module doc).
    pub(crate) fn load(&self) -> Load {
        match self.load.load(Ordering::Relaxed) {
            2 => Load::Saturated,
            1 => Load::Queueing,
            _ => Load::Free,
        }
    }

    pub(crate) fn report(&self) -> QueuesReport {
        QueuesReport {
            load: self.load(),
            windows: self.windows.load(Ordering::Relaxed),
            windows_queueing: self.windows_queueing.load(Ordering::Relaxed),
            windows_saturated: self.windows_saturated.load(Ordering::Relaxed),
            last_slope_ns: self.last_slope_ns.load(Ordering::Relaxed),
            last_busy_permille: self.last_busy_permille.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(samples: impl IntoIterator<Item = (u64, u64)>) -> Sums {
        let mut sums = Sums::default();
        for (ahead, took_ns) in samples {
            sums.add(ahead, took_ns);
        }
        sums
    }

    fn ratio(sums: &Sums) -> f64 {
        sums.line().expect("x varies").slope_per_intercept()
    }

    /// A member serving one request at a time, `service_ns` each: a batch with `ahead` requests before it takes
    /// (ahead + 1) service times.
    fn serial(service_ns: u64) -> Sums {
        window((0..WINDOW_SAMPLES).map(|i| {
            let ahead = i % 8;
            (ahead, (ahead + 1) * service_ns + (i * 7919) % 50_000)
        }))
    }

    /// Members serving requests side by side: about `latency_ns` whatever is ahead.
    fn parallel(latency_ns: u64) -> Sums {
        window((0..WINDOW_SAMPLES).map(|i| (i % 8, latency_ns + (i * 7919) % 20_000)))
    }

    #[test]
    fn members_that_serve_one_request_after_another_queue() {
        let sums = serial(200_000);
        let line = sums.line().expect("x varies");
        assert!((0.8..1.2).contains(&line.slope_per_intercept()), "{line:?}");
        assert!((190_000.0..210_000.0).contains(&line.slope_ns), "{line:?}");
        // The busiest member busy a fifth of the window: time to spare.
        for before in [Load::Free, Load::Queueing, Load::Saturated] {
            assert_eq!(
                next_load(before, sums.line(), 0.2),
                Load::Queueing,
                "{before:?}"
            );
        }
    }

    #[test]
    fn queueing_members_without_time_to_spare_are_saturated() {
        let sums = serial(200_000);
        assert_eq!(next_load(Load::Free, sums.line(), 0.96), Load::Saturated);
        // 78 % busy: saturated stays, queueing does not become it.
        assert_eq!(
            next_load(Load::Saturated, sums.line(), 0.78),
            Load::Saturated
        );
        assert_eq!(next_load(Load::Queueing, sums.line(), 0.78), Load::Queueing);
        // 40 %: no longer.
        assert_eq!(next_load(Load::Saturated, sums.line(), 0.4), Load::Queueing);
    }

    #[test]
    fn members_that_serve_side_by_side_do_not_queue_however_busy() {
        let sums = parallel(100_000);
        assert!(ratio(&sums) < 0.05, "ratio {}", ratio(&sums));
        for before in [Load::Free, Load::Queueing, Load::Saturated] {
            assert_eq!(
                next_load(before, sums.line(), 1.0),
                Load::Free,
                "{before:?}"
            );
        }
    }

    #[test]
    fn a_window_with_nothing_ahead_keeps_the_load() {
        let idle = window((0..WINDOW_SAMPLES).map(|i| (0, 50_000 + i * 100)));
        assert_eq!(idle.line(), None);
        for before in [Load::Free, Load::Queueing, Load::Saturated] {
            assert_eq!(next_load(before, idle.line(), 1.0), before);
            assert_eq!(next_load(before, idle.line(), SATURATED_OFF), before);
        }
        assert_eq!(Sums::default().line(), None);
    }

    #[test]
    fn a_window_with_nothing_ahead_ends_a_saturation_its_members_have_time_for() {
        let idle = window((0..WINDOW_SAMPLES).map(|i| (0, 50_000 + i * 100)));
        assert_eq!(
            next_load(Load::Saturated, idle.line(), 0.36),
            Load::Queueing
        );
        // Nor does it say the members serve side by side, or queue where they did not.
        assert_eq!(next_load(Load::Queueing, idle.line(), 0.36), Load::Queueing);
        assert_eq!(next_load(Load::Free, idle.line(), 0.36), Load::Free);
        assert_eq!(next_load(Load::Free, idle.line(), 0.99), Load::Free);
    }

    #[test]
    fn between_the_thresholds_the_state_holds() {
        // y = 100 µs + 35 µs per request ahead: a ratio of 0.35, between OFF_RATIO and ON_RATIO.
        let mid = window((0..WINDOW_SAMPLES).map(|i| (i % 6, 100_000 + (i % 6) * 35_000)));
        assert!((ratio(&mid) - 0.35).abs() < 1e-9, "ratio {}", ratio(&mid));
        assert_eq!(next_load(Load::Queueing, mid.line(), 0.0), Load::Queueing);
        assert_eq!(next_load(Load::Free, mid.line(), 0.0), Load::Free);
        // A ratio of 0.2 (seen in single windows of members held to a rate, at their rate) keeps them queueing.
        let low = window((0..WINDOW_SAMPLES).map(|i| (i % 6, 100_000 + (i % 6) * 20_000)));
        assert_eq!(next_load(Load::Saturated, low.line(), 1.0), Load::Saturated);
        assert_eq!(next_load(Load::Queueing, low.line(), 0.0), Load::Queueing);
    }

    #[test]
    fn a_line_through_zero_or_below_is_queueing_alone() {
        let steep = window((0..WINDOW_SAMPLES).map(|i| (i % 4, (i % 4) * 10_000)));
        assert_eq!(ratio(&steep), f64::INFINITY);
        let falling = window((0..WINDOW_SAMPLES).map(|i| (i % 4, 90_000 - (i % 4) * 10_000)));
        assert_eq!(ratio(&falling), 0.0);
    }

    #[test]
    fn batches_count_in_flight_per_member_and_fit_each_window() {
        let queues = MemberQueues::new(3);
        let buf = [0u8; 4096];
        let mut out = [0u8; 4096];
        // Requests held in flight on member 1 are ahead of the next batch there; member 2 has none.
        let held = [
            IoReq::write(1, 0, &buf, false),
            IoReq::write(1, 4096, &buf, false),
        ];
        let held_started = queues.begin(&held).expect("writes");
        assert_eq!(
            held_started.ahead, 1,
            "the second request of a batch finds its first ahead"
        );
        let reqs = [IoReq::read(1, 0, &mut out), IoReq::write(2, 0, &buf, false)];
        let started = queues.begin(&reqs).expect("a read and a write");
        assert_eq!(started.ahead, 2);
        queues.end(&reqs, started);
        queues.end(&held, held_started);
        assert!(queues
            .in_flight
            .iter()
            .all(|c| c.load(Ordering::Relaxed) == 0));
        // A flush alone is no sample.
        assert!(queues.begin(&[IoReq::flush(0)]).is_none());
        assert_eq!(queues.window.lock().unwrap().sums.n, 2);
        // The window filled with batches finding nothing ahead: fitted, and says nothing.
        for _ in 2..WINDOW_SAMPLES {
            let reqs = [IoReq::write(0, 0, &buf, false)];
            let started = queues.begin(&reqs).expect("a write");
            queues.end(&reqs, started);
        }
        let report = queues.report();
        assert_eq!((report.windows, report.windows_queueing), (1, 0));
        assert_eq!(queues.load(), Load::Free);
        assert!(
            queues
                .busy_ns
                .iter()
                .all(|c| c.load(Ordering::Relaxed) == 0),
            "the window's busy time taken"
        );
        // Member 0 had batches in flight for part of the window.
        assert!(queues.report().last_busy_permille > 0);
    }

    /// Batches of one write each on member 0 (`held` requests kept in flight on it), driven by a clock the test
    /// sets: `serial` batches take (ahead + 1) ms back to back, so the member is busy all the time.
    struct Driver {
        queues: MemberQueues,
        now_ns: u64,
    }

    const MS: u64 = 1_000_000;

    impl Driver {
        fn new() -> Driver {
            Driver {
                queues: MemberQueues::new(2),
                now_ns: 1_000 * MS,
            }
        }

        /// A batch on member 0 finding `ahead` requests there (held in flight meanwhile, no samples of their
        /// own) and taking `took_ns`; the clock moves to its end.
        fn batch(&mut self, ahead: u64, took_ns: u64) {
            let queues = &self.queues;
            if ahead > 0 && queues.in_flight[0].fetch_add(ahead, Ordering::Relaxed) == 0 {
                queues.busy_since_ns[0].store(self.now_ns, Ordering::Relaxed);
            }
            let buf = [0u8; 4096];
            let reqs = [IoReq::write(0, 0, &buf, false)];
            let started = queues.begin_at(&reqs, self.now_ns).expect("a write");
            assert_eq!(started.ahead, ahead);
            self.now_ns += took_ns;
            if ahead > 0 {
                queues.in_flight[0].fetch_sub(ahead, Ordering::Relaxed);
            }
            queues.end_at(&reqs, started, self.now_ns);
        }

        fn serial(&mut self, samples: u64) {
            for i in 0..samples {
                let ahead = i % 8;
                self.batch(ahead, (ahead + 1) * MS);
            }
        }

        fn windows(&self) -> u64 {
            self.queues.report().windows
        }

        fn sums_n(&self) -> u64 {
            self.queues.window.lock().unwrap().sums.n
        }
    }

    #[test]
    fn members_found_busy_and_queueing_end_a_window_early() {
        let mut driver = Driver::new();
        driver.serial(QUICK_SAMPLES - 1);
        assert_eq!(driver.windows(), 0);
        assert_eq!(driver.queues.load(), Load::Free);
        driver.serial(1);
        assert_eq!(driver.windows(), 1, "ended at {QUICK_SAMPLES} samples");
        assert_eq!(driver.queues.load(), Load::Saturated);
        // Saturated already: the next window takes all its samples.
        driver.serial(QUICK_SAMPLES);
        assert_eq!(driver.windows(), 1);
        assert_eq!(driver.sums_n(), QUICK_SAMPLES);
        driver.serial(WINDOW_SAMPLES - QUICK_SAMPLES);
        assert_eq!(driver.windows(), 2);
        assert_eq!(driver.queues.load(), Load::Saturated);
    }

    #[test]
    fn a_window_that_would_allow_more_early_answers_takes_all_its_samples() {
        let mut driver = Driver::new();
        driver.serial(QUICK_SAMPLES);
        assert_eq!(driver.queues.load(), Load::Saturated);
        // Now the member serves side by side: 1 ms whatever is ahead.
        for i in 0..WINDOW_SAMPLES - 1 {
            driver.batch(i % 8, MS);
        }
        assert_eq!(
            driver.queues.load(),
            Load::Saturated,
            "not before the window is full"
        );
        driver.batch(0, MS);
        assert_eq!(driver.queues.load(), Load::Free);
    }

    #[test]
    fn a_lone_writer_after_a_saturating_load_leaves_saturation_where_the_member_has_time() {
        let mut driver = Driver::new();
        driver.serial(QUICK_SAMPLES);
        assert_eq!(driver.queues.load(), Load::Saturated);
        // One writer: each batch finds nothing ahead and takes 1 ms, with 2 ms of the writer's own between
        // batches (under the pause that starts a new window): the member is busy a third of the time.
        let lone_window = |driver: &mut Driver, gap_ns: u64| {
            for _ in 0..WINDOW_SAMPLES {
                driver.now_ns += gap_ns;
                driver.batch(0, MS);
            }
        };
        // Busy all the time (no gap): the state holds, as a window with nothing ahead says nothing more.
        lone_window(&mut driver, 0);
        assert_eq!(driver.queues.load(), Load::Saturated);
        lone_window(&mut driver, 2 * MS);
        assert_eq!(driver.queues.load(), Load::Queueing);
        let busy = driver.queues.report().last_busy_permille;
        assert!((300..=340).contains(&busy), "busy {busy} per mille");
    }

    #[test]
    fn a_saturation_left_without_a_line_and_found_again_backs_off() {
        let mut probe = Probe::default();
        let (with_line, without) = (true, false);
        // Left on a window without a line: a guess, open.
        assert_eq!(
            probe.settle(Load::Saturated, without, Load::Queueing),
            Load::Queueing
        );
        assert!(probe.open);
        // The next window with a line finds the members saturated: wrong, four windows without a line wait.
        assert_eq!(
            probe.settle(Load::Queueing, with_line, Load::Saturated),
            Load::Saturated
        );
        assert_eq!(
            (probe.open, probe.backoff, probe.backoff_left),
            (false, 4, 4)
        );
        for _ in 0..4 {
            assert_eq!(
                probe.settle(Load::Saturated, without, Load::Queueing),
                Load::Saturated
            );
        }
        // Windows without a line that would keep it anyway take no backoff.
        assert_eq!(
            probe.settle(Load::Queueing, without, Load::Queueing),
            Load::Queueing
        );
        assert_eq!(
            probe.settle(Load::Saturated, without, Load::Queueing),
            Load::Queueing
        );
        // Wrong again: eight; then sixteen, ... up to the most.
        probe.settle(Load::Queueing, with_line, Load::Saturated);
        assert_eq!(probe.backoff_left, 8);
        for _ in 0..10 {
            probe.backoff_left = 0;
            probe.settle(Load::Saturated, without, Load::Queueing);
            probe.settle(Load::Queueing, with_line, Load::Saturated);
        }
        assert_eq!(probe.backoff, PROBE_BACKOFF_MAX_WINDOWS);
        // A good guess (the members keep out of saturation) clears it: the next wrong one starts from four.
        probe.backoff_left = 0;
        probe.settle(Load::Saturated, without, Load::Queueing);
        assert_eq!(
            probe.settle(Load::Queueing, with_line, Load::Queueing),
            Load::Queueing
        );
        assert_eq!((probe.open, probe.backoff), (false, 0));
        probe.settle(Load::Saturated, without, Load::Queueing);
        probe.settle(Load::Queueing, with_line, Load::Saturated);
        assert_eq!(probe.backoff_left, PROBE_BACKOFF_FIRST_WINDOWS);
        // A saturation entered from a window with a line while no guess is open counts nothing.
        let mut calm = Probe::default();
        calm.settle(Load::Queueing, with_line, Load::Saturated);
        assert_eq!(calm, Probe::default());
    }

    #[test]
    fn a_lone_writer_on_members_held_to_their_rate_returns_to_saturation_less_often() {
        let mut driver = Driver::new();
        driver.serial(QUICK_SAMPLES);
        assert_eq!(driver.queues.load(), Load::Saturated);
        // A lone writer, member busy a third of the time; each time it leaves, the early answers it then gets
        // make the member queue and saturate (a window of `serial` batches).
        let lone_window = |driver: &mut Driver| {
            for _ in 0..WINDOW_SAMPLES {
                driver.now_ns += 2 * MS;
                driver.batch(0, MS);
            }
        };
        let mut left_after = Vec::new();
        for _ in 0..4 {
            let mut windows = 0;
            while driver.queues.load() == Load::Saturated {
                lone_window(&mut driver);
                windows += 1;
            }
            left_after.push(windows);
            // Queueing batches until the member is saturated again, where a window ends.
            let mut i = 0;
            while driver.queues.load() != Load::Saturated {
                driver.batch(i % 8, (i % 8 + 1) * MS);
                i += 1;
            }
            assert_eq!(driver.sums_n(), 0);
        }
        assert_eq!(left_after, [1, 5, 9, 17]);
        // A pause, and the next lone window may leave at once.
        driver.now_ns += IDLE_GAP_NS + MS;
        lone_window(&mut driver);
        assert_eq!(driver.queues.load(), Load::Queueing);
    }

    #[test]
    fn a_pause_starts_a_new_window() {
        let mut driver = Driver::new();
        // Side by side and busy: a window's worth but a few samples, kept.
        for i in 0..WINDOW_SAMPLES - 8 {
            driver.batch(i % 8, MS);
        }
        assert_eq!((driver.windows(), driver.sums_n()), (0, WINDOW_SAMPLES - 8));
        // A pause, then lone batches that find the member idle: a new window of one sample, which the
        // samples before the pause do not fill up.
        driver.now_ns += IDLE_GAP_NS + MS;
        driver.batch(0, MS);
        assert_eq!(driver.sums_n(), 1);
        for _ in 0..8 {
            driver.batch(0, MS);
        }
        assert_eq!((driver.windows(), driver.sums_n()), (0, 9));
        // A pause shorter than that keeps the window.
        driver.now_ns += IDLE_GAP_NS / 2;
        driver.batch(0, MS);
        assert_eq!(driver.sums_n(), 10);
    }

    #[test]
    fn the_busy_share_of_a_window_after_a_pause_leaves_the_pause_out() {
        let mut driver = Driver::new();
        driver.serial(QUICK_SAMPLES);
        assert_eq!(driver.queues.load(), Load::Saturated);
        // Part of a window, a pause of two seconds, then the same load: had the window counted the pause (and
        // the samples before it), the member would be busy well under SATURATED_OFF of it (a window of samples
        // takes about 1.2 s) and no longer saturated.
        driver.serial(100);
        driver.now_ns += 2_000 * MS;
        driver.serial(WINDOW_SAMPLES);
        assert_eq!(driver.windows(), 2);
        assert_eq!(driver.queues.load(), Load::Saturated);
        assert!(driver.queues.report().last_busy_permille >= 950);
    }
}
