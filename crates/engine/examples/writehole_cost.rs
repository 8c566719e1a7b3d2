//! What closing the write hole costs on writes: the partial parity log on vs off, same run, same member files
//! (default: /dev/shm, tmpfs with O_DIRECT), random 4 KiB and 16 KiB, sequential 1 MiB and 64 KiB and
//! commit-stream writes, RAID5 and RAID6.
//!
//! Usage: cargo run --release -p paraid-engine --example writehole_cost [dir] [seconds per burst] [bursts]
//!
//! `dir` may be `latency:<us>`: members in memory whose every batch of requests takes that long (the requests of
//! a batch run concurrently: a drive bound by its latency, not by its IOPS, as an NVMe drive is at low queue
//! depths), so that what a log costs is its device round trips.
//!
//! `dir` may be `rate:<iops>`: members in memory each serving one read or write at a time, `1/iops` seconds each,
//! requests queueing behind each other (a drive bound by its request rate: a cloud volume at its IOPS limit, or
//! QEMU's throttled disks in `bench/vm`), so that what a log costs is the requests it adds.
//!
//! Every (level, workload, threads) row writes two arrays, one with the log off and one with it on, in short
//! alternating bursts (so that both see the same machine: other load, cache, frequency), swapping their roles
//! halfway, and reports the medians of throughput and of CPU time per write. Both keep the write-intent bitmap:
//! what differs is only the log.
//!
//! Random writes draw new offsets every burst, over the whole array: most miss the stripe cache, as random writes
//! over a large array do. `WRITEHOLE_HOT=on` repeats one stream of offsets in every burst instead: a hot set of a
//! few MiB that the stripe cache holds (a database rewriting its hot pages), where read-modify-writes read nothing.
//! Sequential and commit rows start every burst at the same offsets (whole stripes read nothing; the commit stream
//! rewrites its region, as a database's log does).
//!
//! `WRITEHOLE_JOURNAL=on`: the "log on" array runs in journal mode (`AssembleOptions::journal`), its writes going
//! through a write-back pool that answers each once durable in the log (`Answer::FromLog`), as `paraid serve
//! --consistency-policy journal` does: the cost of the journal against the bitmap alone.
//!
//! `WRITEHOLE_JOURNAL=lone`: the "log on" array runs in journal mode with lone answers
//! (`AssembleOptions::journal_lone_answers`, `PARAID_JOURNAL_LONE=on` for `paraid serve`), and both arrays' writes
//! are served as the NBD server serves them: each on a thread of a pool of two per writer, through
//! `Array::write_answering`, the writer going on once the write is answered (from the log, or when done);
//! `WRITEHOLE_WORKERS=N` gives each writer N workers instead.
//!
//! `WRITEHOLE_JOURNAL=auto`: as `lone`, with each early answer gated on the machine's idle CPU
//! (`AssembleOptions::spare_cpu`, `PARAID_JOURNAL_LONE=auto` for `paraid serve`); the last column adds the
//! writes that found the CPU busy and took the log's way, and those the CPU allowed an early answer beside
//! others that took the log's way because the members queue requests (array/queueing.rs).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use paraid_engine::layout::Level;
use paraid_engine::{
    assemble, create, Answer, Array, AssembleOptions, CreateOptions, WriteBack, WriteBackConfig,
};

/// `WRITEHOLE_JOURNAL=on` (module doc).
fn journal() -> bool {
    std::env::var("WRITEHOLE_JOURNAL")
        .is_ok_and(|v| v == "on" || v == "direct" || v == "lone" || v == "auto")
}

/// `WRITEHOLE_JOURNAL=lone` or `auto` (module doc).
fn journal_lone() -> bool {
    std::env::var("WRITEHOLE_JOURNAL").is_ok_and(|v| v == "lone" || v == "auto")
}

/// `WRITEHOLE_JOURNAL=auto` (module doc).
fn journal_auto() -> bool {
    std::env::var("WRITEHOLE_JOURNAL").is_ok_and(|v| v == "auto")
}

/// `WRITEHOLE_JOURNAL=direct`: journal mode, but every write answered when done (no write-back pool): what the
/// data entries cost apart from answering early.
fn journal_direct() -> bool {
    std::env::var("WRITEHOLE_JOURNAL").is_ok_and(|v| v == "direct")
}

