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
//! Two levels, because an early answer pays off in two cases at two prices:
//! * `Spare::ForLone`: a write its client waits for alone (nothing else awaiting an answer: queue depth 1) saves
//!   the client a round trip whatever the members are; its copies cost the CPU that the client's wait leaves idle
//!   anyway. Over NBD at QD1 on two cores the machine idles 28-36 % (fio random 4 KiB writes on tmpfs), and the
//!   early answer gains 20-30 % there against the log.
//! * `Spare::ForAll`: at depth an early answer helps only where the members' latency, not the CPU, bounds the
//!   writers (four writers on members of 100 µs latency: the machine idles 50-79 %); on two CPU-bound cores at
//!   QD32 (12-15 % idle) its copies cost a quarter of the IOPS. Idle CPU cannot tell members bound by their latency
//!   from members bound by their request rate, where the early answers' records cost in-place writes: the array
//!   asks its members' queues for that (array/queueing.rs) and keeps `ForAll` to lone writes while they queue.
//!
//! `ProcStatCpu` reads the first line of `/proc/stat` at most once per window (100 ms: ten clock ticks per CPU),
//! steal counted as busy (that CPU is not ours). Each level turns on from one idle share and off below a lower one
//! (`ForLone`: 30 % and 15 %; `ForAll`: 50 % and 35 %); the gaps keep a load that the early answers themselves push
//! across one threshold from flapping at every look. A reader that cannot read or parse the file says `Busy`: the
//! log's own way, the policy that never costs more than the log.
//!
//! Under a CPU quota (a container's or a systemd unit's: cpu_quota.rs) the idle share is the smaller of the
//! machine's and the quota's (what the group left unused of its quota over the same window): a host that idles
//! while the database's own two CPUs are spent has no CPU to spare for it.

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use crate::cpu_quota::CpuQuota;

/// How much CPU is to spare now (module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Spare {
    /// No early answers: every write takes the log's own way.
    Busy,
    /// Early answers for writes no other write awaits an answer beside (journal mode's lone rule).
    ForLone,
    /// Early answers for every write that can have one.
    ForAll,
}

/// Says how much CPU is to spare now (cheap: called once per small write through `Array::write_answering`).
pub trait SpareCpu: Send + Sync {
    fn spare(&self) -> Spare;

    /// The CPU quota read beside the machine's idle share, in thousandths of a CPU (cpu_quota.rs); None where
    /// there is none (or the gate reads no machine at all), for `paraid status`.
    fn quota_millicpus(&self) -> Option<u64> {
        None
    }
}

/// The idle shares (percent of all CPU time in a window) from which a level turns on, and below which it turns
/// off: `ForLone`'s and `ForAll`'s.
pub const FOR_LONE_ON_OFF_PERCENT: (u64, u64) = (30, 15);
pub const FOR_ALL_ON_OFF_PERCENT: (u64, u64) = (50, 35);
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

/// The next level from the one before and a window's ticks; None where the window saw no tick (level kept).
pub fn next_spare(before_level: Spare, before: CpuTicks, now: CpuTicks) -> Option<Spare> {
    idle_percent(before, now).map(|idle| next_level(before_level, idle))
}

/// The share of a window's ticks that was idle, in percent; None where the window saw no tick or the counters
/// went back.
pub fn idle_percent(before: CpuTicks, now: CpuTicks) -> Option<u64> {
    let total = now.total.checked_sub(before.total)?;
    let idle = now.idle.checked_sub(before.idle)?.min(total);
    if total == 0 {
        return None;
    }
    Some(idle * 100 / total)
}

/// The next level from the one before and a window's idle share (percent).
pub fn next_level(before_level: Spare, idle_percent: u64) -> Spare {
    // A level stays while the idle share holds above its off threshold, and is reached from below only at its
    // on threshold.
    let holds = |level: Spare, (on, off): (u64, u64)| {
        idle_percent >= if before_level >= level { off } else { on }
    };
    if holds(Spare::ForAll, FOR_ALL_ON_OFF_PERCENT) {
        Spare::ForAll
    } else if holds(Spare::ForLone, FOR_LONE_ON_OFF_PERCENT) {
        Spare::ForLone
    } else {
        Spare::Busy
    }
}

/// What a look read: the machine's ticks, and under a quota when (µs since the gate's epoch) and how much (µs)
/// the quota's group had used.
#[derive(Debug, Clone, Copy, Default)]
struct Looked {
    host: Option<CpuTicks>,
    quota: Option<(u64, u64)>,
}

