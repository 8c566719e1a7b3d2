//! NBD (network block device) server for paraid, independent of the RAID engine: it serves anything that
//! implements [`Export`].
//!
//! Protocol (from the NBD project's `proto.md`): fixed-newstyle handshake with NBD_FLAG_C_NO_ZEROES; options GO,
//! INFO, LIST, ABORT, STRUCTURED_REPLY, LIST_META_CONTEXT, SET_META_CONTEXT and the old EXPORT_NAME (anything
//! else: NBD_REP_ERR_UNSUP); INFO_EXPORT and INFO_BLOCK_SIZE (minimum 1, preferred 4096, maximum =
//! `max_request_bytes`); commands READ, WRITE, FLUSH, TRIM, WRITE_ZEROES (with NO_HOLE), BLOCK_STATUS (the
//! "base:allocation" context, where the export reports allocation) and DISC, FUA on all; structured replies
//! (OFFSET_DATA, BLOCK_STATUS, ERROR) when negotiated.
//!
//! Concurrency: per connection a pool of workers takes turns reading the next request off the socket, then
//! executes it and sends its reply (whole, through one locked writer); a byte budget bounds what is in flight. Any number of
//! connections at once; CAN_MULTI_CONN only when the export says a flush covers all of them.
//!
//! Safety against clients: every request is validated before the export sees it (range, overflow, size, flags,
//! command); a refused request gets the spec's error and the connection goes on, except for a bad magic or a
//! WRITE payload too large to skip, which end the connection. The server does not panic on client input.

mod error;
mod export;
mod handshake;
mod listener;
mod memory;
pub mod proto;
mod reply;
mod request;
mod server;
mod stream;
mod transmission;

pub use error::NbdError;
pub use export::{error_code_for, Export, Extent, PayloadMemory};
pub use listener::{
    clear_stale_socket, listener_from_systemd, remove_socket_file, socket_file_identity,
    BoundListener, InheritedSocket, Listener, SocketFamily,
};
pub use memory::MemoryExport;
pub use proto::ErrorCode;
pub use server::{
    BoundSocket, Server, ServerConfig, DEFAULT_GATHER_READS, DEFAULT_MERGE_WRITE_BYTES,
    DEFAULT_WORKERS_PER_CONNECTION,
};
pub use stream::Stream;
pub use transmission::GATHER_READ_MAX_BYTES;
