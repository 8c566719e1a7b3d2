//! Runs the seeded simulation (see `paraid_engine::sim`) over many seeds, or replays one.
//!
//!   cargo run --release -p paraid-engine --example sim -- --seeds 100000 [--first N] [--jobs N]
//!   cargo run --release -p paraid-engine --example sim -- --seed 1234 --verbose
//!   options: --ops N (steps per seed), --classes today|all|name,name,... (fault classes), --strict (known
//!   engine bugs count as violations), --concurrent (batches of requests at once from several threads; their
//!   interleaving is not seeded), --failing-new-members (one blank member in three fails while it is rebuilt)

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use paraid_engine::sim::{run_seed, Classes, SimConfig, SimFailure, SimTotals};

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
            "--help" | "-h" => {
                println!(
                    "sim [--seed N | --seeds N --first N --jobs N] [--ops N] [--classes today|all|a,b,..] [--strict] [--concurrent] [--failing-new-members] [--verbose]"
                );
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument '{other}' (try --help)")),
        }
    }
    Ok(args)
}

fn panic_text(panic: Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default()
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
        return;
    }
    println!(
        "simulating seeds {}..{} ({} steps each, classes {}{}{}) on {} threads",
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
        args.jobs
    );
    let cfg = SimConfig {
        verbose: false,
        ..args.cfg
    };
    let next = Arc::new(AtomicU64::new(args.first));
    let done = Arc::new(AtomicU64::new(0));
    let totals = Arc::new(Mutex::new(SimTotals::new()));
    let failures: Arc<Mutex<Vec<SimFailure>>> = Arc::new(Mutex::new(Vec::new()));
    let started = Instant::now();
    let end = args.first + args.seeds;
    let workers: Vec<_> = (0..args.jobs)
        .map(|_| {
            let (next, done, totals, failures, cfg) = (
                next.clone(),
                done.clone(),
                totals.clone(),
                failures.clone(),
                cfg.clone(),
            );
            std::thread::spawn(move || loop {
                let seed = next.fetch_add(1, Ordering::Relaxed);
                if seed >= end {
                    break;
                }
                let outcome =
                    std::panic::catch_unwind(|| run_seed(seed, &cfg)).unwrap_or_else(|p| {
                        Err(SimFailure {
                            seed,
                            op: 0,
                            what: format!("panicked: {}", panic_text(p)),
                            geometry: String::new(),
                            trace: Vec::new(),
                            replay: cfg.replay(seed),
                        })
                    });
                match outcome {
                    Ok(r) => totals
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .add(seed, &r),
                    Err(f) => {
                        eprintln!("{f}");
                        totals
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .add_failure(&f);
                        failures.lock().unwrap_or_else(|e| e.into_inner()).push(f);
                    }
                }
                let n = done.fetch_add(1, Ordering::Relaxed) + 1;
                if n % 1000 == 0 {
                    eprintln!("{n} seeds done, {:.0} s", started.elapsed().as_secs_f64());
                }
            })
        })
        .collect();
    for w in workers {
        let _ = w.join();
    }
    let totals = totals.lock().unwrap_or_else(|e| e.into_inner());
    println!("{totals}");
    println!(
        "elapsed            {:.1} s",
        started.elapsed().as_secs_f64()
    );
    if totals.violations > 0 {
        std::process::exit(1);
    }
}
