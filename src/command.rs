//! Classification: one pass over a command body (`RawDocument`) into a `CommandInfo`; the
//! request body of a whole message (OP_MSG in place, OP_COMPRESSED decompressed); the
//! ok/code of a whole reply.
//!
//! Bodies are read with a small hand-written element scanner ([`scan`]) rather than
//! `RawDocument::iter_elements`: it is about twice as fast, it yields the byte range of every
//! element (which `rewrite` splices), and it checks every declared length against the
//! enclosing one, so malformed input is an error, never a panic.

use std::fmt;
use std::ops::Range;

use bson::RawDocument;

use crate::wire::compressed::Compressed;
use crate::wire::legacy::OpReply;
use crate::wire::opmsg::{self, OpMsg};
use crate::wire::{Header, OpCode, WireError, HEADER_LEN};

use self::scan::{Elem, Elements, Malformed};

/// `$readPreference.mode`; a missing `$readPreference` means `Primary` (drivers never send
/// mode primary to mongos).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReadPrefMode {
    Primary,
    PrimaryPreferred,
    Secondary,
    SecondaryPreferred,
    Nearest,
}

impl ReadPrefMode {
    pub const ALL: [ReadPrefMode; 5] = [
        ReadPrefMode::Primary,
        ReadPrefMode::PrimaryPreferred,
        ReadPrefMode::Secondary,
        ReadPrefMode::SecondaryPreferred,
        ReadPrefMode::Nearest,
    ];

    /// The camelCase wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            ReadPrefMode::Primary => "primary",
            ReadPrefMode::PrimaryPreferred => "primaryPreferred",
            ReadPrefMode::Secondary => "secondary",
            ReadPrefMode::SecondaryPreferred => "secondaryPreferred",
            ReadPrefMode::Nearest => "nearest",
        }
    }

    pub fn parse(s: &str) -> Option<ReadPrefMode> {
        ReadPrefMode::ALL.into_iter().find(|m| m.as_str() == s)
    }

    /// A bit for use in a `u8` set of modes.
    pub fn bit(self) -> u8 {
        1 << (self as u8)
    }
}

/// One namespace a command touches, borrowed from the body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ns<'a> {
    pub db: &'a str,
    pub coll: &'a str,
}

impl fmt::Display for Ns<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.db, self.coll)
    }
}

/// The top-level `readConcern` of a command, if any.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReadConcernInfo<'a> {
    /// `readConcern` is present (even as an empty document).
    pub present: bool,
    pub level: Option<&'a str>,
    pub after_cluster_time: bool,
    pub at_cluster_time: bool,
    /// `readConcern` has fields other than level/afterClusterTime/atClusterTime.
    pub other_fields: bool,
    /// `readConcern` is not a document, or its `level` is not a string (the server rejects
    /// such a command; it is never eligible).
    pub malformed: bool,
}

/// What the policy needs to know about one command. Built by [`classify`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CommandInfo<'a> {
    /// The first key of the body (for `explain`, still `"explain"`).
    pub name: &'a str,
    /// `$db`.
    pub db: Option<&'a str>,
    /// The primary collection: the string value of the first key (of the inner command when
    /// wrapped in `explain`); `None` for `aggregate: 1` and non-string values.
    pub collection: Option<&'a str>,
    /// `$readPreference.mode`; `None` when absent (= primary).
    pub read_pref: Option<ReadPrefMode>,
    /// `$readPreference` present with a mode we do not know.
    pub read_pref_unknown: bool,
    pub read_concern: ReadConcernInfo<'a>,
    /// `autocommit` present (any value) or `startTransaction` present.
    pub in_transaction: bool,
    /// `txnNumber` present.
    pub txn_number: bool,
    /// `maxTimeMS` as an integer (int32, int64 or a whole double).
    pub max_time_ms: Option<i64>,
    /// The command is `explain` wrapping another.
    pub explain: bool,
    /// The command (or its inner command under explain) is `aggregate` and some stage, at
    /// any depth, is `$out` / `$merge` / `$changeStream`.
    pub has_out: bool,
    pub has_merge: bool,
    pub has_change_stream: bool,
    /// A stage whose namespaces cannot be determined (e.g. `$lookup` with a `from` of an
    /// unexpected type); strict policy treats the command as touching an unknown namespace.
    pub opaque_stage: bool,
    /// Every namespace the command reads besides the primary one: `$lookup.from`,
    /// `$graphLookup.from`, `$unionWith`, recursively through `$lookup.pipeline`,
    /// `$unionWith.pipeline` and `$facet`. Empty (and not allocated) for most commands.
    pub other_namespaces: Vec<Ns<'a>>,
}

