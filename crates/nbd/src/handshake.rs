//! The fixed-newstyle handshake: greeting, client flags, then option haggling until the client picks the export
//! (NBD_OPT_GO or the old NBD_OPT_EXPORT_NAME) or leaves.

use std::io::Write;

use crate::error::NbdError;
use crate::proto::*;
use crate::reply::option_reply;
use crate::stream::{ReadFailure, Stream, StreamReader};

/// Option data larger than this is not read: no legitimate option comes near it (strings are at most 4 KiB),
/// and the spec lets a server drop a client that looks like a denial of service.
const MAX_OPTION_DATA_BYTES: u32 = 64 * 1024;

/// Preferred block size advertised in NBD_INFO_BLOCK_SIZE.
pub(crate) const PREFERRED_BLOCK_BYTES: u32 = 4096;

/// What the handshake tells the client about the export.
#[derive(Debug, Clone)]
pub(crate) struct ExportDescription {
    pub name: String,
    pub description: String,
    pub size_bytes: u64,
    pub read_only: bool,
    pub multi_conn: bool,
    pub max_request_bytes: u32,
    /// The export reports allocation: the "base:allocation" metadata context is offered.
    pub allocation: bool,
}

impl ExportDescription {
    /// The empty name selects the default export, which is this one.
    fn answers_to(&self, requested: &[u8]) -> bool {
        requested.is_empty() || requested == self.name.as_bytes()
    }

    /// Transmission flags for this export. Writes are only offered on a writable export; DF only with structured
    /// replies (the spec requires it to be clear otherwise).
    pub(crate) fn transmission_flags(&self, structured_replies: bool) -> u16 {
        let mut flags = FLAG_HAS_FLAGS | FLAG_SEND_FLUSH;
        if self.read_only {
            flags |= FLAG_READ_ONLY;
        } else {
            flags |= FLAG_SEND_FUA | FLAG_SEND_TRIM | FLAG_SEND_WRITE_ZEROES;
        }
        if structured_replies {
            flags |= FLAG_SEND_DF;
        }
        if self.multi_conn {
            flags |= FLAG_CAN_MULTI_CONN;
        }
        flags
    }
}

/// The result of a handshake that reached the transmission phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Negotiated {
    pub structured_replies: bool,
    pub transmission_flags: u16,
    /// The client selected "base:allocation" (NBD_OPT_SET_META_CONTEXT): it may send NBD_CMD_BLOCK_STATUS, whose
    /// replies carry `ALLOCATION_CONTEXT_ID`.
    pub block_status: bool,
}

/// The metadata context id of "base:allocation" in this server's replies.
pub(crate) const ALLOCATION_CONTEXT_ID: u32 = 1;

#[derive(Debug)]
pub(crate) enum Outcome {
    Transmission(Negotiated),
    /// The client aborted, disconnected, or the server is shutting down.
    Ended,
}

/// Reads of the handshake: a peer that leaves or a server shutdown end it quietly; anything else is an error.
enum Step<T> {
    Got(T),
    Ended,
}

fn step<T>(result: Result<T, ReadFailure>) -> Result<Step<T>, NbdError> {
    match result {
        Ok(value) => Ok(Step::Got(value)),
        Err(ReadFailure::Closed { .. }) | Err(ReadFailure::ShuttingDown) => Ok(Step::Ended),
        Err(ReadFailure::Io(error)) => Err(NbdError::Handshake(error)),
    }
}

macro_rules! read_or_end {
    ($expr:expr) => {
        match step($expr)? {
            Step::Got(value) => value,
            Step::Ended => return Ok(Outcome::Ended),
        }
    };
}

fn send(writer: &mut Stream, bytes: &[u8]) -> Result<(), NbdError> {
    writer.write_all(bytes).map_err(NbdError::Handshake)
}

