//! CRC-32C (Castagnoli): reflected polynomial 0x82F63B78, initial value !0, final XOR !0 (the iSCSI / ext4 /
//! Btrfs checksum). With SSE4.2's `crc32` instruction over three interleaved streams where the CPU has it (the
//! log checksums every record it writes and scans, write-back every write it holds); the byte-at-a-time table
//! otherwise, and as the reference the fast path is tested against.

const POLY_REFLECTED: u32 = 0x82F6_3B78;

const TABLE: [u32; 256] = build_table();

const fn build_table() -> [u32; 256] {
    let mut table = [0u32; 256];
    let mut byte = 0;
    while byte < 256 {
        let mut crc = byte as u32;
        let mut bit = 0;
        while bit < 8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ POLY_REFLECTED
            } else {
                crc >> 1
            };
            bit += 1;
        }
        table[byte] = crc;
        byte += 1;
    }
    table
}

/// CRC-32C of `bytes`.
pub fn crc32c(bytes: &[u8]) -> u32 {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("sse4.2") {
        // SAFETY: the CPU has SSE4.2.
        return unsafe { crc32c_sse42(bytes) };
    }
    crc32c_table(bytes)
}

/// CRC-32C of `bytes`, a byte at a time from the table: the reference.
pub fn crc32c_table(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in bytes {
        crc = TABLE[((crc ^ b as u32) & 0xff) as usize] ^ (crc >> 8);
    }
    !crc
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
pub(crate) fn crc_skip(register: u32, columns: &[u32; 32]) -> u32 {
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
pub(crate) unsafe fn crc_register_sse42(register: u32, bytes: &[u8]) -> u32 {
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
    use super::{crc32c, crc32c_table};

    #[test]
    fn the_fast_path_matches_the_table() {
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
            assert_eq!(crc32c(&bytes), crc32c_table(&bytes), "{len} bytes");
        }
        // Unaligned starts, too.
        let bytes: Vec<u8> = (0..10_000u32).map(|i| (i * 131 % 251) as u8).collect();
        for skip in 1..9 {
            assert_eq!(
                crc32c(&bytes[skip..]),
                crc32c_table(&bytes[skip..]),
                "from {skip}"
            );
        }
    }

    // Published check values: the CRC catalogue's "123456789" check, and RFC 3720 (iSCSI) appendix B.4.
    #[test]
    fn check_string() {
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
        assert_eq!(crc32c(b""), 0);
    }

    #[test]
    fn rfc3720_vectors() {
        assert_eq!(crc32c(&[0u8; 32]), 0x8A91_36AA);
        assert_eq!(crc32c(&[0xffu8; 32]), 0x62A8_AB43);
        let ascending: Vec<u8> = (0u8..32).collect();
        assert_eq!(crc32c(&ascending), 0x46DD_794E);
        let descending: Vec<u8> = (0u8..32).rev().collect();
        assert_eq!(crc32c(&descending), 0x113F_DB5C);
    }

    #[test]
    fn detects_every_single_bit_flip() {
        let mut block: Vec<u8> = (0..4092u32).map(|i| (i * 31 % 251) as u8).collect();
        let good = crc32c(&block);
        for bit in (0..block.len() * 8).step_by(97) {
            block[bit / 8] ^= 1 << (bit % 8);
            assert_ne!(crc32c(&block), good, "bit {bit}");
            block[bit / 8] ^= 1 << (bit % 8);
        }
    }
}
