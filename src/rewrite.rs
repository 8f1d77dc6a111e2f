//! Rewrites of a read command: `readConcern: {level: "available"}`, `maxTimeMS` and
//! `$readPreference: {mode: "primary"}`, spliced into the original bytes; message length and
//! checksum fixed; compression redone.

use bson::RawDocument;
use bytes::{Bytes, BytesMut};

use crate::wire::body::{inner_header, op_msg_crc};
use crate::wire::compressed::compress;
use crate::wire::scan::{self, Elem, Elements, Malformed};
use crate::wire::{Header, MsgParts, OpCode, Request, WireError, HEADER_LEN};

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
    /// Replace `$readPreference` with `{mode: "primary"}` (tags, `maxStalenessSeconds` and
    /// `hedge` go with it; read concern untouched). A body without `$readPreference` is
    /// already a primary read and keeps none.
    pub primary: bool,
}

/// Returns `body` with the edits of `spec`: `readConcern` and `maxTimeMS` replaced where they
/// stand, or appended at the end; every other element spliced over unchanged, in order.
pub fn rewrite_body(body: &RawDocument, spec: &RewriteSpec) -> Result<Vec<u8>, WireError> {
    let splice = Splice::plan(body.as_bytes(), spec, None)?;
    let mut out = Vec::with_capacity(splice.len);
    splice.write(&mut out)?;
    Ok(out)
}

/// Rewrites a request opened once ([`Request`]): no header read, no decompression (an
/// OP_COMPRESSED must have been inflated): OP_MSG, or OP_COMPRESSED wrapping OP_MSG
/// (compressed again with the same compressor). Lengths are fixed, the CRC-32C is recomputed
/// when the message carries one, and the result must fit `max_message_size`. What the relay
/// uses, for a first send and a retry; the only way to rewrite a request.
pub fn rewrite(
    req: &Request,
    spec: &RewriteSpec,
    max_message_size: usize,
) -> Result<Bytes, WireError> {
    rewrite_into(req, spec, None, max_message_size, &mut BytesMut::new())
}

pub use crate::command::Places;

impl Places {
    /// The elements `spec` replaces, read where they stand; `None` when one is not there.
    fn read<'b>(&self, body: &'b [u8], spec: &RewriteSpec) -> Option<[Option<Elem<'b>>; 3]> {
        let at = |place: Option<usize>, wanted: bool, key: &[u8]| match place {
            Some(start) if wanted => {
                let e = Elements::resume(body, start).ok()?.next_elem().ok()??;
                (e.start == start && e.key == key).then_some(Some(e))
            }
            _ => Some(None),
        };
        Some([
            at(self.read_concern, spec.available, b"readConcern")?,
            at(self.max_time, spec.max_time_ms.is_some(), b"maxTimeMS")?,
            at(self.read_pref, spec.primary, b"$readPreference")?,
        ])
    }
}

/// [`rewrite`], written in `buf` (an uncompressed message; a compressed one is built on its
/// own). A session passes the same `buf` every time: once the previous rewritten message is
/// sent and dropped, its allocation is taken back, so a rewrite allocates nothing.
/// `places`: where the request's fields stand, when its classification said.
pub fn rewrite_into(
    req: &Request,
    spec: &RewriteSpec,
    places: Option<&Places>,
    max_message_size: usize,
    buf: &mut BytesMut,
) -> Result<Bytes, WireError> {
    match req.parts() {
        Some(parts) => {
            let at = (spec, places);
            rewrite_parts(req.header(), &parts, at, max_message_size, buf)
        }
        None => Err(WireError::BadInnerOpcode(req.header().op_code)),
    }
}

