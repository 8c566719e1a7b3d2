//! Transmission requests: decoding the header and deciding, before anything touches the export, whether the
//! request is allowed. Pure functions: the whole policy is unit-tested here.

use crate::proto::*;

/// A request header as it came off the wire (magic already checked).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RequestHeader {
    pub flags: u16,
    pub kind: u16,
    pub handle: u64,
    pub offset_bytes: u64,
    pub length_bytes: u32,
}

/// Decodes a 28-byte request header; `Err(magic)` when the magic is wrong (the stream is out of sync or hostile).
pub(crate) fn parse_header(bytes: &[u8; REQUEST_HEADER_BYTES]) -> Result<RequestHeader, u32> {
    let be_u16 = |at: usize| u16::from_be_bytes([bytes[at], bytes[at + 1]]);
    let be_u32 =
        |at: usize| u32::from_be_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]]);
    let be_u64 = |at: usize| {
        let mut word = [0u8; 8];
        word.copy_from_slice(&bytes[at..at + 8]);
        u64::from_be_bytes(word)
    };
    let magic = be_u32(0);
    if magic != REQUEST_MAGIC {
        return Err(magic);
    }
    Ok(RequestHeader {
        flags: be_u16(4),
        kind: be_u16(6),
        handle: be_u64(8),
        offset_bytes: be_u64(16),
        length_bytes: be_u32(24),
    })
}

/// A request that passed validation: its range lies inside the export and its size within the limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Command {
    Read {
        offset_bytes: u64,
        length_bytes: u32,
    },
    Write {
        offset_bytes: u64,
        length_bytes: u32,
        fua: bool,
    },
    Flush,
    Trim {
        offset_bytes: u64,
        length_bytes: u32,
        fua: bool,
    },
    WriteZeroes {
        offset_bytes: u64,
        length_bytes: u32,
        fua: bool,
    },
    /// NBD_CMD_BLOCK_STATUS for "base:allocation"; `req_one`: describe only the first extent.
    BlockStatus {
        offset_bytes: u64,
        length_bytes: u32,
        req_one: bool,
    },
    Disconnect,
}

/// What validation needs to know about the export and the negotiated session.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    pub size_bytes: u64,
    pub max_request_bytes: u32,
    pub read_only: bool,
    pub structured_replies: bool,
    /// A metadata context was selected, so NBD_CMD_BLOCK_STATUS may be sent.
    pub block_status: bool,
}

