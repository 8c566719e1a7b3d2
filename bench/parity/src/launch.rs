//! What one in-place GPU batch costs the host (`bench-parity --launch-cost`): threads each generate P and Q of
//! their own batch of RAID6 stripes in memory registered with the GPU (`Backend::alloc_host`), over and over, for
//! `--seconds`. Prints one JSON object: batches per second, wall time per batch, and CPU time per batch for the
//! whole process (the CUDA driver's threads included) and for the calling threads alone; then checks the last
//! batch of every thread against the best CPU backend. Batches are `--stripes` stripes of `--data-chunks` chunks
//! of `--chunk-bytes`; the default stripe and one thread measure the launch alone. `PARAID_GPU_WAIT=block|spin|
//! yield|poll-then-block` picks how the calling thread waits for the GPU. Without a GPU it says so and exits 0.

use std::time::{Duration, Instant};

use paraid_parity::cuda::{CudaBackend, GpuPolicy};
use paraid_parity::{cpu_best, Backend};

use crate::buf::fill_random;
use crate::in_place::{cpu_s, gen_batch};
use crate::Args;

pub fn run(args: &Args) {
    let (k, chunk, stripes, threads) = (
        args.data_chunks,
        args.chunk_bytes,
        args.stripes,
        args.threads,
    );
    let gpu = match CudaBackend::new(cpu_best(), GpuPolicy::Always) {
        Ok(gpu) => gpu,
        Err(e) => {
            println!("bench-parity --launch-cost: skipped: no usable GPU ({e})");
            return;
        }
    };
    let block_bytes = stripes * (k + 2) * chunk;
    let in_place_before = gpu.batches_in_place();
    let wall0 = Instant::now();
    let process0 = cpu_s(libc::CLOCK_PROCESS_CPUTIME_ID);
    let results: Vec<(u64, f64, bool)> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                let gpu = &gpu;
                scope.spawn(move || {
                    let mut block = gpu
                        .alloc_host(block_bytes)
                        .expect("a GPU that runs batches registers host memory");
                    fill_random(&mut block, &mut (t as u64));
                    let block = &mut block[..block_bytes];
                    let thread0 = cpu_s(libc::CLOCK_THREAD_CPUTIME_ID);
                    let start = Instant::now();
                    let mut batches = 0u64;
                    while start.elapsed() < Duration::from_secs_f64(args.seconds) {
                        gen_batch(gpu, block, k, chunk, stripes);
                        batches += 1;
                    }
                    let thread_s = cpu_s(libc::CLOCK_THREAD_CPUTIME_ID) - thread0;
                    let mut expected = block.to_vec();
                    gen_batch(cpu_best().as_ref(), &mut expected, k, chunk, stripes);
                    (batches, thread_s, expected[..] == block[..])
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().expect("worker"))
            .collect()
    });
    let wall_s = wall0.elapsed().as_secs_f64();
    let process_s = cpu_s(libc::CLOCK_PROCESS_CPUTIME_ID) - process0;
    let batches: u64 = results.iter().map(|r| r.0).sum();
    let callers_s: f64 = results.iter().map(|r| r.1).sum();
    let correct = results.iter().all(|r| r.2);
    let in_place = gpu.batches_in_place() - in_place_before;
    let per_batch_us = |s: f64| s / batches.max(1) as f64 * 1e6;
    let report = serde_json::json!({
        "wait": std::env::var("PARAID_GPU_WAIT").unwrap_or_else(|_| "block".into()),
        "data_chunks": k,
        "chunk_bytes": chunk,
        "stripes": stripes,
        "threads": threads,
        "batches": batches,
        "in_place": in_place,
        "batches_per_s": (batches as f64 / wall_s).round(),
        "wall_us_per_batch_per_thread": wall_s * threads as f64 / batches.max(1) as f64 * 1e6,
        "process_cpu_us_per_batch": per_batch_us(process_s),
        "caller_cpu_us_per_batch": per_batch_us(callers_s),
        "process_cores_busy": process_s / wall_s,
        "correct": correct,
    });
    println!("{report}");
    assert!(correct, "a batch on the GPU differs from the CPU's");
    assert_eq!(in_place, batches, "every batch ran in place");
}