/// The new message: `header` with its length fixed, the spliced payload, the checksum
/// recomputed when there is one; compressed again when the original was.
fn rewrite_parts(
    header: &Header,
    parts: &MsgParts<'_>,
    (spec, places): (&RewriteSpec, Option<&Places>),
    max_message_size: usize,
    buf: &mut BytesMut,
) -> Result<Bytes, WireError> {
    let body = parts
        .payload
        .get(parts.body_range.clone())
        .ok_or(WireError::Truncated("op_msg body"))?;
    let crc = parts.flags & crate::wire::opmsg::CHECKSUM_PRESENT != 0;
    let layout = Layout::new(
        body,
        &parts.body_range,
        parts.sections_end,
        crc,
        (spec, places),
    )?;
    let Some(compressor) = parts.compressor else {
        let total = fits(HEADER_LEN + layout.payload_len, max_message_size)?;
        buf.clear();
        buf.reserve(total);
        Header {
            length: total as i32,
            ..*header
        }
        .put(buf);
        if let Err(e) = layout.write(parts.payload, buf) {
            buf.clear();
            return Err(e);
        }
        if crc {
            let sum = crc32c::crc32c(buf);
            buf.extend_from_slice(&sum.to_le_bytes());
        }
        debug_assert_eq!(buf.len(), total);
        let out = buf.split().freeze();
        if total > crate::wire::codec::SHRINK_AFTER {
            // A large message's allocation goes with it once sent, not kept for the next.
            *buf = BytesMut::new();
        }
        return Ok(out);
    };
    let inner_len = layout.payload_len;
    fits(HEADER_LEN + inner_len, max_message_size)?;
    let mut inner = Vec::with_capacity(inner_len);
    layout.write(parts.payload, &mut inner)?;
    if crc {
        let sum = op_msg_crc(&inner_header(header, inner_len), &inner);
        inner.extend_from_slice(&sum.to_le_bytes());
    }
    let data = compress(compressor, &inner)?;
    let total = fits(HEADER_LEN + 9 + data.len(), max_message_size)?;
    let mut out = Vec::with_capacity(total);
    Header {
        length: total as i32,
        ..*header
    }
    .put(&mut out);
    out.extend_from_slice(&OpCode::MSG.to_le_bytes());
    out.extend_from_slice(&(inner_len as i32).to_le_bytes());
    out.push(compressor);
    out.extend_from_slice(&data);
    Ok(Bytes::from(out))
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
    splice: Splice<'b>,
    body_start: usize,
    body_end: usize,
    sections_end: usize,
    /// The new payload (flags, sections, checksum) length.
    payload_len: usize,
}

impl<'b> Layout<'b> {
    fn new(
        body: &'b [u8],
        body_range: &std::ops::Range<usize>,
        sections_end: usize,
        crc: bool,
        (spec, places): (&RewriteSpec, Option<&Places>),
    ) -> Result<Layout<'b>, WireError> {
        let splice = Splice::plan(body, spec, places)?;
        if sections_end < body_range.end {
            return Err(WireError::Truncated("op_msg sections"));
        }
        let payload_len = body_range.start
            + splice.len
            + (sections_end - body_range.end)
            + if crc { 4 } else { 0 };
        Ok(Layout {
            splice,
            body_start: body_range.start,
            body_end: body_range.end,
            sections_end,
            payload_len,
        })
    }

    /// Writes flags and sections (not the checksum): bytes before the body, the new body,
    /// bytes after it.
    fn write(&self, payload: &[u8], out: &mut impl Out) -> Result<(), WireError> {
        let before = payload
            .get(..self.body_start)
            .ok_or(WireError::Truncated("op_msg sections"))?;
        let after = payload
            .get(self.body_end..self.sections_end)
            .ok_or(WireError::Truncated("op_msg sections"))?;
        out.put(before);
        self.splice.write(out)?;
        out.put(after);
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------
// The splice: one scan finds the elements to replace and gives the exact new length (so the
// output is allocated once); then the bytes between them are copied in at most four memcpys.
// Only the first `readConcern` and the first `maxTimeMS` are replaced; a duplicate (which
// the server rejects anyway) is copied as it was.

const RC_KEY: &[u8] = b"readConcern\0";
const LEVEL_AVAILABLE: &[u8] = b"\x02level\0\x0a\0\0\0available\0";
const MT_KEY: &[u8] = b"maxTimeMS\0";
/// The whole `$readPreference: {mode: "primary"}` element.
const RP_PRIMARY: &[u8] = b"\x03$readPreference\0\x17\0\0\0\x02mode\0\x08\0\0\0primary\0\0";

#[derive(Debug, Clone, Copy)]
enum Edit {
    ReadConcern,
    MaxTime,
    ReadPref,
}

struct Splice<'b> {
    body: &'b [u8],
    spec: RewriteSpec,
    /// The `readConcern` element to replace (only when `spec.available`).
    rc: Option<Elem<'b>>,
    /// The length of the new readConcern's elements.
    rc_fields_len: usize,
    /// The `maxTimeMS` element to replace (only when `spec.max_time_ms` is set).
    mt: Option<Elem<'b>>,
    /// The `$readPreference` element to replace (only when `spec.primary`).
    rp: Option<Elem<'b>>,
    /// The length of the new body.
    len: usize,
}

