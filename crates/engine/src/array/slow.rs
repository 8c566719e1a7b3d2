//! Slow members (fault matrix row 11): each member's recent I/O latency, and reads served around a member far
//! slower than its peers.
//!
//! Why: a drive that retries internally before it fails, collects garbage, or shares a bus with another load can
//! take tens of milliseconds per I/O while its peers take a fraction of one. A read that waits for it waits for
//! the slowest drive of the array, and a database's tail latency is that drive's. With a mirror or parity the
//! same bytes can be had from the other members. Writes cannot go around it (the member must stay in sync), so
//! they keep measuring it; nothing here ever fails or evicts a member (slowness is not an error: row 11, "no
//! false failure").
//!
//! How: every read and write a data slot completes (its backend's `IoReq::latency_ns`) moves that slot's average
//! latency 1/16 of the way to the sample (an exponentially weighted mean: it follows a change within a few dozen
//! I/Os). Every `REVIEW_EVERY` samples the averages of the active members are compared: the slowest becomes *the
//! slow member* when its average is at least `ENTER_FLOOR_NS` and `ENTER_RATIO` times the median of the others',
//! and stays it until it falls below `LEAVE_FLOOR_NS` or `LEAVE_RATIO` times that median (hysteresis, so that it
//! does not flap). One member at most: steering around two would leave RAID6 no redundancy to check the read
//! with, and when several members are slow the load is, not a member.
//!
//! Which reads (read.rs): a piece on the slow member is read from another copy (RAID1/10), or solved from the
//! rest of its stripe (RAID6) and accepted only if the whole stripe, the solved chunk included, checks out
//! against both P and Q (any one bad chunk among those read shows there; the read then goes to the slow member
//! after all). RAID5 reads are not steered: one parity cannot check itself, and a chunk solved from a parity
//! chunk that rotted would be returned where a direct read returns the right bytes. Stripes that await a resync
//! (their parity may not match their data) are not steered either.
//!
//! Probes: so that the slow member's average keeps following it when nothing writes (it leaves the slow state
//! within a few seconds of recovering), a thread of its own (`paraid-prober`) reads one page of it every
//! `PROBE_INTERVAL_NS` while it is slow and the level steers reads; every client read that can be steered is. No client read waits for the
//! slow member to measure it. Before stop 59 one steered read in 16 went to it instead: a database reading 100k
//! pages a second sent 6 % of its reads to the slow drive, far more than the 1 % its p99 can hide. Where that
//! thread does not run (it could not be started, or the simulator, whose seeds must replay exactly and whose
//! clock is not read: `set_slow_probe_interval(ZERO)`), a steered read probes instead, once at least
//! `PROBE_EVERY` steered reads (and, with the clock, `PROBE_INTERVAL_NS`) have passed since the last probe.
//!
//! Re-entry hold: a member that becomes slow again soon after it left (within `REENTRY_WINDOW_NS`) stays slow
//! at least `HOLD_MIN_NS`, then twice as long on each such return, up to `HOLD_MAX_NS`, whatever its average
//! says meanwhile (another member found slower may still take its place). Why: a device held to a request rate (a cloud volume's IOPS cap, a throttled cgroup, QEMU's
//! `iops-total`) answers a probe at once when it is idle, so probes alone pull its average below the line within
//! a few seconds; it then gets its full share of reads again, its queue grows past its rate, and it is found
//! slow again. Every such return costs the reads queued on it hundreds of milliseconds (the VM's slow-member run
//! at stop 59: ten returns in 40 s, p99.9 156 ms). A drive that is slow now and then (garbage collection) is
//! held the same way. Without the clock (the simulator), there is no hold.
//!
//! Gradual return: a member that leaves the slow state does not get its whole share of reads back at once. For
//! `RETURN_STAGE_NS` it gets one in 16 of the reads the level could serve around it, then one in 8, 4 and 2, then
//! all (`return_share`); the rest are served around it as while it was slow (read.rs). Why: a rate-capped device
//! that probes found quick again took its whole share at once, queued it past its rate within a second, and every
//! read queued there waited hundreds of milliseconds before a review found it slow again (the VM's slow-member
//! run at stop 59: four returns in 50 s made the QD16 p99.95 72-75 ms). A drive that did recover takes its share
//! back within `4 * RETURN_STAGE_NS`. While it returns, one read of it as slow as a slow member's average
//! (`relapsed`: `ENTER_FLOOR_NS` and `ENTER_RATIO` times the others' median) makes it slow again at once (held,
//! as a return is), not once a few more reads queued behind it have moved its average (the VM's QD16 p99.95 went
//! from 19-20 ms to 15-16 ms, its maximum from 56-67 to 25-38 ms). One member at most is slow or returning: a
//! member found slow ends another's return. Without the clock (the simulator) a member returns at once, as
//! before.
//!
//! Writes (write/plan.rs, `plan_stripe`): a small RAID5/6 write updates parity either from the old data and parity it
//! overwrites (read-modify-write) or from the rest of the stripe (reconstruct-write); the two read disjoint chunks,
//! so the one that reads nothing from the slow member is taken, and a commit stream's log entry does not reach
//! ahead over a stripe whose chunk or parity the slow member holds (ppl/streams.rs). What still reads it: a stripe
//! the partial parity log needs read whole (chunks written since the last flush).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::background::Background;
use super::{Array, ArrayCore};
use crate::buf::AlignedBuf;
use crate::layout::{Level, PAGE_BYTES};
use crate::member::{IoOp, IoReq};

