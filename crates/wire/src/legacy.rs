//! Legacy OP_QUERY (2004) and OP_REPLY (1), understood enough for old drivers' handshakes.

use bson::RawDocument;

use super::{read_cstr, read_doc, read_i32, WireError};

/// An OP_QUERY payload (the bytes after the header).
#[derive(Debug, Clone)]
pub struct OpQuery<'a> {
    pub flags: i32,
    pub full_collection_name: &'a str,
    pub number_to_skip: i32,
    pub number_to_return: i32,
    pub query: &'a RawDocument,
}

impl<'a> OpQuery<'a> {
    pub fn parse(payload: &'a [u8]) -> Result<OpQuery<'a>, WireError> {
        let flags = read_i32(payload, 0).ok_or(WireError::Truncated("op_query flags"))?;
        let rest = &payload[4..];
        let (full_collection_name, used) = read_cstr(rest, "op_query collection name")?;
        let rest = &rest[used..];
        let number_to_skip = read_i32(rest, 0).ok_or(WireError::Truncated("op_query skip"))?;
        let number_to_return = read_i32(rest, 4).ok_or(WireError::Truncated("op_query return"))?;
        let rest = &rest[8..];
        let query = read_doc(rest, "op_query query")?;
        let rest = &rest[query.as_bytes().len()..];
        if !rest.is_empty() {
            let fields = read_doc(rest, "op_query returnFieldsSelector")?;
            if fields.as_bytes().len() != rest.len() {
                return Err(WireError::Overrun {
                    what: "op_query trailing bytes",
                    len: rest.len() as i64,
                    room: fields.as_bytes().len(),
                });
            }
        }
        Ok(OpQuery {
            flags,
            full_collection_name,
            number_to_skip,
            number_to_return,
            query,
        })
    }

    /// The command document, unwrapping `{$query: {...}, $readPreference: ...}`.
    pub fn command(&self) -> &'a RawDocument {
        match self.query.get_document("$query") {
            Ok(inner) => inner,
            Err(_) => self.query,
        }
    }
}

/// An OP_REPLY payload (the bytes after the header).
#[derive(Debug, Clone)]
pub struct OpReply<'a> {
    pub response_flags: i32,
    pub cursor_id: i64,
    pub starting_from: i32,
    pub number_returned: i32,
    /// The first returned document (a command reply has exactly one).
    pub first: Option<&'a RawDocument>,
}

impl<'a> OpReply<'a> {
    pub fn parse(payload: &'a [u8]) -> Result<OpReply<'a>, WireError> {
        if payload.len() < 20 {
            return Err(WireError::Truncated("op_reply"));
        }
        let response_flags = read_i32(payload, 0).ok_or(WireError::Truncated("op_reply"))?;
        let mut id = [0u8; 8];
        id.copy_from_slice(&payload[4..12]);
        let cursor_id = i64::from_le_bytes(id);
        let starting_from = read_i32(payload, 12).ok_or(WireError::Truncated("op_reply"))?;
        let number_returned = read_i32(payload, 16).ok_or(WireError::Truncated("op_reply"))?;
        let mut docs = &payload[20..];
        let mut first = None;
        while !docs.is_empty() {
            let doc = read_doc(docs, "op_reply document")?;
            first.get_or_insert(doc);
            docs = &docs[doc.as_bytes().len()..];
        }
        Ok(OpReply {
            response_flags,
            cursor_id,
            starting_from,
            number_returned,
            first,
        })
    }
}
