//! Legacy OP_QUERY (2004) and OP_REPLY (1), understood enough for old drivers' handshakes
//! and for the proxy to tell which database an OP_QUERY reaches and which command it runs.

use std::borrow::Cow;

use bson::RawDocument;

use super::body::checked_header;
use super::compressed::Compressed;
use super::scan::{self, Elements};
use super::{read_cstr, read_doc, read_i32, OpCode, WireError, HEADER_LEN};

/// The OP_QUERY payload (the bytes after the header) of a whole request message: in place
/// for OP_QUERY, decompressed (bounded by `max_message_size`) for OP_COMPRESSED wrapping
/// OP_QUERY, `None` for anything else. Only the fixed part of an OP_COMPRESSED is read to
/// tell, so compressed OP_MSG costs nothing here.
pub fn query_payload(
    msg: &[u8],
    max_message_size: usize,
) -> Result<Option<Cow<'_, [u8]>>, WireError> {
    let header = checked_header(msg, max_message_size)?;
    let payload = &msg[HEADER_LEN..];
    match header.op_code {
        OpCode::QUERY => Ok(Some(Cow::Borrowed(payload))),
        OpCode::COMPRESSED => {
            let c = Compressed::parse(payload)?;
            if c.original_opcode != OpCode::QUERY {
                return Ok(None);
            }
            let inner = c.decompress(max_message_size.saturating_sub(HEADER_LEN))?;
            Ok(Some(Cow::Owned(inner)))
        }
        _ => Ok(None),
    }
}

/// What an OP_QUERY may run, under every reading a server may give it: servers unwrap a
/// first key `$query` or `query` into the command (with `$readPreference` beside it), and a
/// repeated wrapper may be read either way, so every candidate is listed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QueryReadings<'a> {
    /// Candidate command names: the first key unless it is a wrapper, and the first key of
    /// every `$query`/`query` document at the top level.
    pub names: Vec<&'a str>,
    /// Every string `$db` at the top level or inside a wrapper.
    pub dbs: Vec<&'a str>,
}

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

    /// The database: `fullCollectionName` up to its first `.` (all of it without one).
    pub fn database(&self) -> &'a str {
        let name = self.full_collection_name;
        name.split_once('.').map_or(name, |(db, _)| db)
    }

    /// `<db>.$cmd`: the query carries a command.
    pub fn is_command(&self) -> bool {
        self.full_collection_name
            .split_once('.')
            .is_some_and(|(_, coll)| coll == "$cmd")
    }

    /// The command names and `$db`s the query may be read with (see [`QueryReadings`]).
    pub fn readings(&self) -> Result<QueryReadings<'a>, WireError> {
        let bad = |_| WireError::BadBson("op_query query");
        let mut out = QueryReadings::default();
        let mut elems = Elements::new(self.query.as_bytes()).map_err(bad)?;
        let mut first = true;
        while let Some(e) = elems.next_elem().map_err(bad)? {
            let key = scan::key_str(e.key).map_err(bad)?;
            let wrapper = matches!(key, "$query" | "query");
            if first && !wrapper {
                out.names.push(key);
            }
            first = false;
            match key {
                "$db" if e.tag == scan::STRING => {
                    out.dbs.push(scan::str_value(e.value).map_err(bad)?)
                }
                "$query" | "query" if e.tag == scan::DOCUMENT => {
                    let mut inner = Elements::new(e.value).map_err(bad)?;
                    let mut inner_first = true;
                    while let Some(f) = inner.next_elem().map_err(bad)? {
                        let k = scan::key_str(f.key).map_err(bad)?;
                        if std::mem::take(&mut inner_first) {
                            out.names.push(k);
                        }
                        if k == "$db" && f.tag == scan::STRING {
                            out.dbs.push(scan::str_value(f.value).map_err(bad)?);
                        }
                    }
                }
                _ => {}
            }
        }
        Ok(out)
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
