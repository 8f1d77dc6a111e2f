//! A request opened once: the header read and checked, an OP_MSG validated in place (its
//! checksum verified), an OP_QUERY parsed in place, an OP_COMPRESSED decompressed at most once
//! (when asked) and kept, and the command name (the body's first key) found once. A compressed
//! OP_MSG may first be peeked at (flags and command name from a few hundred decompressed
//! bytes): that decompression is kept and goes on from where it stopped if the whole message
//! is opened later. Everything the relay asks of a request comes from here, and a retry is
//! rewritten from it: nothing reads the header or decompresses the body again.

use std::ops::Range;

use bson::RawDocument;
use bytes::Bytes;

use crate::body::{check_length, command_name_in_prefix, verify_inner_checksum, COMMAND_PREFIX};
use crate::compressed::{Compressed, Inflater, SNAPPY};
use crate::legacy::{OpQuery, QueryLayout};
use crate::opmsg::{self, OpMsg, CHECKSUM_PRESENT, MORE_TO_COME};
use crate::scan::{self, Elem, Elements, Malformed};
use crate::{Header, OpCode, WireError, HEADER_LEN};

/// One request message as it arrived (`frame`, forwarded as is unless rewritten) and what
/// has been read from it. Cloning an opened request costs two reference counts, never a copy
/// (a peeked one is cloned unpeeked: a decompression in progress is not shared).
#[derive(Debug)]
pub struct Request {
    frame: Bytes,
    header: Header,
    state: State,
}

#[derive(Debug)]
enum State {
    /// An OP_MSG or OP_QUERY, in place, or unwrapped from an OP_COMPRESSED (`inflated`: the
    /// wrapped payload after its header, decompressed once, and the compressor).
    Open {
        inflated: Option<(Bytes, u8)>,
        inner: Inner,
    },
    /// OP_COMPRESSED, not decompressed (yet).
    Compressed,
    /// OP_COMPRESSED wrapping OP_MSG whose first bytes were decompressed for a peek; the
    /// decompression goes on from there when the message is opened.
    Peeked(Box<Inflater>),
    /// Anything else (other legacy opcodes, OP_COMPRESSED wrapping one): relayed as is.
    Opaque,
}

#[derive(Debug, Clone)]
enum Inner {
    Msg(Layout),
    Query(QueryLayout),
}

impl Default for Request {
    /// No message: an empty frame, relayed as is. What a kept allocation holds between two
    /// requests, so that it holds none of their bytes.
    fn default() -> Request {
        Request {
            frame: Bytes::new(),
            header: Header {
                length: 0,
                request_id: 0,
                response_to: 0,
                op_code: 0,
            },
            state: State::Opaque,
        }
    }
}

impl Clone for Request {
    fn clone(&self) -> Request {
        let state = match &self.state {
            State::Open { inflated, inner } => State::Open {
                inflated: inflated.clone(),
                inner: inner.clone(),
            },
            State::Compressed | State::Peeked(_) => State::Compressed,
            State::Opaque => State::Opaque,
        };
        Request {
            frame: self.frame.clone(),
            header: self.header,
            state,
        }
    }
}

/// Where things are in an OP_MSG payload (the bytes after the header).
#[derive(Debug, Clone)]
struct Layout {
    flags: u32,
    body: Range<usize>,
    sections_end: usize,
    /// The body's first element; an error is kept, not raised, until someone asks.
    first: Result<Option<First>, Malformed>,
}

/// The first element of a body, as offsets into the body document (it starts at 4).
#[derive(Debug, Clone, Copy)]
struct First {
    tag: u8,
    key_end: usize,
    value_start: usize,
    end: usize,
}

/// The pieces of an OP_MSG a rewrite needs.
#[derive(Debug, Clone)]
pub struct MsgParts<'r> {
    /// The OP_MSG payload: the frame after its header, or the decompressed one.
    pub payload: &'r [u8],
    /// `Some` when the message came as OP_COMPRESSED (a rewrite is compressed again).
    pub compressor: Option<u8>,
    pub flags: u32,
    /// Where the body document sits in `payload`.
    pub body_range: Range<usize>,
    /// Where the sections end in `payload` (the checksum, if any, follows).
    pub sections_end: usize,
}

