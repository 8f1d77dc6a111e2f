//! Raw message → [`Request`]: opened by the wire crate's `Request` (OP_MSG with its checksum
//! verified, OP_COMPRESSED decompressed once, legacy OP_QUERY), then the body and the kind-1
//! document sequences decoded.

use bson::{Bson, Document, RawDocument};
use bytes::Bytes;

use staleguard_wire::legacy::OpQuery;
use staleguard_wire::Request as Message;

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
    /// Opens `msg` once, as the proxy does (`staleguard_wire::Request`), and decodes the
    /// command it carries.
    pub fn decode(msg: Bytes, max: usize) -> Result<Request, DecodeError> {
        let m = Message::open(msg, max).map_err(|e| DecodeError(e.to_string()))?;
        if let Some(q) = m.op_query() {
            return Request::from_query(m.request_id(), &q);
        }
        let Some(parts) = m.parts() else {
            return Err(DecodeError(format!(
                "opcode {} is not served",
                m.header().op_code
            )));
        };
        let raw = m.body().ok_or_else(|| DecodeError("no body".into()))?;
        Ok(Request {
            request_id: m.request_id(),
            compressor: parts.compressor,
            legacy: false,
            flags: parts.flags,
            body: to_document(raw)?,
            sequences: sequences(parts.payload.get(..parts.sections_end).unwrap_or_default())?,
            legacy_db: None,
        })
    }

    /// An OP_QUERY (plain or unwrapped from OP_COMPRESSED), answered with an uncompressed
    /// OP_REPLY.
    fn from_query(request_id: i32, q: &OpQuery<'_>) -> Result<Request, DecodeError> {
        let mut body = to_document(q.command())?;
        if let Ok(rp) = q.query.get_document("$readPreference") {
            body.insert("$readPreference", to_document(rp)?);
        }
        let db = q.full_collection_name.split('.').next().unwrap_or("admin");
        Ok(Request {
            request_id,
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
