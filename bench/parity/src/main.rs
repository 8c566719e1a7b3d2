//! bench/parity: GB/s of data per core for `gen`, `update` and 2-erasure `recover` on every parity
//! backend this machine has, and on ISA-L in the same run, on the same core.
//!
//! `bench-parity [--json] [--data-chunks K] [--chunk-bytes B] [--seconds S]`
//! `bench-parity --launch-cost [--data-chunks K] [--chunk-bytes B] [--stripes N] [--threads T] [--seconds S]`
//!
//! Each row gets S seconds in 10 windows; the windows of all rows (every backend, every op, ISA-L)
//! are taken in turn, so a burst of load from elsewhere on this shared machine hits them alike.
//! The best window is reported beside the median one.

mod buf;
mod gpu;
mod in_place;
mod isal;
mod launch;

use std::time::{Duration, Instant};

use clap::Parser;
use paraid_parity::reference::Reference;
use paraid_parity::{cpu_backends, Backend};

use buf::AlignedBuf;
use isal::{isal_pq_gen, isal_xor_gen, IsalRecover};
use paraid_parity::CheckOutcome;
use std::ffi::c_void;

#[derive(Parser, Debug)]
#[command(
    name = "bench-parity",
    about = "GB/s per core of paraid's parity backends and of ISA-L"
)]
struct Args {
    /// One JSON object per line instead of a table.
    #[arg(long)]
    json: bool,
    /// Data chunks per stripe (k).
    #[arg(long, default_value_t = 10)]
    data_chunks: usize,
    /// Bytes per chunk.
    #[arg(long, default_value_t = 65536)]
    chunk_bytes: usize,
    /// Seconds of measurement per row.
    #[arg(long, default_value_t = 1.0)]
    seconds: f64,
    /// Only these backends (repeatable; "isal" for ISA-L). Default: all.
    #[arg(long = "backend")]
    backends: Vec<String>,
    /// Do not pin the benchmark thread to one CPU.
    #[arg(long)]
    no_pin: bool,
    /// Skip the GPU rows even where a GPU exists.
    #[arg(long)]
    no_gpu: bool,
    /// Only measure what one in-place GPU batch costs the host (launch.rs), with --stripes, --threads,
    /// --data-chunks, --chunk-bytes and --seconds.
    #[arg(long)]
    launch_cost: bool,
    /// Stripes per batch, for --launch-cost.
    #[arg(long, default_value_t = 1)]
    stripes: usize,
    /// Threads each running their own batches, for --launch-cost.
    #[arg(long, default_value_t = 1)]
    threads: usize,
}

/// One measured figure.
pub struct Row {
    pub backend: String,
    pub op: &'static str,
    pub gbps: f64,
    pub gbps_median: f64,
    /// What the figure is relative to, for GPU rows (e.g. the device memcpy rate).
    pub note: Option<String>,
}

const WINDOWS: usize = 10;

/// Runs `step` (which processes `bytes_per_step` bytes of data) for `seconds` split into windows;
/// returns (best, median) GB/s over the windows.
pub fn measure(seconds: f64, bytes_per_step: usize, mut step: impl FnMut()) -> (f64, f64) {
    // Warm caches, page in buffers, and estimate the step time.
    let warm = Instant::now();
    let mut warm_steps = 0u64;
    while warm.elapsed() < Duration::from_millis(20) || warm_steps < 2 {
        step();
        warm_steps += 1;
    }
    let window = Duration::from_secs_f64((seconds / WINDOWS as f64).max(0.001));
    let mut rates = Vec::with_capacity(WINDOWS);
    for _ in 0..WINDOWS {
        let start = Instant::now();
        let mut steps = 0u64;
        while start.elapsed() < window {
            step();
            steps += 1;
        }
        let elapsed = start.elapsed().as_secs_f64();
        rates.push(steps as f64 * bytes_per_step as f64 / elapsed / 1e9);
    }
    rates.sort_by(|a, b| a.total_cmp(b));
    (rates[WINDOWS - 1], rates[WINDOWS / 2])
}

