//! Fault injection for member I/O: `FaultyMembers` wraps any `MemberIo` and, following stackable rules, fails
//! I/Os, flips bits, misdirects and delays them; `CrashMembers` models a volatile write cache and power loss;
//! `RateMembers` holds members to a request rate; `FaultyBackend` is a parity backend that disagrees with the
//! reference.
//!
//! Every random choice is drawn from a generator seeded by the caller, in the order I/Os arrive, so a
//! single-threaded caller (the simulator, a test) replays exactly from its seed.
//!
//! A rule is a `Scope` (which slots or which device, which kinds of I/O, which member byte ranges, and optionally
//! at most how many slots per stripe row) and a `Fault` (what happens to a matching I/O). A slot is an I/O index,
//! which a spare or a new member takes over; a device is what was attached there, and follows a spare that moves.
//! Rules stack: an I/O matched by several rules gets all of their effects (it fails if any failing rule fires).

pub mod backend;
mod crash;
mod rate;
mod rng;
mod rules;

use std::io;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

pub use backend::FaultyBackend;
pub use crash::{CrashMembers, CrashPolicy, CrashReport};
pub use rate::RateMembers;
pub use rng::SplitMix64;
use rules::overlaps;
pub use rules::{
    Count, DeviceId, Fault, FaultCounts, Injected, Injection, OpKinds, RowLimit, RuleId, Scope,
};

use crate::buf::AlignedBuf;
use crate::error::MemberOp;
use crate::layout::MAX_MEMBERS;
use crate::layout::PAGE_BYTES;
use crate::member::{IoOp, IoReq, MemberIo, NewMember};

/// Injections kept for `injections()`; beyond this only the counters grow.
const INJECTION_LOG_MAX: usize = 1 << 16;

struct Rule {
    id: RuleId,
    scope: Scope,
    fault: Fault,
    rng: SplitMix64,
    /// Matching I/Os so far: index 0 is the global count, 1 + slot the per-slot counts.
    seen: Vec<u64>,
    /// Per stripe row: the slots this rule fired on (only with a row limit).
    row_slots: std::collections::HashMap<u64, Vec<usize>>,
    counts: FaultCounts,
}

impl Rule {
    /// Rows of the data area that `span` touches, or None when it leaves the data area.
    fn rows(limit: &RowLimit, span: &Range<u64>) -> Option<Range<u64>> {
        if span.start < limit.data_offset_bytes || span.end <= span.start {
            return None;
        }
        let first = (span.start - limit.data_offset_bytes) / limit.chunk_bytes;
        let last = (span.end - 1 - limit.data_offset_bytes) / limit.chunk_bytes;
        Some(first..last + 1)
    }

    fn within_row_limit(&self, slot: usize, span: &Option<Range<u64>>) -> bool {
        let Some(limit) = &self.scope.row_limit else {
            return true;
        };
        let Some(rows) = span.as_ref().and_then(|s| Rule::rows(limit, s)) else {
            return false;
        };
        rows.into_iter().all(|row| match self.row_slots.get(&row) {
            Some(slots) => slots.contains(&slot) || slots.len() < limit.max_slots,
            None => limit.max_slots > 0,
        })
    }

    fn note_rows(&mut self, slot: usize, span: &Option<Range<u64>>) {
        let Some(limit) = self.scope.row_limit else {
            return;
        };
        let Some(rows) = span.as_ref().and_then(|s| Rule::rows(&limit, s)) else {
            return;
        };
        for row in rows {
            let slots = self.row_slots.entry(row).or_default();
            if !slots.contains(&slot) {
                slots.push(slot);
            }
        }
    }
}

/// What will be done to one request.
#[derive(Default)]
struct Plan {
    fail: bool,
    shift_bytes: i64,
    /// Buffer byte indices and bit numbers to flip (reads after the I/O, writes in a private copy).
    flips: Vec<(usize, u8)>,
    /// Longest injected delay that sleeps, and longest that only counts (virtual time).
    sleep: Duration,
    virtual_delay: Duration,
}

struct State {
    rules: Vec<Rule>,
    next_id: u32,
    ticks: u64,
    /// The simulator's clock: the sum over batches of the longest injected delay of each batch.
    virtual_ns: u64,
    log: Vec<Injection>,
    /// Counts of removed rules, so totals survive `remove`.
    retired: FaultCounts,
    /// Per slot, the device attached there (`MAX_MEMBERS` entries), and the next new device's id.
    devices: Vec<Option<DeviceId>>,
    next_device: u64,
}

