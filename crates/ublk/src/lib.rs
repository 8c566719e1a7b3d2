//! paraid's ublk frontend: serves an [`Export`] as a Linux block device, `/dev/ublkbN`, through the kernel's
//! ublk driver (`ublk_drv`, Linux 6.0+; this crate uses the ioctl-encoded commands of 6.4+).
//!
//! Against NBD it saves the socket: the kernel hands each request over in shared memory and takes the answer
//! back through io_uring, with no protocol to parse and no second copy through a socket buffer; and the
//! device needs no NBD client (`nbd-client`, `nbdfuse` + a loop device) to become a block device.
//!
//! - [`ctrl`]: the control plane (ADD_DEV, SET_PARAMS, START_DEV, STOP_DEV, DEL_DEV on /dev/ublk-control).
//! - [`queue`]: the data plane (one thread and one io_uring per hardware queue, a worker pool per queue).
//!
//! What it promises, and what it leans on:
//! - Every request is answered with what the export did: the bytes of a READ or WRITE only when the export
//!   returned success, a negative errno otherwise (the export's error, or EIO). Nothing is acknowledged early.
//! - The device advertises a volatile write cache and FUA, so the kernel sends FLUSH (and FUA writes) for a
//!   filesystem's or database's ordering points, and the export's `flush`/`write(fua)` make them durable.
//! - If this process dies, the kernel fails the device's outstanding and later I/O with errors: a client sees
//!   errors, never stale data, and the device lingers until deleted ([`delete_device`]). A device started with
//!   a fixed id ([`UblkConfig::dev_id`]) uses ublk's user recovery instead: the kernel holds its I/O, and the
//!   next server of the same owner takes it over and is reissued what was in flight.

pub mod ctrl;
mod error;
mod merge;
pub mod queue;
pub mod sys;

