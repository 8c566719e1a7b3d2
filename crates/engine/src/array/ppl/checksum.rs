//! The log's CRC-32C: SSE4.2 over three interleaved streams, and the share of a zero tail computed.

use super::*;

/// CRC-32C of `bytes`, with the SSE4.2 instruction where the CPU has it (the log checksums every record it
/// writes and scans; the table version in `crc32c` is for single superblocks).
pub(super) fn checksum(bytes: &[u8]) -> u32 {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("sse4.2") {
        // SAFETY: the CPU has SSE4.2.
        return unsafe { crc32c_sse42(bytes) };
    }
    crc32c(bytes)
}

/// `checksum(bytes)` for `bytes` whose bytes from `used` on are all zero, without reading them: CRC-32C is linear,
/// so running the register over n zero bytes is a fixed GF(2) operator, applied here as the product of the
/// operators for the powers of two that make up n.
pub(super) fn checksum_zero_tail(bytes: &[u8], used: usize) -> u32 {
    // (Not asserted here: reading the tail is what this avoids. The caller zeroed the page; a unit test checks
    // the result against reading it.)
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("sse4.2") {
        let skips = zero_skip_columns();
        // SAFETY: the CPU has SSE4.2.
        let mut register = unsafe { crc_register_sse42(!0, &bytes[..used]) };
        let mut zeros = bytes.len() - used;
        let mut power = 0;
        while zeros > 0 {
            if zeros & 1 != 0 {
                register = crc_skip(register, &skips[power]);
            }
            zeros >>= 1;
            power += 1;
        }
        return !register;
    }
    checksum(bytes)
}

/// Zero-byte operators of `zero_skip_columns`: 2^0 .. 2^(ZERO_SKIP_POWERS - 1) bytes (a header page at most).
#[cfg(target_arch = "x86_64")]
const ZERO_SKIP_POWERS: usize = 13;

/// For each power of two p < 2^ZERO_SKIP_POWERS, the CRC-32C register operator for p zero bytes (as columns).
#[cfg(target_arch = "x86_64")]
fn zero_skip_columns() -> &'static [[u32; 32]; ZERO_SKIP_POWERS] {
    static COLUMNS: std::sync::OnceLock<[[u32; 32]; ZERO_SKIP_POWERS]> = std::sync::OnceLock::new();
    COLUMNS.get_or_init(|| {
        let zeros = [0u8; 1 << (ZERO_SKIP_POWERS - 1)];
        let mut ops = [[0u32; 32]; ZERO_SKIP_POWERS];
        for (power, op) in ops.iter_mut().enumerate() {
            for (bit, col) in op.iter_mut().enumerate() {
                // SAFETY: only reached from checksum_zero_tail, i.e. on a CPU with SSE4.2.
                *col = unsafe { crc_register_sse42(1 << bit, &zeros[..1 << power]) };
            }
        }
        ops
    })
}

/// Bytes each of the three interleaved CRC streams takes per block: the `crc32` instruction has a latency of
/// three cycles and a throughput of one, so three independent streams run about three times as fast as one;
/// their registers are joined with the "N zero bytes" operator below.
#[cfg(target_arch = "x86_64")]
const CRC_STREAM_BYTES: usize = 1024;

/// The CRC-32C register operator for `CRC_STREAM_BYTES` zero bytes, as 32 columns (GF(2) matrix): the register
/// after those bytes from register `r` is the XOR of the columns of `r`'s set bits (the CRC is linear).
#[cfg(target_arch = "x86_64")]
fn crc_skip_columns() -> &'static [u32; 32] {
    static COLUMNS: std::sync::OnceLock<[u32; 32]> = std::sync::OnceLock::new();
    COLUMNS.get_or_init(|| {
        let mut cols = [0u32; 32];
        for (bit, col) in cols.iter_mut().enumerate() {
            // SAFETY: only reached from crc32c_sse42, i.e. on a CPU with SSE4.2.
            *col = unsafe { crc_register_sse42(1 << bit, &[0u8; CRC_STREAM_BYTES]) };
        }
        cols
    })
}

#[cfg(target_arch = "x86_64")]
fn crc_skip(register: u32, columns: &[u32; 32]) -> u32 {
    // Branch-free: the register's bits are random, and a mispredicted branch per bit cost more than the XORs.
    let mut out = 0;
    for (bit, col) in columns.iter().enumerate() {
        out ^= col & ((register >> bit) & 1).wrapping_neg();
    }
    out
}

/// The raw CRC-32C register after `bytes`, from `register` (no initial or final inversion).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse4.2")]
unsafe fn crc_register_sse42(register: u32, bytes: &[u8]) -> u32 {
    use std::arch::x86_64::{_mm_crc32_u64, _mm_crc32_u8};
    let mut words = bytes.chunks_exact(8);
    let mut crc = register as u64;
    for w in &mut words {
        crc = _mm_crc32_u64(crc, u64::from_le_bytes(w.try_into().expect("8 bytes")));
    }
    let mut crc = crc as u32;
    for &b in words.remainder() {
        crc = _mm_crc32_u8(crc, b);
    }
    crc
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse4.2")]
unsafe fn crc32c_sse42(bytes: &[u8]) -> u32 {
    use std::arch::x86_64::_mm_crc32_u64;
    const N: usize = CRC_STREAM_BYTES;
    // SAFETY (the reads below): `at + 8 <= N` and every stream slice holds N bytes.
    let word = |b: &[u8], at: usize| {
        u64::from_le(std::ptr::read_unaligned(b.as_ptr().add(at).cast::<u64>()))
    };
    let mut register = !0u32;
    let mut blocks = bytes.chunks_exact(3 * N);
    if bytes.len() >= 3 * N {
        let columns = crc_skip_columns();
        for block in &mut blocks {
            let (a, rest) = block.split_at(N);
            let (b, c) = rest.split_at(N);
            let (mut ra, mut rb, mut rc) = (register as u64, 0u64, 0u64);
            let mut at = 0;
            while at < N {
                ra = _mm_crc32_u64(ra, word(a, at));
                rb = _mm_crc32_u64(rb, word(b, at));
                rc = _mm_crc32_u64(rc, word(c, at));
                at += 8;
            }
            // reg(r, A|B|C) = skip(skip(reg(r, A)) ^ reg(0, B)) ^ reg(0, C).
            register = crc_skip(crc_skip(ra as u32, columns) ^ rb as u32, columns) ^ rc as u32;
        }
    }
    !crc_register_sse42(register, blocks.remainder())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checksum_is_crc32c() {
        let mut x = 1u64;
        for len in [
            0usize, 1, 7, 8, 9, 3071, 3072, 3073, 4092, 4096, 6144, 8192, 9221, 12345,
        ] {
            let bytes: Vec<u8> = (0..len)
                .map(|_| {
                    x = x
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    (x >> 56) as u8
                })
                .collect();
            assert_eq!(checksum(&bytes), crc32c(&bytes), "{len} bytes");
        }
        assert_eq!(checksum(b"123456789"), 0xE306_9283);
        // A header with a zero tail: the computed share of the zeros matches reading them.
        let mut page = vec![0u8; CHECKSUM_AT];
        for used in [0usize, 1, 64, 96, 1000, 4091, CHECKSUM_AT] {
            page.iter_mut()
                .take(used)
                .enumerate()
                .for_each(|(i, b)| *b = (i * 7 + 3) as u8);
            page[used..].fill(0);
            assert_eq!(
                checksum_zero_tail(&page, used),
                crc32c(&page),
                "{used} bytes used"
            );
        }
    }
}
