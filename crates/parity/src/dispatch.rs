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
}

/// Measures CPU and GPU once per process and derives the batch size from which the GPU pays:
/// GPU time = overhead + bytes / gpu rate against CPU time = bytes / cpu rate.
pub fn calibrate(cpu: &Arc<dyn Backend>) -> Result<Calibration, GpuError> {
    static CALIBRATION: OnceLock<Result<Calibration, GpuError>> = OnceLock::new();
    CALIBRATION.get_or_init(|| calibrate_now(cpu)).clone()
}

fn calibrate_now(cpu: &Arc<dyn Backend>) -> Result<Calibration, GpuError> {
    const K: usize = 8;
    const CHUNK_BYTES: usize = 64 << 10;
    const BIG: usize = 32;
    let gpu = CudaBackend::new(cpu.clone(), GpuPolicy::Always)?;
    let data: Vec<Vec<u8>> = (0..BIG * K)
        .map(|i| vec![(i * 37 % 251) as u8; CHUNK_BYTES])
        .collect();
    let mut parity: Vec<Vec<u8>> = vec![vec![0u8; CHUNK_BYTES]; 2 * BIG];
    let views: Vec<Vec<&[u8]>> = data
        .chunks(K)
        .map(|d| d.iter().map(|c| c.as_slice()).collect())
        .collect();
    // Best of a few runs: the first ones pay for page faults and JIT.
    let mut time_batch = |backend: &dyn Backend, stripes: usize| -> f64 {
        let mut best = f64::MAX;
        for _ in 0..5 {
            let mut batch: Vec<StripeGen> = views[..stripes]
                .iter()
                .zip(parity.chunks_mut(2))
                .map(|(d, pq)| {
                    let (p, q) = pq.split_at_mut(1);
                    StripeGen {
                        data: d,
                        p: &mut p[0],
                        q: Some(&mut q[0]),
                    }
                })
                .collect();
            let start = Instant::now();
            backend.gen_batch(&mut batch);
            best = best.min(start.elapsed().as_secs_f64());
        }
        best
    };
    let bytes = |stripes: usize| (stripes * K * CHUNK_BYTES) as f64;
    let cpu_s = time_batch(cpu.as_ref(), BIG);
    let gpu_small_s = time_batch(&gpu, 1);
    let gpu_big_s = time_batch(&gpu, BIG);
    if !gpu.gpu_enabled() {
        return Err(GpuError::SelfTest {
            op: "calibration batch",
        });
    }
    let cpu_gbps = bytes(BIG) / cpu_s / 1e9;
    let per_byte_s = ((gpu_big_s - gpu_small_s) / (bytes(BIG) - bytes(1))).max(1e-15);
    let gpu_gbps = 1.0 / per_byte_s / 1e9;
    let gpu_overhead_s = (gpu_small_s - bytes(1) * per_byte_s).max(0.0);
    let min_batch_bytes = gpu_break_even_bytes(cpu_gbps, gpu_gbps, gpu_overhead_s);
    let calibration = Calibration {
        cpu_gbps,
        gpu_gbps,
        gpu_overhead_s,
        min_batch_bytes,
    };
    log::info!(
        "parity: calibration: CPU {} {:.1} GB/s; GPU {:.1} GB/s after {:.0} us per batch; GPU from {} bytes per batch",
        cpu.name(),
        cpu_gbps,
        gpu_gbps,
        gpu_overhead_s * 1e6,
        if min_batch_bytes == usize::MAX { "never".to_string() } else { min_batch_bytes.to_string() }
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

fn auto_backend(cpu: &Arc<dyn Backend>) -> Result<Arc<dyn Backend>, GpuError> {
    let calibration = calibrate(cpu)?;
    let backend = CudaBackend::new(
        cpu.clone(),
        GpuPolicy::FromBytes {
            min_batch_bytes: calibration.min_batch_bytes,
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
