//! The readConcern/maxTimeMS splice, whole-message rewrites and reply inspection.

use bson::spec::BinarySubtype;
use bson::{rawdoc, Binary, Document, RawBsonRef, RawDocument, RawDocumentBuf, Timestamp};
use bytes::Bytes;
use staleguard::command::classify;
use staleguard::rewrite::{rewrite, rewrite_body, rewrite_into, Places, RewriteSpec};
use staleguard::wire::compressed::{self, compress, Compressed};
use staleguard::wire::opmsg::{verify_checksum, OpMsg, CHECKSUM_PRESENT};
use staleguard::wire::reply::{error_reply, op_msg, op_reply};
use staleguard::wire::{inspect_reply, ReplyStatus, Request};
use staleguard::wire::{Header, WireError, DEFAULT_MAX_MESSAGE_SIZE};

const MAX: usize = DEFAULT_MAX_MESSAGE_SIZE;

/// A whole message opened as the relay opens it (decompressed when compressed).
fn open(msg: &[u8], max: usize) -> Result<Request, WireError> {
    Request::open(Bytes::copy_from_slice(msg), max)
}

/// A whole message opened, then rewritten, as the relay does for a governed read.
fn open_and_rewrite(msg: &[u8], spec: &RewriteSpec, max: usize) -> Result<Bytes, WireError> {
    rewrite(&open(msg, max)?, spec, max)
}

const AVAILABLE: RewriteSpec = RewriteSpec {
    available: true,
    drop_after_cluster_time: true,
    max_time_ms: None,
    primary: false,
};

fn ts() -> Timestamp {
    Timestamp {
        time: 1_700_000_000,
        increment: 3,
    }
}

/// Every top-level element as (key, raw element bytes), computed with bson's own iterator
/// (independently of the scanner under test).
fn elements(doc: &RawDocument) -> Vec<(String, Vec<u8>)> {
    let bytes = doc.as_bytes();
    let mut at = 4;
    let mut out = Vec::new();
    for e in doc.iter_elements() {
        let e = e.unwrap();
        let key = e.key().as_str().to_owned();
        let len = 1 + key.len() + 1 + e.size();
        out.push((key, bytes[at..at + len].to_vec()));
        at += len;
    }
    assert_eq!(at, bytes.len() - 1, "elements cover the document");
    out
}

fn keys(doc: &RawDocument) -> Vec<String> {
    elements(doc).into_iter().map(|(k, _)| k).collect()
}

/// Parses the result fully (every nested value) and returns it as a `RawDocumentBuf`.
fn valid(bytes: Vec<u8>) -> RawDocumentBuf {
    let doc = RawDocumentBuf::from_bytes(bytes).expect("length and terminator");
    Document::try_from(doc.as_ref()).expect("valid bson throughout");
    doc
}

/// Asserts that every element of `original` except those named in `changed` is present in
/// `result`, byte for byte, in the same relative order.
fn untouched_identical(original: &RawDocument, result: &RawDocument, changed: &[&str]) {
    let keep = |v: Vec<(String, Vec<u8>)>| {
        v.into_iter()
            .filter(|(k, _)| !changed.contains(&k.as_str()))
            .collect::<Vec<_>>()
    };
    assert_eq!(keep(elements(original)), keep(elements(result)));
}

fn find_body() -> RawDocumentBuf {
    rawdoc! {
        "find": "store_inventory",
        "filter": { "sku": "abc-123", "qty": { "$gt": 5 } },
        "limit": 20,
        "lsid": { "id": Binary { subtype: BinarySubtype::Uuid, bytes: vec![7; 16] } },
        "$db": "demo",
        "$readPreference": { "mode": "secondaryPreferred", "tags": [ { "dc": "a1" } ] },
    }
}

#[test]
fn read_concern_appended_when_absent() {
    let body = find_body();
    let out = valid(rewrite_body(&body, &AVAILABLE).unwrap());
    assert_eq!(
        keys(&out),
        [
            "find",
            "filter",
            "limit",
            "lsid",
            "$db",
            "$readPreference",
            "readConcern"
        ]
    );
    assert_eq!(
        out.get_document("readConcern").unwrap(),
        rawdoc! { "level": "available" }.as_ref()
    );
    untouched_identical(&body, &out, &["readConcern"]);
    // The original elements are a byte-identical prefix.
    let n = body.as_bytes().len() - 1;
    assert_eq!(out.as_bytes()[4..n], body.as_bytes()[4..n]);
    let info = classify(&out).unwrap();
    assert_eq!(info.read_concern.level, Some("available"));
}

