//! The command body of a whole request message: OP_MSG viewed in place, OP_COMPRESSED
//! wrapping OP_MSG decompressed (bounded) and checked, anything else opaque.

use std::ops::Range;

use bson::RawDocument;

use crate::compressed::Compressed;
use crate::opmsg::{self, OpMsg};
use crate::{Header, OpCode, WireError, HEADER_LEN};

/// The command body of a whole request message.
#[derive(Debug, Clone)]
pub enum RequestBody<'a> {
    /// A plain OP_MSG, viewed in place (no copy).
    Msg(OpMsg<'a>),
    /// OP_COMPRESSED wrapping OP_MSG: the decompressed OP_MSG payload (the bytes after the
    /// wrapped message's header), already validated.
    Decompressed {
        payload: Vec<u8>,
        compressor: u8,
        flags: u32,
        /// Where the body document sits in `payload`.
        body_range: Range<usize>,
        /// Where the sections end in `payload` (the checksum, if any, follows).
        sections_end: usize,
    },
    /// Anything else (OP_QUERY handshakes, legacy opcodes, OP_COMPRESSED wrapping those):
    /// relayed as is.
    NotCommand,
}

impl RequestBody<'_> {
    /// The kind-0 body, `None` for [`RequestBody::NotCommand`].
    pub fn body(&self) -> Option<&RawDocument> {
        match self {
            RequestBody::Msg(m) => Some(m.body),
            RequestBody::Decompressed {
                payload,
                body_range,
                ..
            } => RawDocument::from_bytes(payload.get(body_range.clone())?).ok(),
            RequestBody::NotCommand => None,
        }
    }

    /// The OP_MSG flag bits (0 for `NotCommand`).
    pub fn flags(&self) -> u32 {
        match self {
            RequestBody::Msg(m) => m.flags,
            RequestBody::Decompressed { flags, .. } => *flags,
            RequestBody::NotCommand => 0,
        }
    }
}

/// Reads the header of a whole message and checks `16 <= messageLength <= max` and that it
/// matches the bytes we have.
pub fn checked_header(msg: &[u8], max: usize) -> Result<Header, WireError> {
    let h = Header::parse(msg).ok_or(WireError::Truncated("message header"))?;
    check_length(&h, msg.len(), max)?;
    Ok(h)
}

/// Checks an already read header: `16 <= messageLength <= max`, and equal to `len`, the
/// bytes we have.
pub fn check_length(h: &Header, len: usize, max: usize) -> Result<(), WireError> {
    if h.length < HEADER_LEN as i32 || h.length as i64 > max as i64 {
        return Err(WireError::BadLength {
            len: h.length as i64,
            max,
        });
    }
    if h.length as usize != len {
        return Err(WireError::Overrun {
            what: "message",
            len: h.length as i64,
            room: len,
        });
    }
    Ok(())
}

/// The CRC-32C of an OP_MSG given as a header (possibly reconstructed, for a decompressed
/// message) and the payload up to the checksum.
pub fn op_msg_crc(header: &Header, payload_before_crc: &[u8]) -> u32 {
    let mut head = [0u8; HEADER_LEN];
    let mut w = &mut head[..];
    header.put(&mut w);
    crc32c::crc32c_append(crc32c::crc32c(&head), payload_before_crc)
}

/// The command body of a whole request message (header included). OP_MSG is viewed in place
/// and its checksum verified; OP_COMPRESSED wrapping OP_MSG is decompressed (size bounded by
/// `max_message_size`) and checked the same way; anything else is `NotCommand`.
pub fn request_body(msg: &[u8], max_message_size: usize) -> Result<RequestBody<'_>, WireError> {
    let header = checked_header(msg, max_message_size)?;
    let payload = &msg[HEADER_LEN..];
    match header.op_code {
        OpCode::MSG => {
            let m = OpMsg::parse(payload)?;
            if m.checksum_present() {
                opmsg::verify_checksum(msg)?;
            }
            Ok(RequestBody::Msg(m))
        }
        OpCode::COMPRESSED => {
            let c = Compressed::parse(payload)?;
            if c.original_opcode != OpCode::MSG {
                return Ok(RequestBody::NotCommand);
            }
            let inner = decompress_op_msg(&header, &c, max_message_size)?;
            let m = OpMsg::parse(&inner)?;
            let (flags, body_range, sections_end) = (m.flags, m.body_range.clone(), m.sections_end);
            Ok(RequestBody::Decompressed {
                payload: inner,
                compressor: c.compressor,
                flags,
                body_range,
                sections_end,
            })
        }
        _ => Ok(RequestBody::NotCommand),
    }
}

/// Decompresses an OP_COMPRESSED that wraps an OP_MSG and verifies the inner checksum, if
/// any, over the reconstructed header (as the server does).
pub fn decompress_op_msg(
    header: &Header,
    c: &Compressed<'_>,
    max_message_size: usize,
) -> Result<Vec<u8>, WireError> {
    let inner = c.decompress(max_message_size.saturating_sub(HEADER_LEN))?;
    let flags = inner
        .get(..4)
        .map_or(0, |f| u32::from_le_bytes([f[0], f[1], f[2], f[3]]));
    if flags & opmsg::CHECKSUM_PRESENT != 0 {
        let split = inner
            .len()
            .checked_sub(4)
            .ok_or(WireError::Truncated("op_msg checksum"))?;
        let stated = u32::from_le_bytes([
            inner[split],
            inner[split + 1],
            inner[split + 2],
            inner[split + 3],
        ]);
        let computed = op_msg_crc(&inner_header(header, inner.len()), &inner[..split]);
        if stated != computed {
            return Err(WireError::ChecksumMismatch { stated, computed });
        }
    }
    Ok(inner)
}

