//! A seeded, deterministic simulation of an array under faults.
//!
//! One `u64` seed decides everything: the geometry (level, members, chunk size, rows), the workload (reads,
//! writes, FUA writes, flushes, discards and write-zeroes at random offsets and lengths), and the faults (members
//! that die at a random I/O, power losses with unflushed writes kept, dropped or torn, power cuts between the member
//! writes of one request, process kills, clean restarts, latency spikes in virtual time, stale members offered back
//! at assembly). Everything runs on the calling thread over in-memory members (`CrashMembers` under
//! `FaultyMembers`), so a seed replays exactly.
//!
//! The oracle is `model::BlockModel`: after every read, every block read must be an allowed value; after every
//! crash or restart the whole array is read back and every block must be one a crash may leave; whenever stripes are
//! known to be consistent (no crash since the last clean state: the engine has no resync yet) the member images are
//! audited directly with the reference parity backend. Any violation is returned with the seed and a one-line
//! replay command.
//!
//! Fault classes the engine cannot survive yet (transient errors need retry, silent corruption needs check/repair,
//! a crash while degraded needs a partial parity log, a member lost after a crash needs resync) are off in
//! `Classes::engine_today()`; `Classes::all()` turns them on to show what is still missing.

pub mod audit;
pub mod model;

use std::collections::VecDeque;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::fault::{
    Count, CrashMembers, CrashPolicy, Fault, FaultCounts, FaultyMembers, OpKinds, RowLimit, Scope,
    SplitMix64,
};
use crate::layout::{Geometry, Level, PAGE_BYTES};
use crate::member::MemberIo;
use crate::superblock::DEFAULT_DATA_OFFSET_BYTES;
use crate::{assemble_io, create_io, Array, AssembleOptions, EngineError};
use model::{BlockModel, WriteOutcome};

/// Fault classes the simulator may inject.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Classes {
    /// A member fails every I/O from a random one on (within the level's tolerance).
    pub member_failure: bool,
    /// Sometimes one failure more than the level survives: reads must fail, never return wrong data; assembly must
    /// refuse.
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
    /// A member removed earlier is offered back at assembly: it must be refused.
    pub stale_reattach: bool,
    /// One I/O fails once (needs retry in the engine).
    pub transient_errors: bool,
    /// Bits flipped in stored writes within the level's tolerance (needs check/repair to be noticed).
    pub silent_corruption: bool,
    /// Crash while degraded, and member loss after a crash (needs a partial parity log and resync).
    pub crash_degraded: bool,
}

const CLASS_NAMES: [&str; 11] = [
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
];

impl Classes {
    pub fn none() -> Classes {
        Classes::from_flags([false; 11])
    }

    pub fn all() -> Classes {
        Classes::from_flags([true; 11])
    }

    /// What the engine in this tree is built to survive.
    pub fn engine_today() -> Classes {
        Classes {
            transient_errors: false,
            silent_corruption: false,
            crash_degraded: false,
            ..Classes::all()
        }
    }

    fn flags(&self) -> [bool; 11] {
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
        ]
    }

    fn from_flags(f: [bool; 11]) -> Classes {
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
        }
    }

    /// Comma-separated class names ("all" and "today" also accepted).
    pub fn parse(list: &str) -> Result<Classes, String> {
        match list.trim() {
            "all" => return Ok(Classes::all()),
            "today" => return Ok(Classes::engine_today()),
            "none" | "" => return Ok(Classes::none()),
            _ => {}
        }
        let mut flags = [false; 11];
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
    /// Print every step.
    pub verbose: bool,
}

impl SimConfig {
    /// What CI runs, and what a bare seed replays.
    pub fn ci() -> SimConfig {
        SimConfig {
            ops: 120,
            classes: Classes::engine_today(),
            verbose: false,
        }
    }

