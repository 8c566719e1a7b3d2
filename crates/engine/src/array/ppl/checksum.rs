//! The share of a zero tail in the log's CRC-32C (`crate::crc32c`), computed.

use super::*;
#[cfg(target_arch = "x86_64")]
use crate::crc32c::{crc_register_sse42, crc_skip};

/// `crc32c(bytes)` for `bytes` whose bytes from `used` on are all zero, without reading them: CRC-32C is linear,
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
    crc32c(bytes)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crc32c::crc32c_table;

    #[test]
    fn a_zero_tail_counts_as_read() {
        // (The fast path against the table for many lengths: `crc32c::tests`.)
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
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
                crc32c_table(&page),
                "{used} bytes used"
            );
        }
    }
}
