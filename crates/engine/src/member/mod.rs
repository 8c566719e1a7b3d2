//! Member I/O: what the array asks of its members, behind a trait so that a fault injector or a simulator can
//! stand in for the real files and devices.
//!
//! Contract for every implementation:
//! * `Read`/`Write` offsets, lengths and buffer addresses are multiples of `PAGE_BYTES` (O_DIRECT rules; the
//!   in-memory implementation asserts them so tests catch what a real device would reject).
//! * Offsets are bytes from the start of the member (the superblock is at 0; the array adds its data offset).
//! * `submit` runs every request of the batch, concurrently where it can, and fills each request's `result`.
//! * `Write { fua: true }` is durable when it completes; `Flush` makes every completed write durable.
//! * After `Discard` completes the range reads back as zeros (deallocated where the member can do that, written
//!   with zeros where it cannot).

mod file;
mod mem;
mod overlay;
mod uring;
mod vectored;

use std::io;
use std::path::PathBuf;

pub use file::{identify, Access, MemberFile, MemberKind};
pub use mem::MemMembers;
pub(crate) use mem::{image_range, member_missing, MemSlots};
pub use overlay::OverlayMembers;
pub use uring::UringMembers;

pub enum IoOp<'a> {
    Read {
        offset_bytes: u64,
        buf: &'a mut [u8],
    },
    Write {
        offset_bytes: u64,
        buf: &'a [u8],
        fua: bool,
    },
    Flush,
    Discard {
        offset_bytes: u64,
        len_bytes: u64,
    },
}

impl IoOp<'_> {
    pub fn kind(&self) -> crate::error::MemberOp {
        use crate::error::MemberOp;
        match self {
            IoOp::Read { .. } => MemberOp::Read,
            IoOp::Write { .. } => MemberOp::Write,
            IoOp::Flush => MemberOp::Flush,
            IoOp::Discard { .. } => MemberOp::Discard,
        }
    }
}

/// One operation on one member, and its outcome once submitted.
pub struct IoReq<'a> {
    pub slot: usize,
    pub op: IoOp<'a>,
    pub result: io::Result<()>,
    /// How long the member took to complete it, from submission to completion (nanoseconds), as its backend
    /// measured it: 0 where the backend does not measure (members in memory answer at once). The array watches
    /// these for a member far slower than its peers (array/slow.rs).
    pub latency_ns: u64,
    /// Whether `latency_ns` is this request's own: false where the backend waited for it together with others
    /// and so saw when a later one completed, not when it did (uring.rs, `waits_together`). The array takes no
    /// sample from it.
    pub timed: bool,
}

/// The result a request holds until a backend completes it. An OS error code, not a message: `io::Error::other`
/// allocates, and every member I/O starts with this.
pub(crate) fn not_submitted() -> io::Error {
    io::Error::from_raw_os_error(libc::ECANCELED)
}

impl<'a> IoReq<'a> {
    pub fn new(slot: usize, op: IoOp<'a>) -> IoReq<'a> {
        IoReq {
            slot,
            op,
            result: Err(not_submitted()),
            latency_ns: 0,
            timed: true,
        }
    }

    pub fn read(slot: usize, offset_bytes: u64, buf: &'a mut [u8]) -> IoReq<'a> {
        IoReq::new(slot, IoOp::Read { offset_bytes, buf })
    }

    pub fn write(slot: usize, offset_bytes: u64, buf: &'a [u8], fua: bool) -> IoReq<'a> {
        IoReq::new(
            slot,
            IoOp::Write {
                offset_bytes,
                buf,
                fua,
            },
        )
    }

    pub fn flush(slot: usize) -> IoReq<'a> {
        IoReq::new(slot, IoOp::Flush)
    }

    pub fn discard(slot: usize, offset_bytes: u64, len_bytes: u64) -> IoReq<'a> {
        IoReq::new(
            slot,
            IoOp::Discard {
                offset_bytes,
                len_bytes,
            },
        )
    }

    /// The outcome of a submitted request as an engine error naming the operation and the member (for callers
    /// outside a running array, which has its own retry and eviction policy).
    pub(crate) fn outcome(self, io: &dyn MemberIo) -> Result<(), crate::error::EngineError> {
        let (op, slot) = (self.op.kind(), self.slot);
        self.result
            .map_err(|source| crate::error::EngineError::AccessMember {
                op,
                slot,
                path: io.label(slot),
                source,
            })
    }
}

pub trait MemberIo: Send + Sync {
    /// Slots addressed by this member set (present or not).
    fn slots(&self) -> usize;
    /// Human-readable name of the member in `slot` (its path), for messages.
    fn label(&self, slot: usize) -> String;
    /// Whether `slot` has a member that takes I/O.
    fn present(&self, slot: usize) -> bool;
    /// Bytes addressable on the member in `slot` (0 if absent).
    fn size_bytes(&self, slot: usize) -> u64;
    /// Whether `Discard` on `slot` deallocates (cheap) rather than writing zeros.
    fn discard_deallocates(&self, slot: usize) -> bool;
    /// Runs every request and sets each one's `result`.
    fn submit(&self, reqs: &mut [IoReq<'_>]);

    /// How many bytes from `offset_bytes` on the member in `slot` are known to hold nothing (a hole of a sparse
    /// file: they read as zeros without being stored), at most `len_bytes`; 0 where the first byte holds data or
    /// nothing can be told (a block device, an error). Only ever an underestimate: a caller reports these bytes
    /// as zeros without reading them. Answers NBD_CMD_BLOCK_STATUS.
    fn hole_bytes(&self, slot: usize, offset_bytes: u64, len_bytes: u64) -> u64 {
        let _ = (slot, offset_bytes, len_bytes);
        0
    }

    /// How many bytes from `offset_bytes` on the member in `slot` may hold data before the next hole begins, at
    /// most `len_bytes`: the complement of `hole_bytes`, for finding the holes after data. Only ever an
    /// overestimate (all of `len_bytes` where nothing can be told).
    fn data_bytes(&self, slot: usize, offset_bytes: u64, len_bytes: u64) -> u64 {
        let _ = (slot, offset_bytes);
        len_bytes
    }

    /// Opens (or, for in-memory sets, creates) `member` and puts it in the empty `slot` (slots at or beyond the
    /// array's member count hold spares and replacements; any slot below `MAX_MEMBERS` may be used).
    fn attach(&self, slot: usize, member: &NewMember) -> io::Result<()> {
        let _ = (slot, member);
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "this member set cannot attach members",
        ))
    }

