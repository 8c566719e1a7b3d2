//! Where connections come from: a Unix socket path, a TCP address, or a socket handed over by systemd-style
//! socket activation (LISTEN_PID / LISTEN_FDS, first descriptor 3), as `nbdinfo -- [ CMD ]` and systemd do.

use std::io;
use std::net::{SocketAddr, TcpListener};
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use crate::error::NbdError;
use crate::stream::Stream;

/// What `Server::serve` listens on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Listener {
    /// Bind this Unix socket path (a stale socket file nobody answers on is replaced; removed again at exit).
    Unix(PathBuf),
    /// Bind this TCP address.
    Tcp(SocketAddr),
    /// Use the listening socket this process inherited through socket activation.
    Inherited,
}

/// An already-listening socket.
#[derive(Debug)]
pub enum BoundListener {
    Unix(UnixListener),
    Tcp(TcpListener),
}

impl BoundListener {
    pub(crate) fn set_nonblocking(&self) -> io::Result<()> {
        match self {
            BoundListener::Unix(l) => l.set_nonblocking(true),
            BoundListener::Tcp(l) => l.set_nonblocking(true),
        }
    }

    pub(crate) fn accept(&self) -> io::Result<Stream> {
        Ok(match self {
            BoundListener::Unix(l) => Stream::Unix(l.accept()?.0),
            BoundListener::Tcp(l) => Stream::Tcp(l.accept()?.0),
        })
    }
}

impl AsRawFd for BoundListener {
    fn as_raw_fd(&self) -> RawFd {
        match self {
            BoundListener::Unix(l) => l.as_raw_fd(),
            BoundListener::Tcp(l) => l.as_raw_fd(),
        }
    }
}

/// Binds a Unix socket at `path`, after `clear_stale_socket`.
pub(crate) fn bind_unix(path: &Path) -> Result<UnixListener, NbdError> {
    let bind_error = |source| NbdError::BindUnix {
        path: path.to_path_buf(),
        source,
    };
    clear_stale_socket(path).map_err(bind_error)?;
    UnixListener::bind(path).map_err(bind_error)
}

/// Makes `path` free for a Unix socket: a socket file that refuses connections is left over from a dead server
/// and is removed; one that accepts belongs to a live server (`AddrInUse`), and any other kind of file is
/// refused (`AlreadyExists`) and left alone (connecting to a regular file is refused as to a dead socket, so
/// the kind is checked first).
pub fn clear_stale_socket(path: &Path) -> io::Result<()> {
    let Ok(metadata) = std::fs::symlink_metadata(path) else {
        let parent = path.parent().filter(|p| !p.as_os_str().is_empty());
        if parent.is_some_and(|dir| !dir.is_dir()) {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                "its directory does not exist",
            ));
        }
        return Ok(());
    };
    if !metadata.file_type().is_socket() {
        return Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            "the path exists and is not a socket",
        ));
    }
    match UnixStream::connect(path) {
        Ok(_) => Err(io::Error::new(
            io::ErrorKind::AddrInUse,
            "another server listens on this socket",
        )),
        Err(error) if error.kind() == io::ErrorKind::ConnectionRefused => {
            std::fs::remove_file(path)
        }
        Err(error) => Err(error),
    }
}

/// The (device, inode) of the file at `path`: recorded when a socket is bound, so that it is recognised later.
pub fn socket_file_identity(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(path)
        .ok()
        .map(|m| (m.dev(), m.ino()))
}

/// Removes the socket file at `path` if it is still the one bound here (`identity`, from
/// `socket_file_identity`); returns whether it did. A server started on the same path while this one was shutting
/// down has replaced the file (taking the old one for a dead server's), and removing it would leave that server
/// unreachable.
pub fn remove_socket_file(path: &Path, identity: Option<(u64, u64)>) -> io::Result<bool> {
    if identity.is_none() || socket_file_identity(path) != identity {
        return Ok(false);
    }
    std::fs::remove_file(path).map(|()| true)
}

pub(crate) fn bind_tcp(addr: SocketAddr) -> Result<TcpListener, NbdError> {
    TcpListener::bind(addr).map_err(|source| NbdError::BindTcp { addr, source })
}

/// The first descriptor socket activation passes (SD_LISTEN_FDS_START).
const LISTEN_FDS_START: RawFd = 3;

/// Whether descriptor 3 has been wrapped in an owning listener already: it may be owned once only.
static INHERITED_TAKEN: AtomicBool = AtomicBool::new(false);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SocketFamily {
    Unix,
    Inet,
}

/// A listening socket this process was handed through socket activation (not owned: see `Listener::Inherited`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InheritedSocket {
    pub fd: RawFd,
    pub family: SocketFamily,
}

