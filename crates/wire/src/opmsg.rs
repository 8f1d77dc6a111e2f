//! OP_MSG (2013): flags, sections and the optional CRC-32C trailer, viewed in place.

use std::ops::Range;

use bson::RawDocument;

use super::{read_cstr, read_doc, read_i32, read_u32, WireError};

pub const CHECKSUM_PRESENT: u32 = 1 << 0;
pub const MORE_TO_COME: u32 = 1 << 1;
pub const EXHAUST_ALLOWED: u32 = 1 << 16;
/// Required bits (0..15) we understand; any other required bit is a protocol error.
const KNOWN_REQUIRED: u32 = CHECKSUM_PRESENT | MORE_TO_COME;

/// A validated view of an OP_MSG payload (the bytes after the 16-byte header).
#[derive(Debug, Clone)]
pub struct OpMsg<'a> {
    pub flags: u32,
    /// The kind-0 section's document.
    pub body: &'a RawDocument,
    /// Where the body document sits inside the payload (after its kind byte).
    pub body_range: Range<usize>,
    /// Where the sections end inside the payload (the checksum, if any, follows).
    pub sections_end: usize,
    /// Number of kind-1 document sequences.
    pub sequences: usize,
}

impl<'a> OpMsg<'a> {
    /// Parses and validates `payload`, the message without its header. Does not verify the
    /// checksum: see [`verify_checksum`], which needs the header as well.
    pub fn parse(payload: &'a [u8]) -> Result<OpMsg<'a>, WireError> {
        let flags = read_u32(payload, 0).ok_or(WireError::Truncated("op_msg flags"))?;
        if flags & 0xffff & !KNOWN_REQUIRED != 0 {
            return Err(WireError::UnknownRequiredFlags(
                flags & 0xffff & !KNOWN_REQUIRED,
            ));
        }
        let end = if flags & CHECKSUM_PRESENT != 0 {
            payload
                .len()
                .checked_sub(4)
                .filter(|&e| e >= 4)
                .ok_or(WireError::Truncated("op_msg checksum"))?
        } else {
            payload.len()
        };
        let mut at = 4;
        let mut body = None;
        let mut bodies = 0;
        let mut sequences = 0;
        while at < end {
            let kind = payload[at];
            at += 1;
            let room = &payload[at..end];
            match kind {
                0 => {
                    let doc = read_doc(room, "op_msg body")?;
                    bodies += 1;
                    body = Some((doc, at..at + doc.as_bytes().len()));
                    at += doc.as_bytes().len();
                }
                1 => {
                    at += check_sequence(room)?;
                    sequences += 1;
                }
                2 => {
                    at += read_doc(room, "op_msg security token")?.as_bytes().len();
                }
                other => return Err(WireError::UnknownSectionKind(other)),
            }
        }
        match (bodies, body) {
            (1, Some((body, body_range))) => Ok(OpMsg {
                flags,
                body,
                body_range,
                sections_end: end,
                sequences,
            }),
            (n, _) => Err(WireError::BodyCount(n)),
        }
    }

    #[inline]
    pub fn more_to_come(&self) -> bool {
        self.flags & MORE_TO_COME != 0
    }

    #[inline]
    pub fn checksum_present(&self) -> bool {
        self.flags & CHECKSUM_PRESENT != 0
    }
}

/// Validates a kind-1 section at the front of `room`; returns its size.
fn check_sequence(room: &[u8]) -> Result<usize, WireError> {
    let size = read_i32(room, 0).ok_or(WireError::Truncated("op_msg document sequence"))?;
    if size < 5 || size as usize > room.len() {
        return Err(WireError::Overrun {
            what: "op_msg document sequence",
            len: size as i64,
            room: room.len(),
        });
    }
    let seq = &room[4..size as usize];
    let (_, used) = read_cstr(seq, "op_msg sequence identifier")?;
    let mut docs = &seq[used..];
    while !docs.is_empty() {
        let doc = read_doc(docs, "op_msg sequence document")?;
        docs = &docs[doc.as_bytes().len()..];
    }
    Ok(size as usize)
}

/// Verifies the CRC-32C trailer of a whole OP_MSG (header included) whose flags say it has one.
pub fn verify_checksum(msg: &[u8]) -> Result<(), WireError> {
    let split = msg
        .len()
        .checked_sub(4)
        .ok_or(WireError::Truncated("op_msg checksum"))?;
    let stated = read_u32(msg, split).ok_or(WireError::Truncated("op_msg checksum"))?;
    let computed = crc32c::crc32c(&msg[..split]);
    if stated != computed {
        return Err(WireError::ChecksumMismatch { stated, computed });
    }
    Ok(())
}

/// Reads the flag bits of a whole OP_MSG without validating anything else.
#[inline]
pub fn flags_of(msg: &[u8]) -> u32 {
    read_u32(msg, 16).unwrap_or(0)
}
