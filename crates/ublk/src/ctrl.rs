//! Control plane: admin commands to /dev/ublk-control (add, set parameters, start, stop, delete a device).
//!
//! Each command is one io_uring URING_CMD with a 128-byte SQE, submitted and waited for on its own: they are
//! few (five per device lifetime) and START_DEV blocks in the kernel until every queue has fetched its tags.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use io_uring::{cqueue, opcode, squeue, types, IoUring};

use crate::error::UblkError;
use crate::sys::{self, CtrlCmd, DevInfo, Params};

pub const CONTROL_PATH: &str = "/dev/ublk-control";

/// The dev_id that asks ADD_DEV to pick a free id.
pub const ANY_DEV_ID: u32 = u32::MAX;

/// A command for the whole device (not one queue).
fn for_device(dev_id: u32) -> CtrlCmd {
    CtrlCmd {
        dev_id,
        queue_id: u16::MAX,
        ..CtrlCmd::default()
    }
}

/// A command for the whole device that the kernel answers by reading or filling `buffer`.
fn with_buffer<T>(dev_id: u32, buffer: *const T) -> CtrlCmd {
    CtrlCmd {
        len: std::mem::size_of::<T>() as u16,
        addr: buffer as u64,
        ..for_device(dev_id)
    }
}

/// A command for the whole device carrying the server's pid (START_DEV, END_USER_RECOVERY).
fn with_pid(dev_id: u32, server_pid: i32) -> CtrlCmd {
    CtrlCmd {
        data: [server_pid as u64],
        ..for_device(dev_id)
    }
}

pub struct Control {
    file: File,
    ring: IoUring<squeue::Entry128, cqueue::Entry>,
}

impl Control {
    pub fn open(path: &Path) -> Result<Control, UblkError> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(|source| UblkError::OpenControl {
                path: path.to_path_buf(),
                source,
            })?;
        let ring = IoUring::<squeue::Entry128, cqueue::Entry>::builder()
            .build(4)
            .map_err(|source| UblkError::SetupRing {
                purpose: "ublk admin commands",
                source,
            })?;
        Ok(Control { file, ring })
    }

    /// One admin command; the kernel's answer is the completion's result (>= 0) or a negative errno.
    fn command(&mut self, name: &'static str, nr: u8, cmd: CtrlCmd) -> Result<i32, UblkError> {
        let failed = |source: io::Error| UblkError::Command {
            command: name,
            dev_id: cmd.dev_id,
            source,
        };
        let sqe = opcode::UringCmd80::new(types::Fd(self.file.as_raw_fd()), sys::ctrl_op(nr))
            .cmd(sys::command_bytes(&cmd))
            .build()
            .user_data(nr as u64);
        // SAFETY: the SQE points at nothing but `cmd.addr`, which the caller keeps alive until this returns
        // (we wait for the completion below).
        unsafe { self.ring.submission().push(&sqe) }
            .map_err(|_| failed(io::Error::other("the admin ring is full")))?;
        self.ring.submit_and_wait(1).map_err(failed)?;
        let cqe = self
            .ring
            .completion()
            .next()
            .ok_or_else(|| failed(io::Error::other("no completion after waiting for one")))?;
        if cqe.result() < 0 {
            return Err(failed(io::Error::from_raw_os_error(-cqe.result())));
        }
        Ok(cqe.result())
    }

    /// ADD_DEV: the kernel fills in the id (when asked for ANY_DEV_ID) and the flags it grants.
    pub fn add_device(&mut self, info: &mut DevInfo) -> Result<(), UblkError> {
        let cmd = with_buffer(info.dev_id, info as *mut DevInfo);
        self.command("ADD_DEV", sys::CMD_ADD_DEV, cmd).map(|_| ())
    }

    pub fn set_params(&mut self, dev_id: u32, params: &Params) -> Result<(), UblkError> {
        let cmd = with_buffer(dev_id, params as *const Params);
        self.command("SET_PARAMS", sys::CMD_SET_PARAMS, cmd)
            .map(|_| ())
    }

    /// START_DEV: waits until every queue has fetched all its tags, then adds the block device.
    pub fn start_device(&mut self, dev_id: u32, server_pid: i32) -> Result<(), UblkError> {
        self.command(
            "START_DEV",
            sys::CMD_START_DEV,
            with_pid(dev_id, server_pid),
        )
        .map(|_| ())
    }

    /// STOP_DEV: removes the block device; requests in flight are served first (the queues must keep running).
    pub fn stop_device(&mut self, dev_id: u32) -> Result<(), UblkError> {
        self.command("STOP_DEV", sys::CMD_STOP_DEV, for_device(dev_id))
            .map(|_| ())
    }

    /// DEL_DEV: frees the id; returns once the character device is closed and unmapped everywhere.
    pub fn delete_device(&mut self, dev_id: u32) -> Result<(), UblkError> {
        self.command("DEL_DEV", sys::CMD_DEL_DEV, for_device(dev_id))
            .map(|_| ())
    }
}