#[test]
fn read_concern_replaced_in_place() {
    let body = rawdoc! {
        "find": "c",
        "readConcern": { "level": "local", "afterClusterTime": ts() },
        "filter": { "a": 1 },
        "$db": "d",
        "lsid": { "id": 1 },
    };
    let out = valid(rewrite_body(&body, &AVAILABLE).unwrap());
    assert_eq!(keys(&out), ["find", "readConcern", "filter", "$db", "lsid"]);
    assert_eq!(
        out.get_document("readConcern").unwrap(),
        rawdoc! { "level": "available" }.as_ref()
    );
    untouched_identical(&body, &out, &["readConcern"]);

    // Kept when asked to.
    let keep = RewriteSpec {
        drop_after_cluster_time: false,
        ..AVAILABLE
    };
    let out = valid(rewrite_body(&body, &keep).unwrap());
    assert_eq!(keys(&out), ["find", "readConcern", "filter", "$db", "lsid"]);
    assert_eq!(
        out.get_document("readConcern").unwrap(),
        rawdoc! { "level": "available", "afterClusterTime": ts() }.as_ref()
    );
    untouched_identical(&body, &out, &["readConcern"]);
}

#[test]
fn read_concern_other_subfields_kept() {
    let body = rawdoc! {
        "aggregate": "c",
        "pipeline": [],
        "readConcern": { "afterClusterTime": ts(), "provenance": "clientSupplied", "level": "majority", "x": { "y": [1, 2] } },
        "cursor": {},
    };
    let out = valid(rewrite_body(&body, &AVAILABLE).unwrap());
    assert_eq!(
        keys(&out),
        ["aggregate", "pipeline", "readConcern", "cursor"]
    );
    assert_eq!(
        out.get_document("readConcern").unwrap(),
        rawdoc! { "level": "available", "provenance": "clientSupplied", "x": { "y": [1, 2] } }
            .as_ref()
    );
    let keep = RewriteSpec {
        drop_after_cluster_time: false,
        ..AVAILABLE
    };
    let out = valid(rewrite_body(&body, &keep).unwrap());
    assert_eq!(
        out.get_document("readConcern").unwrap(),
        rawdoc! { "level": "available", "afterClusterTime": ts(), "provenance": "clientSupplied", "x": { "y": [1, 2] } }
            .as_ref()
    );
}

#[test]
fn read_concern_not_a_document_is_replaced() {
    let body = rawdoc! { "find": "c", "readConcern": "local", "$db": "d" };
    let out = valid(rewrite_body(&body, &AVAILABLE).unwrap());
    assert_eq!(keys(&out), ["find", "readConcern", "$db"]);
    assert_eq!(
        out.get_document("readConcern").unwrap(),
        rawdoc! { "level": "available" }.as_ref()
    );
}

fn max_time(doc: &RawDocument) -> RawBsonRef<'_> {
    doc.get("maxTimeMS").unwrap().expect("maxTimeMS present")
}

#[test]
fn max_time_ms_keeps_the_clients_type() {
    let spec = |n| RewriteSpec {
        available: false,
        drop_after_cluster_time: false,
        max_time_ms: Some(n),
        primary: false,
    };
    let cases: Vec<(RawDocumentBuf, i64, RawBsonRef<'static>)> = vec![
        (
            rawdoc! { "find": "c", "maxTimeMS": 5000, "$db": "d" },
            800,
            RawBsonRef::Int32(800),
        ),
        (
            rawdoc! { "find": "c", "maxTimeMS": 5000, "$db": "d" },
            3_000_000_000,
            RawBsonRef::Int64(3_000_000_000),
        ),
        (
            rawdoc! { "find": "c", "maxTimeMS": 5000_i64, "$db": "d" },
            800,
            RawBsonRef::Int64(800),
        ),
        (
            rawdoc! { "find": "c", "maxTimeMS": 5000.0, "$db": "d" },
            800,
            RawBsonRef::Double(800.0),
        ),
        // A spent budget is written as 1 ms, never 0 (= no limit).
        (
            rawdoc! { "find": "c", "maxTimeMS": 5000, "$db": "d" },
            0,
            RawBsonRef::Int32(1),
        ),
        (
            rawdoc! { "find": "c", "maxTimeMS": 5000, "$db": "d" },
            -40,
            RawBsonRef::Int32(1),
        ),
    ];
    for (body, n, want) in cases {
        let out = valid(rewrite_body(&body, &spec(n)).unwrap());
        assert_eq!(keys(&out), ["find", "maxTimeMS", "$db"], "{body:?}");
        assert_eq!(max_time(&out), want, "{body:?} -> {n}");
        untouched_identical(&body, &out, &["maxTimeMS"]);
    }

    // Absent: appended as int64.
    let body = rawdoc! { "count": "c", "query": {}, "$db": "d" };
    let out = valid(rewrite_body(&body, &spec(250)).unwrap());
    assert_eq!(keys(&out), ["count", "query", "$db", "maxTimeMS"]);
    assert_eq!(max_time(&out), RawBsonRef::Int64(250));
    untouched_identical(&body, &out, &["maxTimeMS"]);
    assert_eq!(classify(&out).unwrap().max_time_ms, Some(250));
}

