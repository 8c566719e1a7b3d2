//! What a simulation run injects and how it runs: fault classes and options.

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
    /// Also make one blank member in three fail while it is rebuilt: a write of its rebuilt data, one of its first
    /// four flushes, or a write of its bitmap and log ring as it joins (never in a rebuild the power is cut in). Rebuilds then go in batches of a row or two with
    /// a checkpoint after each (as with `rebuild_power_losses`), so that a member that fails in the middle and is
    /// offered back holds a checkpoint. Drawn from a stream of its own, so with this off every seed keeps the
    /// schedule it had before the option existed.
    pub failing_new_members: bool,
    /// Also make half of the single writes a commit stream: one or two pages at a time, each continuing the
    /// previous one or rewriting its last page (a database's log), often followed by a flush. This is what the
    /// partial parity log's stream entries serve (array/ppl/). Drawn from a stream of its own.
    pub commit_streams: bool,
    /// With `commit_streams`, make one stream write in four longer: from two pages up to two chunks, continuing
    /// the stream as a sequential writer that waits for each write does (`dd oflag=direct`). Such writes end
    /// inside a stripe or at its end, which decides whether the journal answers them early (ppl/streams.rs,
    /// `note_waited_for`). Drawn from the commit stream's own stream, so with this off every seed keeps its
    /// schedule.
    pub long_streams: bool,
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
    /// Also cut the power in the middle of one rebuild in three (after a random number of its member writes, with
    /// a checkpoint after every batch), then re-assemble: the restarted rebuild resumes from a checkpoint, which
    /// must name only rows the new member holds durably (stop 29 found one that did not). Needs the class
    /// `crash-degraded` (a rebuilding array is degraded). Drawn from a stream of its own; the cut point counts
    /// member writes of the rebuild's worker threads, so the outcome is not exactly replayable.
    pub rebuild_power_losses: bool,
    /// Client requests go through write-back (`array/write_back.rs`): small writes are answered once held and
    /// written by its threads while the next steps run, so reads must wait for them, flushes must make them
    /// durable, and power losses and kills cut them. Member and fault steps first let held writes finish (the
    /// simulator's view of which members failed must be exact when it draws the next fault); power losses and
    /// kills in the middle of requests cut held writes. The background threads' timing is not seeded.
    pub write_back: bool,
    /// Journal mode (`AssembleOptions::journal`): client requests go through a write-back pool that answers small
    /// writes once their data is durable in the log (`Answer::FromLog`), and the model takes such a write as
    /// durable when answered, as a FUA write: power losses and kills right after must keep it.
    pub journal: bool,
    /// Which parity backend the array computes with (the audit always uses the reference). The reference by
    /// default; `Cpu` is the SIMD kernel `--parity-backend cpu` picks; `Gpu` sends every batched stripe
    /// operation to the GPU (`GpuPolicy::Always`), so that a GPU machine runs the whole fault model against it.
    pub parity: SimParity,
}

/// The parity backend of the simulated array (`--parity reference|cpu|gpu`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SimParity {
    #[default]
    Reference,
    Cpu,
    Gpu,
}

impl SimParity {
    pub fn parse(text: &str) -> Result<SimParity, String> {
        match text {
            "reference" => Ok(SimParity::Reference),
            "cpu" => Ok(SimParity::Cpu),
            "gpu" => Ok(SimParity::Gpu),
            other => Err(format!(
                "--parity: '{other}' is not one of reference, cpu, gpu"
            )),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            SimParity::Reference => "reference",
            SimParity::Cpu => "cpu",
            SimParity::Gpu => "gpu",
        }
    }
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
            long_streams: false,
            hot_rewrites: false,
            small_ring: false,
            shake: false,
            steady_steps: false,
            rebuild_power_losses: false,
            write_back: false,
            journal: false,
            parity: SimParity::Reference,
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
            && !self.long_streams
            && !self.hot_rewrites
            && !self.small_ring
            && !self.shake
            && !self.steady_steps
            && !self.rebuild_power_losses
            && !self.write_back
            && !self.journal
            && self.parity == SimParity::Reference
        {
            format!(
                "PARAID_SIM_SEED={seed} cargo test -p paraid-engine --profile release-test --test sim -- \
                 --nocapture   (or: cargo run --release -p paraid-engine --example sim -- --seed {seed} --verbose)"
            )
        } else {
            format!(
                "cargo run --release -p paraid-engine --example sim -- --seed {seed} --ops {} --classes \
                 {}{}{}{}{}{}{}{}{}{}{}{}{}{} --verbose{}",
                self.ops,
                self.classes.names(),
                if self.strict { " --strict" } else { "" },
                if self.commit_streams {
                    " --commit-streams"
                } else {
                    ""
                },
                if self.long_streams {
                    " --long-streams"
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
                if self.rebuild_power_losses {
                    " --rebuild-power-losses"
                } else {
                    ""
                },
                if self.write_back { " --write-back" } else { "" },
                if self.journal { " --journal" } else { "" },
                match self.parity {
                    SimParity::Reference => String::new(),
                    other => format!(" --parity {}", other.name()),
                },
                if self.concurrent
                    || self.shake
                    || self.rebuild_power_losses
                    || self.write_back
                    || self.journal
                {
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