/// What a peek at a compressed OP_MSG tells: its flags and command name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Peek<'r> {
    pub flags: u32,
    pub command_name: &'r str,
}

impl Peek<'_> {
    /// The client expects no reply (OP_MSG `moreToCome`).
    pub fn more_to_come(&self) -> bool {
        self.flags & MORE_TO_COME != 0
    }
}

impl Request {
    /// Reads the header (`16 <= messageLength <= max`, and the frame's length); an OP_MSG has
    /// its sections and flags validated and its checksum verified, an OP_QUERY its fields
    /// read. OP_COMPRESSED is left for [`Request::peek`] and [`Request::inflate`]; other
    /// opcodes are opaque.
    pub fn new(frame: Bytes, max: usize) -> Result<Request, WireError> {
        let header = Header::parse(&frame).ok_or(WireError::Truncated("message header"))?;
        check_length(&header, frame.len(), max)?;
        let state = match header.op_code {
            OpCode::MSG => {
                let m = OpMsg::parse(&frame[HEADER_LEN..])?;
                if m.checksum_present() {
                    opmsg::verify_checksum(&frame)?;
                }
                State::Open {
                    inflated: None,
                    inner: Inner::Msg(Layout::of(&m)),
                }
            }
            OpCode::QUERY => State::Open {
                inflated: None,
                inner: Inner::Query(QueryLayout::of(&frame[HEADER_LEN..])?),
            },
            OpCode::COMPRESSED => State::Compressed,
            _ => State::Opaque,
        };
        Ok(Request {
            frame,
            header,
            state,
        })
    }

    /// [`Request::new`] then [`Request::inflate`]: the message opened whole, for callers
    /// that want every request's body at once (the simulated cluster, tests, benchmarks).
    pub fn open(frame: Bytes, max: usize) -> Result<Request, WireError> {
        let mut req = Request::new(frame, max)?;
        req.inflate(max)?;
        Ok(req)
    }

