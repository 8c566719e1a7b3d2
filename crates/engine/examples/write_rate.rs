//! Whole-stripe write rate and what it costs the host, per parity backend and per kind of request memory: a
//! RAID6 of member files (default: six of 1 GiB on /dev/shm, 64 KiB chunks), written by several threads at once,
//! each walking its own part of the array in requests of whole stripes, as a client's sequential writes reach
//! the engine from NBD or ublk. Then a check of every stripe, which must find no mismatch.
//!
//! The request memory is either what the array lends its frontends (`Array::payload_memory`: a GPU's
//! registered host memory, where it computes parity in place, what the NBD server receives WRITE payloads
//! into) or plain page-aligned memory (which a GPU must stage through its own slots). Prints, per run, GB/s
//! of client data written, the process's CPU time (every thread) per GB written, and where the parity batches
//! ran.
//!
//! Usage: write_rate [--dir DIR] [--member-mib N] [--members N] [--request-kib N] [--threads N]
//!                   [--seconds S] [--memory lent|plain|both] [cpu|gpu|auto ...]   (default: cpu gpu, both)
//!
//! On tmpfs the member I/O is itself CPU work (the kernel copies every page), so the CPU the GPU saves is the
//! parity's share of the whole; on a drive with O_DIRECT the member I/O is DMA.

#[path = "common/mod.rs"]
mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use paraid_engine::layout::Level;
use paraid_engine::{assemble, create, Array, AssembleOptions, CreateOptions};
use paraid_parity::{select, BackendChoice, HostBuf};

#[derive(Clone, Copy, PartialEq, Eq)]
enum Memory {
    /// `Array::payload_memory`: what the frontends receive into.
    Lent,
    /// Page-aligned memory nobody registered.
    Plain,
}

impl Memory {
    fn name(self) -> &'static str {
        match self {
            Memory::Lent => "lent",
            Memory::Plain => "plain",
        }
    }
}

struct Settings {
    dir: PathBuf,
    member_mib: u64,
    members: usize,
    request_kib: usize,
    threads: usize,
    seconds: f64,
}

