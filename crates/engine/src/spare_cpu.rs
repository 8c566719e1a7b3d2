//! Whether the machine has CPU to spare: what journal mode's early answers are gated on when the policy is left to
//! measure it (`AssembleOptions::spare_cpu`, `PARAID_JOURNAL_LONE=auto`).
//!
//! Why: an early answer (journal mode with lone answers, array/ppl/) saves a client that waits for each write one
//! member round trip, and pays for it in CPU: the write's data is copied to the log and checksummed, and a round
//! more is written. Where the members' latency is the limit and the CPU idles, that trade wins (`writehole_cost
//! latency:100` at QD1: within 10 % of the bitmap alone, where the log costs −34 %); where the CPU is the limit (a
//! database and its clients on two cores), the same copies cost 4-15 % of the transactions against the log
//! (docs/benchmarks.md, stops 48 and 50). The engine cannot see from inside which of the two it is in, since a
//! database's CPU is spent in other processes; the kernel's count of idle time over the whole machine can.
//!
//! `ProcStatCpu` reads the first line of `/proc/stat` at most once per window (100 ms: ten clock ticks per CPU)
//! and calls the CPU spare from 30 % idle (steal counts as busy: that CPU is not ours) until it falls below 15 %;
//! the gap keeps a load that the early answers themselves push across one threshold from flapping at every look.
//! A reader that cannot read or parse the file says "not spare": the log's own way, the policy that never costs
//! more than the log.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

/// Says whether CPU is to spare now (cheap: called once per small write waited for).
pub trait SpareCpu: Send + Sync {
    fn spare(&self) -> bool;
}

/// Idle share from which the CPU counts as spare again (percent of all CPU time in the window).
pub const SPARE_FROM_IDLE_PERCENT: u64 = 30;
/// Idle share below which the CPU no longer counts as spare.
pub const BUSY_BELOW_IDLE_PERCENT: u64 = 15;
/// The window between two looks at `/proc/stat`.
pub const WINDOW_NS: u64 = 100_000_000;

/// CPU time counters of the first line of `/proc/stat`, in clock ticks: what was idle (idle, iowait) and the sum
/// of every kind (user, nice, system, idle, iowait, irq, softirq, steal; guest time is already in user and nice).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuTicks {
    pub idle: u64,
    pub total: u64,
}

/// Parses the aggregate `cpu` line of `/proc/stat`; None if the text has none or it is malformed.
pub fn parse_proc_stat(text: &str) -> Option<CpuTicks> {
    let line = text.lines().next()?;
    let mut fields = line.split_ascii_whitespace();
    if fields.next()? != "cpu" {
        return None;
    }
    let values: Vec<u64> = fields
        .take(8)
        .map(str::parse)
        .collect::<Result<_, _>>()
        .ok()?;
    // Kernels since 2.6.11 have eight; fewer would leave steal (and more) out of the total.
    if values.len() < 5 {
        return None;
    }
    Some(CpuTicks {
        idle: values[3] + values[4],
        total: values.iter().sum(),
    })
}

/// The next state from the one before and a window's ticks; None where the window saw no tick (state kept).
pub fn next_spare(spare_before: bool, before: CpuTicks, now: CpuTicks) -> Option<bool> {
    let total = now.total.checked_sub(before.total)?;
    let idle = now.idle.checked_sub(before.idle)?.min(total);
    if total == 0 {
        return None;
    }
    let idle_percent = idle * 100 / total;
    Some(if spare_before {
        idle_percent >= BUSY_BELOW_IDLE_PERCENT
    } else {
        idle_percent >= SPARE_FROM_IDLE_PERCENT
    })
}

/// `SpareCpu` from the kernel's idle count over the whole machine (module doc).
pub struct ProcStatCpu {
    epoch: Instant,
    /// When the next look is due (ns since `epoch`).
    next_look_ns: AtomicU64,
    spare: AtomicBool,
    /// The ticks at the last look; None before the first or after a failed read.
    last: Mutex<Option<CpuTicks>>,
    looks: AtomicU64,
}

impl Default for ProcStatCpu {
    fn default() -> ProcStatCpu {
        ProcStatCpu::new()
    }
}

impl ProcStatCpu {
    /// Counts as spare until the first window has passed (the first writes find an idle machine, most often).
    pub fn new() -> ProcStatCpu {
        let cpu = ProcStatCpu {
            epoch: Instant::now(),
            next_look_ns: AtomicU64::new(WINDOW_NS),
            spare: AtomicBool::new(true),
            last: Mutex::new(None),
            looks: AtomicU64::new(0),
        };
        *cpu.last.lock().unwrap_or_else(|e| e.into_inner()) = read_proc_stat();
        cpu
    }

    /// Looks taken at `/proc/stat` (for tests and reports).
    pub fn looks(&self) -> u64 {
        self.looks.load(Ordering::Relaxed)
    }

    fn look(&self, last: &mut Option<CpuTicks>) {
        self.looks.fetch_add(1, Ordering::Relaxed);
        let now = read_proc_stat();
        match (now, *last) {
            (Some(now), Some(before)) => {
                if let Some(spare) = next_spare(self.spare.load(Ordering::Relaxed), before, now) {
                    self.spare.store(spare, Ordering::Relaxed);
                }
            }
            (None, _) => self.spare.store(false, Ordering::Relaxed),
            (Some(_), None) => {}
        }
        *last = now;
    }
}

