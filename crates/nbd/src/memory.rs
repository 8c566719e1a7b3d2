//! An export held in memory: the reference export for tests, examples and demos.

use std::io;
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::export::{Export, Extent};

/// `size_bytes` of RAM behind a reader-writer lock. Nothing is cached, so a flush on any connection trivially
/// covers every connection's writes: it is multi-connection safe.
pub struct MemoryExport {
    bytes: RwLock<Vec<u8>>,
    read_only: bool,
}

impl MemoryExport {
    pub fn new(size_bytes: usize) -> Self {
        MemoryExport {
            bytes: RwLock::new(vec![0; size_bytes]),
            read_only: false,
        }
    }

    /// An export whose initial contents are `bytes`.
    pub fn with_contents(bytes: Vec<u8>, read_only: bool) -> Self {
        MemoryExport {
            bytes: RwLock::new(bytes),
            read_only,
        }
    }

    /// A copy of the whole contents (for tests comparing what a client wrote).
    pub fn contents(&self) -> Vec<u8> {
        self.read_guard().clone()
    }

    // A panic in another thread while it held the lock leaves plain bytes, still usable: ignore poisoning.
    fn read_guard(&self) -> RwLockReadGuard<'_, Vec<u8>> {
        self.bytes
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn write_guard(&self) -> RwLockWriteGuard<'_, Vec<u8>> {
        self.bytes
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// `offset..offset+len` as a slice range, or EINVAL when it leaves `0..size`: the server validates ranges, but an
/// export must not trust its caller with memory safety.
fn range(
    offset_bytes: u64,
    len_bytes: u64,
    size_bytes: usize,
) -> io::Result<std::ops::Range<usize>> {
    let start = usize::try_from(offset_bytes).ok();
    let end = offset_bytes
        .checked_add(len_bytes)
        .and_then(|end| usize::try_from(end).ok());
    match (start, end) {
        (Some(start), Some(end)) if end <= size_bytes => Ok(start..end),
        _ => Err(io::Error::from_raw_os_error(libc::EINVAL)),
    }
}

impl Export for MemoryExport {
    fn size_bytes(&self) -> u64 {
        self.read_guard().len() as u64
    }

    fn read(&self, offset_bytes: u64, buf: &mut [u8]) -> io::Result<()> {
        let bytes = self.read_guard();
        let range = range(offset_bytes, buf.len() as u64, bytes.len())?;
        buf.copy_from_slice(&bytes[range]);
        Ok(())
    }

    fn write(&self, offset_bytes: u64, buf: &[u8], _fua: bool) -> io::Result<()> {
        if self.read_only {
            return Err(io::Error::from_raw_os_error(libc::EROFS));
        }
        let mut bytes = self.write_guard();
        let size_bytes = bytes.len();
        bytes[range(offset_bytes, buf.len() as u64, size_bytes)?].copy_from_slice(buf);
        Ok(())
    }

    fn flush(&self) -> io::Result<()> {
        Ok(())
    }

    /// Trimmed bytes read back as zero, the simplest "unspecified" contents.
    fn trim(&self, offset_bytes: u64, len_bytes: u64) -> io::Result<()> {
        self.write_zeroes(offset_bytes, len_bytes, false)
    }

    fn reports_allocation(&self) -> bool {
        true
    }

    /// Memory holds no holes; runs of whole zero 4 KiB blocks are reported as reading as zeros (NBD_STATE_ZERO),
    /// the rest, and any partial block, as data.
    fn allocation(&self, offset_bytes: u64, len_bytes: u64) -> io::Result<Vec<Extent>> {
        const BLOCK_BYTES: u64 = 4096;
        let bytes = self.read_guard();
        let range = range(offset_bytes, len_bytes, bytes.len())?;
        let mut extents: Vec<Extent> = Vec::new();
        let mut at = range.start as u64;
        while at < range.end as u64 {
            let block_end = ((at / BLOCK_BYTES + 1) * BLOCK_BYTES).min(range.end as u64);
            let whole_block = at.is_multiple_of(BLOCK_BYTES) && block_end - at == BLOCK_BYTES;
            let zero = whole_block
                && bytes[at as usize..block_end as usize]
                    .iter()
                    .all(|b| *b == 0);
            match extents.last_mut() {
                Some(last) if last.zero == zero => last.len_bytes += block_end - at,
                _ => extents.push(Extent {
                    len_bytes: block_end - at,
                    hole: false,
                    zero,
                }),
            }
            at = block_end;
        }
        Ok(extents)
    }

    fn write_zeroes(&self, offset_bytes: u64, len_bytes: u64, _fua: bool) -> io::Result<()> {
        if self.read_only {
            return Err(io::Error::from_raw_os_error(libc::EROFS));
        }
        let mut bytes = self.write_guard();
        let size_bytes = bytes.len();
        bytes[range(offset_bytes, len_bytes, size_bytes)?].fill(0);
        Ok(())
    }

    fn multi_conn_safe(&self) -> bool {
        true
    }

    fn read_only(&self) -> bool {
        self.read_only
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_read_back_and_zeroes_clear() {
        let export = MemoryExport::new(4096);
        export.write(100, &[7; 50], false).unwrap();
        let mut buf = [0u8; 60];
        export.read(95, &mut buf).unwrap();
        assert_eq!(&buf[..5], &[0; 5]);
        assert_eq!(&buf[5..55], &[7; 50]);
        assert_eq!(&buf[55..], &[0; 5]);
        export.write_zeroes(110, 10, false).unwrap();
        export.read(95, &mut buf).unwrap();
        assert_eq!(&buf[15..25], &[0; 10]);
        assert_eq!(&buf[25..55], &[7; 30]);
    }

    #[test]
    fn out_of_range_calls_fail_without_touching_memory() {
        let export = MemoryExport::new(4096);
        assert!(export.write(4000, &[1; 200], false).is_err());
        assert!(export.write(u64::MAX - 1, &[1; 4], false).is_err());
        assert!(export.write_zeroes(4096, 1, false).is_err());
        let mut buf = [0u8; 10];
        assert!(export.read(4090, &mut buf).is_err());
        assert_eq!(export.contents(), vec![0; 4096]);
    }

    #[test]
    fn read_only_refuses_writes() {
        let export = MemoryExport::with_contents(vec![5; 512], true);
        assert!(export.read_only());
        let error = export.write(0, &[1], false).unwrap_err();
        assert_eq!(error.raw_os_error(), Some(libc::EROFS));
        assert_eq!(export.contents(), vec![5; 512]);
    }
}
