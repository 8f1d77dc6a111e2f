//! The properties the fuzz targets check, as plain functions of a byte string: each panics
//! when the property fails. Shared with the proptest smoke of the normal test suite
//! (`tests/fuzz_smoke.rs` includes this file), so the two check exactly the same things.
//!
//! - [`frames`]: the codec cuts an arbitrary byte stream, fed in arbitrary pieces, into exactly
//!   the messages its headers declare (or stops at the first bad length), and every frame can
//!   be opened, classified, rewritten and inspected without a panic; a rewritten message opens
//!   again to the rewritten body.
//! - [`classify`] ([`classify_bytes`] and [`classify_structured`]): classification never panics, agrees with
//!   `command_name`, accepts every well-formed body, and reads generated commands exactly.
//! - [`rewrite`]: the output is valid BSON (checked with bson's own iterators, every `Result`
//!   propagated) and differs from the input only in `readConcern` and `maxTimeMS`, as the
//!   spec says; the same through OP_MSG (checksum, document sequences) and OP_COMPRESSED.
//! - [`reply`]: `inspect_reply` never panics and reads `ok`/`code`/`codeName` of generated
//!   replies exactly, in every envelope.

use bson::raw::{CStr, RawArray, RawArrayBuf, RawBson, RawBsonRef, RawDocument, RawDocumentBuf};
use bytes::{Bytes, BytesMut};
use staleguard::command::{self, ReadPrefMode, MAX_PIPELINE_DEPTH};
use staleguard::rewrite::{rewrite_body, RewriteSpec};
use staleguard::wire::compressed::compress;
use staleguard::wire::opmsg::CHECKSUM_PRESENT;
use staleguard::wire::{
    inspect_reply, reply, Header, MessageCodec, OpCode, Request, WireError, HEADER_LEN,
};
use tokio_util::codec::Decoder;

/// The largest message the properties let through: small enough that a declared length
/// never makes one input allocate much, large enough for every generated message.
pub const FUZZ_MAX: usize = 64 * 1024;

/// Nesting beyond which [`valid_bson`] gives up (and says "not known valid").
const VALID_DEPTH: usize = 64;

// ---------------------------------------------------------------------------------------
// Reading choices from the input.

/// Choices taken one by one from the front of the input; zeros once it is used up.
pub struct Src<'a> {
    b: &'a [u8],
}

impl<'a> Src<'a> {
    pub fn new(b: &'a [u8]) -> Src<'a> {
        Src { b }
    }

    pub fn byte(&mut self) -> u8 {
        match self.b.split_first() {
            Some((&x, rest)) => {
                self.b = rest;
                x
            }
            None => 0,
        }
    }

    pub fn flag(&mut self) -> bool {
        self.byte() & 1 == 1
    }

    pub fn below(&mut self, n: usize) -> usize {
        self.byte() as usize % n.max(1)
    }

    pub fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[self.below(xs.len())]
    }

    pub fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.byte(), self.byte(), self.byte(), self.byte()])
    }

    /// What is left of the input.
    pub fn rest(self) -> &'a [u8] {
        self.b
    }
}

fn key(k: &str) -> &CStr {
    <&CStr>::try_from(k).expect("generated keys have no NUL")
}

fn put(doc: &mut RawDocumentBuf, k: &str, v: RawBson) {
    doc.append(key(k), v);
}

// ---------------------------------------------------------------------------------------
// Validity with bson's own iterators.

/// Whether `doc` is well-formed BSON at every depth (up to [`VALID_DEPTH`] levels), judged by
/// bson's iterators with every `Result` propagated.
pub fn valid_bson(doc: &RawDocument) -> bool {
    walk_doc(doc, 0).is_ok()
}

fn walk_doc(doc: &RawDocument, depth: usize) -> Result<(), ()> {
    if depth > VALID_DEPTH {
        return Err(());
    }
    for item in doc.iter() {
        let (_, v) = item.map_err(|_| ())?;
        walk_value(v, depth)?;
    }
    Ok(())
}

fn walk_array(arr: &RawArray, depth: usize) -> Result<(), ()> {
    if depth > VALID_DEPTH {
        return Err(());
    }
    for item in arr {
        walk_value(item.map_err(|_| ())?, depth)?;
    }
    Ok(())
}

fn walk_value(v: RawBsonRef<'_>, depth: usize) -> Result<(), ()> {
    match v {
        RawBsonRef::Document(d) => walk_doc(d, depth + 1),
        RawBsonRef::Array(a) => walk_array(a, depth + 1),
        RawBsonRef::JavaScriptCodeWithScope(c) => walk_doc(c.scope, depth + 1),
        _ => Ok(()),
    }
}