impl SpareCpu for ProcStatCpu {
    fn spare(&self) -> bool {
        let now_ns = u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX);
        if now_ns >= self.next_look_ns.load(Ordering::Relaxed) {
            // One caller looks; the others go on with the state of the last window rather than wait for it.
            if let Ok(mut last) = self.last.try_lock() {
                if now_ns >= self.next_look_ns.load(Ordering::Relaxed) {
                    self.look(&mut last);
                    self.next_look_ns
                        .store(now_ns + WINDOW_NS, Ordering::Relaxed);
                }
            }
        }
        self.spare.load(Ordering::Relaxed)
    }
}

fn read_proc_stat() -> Option<CpuTicks> {
    parse_proc_stat(&std::fs::read_to_string("/proc/stat").ok()?)
}

/// A fixed answer that a test may change: the gate held open or shut.
#[derive(Debug, Default)]
pub struct FixedSpareCpu(pub AtomicBool);

impl FixedSpareCpu {
    pub fn new(spare: bool) -> FixedSpareCpu {
        FixedSpareCpu(AtomicBool::new(spare))
    }

    pub fn set(&self, spare: bool) {
        self.0.store(spare, Ordering::SeqCst);
    }
}

impl SpareCpu for FixedSpareCpu {
    fn spare(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

/// The simulator's gate: a seeded stream of answers, so that early answers and the log's way alternate write by
/// write as a load crossing the thresholds would make them (the order of the answers follows the order of the
/// calls, which the seed fixes where the run is not concurrent).
#[derive(Debug)]
pub struct SeededSpareCpu {
    seed: u64,
    calls: AtomicU64,
}

impl SeededSpareCpu {
    pub fn new(seed: u64) -> SeededSpareCpu {
        SeededSpareCpu {
            seed,
            calls: AtomicU64::new(0),
        }
    }
}

impl SpareCpu for SeededSpareCpu {
    fn spare(&self) -> bool {
        let call = self.calls.fetch_add(1, Ordering::Relaxed);
        // SplitMix64's finaliser over seed and call number: runs of either answer, not a fixed pattern.
        let mut z = self
            .seed
            .wrapping_add(call.wrapping_add(1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        (z ^ (z >> 31)) & 1 == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STAT: &str = "cpu  1391397 0 426659 2287455 34179 0 5850 18045 0 0\n\
                        cpu0 695000 0 213000 1143000 17000 0 2900 9000 0 0\nintr 1 2 3\n";

    #[test]
    fn the_aggregate_line_is_parsed_with_iowait_idle_and_steal_busy() {
        let t = parse_proc_stat(STAT).unwrap();
        assert_eq!(t.idle, 2_287_455 + 34_179);
        assert_eq!(
            t.total,
            1_391_397 + 426_659 + 2_287_455 + 34_179 + 5_850 + 18_045
        );
        assert_eq!(parse_proc_stat("cpu0 1 2 3 4 5\n"), None);
        assert_eq!(parse_proc_stat("cpu  1 2 x 4 5\n"), None);
        assert_eq!(parse_proc_stat("cpu  1 2 3\n"), None);
        assert_eq!(parse_proc_stat(""), None);
    }

    fn ticks(idle: u64, total: u64) -> CpuTicks {
        CpuTicks { idle, total }
    }

    #[test]
    fn spare_turns_on_from_30_percent_idle_and_off_below_15() {
        let t0 = ticks(1000, 10_000);
        // Busy: stays busy at 29 %, turns spare at 30 %.
        assert_eq!(next_spare(false, t0, ticks(1029, 10_100)), Some(false));
        assert_eq!(next_spare(false, t0, ticks(1030, 10_100)), Some(true));
        // Spare: stays spare down to 15 %, turns busy at 14 %.
        assert_eq!(next_spare(true, t0, ticks(1015, 10_100)), Some(true));
        assert_eq!(next_spare(true, t0, ticks(1014, 10_100)), Some(false));
        // No tick in the window, or counters that went back (a different file, a wrap): state kept.
        assert_eq!(next_spare(true, t0, t0), None);
        assert_eq!(next_spare(false, t0, ticks(900, 9_000)), None);
        // Idle can never count for more than the window.
        assert_eq!(next_spare(false, t0, ticks(2000, 10_010)), Some(true));
    }

    #[test]
    fn proc_stat_is_looked_at_once_per_window() {
        let cpu = ProcStatCpu::new();
        for _ in 0..1000 {
            cpu.spare();
        }
        // Within the first window nothing is read but at construction.
        assert_eq!(cpu.looks(), 0);
        std::thread::sleep(std::time::Duration::from_nanos(WINDOW_NS + 5_000_000));
        cpu.spare();
        cpu.spare();
        assert_eq!(cpu.looks(), 1);
        // This machine has /proc/stat: the look kept ticks to measure the next window from.
        assert!(cpu.last.lock().unwrap().is_some());
    }

    #[test]
    fn the_seeded_gate_replays_and_gives_both_answers() {
        let a: Vec<bool> = {
            let g = SeededSpareCpu::new(7);
            (0..64).map(|_| g.spare()).collect()
        };
        let b: Vec<bool> = {
            let g = SeededSpareCpu::new(7);
            (0..64).map(|_| g.spare()).collect()
        };
        assert_eq!(a, b);
        let spare = a.iter().filter(|&&s| s).count();
        assert!((16..=48).contains(&spare), "{spare} of 64 spare");
    }
}
