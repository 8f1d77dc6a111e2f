//! The MongoDB wire protocol: framing, message views, message builders, and the BSON element
//! scanner the views and the proxy's classification share.
//!
//! A crate of its own so that the proxy and the simulated cluster (`staleguard-sim`) share it
//! without the simulator being part of the proxy.
//!
//! Everything here works on borrowed bytes of a whole received message (header included).
//! Views check every declared length against the enclosing one and never copy; only
//! decompression and the builders allocate. The relay opens each message once: a request as
//! a [`Request`] (header, OP_MSG or OP_QUERY view, a compressed one's decompression kept,
//! from a peek at its command name to a retry, command name), a reply as a [`Reply`]
//! (header, then its status when a tracked read needs it). `Request` is the only way this
//! crate opens a request.

// These bytes come from untrusted peers: no unsafe code anywhere in the crate.
#![forbid(unsafe_code)]

pub mod body;
pub mod codec;
pub mod compressed;
pub mod counters;
pub mod dupids;
pub mod header;
pub mod idtable;
pub mod legacy;
pub mod opmsg;
pub mod replies;
pub mod reply;
pub mod request;
pub mod scan;
pub mod status;
pub mod stream_scan;
#[cfg(test)]
mod testbson;

pub use codec::MessageCodec;
pub use header::{Header, OpCode, HEADER_LEN};
pub use replies::{Head, Incoming, StreamCodec, REQUEST_HEAD};
pub use request::{MsgParts, Peek, Request};
pub use status::{inspect_reply, Reply, ReplyStatus};
pub use stream_scan::StreamScan;

/// Default for `max_message_size`: mongos's `maxMessageSizeBytes`.
pub const DEFAULT_MAX_MESSAGE_SIZE: usize = 48_000_000;

/// A message that cannot be understood. Always the peer's fault; it closes that peer only.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum WireError {
    #[error("message length {len} outside 16..={max}")]
    BadLength { len: i64, max: usize },
    #[error("message truncated: {0}")]
    Truncated(&'static str),
    #[error("op_msg sets unknown required flag bits {0:#06x}")]
    UnknownRequiredFlags(u32),
    #[error("op_msg section kind {0} is unknown")]
    UnknownSectionKind(u8),
    #[error("op_msg {what} length {len} overruns its enclosing {room} bytes")]
    Overrun {
        what: &'static str,
        len: i64,
        room: usize,
    },
    #[error("op_msg has {0} body sections, expected exactly one")]
    BodyCount(usize),
    #[error("op_msg checksum mismatch: message says {stated:#010x}, bytes give {computed:#010x}")]
    ChecksumMismatch { stated: u32, computed: u32 },
    #[error("malformed bson in {0}")]
    BadBson(&'static str),
    #[error("cstring without terminator in {0}")]
    UnterminatedCString(&'static str),
    #[error("op_compressed uses unknown compressor id {0}")]
    UnknownCompressor(u8),
    #[error("op_compressed wraps opcode {0}, which cannot be compressed")]
    BadInnerOpcode(i32),
    #[error("op_compressed declares {declared} uncompressed bytes, got {actual}")]
    SizeMismatch { declared: i64, actual: usize },
    #[error("decompression failed: {0}")]
    Decompress(String),
    #[error("{0} cannot be read in pieces")]
    Streamed(&'static str),
}

/// Reads a little-endian i32 at `at`, if the slice is long enough.
#[inline]
pub fn read_i32(b: &[u8], at: usize) -> Option<i32> {
    let s = b.get(at..at.checked_add(4)?)?;
    Some(i32::from_le_bytes([s[0], s[1], s[2], s[3]]))
}

/// Reads a little-endian u32 at `at`, if the slice is long enough.
#[inline]
pub fn read_u32(b: &[u8], at: usize) -> Option<u32> {
    read_i32(b, at).map(|v| v as u32)
}

/// Splits a NUL-terminated UTF-8 string off the front of `b`; returns it and the bytes consumed.
pub fn read_cstr<'a>(b: &'a [u8], what: &'static str) -> Result<(&'a str, usize), WireError> {
    let nul = b
        .iter()
        .position(|&c| c == 0)
        .ok_or(WireError::UnterminatedCString(what))?;
    let s = std::str::from_utf8(&b[..nul]).map_err(|_| WireError::BadBson(what))?;
    Ok((s, nul + 1))
}

/// Checks a BSON document's declared length at the front of `b` and returns the document.
pub fn read_doc<'a>(b: &'a [u8], what: &'static str) -> Result<&'a bson::RawDocument, WireError> {
    let len = read_i32(b, 0).ok_or(WireError::Truncated(what))?;
    if len < 5 || len as usize > b.len() {
        return Err(WireError::Overrun {
            what,
            len: len as i64,
            room: b.len(),
        });
    }
    bson::RawDocument::from_bytes(&b[..len as usize]).map_err(|_| WireError::BadBson(what))
}
