//! Rewrites of a read command: `readConcern: {level: "available"}` and `maxTimeMS`, spliced
//! into the original bytes; message length and checksum fixed; compression redone.

use bson::RawDocument;
use bytes::Bytes;

use crate::command::scan::{self, Elem, Elements, Malformed};
use crate::command::{self, checked_header, inner_header, op_msg_crc, RequestBody};
use crate::wire::compressed::compress;
use crate::wire::{Header, OpCode, WireError, HEADER_LEN};

/// What to change in a read command. Everything else is copied byte for byte.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RewriteSpec {
    /// Set `readConcern` to `{level: "available"}`, keeping its other subfields.
    pub available: bool,
    /// With `available`: also drop `readConcern.afterClusterTime` (the server rejects
    /// `available` with it, InvalidOptions 72).
    pub drop_after_cluster_time: bool,
    /// Set `maxTimeMS` (the caller has already taken the min of the client's value and the
    /// cap, or the remaining retry budget). Values below 1 are written as 1: `maxTimeMS: 0`
    /// would mean "no limit".
    pub max_time_ms: Option<i64>,
}

/// Returns `body` with the edits of `spec`: `readConcern` and `maxTimeMS` replaced where they
/// stand, or appended at the end; every other element spliced over unchanged, in order.
pub fn rewrite_body(body: &RawDocument, spec: &RewriteSpec) -> Result<Vec<u8>, WireError> {
    let body = body.as_bytes();
    let len = rewritten_len(body, spec)?;
    let mut out = Vec::with_capacity(len);
    write_body(body, spec, len, &mut out)?;
    Ok(out)
}

/// Rewrites the body of a whole request message (header included): OP_MSG, or OP_COMPRESSED
/// wrapping OP_MSG (recompressed with the same compressor). Lengths are fixed, the CRC-32C is
/// recomputed when the message carries one, and the result must fit `max_message_size`.
pub fn rewrite_message(
    msg: &[u8],
    spec: &RewriteSpec,
    max_message_size: usize,
) -> Result<Bytes, WireError> {
    let req = command::request_body(msg, max_message_size)?;
    rewrite_request(msg, &req, spec, max_message_size)
}

/// [`rewrite_message`] for a message already opened with [`command::request_body`], which
/// saves a second decompression. `msg` must be the message `req` was made from.
pub fn rewrite_request(
    msg: &[u8],
    req: &RequestBody<'_>,
    spec: &RewriteSpec,
    max_message_size: usize,
) -> Result<Bytes, WireError> {
    let header = checked_header(msg, max_message_size)?;
    match req {
        RequestBody::Msg(m) => {
            let payload = &msg[HEADER_LEN..];
            let crc = m.checksum_present();
            let layout = Layout::new(m.body.as_bytes(), &m.body_range, m.sections_end, crc, spec)?;
            let total = fits(HEADER_LEN + layout.payload_len, max_message_size)?;
            let mut out = Vec::with_capacity(total);
            Header {
                length: total as i32,
                ..header
            }
            .put(&mut out);
            layout.write(payload, spec, &mut out)?;
            if crc {
                let sum = crc32c::crc32c(&out);
                out.extend_from_slice(&sum.to_le_bytes());
            }
            debug_assert_eq!(out.len(), total);
            Ok(Bytes::from(out))
        }
        RequestBody::Decompressed {
            payload,
            compressor,
            flags,
            body_range,
            sections_end,
        } => {
            let body = payload
                .get(body_range.clone())
                .ok_or(WireError::Truncated("op_msg body"))?;
            let crc = flags & crate::wire::opmsg::CHECKSUM_PRESENT != 0;
            let layout = Layout::new(body, body_range, *sections_end, crc, spec)?;
            let inner_len = layout.payload_len;
            fits(HEADER_LEN + inner_len, max_message_size)?;
            let mut inner = Vec::with_capacity(inner_len);
            layout.write(payload, spec, &mut inner)?;
            if crc {
                let sum = op_msg_crc(&inner_header(&header, inner_len), &inner);
                inner.extend_from_slice(&sum.to_le_bytes());
            }
            let data = compress(*compressor, &inner)?;
            let total = fits(HEADER_LEN + 9 + data.len(), max_message_size)?;
            let mut out = Vec::with_capacity(total);
            Header {
                length: total as i32,
                ..header
            }
            .put(&mut out);
            out.extend_from_slice(&OpCode::MSG.to_le_bytes());
            out.extend_from_slice(&(inner_len as i32).to_le_bytes());
            out.push(*compressor);
            out.extend_from_slice(&data);
            Ok(Bytes::from(out))
        }
        // There is no "not an OP_MSG" variant; this is the closest.
        RequestBody::NotCommand => Err(WireError::BadInnerOpcode(header.op_code)),
    }
}

