//! Shared by the examples that measure a rate: the process's CPU time they charge it with, and the data they
//! write.
#![allow(dead_code)]

/// The process's CPU time so far (user + system, every thread), seconds.
pub fn process_cpu_s() -> f64 {
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: a valid rusage to fill.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

/// Fills `buf` with data that differs per 8-byte word (so that parity is real work): xorshift64 from `seed`.
pub fn fill(buf: &mut [u8], seed: u64) {
    let mut state = seed | 1;
    for word in buf.chunks_mut(8) {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        word.copy_from_slice(&state.to_le_bytes()[..word.len()]);
    }
}