/// `SpareCpu` from the kernel's idle count over the whole machine (module doc).
pub struct ProcStatCpu {
    epoch: Instant,
    /// When the next look is due (ns since `epoch`).
    next_look_ns: AtomicU64,
    /// The level (`Spare as u8`).
    level: AtomicU8,
    /// What the last look read; nothing before the first or after a failed read.
    last: Mutex<Looked>,
    looks: AtomicU64,
    /// The CPU quota this process runs under, if any (cpu_quota.rs).
    quota: Option<CpuQuota>,
    /// What the gate reads is logged at its first look, not when it is made: a server builds the gate before it
    /// knows the level, and a RAID0/1/10 never asks it.
    announced: std::sync::Once,
}

impl Default for ProcStatCpu {
    fn default() -> ProcStatCpu {
        ProcStatCpu::new()
    }
}

impl ProcStatCpu {
    /// Counts as `ForLone` until the first window has passed. Looks for a CPU quota once, here; what it found is
    /// logged at the first look (`announce`).
    pub fn new() -> ProcStatCpu {
        ProcStatCpu::with_quota(crate::cpu_quota::find())
    }

    fn announce(&self) {
        match &self.quota {
            Some(q) => log::info!(
                "spare CPU: the smaller of the machine's idle share and that of a CPU quota of {}.{:03} CPUs ({:?})",
                q.millicpus / 1000,
                q.millicpus % 1000,
                q.usage
            ),
            None => log::info!("spare CPU: the machine's idle share (/proc/stat); no CPU quota found"),
        }
    }

    /// `new` with the quota given (None: the machine's idle share alone).
    pub fn with_quota(quota: Option<CpuQuota>) -> ProcStatCpu {
        let cpu = ProcStatCpu {
            epoch: Instant::now(),
            next_look_ns: AtomicU64::new(WINDOW_NS),
            level: AtomicU8::new(Spare::ForLone as u8),
            last: Mutex::new(Looked::default()),
            looks: AtomicU64::new(0),
            quota,
            announced: std::sync::Once::new(),
        };
        let (first, _) = cpu.read();
        *cpu.last.lock().unwrap_or_else(|e| e.into_inner()) = first;
        cpu
    }

    /// Looks taken at `/proc/stat` (for tests and reports).
    pub fn looks(&self) -> u64 {
        self.looks.load(Ordering::Relaxed)
    }

    /// What the counters say now, and whether every counter the gate reads could be read (the machine's, and
    /// under a quota its group's).
    fn read(&self) -> (Looked, bool) {
        let host = read_proc_stat();
        let quota = self.quota.as_ref().and_then(|q| {
            let used_usec = q.usage.read_usec()?;
            let at_usec = u64::try_from(self.epoch.elapsed().as_micros()).unwrap_or(u64::MAX);
            Some((at_usec, used_usec))
        });
        let complete = host.is_some() && (self.quota.is_none() || quota.is_some());
        (Looked { host, quota }, complete)
    }

    fn look(&self, last: &mut Looked) {
        self.announced.call_once(|| self.announce());
        self.looks.fetch_add(1, Ordering::Relaxed);
        let (now, complete) = self.read();
        if !complete {
            // A counter that cannot be read says busy: the log's own way.
            self.level.store(Spare::Busy as u8, Ordering::Relaxed);
            *last = now;
            return;
        }
        let host_idle = match (now.host, last.host) {
            (Some(now), Some(before)) => idle_percent(before, now),
            _ => None,
        };
        let quota_idle = match (&self.quota, last.quota, now.quota) {
            (Some(q), Some(before), Some(now)) => {
                crate::cpu_quota::quota_idle_percent(q.millicpus, before, now)
            }
            _ => None,
        };
        let idle = match (host_idle, quota_idle) {
            (Some(host), Some(quota)) => Some(host.min(quota)),
            (host, quota) => host.or(quota),
        };
        if let Some(idle) = idle {
            self.level
                .store(next_level(self.level(), idle) as u8, Ordering::Relaxed);
        }
        *last = now;
    }

    fn level(&self) -> Spare {
        match self.level.load(Ordering::Relaxed) {
            2 => Spare::ForAll,
            1 => Spare::ForLone,
            _ => Spare::Busy,
        }
    }
}

impl SpareCpu for ProcStatCpu {
    fn quota_millicpus(&self) -> Option<u64> {
        self.quota.as_ref().map(|q| q.millicpus)
    }

    fn spare(&self) -> Spare {
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
        self.level()
    }
}