// ---------------------------------------------------------------------------------------
// Framing and opening messages.

/// Feeds the rest of the input to the codec in pieces of the chosen size and checks every
/// frame against the stream; opens each frame as the proxy would.
pub fn frames(data: &[u8]) {
    let mut src = Src::new(data);
    let piece = 1 + src.below(97);
    let stream = src.rest();
    let mut codec = MessageCodec::new(FUZZ_MAX);
    let mut buf = BytesMut::new();
    let mut consumed = 0usize;
    for chunk in stream.chunks(piece) {
        buf.extend_from_slice(chunk);
        loop {
            let fed = consumed + buf.len();
            match codec.decode(&mut buf) {
                Ok(Some(frame)) => {
                    let declared = declared_len(&stream[consumed..]);
                    assert_eq!(Some(frame.len() as i64), declared, "frame length");
                    assert!((HEADER_LEN..=FUZZ_MAX).contains(&frame.len()));
                    assert_eq!(&frame[..], &stream[consumed..consumed + frame.len()]);
                    consumed += frame.len();
                    assert_eq!(consumed + buf.len(), fed, "bytes lost or invented");
                    open_message(&frame);
                }
                Ok(None) => {
                    assert_eq!(&buf[..], &stream[consumed..fed], "buffer altered");
                    if let Some(len) = declared_len(&buf) {
                        assert!((HEADER_LEN as i64..=FUZZ_MAX as i64).contains(&len));
                        assert!((buf.len() as i64) < len, "a whole frame was held back");
                    }
                    break;
                }
                Err(_) => {
                    let len = declared_len(&stream[consumed..]).expect("error needs a length");
                    assert!(
                        !(HEADER_LEN as i64..=FUZZ_MAX as i64).contains(&len),
                        "codec refused a length within bounds: {len}"
                    );
                    return;
                }
            }
        }
    }
}

fn declared_len(b: &[u8]) -> Option<i64> {
    let h = b.get(..4)?;
    Some(i32::from_le_bytes([h[0], h[1], h[2], h[3]]) as i64)
}

/// A whole message opened as the relay opens it (`wire::Request`, decompressed when
/// compressed).
fn open(msg: &[u8]) -> Result<Request, WireError> {
    Request::open(Bytes::copy_from_slice(msg), FUZZ_MAX)
}

/// A whole message opened, then rewritten, as the relay does for a governed read.
fn open_and_rewrite(msg: &[u8], spec: &RewriteSpec) -> Result<Bytes, WireError> {
    staleguard::rewrite::rewrite(&open(msg)?, spec, FUZZ_MAX)
}

/// Everything the proxy does with a whole client message, each step without a panic; a
/// rewrite of a message that opens must open again to the rewritten body.
pub fn open_message(msg: &[u8]) {
    let _ = inspect_reply(msg, FUZZ_MAX);
    let Ok(req) = open(msg) else {
        return;
    };
    if let Some(q) = req.op_query() {
        let _ = q.readings();
    }
    let body = match (req.is_command(), req.body()) {
        (false, None) => return,
        (false, Some(_)) => panic!("a message that is not an OP_MSG has a body"),
        (true, None) => panic!("an opened OP_MSG has no body"),
        (true, Some(body)) => body,
    };
    let classified = command::classify(body);
    if let Ok(info) = &classified {
        let _ = command::is_eligible_shape(info);
    }
    for spec in [
        RewriteSpec {
            available: true,
            drop_after_cluster_time: true,
            max_time_ms: Some(250),
            primary: false,
        },
        RewriteSpec {
            available: false,
            drop_after_cluster_time: false,
            max_time_ms: Some(0),
            primary: false,
        },
    ] {
        let Ok(out) = staleguard::rewrite::rewrite(&req, &spec, FUZZ_MAX) else {
            continue;
        };
        let again = open(&out).expect("a rewritten message opens");
        let new_body = again.body().expect("a rewritten message has a body");
        let expected = rewrite_body(body, &spec).expect("rewrite did, so this does");
        assert_eq!(new_body.as_bytes(), &expected[..], "rewritten body");
        assert_eq!(&out[4..12], &msg[4..12], "requestID and responseTo kept");
    }
}

// ---------------------------------------------------------------------------------------
// Classification.

/// The classification target: the first byte picks a raw body (odd) or a generated command.
pub fn classify(data: &[u8]) {
    match data.split_first() {
        Some((mode, rest)) if mode & 1 == 1 => classify_bytes(rest),
        Some((_, rest)) => classify_structured(rest),
        None => {}
    }
}

