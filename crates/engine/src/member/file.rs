//! A member opened: a regular file or a block device, O_DIRECT, claimed so that no second server serves it
//! beside this one; what it is (kind, size, identity, whether it lives in memory) and the synchronous operations
//! beside the ring (superblock reads, zeroing, holes). The ring that drives its I/O is in `uring.rs`.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, FileTypeExt, MetadataExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use super::{check_alignment, IoOp};
use crate::buf::AlignedBuf;

// <linux/fs.h> block device ioctls.
const BLKGETSIZE64: libc::c_ulong = 0x8008_1272;
const BLKDISCARD: libc::c_ulong = 0x1277;
const BLKDISCARDZEROES: libc::c_ulong = 0x127c;
const BLKZEROOUT: libc::c_ulong = 0x127f;

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum MemberKind {
    File,
    Block,
}

/// One opened member.
#[derive(Debug)]
pub struct MemberFile {
    pub path: PathBuf,
    pub kind: MemberKind,
    pub size_bytes: u64,
    /// (st_dev, st_ino) for files, (0, st_rdev) for block devices: equal ids are the same member.
    pub identity: (u64, u64),
    /// Discard deallocates (hole punch; a device that reports zeroing discard or write-zeroes offload).
    pub discard_deallocates: bool,
    /// The file lives in memory (tmpfs, ramfs): its I/O is a copy with nothing to wait for, so it runs on the
    /// calling thread instead of the ring, which would hand each request to a kernel worker thread (these file
    /// systems cannot serve io_uring without blocking) and pay two thread switches for a 4 KiB memcpy.
    pub memory_backed: bool,
    pub(super) file: File,
    /// A regular file opened for writing: a second descriptor holding an exclusive flock (`claim_file`).
    _claim: Option<File>,
    /// Whether a flush has anything to do (see `begin_flush`).
    flush_state: Mutex<FlushState>,
}

/// What decides whether a member's flush can be skipped: a flush makes durable the writes that completed
/// before it; with none completed since the last flush *started* (and no flush still running, which a later
/// flush must not overtake), there is nothing to make durable. RAID flushes every member on every client flush,
/// while a database commit (one small write) dirties three of six: the other fsyncs cost a device cache flush
/// each for nothing.
#[derive(Debug)]
struct FlushState {
    /// A plain write, discard or failed flush completed since the last flush started.
    dirty: bool,
    /// Flushes started and not yet completed.
    in_flight: u32,
    /// Flushes issued to the device (for tests).
    issued: u64,
}

/// The identity (see `MemberFile::identity`) and kind of the file at `path`, without opening it.
pub fn identify(path: &Path) -> io::Result<(MemberKind, (u64, u64))> {
    let meta = std::fs::metadata(path)?;
    let file_type = meta.file_type();
    if file_type.is_block_device() {
        Ok((MemberKind::Block, (0, meta.rdev())))
    } else if file_type.is_file() {
        Ok((MemberKind::File, (meta.dev(), meta.ino())))
    } else {
        Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a regular file or block device",
        ))
    }
}

/// How a member is opened, and whether this process claims it (block devices: O_EXCL; regular files: a
/// flock(2), see `claim_file`), so that no second server serves it beside this one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Read-write, claimed exclusively: serving the array, or creating it.
    Serve,
    /// Read-only, claimed: serving the array read-only. Other read-only servers may share a regular file; no
    /// writer may serve beside it (nor it beside a writer).
    ServeReadOnly,
    /// Read-only and unclaimed: looking at members of a running array (`examine`, `detail`).
    Look,
}

impl MemberFile {
    /// Opens `path` read-write with O_DIRECT (block devices also O_EXCL: refused while mounted or in use).
    pub fn open(path: &Path) -> io::Result<MemberFile> {
        MemberFile::open_with(path, Access::Serve)
    }

    /// Opens `path` read-only with O_DIRECT and without O_EXCL: for looking at members of a running array.
    pub fn open_read_only(path: &Path) -> io::Result<MemberFile> {
        MemberFile::open_with(path, Access::Look)
    }

