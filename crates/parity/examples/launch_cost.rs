//! What one in-place GPU batch costs the host: threads each generate P and Q of their own batch of RAID6 stripes
//! in memory registered with the GPU (`Backend::alloc_host`), over and over, for some seconds. Prints one JSON
//! object: batches per second, wall time per batch, and CPU time per batch for the whole process (the CUDA
//! driver's threads included) and for the calling threads alone; then checks the last batch of every thread
//! against the best CPU backend.
//!
//! Usage: launch_cost [--data-chunks K] [--chunk-bytes B] [--stripes N] [--threads T] [--seconds S]
//! (defaults 4, 4096, 1, 1, 2: a batch so small that what is measured is the launch). `PARAID_GPU_WAIT=block|spin|yield|
//! poll-then-block` picks how the calling thread waits for the GPU. Without a GPU it says so and exits 0.

use std::time::{Duration, Instant};

use paraid_parity::cuda::{CudaBackend, GpuPolicy};
use paraid_parity::{cpu_best, Backend, StripeGen};

fn cpu_s(clock: libc::clockid_t) -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid timespec to fill.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

/// P and Q of every stripe of `block` (k data chunks, then P and Q, each `chunk` bytes).
fn gen(backend: &dyn Backend, block: &mut [u8], k: usize, chunk: usize) {
    let mut datas: Vec<Vec<&[u8]>> = Vec::new();
    let mut parities: Vec<(&mut [u8], &mut [u8])> = Vec::new();
    for stripe in block.chunks_mut((k + 2) * chunk) {
        let (data, pq) = stripe.split_at_mut(k * chunk);
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

fn main() {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let (mut k, mut chunk, mut stripes, mut threads, mut seconds) =
        (4usize, 4096usize, 1usize, 1usize, 2.0f64);
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let value = args.next().unwrap_or_else(|| panic!("{arg} needs a value"));
        match arg.as_str() {
            "--data-chunks" => k = value.parse().expect("--data-chunks K"),
            "--chunk-bytes" => chunk = value.parse().expect("--chunk-bytes B"),
            "--stripes" => stripes = value.parse().expect("--stripes N"),
            "--threads" => threads = value.parse().expect("--threads T"),
            "--seconds" => seconds = value.parse().expect("--seconds S"),
            other => panic!("unknown argument {other:?}"),
        }
    }
    let gpu = match CudaBackend::new(cpu_best(), GpuPolicy::Always) {
        Ok(gpu) => gpu,
        Err(e) => {
            println!("launch_cost: skipped: no usable GPU ({e})");
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
                    let mut seed = 0x9e37_79b9_7f4a_7c15u64 ^ t as u64;
                    for byte in block.iter_mut() {
                        seed ^= seed << 13;
                        seed ^= seed >> 7;
                        seed ^= seed << 17;
                        *byte = seed as u8;
                    }
                    let thread0 = cpu_s(libc::CLOCK_THREAD_CPUTIME_ID);
                    let start = Instant::now();
                    let mut batches = 0u64;
                    while start.elapsed() < Duration::from_secs_f64(seconds) {
                        gen(gpu, &mut block[..block_bytes], k, chunk);
                        batches += 1;
                    }
                    let thread_s = cpu_s(libc::CLOCK_THREAD_CPUTIME_ID) - thread0;
                    let mut expected = block[..block_bytes].to_vec();
                    gen(cpu_best().as_ref(), &mut expected, k, chunk);
                    (batches, thread_s, expected[..] == block[..block_bytes])
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
    println!(
        "{{\"wait\": {:?}, \"data_chunks\": {k}, \"chunk_bytes\": {chunk}, \"stripes\": {stripes}, \"threads\": {threads}, \
         \"batches\": {batches}, \"in_place\": {in_place}, \"batches_per_s\": {:.0}, \"wall_us_per_batch_per_thread\": {:.1}, \
         \"process_cpu_us_per_batch\": {:.1}, \"caller_cpu_us_per_batch\": {:.1}, \"process_cores_busy\": {:.2}, \"correct\": {correct}}}",
        std::env::var("PARAID_GPU_WAIT").unwrap_or_else(|_| "block".into()),
        batches as f64 / wall_s,
        wall_s * threads as f64 / batches.max(1) as f64 * 1e6,
        per_batch_us(process_s),
        per_batch_us(callers_s),
        process_s / wall_s,
    );
    assert!(correct, "a batch on the GPU differs from the CPU's");
    assert_eq!(in_place, batches, "every batch ran in place");
}