/// A `MemberIo` that injects faults into the I/O of the `MemberIo` it wraps.
pub struct FaultyMembers<M: MemberIo> {
    inner: M,
    seed: u64,
    state: Mutex<State>,
    /// Longest unseeded pause before a batch, in microseconds (0: none); see `shake`.
    shake_us: AtomicU64,
    shake_draws: AtomicU64,
}

fn eio() -> io::Error {
    io::Error::from_raw_os_error(libc::EIO)
}

fn span_of(op: &IoOp<'_>) -> Option<Range<u64>> {
    match op {
        IoOp::Read { offset_bytes, buf } => Some(*offset_bytes..*offset_bytes + buf.len() as u64),
        IoOp::Write {
            offset_bytes, buf, ..
        } => Some(*offset_bytes..*offset_bytes + buf.len() as u64),
        IoOp::Flush => None,
        IoOp::Discard {
            offset_bytes,
            len_bytes,
        } => Some(*offset_bytes..*offset_bytes + *len_bytes),
    }
}

impl<M: MemberIo> FaultyMembers<M> {
    /// Wraps `inner`; `seed` drives every random choice of every rule.
    pub fn new(inner: M, seed: u64) -> FaultyMembers<M> {
        FaultyMembers {
            inner,
            seed,
            state: Mutex::new(State {
                rules: Vec::new(),
                next_id: 0,
                ticks: 0,
                virtual_ns: 0,
                log: Vec::new(),
                retired: FaultCounts::default(),
                devices: (0..MAX_MEMBERS as u64).map(|i| Some(DeviceId(i))).collect(),
                next_device: MAX_MEMBERS as u64,
            }),
            shake_us: AtomicU64::new(0),
            shake_draws: AtomicU64::new(0),
        }
    }

    /// From now on, before each batch, pause a random time up to `longest` (or only yield the thread), drawn
    /// from the clock, not the seed. Concurrent code paths then meet in orders a quiet machine rarely shows:
    /// a race found once in thousands of seeds (an interleaving the seed does not decide) shows up in tens of
    /// reruns. Rule-driven faults stay seeded; the pauses are not counted in virtual time.
    pub fn shake(&self, longest: Duration) {
        self.shake_us
            .store(longest.as_micros() as u64, Ordering::Relaxed);
    }

    /// The unseeded pause of `shake`: none, a yield, or a sleep, a third each.
    fn shake_pause(&self) {
        let longest_us = self.shake_us.load(Ordering::Relaxed);
        if longest_us == 0 {
            return;
        }
        let clock = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        let draw = self.shake_draws.fetch_add(1, Ordering::Relaxed);
        let mut rng = SplitMix64::new(clock ^ draw.rotate_left(32));
        match rng.below(3) {
            0 => {}
            1 => std::thread::yield_now(),
            _ => std::thread::sleep(Duration::from_micros(rng.below(longest_us) + 1)),
        }
    }

