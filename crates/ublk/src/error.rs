//! Errors named after the action that failed, each carrying its source.

use std::fmt;
use std::io;
use std::path::PathBuf;

#[derive(Debug)]
pub enum UblkError {
    /// /dev/ublk-control could not be opened: no ublk_drv (or not root).
    OpenControl { path: PathBuf, source: io::Error },
    /// An io_uring could not be set up (the kernel lacks io_uring, or SQE128 for the control ring).
    SetupRing {
        purpose: &'static str,
        source: io::Error,
    },
    /// An admin command (ADD_DEV, SET_PARAMS, START_DEV, ...) failed.
    Command {
        command: &'static str,
        dev_id: u32,
        source: io::Error,
    },
    /// The device's character node did not appear or could not be opened.
    OpenCharDevice { path: PathBuf, source: io::Error },
    /// The queue's request descriptors could not be mapped.
    MapDescriptors { queue: u16, source: io::Error },
    /// A queue's thread failed while serving (its ring broke).
    Queue { queue: u16, source: io::Error },
    /// A setting is out of range.
    Config(String),
}

impl fmt::Display for UblkError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            UblkError::OpenControl { path, source } => write!(
                f,
                "opening {}: {source} (is the ublk_drv module loaded? `modprobe ublk_drv`, as root)",
                path.display()
            ),
            UblkError::SetupRing { purpose, source } => {
                write!(f, "setting up the io_uring for {purpose}: {source}")
            }
            UblkError::Command {
                command,
                dev_id,
                source,
            } => write!(f, "ublk {command} (device {dev_id}): {source}"),
            UblkError::OpenCharDevice { path, source } => {
                write!(f, "opening {}: {source}", path.display())
            }
            UblkError::MapDescriptors { queue, source } => {
                write!(f, "mapping the request descriptors of queue {queue}: {source}")
            }
            UblkError::Queue { queue, source } => write!(f, "serving queue {queue}: {source}"),
            UblkError::Config(message) => write!(f, "{message}"),
        }
    }
}

impl std::error::Error for UblkError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            UblkError::OpenControl { source, .. }
            | UblkError::SetupRing { source, .. }
            | UblkError::Command { source, .. }
            | UblkError::OpenCharDevice { source, .. }
            | UblkError::MapDescriptors { source, .. }
            | UblkError::Queue { source, .. } => Some(source),
            UblkError::Config(_) => None,
        }
    }
}
