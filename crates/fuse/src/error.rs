//! Errors of the FUSE frontend, named after the action that failed, each with its cause.

use std::fmt;
use std::io;
use std::path::PathBuf;

#[derive(Debug)]
pub enum FuseError {
    /// The file to mount over is missing or not a regular file.
    MountPoint { path: PathBuf, source: io::Error },
    /// /dev/fuse could not be opened (no FUSE in the kernel, or not allowed).
    OpenDevice { source: io::Error },
    /// mount(2) failed (not root, or the file is in use as a mount point already).
    Mount { path: PathBuf, source: io::Error },
    /// The kernel's INIT could not be answered (a protocol older than this server serves).
    Init { reason: String },
    /// The mount could not be detached.
    Unmount { path: PathBuf, source: io::Error },
    /// The connection could not be aborted through fusectl.
    Abort { source: io::Error },
    /// A worker thread could not be started.
    SpawnThread { source: io::Error },
}

impl fmt::Display for FuseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FuseError::MountPoint { path, source } => {
                write!(f, "cannot serve over {}: {source}", path.display())
            }
            FuseError::OpenDevice { source } => write!(
                f,
                "cannot open /dev/fuse: {source} (is the fuse module loaded? `modprobe fuse`)"
            ),
            FuseError::Mount { path, source } => {
                let hint = if source.raw_os_error() == Some(libc::EPERM) {
                    " (serving over FUSE without fusermount needs root)"
                } else {
                    ""
                };
                write!(
                    f,
                    "cannot mount FUSE over {}: {source}{hint}",
                    path.display()
                )
            }
            FuseError::Init { reason } => write!(f, "FUSE INIT: {reason}"),
            FuseError::Unmount { path, source } => {
                write!(f, "cannot unmount {}: {source}", path.display())
            }
            FuseError::Abort { source } => write!(f, "cannot abort the FUSE connection: {source}"),
            FuseError::SpawnThread { source } => write!(f, "cannot start a FUSE worker: {source}"),
        }
    }
}

impl std::error::Error for FuseError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            FuseError::MountPoint { source, .. }
            | FuseError::OpenDevice { source }
            | FuseError::Mount { source, .. }
            | FuseError::Unmount { source, .. }
            | FuseError::Abort { source }
            | FuseError::SpawnThread { source } => Some(source),
            FuseError::Init { .. } => None,
        }
    }
}
