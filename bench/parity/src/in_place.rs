//! Whole batches with their chunks in one block of memory, 64 MiB of distinct stripes (beyond the caches), and
//! what each way of computing them costs the host: the best CPU backend, the GPU through its staging slots
//! (ordinary memory), and the GPU in place (the memory registered through `alloc_host`). Beside GB/s, the
//! process's CPU time over the run (every thread, the CUDA driver's included) per GB of data: what a database
//! sharing the machine would lose.

use std::time::Instant;

use paraid_parity::cuda::CudaBackend;
use paraid_parity::{cpu_best, Backend, StripeGen, StripeRecover};

use crate::{measure, Args, Row, StripeView};

/// CPU time so far on `clock` (CLOCK_PROCESS_CPUTIME_ID: every thread; CLOCK_THREAD_CPUTIME_ID: this one),
/// seconds.
pub(crate) fn cpu_s(clock: libc::clockid_t) -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid timespec to fill.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

/// The process's CPU time so far, seconds (all threads).
fn process_cpu_s() -> f64 {
    cpu_s(libc::CLOCK_PROCESS_CPUTIME_ID)
}

/// `measure` plus the CPU it cost: (best GB/s, median GB/s, CPU seconds per GB at the median rate, busy cores).
fn measure_with_cpu(seconds: f64, bytes: usize, step: impl FnMut()) -> (f64, f64, f64, f64) {
    let cpu0 = process_cpu_s();
    let wall0 = Instant::now();
    let (best, median) = measure(seconds, bytes, step);
    let busy_cores = (process_cpu_s() - cpu0) / wall0.elapsed().as_secs_f64();
    (best, median, busy_cores / median, busy_cores)
}

/// One block holding `stripes` stripes of k data chunks then P and Q, data copied from `stripe`.
fn fill(mem: &mut [u8], stripe: &StripeView<'_>, stripes: usize) {
    let k = stripe.data.len();
    let chunk = stripe.p.len();
    for s in mem.chunks_mut((k + 2) * chunk).take(stripes) {
        for (dst, src) in s.chunks_mut(chunk).zip(&stripe.data) {
            dst.copy_from_slice(src);
        }
    }
}

pub(crate) fn gen_batch(
    backend: &dyn Backend,
    mem: &mut [u8],
    k: usize,
    chunk: usize,
    stripes: usize,
) {
    let mut datas: Vec<Vec<&[u8]>> = Vec::with_capacity(stripes);
    let mut parities: Vec<(&mut [u8], &mut [u8])> = Vec::with_capacity(stripes);
    for s in mem.chunks_mut((k + 2) * chunk).take(stripes) {
        let (data, pq) = s.split_at_mut(k * chunk);
        datas.push(data.chunks(chunk).collect());
        parities.push(pq.split_at_mut(chunk));
    }
    let mut batch: Vec<StripeGen> = datas
        .iter()
        .zip(parities.iter_mut())
        .map(|(data, (p, q))| StripeGen {
            data,
            p,
            q: Some(&mut **q),
        })
        .collect();
    backend.gen_batch(&mut batch);
}

fn recover_batch(backend: &dyn Backend, mem: &mut [u8], k: usize, chunk: usize, stripes: usize) {
    let missing = [0, k / 2];
    let mut lists: Vec<Vec<&mut [u8]>> = mem
        .chunks_mut((k + 2) * chunk)
        .take(stripes)
        .map(|s| s.chunks_mut(chunk).collect())
        .collect();
    let mut batch: Vec<StripeRecover> = lists
        .iter_mut()
        .map(|chunks| StripeRecover {
            chunks,
            has_q: true,
            missing: &missing,
        })
        .collect();
    if let Err(e) = backend.recover_batch(&mut batch) {
        eprintln!("bench-parity: recover_batch failed: {e}");
    }
}

/// Whether every stripe of `mem` holds `stripe`'s data, P and Q.
fn verified(mem: &[u8], stripe: &StripeView<'_>, stripes: usize) -> bool {
    let chunk = stripe.p.len();
    mem.chunks((stripe.data.len() + 2) * chunk)
        .take(stripes)
        .all(|s| {
            let mut chunks = s.chunks(chunk);
            stripe.data.iter().all(|d| chunks.next() == Some(*d))
                && chunks.next() == Some(stripe.p)
                && chunks.next() == Some(stripe.q)
        })
}

/// The rows; with no GPU, the CPU's alone.
pub fn bench(gpu: Option<&CudaBackend>, stripe: &StripeView<'_>, args: &Args, rows: &mut Vec<Row>) {
    let k = stripe.data.len();
    let chunk = stripe.p.len();
    let stripe_bytes = k * chunk;
    let stripes = ((64usize << 20) / stripe_bytes.max(1)).clamp(1, 4096);
    let block_bytes = stripes * (k + 2) * chunk;
    let data_bytes = stripes * stripe_bytes;
    let mut registered = gpu.and_then(|gpu| gpu.alloc_host(block_bytes));
    if gpu.is_some() && registered.is_none() {
        eprintln!("bench-parity: in-place rows skipped: the GPU registered no host memory");
    }
    let mut ordinary = vec![0u8; block_bytes];
    if let Some(registered) = registered.as_deref_mut() {
        fill(registered, stripe, stripes);
    }
    fill(&mut ordinary, stripe, stripes);
    let cpu = cpu_best();
    let in_place_before = gpu.map_or(0, |gpu| gpu.batches_in_place());
    let mut runs: Vec<(&'static str, &str, &dyn Backend, bool)> = Vec::new();
    for op in ["gen_pq_64mib", "recover_2data_64mib"] {
        runs.push((op, cpu.name(), cpu.as_ref(), false));
        if let Some(gpu) = gpu {
            runs.push((op, "cuda-staged", gpu, false));
            if registered.is_some() {
                runs.push((op, "cuda-in-place", gpu, true));
            }
        }
    }
    for (op, name, backend, in_place) in runs {
        let mem: &mut [u8] = match (in_place, registered.as_deref_mut()) {
            (true, Some(registered)) => registered,
            _ => &mut ordinary,
        };
        let gen = op.starts_with("gen");
        let (best, median, cpu_s_per_gb, busy) = measure_with_cpu(args.seconds, data_bytes, || {
            if gen {
                gen_batch(backend, mem, k, chunk, stripes);
            } else {
                recover_batch(backend, mem, k, chunk, stripes);
            }
        });
        let correct = verified(mem, stripe, stripes);
        rows.push(Row {
            backend: name.to_string(),
            op,
            gbps: best,
            gbps_median: median,
            note: Some(format!(
                "{stripes} distinct stripes per call; host CPU {:.1} ms per GB ({busy:.2} cores busy); output {}",
                cpu_s_per_gb * 1e3,
                if correct { "verified" } else { "WRONG" }
            )),
        });
    }
    if let Some(gpu) = gpu.filter(|_| registered.is_some()) {
        if gpu.batches_in_place() == in_place_before {
            eprintln!(
                "bench-parity: the in-place rows ran no batch in place: {}",
                gpu.describe()
            );
        }
    }
}