impl<'a> CommandInfo<'a> {
    /// The primary namespace, when both `$db` and a collection are known.
    pub fn primary_ns(&self) -> Option<Ns<'a>> {
        Some(Ns {
            db: self.db?,
            coll: self.collection?,
        })
    }
}

/// Command names whose reads the policy can act on.
pub fn is_read_command(name: &str) -> bool {
    matches!(name, "find" | "aggregate" | "count" | "distinct")
}

/// Why a body could not be classified. The session relays such a command unchanged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ClassifyError {
    #[error("malformed bson in command body: {0}")]
    Malformed(&'static str),
    #[error("command body has no first key")]
    NoCommand,
}

impl From<Malformed> for ClassifyError {
    fn from(m: Malformed) -> Self {
        ClassifyError::Malformed(m.0)
    }
}

/// Pipelines nested deeper than this are not walked; the command is marked `opaque_stage`.
pub const MAX_PIPELINE_DEPTH: u32 = 32;

/// Classifies a command body in one pass over its top-level elements (plus a walk of the
/// `pipeline` of an `aggregate`). Allocates only when a pipeline names other namespaces.
///
/// Under `explain`, `collection` and the pipeline come from the inner command; the outer
/// `readConcern` and `maxTimeMS` win, the inner ones are used only when the outer are absent.
pub fn classify(body: &RawDocument) -> Result<CommandInfo<'_>, ClassifyError> {
    let mut elems = Elements::new(body.as_bytes())?;
    let first = elems.next_elem()?.ok_or(ClassifyError::NoCommand)?;
    let mut info = CommandInfo {
        name: scan::key_str(first.key)?,
        ..CommandInfo::default()
    };
    let mut pipeline = None;
    if info.name == "explain" {
        info.explain = true;
        if first.tag == scan::DOCUMENT {
            pipeline = classify_explained(first.value, &mut info)?;
        }
    } else {
        info.collection = string_value(&first)?;
    }
    let is_aggregate = info.name == "aggregate";
    while let Some(e) = elems.next_elem()? {
        match e.key {
            b"$db" => info.db = string_value(&e)?,
            b"$readPreference" => read_preference(&e, &mut info)?,
            b"readConcern" => info.read_concern = read_concern(&e)?,
            b"autocommit" | b"startTransaction" => info.in_transaction = true,
            b"txnNumber" => info.txn_number = true,
            b"maxTimeMS" => info.max_time_ms = int_value(&e),
            b"pipeline" if is_aggregate => pipeline = Some(e),
            _ => {}
        }
    }
    if let Some(p) = pipeline {
        // Walked after the top level because `$db` (needed for `$lookup: {from: "c"}`)
        // usually comes last.
        let primary = info.primary_ns();
        let mut walk = Walk {
            db: info.db,
            primary,
            info: &mut info,
        };
        walk.pipeline_elem(&p, 0)?;
    }
    Ok(info)
}

/// Reads the inner command of `explain`; returns its `pipeline` element when it is an aggregate.
fn classify_explained<'a>(
    inner: &'a [u8],
    info: &mut CommandInfo<'a>,
) -> Result<Option<Elem<'a>>, ClassifyError> {
    let mut elems = Elements::new(inner)?;
    let Some(first) = elems.next_elem()? else {
        return Ok(None);
    };
    info.collection = string_value(&first)?;
    let is_aggregate = first.key == b"aggregate";
    let mut pipeline = None;
    while let Some(e) = elems.next_elem()? {
        match e.key {
            // Read before the outer fields, which overwrite these when present.
            b"readConcern" => info.read_concern = read_concern(&e)?,
            b"maxTimeMS" => info.max_time_ms = int_value(&e),
            b"pipeline" if is_aggregate => pipeline = Some(e),
            _ => {}
        }
    }
    Ok(pipeline)
}

