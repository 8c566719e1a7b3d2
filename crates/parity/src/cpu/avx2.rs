//! AVX2: 32-byte vectors; multiplication by a constant through split-nibble PSHUFB tables.

use core::arch::x86_64::*;

use super::kernels::{kernel_entry_points, Simd};
use crate::gf;

/// Marker for the AVX2 instruction set.
pub(crate) struct Avx2;

/// The low- and high-nibble product tables, repeated in both 128-bit lanes (PSHUFB looks up
/// within a lane).
#[derive(Clone, Copy)]
pub(crate) struct NibbleTables {
    low: __m256i,
    high: __m256i,
}

impl Simd for Avx2 {
    type V = __m256i;
    type MulConst = NibbleTables;
    const BYTES: usize = 32;

    #[inline(always)]
    unsafe fn zero() -> __m256i {
        _mm256_setzero_si256()
    }

    #[inline(always)]
    unsafe fn load(ptr: *const u8) -> __m256i {
        _mm256_loadu_si256(ptr as *const __m256i)
    }

    #[inline(always)]
    unsafe fn store(ptr: *mut u8, v: __m256i) {
        _mm256_storeu_si256(ptr as *mut __m256i, v)
    }

    #[inline(always)]
    unsafe fn load_partial(ptr: *const u8, bytes: usize) -> __m256i {
        // AVX2 has no byte-granular masked load: bounce through the stack so nothing past `bytes`
        // is read. Only the last vector of a chunk takes this path.
        debug_assert!(bytes < 32);
        let mut bounce = [0u8; 32];
        core::ptr::copy_nonoverlapping(ptr, bounce.as_mut_ptr(), bytes);
        _mm256_loadu_si256(bounce.as_ptr() as *const __m256i)
    }

    #[inline(always)]
    unsafe fn store_partial(ptr: *mut u8, bytes: usize, v: __m256i) {
        debug_assert!(bytes < 32);
        let mut bounce = [0u8; 32];
        _mm256_storeu_si256(bounce.as_mut_ptr() as *mut __m256i, v);
        core::ptr::copy_nonoverlapping(bounce.as_ptr(), ptr, bytes);
    }

    #[inline(always)]
    unsafe fn xor(a: __m256i, b: __m256i) -> __m256i {
        _mm256_xor_si256(a, b)
    }

    #[inline(always)]
    unsafe fn or(a: __m256i, b: __m256i) -> __m256i {
        _mm256_or_si256(a, b)
    }

    #[inline(always)]
    unsafe fn is_zero(v: __m256i) -> bool {
        _mm256_testz_si256(v, v) != 0
    }

    #[inline(always)]
    unsafe fn mul2(v: __m256i) -> __m256i {
        // Shift left by one; where the top bit fell off, reduce by the low byte of 0x11d.
        let overflow = _mm256_cmpgt_epi8(_mm256_setzero_si256(), v);
        let doubled = _mm256_add_epi8(v, v);
        _mm256_xor_si256(doubled, _mm256_and_si256(overflow, _mm256_set1_epi8(0x1d)))
    }

    #[inline(always)]
    unsafe fn mul_const(c: u8) -> NibbleTables {
        let (low, high) = gf::nibble_tables(c);
        NibbleTables {
            low: _mm256_broadcastsi128_si256(_mm_loadu_si128(low.as_ptr() as *const __m128i)),
            high: _mm256_broadcastsi128_si256(_mm_loadu_si128(high.as_ptr() as *const __m128i)),
        }
    }

    #[inline(always)]
    unsafe fn mul(m: NibbleTables, v: __m256i) -> __m256i {
        let nibble = _mm256_set1_epi8(0x0f);
        let low = _mm256_and_si256(v, nibble);
        let high = _mm256_and_si256(_mm256_srli_epi16(v, 4), nibble);
        _mm256_xor_si256(
            _mm256_shuffle_epi8(m.low, low),
            _mm256_shuffle_epi8(m.high, high),
        )
    }
}

kernel_entry_points!(Avx2, Avx2, "avx2", 4);

impl super::Isa for Avx2 {
    const NAME: &'static str = "avx2";

    fn detected() -> bool {
        std::arch::is_x86_feature_detected!("avx2")
    }
}
