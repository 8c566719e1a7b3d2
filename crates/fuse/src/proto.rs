//! The FUSE kernel protocol, as far as a file that stands for a block device needs it (the layouts of
//! <linux/fuse.h>, protocol 7.38; all fields in the host's byte order).

/// The protocol this server speaks; the kernel's INIT says what it speaks, and the lower minor wins.
pub const KERNEL_MAJOR: u32 = 7;
pub const KERNEL_MINOR: u32 = 38;
/// The oldest minor served: 7.28 added max_pages (requests up to 1 MiB) and its INIT reply layout is ours.
pub const OLDEST_MINOR: u32 = 28;

pub const LOOKUP: u32 = 1;
pub const FORGET: u32 = 2;
pub const GETATTR: u32 = 3;
pub const SETATTR: u32 = 4;
pub const OPEN: u32 = 14;
pub const READ: u32 = 15;
pub const WRITE: u32 = 16;
pub const STATFS: u32 = 17;
pub const RELEASE: u32 = 18;
pub const FSYNC: u32 = 20;
pub const FLUSH: u32 = 25;
pub const INIT: u32 = 26;
pub const OPENDIR: u32 = 27;
pub const INTERRUPT: u32 = 36;
pub const DESTROY: u32 = 38;
pub const BATCH_FORGET: u32 = 42;
pub const FALLOCATE: u32 = 43;

/// `fuse_in_header`: len, opcode, unique, nodeid, uid, gid, pid, total_extlen, padding.
pub const IN_HEADER_BYTES: usize = 40;
/// `fuse_out_header`: len, error, unique.
pub const OUT_HEADER_BYTES: usize = 16;
/// `fuse_write_in`, which a WRITE's payload follows.
pub const WRITE_IN_BYTES: usize = 40;
/// `fuse_init_out` (7.28 and later).
pub const INIT_OUT_BYTES: usize = 64;
/// `fuse_attr_out`: attr_valid, attr_valid_nsec, dummy, then `fuse_attr` (88 bytes).
pub const ATTR_OUT_BYTES: usize = 104;
/// `fuse_open_out`: fh, open_flags, padding.
pub const OPEN_OUT_BYTES: usize = 16;
/// `fuse_kstatfs`.
pub const STATFS_OUT_BYTES: usize = 80;

// INIT flags.
pub const ASYNC_READ: u32 = 1 << 0;
pub const BIG_WRITES: u32 = 1 << 5;
pub const ASYNC_DIO: u32 = 1 << 15;
pub const MAX_PAGES: u32 = 1 << 22;

// OPEN reply flags.
pub const FOPEN_DIRECT_IO: u32 = 1 << 0;
pub const FOPEN_NOFLUSH: u32 = 1 << 5;
pub const FOPEN_PARALLEL_DIRECT_WRITES: u32 = 1 << 6;

/// SETATTR: what is to change (mode, owner, group, size).
pub const FATTR_MODE: u32 = 1 << 0;
pub const FATTR_UID: u32 = 1 << 1;
pub const FATTR_GID: u32 = 1 << 2;
pub const FATTR_SIZE: u32 = 1 << 3;

// fallocate(2) modes.
pub const FALLOC_KEEP_SIZE: u32 = 0x01;
pub const FALLOC_PUNCH_HOLE: u32 = 0x02;
pub const FALLOC_ZERO_RANGE: u32 = 0x10;

#[cfg(test)]
pub fn u16_at(bytes: &[u8], at: usize) -> u16 {
    u16::from_ne_bytes(bytes[at..at + 2].try_into().expect("two bytes"))
}

pub fn u32_at(bytes: &[u8], at: usize) -> u32 {
    u32::from_ne_bytes(bytes[at..at + 4].try_into().expect("four bytes"))
}

pub fn u64_at(bytes: &[u8], at: usize) -> u64 {
    u64::from_ne_bytes(bytes[at..at + 8].try_into().expect("eight bytes"))
}

fn put_u16(bytes: &mut [u8], at: usize, value: u16) {
    bytes[at..at + 2].copy_from_slice(&value.to_ne_bytes());
}