fn main() {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    let mut settings = Settings {
        dir: PathBuf::from("/dev/shm"),
        member_mib: 1024,
        members: 6,
        request_kib: 1024,
        threads: 4,
        seconds: 5.0,
    };
    let mut memories = vec![Memory::Lent, Memory::Plain];
    let mut choices: Vec<BackendChoice> = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = |name: &str| {
            args.next()
                .unwrap_or_else(|| panic!("{name} needs a value"))
        };
        match arg.as_str() {
            "--dir" => settings.dir = PathBuf::from(value("--dir")),
            "--member-mib" => {
                settings.member_mib = value("--member-mib").parse().expect("--member-mib N")
            }
            "--members" => settings.members = value("--members").parse().expect("--members N"),
            "--request-kib" => {
                settings.request_kib = value("--request-kib").parse().expect("--request-kib N")
            }
            "--threads" => settings.threads = value("--threads").parse().expect("--threads N"),
            "--seconds" => settings.seconds = value("--seconds").parse().expect("--seconds S"),
            "--memory" => {
                memories = match value("--memory").as_str() {
                    "lent" => vec![Memory::Lent],
                    "plain" => vec![Memory::Plain],
                    "both" => vec![Memory::Lent, Memory::Plain],
                    other => panic!("--memory lent|plain|both, not {other:?}"),
                }
            }
            word => choices.push(word.parse().unwrap_or_else(|e| panic!("{e}"))),
        }
    }
    if choices.is_empty() {
        choices = vec![BackendChoice::Cpu, BackendChoice::Gpu];
    }
    assert!(settings.threads >= 1 && settings.request_kib >= 4);
    let dir = settings
        .dir
        .join(format!("paraid-write-rate-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("create the directory");
    for choice in choices {
        for &memory in &memories {
            run(&dir, &settings, choice, memory);
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

fn run(dir: &Path, settings: &Settings, choice: BackendChoice, memory: Memory) {
    let parity = select(choice);
    let paths: Vec<PathBuf> = (0..settings.members)
        .map(|i| dir.join(format!("m{i}.img")))
        .collect();
    for p in &paths {
        let _ = std::fs::remove_file(p);
    }
    create(&CreateOptions {
        force: false,
        level: Level::Raid6,
        chunk_bytes: 64 << 10,
        name: "write-rate".into(),
        size_bytes: Some((4 + settings.member_mib) << 20),
        members: paths.clone(),
    })
    .expect("create");
    let array = Arc::new(assemble(&paths, AssembleOptions::new(parity.clone())).expect("assemble"));
    let stripe_bytes = array.geometry().stripe_bytes() as usize;
    // Whole stripes: the request rounded to them (at least one).
    let request_bytes = (settings.request_kib << 10).div_ceil(stripe_bytes) * stripe_bytes;
    let stripes_per_thread = array.size_bytes() as usize / stripe_bytes / settings.threads;
    let share_bytes = stripes_per_thread / (request_bytes / stripe_bytes) * request_bytes;
    assert!(
        share_bytes >= request_bytes,
        "members too small for a request per thread"
    );

    // One untimed pass over the array first (every writer its share once), so that the timed writes meet
    // allocated blocks, as on a drive: on tmpfs the first write of a page costs its allocation too.
    let mut shares = Shares::new(&array, memory, settings.threads, request_bytes, share_bytes);
    shares.write(&array, 3600.0, Some(share_bytes));
    let batches_before = parity.batch_counts();
    let cpu0 = common::process_cpu_s();
    let start = Instant::now();
    let written_bytes = shares.write(&array, settings.seconds, None);
    let lent = shares.lent;
    array.flush().expect("flush");
    let seconds = start.elapsed().as_secs_f64();
    let cpu_s = common::process_cpu_s() - cpu0;
    let gb = written_bytes as f64 / 1e9;
    let batches = match (batches_before, parity.batch_counts()) {
        (Some(before), Some(after)) => format!(
            "; batches of the timed writes: {} on the GPU in place, {} staged, {} on the CPU",
            after.gpu_in_place - before.gpu_in_place,
            after.gpu_staged - before.gpu_staged,
            after.cpu - before.cpu
        ),
        _ => String::new(),
    };
    let described = parity.describe();

    array.start_check(false).expect("check");
    assert!(array.wait_idle(Duration::from_secs(3600)), "check finished");
    let check = array.last_result().expect("a check result");
    assert_eq!(check.outcome.as_deref(), Some("completed"), "{check:?}");
    println!(
        "{choice} {mem}: {threads} writers, requests of {req} KiB ({stripes} stripes of {sk} KiB){lent_note}: \
         wrote {gb:.2} GB in {seconds:.2} s: {rate:.2} GB/s; host CPU {cpu_s:.2} s ({per_gb:.2} s per GB, \
         {cores:.2} cores busy); check: {mm} mismatches in {checked:.2} GB; parity: {described}{batches}",
        mem = memory.name(),
        threads = settings.threads,
        req = request_bytes >> 10,
        stripes = request_bytes / stripe_bytes,
        sk = stripe_bytes >> 10,
        lent_note = if memory == Memory::Lent && lent == 0 {
            " (the backend lends no memory: plain)"
        } else {
            ""
        },
        rate = gb / seconds,
        per_gb = cpu_s / gb,
        cores = cpu_s / seconds,
        mm = check.mismatches,
        checked = check.total_bytes as f64 / 1e9,
    );
    assert_eq!(check.mismatches, 0, "the written stripes do not check out");
    drop(array);
    for p in &paths {
        let _ = std::fs::remove_file(p);
    }
}

/// How the writer threads split the array: each writes its own share (`share_bytes` from `t * share_bytes`) in
/// requests of `request_bytes` from its own buffer, in order, wrapping around.
struct Shares {
    /// One request's buffer per writer: lent by the array where `Memory::Lent` asked and it could, else plain.
    bufs: Vec<HostBuf>,
    /// How many of `bufs` the array lent.
    lent: usize,
    request_bytes: usize,
    share_bytes: usize,
}

impl Shares {
    fn new(
        array: &Array,
        memory: Memory,
        threads: usize,
        request_bytes: usize,
        share_bytes: usize,
    ) -> Shares {
        let mut lent = 0;
        let bufs = (0..threads)
            .map(|t| {
                let given = match memory {
                    Memory::Lent => array.payload_memory(request_bytes),
                    Memory::Plain => None,
                };
                lent += given.is_some() as usize;
                let mut buf = given.unwrap_or_else(|| HostBuf::zeroed(request_bytes));
                common::fill(&mut buf[..request_bytes], 0x9e37_79b9_7f4a_7c15 ^ t as u64);
                buf
            })
            .collect();
        Shares {
            bufs,
            lent,
            request_bytes,
            share_bytes,
        }
    }

    /// Writes until `seconds` have passed or, where `limit_bytes` is given, each writer wrote that much.
    /// Returns the bytes written.
    fn write(&mut self, array: &Array, seconds: f64, limit_bytes: Option<usize>) -> u64 {
        let (request_bytes, share_bytes) = (self.request_bytes, self.share_bytes);
        let start = Instant::now();
        let deadline = Duration::from_secs_f64(seconds);
        let limit_bytes = limit_bytes.map_or(u64::MAX, |limit| limit as u64);
        std::thread::scope(|scope| {
            let writers: Vec<_> = self
                .bufs
                .iter_mut()
                .enumerate()
                .map(|(t, buf)| {
                    scope.spawn(move || {
                        let base = (t * share_bytes) as u64;
                        let mut at = 0usize;
                        let mut written = 0u64;
                        while written < limit_bytes && start.elapsed() < deadline {
                            // Each request's bytes differ from the last one's at this place.
                            buf[..8].copy_from_slice(&(written ^ base).to_le_bytes());
                            array
                                .write(base + at as u64, &buf[..request_bytes], false)
                                .expect("write");
                            written += request_bytes as u64;
                            at = (at + request_bytes) % share_bytes;
                        }
                        written
                    })
                })
                .collect();
            writers.into_iter().map(|w| w.join().expect("writer")).sum()
        })
    }
}
