//! Host memory a backend reads and writes where it lies.
//!
//! A CPU backend works on any memory. A GPU reaches host memory without a staging copy only where the memory
//! is page-locked and mapped into its address space; a caller that keeps its stripe buffers in such memory
//! (the engine's rebuild, say) gets batches the GPU serves in place: no CPU copy in or out, the CPU only
//! queues the work and sleeps until it is done. [`crate::Backend::alloc_host`] hands such buffers out.

use std::alloc::{self, Layout};
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

/// Page size the buffers are aligned to (O_DIRECT I/O into them needs it).
pub const HOST_ALIGN_BYTES: usize = 4096;

/// Undoes what a backend did to a buffer (unregisters it from a GPU) before its memory is freed; called with the
/// buffer's address and length.
pub type Release = Box<dyn FnOnce(*mut u8, usize) + Send + Sync>;

/// A zeroed, page-aligned buffer, possibly registered with a backend (see the module comment).
pub struct HostBuf {
    ptr: NonNull<u8>,
    len: usize,
    release: Option<Release>,
}

// The buffer owns its memory exclusively, like a Box<[u8]>; the release hook is Send + Sync.
unsafe impl Send for HostBuf {}
unsafe impl Sync for HostBuf {}

impl HostBuf {
    /// `len` rounded up to whole pages (at least one), zeroed, registered with nobody.
    pub fn zeroed(len: usize) -> HostBuf {
        let len = len.max(1).div_ceil(HOST_ALIGN_BYTES) * HOST_ALIGN_BYTES;
        let layout = Self::layout(len);
        // SAFETY: the layout has a non-zero size.
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).unwrap_or_else(|| alloc::handle_alloc_error(layout));
        HostBuf {
            ptr,
            len,
            release: None,
        }
    }

    /// Whether a backend registered the buffer (its release runs before the memory is freed).
    pub fn is_registered(&self) -> bool {
        self.release.is_some()
    }

    /// Sets what to undo before the memory is freed: a backend that lends a buffer (registers it with a device,
    /// or only keeps track of it) forgets it there.
    pub fn set_release(&mut self, release: Release) {
        debug_assert!(self.release.is_none(), "a buffer is registered once");
        self.release = Some(release);
    }

    fn layout(len: usize) -> Layout {
        Layout::from_size_align(len, HOST_ALIGN_BYTES).expect("page-aligned layout")
    }
}

impl Drop for HostBuf {
    fn drop(&mut self) {
        if let Some(release) = self.release.take() {
            release(self.ptr.as_ptr(), self.len);
        }
        // SAFETY: allocated in `zeroed` with this very layout; nobody else holds it.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), Self::layout(self.len)) }
    }
}

impl Deref for HostBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: ptr is valid for len initialised bytes for the buffer's lifetime.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl DerefMut for HostBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, and &mut self gives exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    #[test]
    fn zeroed_aligned_whole_pages() {
        for len in [0usize, 1, 4096, 5000] {
            let buf = HostBuf::zeroed(len);
            assert_eq!(buf.as_ptr() as usize % HOST_ALIGN_BYTES, 0);
            assert_eq!(buf.len(), len.max(1).div_ceil(4096) * 4096);
            assert!(buf.iter().all(|b| *b == 0));
            assert!(!buf.is_registered());
        }
    }

    #[test]
    fn release_runs_once_with_the_buffer_before_it_is_freed() {
        let seen = Arc::new(AtomicUsize::new(0));
        let mut buf = HostBuf::zeroed(8192);
        let at = buf.as_ptr() as usize;
        let seen_in = seen.clone();
        buf.set_release(Box::new(move |ptr, len| {
            assert_eq!((ptr as usize, len), (at, 8192));
            seen_in.fetch_add(1, Ordering::SeqCst);
        }));
        assert!(buf.is_registered());
        buf[8191] = 7;
        drop(buf);
        assert_eq!(seen.load(Ordering::SeqCst), 1);
    }
}
