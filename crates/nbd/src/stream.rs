//! One client connection (Unix or TCP) and the shutdown-aware reads the server makes on it.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// How often a blocked read looks at the shutdown flag.
pub(crate) const SHUTDOWN_POLL: Duration = Duration::from_millis(100);

/// A connected client socket.
#[derive(Debug)]
pub enum Stream {
    Unix(UnixStream),
    Tcp(TcpStream),
}

impl From<UnixStream> for Stream {
    fn from(stream: UnixStream) -> Self {
        Stream::Unix(stream)
    }
}

impl From<TcpStream> for Stream {
    fn from(stream: TcpStream) -> Self {
        Stream::Tcp(stream)
    }
}

impl Stream {
    pub fn try_clone(&self) -> io::Result<Stream> {
        Ok(match self {
            Stream::Unix(s) => Stream::Unix(s.try_clone()?),
            Stream::Tcp(s) => Stream::Tcp(s.try_clone()?),
        })
    }

    pub fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        match self {
            Stream::Unix(s) => s.shutdown(how),
            Stream::Tcp(s) => s.shutdown(how),
        }
    }

    /// Blocking mode, a bound on how long one reply may stall, and (TCP) no Nagle delay: replies are small
    /// and latency-bound.
    pub(crate) fn prepare(&self, write_timeout: Duration) -> io::Result<()> {
        match self {
            Stream::Unix(s) => {
                s.set_nonblocking(false)?;
                s.set_write_timeout(Some(write_timeout))
            }
            Stream::Tcp(s) => {
                s.set_nonblocking(false)?;
                s.set_nodelay(true)?;
                s.set_write_timeout(Some(write_timeout))
            }
        }
    }
}

impl AsRawFd for Stream {
    fn as_raw_fd(&self) -> RawFd {
        match self {
            Stream::Unix(s) => s.as_raw_fd(),
            Stream::Tcp(s) => s.as_raw_fd(),
        }
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Unix(s) => s.read(buf),
            Stream::Tcp(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Unix(s) => s.write(buf),
            Stream::Tcp(s) => s.write(buf),
        }
    }

    /// A reply's header and data go out in one `writev` (the default would send only the first buffer).
    fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        match self {
            Stream::Unix(s) => s.write_vectored(bufs),
            Stream::Tcp(s) => s.write_vectored(bufs),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Stream::Unix(s) => s.flush(),
            Stream::Tcp(s) => s.flush(),
        }
    }
}

/// Why a read of a whole message did not complete.
#[derive(Debug)]
pub(crate) enum ReadFailure {
    /// The peer closed the connection; `at_boundary` when it did so between messages (a clean end).
    Closed {
        at_boundary: bool,
    },
    /// The shutdown flag was raised while waiting.
    ShuttingDown,
    Io(io::Error),
}

impl ReadFailure {
    pub(crate) fn into_io(self) -> io::Error {
        match self {
            ReadFailure::Closed { .. } => io::Error::from(io::ErrorKind::UnexpectedEof),
            ReadFailure::ShuttingDown => {
                io::Error::new(io::ErrorKind::Interrupted, "server is shutting down")
            }
            ReadFailure::Io(error) => error,
        }
    }
}

/// Waits until `fd` is readable (or hung up), for at most `timeout`. `Ok(false)` on timeout.
pub(crate) fn wait_readable(fd: RawFd, timeout: Duration) -> io::Result<bool> {
    let mut pollfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    let timeout_ms = timeout.as_millis().min(i32::MAX as u128) as libc::c_int;
    loop {
        // SAFETY: one valid pollfd, count 1.
        let ready = unsafe { libc::poll(&mut pollfd, 1, timeout_ms) };
        if ready >= 0 {
            return Ok(ready > 0);
        }
        let error = io::Error::last_os_error();
        if error.kind() != io::ErrorKind::Interrupted {
            return Err(error);
        }
    }
}

/// Bytes the reader asks the socket for at once: several pipelined small requests (header plus payload) arrive
/// in one system call instead of two each.
const READ_AHEAD_BYTES: usize = 64 * 1024;

/// The reading half of a connection. Every socket read first waits in `poll` with a short timeout, so a server
/// that is shutting down notices within `SHUTDOWN_POLL` even when the client sends nothing (or stalls
/// mid-message). Small reads are served from a read-ahead buffer; large ones go straight to their destination.
pub(crate) struct StreamReader<'a> {
    stream: Stream,
    shutdown: &'a AtomicBool,
    read_ahead: Box<[u8]>,
    /// `read_ahead[start..end]` holds bytes received but not yet consumed.
    start: usize,
    end: usize,
    /// Waiting for data past this instant fails with `TimedOut` (the handshake's limit).
    deadline: Option<Instant>,
}

impl<'a> StreamReader<'a> {
    pub(crate) fn new(stream: Stream, shutdown: &'a AtomicBool) -> Self {
        StreamReader {
            stream,
            shutdown,
            read_ahead: vec![0u8; READ_AHEAD_BYTES].into_boxed_slice(),
            start: 0,
            end: 0,
            deadline: None,
        }
    }

    /// From now on, a read that has to wait past `deadline` fails with `TimedOut`; `None`: no limit.
    pub(crate) fn set_deadline(&mut self, deadline: Option<Instant>) {
        self.deadline = deadline;
    }

