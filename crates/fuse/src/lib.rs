//! paraid's FUSE frontend: serves an [`Export`] as one regular file, a FUSE file system mounted over a file, so
//! that a loop device (`losetup`) makes it a block device on a kernel with neither nbd nor ublk (containers,
//! minimal kernels). What `nbdfuse` does for an NBD export, in the server's own process: no NBD client, no
//! socket, no second process between the kernel and the array.
//!
//! - [`mount`]: the control plane (open /dev/fuse, mount over the file, unmount, abort the connection).
//! - [`serve`]: the data plane (worker threads reading requests from /dev/fuse; each serves what it read).
//!
//! What it promises, and what it leans on:
//! - Every request is answered with what the export did: a READ's bytes or a WRITE's success only when the
//!   export returned success (or, in journal mode, once the export says the write may be answered), a
//!   negative errno otherwise. Nothing is acknowledged early.
//! - The file is opened for direct I/O (the kernel keeps no page cache of it and sends each read and write as it
//!   comes, writes in parallel), so what a filesystem above writes reaches the array when it says so: `fsync`
//!   (a loop device's FLUSH) is the export's flush, and a write on a file opened O_DSYNC is a FUA write.
//! - Holes punched and ranges zeroed (a loop device's discards and write-zeroes) read back as zeroes.
//! - The file's size is the export's and cannot change; a write past its end fails with ENOSPC.
//! - If this process dies, the kernel fails the file's outstanding and later I/O (ENOTCONN): a client sees
//!   errors, never stale data.

mod error;
pub mod mount;
mod proto;
mod serve;

use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

pub use error::FuseError;
pub use paraid_nbd::Export;

use mount::Mount;
use serve::Shared;

/// Worker threads when none is asked for: each serves one request at a time, so this bounds the requests the
/// array sees at once.
pub const DEFAULT_WORKERS: usize = 16;
/// The largest read or write the kernel sends (FUSE's limit is 256 pages).
pub const DEFAULT_MAX_IO_BYTES: u32 = 1 << 20;
/// How long `stop` waits for the file to be released before it aborts the connection.
const RELEASE_WAIT: Duration = Duration::from_secs(2);

#[derive(Debug, Clone)]
pub struct FuseConfig {
    pub workers: usize,
    pub max_io_bytes: u32,
}

impl Default for FuseConfig {
    fn default() -> Self {
        FuseConfig {
            workers: DEFAULT_WORKERS,
            max_io_bytes: DEFAULT_MAX_IO_BYTES,
        }
    }
}

/// Counters of a served file.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FuseStats {
    pub requests: u64,
    /// Requests answered with an error.
    pub failed: u64,
    /// Whether `stop` had to abort the connection (a process still held the file open).
    pub aborted: bool,
}

/// An export served as the file at a path.
pub struct FuseFile {
    mount: Mount,
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
}

impl FuseFile {
    /// Mounts over `path` (a regular file, created empty if absent; its mode, owner and group become the
    /// served file's) and serves `export` there until `stop`. Returns once the kernel's INIT is answered.
    pub fn start(
        export: Arc<dyn Export>,
        path: &Path,
        config: &FuseConfig,
    ) -> Result<FuseFile, FuseError> {
        let max_io_bytes = config.max_io_bytes.clamp(4096, DEFAULT_MAX_IO_BYTES) / 4096 * 4096;
        mount::check_mount_file(path)?;
        if !path.exists() {
            std::fs::File::create(path).map_err(|source| FuseError::MountPoint {
                path: path.to_owned(),
                source,
            })?;
        }
        let meta = std::fs::metadata(path).map_err(|source| FuseError::MountPoint {
            path: path.to_owned(),
            source,
        })?;
        let mut mode = libc::S_IFREG | (meta.mode() & 0o7777);
        if export.read_only() {
            mode &= !0o222;
        }
        let mut mount = Mount::new(path, max_io_bytes)?;
        let device = mount
            .device
            .try_clone()
            .map_err(|source| FuseError::OpenDevice { source })?;
        let shared = Arc::new(Shared {
            device,
            max_io_bytes,
            attr: proto::FileAttr {
                size_bytes: export.size_bytes(),
                mode,
                uid: meta.uid(),
                gid: meta.gid(),
                time_s: std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_secs()),
            },
            export,
            init: Mutex::new(None),
            ended: AtomicBool::new(false),
            requests: AtomicU64::new(0),
            failed: AtomicU64::new(0),
        });
        let mut workers = Vec::new();
        for index in 0..config.workers.max(1) {
            let worker_shared = shared.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("fuse-worker-{index}"))
                .spawn(move || serve::run_worker(&worker_shared));
            match spawned {
                Ok(handle) => workers.push(handle),
                Err(source) => {
                    let file = FuseFile {
                        mount,
                        shared,
                        workers,
                    };
                    let _ = file.stop();
                    return Err(FuseError::SpawnThread { source });
                }
            }
        }
        // A look at the mounted file waits for INIT to be answered.
        mount.learn_connection();
        let file = FuseFile {
            mount,
            shared,
            workers,
        };
        let init = file
            .shared
            .init
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        match init {
            Some(Ok(())) => Ok(file),
            Some(Err(reason)) => {
                let _ = file.stop();
                Err(FuseError::Init { reason })
            }
            None => {
                let _ = file.stop();
                Err(FuseError::Init {
                    reason: "the kernel sent no INIT".into(),
                })
            }
        }
    }

    pub fn path(&self) -> &Path {
        &self.mount.path
    }

    /// Whether the connection still serves (false once it was unmounted or aborted from outside).
    pub fn serving(&self) -> bool {
        !self.shared.ended.load(Ordering::Relaxed)
    }

    pub fn stats(&self) -> FuseStats {
        FuseStats {
            requests: self.shared.requests.load(Ordering::Relaxed),
            failed: self.shared.failed.load(Ordering::Relaxed),
            aborted: false,
        }
    }

    /// Unmounts and waits for the workers. Where a process still holds the file open (a loop device not yet
    /// detached) the connection is aborted after a short wait: its I/O then fails, as after a crash.
    pub fn stop(mut self) -> Result<FuseStats, FuseError> {
        let mut stats = self.stats();
        self.mount.unmount()?;
        let deadline = Instant::now() + RELEASE_WAIT;
        while self.workers.iter().any(|w| !w.is_finished()) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        if self.workers.iter().any(|w| !w.is_finished()) {
            log::warn!(
                "FUSE: {} is still held open (a loop device over it?); aborting its connection: its I/O fails",
                self.mount.path.display()
            );
            self.mount.abort()?;
            stats.aborted = true;
        }
        for worker in self.workers.drain(..) {
            let _ = worker.join();
        }
        let after = self.stats();
        stats.requests = after.requests;
        stats.failed = after.failed;
        Ok(stats)
    }
}

/// Whether this process can serve over FUSE here: /dev/fuse opens and it runs as root. For tests and the CLI's
/// message; `Err` says why not.
pub fn available() -> Result<(), String> {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
        .map_err(|e: io::Error| format!("/dev/fuse: {e}"))?;
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err("not root (mount(2) of FUSE needs CAP_SYS_ADMIN)".into());
    }
    Ok(())
}
