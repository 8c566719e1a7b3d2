//! The data plane: worker threads that each read a request from /dev/fuse, serve it against the export and
//! write its reply. The kernel hands each request to one reader, so there is no queue and no hand-off: a request
//! costs one wake-up (the kernel's) and stays on the thread that read it.

use std::cell::Cell;
use std::fs::File;
use std::io::{self, IoSlice, IoSliceMut, Read, Write};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use paraid_nbd::Export;

use crate::proto::{self, InHeader, Transfer};

/// What the workers share.
pub(crate) struct Shared {
    pub export: Arc<dyn Export>,
    pub device: File,
    pub max_io_bytes: u32,
    /// The file's mode (type bits included), owner and group, as the file mounted over had them; its size is
    /// the export's.
    pub attr: proto::FileAttr,
    /// The INIT answer, once given (a refused INIT leaves the connection to end).
    pub init: Mutex<Option<Result<(), String>>>,
    /// A worker found the connection gone (unmounted, aborted) or broken: the others follow.
    pub ended: AtomicBool,
    pub requests: AtomicU64,
    pub failed: AtomicU64,
}

/// A buffer whose bytes start on a 4096-byte boundary (what an export reading with O_DIRECT fills in place).
struct Aligned {
    storage: Vec<u8>,
    start: usize,
}

impl Aligned {
    fn new(len_bytes: usize) -> Aligned {
        let storage = vec![0u8; len_bytes + 4096];
        let start = (4096 - storage.as_ptr() as usize % 4096) % 4096;
        Aligned { storage, start }
    }

    fn bytes(&mut self) -> &mut [u8] {
        let start = self.start;
        &mut self.storage[start..]
    }
}

pub(crate) fn run_worker(shared: &Shared) {
    // A request lands header first, then its arguments: a WRITE's 40 bytes of `fuse_write_in` end the head, so
    // its payload starts the aligned body.
    let mut head = [0u8; proto::IN_HEADER_BYTES + proto::WRITE_IN_BYTES];
    let mut body = Aligned::new(shared.max_io_bytes as usize + 4096);
    let mut data = Aligned::new(shared.max_io_bytes as usize);
    while !shared.ended.load(Ordering::Relaxed) {
        let received = {
            let mut parts = [IoSliceMut::new(&mut head), IoSliceMut::new(body.bytes())];
            (&shared.device).read_vectored(&mut parts)
        };
        let len = match received {
            Ok(len) => len,
            // ENOENT: the request was interrupted before it was read; EINTR, EAGAIN: try again.
            Err(error)
                if matches!(
                    error.raw_os_error(),
                    Some(libc::ENOENT | libc::EINTR | libc::EAGAIN)
                ) =>
            {
                continue
            }
            Err(error) => {
                // ENODEV: unmounted or aborted, the normal end.
                if error.raw_os_error() != Some(libc::ENODEV) {
                    log::error!("FUSE: reading a request: {error}");
                }
                shared.ended.store(true, Ordering::Relaxed);
                return;
            }
        };
        let Some(header) = InHeader::parse(&head[..len.min(head.len())]) else {
            log::error!("FUSE: a request of {len} bytes, shorter than its header");
            continue;
        };
        shared.requests.fetch_add(1, Ordering::Relaxed);
        let head_args = &head[proto::IN_HEADER_BYTES..len.min(head.len())];
        let tail_len = len.saturating_sub(head.len());
        if header.opcode == proto::WRITE {
            serve_write(shared, &header, head_args, &body.bytes()[..tail_len]);
        } else if tail_len == 0 {
            // Most requests (READ's 40 bytes of arguments among them) fit the head: no copy.
            serve(shared, &header, head_args, &mut data);
        } else {
            let mut args = head_args.to_vec();
            args.extend_from_slice(&body.bytes()[..tail_len]);
            serve(shared, &header, &args, &mut data);
        }
    }
}

/// Writes a reply, its header and `body` (sent only with success) in one `writev`: the device wants each reply
/// whole.
fn reply(shared: &Shared, unique: u64, error: i32, body: &[u8]) {
    let body = if error == 0 { body } else { &[] };
    let header = proto::out_header(unique, error, body.len());
    if error != 0 {
        shared.failed.fetch_add(1, Ordering::Relaxed);
    }
    let slices = [IoSlice::new(&header), IoSlice::new(body)];
    match (&shared.device).write_vectored(&slices[..1 + !body.is_empty() as usize]) {
        Ok(_) => {}
        // ENOENT: the request was interrupted (or the connection aborted) meanwhile; nobody waits for it.
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
        Err(e) => log::warn!("FUSE: writing a reply: {e}"),
    }
}