/// Classifies the input taken as a command body.
pub fn classify_bytes(data: &[u8]) {
    let Ok(doc) = RawDocument::from_bytes(data) else {
        return;
    };
    let classified = command::classify(doc);
    let name = first_key(doc);
    match &classified {
        Ok(info) => {
            assert_eq!(name, Some(info.name), "the first key and classify agree");
            let _ = command::is_eligible_shape(info);
            let _ = info.primary_ns();
        }
        Err(e) => {
            let non_empty = doc.iter().next().is_some();
            assert!(
                !(non_empty && valid_bson(doc)),
                "a well-formed command was not classified ({e}); the proxy would relay it ungoverned"
            );
        }
    }
}

/// The first key of a body, read with the wire crate's scanner (as `wire::Request` does).
fn first_key(doc: &RawDocument) -> Option<&str> {
    let mut elems = staleguard::wire::scan::Elements::new(doc.as_bytes()).ok()?;
    let first = elems.next_elem().ok()??;
    staleguard::wire::scan::key_str(first.key).ok()
}

const COMMANDS: &[&str] = &[
    "find",
    "aggregate",
    "count",
    "distinct",
    "explain",
    "insert",
    "getMore",
    "mapReduce",
];
const DBS: &[&str] = &["demo", "pay", "admin", "x-y"];
const COLLS: &[&str] = &["store_inventory", "transactions", "orders", "a.b.c", "$cmd"];
const LEVELS: &[&str] = &["local", "majority", "available", "snapshot", "linearizable"];
const MODES: &[&str] = &[
    "primary",
    "primaryPreferred",
    "secondary",
    "secondaryPreferred",
    "nearest",
    "Secondary",
];

/// What a generated command should classify as.
#[derive(Debug, Default)]
struct Expected {
    name: &'static str,
    db: Option<&'static str>,
    collection: Option<&'static str>,
    mode: Option<&'static str>,
    level: Option<&'static str>,
    rc_present: bool,
    after_cluster_time: bool,
    at_cluster_time: bool,
    rc_other: bool,
    max_time_ms: Option<i64>,
    max_time_invalid: bool,
    in_transaction: bool,
    explain: bool,
    has_out: bool,
    has_merge: bool,
    other: Vec<(&'static str, &'static str)>,
}

/// A pipeline of up to four stages nested at most `depth` levels, recording the namespaces
/// (and `$out`/`$merge`) it names.
fn gen_pipeline(src: &mut Src<'_>, db: &'static str, depth: u32, exp: &mut Expected) -> RawBson {
    let mut stages = RawArrayBuf::new();
    for _ in 0..src.below(5) {
        let mut stage = RawDocumentBuf::new();
        let coll = src.pick(COLLS);
        match src.below(if depth == 0 { 4 } else { 7 }) {
            0 => put(
                &mut stage,
                "$match",
                RawBson::Document(bson::rawdoc! { "qty": { "$gt": 0 } }),
            ),
            1 => {
                exp.has_out = true;
                put(&mut stage, "$out", RawBson::String(coll.into()))
            }
            2 => {
                exp.has_merge = true;
                put(
                    &mut stage,
                    "$merge",
                    RawBson::Document(bson::rawdoc! { "into": coll }),
                )
            }
            3 => {
                exp.other.push((db, coll));
                put(
                    &mut stage,
                    "$graphLookup",
                    RawBson::Document(bson::rawdoc! { "from": coll, "as": "g" }),
                )
            }
            4 => {
                let mut spec = RawDocumentBuf::new();
                if src.flag() {
                    let other_db = src.pick(DBS);
                    exp.other.push((other_db, coll));
                    put(
                        &mut spec,
                        "from",
                        RawBson::Document(bson::rawdoc! { "db": other_db, "coll": coll }),
                    );
                } else {
                    exp.other.push((db, coll));
                    put(&mut spec, "from", RawBson::String(coll.into()));
                }
                put(&mut spec, "as", RawBson::String("j".into()));
                let inner = gen_pipeline(src, db, depth - 1, exp);
                put(&mut spec, "pipeline", inner);
                put(&mut stage, "$lookup", RawBson::Document(spec));
            }
            5 => {
                exp.other.push((db, coll));
                let mut spec = RawDocumentBuf::new();
                put(&mut spec, "coll", RawBson::String(coll.into()));
                let inner = gen_pipeline(src, db, depth - 1, exp);
                put(&mut spec, "pipeline", inner);
                put(&mut stage, "$unionWith", RawBson::Document(spec));
            }
            _ => {
                let mut facets = RawDocumentBuf::new();
                for f in ["a", "b"] {
                    let inner = gen_pipeline(src, db, depth - 1, exp);
                    put(&mut facets, f, inner);
                }
                put(&mut stage, "$facet", RawBson::Document(facets));
            }
        }
        stages.push(RawBson::Document(stage));
    }
    RawBson::Array(stages)
}