use std::fs::{File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

pub use error::UblkError;
pub use paraid_nbd::Export;
pub use queue::QueueStats;

use ctrl::Control;
use queue::{QueueHandle, QueueSpec};

/// How the device is set up.
#[derive(Debug, Clone)]
pub struct UblkConfig {
    /// Hardware queues (each with its own thread and ring).
    pub queues: u16,
    /// Requests in flight per queue (tags).
    pub depth: u16,
    /// The largest request, in bytes (each tag has a buffer this size).
    pub max_io_bytes: u32,
    /// Worker threads per queue; each serves one request at a time.
    pub workers_per_queue: usize,
    pub logical_block_bytes: u32,
    pub physical_block_bytes: u32,
    /// The smallest write that is not a read-modify-write (RAID: the chunk); 0: not said. A power of two.
    pub io_min_bytes: u32,
    /// The write size that is cheapest (RAID: a full stripe); 0: not said. A power of two.
    pub io_opt_bytes: u32,
    pub control_path: PathBuf,
    /// A fixed device id (/dev/ublkbN). With one, the device outlives a crash of this process: the kernel holds
    /// its I/O (and reissues what was in flight) until a new server with the same `owner_tag` takes it over.
    /// Without one, the kernel picks a free id and a crash fails the device's I/O.
    pub dev_id: Option<u32>,
    /// Who may take over the device (paraid: bits of the array's UUID); kept by the kernel beside the device.
    pub owner_tag: u64,
    /// Serve a request that arrives alone into an idle queue on the queue thread, without a worker's handoff.
    pub serve_inline_when_idle: bool,
    /// WRITEs that continue one another and arrived together are served as one export write up to this many
    /// bytes; 0: never.
    pub merge_write_bytes: u32,
    /// The write the export serves best whole (RAID: a full stripe, any size); 0: unknown. Merging completes
    /// such writes and leaves whole ones alone.
    pub whole_write_bytes: u64,
    /// READs (of at most 64 KiB each) that arrived together are served as one `Export::read_many` call, up to
    /// this many; 0 or 1: never.
    pub gather_reads: usize,
}

pub const DEFAULT_QUEUES: u16 = 1;
/// Requests in flight per queue: 64 buffers of 512 KiB, 32 MiB per queue (what the measurements in
/// docs/benchmarks.md used).
pub const DEFAULT_DEPTH: u16 = 64;
pub const DEFAULT_MAX_IO_BYTES: u32 = 512 * 1024;
pub const DEFAULT_WORKERS_PER_QUEUE: usize = 16;
pub const DEFAULT_MERGE_WRITE_BYTES: u32 = 1024 * 1024;

impl Default for UblkConfig {
    fn default() -> Self {
        UblkConfig {
            queues: DEFAULT_QUEUES,
            depth: DEFAULT_DEPTH,
            max_io_bytes: DEFAULT_MAX_IO_BYTES,
            workers_per_queue: DEFAULT_WORKERS_PER_QUEUE,
            logical_block_bytes: 512,
            physical_block_bytes: 4096,
            io_min_bytes: 0,
            io_opt_bytes: 0,
            control_path: PathBuf::from(ctrl::CONTROL_PATH),
            dev_id: None,
            owner_tag: 0,
            serve_inline_when_idle: true,
            merge_write_bytes: DEFAULT_MERGE_WRITE_BYTES,
            whole_write_bytes: 0,
            gather_reads: paraid_nbd::DEFAULT_GATHER_READS,
        }
    }
}

fn shift_of(name: &str, bytes: u32) -> Result<u8, UblkError> {
    if bytes == 0 {
        return Ok(0);
    }
    if !bytes.is_power_of_two() {
        return Err(UblkError::Config(format!(
            "ublk {name} of {bytes} bytes: must be a power of two"
        )));
    }
    Ok(bytes.trailing_zeros() as u8)
}

impl UblkConfig {
    /// Checks every setting that does not depend on the export, so a command can refuse before it acts.
    pub fn validate(&self) -> Result<(), UblkError> {
        self.block_shifts().map(|_| ())
    }

    /// The logical and physical block shifts, after every size-independent check.
    fn block_shifts(&self) -> Result<(u8, u8), UblkError> {
        let bad = |message: String| Err(UblkError::Config(message));
        if self.queues == 0 || self.depth == 0 || self.workers_per_queue == 0 {
            return bad("ublk queues, depth and workers must be at least 1".into());
        }
        if self.depth as u32 > sys::UBLK_MAX_QUEUE_DEPTH {
            return bad(format!(
                "ublk depth {}: at most {}",
                self.depth,
                sys::UBLK_MAX_QUEUE_DEPTH
            ));
        }
        let logical_shift = shift_of("logical block size", self.logical_block_bytes)?;
        let physical_shift = shift_of("physical block size", self.physical_block_bytes)?;
        if !(9..=12).contains(&logical_shift) || physical_shift < logical_shift {
            return bad(format!(
                "ublk block sizes {} (logical) and {} (physical): logical 512-4096 bytes, physical at least logical",
                self.logical_block_bytes, self.physical_block_bytes
            ));
        }
        if self.max_io_bytes < 4096 || !self.max_io_bytes.is_multiple_of(4096) {
            return bad(format!(
                "ublk largest request {} bytes: a multiple of 4096",
                self.max_io_bytes
            ));
        }
        shift_of("optimal I/O size", self.io_opt_bytes)?;
        shift_of("minimum I/O size", self.io_min_bytes)?;
        Ok((logical_shift, physical_shift))
    }

    /// The device parameters for an export of `size_bytes`, or why this configuration cannot serve it.
    pub fn params(&self, size_bytes: u64, read_only: bool) -> Result<sys::Params, UblkError> {
        let (logical_shift, physical_shift) = self.block_shifts()?;
        if size_bytes < self.logical_block_bytes as u64 {
            return Err(UblkError::Config(format!(
                "an export of {size_bytes} bytes is smaller than one block"
            )));
        }
        let mut attrs = sys::ATTR_VOLATILE_CACHE | sys::ATTR_FUA;
        if read_only {
            attrs |= sys::ATTR_READ_ONLY;
        }
        let max_sectors = self.max_io_bytes / sys::SECTOR_BYTES as u32;
        let granularity = self.physical_block_bytes.max(self.io_min_bytes);
        Ok(sys::Params {
            len: std::mem::size_of::<sys::Params>() as u32,
            types: sys::PARAM_TYPE_BASIC | sys::PARAM_TYPE_DISCARD,
            basic: sys::ParamBasic {
                attrs,
                logical_bs_shift: logical_shift,
                physical_bs_shift: physical_shift,
                io_opt_shift: shift_of("optimal I/O size", self.io_opt_bytes)?,
                io_min_shift: shift_of("minimum I/O size", self.io_min_bytes)?,
                max_sectors,
                chunk_sectors: 0,
                // Whole logical blocks only: a partial last block could not be addressed.
                dev_sectors: size_bytes / self.logical_block_bytes as u64
                    * (self.logical_block_bytes as u64 / sys::SECTOR_BYTES),
                virt_boundary_mask: 0,
            },
            discard: sys::ParamDiscard {
                discard_alignment: 0,
                discard_granularity: granularity,
                max_discard_sectors: max_sectors,
                max_write_zeroes_sectors: max_sectors,
                max_discard_segments: 1,
                reserved0: 0,
            },
        })
    }
}

/// A started ublk device serving an export; [`UblkDevice::stop`] (or dropping it) removes the device.
pub struct UblkDevice {
    control: Control,
    dev_id: u32,
    queues: Vec<QueueHandle>,
    cdev: Option<Arc<File>>,
    stopped: bool,
}

/// What the device did, reported by [`UblkDevice::stop`]: its queues' counts summed.
pub type UblkStats = QueueStats;

/// Polls for a device node the kernel creates asynchronously (devtmpfs, or udev).
fn wait_for_node(path: &Path, timeout: Duration) -> io::Result<()> {
    let started = Instant::now();
    while !path.exists() {
        if started.elapsed() > timeout {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("did not appear within {} s", timeout.as_secs()),
            ));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(())
}

const NODE_TIMEOUT: Duration = Duration::from_secs(10);

/// Whether an existing device with our fixed id is one to take over (its server died); false when it is ours
/// but idle (never started, or stopped); an error when it is someone else's, live, or does not fit the export.
fn recoverable(
    control: &mut Control,
    dev_id: u32,
    existing: &sys::DevInfo,
    config: &UblkConfig,
    params: &sys::Params,
) -> Result<bool, UblkError> {
    takeover_decision(
        dev_id,
        existing,
        config.owner_tag,
        params.basic.dev_sectors,
        || control.params(dev_id).map(|p| p.basic.dev_sectors),
    )
}

/// The decision of `recoverable`, apart from the kernel: `their_sectors` asks the device's size only when the
/// answer depends on it.
fn takeover_decision(
    dev_id: u32,
    existing: &sys::DevInfo,
    owner_tag: u64,
    our_sectors: u64,
    their_sectors: impl FnOnce() -> Result<u64, UblkError>,
) -> Result<bool, UblkError> {
    let refuse = |why: String| Err(UblkError::Config(format!("ublk device {dev_id}: {why}")));
    if existing.ublksrv_flags != owner_tag {
        return refuse(format!(
            "it exists and belongs to another server (owner tag {:016x}, ours {:016x}); pick another id, or stop \
             what serves it",
            existing.ublksrv_flags, owner_tag
        ));
    }
    match existing.state {
        sys::S_DEV_DEAD => Ok(false),
        sys::S_DEV_LIVE => refuse(format!(
            "it is live, served by pid {}; stop that server first",
            existing.ublksrv_pid
        )),
        sys::S_DEV_QUIESCED | sys::S_DEV_FAIL_IO => {
            if existing.flags & sys::F_USER_RECOVERY == 0 {
                return refuse(
                    "its server died and it was not set up to be taken over; delete it".into(),
                );
            }
            let theirs = their_sectors()?;
            if theirs != our_sectors {
                return refuse(format!(
                    "it waits for a server of {theirs} sectors, this export has {our_sectors}"
                ));
            }
            Ok(true)
        }
        other => refuse(format!(
            "it is in state {other}, which this server does not know"
        )),
    }
}

/// What [`delete_device`] found and did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeletedDevice {
    pub dev_id: u32,
    /// The server that last served it (no longer running).
    pub server_pid: i32,
    /// It was waiting for a takeover: the I/O that waited on it has failed.
    pub was_waiting: bool,
}