/// LISTEN_FDS / LISTEN_PID (systemd socket activation): `Some(fd 3 listener)` when this process was given one,
/// i.e. LISTEN_PID is this process, LISTEN_FDS >= 1 and descriptor 3 is a listening stream socket. Only looks:
/// serving it takes `Listener::Inherited`.
pub fn listener_from_systemd() -> Option<InheritedSocket> {
    let pid: u32 = std::env::var("LISTEN_PID").ok()?.trim().parse().ok()?;
    if pid != std::process::id() {
        return None;
    }
    let count: u32 = std::env::var("LISTEN_FDS").ok()?.trim().parse().ok()?;
    if count == 0 {
        return None;
    }
    if count > 1 {
        log::warn!(
            "socket activation passed {count} sockets; serving only the first (descriptor 3)"
        );
    }
    let family = listening_stream_family(LISTEN_FDS_START)?;
    Some(InheritedSocket {
        fd: LISTEN_FDS_START,
        family,
    })
}

/// The family of `fd` if it is a listening stream socket (Unix or IP), else `None`.
fn listening_stream_family(fd: RawFd) -> Option<SocketFamily> {
    let int_option = |level, name| {
        let mut value: libc::c_int = 0;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: value/len describe a c_int the kernel may write; a bad fd just returns -1.
        let rc = unsafe {
            libc::getsockopt(
                fd,
                level,
                name,
                (&mut value as *mut libc::c_int).cast(),
                &mut len,
            )
        };
        (rc == 0).then_some(value)
    };
    if int_option(libc::SOL_SOCKET, libc::SO_TYPE)? != libc::SOCK_STREAM {
        return None;
    }
    if int_option(libc::SOL_SOCKET, libc::SO_ACCEPTCONN)? == 0 {
        return None;
    }
    match int_option(libc::SOL_SOCKET, libc::SO_DOMAIN)? {
        libc::AF_UNIX => Some(SocketFamily::Unix),
        libc::AF_INET | libc::AF_INET6 => Some(SocketFamily::Inet),
        _ => None,
    }
}

/// Wraps the inherited descriptor in an owning listener (once per process), close-on-exec so that nothing this
/// process starts inherits it in turn.
pub(crate) fn take_inherited() -> Result<BoundListener, NbdError> {
    let socket = listener_from_systemd().ok_or(NbdError::InheritListener)?;
    if INHERITED_TAKEN.swap(true, Ordering::SeqCst) {
        return Err(NbdError::InheritListener);
    }
    // SAFETY: fcntl on a descriptor we just checked is an open socket.
    unsafe {
        let flags = libc::fcntl(socket.fd, libc::F_GETFD);
        if flags >= 0 {
            libc::fcntl(socket.fd, libc::F_SETFD, flags | libc::FD_CLOEXEC);
        }
    }
    // SAFETY: descriptor 3 was handed to this process to own; INHERITED_TAKEN makes this the only owner.
    Ok(match socket.family {
        SocketFamily::Unix => BoundListener::Unix(unsafe { UnixListener::from_raw_fd(socket.fd) }),
        SocketFamily::Inet => BoundListener::Tcp(unsafe { TcpListener::from_raw_fd(socket.fd) }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stale_socket_file_is_replaced_but_live_one_is_refused() {
        let dir = std::env::temp_dir().join(format!("paraid-nbd-listener-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("s.sock");
        let _ = std::fs::remove_file(&path);

        let live = bind_unix(&path).unwrap();
        assert!(matches!(bind_unix(&path), Err(NbdError::BindUnix { .. })));
        drop(live); // the file stays, nobody answers: stale
        assert!(path.exists());
        let again = bind_unix(&path).unwrap();
        drop(again);

        let regular = dir.join("regular");
        std::fs::write(&regular, b"x").unwrap();
        assert!(matches!(
            bind_unix(&regular),
            Err(NbdError::BindUnix { .. })
        ));
        assert_eq!(std::fs::read(&regular).unwrap(), b"x");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn listening_family_is_detected_and_other_descriptors_rejected() {
        let tcp = TcpListener::bind("127.0.0.1:0").unwrap();
        assert_eq!(
            listening_stream_family(tcp.as_raw_fd()),
            Some(SocketFamily::Inet)
        );
        let connected = std::net::TcpStream::connect(tcp.local_addr().unwrap()).unwrap();
        assert_eq!(listening_stream_family(connected.as_raw_fd()), None);
        let file = std::fs::File::open("/proc/self/status").unwrap();
        assert_eq!(listening_stream_family(file.as_raw_fd()), None);
    }
}