/// Options for an array with the log `log` (and, with `WRITEHOLE_JOURNAL=on`, journal mode with it).
fn options(log: bool) -> AssembleOptions {
    let mut opts = AssembleOptions::new(paraid_parity::cpu_best());
    opts.write_hole_log = log;
    opts.journal = log && journal();
    opts.journal_lone_answers = log && journal_lone();
    opts.spare_cpu = None;
    if log && journal_auto() {
        opts.gate_answers_on_spare_cpu();
    }
    opts
}

/// `WRITEHOLE_JOURNAL=lone`: a writer's writes served as the NBD server serves them (module doc).
struct Served {
    jobs: Option<std::sync::mpsc::Sender<u64>>,
    answers: std::sync::mpsc::Receiver<()>,
    workers: Vec<std::thread::JoinHandle<()>>,
}

impl Served {
    /// Workers (two, or `WRITEHOLE_WORKERS`: the NBD server starts more as requests wait, up to its limit, so a
    /// write answered early and still being written in place holds one of them) writing `bytes`-long writes of
    /// `fill` into `array`.
    fn new(array: &Arc<Array>, bytes: usize, fill: u8) -> Served {
        let (jobs, queue) = std::sync::mpsc::channel::<u64>();
        let (answer, answers) = std::sync::mpsc::channel::<()>();
        let queue = Arc::new(std::sync::Mutex::new(queue));
        let count: usize = std::env::var("WRITEHOLE_WORKERS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(2);
        let workers = (0..count.max(1))
            .map(|_| {
                let (array, queue, answer) = (array.clone(), queue.clone(), answer.clone());
                std::thread::spawn(move || {
                    let buf = vec![fill; bytes];
                    loop {
                        let next = queue.lock().expect("queue").recv();
                        let Ok(offset) = next else { break };
                        let answered = std::cell::Cell::new(false);
                        let hook = || {
                            answered.set(true);
                            let _ = answer.send(());
                        };
                        array.write_answering(offset, &buf, &hook).expect("write");
                        if !answered.get() {
                            let _ = answer.send(());
                        }
                    }
                })
            })
            .collect();
        Served {
            jobs: Some(jobs),
            answers,
            workers,
        }
    }

    /// Sends the write at `offset` to a worker and waits for its answer.
    fn write(&self, offset: u64) {
        self.jobs
            .as_ref()
            .expect("open")
            .send(offset)
            .expect("a worker");
        self.answers.recv().expect("an answer");
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        self.jobs = None;
        for worker in self.workers.drain(..) {
            worker.join().expect("worker");
        }
    }
}

const MEMBER_MIB: u64 = 256;
const CHUNK_BYTES: u64 = 65536;

/// Bursts run so far: each random burst draws its offsets from a stream of its own. When every burst started the
/// same stream (until stop 37), a row's bursts rewrote the same few thousand pages (a hot set of a few MiB), which
/// the stripe cache holds after the first: the read-modify-writes read nothing, unlike random writes over the
/// array. `WRITEHOLE_HOT=on` measures that case on purpose: every burst repeats the same stream.
static BURSTS: AtomicU64 = AtomicU64::new(0);

/// `WRITEHOLE_HOT=on` (see `BURSTS`).
fn hot_set() -> bool {
    std::env::var("WRITEHOLE_HOT").is_ok_and(|v| v == "on")
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Workload {
    Random4k,
    /// Random 16 KiB writes: a database's page flushes (InnoDB's page size).
    Random16k,
    Sequential1m,
    /// Sequential 64 KiB writes: a chunk at a time, less than a stripe (four or five chunks here), as a copy
    /// with `dd bs=64K oflag=direct` writes; each ends inside a stripe but the last of the stripe's.
    Sequential64k,
    /// Sequential 4 KiB writes, each followed by a flush: a database's commit stream.
    Commit4k,
}

impl Workload {
    fn name(self) -> &'static str {
        match self {
            Workload::Random4k => "random 4 KiB",
            Workload::Random16k => "random 16 KiB",
            Workload::Sequential1m => "sequential 1 MiB",
            Workload::Sequential64k => "sequential 64 KiB",
            Workload::Commit4k => "commit 4 KiB",
        }
    }

    fn bytes(self) -> usize {
        match self {
            Workload::Random4k | Workload::Commit4k => 4096,
            Workload::Random16k => 16384,
            Workload::Sequential1m => 1 << 20,
            Workload::Sequential64k => 64 << 10,
        }
    }
}

/// Members in memory whose every batch of requests takes `latency` (module doc).
type LatencyMembers = paraid_engine::fault::FaultyMembers<paraid_engine::MemMembers>;

/// Members in memory bound by a request rate (module doc): each read or write occupies its member for the time
/// of one request, after the requests queued before it there (`WRITEHOLE_RATE_FLUSHES`: flushes too).
type RateMembers = paraid_engine::fault::RateMembers<paraid_engine::MemMembers>;

/// Where an array's members are: files, members in memory with a latency, or members bound by a rate.
enum Members {
    Files(Vec<PathBuf>),
    Latency(Arc<LatencyMembers>),
    Rate(Arc<RateMembers>),
}

impl Members {
    fn assemble(&self, log: bool) -> Array {
        match self {
            Members::Files(paths) => assemble(paths, options(log)).expect("assemble"),
            Members::Latency(io) => {
                paraid_engine::assemble_io(io.clone(), options(log)).expect("assemble")
            }
            Members::Rate(io) => {
                paraid_engine::assemble_io(io.clone(), options(log)).expect("assemble")
            }
        }
    }
}

/// `latency:<us>` as a `dir` argument.
fn latency_arg(dir: &str) -> Option<Duration> {
    let us: u64 = dir.strip_prefix("latency:")?.parse().ok()?;
    Some(Duration::from_micros(us))
}

/// `rate:<iops>` as a `dir` argument: the time one request occupies a member.
fn rate_arg(dir: &str) -> Option<Duration> {
    let iops: u64 = dir.strip_prefix("rate:")?.parse().ok()?;
    Some(Duration::from_nanos(1_000_000_000 / iops.max(1)))
}

/// A fresh array in memory whose members each serve a request per `per_request`.
fn fresh_rate_array(
    per_request: Duration,
    level: Level,
    members: usize,
    log: bool,
) -> (Array, Members) {
    let inner = paraid_engine::MemMembers::new(members, (4 + MEMBER_MIB) << 20);
    paraid_engine::create_io(&inner, level, CHUNK_BYTES, "writehole").expect("create");
    let rate = RateMembers::new(inner, per_request);
    let io = Arc::new(if std::env::var_os("WRITEHOLE_RATE_FLUSHES").is_some() {
        rate.with_flushes_counted()
    } else {
        rate
    });
    let members = Members::Rate(io);
    (members.assemble(log), members)
}

/// A fresh array in memory whose every request batch takes `latency`.
fn fresh_latency_array(
    latency: Duration,
    level: Level,
    members: usize,
    log: bool,
) -> (Array, Members) {
    let io = Arc::new(paraid_engine::fault::FaultyMembers::new(
        paraid_engine::MemMembers::new(members, (4 + MEMBER_MIB) << 20),
        1,
    ));
    paraid_engine::create_io(io.as_ref(), level, CHUNK_BYTES, "writehole").expect("create");
    io.add(
        paraid_engine::fault::Scope::all(),
        paraid_engine::fault::Fault::Delay {
            delay: latency,
            one_in: 1,
            sleep: true,
        },
    );
    let members = Members::Latency(io);
    (members.assemble(log), members)
}

/// A fresh array on files in `dir`.
fn fresh_array(dir: &Path, level: Level, members: usize, log: bool) -> (Array, Members) {
    let paths: Vec<PathBuf> = (0..members)
        .map(|i| dir.join(format!("m{i}.img")))
        .collect();
    for p in &paths {
        let _ = std::fs::remove_file(p);
    }
    create(&CreateOptions {
        level,
        chunk_bytes: CHUNK_BYTES,
        name: "writehole".into(),
        size_bytes: Some((4 + MEMBER_MIB) << 20),
        members: paths.clone(),
        force: false,
    })
    .expect("create");
    for p in &paths {
        allocate(p);
    }
    let members = Members::Files(paths);
    (members.assemble(log), members)
}

/// Allocates every block of a member file. A sparse file on tmpfs allocates (and zeroes) a page at its first
/// write: the first bursts would pay for that and later ones not, and which array's bursts met fresh pages would
/// decide the comparison (sequential rows differed by up to 40 % with no log I/O at all before this).
fn allocate(path: &Path) {
    use std::os::fd::AsRawFd;
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .expect("open member");
    let len = file.metadata().expect("member size").len();
    // SAFETY: fallocate on an open descriptor; mode 0 allocates without changing contents or size.
    let rc = unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, len as libc::off_t) };
    assert_eq!(
        rc,
        0,
        "fallocate {}: {}",
        path.display(),
        std::io::Error::last_os_error()
    );
}