/// The header of the message an OP_COMPRESSED wraps, as the server reconstructs it.
pub fn inner_header(outer: &Header, payload_len: usize) -> Header {
    Header {
        length: (HEADER_LEN + payload_len) as i32,
        request_id: outer.request_id,
        response_to: outer.response_to,
        op_code: OpCode::MSG,
    }
}

/// How much of a compressed OP_MSG [`command_name_in_prefix`] needs: flags, section kind,
/// document length, element type, and a key of up to 255 bytes with its NUL.
pub const COMMAND_PREFIX: usize = 4 + 1 + 4 + 1 + 256;

/// The command name (the body's first key) read from the start of an OP_MSG payload (the
/// bytes after the header), when the body is the first section and its first key lies
/// within `prefix`. `None` otherwise (a document sequence first, an empty body, a longer
/// key): the caller opens the whole message.
pub fn command_name_in_prefix(prefix: &[u8]) -> Option<&str> {
    if *prefix.get(4)? != 0 {
        return None;
    }
    let doc_len = i32::from_le_bytes(prefix.get(5..9)?.try_into().ok()?);
    // An element needs a type byte, a key of at least its NUL, and the document's own NUL.
    if doc_len < 5 + 1 + 1 + 1 || *prefix.get(9)? == 0 {
        return None;
    }
    let key = prefix.get(10..)?;
    let end = key.iter().position(|&b| b == 0)?;
    std::str::from_utf8(&key[..end]).ok()
}

#[cfg(test)]
mod prefix_tests {
    use super::*;
    use crate::compressed::{compress, Compressed, ZLIB, ZSTD};

    #[test]
    fn command_name_from_a_prefix_of_a_bomb() {
        // An insert whose body expands to 40 MB: its name costs a few hundred bytes.
        let pad = 40_000_000usize;
        let mut elems = vec![2u8];
        elems.extend_from_slice(b"insert\0");
        elems.extend_from_slice(&2i32.to_le_bytes());
        elems.extend_from_slice(b"c\0");
        elems.push(5);
        elems.extend_from_slice(b"pad\0");
        elems.extend_from_slice(&(pad as i32).to_le_bytes());
        elems.push(0);
        elems.resize(elems.len() + pad, 0);
        let mut payload = vec![0, 0, 0, 0, 0];
        payload.extend_from_slice(&((elems.len() + 5) as i32).to_le_bytes());
        payload.extend_from_slice(&elems);
        payload.push(0);
        for compressor in [ZLIB, ZSTD] {
            let data = compress(compressor, &payload).unwrap();
            let mut wire = Vec::new();
            wire.extend_from_slice(&crate::OpCode::MSG.to_le_bytes());
            wire.extend_from_slice(&(payload.len() as i32).to_le_bytes());
            wire.push(compressor);
            wire.extend_from_slice(&data);
            let c = Compressed::parse(&wire).unwrap();
            let prefix = c.decompress_prefix(COMMAND_PREFIX).unwrap();
            assert_eq!(prefix.len(), COMMAND_PREFIX);
            assert_eq!(command_name_in_prefix(&prefix), Some("insert"));
        }
    }

    #[test]
    fn a_snappy_length_past_snappys_ratio_is_refused_before_allocating() {
        use crate::compressed::SNAPPY;
        // Varint 48,000,000 then one literal byte: snappy cannot expand 6 bytes that far.
        let mut data = Vec::new();
        let mut n = 48_000_000u32;
        while n >= 0x80 {
            data.push((n as u8) | 0x80);
            n >>= 7;
        }
        data.push(n as u8);
        data.extend_from_slice(&[0, b'x']);
        let mut wire = Vec::new();
        wire.extend_from_slice(&crate::OpCode::MSG.to_le_bytes());
        wire.extend_from_slice(&48_000_000i32.to_le_bytes());
        wire.push(SNAPPY);
        wire.extend_from_slice(&data);
        let c = Compressed::parse(&wire).unwrap();
        assert!(matches!(
            c.decompress(48_000_000),
            Err(WireError::Decompress(_))
        ));
        assert!(matches!(
            c.decompress_prefix(COMMAND_PREFIX),
            Err(WireError::Decompress(_))
        ));
    }

    #[test]
    fn no_name_without_a_body_first() {
        assert_eq!(command_name_in_prefix(&[0, 0, 0, 0, 1, 9, 0, 0, 0]), None);
        assert_eq!(
            command_name_in_prefix(&[0, 0, 0, 0, 0, 5, 0, 0, 0, 0]),
            None
        );
        assert_eq!(
            command_name_in_prefix(&[0, 0, 0, 0, 0, 16, 0, 0, 0, 2, b'f', b'i']),
            None
        );
        assert_eq!(
            command_name_in_prefix(&[0, 0, 0, 0, 0, 16, 0, 0, 0, 2, b'f', 0]),
            Some("f")
        );
    }
}
