//! Encoders for everything the server sends: option replies during the handshake, simple replies and
//! structured reply chunks during transmission.

use crate::proto::*;

/// An option reply: magic, the option it answers, reply type, data length, data.
pub(crate) fn option_reply(option: u32, reply_type: u32, data: &[u8]) -> Vec<u8> {
    debug_assert!(data.len() <= u32::MAX as usize);
    let mut bytes = Vec::with_capacity(20 + data.len());
    bytes.extend_from_slice(&OPTION_REPLY_MAGIC.to_be_bytes());
    bytes.extend_from_slice(&option.to_be_bytes());
    bytes.extend_from_slice(&reply_type.to_be_bytes());
    bytes.extend_from_slice(&(data.len() as u32).to_be_bytes());
    bytes.extend_from_slice(data);
    bytes
}

pub(crate) fn put_simple_header(out: &mut [u8], handle: u64, error: u32) {
    out[0..4].copy_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
    out[4..8].copy_from_slice(&error.to_be_bytes());
    out[8..16].copy_from_slice(&handle.to_be_bytes());
}

pub(crate) fn put_structured_header(
    out: &mut [u8],
    flags: u16,
    chunk_type: u16,
    handle: u64,
    length_bytes: u32,
) {
    out[0..4].copy_from_slice(&STRUCTURED_REPLY_MAGIC.to_be_bytes());
    out[4..6].copy_from_slice(&flags.to_be_bytes());
    out[6..8].copy_from_slice(&chunk_type.to_be_bytes());
    out[8..16].copy_from_slice(&handle.to_be_bytes());
    out[16..20].copy_from_slice(&length_bytes.to_be_bytes());
}

/// A successful reply without payload (any command but READ). A simple reply is allowed even when structured
/// replies were negotiated, and is the shortest.
pub(crate) fn success(handle: u64) -> [u8; SIMPLE_REPLY_HEADER_BYTES] {
    let mut bytes = [0u8; SIMPLE_REPLY_HEADER_BYTES];
    put_simple_header(&mut bytes, handle, 0);
    bytes
}

/// A failed request. With structured replies the error goes in an NBD_REPLY_TYPE_ERROR chunk (mandatory for
/// READ, preferred otherwise) carrying a message for humans; else a simple reply with the error and no payload.
pub(crate) fn error(structured: bool, handle: u64, code: ErrorCode, message: &str) -> Vec<u8> {
    if !structured {
        let mut bytes = vec![0u8; SIMPLE_REPLY_HEADER_BYTES];
        put_simple_header(&mut bytes, handle, code.wire_value());
        return bytes;
    }
    let message = truncate_utf8(message, 512);
    let payload_bytes = 4 + 2 + message.len();
    let mut bytes = vec![0u8; STRUCTURED_REPLY_HEADER_BYTES];
    put_structured_header(
        &mut bytes,
        REPLY_FLAG_DONE,
        REPLY_TYPE_ERROR,
        handle,
        payload_bytes as u32,
    );
    bytes.extend_from_slice(&code.wire_value().to_be_bytes());
    bytes.extend_from_slice(&(message.len() as u16).to_be_bytes());
    bytes.extend_from_slice(message.as_bytes());
    bytes
}

/// Bytes in front of the data in a successful READ reply of `length_bytes`: the simple header, or the structured
/// chunk header plus the chunk's 64-bit offset (a zero-length read's NBD_REPLY_TYPE_NONE has no offset: sending
/// one put eight stray bytes in the stream, and the client's next reply failed on its magic).
pub(crate) fn read_prefix_bytes(structured: bool, length_bytes: u32) -> usize {
    match (structured, length_bytes) {
        (false, _) => SIMPLE_REPLY_HEADER_BYTES,
        (true, 0) => STRUCTURED_REPLY_HEADER_BYTES,
        (true, _) => STRUCTURED_REPLY_HEADER_BYTES + 8,
    }
}

/// Fills the prefix of a READ reply whose data (`length_bytes` of it) directly follows in the same buffer. With
/// structured replies this is a single NBD_REPLY_TYPE_OFFSET_DATA chunk marked DONE: the data is already read in
/// full, so no error can follow it. A zero-length read has no data chunk, just NBD_REPLY_TYPE_NONE.
pub(crate) fn put_read_prefix(
    out: &mut [u8],
    structured: bool,
    handle: u64,
    offset_bytes: u64,
    length_bytes: u32,
) {
    debug_assert_eq!(out.len(), read_prefix_bytes(structured, length_bytes));
    if !structured {
        put_simple_header(out, handle, 0);
        return;
    }
    if length_bytes == 0 {
        put_structured_header(out, REPLY_FLAG_DONE, REPLY_TYPE_NONE, handle, 0);
        return;
    }
    // Requests are capped far below 4 GiB - 8, so the chunk length cannot overflow.
    debug_assert!(length_bytes <= u32::MAX - 8);
    put_structured_header(
        out,
        REPLY_FLAG_DONE,
        REPLY_TYPE_OFFSET_DATA,
        handle,
        length_bytes + 8,
    );
    out[STRUCTURED_REPLY_HEADER_BYTES..].copy_from_slice(&offset_bytes.to_be_bytes());
}