/// Checks a message size against the limit (and i32).
fn fits(len: usize, max: usize) -> Result<usize, WireError> {
    if len > max || len > i32::MAX as usize {
        return Err(WireError::BadLength {
            len: len as i64,
            max,
        });
    }
    Ok(len)
}

fn bad_body(_: Malformed) -> WireError {
    WireError::BadBson("command body")
}

/// Where the pieces of a rewritten OP_MSG payload come from.
struct Layout<'b> {
    body: &'b [u8],
    body_start: usize,
    body_end: usize,
    sections_end: usize,
    new_body_len: usize,
    /// The new payload (flags, sections, checksum) length.
    payload_len: usize,
}

impl<'b> Layout<'b> {
    fn new(
        body: &'b [u8],
        body_range: &std::ops::Range<usize>,
        sections_end: usize,
        crc: bool,
        spec: &RewriteSpec,
    ) -> Result<Layout<'b>, WireError> {
        let new_body_len = rewritten_len(body, spec)?;
        if sections_end < body_range.end {
            return Err(WireError::Truncated("op_msg sections"));
        }
        let payload_len = body_range.start
            + new_body_len
            + (sections_end - body_range.end)
            + if crc { 4 } else { 0 };
        Ok(Layout {
            body,
            body_start: body_range.start,
            body_end: body_range.end,
            sections_end,
            new_body_len,
            payload_len,
        })
    }

    /// Writes flags and sections (not the checksum): bytes before the body, the new body,
    /// bytes after it.
    fn write(
        &self,
        payload: &[u8],
        spec: &RewriteSpec,
        out: &mut Vec<u8>,
    ) -> Result<(), WireError> {
        let before = payload
            .get(..self.body_start)
            .ok_or(WireError::Truncated("op_msg sections"))?;
        let after = payload
            .get(self.body_end..self.sections_end)
            .ok_or(WireError::Truncated("op_msg sections"))?;
        out.extend_from_slice(before);
        write_body(self.body, spec, self.new_body_len, out)?;
        out.extend_from_slice(after);
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------
// The splice. The same code runs twice: once counting bytes (to allocate exactly once and
// to know the length prefixes), once writing.

trait Sink {
    fn put(&mut self, bytes: &[u8]);
}

/// Counts what would be written.
struct Count(usize);

impl Sink for Count {
    #[inline]
    fn put(&mut self, bytes: &[u8]) {
        self.0 += bytes.len();
    }
}

impl Sink for Vec<u8> {
    #[inline]
    fn put(&mut self, bytes: &[u8]) {
        self.extend_from_slice(bytes);
    }
}

const RC_KEY: &[u8] = b"readConcern\0";
const LEVEL_AVAILABLE: &[u8] = b"\x02level\0\x0a\0\0\0available\0";
const MT_KEY: &[u8] = b"maxTimeMS\0";

/// The length of the rewritten body.
fn rewritten_len(body: &[u8], spec: &RewriteSpec) -> Result<usize, WireError> {
    let mut count = Count(4 + 1);
    splice(body, spec, &mut count).map_err(bad_body)?;
    Ok(count.0)
}

/// Appends the rewritten body, whose length `len` is already known, to `out`.
fn write_body(
    body: &[u8],
    spec: &RewriteSpec,
    len: usize,
    out: &mut Vec<u8>,
) -> Result<(), WireError> {
    let start = out.len();
    out.extend_from_slice(&(len as i32).to_le_bytes());
    splice(body, spec, out).map_err(bad_body)?;
    out.push(0);
    debug_assert_eq!(out.len() - start, len);
    Ok(())
}

/// The elements of the rewritten body (no length prefix, no terminator).
fn splice<S: Sink>(body: &[u8], spec: &RewriteSpec, out: &mut S) -> Result<(), Malformed> {
    let mut elems = Elements::new(body)?;
    let mut copied = 4;
    let (mut saw_rc, mut saw_mt) = (false, false);
    while let Some(e) = elems.next_elem()? {
        let rc = spec.available && e.key == b"readConcern";
        let mt = match spec.max_time_ms {
            Some(n) if e.key == b"maxTimeMS" => Some(n),
            _ => None,
        };
        if !rc && mt.is_none() {
            continue;
        }
        out.put(&body[copied..e.start]);
        copied = e.end;
        if rc {
            saw_rc = true;
            read_concern(Some(&e), spec, out)?;
        } else if let Some(n) = mt {
            saw_mt = true;
            max_time_ms(Some(e.tag), n, out);
        }
    }
    out.put(&body[copied..body.len() - 1]);
    if spec.available && !saw_rc {
        read_concern(None, spec, out)?;
    }
    if let (Some(n), false) = (spec.max_time_ms, saw_mt) {
        max_time_ms(None, n, out);
    }
    Ok(())
}

/// `readConcern: {level: "available", <old subfields but level (and afterClusterTime)>}`.
fn read_concern<S: Sink>(
    old: Option<&Elem<'_>>,
    spec: &RewriteSpec,
    out: &mut S,
) -> Result<(), Malformed> {
    // Only a document's subfields are kept; any other value is simply replaced.
    let old = old.filter(|e| e.tag == scan::DOCUMENT).map(|e| e.value);
    let mut inner = Count(0);
    read_concern_fields(old, spec, &mut inner)?;
    out.put(&[scan::DOCUMENT]);
    out.put(RC_KEY);
    out.put(&((4 + inner.0 + 1) as i32).to_le_bytes());
    read_concern_fields(old, spec, out)?;
    out.put(&[0]);
    Ok(())
}

fn read_concern_fields<S: Sink>(
    old: Option<&[u8]>,
    spec: &RewriteSpec,
    out: &mut S,
) -> Result<(), Malformed> {
    out.put(LEVEL_AVAILABLE);
    let Some(old) = old else {
        return Ok(());
    };
    let mut fields = Elements::new(old)?;
    while let Some(f) = fields.next_elem()? {
        let dropped =
            f.key == b"level" || (spec.drop_after_cluster_time && f.key == b"afterClusterTime");
        if !dropped {
            out.put(&old[f.start..f.end]);
        }
    }
    Ok(())
}

/// `maxTimeMS: n` as int32 if the client sent int32 and `n` fits, as a double if the client
/// sent a double, else as int64.
fn max_time_ms<S: Sink>(old_tag: Option<u8>, n: i64, out: &mut S) {
    let n = n.max(1);
    match (old_tag, i32::try_from(n)) {
        (Some(scan::INT32), Ok(v)) => {
            out.put(&[scan::INT32]);
            out.put(MT_KEY);
            out.put(&v.to_le_bytes());
        }
        (Some(scan::DOUBLE), _) => {
            out.put(&[scan::DOUBLE]);
            out.put(MT_KEY);
            out.put(&(n as f64).to_le_bytes());
        }
        _ => {
            out.put(&[scan::INT64]);
            out.put(MT_KEY);
            out.put(&n.to_le_bytes());
        }
    }
}
