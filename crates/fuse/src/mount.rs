//! The mount: /dev/fuse opened, a FUSE file system mounted on a regular file with that descriptor, and the ways
//! to end it (unmount; abort the connection where a process still holds the file open).

use std::ffi::CString;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

use crate::error::FuseError;

const DEVICE_PATH: &str = "/dev/fuse";
/// Where the kernel's fusectl file system lists connections (each with an `abort` file).
const CONNECTIONS_PATH: &str = "/sys/fs/fuse/connections";

/// A mounted FUSE file system whose root is the file at `path`.
#[derive(Debug)]
pub struct Mount {
    pub path: PathBuf,
    pub device: File,
    /// The connection's number under /sys/fs/fuse/connections.
    connection: Option<u32>,
    mounted: bool,
}

fn cstring(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a path with a NUL byte"))
}

/// Whether the array can be served over `path`: a regular file, or a new one in a folder that exists (what
/// `FuseFile::start` creates). Nothing is created or mounted; a frontend's caller can ask before it assembles
/// anything.
pub fn check_mount_file(path: &Path) -> Result<(), FuseError> {
    let refused = |why: String| FuseError::MountPoint {
        path: path.to_owned(),
        source: io::Error::new(io::ErrorKind::InvalidInput, why),
    };
    match std::fs::metadata(path) {
        Ok(meta) if meta.is_file() => Ok(()),
        Ok(_) => Err(refused(
            "not a regular file (the array is mounted over a file, which then stands for it)"
                .into(),
        )),
        Err(_) => {
            let folder = path
                .parent()
                .filter(|p| !p.as_os_str().is_empty())
                .unwrap_or(Path::new("."));
            if folder.is_dir() {
                Ok(())
            } else {
                Err(refused(format!(
                    "a file in {}, which is no folder",
                    folder.display()
                )))
            }
        }
    }
}

impl Mount {
    /// Mounts on `path`, which must be a regular file (the mount's root stands in for it). Root only: mount(2)
    /// of FUSE without fusermount needs CAP_SYS_ADMIN.
    pub fn new(path: &Path, max_read_bytes: u32) -> Result<Mount, FuseError> {
        check_mount_file(path)?;
        if !path.exists() {
            return Err(FuseError::MountPoint {
                path: path.to_owned(),
                source: io::Error::from(io::ErrorKind::NotFound),
            });
        }
        let device = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_CLOEXEC)
            .open(DEVICE_PATH)
            .map_err(|source| FuseError::OpenDevice { source })?;
        // SAFETY: geteuid and getegid have no preconditions.
        let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
        let options = format!(
            "fd={},rootmode=100000,user_id={uid},group_id={gid},default_permissions,allow_other,max_read={max_read_bytes}",
            device.as_raw_fd()
        );
        let target = cstring(path).map_err(|source| FuseError::Mount {
            path: path.to_owned(),
            source,
        })?;
        let source_name = CString::new("paraid").expect("no NUL");
        let fs_type = CString::new("fuse.paraid").expect("no NUL");
        let options = CString::new(options).expect("no NUL");
        // SAFETY: every pointer is a valid NUL-terminated string that outlives the call.
        let mounted = unsafe {
            libc::mount(
                source_name.as_ptr(),
                target.as_ptr(),
                fs_type.as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV,
                options.as_ptr().cast(),
            )
        };
        if mounted != 0 {
            return Err(FuseError::Mount {
                path: path.to_owned(),
                source: io::Error::last_os_error(),
            });
        }
        Ok(Mount {
            path: path.to_owned(),
            device,
            connection: None,
            mounted: true,
        })
    }

    /// Learns the connection's number from the mount's device number (major 0: the number is the minor). A
    /// look at the mounted file waits for the kernel's INIT to be answered, so only once workers serve.
    pub fn learn_connection(&mut self) {
        self.connection = std::fs::metadata(&self.path)
            .ok()
            .filter(|m| libc::major(m.dev()) == 0)
            .map(|m| libc::minor(m.dev()));
    }

    /// Detaches the mount from the tree. The file system ends (and the workers' reads fail with ENODEV) once
    /// nothing holds the file open; a loop device over it keeps it until detached.
    pub fn unmount(&mut self) -> Result<(), FuseError> {
        if !self.mounted {
            return Ok(());
        }
        let target = cstring(&self.path).map_err(|source| FuseError::Unmount {
            path: self.path.clone(),
            source,
        })?;
        // SAFETY: a valid NUL-terminated path.
        if unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) } != 0 {
            let source = io::Error::last_os_error();
            if source.raw_os_error() != Some(libc::EINVAL) {
                return Err(FuseError::Unmount {
                    path: self.path.clone(),
                    source,
                });
            }
            // EINVAL: no longer a mount point (someone unmounted it).
        }
        self.mounted = false;
        Ok(())
    }

    /// Ends the connection at once, as a crash of the server would: requests in flight and later ones fail
    /// with ENOTCONN. For a stop while a process (a loop device) still holds the file open.
    pub fn abort(&self) -> Result<(), FuseError> {
        let Some(connection) = self.connection else {
            return Err(FuseError::Abort {
                source: io::Error::new(
                    io::ErrorKind::NotFound,
                    "the connection's number is unknown",
                ),
            });
        };
        let connections = Path::new(CONNECTIONS_PATH);
        let abort_path = connections.join(connection.to_string()).join("abort");
        if !abort_path.exists() {
            // fusectl not mounted yet.
            let fs = CString::new("fusectl").expect("no NUL");
            let target = cstring(connections).map_err(|source| FuseError::Abort { source })?;
            // SAFETY: valid NUL-terminated strings; no data.
            unsafe {
                libc::mount(
                    fs.as_ptr(),
                    target.as_ptr(),
                    fs.as_ptr(),
                    0,
                    std::ptr::null(),
                )
            };
        }
        std::fs::write(&abort_path, b"1").map_err(|source| FuseError::Abort { source })
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        if let Err(error) = self.unmount() {
            log::warn!("{error}");
        }
    }
}
