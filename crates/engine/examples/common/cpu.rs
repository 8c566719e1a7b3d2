//! What the examples that measure a rate charge it with: the process's CPU time.

/// The process's CPU time so far (user + system, every thread), seconds.
pub fn process_cpu_s() -> f64 {
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: a valid rusage to fill.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    tv(usage.ru_utime) + tv(usage.ru_stime)
}