fn errno_of(error: &io::Error) -> i32 {
    -error.raw_os_error().unwrap_or(libc::EIO)
}

fn serve(shared: &Shared, header: &InHeader, args: &[u8], data: &mut Aligned) {
    let unique = header.unique;
    let size_bytes = shared.export.size_bytes();
    match header.opcode {
        proto::INIT => serve_init(shared, unique, args),
        // No reply is expected.
        proto::FORGET | proto::BATCH_FORGET | proto::INTERRUPT => {}
        proto::GETATTR => reply(shared, unique, 0, &proto::attr_out(&shared.attr, 3600)),
        proto::SETATTR => match proto::parse_setattr(args) {
            // The size is the array's: a truncate to it is a no-op, to anything else refused. The mode and owner
            // are those of the file mounted over, fixed while it is served (chmod and chown there, before).
            // Times are taken and forgotten (`touch` works).
            Some((valid, size))
                if (valid & proto::FATTR_SIZE != 0 && size != size_bytes)
                    || valid & (proto::FATTR_MODE | proto::FATTR_UID | proto::FATTR_GID) != 0 =>
            {
                reply(shared, unique, -libc::EPERM, &[])
            }
            Some(_) => reply(shared, unique, 0, &proto::attr_out(&shared.attr, 3600)),
            None => reply(shared, unique, -libc::EINVAL, &[]),
        },
        proto::OPEN => {
            let flags = args.get(..4).map_or(0, |b| proto::u32_at(b, 0)) as i32;
            if shared.export.read_only() && flags & libc::O_ACCMODE != libc::O_RDONLY {
                return reply(shared, unique, -libc::EROFS, &[]);
            }
            // Straight to the array (no page cache of its own: the filesystem above caches), and writes in
            // parallel (without it the kernel serializes direct writes to one file).
            let open_flags =
                proto::FOPEN_DIRECT_IO | proto::FOPEN_PARALLEL_DIRECT_WRITES | proto::FOPEN_NOFLUSH;
            reply(shared, unique, 0, &proto::open_out(0, open_flags));
        }
        proto::READ => {
            let Some(t) = Transfer::parse(args) else {
                return reply(shared, unique, -libc::EINVAL, &[]);
            };
            let len = (t.size_bytes as u64)
                .min(size_bytes.saturating_sub(t.offset_bytes))
                .min(shared.max_io_bytes as u64) as usize;
            let buf = &mut data.bytes()[..len];
            match if len == 0 {
                Ok(())
            } else {
                shared.export.read(t.offset_bytes, buf)
            } {
                Ok(()) => reply(shared, unique, 0, buf),
                Err(error) => reply(shared, unique, errno_of(&error), &[]),
            }
        }
        proto::FSYNC => match shared.export.flush() {
            Ok(()) => reply(shared, unique, 0, &[]),
            Err(error) => reply(shared, unique, errno_of(&error), &[]),
        },
        // close(2) makes nothing durable; FSYNC does.
        proto::FLUSH | proto::RELEASE => reply(shared, unique, 0, &[]),
        proto::STATFS => reply(shared, unique, 0, &proto::statfs_out(size_bytes)),
        proto::FALLOCATE => serve_fallocate(shared, unique, args, size_bytes),
        proto::DESTROY => {
            reply(shared, unique, 0, &[]);
            shared.ended.store(true, Ordering::Relaxed);
        }
        // The root is the file: nothing to look up, no directory to open.
        proto::LOOKUP => reply(shared, unique, -libc::ENOENT, &[]),
        proto::OPENDIR => reply(shared, unique, -libc::ENOTDIR, &[]),
        // Everything else (xattrs, locks, ioctl, lseek, ...): not here; the kernel remembers for most.
        _ => reply(shared, unique, -libc::ENOSYS, &[]),
    }
}