fn read_proc_stat() -> Option<CpuTicks> {
    parse_proc_stat(&std::fs::read_to_string("/proc/stat").ok()?)
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
    fn spare(&self) -> Spare {
        let call = self.calls.fetch_add(1, Ordering::Relaxed);
        // SplitMix64's finaliser over seed and call number: runs of either answer, not a fixed pattern.
        let mut z = self
            .seed
            .wrapping_add(call.wrapping_add(1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        match (z ^ (z >> 31)) % 3 {
            0 => Spare::Busy,
            1 => Spare::ForLone,
            _ => Spare::ForAll,
        }
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
    fn each_level_turns_on_at_its_on_share_and_off_below_its_off_share() {
        use Spare::*;
        let t0 = ticks(1000, 10_000);
        let idle = |percent: u64| ticks(1000 + percent, 10_100);
        // From busy: ForLone from 30 %, ForAll from 50 %.
        assert_eq!(next_spare(Busy, t0, idle(29)), Some(Busy));
        assert_eq!(next_spare(Busy, t0, idle(30)), Some(ForLone));
        assert_eq!(next_spare(Busy, t0, idle(49)), Some(ForLone));
        assert_eq!(next_spare(Busy, t0, idle(50)), Some(ForAll));
        // From ForLone: kept down to 15 %, ForAll only from 50 %.
        assert_eq!(next_spare(ForLone, t0, idle(15)), Some(ForLone));
        assert_eq!(next_spare(ForLone, t0, idle(14)), Some(Busy));
        assert_eq!(next_spare(ForLone, t0, idle(49)), Some(ForLone));
        assert_eq!(next_spare(ForLone, t0, idle(50)), Some(ForAll));
        // From ForAll: kept down to 35 %, then ForLone down to 15 %.
        assert_eq!(next_spare(ForAll, t0, idle(35)), Some(ForAll));
        assert_eq!(next_spare(ForAll, t0, idle(34)), Some(ForLone));
        assert_eq!(next_spare(ForAll, t0, idle(15)), Some(ForLone));
        assert_eq!(next_spare(ForAll, t0, idle(14)), Some(Busy));
        // No tick in the window, or counters that went back (a different file, a wrap): level kept.
        assert_eq!(next_spare(ForAll, t0, t0), None);
        assert_eq!(next_spare(Busy, t0, ticks(900, 9_000)), None);
        // Idle can never count for more than the window.
        assert_eq!(next_spare(Busy, t0, ticks(2000, 10_010)), Some(ForAll));
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
        assert!(cpu.last.lock().unwrap().host.is_some());
    }

    /// Under a quota, a window in which the group used all of it says busy whatever the machine idles; a usage
    /// file that cannot be read says busy too.
    #[test]
    fn a_spent_quota_says_busy_while_the_machine_idles() {
        use crate::cpu_quota::UsageFile;
        let dir = std::env::temp_dir().join(format!("paraid-spare-quota-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let stat = dir.join("cpu.stat");
        std::fs::write(&stat, "usage_usec 1000\n").unwrap();
        let cpu = ProcStatCpu::with_quota(Some(CpuQuota {
            millicpus: 1000,
            usage: UsageFile::CpuStat(stat.clone()),
        }));
        assert_eq!(cpu.quota_millicpus(), Some(1000));
        assert_eq!(cpu.spare(), Spare::ForLone, "before the first window");
        std::thread::sleep(std::time::Duration::from_nanos(WINDOW_NS + 5_000_000));
        // Ten seconds of CPU in a window of about 0.1 s of one CPU's quota.
        std::fs::write(&stat, "usage_usec 10001000\n").unwrap();
        assert_eq!(cpu.spare(), Spare::Busy, "the quota spent");
        assert_eq!(cpu.looks(), 1);
        std::fs::remove_file(&stat).unwrap();
        let unreadable = ProcStatCpu::with_quota(Some(CpuQuota {
            millicpus: 1000,
            usage: UsageFile::CpuStat(stat),
        }));
        std::thread::sleep(std::time::Duration::from_nanos(WINDOW_NS + 5_000_000));
        assert_eq!(unreadable.spare(), Spare::Busy, "the usage unreadable");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_seeded_gate_replays_and_gives_every_answer() {
        let draw = |seed: u64| -> Vec<Spare> {
            let g = SeededSpareCpu::new(seed);
            (0..96).map(|_| g.spare()).collect()
        };
        let a = draw(7);
        assert_eq!(a, draw(7));
        for level in [Spare::Busy, Spare::ForLone, Spare::ForAll] {
            let n = a.iter().filter(|&&s| s == level).count();
            assert!((16..=48).contains(&n), "{n} of 96 {level:?}");
        }
    }
}
