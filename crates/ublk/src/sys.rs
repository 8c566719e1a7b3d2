//! The kernel's ublk interface (include/uapi/linux/ublk_cmd.h), the part this frontend uses.
//!
//! Commands are the ioctl-encoded ones (`UBLK_U_*`): kernels built without the legacy opcodes accept only those,
//! and every kernel with ublk since 6.4 accepts them.

/// The admin commands' numbers (`_IOC_NR` of the encoded command).
pub const CMD_ADD_DEV: u8 = 0x04;
pub const CMD_DEL_DEV: u8 = 0x05;
pub const CMD_START_DEV: u8 = 0x06;
pub const CMD_STOP_DEV: u8 = 0x07;
pub const CMD_SET_PARAMS: u8 = 0x08;
pub const CMD_GET_DEV_INFO: u8 = 0x02;
pub const CMD_GET_PARAMS: u8 = 0x09;
pub const CMD_START_USER_RECOVERY: u8 = 0x10;
pub const CMD_END_USER_RECOVERY: u8 = 0x11;

/// The I/O commands' numbers.
pub const IO_FETCH_REQ: u8 = 0x20;
pub const IO_COMMIT_AND_FETCH_REQ: u8 = 0x21;

/// What a completed FETCH or COMMIT_AND_FETCH says: a request waits in the descriptor, or the device is going
/// away and the tag will not be used again.
pub const IO_RES_OK: i32 = 0;
pub const IO_RES_ABORT: i32 = -libc::ENODEV;

/// The descriptors of queue `q` are mapped from the character device at `q * MAX_CMD_BUF_BYTES`.
pub const UBLK_MAX_QUEUE_DEPTH: u32 = 4096;
pub const PAGE_BYTES: usize = 4096;
pub const MAX_CMD_BUF_BYTES: usize = round_up(
    UBLK_MAX_QUEUE_DEPTH as usize * std::mem::size_of::<IoDesc>(),
    PAGE_BYTES,
);

/// Device flags (`ublksrv_ctrl_dev_info.flags`).
pub const F_USER_RECOVERY: u64 = 1 << 3;
pub const F_USER_RECOVERY_REISSUE: u64 = 1 << 4;
pub const F_CMD_IOCTL_ENCODE: u64 = 1 << 6;

/// Device states (`ublksrv_ctrl_dev_info.state`): added but not started (or stopped), serving, waiting for a
/// new server after the old one died (recovery), failing I/O while it waits (6.13+).
pub const S_DEV_DEAD: u16 = 0;
pub const S_DEV_LIVE: u16 = 1;
pub const S_DEV_QUIESCED: u16 = 2;
pub const S_DEV_FAIL_IO: u16 = 3;

/// Request operations (`op_flags & 0xff`) and flags (`op_flags >> 8` in the header; here as bits of op_flags).
pub const IO_OP_READ: u8 = 0;
pub const IO_OP_WRITE: u8 = 1;
pub const IO_OP_FLUSH: u8 = 2;
pub const IO_OP_DISCARD: u8 = 3;
pub const IO_OP_WRITE_SAME: u8 = 4;
pub const IO_OP_WRITE_ZEROES: u8 = 5;
pub const IO_F_FUA: u32 = 1 << 13;

/// `ublk_param_basic.attrs`.
pub const ATTR_READ_ONLY: u32 = 1 << 0;
pub const ATTR_VOLATILE_CACHE: u32 = 1 << 2;
pub const ATTR_FUA: u32 = 1 << 3;

pub const PARAM_TYPE_BASIC: u32 = 1 << 0;
pub const PARAM_TYPE_DISCARD: u32 = 1 << 1;

pub const SECTOR_BYTES: u64 = 512;

const fn round_up(value: usize, to: usize) -> usize {
    value.div_ceil(to) * to
}