fn pin_to_one_cpu() -> Option<usize> {
    // SAFETY: plain libc calls on a zeroed cpu_set_t owned here.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return None;
        }
        let cpu = (0..libc::CPU_SETSIZE as usize).find(|&c| libc::CPU_ISSET(c, &set))?;
        let mut one: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut one);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &one) != 0 {
            return None;
        }
        Some(cpu)
    }
}

/// The stripe every CPU row works on: k data chunks, P, Q, and a spare chunk of new data.
struct Stripe {
    data: Vec<AlignedBuf>,
    p: AlignedBuf,
    q: AlignedBuf,
    new: AlignedBuf,
}

impl Stripe {
    fn new(k: usize, chunk_bytes: usize) -> Self {
        let mut seed = 0x1234_5678_9abc_def0u64;
        let data = (0..k)
            .map(|_| AlignedBuf::random(chunk_bytes, &mut seed))
            .collect();
        let mut stripe = Stripe {
            data,
            p: AlignedBuf::zeroed(chunk_bytes),
            q: AlignedBuf::zeroed(chunk_bytes),
            new: AlignedBuf::random(chunk_bytes, &mut seed),
        };
        let data: Vec<&[u8]> = stripe.data.iter().map(|d| d.as_slice()).collect();
        Reference.gen_pq(&data, stripe.p.as_mut_slice(), stripe.q.as_mut_slice());
        stripe
    }
}

/// The two data chunks every recover row rebuilds: the first and one in the middle.
fn lost_pair(k: usize) -> (usize, usize) {
    (0, k / 2)
}

/// The operations measured, with the data bytes one step processes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    GenPq,
    GenP,
    UpdatePq,
    Recover2Data,
    CheckPq,
}

impl Op {
    const ALL: [Op; 5] = [
        Op::GenPq,
        Op::GenP,
        Op::UpdatePq,
        Op::Recover2Data,
        Op::CheckPq,
    ];

    fn name(self) -> &'static str {
        match self {
            Op::GenPq => "gen_pq",
            Op::GenP => "gen_p",
            Op::UpdatePq => "update_pq",
            Op::Recover2Data => "recover_2data",
            Op::CheckPq => "check_pq",
        }
    }

    /// Data bytes per step: the whole stripe, except for update, which moves one chunk.
    fn step_bytes(self, k: usize, chunk_bytes: usize) -> usize {
        match self {
            Op::UpdatePq => chunk_bytes,
            _ => k * chunk_bytes,
        }
    }
}

/// One contender for one op: its name and a step that does the op once on its own buffers.
struct Contender<'a> {
    backend: String,
    op: Op,
    step: Box<dyn FnMut() + 'a>,
}