#[test]
fn both_edits_and_no_edit() {
    let body = rawdoc! {
        "find": "c",
        "maxTimeMS": 9000,
        "filter": {},
        "readConcern": { "level": "majority" },
        "$db": "d",
    };
    let spec = RewriteSpec {
        available: true,
        drop_after_cluster_time: true,
        max_time_ms: Some(1200),
        primary: false,
    };
    let out = valid(rewrite_body(&body, &spec).unwrap());
    assert_eq!(
        keys(&out),
        ["find", "maxTimeMS", "filter", "readConcern", "$db"]
    );
    assert_eq!(max_time(&out), RawBsonRef::Int32(1200));
    assert_eq!(
        out.get_document("readConcern").unwrap(),
        rawdoc! { "level": "available" }.as_ref()
    );
    untouched_identical(&body, &out, &["maxTimeMS", "readConcern"]);

    // Both absent: appended, readConcern first.
    let body = rawdoc! { "distinct": "c", "key": "k", "$db": "d" };
    let out = valid(rewrite_body(&body, &spec).unwrap());
    assert_eq!(
        keys(&out),
        ["distinct", "key", "$db", "readConcern", "maxTimeMS"]
    );

    // Nothing to do: the same bytes.
    let out = rewrite_body(&body, &RewriteSpec::default()).unwrap();
    assert_eq!(out, body.as_bytes());
}

#[test]
fn only_the_first_duplicate_is_replaced() {
    // The server rejects duplicate fields; the rewrite does not try to repair them.
    let body = rawdoc! {
        "find": "c",
        "readConcern": { "level": "local" },
        "maxTimeMS": 100,
        "readConcern": { "level": "majority" },
        "maxTimeMS": 200,
    };
    let spec = RewriteSpec {
        max_time_ms: Some(50),
        ..AVAILABLE
    };
    let out = valid(rewrite_body(&body, &spec).unwrap());
    let els = elements(&out);
    let orig = elements(&body);
    assert_eq!(
        keys(&out),
        [
            "find",
            "readConcern",
            "maxTimeMS",
            "readConcern",
            "maxTimeMS"
        ]
    );
    assert_eq!(els[0], orig[0]);
    assert_eq!(els[3], orig[3]);
    assert_eq!(els[4], orig[4]);
    assert_eq!(
        out.get_document("readConcern").unwrap(),
        rawdoc! { "level": "available" }.as_ref()
    );
    assert_eq!(max_time(&out), RawBsonRef::Int32(50));
}

#[test]
fn malformed_body_is_an_error() {
    let body = rawdoc! { "find": "c", "filter": { "a": 1 }, "$db": "d" };
    let mut b = body.as_bytes().to_vec();
    b[16] = 0x42; // the type byte of "filter"
    let doc = RawDocument::from_bytes(&b).unwrap();
    assert_eq!(
        rewrite_body(doc, &AVAILABLE),
        Err(WireError::BadBson("command body"))
    );
}

// ---------------------------------------------------------------------------------------
// Whole messages

/// A kind-1 section.
fn sequence(id: &str, docs: &[RawDocumentBuf]) -> Vec<u8> {
    let mut s = Vec::new();
    s.extend_from_slice(id.as_bytes());
    s.push(0);
    for d in docs {
        s.extend_from_slice(d.as_bytes());
    }
    let mut out = vec![1u8];
    out.extend_from_slice(&((s.len() + 4) as i32).to_le_bytes());
    out.extend_from_slice(&s);
    out
}

/// An OP_MSG with a sequence before and after the body.
fn op_msg_with_sequences(flags: u32, body: &RawDocument, before: &[u8], after: &[u8]) -> Vec<u8> {
    let crc = flags & CHECKSUM_PRESENT != 0;
    let len =
        16 + 4 + before.len() + 1 + body.as_bytes().len() + after.len() + if crc { 4 } else { 0 };
    let mut m = Vec::with_capacity(len);
    m.extend_from_slice(&(len as i32).to_le_bytes());
    m.extend_from_slice(&4242i32.to_le_bytes());
    m.extend_from_slice(&17i32.to_le_bytes());
    m.extend_from_slice(&2013i32.to_le_bytes());
    m.extend_from_slice(&flags.to_le_bytes());
    m.extend_from_slice(before);
    m.push(0);
    m.extend_from_slice(body.as_bytes());
    m.extend_from_slice(after);
    if crc {
        let sum = crc32c::crc32c(&m);
        m.extend_from_slice(&sum.to_le_bytes());
    }
    assert_eq!(m.len(), len);
    m
}

fn compressed(msg: &[u8], compressor: u8) -> Vec<u8> {
    let payload = &msg[16..];
    let data = compress(compressor, payload).unwrap();
    let len = 16 + 9 + data.len();
    let mut out = Vec::with_capacity(len);
    out.extend_from_slice(&(len as i32).to_le_bytes());
    out.extend_from_slice(&msg[4..12]);
    out.extend_from_slice(&2012i32.to_le_bytes());
    out.extend_from_slice(&i32::from_le_bytes(msg[12..16].try_into().unwrap()).to_le_bytes());
    out.extend_from_slice(&(payload.len() as i32).to_le_bytes());
    out.push(compressor);
    out.extend_from_slice(&data);
    out
}