pub(crate) fn negotiate(
    reader: &mut StreamReader<'_>,
    writer: &mut Stream,
    export: &ExportDescription,
) -> Result<Outcome, NbdError> {
    let mut greeting = Vec::with_capacity(18);
    greeting.extend_from_slice(&NBD_MAGIC.to_be_bytes());
    greeting.extend_from_slice(&IHAVEOPT.to_be_bytes());
    greeting.extend_from_slice(&(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).to_be_bytes());
    send(writer, &greeting)?;

    let client_flags = read_or_end!(reader.read_u32());
    // The spec has the server drop a client that sets a flag it did not offer.
    if client_flags & !(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES) != 0 {
        return Err(NbdError::HandshakeProtocol(
            "client set unknown handshake flags",
        ));
    }
    let no_zeroes = client_flags & FLAG_C_NO_ZEROES != 0;
    let mut structured_replies = false;
    // The metadata contexts the last NBD_OPT_SET_META_CONTEXT selected (each one replaces the selection).
    let mut allocation_selected = false;

    loop {
        let magic = read_or_end!(reader.read_u64());
        if magic != IHAVEOPT {
            return Err(NbdError::HandshakeProtocol("option without IHAVEOPT magic"));
        }
        let option = read_or_end!(reader.read_u32());
        let length_bytes = read_or_end!(reader.read_u32());
        if length_bytes > MAX_OPTION_DATA_BYTES {
            return Err(NbdError::HandshakeProtocol(
                "option data larger than 64 KiB",
            ));
        }
        let mut data = vec![0u8; length_bytes as usize];
        read_or_end!(reader.read_exact(&mut data));

        match option {
            OPT_EXPORT_NAME => {
                // This option cannot answer with an error: an unknown name ends the session.
                if !export.answers_to(&data) {
                    return Err(NbdError::HandshakeProtocol(
                        "NBD_OPT_EXPORT_NAME names an unknown export",
                    ));
                }
                let flags = export.transmission_flags(structured_replies);
                let mut reply = Vec::with_capacity(10 + EXPORT_NAME_ZERO_PAD_BYTES);
                reply.extend_from_slice(&export.size_bytes.to_be_bytes());
                reply.extend_from_slice(&flags.to_be_bytes());
                if !no_zeroes {
                    reply.resize(reply.len() + EXPORT_NAME_ZERO_PAD_BYTES, 0);
                }
                send(writer, &reply)?;
                return Ok(Outcome::Transmission(Negotiated {
                    structured_replies,
                    transmission_flags: flags,
                    block_status: structured_replies && allocation_selected,
                }));
            }
            OPT_ABORT => {
                // The client may already have closed its end; an unsent ACK is no error.
                let _ = writer.write_all(&option_reply(option, REP_ACK, &[]));
                return Ok(Outcome::Ended);
            }
            OPT_LIST => {
                if !data.is_empty() {
                    send(
                        writer,
                        &option_reply(option, REP_ERR_INVALID, b"NBD_OPT_LIST takes no data"),
                    )?;
                    continue;
                }
                let mut server =
                    Vec::with_capacity(4 + export.name.len() + export.description.len());
                server.extend_from_slice(&(export.name.len() as u32).to_be_bytes());
                server.extend_from_slice(export.name.as_bytes());
                server.extend_from_slice(export.description.as_bytes());
                send(writer, &option_reply(option, REP_SERVER, &server))?;
                send(writer, &option_reply(option, REP_ACK, &[]))?;
            }
            OPT_INFO | OPT_GO => {
                let Some(request) =
                    named_request(writer, export, option, &data, parse_info_request, |r| {
                        r.name
                    })?
                else {
                    continue;
                };
                let flags = export.transmission_flags(structured_replies);
                for info in info_replies(export, flags, &request.info_types) {
                    send(writer, &option_reply(option, REP_INFO, &info))?;
                }
                send(writer, &option_reply(option, REP_ACK, &[]))?;
                if option == OPT_GO {
                    return Ok(Outcome::Transmission(Negotiated {
                        structured_replies,
                        transmission_flags: flags,
                        block_status: structured_replies && allocation_selected,
                    }));
                }
            }
            OPT_STRUCTURED_REPLY => {
                if !data.is_empty() {
                    send(
                        writer,
                        &option_reply(
                            option,
                            REP_ERR_INVALID,
                            b"NBD_OPT_STRUCTURED_REPLY takes no data",
                        ),
                    )?;
                    continue;
                }
                structured_replies = true;
                send(writer, &option_reply(option, REP_ACK, &[]))?;
            }
            OPT_LIST_META_CONTEXT | OPT_SET_META_CONTEXT => {
                let set = option == OPT_SET_META_CONTEXT;
                if set {
                    // A failed selection leaves none, rather than the one before it.
                    allocation_selected = false;
                }
                if !structured_replies {
                    send(
                        writer,
                        &option_reply(
                            option,
                            REP_ERR_INVALID,
                            b"metadata contexts need structured replies (NBD_OPT_STRUCTURED_REPLY) first",
                        ),
                    )?;
                    continue;
                }
                let Some(request) = named_request(
                    writer,
                    export,
                    option,
                    &data,
                    parse_meta_context_request,
                    |r| r.name,
                )?
                else {
                    continue;
                };
                let allocation = export.allocation && selects_allocation(&request.queries, set);
                if set {
                    allocation_selected = allocation;
                }
                if allocation {
                    // LIST answers with id 0 (reserved: the spec has clients disregard it).
                    let id = if set { ALLOCATION_CONTEXT_ID } else { 0 };
                    let mut context = id.to_be_bytes().to_vec();
                    context.extend_from_slice(CONTEXT_BASE_ALLOCATION.as_bytes());
                    send(writer, &option_reply(option, REP_META_CONTEXT, &context))?;
                }
                send(writer, &option_reply(option, REP_ACK, &[]))?;
            }
            // STARTTLS (this server has no TLS), extended headers, and anything unknown.
            _ => {
                send(
                    writer,
                    &option_reply(
                        option,
                        REP_ERR_UNSUP,
                        b"option not supported by this server",
                    ),
                )?;
            }
        }
    }
}

