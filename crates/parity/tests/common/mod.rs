//! Test helpers: a seeded PRNG and buffers placed where SIMD code is most likely to go wrong
//! (misaligned starts, ends flush against an unmapped guard page).

#![allow(dead_code)]

use std::ptr::NonNull;

/// SplitMix64: small, seedable, good enough to spread test data.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in 0..n (n > 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    pub fn fill(&mut self, buf: &mut [u8]) {
        for chunk in buf.chunks_mut(8) {
            let word = self.next_u64().to_le_bytes();
            chunk.copy_from_slice(&word[..chunk.len()]);
        }
    }

    pub fn nonzero_byte(&mut self) -> u8 {
        1 + (self.next_u64() % 255) as u8
    }
}

/// Where a test buffer sits in memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// Starts `offset` bytes past a 64-byte boundary.
    Offset(usize),
    /// Ends exactly at the end of its mapping, followed by a PROT_NONE page: any read or write past
    /// the end faults.
    GuardPage,
}

pub const PLACEMENTS: [Placement; 4] = [
    Placement::Offset(0),
    Placement::Offset(1),
    Placement::Offset(37),
    Placement::GuardPage,
];

pub struct TestBuf {
    ptr: NonNull<u8>,
    len: usize,
    map: Option<(*mut libc::c_void, usize)>,
    _vec: Vec<u8>,
}

// The buffer is owned memory like a Vec.
unsafe impl Send for TestBuf {}
unsafe impl Sync for TestBuf {}

const PAGE_BYTES: usize = 4096;

impl TestBuf {
    pub fn new(len: usize, placement: Placement) -> Self {
        match placement {
            Placement::Offset(offset) => {
                let mut vec = vec![0u8; len + offset + 64];
                let base = vec.as_mut_ptr() as usize;
                let start = base.div_ceil(64) * 64 + offset - base;
                let ptr =
                    NonNull::new(unsafe { vec.as_mut_ptr().add(start) }).expect("vec pointer");
                TestBuf {
                    ptr,
                    len,
                    map: None,
                    _vec: vec,
                }
            }
            Placement::GuardPage => {
                let data_pages = len.div_ceil(PAGE_BYTES).max(1);
                let map_bytes = (data_pages + 1) * PAGE_BYTES;
                // SAFETY: a fresh anonymous mapping, unmapped in Drop.
                unsafe {
                    let base = libc::mmap(
                        std::ptr::null_mut(),
                        map_bytes,
                        libc::PROT_READ | libc::PROT_WRITE,
                        libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                        -1,
                        0,
                    );
                    assert_ne!(base, libc::MAP_FAILED, "mmap for a guard-page buffer");
                    let guard = (base as *mut u8).add(data_pages * PAGE_BYTES);
                    assert_eq!(
                        libc::mprotect(guard as *mut libc::c_void, PAGE_BYTES, libc::PROT_NONE),
                        0,
                        "mprotect guard page"
                    );
                    let ptr = NonNull::new(guard.sub(len)).expect("mapping pointer");
                    TestBuf {
                        ptr,
                        len,
                        map: Some((base, map_bytes)),
                        _vec: Vec::new(),
                    }
                }
            }
        }
    }

    pub fn random(len: usize, placement: Placement, rng: &mut Rng) -> Self {
        let mut buf = TestBuf::new(len, placement);
        rng.fill(buf.as_mut_slice());
        buf
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr..ptr+len lies inside the owned Vec or mapping.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and &mut self makes it unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for TestBuf {
    fn drop(&mut self) {
        if let Some((base, map_bytes)) = self.map {
            // SAFETY: the mapping made in new().
            unsafe {
                libc::munmap(base, map_bytes);
            }
        }
    }
}

/// A stripe of k data chunks plus P (and Q), each its own buffer.
pub struct TestStripe {
    pub k: usize,
    pub has_q: bool,
    pub chunks: Vec<TestBuf>,
}

impl TestStripe {
    /// Random data; parity left zero.
    pub fn random(k: usize, has_q: bool, len: usize, placement: Placement, rng: &mut Rng) -> Self {
        let parity = if has_q { 2 } else { 1 };
        let chunks = (0..k + parity)
            .map(|i| {
                if i < k {
                    TestBuf::random(len, placement, rng)
                } else {
                    TestBuf::new(len, placement)
                }
            })
            .collect();
        TestStripe { k, has_q, chunks }
    }

    pub fn data(&self) -> Vec<&[u8]> {
        self.chunks[..self.k].iter().map(|c| c.as_slice()).collect()
    }

    pub fn all(&self) -> Vec<&[u8]> {
        self.chunks.iter().map(|c| c.as_slice()).collect()
    }

    pub fn all_mut(&mut self) -> Vec<&mut [u8]> {
        self.chunks.iter_mut().map(|c| c.as_mut_slice()).collect()
    }

    pub fn to_vecs(&self) -> Vec<Vec<u8>> {
        self.chunks.iter().map(|c| c.as_slice().to_vec()).collect()
    }

    /// Fills P (and Q) with `backend`.
    pub fn gen(&mut self, backend: &dyn paraid_parity::Backend) {
        let k = self.k;
        let (data, parity) = self.chunks.split_at_mut(k);
        let data: Vec<&[u8]> = data.iter().map(|c| c.as_slice()).collect();
        match parity {
            [p] => backend.gen_p(&data, p.as_mut_slice()),
            [p, q] => backend.gen_pq(&data, p.as_mut_slice(), q.as_mut_slice()),
            _ => unreachable!(),
        }
    }
}
