//! Legacy OP_QUERY (2004) and OP_REPLY (1), understood enough for old drivers' handshakes
//! and for the proxy to tell which database an OP_QUERY reaches and which command it runs.

use std::ops::Range;

use bson::RawDocument;

use super::scan::{self, Elements};
use super::{read_cstr, read_doc, read_i32, WireError};

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

/// Where an OP_QUERY's fields are in its payload, found once by [`QueryLayout::of`] (which
/// validates it as [`OpQuery::parse`] does), so that a [`crate::Request`] gives its
/// [`OpQuery`] without reading it again.
#[derive(Debug, Clone)]
pub(crate) struct QueryLayout {
    flags: i32,
    name_end: usize,
    number_to_skip: i32,
    number_to_return: i32,
    query: Range<usize>,
}

impl QueryLayout {
    pub(crate) fn of(payload: &[u8]) -> Result<QueryLayout, WireError> {
        let q = OpQuery::parse(payload)?;
        // flags (4), the name and its NUL, skip and return (8), then the query document.
        let name_end = 4 + q.full_collection_name.len();
        let start = name_end + 1 + 8;
        Ok(QueryLayout {
            flags: q.flags,
            name_end,
            number_to_skip: q.number_to_skip,
            number_to_return: q.number_to_return,
            query: start..start + q.query.as_bytes().len(),
        })
    }

    /// The OP_QUERY of `payload`, the payload this layout was made from (`None` otherwise).
    pub(crate) fn view<'a>(&self, payload: &'a [u8]) -> Option<OpQuery<'a>> {
        Some(OpQuery {
            flags: self.flags,
            full_collection_name: std::str::from_utf8(payload.get(4..self.name_end)?).ok()?,
            number_to_skip: self.number_to_skip,
            number_to_return: self.number_to_return,
            query: RawDocument::from_bytes(payload.get(self.query.clone())?).ok()?,
        })
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