/// Builds a command as drivers send it (no repeated keys), with the choices from `src`, and
/// what it should classify as.
fn gen_command(src: &mut Src<'_>) -> (RawDocumentBuf, Expected) {
    let name = src.pick(COMMANDS);
    let db = src.pick(DBS);
    let coll = src.pick(COLLS);
    let mut exp = Expected {
        name,
        db: Some(db),
        ..Expected::default()
    };
    let mut fields: Vec<(&str, RawBson)> = Vec::new();
    let inner_name = if name == "explain" {
        exp.explain = true;
        src.pick(&["find", "aggregate", "count"])
    } else {
        name
    };
    let mut first = RawDocumentBuf::new();
    put(&mut first, inner_name, RawBson::String(coll.into()));
    exp.collection = Some(coll);
    // Pipelines deeper than the walk's limit are covered by the raw targets; here every
    // namespace must be found.
    let depth = src.below(4).min(MAX_PIPELINE_DEPTH as usize - 1) as u32;
    if inner_name == "aggregate" {
        let p = gen_pipeline(src, db, depth, &mut exp);
        if name == "explain" {
            put(&mut first, "pipeline", p);
        } else {
            fields.push(("pipeline", p));
        }
        fields.push(("cursor", RawBson::Document(RawDocumentBuf::new())));
    }
    if src.flag() {
        let mode = src.pick(MODES);
        exp.mode = Some(mode);
        fields.push((
            "$readPreference",
            RawBson::Document(bson::rawdoc! { "mode": mode }),
        ));
    }
    if src.flag() {
        exp.rc_present = true;
        let mut rc = RawDocumentBuf::new();
        if src.flag() {
            let level = src.pick(LEVELS);
            exp.level = Some(level);
            put(&mut rc, "level", RawBson::String(level.into()));
        }
        if src.flag() {
            exp.after_cluster_time = true;
            let ts = bson::Timestamp {
                time: src.u32(),
                increment: 1,
            };
            put(&mut rc, "afterClusterTime", RawBson::Timestamp(ts));
        }
        if src.flag() {
            exp.at_cluster_time = true;
            let ts = bson::Timestamp {
                time: 7,
                increment: 2,
            };
            put(&mut rc, "atClusterTime", RawBson::Timestamp(ts));
        }
        if src.flag() {
            exp.rc_other = true;
            put(&mut rc, "provenance", RawBson::String("client".into()));
        }
        fields.push(("readConcern", RawBson::Document(rc)));
    }
    // What the server accepts (0..=2147483647, integral) is read; anything else marks
    // the read invalid (it is then forwarded untouched).
    let max_time = |exp: &mut Expected, n: Option<i64>| match n {
        Some(n) if (0..=i32::MAX as i64).contains(&n) => exp.max_time_ms = Some(n),
        _ => exp.max_time_invalid = true,
    };
    match src.below(5) {
        0 => {}
        1 => {
            let n = src.u32() as i32;
            max_time(&mut exp, Some(n as i64));
            fields.push(("maxTimeMS", RawBson::Int32(n)));
        }
        2 => {
            let n = src.u32() as i64 * 3;
            max_time(&mut exp, Some(n));
            fields.push(("maxTimeMS", RawBson::Int64(n)));
        }
        3 => {
            let n = src.below(100_000) as f64 + 0.5;
            max_time(&mut exp, None);
            fields.push(("maxTimeMS", RawBson::Double(n)));
        }
        _ => {
            let n = src.below(100_000) as f64;
            max_time(&mut exp, Some(n as i64));
            fields.push(("maxTimeMS", RawBson::Double(n)));
        }
    }
    if src.flag() {
        exp.in_transaction = true;
        fields.push(("autocommit", RawBson::Boolean(false)));
    }
    fields.push(("$db", RawBson::String(db.into())));
    fields.push((
        "lsid",
        RawBson::Document(bson::rawdoc! { "id": bson::Binary {
        subtype: bson::spec::BinarySubtype::Uuid, bytes: vec![7; 16] } }),
    ));
    // Drivers put the fields in different orders: shuffle all but the command key.
    for i in (1..fields.len()).rev() {
        let j = src.below(i + 1);
        fields.swap(i, j);
    }
    let mut doc = RawDocumentBuf::new();
    if name == "explain" {
        put(&mut doc, "explain", RawBson::Document(first));
    } else {
        put(&mut doc, name, RawBson::String(coll.into()));
    }
    for (k, v) in fields {
        put(&mut doc, k, v);
    }
    (doc, exp)
}

