//! The server: configuration, the accept loop, and one thread per connection.

use std::io;
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use crate::error::NbdError;
use crate::export::Export;
use crate::handshake::{self, ExportDescription, Outcome, PREFERRED_BLOCK_BYTES};
use crate::listener::{
    bind_tcp, bind_unix, remove_socket_file, socket_file_identity, take_inherited, BoundListener,
    Listener,
};
use crate::stream::{wait_readable, Stream, StreamReader, SHUTDOWN_POLL};
use crate::transmission::{self, Settings, REQUEST_OVERHEAD_BYTES};

/// Largest request size the server accepts being configured with; keeps a READ's data in one structured chunk
/// (the spec caps a chunk below 4 GiB) and a worker's buffer sane.
const MAX_REQUEST_BYTES_LIMIT: u32 = 1 << 30;
/// A refused WRITE up to this long is read and dropped rather than ending the connection: the spec says lengths
/// below 32 MiB should never be treated as an attack.
const MIN_DISCARD_LIMIT_BYTES: u64 = 32 << 20;

/// Most worker threads per connection unless configured (nbdkit's default thread count too); the pool starts
/// with one and grows while every worker is busy.
pub const DEFAULT_WORKERS_PER_CONNECTION: usize = 16;

/// Merged WRITEs (see `ServerConfig::merge_write_bytes`) up to 1 MiB unless configured: a few stripes of a
/// parity array, and the size up to which workers keep their buffers.
pub const DEFAULT_MERGE_WRITE_BYTES: u32 = 1 << 20;

/// READs that arrived together served as one export call (see `ServerConfig::gather_reads`), up to this many
/// unless configured.
pub const DEFAULT_GATHER_READS: usize = 16;

#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// The name clients may ask for (the empty name, the default export, always works too).
    pub export_name: String,
    /// Shown by NBD_OPT_LIST and NBD_INFO_DESCRIPTION.
    pub description: String,
    /// Most threads executing requests of one connection in parallel (started on demand, see transmission.rs).
    pub workers_per_connection: usize,
    /// Largest READ/WRITE accepted; advertised as the maximum block size. Clamped to 4 KiB..=1 GiB.
    pub max_request_bytes: u32,
    /// Bound on one connection's queued plus executing request bytes; raised to fit at least one largest request.
    pub max_in_flight_bytes: u64,
    /// Connections served at once; further ones are accepted and closed at once.
    pub max_connections: usize,
    /// A reply that cannot be sent within this long (client not reading) ends its connection.
    pub write_timeout: Duration,
    /// A client that has not finished the handshake this long after connecting is dropped: connections are
    /// limited (`max_connections`), and one that connects and says nothing must not hold a place for ever (as
    /// qemu-nbd's handshake limit). Once serving, a connection may be idle as long as it likes.
    pub handshake_timeout: Duration,
    /// WRITEs that continue one another and have arrived together are served as one export write of up to this
    /// many bytes (0: never); at most `max_request_bytes`. See `merge_following_writes` in transmission.rs.
    pub merge_write_bytes: u32,
    /// READs (of at most 64 KiB each) that have arrived together are served as one `Export::read_many` call, up
    /// to this many (0 or 1: never). See `gather_following_reads` in transmission.rs.
    pub gather_reads: usize,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            export_name: String::new(),
            description: String::new(),
            workers_per_connection: DEFAULT_WORKERS_PER_CONNECTION,
            max_request_bytes: 32 << 20,
            max_in_flight_bytes: 64 << 20,
            max_connections: 64,
            write_timeout: Duration::from_secs(30),
            handshake_timeout: Duration::from_secs(10),
            merge_write_bytes: DEFAULT_MERGE_WRITE_BYTES,
            gather_reads: DEFAULT_GATHER_READS,
        }
    }
}

impl ServerConfig {
    /// The same configuration with every limit inside what the protocol and the server can honour.
    fn normalized(mut self) -> Self {
        self.workers_per_connection = self.workers_per_connection.clamp(1, 256);
        self.max_request_bytes = self
            .max_request_bytes
            .clamp(PREFERRED_BLOCK_BYTES, MAX_REQUEST_BYTES_LIMIT);
        self.max_in_flight_bytes = self
            .max_in_flight_bytes
            .max(u64::from(self.max_request_bytes) + REQUEST_OVERHEAD_BYTES);
        self.max_connections = self.max_connections.max(1);
        self.merge_write_bytes = self.merge_write_bytes.min(self.max_request_bytes);
        if self.write_timeout.is_zero() {
            self.write_timeout = ServerConfig::default().write_timeout;
        }
        if self.handshake_timeout.is_zero() {
            self.handshake_timeout = ServerConfig::default().handshake_timeout;
        }
        // Strings longer than the protocol allows would be cut by clients; refuse to send them at all.
        truncate_to_protocol_string(&mut self.export_name);
        truncate_to_protocol_string(&mut self.description);
        self
    }
}

