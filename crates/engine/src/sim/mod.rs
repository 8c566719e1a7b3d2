//! A seeded, deterministic simulation of an array under faults.
//!
//! One `u64` seed decides everything: the geometry (level, members, chunk size, rows), the workload (reads,
//! writes, FUA writes, flushes, discards and write-zeroes at random offsets and lengths), and the faults (members
//! that die at a random I/O or are failed by the admin, transient and unretryable I/O errors, power losses with
//! unflushed writes kept, dropped or torn, power cuts between the member writes of one request, process kills,
//! clean restarts, latency spikes in virtual time, silent corruption at rest followed by check and repair, rebuilds
//! onto blank members and live replacements, stale members offered back at assembly or re-added). Requests run on
//! the calling thread over in-memory members (`CrashMembers` under `FaultyMembers`); background jobs (rebuild,
//! resync, check) are always waited for before the next step, so a seed replays exactly. With
//! `SimConfig::concurrent` some steps are batches of requests at once from several threads, also beside a rebuild
//! or an online check, and cut short by a power loss or a kill (`batch`); those seeds replay their steps, not their
//! interleaving. (The engine's once-a-second integrity tick is the one thing not driven by the seed: a seed whose
//! array lives longer than a second may see it; bitmap clearing by idle time is pushed out to an hour so that tick
//! rarely does I/O.)
//!
//! The oracle is `model::BlockModel`: after every read, every block read must be an allowed value; after every
//! crash, kill or restart the whole array is read back (before and after the background resync: the two reads must
//! agree) and every block must be one a crash may leave; after every re-assembly, rebuild, replacement and repair
//! the member images are audited directly with the reference parity backend (every stripe's parity, every copy,
//! against the model). Within the level's tolerance no request may fail. Any violation is returned with the seed
//! and a one-line replay command.

pub mod audit;
mod batch;
pub mod model;

use std::collections::VecDeque;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::fault::{
    Count, CrashMembers, CrashPolicy, Fault, FaultCounts, FaultyMembers, OpKinds, RuleId, Scope,
    SplitMix64,
};
use crate::layout::{Geometry, Level, MAX_MEMBERS, PAGE_BYTES};
use crate::member::{MemberIo, NewMember};
use crate::superblock::{SlotState, DEFAULT_DATA_OFFSET_BYTES, SUPERBLOCK_BYTES};
use crate::{
    assemble_io, create_io_with_data_offset, AddOutcome, Array, AssembleOptions, EngineError,
};
use model::{BlockModel, WriteOutcome};

/// A random request extent of an array of `array_bytes`: any offset, length up to three stripes (capped at 512
/// bytes, 16 KiB or one stripe three times in four, so that small and partial-stripe requests are common), half
/// of them page-aligned. The simulator and the fault and integrity tests all draw their requests from here.
pub fn random_extent(rng: &mut SplitMix64, array_bytes: u64, stripe_bytes: u64) -> (u64, usize) {
    let max = match rng.below(4) {
        0 => 512,
        1 => 16384,
        2 => stripe_bytes,
        _ => 3 * stripe_bytes,
    }
    .min(array_bytes);
    let mut len = 1 + rng.below(max);
    let mut offset = rng.below(array_bytes - len + 1);
    if rng.one_in(2) {
        offset -= offset % PAGE_BYTES;
        len = len.div_ceil(PAGE_BYTES) * PAGE_BYTES;
        len = len.min(array_bytes - offset);
    }
    (offset, len as usize)
}

const CLASS_COUNT: usize = 12;

/// Fault classes the simulator may inject.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Classes {
    /// A member fails every I/O from a random one on, or the admin fails it (within the level's tolerance).
    pub member_failure: bool,
    /// Sometimes one failure more than the level survives: the array must stop serving, never return wrong data,
    /// and assembly must refuse.
    pub beyond_tolerance: bool,
    /// Power loss: unflushed writes kept, dropped or torn.
    pub crash: bool,
    /// Power cut between two member writes of one array write.
    pub power_cut_mid_request: bool,
    /// The process dies: every completed member write survives, the request in flight is cut short.
    pub kill: bool,
    /// Clean stop and re-assembly.
    pub restart: bool,
    /// Latency spikes on one member (virtual time): must not fail anything.
    pub latency: bool,
    /// A member removed earlier is offered back at assembly: refused, or (re-add) rebuilt.
    pub stale_reattach: bool,
    /// One I/O fails once (retried), or a page fails reads until rewritten (served by reconstruction).
    pub transient_errors: bool,
    /// Bits flipped at rest within the level's tolerance, then check (every one found) and repair.
    pub silent_corruption: bool,
    /// Power loss or kill while degraded, and member loss right after a power loss (the write hole).
    pub crash_degraded: bool,
    /// Failed and missing members replaced by blank ones and rebuilt; live replacement of working members.
    pub rebuild: bool,
}

const CLASS_NAMES: [&str; CLASS_COUNT] = [
    "member-failure",
    "beyond-tolerance",
    "crash",
    "power-cut-mid-request",
    "kill",
    "restart",
    "latency",
    "stale-reattach",
    "transient-errors",
    "silent-corruption",
    "crash-degraded",
    "rebuild",
];

impl Classes {
    pub fn none() -> Classes {
        Classes::from_flags([false; CLASS_COUNT])
    }

    pub fn all() -> Classes {
        Classes::from_flags([true; CLASS_COUNT])
    }

    /// What the engine in this tree survives: every class (a power loss or kill of a degraded parity array was
    /// left out until the partial parity log logged writes that change only a missing member's chunk).
    pub fn engine_today() -> Classes {
        Classes::all()
    }

    fn flags(&self) -> [bool; CLASS_COUNT] {
        [
            self.member_failure,
            self.beyond_tolerance,
            self.crash,
            self.power_cut_mid_request,
            self.kill,
            self.restart,
            self.latency,
            self.stale_reattach,
            self.transient_errors,
            self.silent_corruption,
            self.crash_degraded,
            self.rebuild,
        ]
    }

    fn from_flags(f: [bool; CLASS_COUNT]) -> Classes {
        Classes {
            member_failure: f[0],
            beyond_tolerance: f[1],
            crash: f[2],
            power_cut_mid_request: f[3],
            kill: f[4],
            restart: f[5],
            latency: f[6],
            stale_reattach: f[7],
            transient_errors: f[8],
            silent_corruption: f[9],
            crash_degraded: f[10],
            rebuild: f[11],
        }
    }

    /// Comma-separated class names ("all", "today" and "none" also accepted).
    pub fn parse(list: &str) -> Result<Classes, String> {
        match list.trim() {
            "all" => return Ok(Classes::all()),
            "today" => return Ok(Classes::engine_today()),
            "none" | "" => return Ok(Classes::none()),
            _ => {}
        }
        let mut flags = [false; CLASS_COUNT];
        for word in list.split(',').map(str::trim) {
            match CLASS_NAMES.iter().position(|n| *n == word) {
                Some(i) => flags[i] = true,
                None => {
                    return Err(format!(
                        "unknown fault class '{word}' (known: {})",
                        CLASS_NAMES.join(", ")
                    ))
                }
            }
        }
        Ok(Classes::from_flags(flags))
    }

