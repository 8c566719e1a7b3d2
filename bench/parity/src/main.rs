//! bench/parity: GB/s of data per core for `gen`, `update` and 2-erasure `recover` on every parity
//! backend this machine has, and on ISA-L in the same run, on the same core.
//!
//! `bench-parity [--json] [--data-chunks K] [--chunk-bytes B] [--seconds S]`
//!
//! Each figure is the best of several equal time windows (S seconds in all per row): the machine is
//! shared, and the best window is the one least disturbed by others.

mod buf;
mod gpu;
mod isal;

use std::time::{Duration, Instant};

use clap::Parser;
use paraid_parity::reference::Reference;
use paraid_parity::{cpu_backends, Backend};

use buf::AlignedBuf;
use isal::{isal_pq_gen, isal_xor_gen, IsalRecover};

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

/// The two data chunks every recover row rebuilds: one near each end of the stripe.
fn lost_pair(k: usize) -> (usize, usize) {
    if k >= 2 {
        (0, k / 2)
    } else {
        (0, 1)
    }
}

fn bench_backend(backend: &dyn Backend, stripe: &mut Stripe, args: &Args, rows: &mut Vec<Row>) {
    let k = args.data_chunks;
    let chunk_bytes = args.chunk_bytes;
    let stripe_bytes = k * chunk_bytes;
    let name = backend.name().to_string();
    let mut push = |op: &'static str, (gbps, gbps_median): (f64, f64)| {
        rows.push(Row {
            backend: name.clone(),
            op,
            gbps,
            gbps_median,
            note: None,
        })
    };

    let mut p = AlignedBuf::zeroed(chunk_bytes);
    let mut q = AlignedBuf::zeroed(chunk_bytes);
    let data: Vec<&[u8]> = stripe.data.iter().map(|d| d.as_slice()).collect();
    // Sanity first: a figure for wrong output is worthless.
    backend.gen_pq(&data, p.as_mut_slice(), q.as_mut_slice());
    assert!(
        p.as_slice() == stripe.p.as_slice() && q.as_slice() == stripe.q.as_slice(),
        "{} gen_pq differs from the reference",
        backend.name()
    );
    push(
        "gen_pq",
        measure(args.seconds, stripe_bytes, || {
            backend.gen_pq(&data, p.as_mut_slice(), q.as_mut_slice())
        }),
    );
    push(
        "gen_p",
        measure(args.seconds, stripe_bytes, || {
            backend.gen_p(&data, p.as_mut_slice())
        }),
    );

    // Update of one chunk: new data in, back and forth so P and Q stay those of a real stripe.
    let index = k / 2;
    let old = stripe.data[index].as_slice();
    let new = stripe.new.as_slice();
    let mut flip = false;
    push(
        "update_pq",
        measure(args.seconds, chunk_bytes, || {
            let (from, to) = if flip { (new, old) } else { (old, new) };
            backend.update(index, from, to, p.as_mut_slice(), Some(q.as_mut_slice()));
            flip = !flip;
        }),
    );

    // Two lost data chunks, rebuilt in place from the other k-2, P and Q.
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
    let mut chunks: Vec<&mut [u8]> = copy.iter_mut().map(|c| c.as_mut_slice()).collect();
    backend
        .recover(&mut chunks, true, &[x, y])
        .expect("two erasures are recoverable");
    assert!(
        chunks[x] == stripe.data[x].as_slice() && chunks[y] == stripe.data[y].as_slice(),
        "{} recover differs",
        backend.name()
    );
    push(
        "recover_2data",
        measure(args.seconds, stripe_bytes, || {
            backend
                .recover(&mut chunks, true, &[x, y])
                .expect("two erasures are recoverable")
        }),
    );

    let mut all: Vec<&[u8]> = stripe.data.iter().map(|d| d.as_slice()).collect();
    all.push(stripe.p.as_slice());
    all.push(stripe.q.as_slice());
    assert_eq!(
        backend.check(&all, true),
        paraid_parity::CheckOutcome::Consistent
    );
    push(
        "check_pq",
        measure(args.seconds, stripe_bytes, || {
            assert_eq!(
                backend.check(&all, true),
                paraid_parity::CheckOutcome::Consistent
            )
        }),
    );
}

