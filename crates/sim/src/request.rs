//! Raw message → [`Request`]: OP_MSG (checksum verified), OP_COMPRESSED (decompressed by
//! the crate's `command::request_body`), kind-1 document sequences, legacy OP_QUERY.

use bson::{Bson, Document, RawDocument};

use staleguard_wire::legacy::OpQuery;
use staleguard_wire::{request_body, RequestBody};
use staleguard_wire::{Header, OpCode, HEADER_LEN};

use super::SimError;

/// One decoded command.
#[derive(Debug)]
pub struct Request {
    pub request_id: i32,
    /// Set when the request came compressed: the reply is compressed the same way.
    pub compressor: Option<u8>,
    /// OP_QUERY: answered with OP_REPLY.
    pub legacy: bool,
    pub flags: u32,
    pub body: Document,
    /// Kind-1 sections: identifier and documents.
    pub sequences: Vec<(String, Vec<Document>)>,
    /// The database for OP_QUERY (`admin.$cmd` → `admin`).
    legacy_db: Option<String>,
}

/// Why a message cannot be served; the connection closes.
#[derive(Debug, thiserror::Error)]
#[error("undecodable request: {0}")]
pub struct DecodeError(pub String);

impl Request {
    pub fn decode(msg: &[u8], max: usize) -> Result<Request, DecodeError> {
        let err = |e: &dyn std::fmt::Display| DecodeError(e.to_string());
        let header = Header::parse(msg).ok_or_else(|| DecodeError("short header".into()))?;
        if header.op_code == OpCode::QUERY {
            return Request::decode_query(&header, msg);
        }
        let rb = request_body(msg, max).map_err(|e| err(&e))?;
        let (payload, end, compressor): (&[u8], usize, Option<u8>) = match &rb {
            RequestBody::Msg(m) => (
                msg.get(HEADER_LEN..).unwrap_or_default(),
                m.sections_end,
                None,
            ),
            RequestBody::Decompressed {
                payload,
                sections_end,
                compressor,
                ..
            } => (payload.as_slice(), *sections_end, Some(*compressor)),
            RequestBody::NotCommand => {
                return Err(DecodeError(format!(
                    "opcode {} is not served",
                    header.op_code
                )))
            }
        };
        let raw = rb.body().ok_or_else(|| DecodeError("no body".into()))?;
        Ok(Request {
            request_id: header.request_id,
            compressor,
            legacy: false,
            flags: rb.flags(),
            body: to_document(raw)?,
            sequences: sequences(payload.get(..end).unwrap_or_default())?,
            legacy_db: None,
        })
    }

    fn decode_query(header: &Header, msg: &[u8]) -> Result<Request, DecodeError> {
        let q = OpQuery::parse(msg.get(HEADER_LEN..).unwrap_or_default())
            .map_err(|e| DecodeError(e.to_string()))?;
        let mut body = to_document(q.command())?;
        if let Ok(rp) = q.query.get_document("$readPreference") {
            body.insert("$readPreference", to_document(rp)?);
        }
        let db = q.full_collection_name.split('.').next().unwrap_or("admin");
        Ok(Request {
            request_id: header.request_id,
            compressor: None,
            legacy: true,
            flags: 0,
            body,
            sequences: Vec::new(),
            legacy_db: Some(db.to_string()),
        })
    }

    /// The command name: the body's first key.
    pub fn name(&self) -> &str {
        self.body.keys().next().map_or("", String::as_str)
    }

    /// `$db`, or the OP_QUERY namespace's database.
    pub fn db(&self) -> Result<&str, SimError> {
        match (self.body.get_str("$db"), &self.legacy_db) {
            (Ok(db), _) => Ok(db),
            (Err(_), Some(db)) => Ok(db),
            _ => Err(SimError::new(
                40571,
                "Location40571",
                "OP_MSG requests require a $db argument",
            )),
        }
    }

    /// The documents of argument `name`: its kind-1 sequence, else the body's array.
    pub fn documents(&self, name: &str) -> Result<Vec<Document>, SimError> {
        if let Some((_, docs)) = self.sequences.iter().find(|(id, _)| id == name) {
            if self.body.contains_key(name) {
                return Err(SimError::new(
                    40433,
                    "Location40433",
                    format!("Duplicate field {name}: in the body and in a document sequence"),
                ));
            }
            return Ok(docs.clone());
        }
        match self.body.get(name) {
            Some(Bson::Array(items)) => items
                .iter()
                .map(|v| match v {
                    Bson::Document(d) => Ok(d.clone()),
                    _ => Err(SimError::new(
                        14,
                        "TypeMismatch",
                        format!("{name} entries must be documents"),
                    )),
                })
                .collect(),
            None => Err(SimError::new(
                40414,
                "Location40414",
                format!(
                    "BSON field '{}.{name}' is missing but a required field",
                    self.name()
                ),
            )),
            Some(_) => Err(SimError::new(
                14,
                "TypeMismatch",
                format!("BSON field '{name}' must be an array"),
            )),
        }
    }
}

fn to_document(raw: &RawDocument) -> Result<Document, DecodeError> {
    Document::try_from(raw).map_err(|e| DecodeError(format!("malformed bson: {e}")))
}

/// The kind-1 sections of an OP_MSG payload (flags first, checksum already cut off).
fn sequences(payload: &[u8]) -> Result<Vec<(String, Vec<Document>)>, DecodeError> {
    let bad = |what: &str| DecodeError(format!("op_msg section: {what}"));
    let mut out = Vec::new();
    let mut at = 4;
    while at < payload.len() {
        let kind = payload[at];
        at += 1;
        let len = read_len(payload, at).ok_or_else(|| bad("length"))?;
        let section = payload.get(at..at + len).ok_or_else(|| bad("bounds"))?;
        if kind == 1 {
            let inner = section.get(4..).ok_or_else(|| bad("sequence"))?;
            let nul = inner
                .iter()
                .position(|&b| b == 0)
                .ok_or_else(|| bad("identifier"))?;
            let id = String::from_utf8_lossy(&inner[..nul]).into_owned();
            let mut docs = Vec::new();
            let mut rest = &inner[nul + 1..];
            while !rest.is_empty() {
                let n = read_len(rest, 0).ok_or_else(|| bad("document length"))?;
                let raw =
                    RawDocument::from_bytes(rest.get(..n).ok_or_else(|| bad("document bounds"))?)
                        .map_err(|e| bad(&e.to_string()))?;
                docs.push(to_document(raw)?);
                rest = &rest[n..];
            }
            out.push((id, docs));
        }
        at += len;
    }
    Ok(out)
}

/// A little-endian length at `at`, accepted only if positive (a section or document size).
fn read_len(b: &[u8], at: usize) -> Option<usize> {
    let s = b.get(at..at.checked_add(4)?)?;
    let n = i32::from_le_bytes([s[0], s[1], s[2], s[3]]);
    (n >= 5).then_some(n as usize)
}
