//! Runs the seeded simulation (see `paraid_engine::sim`) over many seeds, or replays one.
//!
//!   cargo run --release -p paraid-engine --example sim -- --seeds 100000 [--first N] [--jobs N]
//!   cargo run --release -p paraid-engine --example sim -- --seed 1234 --verbose
//!   options: --ops N (steps per seed), --classes today|all|name,name,... (fault classes), --strict (known
//!   engine bugs count as violations), --concurrent (batches of requests at once from several threads; their
//!   interleaving is not seeded), --failing-new-members (one blank member in three fails while it is rebuilt),
//!   --commit-streams (half the single writes continue a stream of small writes, often followed by a flush),
//!   --long-streams (with --commit-streams, one stream write in four runs from two pages up to two chunks),
//!   --parity reference|cpu|gpu (the array's parity backend; gpu: every batched operation on the GPU, and the
//!   run fails if the GPU is missing or was switched off by a failure, since the CPU would then have done the work)

use std::time::Instant;

use paraid_engine::sim::{
    gpu_parity_batches, parity_available, run_seed, run_seeds, Classes, SimConfig, SimParity,
};

struct Args {
    seed: Option<u64>,
    seeds: u64,
    first: u64,
    jobs: usize,
    cfg: SimConfig,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        seed: None,
        seeds: 1000,
        first: 0,
        jobs: std::thread::available_parallelism().map_or(1, |n| n.get()),
        cfg: SimConfig::ci(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = |name: &str| it.next().ok_or_else(|| format!("{name} needs a value"));
        let number = |name: &str, v: String| -> Result<u64, String> {
            v.parse()
                .map_err(|_| format!("{name}: '{v}' is not a number"))
        };
        match flag.as_str() {
            "--seed" => args.seed = Some(number("--seed", value("--seed")?)?),
            "--seeds" => args.seeds = number("--seeds", value("--seeds")?)?,
            "--first" => args.first = number("--first", value("--first")?)?,
            "--jobs" => args.jobs = number("--jobs", value("--jobs")?)?.max(1) as usize,
            "--ops" => args.cfg.ops = number("--ops", value("--ops")?)? as usize,
            "--classes" => args.cfg.classes = Classes::parse(&value("--classes")?)?,
            "--verbose" => args.cfg.verbose = true,
            "--strict" => args.cfg.strict = true,
            "--concurrent" => args.cfg.concurrent = true,
            "--failing-new-members" => args.cfg.failing_new_members = true,
            "--commit-streams" => args.cfg.commit_streams = true,
            "--long-streams" => args.cfg.long_streams = true,
            "--hot-rewrites" => args.cfg.hot_rewrites = true,
            "--rebuild-power-losses" => args.cfg.rebuild_power_losses = true,
            "--small-ring" => args.cfg.small_ring = true,
            "--shake" => args.cfg.shake = true,
            "--steady-steps" => args.cfg.steady_steps = true,
            "--write-back" => args.cfg.write_back = true,
            "--journal" => args.cfg.journal = true,
            "--parity" => args.cfg.parity = SimParity::parse(&value("--parity")?)?,
            "--help" | "-h" => {
                println!(
                    "sim [--seed N | --seeds N --first N --jobs N] [--ops N] [--classes today|all|a,b,..] [--strict] [--concurrent] [--failing-new-members] [--commit-streams] [--long-streams] [--hot-rewrites] [--small-ring] [--shake] [--steady-steps] [--rebuild-power-losses] [--write-back] [--journal] [--parity reference|cpu|gpu] [--verbose]"
                );
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument '{other}' (try --help)")),
        }
    }
    Ok(args)
}

fn main() {
    // RUST_LOG=warn (or debug) shows what the engine says while a seed replays; silent otherwise.
    let _ = env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("off"))
        .try_init();
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("sim: {e}");
            std::process::exit(2);
        }
    };
    if let Err(e) = parity_available(&args.cfg) {
        eprintln!("sim: --parity {}: {e}", args.cfg.parity.name());
        std::process::exit(2);
    }
    if let Some(seed) = args.seed {
        let cfg = SimConfig {
            verbose: true,
            ..args.cfg
        };
        match run_seed(seed, &cfg) {
            Ok(report) => {
                println!("seed {seed} passed\n{report:#?}");
                let quiet = SimConfig {
                    verbose: false,
                    ..cfg
                };
                let again = run_seed(seed, &quiet).map(|r| r.trace_digest);
                let same = again.as_ref().ok() == Some(&report.trace_digest);
                println!(
                    "replays exactly: {}{}",
                    if same { "yes" } else { "no" },
                    if cfg.concurrent {
                        " (with --concurrent the threads' interleaving is not seeded)"
                    } else {
                        ""
                    }
                );
            }
            Err(f) => {
                eprintln!("{f}");
                std::process::exit(1);
            }
        }
        if !gpu_stayed_on(&args.cfg) {
            std::process::exit(1);
        }
        return;
    }
    println!(
        "simulating seeds {}..{} ({} steps each, classes {}{}{}{}{}{}{}{}{}{}{}{}, parity {}) on {} threads",
        args.first,
        args.first + args.seeds,
        args.cfg.ops,
        args.cfg.classes.names(),
        if args.cfg.concurrent {
            ", concurrent batches"
        } else {
            ""
        },
        if args.cfg.failing_new_members {
            ", failing new members"
        } else {
            ""
        },
        if args.cfg.commit_streams {
            ", commit streams"
        } else {
            ""
        },
        if args.cfg.long_streams {
            ", long stream writes"
        } else {
            ""
        },
        if args.cfg.hot_rewrites {
            ", hot rewrites"
        } else {
            ""
        },
        if args.cfg.small_ring {
            ", small log rings"
        } else {
            ""
        },
        if args.cfg.shake {
            ", shaken timing"
        } else {
            ""
        },
        if args.cfg.steady_steps {
            ", steady steps"
        } else {
            ""
        },
        if args.cfg.rebuild_power_losses {
            ", power losses mid-rebuild"
        } else {
            ""
        },
        if args.cfg.write_back {
            ", write-back"
        } else {
            ""
        },
        if args.cfg.journal { ", journal" } else { "" },
        args.cfg.parity.name(),
        args.jobs
    );
    let cfg = SimConfig {
        verbose: false,
        ..args.cfg
    };
    let started = Instant::now();
    let (totals, _failures) =
        run_seeds(args.first, args.seeds, args.jobs, &cfg, &|done, failure| {
            if let Some(f) = failure {
                eprintln!("{f}");
            }
            if done % 1000 == 0 {
                eprintln!(
                    "{done} seeds done, {:.0} s",
                    started.elapsed().as_secs_f64()
                );
            }
        });
    println!("{totals}");
    println!(
        "elapsed            {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let gpu_ok = gpu_stayed_on(&cfg);
    if totals.violations > 0 || !gpu_ok {
        std::process::exit(1);
    }
}

/// Under `--parity gpu`: prints where the parity batches ran; false when the GPU was switched off by a failure
/// (the CPU then did the rest, and the run did not test what it was asked to) or ran nothing.
fn gpu_stayed_on(cfg: &SimConfig) -> bool {
    if cfg.parity != SimParity::Gpu {
        return true;
    }
    match gpu_parity_batches() {
        Some((b, still_on)) => {
            let on_gpu = b.gpu_staged + b.gpu_in_place;
            println!(
                "parity batches     {on_gpu} on the GPU ({} of them in place), {} on the CPU (those the GPU does not take: nothing to recover, too many chunks); GPU {}",
                b.gpu_in_place,
                b.cpu,
                if still_on { "still on" } else { "SWITCHED OFF by a failure" }
            );
            still_on && on_gpu > 0
        }
        None => {
            println!("parity batches     no GPU was opened");
            false
        }
    }
}
