//! SIGINT/SIGTERM turn into a shutdown flag the server polls: the array is then stopped cleanly (marked clean).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

static SIGNALLED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_signal: libc::c_int) {
    // Only an atomic store: the one thing that is async-signal-safe here.
    SIGNALLED.store(true, Ordering::SeqCst);
}

/// Installs handlers for SIGINT and SIGTERM and returns a flag that becomes true after either arrives.
pub fn shutdown_flag() -> Arc<AtomicBool> {
    let handler: extern "C" fn(libc::c_int) = on_signal;
    // SAFETY: installs a handler that only stores to an atomic; sigaction is given a zeroed, valid struct.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = handler as libc::sighandler_t;
        libc::sigemptyset(&mut action.sa_mask);
        libc::sigaction(libc::SIGINT, &action, std::ptr::null_mut());
        libc::sigaction(libc::SIGTERM, &action, std::ptr::null_mut());
    }
    let flag = Arc::new(AtomicBool::new(false));
    let forwarded = flag.clone();
    std::thread::Builder::new()
        .name("signal-watch".into())
        .spawn(move || loop {
            if SIGNALLED.load(Ordering::SeqCst) {
                forwarded.store(true, Ordering::SeqCst);
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        })
        .expect("spawning the signal watcher thread");
    flag
}