/// Checks a rewritten OP_MSG payload: flags kept, sequences identical, body rewritten.
fn check_payload(payload: &[u8], flags: u32, before: &[u8], after: &[u8]) {
    let m = OpMsg::parse(payload).unwrap();
    assert_eq!(m.flags, flags);
    assert_eq!(m.sequences, 2);
    assert_eq!(&payload[4..4 + before.len()], before);
    assert_eq!(&payload[m.body_range.end..m.sections_end], after);
    assert_eq!(
        m.body.get_document("readConcern").unwrap(),
        rawdoc! { "level": "available" }.as_ref()
    );
    assert_eq!(m.body.get_i64("maxTimeMS").unwrap(), 700);
    assert_eq!(m.body.get_str("update").unwrap(), "c");
}

fn seq_fixture() -> (RawDocumentBuf, Vec<u8>, Vec<u8>) {
    // Not a read, but any OP_MSG body can be rewritten; sequences surround it.
    let body = rawdoc! { "update": "c", "ordered": true, "$db": "d" };
    let before = sequence(
        "updates",
        &[rawdoc! { "q": {}, "u": { "$set": { "a": 1 } } }],
    );
    let after = sequence("other", &[rawdoc! { "x": 1 }, rawdoc! { "y": "two" }]);
    (body, before, after)
}

const BOTH: RewriteSpec = RewriteSpec {
    available: true,
    drop_after_cluster_time: true,
    max_time_ms: Some(700),
    primary: false,
};

#[test]
fn rewrite_message_keeps_sequences_and_header() {
    let (body, before, after) = seq_fixture();
    for flags in [0, CHECKSUM_PRESENT, CHECKSUM_PRESENT | (1 << 16)] {
        let msg = op_msg_with_sequences(flags, &body, &before, &after);
        let out = open_and_rewrite(&msg, &BOTH, MAX).unwrap();
        let h = Header::parse(&out).unwrap();
        assert_eq!(h.length as usize, out.len());
        assert_eq!((h.request_id, h.response_to, h.op_code), (4242, 17, 2013));
        check_payload(&out[16..], flags, &before, &after);
        if flags & CHECKSUM_PRESENT != 0 {
            verify_checksum(&out).unwrap();
        }
        // And it reads back as a command.
        assert!(open(&out, MAX).unwrap().body().is_some());
    }
}

#[test]
fn rewrite_message_plain_find_with_checksum() {
    let body = find_body();
    let msg = op_msg(5, 0, CHECKSUM_PRESENT, &body);
    let out = open_and_rewrite(&msg, &AVAILABLE, MAX).unwrap();
    verify_checksum(&out).unwrap();
    let m = OpMsg::parse(&out[16..]).unwrap();
    let rewritten = rewrite_body(&body, &AVAILABLE).unwrap();
    assert_eq!(m.body.as_bytes(), &rewritten[..]);
    assert_eq!(
        out.len(),
        msg.len() + (rewritten.len() - body.as_bytes().len())
    );
}

#[test]
fn rewrite_message_each_compressor() {
    let (body, before, after) = seq_fixture();
    for flags in [0, CHECKSUM_PRESENT] {
        let msg = op_msg_with_sequences(flags, &body, &before, &after);
        for c in [
            compressed::NOOP,
            compressed::SNAPPY,
            compressed::ZLIB,
            compressed::ZSTD,
        ] {
            let wrapped = compressed(&msg, c);
            let out = open_and_rewrite(&wrapped, &BOTH, MAX).unwrap();
            let h = Header::parse(&out).unwrap();
            assert_eq!(h.length as usize, out.len());
            assert_eq!((h.request_id, h.response_to, h.op_code), (4242, 17, 2012));
            let comp = Compressed::parse(&out[16..]).unwrap();
            assert_eq!(comp.compressor, c, "same compressor");
            assert_eq!(comp.original_opcode, 2013);
            let inner = comp.decompress(MAX).unwrap();
            assert_eq!(comp.uncompressed_size as usize, inner.len());
            check_payload(&inner, flags, &before, &after);
            // Opening verifies the inner checksum over the reconstructed header.
            let req = open(&out, MAX).unwrap();
            assert_eq!(req.compressor(), Some(c));
            assert_eq!(
                classify(req.body().unwrap()).unwrap().read_concern.level,
                Some("available")
            );
        }
    }
}

#[test]
fn a_request_opened_once_rewrites_the_same_every_time() {
    let msg = compressed(&op_msg(3, 0, 0, &find_body()), compressed::ZSTD);
    let req = open(&msg, MAX).unwrap();
    let a = rewrite(&req, &AVAILABLE, MAX).unwrap();
    let b = rewrite(&req, &AVAILABLE, MAX).unwrap();
    assert_eq!(a, b);
    assert_eq!(a, open_and_rewrite(&msg, &AVAILABLE, MAX).unwrap());
}