impl<'b> Splice<'b> {
    fn plan(
        body: &'b [u8],
        spec: &RewriteSpec,
        places: Option<&Places>,
    ) -> Result<Splice<'b>, WireError> {
        let known = places.and_then(|p| p.read(body, spec));
        Self::plan_inner(body, spec, known).map_err(bad_body)
    }

    fn plan_inner(
        body: &'b [u8],
        spec: &RewriteSpec,
        known: Option<[Option<Elem<'b>>; 3]>,
    ) -> Result<Splice<'b>, Malformed> {
        let [mut rc, mut mt, mut rp] = known.unwrap_or_default();
        // The body's length and terminator are checked either way; its elements are
        // scanned only when where they stand is not known.
        let mut elems = Elements::new(body)?;
        if known.is_none() {
            while let Some(e) = elems.next_elem()? {
                if spec.available && rc.is_none() && e.key == b"readConcern" {
                    rc = Some(e);
                } else if spec.max_time_ms.is_some() && mt.is_none() && e.key == b"maxTimeMS" {
                    mt = Some(e);
                } else if spec.primary && rp.is_none() && e.key == b"$readPreference" {
                    rp = Some(e);
                }
            }
        }
        let mut len = body.len();
        let mut rc_fields_len = 0;
        if spec.available {
            let mut count = Count(0);
            read_concern_fields(old_read_concern(rc.as_ref()), spec, &mut count)?;
            rc_fields_len = count.0;
            len += 1 + RC_KEY.len() + 4 + rc_fields_len + 1;
            len -= rc.map_or(0, |e| e.end - e.start);
        }
        if let Some(n) = spec.max_time_ms {
            len += 1 + MT_KEY.len() + max_time_ms(mt.map(|e| e.tag), n).1.len;
            len -= mt.map_or(0, |e| e.end - e.start);
        }
        if let Some(e) = rp {
            len = len + RP_PRIMARY.len() - (e.end - e.start);
        }
        Ok(Splice {
            body,
            spec: *spec,
            rc,
            rc_fields_len,
            mt,
            rp,
            len,
        })
    }

    /// Appends the new body (exactly `self.len` bytes) to `out`.
    fn write(&self, out: &mut impl Out) -> Result<(), WireError> {
        self.write_inner(out).map_err(bad_body)
    }

    fn write_inner(&self, out: &mut impl Out) -> Result<(), Malformed> {
        let start_len = out.written();
        let body = self.body;
        out.put(&(self.len as i32).to_le_bytes());
        let mut edits = [
            self.rc.map(|e| (e.start, e.end, Edit::ReadConcern)),
            self.mt.map(|e| (e.start, e.end, Edit::MaxTime)),
            self.rp.map(|e| (e.start, e.end, Edit::ReadPref)),
        ];
        // In body order (absent edits last).
        edits.sort_by_key(|e| e.map_or(usize::MAX, |(start, _, _)| start));
        let mut copied = 4;
        for (start, end, edit) in edits.into_iter().flatten() {
            out.put(&body[copied..start]);
            copied = end;
            match edit {
                Edit::ReadConcern => self.put_read_concern(out)?,
                Edit::MaxTime => self.put_max_time_ms(out),
                Edit::ReadPref => out.put(RP_PRIMARY),
            }
        }
        out.put(&body[copied..body.len() - 1]);
        if self.spec.available && self.rc.is_none() {
            self.put_read_concern(out)?;
        }
        if self.spec.max_time_ms.is_some() && self.mt.is_none() {
            self.put_max_time_ms(out);
        }
        out.byte(0);
        debug_assert_eq!(out.written() - start_len, self.len);
        Ok(())
    }

    fn put_read_concern(&self, out: &mut impl Out) -> Result<(), Malformed> {
        out.byte(scan::DOCUMENT);
        out.put(RC_KEY);
        out.put(&((4 + self.rc_fields_len + 1) as i32).to_le_bytes());
        read_concern_fields(old_read_concern(self.rc.as_ref()), &self.spec, out)?;
        out.byte(0);
        Ok(())
    }

    fn put_max_time_ms(&self, out: &mut impl Out) {
        if let Some(n) = self.spec.max_time_ms {
            let (tag, value) = max_time_ms(self.mt.map(|e| e.tag), n);
            out.byte(tag);
            out.put(MT_KEY);
            out.put(value.as_slice());
        }
    }
}