/// Each sample moves a slot's average 1/2^WEIGHT_SHIFT of the way.
const WEIGHT_SHIFT: u32 = 4;
/// Samples between two comparisons of the averages.
const REVIEW_EVERY: u64 = 64;
/// A member becomes the slow one at this average latency and this many times the median of the others'.
const ENTER_FLOOR_NS: u64 = 1_000_000;
const ENTER_RATIO: u64 = 8;
/// It stops being the slow one below either of these.
const LEAVE_FLOOR_NS: u64 = 500_000;
const LEAVE_RATIO: u64 = 4;
/// Where no prober runs, a probe (a read that would be steered, sent to the slow member anyway) comes after at
/// least this many steered reads (and, with the clock, `PROBE_INTERVAL_NS` after the previous probe).
const PROBE_EVERY: u64 = 16;
/// The prober's period: one page of the slow member read this often.
const PROBE_INTERVAL_NS: u64 = 100_000_000;
/// A member found slow again within this long after it left is held slow (module doc, "Re-entry hold")...
const REENTRY_WINDOW_NS: u64 = 60_000_000_000;
/// ... at least this long the first time, twice as long each time after, at most `HOLD_MAX_NS`.
const HOLD_MIN_NS: u64 = 4_000_000_000;
const HOLD_MAX_NS: u64 = 64_000_000_000;
/// How long a returning member keeps each share of its reads (module doc, "Gradual return"): 1/16, 1/8, 1/4, 1/2.
const RETURN_STAGE_NS: u64 = 1_000_000_000;
const RETURN_STAGES: u64 = 4;
const NONE: usize = usize::MAX;

/// Whether one I/O of a member returning from the slow state, `latency_ns` long, is as slow as the average that
/// makes a member slow (`ENTER_FLOOR_NS`, `ENTER_RATIO` times the others' median `peers_ns`): it is slow again at
/// once, not once its average shows it (module doc, "Gradual return"). `peers_ns` is set whenever a member
/// begins to return (members in memory measure 0: the floor decides there, as in `review`).
fn relapsed(latency_ns: u64, peers_ns: u64) -> bool {
    latency_ns >= ENTER_FLOOR_NS && latency_ns >= ENTER_RATIO.saturating_mul(peers_ns)
}

/// The share of its readable pieces a member that left the slow state `since_ns` ago gets, as the divisor of
/// one in N (16, 8, 4, 2); None once it has them all back (module doc, "Gradual return").
fn return_share(since_ns: u64) -> Option<u64> {
    let stage = since_ns / RETURN_STAGE_NS;
    (stage < RETURN_STAGES).then(|| 1 << (RETURN_STAGES - stage))
}

/// The array-wide part; each slot's average lives in its `SlotRuntime::latency_ns`.
pub(crate) struct SlowMember {
    /// The slow member's slot, or `NONE`.
    slot: AtomicUsize,
    /// Samples taken (a review every `REVIEW_EVERY`).
    samples: AtomicU64,
    /// When reads that would be steered go to the slow member anyway.
    probes: Probes,
    /// Pieces read around the slow member since assembly.
    steered_reads: AtomicU64,
    /// Re-entries and how long the slow member is held (taken only when a review would change the slow member).
    hold: Mutex<Hold>,
    /// The prober thread (module doc, "Probes"), and whether it runs.
    prober: Background,
    prober_running: AtomicBool,
    /// Probe reads the prober made, which picks the row of each from it.
    probe_reads: AtomicU64,
    /// The member returning from the slow state (`NONE`: none), since when (nanoseconds since `Probes::epoch`),
    /// and the reads of it asked about since (module doc, "Gradual return").
    returning_slot: AtomicUsize,
    returning_since_ns: AtomicU64,
    returning_reads: AtomicU64,
    /// The others' median average when it began to return (updated at each review while it returns).
    returning_peers_ns: AtomicU64,
}

/// The re-entry hold's state (module doc, "Re-entry hold"); times in nanoseconds since `Probes::epoch`.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct Hold {
    /// The slow member stays slow until then, whatever its average.
    until_ns: u64,
    /// Each member that was slow: `(slot, when it last left the slow state (u64::MAX while it is slow), the hold
    /// it was given last)`.
    left: Vec<(usize, u64, u64)>,
    /// Times a member became slow again within the window (status).
    returns: u64,
}