#[test]
fn rewrite_message_limits_and_refusals() {
    let msg = op_msg(5, 0, 0, &find_body());
    // The result would exceed the limit.
    assert!(matches!(
        open_and_rewrite(&msg, &AVAILABLE, msg.len()),
        Err(WireError::BadLength { .. })
    ));
    // `readConcern: {level: "available"}` is 39 bytes: type, "readConcern\0", a 26-byte document.
    assert!(open_and_rewrite(&msg, &AVAILABLE, msg.len() + 39).is_ok());
    assert!(open_and_rewrite(&msg, &AVAILABLE, msg.len() + 38).is_err());
    // Not an OP_MSG (a legacy OP_INSERT, relayed as is).
    let mut q = msg.to_vec();
    q[12..16].copy_from_slice(&2002i32.to_le_bytes());
    assert_eq!(
        open_and_rewrite(&q, &AVAILABLE, MAX),
        Err(WireError::BadInnerOpcode(2002))
    );
    // A corrupted checksum is not laundered into a valid one.
    let mut bad = op_msg(5, 0, CHECKSUM_PRESENT, &find_body()).to_vec();
    let n = bad.len();
    bad[n - 1] ^= 1;
    assert!(matches!(
        open_and_rewrite(&bad, &AVAILABLE, MAX),
        Err(WireError::ChecksumMismatch { .. })
    ));
}

// ---------------------------------------------------------------------------------------
// Replies

fn status(ok: bool, code: Option<i32>, name: Option<&str>) -> ReplyStatus {
    ReplyStatus {
        ok,
        code,
        code_name: name.map(str::to_owned),
    }
}

#[test]
fn inspect_ok_and_errors() {
    let cases: Vec<(RawDocumentBuf, ReplyStatus)> = vec![
        (rawdoc! { "ok": 1.0 }, status(true, None, None)),
        (rawdoc! { "n": 1, "ok": 1 }, status(true, None, None)),
        (rawdoc! { "ok": 1_i64 }, status(true, None, None)),
        (rawdoc! { "ok": true }, status(true, None, None)),
        (rawdoc! { "ok": false }, status(false, None, None)),
        (rawdoc! { "ok": 0 }, status(false, None, None)),
        (rawdoc! { "x": 1 }, status(false, None, None)),
        (
            rawdoc! {
                "ok": 0.0,
                "errmsg": "version mismatch",
                "code": 13388,
                "codeName": "StaleConfig",
                "$clusterTime": { "clusterTime": ts() },
            },
            status(false, Some(13388), Some("StaleConfig")),
        ),
        (
            rawdoc! { "code": 50_i64, "codeName": "MaxTimeMSExpired", "ok": 0 },
            status(false, Some(50), Some("MaxTimeMSExpired")),
        ),
        (
            rawdoc! { "ok": 0.0, "code": 262.0 },
            status(false, Some(262), None),
        ),
    ];
    for (body, want) in cases {
        let msg = op_msg(1, 9, 0, &body);
        assert_eq!(inspect_reply(&msg, MAX).unwrap(), want, "{body:?}");
        let msg = op_msg(1, 9, CHECKSUM_PRESENT, &body);
        assert_eq!(
            inspect_reply(&msg, MAX).unwrap(),
            want,
            "{body:?} with checksum"
        );
        let legacy = op_reply(1, 9, &body);
        assert_eq!(
            inspect_reply(&legacy, MAX).unwrap(),
            want,
            "{body:?} as OP_REPLY"
        );
    }
    let err = error_reply(1, 2, 13388, "StaleConfig", "staleguard: x");
    assert_eq!(
        inspect_reply(&err, MAX).unwrap(),
        status(false, Some(13388), Some("StaleConfig"))
    );
}

#[test]
fn inspect_compressed_replies() {
    let body = rawdoc! { "ok": 0.0, "errmsg": "stale", "code": 13388, "codeName": "StaleConfig" };
    for c in [
        compressed::NOOP,
        compressed::SNAPPY,
        compressed::ZLIB,
        compressed::ZSTD,
    ] {
        let msg = compressed(&op_msg(1, 9, 0, &body), c);
        assert_eq!(
            inspect_reply(&msg, MAX).unwrap(),
            status(false, Some(13388), Some("StaleConfig")),
            "compressor {c}"
        );
        let legacy = compressed(&op_reply(1, 9, &rawdoc! { "ok": 1 }), c);
        assert_eq!(
            inspect_reply(&legacy, MAX).unwrap(),
            status(true, None, None)
        );
    }
}

fn big_cursor_reply() -> RawDocumentBuf {
    let mut batch = bson::RawArrayBuf::new();
    let filler = "x".repeat(1000);
    for i in 0..1000 {
        batch.push(rawdoc! { "_id": i, "sku": format!("sku-{i}"), "pad": filler.clone() });
    }
    rawdoc! {
        "cursor": { "firstBatch": batch, "id": 0_i64, "ns": "demo.store_inventory" },
        "ok": 1.0,
        "$clusterTime": { "clusterTime": ts() },
        "operationTime": ts(),
    }
}