fn read_preference<'a>(e: &Elem<'a>, info: &mut CommandInfo<'a>) -> Result<(), ClassifyError> {
    info.read_pref = None;
    info.read_pref_unknown = true;
    if e.tag != scan::DOCUMENT {
        return Ok(());
    }
    let mut elems = Elements::new(e.value)?;
    while let Some(f) = elems.next_elem()? {
        if f.key == b"mode" {
            let mode = string_value(&f)?.and_then(ReadPrefMode::parse);
            info.read_pref = mode;
            info.read_pref_unknown = mode.is_none();
        }
    }
    Ok(())
}

fn read_concern<'a>(e: &Elem<'a>) -> Result<ReadConcernInfo<'a>, ClassifyError> {
    let mut rc = ReadConcernInfo {
        present: true,
        ..ReadConcernInfo::default()
    };
    if e.tag != scan::DOCUMENT {
        rc.malformed = true;
        return Ok(rc);
    }
    let mut elems = Elements::new(e.value)?;
    while let Some(f) = elems.next_elem()? {
        match f.key {
            b"level" => match string_value(&f)? {
                Some(level) => rc.level = Some(level),
                None => rc.malformed = true,
            },
            b"afterClusterTime" => rc.after_cluster_time = true,
            b"atClusterTime" => rc.at_cluster_time = true,
            _ => rc.other_fields = true,
        }
    }
    Ok(rc)
}

/// The value of a string element, `None` for any other type.
fn string_value<'a>(e: &Elem<'a>) -> Result<Option<&'a str>, ClassifyError> {
    if e.tag != scan::STRING {
        return Ok(None);
    }
    Ok(Some(scan::str_value(e.value)?))
}

/// An int32, int64 or whole double as i64; `None` for anything else.
fn int_value(e: &Elem<'_>) -> Option<i64> {
    match e.tag {
        scan::INT32 => Some(i32::from_le_bytes(e.value.try_into().ok()?) as i64),
        scan::INT64 => Some(i64::from_le_bytes(e.value.try_into().ok()?)),
        scan::DOUBLE => {
            let d = f64::from_le_bytes(e.value.try_into().ok()?);
            // The range check also rejects NaN; `as` would saturate silently.
            let whole = d.fract() == 0.0 && d >= i64::MIN as f64 && d < i64::MAX as f64;
            whole.then_some(d as i64)
        }
        _ => None,
    }
}

/// A recursive walk of one aggregation pipeline and its sub-pipelines.
struct Walk<'a, 'i> {
    db: Option<&'a str>,
    primary: Option<Ns<'a>>,
    info: &'i mut CommandInfo<'a>,
}

