//! GFNI on 64-byte vectors (with AVX-512BW for masked tails): multiplication by any constant is one
//! GF2P8AFFINEQB with the constant's 8x8 bit matrix (see [`gf::affine_matrix`]), {02} included.

use core::arch::x86_64::*;

use super::avx512::tail_mask;
use super::kernels::{kernel_entry_points, Simd};
use crate::gf;

/// Marker for GFNI + AVX-512F + AVX-512BW.
pub(crate) struct Avx512Gfni;

/// The bit matrix of multiplication by {02}, for Horner's rule in Q.
const MUL2_MATRIX: u64 = 0x80_01_82_84_88_10_20_40;

impl Simd for Avx512Gfni {
    type V = __m512i;
    /// The constant's bit matrix, broadcast to every 64-bit lane.
    type MulConst = __m512i;
    const BYTES: usize = 64;

    #[inline(always)]
    unsafe fn zero() -> __m512i {
        _mm512_setzero_si512()
    }

    #[inline(always)]
    unsafe fn load(ptr: *const u8) -> __m512i {
        _mm512_loadu_si512(ptr as *const __m512i)
    }

    #[inline(always)]
    unsafe fn store(ptr: *mut u8, v: __m512i) {
        _mm512_storeu_si512(ptr as *mut __m512i, v)
    }

    #[inline(always)]
    unsafe fn load_partial(ptr: *const u8, bytes: usize) -> __m512i {
        _mm512_maskz_loadu_epi8(tail_mask(bytes), ptr as *const i8)
    }

    #[inline(always)]
    unsafe fn store_partial(ptr: *mut u8, bytes: usize, v: __m512i) {
        _mm512_mask_storeu_epi8(ptr as *mut i8, tail_mask(bytes), v)
    }

    #[inline(always)]
    unsafe fn xor(a: __m512i, b: __m512i) -> __m512i {
        _mm512_xor_si512(a, b)
    }

    #[inline(always)]
    unsafe fn or(a: __m512i, b: __m512i) -> __m512i {
        _mm512_or_si512(a, b)
    }

    #[inline(always)]
    unsafe fn is_zero(v: __m512i) -> bool {
        _mm512_test_epi64_mask(v, v) == 0
    }

    #[inline(always)]
    unsafe fn mul2(v: __m512i) -> __m512i {
        _mm512_gf2p8affine_epi64_epi8::<0>(v, _mm512_set1_epi64(MUL2_MATRIX as i64))
    }

    #[inline(always)]
    unsafe fn mul_const(c: u8) -> __m512i {
        _mm512_set1_epi64(gf::affine_matrix(c) as i64)
    }

    #[inline(always)]
    unsafe fn mul(m: __m512i, v: __m512i) -> __m512i {
        _mm512_gf2p8affine_epi64_epi8::<0>(v, m)
    }
}

kernel_entry_points!(Avx512Gfni, Avx512Gfni, "avx512f,avx512bw,gfni", 4);

impl super::Isa for Avx512Gfni {
    const NAME: &'static str = "avx512-gfni";

    fn detected() -> bool {
        std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("gfni")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mul2_matrix_is_the_matrix_of_two() {
        assert_eq!(MUL2_MATRIX, gf::affine_matrix(2));
    }
}