fn put_u32(bytes: &mut [u8], at: usize, value: u32) {
    bytes[at..at + 4].copy_from_slice(&value.to_ne_bytes());
}

fn put_u64(bytes: &mut [u8], at: usize, value: u64) {
    bytes[at..at + 8].copy_from_slice(&value.to_ne_bytes());
}

/// A request's header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InHeader {
    /// The whole request's length, header included.
    pub len: u32,
    pub opcode: u32,
    pub unique: u64,
    pub nodeid: u64,
}

impl InHeader {
    pub fn parse(bytes: &[u8]) -> Option<InHeader> {
        (bytes.len() >= IN_HEADER_BYTES).then(|| InHeader {
            len: u32_at(bytes, 0),
            opcode: u32_at(bytes, 4),
            unique: u64_at(bytes, 8),
            nodeid: u64_at(bytes, 16),
        })
    }
}

/// A reply's header: `error` is 0 or a negative errno; `len` counts the header and what follows it.
pub fn out_header(unique: u64, error: i32, payload_bytes: usize) -> [u8; OUT_HEADER_BYTES] {
    let mut header = [0u8; OUT_HEADER_BYTES];
    put_u32(&mut header, 0, (OUT_HEADER_BYTES + payload_bytes) as u32);
    header[4..8].copy_from_slice(&error.to_ne_bytes());
    put_u64(&mut header, 8, unique);
    header
}

/// What the kernel's INIT said (`fuse_init_in`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InitIn {
    pub major: u32,
    pub minor: u32,
    pub max_readahead: u32,
    pub flags: u32,
}

impl InitIn {
    pub fn parse(args: &[u8]) -> Option<InitIn> {
        (args.len() >= 16).then(|| InitIn {
            major: u32_at(args, 0),
            minor: u32_at(args, 4),
            max_readahead: u32_at(args, 8),
            flags: u32_at(args, 12),
        })
    }
}

/// The INIT reply (`fuse_init_out`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InitOut {
    pub minor: u32,
    pub max_readahead: u32,
    pub flags: u32,
    pub max_background: u16,
    pub congestion_threshold: u16,
    pub max_write: u32,
    pub max_pages: u16,
}

impl InitOut {
    pub fn encode(&self) -> [u8; INIT_OUT_BYTES] {
        let mut out = [0u8; INIT_OUT_BYTES];
        put_u32(&mut out, 0, KERNEL_MAJOR);
        put_u32(&mut out, 4, self.minor);
        put_u32(&mut out, 8, self.max_readahead);
        put_u32(&mut out, 12, self.flags);
        put_u16(&mut out, 16, self.max_background);
        put_u16(&mut out, 18, self.congestion_threshold);
        put_u32(&mut out, 20, self.max_write);
        put_u32(&mut out, 24, 1); // time_gran: nanoseconds
        put_u16(&mut out, 28, self.max_pages);
        out
    }
}

/// The served file's attributes, as one stat(2) of it shows them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileAttr {
    pub size_bytes: u64,
    /// Type and permission bits.
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    /// atime, mtime and ctime alike (seconds since the epoch): when the serve began.
    pub time_s: u64,
}

/// The one file's attributes (`fuse_attr_out`, inode 1: the root), valid for `valid_s` seconds.
pub fn attr_out(attr_of: &FileAttr, valid_s: u64) -> [u8; ATTR_OUT_BYTES] {
    let FileAttr {
        size_bytes,
        mode,
        uid,
        gid,
        time_s,
    } = *attr_of;
    let mut out = [0u8; ATTR_OUT_BYTES];
    put_u64(&mut out, 0, valid_s);
    let attr = 16;
    put_u64(&mut out, attr, 1);
    put_u64(&mut out, attr + 8, size_bytes);
    put_u64(&mut out, attr + 16, size_bytes.div_ceil(512)); // blocks of 512 bytes
    for at in [24, 32, 40] {
        put_u64(&mut out, attr + at, time_s);
    }
    put_u32(&mut out, attr + 60, mode);
    put_u32(&mut out, attr + 64, 1); // nlink
    put_u32(&mut out, attr + 68, uid);
    put_u32(&mut out, attr + 72, gid);
    put_u32(&mut out, attr + 80, 4096); // blksize
    out
}