impl<'a> Walk<'a, '_> {
    fn opaque(&mut self) {
        self.info.opaque_stage = true;
    }

    /// `e` should be an array of stages; anything else is an opaque shape.
    fn pipeline_elem(&mut self, e: &Elem<'a>, depth: u32) -> Result<(), ClassifyError> {
        if e.tag != scan::ARRAY {
            self.opaque();
            return Ok(());
        }
        if depth >= MAX_PIPELINE_DEPTH {
            self.opaque();
            return Ok(());
        }
        let mut stages = Elements::new(e.value)?;
        while let Some(stage) = stages.next_elem()? {
            if stage.tag != scan::DOCUMENT {
                self.opaque();
                continue;
            }
            match Elements::new(stage.value)?.next_elem()? {
                Some(spec) => self.stage(&spec, depth)?,
                None => self.opaque(),
            }
        }
        Ok(())
    }

    /// One stage, `spec` being its single `{$name: value}` element.
    fn stage(&mut self, spec: &Elem<'a>, depth: u32) -> Result<(), ClassifyError> {
        match spec.key {
            b"$lookup" => self.lookup(spec, depth),
            b"$graphLookup" => self.graph_lookup(spec),
            b"$unionWith" => self.union_with(spec, depth),
            b"$facet" => self.facet(spec, depth),
            b"$out" => {
                self.info.has_out = true;
                Ok(())
            }
            b"$merge" => {
                self.info.has_merge = true;
                Ok(())
            }
            b"$changeStream" => {
                self.info.has_change_stream = true;
                Ok(())
            }
            _ => Ok(()),
        }
    }

    fn lookup(&mut self, spec: &Elem<'a>, depth: u32) -> Result<(), ClassifyError> {
        if spec.tag != scan::DOCUMENT {
            self.opaque();
            return Ok(());
        }
        let mut fields = Elements::new(spec.value)?;
        while let Some(f) = fields.next_elem()? {
            match f.key {
                b"from" => match f.tag {
                    scan::STRING => self.same_db(scan::str_value(f.value)?),
                    scan::DOCUMENT => self.db_coll(f.value)?,
                    _ => self.opaque(),
                },
                b"pipeline" => self.pipeline_elem(&f, depth + 1)?,
                _ => {}
            }
        }
        Ok(())
    }

    /// `from: {db: "d", coll: "c"}`.
    fn db_coll(&mut self, doc: &'a [u8]) -> Result<(), ClassifyError> {
        let (mut db, mut coll) = (None, None);
        let mut fields = Elements::new(doc)?;
        while let Some(f) = fields.next_elem()? {
            match f.key {
                b"db" => db = string_value(&f)?,
                b"coll" => coll = string_value(&f)?,
                _ => {}
            }
        }
        match (db, coll) {
            (Some(db), Some(coll)) => self.push(Ns { db, coll }),
            _ => self.opaque(),
        }
        Ok(())
    }

    fn graph_lookup(&mut self, spec: &Elem<'a>) -> Result<(), ClassifyError> {
        if spec.tag == scan::DOCUMENT {
            let mut fields = Elements::new(spec.value)?;
            while let Some(f) = fields.next_elem()? {
                if f.key == b"from" {
                    match string_value(&f)? {
                        Some(coll) => self.same_db(coll),
                        None => self.opaque(),
                    }
                    return Ok(());
                }
            }
        }
        // Not a document, or no `from`: the server rejects it, but we cannot tell what it reads.
        self.opaque();
        Ok(())
    }

    fn union_with(&mut self, spec: &Elem<'a>, depth: u32) -> Result<(), ClassifyError> {
        match spec.tag {
            scan::STRING => self.same_db(scan::str_value(spec.value)?),
            scan::DOCUMENT => {
                let mut fields = Elements::new(spec.value)?;
                while let Some(f) = fields.next_elem()? {
                    match f.key {
                        b"coll" => match string_value(&f)? {
                            Some(coll) => self.same_db(coll),
                            None => self.opaque(),
                        },
                        b"pipeline" => self.pipeline_elem(&f, depth + 1)?,
                        _ => {}
                    }
                }
            }
            _ => self.opaque(),
        }
        Ok(())
    }

    fn facet(&mut self, spec: &Elem<'a>, depth: u32) -> Result<(), ClassifyError> {
        if spec.tag != scan::DOCUMENT {
            self.opaque();
            return Ok(());
        }
        let mut facets = Elements::new(spec.value)?;
        while let Some(f) = facets.next_elem()? {
            self.pipeline_elem(&f, depth + 1)?;
        }
        Ok(())
    }

    fn same_db(&mut self, coll: &'a str) {
        match self.db {
            Some(db) => self.push(Ns { db, coll }),
            None => self.opaque(),
        }
    }

    fn push(&mut self, ns: Ns<'a>) {
        if self.primary != Some(ns) && !self.info.other_namespaces.contains(&ns) {
            self.info.other_namespaces.push(ns);
        }
    }
}