/// Generates a command, checks its classification field by field, then flips bytes of it
/// as the rest of the input says and classifies the result (see [`classify_bytes`]).
pub fn classify_structured(data: &[u8]) {
    let mut src = Src::new(data);
    let (doc, exp) = gen_command(&mut src);
    let info = command::classify(&doc).expect("a generated command classifies");
    assert_eq!(info.name, exp.name);
    assert_eq!(info.db, exp.db);
    assert_eq!(info.collection, exp.collection);
    assert_eq!(info.read_pref, exp.mode.and_then(ReadPrefMode::parse));
    assert_eq!(
        info.read_pref_unknown,
        exp.mode.is_some_and(|m| ReadPrefMode::parse(m).is_none())
    );
    let rc = &info.read_concern;
    assert_eq!(rc.present, exp.rc_present);
    assert_eq!(rc.level, exp.level);
    assert_eq!(rc.after_cluster_time, exp.after_cluster_time);
    assert_eq!(rc.at_cluster_time, exp.at_cluster_time);
    assert_eq!(rc.other_fields, exp.rc_other);
    assert!(!rc.malformed);
    assert_eq!(info.max_time_ms, exp.max_time_ms);
    assert_eq!(info.max_time_invalid, exp.max_time_invalid);
    assert_eq!(info.in_transaction, exp.in_transaction);
    assert_eq!(info.explain, exp.explain);
    assert_eq!(info.has_out, exp.has_out);
    assert_eq!(info.has_merge, exp.has_merge);
    assert!(
        !info.opaque_stage,
        "every generated stage names its namespaces"
    );
    let mut want: Vec<(&str, &str)> = exp
        .other
        .iter()
        .copied()
        .filter(|&(d, c)| (Some(d), Some(c)) != (exp.db, exp.collection))
        .collect();
    want.sort_unstable();
    want.dedup();
    let mut got: Vec<(&str, &str)> = info
        .other_namespaces
        .iter()
        .map(|ns| (ns.db, ns.coll))
        .collect();
    got.sort_unstable();
    assert_eq!(got, want, "namespaces named by the pipeline");
    let eligible = command::is_eligible_shape(&info);
    let level_ok = matches!(exp.level, None | Some("local" | "majority" | "available"));
    assert_eq!(
        eligible,
        command::is_read_command(exp.name)
            && !exp.explain
            && !exp.in_transaction
            && !exp.max_time_invalid
            && level_ok
            && !exp.at_cluster_time
            && !exp.has_out
            && !exp.has_merge,
        "eligibility"
    );
    let mut bytes = doc.into_bytes();
    mutate(&mut bytes, src.rest());
    classify_bytes(&bytes);
}

/// Overwrites bytes of `b`: each pair of input bytes is (position, value).
fn mutate(b: &mut [u8], edits: &[u8]) {
    if b.is_empty() {
        return;
    }
    for e in edits.chunks_exact(2).take(8) {
        let at = (e[0] as usize * 7) % b.len();
        b[at] = e[1];
    }
}

// ---------------------------------------------------------------------------------------
// Rewrite.

fn gen_spec(src: &mut Src<'_>) -> RewriteSpec {
    let available = src.flag();
    RewriteSpec {
        available,
        drop_after_cluster_time: available && src.flag(),
        max_time_ms: match src.below(6) {
            0 | 1 => None,
            2 => Some(0),
            3 => Some(-(src.u32() as i64)),
            4 => Some(src.u32() as i64),
            _ => Some(i64::from(src.u32()) << 20),
        },
        // The `$readPreference` splice is not checked by `check_rewrite` yet.
        primary: false,
    }
}

