//! What the server serves: anything byte-addressable behind the `Export` trait.

use std::io;
use std::ops::DerefMut;

use crate::proto::ErrorCode;

/// Memory an export lends a frontend for request payloads (`Export::payload_memory`).
pub type PayloadMemory = Box<dyn DerefMut<Target = [u8]> + Send>;

/// A block device (or anything shaped like one) the server exposes.
///
/// The server only ever calls these with ranges inside `0..size_bytes()` (validated before the call), from
/// several worker threads at once, so implementations must be internally synchronized.
pub trait Export: Send + Sync + 'static {
    fn size_bytes(&self) -> u64;
    /// Fill all of `buf` from `offset_bytes`.
    fn read(&self, offset_bytes: u64, buf: &mut [u8]) -> io::Result<()>;
    /// Optional: `read` of each `(offset_bytes, buf)` of `reads`, one result per read in order. An export whose
    /// reads can share their trip to storage (one submission for several member reads) serves them together;
    /// the server hands it the READs that arrived together. Default: one after another.
    fn read_many(&self, reads: &mut [(u64, &mut [u8])]) -> Vec<io::Result<()>> {
        reads
            .iter_mut()
            .map(|(offset_bytes, buf)| self.read(*offset_bytes, buf))
            .collect()
    }
    /// Write all of `buf` at `offset_bytes`; with `fua`, the data is durable before this returns.
    fn write(&self, offset_bytes: u64, buf: &[u8], fua: bool) -> io::Result<()>;
    /// Optional: `write`, calling `answered` (at most once) as soon as the write may be answered as done, which
    /// may be before this returns (a journal: once the data is durable in its log). After `answered` the writer
    /// has its reply, so an error returned later cannot reach it: the export must make it known otherwise (later
    /// requests failing). The default never answers early.
    fn write_answering(
        &self,
        offset_bytes: u64,
        buf: &[u8],
        fua: bool,
        answered: &dyn Fn(),
    ) -> io::Result<()> {
        let _ = answered;
        self.write(offset_bytes, buf, fua)
    }
    /// Whether `write_answering` is for writes whose client waits for the answer only: the connection has no
    /// other request unanswered and none has arrived behind it (a client at queue depth 1, which an early answer
    /// saves a wait). The server then sends every other write to `write`. Default: every write goes to
    /// `write_answering`.
    fn answers_early_only_when_waited_for(&self) -> bool {
        false
    }
    /// The server began reading a WRITE's payload off the client (`true`), or handed that WRITE on to be
    /// served or dropped it (`false`): one `false` after each `true`. A hint, for an export that waits for writes
    /// on their way (paraid's write gathering); default: ignored.
    fn write_arriving(&self, arriving: bool) {
        let _ = arriving;
    }
    /// A WRITE that starts at `offset_bytes`, where the WRITE the server is about to hand on ends, has already
    /// arrived behind it (its header is in the socket): the server serves it next unless the connection ends
    /// first. Told once per such WRITE, before the one it continues is handed on. A hint, for an export that
    /// waits for the rest of a stripe where it knows the rest is coming (paraid's write gathering); default:
    /// ignored.
    fn write_follows(&self, offset_bytes: u64) {
        let _ = offset_bytes;
    }
    /// Make every write that has returned so far durable.
    fn flush(&self) -> io::Result<()>;
    /// A hint that the range is no longer needed; its contents are unspecified afterwards.
    fn trim(&self, offset_bytes: u64, len_bytes: u64) -> io::Result<()>;
    /// Make the range read as zeroes. The range must stay provisioned (no hole that a later write could fail
    /// to fill), which is what NBD_CMD_FLAG_NO_HOLE asks for; so the server needs no separate call for it.
    fn write_zeroes(&self, offset_bytes: u64, len_bytes: u64, fua: bool) -> io::Result<()>;
    /// Safe to advertise NBD_FLAG_CAN_MULTI_CONN (a flush on any connection covers writes acknowledged on all).
    fn multi_conn_safe(&self) -> bool {
        false
    }
    fn read_only(&self) -> bool {
        false
    }
    /// Whether `allocation` answers: the server then offers the "base:allocation" metadata context, and clients
    /// that select it ask NBD_CMD_BLOCK_STATUS.
    fn reports_allocation(&self) -> bool {
        false
    }
    /// The allocation of `len_bytes` (> 0) from `offset_bytes`: extents in order from `offset_bytes`, each of at
    /// least one byte, together covering the range or a prefix of it (the client asks again for the rest), never
    /// beyond it. Called only when `reports_allocation` is true.
    fn allocation(&self, offset_bytes: u64, len_bytes: u64) -> io::Result<Vec<Extent>> {
        let _ = (offset_bytes, len_bytes);
        Err(io::Error::from(io::ErrorKind::Unsupported))
    }
    /// Optional: `len_bytes` of memory for request payloads (the NBD server's WRITE payloads, a ublk queue's
    /// request buffers), where the export has a better kind than the heap. A RAID array lends its parity backend's memory, which a GPU computes on where it lies:
    /// a client's data received there needs no copy before its parity is computed. None (the default, or when
    /// the export cannot make it now): the frontend allocates its own. Memory that does not start on a 4 KiB
    /// boundary is not used. The frontend keeps it for later requests and drops it when done.
    fn payload_memory(&self, len_bytes: usize) -> Option<PayloadMemory> {
        let _ = len_bytes;
        None
    }
}

