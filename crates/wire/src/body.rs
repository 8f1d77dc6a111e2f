//! What the request and reply views share about a whole message: its header's length checks,
//! an OP_MSG's CRC-32C (over a reconstructed header for a decompressed one), and the command
//! name read from the first bytes of a compressed OP_MSG.

use crate::opmsg;
use crate::{Header, OpCode, WireError, HEADER_LEN};

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

/// Verifies the checksum, if any, of an OP_MSG payload an OP_COMPRESSED wrapped (the bytes
/// after the wrapped message's header), over the header the server reconstructs from `outer`.
pub fn verify_inner_checksum(outer: &Header, inner: &[u8]) -> Result<(), WireError> {
    let flags = inner
        .get(..4)
        .map_or(0, |f| u32::from_le_bytes([f[0], f[1], f[2], f[3]]));
    if flags & opmsg::CHECKSUM_PRESENT == 0 {
        return Ok(());
    }
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
    let computed = op_msg_crc(&inner_header(outer, inner.len()), &inner[..split]);
    if stated != computed {
        return Err(WireError::ChecksumMismatch { stated, computed });
    }
    Ok(())
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
    use bytes::Bytes;

    use super::*;
    use crate::compressed::{compress, SNAPPY, ZLIB, ZSTD};
    use crate::Request;

    /// `payload` (an OP_MSG after its header) as a whole OP_COMPRESSED message.
    fn wrapped(compressor: u8, payload: &[u8]) -> Bytes {
        let data = compress(compressor, payload).unwrap();
        let mut wire = Vec::new();
        let len = (HEADER_LEN + 9 + data.len()) as i32;
        for v in [len, 7, 0, OpCode::COMPRESSED, OpCode::MSG] {
            wire.extend_from_slice(&v.to_le_bytes());
        }
        wire.extend_from_slice(&(payload.len() as i32).to_le_bytes());
        wire.push(compressor);
        wire.extend_from_slice(&data);
        Bytes::from(wire)
    }

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
            let mut req = Request::new(wrapped(compressor, &payload), 48_000_000).unwrap();
            let peek = req.peek(48_000_000, 64 * 1024).unwrap().unwrap();
            assert_eq!(peek.command_name, "insert");
            assert!(!peek.more_to_come());
            // Opening it afterwards goes on from the prefix to the same whole message.
            req.inflate(48_000_000).unwrap();
            assert_eq!(req.command_name().unwrap(), Some("insert"));
            assert_eq!(req.command_key().unwrap(), Some(&b"insert"[..]));
            assert_eq!(req.parts().unwrap().payload, &payload[..]);
        }
        // Snappy cannot stop early: past `inline` it is not peeked at.
        let mut req = Request::new(wrapped(SNAPPY, &payload), 48_000_000).unwrap();
        assert_eq!(req.peek(48_000_000, 64 * 1024).unwrap(), None);
        assert!(req.needs_inflate());
    }

    #[test]
    fn a_snappy_length_past_snappys_ratio_is_refused_before_allocating() {
        use crate::compressed::Compressed;
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
        let mut frame = Vec::new();
        let len = (HEADER_LEN + wire.len()) as i32;
        for v in [len, 7, 0, OpCode::COMPRESSED] {
            frame.extend_from_slice(&v.to_le_bytes());
        }
        frame.extend_from_slice(&wire);
        let mut req = Request::new(Bytes::from(frame), 64_000_000).unwrap();
        assert!(matches!(
            req.peek(64_000_000, 64_000_000),
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