    pub fn inner(&self) -> &M {
        &self.inner
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Adds a rule; it counts matching I/Os from now on.
    pub fn add(&self, scope: Scope, fault: Fault) -> RuleId {
        if let Fault::Misdirect { shift_bytes, .. } = fault {
            assert!(
                shift_bytes.unsigned_abs() % PAGE_BYTES == 0,
                "misdirection must keep I/O aligned: {shift_bytes} bytes"
            );
        }
        if let Some(limit) = &scope.row_limit {
            assert!(limit.chunk_bytes > 0, "row limit needs a chunk size");
        }
        // Per-slot counts for every slot a member could be attached to, not only those in use now.
        let slots = MAX_MEMBERS;
        let mut state = self.lock();
        let id = RuleId(state.next_id);
        state.next_id += 1;
        state.rules.push(Rule {
            id,
            scope,
            fault,
            rng: SplitMix64::derive(self.seed, id.0 as u64),
            seen: vec![0; slots + 1],
            row_slots: std::collections::HashMap::new(),
            counts: FaultCounts::default(),
        });
        id
    }

    /// Every I/O of `slot` fails from its next one on: the member died.
    pub fn fail_slot(&self, slot: usize) -> RuleId {
        self.fail_from_now(Scope::slot(slot))
    }

    /// Every I/O within `scope` fails from its next one on.
    fn fail_from_now(&self, scope: Scope) -> RuleId {
        self.add(
            scope,
            Fault::FailFrom {
                nth: 1,
                count: Count::Global,
            },
        )
    }

    /// The device attached in `slot` now (None when there is none).
    pub fn device_at(&self, slot: usize) -> Option<DeviceId> {
        self.lock().devices.get(slot).copied().flatten()
    }

    /// Every I/O of the device in `slot` fails from its next one on, wherever it goes: the drive died. A member
    /// attached to the slot later is another device, and works.
    pub fn fail_device(&self, slot: usize) -> RuleId {
        let device = self
            .device_at(slot)
            .unwrap_or_else(|| panic!("no device in slot {slot}"));
        self.fail_from_now(Scope::device(device))
    }

    /// Removes a rule (its counts stay in the totals). Returns whether it existed.
    pub fn remove(&self, id: RuleId) -> bool {
        let mut state = self.lock();
        match state.rules.iter().position(|r| r.id == id) {
            Some(at) => {
                let rule = state.rules.remove(at);
                state.retired += rule.counts;
                true
            }
            None => false,
        }
    }

    /// Removes every rule.
    pub fn clear(&self) {
        let mut state = self.lock();
        let rules = std::mem::take(&mut state.rules);
        for rule in rules {
            state.retired += rule.counts;
        }
    }

    /// Totals over every rule, removed ones included.
    pub fn counts(&self) -> FaultCounts {
        let state = self.lock();
        let mut total = state.retired;
        for rule in &state.rules {
            total += rule.counts;
        }
        total
    }

    /// Counts of one live rule.
    pub fn rule_counts(&self, id: RuleId) -> Option<FaultCounts> {
        self.lock()
            .rules
            .iter()
            .find(|r| r.id == id)
            .map(|r| r.counts)
    }

    /// The injections so far (the first 65536).
    pub fn injections(&self) -> Vec<Injection> {
        self.lock().log.clone()
    }

    /// Member I/Os submitted through the wrapper so far (the clock that "from tick t" refers to).
    pub fn ticks(&self) -> u64 {
        self.lock().ticks
    }

    /// Virtual time spent in injected delays that did not sleep.
    pub fn virtual_delay(&self) -> Duration {
        Duration::from_nanos(self.lock().virtual_ns)
    }

    /// Decides, under the lock, what happens to one request.
    fn plan(&self, state: &mut State, slot: usize, op: &IoOp<'_>) -> Plan {
        let kind = op.kind();
        let span = span_of(op);
        let member_bytes = self.inner.size_bytes(slot);
        let mut plan = Plan::default();
        let mut log: Vec<Injection> = Vec::new();
        let device = state.devices.get(slot).copied().flatten();
        for rule in state.rules.iter_mut() {
            if !rule.scope.matches(slot, device, kind, span.clone())
                || !rule.within_row_limit(slot, &span)
            {
                continue;
            }
            rule.counts.matched += 1;
            rule.seen[0] += 1;
            if let Some(n) = rule.seen.get_mut(1 + slot) {
                *n += 1;
            }
            let nth_seen = |count: Count| match count {
                Count::Global => rule.seen[0],
                Count::PerSlot => rule.seen.get(1 + slot).copied().unwrap_or(0),
            };
            let mut note = |what: Injected| {
                log.push(Injection {
                    rule: rule.id,
                    slot,
                    op: kind,
                    offset_bytes: span.as_ref().map_or(0, |s| s.start),
                    len_bytes: span.as_ref().map_or(0, |s| s.end - s.start),
                    what,
                })
            };
            let fired = match rule.fault.clone() {
                Fault::FailFrom { nth, count } => {
                    let fire = nth_seen(count) >= nth;
                    if fire {
                        plan.fail = true;
                        rule.counts.failed += 1;
                        note(Injected::Failed);
                    }
                    fire
                }
                Fault::FailOnce { nth, count } => {
                    let fire = nth_seen(count) == nth;
                    if fire {
                        plan.fail = true;
                        rule.counts.failed += 1;
                        note(Injected::Failed);
                    }
                    fire
                }
                Fault::FailRun { nth, times, count } => {
                    let n = nth_seen(count);
                    let fire = n >= nth && n < nth.saturating_add(times);
                    if fire {
                        plan.fail = true;
                        rule.counts.failed += 1;
                        note(Injected::Failed);
                    }
                    fire
                }
                Fault::FlipBits { bits, one_in } => {
                    let data = matches!(kind, MemberOp::Read | MemberOp::Write);
                    let fire = data && rule.rng.one_in(one_in);
                    if fire {
                        let span = span.clone().expect("reads and writes have a span");
                        // Candidate bytes: the I/O, narrowed to the scope's ranges when it has any.
                        let windows: Vec<Range<u64>> = if rule.scope.ranges.is_empty() {
                            vec![span.clone()]
                        } else {
                            rule.scope
                                .ranges
                                .iter()
                                .filter(|r| overlaps(r, &span))
                                .map(|r| r.start.max(span.start)..r.end.min(span.end))
                                .collect()
                        };
                        let total: u64 = windows.iter().map(|w| w.end - w.start).sum();
                        for _ in 0..bits {
                            let mut pick = rule.rng.below(total);
                            let at = windows
                                .iter()
                                .find_map(|w| {
                                    let len = w.end - w.start;
                                    if pick < len {
                                        Some(w.start + pick)
                                    } else {
                                        pick -= len;
                                        None
                                    }
                                })
                                .expect("pick within the windows");
                            let bit = rule.rng.below(8) as u8;
                            plan.flips.push(((at - span.start) as usize, bit));
                            rule.counts.bits_flipped += 1;
                            note(Injected::FlippedBit { at_bytes: at, bit });
                        }
                        if kind == MemberOp::Read {
                            rule.counts.flipped_reads += 1;
                        } else {
                            rule.counts.flipped_writes += 1;
                        }
                    }
                    fire
                }
                Fault::Misdirect {
                    shift_bytes,
                    one_in,
                } => {
                    let data = matches!(kind, MemberOp::Read | MemberOp::Write);
                    let span = span.clone().unwrap_or(0..0);
                    let to = span.start as i128 + plan.shift_bytes as i128 + shift_bytes as i128;
                    let len = (span.end - span.start) as i128;
                    let inside = to >= 0 && to + len <= member_bytes as i128;
                    let fire = data && inside && rule.rng.one_in(one_in);
                    if fire {
                        plan.shift_bytes += shift_bytes;
                        if kind == MemberOp::Read {
                            rule.counts.misdirected_reads += 1;
                        } else {
                            rule.counts.misdirected_writes += 1;
                        }
                        note(Injected::Misdirected {
                            to_bytes: to as u64,
                        });
                    }
                    fire
                }
                Fault::Delay {
                    delay,
                    one_in,
                    sleep,
                } => {
                    let fire = rule.rng.one_in(one_in);
                    if fire {
                        if sleep {
                            plan.sleep = plan.sleep.max(delay);
                        } else {
                            plan.virtual_delay = plan.virtual_delay.max(delay);
                        }
                        rule.counts.delayed += 1;
                        rule.counts.delay_ns += delay.as_nanos() as u64;
                        note(Injected::Delayed { delay });
                    }
                    fire
                }
            };
            if fired {
                rule.note_rows(slot, &span);
            }
        }
        let room = INJECTION_LOG_MAX.saturating_sub(state.log.len());
        state.log.extend(log.into_iter().take(room));
        plan
    }
}

fn shifted(offset_bytes: u64, shift_bytes: i64) -> u64 {
    (offset_bytes as i128 + shift_bytes as i128) as u64
}

impl<M: MemberIo> MemberIo for FaultyMembers<M> {
    // Holes: the inner members' answer, as no rule applies (nothing is read or written; a page a rule would fail
    // to read still holds what the read path would reconstruct).
    crate::forward_member_io!(inner, holes);