/// A run of an export's bytes with one allocation state ("base:allocation").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    pub len_bytes: u64,
    /// Nothing is stored there (NBD_STATE_HOLE): a write may need space.
    pub hole: bool,
    /// It reads as zeros (NBD_STATE_ZERO).
    pub zero: bool,
}

/// The NBD error value for an I/O error from an export. The protocol only has a handful of values, so the OS
/// error is folded onto the nearest one (the spec asks EDQUOT and EFBIG to become ENOSPC); anything unknown is
/// EIO, never silently success.
pub fn error_code_for(error: &io::Error) -> ErrorCode {
    if let Some(errno) = error.raw_os_error() {
        return match errno {
            libc::EPERM | libc::EACCES | libc::EROFS => ErrorCode::Perm,
            libc::ENOSPC | libc::EDQUOT | libc::EFBIG => ErrorCode::NoSpc,
            libc::EINVAL => ErrorCode::Inval,
            libc::ENOMEM => ErrorCode::NoMem,
            libc::EOVERFLOW => ErrorCode::Overflow,
            libc::EOPNOTSUPP => ErrorCode::NotSup,
            libc::ESHUTDOWN => ErrorCode::Shutdown,
            _ => ErrorCode::Io,
        };
    }
    match error.kind() {
        io::ErrorKind::PermissionDenied => ErrorCode::Perm,
        io::ErrorKind::InvalidInput => ErrorCode::Inval,
        io::ErrorKind::OutOfMemory => ErrorCode::NoMem,
        io::ErrorKind::Unsupported => ErrorCode::NotSup,
        _ => ErrorCode::Io,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn os_errors_fold_onto_protocol_values() {
        let cases = [
            (libc::EPERM, ErrorCode::Perm),
            (libc::EACCES, ErrorCode::Perm),
            (libc::EROFS, ErrorCode::Perm),
            (libc::ENOSPC, ErrorCode::NoSpc),
            (libc::EDQUOT, ErrorCode::NoSpc),
            (libc::EFBIG, ErrorCode::NoSpc),
            (libc::EINVAL, ErrorCode::Inval),
            (libc::ENOMEM, ErrorCode::NoMem),
            (libc::EOVERFLOW, ErrorCode::Overflow),
            (libc::EOPNOTSUPP, ErrorCode::NotSup),
            (libc::ESHUTDOWN, ErrorCode::Shutdown),
            (libc::EIO, ErrorCode::Io),
            (libc::ENXIO, ErrorCode::Io),
            (libc::EBADF, ErrorCode::Io),
        ];
        for (errno, expected) in cases {
            assert_eq!(
                error_code_for(&io::Error::from_raw_os_error(errno)),
                expected,
                "errno {errno}"
            );
        }
    }

    #[test]
    fn error_kinds_without_errno_fold_too() {
        let cases = [
            (io::ErrorKind::PermissionDenied, ErrorCode::Perm),
            (io::ErrorKind::InvalidInput, ErrorCode::Inval),
            (io::ErrorKind::OutOfMemory, ErrorCode::NoMem),
            (io::ErrorKind::Unsupported, ErrorCode::NotSup),
            (io::ErrorKind::Other, ErrorCode::Io),
            (io::ErrorKind::UnexpectedEof, ErrorCode::Io),
        ];
        for (kind, expected) in cases {
            assert_eq!(
                error_code_for(&io::Error::new(kind, "x")),
                expected,
                "{kind:?}"
            );
        }
    }
}