/// A command for the rewrite: a generated read, with (when asked) repeated `readConcern` /
/// `maxTimeMS` and values of unexpected types, which the rewrite must still handle.
fn gen_rewrite_body(src: &mut Src<'_>) -> RawDocumentBuf {
    let (doc, _) = gen_command(src);
    let mut out = RawDocumentBuf::new();
    let extras: Vec<(&str, RawBson)> = (0..src.below(3))
        .map(|_| match src.below(5) {
            0 => ("readConcern", RawBson::String("available".into())),
            1 => (
                "readConcern",
                RawBson::Document(bson::rawdoc! { "level": "local", "level": "majority" }),
            ),
            2 => ("maxTimeMS", RawBson::String("soon".into())),
            3 => ("maxTimeMS", RawBson::Int32(5)),
            _ => ("readConcern", RawBson::Document(RawDocumentBuf::new())),
        })
        .collect();
    let at = src.below(8);
    let mut extras = extras.into_iter();
    for (i, item) in doc.iter().enumerate() {
        let (k, v) = item.expect("generated documents are valid");
        if i >= at {
            for (ek, ev) in extras.by_ref() {
                put(&mut out, ek, ev);
            }
        }
        out.append(k, v);
    }
    for (ek, ev) in extras {
        put(&mut out, ek, ev);
    }
    out
}

/// Rewrites a generated (or, on the second branch, raw) body and checks the result; then
/// the same body inside an OP_MSG and an OP_COMPRESSED.
pub fn rewrite(data: &[u8]) {
    let mut src = Src::new(data);
    let spec = gen_spec(&mut src);
    let raw = src.flag();
    let envelope = src.byte();
    let generated;
    let body: &RawDocument = if raw {
        match RawDocument::from_bytes(src.rest()) {
            Ok(d) => d,
            Err(_) => return,
        }
    } else {
        generated = gen_rewrite_body(&mut src);
        &generated
    };
    check_rewrite(body, &spec);
    check_rewrite_message(body, &spec, envelope);
}

/// The rewrite property on one body: valid in, valid out; only the named fields differ.
pub fn check_rewrite(body: &RawDocument, spec: &RewriteSpec) {
    let valid_in = valid_bson(body);
    let out = match rewrite_body(body, spec) {
        Ok(out) => out,
        Err(e) => {
            assert!(!valid_in, "rewrite refused a well-formed body: {e}");
            return;
        }
    };
    let out_doc = RawDocument::from_bytes(&out).expect("the output has a sound frame");
    assert_eq!(declared_len(&out), Some(out.len() as i64));
    if !valid_in {
        return;
    }
    assert!(valid_bson(out_doc), "valid in, invalid out");
    let mut got = out_doc.iter().map(|e| {
        let (k, v) = e.expect("valid");
        (k.as_str(), v)
    });
    let (mut rc_seen, mut mt_seen) = (false, false);
    for item in body.iter() {
        let (k, v) = item.expect("valid");
        let k = k.as_str();
        let (gk, gv) = got.next().expect("an element of the input went missing");
        assert_eq!(gk, k, "elements keep their order");
        if spec.available && k == "readConcern" && !rc_seen {
            rc_seen = true;
            check_read_concern(gv, Some(v), spec);
        } else if spec.max_time_ms.is_some() && k == "maxTimeMS" && !mt_seen {
            mt_seen = true;
            check_max_time(gv, Some(v), spec);
        } else {
            assert!(same(gv, v), "{k} changed, and the spec does not name it");
        }
    }
    if spec.available && !rc_seen {
        let (gk, gv) = got.next().expect("readConcern appended");
        assert_eq!(gk, "readConcern");
        check_read_concern(gv, None, spec);
    }
    if spec.max_time_ms.is_some() && !mt_seen {
        let (gk, gv) = got.next().expect("maxTimeMS appended");
        assert_eq!(gk, "maxTimeMS");
        check_max_time(gv, None, spec);
    }
    assert!(got.next().is_none(), "the rewrite added an element");
}

/// Equal values, bit for bit (so NaN equals itself, and embedded documents byte for byte).
fn same(a: RawBsonRef<'_>, b: RawBsonRef<'_>) -> bool {
    match (a, b) {
        (RawBsonRef::Double(x), RawBsonRef::Double(y)) => x.to_bits() == y.to_bits(),
        (RawBsonRef::Document(x), RawBsonRef::Document(y)) => x.as_bytes() == y.as_bytes(),
        (RawBsonRef::Array(x), RawBsonRef::Array(y)) => x.as_bytes() == y.as_bytes(),
        (RawBsonRef::JavaScriptCodeWithScope(x), RawBsonRef::JavaScriptCodeWithScope(y)) => {
            x.code == y.code && x.scope.as_bytes() == y.scope.as_bytes()
        }
        _ => a == b,
    }
}