    fn attach(&self, slot: usize, member: &NewMember) -> io::Result<()> {
        self.inner.attach(slot, member)?;
        let mut state = self.lock();
        let device = DeviceId(state.next_device);
        state.next_device += 1;
        state.devices[slot] = Some(device);
        Ok(())
    }

    fn detach(&self, slot: usize) -> bool {
        let was = self.inner.detach(slot);
        self.lock().devices[slot] = None;
        was
    }

    fn move_member(&self, from: usize, to: usize) -> io::Result<()> {
        self.inner.move_member(from, to)?;
        let mut state = self.lock();
        state.devices[to] = state.devices[from].take();
        Ok(())
    }

    fn submit(&self, reqs: &mut [IoReq<'_>]) {
        self.shake_pause();
        let plans: Vec<Plan> = {
            let mut state = self.lock();
            state.ticks += reqs.len() as u64;
            let plans: Vec<Plan> = reqs
                .iter()
                .map(|req| self.plan(&mut state, req.slot, &req.op))
                .collect();
            // The batch's requests run concurrently: it completes after its longest delay.
            let longest = plans
                .iter()
                .map(|p| p.virtual_delay)
                .max()
                .unwrap_or_default();
            state.virtual_ns += longest.as_nanos() as u64;
            plans
        };
        let sleep = plans.iter().map(|p| p.sleep).max().unwrap_or_default();
        if !sleep.is_zero() {
            std::thread::sleep(sleep);
        }

        // Writes that store corrupted bytes get a private copy; the caller's buffer stays intact.
        let mut copies: Vec<Option<AlignedBuf>> = reqs
            .iter()
            .zip(&plans)
            .map(|(req, plan)| match &req.op {
                IoOp::Write { buf, .. } if !plan.fail && !plan.flips.is_empty() => {
                    let mut copy = AlignedBuf::zeroed(buf.len());
                    copy.copy_from_slice(buf);
                    for &(at, bit) in &plan.flips {
                        copy[at] ^= 1 << bit;
                    }
                    Some(copy)
                }
                _ => None,
            })
            .collect();

        let results: Vec<(usize, io::Result<()>, u64, bool)> = {
            let mut inner_reqs: Vec<IoReq<'_>> = Vec::with_capacity(reqs.len());
            let mut at: Vec<usize> = Vec::with_capacity(reqs.len());
            for (i, ((req, plan), copy)) in reqs
                .iter_mut()
                .zip(&plans)
                .zip(copies.iter_mut())
                .enumerate()
            {
                if plan.fail {
                    continue;
                }
                let op = match &mut req.op {
                    IoOp::Read { offset_bytes, buf } => IoOp::Read {
                        offset_bytes: shifted(*offset_bytes, plan.shift_bytes),
                        buf,
                    },
                    IoOp::Write {
                        offset_bytes,
                        buf,
                        fua,
                    } => IoOp::Write {
                        offset_bytes: shifted(*offset_bytes, plan.shift_bytes),
                        buf: match copy {
                            Some(c) => &c[..],
                            None => buf,
                        },
                        fua: *fua,
                    },
                    IoOp::Flush => IoOp::Flush,
                    IoOp::Discard {
                        offset_bytes,
                        len_bytes,
                    } => IoOp::Discard {
                        offset_bytes: *offset_bytes,
                        len_bytes: *len_bytes,
                    },
                };
                inner_reqs.push(IoReq::new(req.slot, op));
                at.push(i);
            }
            self.inner.submit(&mut inner_reqs);
            at.into_iter()
                .zip(inner_reqs)
                .map(|(i, r)| (i, r.result, r.latency_ns, r.timed))
                .collect()
        };
        for (req, plan) in reqs.iter_mut().zip(&plans) {
            if plan.fail {
                req.result = Err(eio());
            }
        }
        for (i, result, latency_ns, timed) in results {
            let req = &mut reqs[i];
            // As a member would report it: its own injected delay, whether slept or only counted; untimed where the
            // members below waited for it together with others (member/uring.rs, `waits_together`).
            let delay = plans[i].sleep.max(plans[i].virtual_delay);
            req.latency_ns = latency_ns + delay.as_nanos() as u64;
            req.timed = timed;
            if result.is_ok() {
                if let IoOp::Read { buf, .. } = &mut req.op {
                    for &(at, bit) in &plans[i].flips {
                        buf[at] ^= 1 << bit;
                    }
                }
            }
            req.result = result;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::member::MemMembers;

    fn page(fill: u8) -> AlignedBuf {
        let mut b = AlignedBuf::zeroed(4096);
        b.fill(fill);
        b
    }

    fn read(io: &dyn MemberIo, slot: usize, offset: u64) -> (io::Result<()>, AlignedBuf) {
        let mut b = AlignedBuf::zeroed(4096);
        let mut reqs = [IoReq::read(slot, offset, &mut b)];
        io.submit(&mut reqs);
        let [req] = reqs;
        (req.result, b)
    }

    fn write(io: &dyn MemberIo, slot: usize, offset: u64, b: &[u8]) -> io::Result<()> {
        let mut reqs = [IoReq::write(slot, offset, b, false)];
        io.submit(&mut reqs);
        let [req] = reqs;
        req.result
    }

    /// A dead device stays dead when a spare takes its slot, and a rule on the spare follows it there; a rule on
    /// the slot (`fail_slot`) would fail whatever is attached to it.
    #[test]
    fn a_device_rule_follows_the_device_not_the_slot() {
        let io = FaultyMembers::new(MemMembers::new(3, 1 << 16), 1);
        let image = |label: &str| NewMember::Image {
            label: label.to_string(),
            size_bytes: 1 << 16,
        };
        io.attach(3, &image("spare")).expect("attach a spare");
        let spare = io.device_at(3).expect("the spare's device");
        io.fail_device(1);
        assert!(write(&io, 1, 0, &page(1)).is_err(), "the dead device fails");
        assert!(read(&io, 1, 0).0.is_err());
        assert!(write(&io, 0, 0, &page(1)).is_ok(), "the others work");
        assert!(write(&io, 3, 0, &page(1)).is_ok());

        assert!(io.detach(1));
        assert_eq!(io.device_at(1), None);
        io.move_member(3, 1).expect("the spare takes slot 1");
        assert_eq!(io.device_at(1), Some(spare));
        assert_eq!(io.device_at(3), None);
        assert!(
            write(&io, 1, 0, &page(2)).is_ok(),
            "the spare in slot 1 works"
        );
        assert_eq!(read(&io, 1, 0).1[..], page(2)[..]);

        io.add(
            Scope::device(spare).ops(OpKinds::READ),
            Fault::FailFrom {
                nth: 1,
                count: Count::Global,
            },
        );
        assert!(read(&io, 1, 0).0.is_err(), "the spare's rule, in slot 1");
        assert!(write(&io, 1, 0, &page(3)).is_ok(), "writes unaffected");
        assert!(io.detach(1));
        io.attach(1, &image("new")).expect("a new member in slot 1");
        assert_ne!(io.device_at(1), Some(spare));
        assert!(
            read(&io, 1, 0).0.is_ok(),
            "a new device: no rule of the old ones"
        );

        io.fail_slot(1);
        assert!(
            read(&io, 1, 0).0.is_err(),
            "a slot rule fails what is in the slot"
        );
    }

    #[test]
    fn fail_from_nth_per_slot() {
        let io = FaultyMembers::new(MemMembers::new(2, 1 << 16), 1);
        io.add(
            Scope::all().ops(OpKinds::READ),
            Fault::FailFrom {
                nth: 3,
                count: Count::PerSlot,
            },
        );
        for slot in 0..2 {
            assert!(read(&io, slot, 0).0.is_ok());
            assert!(read(&io, slot, 4096).0.is_ok());
            assert!(write(&io, slot, 0, &page(1)).is_ok(), "writes unaffected");
            for _ in 0..3 {
                let err = read(&io, slot, 0).0.expect_err("3rd read on fails");
                assert_eq!(err.raw_os_error(), Some(libc::EIO));
            }
        }
        assert_eq!(io.counts().failed, 6);
        assert_eq!(io.counts().matched, 10);
    }

    #[test]
    fn fail_run_then_spent() {
        let io = FaultyMembers::new(MemMembers::new(1, 1 << 16), 1);
        io.add(
            Scope::all(),
            Fault::FailRun {
                nth: 2,
                times: 2,
                count: Count::Global,
            },
        );
        let outcomes: Vec<bool> = (0..5).map(|_| read(&io, 0, 0).0.is_ok()).collect();
        assert_eq!(outcomes, vec![true, false, false, true, true]);
    }

    #[test]
    fn fail_once_global_on_a_range() {
        let io = FaultyMembers::new(MemMembers::new(2, 1 << 16), 1);
        io.add(
            Scope::all().range(8192..12288),
            Fault::FailOnce {
                nth: 2,
                count: Count::Global,
            },
        );
        assert!(read(&io, 0, 0).0.is_ok(), "outside the range");
        assert!(read(&io, 0, 8192).0.is_ok(), "1st match");
        assert!(read(&io, 1, 8192).0.is_err(), "2nd match fails");
        assert!(read(&io, 1, 8192).0.is_ok(), "only once");
        assert_eq!(io.counts().failed, 1);
    }

    #[test]
    fn flipped_write_stores_corruption_and_spares_the_caller() {
        let io = FaultyMembers::new(MemMembers::new(1, 1 << 16), 9);
        let rule = io.add(
            Scope::all().ops(OpKinds::WRITE),
            Fault::FlipBits { bits: 3, one_in: 1 },
        );
        let data = page(0xAA);
        write(&io, 0, 4096, &data).expect("write");
        assert!(data.iter().all(|b| *b == 0xAA), "caller's buffer untouched");
        io.remove(rule);
        let (r, back) = read(&io, 0, 4096);
        r.expect("read");
        let differing: u32 = back.iter().map(|b| (b ^ 0xAA).count_ones()).sum::<u32>();
        let log = io.injections();
        assert_eq!(log.len(), 3);
        // Three flips, unless two hit the same bit (then they cancel).
        assert!(differing == 3 || differing == 1, "{differing} bits differ");
        for inj in log {
            let Injected::FlippedBit { at_bytes, .. } = inj.what else {
                panic!("unexpected {inj:?}");
            };
            assert!((4096..8192).contains(&at_bytes));
        }
    }

    #[test]
    fn flipped_read_leaves_the_medium_intact() {
        let mem = MemMembers::new(1, 1 << 16);
        let io = FaultyMembers::new(mem, 3);
        write(&io, 0, 0, &page(0x11)).expect("write");
        io.add(
            Scope::all().ops(OpKinds::READ).range(100..101),
            Fault::FlipBits { bits: 1, one_in: 1 },
        );
        let (_, back) = read(&io, 0, 0);
        assert_ne!(back[100], 0x11, "bit flipped at the only byte in range");
        assert_eq!(back.iter().filter(|b| **b != 0x11).count(), 1);
        assert!(io.inner().image(0).expect("present")[..4096]
            .iter()
            .all(|b| *b == 0x11));
    }

    #[test]
    fn misdirected_write_lands_elsewhere() {
        let io = FaultyMembers::new(MemMembers::new(1, 1 << 16), 3);
        io.add(
            Scope::all().ops(OpKinds::WRITE),
            Fault::Misdirect {
                shift_bytes: 8192,
                one_in: 1,
            },
        );
        write(&io, 0, 4096, &page(7)).expect("write");
        let image = io.inner().image(0).expect("present");
        assert!(image[4096..8192].iter().all(|b| *b == 0), "intended page");
        assert!(image[12288..16384].iter().all(|b| *b == 7), "landed page");
        // A shift past the end is not applied.
        write(&io, 0, 61440, &page(8)).expect("write");
        assert!(io.inner().image(0).expect("present")[61440..]
            .iter()
            .all(|b| *b == 8));
        assert_eq!(io.counts().misdirected_writes, 1);
    }

    #[test]
    fn row_limit_caps_slots_per_row() {
        let io = FaultyMembers::new(MemMembers::new(4, 1 << 16), 5);
        io.add(
            Scope::all().ops(OpKinds::WRITE).row_limit(RowLimit {
                data_offset_bytes: 8192,
                chunk_bytes: 8192,
                max_slots: 1,
            }),
            Fault::FlipBits { bits: 1, one_in: 1 },
        );
        for slot in 0..4 {
            write(&io, slot, 8192, &page(0)).expect("write row 0");
        }
        write(&io, 0, 0, &page(0)).expect("write outside the data area");
        let slots: Vec<usize> = io.injections().iter().map(|i| i.slot).collect();
        assert_eq!(
            slots,
            vec![0],
            "one slot of row 0, nothing outside the data area"
        );
        write(&io, 0, 12288, &page(0)).expect("same slot, same row");
        assert_eq!(io.counts().flipped_writes, 2);
    }

    #[test]
    fn same_seed_same_injections() {
        let run = |seed: u64| {
            let io = FaultyMembers::new(MemMembers::new(3, 1 << 16), seed);
            io.add(Scope::all(), Fault::FlipBits { bits: 2, one_in: 3 });
            io.add(
                Scope::slot(1),
                Fault::Delay {
                    delay: Duration::from_millis(5),
                    one_in: 2,
                    sleep: false,
                },
            );
            for i in 0..30u64 {
                let _ = write(&io, (i % 3) as usize, (i % 8) * 4096, &page(i as u8));
                let _ = read(&io, (i % 3) as usize, (i % 5) * 4096);
            }
            (io.injections(), io.virtual_delay())
        };
        assert_eq!(run(42), run(42));
        assert_ne!(run(42).0, run(43).0);
    }
}