/// A read the policy may act on, before looking at namespaces and read preference: one of
/// find/aggregate/count/distinct (not under `explain`), outside a transaction, with a
/// readConcern level of none/local/majority/available and no `atClusterTime`, and no
/// `$out`/`$merge`/`$changeStream` stage.
pub fn is_eligible_shape(info: &CommandInfo<'_>) -> bool {
    let rc = &info.read_concern;
    let level_ok = matches!(
        rc.level,
        None | Some("local") | Some("majority") | Some("available")
    );
    is_read_command(info.name)
        && !info.explain
        && !info.in_transaction
        && level_ok
        && !rc.at_cluster_time
        && !rc.malformed
        && !info.has_out
        && !info.has_merge
        && !info.has_change_stream
}

// ---------------------------------------------------------------------------------------
// Whole messages → body

/// The command body of a whole request message.
#[derive(Debug, Clone)]
pub enum RequestBody<'a> {
    /// A plain OP_MSG, viewed in place (no copy).
    Msg(OpMsg<'a>),
    /// OP_COMPRESSED wrapping OP_MSG: the decompressed OP_MSG payload (the bytes after the
    /// wrapped message's header), already validated.
    Decompressed {
        payload: Vec<u8>,
        compressor: u8,
        flags: u32,
        /// Where the body document sits in `payload`.
        body_range: Range<usize>,
        /// Where the sections end in `payload` (the checksum, if any, follows).
        sections_end: usize,
    },
    /// Anything else (OP_QUERY handshakes, legacy opcodes, OP_COMPRESSED wrapping those):
    /// relayed as is.
    NotCommand,
}

impl RequestBody<'_> {
    /// The kind-0 body, `None` for [`RequestBody::NotCommand`].
    pub fn body(&self) -> Option<&RawDocument> {
        match self {
            RequestBody::Msg(m) => Some(m.body),
            RequestBody::Decompressed {
                payload,
                body_range,
                ..
            } => RawDocument::from_bytes(payload.get(body_range.clone())?).ok(),
            RequestBody::NotCommand => None,
        }
    }

    /// The OP_MSG flag bits (0 for `NotCommand`).
    pub fn flags(&self) -> u32 {
        match self {
            RequestBody::Msg(m) => m.flags,
            RequestBody::Decompressed { flags, .. } => *flags,
            RequestBody::NotCommand => 0,
        }
    }
}

/// Reads the header of a whole message and checks `16 <= messageLength <= max` and that it
/// matches the bytes we have.
pub(crate) fn checked_header(msg: &[u8], max: usize) -> Result<Header, WireError> {
    let h = Header::parse(msg).ok_or(WireError::Truncated("message header"))?;
    if h.length < HEADER_LEN as i32 || h.length as i64 > max as i64 {
        return Err(WireError::BadLength {
            len: h.length as i64,
            max,
        });
    }
    if h.length as usize != msg.len() {
        return Err(WireError::Overrun {
            what: "message",
            len: h.length as i64,
            room: msg.len(),
        });
    }
    Ok(h)
}

/// The CRC-32C of an OP_MSG given as a header (possibly reconstructed, for a decompressed
/// message) and the payload up to the checksum.
pub(crate) fn op_msg_crc(header: &Header, payload_before_crc: &[u8]) -> u32 {
    let mut head = [0u8; HEADER_LEN];
    let mut w = &mut head[..];
    header.put(&mut w);
    crc32c::crc32c_append(crc32c::crc32c(&head), payload_before_crc)
}

/// The command body of a whole request message (header included). OP_MSG is viewed in place
/// and its checksum verified; OP_COMPRESSED wrapping OP_MSG is decompressed (size bounded by
/// `max_message_size`) and checked the same way; anything else is `NotCommand`.
pub fn request_body(msg: &[u8], max_message_size: usize) -> Result<RequestBody<'_>, WireError> {
    let header = checked_header(msg, max_message_size)?;
    let payload = &msg[HEADER_LEN..];
    match header.op_code {
        OpCode::MSG => {
            let m = OpMsg::parse(payload)?;
            if m.checksum_present() {
                opmsg::verify_checksum(msg)?;
            }
            Ok(RequestBody::Msg(m))
        }
        OpCode::COMPRESSED => {
            let c = Compressed::parse(payload)?;
            if c.original_opcode != OpCode::MSG {
                return Ok(RequestBody::NotCommand);
            }
            let inner = decompress_op_msg(&header, &c, max_message_size)?;
            let m = OpMsg::parse(&inner)?;
            let (flags, body_range, sections_end) = (m.flags, m.body_range.clone(), m.sections_end);
            Ok(RequestBody::Decompressed {
                payload: inner,
                compressor: c.compressor,
                flags,
                body_range,
                sections_end,
            })
        }
        _ => Ok(RequestBody::NotCommand),
    }
}