/// Removes a device whose server is gone: one served with a fixed id waits for a takeover for ever, and this is
/// how a user gives up on it (its waiting I/O then fails with errors, and the id is free again). A device whose
/// server still runs is refused: stopping that server removes it cleanly.
pub fn delete_device(control_path: &Path, dev_id: u32) -> Result<DeletedDevice, UblkError> {
    let mut control = Control::open(control_path)?;
    let info = control.device_info(dev_id)?.ok_or_else(|| {
        UblkError::Config(format!("ublk device {dev_id}: there is no such device"))
    })?;
    // SAFETY: kill with signal 0 only asks whether the process exists.
    let server_runs = info.ublksrv_pid > 0 && unsafe { libc::kill(info.ublksrv_pid, 0) } == 0;
    if info.state == sys::S_DEV_LIVE && server_runs {
        return Err(UblkError::Config(format!(
            "ublk device {dev_id}: it is served by pid {}, which is running; stop that server (SIGTERM) instead",
            info.ublksrv_pid
        )));
    }
    if info.state != sys::S_DEV_DEAD {
        control.stop_device(dev_id)?;
    }
    control.delete_device(dev_id)?;
    Ok(DeletedDevice {
        dev_id,
        server_pid: info.ublksrv_pid,
        was_waiting: matches!(info.state, sys::S_DEV_QUIESCED | sys::S_DEV_FAIL_IO),
    })
}

