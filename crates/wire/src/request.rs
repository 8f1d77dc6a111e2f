//! A request opened once: the header read and checked, an OP_MSG validated in place (its
//! checksum verified), an OP_COMPRESSED decompressed at most once (when asked) and kept, and
//! the command name (the body's first key) found once. Everything the relay asks of a request
//! comes from here, and a retry is rewritten from it: nothing reads the header or
//! decompresses the body again.

use std::ops::Range;

use bson::RawDocument;
use bytes::Bytes;

use crate::body::{check_length, decompress_op_msg};
use crate::compressed::Compressed;
use crate::opmsg::{self, OpMsg, CHECKSUM_PRESENT, MORE_TO_COME};
use crate::scan::{self, Elem, Elements, Malformed};
use crate::{Header, OpCode, WireError, HEADER_LEN};

/// One request message as it arrived (`frame`, forwarded as is unless rewritten) and what
/// has been read from it. Cloning costs two reference counts, never a copy.
#[derive(Debug, Clone)]
pub struct Request {
    frame: Bytes,
    header: Header,
    state: State,
}

#[derive(Debug, Clone)]
enum State {
    /// OP_MSG, validated in place.
    Msg(Layout),
    /// OP_COMPRESSED, not decompressed (yet).
    Compressed,
    /// OP_COMPRESSED wrapping OP_MSG: the wrapped payload (after its header), decompressed
    /// once and validated.
    Inflated {
        payload: Bytes,
        compressor: u8,
        layout: Layout,
    },
    /// Anything else (legacy opcodes, OP_COMPRESSED wrapping one): relayed as is.
    Opaque,
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

impl Request {
    /// Reads the header (`16 <= messageLength <= max`, and the frame's length) and, for an
    /// OP_MSG, validates its sections and flags and verifies its checksum. OP_COMPRESSED is
    /// left for [`Request::inflate`]; other opcodes are opaque.
    pub fn new(frame: Bytes, max: usize) -> Result<Request, WireError> {
        let header = Header::parse(&frame).ok_or(WireError::Truncated("message header"))?;
        check_length(&header, frame.len(), max)?;
        let state = match header.op_code {
            OpCode::MSG => {
                let m = OpMsg::parse(&frame[HEADER_LEN..])?;
                if m.checksum_present() {
                    opmsg::verify_checksum(&frame)?;
                }
                State::Msg(Layout::of(&m))
            }
            OpCode::COMPRESSED => State::Compressed,
            _ => State::Opaque,
        };
        Ok(Request {
            frame,
            header,
            state,
        })
    }

    /// Decompresses an OP_COMPRESSED wrapping an OP_MSG (at most `max` bytes) and validates
    /// the wrapped message as [`Request::new`] does an OP_MSG, checking its checksum over the
    /// reconstructed header. Once: the result is kept and later calls do nothing. An
    /// OP_COMPRESSED wrapping anything else becomes opaque; other opcodes are left alone.
    pub fn inflate(&mut self, max: usize) -> Result<(), WireError> {
        if !matches!(self.state, State::Compressed) {
            return Ok(());
        }
        let c = Compressed::parse(&self.frame[HEADER_LEN..])?;
        if c.original_opcode != OpCode::MSG {
            self.state = State::Opaque;
            return Ok(());
        }
        let payload = Bytes::from(decompress_op_msg(&self.header, &c, max)?);
        let layout = Layout::of(&OpMsg::parse(&payload)?);
        self.state = State::Inflated {
            payload,
            compressor: c.compressor,
            layout,
        };
        Ok(())
    }

    /// For an OP_COMPRESSED not inflated yet: the uncompressed size it declares (which
    /// [`Request::inflate`] holds it to). `None` for anything else, or a negative size.
    pub fn declared_inflated_len(&self) -> Option<usize> {
        if !matches!(self.state, State::Compressed) {
            return None;
        }
        let c = Compressed::parse(&self.frame[HEADER_LEN..]).ok()?;
        usize::try_from(c.uncompressed_size).ok()
    }

    /// For an OP_COMPRESSED wrapping an OP_MSG not inflated yet: the first `n` bytes of the
    /// wrapped payload, decompressing no further (see [`Compressed::decompress_prefix`]).
    /// `None` for anything else.
    pub fn compressed_prefix(&self, n: usize) -> Result<Option<Vec<u8>>, WireError> {
        if !matches!(self.state, State::Compressed) {
            return Ok(None);
        }
        let c = Compressed::parse(&self.frame[HEADER_LEN..])?;
        if c.original_opcode != OpCode::MSG {
            return Ok(None);
        }
        c.decompress_prefix(n).map(Some)
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

    /// An OP_COMPRESSED not decompressed yet.
    pub fn needs_inflate(&self) -> bool {
        matches!(self.state, State::Compressed)
    }

    /// The compressor id, once an OP_COMPRESSED has been inflated.
    pub fn compressor(&self) -> Option<u8> {
        match &self.state {
            State::Inflated { compressor, .. } => Some(*compressor),
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

    /// The kind-0 body, when the message is (or wraps, once inflated) an OP_MSG.
    pub fn body(&self) -> Option<&RawDocument> {
        let (payload, layout) = self.payload()?;
        RawDocument::from_bytes(payload.get(layout.body.clone())?).ok()
    }

    /// The command name (the body's first key); `None` without a body or for an empty one.
    pub fn command_name(&self) -> Result<Option<&str>, Malformed> {
        Ok(match self.scan_body()? {
            Some((first, _)) => Some(scan::key_str(first.key)?),
            None => None,
        })
    }

    /// The body's first element and a scanner positioned after it, so that classification
    /// goes on from there without reading the first element again. `None` without a body or
    /// for an empty one.
    pub fn scan_body(&self) -> Result<Option<(Elem<'_>, Elements<'_>)>, Malformed> {
        let Some((payload, layout)) = self.payload() else {
            return Ok(None);
        };
        let Some(first) = layout.first? else {
            return Ok(None);
        };
        let body = payload
            .get(layout.body.clone())
            .ok_or(Malformed("op_msg body"))?;
        let elem = first.elem(body)?;
        Ok(Some((elem, Elements::resume(body, first.end)?)))
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
            State::Msg(layout) => Some((&self.frame[HEADER_LEN..], layout)),
            State::Inflated {
                payload, layout, ..
            } => Some((payload, layout)),
            State::Compressed | State::Opaque => None,
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
        scan::key_str(e.key)?;
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