#[test]
fn inspect_large_cursor_reply_skips_the_batch() {
    let body = big_cursor_reply();
    assert!(body.as_bytes().len() > 1_000_000);
    let msg = op_msg(1, 9, 0, &body);
    assert_eq!(inspect_reply(&msg, MAX).unwrap(), status(true, None, None));

    // Corrupt a type byte deep inside the batch: still fine, so the batch is skipped by its
    // length rather than walked.
    let mut bytes = msg.to_vec();
    let pos = bytes.windows(4).position(|w| w == b"pad\0").unwrap() - 1;
    assert_eq!(bytes[pos], 0x02);
    bytes[pos] = 0x42;
    assert_eq!(
        inspect_reply(&bytes, MAX).unwrap(),
        status(true, None, None)
    );

    // Too large for the limit.
    assert!(matches!(
        inspect_reply(&msg, 1_000_000),
        Err(WireError::BadLength { .. })
    ));
}

#[test]
fn inspect_malformed_replies() {
    let msg = op_msg(1, 9, 0, &rawdoc! { "ok": 1.0, "code": 1 });
    let mut bad = msg.to_vec();
    bad[21 + 4] = 0x42; // type byte of "ok"
    assert_eq!(
        inspect_reply(&bad, MAX),
        Err(WireError::BadBson("reply body"))
    );
    assert!(inspect_reply(&msg[..20], MAX).is_err());
    let mut other = msg.to_vec();
    other[12..16].copy_from_slice(&2004i32.to_le_bytes());
    assert!(inspect_reply(&other, MAX).is_err());
}

// ---------------------------------------------------------------------------------------
// Timing (release): cargo test --release --test it rewrite:: -- --ignored --nocapture

/// A ~300-byte find as a driver sends it.
fn driver_find() -> RawDocumentBuf {
    rawdoc! {
        "find": "store_inventory",
        "filter": { "sku": "abc-123", "qty": { "$gt": 5 } },
        "limit": 20,
        "batchSize": 20,
        "maxTimeMS": 5000,
        "lsid": { "id": Binary { subtype: BinarySubtype::Uuid, bytes: vec![7; 16] } },
        "$clusterTime": {
            "clusterTime": ts(),
            "signature": { "hash": Binary { subtype: BinarySubtype::Generic, bytes: vec![0; 20] }, "keyId": 7_i64 },
        },
        "$db": "demo",
        "$readPreference": { "mode": "secondaryPreferred", "tags": [ { "dc": "a1" } ] },
    }
}