    /// The command lines that replay `seed` under this configuration.
    pub fn replay(&self, seed: u64) -> String {
        let default = SimConfig::ci();
        if self.ops == default.ops && self.classes == default.classes {
            format!(
                "PARAID_SIM_SEED={seed} cargo test -p paraid-engine --profile release-test --test sim -- \
                 --nocapture   (or: cargo run --release -p paraid-engine --example sim -- --seed {seed} --verbose)"
            )
        } else {
            format!(
                "cargo run --release -p paraid-engine --example sim -- --seed {seed} --ops {} --classes {} --verbose",
                self.ops,
                self.classes.names()
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
    pub discards: u64,
    /// Array requests that failed while a fault made failure legitimate.
    pub request_errors: u64,
    /// Blocks compared with the model (reads, and full read-backs after crashes and restarts).
    pub blocks_verified: u64,
    pub crashes: u64,
    pub power_cuts_mid_request: u64,
    pub kills: u64,
    pub restarts: u64,
    pub member_failures: u64,
    pub members_removed: u64,
    pub beyond_tolerance: u64,
    pub beyond_tolerance_refusals: u64,
    pub stale_refusals: u64,
    pub transient_errors: u64,
    pub corruptions_planted: u64,
    /// Member-image audits (parity and copies checked from raw bytes) and the stripes they covered.
    pub audits: u64,
    pub stripes_audited: u64,
    /// Audits skipped because a crash may have left stripes inconsistent and the engine has no resync.
    pub audits_skipped_unsynced: u64,
    pub crash_writes_kept: u64,
    pub crash_writes_dropped: u64,
    pub crash_writes_torn: u64,
    pub faults: FaultCounts,
    pub virtual_delay: Duration,
}

/// Sums over many seeds.
#[derive(Debug, Clone, Default)]
pub struct SimTotals {
    pub seeds: u64,
    pub by_level: [(u64, &'static str); 5],
    pub sum: SeedReport,
    pub violations: u64,
    pub failing_seeds: Vec<u64>,
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

    pub fn add(&mut self, r: &SeedReport) {
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
        let s = &mut self.sum;
        s.reads += r.reads;
        s.writes += r.writes;
        s.flushes += r.flushes;
        s.discards += r.discards;
        s.request_errors += r.request_errors;
        s.blocks_verified += r.blocks_verified;
        s.crashes += r.crashes;
        s.power_cuts_mid_request += r.power_cuts_mid_request;
        s.kills += r.kills;
        s.restarts += r.restarts;
        s.member_failures += r.member_failures;
        s.members_removed += r.members_removed;
        s.beyond_tolerance += r.beyond_tolerance;
        s.beyond_tolerance_refusals += r.beyond_tolerance_refusals;
        s.stale_refusals += r.stale_refusals;
        s.transient_errors += r.transient_errors;
        s.corruptions_planted += r.corruptions_planted;
        s.audits += r.audits;
        s.stripes_audited += r.stripes_audited;
        s.audits_skipped_unsynced += r.audits_skipped_unsynced;
        s.crash_writes_kept += r.crash_writes_kept;
        s.crash_writes_dropped += r.crash_writes_dropped;
        s.crash_writes_torn += r.crash_writes_torn;
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
            "requests           {} reads, {} writes, {} flushes, {} discards/write-zeroes; {} failed under faults",
            s.reads, s.writes, s.flushes, s.discards, s.request_errors
        )?;
        writeln!(f, "blocks verified    {}", s.blocks_verified)?;
        writeln!(
            f,
            "faults by class    member failures {} (removed at restart {}), beyond tolerance {} (assembly refused {}), \
             power losses {}, power cuts mid-request {}, kills {}, clean restarts {}, stale members refused {}, \
             transient errors {}, corruptions planted {}",
            s.member_failures,
            s.members_removed,
            s.beyond_tolerance,
            s.beyond_tolerance_refusals,
            s.crashes,
            s.power_cuts_mid_request,
            s.kills,
            s.restarts,
            s.stale_refusals,
            s.transient_errors,
            s.corruptions_planted
        )?;
        writeln!(
            f,
            "member I/O faults  {} failed I/Os, {} flipped writes, {} delayed I/Os ({:.1} s virtual)",
            s.faults.failed,
            s.faults.flipped_writes,
            s.faults.delayed,
            s.virtual_delay.as_secs_f64()
        )?;
        writeln!(
            f,
            "unflushed writes   at power loss: {} kept, {} dropped, {} torn",
            s.crash_writes_kept, s.crash_writes_dropped, s.crash_writes_torn
        )?;
        writeln!(
            f,
            "member audits      {} ({} stripes checked with the reference), {} skipped (crash, no resync in the engine)",
            s.audits, s.stripes_audited, s.audits_skipped_unsynced
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
        writeln!(
            f,
            "simulation seed {} failed at step {} ({}): {}",
            self.seed, self.op, self.geometry, self.what
        )?;
        writeln!(f, "replay: {}", self.replay)?;
        writeln!(f, "last steps:")?;
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
}

const TRACE_LINES: usize = 40;

type Io = FaultyMembers<CrashMembers>;

struct Run<'a> {
    seed: u64,
    cfg: &'a SimConfig,
    rng: SplitMix64,
    g: Geometry,
    data_offset_bytes: u64,
    io: Arc<Io>,
    array: Option<Array>,
    model: BlockModel,
    /// Slots with a persistent failure rule (they leave at the next restart).
    failed: Vec<bool>,
    /// Slots absent from the array.
    gone: Vec<bool>,
    /// What a removed member held, and whether an assembly without it has happened since (then it is stale).
    stale: Vec<Option<Vec<u8>>>,
    stale_behind: Vec<bool>,
    /// A transient-error rule is pending (errors are legitimate until the next restart).
    transient_armed: bool,
    /// A crash may have left stripes inconsistent: no resync exists, so no audit and no further member loss.
    unsynced: bool,
    /// More members failed than the level survives.
    beyond: bool,
    dead: bool,
    latency_slot: usize,
    latency_ms: u64,
    step: usize,
    trace: VecDeque<String>,
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
    let member_bytes = DEFAULT_DATA_OFFSET_BYTES + rows * chunk_bytes;
    let geometry_text = format!("{level}, {members} members, chunk {chunk_bytes} B, {rows} rows");

    let setup_failure = |what: String| SimFailure {
        seed,
        op: 0,
        what,
        geometry: geometry_text.clone(),
        trace: Vec::new(),
        replay: cfg.replay(seed),
    };
    let io = Arc::new(FaultyMembers::new(
        CrashMembers::new(members, member_bytes),
        SplitMix64::derive(seed, 1).next_u64(),
    ));
    create_io(io.as_ref(), level, chunk_bytes, "sim")
        .map_err(|e| setup_failure(format!("create: {e}")))?;
    let array = assemble_io(io.clone(), AssembleOptions::new(reference()))
        .map_err(|e| setup_failure(format!("first assembly: {e}")))?;
    let g = array.geometry();
    let mut run = Run {
        seed,
        cfg,
        g,
        data_offset_bytes: array.data_offset_bytes(),
        io,
        model: BlockModel::new(array.size_bytes()),
        array: Some(array),
        failed: vec![false; members],
        gone: vec![false; members],
        stale: vec![None; members],
        stale_behind: vec![false; members],
        transient_armed: false,
        unsynced: false,
        beyond: false,
        dead: false,
        latency_slot: rng.below(members as u64) as usize,
        latency_ms: rng.range(1, 200),
        step: 0,
        trace: VecDeque::new(),
        report: SeedReport {
            level: Some(level),
            members,
            chunk_bytes,
            array_bytes: g.array_bytes(),
            ..SeedReport::default()
        },
        rng,
    };
    run.note(format!(
        "start: {geometry_text}, array {} bytes",
        g.array_bytes()
    ));
    run.arm_latency();
    run.main_loop()
        .map_err(|what| run.failure(what, &geometry_text))?;
    let faults = run.io.counts();
    run.report.faults += faults;
    run.report.virtual_delay += run.io.virtual_delay();
    Ok(run.report)
}

impl Run<'_> {
    fn note(&mut self, line: String) {
        let line = format!("step {}: {line}", self.step);
        if self.cfg.verbose {
            println!("{line}");
        }
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

    fn redundant(&self) -> bool {
        self.g.level != Level::Raid0
    }

    /// Whether a failing request is legitimate now.
    fn errors_expected(&self) -> bool {
        self.failed.iter().any(|f| *f) || self.transient_armed || self.beyond
    }

    fn request_failed(&mut self, what: &str, err: &EngineError) -> Result<(), String> {
        self.note(format!("{what} failed: {err}"));
        if !self.errors_expected() {
            return Err(format!(
                "{what} failed with no fault that could explain it: {err}"
            ));
        }
        self.report.request_errors += 1;
        Ok(())
    }

    fn arm_latency(&mut self) {
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

    /// A random request extent: any offset and length, half of them page-aligned.
    fn extent(&mut self) -> (u64, usize) {
        let array_bytes = self.model.array_bytes();
        let stripe = self.g.stripe_bytes();
        let max = match self.rng.below(4) {
            0 => 512,
            1 => 16384,
            2 => stripe,
            _ => 3 * stripe,
        }
        .min(array_bytes);
        let mut len = 1 + self.rng.below(max);
        let mut offset = self.rng.below(array_bytes - len + 1);
        if self.rng.one_in(2) {
            offset -= offset % PAGE_BYTES;
            len = len.div_ceil(PAGE_BYTES) * PAGE_BYTES;
            len = len.min(array_bytes - offset);
        }
        (offset, len as usize)
    }

    fn pick_step(&mut self) -> Step {
        let c = self.cfg.classes;
        let table: [(Step, u64, bool); 12] = [
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
                Step::FailMember => self.fail_member(),
                Step::TransientError => self.transient_error(),
                Step::Corrupt => self.corrupt(),
            }
        }
        if !self.dead {
            self.step += 1;
            self.note("final restart and audit".to_string());
            self.restart()?;
        }
        Ok(())
    }

    fn write(&mut self) -> Result<(), String> {
        let (offset, len) = self.extent();
        let mut data = vec![0u8; len];
        self.rng.fill(&mut data);
        let fua = self.rng.one_in(4);
        self.report.writes += 1;
        match self.array().write(offset, &data, fua) {
            Ok(()) => {
                self.note(format!("write {offset}+{len} fua={fua}: ok"));
                self.model
                    .write(offset, &data, WriteOutcome::Acked { durable: fua });
            }
            Err(e) => {
                self.request_failed(&format!("write {offset}+{len}"), &e)?;
                self.model.write(offset, &data, WriteOutcome::Failed);
            }
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
        Ok(())
    }

    /// Whether losing power now could expose the write hole, which the engine cannot close yet.
    fn crash_unsafe(&self) -> bool {
        let degraded = self.failed.iter().chain(&self.gone).any(|f| *f);
        self.g.level.has_parity() && degraded && !self.cfg.classes.crash_degraded
    }

    /// Power loss, now or between two member writes of a write request.
    fn crash(&mut self, mid_request: bool) -> Result<(), String> {
        if self.crash_unsafe() {
            self.note("power loss skipped: degraded parity array (write hole: needs a partial parity log)".into());
            return Ok(());
        }
        let mut interrupted = false;
        if mid_request {
            let cut_after = self.rng.below(2 * self.g.members as u64 + 2);
            self.io.inner().cut_power_after_writes(cut_after);
            let (offset, len) = self.extent();
            let mut data = vec![0u8; len];
            self.rng.fill(&mut data);
            let fua = self.rng.one_in(4);
            self.report.writes += 1;
            match self.array().write(offset, &data, fua) {
                Ok(()) => {
                    self.note(format!(
                        "write {offset}+{len} fua={fua} completed before the power cut after {cut_after} member writes"
                    ));
                    self.model
                        .write(offset, &data, WriteOutcome::Acked { durable: fua });
                }
                Err(e) => {
                    interrupted = true;
                    self.report.power_cuts_mid_request += 1;
                    self.note(format!(
                        "write {offset}+{len} fua={fua} cut by power loss after {cut_after} member writes: {e}"
                    ));
                    self.model.write(offset, &data, WriteOutcome::Failed);
                }
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
        let inconsistent = interrupted || r.writes_dropped + r.writes_torn > 0;
        self.reassemble(r.images, inconsistent)
    }

    /// The process dies between requests, or (half the time) in the middle of one: every completed member write
    /// survives.
    fn kill(&mut self) -> Result<(), String> {
        let mut interrupted = false;
        if self.rng.one_in(2) {
            if self.crash_unsafe() {
                self.note("kill mid-request skipped: degraded parity array (write hole)".into());
                return Ok(());
            }
            let cut_after = self.rng.below(2 * self.g.members as u64 + 2);
            self.io.inner().cut_power_after_writes(cut_after);
            let (offset, len) = self.extent();
            let mut data = vec![0u8; len];
            self.rng.fill(&mut data);
            self.report.writes += 1;
            match self.array().write(offset, &data, false) {
                Ok(()) => self
                    .model
                    .write(offset, &data, WriteOutcome::Acked { durable: false }),
                Err(_) => {
                    interrupted = true;
                    self.model.write(offset, &data, WriteOutcome::Failed);
                }
            }
            self.note(format!(
                "kill after {cut_after} member writes of write {offset}+{len} (cut short: {interrupted})"
            ));
        } else {
            self.note("kill between requests".to_string());
        }
        self.io.inner().cut_power();
        self.report.kills += 1;
        // Completed writes sit in the kernel's cache: all of them survive the process.
        let r = self.io.inner().crash(0, CrashPolicy::KeepAll);
        // Nothing was lost beyond the request cut short: what was acknowledged is now as good as durable.
        self.reassemble(r.images, interrupted)
    }

    /// Clean stop (a kill if the stop fails) and re-assembly.
    fn restart(&mut self) -> Result<(), String> {
        let array = self.array.take().expect("the array runs between restarts");
        match array.stop() {
            Ok(()) => {
                self.model.flushed();
                self.report.restarts += 1;
                self.note("clean stop".to_string());
                let images = self.io.inner().images();
                self.reassemble(images, false)
            }
            Err(e) => {
                if !self.errors_expected() {
                    return Err(format!(
                        "stop failed with no fault that could explain it: {e}"
                    ));
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

    /// Brings the array back from `images` after a crash, kill or stop: failed members are left out (the admin
    /// pulled them), a stale member is offered first and must be refused, then the whole array is read back and
    /// checked, and the members audited when their stripes are known to be consistent.
    fn reassemble(
        &mut self,
        mut images: Vec<Option<Vec<u8>>>,
        inconsistent: bool,
    ) -> Result<(), String> {
        self.array = None;
        self.report.faults += self.io.counts();
        self.report.virtual_delay += self.io.virtual_delay();
        if inconsistent && self.redundant() {
            self.unsynced = true;
        }
        for slot in 0..self.g.members {
            if self.failed[slot] {
                self.stale[slot] = images[slot].take();
                self.stale_behind[slot] = false;
                self.failed[slot] = false;
                self.gone[slot] = true;
                self.report.members_removed += 1;
            } else if self.gone[slot] {
                images[slot] = None;
            }
        }
        self.transient_armed = false;

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
                let attempt = assemble_io(
                    Arc::new(CrashMembers::from_images(with_stale)),
                    AssembleOptions::new(reference()),
                );
                match attempt {
                    Err(EngineError::TrustStaleMember { slot: named, .. }) if named == slot => {
                        self.report.stale_refusals += 1;
                        self.note(format!("stale member {slot} offered back: refused"));
                    }
                    Err(e) => {
                        return Err(format!(
                        "stale member {slot} offered back: expected a refusal naming it, got: {e}"
                    ))
                    }
                    Ok(_) => {
                        return Err(format!(
                            "stale member {slot} (left out of an earlier assembly) was trusted"
                        ))
                    }
                }
            }
        }

        let seed = SplitMix64::derive(
            self.seed,
            2 + self.report.restarts + self.report.crashes + self.report.kills,
        )
        .next_u64();
        self.io = Arc::new(FaultyMembers::new(CrashMembers::from_images(images), seed));
        let survives = self.g.survives(&self.gone);
        match assemble_io(self.io.clone(), AssembleOptions::new(reference())) {
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
        self.arm_latency();

        let mut all = vec![0u8; self.model.array_bytes() as usize];
        self.array()
            .read(0, &mut all)
            .map_err(|e| format!("reading the whole array back after re-assembly failed: {e}"))?;
        let blocks = self
            .model
            .check_after_crash(&all)
            .map_err(|m| format!("after re-assembly (missing {:?}): {m}", self.gone_slots()))?;
        self.report.blocks_verified += blocks;
        self.note(format!(
            "re-assembled without {:?}: {blocks} blocks verified",
            self.gone_slots()
        ));
        self.audit()
    }

    fn gone_slots(&self) -> Vec<usize> {
        (0..self.g.members).filter(|s| self.gone[*s]).collect()
    }

    /// Checks member images directly: parity of every stripe, every copy of every chunk against the model.
    fn audit(&mut self) -> Result<(), String> {
        if self.unsynced {
            self.report.audits_skipped_unsynced += 1;
            return Ok(());
        }
        let Some(expected) = self.model.settled_bytes() else {
            return Err("after a full read-back every block should be settled".to_string());
        };
        let images = self.io.inner().images();
        let r = audit::audit_images(&self.g, self.data_offset_bytes, &images, Some(&expected));
        self.report.audits += 1;
        self.report.stripes_audited += r.stripes_checked + r.degraded_stripes_checked;
        if !r.clean() {
            return Err(format!("member audit: {}", r.describe()));
        }
        self.note(format!(
            "audit: {} stripes, {} degraded stripes, {} chunk copies consistent",
            r.stripes_checked, r.degraded_stripes_checked, r.copies_checked
        ));
        Ok(())
    }

    fn fail_member(&mut self) {
        let healthy: Vec<usize> = (0..self.g.members)
            .filter(|s| !self.failed[*s] && !self.gone[*s])
            .collect();
        if healthy.is_empty() {
            return;
        }
        let slot = *self.rng.pick(&healthy);
        let mut missing: Vec<bool> = self
            .failed
            .iter()
            .zip(&self.gone)
            .map(|(f, g)| *f || *g)
            .collect();
        missing[slot] = true;
        let survivable = self.g.survives(&missing);
        let go_beyond = self.cfg.classes.beyond_tolerance && self.rng.one_in(3);
        if !survivable && !go_beyond {
            return;
        }
        if self.unsynced && self.redundant() && !self.cfg.classes.crash_degraded {
            self.note(
                "member failure skipped: stripes may be inconsistent since a crash (no resync)"
                    .into(),
            );
            return;
        }
        let nth = self.rng.range(1, 40);
        self.io.add(
            Scope::slot(slot),
            Fault::FailFrom {
                nth,
                count: Count::Global,
            },
        );
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
    }

    fn transient_error(&mut self) {
        let present: Vec<usize> = (0..self.g.members).filter(|s| !self.gone[*s]).collect();
        let slot = *self.rng.pick(&present);
        let nth = self.rng.range(1, 20);
        self.io.add(
            Scope::slot(slot).ops(OpKinds::DATA),
            Fault::FailOnce {
                nth,
                count: Count::Global,
            },
        );
        self.transient_armed = true;
        self.report.transient_errors += 1;
        self.note(format!("member {slot}: its data I/O #{nth} will fail once"));
    }

    fn corrupt(&mut self) {
        let tolerance = self.g.level.parity_chunks().max(self.g.copies() - 1);
        if tolerance == 0 {
            return;
        }
        self.io.add(
            Scope::all().ops(OpKinds::WRITE).row_limit(RowLimit {
                data_offset_bytes: self.data_offset_bytes,
                chunk_bytes: self.g.chunk_bytes,
                max_slots: tolerance,
            }),
            Fault::FlipBits {
                bits: 1,
                one_in: 16,
            },
        );
        self.report.corruptions_planted += 1;
        self.note("silent corruption: one in 16 member writes stores a flipped bit".to_string());
    }
}

/// Runs seeds `first..first + count` and sums their reports; failures are collected, not raised.
pub fn run_seeds(first: u64, count: u64, cfg: &SimConfig) -> (SimTotals, Vec<SimFailure>) {
    let mut totals = SimTotals::new();
    let mut failures = Vec::new();
    for seed in first..first + count {
        match run_seed(seed, cfg) {
            Ok(r) => totals.add(&r),
            Err(f) => {
                totals.add_failure(&f);
                failures.push(f);
            }
        }
    }
    (totals, failures)
}

// The member stack the simulator drives must itself be a MemberIo the array can own.
const _: fn() = || {
    fn member_io<T: MemberIo + 'static>() {}
    member_io::<Io>();
};
