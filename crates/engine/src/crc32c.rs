//! CRC-32C (Castagnoli): reflected polynomial 0x82F63B78, initial value !0, final XOR !0 (the iSCSI / ext4 /
//! Btrfs checksum). Byte-at-a-time table; it only ever covers one 4 KiB superblock.

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
    let mut crc = !0u32;
    for &b in bytes {
        crc = TABLE[((crc ^ b as u32) & 0xff) as usize] ^ (crc >> 8);
    }
    !crc
}

#[cfg(test)]
mod tests {
    use super::crc32c;

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
