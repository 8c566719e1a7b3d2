//! Run-time backend choice: the best CPU backend for this machine, and the CPU/GPU dispatcher.

use std::fmt;
use std::str::FromStr;
use std::sync::{Arc, OnceLock};

use std::time::Instant;

use crate::cuda::{CudaBackend, GpuError, GpuPolicy};
use crate::reference::Reference;
use crate::{Backend, StripeGen};

/// Backend selection, as given by `--parity-backend cpu|gpu|auto`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendChoice {
    /// GPU for the batches where it pays off, CPU for the rest.
    Auto,
    /// The best CPU backend only.
    Cpu,
    /// The GPU whenever it works; a logged CPU fallback when it does not.
    Gpu,
}

/// A `--parity-backend` word that is none of cpu, gpu, auto.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseBackendChoiceError {
    pub word: String,
}

impl fmt::Display for ParseBackendChoiceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "unknown parity backend {:?}: expected cpu, gpu or auto",
            self.word
        )
    }
}

impl std::error::Error for ParseBackendChoiceError {}

impl FromStr for BackendChoice {
    type Err = ParseBackendChoiceError;

    fn from_str(word: &str) -> Result<Self, Self::Err> {
        match word {
            "auto" => Ok(BackendChoice::Auto),
            "cpu" => Ok(BackendChoice::Cpu),
            "gpu" => Ok(BackendChoice::Gpu),
            _ => Err(ParseBackendChoiceError {
                word: word.to_string(),
            }),
        }
    }
}

impl fmt::Display for BackendChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            BackendChoice::Auto => "auto",
            BackendChoice::Cpu => "cpu",
            BackendChoice::Gpu => "gpu",
        })
    }
}

/// Every CPU backend this machine can run, the reference first, then in order of preference from
/// the least to the most capable. Tests and benchmarks run them side by side.
pub fn cpu_backends() -> Vec<Arc<dyn Backend>> {
    let mut all: Vec<Arc<dyn Backend>> = vec![Arc::new(Reference)];
    all.extend(crate::cpu::detected_backends());
    all
}

/// The best CPU backend for this machine (GFNI > AVX-512BW > AVX2 > reference), detected once,
/// logged once.
pub fn cpu_best() -> Arc<dyn Backend> {
    static BEST: OnceLock<Arc<dyn Backend>> = OnceLock::new();
    BEST.get_or_init(|| {
        let all = cpu_backends();
        let names: Vec<&str> = all.iter().map(|b| b.name()).collect();
        let best = all.last().cloned().unwrap_or_else(|| Arc::new(Reference));
        log::info!(
            "parity: CPU backend {} (available: {})",
            best.name(),
            names.join(", ")
        );
        best
    })
    .clone()
}

/// The dispatcher for `choice` (Auto: GPU per batch when it pays, else CPU; Gpu: GPU or a logged
/// CPU fallback).
pub fn select(choice: BackendChoice) -> Arc<dyn Backend> {
    let cpu = cpu_best();
    match choice {
        BackendChoice::Cpu => cpu,
        BackendChoice::Gpu => match CudaBackend::new(cpu.clone(), GpuPolicy::Always) {
            Ok(gpu) => {
                let gpu: Arc<dyn Backend> = Arc::new(gpu);
                log::info!("parity: --parity-backend gpu: {}", gpu.describe());
                gpu
            }
            Err(e) => {
                log::warn!("parity: --parity-backend gpu, but the GPU is unavailable ({e}); using CPU backend {}", cpu.name());
                cpu
            }
        },
        BackendChoice::Auto => match auto_backend(&cpu) {
            Ok(auto) => {
                log::info!("parity: --parity-backend auto: {}", auto.describe());
                auto
            }
            Err(e) => {
                log::info!(
                    "parity: --parity-backend auto: no GPU ({e}); CPU backend {}",
                    cpu.name()
                );
                cpu
            }
        },
    }
}