    pub fn open_with(path: &Path, access: Access) -> io::Result<MemberFile> {
        let (kind, _) = identify(path)?;
        let writable = access == Access::Serve;
        let claimed = access != Access::Look;
        let mut flags = libc::O_DIRECT;
        if kind == MemberKind::Block && claimed {
            flags |= libc::O_EXCL;
        }
        let file = open_waiting_for_claim(path, writable, flags)?;
        // Identify through the opened descriptor: the path may have changed in between.
        let meta = file.metadata()?;
        let claim = if meta.file_type().is_file() && claimed {
            Some(claim_file(path, (meta.dev(), meta.ino()), writable)?)
        } else {
            None
        };
        let (kind, identity, size_bytes) = if meta.file_type().is_block_device() {
            (
                MemberKind::Block,
                (0, meta.rdev()),
                block_size_bytes(&file)?,
            )
        } else if meta.file_type().is_file() {
            (MemberKind::File, (meta.dev(), meta.ino()), meta.len())
        } else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "not a regular file or block device",
            ));
        };
        let discard_deallocates = match kind {
            MemberKind::File => true,
            MemberKind::Block => {
                block_discard_zeroes(&file) || block_write_zeroes_offload(meta.rdev())
            }
        };
        let memory_backed = kind == MemberKind::File && on_memory_file_system(&file);
        Ok(MemberFile {
            path: path.to_path_buf(),
            kind,
            size_bytes,
            identity,
            discard_deallocates,
            memory_backed,
            file,
            _claim: claim,
            // Whatever happened before this descriptor was opened is not known to be durable.
            flush_state: Mutex::new(FlushState {
                dirty: true,
                in_flight: 0,
                issued: 0,
            }),
        })
    }

    fn flush_state(&self) -> std::sync::MutexGuard<'_, FlushState> {
        self.flush_state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether a flush must reach the device; if so it counts as started (`end_flush` when it completes).
    pub(super) fn begin_flush(&self) -> bool {
        let mut state = self.flush_state();
        if !state.dirty && state.in_flight == 0 {
            return false;
        }
        state.dirty = false;
        state.in_flight += 1;
        state.issued += 1;
        true
    }

    pub(super) fn end_flush(&self, ok: bool) {
        let mut state = self.flush_state();
        state.in_flight -= 1;
        if !ok {
            state.dirty = true; // the next flush tries again
        }
    }

    /// A write that is not durable by itself (or a discard) completed, or failed partway.
    pub(super) fn note_dirty(&self) {
        self.flush_state().dirty = true;
    }

    /// Flushes that reached the device since the member was opened.
    pub fn flushes_issued(&self) -> u64 {
        self.flush_state().issued
    }

    /// Bytes from `offset_bytes` (at most `len_bytes`) that are a hole of the file: SEEK_DATA finds the next
    /// byte holding data (ENXIO: none up to the end of the file). A block device, or any error, answers 0:
    /// nothing is known to be a hole. The descriptor's file position is not used by any I/O (every read and write
    /// names its offset), so moving it here is harmless.
    pub fn hole_bytes(&self, offset_bytes: u64, len_bytes: u64) -> u64 {
        if len_bytes == 0 {
            return 0;
        }
        match self.seek(offset_bytes, libc::SEEK_DATA) {
            Ok(next_data) => next_data.saturating_sub(offset_bytes).min(len_bytes),
            // No data at or after the offset; the bytes past the end of the file are not the member's to report.
            Err(e) if e.raw_os_error() == Some(libc::ENXIO) => {
                self.size_bytes.saturating_sub(offset_bytes).min(len_bytes)
            }
            Err(_) => 0,
        }
    }

    /// Bytes from `offset_bytes` up to the next hole (SEEK_HOLE), at most `len_bytes`; all of them where it
    /// cannot tell (a block device, an error).
    pub fn data_bytes(&self, offset_bytes: u64, len_bytes: u64) -> u64 {
        match self.seek(offset_bytes, libc::SEEK_HOLE) {
            Ok(next_hole) => next_hole.saturating_sub(offset_bytes).min(len_bytes),
            Err(_) => len_bytes,
        }
    }

    /// lseek(2) with `whence` (SEEK_DATA or SEEK_HOLE) from `offset_bytes` on a regular file; an error for a
    /// block device, which cannot tell.
    fn seek(&self, offset_bytes: u64, whence: libc::c_int) -> io::Result<u64> {
        if self.kind != MemberKind::File {
            return Err(io::Error::from(io::ErrorKind::Unsupported));
        }
        let offset = libc::off_t::try_from(offset_bytes)
            .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        // SAFETY: lseek on a descriptor this struct owns; no memory is passed.
        let at = unsafe { libc::lseek(self.file.as_raw_fd(), offset, whence) };
        if at < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(at as u64)
    }

    /// Synchronous aligned read (superblocks at assembly).
    pub fn read_at(&self, offset_bytes: u64, buf: &mut [u8]) -> io::Result<()> {
        check_alignment(&IoOp::Read { offset_bytes, buf })?;
        self.file.read_exact_at(buf, offset_bytes)
    }

    /// Zeroes a block device range: BLKDISCARD where the device promises zeroes after discard, else BLKZEROOUT
    /// (the kernel offloads to write-zeroes or writes zero pages itself).
    pub(super) fn zero_block_range(&self, offset_bytes: u64, len_bytes: u64) -> io::Result<()> {
        let range: [u64; 2] = [offset_bytes, len_bytes];
        let request = if block_discard_zeroes(&self.file) {
            BLKDISCARD
        } else {
            BLKZEROOUT
        };
        // SAFETY: both ioctls read a [u64; 2] {start, len} from the pointer.
        let rc = unsafe { libc::ioctl(self.file.as_raw_fd(), request as _, range.as_ptr()) };
        if rc == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }

    /// Writes zeros over a file range (hole punching unsupported by the file system).
    pub(super) fn write_zeros(&self, offset_bytes: u64, len_bytes: u64) -> io::Result<()> {
        let zeros = zero_page_run();
        let mut done = 0;
        while done < len_bytes {
            let n = (len_bytes - done).min(zeros.len() as u64) as usize;
            self.file.write_all_at(&zeros[..n], offset_bytes + done)?;
            done += n as u64;
        }
        Ok(())
    }
}