/// `_IOC(dir, 'u', nr, size)` as Linux encodes it on x86-64 and arm64.
const fn ioc(dir: u32, nr: u8, size: usize) -> u32 {
    (dir << 30) | ((size as u32) << 16) | ((b'u' as u32) << 8) | nr as u32
}
const IOC_READ: u32 = 2;
const IOC_WRITE: u32 = 1;

/// The encoded admin command: GET_DEV_INFO and GET_PARAMS only read (`_IOR`), the others read and write
/// (`_IOWR`).
pub const fn ctrl_op(nr: u8) -> u32 {
    let dir = if nr == CMD_GET_DEV_INFO || nr == CMD_GET_PARAMS {
        IOC_READ
    } else {
        IOC_READ | IOC_WRITE
    };
    ioc(dir, nr, std::mem::size_of::<CtrlCmd>())
}

/// The encoded I/O command (`_IOWR`).
pub const fn io_op(nr: u8) -> u32 {
    ioc(IOC_READ | IOC_WRITE, nr, std::mem::size_of::<IoCmd>())
}

/// `struct ublksrv_ctrl_cmd`: the payload of an admin command (in the 128-byte SQE's command area).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct CtrlCmd {
    pub dev_id: u32,
    /// u16::MAX unless the command is for one queue.
    pub queue_id: u16,
    pub len: u16,
    pub addr: u64,
    pub data: [u64; 1],
    pub dev_path_len: u16,
    pub pad: u16,
    pub reserved: u32,
}

/// `struct ublksrv_ctrl_dev_info`: what ADD_DEV is asked for and answers (the id, the flags granted).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct DevInfo {
    pub nr_hw_queues: u16,
    pub queue_depth: u16,
    pub state: u16,
    pub pad0: u16,
    pub max_io_buf_bytes: u32,
    pub dev_id: u32,
    pub ublksrv_pid: i32,
    pub pad1: u32,
    pub flags: u64,
    pub ublksrv_flags: u64,
    pub owner_uid: u32,
    pub owner_gid: u32,
    pub reserved1: u64,
    pub reserved2: u64,
}

/// `struct ublksrv_io_desc`: one request, in the queue's shared descriptor array at its tag.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct IoDesc {
    pub op_flags: u32,
    pub nr_sectors: u32,
    pub start_sector: u64,
    pub addr: u64,
}

impl IoDesc {
    pub fn op(&self) -> u8 {
        (self.op_flags & 0xff) as u8
    }

    pub fn fua(&self) -> bool {
        self.op_flags & IO_F_FUA != 0
    }

    pub fn offset_bytes(&self) -> u64 {
        self.start_sector * SECTOR_BYTES
    }

    pub fn len_bytes(&self) -> u64 {
        self.nr_sectors as u64 * SECTOR_BYTES
    }

    pub fn end_sector(&self) -> u64 {
        self.start_sector + self.nr_sectors as u64
    }
}

/// What COMMIT reports for a failed request: the error's negative errno, or -EIO for one without (never 0).
pub fn negative_errno(error: &std::io::Error) -> i32 {
    -error
        .raw_os_error()
        .filter(|&errno| errno > 0)
        .unwrap_or(libc::EIO)
}

/// `struct ublksrv_io_cmd`: the payload of FETCH and COMMIT_AND_FETCH (in a 64-byte SQE's command area).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct IoCmd {
    pub q_id: u16,
    pub tag: u16,
    /// COMMIT: bytes served, or a negative errno.
    pub result: i32,
    /// The buffer the kernel copies a WRITE's data into and a READ's data out of.
    pub addr: u64,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ParamBasic {
    pub attrs: u32,
    pub logical_bs_shift: u8,
    pub physical_bs_shift: u8,
    pub io_opt_shift: u8,
    pub io_min_shift: u8,
    pub max_sectors: u32,
    pub chunk_sectors: u32,
    pub dev_sectors: u64,
    pub virt_boundary_mask: u64,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ParamDiscard {
    pub discard_alignment: u32,
    pub discard_granularity: u32,
    pub max_discard_sectors: u32,
    pub max_write_zeroes_sectors: u32,
    pub max_discard_segments: u16,
    pub reserved0: u16,
}

/// `struct ublk_params` up to the discard parameters; `len` tells the kernel how much of it there is.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct Params {
    pub len: u32,
    pub types: u32,
    pub basic: ParamBasic,
    pub discard: ParamDiscard,
}

