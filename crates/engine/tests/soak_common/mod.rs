//! The soaks' watchdog: a thread that ends the process, naming the phase, when nothing completes for `HANG`. A
//! hang can catch the test's own thread inside a member event, so the watchdog cannot be that thread; it writes
//! straight to stderr because the harness's capture of `eprintln!` dies with the process.
#![allow(dead_code)]

use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use paraid_engine::fault::SplitMix64;
use paraid_engine::layout::Level;
use paraid_engine::superblock::DEFAULT_DATA_OFFSET_BYTES;

/// The soaks' arrays: sixteen writer threads, each on its own stretch of six stripes; six members, 16 KiB chunks.
pub const THREADS: u64 = 16;
pub const STRETCH_STRIPES: u64 = 6;
pub const CHUNK_BYTES: u64 = 16384;
pub const MEMBERS: usize = 6;

/// Where a soak array's data starts and how large each member is: the smallest log ring the log works with
/// (`small_ring`, which fills and retires under the sixteen writers) or the default metadata area, then one
/// stretch of `STRETCH_STRIPES` rows per thread. Returns (data offset, member bytes).
pub fn member_layout(level: Level, small_ring: bool) -> (u64, u64) {
    let data_offset = if small_ring {
        paraid_engine::small_ring_data_offset_bytes(level, CHUNK_BYTES, 0)
    } else {
        DEFAULT_DATA_OFFSET_BYTES
    };
    (
        data_offset,
        data_offset + THREADS * STRETCH_STRIPES * CHUNK_BYTES,
    )
}

/// A whole number from the environment variable `name`, if set (a clear panic if it is not a number).
pub fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().map(|v| {
        v.trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v}: not a number"))
    })
}

/// A request within a stretch of `stretch_bytes`: (offset, length). Whole pages, page-aligned, three times in four
/// (up to 48 KiB); otherwise any bytes at any offset (up to 9000).
pub fn draw_extent(rng: &mut SplitMix64, stretch_bytes: u64) -> (u64, u64) {
    let len = if rng.one_in(4) {
        1 + rng.below(9000)
    } else {
        4096 * (1 + rng.below(12))
    };
    let mut at = rng.below(stretch_bytes - len + 1);
    if len % 4096 == 0 {
        at -= at % 4096;
    }
    (at, len)
}

/// No I/O and no member event completed for this long: hung.
pub const HANG: Duration = Duration::from_secs(20);

pub struct Watchdog {
    /// Every completed I/O and member event adds one.
    pub ops: Arc<AtomicU64>,
    phase: Arc<Mutex<String>>,
    done: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
}

impl Watchdog {
    /// Watches the run described by `what`.
    pub fn start(what: &str) -> Watchdog {
        let ops = Arc::new(AtomicU64::new(0));
        let phase = Arc::new(Mutex::new(String::from("warm-up")));
        let done = Arc::new(AtomicBool::new(false));
        let handle = {
            let (ops, phase, done, what) =
                (ops.clone(), phase.clone(), done.clone(), what.to_string());
            std::thread::spawn(move || {
                let (mut seen, mut since) = (ops.load(Ordering::Relaxed), Instant::now());
                while !done.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(100));
                    let now = ops.load(Ordering::Relaxed);
                    if now != seen {
                        (seen, since) = (now, Instant::now());
                    } else if since.elapsed() > HANG {
                        let _ = writeln!(
                            std::io::stderr(),
                            "soak, {what}: nothing completed for {} s during {}: hung",
                            HANG.as_secs(),
                            phase.lock().unwrap_or_else(|e| e.into_inner()),
                        );
                        std::process::exit(1);
                    }
                }
            })
        };
        Watchdog {
            ops,
            phase,
            done,
            handle: Some(handle),
        }
    }

    /// Before a member event or a final step: the phase, and a tick for the step before it, which completed.
    pub fn enter(&self, during: &str) {
        *self.phase.lock().unwrap_or_else(|e| e.into_inner()) = during.to_string();
        self.ops.fetch_add(1, Ordering::Relaxed);
    }

    /// Waiting on the load for 100 ms: the phase only (progress must come from the threads).
    pub fn watch(&self, during: &str) {
        *self.phase.lock().unwrap_or_else(|e| e.into_inner()) = during.to_string();
        std::thread::sleep(Duration::from_millis(100));
    }

    /// Completed I/Os and events so far.
    pub fn count(&self) -> u64 {
        self.ops.load(Ordering::Relaxed)
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.done.store(true, Ordering::Relaxed);
        if let Some(handle) = self.handle.take() {
            let _ = handle.join();
        }
    }
}