    /// Fills `buf` completely.
    pub(crate) fn read_exact(&mut self, buf: &mut [u8]) -> Result<(), ReadFailure> {
        let mut filled = self.take_buffered(buf);
        while filled < buf.len() {
            let missing = buf.len() - filled;
            if missing >= self.read_ahead.len() {
                let n = self.read_some(Some(&mut buf[filled..]), filled == 0)?;
                filled += n;
            } else {
                let n = self.read_some(None, filled == 0)?;
                debug_assert_eq!((self.start, self.end), (0, n));
                filled += self.take_buffered(&mut buf[filled..]);
            }
        }
        Ok(())
    }

    /// Copies buffered bytes into `buf`; returns how many.
    fn take_buffered(&mut self, buf: &mut [u8]) -> usize {
        let n = buf.len().min(self.end - self.start);
        buf[..n].copy_from_slice(&self.read_ahead[self.start..self.start + n]);
        self.start += n;
        n
    }

    /// One successful socket read (at least one byte) into `target`, or into the read-ahead buffer when `None`;
    /// waits for data in slices of `SHUTDOWN_POLL`. `at_boundary`: nothing of the current message was read yet.
    fn read_some(
        &mut self,
        mut target: Option<&mut [u8]>,
        at_boundary: bool,
    ) -> Result<usize, ReadFailure> {
        debug_assert_eq!(
            self.start, self.end,
            "read-ahead must be empty before reading the socket"
        );
        // A pipelining client usually has the next request waiting: try the socket first and only wait in `poll`
        // when it is empty (one system call per read instead of two).
        let mut must_wait = false;
        loop {
            if self.shutdown.load(Ordering::Relaxed) {
                return Err(ReadFailure::ShuttingDown);
            }
            if must_wait {
                if self
                    .deadline
                    .is_some_and(|deadline| Instant::now() >= deadline)
                {
                    return Err(ReadFailure::Io(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "the client did not finish the handshake in time",
                    )));
                }
                match wait_readable(self.stream.as_raw_fd(), SHUTDOWN_POLL) {
                    Ok(false) => continue,
                    Ok(true) => {}
                    Err(error) => return Err(ReadFailure::Io(error)),
                }
            }
            let buf: &mut [u8] = match target.as_deref_mut() {
                Some(buf) => buf,
                None => &mut self.read_ahead,
            };
            // SAFETY: `buf` is valid for writes of `buf.len()` bytes; MSG_DONTWAIT makes this one call
            // non-blocking without changing the socket's mode (replies are written to it blocking).
            let received = unsafe {
                libc::recv(
                    self.stream.as_raw_fd(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    libc::MSG_DONTWAIT,
                )
            };
            match received {
                0 => return Err(ReadFailure::Closed { at_boundary }),
                n if n > 0 => {
                    let n = n as usize;
                    if target.is_none() {
                        self.start = 0;
                        self.end = n;
                    }
                    return Ok(n);
                }
                _ => {
                    let error = io::Error::last_os_error();
                    match error.kind() {
                        io::ErrorKind::Interrupted => {}
                        io::ErrorKind::WouldBlock => must_wait = true,
                        _ => return Err(ReadFailure::Io(error)),
                    }
                }
            }
        }
    }

    /// Copies the next `buf.len()` bytes into `buf` without consuming them, if they have all arrived; never waits.
    /// (Used to look at the next request header: a few bytes, so a peek that would straddle the read-ahead and
    /// the socket just says no.)
    pub(crate) fn peek_arrived(&mut self, buf: &mut [u8]) -> bool {
        let buffered = self.end - self.start;
        if buffered >= buf.len() {
            buf.copy_from_slice(&self.read_ahead[self.start..self.start + buf.len()]);
            return true;
        }
        if buffered > 0 || self.shutdown.load(Ordering::Relaxed) {
            return false;
        }
        // SAFETY: recv writes at most `buf.len()` bytes into `buf`; MSG_PEEK leaves them in the socket.
        let received = unsafe {
            libc::recv(
                self.stream.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                libc::MSG_PEEK | libc::MSG_DONTWAIT,
            )
        };
        received >= 0 && received as usize == buf.len()
    }

    /// Reads and throws away `len_bytes` (the payload of a refused request).
    pub(crate) fn discard(&mut self, mut len_bytes: u64) -> Result<(), ReadFailure> {
        let mut scratch = [0u8; 64 * 1024];
        while len_bytes > 0 {
            let step = len_bytes.min(scratch.len() as u64) as usize;
            self.read_exact(&mut scratch[..step])
                .map_err(|failure| match failure {
                    ReadFailure::Closed { .. } => ReadFailure::Closed { at_boundary: false },
                    other => other,
                })?;
            len_bytes -= step as u64;
        }
        Ok(())
    }

    pub(crate) fn read_u32(&mut self) -> Result<u32, ReadFailure> {
        let mut bytes = [0u8; 4];
        self.read_exact(&mut bytes)?;
        Ok(u32::from_be_bytes(bytes))
    }

    pub(crate) fn read_u64(&mut self) -> Result<u64, ReadFailure> {
        let mut bytes = [0u8; 8];
        self.read_exact(&mut bytes)?;
        Ok(u64::from_be_bytes(bytes))
    }
}