fn truncate_to_protocol_string(text: &mut String) {
    let mut end = text.len().min(crate::proto::MAX_STRING_BYTES);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.truncate(end);
}

struct Inner {
    export: Arc<dyn Export>,
    config: ServerConfig,
}

/// An NBD server for one export. Cheap to share: `serve` may run while tests call `serve_stream` on the side.
pub struct Server {
    inner: Arc<Inner>,
}

/// A listening socket from `BoundSocket::bind`: a Unix socket file it created is removed when it is dropped (after
/// being served, or unused), if the file is still the one it bound.
pub struct BoundSocket {
    listener: Option<BoundListener>,
    socket_path: Option<PathBuf>,
    identity: Option<(u64, u64)>,
}

impl BoundSocket {
    /// Binds what `listener` names (a stale Unix socket file nobody answers on is replaced).
    pub fn bind(listener: Listener) -> Result<BoundSocket, NbdError> {
        let (bound, socket_path) = match listener {
            Listener::Unix(path) => (BoundListener::Unix(bind_unix(&path)?), Some(path)),
            Listener::Tcp(addr) => (BoundListener::Tcp(bind_tcp(addr)?), None),
            Listener::Inherited => (take_inherited()?, None),
        };
        let identity = socket_path.as_deref().and_then(socket_file_identity);
        Ok(BoundSocket {
            listener: Some(bound),
            socket_path,
            identity,
        })
    }
}

impl Drop for BoundSocket {
    fn drop(&mut self) {
        // The listening socket closes first: nobody connects to a file about to go.
        drop(self.listener.take());
        if let Some(path) = &self.socket_path {
            match remove_socket_file(path, self.identity) {
                Ok(true) => {}
                Ok(false) => log::info!(
                    "socket {} is not the one this server bound any more: left in place",
                    path.display()
                ),
                Err(error) => log::warn!("removing socket {}: {error}", path.display()),
            }
        }
    }
}

impl Server {
    pub fn new(export: Arc<dyn Export>, config: ServerConfig) -> Self {
        Server {
            inner: Arc::new(Inner {
                export,
                config: config.normalized(),
            }),
        }
    }

    /// The configuration in force (after normalization).
    pub fn config(&self) -> &ServerConfig {
        &self.inner.config
    }

    /// Serve until `shutdown` is set (checked at least every ~100 ms); then stop accepting, let in-flight requests
    /// finish and reply, close connections, return. A Unix socket file this call created is removed.
    pub fn serve(&self, listener: Listener, shutdown: Arc<AtomicBool>) -> Result<(), NbdError> {
        self.serve_socket(BoundSocket::bind(listener)?, shutdown)
    }

    /// Like `serve`, on a socket bound beforehand (so that a failure to bind is known before anything else
    /// starts); its socket file is removed at the end.
    pub fn serve_socket(
        &self,
        mut socket: BoundSocket,
        shutdown: Arc<AtomicBool>,
    ) -> Result<(), NbdError> {
        let listener = socket
            .listener
            .take()
            .expect("a bound socket is served once");
        self.serve_bound(listener, shutdown)
    }

    /// Like `serve`, on a socket that is already listening (for example a TCP port 0 the caller bound to learn
    /// the port).
    pub fn serve_bound(
        &self,
        listener: BoundListener,
        shutdown: Arc<AtomicBool>,
    ) -> Result<(), NbdError> {
        listener
            .set_nonblocking()
            .map_err(NbdError::ConfigureSocket)?;
        // Connections watch `stop`, not the caller's flag, so that an accept failure stops them too.
        let stop = Arc::new(AtomicBool::new(false));
        let mut connections: Vec<JoinHandle<()>> = Vec::new();
        let mut next_id: u64 = 0;
        let result = loop {
            if shutdown.load(Ordering::Relaxed) {
                break Ok(());
            }
            connections.retain(|connection| !connection.is_finished());
            match wait_readable(listener.as_raw_fd(), SHUTDOWN_POLL) {
                Ok(false) => continue,
                Ok(true) => {}
                Err(error) => break Err(NbdError::Accept(error)),
            }
            let stream = match listener.accept() {
                Ok(stream) => stream,
                Err(error) if accept_error_is_transient(&error) => {
                    if error.kind() != io::ErrorKind::WouldBlock {
                        log::warn!("accepting an NBD connection: {error}; retrying");
                        thread::sleep(SHUTDOWN_POLL);
                    }
                    continue;
                }
                Err(error) => break Err(NbdError::Accept(error)),
            };
            if connections.len() >= self.inner.config.max_connections {
                log::warn!(
                    "refusing an NBD connection: {} already open",
                    connections.len()
                );
                drop(stream);
                continue;
            }
            next_id += 1;
            let id = next_id;
            let inner = self.inner.clone();
            let stop = stop.clone();
            let spawned = thread::Builder::new()
                .name(format!("nbd-conn-{id}"))
                .spawn(move || {
                    log::debug!("NBD connection {id} opened");
                    match inner.serve_connection(stream, &stop) {
                        Ok(()) => log::debug!("NBD connection {id} closed"),
                        // A client that hangs up mid-handshake (a readiness probe, `nbdinfo --list`) is routine.
                        Err(NbdError::Handshake(source)) if hung_up(&source) => {
                            log::debug!(
                                "NBD connection {id}: client left during the handshake: {source}"
                            )
                        }
                        Err(error) => log::warn!("NBD connection {id}: {error}"),
                    }
                });
            match spawned {
                Ok(handle) => connections.push(handle),
                Err(error) => {
                    log::warn!("NBD connection {id} dropped: spawning its thread: {error}")
                }
            }
        };
        stop.store(true, Ordering::Relaxed);
        for connection in connections {
            if connection.join().is_err() {
                log::error!("an NBD connection thread panicked");
            }
        }
        result
    }