/// Decompresses an OP_COMPRESSED that wraps an OP_MSG and verifies the inner checksum, if
/// any, over the reconstructed header (as the server does).
pub(crate) fn decompress_op_msg(
    header: &Header,
    c: &Compressed<'_>,
    max_message_size: usize,
) -> Result<Vec<u8>, WireError> {
    let inner = c.decompress(max_message_size.saturating_sub(HEADER_LEN))?;
    let flags = inner
        .get(..4)
        .map_or(0, |f| u32::from_le_bytes([f[0], f[1], f[2], f[3]]));
    if flags & opmsg::CHECKSUM_PRESENT != 0 {
        let split = inner
            .len()
            .checked_sub(4)
            .ok_or(WireError::Truncated("op_msg checksum"))?;
        let stated = u32::from_le_bytes([
            inner[split],
            inner[split + 1],
            inner[split + 2],
            inner[split + 3],
        ]);
        let computed = op_msg_crc(&inner_header(header, inner.len()), &inner[..split]);
        if stated != computed {
            return Err(WireError::ChecksumMismatch { stated, computed });
        }
    }
    Ok(inner)
}

/// The header of the message an OP_COMPRESSED wraps, as the server reconstructs it.
pub(crate) fn inner_header(outer: &Header, payload_len: usize) -> Header {
    Header {
        length: (HEADER_LEN + payload_len) as i32,
        request_id: outer.request_id,
        response_to: outer.response_to,
        op_code: OpCode::MSG,
    }
}

// ---------------------------------------------------------------------------------------
// Replies

/// What a reply says about the command's outcome.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReplyStatus {
    /// Top-level `ok` is 1 (double, int32, int64 or bool); false when absent.
    pub ok: bool,
    /// Top-level `code` (int32, int64 or whole double that fits an i32).
    pub code: Option<i32>,
    /// Top-level `codeName`; allocated only when present (error replies).
    pub code_name: Option<String>,
}

/// Reads `ok`, `code` and `codeName` of a whole reply message: OP_MSG, OP_COMPRESSED wrapping
/// OP_MSG or OP_REPLY, or OP_REPLY (its first document). Only top-level elements are visited;
/// a large `cursor` is skipped by its length. The checksum is not verified (the client does).
pub fn inspect_reply(msg: &[u8], max_message_size: usize) -> Result<ReplyStatus, WireError> {
    let header = checked_header(msg, max_message_size)?;
    let payload = &msg[HEADER_LEN..];
    match header.op_code {
        OpCode::MSG => reply_status(OpMsg::parse(payload)?.body.as_bytes()),
        OpCode::REPLY => reply_status(op_reply_doc(payload)?),
        OpCode::COMPRESSED => {
            let c = Compressed::parse(payload)?;
            let inner = c.decompress(max_message_size.saturating_sub(HEADER_LEN))?;
            match c.original_opcode {
                OpCode::MSG => reply_status(OpMsg::parse(&inner)?.body.as_bytes()),
                OpCode::REPLY => reply_status(op_reply_doc(&inner)?),
                other => Err(WireError::BadInnerOpcode(other)),
            }
        }
        other => Err(WireError::BadInnerOpcode(other)),
    }
}

fn op_reply_doc(payload: &[u8]) -> Result<&[u8], WireError> {
    let reply = OpReply::parse(payload)?;
    let first = reply
        .first
        .ok_or(WireError::Truncated("op_reply document"))?;
    Ok(first.as_bytes())
}