    /// For an OP_COMPRESSED wrapping an OP_MSG not opened yet: its flags and command name,
    /// from the first few hundred decompressed bytes when the body comes first and its first
    /// key fits in them. The decompression is kept and [`Request::inflate`] goes on from
    /// where it stopped. A snappy block cannot be decompressed in part: one that declares
    /// more than `inline` bytes is not peeked at (`None`; open it whole, where large work
    /// belongs), a smaller one is decompressed whole and kept. `None` for anything else.
    /// Refused: a declared size over `max`, a malformed compressed message.
    pub fn peek(&mut self, max: usize, inline: usize) -> Result<Option<Peek<'_>>, WireError> {
        if matches!(self.state, State::Compressed) {
            let c = Compressed::parse(&self.frame[HEADER_LEN..])?;
            if c.original_opcode != OpCode::MSG {
                return Ok(None);
            }
            if c.compressor == SNAPPY && c.uncompressed_size as i64 > inline as i64 {
                return Ok(None);
            }
            let data = self.frame.slice(HEADER_LEN + 9..);
            let max = max.saturating_sub(HEADER_LEN);
            let inflater =
                Inflater::begin(c.compressor, c.uncompressed_size, data, COMMAND_PREFIX, max)?;
            self.state = State::Peeked(Box::new(inflater));
        }
        let State::Peeked(inflater) = &self.state else {
            return Ok(None);
        };
        let prefix = inflater.prefix();
        let Some(command_name) = command_name_in_prefix(prefix) else {
            return Ok(None);
        };
        let flags = u32::from_le_bytes([prefix[0], prefix[1], prefix[2], prefix[3]]);
        Ok(Some(Peek {
            flags,
            command_name,
        }))
    }

    /// Decompresses an OP_COMPRESSED wrapping an OP_MSG or an OP_QUERY (at most `max` bytes;
    /// from where a peek stopped, if there was one) and opens the wrapped message as
    /// [`Request::new`] does, checking an OP_MSG's checksum over the reconstructed header.
    /// Once: the result is kept and later calls do nothing. An OP_COMPRESSED wrapping any
    /// other opcode becomes opaque; other opcodes are left alone.
    pub fn inflate(&mut self, max: usize) -> Result<(), WireError> {
        let inflater = match std::mem::replace(&mut self.state, State::Opaque) {
            State::Compressed => {
                let c = Compressed::parse(&self.frame[HEADER_LEN..])?;
                if !matches!(c.original_opcode, OpCode::MSG | OpCode::QUERY) {
                    return Ok(());
                }
                let data = self.frame.slice(HEADER_LEN + 9..);
                let max = max.saturating_sub(HEADER_LEN);
                Inflater::begin(c.compressor, c.uncompressed_size, data, 0, max)?
            }
            State::Peeked(inflater) => *inflater,
            other => {
                self.state = other;
                return Ok(());
            }
        };
        let compressor = inflater.compressor();
        let payload = Bytes::from(inflater.finish()?);
        // The opcode is read again from the fixed part (nine bytes, already checked).
        let inner = match Compressed::parse(&self.frame[HEADER_LEN..])?.original_opcode {
            OpCode::MSG => {
                verify_inner_checksum(&self.header, &payload)?;
                Inner::Msg(Layout::of(&OpMsg::parse(&payload)?))
            }
            _ => Inner::Query(QueryLayout::of(&payload)?),
        };
        self.state = State::Open {
            inflated: Some((payload, compressor)),
            inner,
        };
        Ok(())
    }

    /// For an OP_COMPRESSED not opened yet: the uncompressed size it declares (which
    /// [`Request::inflate`] holds it to). `None` for anything else, or a negative size.
    pub fn declared_inflated_len(&self) -> Option<usize> {
        if !matches!(self.state, State::Compressed | State::Peeked(_)) {
            return None;
        }
        let c = Compressed::parse(&self.frame[HEADER_LEN..]).ok()?;
        usize::try_from(c.uncompressed_size).ok()
    }

    /// The message as it arrived.
    pub fn frame(&self) -> &Bytes {
        &self.frame
    }

    pub fn into_frame(self) -> Bytes {
        self.frame
    }

    pub fn header(&self) -> &Header {
        &self.header
    }

    pub fn request_id(&self) -> i32 {
        self.header.request_id
    }

    pub fn op(&self) -> OpCode {
        self.header.op()
    }

    /// The message is (or wraps, once inflated) an OP_MSG: it has a body and flags.
    pub fn is_command(&self) -> bool {
        self.payload().is_some()
    }

    /// An OP_COMPRESSED not opened yet (peeked at or not).
    pub fn needs_inflate(&self) -> bool {
        matches!(self.state, State::Compressed | State::Peeked(_))
    }

    /// The compressor id, once an OP_COMPRESSED has been inflated.
    pub fn compressor(&self) -> Option<u8> {
        match &self.state {
            State::Open {
                inflated: Some((_, c)),
                ..
            } => Some(*c),
            _ => None,
        }
    }

    /// The OP_MSG flag bits (of the wrapped message once inflated); 0 without an OP_MSG.
    pub fn flags(&self) -> u32 {
        self.payload().map_or(0, |(_, l)| l.flags)
    }

    /// The client expects no reply (OP_MSG `moreToCome`).
    pub fn more_to_come(&self) -> bool {
        self.flags() & MORE_TO_COME != 0
    }

    /// The OP_MSG carries a CRC-32C (already verified).
    pub fn checksum_present(&self) -> bool {
        self.flags() & CHECKSUM_PRESENT != 0
    }

    /// The OP_QUERY, when the message is (or wraps, once inflated) one.
    pub fn op_query(&self) -> Option<OpQuery<'_>> {
        match &self.state {
            State::Open {
                inflated,
                inner: Inner::Query(q),
            } => q.view(self.inner_payload(inflated)),
            _ => None,
        }
    }

    /// The kind-0 body, when the message is (or wraps, once inflated) an OP_MSG.
    pub fn body(&self) -> Option<&RawDocument> {
        let (payload, layout) = self.payload()?;
        RawDocument::from_bytes(payload.get(layout.body.clone())?).ok()
    }

    /// The command name (the body's first key); `None` without a body or for an empty one.
    pub fn command_name(&self) -> Result<Option<&str>, Malformed> {
        Ok(match self.command_key()? {
            Some(key) => Some(scan::key_str(key)?),
            None => None,
        })
    }

    /// The command name's bytes, from where the message was opened (its UTF-8 was checked
    /// then, or the body's first element is an error here); `None` without a body or for an
    /// empty one. What a caller that only compares the name needs: no scan, no second
    /// UTF-8 check.
    pub fn command_key(&self) -> Result<Option<&[u8]>, Malformed> {
        let Some((body, first)) = self.first_in_body()? else {
            return Ok(None);
        };
        Ok(Some(first.elem(body)?.key))
    }

    /// The body's first element and a scanner positioned after it, so that classification
    /// goes on from there without reading the first element again. `None` without a body or
    /// for an empty one.
    pub fn scan_body(&self) -> Result<Option<(Elem<'_>, Elements<'_>)>, Malformed> {
        let Some((body, first)) = self.first_in_body()? else {
            return Ok(None);
        };
        let elem = first.elem(body)?;
        Ok(Some((elem, Elements::resume(body, first.end)?)))
    }

    /// The OP_MSG body and where its first element is; `None` without a body or for an
    /// empty one.
    fn first_in_body(&self) -> Result<Option<(&[u8], First)>, Malformed> {
        let Some((payload, layout)) = self.payload() else {
            return Ok(None);
        };
        let Some(first) = layout.first? else {
            return Ok(None);
        };
        let body = payload
            .get(layout.body.clone())
            .ok_or(Malformed("op_msg body"))?;
        Ok(Some((body, first)))
    }

    /// The pieces of the OP_MSG (the wrapped one once inflated) a rewrite needs.
    pub fn parts(&self) -> Option<MsgParts<'_>> {
        let (payload, layout) = self.payload()?;
        Some(MsgParts {
            payload,
            compressor: self.compressor(),
            flags: layout.flags,
            body_range: layout.body.clone(),
            sections_end: layout.sections_end,
        })
    }

    fn payload(&self) -> Option<(&[u8], &Layout)> {
        match &self.state {
            State::Open {
                inflated,
                inner: Inner::Msg(layout),
            } => Some((self.inner_payload(inflated), layout)),
            _ => None,
        }
    }

    fn inner_payload<'r>(&'r self, inflated: &'r Option<(Bytes, u8)>) -> &'r [u8] {
        match inflated {
            Some((payload, _)) => payload,
            None => &self.frame[HEADER_LEN..],
        }
    }
}

