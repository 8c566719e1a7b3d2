//! An array's background thread (the bitmap tick, the slow-member prober): it waits between rounds of work on a
//! stop flag that wakes it at once, and is stopped and joined once, never by itself.

use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// The thread's side: waits, and says when to stop.
#[derive(Clone)]
pub(super) struct StopFlag(Arc<(Mutex<bool>, Condvar)>);

impl StopFlag {
    /// Waits `wait` or until stopped; true when stopped.
    pub(super) fn wait(&self, wait: Duration) -> bool {
        let (stopped, wake) = &*self.0;
        let guard = stopped.lock().unwrap_or_else(|e| e.into_inner());
        let (guard, _) = wake
            .wait_timeout_while(guard, wait, |s| !*s)
            .unwrap_or_else(|e| e.into_inner());
        *guard
    }
}

/// The array's side: starts the thread, stops it.
pub(super) struct Background {
    stop: StopFlag,
    handle: Mutex<Option<JoinHandle<()>>>,
}

impl Background {
    pub(super) fn new() -> Background {
        Background {
            stop: StopFlag(Arc::new((Mutex::new(false), Condvar::new()))),
            handle: Mutex::new(None),
        }
    }

    /// Starts `body` on a thread named `name`, with the flag to wait on.
    pub(super) fn start(
        &self,
        name: &str,
        body: impl FnOnce(StopFlag) + Send + 'static,
    ) -> std::io::Result<()> {
        let stop = self.stop.clone();
        let handle = std::thread::Builder::new()
            .name(name.to_string())
            .spawn(move || body(stop))?;
        *self.handle.lock().unwrap_or_else(|e| e.into_inner()) = Some(handle);
        Ok(())
    }

    /// Stops the thread and waits for it (not when called from it), logging a panic as `what`'s.
    pub(super) fn stop(&self, what: &str) {
        {
            let (stopped, wake) = &*self.stop.0;
            *stopped.lock().unwrap_or_else(|e| e.into_inner()) = true;
            wake.notify_all();
        }
        let handle = self.handle.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(t) = handle {
            if t.thread().id() != std::thread::current().id() && t.join().is_err() {
                log::error!("{what} panicked");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Instant;

    #[test]
    fn a_waiting_thread_stops_at_once_and_is_joined() {
        let background = Background::new();
        let rounds = Arc::new(AtomicUsize::new(0));
        let counted = rounds.clone();
        background
            .start("test-background", move |stop| {
                while !stop.wait(Duration::from_secs(3600)) {
                    counted.fetch_add(1, Ordering::Relaxed);
                }
            })
            .expect("a thread");
        let started = Instant::now();
        background.stop("the test thread");
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "woken, not timed out"
        );
        assert_eq!(rounds.load(Ordering::Relaxed), 0);
        background.stop("the test thread"); // twice: nothing left to join
    }
}