/// The old readConcern's document bytes; any other value is simply replaced.
fn old_read_concern<'b>(rc: Option<&Elem<'b>>) -> Option<&'b [u8]> {
    rc.filter(|e| e.tag == scan::DOCUMENT).map(|e| e.value)
}

/// Where the new readConcern's elements go: counted first, then written.
trait Sink {
    fn put(&mut self, bytes: &[u8]);
}

struct Count(usize);

impl Sink for Count {
    fn put(&mut self, bytes: &[u8]) {
        self.0 += bytes.len();
    }
}

impl Sink for Vec<u8> {
    fn put(&mut self, bytes: &[u8]) {
        self.extend_from_slice(bytes);
    }
}

impl Sink for BytesMut {
    fn put(&mut self, bytes: &[u8]) {
        self.extend_from_slice(bytes);
    }
}

/// Where a rewritten message is written: a `Vec` (bodies, compressed messages) or the
/// session's reusable `BytesMut`.
trait Out: Sink {
    fn byte(&mut self, b: u8);
    fn written(&self) -> usize;
}

impl Out for Vec<u8> {
    fn byte(&mut self, b: u8) {
        self.push(b);
    }
    fn written(&self) -> usize {
        self.len()
    }
}

impl Out for BytesMut {
    fn byte(&mut self, b: u8) {
        self.extend_from_slice(&[b]);
    }
    fn written(&self) -> usize {
        self.len()
    }
}

/// `level: "available"`, then the old subfields but `level` (and, if asked, `afterClusterTime`)
/// in their order.
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

/// A little-endian value of 4 or 8 bytes.
struct Value {
    bytes: [u8; 8],
    len: usize,
}

impl Value {
    fn as_slice(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

/// `maxTimeMS: n` (at least 1: 0 would mean no limit) as int32 if the client sent int32 and
/// `n` fits, as a double if the client sent a double, else as int64. Returns the type byte and
/// the value.
fn max_time_ms(old_tag: Option<u8>, n: i64) -> (u8, Value) {
    let n = n.max(1);
    match (old_tag, i32::try_from(n)) {
        (Some(scan::INT32), Ok(v)) => {
            let mut bytes = [0; 8];
            bytes[..4].copy_from_slice(&v.to_le_bytes());
            (scan::INT32, Value { bytes, len: 4 })
        }
        (Some(scan::DOUBLE), _) => (
            scan::DOUBLE,
            Value {
                bytes: (n as f64).to_le_bytes(),
                len: 8,
            },
        ),
        _ => (
            scan::INT64,
            Value {
                bytes: n.to_le_bytes(),
                len: 8,
            },
        ),
    }
}
