//! Page-aligned buffers (O_DIRECT needs them) and a per-thread scratch area reused across requests, so the
//! data path allocates nothing once a thread has warmed up.

use std::alloc::{self, Layout};
use std::cell::RefCell;
use std::ops::{Deref, DerefMut};

use crate::layout::PAGE_BYTES;

/// A zero-initialised heap buffer whose address is a multiple of `PAGE_BYTES`.
pub struct AlignedBuf {
    ptr: std::ptr::NonNull<u8>,
    len: usize,
}

// The buffer owns its memory exclusively, like a Box<[u8]>.
unsafe impl Send for AlignedBuf {}
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// `len` is rounded up to a whole number of pages (at least one).
    pub fn zeroed(len: usize) -> AlignedBuf {
        let len = round_up(len.max(1) as u64, PAGE_BYTES) as usize;
        if let Some(ptr) = pool_take(len) {
            // SAFETY: a pooled buffer of exactly `len` bytes, owned by nobody else.
            unsafe { std::ptr::write_bytes(ptr.as_ptr(), 0, len) };
            return AlignedBuf { ptr, len };
        }
        let layout =
            Layout::from_size_align(len, PAGE_BYTES as usize).expect("page-aligned layout");
        // SAFETY: the layout has a non-zero size.
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let ptr = std::ptr::NonNull::new(raw).unwrap_or_else(|| alloc::handle_alloc_error(layout));
        AlignedBuf { ptr, len }
    }

    /// Like `zeroed`, for a caller that overwrites every byte it uses: a recycled buffer keeps what it held (bytes
    /// this process wrote before), which saves clearing it. A fresh allocation is zeroed as always.
    pub fn for_overwrite(len: usize) -> AlignedBuf {
        let len = round_up(len.max(1) as u64, PAGE_BYTES) as usize;
        match pool_take(len) {
            // A pooled buffer is initialised memory (zeroed when first allocated, written since).
            Some(ptr) => AlignedBuf { ptr, len },
            None => AlignedBuf::zeroed(len),
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        if pool_give(self.ptr, self.len) {
            return;
        }
        let layout =
            Layout::from_size_align(self.len, PAGE_BYTES as usize).expect("page-aligned layout");
        // SAFETY: allocated in `zeroed` with this very layout.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), layout) }
    }
}

impl Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: ptr is valid for len initialised bytes for the buffer's lifetime.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, and &mut self gives exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

/// Page-aligned memory for batches of whole stripes (a rebuild's): where the parity backend has memory it
/// serves in place (a GPU's registered host memory: its batches then skip the staging copy and leave the CPU
/// free), that, else ordinary memory. Both read and write alike; only where the parity work runs differs.
pub enum BatchBuf {
    Backend(paraid_parity::HostBuf),
    Plain(AlignedBuf),
}

impl BatchBuf {
    pub fn for_backend(parity: &dyn paraid_parity::Backend, len: usize) -> BatchBuf {
        match parity.alloc_host(len) {
            Some(buf) => BatchBuf::Backend(buf),
            None => BatchBuf::Plain(AlignedBuf::zeroed(len)),
        }
    }

    /// Whether the memory came from the parity backend.
    pub fn is_backend_memory(&self) -> bool {
        matches!(self, BatchBuf::Backend(_))
    }
}

impl Deref for BatchBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            BatchBuf::Backend(buf) => buf,
            BatchBuf::Plain(buf) => buf,
        }
    }
}

impl DerefMut for BatchBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        match self {
            BatchBuf::Backend(buf) => buf,
            BatchBuf::Plain(buf) => buf,
        }
    }
}

/// Small buffers are kept per thread when dropped and handed out again: the data path (log records, partial
/// parity) takes a few per write, and a page-aligned allocation costs more than zeroing a recycled one.
const POOL_MAX_PAGES: usize = 16;
/// Buffers kept per size and thread.
const POOL_PER_SIZE: usize = 8;

/// Freed small buffers by size in pages (index 0 unused); dropping the pool (thread exit) frees them.
struct Pool(Vec<Vec<std::ptr::NonNull<u8>>>);

impl Drop for Pool {
    fn drop(&mut self) {
        for (pages, bufs) in self.0.iter().enumerate() {
            for ptr in bufs {
                let layout =
                    Layout::from_size_align(pages * PAGE_BYTES as usize, PAGE_BYTES as usize)
                        .expect("page-aligned layout");
                // SAFETY: allocated by `AlignedBuf::zeroed` with this layout and owned by the pool alone.
                unsafe { alloc::dealloc(ptr.as_ptr(), layout) }
            }
        }
    }
}

thread_local! {
    static POOL: RefCell<Pool> = RefCell::new(Pool(vec![Vec::new(); POOL_MAX_PAGES + 1]));
}

fn pool_take(len: usize) -> Option<std::ptr::NonNull<u8>> {
    let pages = len / PAGE_BYTES as usize;
    if pages > POOL_MAX_PAGES {
        return None;
    }
    POOL.try_with(|pool| pool.borrow_mut().0[pages].pop())
        .ok()
        .flatten()
}

/// Keeps a dropped buffer for reuse; false: not kept (too big, pool full, thread exiting), free it.
fn pool_give(ptr: std::ptr::NonNull<u8>, len: usize) -> bool {
    let pages = len / PAGE_BYTES as usize;
    if pages > POOL_MAX_PAGES {
        return false;
    }
    POOL.try_with(|pool| {
        let Ok(mut pool) = pool.try_borrow_mut() else {
            return false;
        };
        let kept = &mut pool.0[pages];
        if kept.len() >= POOL_PER_SIZE {
            return false;
        }
        kept.push(ptr);
        true
    })
    .unwrap_or(false)
}