/// `{level: "available", <old subfields but level (and afterClusterTime when asked)>}`.
fn check_read_concern(got: RawBsonRef<'_>, old: Option<RawBsonRef<'_>>, spec: &RewriteSpec) {
    let RawBsonRef::Document(rc) = got else {
        panic!("readConcern rewritten to a non-document: {got:?}");
    };
    let mut fields = rc.iter().map(|e| {
        let (k, v) = e.expect("valid");
        (k.as_str(), v)
    });
    assert_eq!(
        fields.next(),
        Some(("level", RawBsonRef::String("available")))
    );
    if let Some(RawBsonRef::Document(old)) = old {
        for item in old.iter() {
            let (k, v) = item.expect("valid");
            let k = k.as_str();
            let dropped = k == "level" || (spec.drop_after_cluster_time && k == "afterClusterTime");
            if !dropped {
                let (gk, gv) = fields.next().expect("readConcern subfield kept");
                assert!(gk == k && same(gv, v), "readConcern subfield {k} kept");
            }
        }
    }
    assert!(fields.next().is_none(), "readConcern gained a subfield");
}

/// `maxTimeMS` is the spec's value (at least 1), int32 when the old one was int32 and it
/// fits, a double when the old one was a double, else int64.
fn check_max_time(got: RawBsonRef<'_>, old: Option<RawBsonRef<'_>>, spec: &RewriteSpec) {
    let n = spec.max_time_ms.expect("checked by the caller").max(1);
    let want = match (old, i32::try_from(n)) {
        (Some(RawBsonRef::Int32(_)), Ok(v)) => RawBsonRef::Int32(v),
        (Some(RawBsonRef::Double(_)), _) => RawBsonRef::Double(n as f64),
        _ => RawBsonRef::Int64(n),
    };
    assert_eq!(got, want, "maxTimeMS");
}

/// The body inside an OP_MSG (checksum and a document sequence as `envelope` says), maybe
/// compressed: opening and rewriting it must give a message that opens to `rewrite_body`'s output,
/// with the header ids and the sequence unchanged.
fn check_rewrite_message(body: &RawDocument, spec: &RewriteSpec, envelope: u8) {
    let crc = envelope & 1 == 1;
    let sequence = envelope & 2 == 2;
    let compressor = match envelope >> 2 & 7 {
        c @ 0..=3 => Some(c),
        _ => None,
    };
    let Some(msg) = op_msg_bytes(body, crc, sequence) else {
        return;
    };
    let msg = match compressor {
        Some(c) => compressed(&msg, c),
        None => msg,
    };
    if msg.len() > FUZZ_MAX {
        return;
    }
    let Ok(expected) = rewrite_body(body, spec) else {
        assert!(open_and_rewrite(&msg, spec).is_err());
        return;
    };
    let out = match open_and_rewrite(&msg, spec) {
        Ok(out) => out,
        Err(e) => {
            // Only a message that no longer fits may fail (compression can grow it a little).
            let at_least = HEADER_LEN + 5 + expected.len() + if crc { 4 } else { 0 };
            assert!(at_least + 512 > FUZZ_MAX, "open and rewrite failed: {e}");
            return;
        }
    };
    assert_eq!(&out[4..12], &msg[4..12], "requestID and responseTo kept");
    let req = open(&out).expect("the rewritten message opens");
    assert_eq!(
        req.body().expect("it has a body").as_bytes(),
        &expected[..],
        "message and body rewrites agree"
    );
    let parts = req.parts().expect("the rewrite is still an OP_MSG");
    let (payload, body_end, sections_end) =
        (parts.payload, parts.body_range.end, parts.sections_end);
    let tail: &[u8] = if sequence { SEQUENCE_TAIL } else { &[] };
    assert_eq!(
        &payload[body_end..sections_end],
        tail,
        "document sequence kept"
    );
    assert_eq!(req.flags() & CHECKSUM_PRESENT != 0, crc);
}

/// A kind-1 section `documents` holding `{_id: 1}`.
const SEQUENCE_TAIL: &[u8] =
    b"\x01\x1c\x00\x00\x00documents\x00\x0e\x00\x00\x00\x10_id\x00\x01\x00\x00\x00\x00";

/// An OP_MSG (request id 71) around `body`, or `None` when it would not fit an i32.
fn op_msg_bytes(body: &RawDocument, crc: bool, sequence: bool) -> Option<Vec<u8>> {
    let b = body.as_bytes();
    let tail = if sequence { SEQUENCE_TAIL } else { &[] };
    let total = HEADER_LEN + 4 + 1 + b.len() + tail.len() + if crc { 4 } else { 0 };
    let mut out = Vec::with_capacity(total);
    Header {
        length: i32::try_from(total).ok()?,
        request_id: 71,
        response_to: 0,
        op_code: OpCode::MSG,
    }
    .put(&mut out);
    out.extend_from_slice(&(if crc { CHECKSUM_PRESENT } else { 0 }).to_le_bytes());
    out.push(0);
    out.extend_from_slice(b);
    out.extend_from_slice(tail);
    if crc {
        let sum = crc32c::crc32c(&out);
        out.extend_from_slice(&sum.to_le_bytes());
    }
    Some(out)
}