/// Whether `file` is on tmpfs or ramfs (statfs magic numbers from <linux/magic.h>).
fn on_memory_file_system(file: &File) -> bool {
    const TMPFS_MAGIC: i64 = 0x0102_1994;
    const RAMFS_MAGIC: i64 = 0x8584_58f6;
    // SAFETY: statfs is plain old data; fstatfs fills it on success.
    let mut stat: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: a valid descriptor and a pointer to one statfs.
    let rc = unsafe { libc::fstatfs(file.as_raw_fd(), &mut stat) };
    rc == 0 && matches!(stat.f_type as i64, TMPFS_MAGIC | RAMFS_MAGIC)
}

fn block_size_bytes(file: &File) -> io::Result<u64> {
    let mut size: u64 = 0;
    // SAFETY: BLKGETSIZE64 writes one u64.
    let rc = unsafe { libc::ioctl(file.as_raw_fd(), BLKGETSIZE64 as _, &mut size as *mut u64) };
    if rc == 0 {
        Ok(size)
    } else {
        Err(io::Error::last_os_error())
    }
}

fn block_discard_zeroes(file: &File) -> bool {
    let mut zeroes: libc::c_uint = 0;
    // SAFETY: BLKDISCARDZEROES writes one unsigned int. (Kernels since 4.12 always report 0.)
    let rc = unsafe {
        libc::ioctl(
            file.as_raw_fd(),
            BLKDISCARDZEROES as _,
            &mut zeroes as *mut libc::c_uint,
        )
    };
    rc == 0 && zeroes == 1
}

fn block_write_zeroes_offload(rdev: u64) -> bool {
    let path = format!(
        "/sys/dev/block/{}:{}/queue/write_zeroes_max_bytes",
        libc::major(rdev as libc::dev_t),
        libc::minor(rdev as libc::dev_t)
    );
    std::fs::read_to_string(path)
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .is_some_and(|n| n > 0)
}

fn zero_page_run() -> &'static AlignedBuf {
    static ZEROS: OnceLock<AlignedBuf> = OnceLock::new();
    ZEROS.get_or_init(|| AlignedBuf::zeroed(1 << 20))
}

pub(super) fn already_a_member(path: &Path, other: &Path) -> io::Error {
    io::Error::new(
        io::ErrorKind::AlreadyExists,
        format!(
            "{} is in this array already (as {}: a member or a hot spare)",
            path.display(),
            other.display()
        ),
    )
}