/// What start-up calibration measured, for the log and the benchmark.
#[derive(Debug, Clone, Copy)]
pub struct Calibration {
    /// CPU RAID6 gen, GB/s of data.
    pub cpu_gbps: f64,
    /// GPU end-to-end RAID6 gen (gather, copies, kernel, scatter), GB/s of data beyond the overhead.
    pub gpu_gbps: f64,
    /// Fixed cost of one GPU batch, seconds.
    pub gpu_overhead_s: f64,
    /// Smallest batch (bytes of data) for which the GPU is expected to be faster; usize::MAX: never.
    pub min_batch_bytes: usize,
    /// The same three for batches served in place (chunks in registered host memory, no staging copy); rate
    /// 0 and never where no memory could be registered.
    pub in_place_gbps: f64,
    pub in_place_overhead_s: f64,
    pub in_place_min_batch_bytes: usize,
}

/// Measures CPU and GPU once per process and derives the batch size from which the GPU pays:
/// GPU time = overhead + bytes / gpu rate against CPU time = bytes / cpu rate.
pub fn calibrate(cpu: &Arc<dyn Backend>) -> Result<Calibration, GpuError> {
    static CALIBRATION: OnceLock<Result<Calibration, GpuError>> = OnceLock::new();
    CALIBRATION.get_or_init(|| calibrate_now(cpu)).clone()
}

const CALIBRATION_K: usize = 8;
const CALIBRATION_CHUNK_BYTES: usize = 64 << 10;
/// Stripes of the large calibration batch.
const CALIBRATION_STRIPES: usize = 32;

/// Best of a few timings of RAID6 gen over the first `stripes` stripes of `data` (CALIBRATION_K chunks each)
/// into `parity` (two chunks per stripe): the first runs pay for page faults and JIT.
fn time_gen(backend: &dyn Backend, data: &[u8], parity: &mut [u8], stripes: usize) -> f64 {
    let chunk = CALIBRATION_CHUNK_BYTES;
    let views: Vec<Vec<&[u8]>> = data
        .chunks(CALIBRATION_K * chunk)
        .take(stripes)
        .map(|stripe| stripe.chunks(chunk).collect())
        .collect();
    let mut best = f64::MAX;
    for _ in 0..5 {
        let mut batch: Vec<StripeGen> = views
            .iter()
            .zip(parity.chunks_mut(2 * chunk))
            .map(|(d, pq)| {
                let (p, q) = pq.split_at_mut(chunk);
                StripeGen {
                    data: d,
                    p,
                    q: Some(q),
                }
            })
            .collect();
        let start = Instant::now();
        backend.gen_batch(&mut batch);
        best = best.min(start.elapsed().as_secs_f64());
    }
    best
}

/// GPU rate (GB/s beyond the overhead), overhead (s) and break-even batch against `cpu_gbps`, from a one-stripe
/// and a CALIBRATION_STRIPES batch.
fn fit(cpu_gbps: f64, small_s: f64, big_s: f64) -> (f64, f64, usize) {
    let bytes = |stripes: usize| (stripes * CALIBRATION_K * CALIBRATION_CHUNK_BYTES) as f64;
    let per_byte_s = ((big_s - small_s) / (bytes(CALIBRATION_STRIPES) - bytes(1))).max(1e-15);
    let gbps = 1.0 / per_byte_s / 1e9;
    let overhead_s = (small_s - bytes(1) * per_byte_s).max(0.0);
    (
        gbps,
        overhead_s,
        gpu_break_even_bytes(cpu_gbps, gbps, overhead_s),
    )
}

