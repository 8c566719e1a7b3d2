//! Run-time backend choice: the best CPU backend for this machine, and the CPU/GPU dispatcher.

use std::fmt;
use std::str::FromStr;
use std::sync::{Arc, OnceLock};

use crate::reference::Reference;
use crate::Backend;

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
    match choice {
        BackendChoice::Cpu | BackendChoice::Auto | BackendChoice::Gpu => cpu_best(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