fn reply_status(body: &[u8]) -> Result<ReplyStatus, WireError> {
    let bad = |_| WireError::BadBson("reply body");
    let mut status = ReplyStatus::default();
    let mut elems = Elements::new(body).map_err(bad)?;
    while let Some(e) = elems.next_elem().map_err(bad)? {
        match e.key {
            b"ok" => {
                status.ok = match e.tag {
                    scan::BOOLEAN => e.value.first() == Some(&1),
                    _ => int_value(&e) == Some(1),
                }
            }
            b"code" => status.code = int_value(&e).and_then(|c| i32::try_from(c).ok()),
            b"codeName" if e.tag == scan::STRING => {
                status.code_name = Some(scan::str_value(e.value).map_err(bad)?.to_owned())
            }
            _ => {}
        }
    }
    Ok(status)
}

// ---------------------------------------------------------------------------------------

/// A BSON element scanner over borrowed bytes: every declared length is checked against the
/// enclosing document before use; values are not decoded until asked for.
pub(crate) mod scan {
    pub const DOUBLE: u8 = 0x01;
    pub const STRING: u8 = 0x02;
    pub const DOCUMENT: u8 = 0x03;
    pub const ARRAY: u8 = 0x04;
    pub const BOOLEAN: u8 = 0x08;
    pub const INT32: u8 = 0x10;
    pub const INT64: u8 = 0x12;

    /// The first malformation found.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct Malformed(pub &'static str);