fn serve_init(shared: &Shared, unique: u64, args: &[u8]) {
    let Some(init) = proto::InitIn::parse(args) else {
        return reply(shared, unique, -libc::EINVAL, &[]);
    };
    let outcome = if init.major != proto::KERNEL_MAJOR || init.minor < proto::OLDEST_MINOR {
        Err(format!(
            "the kernel speaks FUSE {}.{}; this server needs {}.{} or later",
            init.major,
            init.minor,
            proto::KERNEL_MAJOR,
            proto::OLDEST_MINOR
        ))
    } else {
        Ok(())
    };
    // Recorded before the reply: the reply lets the starting thread's look at the mounted file return, and it reads
    // this right after (under load, a worker preempted between the reply and the record made a good start fail
    // with "the kernel sent no INIT").
    *shared.init.lock().unwrap_or_else(|p| p.into_inner()) = Some(outcome.clone());
    match &outcome {
        Ok(()) => {
            let wanted =
                proto::ASYNC_READ | proto::BIG_WRITES | proto::ASYNC_DIO | proto::MAX_PAGES;
            let out = proto::InitOut {
                minor: init.minor.min(proto::KERNEL_MINOR),
                max_readahead: init.max_readahead,
                flags: init.flags & wanted,
                // Requests the kernel keeps in flight in the background (asynchronous direct I/O, a loop
                // device's): enough for every worker and a queue behind them.
                max_background: 128,
                congestion_threshold: 96,
                max_write: shared.max_io_bytes,
                max_pages: (shared.max_io_bytes / 4096) as u16,
            };
            reply(shared, unique, 0, &out.encode());
        }
        Err(reason) => {
            log::error!("FUSE: {reason}");
            reply(shared, unique, -libc::EPROTO, &[]);
        }
    }
}

fn serve_write(shared: &Shared, header: &InHeader, args: &[u8], payload: &[u8]) {
    let unique = header.unique;
    let Some(t) = Transfer::parse(args) else {
        return reply(shared, unique, -libc::EINVAL, &[]);
    };
    if t.size_bytes as usize != payload.len() {
        return reply(shared, unique, -libc::EINVAL, &[]);
    }
    if shared.export.read_only() {
        return reply(shared, unique, -libc::EROFS, &[]);
    }
    let size_bytes = shared.export.size_bytes();
    if t.offset_bytes
        .checked_add(payload.len() as u64)
        .is_none_or(|end| end > size_bytes)
    {
        // A block device's answer to a write past its end.
        return reply(shared, unique, -libc::ENOSPC, &[]);
    }
    if payload.is_empty() {
        return reply(shared, unique, 0, &proto::write_out(0));
    }
    // O_DSYNC (and O_SYNC, which includes it) on the open file: the write is durable when answered.
    let fua = t.open_flags & libc::O_DSYNC as u32 != 0;
    let answered = Cell::new(false);
    let answer = || {
        if !answered.replace(true) {
            reply(shared, unique, 0, &proto::write_out(t.size_bytes));
        }
    };
    match shared
        .export
        .write_answering(t.offset_bytes, payload, fua, &answer)
    {
        Ok(()) => answer(),
        Err(error) if !answered.get() => reply(shared, unique, errno_of(&error), &[]),
        // Answered from a journal already: the export makes the failure known through later requests.
        Err(error) => log::error!("FUSE: a write answered early failed afterwards: {error}"),
    }
}

fn serve_fallocate(shared: &Shared, unique: u64, args: &[u8], size_bytes: u64) {
    let Some((offset, len, mode)) = proto::parse_fallocate(args) else {
        return reply(shared, unique, -libc::EINVAL, &[]);
    };
    let Some(end) = offset.checked_add(len).filter(|&end| end <= size_bytes) else {
        // The file cannot grow: past its end nothing can be allocated.
        return reply(shared, unique, -libc::ENOSPC, &[]);
    };
    let outcome = if mode & !(proto::FALLOC_KEEP_SIZE) == 0 {
        // Allocation: every byte of the array is there already.
        Ok(())
    } else if mode & (proto::FALLOC_PUNCH_HOLE | proto::FALLOC_ZERO_RANGE) != 0
        && mode & !(proto::FALLOC_KEEP_SIZE | proto::FALLOC_PUNCH_HOLE | proto::FALLOC_ZERO_RANGE)
            == 0
    {
        if shared.export.read_only() {
            return reply(shared, unique, -libc::EROFS, &[]);
        }
        // Both must read back as zeroes (a loop device sends its discards as holes punched).
        shared.export.write_zeroes(offset, end - offset, false)
    } else {
        return reply(shared, unique, -libc::EOPNOTSUPP, &[]);
    };
    match outcome {
        Ok(()) => reply(shared, unique, 0, &[]),
        Err(error) => reply(shared, unique, errno_of(&error), &[]),
    }
}