/// How `bring_up` ends: a new device is started, a recovered one has its recovery ended.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Finish {
    Start,
    EndRecovery,
}

impl UblkDevice {
    /// Adds a ublk device for `export`, starts its queues and the block device. On any failure the device is
    /// deleted again before the error returns. With a fixed id whose device is waiting for a new server (the
    /// last one died), the device is taken over instead, and its waiting I/O resumes.
    pub fn start(export: Arc<dyn Export>, config: &UblkConfig) -> Result<UblkDevice, UblkError> {
        let params = config.params(export.size_bytes(), export.read_only())?;
        let mut control = Control::open(&config.control_path)?;
        if let Some(dev_id) = config.dev_id {
            if let Some(existing) = control.device_info(dev_id)? {
                if recoverable(&mut control, dev_id, &existing, config, &params)? {
                    return UblkDevice::recover(control, export, config, existing);
                }
                // Ours, but never started or already stopped: clear it and add it anew.
                control.delete_device(dev_id)?;
            }
        }
        let mut flags = sys::F_CMD_IOCTL_ENCODE;
        if config.dev_id.is_some() {
            flags |= sys::F_USER_RECOVERY | sys::F_USER_RECOVERY_REISSUE;
        }
        let mut info = sys::DevInfo {
            nr_hw_queues: config.queues,
            queue_depth: config.depth,
            max_io_buf_bytes: config.max_io_bytes,
            dev_id: config.dev_id.unwrap_or(ctrl::ANY_DEV_ID),
            flags,
            ublksrv_flags: config.owner_tag,
            ..sys::DevInfo::default()
        };
        control.add_device(&mut info)?;
        let mut device = UblkDevice {
            control,
            dev_id: info.dev_id,
            queues: Vec::new(),
            cdev: None,
            stopped: false,
        };
        match device.bring_up(export, config, Some(&params), &info, Finish::Start) {
            Ok(()) => Ok(device),
            Err(error) => {
                if let Err(cleanup) = device.shut_down(false) {
                    log::warn!(
                        "ublk: removing device {} after a failed start: {cleanup}",
                        device.dev_id
                    );
                }
                Err(error)
            }
        }
    }