    /// The names of the classes turned on, comma-separated.
    pub fn names(&self) -> String {
        CLASS_NAMES
            .iter()
            .zip(self.flags())
            .filter(|(_, on)| *on)
            .map(|(n, _)| *n)
            .collect::<Vec<_>>()
            .join(",")
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimConfig {
    /// Workload and fault steps per seed.
    pub ops: usize,
    pub classes: Classes,
    /// Treat hits of known, reported engine bugs as violations (otherwise they are counted and end the seed).
    pub strict: bool,
    /// Print every step.
    pub verbose: bool,
    /// Also send batches of requests at once from several threads (see `batch`): the workload and faults stay
    /// seeded, the interleaving does not, so such a seed replays its steps but not necessarily their outcome.
    pub concurrent: bool,
    /// Also make one blank member in three fail while it is rebuilt: a write of its rebuilt data, its final
    /// flush, or a write of its bitmap and log ring as it joins. Drawn from a stream of its own, so with this off
    /// every seed keeps the schedule it had before the option existed.
    pub failing_new_members: bool,
    /// Also make half of the single writes a commit stream: one or two pages at a time, each continuing the
    /// previous one or rewriting its last page (a database's log), often followed by a flush. This is what the
    /// partial parity log's stream entries serve (array/ppl/). Drawn from a stream of its own.
    pub commit_streams: bool,
    /// Also make a third of the single writes rewrite one of a few hot extents (a database's hot pages),
    /// which is what the stripe cache serves (array/stripe_cache.rs). Drawn from a stream of its own.
    pub hot_rewrites: bool,
    /// Give RAID5/6 arrays a partial parity log ring of little more than the two requests it must hold (a
    /// smaller metadata area: `create_io_with_data_offset`), so that the ring fills, retires and wraps within a
    /// seed's steps; the default ring is far larger than a seed's writes. A full ring hung every writer twice
    /// before this existed (stop 22). Drawn from a stream of its own.
    pub small_ring: bool,
    /// Pause member I/O batches at random, unseeded (`FaultyMembers::shake`): with `concurrent`, the threads
    /// of a batch and the background jobs meet in many more orders, so a rare race shows up in a few reruns.
    /// The steps stay seeded; only their timing is not.
    pub shake: bool,
    /// Draw each step from a stream of its own (seed and step number) instead of one stream for the whole seed.
    /// With `concurrent` the draws a step makes can depend on the interleaving (whether a dying member was
    /// evicted before a power loss decides whether re-assembly draws for offering it back), and with one stream
    /// every later step shifts; with this the steps stay the same from run to run, so rerunning a failure
    /// replays its schedule. Off by default: it gives every seed a different schedule from the one it had.
    pub steady_steps: bool,
}

impl SimConfig {
    /// What CI runs, and what a bare seed replays.
    pub fn ci() -> SimConfig {
        SimConfig {
            ops: 120,
            classes: Classes::engine_today(),
            strict: false,
            verbose: false,
            concurrent: false,
            failing_new_members: false,
            commit_streams: false,
            hot_rewrites: false,
            small_ring: false,
            shake: false,
            steady_steps: false,
        }
    }

    /// The CI configuration plus batches of concurrent requests.
    pub fn concurrent() -> SimConfig {
        SimConfig {
            concurrent: true,
            ..SimConfig::ci()
        }
    }

    /// The command lines that replay `seed` under this configuration.
    pub fn replay(&self, seed: u64) -> String {
        let default = SimConfig::ci();
        if self.ops == default.ops
            && self.classes == default.classes
            && self.strict == default.strict
            && !self.concurrent
            && !self.failing_new_members
            && !self.commit_streams
            && !self.hot_rewrites
            && !self.small_ring
            && !self.shake
            && !self.steady_steps
        {
            format!(
                "PARAID_SIM_SEED={seed} cargo test -p paraid-engine --profile release-test --test sim -- \
                 --nocapture   (or: cargo run --release -p paraid-engine --example sim -- --seed {seed} --verbose)"
            )
        } else {
            format!(
                "cargo run --release -p paraid-engine --example sim -- --seed {seed} --ops {} --classes \
                 {}{}{}{}{}{}{}{}{} --verbose{}",
                self.ops,
                self.classes.names(),
                if self.strict { " --strict" } else { "" },
                if self.commit_streams {
                    " --commit-streams"
                } else {
                    ""
                },
                if self.hot_rewrites {
                    " --hot-rewrites"
                } else {
                    ""
                },
                if self.failing_new_members {
                    " --failing-new-members"
                } else {
                    ""
                },
                if self.small_ring { " --small-ring" } else { "" },
                if self.concurrent { " --concurrent" } else { "" },
                if self.shake { " --shake" } else { "" },
                if self.steady_steps {
                    " --steady-steps"
                } else {
                    ""
                },
                if self.concurrent || self.shake {
                    "   (the interleaving is not seeded: rerun it until it fails)"
                } else {
                    ""
                }
            )
        }
    }
}

impl Default for SimConfig {
    fn default() -> SimConfig {
        SimConfig::ci()
    }
}

/// What one seed did.
#[derive(Debug, Clone, Default)]
pub struct SeedReport {
    pub level: Option<Level>,
    pub members: usize,
    pub chunk_bytes: u64,
    pub array_bytes: u64,
    pub reads: u64,
    pub writes: u64,
    pub flushes: u64,
    /// Background ticks run as steps (`Step::Tick`).
    pub ticks: u64,
    pub discards: u64,
    /// Array requests that failed while a fault made failure legitimate (beyond tolerance).
    pub request_errors: u64,
    /// Blocks compared with the model (reads, and full read-backs after crashes and restarts).
    pub blocks_verified: u64,
    pub crashes: u64,
    pub power_cuts_mid_request: u64,
    pub kills: u64,
    pub restarts: u64,
    pub member_failures: u64,
    pub admin_fails: u64,
    pub evictions: u64,
    pub members_removed: u64,
    pub beyond_tolerance: u64,
    pub beyond_tolerance_refusals: u64,
    pub stale_refusals: u64,
    pub re_adds: u64,
    /// Failed arrays started by `force` from the member that left last.
    pub forced: u64,
    pub transient_errors: u64,
    pub unretryable_read_errors: u64,
    pub rebuilds: u64,
    pub replacements: u64,
    /// Blank members that failed while they were rebuilt (`failing_new_members`): each rebuild aborted, the
    /// member kept out.
    pub new_member_failures: u64,
    /// Resyncs after an unclean stop, and the stripes they rewrote.
    pub resyncs: u64,
    pub resync_rewritten: u64,
    pub corruptions_planted: u64,
    pub corruptions_detected: u64,
    pub corruptions_repaired: u64,
    /// Member-image audits (parity and copies checked from raw bytes) and the stripes they covered.
    pub audits: u64,
    pub stripes_audited: u64,
    pub crash_writes_kept: u64,
    pub crash_writes_dropped: u64,
    pub crash_writes_torn: u64,
    /// Seeds ended by a known engine bug (a power cut inside a superblock update; see docs/reliability.md).
    pub known_bug_hits: u64,
    /// Blocks of missing members being written at a crash that came back as neither old nor new (the partial
    /// parity log's documented limit; a violation under `strict`).
    pub write_hole_limit_blocks: u64,
    /// Batches of concurrent requests, their requests, and the writes gathered (joined into another write's
    /// full-stripe write) and full stripes written by gathers meanwhile.
    pub batches: u64,
    pub batch_requests: u64,
    pub gathered_writes: u64,
    pub gathered_stripes: u64,
    /// Online checks and repairs of a consistent array beside a batch (each must find and rewrite nothing).
    pub online_checks: u64,
    /// Writes (stripes of) that rode a stream entry of the partial parity log, and stream entries extended ahead.
    pub log_rides: u64,
    pub log_stream_extensions: u64,
    /// Flushes of every member made because a log round found no room in the ring (to retire its records).
    pub log_ring_full_flushes: u64,
    /// Read-modify-write reads the stripe cache served and those that went to the members.
    pub stripe_cache_hits: u64,
    pub stripe_cache_misses: u64,
    pub faults: FaultCounts,
    pub virtual_delay: Duration,
    /// A digest of every step's trace line: two runs of one seed replay exactly when it matches.
    pub trace_digest: u64,
}

/// Sums over many seeds.
#[derive(Debug, Clone, Default)]
pub struct SimTotals {
    pub seeds: u64,
    pub by_level: [(u64, &'static str); 5],
    pub sum: SeedReport,
    pub violations: u64,
    pub failing_seeds: Vec<u64>,
    pub known_bug_seeds: Vec<u64>,
}

impl SimTotals {
    pub fn new() -> SimTotals {
        SimTotals {
            by_level: [
                (0, "raid0"),
                (0, "raid1"),
                (0, "raid5"),
                (0, "raid6"),
                (0, "raid10"),
            ],
            ..SimTotals::default()
        }
    }

    pub fn add(&mut self, seed: u64, r: &SeedReport) {
        self.seeds += 1;
        let at = match r.level {
            Some(Level::Raid0) => 0,
            Some(Level::Raid1) => 1,
            Some(Level::Raid5) => 2,
            Some(Level::Raid6) => 3,
            Some(Level::Raid10) => 4,
            None => return,
        };
        self.by_level[at].0 += 1;
        if r.known_bug_hits > 0 {
            self.known_bug_seeds.push(seed);
        }
        let s = &mut self.sum;
        s.reads += r.reads;
        s.writes += r.writes;
        s.flushes += r.flushes;
        s.ticks += r.ticks;
        s.discards += r.discards;
        s.request_errors += r.request_errors;
        s.blocks_verified += r.blocks_verified;
        s.crashes += r.crashes;
        s.power_cuts_mid_request += r.power_cuts_mid_request;
        s.kills += r.kills;
        s.restarts += r.restarts;
        s.member_failures += r.member_failures;
        s.admin_fails += r.admin_fails;
        s.evictions += r.evictions;
        s.members_removed += r.members_removed;
        s.beyond_tolerance += r.beyond_tolerance;
        s.beyond_tolerance_refusals += r.beyond_tolerance_refusals;
        s.stale_refusals += r.stale_refusals;
        s.re_adds += r.re_adds;
        s.forced += r.forced;
        s.transient_errors += r.transient_errors;
        s.unretryable_read_errors += r.unretryable_read_errors;
        s.rebuilds += r.rebuilds;
        s.replacements += r.replacements;
        s.new_member_failures += r.new_member_failures;
        s.resyncs += r.resyncs;
        s.resync_rewritten += r.resync_rewritten;
        s.corruptions_planted += r.corruptions_planted;
        s.corruptions_detected += r.corruptions_detected;
        s.corruptions_repaired += r.corruptions_repaired;
        s.audits += r.audits;
        s.stripes_audited += r.stripes_audited;
        s.crash_writes_kept += r.crash_writes_kept;
        s.crash_writes_dropped += r.crash_writes_dropped;
        s.crash_writes_torn += r.crash_writes_torn;
        s.known_bug_hits += r.known_bug_hits;
        s.write_hole_limit_blocks += r.write_hole_limit_blocks;
        s.batches += r.batches;
        s.batch_requests += r.batch_requests;
        s.gathered_writes += r.gathered_writes;
        s.gathered_stripes += r.gathered_stripes;
        s.online_checks += r.online_checks;
        s.log_rides += r.log_rides;
        s.log_stream_extensions += r.log_stream_extensions;
        s.log_ring_full_flushes += r.log_ring_full_flushes;
        s.stripe_cache_hits += r.stripe_cache_hits;
        s.stripe_cache_misses += r.stripe_cache_misses;
        s.faults += r.faults;
        s.virtual_delay += r.virtual_delay;
    }

    pub fn add_failure(&mut self, f: &SimFailure) {
        self.seeds += 1;
        self.violations += 1;
        self.failing_seeds.push(f.seed);
    }
}

impl fmt::Display for SimTotals {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = &self.sum;
        let levels: Vec<String> = self
            .by_level
            .iter()
            .map(|(n, name)| format!("{name} {n}"))
            .collect();
        writeln!(
            f,
            "seeds run          {} ({})",
            self.seeds,
            levels.join(", ")
        )?;
        writeln!(
            f,
            "requests           {} reads, {} writes, {} flushes, {} discards/write-zeroes; {} failed beyond tolerance; \
             {} background ticks",
            s.reads, s.writes, s.flushes, s.discards, s.request_errors, s.ticks
        )?;
        writeln!(f, "blocks verified    {}", s.blocks_verified)?;
        if s.batches > 0 {
            writeln!(
                f,
                "concurrency        {} batches of {} requests at once; {} writes gathered into {} full stripes; {} online \
                 checks/repairs beside requests found nothing",
                s.batches, s.batch_requests, s.gathered_writes, s.gathered_stripes, s.online_checks
            )?;
        }
        if s.stripe_cache_hits + s.stripe_cache_misses > 0 {
            writeln!(
                f,
                "stripe cache       {} read-modify-write reads served from the cache, {} from the members",
                s.stripe_cache_hits, s.stripe_cache_misses
            )?;
        }
        if s.log_rides > 0 || s.log_stream_extensions > 0 {
            writeln!(
                f,
                "log streams        {} stripe writes rode a stream entry, {} stream entries extended ahead",
                s.log_rides, s.log_stream_extensions
            )?;
        }
        if s.log_ring_full_flushes > 0 {
            writeln!(
                f,
                "log ring           full {} times (a flush of every member to retire records)",
                s.log_ring_full_flushes
            )?;
        }
        writeln!(
            f,
            "members            {} failures ({} by the admin), {} evictions, {} removed at restart, {} beyond tolerance \
             (assembly refused {}), {} stale members refused, {} re-added, {} failed arrays forced",
            s.member_failures,
            s.admin_fails,
            s.evictions,
            s.members_removed,
            s.beyond_tolerance,
            s.beyond_tolerance_refusals,
            s.stale_refusals,
            s.re_adds,
            s.forced
        )?;
        writeln!(
            f,
            "rebuilds           {} onto blank members, {} live replacements, {} new members failed while rebuilt",
            s.rebuilds, s.replacements, s.new_member_failures
        )?;
        writeln!(
            f,
            "power and process  {} power losses ({} mid-request), {} kills, {} clean restarts; unflushed writes kept {}, \
             dropped {}, torn {}; {} resyncs rewrote {} stripes",
            s.crashes,
            s.power_cuts_mid_request,
            s.kills,
            s.restarts,
            s.crash_writes_kept,
            s.crash_writes_dropped,
            s.crash_writes_torn,
            s.resyncs,
            s.resync_rewritten
        )?;
        writeln!(
            f,
            "I/O faults         {} failed member I/Os, {} transient errors, {} unretryable read errors, {} delayed I/Os \
             ({:.1} s virtual)",
            s.faults.failed,
            s.transient_errors,
            s.unretryable_read_errors,
            s.faults.delayed,
            s.virtual_delay.as_secs_f64()
        )?;
        writeln!(
            f,
            "silent corruption  {} planted, {} found by check, {} repaired",
            s.corruptions_planted, s.corruptions_detected, s.corruptions_repaired
        )?;
        writeln!(
            f,
            "member audits      {} ({} stripes checked with the reference)",
            s.audits, s.stripes_audited
        )?;
        writeln!(
            f,
            "write-hole limit   {} blocks of missing members, unflushed and being written at a crash, came back as \
             neither old nor new",
            s.write_hole_limit_blocks
        )?;
        writeln!(
            f,
            "known engine bugs  {} seeds ended by a power cut inside a superblock update{}",
            s.known_bug_hits,
            if self.known_bug_seeds.is_empty() {
                String::new()
            } else {
                format!(
                    " (seeds {:?})",
                    &self.known_bug_seeds[..self.known_bug_seeds.len().min(10)]
                )
            }
        )?;
        write!(
            f,
            "violations         {}{}",
            self.violations,
            if self.failing_seeds.is_empty() {
                String::new()
            } else {
                format!(
                    " (seeds {:?})",
                    &self.failing_seeds[..self.failing_seeds.len().min(20)]
                )
            }
        )
    }
}

/// A violation: what went wrong, where, and how to replay it.
#[derive(Debug, Clone)]
pub struct SimFailure {
    pub seed: u64,
    /// The step at which it was found.
    pub op: usize,
    pub what: String,
    pub geometry: String,
    /// The last steps before it.
    pub trace: Vec<String>,
    pub replay: String,
}

impl fmt::Display for SimFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // A hung seed or a panic knows neither its step nor its geometry: they are left out rather than shown empty.
        write!(f, "simulation seed {}", self.seed)?;
        if !self.geometry.is_empty() {
            write!(f, " failed at step {} ({})", self.op, self.geometry)?;
        }
        writeln!(f, ": {}", self.what)?;
        writeln!(f, "replay: {}", self.replay)?;
        if !self.trace.is_empty() {
            writeln!(f, "last steps:")?;
        }
        for line in &self.trace {
            writeln!(f, "  {line}")?;
        }
        Ok(())
    }
}

impl std::error::Error for SimFailure {}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    Write,
    Read,
    Flush,
    Discard,
    WriteZeroes,
    Crash,
    PowerCutMidRequest,
    Kill,
    Restart,
    FailMember,
    TransientError,
    Corrupt,
    Rebuild,
    Batch,
    CheckBesideBatch,
    Tick,
}