impl Hold {
    /// `slot` becomes the slow member at `now_ns`: held if it left not long ago.
    fn enter(&mut self, slot: usize, now_ns: u64) {
        let before = self.left.iter().find(|(left, ..)| *left == slot);
        let hold_ns = match before {
            Some(&(_, at, hold_ns)) if at <= now_ns && now_ns - at < REENTRY_WINDOW_NS => {
                self.returns += 1;
                (hold_ns * 2).clamp(HOLD_MIN_NS, HOLD_MAX_NS)
            }
            _ => 0,
        };
        self.left.retain(|(left, ..)| *left != slot);
        self.left.push((slot, u64::MAX, hold_ns));
        self.until_ns = now_ns + hold_ns;
    }

    /// Whether the slow member is held slow at `now_ns`.
    fn holds(&self, now_ns: u64) -> bool {
        now_ns < self.until_ns
    }

    /// `slot` leaves the slow state at `now_ns`.
    fn leave(&mut self, slot: usize, now_ns: u64) {
        match self.left.iter_mut().find(|(left, ..)| *left == slot) {
            Some(entry) => entry.1 = now_ns,
            None => self.left.push((slot, now_ns, 0)),
        }
    }

    /// Whether the slow member may change from `current` to `next` at `now_ns` (a review's verdict), and if so
    /// notes the change. The hold keeps reads off a member that keeps coming back slow; it does not stop another
    /// member that is now slower from taking its place, nor keep one that left the array.
    fn change(
        &mut self,
        current: Option<usize>,
        next: Option<usize>,
        current_active: bool,
        now_ns: u64,
    ) -> bool {
        if let Some(slot) = current {
            if next.is_none() && current_active && self.holds(now_ns) {
                return false;
            }
            self.leave(slot, now_ns);
        }
        if let Some(slot) = next {
            self.enter(slot, now_ns);
        }
        true
    }
}

/// What `ArrayDetail` reports of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct SlowMemberStats {
    /// The member reads are served around now, if any.
    pub slow_slot: Option<usize>,
    /// Pieces read around a slow member since assembly (from another copy, or solved and checked).
    pub steered_reads: u64,
    /// Reads of the slow member made only to keep measuring it (module doc, "Probes"): the prober's, or steered
    /// reads sent to it anyway where the prober does not run.
    pub probes: u64,
    /// Times a member was found slow again soon after it left the slow state, and held slow (module doc,
    /// "Re-entry hold").
    pub returns: u64,
    /// The member that left the slow state and gets its reads back gradually now, if any (module doc, "Gradual
    /// return").
    pub returning_slot: Option<usize>,
}

impl SlowMember {
    pub(crate) fn new() -> SlowMember {
        SlowMember {
            slot: AtomicUsize::new(NONE),
            samples: AtomicU64::new(0),
            probes: Probes::new(),
            hold: Mutex::new(Hold::default()),
            prober: Background::new(),
            prober_running: AtomicBool::new(false),
            probe_reads: AtomicU64::new(0),
            steered_reads: AtomicU64::new(0),
            returning_slot: AtomicUsize::new(NONE),
            returning_since_ns: AtomicU64::new(0),
            returning_reads: AtomicU64::new(0),
            returning_peers_ns: AtomicU64::new(0),
        }
    }

    /// `slot` left the slow state at `now_ns` (None: without the clock, so at once): it returns gradually.
    /// `peers_ns`: the others' median then, which a relapse is measured against (`relapsed`).
    fn begin_return(&self, slot: usize, now_ns: Option<u64>, peers_ns: u64) {
        let Some(now_ns) = now_ns else {
            return;
        };
        self.returning_peers_ns.store(peers_ns, Ordering::Relaxed);
        self.returning_since_ns.store(now_ns, Ordering::Relaxed);
        self.returning_reads.store(0, Ordering::Relaxed);
        self.returning_slot.store(slot, Ordering::Release);
    }

    fn end_return(&self) {
        self.returning_slot.store(NONE, Ordering::Release);
    }

    /// Whether a read of a piece on `slot` that the level could serve around it should be, `slot` returning from
    /// the slow state at `now_ns` (module doc, "Gradual return"): all but one in `return_share`'s N. The return
    /// ends here once its stages are over.
    fn returning_steers_at(&self, slot: usize, now_ns: u64) -> bool {
        if self.returning_slot.load(Ordering::Acquire) != slot {
            return false;
        }
        let since_ns = now_ns.saturating_sub(self.returning_since_ns.load(Ordering::Relaxed));
        let Some(one_in) = return_share(since_ns) else {
            // Only the return that is over: a new one (another slot, or this one again) stays.
            let _ = self.returning_slot.compare_exchange(
                slot,
                NONE,
                Ordering::AcqRel,
                Ordering::Relaxed,
            );
            return false;
        };
        !self
            .returning_reads
            .fetch_add(1, Ordering::Relaxed)
            .is_multiple_of(one_in)
    }