/// Parses an option's data with `parse` and checks the export it names: the request, or None once the error
/// reply is sent (NBD_REP_ERR_INVALID for data that does not parse, NBD_REP_ERR_UNKNOWN for another export).
fn named_request<'d, R>(
    writer: &mut Stream,
    export: &ExportDescription,
    option: u32,
    data: &'d [u8],
    parse: fn(&'d [u8]) -> Result<R, &'static str>,
    name: fn(&R) -> &'d [u8],
) -> Result<Option<R>, NbdError> {
    let request = match parse(data) {
        Ok(request) => request,
        Err(message) => {
            send(
                writer,
                &option_reply(option, REP_ERR_INVALID, message.as_bytes()),
            )?;
            return Ok(None);
        }
    };
    if !export.answers_to(name(&request)) {
        let message = format!(
            "no export named {:?}",
            String::from_utf8_lossy(name(&request))
        );
        send(
            writer,
            &option_reply(option, REP_ERR_UNKNOWN, message.as_bytes()),
        )?;
        return Ok(None);
    }
    Ok(Some(request))
}

struct MetaContextRequest<'a> {
    name: &'a [u8],
    queries: Vec<&'a [u8]>,
}

/// NBD_OPT_LIST_META_CONTEXT / NBD_OPT_SET_META_CONTEXT data: u32 export name length, name, u32 query count,
/// then each query as u32 length and string.
fn parse_meta_context_request(data: &[u8]) -> Result<MetaContextRequest<'_>, &'static str> {
    let too_short = "metadata context request shorter than its lengths say";
    let mut at = 0usize;
    let mut take = |len: usize| -> Result<&[u8], &'static str> {
        let end = at.checked_add(len).ok_or(too_short)?;
        let bytes = data.get(at..end).ok_or(too_short)?;
        at = end;
        Ok(bytes)
    };
    let be_u32 =
        |bytes: &[u8]| u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]) as usize;
    let name_bytes = be_u32(take(4)?);
    let name = take(name_bytes)?;
    let count = be_u32(take(4)?);
    let mut queries = Vec::new();
    for _ in 0..count {
        let query_bytes = be_u32(take(4)?);
        queries.push(take(query_bytes)?);
    }
    if at != data.len() {
        return Err("metadata context request longer than its queries");
    }
    Ok(MetaContextRequest { name, queries })
}

/// Whether the queries select "base:allocation": named exactly, or, when listing, by its namespace or by no query
/// at all (the spec has LIST without queries list everything, and SET without queries select nothing).
fn selects_allocation(queries: &[&[u8]], set: bool) -> bool {
    if queries.is_empty() {
        return !set;
    }
    queries
        .iter()
        .any(|query| *query == CONTEXT_BASE_ALLOCATION.as_bytes() || (!set && *query == b"base:"))
}

struct InfoRequest<'a> {
    name: &'a [u8],
    info_types: Vec<u16>,
}

/// NBD_OPT_INFO / NBD_OPT_GO data: u32 name length, name, u16 count, count x u16 information types.
fn parse_info_request(data: &[u8]) -> Result<InfoRequest<'_>, &'static str> {
    let too_short = "NBD_OPT_INFO/GO data shorter than its lengths say";
    let name_bytes = u32::from_be_bytes(
        data.get(0..4)
            .ok_or(too_short)?
            .try_into()
            .map_err(|_| too_short)?,
    ) as usize;
    let name_end = 4usize.checked_add(name_bytes).ok_or(too_short)?;
    let name = data.get(4..name_end).ok_or(too_short)?;
    let count_bytes = data.get(name_end..name_end + 2).ok_or(too_short)?;
    let count = u16::from_be_bytes([count_bytes[0], count_bytes[1]]) as usize;
    let list = &data[name_end + 2..];
    if list.len() != count * 2 {
        return Err("NBD_OPT_INFO/GO information list does not match its count");
    }
    let info_types = list
        .chunks_exact(2)
        .map(|pair| u16::from_be_bytes([pair[0], pair[1]]))
        .collect();
    Ok(InfoRequest { name, info_types })
}