/// Builds `backend`'s step for `op`, after checking its output against the reference stripe.
fn backend_contender<'a>(backend: &'a dyn Backend, op: Op, stripe: &'a Stripe) -> Contender<'a> {
    let k = stripe.data.len();
    let chunk_bytes = stripe.p.as_slice().len();
    let name = backend.name().to_string();
    let data: Vec<&[u8]> = stripe.data.iter().map(|d| d.as_slice()).collect();
    let mut p = AlignedBuf::zeroed(chunk_bytes);
    let mut q = AlignedBuf::zeroed(chunk_bytes);
    let step: Box<dyn FnMut() + 'a> = match op {
        Op::GenPq => {
            backend.gen_pq(&data, p.as_mut_slice(), q.as_mut_slice());
            assert!(
                p.as_slice() == stripe.p.as_slice() && q.as_slice() == stripe.q.as_slice(),
                "{name} gen_pq differs from the reference"
            );
            Box::new(move || backend.gen_pq(&data, p.as_mut_slice(), q.as_mut_slice()))
        }
        Op::GenP => {
            backend.gen_p(&data, p.as_mut_slice());
            assert!(
                p.as_slice() == stripe.p.as_slice(),
                "{name} gen_p differs from the reference"
            );
            Box::new(move || backend.gen_p(&data, p.as_mut_slice()))
        }
        Op::UpdatePq => {
            // New data in, then the old data back, so P and Q stay those of a real stripe.
            let index = k / 2;
            p.as_mut_slice().copy_from_slice(stripe.p.as_slice());
            q.as_mut_slice().copy_from_slice(stripe.q.as_slice());
            let (old, new) = (stripe.data[index].as_slice(), stripe.new.as_slice());
            backend.update(index, old, new, p.as_mut_slice(), Some(q.as_mut_slice()));
            backend.update(index, new, old, p.as_mut_slice(), Some(q.as_mut_slice()));
            assert!(
                p.as_slice() == stripe.p.as_slice() && q.as_slice() == stripe.q.as_slice(),
                "{name} update differs"
            );
            let mut flip = false;
            Box::new(move || {
                let (from, to) = if flip { (new, old) } else { (old, new) };
                backend.update(index, from, to, p.as_mut_slice(), Some(q.as_mut_slice()));
                flip = !flip;
            })
        }
        Op::Recover2Data => {
            let (x, y) = lost_pair(k);
            let mut copy: Vec<AlignedBuf> = stripe
                .data
                .iter()
                .map(|d| AlignedBuf::copy_of(d.as_slice()))
                .collect();
            copy.push(AlignedBuf::copy_of(stripe.p.as_slice()));
            copy.push(AlignedBuf::copy_of(stripe.q.as_slice()));
            copy[x].as_mut_slice().fill(0);
            copy[y].as_mut_slice().fill(0);
            let recover = move |copy: &mut Vec<AlignedBuf>| {
                let mut chunks: [&mut [u8]; paraid_parity::MAX_CHUNKS] =
                    std::array::from_fn(|_| &mut [][..]);
                for (slot, chunk) in chunks.iter_mut().zip(copy.iter_mut()) {
                    *slot = chunk.as_mut_slice();
                }
                backend
                    .recover(&mut chunks[..k + 2], true, &[x, y])
                    .expect("two erasures are recoverable");
            };
            recover(&mut copy);
            assert!(
                copy[x].as_slice() == stripe.data[x].as_slice()
                    && copy[y].as_slice() == stripe.data[y].as_slice(),
                "{name} recover differs"
            );
            Box::new(move || recover(&mut copy))
        }
        Op::CheckPq => {
            let mut all = data.clone();
            all.push(stripe.p.as_slice());
            all.push(stripe.q.as_slice());
            assert_eq!(
                backend.check(&all, true),
                CheckOutcome::Consistent,
                "{name} check"
            );
            Box::new(move || assert_eq!(backend.check(&all, true), CheckOutcome::Consistent))
        }
    };
    Contender {
        backend: name,
        op,
        step,
    }
}

