//! Raw bytes → [`Request`]: decompression, checksum check, OP_MSG sections, OP_QUERY.

use bson::{RawDocument, RawDocumentBuf};
use bytes::{BufMut, BytesMut};
use staleguard::wire::compressed::Compressed;
use staleguard::wire::legacy::OpQuery;
use staleguard::wire::opmsg::{verify_checksum, OpMsg, CHECKSUM_PRESENT};
use staleguard::wire::{Header, OpCode, HEADER_LEN};

/// One decoded request.
#[derive(Debug)]
pub struct Request {
    /// The header of the message as received (its requestID is what replies answer).
    pub header: Header,
    /// Set when the request came as OP_COMPRESSED: replies are compressed the same way.
    pub compressor: Option<u8>,
    /// OP_QUERY: answered with OP_REPLY.
    pub legacy: bool,
    /// OP_MSG flag bits (0 for OP_QUERY).
    pub flags: u32,
    /// The command document (kind-0 section, or the OP_QUERY command).
    pub body: RawDocumentBuf,
    /// Kind-1 document sequences: identifier and documents.
    pub sequences: Vec<(String, Vec<RawDocumentBuf>)>,
    /// The OP_QUERY `fullCollectionName` (empty for OP_MSG).
    pub collection_name: String,
}

impl Request {
    /// Decodes a whole message; an error means the connection must be closed.
    pub fn decode(raw: &[u8], max: usize) -> Result<Request, String> {
        let header = Header::parse(raw).ok_or("short header")?;
        let payload = &raw[HEADER_LEN..];
        if header.op() == OpCode::Compressed {
            let c = Compressed::parse(payload).map_err(|e| e.to_string())?;
            let inner = c.decompress(max).map_err(|e| e.to_string())?;
            let mut msg = BytesMut::with_capacity(HEADER_LEN + inner.len());
            Header {
                length: (HEADER_LEN + inner.len()) as i32,
                request_id: header.request_id,
                response_to: header.response_to,
                op_code: c.original_opcode,
            }
            .put(&mut msg);
            msg.put_slice(&inner);
            let mut req = Request::decode_plain(&msg)?;
            req.compressor = Some(c.compressor);
            return Ok(req);
        }
        Request::decode_plain(raw)
    }

    fn decode_plain(raw: &[u8]) -> Result<Request, String> {
        let header = Header::parse(raw).ok_or("short header")?;
        let payload = &raw[HEADER_LEN..];
        match header.op() {
            OpCode::Msg => {
                let msg = OpMsg::parse(payload).map_err(|e| e.to_string())?;
                if msg.flags & CHECKSUM_PRESENT != 0 {
                    verify_checksum(raw).map_err(|e| e.to_string())?;
                }
                Ok(Request {
                    header,
                    compressor: None,
                    legacy: false,
                    flags: msg.flags,
                    body: msg.body.to_owned(),
                    sequences: sequences(&payload[..msg.sections_end])?,
                    collection_name: String::new(),
                })
            }
            OpCode::Query => {
                let q = OpQuery::parse(payload).map_err(|e| e.to_string())?;
                Ok(Request {
                    header,
                    compressor: None,
                    legacy: true,
                    flags: 0,
                    body: q.command().to_owned(),
                    sequences: Vec::new(),
                    collection_name: q.full_collection_name.to_string(),
                })
            }
            other => Err(format!("opcode {other:?} is not served")),
        }
    }

    /// The first key of the body.
    pub fn command_name(&self) -> &str {
        command_name(&self.body)
    }

    /// The database: `$db`, or the OP_QUERY namespace's prefix.
    pub fn db(&self) -> &str {
        match self.body.get_str("$db") {
            Ok(db) => db,
            Err(_) => self.collection_name.split('.').next().unwrap_or_default(),
        }
    }

    /// The documents of argument `name`: a kind-1 sequence of that name, else a body array.
    pub fn documents(&self, name: &str) -> Vec<RawDocumentBuf> {
        if let Some((_, docs)) = self.sequences.iter().find(|(id, _)| id == name) {
            return docs.clone();
        }
        match self.body.get_array(name) {
            Ok(arr) => arr
                .into_iter()
                .filter_map(|v| v.ok()?.as_document().map(|d| d.to_owned()))
                .collect(),
            Err(_) => Vec::new(),
        }
    }
}

pub fn command_name(body: &RawDocument) -> &str {
    match body.iter().next() {
        Some(Ok((key, _))) => key.as_str(),
        _ => "",
    }
}

/// Collects the kind-1 sections of an OP_MSG payload already validated by `OpMsg::parse`
/// (`payload` ends where the sections end).
fn sequences(payload: &[u8]) -> Result<Vec<(String, Vec<RawDocumentBuf>)>, String> {
    let mut out = Vec::new();
    let mut at = 4;
    while at < payload.len() {
        let kind = payload[at];
        at += 1;
        let len = i32_at(payload, at)? as usize;
        if kind == 1 {
            let section = payload.get(at + 4..at + len).ok_or("sequence bounds")?;
            let nul = section.iter().position(|&b| b == 0).ok_or("identifier")?;
            let id = String::from_utf8_lossy(&section[..nul]).into_owned();
            let mut docs = Vec::new();
            let mut rest = &section[nul + 1..];
            while !rest.is_empty() {
                let n = i32_at(rest, 0)? as usize;
                let doc = RawDocument::from_bytes(rest.get(..n).ok_or("document bounds")?)
                    .map_err(|e| e.to_string())?;
                docs.push(doc.to_owned());
                rest = &rest[n..];
            }
            out.push((id, docs));
        }
        at += len;
    }
    Ok(out)
}

fn i32_at(b: &[u8], at: usize) -> Result<i32, String> {
    let s = b.get(at..at + 4).ok_or("length bounds")?;
    Ok(i32::from_le_bytes([s[0], s[1], s[2], s[3]]))
}
