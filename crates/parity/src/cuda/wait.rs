//! How the host waits for a launch of the in-place path to finish.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use cudarc::driver::sys;

use super::GpuError;

/// How a lane waits for its launch to finish: by default in the driver's blocking wait (the thread sleeps until
/// the GPU is done). Measured on an H200 machine (`bench-parity --launch-cost`; docs/benchmarks.md, "How a lane
/// waits for the GPU (stop 47)"), one thread of 1 MiB batches: blocking 91 µs a batch for 53 µs of host CPU,
/// spinning on the event 47 µs for 54, polling for up to 50 µs and then blocking 81 µs for 88 (the batches
/// that outlast the poll pay for both); eight threads: blocking 40 µs of host CPU a batch, spinning 137. A
/// rebuild's batches of milliseconds would keep a spinning core busy throughout: blocking is the default, and
/// `PARAID_GPU_WAIT` (block, spin, yield, poll-then-block) chooses another, for measuring.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Wait {
    PollThenBlock,
    Block,
    Spin,
    Yield,
}

/// How long poll-then-block polls before it blocks.
const POLL_BEFORE_BLOCK: Duration = Duration::from_micros(50);

fn wait_mode() -> Wait {
    static MODE: OnceLock<Wait> = OnceLock::new();
    *MODE.get_or_init(|| {
        let value = std::env::var("PARAID_GPU_WAIT").ok();
        let mode = parse(value.as_deref());
        if mode.is_none() {
            log::warn!(
                "parity: PARAID_GPU_WAIT={value:?} is none of block, spin, yield, poll-then-block: block"
            );
        }
        mode.unwrap_or(Wait::Block)
    })
}

/// The mode a `PARAID_GPU_WAIT` value names (unset: the default); None for a word it does not know.
fn parse(value: Option<&str>) -> Option<Wait> {
    match value {
        None | Some("block") => Some(Wait::Block),
        Some("poll-then-block") => Some(Wait::PollThenBlock),
        Some("spin") => Some(Wait::Spin),
        Some("yield") => Some(Wait::Yield),
        Some(_) => None,
    }
}

/// Waits until the GPU has passed `event`, as `wait_mode` says.
/// SAFETY: `event` is a live event of the current context.
pub(super) unsafe fn wait_for(event: sys::CUevent) -> Result<(), GpuError> {
    let block = || {
        sys::cuEventSynchronize(event)
            .result()
            .map_err(GpuError::Synchronize)
    };
    let (pause, poll_for): (fn(), Option<Duration>) = match wait_mode() {
        Wait::Block => return block(),
        Wait::PollThenBlock => (std::hint::spin_loop, Some(POLL_BEFORE_BLOCK)),
        Wait::Spin => (std::hint::spin_loop, None),
        Wait::Yield => (std::thread::yield_now, None),
    };
    let start = Instant::now();
    loop {
        match sys::cuEventQuery(event).result() {
            Ok(()) => return Ok(()),
            Err(e) if e.0 == sys::CUresult::CUDA_ERROR_NOT_READY => {
                if poll_for.is_some_and(|limit| start.elapsed() >= limit) {
                    return block();
                }
                pause()
            }
            Err(e) => return Err(GpuError::Synchronize(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{parse, Wait};

    #[test]
    fn blocking_is_the_default_and_each_word_names_its_mode() {
        assert_eq!(parse(None), Some(Wait::Block));
        assert_eq!(parse(Some("block")), Some(Wait::Block));
        assert_eq!(parse(Some("spin")), Some(Wait::Spin));
        assert_eq!(parse(Some("yield")), Some(Wait::Yield));
        assert_eq!(parse(Some("poll-then-block")), Some(Wait::PollThenBlock));
        assert_eq!(
            parse(Some("Block")),
            None,
            "a word it does not know is refused"
        );
        assert_eq!(parse(Some("")), None);
    }
}