impl Control {
    /// GET_DEV_INFO: the device's state, flags and server; Ok(None) when no device has this id.
    pub fn device_info(&mut self, dev_id: u32) -> Result<Option<DevInfo>, UblkError> {
        let mut info = DevInfo::default();
        let cmd = with_buffer(dev_id, &mut info as *mut DevInfo);
        match self.command("GET_DEV_INFO", sys::CMD_GET_DEV_INFO, cmd) {
            Ok(_) => Ok(Some(info)),
            Err(UblkError::Command { source, .. })
                if source.raw_os_error() == Some(libc::ENODEV) =>
            {
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    pub fn params(&mut self, dev_id: u32) -> Result<Params, UblkError> {
        let mut params = Params {
            len: std::mem::size_of::<Params>() as u32,
            ..Params::default()
        };
        let cmd = with_buffer(dev_id, &mut params as *mut Params);
        self.command("GET_PARAMS", sys::CMD_GET_PARAMS, cmd)?;
        Ok(params)
    }

    /// START_USER_RECOVERY: a device whose server died (quiesced, its I/O waiting) is prepared for a new one.
    pub fn start_recovery(&mut self, dev_id: u32) -> Result<(), UblkError> {
        self.command(
            "START_USER_RECOVERY",
            sys::CMD_START_USER_RECOVERY,
            for_device(dev_id),
        )
        .map(|_| ())
    }

    /// END_USER_RECOVERY: like START_DEV for a recovered device; the waiting I/O is then reissued to us.
    pub fn end_recovery(&mut self, dev_id: u32, server_pid: i32) -> Result<(), UblkError> {
        self.command(
            "END_USER_RECOVERY",
            sys::CMD_END_USER_RECOVERY,
            with_pid(dev_id, server_pid),
        )
        .map(|_| ())
    }
}

pub fn char_device_path(dev_id: u32) -> PathBuf {
    PathBuf::from(format!("/dev/ublkc{dev_id}"))
}

pub fn block_device_path(dev_id: u32) -> PathBuf {
    PathBuf::from(format!("/dev/ublkb{dev_id}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_commands_name_no_queue_and_carry_their_buffer_or_pid() {
        let plain = for_device(7);
        assert_eq!(
            (plain.dev_id, plain.queue_id, plain.len, plain.addr),
            (7, u16::MAX, 0, 0)
        );
        let params = Params::default();
        let with = with_buffer(7, &params as *const Params);
        assert_eq!(with.len as usize, std::mem::size_of::<Params>());
        assert_eq!(with.addr, &params as *const Params as u64);
        assert_eq!(with.queue_id, u16::MAX);
        let started = with_pid(ANY_DEV_ID, 4242);
        assert_eq!((started.dev_id, started.data[0]), (ANY_DEV_ID, 4242));
    }
}