/// How long opening a block device waits for another holder's exclusive claim to end: a server killed a moment
/// ago keeps its devices claimed until the kernel has torn its io_uring down (a worker does that after the process
/// is gone), and a restart right after SIGKILL found a device busy about one time in five.
const CLAIM_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Opens `path`; with O_EXCL (a block device), waits up to `CLAIM_WAIT` while another holder has it.
fn open_waiting_for_claim(path: &Path, writable: bool, flags: i32) -> io::Result<File> {
    let started = std::time::Instant::now();
    loop {
        let opened = OpenOptions::new()
            .read(true)
            .write(writable)
            .custom_flags(flags)
            .open(path);
        match opened {
            Err(e) if flags & libc::O_EXCL != 0 && e.raw_os_error() == Some(libc::EBUSY) => {
                if started.elapsed() >= CLAIM_WAIT {
                    return Err(io::Error::new(
                        e.kind(),
                        "in use: another process holds it exclusively (a running `paraid serve`, a mounted \
                         filesystem, md?)",
                    ));
                }
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            other => return other,
        }
    }
}

/// Claims a regular file for this process, as O_EXCL claims a block device: two processes serving the same member
/// files would each keep parity over writes the other does not see, and one serving them read-only would read
/// stripes another is in the middle of writing. A flock(2) (exclusive for a writer, shared for a read-only
/// server) on a descriptor of its own, opened read-only and never given to io_uring: a lock lives as long as its
/// open file, and a ring that dies with its process drops its references to the member's descriptor only later,
/// in a kernel worker, so a lock on that descriptor could outlive a killed server by a moment (a restart right
/// after SIGKILL found the member "in use"). This one closes with the process, also when it crashes. `identity`
/// is the member's (st_dev, st_ino): the path must still name the file opened.
fn claim_file(path: &Path, identity: (u64, u64), exclusive: bool) -> io::Result<File> {
    let claim = File::open(path)?;
    let meta = claim.metadata()?;
    if (meta.dev(), meta.ino()) != identity {
        return Err(io::Error::other(
            "the path changed while it was being opened",
        ));
    }
    let kind = if exclusive {
        libc::LOCK_EX
    } else {
        libc::LOCK_SH
    };
    // SAFETY: flock on a descriptor this File owns; no memory is passed.
    if unsafe { libc::flock(claim.as_raw_fd(), kind | libc::LOCK_NB) } == 0 {
        return Ok(claim);
    }
    let error = io::Error::last_os_error();
    if error.kind() == io::ErrorKind::WouldBlock {
        return Err(io::Error::new(
            io::ErrorKind::WouldBlock,
            "in use: another process has it open as an array member (a running `paraid serve`?)",
        ));
    }
    Err(error)
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: usize = 4096;

    /// A regular file opened as a writable member is claimed: a second writable open fails (also in the same
    /// process: a second open file description) until the first closes; read-only opens (examine, detail) work.
    #[test]
    fn a_writable_member_file_is_claimed_until_closed() {
        let path = std::env::temp_dir().join(format!("paraid-claim-{}", std::process::id()));
        File::create(&path).unwrap().set_len(1 << 20).unwrap();
        let first = MemberFile::open(&path).expect("first open");
        let err = MemberFile::open(&path).expect_err("a second writable open is refused");
        assert_eq!(err.kind(), io::ErrorKind::WouldBlock, "{err}");
        assert!(err.to_string().contains("in use"), "{err}");
        MemberFile::open_read_only(&path).expect("a read-only open works beside it");
        let err = MemberFile::open_with(&path, Access::ServeReadOnly)
            .expect_err("serving read-only beside a writer is refused");
        assert!(err.to_string().contains("in use"), "{err}");
        drop(first);
        MemberFile::open(&path).expect("open after the first closed");
        std::fs::remove_file(&path).unwrap();
    }

    /// Read-only servers share a member file with one another, not with a writer; their descriptors cannot write.
    #[test]
    fn a_member_served_read_only_is_claimed_shared() {
        let path = std::env::temp_dir().join(format!("paraid-claim-ro-{}", std::process::id()));
        File::create(&path).unwrap().set_len(1 << 20).unwrap();
        let first =
            MemberFile::open_with(&path, Access::ServeReadOnly).expect("first read-only open");
        let second =
            MemberFile::open_with(&path, Access::ServeReadOnly).expect("a second read-only server");
        let err =
            MemberFile::open(&path).expect_err("a writer beside read-only servers is refused");
        assert_eq!(err.kind(), io::ErrorKind::WouldBlock, "{err}");
        let page = AlignedBuf::zeroed(PAGE);
        let err = std::os::unix::fs::FileExt::write_at(&first.file, &page, 0)
            .expect_err("a read-only member's descriptor cannot write");
        assert_eq!(err.raw_os_error(), Some(libc::EBADF), "{err}");
        drop((first, second));
        MemberFile::open(&path).expect("a writer once they are gone");
        std::fs::remove_file(&path).unwrap();
    }
}