/// ISA-L's step for `op`, if ISA-L has one: pq_gen, xor_gen, ec_encode_data.
fn isal_contender<'a>(
    op: Op,
    stripe: &'a Stripe,
) -> Result<Option<Contender<'a>>, isal::IsalError> {
    let k = stripe.data.len();
    let chunk_bytes = stripe.p.as_slice().len();
    let mut p = AlignedBuf::zeroed(chunk_bytes);
    let mut q = AlignedBuf::zeroed(chunk_bytes);
    let mut array: Vec<*mut c_void> = stripe
        .data
        .iter()
        .map(|d| d.as_ptr() as *mut c_void)
        .collect();
    array.push(p.as_mut_ptr() as *mut c_void);
    array.push(q.as_mut_ptr() as *mut c_void);
    let step: Box<dyn FnMut() + 'a> = match op {
        Op::GenPq => {
            isal_pq_gen(&mut array, chunk_bytes)?;
            assert!(
                p.as_slice() == stripe.p.as_slice() && q.as_slice() == stripe.q.as_slice(),
                "ISA-L pq_gen differs from the reference"
            );
            Box::new(move || {
                let _keep = (&p, &q);
                isal_pq_gen(&mut array, chunk_bytes).expect("pq_gen worked a moment ago");
            })
        }
        Op::GenP => {
            array.truncate(k + 1);
            isal_xor_gen(&mut array, chunk_bytes)?;
            assert!(
                p.as_slice() == stripe.p.as_slice(),
                "ISA-L xor_gen differs from the reference"
            );
            Box::new(move || {
                let _keep = &p;
                isal_xor_gen(&mut array, chunk_bytes).expect("xor_gen worked a moment ago");
            })
        }
        Op::Recover2Data => {
            let (x, y) = lost_pair(k);
            let mut recover = IsalRecover::new(k, x, y)?;
            let by_index = |i: usize| -> *mut u8 {
                match i {
                    i if i < k => stripe.data[i].as_ptr() as *mut u8,
                    i if i == k => stripe.p.as_ptr() as *mut u8,
                    _ => stripe.q.as_ptr() as *mut u8,
                }
            };
            let mut sources: Vec<*mut u8> =
                recover.survivors.iter().map(|&i| by_index(i)).collect();
            let mut outputs = [p.as_mut_ptr(), q.as_mut_ptr()];
            recover.run(&mut sources, &mut outputs, chunk_bytes);
            assert!(
                p.as_slice() == stripe.data[x].as_slice()
                    && q.as_slice() == stripe.data[y].as_slice(),
                "ISA-L ec_encode_data did not recover"
            );
            Box::new(move || {
                let _keep = (&p, &q);
                recover.run(&mut sources, &mut outputs, chunk_bytes);
            })
        }
        Op::UpdatePq | Op::CheckPq => return Ok(None),
    };
    Ok(Some(Contender {
        backend: "isal".into(),
        op,
        step,
    }))
}