const TRACE_LINES: usize = 40;
/// How long a background job (rebuild, resync, check) may take in the simulator before it counts as hung.
const JOB_TIMEOUT: Duration = Duration::from_secs(120);
/// Where the streams of `steady_steps` start (one per step; far from the other streams' numbers).
const STEADY_STEP_STREAMS: u64 = 0x57EA_D000_0000;
/// The longest pause `--shake` puts before a member I/O batch: long enough for another thread to run a whole
/// request meanwhile, short enough that a seed still takes seconds.
const SHAKE_LONGEST: Duration = Duration::from_micros(300);

type Io = FaultyMembers<CrashMembers>;

/// The simulator's member stack over `members`: the fault injector seeded with `seed`, shaken if `cfg` says so.
fn member_stack(members: CrashMembers, seed: u64, cfg: &SimConfig) -> Arc<Io> {
    let io = Arc::new(FaultyMembers::new(members, seed));
    if cfg.shake {
        io.shake(SHAKE_LONGEST);
    }
    io
}

/// The hot extents of a seed (`hot_rewrites`): four runs of one to three pages (first page, pages), anywhere in an
/// array of `array_bytes`.
fn hot_extents(seed: u64, array_bytes: u64) -> Vec<(u64, u64)> {
    let pages_in_array = array_bytes / PAGE_BYTES;
    let mut fixed = SplitMix64::derive(seed, 0x4077);
    (0..4)
        .map(|_| {
            let pages = fixed.range(1, 3).min(pages_in_array);
            (fixed.below(pages_in_array - pages + 1), pages)
        })
        .collect()
}

struct Run<'a> {
    seed: u64,
    cfg: &'a SimConfig,
    rng: SplitMix64,
    /// The draws of `failing_new_members`, apart from `rng` so that the option leaves other schedules alone.
    join_rng: SplitMix64,
    /// The draws of `commit_streams`, and where the stream's next write goes (array bytes).
    stream_rng: SplitMix64,
    stream_at: u64,
    /// The stripe cache budget of every assembly of this seed.
    stripe_cache_bytes: usize,
    /// The log rounds written at the same time, every assembly of this seed (one, as on drives, or four, as on
    /// members in memory).
    log_rounds: usize,
    /// The draws of `hot_rewrites`, and its hot extents (first page, pages), fixed by the seed.
    hot_rng: SplitMix64,
    hot_extents: Vec<(u64, u64)>,
    g: Geometry,
    data_offset_bytes: u64,
    member_bytes: u64,
    io: Arc<Io>,
    array: Option<Array>,
    model: BlockModel,
    /// Slots that failed (an I/O failure rule, an eviction, or the admin): they leave at the next restart unless
    /// rebuilt first.
    failed: Vec<bool>,
    /// Slots the engine marked faulty (counted once per assembly).
    evicted: Vec<bool>,
    /// The failure rule of each slot, to lift once its member is replaced.
    fail_rules: Vec<Option<RuleId>>,
    /// Slots absent from the array.
    gone: Vec<bool>,
    /// What a removed member held, and whether the others' event counters have moved past it (then it is stale).
    stale: Vec<Option<Vec<u8>>>,
    stale_behind: Vec<bool>,
    /// More members failed than the level survives.
    beyond: bool,
    /// A page that fails reads even after a retry is pending (until the next re-assembly).
    lse_armed: bool,
    /// Transient faults armed: the rule, how many failures it injects before it is spent (a rule of an earlier
    /// member stack is gone, hence spent), and the slot it targets.
    transient_armed: Vec<(RuleId, u64, usize)>,
    dead: bool,
    latency_slot: usize,
    latency_ms: u64,
    step: usize,
    trace: VecDeque<String>,
    digest: u64,
    report: SeedReport,
}

fn reference() -> Arc<dyn paraid_parity::Backend> {
    Arc::new(paraid_parity::reference::Reference)
}

/// Runs one seed under `cfg`.
pub fn run_seed(seed: u64, cfg: &SimConfig) -> Result<SeedReport, SimFailure> {
    let mut rng = SplitMix64::derive(seed, 0x5EED);
    let level = *rng.pick(&[
        Level::Raid0,
        Level::Raid1,
        Level::Raid5,
        Level::Raid5,
        Level::Raid5,
        Level::Raid6,
        Level::Raid6,
        Level::Raid6,
        Level::Raid10,
        Level::Raid10,
    ]);
    let members = match level {
        Level::Raid0 => rng.range(2, 5),
        Level::Raid1 => rng.range(2, 4),
        Level::Raid5 => rng.range(3, 8),
        Level::Raid6 => rng.range(4, 9),
        Level::Raid10 => rng.range(2, 6),
    } as usize;
    let chunk_bytes = *rng.pick(&[4096u64, 8192, 16384, 65536]);
    let rows = rng.range(2, ((256 << 10) / chunk_bytes).clamp(2, 24));
    let data_offset_bytes = if cfg.small_ring && level.has_parity() {
        // The smallest ring the log works with, plus up to two requests more. The setup checks that the log is on.
        let one_request = crate::array::one_request_pages(level, chunk_bytes);
        let extra = *SplitMix64::derive(seed, 0x5121).pick(&[0, 1, one_request, 2 * one_request]);
        crate::small_ring_data_offset_bytes(level, chunk_bytes, extra)
    } else {
        DEFAULT_DATA_OFFSET_BYTES
    };
    let member_bytes = data_offset_bytes + rows * chunk_bytes;
    let geometry_text = format!(
        "{level}, {members} members, chunk {chunk_bytes} B, {rows} rows{}",
        if data_offset_bytes == DEFAULT_DATA_OFFSET_BYTES {
            String::new()
        } else {
            format!(", data offset {data_offset_bytes} B")
        }
    );

    let setup_failure = |what: String| SimFailure {
        seed,
        op: 0,
        what,
        geometry: geometry_text.clone(),
        trace: Vec::new(),
        replay: cfg.replay(seed),
    };
    let io = member_stack(
        CrashMembers::new(members, member_bytes),
        SplitMix64::derive(seed, 1).next_u64(),
        cfg,
    );
    create_io_with_data_offset(io.as_ref(), level, chunk_bytes, "sim", data_offset_bytes)
        .map_err(|e| setup_failure(format!("create: {e}")))?;
    // The stripe cache: off, so small that it evicts all the time, or the default (drawn from a stream of its
    // own, so that the other draws of a seed stay what they were).
    let stripe_cache_bytes = *SplitMix64::derive(seed, 0xCAC4E).pick(&[
        0,
        128 << 10,
        crate::array::DEFAULT_STRIPE_CACHE_BYTES,
    ]);
    // Log rounds in flight: one or four (a stream of its own, like the cache's).
    let log_rounds = *SplitMix64::derive(seed, 0x40D5).pick(&[1usize, 4]);
    let options = AssembleOptions {
        stripe_cache_bytes: Some(stripe_cache_bytes),
        log_rounds_in_flight: Some(log_rounds),
        ..AssembleOptions::new(reference())
    };
    let array = assemble_io(io.clone(), options)
        .map_err(|e| setup_failure(format!("first assembly: {e}")))?;
    if data_offset_bytes != DEFAULT_DATA_OFFSET_BYTES && !array.integrity().log_enabled {
        return Err(setup_failure(format!(
            "a data offset of {data_offset_bytes} B left no partial parity log"
        )));
    }
    let g = array.geometry();
    let mut run = Run {
        seed,
        cfg,
        g,
        data_offset_bytes: array.data_offset_bytes(),
        member_bytes,
        io,
        model: BlockModel::new(array.size_bytes()),
        array: Some(array),
        failed: vec![false; members],
        evicted: vec![false; members],
        fail_rules: vec![None; members],
        gone: vec![false; members],
        stale: vec![None; members],
        stale_behind: vec![false; members],
        beyond: false,
        lse_armed: false,
        transient_armed: Vec::new(),
        dead: false,
        latency_slot: rng.below(members as u64) as usize,
        latency_ms: rng.range(1, 200),
        step: 0,
        trace: VecDeque::new(),
        digest: 0,
        report: SeedReport {
            level: Some(level),
            members,
            chunk_bytes,
            array_bytes: g.array_bytes(),
            ..SeedReport::default()
        },
        rng,
        join_rng: SplitMix64::derive(seed, 0x901E),
        stream_rng: SplitMix64::derive(seed, 0x57EA),
        stream_at: 0,
        stripe_cache_bytes,
        log_rounds,
        hot_rng: SplitMix64::derive(seed, 0x407),
        hot_extents: hot_extents(seed, g.array_bytes()),
    };
    run.note(format!(
        "start: {geometry_text}, array {} bytes, stripe cache {stripe_cache_bytes} bytes, {log_rounds} log \
         round(s) in flight",
        g.array_bytes()
    ));
    run.after_assembly();
    run.main_loop()
        .map_err(|what| run.failure(what, &geometry_text))?;
    run.note_log_streams();
    let faults = run.io.counts();
    run.report.faults += faults;
    run.report.virtual_delay += run.io.virtual_delay();
    run.report.trace_digest = run.digest;
    Ok(run.report)
}