pub fn round_up(value: u64, align: u64) -> u64 {
    debug_assert!(align.is_power_of_two());
    (value + align - 1) & !(align - 1)
}

pub fn round_down(value: u64, align: u64) -> u64 {
    debug_assert!(align.is_power_of_two());
    value & !(align - 1)
}

/// Scratch larger than this is given back after the request instead of kept for the thread.
const KEEP_SCRATCH_BYTES: usize = 64 << 20;

thread_local! {
    static SCRATCH: RefCell<Option<AlignedBuf>> = const { RefCell::new(None) };
}

/// Runs `f` with this thread's page-aligned scratch area of at least `bytes` bytes (contents unspecified).
/// Not re-entrant: `f` must not call `with_scratch` again.
pub fn with_scratch<R>(bytes: usize, f: impl FnOnce(&mut [u8]) -> R) -> R {
    SCRATCH.with(|cell| with_kept(cell, bytes, || AlignedBuf::zeroed(bytes), f))
}

/// Both scratch areas: `cell`'s buffer, replaced by `make()` when smaller than `bytes` (the old one freed first:
/// no moment with both alive), and given back after `f` when larger than KEEP_SCRATCH_BYTES.
fn with_kept<B: DerefMut<Target = [u8]>, R>(
    cell: &RefCell<Option<B>>,
    bytes: usize,
    make: impl FnOnce() -> B,
    f: impl FnOnce(&mut [u8]) -> R,
) -> R {
    let mut slot = cell.borrow_mut();
    if slot.as_ref().is_none_or(|buf| buf.len() < bytes) {
        *slot = None;
        *slot = Some(make());
    }
    let buf = slot.as_mut().expect("scratch just ensured");
    let result = f(&mut buf[..round_up(bytes as u64, PAGE_BYTES) as usize]);
    if buf.len() > KEEP_SCRATCH_BYTES {
        *slot = None;
    }
    result
}

thread_local! {
    static BATCH_SCRATCH: RefCell<Option<BatchBuf>> = const { RefCell::new(None) };
}

/// Like `with_scratch`, for batches of whole stripes (a check's, a resync's): the area comes from `parity`'s own
/// memory where it has some (`BatchBuf`), so that a GPU serves the batch in place. Kept per thread while big
/// enough (these run on a job's own thread); whatever memory a kept area is, every backend computes the same on
/// it. Not re-entrant.
pub fn with_batch_scratch<R>(
    parity: &dyn paraid_parity::Backend,
    bytes: usize,
    f: impl FnOnce(&mut [u8]) -> R,
) -> R {
    BATCH_SCRATCH.with(|cell| with_kept(cell, bytes, || BatchBuf::for_backend(parity, bytes), f))
}

/// Hands out consecutive page-aligned pieces of one buffer.
pub struct Carver<'a> {
    rest: &'a mut [u8],
}

impl<'a> Carver<'a> {
    pub fn new(buf: &'a mut [u8]) -> Carver<'a> {
        debug_assert_eq!(buf.as_ptr() as u64 % PAGE_BYTES, 0);
        Carver { rest: buf }
    }

    /// The next `len` bytes; `len` must be a multiple of `PAGE_BYTES` so the following piece stays aligned.
    pub fn take(&mut self, len: usize) -> &'a mut [u8] {
        assert_eq!(
            len as u64 % PAGE_BYTES,
            0,
            "carved piece of {len} bytes is not page-aligned"
        );
        let rest = std::mem::take(&mut self.rest);
        let (piece, rest) = rest.split_at_mut(len);
        self.rest = rest;
        piece
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_and_zeroed() {
        for len in [1usize, 4096, 5000, 1 << 20] {
            let buf = AlignedBuf::zeroed(len);
            assert_eq!(buf.as_ptr() as u64 % PAGE_BYTES, 0);
            assert!(buf.len() >= len && (buf.len() as u64).is_multiple_of(PAGE_BYTES));
            assert!(buf.iter().all(|b| *b == 0));
        }
    }

    #[test]
    fn a_recycled_buffer_comes_back_zeroed() {
        let mut first = AlignedBuf::zeroed(8192);
        first.fill(0xa5);
        let at = first.as_ptr() as usize;
        drop(first);
        let again = AlignedBuf::zeroed(8192);
        assert_eq!(again.as_ptr() as usize, at, "the dropped buffer is reused");
        assert!(again.iter().all(|b| *b == 0));
        // Another size does not take it; a buffer beyond the pooled sizes is not kept.
        let other = AlignedBuf::zeroed(4096);
        assert_ne!(other.as_ptr() as usize, at);
        let big = AlignedBuf::zeroed((POOL_MAX_PAGES + 1) * PAGE_BYTES as usize);
        assert!(big.iter().all(|b| *b == 0));
    }

    #[test]
    fn scratch_is_reused_and_carves_aligned_pieces() {
        let first = with_scratch(3 * 4096, |buf| {
            let mut carver = Carver::new(buf);
            let a = carver.take(4096);
            let b = carver.take(8192);
            assert_eq!(b.as_ptr() as usize - a.as_ptr() as usize, 4096);
            assert_eq!(b.as_ptr() as u64 % PAGE_BYTES, 0);
            a.as_ptr() as usize
        });
        let second = with_scratch(4096, |buf| buf.as_ptr() as usize);
        assert_eq!(
            first, second,
            "scratch reallocated although it was big enough"
        );
    }
}
