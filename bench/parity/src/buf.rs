//! 64-byte aligned heap buffers: what ISA-L's SIMD paths require, and what a caller of paraid would
//! normally hand over.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::ptr::NonNull;

pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
}

const ALIGN: usize = 64;

impl AlignedBuf {
    pub fn zeroed(len: usize) -> Self {
        let layout = Layout::from_size_align(len.max(1), ALIGN).expect("buffer layout");
        // SAFETY: non-zero size.
        let ptr = NonNull::new(unsafe { alloc_zeroed(layout) })
            .unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        AlignedBuf { ptr, len }
    }

    /// Pseudo-random bytes from a SplitMix64 state.
    pub fn random(len: usize, seed: &mut u64) -> Self {
        let mut buf = AlignedBuf::zeroed(len);
        fill_random(buf.as_mut_slice(), seed);
        buf
    }

    pub fn copy_of(src: &[u8]) -> Self {
        let mut buf = AlignedBuf::zeroed(src.len());
        buf.as_mut_slice().copy_from_slice(src);
        buf
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: len bytes allocated in zeroed().
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above; &mut self is unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    pub fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }

    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr.as_ptr()
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        let layout = Layout::from_size_align(self.len.max(1), ALIGN).expect("buffer layout");
        // SAFETY: allocated with this layout in zeroed().
        unsafe { dealloc(self.ptr.as_ptr(), layout) }
    }
}

/// Fills `bytes` with pseudo-random bytes from a SplitMix64 state.
pub fn fill_random(bytes: &mut [u8], seed: &mut u64) {
    for chunk in bytes.chunks_mut(8) {
        *seed = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = *seed;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        chunk.copy_from_slice(&z.to_le_bytes()[..chunk.len()]);
    }
}