impl Run<'_> {
    fn note(&mut self, line: String) {
        let line = format!("step {}: {line}", self.step);
        if self.cfg.verbose {
            println!("{line}");
        }
        self.digest = model::hash(line.as_bytes()) ^ self.digest.rotate_left(5);
        if self.trace.len() == TRACE_LINES {
            self.trace.pop_front();
        }
        self.trace.push_back(line);
    }

    fn failure(&self, what: String, geometry: &str) -> SimFailure {
        SimFailure {
            seed: self.seed,
            op: self.step,
            what,
            geometry: geometry.to_string(),
            trace: self.trace.iter().cloned().collect(),
            replay: self.cfg.replay(self.seed),
        }
    }

    fn array(&self) -> &Array {
        self.array
            .as_ref()
            .expect("the array runs between restarts")
    }

    /// Slots that are failed or gone.
    fn missing(&self) -> Vec<bool> {
        self.failed
            .iter()
            .zip(&self.gone)
            .map(|(f, g)| *f || *g)
            .collect()
    }

    /// Whether one more erasure (a latent sector error) could take some data beyond recovery.
    fn redundancy_exhausted(&self) -> bool {
        let missing = self.missing();
        (0..self.g.members).any(|s| {
            let mut more = missing.clone();
            more[s] = true;
            !missing[s] && !self.g.survives(&more)
        })
    }

    fn degraded(&self) -> bool {
        self.missing().iter().any(|m| *m)
    }

    /// Notes evictions the engine made on its own (a member past the error threshold) and whether the array is
    /// still within tolerance.
    fn sync_slot_states(&mut self) {
        let Some(array) = self.array.as_ref() else {
            return;
        };
        let mut newly = Vec::new();
        for slot in 0..self.g.members {
            if !self.gone[slot]
                && array.slot_state(slot) == SlotState::Faulty
                && !self.evicted[slot]
            {
                newly.push(slot);
            }
        }
        for slot in newly {
            self.evicted[slot] = true;
            self.report.evictions += 1;
            if !self.failed[slot] {
                self.failed[slot] = true;
                self.note(format!(
                    "member {slot} was evicted by the engine on its own"
                ));
            }
        }
        if !self.g.survives(&self.missing()) && !self.beyond {
            self.beyond = true;
            self.report.beyond_tolerance += 1;
            self.note("beyond tolerance".to_string());
        }
    }

    fn request_failed(&mut self, what: &str, err: &EngineError) -> Result<(), String> {
        self.note(format!("{what} failed: {err}"));
        self.sync_slot_states();
        // A failure is expected beyond the level's tolerance, or where a pending unreadable page meets an array
        // that one more erasure would take past recovery.
        let excused = self.beyond || (self.lse_armed && self.redundancy_exhausted());
        if !excused {
            return Err(format!("{what} failed within the level's tolerance: {err}"));
        }
        self.report.request_errors += 1;
        Ok(())
    }

    /// After every assembly: the latency rule on the fresh member stack, and the background tick off (it runs on
    /// the wall clock: bitmap clearing, log retirement, flushes), so that a seed replays exactly; `Step::Tick`
    /// runs it where the seed says, with bitmap clearing pushed out (it goes by idle time).
    fn after_assembly(&mut self) {
        if let Some(array) = self.array.as_ref() {
            array.set_integrity_tick(false);
            array.set_bitmap_idle_clear(Duration::from_secs(3600));
        }
        self.fail_rules = vec![None; self.g.members];
        self.evicted = vec![false; self.g.members];
        if self.cfg.classes.latency && !self.gone[self.latency_slot] {
            self.io.add(
                Scope::slot(self.latency_slot),
                Fault::Delay {
                    delay: Duration::from_millis(self.latency_ms),
                    one_in: 8,
                    sleep: false,
                },
            );
        }
    }

    /// Waits for background jobs (resync, rebuild, check); a job that does not end is a violation.
    fn wait_jobs(&mut self, what: &str) -> Result<(), String> {
        if self.array().wait_idle(JOB_TIMEOUT) {
            Ok(())
        } else {
            Err(format!(
                "{what}: a background job did not finish within {} s: {:?}",
                JOB_TIMEOUT.as_secs(),
                self.array().progress()
            ))
        }
    }

    /// A random request extent of the array (see `random_extent`).
    fn extent(&mut self) -> (u64, usize) {
        random_extent(
            &mut self.rng,
            self.model.array_bytes(),
            self.g.stripe_bytes(),
        )
    }

    fn pick_step(&mut self) -> Step {
        let c = self.cfg.classes;
        let table: [(Step, u64, bool); 16] = [
            (Step::Write, 30, true),
            (Step::Read, 30, true),
            (Step::Flush, 6, true),
            (Step::Discard, 3, true),
            (Step::WriteZeroes, 3, true),
            (Step::Crash, 2, c.crash),
            (Step::PowerCutMidRequest, 2, c.power_cut_mid_request),
            (Step::Kill, 2, c.kill),
            (Step::Restart, 2, c.restart),
            (Step::FailMember, 3, c.member_failure),
            (Step::TransientError, 2, c.transient_errors),
            (Step::Corrupt, 2, c.silent_corruption),
            (Step::Rebuild, 3, c.rebuild),
            (Step::Batch, 12, self.cfg.concurrent),
            (Step::CheckBesideBatch, 2, self.cfg.concurrent),
            (Step::Tick, 2, true),
        ];
        let total: u64 = table.iter().filter(|t| t.2).map(|t| t.1).sum();
        let mut pick = self.rng.below(total);
        for (step, weight, on) in table {
            if !on {
                continue;
            }
            if pick < weight {
                return step;
            }
            pick -= weight;
        }
        unreachable!("the pick falls inside the table")
    }

    fn main_loop(&mut self) -> Result<(), String> {
        for step in 0..self.cfg.ops {
            self.step = step + 1;
            if self.cfg.steady_steps {
                self.rng = SplitMix64::derive(self.seed, STEADY_STEP_STREAMS + step as u64);
            }
            if self.dead {
                break;
            }
            match self.pick_step() {
                Step::Write => self.write()?,
                Step::Read => self.read()?,
                Step::Flush => self.flush()?,
                Step::Discard => self.discard(false)?,
                Step::WriteZeroes => self.discard(true)?,
                Step::Crash => self.crash(false)?,
                Step::PowerCutMidRequest => self.crash(true)?,
                Step::Kill => self.kill()?,
                Step::Restart => self.restart()?,
                Step::FailMember => self.fail_member()?,
                Step::TransientError => self.transient_error(),
                Step::Corrupt => self.corrupt()?,
                Step::Rebuild => self.rebuild()?,
                Step::Batch => self.batch()?,
                Step::CheckBesideBatch => self.check_beside_batch()?,
                Step::Tick => self.tick()?,
            }
        }
        if !self.dead {
            self.step += 1;
            self.note("final restart and audit".to_string());
            self.restart()?;
        }
        Ok(())
    }

    /// The next write of the commit stream (`commit_streams`): one or two pages, continuing the last one or (one
    /// time in four) rewriting its last page; now and then the stream starts over somewhere else.
    fn stream_extent(&mut self) -> (u64, usize) {
        let page = PAGE_BYTES;
        let array_bytes = self.model.array_bytes();
        let pages = self.stream_rng.range(1, 2);
        if self.stream_at == 0 || self.stream_rng.one_in(16) {
            self.stream_at = self.stream_rng.below(array_bytes / page) * page;
        } else if self.stream_rng.one_in(4) {
            self.stream_at = self.stream_at.saturating_sub(page);
        }
        if self.stream_at + pages * page > array_bytes {
            self.stream_at = 0;
        }
        let offset = self.stream_at;
        self.stream_at += pages * page;
        (offset, (pages * page) as usize)
    }

    /// The next hot rewrite (`hot_rewrites`): one of the seed's hot extents, whole or one page of it.
    fn hot_extent(&mut self) -> (u64, usize) {
        let page = PAGE_BYTES;
        let (first, pages) = *self.hot_rng.pick(&self.hot_extents);
        if pages > 1 && self.hot_rng.one_in(2) {
            let one = first + self.hot_rng.below(pages);
            (one * page, page as usize)
        } else {
            (first * page, (pages * page) as usize)
        }
    }

    fn write(&mut self) -> Result<(), String> {
        let streamed = self.cfg.commit_streams && self.stream_rng.one_in(2);
        let hot = !streamed && self.cfg.hot_rewrites && self.hot_rng.one_in(3);
        let (offset, len) = if streamed {
            self.stream_extent()
        } else if hot {
            self.hot_extent()
        } else {
            self.extent()
        };
        // Page-aligned like a frontend's buffers: where the extent starts on a page, whole chunks go out from it
        // directly (write.rs), elsewhere through scratch, so both paths run.
        let mut buf = crate::buf::AlignedBuf::zeroed(len);
        self.rng.fill(&mut buf[..len]);
        let data = &buf[..len];
        let fua = self.rng.one_in(4);
        self.report.writes += 1;
        match self.array().write(offset, data, fua) {
            Ok(()) => {
                self.note(format!("write {offset}+{len} fua={fua}: ok"));
                self.model
                    .write(offset, data, WriteOutcome::Acked { durable: fua });
            }
            Err(e) => {
                self.request_failed(&format!("write {offset}+{len}"), &e)?;
                self.model.write(offset, data, WriteOutcome::Failed);
            }
        }
        self.sync_slot_states();
        if streamed && self.stream_rng.one_in(2) {
            self.flush()?; // the commit
        }
        Ok(())
    }

    fn read(&mut self) -> Result<(), String> {
        let (offset, len) = self.extent();
        let mut got = vec![0u8; len];
        self.report.reads += 1;
        match self.array().read(offset, &mut got) {
            Ok(()) => {
                let blocks = self
                    .model
                    .check_read(offset, &got)
                    .map_err(|m| format!("read {offset}+{len} returned wrong data: {m}"))?;
                self.report.blocks_verified += blocks;
                self.note(format!("read {offset}+{len}: {blocks} blocks verified"));
            }
            Err(e) => self.request_failed(&format!("read {offset}+{len}"), &e)?,
        }
        self.sync_slot_states();
        Ok(())
    }

    fn flush(&mut self) -> Result<(), String> {
        self.report.flushes += 1;
        match self.array().flush() {
            Ok(()) => {
                self.note("flush: ok".to_string());
                self.model.flushed();
            }
            Err(e) => self.request_failed("flush", &e)?,
        }
        self.sync_slot_states();
        Ok(())
    }

    /// The background tick, run here instead of by the clock: it may flush every member (the log holding chunks
    /// not yet durable), and a flush that completed makes what was written before it durable, as a client's does.
    fn tick(&mut self) -> Result<(), String> {
        self.report.ticks += 1;
        let flushes_before = self.array().integrity().log_tick_flushes;
        match self.array().run_integrity_tick() {
            Ok(()) => {
                let flushed = self.array().integrity().log_tick_flushes > flushes_before;
                self.note(format!(
                    "tick: ok{}",
                    if flushed { ", flushed" } else { "" }
                ));
                if flushed {
                    self.model.flushed();
                }
            }
            // In service a failed tick is a warning in the log, not a failed request: what it did or did not
            // do is judged by the audits like everything else (a flush counted only if it completed).
            Err(e) => self.note(format!("tick failed: {e}")),
        }
        self.sync_slot_states();
        Ok(())
    }

    fn discard(&mut self, zeroes: bool) -> Result<(), String> {
        let (offset, len) = self.extent();
        let fua = zeroes && self.rng.one_in(3);
        self.report.discards += 1;
        let result = if zeroes {
            self.array().write_zeroes(offset, len as u64, fua)
        } else {
            self.array().discard(offset, len as u64)
        };
        let what = format!(
            "{} {offset}+{len}{}",
            if zeroes { "write-zeroes" } else { "discard" },
            if fua { " fua" } else { "" }
        );
        let zeros = vec![0u8; len];
        match result {
            Ok(()) => {
                self.note(format!("{what}: ok"));
                self.model
                    .write(offset, &zeros, WriteOutcome::Acked { durable: fua });
            }
            Err(e) => {
                self.request_failed(&what, &e)?;
                self.model.write(offset, &zeros, WriteOutcome::Failed);
            }
        }
        self.sync_slot_states();
        Ok(())
    }

    /// Whether losing power now is a case the configuration leaves out (a degraded array).
    fn crash_left_out(&self) -> bool {
        self.g.level != Level::Raid0 && self.degraded() && !self.cfg.classes.crash_degraded
    }

    /// Starts a write that the power (or the process) will cut after `cut_after` member writes; returns whether
    /// it was cut short.
    fn write_cut_short(&mut self, cut_after: u64, fua: bool) -> bool {
        self.io.inner().cut_power_after_writes(cut_after);
        let (offset, len) = self.extent();
        // Page-aligned like a frontend's buffers: where the extent starts on a page, whole chunks go out from it
        // directly (write.rs), elsewhere through scratch, so both paths run.
        let mut buf = crate::buf::AlignedBuf::zeroed(len);
        self.rng.fill(&mut buf[..len]);
        let data = &buf[..len];
        self.report.writes += 1;
        match self.array().write(offset, data, fua) {
            Ok(()) => {
                self.note(format!(
                    "write {offset}+{len} fua={fua} completed before the cut after {cut_after} member writes"
                ));
                self.model
                    .write(offset, data, WriteOutcome::Acked { durable: fua });
                false
            }
            Err(e) => {
                self.note(format!(
                    "write {offset}+{len} fua={fua} cut after {cut_after} member writes: {e}"
                ));
                self.model.write(offset, data, WriteOutcome::Failed);
                true
            }
        }
    }

    /// Power loss, now or between two member writes of a write request.
    fn crash(&mut self, mid_request: bool) -> Result<(), String> {
        if self.crash_left_out() {
            self.note("power loss left out: degraded array".into());
            return Ok(());
        }
        // What the engine decided while the power was on; whatever it does with the I/O errors of the power cut
        // never reaches the members.
        self.note_evictions_before_drop();
        let mut interrupted = false;
        if mid_request {
            let cut_after = self.rng.below(2 * self.g.members as u64 + 2);
            let fua = self.rng.one_in(4);
            interrupted = if self.cfg.concurrent && self.rng.one_in(2) {
                self.batch_cut_short(4 * cut_after)?
            } else {
                self.write_cut_short(cut_after, fua)
            };
            if interrupted {
                self.report.power_cuts_mid_request += 1;
            }
        }
        self.io.inner().cut_power();
        self.report.crashes += 1;
        let crash_seed = self.rng.next_u64();
        let r = self.io.inner().crash(crash_seed, CrashPolicy::Random);
        self.report.crash_writes_kept += r.writes_kept;
        self.report.crash_writes_dropped += r.writes_dropped;
        self.report.crash_writes_torn += r.writes_torn;
        self.note(format!(
            "power loss: {} unflushed writes kept, {} dropped, {} torn",
            r.writes_kept, r.writes_dropped, r.writes_torn
        ));
        self.reassemble(r.images, interrupted)
    }

    /// The process dies between requests, or (half the time) in the middle of one: every completed member write
    /// survives.
    fn kill(&mut self) -> Result<(), String> {
        self.note_evictions_before_drop();
        let mut interrupted = false;
        if self.crash_left_out() {
            self.note("kill left out: degraded array".into());
            return Ok(());
        }
        if self.rng.one_in(2) {
            let cut_after = self.rng.below(2 * self.g.members as u64 + 2);
            interrupted = if self.cfg.concurrent && self.rng.one_in(2) {
                self.batch_cut_short(4 * cut_after)?
            } else {
                self.write_cut_short(cut_after, false)
            };
        } else {
            self.note("kill between requests".to_string());
        }
        self.io.inner().cut_power();
        self.report.kills += 1;
        // Completed writes sit in the kernel's cache: all of them survive the process.
        let r = self.io.inner().crash(0, CrashPolicy::KeepAll);
        self.reassemble(r.images, interrupted)
    }

    /// Clean stop (a kill if the stop fails) and re-assembly.
    /// Adds the log's stream figures of the running array to the report (before it is dropped).
    fn note_log_streams(&mut self) {
        if let Some(array) = self.array.as_ref() {
            let log = array.integrity();
            self.report.log_rides += log.log_rides;
            self.report.log_stream_extensions += log.log_stream_extensions;
            self.report.log_ring_full_flushes += log.log_retire_flushes;
            let cache = array.detail().stripe_cache;
            self.report.stripe_cache_hits += cache.hits;
            self.report.stripe_cache_misses += cache.misses;
        }
    }

    fn restart(&mut self) -> Result<(), String> {
        self.note_evictions_before_drop();
        self.note_log_streams();
        let array = self.array.take().expect("the array runs between restarts");
        match array.stop() {
            Ok(_) => {
                self.model.flushed();
                self.report.restarts += 1;
                self.note("clean stop".to_string());
                let images = self.io.inner().images();
                self.reassemble(images, false)
            }
            Err(e) => {
                if !self.beyond {
                    return Err(format!("stop failed within the level's tolerance: {e}"));
                }
                self.note(format!(
                    "stop failed ({e}): restarting from what the members hold"
                ));
                self.io.inner().cut_power();
                self.report.kills += 1;
                let r = self.io.inner().crash(0, CrashPolicy::KeepAll);
                self.reassemble(r.images, false)
            }
        }
    }

    /// Members the engine evicted carry an older event count than the others from then on.
    fn note_evictions_before_drop(&mut self) {
        self.sync_slot_states();
        if let Some(array) = self.array.as_ref() {
            for slot in 0..self.g.members {
                if !self.gone[slot] && array.slot_state(slot) == SlotState::Faulty {
                    self.stale_behind[slot] = true;
                }
            }
        }
    }

    /// Brings the array back from `images` after a crash, kill or stop: failed members are left out (the admin
    /// pulled them), a stale member is offered first (refused, or re-added), then the whole array is read back
    /// before and after the background resync, and the members audited.
    fn reassemble(
        &mut self,
        mut images: Vec<Option<Vec<u8>>>,
        cut_mid_request: bool,
    ) -> Result<(), String> {
        self.note_log_streams();
        self.array = None;
        self.lse_armed = false;
        self.report.faults += self.io.counts();
        self.report.virtual_delay += self.io.virtual_delay();
        images.truncate(self.g.members);
        for (slot, image) in images.iter_mut().enumerate() {
            if self.failed[slot] {
                self.stale[slot] = image.take();
                self.failed[slot] = false;
                self.gone[slot] = true;
                self.report.members_removed += 1;
            } else if self.gone[slot] {
                *image = None;
            }
        }
        self.beyond = false;

        let mut opts = AssembleOptions {
            stripe_cache_bytes: Some(self.stripe_cache_bytes),
            log_rounds_in_flight: Some(self.log_rounds),
            ..AssembleOptions::new(reference())
        };
        if self.cfg.classes.stale_reattach {
            let candidates: Vec<usize> = (0..self.g.members)
                .filter(|s| self.stale_behind[*s] && self.stale[*s].is_some())
                .collect();
            // Staleness shows only next to a newer member: alone, an old member is all the array there is.
            let newer_present = images.iter().any(|i| i.is_some());
            if !candidates.is_empty() && newer_present && self.rng.one_in(2) {
                let slot = *self.rng.pick(&candidates);
                let mut with_stale = images.clone();
                with_stale[slot] = self.stale[slot].clone();
                // A re-added member is a rebuild target, not a source: only where the array runs without it.
                if self.cfg.classes.rebuild && self.g.survives(&self.gone) && self.rng.one_in(2) {
                    // Re-add: the stale member comes back as a rebuild target in its slot.
                    opts.re_add = true;
                    images = with_stale;
                    self.gone[slot] = false;
                    self.stale[slot] = None;
                    self.stale_behind[slot] = false;
                    self.report.re_adds += 1;
                    self.note(format!("stale member {slot} re-added"));
                } else {
                    let members = Arc::new(CrashMembers::from_images(with_stale.clone()));
                    let label = std::path::PathBuf::from(members.label(slot));
                    let attempt = assemble_io(
                        members,
                        AssembleOptions {
                            stripe_cache_bytes: Some(self.stripe_cache_bytes),
                            log_rounds_in_flight: Some(self.log_rounds),
                            ..AssembleOptions::new(reference())
                        },
                    );
                    match attempt {
                        Err(EngineError::TrustStaleMember { slot: named, .. }) if named == slot => {
                            self.report.stale_refusals += 1;
                            self.note(format!("stale member {slot} offered back: refused"));
                        }
                        // The array failed when it left: refused too, naming it as what `force` would trust.
                        Err(EngineError::AssembleFailedArray {
                            force_would_trust, ..
                        }) if force_would_trust.contains(&label) => {
                            self.report.stale_refusals += 1;
                            self.note(format!(
                                "stale member {slot} offered back: refused (the array failed when it left; force \
                                 would trust it)"
                            ));
                            if self.rng.one_in(2) {
                                // The operator's `serve --force`: the member that left last is trusted again.
                                opts.force = true;
                                images = with_stale;
                                self.gone[slot] = false;
                                self.stale[slot] = None;
                                self.stale_behind[slot] = false;
                                self.report.forced += 1;
                                self.note(format!("stale member {slot} trusted by force"));
                            }
                        }
                        Err(e) => {
                            return Err(format!(
                                "stale member {slot} offered back: expected a refusal naming it, got: {e}"
                            ))
                        }
                        Ok(_) => {
                            return Err(format!(
                                "stale member {slot} (behind the others) was trusted"
                            ))
                        }
                    }
                }
            }
        }

        let seed = SplitMix64::derive(
            self.seed,
            2 + self.report.restarts + self.report.crashes + self.report.kills,
        )
        .next_u64();
        self.io = member_stack(CrashMembers::from_images(images), seed, self.cfg);
        let survives = self.g.survives(&self.gone);
        match assemble_io(self.io.clone(), opts) {
            Ok(array) => {
                if !survives {
                    return Err(format!(
                        "assembly accepted an array missing slots {:?}, beyond what {} survives",
                        self.gone_slots(),
                        self.g.level
                    ));
                }
                self.array = Some(array);
            }
            Err(e) => {
                if survives {
                    if let EngineError::TrustStaleMember {
                        events,
                        newest_events,
                        ..
                    } = &e
                    {
                        if cut_mid_request && events + 1 == *newest_events && !self.cfg.strict {
                            // Known engine bug: a power cut inside a superblock update leaves members one event
                            // apart, and assembly refuses the older ones. Counted; the seed ends here.
                            self.report.known_bug_hits += 1;
                            self.note(format!("known engine bug (torn superblock update): {e}"));
                            self.dead = true;
                            return Ok(());
                        }
                    }
                    return Err(format!("re-assembly failed: {e}"));
                }
                // Refused, as it must be: AssembleDegraded naming the missing slots, or (every member gone)
                // "no members present".
                self.report.beyond_tolerance_refusals += 1;
                self.note(format!("re-assembly refused beyond tolerance: {e}"));
                self.dead = true;
                return Ok(());
            }
        }
        for slot in 0..self.g.members {
            if self.gone[slot] {
                self.stale_behind[slot] = true;
            }
        }
        self.after_assembly();

        // A dirty array resyncs (and a re-added member rebuilds) in the background. The simulator waits for it
        // before reading: a read running beside the job would interleave member I/O with it, and the seed would no
        // longer replay exactly (row 4's resync test checks that reads before and after a resync agree). With
        // concurrent batches, half the time the read-back and a batch run beside the job instead.
        let beside_jobs = self.cfg.concurrent && self.rng.one_in(2);
        if !beside_jobs {
            self.settle_jobs_after_assembly()?;
        }
        let mut all = vec![0u8; self.model.array_bytes() as usize];
        self.array()
            .read(0, &mut all)
            .map_err(|e| format!("reading the whole array back after re-assembly failed: {e}"))?;
        // Blocks of a parity array's missing members that a write was changing at the crash may come back as
        // neither old nor new: the partial parity log protects the rest of the stripe, not the missing chunk being
        // written (docs/reliability.md). Unless strict, such blocks are counted, not failed.
        let g = self.g;
        let gone = self.gone.clone();
        let forgive =
            move |block: u64| g.level.has_parity() && gone[g.map(block * PAGE_BYTES, 0).member];
        let checked = if self.cfg.strict {
            self.model.check_after_crash(&all).map(|b| (b, 0))
        } else {
            self.model.check_after_crash_forgiving(&all, forgive)
        };
        let blocks = match checked {
            Ok((blocks, forgiven)) => {
                if forgiven > 0 {
                    self.report.write_hole_limit_blocks += forgiven;
                    self.note(format!(
                        "{forgiven} blocks of missing members, written at the crash, came back as neither old nor new \
                         (partial parity log limit)"
                    ));
                }
                blocks
            }
            Err(m) => {
                return Err(format!(
                    "after re-assembly (missing {:?}): {m}; {}",
                    self.gone_slots(),
                    self.diagnose(m.block)
                ))
            }
        };
        self.report.blocks_verified += blocks;
        self.note(format!(
            "re-assembled without {:?}: {blocks} blocks verified{}",
            self.gone_slots(),
            if beside_jobs {
                " (beside the background jobs)"
            } else {
                ""
            }
        ));
        if beside_jobs {
            self.batch()?;
            self.settle_jobs_after_assembly()?;
        }
        self.audit("after re-assembly")
    }

    /// Waits for the background jobs an assembly started (resync, rebuild of a re-added member) and counts them;
    /// one that neither completed nor yielded to a rebuild is a violation.
    fn settle_jobs_after_assembly(&mut self) -> Result<(), String> {
        self.wait_jobs("after re-assembly")?;
        if let Some(done) = self.array().last_result() {
            match done.kind {
                "resync" => {
                    self.report.resyncs += 1;
                    self.report.resync_rewritten += done.repaired;
                }
                "rebuild" => self.report.rebuilds += 1,
                _ => {}
            }
            // A resync yields to a rebuild ("interrupted"); whether the stripes end consistent is what the audit
            // below checks.
            let yielded = done.kind == "resync" && done.outcome.as_deref() == Some("interrupted");
            if done.outcome.as_deref() != Some("completed") && !yielded {
                return Err(format!(
                    "background {} after re-assembly: {done:?}",
                    done.kind
                ));
            }
        }
        Ok(())
    }

    /// Where a block lives and what its stripe looks like on the members, for a violation message.
    fn diagnose(&self, block: u64) -> String {
        let g = &self.g;
        let at = g.map(block * PAGE_BYTES, 0);
        let row = at.data_offset_bytes / g.chunk_bytes;
        let page_at = at.data_offset_bytes % g.chunk_bytes;
        let images = self.io.inner().images();
        let mut text = format!(
            "block {block} is on member {} row {row} at +{page_at} (slot states {:?})",
            at.member,
            (0..g.members)
                .map(|s| self.array.as_ref().map(|a| a.slot_state(s)))
                .collect::<Vec<_>>()
        );
        if g.level.has_parity() {
            let k = g.data_per_stripe();
            let cells: Vec<Option<&[u8]>> = (0..k + g.level.parity_chunks())
                .map(|i| {
                    let m = g.stripe_member(row, i);
                    images.get(m).and_then(|i| i.as_deref()).map(|img| {
                        let off = (self.data_offset_bytes + row * g.chunk_bytes + page_at) as usize;
                        &img[off..off + PAGE_BYTES as usize]
                    })
                })
                .collect();
            if cells.iter().all(|c| c.is_some()) {
                let cells: Vec<&[u8]> = cells.into_iter().flatten().collect();
                use paraid_parity::Backend;
                let verdict =
                    paraid_parity::reference::Reference.check(&cells, g.level == Level::Raid6);
                text.push_str(&format!("; that page of its stripe: {verdict:?}"));
            } else {
                text.push_str("; its stripe has a member missing");
            }
        }
        text
    }

    fn gone_slots(&self) -> Vec<usize> {
        (0..self.g.members).filter(|s| self.gone[*s]).collect()
    }

    /// Checks member images directly: parity of every stripe, every copy of every chunk against the model. Slots
    /// failed but not yet removed are left out (their contents are not trusted).
    fn audit(&mut self, when: &str) -> Result<(), String> {
        if self.model.settled_bytes().is_none() {
            // Blocks of failed writes allow old or new: a full read settles them (and checks them).
            let mut all = vec![0u8; self.model.array_bytes() as usize];
            self.array()
                .read(0, &mut all)
                .map_err(|e| format!("{when}: reading the whole array failed: {e}"))?;
            let blocks = self
                .model
                .check_read(0, &all)
                .map_err(|m| format!("{when}: {m}"))?;
            self.report.blocks_verified += blocks;
        }
        let Some(expected) = self.model.settled_bytes() else {
            return Err(format!(
                "{when}: after a full read-back every block should be settled"
            ));
        };
        let mut images = self.io.inner().images();
        images.truncate(self.g.members);
        for (slot, image) in images.iter_mut().enumerate() {
            if self.failed[slot] || self.gone[slot] {
                *image = None;
            }
        }
        let r = audit::audit_images(&self.g, self.data_offset_bytes, &images, Some(&expected));
        self.report.audits += 1;
        self.report.stripes_audited += r.stripes_checked + r.degraded_stripes_checked;
        if !r.clean() {
            let array = self.array();
            let i = array.integrity();
            return Err(format!(
                "member audit {when}: {}; since assembly: {} stripes recovered from the log, resyncs verified {} \
                 stripes and rewrote {}, {} bitmap regions dirty now; last job: {:?}",
                r.describe(),
                i.log_recovered_stripes,
                i.resync_stripes,
                i.resync_rewritten,
                i.dirty_regions,
                array.last_result()
            ));
        }
        self.note(format!(
            "audit {when}: {} stripes, {} degraded stripes, {} chunk copies consistent",
            r.stripes_checked, r.degraded_stripes_checked, r.copies_checked
        ));
        Ok(())
    }

    fn fail_member(&mut self) -> Result<(), String> {
        if self.beyond {
            return Ok(());
        }
        let healthy: Vec<usize> = (0..self.g.members)
            .filter(|s| !self.failed[*s] && !self.gone[*s])
            .collect();
        if healthy.is_empty() {
            return Ok(());
        }
        let slot = *self.rng.pick(&healthy);
        let mut missing = self.missing();
        missing[slot] = true;
        let survivable = self.g.survives(&missing);
        let go_beyond = self.cfg.classes.beyond_tolerance && self.rng.one_in(3);
        if !survivable && !go_beyond {
            return Ok(());
        }
        if survivable && self.rng.one_in(3) {
            // The admin fails it: at once, durably.
            self.array()
                .fail_member(slot)
                .map_err(|e| format!("admin fail of member {slot}: {e}"))?;
            self.failed[slot] = true;
            self.report.member_failures += 1;
            self.report.admin_fails += 1;
            self.note(format!("member {slot} failed by the admin"));
            return Ok(());
        }
        let nth = self.rng.range(1, 40);
        let rule = self.io.add(
            Scope::slot(slot),
            Fault::FailFrom {
                nth,
                count: Count::Global,
            },
        );
        self.fail_rules[slot] = Some(rule);
        self.failed[slot] = true;
        self.report.member_failures += 1;
        if !survivable {
            self.beyond = true;
            self.report.beyond_tolerance += 1;
        }
        self.note(format!(
            "member {slot} fails from its I/O #{nth} on{}",
            if survivable {
                ""
            } else {
                " (beyond tolerance)"
            }
        ));
        Ok(())
    }

    fn transient_error(&mut self) {
        // One transient fault at a time: two pending ones can meet in one request (a read and its retry, or two
        // members of one stripe), which is more than a transient error, and whether they meet depends on how many
        // I/Os a background job issued meanwhile (timing), so the seed would not replay.
        let io = &self.io;
        if self
            .transient_armed
            .iter()
            .any(|&(id, needed, _)| io.rule_counts(id).is_some_and(|c| c.failed < needed))
        {
            return;
        }
        let present: Vec<usize> = (0..self.g.members)
            .filter(|s| !self.gone[*s] && !self.failed[*s])
            .collect();
        if present.is_empty() {
            return;
        }
        let slot = *self.rng.pick(&present);
        if self.rng.one_in(2) {
            let nth = self.rng.range(1, 20);
            let id = self.io.add(
                Scope::slot(slot).ops(OpKinds::DATA),
                Fault::FailOnce {
                    nth,
                    count: Count::Global,
                },
            );
            self.transient_armed.push((id, 1, slot));
            self.report.transient_errors += 1;
            self.note(format!("member {slot}: its data I/O #{nth} will fail once"));
        } else {
            // A page that fails reads (twice: the retry too) until it is rewritten.
            let row = self.rng.below(self.g.rows);
            let page = self.rng.below(self.g.chunk_bytes / PAGE_BYTES);
            let at = self.data_offset_bytes + row * self.g.chunk_bytes + page * PAGE_BYTES;
            let id = self.io.add(
                Scope::slot(slot)
                    .ops(OpKinds::READ)
                    .range(at..at + PAGE_BYTES),
                Fault::FailRun {
                    nth: 1,
                    times: 2,
                    count: Count::Global,
                },
            );
            self.transient_armed.push((id, 2, slot));
            self.lse_armed = true;
            self.report.unretryable_read_errors += 1;
            self.note(format!(
                "member {slot}: page at {at} fails its next two reads"
            ));
        }
    }

    /// Plants flipped bits at rest where repair can tell the right copy (RAID6: any chunk; RAID5: P; mirrors: a
    /// copy other than the first), then checks (every one found), repairs, and checks again (none left). Needs
    /// every member active.
    fn corrupt(&mut self) -> Result<(), String> {
        // A check stops at an unreadable page (reported), so none may be pending.
        if self.degraded() || self.beyond || self.lse_armed || self.g.level == Level::Raid0 {
            return Ok(());
        }
        self.wait_jobs("before planting corruption")?;
        let units = self.rng.range(1, 3.min(self.g.rows));
        let mut rows: Vec<u64> = Vec::new();
        while (rows.len() as u64) < units {
            let r = self.rng.below(self.g.rows);
            if !rows.contains(&r) {
                rows.push(r);
            }
        }
        let mut planted = 0u64;
        for &row in &rows {
            let (member, cell_row) = match self.g.level {
                Level::Raid6 => (self.rng.below(self.g.members as u64) as usize, row),
                Level::Raid5 => (self.g.p_member(row), row),
                _ => {
                    // Mirrors: the chunk whose first copy sits in this row of member 0 is not known in general;
                    // take chunk `row` (every level has at least `rows` chunks) and spoil its second copy.
                    let chunk = row.min(self.g.data_chunks() - 1);
                    let copy = 1 + self.rng.below(self.g.copies() as u64 - 1) as usize;
                    let addr = self.g.chunk_copy(chunk, copy);
                    (addr.member, addr.row)
                }
            };
            let at = self.data_offset_bytes
                + cell_row * self.g.chunk_bytes
                + self.rng.below(self.g.chunk_bytes);
            let image = self.io.inner().image(member).expect("every member present");
            let byte = image[at as usize] ^ (1 << self.rng.below(8));
            self.io.inner().poke(member, at, &[byte]);
            planted += 1;
        }
        // Mirrors: two rows may name one chunk only if rows collide, which the loop above prevents.
        self.report.corruptions_planted += planted;
        self.note(format!(
            "silent corruption: a bit flipped at rest in {planted} stripes/chunks (rows {rows:?})"
        ));
        let found = self.run_check(false)?;
        if found.mismatches != planted {
            return Err(format!(
                "check found {} mismatches for {planted} planted corruptions: {:?}",
                found.mismatches,
                self.array().check_findings()
            ));
        }
        self.report.corruptions_detected += found.mismatches;
        let fixed = self.run_check(true)?;
        if fixed.repaired != planted {
            return Err(format!(
                "repair rewrote {} stripes for {planted} corruptions",
                fixed.repaired
            ));
        }
        self.report.corruptions_repaired += fixed.repaired;
        // Known engine bug: repair does not flush what it rewrote (a power loss brings the corruption back).
        self.flush_after_repair()?;
        let again = self.run_check(false)?;
        if again.mismatches != 0 {
            return Err(format!("{} mismatches left after repair", again.mismatches));
        }
        self.note(format!(
            "check found {planted}, repair fixed {planted}, none left"
        ));
        self.audit("after repair")
    }

    /// Known engine bug (docs/reliability.md, tests/faults_engine_bugs.rs): a repair never flushes what it rewrote,
    /// so a power loss after it "completed" brings the corruption back. Unless strict, the simulator flushes after
    /// every repair so that the rest of the seed tests everything else.
    fn flush_after_repair(&mut self) -> Result<(), String> {
        if self.cfg.strict {
            return Ok(());
        }
        self.array()
            .flush()
            .map_err(|e| format!("flush after a repair: {e}"))?;
        self.model.flushed();
        self.note(
            "flush after the rebuild or repair (works around the unflushed-job-writes bug)"
                .to_string(),
        );
        Ok(())
    }

    fn run_check(&mut self, repair: bool) -> Result<crate::Progress, String> {
        self.run_check_beside(repair, |_| Ok(()))
    }

    /// `run_check`, with `beside` run while the check runs (requests sent alongside it).
    fn run_check_beside(
        &mut self,
        repair: bool,
        beside: impl FnOnce(&mut Self) -> Result<(), String>,
    ) -> Result<crate::Progress, String> {
        self.array()
            .start_check(repair)
            .map_err(|e| format!("start check: {e}"))?;
        beside(self)?;
        self.wait_jobs("check")?;
        let done = self
            .array()
            .last_result()
            .ok_or_else(|| "a check ran but left no result".to_string())?;
        if done.outcome.as_deref() != Some("completed") {
            return Err(format!("check did not complete: {done:?}"));
        }
        Ok(done)
    }

    /// Replaces a failed or missing member by a blank one and rebuilds it; with every member healthy, replaces a
    /// working member live (half the time).
    /// With `failing_new_members`, one time in three: a failure rule for the blank member about to be added
    /// (`replacing` false) or to be built as a live replacement, on I/O the add itself never does (it reads the
    /// superblock, discards the reserved area and writes the superblock with FUA), so the seed replays exactly.
    /// Returns the slot the engine will give an added member (the first failed or missing one without a member;
    /// a replacement is built at an entry past the data slots, where no other member does I/O), the rule, and
    /// what fails.
    fn arm_new_member_fault(
        &mut self,
        replacing: bool,
    ) -> Option<(Option<usize>, RuleId, &'static str)> {
        if !self.cfg.failing_new_members || !self.join_rng.one_in(3) {
            return None;
        }
        let array = self.array.as_ref()?;
        let (slot, member) = if replacing {
            let entries: Vec<usize> = (self.g.members..MAX_MEMBERS).collect();
            (None, Scope::slots(&entries))
        } else {
            let slot = (0..self.g.members).find(|&s| {
                matches!(array.slot_state(s), SlotState::Faulty | SlotState::Missing)
                    && !self.io.present(s)
            })?;
            (Some(slot), Scope::slot(slot))
        };
        let data_at = self.data_offset_bytes;
        let rows = (self.member_bytes - data_at) / self.g.chunk_bytes;
        let writes = member.clone().ops(OpKinds::WRITE);
        let (scope, nth, what) = match self.join_rng.below(3) {
            0 => (
                writes.range(data_at..self.member_bytes),
                self.join_rng.range(1, rows),
                "a write of its rebuilt data",
            ),
            1 => (member.ops(OpKinds::FLUSH), 1, "its final flush"),
            _ => (
                // The bitmap and the ring lie after the superblock and its reserved copy (docs/format.md).
                writes.range(2 * SUPERBLOCK_BYTES as u64..data_at),
                self.join_rng.range(1, 3),
                "a write of its bitmap or log ring",
            ),
        };
        let rule = self.io.add(
            scope,
            Fault::FailFrom {
                nth,
                count: Count::Global,
            },
        );
        let role = match slot {
            Some(slot) => format!("the blank member for slot {slot}"),
            None => "the replacement".to_string(),
        };
        self.note(format!("{role} will fail {what} (#{nth})"));
        Some((slot, rule, what))
    }

    fn rebuild(&mut self) -> Result<(), String> {
        if self.beyond {
            return Ok(());
        }
        self.wait_jobs("before a rebuild")?;
        self.sync_slot_states();
        let members = self.g.members;
        let states: Vec<SlotState> = (0..members).map(|s| self.array().slot_state(s)).collect();
        let replaceable: Vec<usize> = (0..members)
            .filter(|s| matches!(states[*s], SlotState::Faulty | SlotState::Missing))
            .collect();
        let label = format!("new{}", self.report.rebuilds + self.report.replacements);
        let member = NewMember::Image {
            label,
            size_bytes: self.member_bytes,
        };
        if replaceable.is_empty() {
            if self.degraded() || !self.rng.one_in(2) {
                return Ok(());
            }
            if self.g.level == Level::Raid0 {
                // Nothing to copy from while keeping redundancy: the engine must refuse.
                return match self.array().replace_member(0, member) {
                    Err(_) => Ok(()),
                    Ok(()) => Err("replace_member on RAID0 was accepted".to_string()),
                };
            }
            let slot = self.rng.below(members as u64) as usize;
            let joining_fault = self.arm_new_member_fault(true);
            self.array()
                .replace_member(slot, member)
                .map_err(|e| format!("replace member {slot}: {e}"))?;
            let beside = self.cfg.concurrent && self.rng.one_in(2);
            if beside {
                self.note(format!("requests while member {slot} is replaced"));
                self.batch()?;
            }
            self.wait_jobs("live replacement")?;
            let done = self.array().last_result();
            if let Some((_, rule, what)) = joining_fault {
                // The rule covers every entry past the data slots: lifted whatever happened, or it would catch
                // the next replacement.
                let fired = self.io.rule_counts(rule).is_some_and(|c| c.failed > 0);
                self.io.remove(rule);
                // A request beside the replacement may meet the rule too (a client flush reaches the new
                // member, even before the replacement's job starts): the replacement must end aborted all the
                // same. None reaches the entry after the new member took the slot: the replacement holds
                // requests off while it completes.
                let completed = rebuild_completed(&done, slot);
                if fired {
                    if completed || self.array().slot_state(slot) != SlotState::Active {
                        return Err(format!(
                            "the replacement of member {slot} failed {what}: the replacement must be dropped and \
                             the member keep serving, got {:?} and slot state {}",
                            done.as_ref().and_then(|d| d.outcome.clone()),
                            self.array().slot_state(slot)
                        ));
                    }
                    self.report.new_member_failures += 1;
                    self.note(format!(
                        "the replacement of member {slot} failed {what}: {}",
                        done.as_ref()
                            .and_then(|d| d.outcome.as_deref())
                            .unwrap_or("no result")
                    ));
                    return self.audit("after a replacement failed");
                }
            }
            if self.array().slot_state(slot) != SlotState::Active || !rebuild_completed(&done, slot)
            {
                return Err(format!(
                    "live replacement of member {slot} did not complete: {done:?}"
                ));
            }
            self.report.replacements += 1;
            self.note(format!("member {slot} replaced live"));
            return self.audit("after a live replacement");
        }
        let slot = *self.rng.pick(&replaceable);
        if states[slot] == SlotState::Faulty && self.io.present(slot) {
            self.array()
                .remove_member(slot)
                .map_err(|e| format!("remove member {slot}: {e}"))?;
        }
        if let Some(rule) = self.fail_rules[slot].take() {
            self.io.remove(rule);
        }
        // The blank member is a new device: a transient fault armed for the one it replaces does not follow it.
        let io = &self.io;
        self.transient_armed.retain(|&(id, _, s)| {
            if s == slot {
                io.remove(id);
            }
            s != slot
        });
        let joining_fault = self.arm_new_member_fault(false);
        let outcome = self
            .array()
            .add_member(member)
            .map_err(|e| format!("add a blank member for slot {slot}: {e}"))?;
        let AddOutcome::Rebuilding { slot: took } = outcome else {
            return Err(format!(
                "a blank member should take a failed or missing slot: {outcome:?}"
            ));
        };
        let joining_fault = match joining_fault {
            Some((at, rule, _)) if at != Some(took) => {
                self.io.remove(rule);
                None
            }
            armed => armed,
        };
        let beside = self.cfg.concurrent && self.rng.one_in(2);
        if beside {
            self.note(format!("requests while slot {took} rebuilds"));
            self.batch()?;
        }
        self.wait_jobs("rebuild")?;
        let done = self.array().last_result();
        let completed = rebuild_completed(&done, took);
        self.sync_slot_states();
        if let Some((_, rule, what)) = joining_fault {
            if self.io.rule_counts(rule).is_some_and(|c| c.failed > 0) {
                // Whenever it failed, a member that failed an I/O must not serve: aborted as a target, or
                // evicted as a member. Only requests beside the rebuild can meet the rule after it joined.
                let state = self.array().slot_state(took);
                if state == SlotState::Active || (completed && !beside) {
                    return Err(format!(
                        "the new member of slot {took} failed {what}, yet it joined the array (slot {state}): \
                         {done:?}"
                    ));
                }
                // It stays in its slot, faulty and failing, until a later rebuild removes it; the abort moved the
                // survivors' event counters past it.
                self.fail_rules[took] = Some(rule);
                self.failed[took] = true;
                self.stale[took] = None;
                self.stale_behind[took] = true;
                self.report.new_member_failures += 1;
                // The outcome only: the progress carries a rate, which is timing.
                let outcome = done.as_ref().and_then(|d| d.outcome.clone());
                self.note(format!(
                    "the new member of slot {took} failed {what}: {}",
                    outcome.as_deref().unwrap_or("no result")
                ));
                return self.audit("after a new member failed");
            }
            self.io.remove(rule);
        }
        if !completed || self.array().slot_state(took) != SlotState::Active {
            if self.beyond {
                self.note(format!(
                    "rebuild of {took} ended beyond tolerance: {done:?}"
                ));
                return Ok(());
            }
            // An unretryable read fault armed while redundancy remained, now on the last copy (a member failed
            // since): the rebuild cannot read those bytes anywhere and, rightly, does not activate its target.
            let unreadable = done.as_ref().is_some_and(|d| !d.unreadable.is_empty());
            if unreadable && self.lse_armed && self.redundancy_exhausted() {
                self.note(format!(
                    "rebuild of {took} stopped at bytes no member could read (armed read fault on the last copy)"
                ));
                return Ok(());
            }
            return Err(format!("rebuild of slot {took} did not complete: {done:?}"));
        }
        self.failed[took] = false;
        self.gone[took] = false;
        self.stale[took] = None;
        self.stale_behind[took] = false;
        self.report.rebuilds += 1;
        self.note(format!("blank member rebuilt into slot {took}"));
        self.audit("after a rebuild")
    }
}