    /// Takes over a device whose server died. If that fails, the device is left waiting (not deleted), so that
    /// its I/O can still resume under another try.
    fn recover(
        mut control: Control,
        export: Arc<dyn Export>,
        config: &UblkConfig,
        info: sys::DevInfo,
    ) -> Result<UblkDevice, UblkError> {
        control.start_recovery(info.dev_id)?;
        let mut device = UblkDevice {
            control,
            dev_id: info.dev_id,
            queues: Vec::new(),
            cdev: None,
            stopped: false,
        };
        match device.bring_up(export, config, None, &info, Finish::EndRecovery) {
            Ok(()) => {
                log::warn!(
                    "ublk: device {} taken over from server pid {}: its waiting I/O resumes",
                    info.dev_id,
                    info.ublksrv_pid
                );
                Ok(device)
            }
            Err(error) => {
                device.stopped = true;
                let _ = device.end_queues();
                Err(error)
            }
        }
    }

    fn bring_up(
        &mut self,
        export: Arc<dyn Export>,
        config: &UblkConfig,
        params: Option<&sys::Params>,
        info: &sys::DevInfo,
        finish: Finish,
    ) -> Result<(), UblkError> {
        let dev_id = self.dev_id;
        if let Some(params) = params {
            self.control.set_params(dev_id, params)?;
        }
        let cdev_path = ctrl::char_device_path(dev_id);
        let open_failed = |source| UblkError::OpenCharDevice {
            path: cdev_path.clone(),
            source,
        };
        wait_for_node(&cdev_path, NODE_TIMEOUT).map_err(open_failed)?;
        let cdev = Arc::new(
            OpenOptions::new()
                .read(true)
                .write(true)
                .open(&cdev_path)
                .map_err(open_failed)?,
        );
        self.cdev = Some(cdev.clone());
        // The kernel may grant fewer queues or a smaller depth than asked; serve what it granted.
        let (ready_tx, ready_rx) = mpsc::channel();
        for q_id in 0..info.nr_hw_queues {
            let spec = QueueSpec {
                q_id,
                depth: info.queue_depth,
                buf_bytes: info.max_io_buf_bytes as usize,
                workers: config.workers_per_queue,
                serve_inline_when_idle: config.serve_inline_when_idle,
                merge_write_bytes: config.merge_write_bytes,
                whole_write_bytes: config.whole_write_bytes,
                gather_reads: config.gather_reads,
            };
            let handle = queue::spawn(spec, cdev.clone(), export.clone(), ready_tx.clone())?;
            self.queues.push(handle);
        }
        drop(ready_tx);
        for _ in 0..info.nr_hw_queues {
            match ready_rx.recv() {
                Ok((_, Ok(()))) => {}
                Ok((queue, Err(source))) => return Err(UblkError::Queue { queue, source }),
                Err(_) => {
                    return Err(UblkError::Queue {
                        queue: 0,
                        source: io::Error::other("a queue thread ended before it was ready"),
                    })
                }
            }
        }
        let pid = std::process::id() as i32;
        match finish {
            Finish::Start => self.control.start_device(dev_id, pid)?,
            Finish::EndRecovery => self.control.end_recovery(dev_id, pid)?,
        }
        let block_path = ctrl::block_device_path(dev_id);
        wait_for_node(&block_path, NODE_TIMEOUT).map_err(|source| UblkError::OpenCharDevice {
            path: block_path,
            source,
        })?;
        log::info!(
            "ublk: device {dev_id} serving: {} queue(s) of depth {}, requests up to {} KiB{}",
            info.nr_hw_queues,
            info.queue_depth,
            info.max_io_buf_bytes / 1024,
            if info.flags & sys::F_USER_RECOVERY != 0 {
                "; it outlives a crash of this server"
            } else {
                ""
            }
        );
        Ok(())
    }