impl Layout {
    fn of(m: &OpMsg<'_>) -> Layout {
        Layout {
            flags: m.flags,
            body: m.body_range.clone(),
            sections_end: m.sections_end,
            first: First::of(m.body.as_bytes()),
        }
    }
}

impl First {
    fn of(body: &[u8]) -> Result<Option<First>, Malformed> {
        let Some(e) = Elements::new(body)?.next_elem()? else {
            return Ok(None);
        };
        // Command names are ASCII: checked as such first (a few instructions), as UTF-8
        // only when they are not.
        if !e.key.is_ascii() {
            scan::key_str(e.key)?;
        }
        Ok(Some(First {
            tag: e.tag,
            key_end: e.start + 1 + e.key.len(),
            value_start: e.end - e.value.len(),
            end: e.end,
        }))
    }

    fn elem<'b>(&self, body: &'b [u8]) -> Result<Elem<'b>, Malformed> {
        let bad = || Malformed("first element");
        Ok(Elem {
            tag: self.tag,
            key: body.get(5..self.key_end).ok_or_else(bad)?,
            value: body.get(self.value_start..self.end).ok_or_else(bad)?,
            start: 4,
            end: self.end,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compressed::{compress, ZLIB};
    use bson::rawdoc;

    const MAX: usize = 1 << 20;

    fn op_msg(flags: u32, body: &RawDocument) -> Vec<u8> {
        let mut out = Vec::new();
        let len = (HEADER_LEN + 4 + 1 + body.as_bytes().len()) as i32;
        for v in [len, 7, 0, OpCode::MSG] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(&flags.to_le_bytes());
        out.push(0);
        out.extend_from_slice(body.as_bytes());
        out
    }

    fn wrap(msg: &[u8]) -> Vec<u8> {
        let data = compress(ZLIB, &msg[HEADER_LEN..]).unwrap();
        let mut out = Vec::new();
        let len = (HEADER_LEN + 9 + data.len()) as i32;
        for v in [len, 7, 0, OpCode::COMPRESSED, OpCode::MSG] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(&((msg.len() - HEADER_LEN) as i32).to_le_bytes());
        out.push(ZLIB);
        out.extend_from_slice(&data);
        out
    }

    #[test]
    fn op_msg_is_opened_in_place() {
        let body = rawdoc! {"find": "c", "filter": {}, "$db": "d"};
        let frame = Bytes::from(op_msg(MORE_TO_COME, &body));
        let req = Request::new(frame.clone(), MAX).unwrap();
        assert_eq!(req.request_id(), 7);
        assert!(req.more_to_come() && !req.checksum_present());
        assert_eq!(req.command_name().unwrap(), Some("find"));
        assert_eq!(req.body().unwrap().as_bytes(), body.as_bytes());
        let (first, mut rest) = req.scan_body().unwrap().unwrap();
        assert_eq!((first.key, first.value.len()), (&b"find"[..], 6));
        assert_eq!(rest.next_elem().unwrap().unwrap().key, b"filter");
        // The very bytes that arrived.
        assert_eq!(req.frame().as_ptr(), frame.as_ptr());
    }

    #[test]
    fn compressed_is_inflated_once_on_demand() {
        let body = rawdoc! {"aggregate": 1, "$db": "d"};
        let mut req = Request::new(Bytes::from(wrap(&op_msg(0, &body))), MAX).unwrap();
        assert!(req.needs_inflate() && req.body().is_none());
        req.inflate(MAX).unwrap();
        assert!(!req.needs_inflate());
        assert_eq!(req.compressor(), Some(ZLIB));
        assert_eq!(req.command_name().unwrap(), Some("aggregate"));
        let parts = req.parts().unwrap();
        assert_eq!(&parts.payload[parts.body_range], body.as_bytes());
        req.inflate(MAX).unwrap();
        assert_eq!(req.command_name().unwrap(), Some("aggregate"));
    }

    /// An OP_QUERY payload (after the header).
    fn op_query_payload(ns: &str, doc: &RawDocument) -> Vec<u8> {
        let mut out = 4i32.to_le_bytes().to_vec();
        out.extend_from_slice(ns.as_bytes());
        out.push(0);
        out.extend_from_slice(&0i32.to_le_bytes());
        out.extend_from_slice(&(-1i32).to_le_bytes());
        out.extend_from_slice(doc.as_bytes());
        out
    }

    #[test]
    fn op_query_is_opened_in_place_or_once_decompressed() {
        let doc = rawdoc! {"isMaster": 1, "$db": "admin"};
        let payload = op_query_payload("admin.$cmd", &doc);
        let mut plain = Vec::new();
        let len = (HEADER_LEN + payload.len()) as i32;
        for v in [len, 9, 0, OpCode::QUERY] {
            plain.extend_from_slice(&v.to_le_bytes());
        }
        plain.extend_from_slice(&payload);
        let req = Request::new(Bytes::from(plain.clone()), MAX).unwrap();
        let q = req.op_query().unwrap();
        assert_eq!((q.flags, q.full_collection_name), (4, "admin.$cmd"));
        assert_eq!((q.number_to_skip, q.number_to_return), (0, -1));
        assert_eq!(q.query.as_bytes(), doc.as_bytes());
        assert!(!req.is_command() && req.body().is_none());

        let data = compress(ZLIB, &payload).unwrap();
        let mut wrapped = Vec::new();
        let len = (HEADER_LEN + 9 + data.len()) as i32;
        for v in [len, 9, 0, OpCode::COMPRESSED, OpCode::QUERY] {
            wrapped.extend_from_slice(&v.to_le_bytes());
        }
        wrapped.extend_from_slice(&(payload.len() as i32).to_le_bytes());
        wrapped.push(ZLIB);
        wrapped.extend_from_slice(&data);
        let mut req = Request::new(Bytes::from(wrapped), MAX).unwrap();
        assert!(req.op_query().is_none());
        // Not an OP_MSG: nothing to peek at, and nothing decompressed for it.
        assert_eq!(req.peek(MAX, MAX).unwrap(), None);
        req.inflate(MAX).unwrap();
        assert_eq!(req.compressor(), Some(ZLIB));
        assert_eq!(req.op_query().unwrap().query.as_bytes(), doc.as_bytes());

        // A truncated OP_QUERY is refused on arrival.
        plain.truncate(plain.len() - 1);
        let len = plain.len() as i32;
        plain[..4].copy_from_slice(&len.to_le_bytes());
        assert!(Request::new(Bytes::from(plain), MAX).is_err());
    }

    #[test]
    fn a_peek_is_kept_and_a_clone_does_not_share_it() {
        let body = rawdoc! {"find": "c", "filter": {}, "$db": "d"};
        let mut req = Request::new(Bytes::from(wrap(&op_msg(0, &body))), MAX).unwrap();
        let peek = req.peek(MAX, MAX).unwrap().unwrap();
        assert_eq!(peek.command_name, "find");
        assert!(req.needs_inflate());
        let mut copy = req.clone();
        req.inflate(MAX).unwrap();
        assert_eq!(req.body().unwrap().as_bytes(), body.as_bytes());
        // The clone starts over.
        assert!(copy.needs_inflate() && copy.body().is_none());
        copy.inflate(MAX).unwrap();
        assert_eq!(copy.body().unwrap().as_bytes(), body.as_bytes());
        // A peek over the limit is refused before anything is decompressed.
        let mut big = Request::new(Bytes::from(wrap(&op_msg(0, &body))), MAX).unwrap();
        assert!(big.peek(HEADER_LEN + 10, MAX).is_err());
    }

    #[test]
    fn a_bad_first_key_is_an_error_only_when_asked() {
        let mut body = rawdoc! {"find": 1}.into_bytes();
        body[5] = 0xff;
        let doc = RawDocument::from_bytes(&body).unwrap();
        let req = Request::new(Bytes::from(op_msg(0, doc)), MAX).unwrap();
        assert!(req.command_name().is_err());
        let empty = Request::new(Bytes::from(op_msg(0, &rawdoc! {})), MAX).unwrap();
        assert_eq!(empty.command_name().unwrap(), None);
    }

    #[test]
    fn bad_frames_are_refused() {
        let msg = op_msg(0, &rawdoc! {"ping": 1});
        assert!(Request::new(Bytes::copy_from_slice(&msg[..msg.len() - 1]), MAX).is_err());
        assert!(Request::new(Bytes::from(msg.clone()), 20).is_err());
        let mut bad_crc = msg.clone();
        bad_crc[16] |= CHECKSUM_PRESENT as u8;
        assert!(Request::new(Bytes::from(bad_crc), MAX).is_err());
    }
}