/// Whether `done` (the array's last job result) is a rebuild or replacement of `slot` that completed. The kind
/// and slot matter: a replacement aborted before its job ran (a request beside it failed on the new member) leaves
/// the result of the job before, a resync say, as the last.
fn rebuild_completed(done: &Option<crate::Progress>, slot: usize) -> bool {
    done.as_ref().is_some_and(|d| {
        d.kind == "rebuild" && d.slot == Some(slot) && d.outcome.as_deref() == Some("completed")
    })
}

/// Runs seeds `first..first + count` on `jobs` threads and sums their reports; failures are collected, not
/// raised. Each seed runs on one thread, so it replays as it would alone; a panic inside a seed (an engine debug
/// assertion) becomes that seed's failure. `progress` is called after every seed with the count done so far and
/// the seed's failure, if it failed.
pub fn run_seeds(
    first: u64,
    count: u64,
    jobs: usize,
    cfg: &SimConfig,
    progress: &(dyn Fn(u64, Option<&SimFailure>) + Sync),
) -> (SimTotals, Vec<SimFailure>) {
    use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
    use std::sync::Mutex;
    use std::time::Instant;
    let next = AtomicU64::new(first);
    let done = AtomicU64::new(0);
    let results = Mutex::new((SimTotals::new(), Vec::new()));
    let jobs = jobs.max(1);
    // Per job, the seed it runs and since when: the watchdog's view.
    let running: Vec<Mutex<Option<(u64, Instant)>>> = (0..jobs).map(|_| Mutex::new(None)).collect();
    let jobs_left = AtomicUsize::new(jobs);
    let hang = seed_hang_limit();
    std::thread::scope(|scope| {
        scope.spawn(|| {
            while jobs_left.load(Ordering::SeqCst) > 0 {
                std::thread::sleep(Duration::from_millis(200));
                for slot in &running {
                    let current = *slot.lock().unwrap_or_else(|e| e.into_inner());
                    if let Some((seed, _)) = current.filter(|(_, since)| since.elapsed() > hang) {
                        // The seed's thread cannot be stopped: say which seed hung and how to replay it, and end
                        // the process (a test binary then fails with this message, instead of CI timing out).
                        // Straight to stderr: under the test harness `eprintln!` goes to the test's capture,
                        // which dies with the process.
                        use std::io::Write as _;
                        let _ =
                            writeln!(std::io::stderr(), "{}", SimFailure::hung(seed, cfg, hang));
                        std::process::exit(1);
                    }
                }
            }
        });
        for job in 0..jobs {
            let (running, jobs_left) = (&running, &jobs_left);
            let (next, done, results) = (&next, &done, &results);
            scope.spawn(move || loop {
                let seed = next.fetch_add(1, Ordering::Relaxed);
                if seed >= first + count {
                    jobs_left.fetch_sub(1, Ordering::SeqCst);
                    break;
                }
                *running[job].lock().unwrap_or_else(|e| e.into_inner()) =
                    Some((seed, Instant::now()));
                let outcome = std::panic::catch_unwind(|| run_seed(seed, cfg))
                    .unwrap_or_else(|panic| Err(SimFailure::panicked(seed, cfg, panic)));
                *running[job].lock().unwrap_or_else(|e| e.into_inner()) = None;
                let n = done.fetch_add(1, Ordering::Relaxed) + 1;
                progress(n, outcome.as_ref().err());
                let mut results = results.lock().unwrap_or_else(|e| e.into_inner());
                match outcome {
                    Ok(r) => results.0.add(seed, &r),
                    Err(f) => {
                        results.0.add_failure(&f);
                        results.1.push(f);
                    }
                }
            });
        }
    });
    let (totals, mut failures) = results.into_inner().unwrap_or_else(|e| e.into_inner());
    failures.sort_by_key(|f| f.seed);
    (totals, failures)
}

