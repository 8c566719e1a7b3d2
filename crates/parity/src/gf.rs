//! GF(2^8) with the polynomial x^8 + x^4 + x^3 + x^2 + 1 (0x11d) and generator {02}: the field of
//! Linux md's RAID6 and of ISA-L's `pq_gen`.
//!
//! Every table is built at compile time, so the first call pays nothing and no code path can see a
//! half-built table.

/// The reduction polynomial, with its x^8 bit.
pub const POLY: u16 = 0x11d;

/// Number of non-zero field elements: the order of the multiplicative group.
pub const ORDER: usize = 255;

const fn mul_by_2(a: u8) -> u8 {
    let wide = (a as u16) << 1;
    if wide & 0x100 != 0 {
        (wide ^ POLY) as u8
    } else {
        wide as u8
    }
}

/// EXP[i] = 2^i, repeated once more so that EXP[log a + log b] needs no reduction mod 255.
const EXP: [u8; 2 * ORDER] = {
    let mut table = [0u8; 2 * ORDER];
    let mut x: u8 = 1;
    let mut i = 0;
    while i < ORDER {
        table[i] = x;
        table[i + ORDER] = x;
        x = mul_by_2(x);
        i += 1;
    }
    table
};

/// LOG[a] = i with 2^i = a, for a != 0. LOG[0] is never read.
const LOG: [u8; 256] = {
    let mut table = [0u8; 256];
    let mut i = 0;
    while i < ORDER {
        table[EXP[i] as usize] = i as u8;
        i += 1;
    }
    table
};

const fn mul_slow(a: u8, b: u8) -> u8 {
    if a == 0 || b == 0 {
        0
    } else {
        EXP[LOG[a as usize] as usize + LOG[b as usize] as usize]
    }
}

/// MUL[a][b] = a * b: one load per byte in the scalar paths.
pub static MUL: [[u8; 256]; 256] = {
    let mut table = [[0u8; 256]; 256];
    let mut a = 0;
    while a < 256 {
        let mut b = 0;
        while b < 256 {
            table[a][b] = mul_slow(a as u8, b as u8);
            b += 1;
        }
        a += 1;
    }
    table
};

const INV: [u8; 256] = {
    let mut table = [0u8; 256];
    let mut a = 1;
    while a < 256 {
        table[a] = EXP[(ORDER - LOG[a] as usize) % ORDER];
        a += 1;
    }
    table
};

/// a * b in GF(2^8).
#[inline]
pub fn mul(a: u8, b: u8) -> u8 {
    MUL[a as usize][b as usize]
}

/// The multiplicative inverse of a. Panics on zero, which has none.
#[inline]
pub fn inv(a: u8) -> u8 {
    assert!(a != 0, "gf::inv(0): zero has no inverse");
    INV[a as usize]
}

/// a / b. Panics when b is zero.
#[inline]
pub fn div(a: u8, b: u8) -> u8 {
    mul(a, inv(b))
}

/// 2^i (i taken mod 255).
#[inline]
pub fn exp(i: usize) -> u8 {
    EXP[i % ORDER]
}

/// The discrete log base 2 of a, in 0..255. Panics on zero, which has none.
#[inline]
pub fn log(a: u8) -> usize {
    assert!(a != 0, "gf::log(0): zero has no logarithm");
    LOG[a as usize] as usize
}

/// 2^-i: the coefficient that undoes the Q weight of data chunk i.
#[inline]
pub fn exp_neg(i: usize) -> u8 {
    EXP[(ORDER - i % ORDER) % ORDER]
}

/// The split-nibble tables of multiplication by c: `low[n] = c * n`, `high[n] = c * (n << 4)`,
/// so c * x = low[x & 15] ^ high[x >> 4]. What PSHUFB-based SIMD backends look up.
pub fn nibble_tables(c: u8) -> ([u8; 16], [u8; 16]) {
    let mut low = [0u8; 16];
    let mut high = [0u8; 16];
    for n in 0..16u8 {
        low[n as usize] = mul(c, n);
        high[n as usize] = mul(c, n << 4);
    }
    (low, high)
}

/// The 8x8 bit matrix of multiplication by c, laid out for GF2P8AFFINEQB: bit i of the product of
/// byte x is parity(matrix.byte[7 - i] & x). Multiplication by a constant is linear over GF(2) in any
/// field polynomial, which is why GFNI's affine instruction works for 0x11d even though its own
/// GF2P8MULB is fixed to the AES polynomial 0x11b.
pub fn affine_matrix(c: u8) -> u64 {
    let mut matrix = 0u64;
    for out_bit in 0..8 {
        let mut row = 0u8;
        for in_bit in 0..8 {
            if mul(c, 1 << in_bit) & (1 << out_bit) != 0 {
                row |= 1 << in_bit;
            }
        }
        matrix |= (row as u64) << (8 * (7 - out_bit));
    }
    matrix
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Carry-less multiplication reduced by 0x11d: a definition independent of the tables.
    fn mul_bitwise(a: u8, b: u8) -> u8 {
        let mut product: u16 = 0;
        for bit in 0..8 {
            if b & (1 << bit) != 0 {
                product ^= (a as u16) << bit;
            }
        }
        for bit in (8..16).rev() {
            if product & (1 << bit) != 0 {
                product ^= POLY << (bit - 8);
            }
        }
        product as u8
    }

    #[test]
    fn mul_table_matches_bitwise_definition() {
        for a in 0..=255u8 {
            for b in 0..=255u8 {
                assert_eq!(mul(a, b), mul_bitwise(a, b), "{a} * {b}");
            }
        }
    }

    #[test]
    fn generator_two_has_order_255() {
        let mut seen = [false; 256];
        for i in 0..ORDER {
            let x = exp(i);
            assert!(
                !seen[x as usize],
                "2^{i} = {x} repeats: 2 is not a generator"
            );
            seen[x as usize] = true;
            assert_eq!(log(x), i);
        }
        assert!(!seen[0]);
        assert_eq!(exp(255), 1);
        assert_eq!(exp(8), 0x1d, "2^8 reduces by the 0x11d polynomial");
    }

    #[test]
    fn inverse_and_division() {
        for a in 1..=255u8 {
            assert_eq!(mul(a, inv(a)), 1, "a = {a}");
            for b in 1..=255u8 {
                assert_eq!(mul(div(a, b), b), a);
            }
        }
        for i in 0..600 {
            assert_eq!(mul(exp(i), exp_neg(i)), 1, "i = {i}");
        }
    }

    #[test]
    fn nibble_tables_multiply() {
        for c in 0..=255u8 {
            let (low, high) = nibble_tables(c);
            for x in 0..=255u8 {
                assert_eq!(low[(x & 15) as usize] ^ high[(x >> 4) as usize], mul(c, x));
            }
        }
    }

    /// A scalar model of GF2P8AFFINEQB with imm8 = 0, written from Intel's pseudo-code.
    fn affine_byte(matrix: u64, x: u8) -> u8 {
        let mut out = 0u8;
        for i in 0..8 {
            let row = (matrix >> (8 * (7 - i))) as u8;
            if (row & x).count_ones() % 2 == 1 {
                out |= 1 << i;
            }
        }
        out
    }

    #[test]
    fn affine_matrix_multiplies() {
        for c in 0..=255u8 {
            let matrix = affine_matrix(c);
            for x in 0..=255u8 {
                assert_eq!(affine_byte(matrix, x), mul(c, x), "c = {c}, x = {x}");
            }
        }
    }
}