/// Checks a request against the export and the protocol. The error is the one the spec asks for: EINVAL for
/// unknown commands and flags, oversized READ/WRITE, and READ/TRIM beyond the end; ENOSPC for WRITE and
/// WRITE_ZEROES beyond the end; EPERM for writes to a read-only export. An `offset + length` that overflows is
/// simply beyond the end.
pub(crate) fn validate(header: &RequestHeader, limits: &Limits) -> Result<Command, ErrorCode> {
    let offset_bytes = header.offset_bytes;
    let length_bytes = header.length_bytes;
    let fua = header.flags & CMD_FLAG_FUA != 0;
    let in_range = matches!(offset_bytes.checked_add(u64::from(length_bytes)), Some(end) if end <= limits.size_bytes);
    // FUA is accepted on every command (the spec makes the server accept it wherever SEND_FUA was offered).
    let flags_allowed = |allowed: u16| {
        if header.flags & !(allowed | CMD_FLAG_FUA) == 0 {
            Ok(())
        } else {
            Err(ErrorCode::Inval)
        }
    };
    match header.kind {
        CMD_READ => {
            // DF is only offered (NBD_FLAG_SEND_DF) with structured replies; a read is always one chunk anyway.
            flags_allowed(if limits.structured_replies {
                CMD_FLAG_DF
            } else {
                0
            })?;
            if length_bytes > limits.max_request_bytes || !in_range {
                return Err(ErrorCode::Inval);
            }
            Ok(Command::Read {
                offset_bytes,
                length_bytes,
            })
        }
        CMD_WRITE => {
            flags_allowed(0)?;
            if limits.read_only {
                return Err(ErrorCode::Perm);
            }
            if length_bytes > limits.max_request_bytes {
                return Err(ErrorCode::Inval);
            }
            if !in_range {
                return Err(ErrorCode::NoSpc);
            }
            Ok(Command::Write {
                offset_bytes,
                length_bytes,
                fua,
            })
        }
        CMD_DISC => Ok(Command::Disconnect),
        CMD_FLUSH => {
            flags_allowed(0)?;
            if offset_bytes != 0 || length_bytes != 0 {
                return Err(ErrorCode::Inval);
            }
            Ok(Command::Flush)
        }
        CMD_TRIM => {
            flags_allowed(0)?;
            if limits.read_only {
                return Err(ErrorCode::Perm);
            }
            if !in_range {
                return Err(ErrorCode::Inval);
            }
            Ok(Command::Trim {
                offset_bytes,
                length_bytes,
                fua,
            })
        }
        CMD_WRITE_ZEROES => {
            // FAST_ZERO is not offered (no NBD_FLAG_SEND_FAST_ZERO), so it is an unexpected flag: EINVAL.
            flags_allowed(CMD_FLAG_NO_HOLE)?;
            if limits.read_only {
                return Err(ErrorCode::Perm);
            }
            // No payload, so no size limit beyond the export's end: large zeroing requests are cheap to accept.
            if !in_range {
                return Err(ErrorCode::NoSpc);
            }
            Ok(Command::WriteZeroes {
                offset_bytes,
                length_bytes,
                fua,
            })
        }
        CMD_BLOCK_STATUS => {
            // Without a selected context the spec asks for EINVAL; so for a zero length (nothing to describe)
            // and a range beyond the end.
            if !limits.block_status {
                return Err(ErrorCode::Inval);
            }
            flags_allowed(CMD_FLAG_REQ_ONE)?;
            if length_bytes == 0 || !in_range {
                return Err(ErrorCode::Inval);
            }
            Ok(Command::BlockStatus {
                offset_bytes,
                length_bytes,
                req_one: header.flags & CMD_FLAG_REQ_ONE != 0,
            })
        }
        // CACHE, RESIZE and anything unknown.
        _ => Err(ErrorCode::Inval),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: Limits = Limits {
        size_bytes: 1 << 20,
        max_request_bytes: 64 << 10,
        read_only: false,
        structured_replies: false,
        block_status: false,
    };

    fn header(kind: u16, flags: u16, offset_bytes: u64, length_bytes: u32) -> RequestHeader {
        RequestHeader {
            flags,
            kind,
            handle: 7,
            offset_bytes,
            length_bytes,
        }
    }

    #[test]
    fn header_decodes_big_endian_fields() {
        let mut bytes = [0u8; REQUEST_HEADER_BYTES];
        bytes[0..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
        bytes[4..6].copy_from_slice(&CMD_FLAG_FUA.to_be_bytes());
        bytes[6..8].copy_from_slice(&CMD_WRITE.to_be_bytes());
        bytes[8..16].copy_from_slice(&0x0102_0304_0506_0708u64.to_be_bytes());
        bytes[16..24].copy_from_slice(&0x1000u64.to_be_bytes());
        bytes[24..28].copy_from_slice(&512u32.to_be_bytes());
        let parsed = parse_header(&bytes).unwrap();
        assert_eq!(
            parsed,
            header(CMD_WRITE, CMD_FLAG_FUA, 0x1000, 512).with_handle(0x0102_0304_0506_0708)
        );
        bytes[0] ^= 1;
        assert_eq!(parse_header(&bytes), Err(REQUEST_MAGIC ^ 0x0100_0000));
    }

    impl RequestHeader {
        fn with_handle(mut self, handle: u64) -> Self {
            self.handle = handle;
            self
        }
    }

    #[test]
    fn in_range_requests_pass() {
        assert_eq!(
            validate(&header(CMD_READ, 0, 0, 4096), &LIMITS),
            Ok(Command::Read {
                offset_bytes: 0,
                length_bytes: 4096
            })
        );
        let last = (1 << 20) - 4096;
        assert_eq!(
            validate(&header(CMD_WRITE, CMD_FLAG_FUA, last, 4096), &LIMITS),
            Ok(Command::Write {
                offset_bytes: last,
                length_bytes: 4096,
                fua: true
            })
        );
        assert_eq!(
            validate(&header(CMD_FLUSH, 0, 0, 0), &LIMITS),
            Ok(Command::Flush)
        );
        assert_eq!(
            validate(
                &header(CMD_WRITE_ZEROES, CMD_FLAG_NO_HOLE, 0, 1 << 20),
                &LIMITS
            ),
            Ok(Command::WriteZeroes {
                offset_bytes: 0,
                length_bytes: 1 << 20,
                fua: false
            })
        );
        assert_eq!(
            validate(&header(CMD_TRIM, CMD_FLAG_FUA, 512, 1 << 19), &LIMITS),
            Ok(Command::Trim {
                offset_bytes: 512,
                length_bytes: 1 << 19,
                fua: true
            })
        );
        // Zero length at the very end is inside the export.
        assert!(validate(&header(CMD_READ, 0, 1 << 20, 0), &LIMITS).is_ok());
        assert_eq!(
            validate(&header(CMD_DISC, 0, 0, 0), &LIMITS),
            Ok(Command::Disconnect)
        );
    }

    #[test]
    fn out_of_range_gets_the_spec_error_per_command() {
        let past = (1 << 20) - 100;
        assert_eq!(
            validate(&header(CMD_READ, 0, past, 4096), &LIMITS),
            Err(ErrorCode::Inval)
        );
        assert_eq!(
            validate(&header(CMD_TRIM, 0, past, 4096), &LIMITS),
            Err(ErrorCode::Inval)
        );
        assert_eq!(
            validate(&header(CMD_WRITE, 0, past, 4096), &LIMITS),
            Err(ErrorCode::NoSpc)
        );
        assert_eq!(
            validate(&header(CMD_WRITE_ZEROES, 0, past, 4096), &LIMITS),
            Err(ErrorCode::NoSpc)
        );
        assert_eq!(
            validate(&header(CMD_READ, 0, (1 << 20) + 1, 0), &LIMITS),
            Err(ErrorCode::Inval)
        );
    }

    #[test]
    fn offset_plus_length_overflow_is_out_of_range() {
        let huge = u64::MAX - 10;
        assert_eq!(
            validate(&header(CMD_READ, 0, huge, 100), &LIMITS),
            Err(ErrorCode::Inval)
        );
        assert_eq!(
            validate(&header(CMD_WRITE, 0, huge, 100), &LIMITS),
            Err(ErrorCode::NoSpc)
        );
        assert_eq!(
            validate(&header(CMD_TRIM, 0, huge, 100), &LIMITS),
            Err(ErrorCode::Inval)
        );
        assert_eq!(
            validate(&header(CMD_WRITE_ZEROES, 0, huge, u32::MAX), &LIMITS),
            Err(ErrorCode::NoSpc)
        );
    }

    #[test]
    fn lengths_above_the_maximum_are_refused_for_payload_commands() {
        let big = (64 << 10) + 1;
        assert_eq!(
            validate(&header(CMD_READ, 0, 0, big), &LIMITS),
            Err(ErrorCode::Inval)
        );
        assert_eq!(
            validate(&header(CMD_WRITE, 0, 0, big), &LIMITS),
            Err(ErrorCode::Inval)
        );
        assert!(validate(&header(CMD_WRITE_ZEROES, 0, 0, big), &LIMITS).is_ok());
        assert!(validate(&header(CMD_TRIM, 0, 0, big), &LIMITS).is_ok());
    }

    #[test]
    fn unknown_commands_and_flags_are_einval() {
        for kind in [CMD_CACHE, CMD_BLOCK_STATUS, CMD_RESIZE, 9, 42, u16::MAX] {
            assert_eq!(
                validate(&header(kind, 0, 0, 512), &LIMITS),
                Err(ErrorCode::Inval),
                "kind {kind}"
            );
        }
        assert_eq!(
            validate(&header(CMD_READ, 1 << 10, 0, 512), &LIMITS),
            Err(ErrorCode::Inval)
        );
        assert_eq!(
            validate(&header(CMD_WRITE, CMD_FLAG_NO_HOLE, 0, 512), &LIMITS),
            Err(ErrorCode::Inval)
        );
        assert_eq!(
            validate(
                &header(CMD_WRITE_ZEROES, CMD_FLAG_FAST_ZERO, 0, 512),
                &LIMITS
            ),
            Err(ErrorCode::Inval)
        );
        assert_eq!(
            validate(&header(CMD_FLUSH, 0, 8, 0), &LIMITS),
            Err(ErrorCode::Inval)
        );
        assert_eq!(
            validate(&header(CMD_FLUSH, 0, 0, 8), &LIMITS),
            Err(ErrorCode::Inval)
        );
    }

    #[test]
    fn df_needs_structured_replies() {
        assert_eq!(
            validate(&header(CMD_READ, CMD_FLAG_DF, 0, 512), &LIMITS),
            Err(ErrorCode::Inval)
        );
        let structured = Limits {
            structured_replies: true,
            ..LIMITS
        };
        assert!(validate(&header(CMD_READ, CMD_FLAG_DF, 0, 512), &structured).is_ok());
    }

    #[test]
    fn read_only_refuses_every_write_kind_with_eperm() {
        let read_only = Limits {
            read_only: true,
            ..LIMITS
        };
        assert_eq!(
            validate(&header(CMD_WRITE, 0, 0, 512), &read_only),
            Err(ErrorCode::Perm)
        );
        assert_eq!(
            validate(&header(CMD_TRIM, 0, 0, 512), &read_only),
            Err(ErrorCode::Perm)
        );
        assert_eq!(
            validate(&header(CMD_WRITE_ZEROES, 0, 0, 512), &read_only),
            Err(ErrorCode::Perm)
        );
        assert!(validate(&header(CMD_READ, 0, 0, 512), &read_only).is_ok());
        assert_eq!(
            validate(&header(CMD_FLUSH, 0, 0, 0), &read_only),
            Ok(Command::Flush)
        );
    }
}