#[test]
#[ignore]
fn timing_classify_and_rewrite() {
    use std::hint::black_box;
    use std::time::Instant;
    let body = driver_find();
    let msg = op_msg(1, 0, 0, &body);
    let crc_msg = op_msg(1, 0, CHECKSUM_PRESENT, &body);
    let spec = RewriteSpec {
        available: true,
        drop_after_cluster_time: true,
        max_time_ms: Some(1200),
        primary: false,
    };
    // The best of 40 batches: other processes on the machine only ever add time.
    let n: u32 = std::env::var("TIMING_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(25_000);
    let time = |name: &str, f: &dyn Fn()| {
        let mut best = f64::MAX;
        for _ in 0..40 {
            let t = Instant::now();
            for _ in 0..n {
                f();
            }
            best = best.min(t.elapsed().as_nanos() as f64 / n as f64);
        }
        println!("{name}: {best:.0} ns");
    };
    println!(
        "body {} bytes, message {} bytes",
        body.as_bytes().len(),
        msg.len()
    );
    time("classify(body)", &|| {
        black_box(classify(black_box(&body)).unwrap());
    });
    time("Request::open + classify", &|| {
        let req = open(black_box(&msg), MAX).unwrap();
        black_box(classify(req.body().unwrap()).unwrap().read_pref);
    });
    time("rewrite_body", &|| {
        black_box(rewrite_body(black_box(&body), &spec).unwrap());
    });
    time("open + rewrite", &|| {
        black_box(open_and_rewrite(black_box(&msg), &spec, MAX).unwrap());
    });
    time("open + rewrite with crc", &|| {
        black_box(open_and_rewrite(black_box(&crc_msg), &spec, MAX).unwrap());
    });
    let reply = op_msg(1, 0, 0, &big_cursor_reply());
    let m = n / 2;
    let t = Instant::now();
    for _ in 0..m {
        black_box(inspect_reply(black_box(&reply), MAX).unwrap());
    }
    println!(
        "inspect_reply (1 MB cursor): {:.0} ns",
        t.elapsed().as_nanos() as f64 / m as f64
    );
}

const PRIMARY: RewriteSpec = RewriteSpec {
    available: false,
    drop_after_cluster_time: false,
    max_time_ms: None,
    primary: true,
};

#[test]
fn primary_rung_replaces_only_the_read_preference() {
    let body = rawdoc! {
        "find": "transactions",
        "filter": { "_id": 7 },
        "readConcern": { "level": "majority", "afterClusterTime": ts() },
        "$readPreference": {
            "mode": "secondary",
            "tags": [ { "node": "a1" }, {} ],
            "maxStalenessSeconds": 120,
            "hedge": { "enabled": true },
        },
        "maxTimeMS": 800,
        "$db": "pay",
    };
    let out = valid(rewrite_body(&body, &PRIMARY).unwrap());
    // Same keys in the same places; every element but $readPreference byte for byte.
    assert_eq!(keys(&out), keys(&body));
    untouched_identical(&body, &out, &["$readPreference"]);
    let rp = out.get_document("$readPreference").unwrap();
    assert_eq!(keys(rp), ["mode"]);
    assert_eq!(rp.get_str("mode").unwrap(), "primary");
    // Read concern untouched (never `available`), afterClusterTime kept.
    let rc = out.get_document("readConcern").unwrap();
    assert_eq!(rc.get_str("level").unwrap(), "majority");
    assert!(rc.get_timestamp("afterClusterTime").is_ok());
}

#[test]
fn primary_rung_with_max_time_and_no_read_preference() {
    // Both edits, in either order of the elements in the body.
    let before = rawdoc! {"find": "t", "maxTimeMS": 1000_i64, "$db": "pay", "$readPreference": {"mode": "nearest"}};
    let after = rawdoc! {"find": "t", "$readPreference": {"mode": "nearest"}, "$db": "pay", "maxTimeMS": 1000};
    let spec = RewriteSpec {
        max_time_ms: Some(400),
        ..PRIMARY
    };
    for body in [&before, &after] {
        let out = valid(rewrite_body(body, &spec).unwrap());
        assert_eq!(keys(&out), keys(body));
        untouched_identical(body, &out, &["$readPreference", "maxTimeMS"]);
        assert_eq!(
            out.get_document("$readPreference")
                .unwrap()
                .get_str("mode")
                .unwrap(),
            "primary"
        );
        assert_eq!(
            max_time(&out)
                .as_i64()
                .or(max_time(&out).as_i32().map(i64::from)),
            Some(400)
        );
    }
    // No $readPreference: the read already goes to the primary; nothing is added.
    let plain = rawdoc! {"find": "t", "$db": "pay"};
    let out = rewrite_body(&plain, &PRIMARY).unwrap();
    assert_eq!(out, plain.as_bytes());
}

#[test]
fn primary_rung_whole_message_with_checksum_and_compression() {
    let body = find_body();
    let msg = op_msg(9, 0, CHECKSUM_PRESENT, &body);
    let out = open_and_rewrite(&msg, &PRIMARY, MAX).unwrap();
    verify_checksum(&out).unwrap();
    let m = OpMsg::parse(&out[16..]).unwrap();
    untouched_identical(&body, m.body, &["$readPreference"]);
    let h = Header::parse(&out).unwrap();
    assert_eq!((h.length as usize, h.request_id), (out.len(), 9));
    for compressor in [1u8, 2, 3] {
        let c = compressed(&op_msg(9, 0, 0, &body), compressor);
        let out = open_and_rewrite(&c, &PRIMARY, MAX).unwrap();
        let rb = open(&out, MAX).unwrap();
        assert_eq!(rb.compressor(), Some(compressor), "still compressed");
        let doc = rb.body().unwrap();
        untouched_identical(&body, doc, &["$readPreference"]);
        assert_eq!(
            doc.get_document("$readPreference")
                .unwrap()
                .get_str("mode")
                .unwrap(),
            "primary"
        );
    }
}

/// A session rewrites into one buffer: once the last rewritten message is dropped (sent),
/// the next rewrite reuses its allocation, so a governed read's `maxTimeMS` costs no malloc.
/// Each output is still exactly what `rewrite` makes.
#[test]
fn rewrites_into_one_buffer_reuse_its_allocation() {
    use bytes::BytesMut;
    use staleguard::rewrite::rewrite_into;
    let spec = RewriteSpec {
        max_time_ms: Some(500),
        ..RewriteSpec::default()
    };
    let body = rawdoc! {"find": "inv", "filter": {}, "maxTimeMS": 2000_i32, "$db": "demo"};
    let msg = op_msg(7, 0, 0, &body);
    let req =
        Request::new(Bytes::copy_from_slice(&msg), DEFAULT_MAX_MESSAGE_SIZE).expect("request");
    let want = open_and_rewrite(&msg, &spec, DEFAULT_MAX_MESSAGE_SIZE).expect("rewrites");
    let mut buf = BytesMut::new();
    let first =
        rewrite_into(&req, &spec, None, DEFAULT_MAX_MESSAGE_SIZE, &mut buf).expect("rewrites");
    assert_eq!(first, want);
    let at = first.as_ptr();
    // Still held (not sent yet): the next one needs memory of its own.
    let second =
        rewrite_into(&req, &spec, None, DEFAULT_MAX_MESSAGE_SIZE, &mut buf).expect("rewrites");
    assert_eq!(second, want);
    assert_ne!(second.as_ptr(), at);
    drop(first);
    drop(second);
    let again =
        rewrite_into(&req, &spec, None, DEFAULT_MAX_MESSAGE_SIZE, &mut buf).expect("rewrites");
    assert_eq!(again, want);
    let at = again.as_ptr();
    drop(again);
    let reused =
        rewrite_into(&req, &spec, None, DEFAULT_MAX_MESSAGE_SIZE, &mut buf).expect("rewrites");
    assert_eq!(reused, want);
    assert_eq!(
        reused.as_ptr(),
        at,
        "the dropped message's allocation is taken back"
    );
}

/// The session's reused rewrite buffer keeps a small message's room at most: a large rewritten
/// request takes its allocation with it (issue 21: nothing a connection carried once stays).
#[test]
fn a_large_rewrite_does_not_stay_in_the_reused_buffer() {
    use staleguard::rewrite::rewrite_into;
    use staleguard::wire::Request;
    let pad = Binary {
        subtype: BinarySubtype::Generic,
        bytes: vec![3; 1_000_000],
    };
    let small = op_msg(1, 0, 0, &find_body());
    let body = rawdoc! {"find": "c", "filter": {"pad": pad}, "$db": "d"};
    let large = op_msg(2, 0, 0, &body);
    let mut buf = bytes::BytesMut::new();
    let open = |m: &[u8]| {
        Request::new(bytes::Bytes::copy_from_slice(m), DEFAULT_MAX_MESSAGE_SIZE).unwrap()
    };
    let out = rewrite_into(
        &open(&large),
        &AVAILABLE,
        None,
        DEFAULT_MAX_MESSAGE_SIZE,
        &mut buf,
    )
    .unwrap();
    assert!(out.len() > 1_000_000);
    drop(out);
    assert!(buf.capacity() < 16 * 1024, "kept {}", buf.capacity());
    // A small one is written in the reused buffer, whose room comes back once it is sent.
    let out = rewrite_into(
        &open(&small),
        &AVAILABLE,
        None,
        DEFAULT_MAX_MESSAGE_SIZE,
        &mut buf,
    )
    .unwrap();
    drop(out);
    let out = rewrite_into(
        &open(&small),
        &AVAILABLE,
        None,
        DEFAULT_MAX_MESSAGE_SIZE,
        &mut buf,
    )
    .unwrap();
    assert!(buf.capacity() < 16 * 1024);
    assert!(!out.is_empty());
}

/// What the relay does for a governed read: the rewrite reads its fields where
/// classification found them (`CommandInfo::places`) instead of scanning the body; the bytes
/// are those of the scan, with every field present or absent, repeated, or first; a place
/// that does not hold its field makes the rewrite scan.
#[test]
fn rewrite_at_classified_places_writes_the_scanned_bytes() {
    let bodies = [
        rawdoc! { "find": "c", "filter": {}, "$db": "d" },
        rawdoc! {
            "find": "c", "maxTimeMS": 5, "readConcern": { "level": "local" },
            "$readPreference": { "mode": "secondary" }, "$db": "d",
        },
        rawdoc! {
            "find": "c", "$readPreference": { "mode": "nearest", "tags": [{ "a": "b" }] },
            "readConcern": { "level": "local", "afterClusterTime": ts() },
            "maxTimeMS": 5.0, "readConcern": { "level": "majority" }, "maxTimeMS": 7_i64,
            "$readPreference": { "mode": "secondary" }, "$db": "d",
        },
        rawdoc! { "maxTimeMS": 5, "find": "c", "maxTimeMS": 6, "$db": "d" },
        rawdoc! { "$readPreference": { "mode": "secondary" }, "find": "c", "$db": "d" },
        rawdoc! { "explain": { "find": "c", "maxTimeMS": 3 }, "maxTimeMS": 4, "$db": "d" },
        rawdoc! { "aggregate": "c", "pipeline": [], "cursor": {}, "$db": "d" },
    ];
    let specs = [
        AVAILABLE,
        BOTH,
        PRIMARY,
        RewriteSpec {
            max_time_ms: Some(250),
            primary: true,
            ..AVAILABLE
        },
        RewriteSpec {
            max_time_ms: Some(250),
            ..RewriteSpec::default()
        },
    ];
    let mut placed_bodies = 0;
    for body in &bodies {
        let req = open(&op_msg(9, 0, 0, body), MAX).unwrap();
        let info = classify(body).unwrap();
        // A command key that is one of the fields leaves the places unknown.
        let first = body.iter().next().unwrap().unwrap().0;
        let field_first = ["maxTimeMS", "readConcern", "$readPreference"].contains(&first.as_str());
        assert_eq!(info.places.is_none(), field_first, "{body:?}");
        placed_bodies += usize::from(info.places.is_some());
        for spec in &specs {
            let scanned = rewrite(&req, spec, MAX).unwrap();
            let mut buf = bytes::BytesMut::new();
            let at = info.places.as_ref();
            let placed = rewrite_into(&req, spec, at, MAX, &mut buf).unwrap();
            assert_eq!(placed, scanned, "{body:?} {spec:?}");
            let Some(p) = info.places else { continue };
            let off = |o: Option<usize>| o.map(|o| o + 1);
            let wrong = Places {
                read_concern: off(p.read_concern),
                max_time: off(p.max_time),
                read_pref: off(p.read_pref),
            };
            let fallback = rewrite_into(&req, spec, Some(&wrong), MAX, &mut buf).unwrap();
            assert_eq!(fallback, scanned, "{body:?} {spec:?}");
        }
    }
    assert_eq!(placed_bodies, 5);
}