    /// The member returning from the slow state, if any (reads of it decide one by one: `returning_steers_at`).
    fn returning_slot(&self) -> Option<usize> {
        Some(self.returning_slot.load(Ordering::Acquire)).filter(|&s| s != NONE)
    }

    pub(crate) fn slot(&self) -> Option<usize> {
        Some(self.slot.load(Ordering::Relaxed)).filter(|&s| s != NONE)
    }

    pub(crate) fn stats(&self) -> SlowMemberStats {
        SlowMemberStats {
            slow_slot: self.slot(),
            steered_reads: self.steered_reads.load(Ordering::Relaxed),
            probes: self.probes.taken.load(Ordering::Relaxed),
            returns: lock(&self.hold).returns,
            returning_slot: self.returning_slot(),
        }
    }
}

/// Which steered reads probe the slow member: one after at least `PROBE_EVERY` steered reads and
/// `PROBE_INTERVAL_NS` since the previous probe (module doc, "Probes").
struct Probes {
    epoch: Instant,
    /// Reads that would have been steered since the last probe.
    steered_since: AtomicU64,
    /// When the last probe went, in nanoseconds since `epoch` (0: none yet, so the first waits an interval too).
    last_ns: AtomicU64,
    /// Probes since assembly.
    taken: AtomicU64,
    /// `PROBE_INTERVAL_NS` unless set otherwise (`Array::set_slow_probe_interval`); 0: by count alone, without
    /// reading the clock, as the simulator needs to replay a seed exactly.
    interval_ns: AtomicU64,
}

impl Probes {
    fn new() -> Probes {
        Probes {
            epoch: Instant::now(),
            steered_since: AtomicU64::new(0),
            last_ns: AtomicU64::new(0),
            taken: AtomicU64::new(0),
            interval_ns: AtomicU64::new(PROBE_INTERVAL_NS),
        }
    }

    /// Whether the read asking now probes.
    fn take(&self) -> bool {
        let interval_ns = self.interval_ns.load(Ordering::Relaxed);
        self.take_at(self.now_ns().unwrap_or(0), interval_ns)
    }

    /// Nanoseconds since the epoch; None without the clock (`interval_ns` 0: the simulator).
    fn now_ns(&self) -> Option<u64> {
        (self.interval_ns.load(Ordering::Relaxed) != 0)
            .then(|| self.epoch.elapsed().as_nanos() as u64)
    }

    /// `take` at `now_ns` since the epoch, probes at least `interval_ns` apart (the clock given, for the tests).
    fn take_at(&self, now_ns: u64, interval_ns: u64) -> bool {
        let since = self.steered_since.fetch_add(1, Ordering::Relaxed) + 1;
        if since < PROBE_EVERY {
            return false;
        }
        if interval_ns == 0 {
            self.steered_since.store(0, Ordering::Relaxed);
            self.taken.fetch_add(1, Ordering::Relaxed);
            return true;
        }
        let last = self.last_ns.load(Ordering::Relaxed);
        if now_ns.saturating_sub(last) < interval_ns {
            return false;
        }
        // Of two readers that find a probe due, one takes it.
        if self
            .last_ns
            .compare_exchange(last, now_ns, Ordering::Relaxed, Ordering::Relaxed)
            .is_err()
        {
            return false;
        }
        self.steered_since.store(0, Ordering::Relaxed);
        self.taken.fetch_add(1, Ordering::Relaxed);
        true
    }
}

fn lock(hold: &Mutex<Hold>) -> MutexGuard<'_, Hold> {
    hold.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The next average: 1/16 of the way from `average` to `sample`.
fn moved(average: u64, sample: u64) -> u64 {
    average - (average >> WEIGHT_SHIFT) + (sample >> WEIGHT_SHIFT)
}

/// The median of the averages of every member but `slot` (at least one other).
fn others_median(averages: &[(usize, u64)], slot: usize) -> u64 {
    let mut values: Vec<u64> = averages
        .iter()
        .filter(|(s, _)| *s != slot)
        .map(|(_, a)| *a)
        .collect();
    values.sort_unstable();
    values[values.len() / 2]
}

/// The slow member after a review of the averages of the active members (`(slot, average ns)`), given the one
/// before it.
fn review(averages: &[(usize, u64)], current: Option<usize>) -> Option<usize> {
    if averages.len() < 2 {
        return None;
    }
    if let Some(slot) = current {
        if let Some(&(_, average)) = averages.iter().find(|(s, _)| *s == slot) {
            let peers = others_median(averages, slot);
            if average >= LEAVE_FLOOR_NS && average >= LEAVE_RATIO.saturating_mul(peers) {
                return Some(slot);
            }
        }
    }
    let &(slot, average) = averages.iter().max_by_key(|(_, a)| *a)?;
    let peers = others_median(averages, slot);
    (average >= ENTER_FLOOR_NS && average >= ENTER_RATIO.saturating_mul(peers)).then_some(slot)
}

