//! GPU rows: the kernel alone beside the device memcpy rate, pinned host→GPU→host beside the
//! pinned host-to-device copy rate, and whole batches through the `Backend` trait (gathering from
//! and scattering to ordinary host memory included).

use paraid_parity::cuda::{driver_present, CudaBackend, GpuPolicy};
use paraid_parity::{calibrate, cpu_best, Backend, StripeGen, StripeRecover};

use crate::{measure, Args, Row, StripeView};

/// Stripes per batch for the batched rows: about 64 MiB of data.
fn batch_stripes(stripe_bytes: usize) -> usize {
    ((64usize << 20) / stripe_bytes.max(1)).clamp(1, 4096)
}

pub fn bench(stripe: &StripeView<'_>, args: &Args, rows: &mut Vec<Row>) {
    if !driver_present() {
        eprintln!("bench-parity: GPU rows skipped: no CUDA driver");
        crate::in_place::bench(None, stripe, args, rows);
        return;
    }
    let gpu = match CudaBackend::new(cpu_best(), GpuPolicy::Always) {
        Ok(gpu) => gpu,
        Err(e) => {
            eprintln!("bench-parity: GPU rows skipped: {e}");
            crate::in_place::bench(None, stripe, args, rows);
            return;
        }
    };
    let k = args.data_chunks;
    let chunk_bytes = args.chunk_bytes;
    let stripe_bytes = k * chunk_bytes;
    let stripes = batch_stripes(stripe_bytes);
    let device = gpu.device_name().to_string();
    let mut push = |op: &'static str, (gbps, gbps_median): (f64, f64), note: String| {
        rows.push(Row {
            backend: "cuda".into(),
            op,
            gbps,
            gbps_median,
            note: Some(note),
        });
    };

    match gpu.bench_device(k, chunk_bytes, stripes, args.seconds) {
        Ok(f) => {
            push(
                "gen_pq_kernel",
                (f.kernel_gbps, f.kernel_gbps),
                format!(
                    "{:.0}% of device memcpy; {device}",
                    100.0 * f.kernel_gbps / f.device_memcpy_gbps
                ),
            );
            if let Some(recover_gbps) = f.recover_kernel_gbps {
                push(
                    "recover_2data_kernel",
                    (recover_gbps, recover_gbps),
                    format!(
                        "{:.0}% of device memcpy; {device}",
                        100.0 * recover_gbps / f.device_memcpy_gbps
                    ),
                );
            }
            push(
                "device_memcpy",
                (f.device_memcpy_gbps, f.device_memcpy_gbps),
                format!("cuMemcpyDtoD, GB/s copied; {device}"),
            );
            push(
                "gen_pq_pinned_roundtrip",
                (f.pinned_roundtrip_gbps, f.pinned_roundtrip_gbps),
                format!(
                    "{:.0}% of pinned host-to-device; {stripes} stripes per batch",
                    100.0 * f.pinned_roundtrip_gbps / f.pinned_to_device_gbps
                ),
            );
            push(
                "pinned_h2d",
                (f.pinned_to_device_gbps, f.pinned_to_device_gbps),
                "cuMemcpyHtoD from pinned memory, GB/s copied".into(),
            );
        }
        Err(e) => eprintln!("bench-parity: GPU device rows failed: {e}"),
    }

    // Whole batches through the Backend trait: the same stripe data repeated, distinct outputs.
    let mut parity: Vec<Vec<u8>> = vec![vec![0u8; chunk_bytes]; 2 * stripes];
    let measured = measure(args.seconds, stripes * stripe_bytes, || {
        let mut batch: Vec<StripeGen> = parity
            .chunks_mut(2)
            .map(|pq| {
                let (p, q) = pq.split_at_mut(1);
                StripeGen {
                    data: &stripe.data,
                    p: &mut p[0],
                    q: Some(&mut q[0]),
                }
            })
            .collect();
        gpu.gen_batch(&mut batch);
    });
    let correct = parity
        .chunks(2)
        .all(|pq| pq[0] == stripe.p && pq[1] == stripe.q);
    push(
        "gen_pq_batch",
        measured,
        format!(
            "host memory to host memory, {stripes} stripes per call; output {}",
            if correct { "verified" } else { "WRONG" }
        ),
    );

    let (x, y) = (0, k / 2);
    let mut whole: Vec<Vec<Vec<u8>>> = (0..stripes)
        .map(|_| {
            let mut chunks: Vec<Vec<u8>> = stripe.data.iter().map(|d| d.to_vec()).collect();
            chunks.push(stripe.p.to_vec());
            chunks.push(stripe.q.to_vec());
            chunks[x].fill(0);
            chunks[y].fill(0);
            chunks
        })
        .collect();
    let missing = [x, y];
    let measured = measure(args.seconds, stripes * stripe_bytes, || {
        let mut lists: Vec<Vec<&mut [u8]>> = whole
            .iter_mut()
            .map(|c| c.iter_mut().map(|c| c.as_mut_slice()).collect())
            .collect();
        let mut batch: Vec<StripeRecover> = lists
            .iter_mut()
            .map(|c| StripeRecover {
                chunks: c,
                has_q: true,
                missing: &missing,
            })
            .collect();
        if let Err(e) = gpu.recover_batch(&mut batch) {
            eprintln!("bench-parity: GPU recover_batch failed: {e}");
        }
    });
    let correct = whole
        .iter()
        .all(|c| c[x] == stripe.data[x] && c[y] == stripe.data[y]);
    push(
        "recover_2data_batch",
        measured,
        format!(
            "host memory to host memory, {stripes} stripes per call; output {}",
            if correct { "verified" } else { "WRONG" }
        ),
    );
    crate::in_place::bench(Some(&gpu), stripe, args, rows);
    if !gpu.gpu_enabled() {
        eprintln!(
            "bench-parity: the GPU switched itself off during the run: {}",
            gpu.describe()
        );
    }

    match calibrate(&cpu_best()) {
        Ok(c) => eprintln!(
            "bench-parity: auto calibration: CPU {:.1} GB/s, GPU {:.1} GB/s after {:.0} us per batch; GPU from {} bytes per batch; in place {:.1} GB/s after {:.0} us, from {} bytes",
            c.cpu_gbps,
            c.gpu_gbps,
            c.gpu_overhead_s * 1e6,
            if c.min_batch_bytes == usize::MAX { "never".to_string() } else { c.min_batch_bytes.to_string() },
            c.in_place_gbps,
            c.in_place_overhead_s * 1e6,
            if c.in_place_min_batch_bytes == usize::MAX { "never".to_string() } else { c.in_place_min_batch_bytes.to_string() },
        ),
        Err(e) => eprintln!("bench-parity: auto calibration failed: {e}"),
    }
}