/// CPU time (user + system) of the whole process so far, io_uring workers included, in microseconds.
fn cpu_us() -> f64 {
    // SAFETY: getrusage fills the struct it is given.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    let us = |t: libc::timeval| t.tv_sec as f64 * 1e6 + t.tv_usec as f64;
    us(usage.ru_utime) + us(usage.ru_stime)
}

/// What one run measured.
struct Figures {
    bytes_per_s: f64,
    writes_per_s: f64,
    /// CPU time per write (every thread of the process): the cost a loaded machine cannot hide.
    cpu_us_per_write: f64,
    log_rounds: u64,
    log_entries: u64,
    /// Writes done as reconstruct-writes for the log (a chunk of the stripe not yet durable).
    log_rmw_to_rcw: u64,
    /// Writes that found the CPU busy (`WRITEHOLE_JOURNAL=auto`).
    log_cpu_busy: u64,
    log_members_queue: u64,
}

/// Writes for `seconds` from `threads` threads.
fn run(array: &Arc<Array>, workload: Workload, threads: u64, seconds: f64) -> Figures {
    let before = array.integrity();
    let cpu_before = cpu_us();
    let stop = Arc::new(AtomicBool::new(false));
    let writes = Arc::new(AtomicU64::new(0));
    let size = array.size_bytes();
    let burst = if hot_set() {
        0
    } else {
        BURSTS.fetch_add(1, Ordering::Relaxed)
    };
    // Journal mode: writes through a pool that answers them once durable in the log.
    let front = (array.answers_from_log() && !journal_direct() && !journal_lone()).then(|| {
        Arc::new(WriteBack::new(
            array,
            WriteBackConfig {
                threads: 16,
                answer: Answer::FromLog,
                ..WriteBackConfig::DEFAULT
            },
        ))
    });
    let start = Instant::now();
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let array = array.clone();
            let front = front.clone();
            let stop = stop.clone();
            let writes = writes.clone();
            std::thread::spawn(move || {
                let buf = vec![0xa5u8 ^ t as u8; workload.bytes()];
                let len = buf.len() as u64;
                let served = journal_lone().then(|| Served::new(&array, buf.len(), buf[0]));
                // Sequential writers each take their own slice of the array; random ones go anywhere.
                let slice = size / threads / len * len;
                let mut at = t * slice;
                // A stream per thread and burst; never zero (xorshift would stay there): odd.
                let mut x = (0x9E37_79B9_7F4A_7C15u64 ^ (t + 1))
                    .wrapping_mul(burst.wrapping_mul(2) | 1)
                    | 1;
                while !stop.load(Ordering::Relaxed) {
                    let offset = match workload {
                        Workload::Random4k | Workload::Random16k => {
                            x ^= x << 13;
                            x ^= x >> 7;
                            x ^= x << 17;
                            x % (size / len) * len
                        }
                        Workload::Sequential1m | Workload::Sequential64k | Workload::Commit4k => {
                            if at + len > (t + 1) * slice {
                                at = t * slice;
                            }
                            at += len;
                            at - len
                        }
                    };
                    match (&served, &front) {
                        (Some(served), _) => served.write(offset),
                        (None, Some(front)) => front.write(offset, &buf, false).expect("write"),
                        (None, None) => array.write(offset, &buf, false).expect("write"),
                    }
                    if workload == Workload::Commit4k {
                        match &front {
                            Some(front) => front.flush().expect("flush"),
                            None => array.flush().expect("flush"),
                        }
                    }
                    writes.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs_f64(seconds));
    stop.store(true, Ordering::Relaxed);
    for h in handles {
        h.join().expect("writer");
    }
    if let Some(front) = front {
        Arc::try_unwrap(front)
            .unwrap_or_else(|_| panic!("writers still hold the write-back pool"))
            .close()
            .expect("close the write-back pool");
    }
    array.flush().expect("flush");
    let secs = start.elapsed().as_secs_f64();
    let cpu = cpu_us() - cpu_before;
    let n = writes.load(Ordering::Relaxed) as f64;
    let after = array.integrity();
    Figures {
        bytes_per_s: n * workload.bytes() as f64 / secs,
        writes_per_s: n / secs,
        cpu_us_per_write: cpu / n,
        log_rounds: after.log_rounds - before.log_rounds,
        log_entries: after.log_entries - before.log_entries,
        log_rmw_to_rcw: after.log_rmw_to_rcw - before.log_rmw_to_rcw,
        log_cpu_busy: after.log_cpu_busy - before.log_cpu_busy,
        log_members_queue: after.log_members_queue - before.log_members_queue,
    }
}

fn stop(array: Arc<Array>) {
    match Arc::try_unwrap(array) {
        Ok(array) => {
            array.stop().expect("stop");
        }
        Err(_) => panic!("writers still hold the array"),
    }
}

/// A tiny in-memory array standing in while a slot's real one is re-assembled.
fn placeholder() -> Array {
    let io = Arc::new(paraid_engine::MemMembers::new(3, (4 << 20) + 3 * 4096));
    paraid_engine::create_io(io.as_ref(), Level::Raid5, 4096, "placeholder").expect("create");
    paraid_engine::assemble_io(io, AssembleOptions::new(paraid_parity::cpu_best()))
        .expect("assemble")
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() {
    let mut args = std::env::args().skip(1);
    let dir_arg = args.next().unwrap_or_else(|| "/dev/shm".to_string());
    let latency = latency_arg(&dir_arg);
    let rate = rate_arg(&dir_arg);
    let dir = PathBuf::from(&dir_arg).join(format!("paraid-writehole-{}", std::process::id()));
    let seconds: f64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(0.5);
    let rounds: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(11);
    println!(
        "partial parity log cost{}: member files in {}, {MEMBER_MIB} MiB each, {} KiB chunks; per row, two arrays \
         (log off, log on) written in alternating bursts of {seconds} s, {rounds} bursts each after a warm-up one, \
         medians; random offsets {}; parity backend {}",
        if journal_auto() {
            " (log on = journal mode with lone answers gated on spare CPU; every write served on a worker through \
             write_answering)"
        } else if journal_lone() {
            " (log on = journal mode with lone answers; every write served on a worker through write_answering)"
        } else if journal() {
            " (log on = journal mode, answered from the log)"
        } else {
            ""
        },
        match (latency, rate) {
            (Some(latency), _) => format!("memory, every request batch {} us", latency.as_micros()),
            (None, Some(per_request)) => format!(
                "memory, each member one request at a time, {} us each",
                per_request.as_micros()
            ),
            (None, None) => dir.display().to_string(),
        },
        CHUNK_BYTES >> 10,
        if hot_set() {
            "the same in every burst (a hot set, WRITEHOLE_HOT=on)"
        } else {
            "new in every burst"
        },
        paraid_parity::cpu_best().name()
    );
    println!(
        "| level | workload | threads | log off | log on | cost | CPU/write off | CPU/write on | CPU cost | log \
         rounds / entries / RMW done as RCW (on) |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    // WRITEHOLE_ONLY="raid5 random 1" (any words of a row) narrows the table, e.g. for profiling.
    let only = std::env::var("WRITEHOLE_ONLY").unwrap_or_default();
    // WRITEHOLE_THREADS="1 16": the writer counts of each (level, workload); default 1 and 4.
    let writer_counts: Vec<u64> = match std::env::var("WRITEHOLE_THREADS") {
        Ok(v) => v
            .split_whitespace()
            .map(|n| n.parse().expect("WRITEHOLE_THREADS: writer counts"))
            .collect(),
        Err(_) => vec![1, 4],
    };
    // WRITEHOLE_PROFILE=on|off measures only that array (for `perf record`; the table then lacks the other).
    let profile_only: Option<bool> = match std::env::var("WRITEHOLE_PROFILE").as_deref() {
        Ok("on") => Some(true),
        Ok("off") => Some(false),
        _ => None,
    };
    for (level, members) in [(Level::Raid5, 5usize), (Level::Raid6, 6)] {
        for workload in [
            Workload::Random4k,
            Workload::Random16k,
            Workload::Sequential1m,
            Workload::Sequential64k,
            Workload::Commit4k,
        ] {
            for &threads in &writer_counts {
                let row = format!("{level} {} {threads}", workload.name());
                if !only
                    .split_whitespace()
                    .all(|w| row.split_whitespace().any(|r| r == w))
                {
                    continue;
                }
                // Two arrays live through the row: bursts alternate between them under the same conditions.
                // Halfway they swap roles (re-assembled with the log the other way), so that whatever differs
                // between the two sets of files (where tmpfs put their pages) falls on both modes alike.
                let mut arrays: Vec<(bool, Arc<Array>, Members)> = [false, true]
                    .into_iter()
                    .map(|log| {
                        let (array, members) = match (latency, rate) {
                            (Some(latency), _) => fresh_latency_array(latency, level, members, log),
                            (None, Some(per_request)) => {
                                fresh_rate_array(per_request, level, members, log)
                            }
                            (None, None) => {
                                let sub = dir.join(if log { "a" } else { "b" });
                                std::fs::create_dir_all(&sub).expect("create dir");
                                fresh_array(&sub, level, members, log)
                            }
                        };
                        (log, Arc::new(array), members)
                    })
                    .collect();
                let mut off = Vec::new();
                let mut on = Vec::new();
                let mut cpu_off = Vec::new();
                let mut cpu_on = Vec::new();
                let (mut rounds_on, mut entries_on, mut rcw_on, mut cpu_busy_on, mut queue_on) =
                    (0, 0, 0, 0, 0);
                for round in 0..rounds {
                    if round == 0 || round == rounds / 2 {
                        if round > 0 {
                            for slot in arrays.iter_mut() {
                                let (log, array, members) = std::mem::replace(
                                    slot,
                                    (false, Arc::new(placeholder()), Members::Files(Vec::new())),
                                );
                                stop(array);
                                let array = members.assemble(!log);
                                *slot = (!log, Arc::new(array), members);
                            }
                        }
                        for (_, array, _) in &arrays {
                            run(array, workload, threads, seconds); // warm-up: bitmap bits, ring in steady state
                        }
                    }
                    for i in 0..2 {
                        let (log, array, _) = &arrays[(i + round) % 2];
                        if profile_only.is_some_and(|only| only != *log) {
                            continue;
                        }
                        let f = run(array, workload, threads, seconds);
                        let figure = match workload {
                            Workload::Random4k | Workload::Random16k | Workload::Commit4k => {
                                f.writes_per_s
                            }
                            Workload::Sequential1m | Workload::Sequential64k => {
                                f.bytes_per_s / (1 << 20) as f64
                            }
                        };
                        if *log {
                            on.push(figure);
                            cpu_on.push(f.cpu_us_per_write);
                            rounds_on += f.log_rounds;
                            entries_on += f.log_entries;
                            rcw_on += f.log_rmw_to_rcw;
                            cpu_busy_on += f.log_cpu_busy;
                            queue_on += f.log_members_queue;
                        } else {
                            off.push(figure);
                            cpu_off.push(f.cpu_us_per_write);
                        }
                    }
                }
                for (_, array, _) in arrays {
                    stop(array);
                }
                if profile_only.is_some() {
                    for v in [&mut off, &mut on, &mut cpu_off, &mut cpu_on] {
                        if v.is_empty() {
                            v.push(f64::NAN);
                        }
                    }
                }
                let (off, on) = (median(off), median(on));
                let (cpu_off, cpu_on) = (median(cpu_off), median(cpu_on));
                let unit = match workload {
                    Workload::Random4k | Workload::Random16k | Workload::Commit4k => "IOPS",
                    Workload::Sequential1m | Workload::Sequential64k => "MiB/s",
                };
                println!(
                    "| {level} n={members} | {} | {threads} | {off:.0} {unit} | {on:.0} {unit} | {:+.1} % | {cpu_off:.1} \
                     us | {cpu_on:.1} us | {:+.1} % | {rounds_on} / {entries_on} / {rcw_on}{} |",
                    workload.name(),
                    (on - off) / off * 100.0,
                    (cpu_on - cpu_off) / cpu_off * 100.0,
                    if journal_auto() {
                        format!(" / CPU busy {cpu_busy_on} / members queue {queue_on}")
                    } else {
                        String::new()
                    }
                );
                let _ = std::fs::remove_dir_all(&dir);
            }
        }
    }
}