fn bench_isal(
    stripe: &mut Stripe,
    args: &Args,
    rows: &mut Vec<Row>,
) -> Result<(), isal::IsalError> {
    let k = args.data_chunks;
    let chunk_bytes = args.chunk_bytes;
    let stripe_bytes = k * chunk_bytes;
    let mut push = |op: &'static str, (gbps, gbps_median): (f64, f64)| {
        rows.push(Row {
            backend: "isal".into(),
            op,
            gbps,
            gbps_median,
            note: None,
        })
    };

    let mut p = AlignedBuf::zeroed(chunk_bytes);
    let mut q = AlignedBuf::zeroed(chunk_bytes);
    let mut array: Vec<*mut std::ffi::c_void> = stripe
        .data
        .iter()
        .map(|d| d.as_ptr() as *mut std::ffi::c_void)
        .collect();
    array.push(p.as_mut_ptr() as *mut _);
    array.push(q.as_mut_ptr() as *mut _);
    isal_pq_gen(&mut array, chunk_bytes)?;
    assert!(
        p.as_slice() == stripe.p.as_slice() && q.as_slice() == stripe.q.as_slice(),
        "ISA-L pq_gen differs from the reference"
    );
    let mut failure = None;
    push(
        "gen_pq",
        measure(args.seconds, stripe_bytes, || {
            failure = isal_pq_gen(&mut array, chunk_bytes)
                .err()
                .or(failure.take())
        }),
    );
    let mut xor_array = array[..k + 1].to_vec();
    push(
        "gen_p",
        measure(args.seconds, stripe_bytes, || {
            failure = isal_xor_gen(&mut xor_array, chunk_bytes)
                .err()
                .or(failure.take())
        }),
    );
    if let Some(e) = failure {
        return Err(e);
    }

    let (x, y) = lost_pair(k);
    let mut recover = IsalRecover::new(k, x, y)?;
    let by_index = |i: usize| -> *mut u8 {
        if i < k {
            stripe.data[i].as_ptr() as *mut u8
        } else if i == k {
            stripe.p.as_ptr() as *mut u8
        } else {
            stripe.q.as_ptr() as *mut u8
        }
    };
    let mut sources: Vec<*mut u8> = recover.survivors.iter().map(|&i| by_index(i)).collect();
    let mut lost_x = AlignedBuf::zeroed(chunk_bytes);
    let mut lost_y = AlignedBuf::zeroed(chunk_bytes);
    let mut outputs = [lost_x.as_mut_ptr(), lost_y.as_mut_ptr()];
    recover.run(&mut sources, &mut outputs, chunk_bytes);
    assert!(
        lost_x.as_slice() == stripe.data[x].as_slice()
            && lost_y.as_slice() == stripe.data[y].as_slice(),
        "ISA-L ec_encode_data did not recover"
    );
    push(
        "recover_2data",
        measure(args.seconds, stripe_bytes, || {
            recover.run(&mut sources, &mut outputs, chunk_bytes)
        }),
    );
    Ok(())
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
    let cpu = if args.no_pin {
        "unpinned".to_string()
    } else {
        pin_to_one_cpu().map_or("unpinned".to_string(), |c| format!("cpu{c}"))
    };
    let wanted = |name: &str| args.backends.is_empty() || args.backends.iter().any(|b| b == name);

    let mut stripe = Stripe::new(args.data_chunks, args.chunk_bytes);
    let mut rows = Vec::new();
    for backend in cpu_backends() {
        if wanted(backend.name()) {
            bench_backend(backend.as_ref(), &mut stripe, &args, &mut rows);
        }
    }
    if wanted("isal") {
        if args.chunk_bytes % 64 != 0 {
            eprintln!("bench-parity: ISA-L rows skipped: its SIMD paths want --chunk-bytes in whole 64-byte vectors");
        } else if let Err(e) = bench_isal(&mut stripe, &args, &mut rows) {
            eprintln!("bench-parity: ISA-L rows failed: {e}");
        }
    }
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