/// Measures contenders side by side: window after window, each contender (every backend and every
/// op) in turn, so a burst of load from elsewhere hits all of them alike. Returns (best, median)
/// GB/s per contender.
fn measure_interleaved(
    contenders: &mut [Contender<'_>],
    seconds: f64,
    k: usize,
    chunk_bytes: usize,
) -> Vec<(f64, f64)> {
    let window = Duration::from_secs_f64((seconds / WINDOWS as f64).max(0.001));
    for c in contenders.iter_mut() {
        // Warm caches and page in the buffers.
        let warm = Instant::now();
        while warm.elapsed() < Duration::from_millis(10) {
            (c.step)();
        }
    }
    let mut rates = vec![Vec::with_capacity(WINDOWS); contenders.len()];
    for _ in 0..WINDOWS {
        for (c, rates) in contenders.iter_mut().zip(rates.iter_mut()) {
            let step_bytes = c.op.step_bytes(k, chunk_bytes);
            let start = Instant::now();
            let mut steps = 0u64;
            while start.elapsed() < window {
                (c.step)();
                steps += 1;
            }
            rates.push(steps as f64 * step_bytes as f64 / start.elapsed().as_secs_f64() / 1e9);
        }
    }
    rates
        .into_iter()
        .map(|mut r| {
            r.sort_by(|a, b| a.total_cmp(b));
            (r[WINDOWS - 1], r[WINDOWS / 2])
        })
        .collect()
}

fn print_rows(rows: &[Row], args: &Args, cpu: &str) {
    if args.json {
        for row in rows {
            let mut object = serde_json::json!({
                "backend": row.backend,
                "op": row.op,
                "k": args.data_chunks,
                "chunk_bytes": args.chunk_bytes,
                "gbps": (row.gbps * 100.0).round() / 100.0,
                "gbps_median": (row.gbps_median * 100.0).round() / 100.0,
                "seconds": args.seconds,
                "cpu": cpu,
            });
            if let Some(note) = &row.note {
                object["note"] = serde_json::Value::String(note.clone());
            }
            println!("{object}");
        }
        return;
    }
    println!(
        "k={} chunk_bytes={} seconds/row={} cpu={cpu}",
        args.data_chunks, args.chunk_bytes, args.seconds
    );
    println!(
        "{:<14} {:<16} {:>10} {:>12}  note",
        "backend", "op", "GB/s best", "GB/s median"
    );
    for row in rows {
        println!(
            "{:<14} {:<16} {:>10.2} {:>12.2}  {}",
            row.backend,
            row.op,
            row.gbps,
            row.gbps_median,
            row.note.as_deref().unwrap_or("")
        );
    }
}

fn main() {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let args = Args::parse();
    if args.data_chunks < 2 || args.data_chunks > paraid_parity::MAX_DATA_CHUNKS_RAID6 {
        eprintln!(
            "bench-parity: --data-chunks must be in 2..={}",
            paraid_parity::MAX_DATA_CHUNKS_RAID6
        );
        std::process::exit(2);
    }
    if args.chunk_bytes == 0 || args.chunk_bytes > i32::MAX as usize {
        eprintln!("bench-parity: --chunk-bytes must be in 1..2^31");
        std::process::exit(2);
    }
    if args.launch_cost {
        launch::run(&args);
        return;
    }
    let cpu = if args.no_pin {
        "unpinned".to_string()
    } else {
        pin_to_one_cpu().map_or("unpinned".to_string(), |c| format!("cpu{c}"))
    };
    let wanted = |name: &str| args.backends.is_empty() || args.backends.iter().any(|b| b == name);

    let stripe = Stripe::new(args.data_chunks, args.chunk_bytes);
    let backends: Vec<_> = cpu_backends()
        .into_iter()
        .filter(|b| wanted(b.name()))
        .collect();
    let with_isal = wanted("isal")
        && {
            let fits = args.chunk_bytes % 64 == 0;
            if !fits {
                eprintln!("bench-parity: ISA-L rows skipped: its SIMD paths want --chunk-bytes in whole 64-byte vectors");
            }
            fits
        };
    let mut contenders: Vec<Contender> = Vec::new();
    for op in Op::ALL {
        contenders.extend(
            backends
                .iter()
                .map(|b| backend_contender(b.as_ref(), op, &stripe)),
        );
        if with_isal {
            match isal_contender(op, &stripe) {
                Ok(Some(c)) => contenders.push(c),
                Ok(None) => {}
                Err(e) => eprintln!("bench-parity: ISA-L {} skipped: {e}", op.name()),
            }
        }
    }
    let measured = measure_interleaved(
        &mut contenders,
        args.seconds,
        args.data_chunks,
        args.chunk_bytes,
    );
    let mut rows: Vec<Row> = contenders
        .iter()
        .zip(measured)
        .map(|(c, (gbps, gbps_median))| Row {
            backend: c.backend.clone(),
            op: c.op.name(),
            gbps,
            gbps_median,
            note: None,
        })
        .collect();
    if !args.no_gpu && wanted("cuda") {
        gpu::bench(&stripe_view(&stripe), &args, &mut rows);
    }
    print_rows(&rows, &args, &cpu);
}

/// The stripe's data, P and Q as plain slices, for the GPU rows.
pub struct StripeView<'a> {
    pub data: Vec<&'a [u8]>,
    pub p: &'a [u8],
    pub q: &'a [u8],
}

fn stripe_view(stripe: &Stripe) -> StripeView<'_> {
    StripeView {
        data: stripe.data.iter().map(|d| d.as_slice()).collect(),
        p: stripe.p.as_slice(),
        q: stripe.q.as_slice(),
    }
}
