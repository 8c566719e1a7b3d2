//! Wire values of the NBD protocol, as the NetworkBlockDevice project's `doc/proto.md` defines them.
//!
//! Every multi-byte field on the wire is big-endian. Public so that tests (and other clients) can speak the
//! protocol byte by byte without restating the numbers.

/// `NBDMAGIC`: first 8 bytes the server sends.
pub const NBD_MAGIC: u64 = 0x4e42_444d_4147_4943;
/// `IHAVEOPT`: second 8 bytes of the newstyle greeting, and the magic that starts every client option.
pub const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
/// Magic that starts every option reply (fixed newstyle).
pub const OPTION_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
/// Magic of a (compact) transmission request.
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
/// Magic of a simple reply.
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
/// Magic of a structured reply chunk.
pub const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;

// Handshake flags (16 bits, server to client).
pub const FLAG_FIXED_NEWSTYLE: u16 = 1 << 0;
pub const FLAG_NO_ZEROES: u16 = 1 << 1;

// Client flags (32 bits, client to server).
pub const FLAG_C_FIXED_NEWSTYLE: u32 = 1 << 0;
pub const FLAG_C_NO_ZEROES: u32 = 1 << 1;

// Transmission flags (16 bits, sent with the export size).
pub const FLAG_HAS_FLAGS: u16 = 1 << 0;
pub const FLAG_READ_ONLY: u16 = 1 << 1;
pub const FLAG_SEND_FLUSH: u16 = 1 << 2;
pub const FLAG_SEND_FUA: u16 = 1 << 3;
pub const FLAG_ROTATIONAL: u16 = 1 << 4;
pub const FLAG_SEND_TRIM: u16 = 1 << 5;
pub const FLAG_SEND_WRITE_ZEROES: u16 = 1 << 6;
pub const FLAG_SEND_DF: u16 = 1 << 7;
pub const FLAG_CAN_MULTI_CONN: u16 = 1 << 8;
pub const FLAG_SEND_RESIZE: u16 = 1 << 9;
pub const FLAG_SEND_CACHE: u16 = 1 << 10;
pub const FLAG_SEND_FAST_ZERO: u16 = 1 << 11;

// Options (client to server during the handshake).
pub const OPT_EXPORT_NAME: u32 = 1;
pub const OPT_ABORT: u32 = 2;
pub const OPT_LIST: u32 = 3;
pub const OPT_PEEK_EXPORT: u32 = 4;
pub const OPT_STARTTLS: u32 = 5;
pub const OPT_INFO: u32 = 6;
pub const OPT_GO: u32 = 7;
pub const OPT_STRUCTURED_REPLY: u32 = 8;
pub const OPT_LIST_META_CONTEXT: u32 = 9;
pub const OPT_SET_META_CONTEXT: u32 = 10;
pub const OPT_EXTENDED_HEADERS: u32 = 11;

// Option reply types. Errors have bit 31 set.
pub const REP_ACK: u32 = 1;
pub const REP_SERVER: u32 = 2;
pub const REP_INFO: u32 = 3;
pub const REP_META_CONTEXT: u32 = 4;
const REP_ERROR_BIT: u32 = 1 << 31;
pub const REP_ERR_UNSUP: u32 = REP_ERROR_BIT | 1;
pub const REP_ERR_POLICY: u32 = REP_ERROR_BIT | 2;
pub const REP_ERR_INVALID: u32 = REP_ERROR_BIT | 3;
pub const REP_ERR_PLATFORM: u32 = REP_ERROR_BIT | 4;
pub const REP_ERR_TLS_REQD: u32 = REP_ERROR_BIT | 5;
pub const REP_ERR_UNKNOWN: u32 = REP_ERROR_BIT | 6;
pub const REP_ERR_SHUTDOWN: u32 = REP_ERROR_BIT | 7;
pub const REP_ERR_BLOCK_SIZE_REQD: u32 = REP_ERROR_BIT | 8;
pub const REP_ERR_TOO_BIG: u32 = REP_ERROR_BIT | 9;

// Information types in NBD_REP_INFO replies to NBD_OPT_INFO / NBD_OPT_GO.
pub const INFO_EXPORT: u16 = 0;
pub const INFO_NAME: u16 = 1;
pub const INFO_DESCRIPTION: u16 = 2;
pub const INFO_BLOCK_SIZE: u16 = 3;

// Commands (the "type" field of a request).
pub const CMD_READ: u16 = 0;
pub const CMD_WRITE: u16 = 1;
pub const CMD_DISC: u16 = 2;
pub const CMD_FLUSH: u16 = 3;
pub const CMD_TRIM: u16 = 4;
pub const CMD_CACHE: u16 = 5;
pub const CMD_WRITE_ZEROES: u16 = 6;
pub const CMD_BLOCK_STATUS: u16 = 7;
pub const CMD_RESIZE: u16 = 8;