/// NBD_REP_INFO payloads: always the export (mandatory) and block sizes (so every client learns the maximum
/// request size); the name and description only when asked for.
fn info_replies(export: &ExportDescription, flags: u16, requested: &[u16]) -> Vec<Vec<u8>> {
    let mut replies = Vec::with_capacity(4);

    let mut info_export = Vec::with_capacity(12);
    info_export.extend_from_slice(&INFO_EXPORT.to_be_bytes());
    info_export.extend_from_slice(&export.size_bytes.to_be_bytes());
    info_export.extend_from_slice(&flags.to_be_bytes());
    replies.push(info_export);

    let mut block_size = Vec::with_capacity(14);
    block_size.extend_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
    block_size.extend_from_slice(&1u32.to_be_bytes());
    block_size.extend_from_slice(&PREFERRED_BLOCK_BYTES.to_be_bytes());
    block_size.extend_from_slice(&export.max_request_bytes.to_be_bytes());
    replies.push(block_size);

    if requested.contains(&INFO_NAME) {
        let mut name = INFO_NAME.to_be_bytes().to_vec();
        name.extend_from_slice(export.name.as_bytes());
        replies.push(name);
    }
    if requested.contains(&INFO_DESCRIPTION) && !export.description.is_empty() {
        let mut description = INFO_DESCRIPTION.to_be_bytes().to_vec();
        description.extend_from_slice(export.description.as_bytes());
        replies.push(description);
    }
    replies
}

#[cfg(test)]
mod tests {
    use super::*;

    fn export(read_only: bool, multi_conn: bool) -> ExportDescription {
        ExportDescription {
            name: "disk".into(),
            description: "a test disk".into(),
            size_bytes: 1 << 30,
            read_only,
            multi_conn,
            max_request_bytes: 32 << 20,
            allocation: true,
        }
    }

    #[test]
    fn flags_follow_the_export_and_session() {
        let writable = export(false, false).transmission_flags(false);
        assert_eq!(
            writable,
            FLAG_HAS_FLAGS
                | FLAG_SEND_FLUSH
                | FLAG_SEND_FUA
                | FLAG_SEND_TRIM
                | FLAG_SEND_WRITE_ZEROES
        );
        assert_eq!(
            export(false, true).transmission_flags(true),
            writable | FLAG_CAN_MULTI_CONN | FLAG_SEND_DF
        );
        let read_only = export(true, false).transmission_flags(false);
        assert_eq!(read_only, FLAG_HAS_FLAGS | FLAG_SEND_FLUSH | FLAG_READ_ONLY);
    }

    #[test]
    fn empty_name_is_the_default_export() {
        let export = export(false, false);
        assert!(export.answers_to(b""));
        assert!(export.answers_to(b"disk"));
        assert!(!export.answers_to(b"disk2"));
    }

    #[test]
    fn info_request_parsing_checks_every_length() {
        let mut data = 4u32.to_be_bytes().to_vec();
        data.extend_from_slice(b"disk");
        data.extend_from_slice(&2u16.to_be_bytes());
        data.extend_from_slice(&INFO_NAME.to_be_bytes());
        data.extend_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
        let request = parse_info_request(&data).unwrap();
        assert_eq!(request.name, b"disk");
        assert_eq!(request.info_types, vec![INFO_NAME, INFO_BLOCK_SIZE]);

        assert!(parse_info_request(&data[..data.len() - 1]).is_err());
        assert!(parse_info_request(&data[..3]).is_err());
        let mut lying_name = data.clone();
        lying_name[0..4].copy_from_slice(&u32::MAX.to_be_bytes());
        assert!(parse_info_request(&lying_name).is_err());
        let mut extra = data.clone();
        extra.push(0);
        assert!(parse_info_request(&extra).is_err());
    }

    #[test]
    fn info_replies_always_include_export_and_block_size() {
        let export = export(false, false);
        let replies = info_replies(&export, 0x1234, &[]);
        assert_eq!(replies.len(), 2);
        assert_eq!(&replies[0][0..2], &INFO_EXPORT.to_be_bytes());
        assert_eq!(&replies[0][2..10], &(1u64 << 30).to_be_bytes());
        assert_eq!(&replies[0][10..12], &0x1234u16.to_be_bytes());
        assert_eq!(replies[1].len(), 14);
        assert_eq!(&replies[1][2..6], &1u32.to_be_bytes());
        assert_eq!(&replies[1][6..10], &4096u32.to_be_bytes());
        assert_eq!(&replies[1][10..14], &(32u32 << 20).to_be_bytes());
        let replies = info_replies(&export, 0, &[INFO_NAME, INFO_DESCRIPTION]);
        assert_eq!(replies.len(), 4);
        assert_eq!(&replies[2][2..], b"disk");
        assert_eq!(&replies[3][2..], b"a test disk");
    }
}