/// A successful NBD_CMD_BLOCK_STATUS: one NBD_REPLY_TYPE_BLOCK_STATUS chunk marked DONE, the context id, then one
/// (length, flags) descriptor per extent.
pub(crate) fn block_status(handle: u64, context_id: u32, descriptors: &[(u32, u32)]) -> Vec<u8> {
    let payload_bytes = 4 + 8 * descriptors.len();
    let mut bytes = vec![0u8; STRUCTURED_REPLY_HEADER_BYTES];
    put_structured_header(
        &mut bytes,
        REPLY_FLAG_DONE,
        REPLY_TYPE_BLOCK_STATUS,
        handle,
        payload_bytes as u32,
    );
    bytes.reserve(payload_bytes);
    bytes.extend_from_slice(&context_id.to_be_bytes());
    for (length_bytes, flags) in descriptors {
        bytes.extend_from_slice(&length_bytes.to_be_bytes());
        bytes.extend_from_slice(&flags.to_be_bytes());
    }
    bytes
}

fn truncate_utf8(text: &str, max_bytes: usize) -> &str {
    if text.len() <= max_bytes {
        return text;
    }
    let mut end = max_bytes;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn simple_error_has_no_payload() {
        let bytes = error(false, 0xabcd, ErrorCode::NoSpc, "ignored");
        assert_eq!(bytes.len(), 16);
        assert_eq!(&bytes[0..4], &SIMPLE_REPLY_MAGIC.to_be_bytes());
        assert_eq!(&bytes[4..8], &28u32.to_be_bytes());
        assert_eq!(&bytes[8..16], &0xabcdu64.to_be_bytes());
    }

    #[test]
    fn structured_error_chunk_is_final_and_carries_the_message() {
        let bytes = error(true, 9, ErrorCode::Inval, "beyond the end");
        assert_eq!(&bytes[0..4], &STRUCTURED_REPLY_MAGIC.to_be_bytes());
        assert_eq!(&bytes[4..6], &REPLY_FLAG_DONE.to_be_bytes());
        assert_eq!(&bytes[6..8], &REPLY_TYPE_ERROR.to_be_bytes());
        assert_eq!(&bytes[8..16], &9u64.to_be_bytes());
        let length = u32::from_be_bytes(bytes[16..20].try_into().unwrap()) as usize;
        assert_eq!(length, bytes.len() - 20);
        assert_eq!(&bytes[20..24], &22u32.to_be_bytes());
        assert_eq!(&bytes[24..26], &14u16.to_be_bytes());
        assert_eq!(&bytes[26..], b"beyond the end");
    }

    #[test]
    fn long_messages_are_cut_on_a_character_boundary() {
        let message = "é".repeat(400); // 800 bytes
        let bytes = error(true, 1, ErrorCode::Io, &message);
        let message_bytes = u16::from_be_bytes([bytes[24], bytes[25]]) as usize;
        assert!(message_bytes <= 512);
        assert!(std::str::from_utf8(&bytes[26..]).is_ok());
        assert_eq!(bytes.len(), 26 + message_bytes);
    }

    #[test]
    fn structured_read_prefix_describes_one_done_data_chunk() {
        let mut prefix = [0u8; 28];
        put_read_prefix(&mut prefix, true, 5, 4096, 1000);
        assert_eq!(&prefix[4..6], &REPLY_FLAG_DONE.to_be_bytes());
        assert_eq!(&prefix[6..8], &REPLY_TYPE_OFFSET_DATA.to_be_bytes());
        assert_eq!(&prefix[16..20], &1008u32.to_be_bytes());
        assert_eq!(&prefix[20..28], &4096u64.to_be_bytes());
        // A zero-length read: the chunk header alone, NBD_REPLY_TYPE_NONE, nothing after it.
        assert_eq!(read_prefix_bytes(true, 0), 20);
        let mut none = [0u8; 20];
        put_read_prefix(&mut none, true, 5, 4096, 0);
        assert_eq!(&none[6..8], &REPLY_TYPE_NONE.to_be_bytes());
        assert_eq!(&none[16..20], &0u32.to_be_bytes());
        assert_eq!(read_prefix_bytes(true, 1000), 28);
        assert_eq!(read_prefix_bytes(false, 0), 16);
    }

    #[test]
    fn block_status_chunk_carries_the_context_and_descriptors() {
        let bytes = block_status(3, 1, &[(4096, STATE_HOLE | STATE_ZERO), (8192, 0)]);
        assert_eq!(&bytes[0..4], &STRUCTURED_REPLY_MAGIC.to_be_bytes());
        assert_eq!(&bytes[4..6], &REPLY_FLAG_DONE.to_be_bytes());
        assert_eq!(&bytes[6..8], &REPLY_TYPE_BLOCK_STATUS.to_be_bytes());
        assert_eq!(&bytes[8..16], &3u64.to_be_bytes());
        assert_eq!(&bytes[16..20], &20u32.to_be_bytes());
        assert_eq!(&bytes[20..24], &1u32.to_be_bytes());
        assert_eq!(&bytes[24..28], &4096u32.to_be_bytes());
        assert_eq!(&bytes[28..32], &3u32.to_be_bytes());
        assert_eq!(&bytes[32..36], &8192u32.to_be_bytes());
        assert_eq!(&bytes[36..40], &0u32.to_be_bytes());
        assert_eq!(bytes.len(), 40);
    }

    #[test]
    fn option_reply_layout() {
        let bytes = option_reply(OPT_LIST, REP_SERVER, b"abc");
        assert_eq!(&bytes[0..8], &OPTION_REPLY_MAGIC.to_be_bytes());
        assert_eq!(&bytes[8..12], &OPT_LIST.to_be_bytes());
        assert_eq!(&bytes[12..16], &REP_SERVER.to_be_bytes());
        assert_eq!(&bytes[16..20], &3u32.to_be_bytes());
        assert_eq!(&bytes[20..], b"abc");
    }
}