/// The bytes of a `#[repr(C)]` command payload, zero-padded to the SQE's command area.
pub fn command_bytes<T: Copy, const N: usize>(value: &T) -> [u8; N] {
    let size = std::mem::size_of::<T>();
    assert!(size <= N, "a {size}-byte command does not fit {N} bytes");
    let mut bytes = [0u8; N];
    // SAFETY: T is a plain #[repr(C)] struct of integers (no padding bytes that matter: the kernel reads the
    // named fields), and `size` bytes of it are readable.
    let source = unsafe { std::slice::from_raw_parts((value as *const T).cast::<u8>(), size) };
    bytes[..size].copy_from_slice(source);
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::size_of;

    /// The sizes the kernel's structs have; a different size would be read as a different layout.
    #[test]
    fn structs_have_the_kernels_sizes() {
        assert_eq!(size_of::<CtrlCmd>(), 32);
        assert_eq!(size_of::<DevInfo>(), 64);
        assert_eq!(size_of::<IoDesc>(), 24);
        assert_eq!(size_of::<IoCmd>(), 16);
        assert_eq!(size_of::<ParamBasic>(), 32);
        assert_eq!(size_of::<ParamDiscard>(), 20);
        assert_eq!(size_of::<Params>(), 64);
        assert_eq!(MAX_CMD_BUF_BYTES, 98_304);
    }

    /// The encoded commands as `<linux/ublk_cmd.h>` defines them (values a C program prints for UBLK_U_*).
    #[test]
    fn encoded_commands_match_the_header() {
        assert_eq!(ctrl_op(CMD_ADD_DEV), 0xc020_7504);
        assert_eq!(ctrl_op(CMD_DEL_DEV), 0xc020_7505);
        assert_eq!(ctrl_op(CMD_START_DEV), 0xc020_7506);
        assert_eq!(ctrl_op(CMD_STOP_DEV), 0xc020_7507);
        assert_eq!(ctrl_op(CMD_SET_PARAMS), 0xc020_7508);
        assert_eq!(ctrl_op(CMD_GET_DEV_INFO), 0x8020_7502);
        assert_eq!(ctrl_op(CMD_GET_PARAMS), 0x8020_7509);
        assert_eq!(ctrl_op(CMD_START_USER_RECOVERY), 0xc020_7510);
        assert_eq!(ctrl_op(CMD_END_USER_RECOVERY), 0xc020_7511);
        assert_eq!(io_op(IO_FETCH_REQ), 0xc010_7520);
        assert_eq!(io_op(IO_COMMIT_AND_FETCH_REQ), 0xc010_7521);
    }

    #[test]
    fn command_bytes_are_the_fields_in_order_then_zeroes() {
        let cmd = IoCmd {
            q_id: 0x0102,
            tag: 0x0304,
            result: -5,
            addr: 0x1122_3344_5566_7788,
        };
        let bytes: [u8; 16] = command_bytes(&cmd);
        assert_eq!(&bytes[0..2], &0x0102u16.to_ne_bytes());
        assert_eq!(&bytes[2..4], &0x0304u16.to_ne_bytes());
        assert_eq!(&bytes[4..8], &(-5i32).to_ne_bytes());
        assert_eq!(&bytes[8..16], &0x1122_3344_5566_7788u64.to_ne_bytes());
        let ctrl = CtrlCmd {
            dev_id: 7,
            ..CtrlCmd::default()
        };
        let wide: [u8; 80] = command_bytes(&ctrl);
        assert_eq!(&wide[0..4], &7u32.to_ne_bytes());
        assert!(wide[32..].iter().all(|&b| b == 0));
    }
}