    /// Takes the member out of `slot` (it is closed once no request uses it; later I/O to the slot fails).
    /// Returns whether a member was there.
    fn detach(&self, slot: usize) -> bool {
        let _ = slot;
        false
    }

    /// Moves the member in `from` to the empty slot `to` (a spare taking over a failed slot).
    fn move_member(&self, from: usize, to: usize) -> io::Result<()> {
        let _ = (from, to);
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "this member set cannot move members",
        ))
    }
}

/// Inside `impl MemberIo for Wrapper`: forwards slots, label, present, size_bytes and discard_deallocates to the
/// member set the wrapper wraps (its field `$inner`), so that the wrapper writes only what it changes (submit, and
/// whatever else it names itself). With `, attach` it forwards attach, detach and move_member too (otherwise the
/// wrapper refuses them, the trait's default); with `, holes` it forwards hole_bytes and data_bytes (otherwise it
/// knows of no hole, the trait's default).
#[macro_export]
macro_rules! forward_member_io {
    ($inner:ident $(, $extra:ident)*) => {
        fn slots(&self) -> usize {
            self.$inner.slots()
        }
        fn label(&self, slot: usize) -> String {
            self.$inner.label(slot)
        }
        fn present(&self, slot: usize) -> bool {
            self.$inner.present(slot)
        }
        fn size_bytes(&self, slot: usize) -> u64 {
            self.$inner.size_bytes(slot)
        }
        fn discard_deallocates(&self, slot: usize) -> bool {
            self.$inner.discard_deallocates(slot)
        }
        $($crate::forward_member_io!(@$extra $inner);)*
    };
    (@attach $inner:ident) => {
        fn attach(&self, slot: usize, member: &$crate::member::NewMember) -> std::io::Result<()> {
            self.$inner.attach(slot, member)
        }
        fn detach(&self, slot: usize) -> bool {
            self.$inner.detach(slot)
        }
        fn move_member(&self, from: usize, to: usize) -> std::io::Result<()> {
            self.$inner.move_member(from, to)
        }
    };
    (@holes $inner:ident) => {
        fn hole_bytes(&self, slot: usize, offset_bytes: u64, len_bytes: u64) -> u64 {
            self.$inner.hole_bytes(slot, offset_bytes, len_bytes)
        }
        fn data_bytes(&self, slot: usize, offset_bytes: u64, len_bytes: u64) -> u64 {
            self.$inner.data_bytes(slot, offset_bytes, len_bytes)
        }
    };
}

/// A member to add to a running array.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NewMember {
    /// A regular file or block device (opened O_DIRECT, block devices O_EXCL).
    Path(PathBuf),
    /// A zero-filled in-memory member (tests, the simulator).
    Image { label: String, size_bytes: u64 },
    /// An in-memory member holding `image` (the simulator: a failed device that comes back with what it held).
    Existing {
        label: String,
        image: std::sync::Arc<Vec<u8>>,
    },
}

impl std::fmt::Display for NewMember {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NewMember::Path(path) => write!(f, "{}", path.display()),
            NewMember::Image { label, .. } | NewMember::Existing { label, .. } => {
                f.write_str(label)
            }
        }
    }
}

fn unsupported_kind(member: &NewMember, set: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::Unsupported,
        format!("{member}: {set} members cannot hold this kind of member"),
    )
}

/// Checks the O_DIRECT rules for one request (used by implementations before touching anything).
pub(crate) fn check_alignment(op: &IoOp<'_>) -> io::Result<()> {
    use crate::layout::PAGE_BYTES;
    let aligned = |offset: u64, len: u64, addr: Option<usize>| {
        offset.is_multiple_of(PAGE_BYTES)
            && len.is_multiple_of(PAGE_BYTES)
            && addr.is_none_or(|a| (a as u64).is_multiple_of(PAGE_BYTES))
    };
    let ok = match op {
        IoOp::Read { offset_bytes, buf } => {
            aligned(*offset_bytes, buf.len() as u64, Some(buf.as_ptr() as usize))
        }
        IoOp::Write {
            offset_bytes, buf, ..
        } => aligned(*offset_bytes, buf.len() as u64, Some(buf.as_ptr() as usize)),
        IoOp::Flush => true,
        IoOp::Discard {
            offset_bytes,
            len_bytes,
        } => aligned(*offset_bytes, *len_bytes, None),
    };
    if ok {
        Ok(())
    } else {
        Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "member I/O not aligned to 4096 bytes",
        ))
    }
}