    pub fn dev_id(&self) -> u32 {
        self.dev_id
    }

    /// The block device a filesystem or database opens.
    pub fn block_path(&self) -> PathBuf {
        ctrl::block_device_path(self.dev_id)
    }

    /// Whether every queue is still serving (a queue ends only on stop or when its ring fails).
    pub fn serving(&self) -> bool {
        !self.queues.is_empty() && self.queues.iter().all(QueueHandle::is_running)
    }

    /// Removes the block device (requests in flight are answered first), ends the queues, deletes the device.
    pub fn stop(mut self) -> Result<UblkStats, UblkError> {
        self.shut_down(true)
    }

    /// Asks every queue to end, waits for them, and sums what they did; the first queue's error, if any.
    fn end_queues(&mut self) -> (UblkStats, Option<UblkError>) {
        for queue in &self.queues {
            queue.request_stop();
        }
        let mut stats = UblkStats::default();
        let mut first_error = None;
        for (q_id, queue) in self.queues.iter_mut().enumerate() {
            match queue.join(q_id as u16) {
                Ok(q) => stats.add(&q),
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        self.queues.clear();
        (stats, first_error)
    }

    fn shut_down(&mut self, started: bool) -> Result<UblkStats, UblkError> {
        if self.stopped {
            return Ok(UblkStats::default());
        }
        self.stopped = true;
        // STOP_DEV returns once the block device is gone; the queues keep serving until then.
        let stopped = if started {
            self.control.stop_device(self.dev_id)
        } else {
            Ok(())
        };
        let (stats, queue_error) = self.end_queues();
        let mut first_error = stopped.err().or(queue_error);
        // DEL_DEV waits until the character device is closed and unmapped, so close it first.
        self.cdev = None;
        if let Err(e) = self.control.delete_device(self.dev_id) {
            first_error.get_or_insert(e);
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(stats),
        }
    }
}

impl Drop for UblkDevice {
    fn drop(&mut self) {
        if let Err(e) = self.shut_down(true) {
            log::warn!("ublk: removing device {}: {e}", self.dev_id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params_describe_the_export_and_the_requests() {
        let config = UblkConfig {
            io_min_bytes: 64 * 1024,
            io_opt_bytes: 256 * 1024,
            ..UblkConfig::default()
        };
        let params = config.params(10 * (1 << 30) + 1000, false).unwrap();
        assert_eq!(
            params.types,
            sys::PARAM_TYPE_BASIC | sys::PARAM_TYPE_DISCARD
        );
        assert_eq!(params.len, 64);
        let basic = params.basic;
        assert_eq!(basic.dev_sectors, 10 * (1 << 30) / 512 + 1);
        assert_eq!(basic.attrs, sys::ATTR_VOLATILE_CACHE | sys::ATTR_FUA);
        assert_eq!((basic.logical_bs_shift, basic.physical_bs_shift), (9, 12));
        assert_eq!((basic.io_min_shift, basic.io_opt_shift), (16, 18));
        assert_eq!(basic.max_sectors, DEFAULT_MAX_IO_BYTES / 512);
        assert_eq!(params.discard.discard_granularity, 64 * 1024);
        assert_eq!(params.discard.max_discard_segments, 1);
        let read_only = config.params(1 << 20, true).unwrap();
        assert_ne!(read_only.basic.attrs & sys::ATTR_READ_ONLY, 0);
    }

    #[test]
    fn a_4k_logical_block_counts_whole_blocks_only() {
        let config = UblkConfig {
            logical_block_bytes: 4096,
            ..UblkConfig::default()
        };
        let params = config.params(3 * 4096 + 512, false).unwrap();
        assert_eq!(params.basic.dev_sectors, 3 * 8);
    }

    #[test]
    fn bad_settings_are_refused_with_what_is_wrong() {
        let refused = |config: UblkConfig| match config.params(1 << 30, false) {
            Err(UblkError::Config(message)) => message,
            other => panic!("expected a refusal, got {other:?}"),
        };
        let cases = [
            (
                UblkConfig {
                    io_opt_bytes: 5 * 64 * 1024,
                    ..UblkConfig::default()
                },
                "power of two",
            ),
            (
                UblkConfig {
                    depth: 0,
                    ..UblkConfig::default()
                },
                "at least 1",
            ),
            (
                UblkConfig {
                    depth: 5000,
                    ..UblkConfig::default()
                },
                "at most 4096",
            ),
            (
                UblkConfig {
                    physical_block_bytes: 512,
                    logical_block_bytes: 4096,
                    ..UblkConfig::default()
                },
                "physical at least logical",
            ),
            (
                UblkConfig {
                    max_io_bytes: 6000,
                    ..UblkConfig::default()
                },
                "multiple of 4096",
            ),
        ];
        for (config, needle) in cases {
            let message = refused(config);
            assert!(message.contains(needle), "{needle}: {message}");
        }
    }

    #[test]
    fn only_a_waiting_device_of_the_same_owner_and_size_is_taken_over() {
        let info = |state: u16, flags: u64, owner: u64| sys::DevInfo {
            state,
            flags,
            ublksrv_flags: owner,
            ublksrv_pid: 4242,
            ..sys::DevInfo::default()
        };
        let recovery = sys::F_USER_RECOVERY | sys::F_USER_RECOVERY_REISSUE;
        let size = || Ok(1000);
        let decide = |existing: &sys::DevInfo| takeover_decision(7, existing, 0xabc, 1000, size);
        let refusal = |result: Result<bool, UblkError>| match result {
            Err(UblkError::Config(message)) => message,
            other => panic!("expected a refusal, got {other:?}"),
        };
        assert!(decide(&info(sys::S_DEV_QUIESCED, recovery, 0xabc)).unwrap());
        assert!(decide(&info(sys::S_DEV_FAIL_IO, recovery, 0xabc)).unwrap());
        // Ours and idle: cleared and added anew, not taken over.
        assert!(!decide(&info(sys::S_DEV_DEAD, recovery, 0xabc)).unwrap());
        let message = refusal(decide(&info(sys::S_DEV_QUIESCED, recovery, 0xdef)));
        assert!(message.contains("belongs to another server"), "{message}");
        let message = refusal(decide(&info(sys::S_DEV_LIVE, recovery, 0xabc)));
        assert!(message.contains("live, served by pid 4242"), "{message}");
        let message = refusal(decide(&info(sys::S_DEV_QUIESCED, 0, 0xabc)));
        assert!(message.contains("not set up to be taken over"), "{message}");
        let other_size = takeover_decision(
            7,
            &info(sys::S_DEV_QUIESCED, recovery, 0xabc),
            0xabc,
            2000,
            size,
        );
        let message = refusal(other_size);
        assert!(
            message.contains("1000 sectors, this export has 2000"),
            "{message}"
        );
        // The size is asked only when it decides.
        let never = || -> Result<u64, UblkError> { panic!("the size was asked for a live device") };
        assert!(
            takeover_decision(7, &info(sys::S_DEV_LIVE, recovery, 0xabc), 0xabc, 1, never).is_err()
        );
    }

    #[test]
    fn a_missing_driver_says_how_to_load_it() {
        let config = UblkConfig {
            control_path: PathBuf::from("/nonexistent/ublk-control"),
            ..UblkConfig::default()
        };
        let export = Arc::new(paraid_nbd::MemoryExport::new(1 << 20));
        match UblkDevice::start(export, &config) {
            Err(error @ UblkError::OpenControl { .. }) => {
                assert!(error.to_string().contains("modprobe ublk_drv"), "{error}")
            }
            Err(other) => panic!("expected OpenControl, got {other}"),
            Ok(_) => panic!("a device started without a control node"),
        }
    }
}