    /// One element of a document.
    #[derive(Debug, Clone, Copy)]
    pub struct Elem<'a> {
        pub tag: u8,
        pub key: &'a [u8],
        /// The value's bytes (for a document or array: the whole embedded document).
        pub value: &'a [u8],
        /// The whole element (type byte, key, value) as a range of the scanned document.
        pub start: usize,
        pub end: usize,
    }

    /// The elements of one document, in order.
    pub struct Elements<'a> {
        doc: &'a [u8],
        at: usize,
        /// Index of the document's terminating NUL.
        end: usize,
    }

    impl<'a> Elements<'a> {
        /// `doc` must be exactly one document: length prefix equal to `doc.len()`, trailing NUL.
        pub fn new(doc: &'a [u8]) -> Result<Elements<'a>, Malformed> {
            let len = read_i32(doc).ok_or(Malformed("document shorter than 5 bytes"))?;
            if len < 5 || len as usize != doc.len() || doc[doc.len() - 1] != 0 {
                return Err(Malformed("document length or terminator"));
            }
            Ok(Elements {
                doc,
                at: 4,
                end: doc.len() - 1,
            })
        }

        /// The next element, `None` at the end; after an error the scan stays at the error.
        #[inline(always)]
        pub fn next_elem(&mut self) -> Result<Option<Elem<'a>>, Malformed> {
            if self.at >= self.end {
                return Ok(None);
            }
            let start = self.at;
            let tag = self.doc[start];
            let rest = &self.doc[start + 1..self.end];
            let nul = find_nul(rest).ok_or(Malformed("element key without terminator"))?;
            let vstart = start + 1 + nul + 1;
            let room = &self.doc[vstart..self.end];
            let size = value_size(tag, room)?;
            let vend = vstart + size;
            self.at = vend;
            Ok(Some(Elem {
                tag,
                key: &rest[..nul],
                value: &room[..size],
                start,
                end: vend,
            }))
        }
    }

    /// The index of the first NUL byte, eight bytes at a time (keys are short, but a byte
    /// loop was the largest cost of a scan).
    #[inline]
    pub(crate) fn find_nul(b: &[u8]) -> Option<usize> {
        const ONES: u64 = 0x0101_0101_0101_0101;
        const HIGHS: u64 = 0x8080_8080_8080_8080;
        let mut chunks = b.chunks_exact(8);
        let mut at = 0;
        for chunk in &mut chunks {
            let mut w = [0u8; 8];
            w.copy_from_slice(chunk);
            let w = u64::from_le_bytes(w);
            // The lowest set bit marks the first zero byte (borrows only cause false
            // positives above a real zero byte).
            let zero = w.wrapping_sub(ONES) & !w & HIGHS;
            if zero != 0 {
                return Some(at + (zero.trailing_zeros() / 8) as usize);
            }
            at += 8;
        }
        chunks
            .remainder()
            .iter()
            .position(|&c| c == 0)
            .map(|p| at + p)
    }

    #[inline]
    fn read_i32(b: &[u8]) -> Option<i32> {
        Some(i32::from_le_bytes(b.get(..4)?.try_into().ok()?))
    }

    /// A length-prefixed string (string, code, symbol): int32 n >= 1, then n bytes ending in NUL.
    fn string_size(room: &[u8]) -> Result<usize, Malformed> {
        let n = read_i32(room).ok_or(Malformed("string length"))?;
        if n < 1 || n as usize > room.len() - 4 || room[4 + n as usize - 1] != 0 {
            return Err(Malformed("string length or terminator"));
        }
        Ok(4 + n as usize)
    }

    fn cstring_size(room: &[u8]) -> Result<usize, Malformed> {
        find_nul(room)
            .map(|n| n + 1)
            .ok_or(Malformed("cstring without terminator"))
    }

    /// The size of a value of type `tag` at the front of `room`, checked to fit in `room`.
    #[inline(always)]
    fn value_size(tag: u8, room: &[u8]) -> Result<usize, Malformed> {
        let size = match tag {
            0x01 | 0x09 | 0x11 | 0x12 => 8,
            0x10 => 4,
            0x08 => 1,
            0x07 => 12,
            0x13 => 16,
            0x06 | 0x0A | 0x7F | 0xFF => 0,
            0x02 | 0x0D | 0x0E => string_size(room)?,
            0x03 | 0x04 => {
                let n = read_i32(room).ok_or(Malformed("embedded document length"))?;
                if n < 5 || n as usize > room.len() || room[n as usize - 1] != 0 {
                    return Err(Malformed("embedded document length or terminator"));
                }
                n as usize
            }
            0x05 => {
                let n = read_i32(room).ok_or(Malformed("binary length"))?;
                if n < 0 {
                    return Err(Malformed("negative binary length"));
                }
                5 + n as usize
            }
            0x0B => {
                let pattern = cstring_size(room)?;
                pattern + cstring_size(&room[pattern..])?
            }
            0x0C => string_size(room)? + 12,
            0x0F => {
                let n = read_i32(room).ok_or(Malformed("code with scope length"))?;
                if n < 14 {
                    return Err(Malformed("code with scope length"));
                }
                n as usize
            }
            _ => return Err(Malformed("unknown element type")),
        };
        if size > room.len() {
            return Err(Malformed("element overruns its document"));
        }
        Ok(size)
    }

    /// The text of a string value (`value` as yielded for a string element).
    pub fn str_value(value: &[u8]) -> Result<&str, Malformed> {
        let text = value
            .get(4..value.len().saturating_sub(1))
            .ok_or(Malformed("string value"))?;
        std::str::from_utf8(text).map_err(|_| Malformed("string is not utf-8"))
    }

    pub fn key_str(key: &[u8]) -> Result<&str, Malformed> {
        std::str::from_utf8(key).map_err(|_| Malformed("key is not utf-8"))
    }
}

/// The command name (first key) alone, without looking at the rest of the body: lets the
/// session skip classification of commands no policy acts on.
pub fn command_name(body: &RawDocument) -> Result<Option<&str>, ClassifyError> {
    let mut elems = Elements::new(body.as_bytes())?;
    match elems.next_elem()? {
        Some(first) => Ok(Some(scan::key_str(first.key)?)),
        None => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    proptest! {
        /// The word-at-a-time NUL search agrees with a byte loop on every input.
        #[test]
        fn find_nul_matches_position(
            b in proptest::collection::vec(
                prop_oneof![Just(0u8), Just(1u8), Just(0x80u8), Just(0xffu8), any::<u8>()],
                0..40,
            )
        ) {
            prop_assert_eq!(super::scan::find_nul(&b), b.iter().position(|&c| c == 0));
        }
    }
}
