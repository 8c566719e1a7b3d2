//! Why serving stopped. Each variant is named after the action that failed and carries its cause.

use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;

#[derive(Debug)]
pub enum NbdError {
    /// Binding the Unix socket path failed (exists and in use, no permission, ...).
    BindUnix { path: PathBuf, source: io::Error },
    /// Binding the TCP address failed.
    BindTcp { addr: SocketAddr, source: io::Error },
    /// `Listener::Inherited` was asked for but this process was not handed a socket (LISTEN_PID/LISTEN_FDS).
    InheritListener,
    /// Preparing a socket (non-blocking mode, timeouts, cloning the descriptor) failed.
    ConfigureSocket(io::Error),
    /// Waiting for a connection (poll) or accepting it failed.
    Accept(io::Error),
    /// Starting a connection's or worker's thread failed.
    SpawnThread(io::Error),
    /// Reading or writing the handshake failed.
    Handshake(io::Error),
    /// The client broke the handshake rules (bad option magic, unknown client flags, oversized option...).
    HandshakeProtocol(&'static str),
    /// Reading a request (header or write payload) failed mid-message.
    ReadRequest(io::Error),
    /// The client sent a request whose magic is wrong: the stream can't be trusted, so it was dropped.
    RequestMagic { magic: u32 },
    /// The client sent a WRITE too large to even skip safely; the connection was dropped.
    WritePayloadTooLarge { length_bytes: u32 },
    /// Sending a reply failed (client gone or stalled past the write timeout).
    SendReply(io::Error),
}

impl fmt::Display for NbdError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NbdError::BindUnix { path, source } => {
                write!(f, "binding Unix socket {}: {source}", path.display())
            }
            NbdError::BindTcp { addr, source } => write!(f, "binding TCP address {addr}: {source}"),
            NbdError::InheritListener => {
                write!(f, "inheriting the listening socket: LISTEN_PID/LISTEN_FDS do not hand this process one")
            }
            NbdError::ConfigureSocket(source) => write!(f, "configuring a socket: {source}"),
            NbdError::Accept(source) => write!(f, "accepting a connection: {source}"),
            NbdError::SpawnThread(source) => write!(f, "spawning a thread: {source}"),
            NbdError::Handshake(source) => write!(f, "NBD handshake: {source}"),
            NbdError::HandshakeProtocol(what) => {
                write!(f, "NBD handshake: client broke the protocol: {what}")
            }
            NbdError::ReadRequest(source) => write!(f, "reading an NBD request: {source}"),
            NbdError::RequestMagic { magic } => {
                write!(
                    f,
                    "reading an NBD request: bad magic {magic:#010x}, connection dropped"
                )
            }
            NbdError::WritePayloadTooLarge { length_bytes } => {
                write!(f, "reading an NBD request: WRITE of {length_bytes} bytes is too large to skip, connection dropped")
            }
            NbdError::SendReply(source) => write!(f, "sending an NBD reply: {source}"),
        }
    }
}

impl std::error::Error for NbdError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            NbdError::BindUnix { source, .. }
            | NbdError::BindTcp { source, .. }
            | NbdError::ConfigureSocket(source)
            | NbdError::Accept(source)
            | NbdError::SpawnThread(source)
            | NbdError::Handshake(source)
            | NbdError::ReadRequest(source)
            | NbdError::SendReply(source) => Some(source),
            NbdError::InheritListener
            | NbdError::HandshakeProtocol(_)
            | NbdError::RequestMagic { .. }
            | NbdError::WritePayloadTooLarge { .. } => None,
        }
    }
}
