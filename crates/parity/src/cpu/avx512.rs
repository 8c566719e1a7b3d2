//! AVX-512BW: 64-byte vectors, byte-masked loads and stores for the tail; multiplication by a
//! constant through split-nibble PSHUFB tables.

use core::arch::x86_64::*;

use super::kernels::{kernel_entry_points, Simd};
use crate::gf;

/// Marker for AVX-512F + AVX-512BW.
pub(crate) struct Avx512Bw;

/// The low- and high-nibble product tables, repeated in all four 128-bit lanes.
#[derive(Clone, Copy)]
pub(crate) struct NibbleTables {
    low: __m512i,
    high: __m512i,
}

/// The byte mask of the first `bytes` (< 64) lanes.
#[inline(always)]
pub(crate) fn tail_mask(bytes: usize) -> u64 {
    debug_assert!(bytes < 64);
    (1u64 << bytes) - 1
}

impl Simd for Avx512Bw {
    type V = __m512i;
    type MulConst = NibbleTables;
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
        // Masked-off lanes are not accessed, so a chunk may end right before an unmapped page.
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
        // Shift left by one; where the top bit fell off, reduce by the low byte of 0x11d.
        let overflow = _mm512_movepi8_mask(v);
        let doubled = _mm512_add_epi8(v, v);
        _mm512_xor_si512(
            doubled,
            _mm512_maskz_mov_epi8(overflow, _mm512_set1_epi8(0x1d)),
        )
    }

    #[inline(always)]
    unsafe fn mul_const(c: u8) -> NibbleTables {
        let (low, high) = gf::nibble_tables(c);
        NibbleTables {
            low: _mm512_broadcast_i32x4(_mm_loadu_si128(low.as_ptr() as *const __m128i)),
            high: _mm512_broadcast_i32x4(_mm_loadu_si128(high.as_ptr() as *const __m128i)),
        }
    }

    #[inline(always)]
    unsafe fn mul(m: NibbleTables, v: __m512i) -> __m512i {
        let nibble = _mm512_set1_epi8(0x0f);
        let low = _mm512_and_si512(v, nibble);
        let high = _mm512_and_si512(_mm512_srli_epi16(v, 4), nibble);
        _mm512_xor_si512(
            _mm512_shuffle_epi8(m.low, low),
            _mm512_shuffle_epi8(m.high, high),
        )
    }
}

kernel_entry_points!(Avx512Bw, Avx512Bw, "avx512f,avx512bw", 4);

impl super::Isa for Avx512Bw {
    const NAME: &'static str = "avx512bw";

    fn detected() -> bool {
        std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
    }
}