impl Array {
    /// Takes the latencies of a submitted batch into the averages of the active data slots (reads and writes
    /// that succeeded: a flush waits for whatever its member still had to write, an error for a timeout), and
    /// reviews them now and then.
    pub(super) fn note_latencies(&self, reqs: &[IoReq<'_>]) {
        let mut taken = 0;
        let returning = self.slow.returning_slot();
        for req in reqs {
            let measured = matches!(req.op, IoOp::Read { .. } | IoOp::Write { .. })
                && req.timed
                && req.result.is_ok()
                && req.slot < self.geometry.members;
            if !measured || !self.is_active(req.slot) {
                continue;
            }
            // A lost update between two threads loses one sample of many: no lock on the data path for it.
            let average = &self.slots[req.slot].latency_ns;
            average.store(
                moved(average.load(Ordering::Relaxed), req.latency_ns),
                Ordering::Relaxed,
            );
            taken += 1;
            // Reads only: a write's latency depends on what it asks (a FUA write on a drive with a volatile cache
            // waits for its flush), and a read is what a slow member makes a client wait for.
            if returning == Some(req.slot) && matches!(req.op, IoOp::Read { .. }) {
                self.note_returning_sample(req.slot, req.latency_ns);
            }
        }
        if taken == 0 {
            return;
        }
        let before = self.slow.samples.fetch_add(taken, Ordering::Relaxed);
        if before / REVIEW_EVERY != (before + taken) / REVIEW_EVERY {
            self.review_slow_member();
        }
    }

    fn review_slow_member(&self) {
        let averages: Vec<(usize, u64)> = (0..self.geometry.members)
            .filter(|&slot| self.is_active(slot))
            .map(|slot| (slot, self.slots[slot].latency_ns.load(Ordering::Relaxed)))
            .collect();
        if let Some(slot) = self.slow.returning_slot() {
            if averages.len() >= 2 && averages.iter().any(|(s, _)| *s == slot) {
                let peers_ns = others_median(&averages, slot);
                self.slow
                    .returning_peers_ns
                    .store(peers_ns, Ordering::Relaxed);
            }
        }
        let current = self.slow.slot();
        let next = review(&averages, current);
        if next == current {
            return;
        }
        // A member that leaves the slow state returns gradually where another member is active: reads can go
        // around it only there, and its relapse is measured against the others' median (a slow member left
        // alone active, RAID1 with its mirror failed, has none: seed 60100647 panicked on the median of none).
        let returns_against = match (current, next) {
            (Some(slot), None) if averages.iter().any(|(s, _)| *s != slot) => {
                Some(others_median(&averages, slot))
            }
            _ => None,
        };
        let peers_ns = next.map(|slot| others_median(&averages, slot));
        self.change_slow_member(current, next, peers_ns, returns_against, None);
    }

    /// A sample of the member returning from the slow state (module doc, "Gradual return"): one as slow as a
    /// slow member's average (`relapsed`) makes it slow again at once.
    fn note_returning_sample(&self, slot: usize, latency_ns: u64) {
        let peers_ns = self.slow.returning_peers_ns.load(Ordering::Relaxed);
        if relapsed(latency_ns, peers_ns) && self.slow.slot().is_none() {
            self.change_slow_member(None, Some(slot), Some(peers_ns), None, Some(latency_ns));
        }
    }

    /// Makes `next` the slow member in place of `current` (a review's verdict, or a relapse), unless the hold
    /// keeps `current` or another change came first; `peers_ns` (the others' median) for the log. A member that
    /// leaves the slow state returns gradually if `returns_against` gives the others' median to measure a
    /// relapse against; `relapse_ns`: the read of a returning member that makes it slow again (for the log).
    fn change_slow_member(
        &self,
        current: Option<usize>,
        next: Option<usize>,
        peers_ns: Option<u64>,
        returns_against: Option<u64>,
        relapse_ns: Option<u64>,
    ) {
        let now_ns = self.slow.probes.now_ns();
        let _hold = match now_ns {
            Some(now_ns) => {
                let mut hold = lock(&self.slow.hold);
                // Another review may have changed the slow member since `current` was read: decide on what is
                // now.
                if self.slow.slot() != current {
                    return;
                }
                let current_active = current.is_some_and(|slot| self.is_active(slot));
                if !hold.change(current, next, current_active, now_ns) {
                    return;
                }
                // Kept while the slow member and its return change together.
                Some(hold)
            }
            None => None,
        };
        // One member at most is slow or returning (module doc, "Gradual return").
        match (current, next) {
            (Some(slot), None) if self.is_active(slot) => match returns_against {
                Some(peers_ns) => self.slow.begin_return(slot, now_ns, peers_ns),
                None => self.slow.end_return(),
            },
            _ => self.slow.end_return(),
        }
        self.slow
            .slot
            .store(next.unwrap_or(NONE), Ordering::Relaxed);
        let ms = |slot: usize| self.slots[slot].latency_ns.load(Ordering::Relaxed) as f64 / 1e6;
        if let Some(slot) = current {
            log::info!(
                "{} (slot {slot}) is no longer slow ({:.2} ms per I/O on average): reads go to it again{}",
                self.io.label(slot),
                ms(slot),
                if self.slow.returning_slot() == Some(slot) {
                    ", a growing share of them over the next seconds"
                } else {
                    ""
                }
            );
        }
        if let Some(slot) = next {
            let peers = peers_ns.unwrap_or(0) as f64 / 1e6;
            if let Some(relapse_ns) = relapse_ns {
                log::warn!(
                    "{} (slot {slot}) is slow again while its reads return to it (a read took {:.2} ms against \
                     {peers:.3} ms on average for the other members): they are served from the other members again",
                    self.io.label(slot),
                    relapse_ns as f64 / 1e6,
                );
            } else {
                log::warn!(
                    "{} (slot {slot}) is slow: {:.2} ms per I/O on average against {peers:.3} ms for the other \
                     members; its reads are served from the other members where the level can check them (it \
                     stays in the array and is written as before)",
                    self.io.label(slot),
                    ms(slot),
                );
            }
        }
    }

    /// Whether a read of a piece on the slow member, which the level could serve around it, goes to it anyway
    /// to keep measuring it (module doc, "Probes"): never while the prober thread measures it. Asked only for such
    /// reads, so that the count toward the next probe is of reads that would be steered.
    pub(super) fn probe_slow_member(&self) -> bool {
        let prober_measures = self.slow.prober_running.load(Ordering::Relaxed)
            && self.slow.probes.interval_ns.load(Ordering::Relaxed) != 0;
        !prober_measures && self.slow.probes.take()
    }

    /// Starts the prober thread (module doc, "Probes"). Without it, steered reads probe instead.
    pub(super) fn start_prober(&self) {
        let core: std::sync::Weak<ArrayCore> = Arc::downgrade(&self.core);
        let spawned = self.slow.prober.start("paraid-prober", move |stop| loop {
            let interval_ns = match core.upgrade() {
                Some(core) => core.slow.probes.interval_ns.load(Ordering::Relaxed),
                None => return,
            };
            let waited_from = Instant::now();
            // Without the clock (0) it only looks now and then whether that changed.
            let wait = Duration::from_nanos(if interval_ns == 0 {
                PROBE_INTERVAL_NS
            } else {
                interval_ns
            });
            if stop.wait(wait) {
                return;
            }
            let Some(core) = core.upgrade() else {
                return;
            };
            let array = Array { core, owner: false };
            // The interval as it is now: one set longer meanwhile is waited out first.
            let interval_ns = array.slow.probes.interval_ns.load(Ordering::Relaxed);
            if interval_ns != 0 && waited_from.elapsed() >= Duration::from_nanos(interval_ns) {
                array.probe_once();
            }
        });
        match spawned {
            Ok(()) => self.slow.prober_running.store(true, Ordering::Relaxed),
            Err(e) => log::warn!(
                "cannot start a thread to measure a slow member ({e}): reads around one will measure it instead"
            ),
        }
    }

    /// Ends the prober thread, if it runs.
    pub(super) fn stop_prober(&self) {
        self.slow.prober_running.store(false, Ordering::Relaxed);
        self.slow.prober.stop("the slow-member prober");
    }

    /// One probe of the slow member, if there is one and it is active: a page of it read (the rows taken in a
    /// stride, so that the probes spread over the member), its latency noted as any read's.
    fn probe_once(&self) {
        // RAID5 and RAID0 read the slow member as before: their reads measure it.
        if !matches!(
            self.geometry.level,
            Level::Raid1 | Level::Raid10 | Level::Raid6
        ) {
            return;
        }
        let Some(slot) = self.slow.slot().filter(|&slot| self.is_active(slot)) else {
            return;
        };
        let n = self.slow.probe_reads.fetch_add(1, Ordering::Relaxed);
        let row = n.wrapping_mul(7919) % self.geometry.rows.max(1);
        let mut page = AlignedBuf::zeroed(PAGE_BYTES as usize);
        let reqs = vec![IoReq::read(slot, self.member_offset(row, 0), &mut page[..])];
        // A failed probe counts as any failed read of the member would (members.rs): nothing more here.
        let _ = self.submit_tolerant(reqs);
        self.slow.probes.taken.fetch_add(1, Ordering::Relaxed);
    }

    /// How far apart the prober's reads of the slow member are (default 100 ms); zero: no prober reads, and the
    /// clock is not read: steered reads probe by count alone (the simulator, whose seeds must replay exactly).
    #[doc(hidden)]
    pub fn set_slow_probe_interval(&self, interval: Duration) {
        self.slow
            .probes
            .interval_ns
            .store(interval.as_nanos() as u64, Ordering::Relaxed);
    }

    /// The slow member, if any: the write path prefers the way of updating parity that reads nothing from it.
    pub(super) fn slow_slot(&self) -> Option<usize> {
        self.slow.slot()
    }

    /// The member returning from the slow state, if any: a read of a piece on it asks `returning_steers` whether
    /// it goes around it (module doc, "Gradual return").
    pub(super) fn returning_slot(&self) -> Option<usize> {
        self.slow.returning_slot()
    }

    /// Whether this read of a piece on `slot`, which the level could serve around it, should be: `slot` is
    /// returning from the slow state and this read is not one of its share.
    pub(super) fn returning_steers(&self, slot: usize) -> bool {
        match self.slow.probes.now_ns() {
            Some(now_ns) => self.slow.returning_steers_at(slot, now_ns),
            None => false,
        }
    }

    pub(super) fn count_steered_read(&self) {
        self.slow.steered_reads.fetch_add(1, Ordering::Relaxed);
    }

    /// A slot's average latency, in nanoseconds (0 before anything was measured).
    pub(super) fn slot_latency_ns(&self, slot: usize) -> u64 {
        self.slots[slot].latency_ns.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn the_average_follows_a_change_within_dozens_of_samples() {
        let mut average = 0;
        for _ in 0..48 {
            average = moved(average, 20 * MS);
        }
        assert!(average > 18 * MS, "{average}");
        for _ in 0..48 {
            average = moved(average, 0);
        }
        assert!(average < 2 * MS, "{average}");
    }

    #[test]
    fn a_member_far_slower_than_the_median_of_the_others_is_slow() {
        let fast = 100_000; // 0.1 ms
        let averages = [(0, fast), (1, fast), (2, 9 * MS), (3, fast + 50_000)];
        assert_eq!(review(&averages, None), Some(2));
        // Slower than the floor but not than its peers: the load is slow, not the member.
        let loaded = [(0, 2 * MS), (1, 3 * MS), (2, 9 * MS), (3, 2 * MS)];
        assert_eq!(review(&loaded, None), None);
        // Many times its peers but quick: nothing a read would gain.
        let quick = [(0, 10_000), (1, 10_000), (2, 900_000), (3, 10_000)];
        assert_eq!(review(&quick, None), None);
        // Members in memory measure nothing: one with injected delays stands out.
        assert_eq!(review(&[(0, 0), (1, 2 * MS), (2, 0)], None), Some(1));
        assert_eq!(review(&[(0, 5 * MS)], None), None, "one member: no peers");
    }

    #[test]
    fn a_probe_needs_both_sixteen_steered_reads_and_a_tenth_of_a_second() {
        let probes = Probes::new();
        let interval = PROBE_INTERVAL_NS;
        // A burst of reads: in the first interval none probes, however many there are.
        assert!((0..1000).all(|i| !probes.take_at(i * 1000, interval)));
        // The first read past the interval probes (16 had come); the next 15 cannot, whatever the time.
        assert!(probes.take_at(interval, interval));
        assert!((1..PROBE_EVERY).all(|i| !probes.take_at(interval * (1 + i), interval)));
        assert!(probes.take_at(interval * (1 + PROBE_EVERY), interval));
        // A fast reader: 100 reads a millisecond for a second probe ten times, not 6,250.
        let probes = Probes::new();
        let start = 10 * interval;
        let taken = (0..100_000u64)
            .filter(|i| probes.take_at(start + i * 10_000, interval))
            .count();
        assert_eq!(taken, 10);
        // By count alone (the simulator): every 16th, the clock not read.
        let probes = Probes::new();
        probes.interval_ns.store(0, Ordering::Relaxed);
        let taken: Vec<u64> = (1..=64).filter(|_| probes.take()).collect();
        assert_eq!(taken.len(), 4);
        assert_eq!(probes.taken.load(Ordering::Relaxed), 4);
    }

    #[test]
    fn a_member_found_slow_again_soon_after_it_left_is_held_longer_each_time() {
        const S: u64 = 1_000_000_000;
        let mut hold = Hold::default();
        // The first time: no hold, it may leave at once.
        hold.enter(2, 10 * S);
        assert!(hold.change(Some(2), None, true, 10 * S));
        // Back within the window: held 4 s, then 8, 16, 32, 64, 64.
        let mut now = 11 * S;
        for expected in [4, 8, 16, 32, 64, 64] {
            hold.enter(2, now);
            assert!(
                !hold.change(Some(2), None, true, now + expected * S - 1),
                "held {expected} s"
            );
            assert!(hold.change(Some(2), None, true, now + expected * S));
            now += expected * S + S;
        }
        assert_eq!(hold.returns, 6);
        // Long after it left, or another member: no hold.
        hold.enter(2, now + REENTRY_WINDOW_NS);
        assert!(hold.change(Some(2), None, true, now + REENTRY_WINDOW_NS));
        hold.enter(3, now + REENTRY_WINDOW_NS + S);
        assert!(hold.change(Some(3), None, true, now + REENTRY_WINDOW_NS + S));
        assert_eq!(hold.returns, 6);
    }

    #[test]
    fn a_held_member_gives_way_to_a_slower_one_and_leaves_when_it_leaves_the_array() {
        const S: u64 = 1_000_000_000;
        let mut hold = Hold::default();
        assert!(hold.change(None, Some(1), true, S));
        assert!(hold.change(Some(1), None, true, 2 * S));
        assert!(hold.change(None, Some(1), true, 3 * S), "back: held 4 s");
        assert!(!hold.change(Some(1), None, true, 4 * S), "held");
        // Another member, slower now, takes its place; member 1 counts as left then.
        assert!(hold.change(Some(1), Some(4), true, 5 * S));
        assert!(
            hold.change(Some(4), None, true, 5 * S),
            "member 4 is not held: it never left before"
        );
        assert!(hold.change(None, Some(1), true, 6 * S));
        assert_eq!(hold.returns, 2, "member 1 came back twice");
        // Held, but failed or removed: no longer slow.
        assert!(!hold.change(Some(1), None, true, 7 * S));
        assert!(hold.change(Some(1), None, false, 7 * S));
    }

    #[test]
    fn a_slow_member_stays_slow_until_well_below_the_line_it_crossed() {
        let fast = 100_000;
        // 6x its peers and above the floor: would not become slow, but stays slow.
        let better = [(0, fast), (1, 600_000), (2, fast)];
        assert_eq!(review(&better, None), None);
        assert_eq!(review(&better, Some(1)), Some(1));
        // Below 4x, or below the leaving floor: no longer.
        assert_eq!(review(&[(0, fast), (1, 350_000), (2, fast)], Some(1)), None);
        assert_eq!(review(&[(0, 0), (1, 400_000), (2, 0)], Some(1)), None);
        // A slow member that left the array (not among the active) is not slow; another may be.
        let others = [(0, fast), (2, 9 * MS), (3, fast)];
        assert_eq!(review(&others, Some(1)), Some(2));
    }

    #[test]
    fn one_io_as_slow_as_a_slow_members_average_is_a_relapse() {
        let peers = 400_000; // 0.4 ms
        assert!(relapsed(8 * peers, peers));
        assert!(!relapsed(8 * peers - 1, peers), "under 8x the peers");
        assert!(
            !relapsed(900_000, 10_000),
            "90x quick peers, but under the 1 ms floor"
        );
        assert!(relapsed(ENTER_FLOOR_NS, 10_000));
        assert!(relapsed(2 * MS, 0), "members in memory: the floor decides");
        assert!(!relapsed(MS - 1, 0));
    }

    #[test]
    fn a_returning_member_gets_a_share_of_its_reads_that_doubles_each_stage() {
        const S: u64 = RETURN_STAGE_NS;
        assert_eq!(return_share(0), Some(16));
        assert_eq!(return_share(S - 1), Some(16));
        assert_eq!(return_share(S), Some(8));
        assert_eq!(return_share(2 * S), Some(4));
        assert_eq!(return_share(3 * S + S / 2), Some(2));
        assert_eq!(return_share(4 * S), None, "all its reads back");
        let slow = SlowMember::new();
        assert_eq!(slow.returning_slot(), None);
        slow.begin_return(2, None, 0);
        assert_eq!(slow.returning_slot(), None, "no clock: back at once");
        slow.begin_return(2, Some(10 * S), 0);
        assert_eq!(slow.returning_slot(), Some(2));
        let to_it = |at_ns: u64, reads: usize| {
            (0..reads)
                .filter(|_| !slow.returning_steers_at(2, at_ns))
                .count()
        };
        assert_eq!(to_it(10 * S, 64), 4, "one in 16 in the first stage");
        assert_eq!(to_it(11 * S, 64), 8, "one in 8 in the second");
        assert_eq!(to_it(13 * S, 64), 32, "one in 2 in the last");
        assert!(
            !slow.returning_steers_at(3, 13 * S),
            "another member's reads are not steered"
        );
        assert_eq!(
            to_it(14 * S, 64),
            64,
            "all of them once the stages are over"
        );
        assert_eq!(slow.returning_slot(), None, "the return is over");
        // A member found slow ends a return (review_slow_member): what `end_return` does.
        slow.begin_return(1, Some(20 * S), 0);
        slow.end_return();
        assert!(!slow.returning_steers_at(1, 20 * S));
    }
}