pub fn open_out(fh: u64, open_flags: u32) -> [u8; OPEN_OUT_BYTES] {
    let mut out = [0u8; OPEN_OUT_BYTES];
    put_u64(&mut out, 0, fh);
    put_u32(&mut out, 8, open_flags);
    out
}

pub fn write_out(size: u32) -> [u8; 8] {
    let mut out = [0u8; 8];
    put_u32(&mut out, 0, size);
    out
}

/// `fuse_kstatfs` of a file system that is one full file of `size_bytes`.
pub fn statfs_out(size_bytes: u64) -> [u8; STATFS_OUT_BYTES] {
    let mut out = [0u8; STATFS_OUT_BYTES];
    put_u64(&mut out, 0, size_bytes / 4096); // blocks
    put_u64(&mut out, 24, 1); // files
    put_u32(&mut out, 40, 4096); // bsize
    put_u32(&mut out, 44, 255); // namelen
    put_u32(&mut out, 48, 4096); // frsize
    out
}

/// `fuse_read_in` / `fuse_write_in`: offset, size, flags (the open flags: O_DSYNC asks for FUA).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transfer {
    pub offset_bytes: u64,
    pub size_bytes: u32,
    pub open_flags: u32,
}

impl Transfer {
    pub fn parse(args: &[u8]) -> Option<Transfer> {
        (args.len() >= 40).then(|| Transfer {
            offset_bytes: u64_at(args, 8),
            size_bytes: u32_at(args, 16),
            open_flags: u32_at(args, 32),
        })
    }
}

/// `fuse_fallocate_in`: offset, length, mode.
pub fn parse_fallocate(args: &[u8]) -> Option<(u64, u64, u32)> {
    (args.len() >= 32).then(|| (u64_at(args, 8), u64_at(args, 16), u32_at(args, 24)))
}

/// `fuse_setattr_in`: which attributes are to change, and the new size.
pub fn parse_setattr(args: &[u8]) -> Option<(u32, u64)> {
    (args.len() >= 88).then(|| (u32_at(args, 0), u64_at(args, 16)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_have_the_kernels_sizes_and_offsets() {
        let header = out_header(7, -libc::EIO, 8);
        assert_eq!(u32_at(&header, 0), 24);
        assert_eq!(
            i32::from_ne_bytes(header[4..8].try_into().unwrap()),
            -libc::EIO
        );
        assert_eq!(u64_at(&header, 8), 7);

        let attr = attr_out(
            &FileAttr {
                size_bytes: 1 << 30,
                mode: 0o100600,
                uid: 0,
                gid: 0,
                time_s: 1_800_000_000,
            },
            3600,
        );
        assert_eq!(u64_at(&attr, 16), 1, "ino");
        assert_eq!(u64_at(&attr, 24), 1 << 30, "size");
        assert_eq!(u64_at(&attr, 16 + 32), 1_800_000_000, "mtime");
        assert_eq!(u32_at(&attr, 76), 0o100600, "mode");
        assert_eq!(u32_at(&attr, 80), 1, "nlink");

        let mut write_in = [0u8; 40];
        write_in[8..16].copy_from_slice(&4096u64.to_ne_bytes());
        write_in[16..20].copy_from_slice(&512u32.to_ne_bytes());
        write_in[32..36].copy_from_slice(&(libc::O_DSYNC as u32).to_ne_bytes());
        let transfer = Transfer::parse(&write_in).unwrap();
        assert_eq!(
            transfer,
            Transfer {
                offset_bytes: 4096,
                size_bytes: 512,
                open_flags: libc::O_DSYNC as u32
            }
        );
        assert!(Transfer::parse(&write_in[..24]).is_none());

        let init = InitOut {
            minor: 38,
            max_readahead: 1 << 17,
            flags: ASYNC_READ | MAX_PAGES,
            max_background: 64,
            congestion_threshold: 48,
            max_write: 1 << 20,
            max_pages: 256,
        }
        .encode();
        assert_eq!(u32_at(&init, 20), 1 << 20, "max_write");
        assert_eq!(u16_at(&init, 28), 256, "max_pages");
    }
}