/// How long one seed may run before the watchdog of `run_seeds` takes it for a hang (a deadlock in the engine):
/// `PARAID_SIM_HANG_SECS`, else 300 s. Seeds take well under a second; latency faults add at most seconds.
/// A value that is not a whole number of seconds is a mistake worth saying: it is reported, and the default
/// holds.
fn seed_hang_limit() -> Duration {
    const DEFAULT_SECS: u64 = 300;
    let secs = match std::env::var("PARAID_SIM_HANG_SECS") {
        Err(_) => DEFAULT_SECS,
        Ok(text) => text.trim().parse().unwrap_or_else(|_| {
            use std::io::Write as _;
            let _ = writeln!(
                std::io::stderr(),
                "PARAID_SIM_HANG_SECS={text:?} is not a whole number of seconds; using {DEFAULT_SECS}"
            );
            DEFAULT_SECS
        }),
    };
    Duration::from_secs(secs)
}

impl SimFailure {
    /// The failure of a seed that ran past `limit`: hung.
    fn hung(seed: u64, cfg: &SimConfig, limit: Duration) -> SimFailure {
        SimFailure {
            seed,
            op: 0,
            what: format!(
                "no result after {} s: hung (a deadlock in the engine, or PARAID_SIM_HANG_SECS too short)",
                limit.as_secs()
            ),
            geometry: String::new(),
            trace: Vec::new(),
            replay: cfg.replay(seed),
        }
    }

    /// The failure of a seed that panicked, with the panic's message.
    fn panicked(seed: u64, cfg: &SimConfig, panic: Box<dyn std::any::Any + Send>) -> SimFailure {
        let message = panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default();
        SimFailure {
            seed,
            op: 0,
            what: format!("panicked: {message}"),
            geometry: String::new(),
            trace: Vec::new(),
            replay: cfg.replay(seed),
        }
    }
}

// The member stack the simulator drives must itself be a MemberIo the array can own.
const _: fn() = || {
    fn member_io<T: MemberIo + 'static>() {}
    member_io::<Io>();
};