fn calibrate_now(cpu: &Arc<dyn Backend>) -> Result<Calibration, GpuError> {
    let stripe_bytes = CALIBRATION_K * CALIBRATION_CHUNK_BYTES;
    let data_bytes = CALIBRATION_STRIPES * stripe_bytes;
    let parity_bytes = CALIBRATION_STRIPES * 2 * CALIBRATION_CHUNK_BYTES;
    let gpu = CudaBackend::new(cpu.clone(), GpuPolicy::Always)?;
    let mut data = vec![0u8; data_bytes];
    for (i, chunk) in data.chunks_mut(CALIBRATION_CHUNK_BYTES).enumerate() {
        chunk.fill((i * 37 % 251) as u8);
    }
    let mut parity = vec![0u8; parity_bytes];
    let cpu_s = time_gen(cpu.as_ref(), &data, &mut parity, CALIBRATION_STRIPES);
    let gpu_small_s = time_gen(&gpu, &data, &mut parity, 1);
    let gpu_big_s = time_gen(&gpu, &data, &mut parity, CALIBRATION_STRIPES);
    let cpu_gbps = data_bytes as f64 / cpu_s / 1e9;
    let (gpu_gbps, gpu_overhead_s, min_batch_bytes) = fit(cpu_gbps, gpu_small_s, gpu_big_s);
    // The same batches with their chunks in registered memory, served in place.
    let (mut in_place_gbps, mut in_place_overhead_s, mut in_place_min_batch_bytes) =
        (0.0, 0.0, usize::MAX);
    let in_place_before = gpu.batches_in_place();
    if let (Some(mut host_data), Some(mut host_parity)) =
        (gpu.alloc_host(data_bytes), gpu.alloc_host(parity_bytes))
    {
        host_data[..data_bytes].copy_from_slice(&data);
        let host_parity = &mut host_parity[..parity_bytes];
        let small_s = time_gen(&gpu, &host_data[..data_bytes], host_parity, 1);
        let big_s = time_gen(
            &gpu,
            &host_data[..data_bytes],
            host_parity,
            CALIBRATION_STRIPES,
        );
        if gpu.batches_in_place() > in_place_before && host_parity[..] == parity[..] {
            (in_place_gbps, in_place_overhead_s, in_place_min_batch_bytes) =
                fit(cpu_gbps, small_s, big_s);
        } else {
            log::warn!("parity: calibration: batches in registered memory were not served in place, or differ");
        }
    }
    if !gpu.gpu_enabled() {
        return Err(GpuError::SelfTest {
            op: "calibration batch",
        });
    }
    let calibration = Calibration {
        cpu_gbps,
        gpu_gbps,
        gpu_overhead_s,
        min_batch_bytes,
        in_place_gbps,
        in_place_overhead_s,
        in_place_min_batch_bytes,
    };
    let from = |bytes: usize| {
        if bytes == usize::MAX {
            "never".to_string()
        } else {
            format!("from {bytes} bytes per batch")
        }
    };
    log::info!(
        "parity: calibration: CPU {} {:.1} GB/s; GPU {:.1} GB/s after {:.0} us per batch: {}; in place {:.1} GB/s after {:.0} us: {}",
        cpu.name(),
        cpu_gbps,
        gpu_gbps,
        gpu_overhead_s * 1e6,
        from(min_batch_bytes),
        in_place_gbps,
        in_place_overhead_s * 1e6,
        from(in_place_min_batch_bytes),
    );
    Ok(calibration)
}

/// The smallest batch for which overhead + bytes / gpu rate < bytes / cpu rate; usize::MAX when
/// the GPU's rate alone is no better than the CPU's.
pub fn gpu_break_even_bytes(cpu_gbps: f64, gpu_gbps: f64, gpu_overhead_s: f64) -> usize {
    if !(cpu_gbps > 0.0 && gpu_gbps > cpu_gbps && gpu_overhead_s.is_finite()) {
        return usize::MAX;
    }
    let cpu_per_byte_s = 1.0 / (cpu_gbps * 1e9);
    let gpu_per_byte_s = 1.0 / (gpu_gbps * 1e9);
    let bytes = (gpu_overhead_s.max(0.0) / (cpu_per_byte_s - gpu_per_byte_s)).ceil();
    if bytes >= (usize::MAX / 2) as f64 {
        usize::MAX
    } else {
        bytes as usize
    }
}