    /// Serve exactly one already-connected stream (used by tests and socket activation): handshake, then requests
    /// until the client disconnects or `shutdown` is set. A client that merely disconnects is `Ok`.
    pub fn serve_stream(
        &self,
        stream: impl Into<Stream>,
        shutdown: &AtomicBool,
    ) -> Result<(), NbdError> {
        self.inner.serve_connection(stream.into(), shutdown)
    }
}

/// Errors after which accepting again makes sense: the queue raced empty, a client reset before we got to it,
/// or descriptors/memory ran out for a moment.
fn accept_error_is_transient(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted | io::ErrorKind::ConnectionAborted
    ) || matches!(
        error.raw_os_error(),
        Some(
            libc::EMFILE
                | libc::ENFILE
                | libc::ENOBUFS
                | libc::ENOMEM
                | libc::EPROTO
                | libc::ECONNRESET
        )
    )
}

impl Inner {
    fn serve_connection(&self, stream: Stream, shutdown: &AtomicBool) -> Result<(), NbdError> {
        let config = &self.config;
        stream
            .prepare(config.write_timeout)
            .map_err(NbdError::ConfigureSocket)?;
        let mut writer = stream.try_clone().map_err(NbdError::ConfigureSocket)?;
        let mut reader = StreamReader::new(stream, shutdown);
        let description = ExportDescription {
            name: config.export_name.clone(),
            description: config.description.clone(),
            size_bytes: self.export.size_bytes(),
            read_only: self.export.read_only(),
            multi_conn: self.export.multi_conn_safe(),
            max_request_bytes: config.max_request_bytes,
            allocation: self.export.reports_allocation(),
        };
        reader.set_deadline(Some(Instant::now() + config.handshake_timeout));
        let negotiated = match handshake::negotiate(&mut reader, &mut writer, &description)? {
            Outcome::Transmission(negotiated) => negotiated,
            Outcome::Ended => return Ok(()),
        };
        reader.set_deadline(None);
        log::debug!(
            "NBD transmission: structured replies {}, flags {:#06x}",
            negotiated.structured_replies,
            negotiated.transmission_flags
        );
        let settings = Settings {
            workers: config.workers_per_connection,
            max_request_bytes: config.max_request_bytes,
            max_in_flight_bytes: config.max_in_flight_bytes,
            discard_limit_bytes: MIN_DISCARD_LIMIT_BYTES.max(u64::from(config.max_request_bytes)),
            merge_write_bytes: config.merge_write_bytes,
            gather_reads: config.gather_reads,
        };
        transmission::serve(
            &*self.export,
            reader,
            writer,
            negotiated,
            settings,
            shutdown,
        )
    }
}

/// The peer closed the connection: end of file, broken pipe or reset.
fn hung_up(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::UnexpectedEof | io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalization_keeps_limits_consistent() {
        let config = ServerConfig {
            workers_per_connection: 0,
            max_request_bytes: 1,
            max_in_flight_bytes: 0,
            max_connections: 0,
            write_timeout: Duration::ZERO,
            export_name: "é".repeat(3000),
            ..ServerConfig::default()
        }
        .normalized();
        assert_eq!(config.workers_per_connection, 1);
        assert_eq!(config.max_request_bytes, 4096);
        assert_eq!(config.max_in_flight_bytes, 4096 + REQUEST_OVERHEAD_BYTES);
        assert_eq!(config.max_connections, 1);
        assert!(!config.write_timeout.is_zero());
        assert!(config.export_name.len() <= 4096);
        assert!(config.export_name.chars().all(|c| c == 'é'));

        let big = ServerConfig {
            max_request_bytes: u32::MAX,
            ..ServerConfig::default()
        }
        .normalized();
        assert_eq!(big.max_request_bytes, 1 << 30);
        assert!(big.max_in_flight_bytes >= (1 << 30) + REQUEST_OVERHEAD_BYTES);
    }
}