/// `msg` (OP_MSG or OP_REPLY) wrapped in OP_COMPRESSED with `compressor`.
pub fn compressed(msg: &[u8], compressor: u8) -> Vec<u8> {
    let header = Header::parse(msg).expect("a whole message");
    let payload = &msg[HEADER_LEN..];
    let data = compress(compressor, payload).expect("known compressor");
    let total = HEADER_LEN + 9 + data.len();
    let mut out = Vec::with_capacity(total);
    Header {
        length: total as i32,
        op_code: OpCode::COMPRESSED,
        ..header
    }
    .put(&mut out);
    out.extend_from_slice(&header.op_code.to_le_bytes());
    out.extend_from_slice(&(payload.len() as i32).to_le_bytes());
    out.push(compressor);
    out.extend_from_slice(&data);
    out
}

// ---------------------------------------------------------------------------------------
// Reply inspection.

/// Raw input: `inspect_reply` must not panic. Generated input: a reply whose `ok`, `code`
/// and `codeName` are of chosen types, in a chosen envelope, read exactly.
pub fn reply(data: &[u8]) {
    let mut src = Src::new(data);
    if src.flag() {
        let _ = inspect_reply(src.rest(), FUZZ_MAX);
        return;
    }
    let mut fields: Vec<(&str, RawBson)> = vec![(
        "cursor",
        RawBson::Document(bson::rawdoc! { "firstBatch": [{ "ok": 0, "code": 1 }], "id": 0_i64 }),
    )];
    let (ok_value, ok) = match src.below(9) {
        0 => (Some(RawBson::Double(1.0)), true),
        1 => (Some(RawBson::Double(0.0)), false),
        2 => (Some(RawBson::Int32(1)), true),
        3 => (Some(RawBson::Int64(1)), true),
        4 => (Some(RawBson::Boolean(true)), true),
        5 => (Some(RawBson::Boolean(false)), false),
        6 => (Some(RawBson::String("1".into())), false),
        7 => (Some(RawBson::Double(1.5)), false),
        _ => (None, false),
    };
    if let Some(v) = ok_value {
        fields.push(("ok", v));
    }
    let raw_code = src.u32() as i32;
    let (code_value, code) = match src.below(8) {
        0 => (Some(RawBson::Int32(raw_code)), Some(raw_code)),
        1 => (Some(RawBson::Int64(raw_code as i64)), Some(raw_code)),
        2 => (
            Some(RawBson::Int64(
                i64::from(i32::MAX) + 1 + i64::from(raw_code as u32),
            )),
            None,
        ),
        3 => (Some(RawBson::Double(raw_code as f64)), Some(raw_code)),
        4 => (Some(RawBson::Double(raw_code as f64 + 0.25)), None),
        5 => (Some(RawBson::String("13388".into())), None),
        6 => (Some(RawBson::Double(f64::NAN)), None),
        _ => (None, None),
    };
    if let Some(v) = code_value {
        fields.push(("code", v));
    }
    let code_name = match src.below(3) {
        0 => {
            fields.push(("codeName", RawBson::String("StaleConfig".into())));
            Some("StaleConfig".to_string())
        }
        1 => {
            fields.push(("codeName", RawBson::Int32(13388)));
            None
        }
        _ => None,
    };
    for i in (0..fields.len()).rev() {
        let j = src.below(i + 1);
        fields.swap(i, j);
    }
    let mut doc = RawDocumentBuf::new();
    for (k, v) in fields {
        put(&mut doc, k, v);
    }
    let msg = match src.below(3) {
        0 => reply::op_msg(5, 9, 0, &doc).to_vec(),
        1 => reply::op_msg(5, 9, CHECKSUM_PRESENT, &doc).to_vec(),
        _ => reply::op_reply(5, 9, &doc).to_vec(),
    };
    let msg = match src.below(6) {
        c @ 0..=3 => compressed(&msg, c as u8),
        _ => msg,
    };
    let status = inspect_reply(&msg, FUZZ_MAX).expect("a generated reply inspects");
    assert_eq!(status.ok, ok, "ok");
    assert_eq!(status.code, code, "code");
    assert_eq!(status.code_name, code_name, "codeName");
    let mut msg = msg;
    mutate(&mut msg, src.rest());
    let _ = inspect_reply(&msg, FUZZ_MAX);
}