/// The smallest batch `auto` serves in place, whatever the calibration says. The calibration times one batch
/// at a time; a client's whole-stripe writes (a batch of at most 1 MiB: NBD's merged writes and the payload
/// memory it is lent, ublk's 512 KiB requests) come from many threads at once, where the CPU's rate grows with
/// the writers and the GPU's does not. On an H200 machine eight writers of 1 MiB batches wrote 10.4 GB/s with
/// them in place against 13.5 GB/s on the CPU, for no less host CPU per GB (docs/benchmarks.md, "Client writes
/// on a GPU machine (H200)"). A rebuild's batches (64 rows: 4 MiB of every member with 64 KiB chunks) and a
/// check's (8 MiB of stripes) stay at or above it.
pub const AUTO_IN_PLACE_MIN_BATCH_BYTES: usize = 4 << 20;

/// The in-place threshold `auto` uses: the calibrated break-even, but never below
/// [`AUTO_IN_PLACE_MIN_BATCH_BYTES`].
pub fn auto_in_place_min_batch_bytes(calibrated: usize) -> usize {
    calibrated.max(AUTO_IN_PLACE_MIN_BATCH_BYTES)
}

fn auto_backend(cpu: &Arc<dyn Backend>) -> Result<Arc<dyn Backend>, GpuError> {
    let calibration = calibrate(cpu)?;
    let backend = CudaBackend::new(
        cpu.clone(),
        GpuPolicy::FromBytes {
            min_batch_bytes: calibration.min_batch_bytes,
            in_place_min_batch_bytes: auto_in_place_min_batch_bytes(
                calibration.in_place_min_batch_bytes,
            ),
        },
    )?;
    Ok(Arc::new(backend))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpu_pays_only_past_the_break_even_batch() {
        // CPU 50 GB/s; GPU 100 GB/s after 100 us: t_gpu = 1e-4 + b/1e11 < b/5e10 from b = 1e7.
        let bytes = gpu_break_even_bytes(50.0, 100.0, 100e-6);
        assert!((9_999_000..=10_001_000).contains(&bytes), "{bytes}");
        assert_eq!(
            gpu_break_even_bytes(50.0, 40.0, 1e-6),
            usize::MAX,
            "a slower GPU never pays"
        );
        assert_eq!(gpu_break_even_bytes(50.0, 50.0, 0.0), usize::MAX);
        assert_eq!(gpu_break_even_bytes(0.0, 50.0, 0.0), usize::MAX);
        assert_eq!(
            gpu_break_even_bytes(10.0, 20.0, 0.0),
            0,
            "no overhead: always"
        );
        assert_eq!(gpu_break_even_bytes(10.0, 20.0, f64::NAN), usize::MAX);
    }

    #[test]
    fn auto_serves_in_place_from_the_floor_or_the_break_even_whichever_is_larger() {
        // The H200 calibrations seen: 1.56 MB and 0.90 MB, both below a client write's 1 MiB batch.
        assert_eq!(auto_in_place_min_batch_bytes(902_101), 4 << 20);
        assert_eq!(auto_in_place_min_batch_bytes(1_564_608), 4 << 20);
        assert_eq!(auto_in_place_min_batch_bytes(0), 4 << 20);
        assert_eq!(auto_in_place_min_batch_bytes(9 << 20), 9 << 20);
        assert_eq!(auto_in_place_min_batch_bytes(usize::MAX), usize::MAX);
    }

    #[test]
    fn backend_choice_parses_and_names_bad_word() {
        assert_eq!("auto".parse::<BackendChoice>(), Ok(BackendChoice::Auto));
        assert_eq!("cpu".parse::<BackendChoice>(), Ok(BackendChoice::Cpu));
        assert_eq!("gpu".parse::<BackendChoice>(), Ok(BackendChoice::Gpu));
        let err = "tpu".parse::<BackendChoice>().unwrap_err();
        assert!(err.to_string().contains("\"tpu\""), "{err}");
        for choice in [BackendChoice::Auto, BackendChoice::Cpu, BackendChoice::Gpu] {
            assert_eq!(choice.to_string().parse::<BackendChoice>(), Ok(choice));
        }
    }
}