// Command flags.
pub const CMD_FLAG_FUA: u16 = 1 << 0;
pub const CMD_FLAG_NO_HOLE: u16 = 1 << 1;
pub const CMD_FLAG_DF: u16 = 1 << 2;
pub const CMD_FLAG_REQ_ONE: u16 = 1 << 3;
pub const CMD_FLAG_FAST_ZERO: u16 = 1 << 4;
pub const CMD_FLAG_PAYLOAD_LEN: u16 = 1 << 5;

// Structured reply flags and chunk types.
pub const REPLY_FLAG_DONE: u16 = 1 << 0;
pub const REPLY_TYPE_NONE: u16 = 0;
pub const REPLY_TYPE_OFFSET_DATA: u16 = 1;
pub const REPLY_TYPE_OFFSET_HOLE: u16 = 2;
pub const REPLY_TYPE_BLOCK_STATUS: u16 = 5;

/// "base:allocation" block status flags.
pub const STATE_HOLE: u32 = 1 << 0;
pub const STATE_ZERO: u32 = 1 << 1;
/// The one metadata context this server knows.
pub const CONTEXT_BASE_ALLOCATION: &str = "base:allocation";
pub const REPLY_TYPE_ERROR: u16 = (1 << 15) | 1;
pub const REPLY_TYPE_ERROR_OFFSET: u16 = (1 << 15) | 2;

/// Bytes of a request header: magic, flags, type, handle, offset, length.
pub const REQUEST_HEADER_BYTES: usize = 28;
/// Bytes of a simple reply header: magic, error, handle.
pub const SIMPLE_REPLY_HEADER_BYTES: usize = 16;
/// Bytes of a structured reply chunk header: magic, flags, type, handle, length.
pub const STRUCTURED_REPLY_HEADER_BYTES: usize = 20;
/// Reserved zero bytes that end an NBD_OPT_EXPORT_NAME reply unless NO_ZEROES was agreed.
pub const EXPORT_NAME_ZERO_PAD_BYTES: usize = 124;
/// Longest string (export name, description, error message) the protocol allows.
pub const MAX_STRING_BYTES: usize = 4096;

/// The error values a reply may carry. The protocol fixes these numbers (they happen to match Linux errno).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum ErrorCode {
    Perm = 1,
    Io = 5,
    NoMem = 12,
    Inval = 22,
    NoSpc = 28,
    Overflow = 75,
    NotSup = 95,
    Shutdown = 108,
}

impl ErrorCode {
    pub fn wire_value(self) -> u32 {
        self as u32
    }

    /// The code for a wire value, `None` for a value the protocol does not define.
    pub fn from_wire(value: u32) -> Option<ErrorCode> {
        Some(match value {
            1 => ErrorCode::Perm,
            5 => ErrorCode::Io,
            12 => ErrorCode::NoMem,
            22 => ErrorCode::Inval,
            28 => ErrorCode::NoSpc,
            75 => ErrorCode::Overflow,
            95 => ErrorCode::NotSup,
            108 => ErrorCode::Shutdown,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            ErrorCode::Perm => "EPERM",
            ErrorCode::Io => "EIO",
            ErrorCode::NoMem => "ENOMEM",
            ErrorCode::Inval => "EINVAL",
            ErrorCode::NoSpc => "ENOSPC",
            ErrorCode::Overflow => "EOVERFLOW",
            ErrorCode::NotSup => "ENOTSUP",
            ErrorCode::Shutdown => "ESHUTDOWN",
        }
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn magics_spell_their_ascii_names() {
        assert_eq!(&NBD_MAGIC.to_be_bytes(), b"NBDMAGIC");
        assert_eq!(&IHAVEOPT.to_be_bytes(), b"IHAVEOPT");
    }

    #[test]
    fn error_codes_round_trip_through_the_wire_value() {
        for code in [
            ErrorCode::Perm,
            ErrorCode::Io,
            ErrorCode::NoMem,
            ErrorCode::Inval,
            ErrorCode::NoSpc,
            ErrorCode::Overflow,
            ErrorCode::NotSup,
            ErrorCode::Shutdown,
        ] {
            assert_eq!(ErrorCode::from_wire(code.wire_value()), Some(code));
        }
        assert_eq!(ErrorCode::from_wire(0), None);
        assert_eq!(ErrorCode::from_wire(2), None);
    }

    #[test]
    fn option_errors_have_bit_31_set() {
        for value in [
            REP_ERR_UNSUP,
            REP_ERR_POLICY,
            REP_ERR_INVALID,
            REP_ERR_UNKNOWN,
            REP_ERR_TOO_BIG,
        ] {
            assert_ne!(value & (1 << 31), 0);
        }
        assert_eq!(REP_ERR_UNSUP, 0x8000_0001);
        assert_eq!(REPLY_TYPE_ERROR, 0x8001);
    }
}
