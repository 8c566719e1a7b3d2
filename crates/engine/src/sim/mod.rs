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
mod config;
mod members;
pub mod model;
mod report;
mod restarts;

pub use config::{Classes, SimConfig, SimParity};
pub use report::{SeedReport, SimFailure, SimTotals};

use std::collections::VecDeque;
use std::fmt;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use crate::array::held::{self, HeldRegion, HeldStore};
use crate::fault::{
    Count, CrashMembers, CrashPolicy, Fault, FaultCounts, FaultyMembers, OpKinds, RuleId, Scope,
    SplitMix64,
};
use crate::layout::{Geometry, Level, MAX_MEMBERS, PAGE_BYTES};
use crate::member::{MemberIo, NewMember};
use crate::superblock::{SlotState, DEFAULT_DATA_OFFSET_BYTES, SUPERBLOCK_BYTES};
use crate::{
    assemble_io, create_io_with_data_offset, AddOutcome, Array, AssembleOptions, EngineError,
    WriteBack, WriteBackConfig,
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

/// Write-back in the simulator (`SimConfig::write_back`): few threads and little room, so that writes often find
/// every thread busy and take the ordinary path beside held ones; writes up to a stripe or so are held, longer
/// ones take the ordinary path.
const SIM_WRITE_BACK: WriteBackConfig = WriteBackConfig {
    threads: 4,
    limit_bytes: 256 << 10,
    max_write_bytes: 64 << 10,
    answer: crate::Answer::WhenHeld,
};

/// A client write through `front`: the pool's way, or (`caller`) the caller's-thread way
/// (`WriteBack::write_answering`, as the NBD server's); says how it was answered.
fn write_through(
    front: &WriteBack,
    offset_bytes: u64,
    data: &[u8],
    fua: bool,
    caller: bool,
) -> Result<crate::Answered, EngineError> {
    if !caller {
        return front.write_answered(offset_bytes, data, fua);
    }
    let answered = std::cell::Cell::new(false);
    front.write_answering(offset_bytes, data, fua, &|| answered.set(true))?;
    Ok(if answered.get() {
        crate::Answered::FromLog
    } else {
        crate::Answered::Written
    })
}

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
    /// Writers at work from which the log counts as deep (`AssembleOptions::log_deep_writers`), every assembly of
    /// this seed: always, one, two or four (the default), so that journal writes take each of their ways.
    log_deep_writers: usize,
    /// Journal mode: lone answers (`AssembleOptions::journal_lone_answers`), every assembly of this seed.
    journal_lone_answers: bool,
    /// Journal mode with lone answers: each early answer gated on "spare CPU" (`AssembleOptions::spare_cpu`), a
    /// seeded stream of answers (`SeededSpareCpu`), for half of those seeds; the seed of the stream.
    spare_cpu_seed: Option<u64>,
    /// The draws of `hot_rewrites`, and its hot extents (first page, pages), fixed by the seed.
    hot_rng: SplitMix64,
    /// Whether a failed member comes back instead of a blank one (`members.rs`, runtime re-add): a stream of its
    /// own, drawn only when a failed member is there to come back, so other draws keep their schedule.
    readd_rng: SplitMix64,
    /// Whether a re-assembly is first looked at read-only (`restarts.rs`, `read_only_look`): a stream of its own.
    read_only_rng: SplitMix64,
    /// The draws of `rebuild_power_losses`: a stream of its own.
    rebuild_cut_rng: SplitMix64,
    hot_extents: Vec<(u64, u64)>,
    g: Geometry,
    data_offset_bytes: u64,
    member_bytes: u64,
    io: Arc<Io>,
    array: Option<Array>,
    /// Where client requests go, made at every assembly: write-back in front of `array` with
    /// `SimConfig::write_back`, else one that holds nothing (every request straight to the array).
    write_back: Option<WriteBack>,
    /// Where write-back keeps its held writes (`SimConfig::write_back`): survives the kills this run plays, not its
    /// power losses (held.rs).
    held_region: Option<Arc<HeldRegion>>,
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
    /// The re-assembly under way follows a kill of the process (or a clean stop), not a power loss, and nothing
    /// answered was only held in memory (`SimConfig::write_back` off): every acknowledged write must read back,
    /// flushed or not (`BlockModel::check_after_kill_forgiving`).
    after_kill: bool,
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

/// The process's one GPU backend for `SimParity::Gpu` (every batched operation on the GPU), or why there is none.
fn sim_gpu() -> Result<Arc<paraid_parity::cuda::CudaBackend>, String> {
    static GPU: OnceLock<Result<Arc<paraid_parity::cuda::CudaBackend>, String>> = OnceLock::new();
    GPU.get_or_init(|| {
        paraid_parity::cuda::CudaBackend::new(
            paraid_parity::cpu_best(),
            paraid_parity::cuda::GpuPolicy::Always,
        )
        .map(Arc::new)
        .map_err(|e| e.to_string())
    })
    .clone()
}

/// Where the simulated arrays' parity went under `SimParity::Gpu` (batches staged, in place, on the CPU), and whether
/// the GPU is still on: a GPU that failed is switched off and the CPU takes over, which the simulation would not
/// notice, so a run that means to test the GPU must check this. None: no GPU opened.
pub fn gpu_parity_batches() -> Option<(paraid_parity::BatchCounts, bool)> {
    use paraid_parity::Backend;
    let gpu = sim_gpu().ok()?;
    Some((gpu.batch_counts()?, gpu.gpu_enabled()))
}

/// Whether the parity backend `cfg` asks for can be had here; the reason when not (no GPU).
pub fn parity_available(cfg: &SimConfig) -> Result<(), String> {
    match cfg.parity {
        SimParity::Gpu => sim_gpu().map(|_| ()),
        SimParity::Reference | SimParity::Cpu => Ok(()),
    }
}

/// The backend the simulated array computes its parity with (the audit always uses the reference).
fn array_parity(cfg: &SimConfig) -> Arc<dyn paraid_parity::Backend> {
    match cfg.parity {
        SimParity::Reference => reference(),
        SimParity::Cpu => paraid_parity::cpu_best(),
        SimParity::Gpu => match sim_gpu() {
            Ok(gpu) => gpu,
            // parity_available is checked before any seed runs; a seed never silently runs without it.
            Err(e) => panic!("simulation asked for GPU parity, but there is no GPU: {e}"),
        },
    }
}

/// The options every assembly of a seed starts from: the configuration's parity backend, and the seed's stripe
/// cache budget, log rounds in flight and log depth.
fn assemble_options(
    cfg: &SimConfig,
    stripe_cache_bytes: usize,
    log_rounds: usize,
    log_deep_writers: usize,
    journal_lone_answers: bool,
    spare_cpu_seed: Option<u64>,
) -> AssembleOptions {
    AssembleOptions {
        spare_cpu: spare_cpu_seed.map(|seed| {
            Arc::new(crate::spare_cpu::SeededSpareCpu::new(seed))
                as Arc<dyn crate::spare_cpu::SpareCpu>
        }),
        stripe_cache_bytes: Some(stripe_cache_bytes),
        log_rounds_in_flight: Some(log_rounds),
        log_deep_writers: Some(log_deep_writers),
        journal: cfg.journal,
        journal_lone_answers,
        ..AssembleOptions::new(array_parity(cfg))
    }
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
    // Log depth (journal mode): a stream of its own too.
    let log_deep_writers = *SplitMix64::derive(seed, 0xDEE9).pick(&[0usize, 1, 2, 4]);
    // Lone answers (journal mode): on for half the seeds, a stream of its own too.
    let journal_lone_answers = *SplitMix64::derive(seed, 0x1011E).pick(&[false, true]);
    // The gate on spare CPU (lone answers): on for half of those seeds, a stream of its own too.
    let spare_cpu_seed = (journal_lone_answers
        && *SplitMix64::derive(seed, 0xC9B5).pick(&[false, true]))
    .then(|| SplitMix64::derive(seed, 0xC9B6).next_u64());
    let array = assemble_io(
        io.clone(),
        assemble_options(
            cfg,
            stripe_cache_bytes,
            log_rounds,
            log_deep_writers,
            journal_lone_answers,
            spare_cpu_seed,
        ),
    )
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
        write_back: None,
        held_region: None,
        failed: vec![false; members],
        evicted: vec![false; members],
        fail_rules: vec![None; members],
        gone: vec![false; members],
        stale: vec![None; members],
        stale_behind: vec![false; members],
        beyond: false,
        after_kill: false,
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
        log_deep_writers,
        journal_lone_answers,
        spare_cpu_seed,
        hot_rng: SplitMix64::derive(seed, 0x407),
        readd_rng: SplitMix64::derive(seed, 0x2EADD),
        read_only_rng: SplitMix64::derive(seed, 0x2EAD0),
        rebuild_cut_rng: SplitMix64::derive(seed, 0xC7EB),
        hot_extents: hot_extents(seed, g.array_bytes()),
    };
    run.note(format!(
        "start: {geometry_text}, array {} bytes, stripe cache {stripe_cache_bytes} bytes, {log_rounds} log \
         round(s) in flight, log deep from {log_deep_writers} writer(s) at work, lone answers \
         {journal_lone_answers}, gated on spare CPU {}",
        g.array_bytes(),
        spare_cpu_seed.is_some()
    ));
    run.after_assembly()
        .map_err(|what| run.failure(what, &geometry_text))?;
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

    /// Where client requests go (`write_back`).
    fn front(&self) -> &WriteBack {
        self.write_back
            .as_ref()
            .expect("the array runs between restarts")
    }

    /// Lets every held write finish (before a step that acts on members or faults, so that what the simulator
    /// believes about them is what the array did).
    fn settle_write_back(&self) {
        if let Some(w) = &self.write_back {
            w.settle();
        }
    }

    /// Ends write-back before the array goes (its threads write what they hold first; after a power cut those
    /// writes fail): counts what it held and returns the first held write that failed, if any.
    fn close_write_back(&mut self) -> Result<(), EngineError> {
        match self.write_back.take() {
            Some(w) => {
                let stats = w.stats();
                self.report.held_writes += stats.held_writes;
                self.report.answered_from_log += stats.answered_from_log;
                w.close()
            }
            None => Ok(()),
        }
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
    /// `assemble_options` of this seed.
    fn assemble_options(&self) -> AssembleOptions {
        assemble_options(
            self.cfg,
            self.stripe_cache_bytes,
            self.log_rounds,
            self.log_deep_writers,
            self.journal_lone_answers,
            // Each assembly its own stream (the same seed would replay the first assembly's answers).
            self.spare_cpu_seed
                .map(|seed| seed.wrapping_add(self.step as u64)),
        )
    }

    fn after_assembly(&mut self) -> Result<(), String> {
        let store = self.held_store()?;
        let config = if self.cfg.journal {
            WriteBackConfig {
                answer: crate::Answer::FromLog,
                ..SIM_WRITE_BACK
            }
        } else if self.cfg.write_back {
            SIM_WRITE_BACK
        } else {
            WriteBackConfig::OFF
        };
        self.write_back = self
            .array
            .as_ref()
            .map(|a| WriteBack::with_store(a, config, store));
        if let Some(array) = self.array.as_ref() {
            self.report.pages_rolled_forward += array.integrity().log_pages_rolled_forward;
            array.set_integrity_tick(false);
            array.set_bitmap_idle_clear(Duration::from_secs(3600));
            // Probes of a slow member by count alone: by time they would depend on how fast the host runs.
            array.set_slow_probe_interval(Duration::ZERO);
            if self.cfg.rebuild_power_losses || self.cfg.failing_new_members {
                // Batches of a row or two and a checkpoint after each: a power loss in the middle of a rebuild
                // finds several, and so does a new member that fails in the middle of its rebuild and comes back
                // (re-added below its checkpoint).
                array.set_rebuild_checkpoint_bytes(1);
                array.set_rebuild_batch_rows(1 + self.rebuild_cut_rng.below(2));
            }
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
        Ok(())
    }

    /// With write-back that answers when it holds (`SimConfig::write_back`): writes what the store kept when the
    /// process was last killed into the new array (held.rs, `replay`), then gives the store, emptied, to the new
    /// write-back. None otherwise.
    fn held_store(&mut self) -> Result<Option<HeldStore>, String> {
        if !self.cfg.write_back || self.cfg.journal {
            return Ok(None);
        }
        let Some(array) = self.array.as_ref() else {
            return Ok(None);
        };
        let region = self
            .held_region
            .get_or_insert_with(|| {
                Arc::new(HeldRegion::in_memory(HeldStore::region_bytes(
                    SIM_WRITE_BACK.threads,
                    SIM_WRITE_BACK.max_write_bytes,
                )))
            })
            .clone();
        let replayed = held::replay(array, &region);
        match replayed {
            Ok(r) => {
                self.report.held_replayed += r.written as u64;
                if r.written > 0 {
                    self.note(format!(
                        "{} held writes written again from the store",
                        r.written
                    ));
                }
                if let Some(why) = r.why_dropped {
                    // The read-back decides whether that lost an answered write.
                    self.note(format!(
                        "{} held writes in the store not written: {why}",
                        r.dropped
                    ));
                }
            }
            Err(e) if self.beyond => self.note(format!("held writes not written again: {e}")),
            Err(e) => return Err(format!("writing the held writes again failed: {e}")),
        }
        let array = self.array.as_ref().expect("checked above");
        Ok(Some(HeldStore::format(
            region,
            array,
            SIM_WRITE_BACK.threads,
            SIM_WRITE_BACK.max_write_bytes,
        )))
    }

    /// Whether write-back's store holds writes a kill cut short, which only a read-write start writes.
    fn held_writes_pending(&self) -> bool {
        self.held_region
            .as_ref()
            .and_then(|r| HeldStore::leftover(r))
            .is_some_and(|left| !left.writes.is_empty())
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
            let step = self.pick_step();
            if !matches!(
                step,
                Step::Write
                    | Step::Read
                    | Step::Flush
                    | Step::Discard
                    | Step::WriteZeroes
                    | Step::Batch
            ) {
                self.settle_write_back();
            }
            // With an unreadable page armed, a write may fail within the level's tolerance (its page cannot be
            // rebuilt where redundancy is exhausted); such a write must fail to its writer, as the model assumes,
            // so nothing is held meanwhile.
            if let Some(w) = &self.write_back {
                w.set_holding(!self.lse_armed);
            }
            match step {
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

    /// The next write of the commit stream (`commit_streams`): one or two pages (with `long_streams`, one time in
    /// four up to two chunks), continuing the last one or (one time in four) rewriting its last page; now and then
    /// the stream starts over somewhere else.
    fn stream_extent(&mut self) -> (u64, usize) {
        let page = PAGE_BYTES;
        let array_bytes = self.model.array_bytes();
        let pages = if self.cfg.long_streams && self.stream_rng.one_in(4) {
            let chunk_pages = self.g.chunk_bytes / page;
            self.stream_rng.range(2, 2 * chunk_pages)
        } else {
            self.stream_rng.range(1, 2)
        };
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
        // directly (write/parity.rs), elsewhere through scratch, so both paths run.
        let mut buf = crate::buf::AlignedBuf::zeroed(len);
        self.rng.fill(&mut buf[..len]);
        let data = &buf[..len];
        let fua = self.rng.one_in(4);
        self.report.writes += 1;
        // Half the writes the caller's-thread way.
        let caller = self.cfg.journal && self.rng.one_in(2);
        match write_through(self.front(), offset, data, fua, caller) {
            Ok(answered) => {
                // Answered from the journal: durable as if FUA.
                let durable = fua || answered == crate::Answered::FromLog;
                self.note(format!("write {offset}+{len} fua={fua}: ok ({answered:?})"));
                self.model
                    .write(offset, data, WriteOutcome::Acked { durable });
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
        match read_front(self.front(), offset, &mut got) {
            Ok(()) => {
                let blocks = self
                    .model
                    .check_read(offset, &got)
                    .map_err(|m| format!("read {offset}+{len} returned wrong data: {m}"))?;
                self.report.blocks_verified += blocks;
                self.note(format!("read {offset}+{len}: {blocks} blocks verified"));
                self.check_allocation(offset, len as u64)?;
            }
            Err(e) => self.request_failed(&format!("read {offset}+{len}"), &e)?,
        }
        self.sync_slot_states();
        Ok(())
    }

    /// What block status reports for the range just read (`Array::allocation`): every hole must read as zeros,
    /// so each is checked against the model as a read that returned zeros. It draws nothing from the seed's
    /// streams and issues no member I/O, so schedules and replays are as without it.
    fn check_allocation(&mut self, offset: u64, len: u64) -> Result<(), String> {
        let extents = match self.front().allocation(offset, len) {
            Ok(extents) => extents,
            // The read may have evicted members on its way (a dying member's reads reconstructed): a failure is
            // then judged as any request's.
            Err(e) => return self.request_failed(&format!("block status of {offset}+{len}"), &e),
        };
        let mut at = offset;
        for extent in extents {
            if extent.hole {
                let zeros = vec![0u8; extent.len_bytes as usize];
                let blocks = self.model.check_read(at, &zeros).map_err(|m| {
                    format!(
                        "block status of {offset}+{len} reported a hole at {at}+{} that does not read as zeros: {m}",
                        extent.len_bytes
                    )
                })?;
                self.report.hole_blocks_verified += blocks;
            }
            at += extent.len_bytes;
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<(), String> {
        self.report.flushes += 1;
        match self.front().flush() {
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
            self.front().write_zeroes(offset, len as u64, fua)
        } else {
            self.front().discard(offset, len as u64)
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

// The member stack the simulator drives must itself be a MemberIo the array can own.
const _: fn() = || {
    fn member_io<T: MemberIo + 'static>() {}
    member_io::<Io>();
};

/// A client read of `buf.len()` bytes at `offset_bytes`, as the simulator makes it: at odd pages through
/// `WriteBack::read_many` (`read_in_parts`), elsewhere through `WriteBack::read`. Decided from the extent, not
/// drawn: the seed's streams, and so every schedule, stay as they were before reads went both ways.
pub(super) fn read_front(
    front: &WriteBack,
    offset_bytes: u64,
    buf: &mut [u8],
) -> Result<(), EngineError> {
    if (offset_bytes / PAGE_BYTES) % 2 == 1 {
        read_in_parts(front, offset_bytes, buf)
    } else {
        front.read(offset_bytes, buf)
    }
}

/// `buf.len()` bytes at `offset_bytes` through `WriteBack::read_many`: cut at page boundaries into up to three
/// reads, each into a page-aligned buffer of its own (so that whole pages are read in place, batched), then
/// copied into `buf`. The first failure is the result.
fn read_in_parts(front: &WriteBack, offset_bytes: u64, buf: &mut [u8]) -> Result<(), EngineError> {
    let end = offset_bytes + buf.len() as u64;
    let mut cuts = vec![offset_bytes];
    let mut at = offset_bytes.next_multiple_of(PAGE_BYTES);
    while cuts.len() < 3 && at < end {
        if at > offset_bytes {
            cuts.push(at);
        }
        at += PAGE_BYTES * (1 + (at / PAGE_BYTES) % 3);
    }
    cuts.push(end);
    let mut parts: Vec<crate::buf::AlignedBuf> = cuts
        .windows(2)
        .map(|w| crate::buf::AlignedBuf::zeroed((w[1] - w[0]) as usize))
        .collect();
    let mut reads: Vec<(u64, &mut [u8])> = cuts
        .windows(2)
        .zip(parts.iter_mut())
        .map(|(w, part)| (w[0], &mut part[..(w[1] - w[0]) as usize]))
        .collect();
    for result in front.read_many(&mut reads) {
        result?;
    }
    for (at, part) in reads {
        let from = (at - offset_bytes) as usize;
        buf[from..from + part.len()].copy_from_slice(part);
    }
    Ok(())
}
