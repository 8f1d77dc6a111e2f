//! Realistic wire messages for the benchmarks, shaped as the Rust driver and mongos send them.
//!
//! Shared by `hot_path` (criterion) and `e2e` (the load harness) through `#[path]`; each
//! user takes what it needs, hence the `dead_code` allowance.

#![allow(dead_code)]

use bson::spec::BinarySubtype;
use bson::{rawdoc, Binary, DateTime, RawDocument, RawDocumentBuf, Timestamp};
use bytes::{BufMut, BytesMut};
use staleguard::wire::compressed::{compress, ZSTD};
use staleguard::wire::opmsg::CHECKSUM_PRESENT;
use staleguard::wire::{reply, Header, OpCode, HEADER_LEN};

/// The passthrough traffic of the e2e harness: a namespace no config entry names.
pub const PASS_DB: &str = "demo";
pub const PASS_COLL: &str = "products";
/// The fallback namespace of the e2e config (its breaker gets opened for the rewrite run).
pub const FALLBACK_DB: &str = "demo";
pub const FALLBACK_COLL: &str = "store_inventory";
/// A second fallback namespace of the e2e config that never fails: its breaker stays closed,
/// so every read on it is tracked (the governed-read run).
pub const GOVERNED_DB: &str = "demo";
pub const GOVERNED_COLL: &str = "store_ledger";

/// `readConcern.level: "available"` as a BSON string element, the way both the driver and
/// staleguard's rewrite encode it.
pub const LEVEL_AVAILABLE: &[u8] = b"\x02level\x00\x0a\x00\x00\x00available\x00";

fn lsid() -> RawDocumentBuf {
    rawdoc! {
        "id": Binary {
            subtype: BinarySubtype::Uuid,
            bytes: vec![0x5a, 0x1f, 0x93, 0x0c, 0x4e, 0x2b, 0x4d, 0x11, 0x9a, 0x6e, 0x0b, 0x73, 0x21, 0xc4, 0x8f, 0x02],
        },
    }
}

fn cluster_time() -> RawDocumentBuf {
    rawdoc! {
        "clusterTime": Timestamp { time: 1_764_400_000, increment: 7 },
        "signature": {
            "hash": Binary { subtype: BinarySubtype::Generic, bytes: vec![0x3c; 20] },
            "keyId": 7_312_345_678_901_234_567_i64,
        },
    }
}

/// A `find` as the Rust driver sends it to mongos with `secondaryPreferred` (about 300 bytes).
pub fn find_body(db: &str, coll: &str) -> RawDocumentBuf {
    rawdoc! {
        "find": coll,
        "filter": { "sku": "A-1042-BLU", "qty": { "$gt": 0_i32 }, "store": 1187_i32 },
        "limit": 10_i64,
        "$db": db,
        "lsid": lsid(),
        "$clusterTime": cluster_time(),
        "$readPreference": { "mode": "secondaryPreferred" },
    }
}

/// An `aggregate` whose `$lookup` has a sub-pipeline with another `$lookup`.
pub fn aggregate_body() -> RawDocumentBuf {
    rawdoc! {
        "aggregate": "orders",
        "pipeline": [
            { "$match": { "status": "shipped", "total": { "$gte": 100_i32 } } },
            { "$lookup": {
                "from": "store_inventory",
                "localField": "sku",
                "foreignField": "sku",
                "as": "stock",
                "pipeline": [
                    { "$match": { "qty": { "$gt": 0_i32 } } },
                    { "$lookup": {
                        "from": "warehouses",
                        "localField": "warehouse",
                        "foreignField": "_id",
                        "as": "wh",
                    } },
                    { "$project": { "qty": 1_i32, "wh.name": 1_i32 } },
                ],
            } },
            { "$unwind": "$stock" },
            { "$sort": { "placed": -1_i32 } },
            { "$limit": 50_i32 },
        ],
        "cursor": {},
        "$db": "demo",
        "lsid": lsid(),
        "$clusterTime": cluster_time(),
        "$readPreference": { "mode": "secondaryPreferred" },
    }
}

/// The kind-0 body of a bulk `insert` (its documents travel in a kind-1 sequence).
pub fn insert_body() -> RawDocumentBuf {
    rawdoc! {
        "insert": "orders",
        "ordered": true,
        "$db": "demo",
        "lsid": lsid(),
        "txnNumber": 42_i64,
        "$clusterTime": cluster_time(),
    }
}

/// One order document of about 130 bytes.
pub fn order_doc(i: i32) -> RawDocumentBuf {
    rawdoc! {
        "_id": bson::oid::ObjectId::from_bytes([7, 1, 2, 3, 4, 5, 6, 7, 8, 9, (i >> 8) as u8, i as u8]),
        "sku": format!("A-{:04}-RED", i),
        "qty": i % 17,
        "price": 19.99,
        "status": "placed",
        "placed": DateTime::from_millis(1_764_400_000_000 + i as i64),
        "tags": ["web", "promo"],
    }
}

/// An OP_MSG with one body section (checksum added when `crc`).
pub fn op_msg(request_id: i32, body: &RawDocument, crc: bool) -> Vec<u8> {
    let flags = if crc { CHECKSUM_PRESENT } else { 0 };
    reply::op_msg(request_id, 0, flags, body).to_vec()
}

/// An OP_MSG with a body section and one kind-1 document sequence.
pub fn op_msg_with_sequence(
    request_id: i32,
    body: &RawDocument,
    id: &str,
    docs: &[RawDocumentBuf],
) -> Vec<u8> {
    let docs_len: usize = docs.iter().map(|d| d.as_bytes().len()).sum();
    let seq_len = 4 + id.len() + 1 + docs_len;
    let total = HEADER_LEN + 4 + 1 + body.as_bytes().len() + 1 + seq_len;
    let mut out = BytesMut::with_capacity(total);
    Header {
        length: total as i32,
        request_id,
        response_to: 0,
        op_code: OpCode::MSG,
    }
    .put(&mut out);
    out.put_u32_le(0);
    out.put_u8(0);
    out.put_slice(body.as_bytes());
    out.put_u8(1);
    out.put_i32_le(seq_len as i32);
    out.put_slice(id.as_bytes());
    out.put_u8(0);
    for d in docs {
        out.put_slice(d.as_bytes());
    }
    debug_assert_eq!(out.len(), total);
    out.to_vec()
}

/// `msg` (an OP_MSG) wrapped in OP_COMPRESSED (zstd), as a peer with compression on sends it.
pub fn compressed(msg: &[u8]) -> Vec<u8> {
    let payload = &msg[HEADER_LEN..];
    let data = compress(ZSTD, payload).expect("zstd compresses");
    let total = HEADER_LEN + 9 + data.len();
    let mut out = BytesMut::with_capacity(total);
    Header {
        length: total as i32,
        request_id: i32::from_le_bytes([msg[4], msg[5], msg[6], msg[7]]),
        response_to: 0,
        op_code: OpCode::COMPRESSED,
    }
    .put(&mut out);
    out.put_i32_le(OpCode::MSG);
    out.put_i32_le(payload.len() as i32);
    out.put_u8(ZSTD);
    out.put_slice(&data);
    out.to_vec()
}

pub fn find_msg(crc: bool) -> Vec<u8> {
    op_msg(17, &find_body(FALLBACK_DB, FALLBACK_COLL), crc)
}

pub fn aggregate_msg() -> Vec<u8> {
    op_msg(18, &aggregate_body(), false)
}

pub fn insert_msg() -> Vec<u8> {
    let docs: Vec<_> = (0..100).map(order_doc).collect();
    op_msg_with_sequence(19, &insert_body(), "documents", &docs)
}

pub fn find_zstd_msg() -> Vec<u8> {
    compressed(&find_msg(false))
}

/// The reply mongos sends to a one-document `find` (about 200 bytes).
pub fn find_reply_body() -> RawDocumentBuf {
    rawdoc! {
        "cursor": {
            "firstBatch": [ {
                "_id": bson::oid::ObjectId::from_bytes([0x65, 0x1a, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]),
                "sku": "A-1042-BLU",
                "name": "Trail runner, blue, size 42",
                "qty": 12_i32,
                "store": 1187_i32,
                "updated": DateTime::from_millis(1_764_400_000_000),
            } ],
            "id": 0_i64,
            "ns": "demo.store_inventory",
        },
        "ok": 1.0,
    }
}

/// The body of the fake mongos's answer to a `find`: the one-document reply, or about
/// `bytes` bytes of documents when `bytes` is not 0 (the large-reply runs, `E2E_REPLY_BYTES`).
/// The fake mongos's `find` reply: `docs` small documents when not 0, else about `bytes`
/// bytes of 1 KiB documents when not 0, else the one-document reply.
pub fn find_reply_for(bytes: usize, docs: usize) -> RawDocumentBuf {
    if docs > 0 {
        small_docs_reply_body(docs)
    } else if bytes == 0 {
        find_reply_body()
    } else {
        big_cursor_reply_body(bytes)
    }
}

/// A `find` reply whose first batch holds `n` small documents (`{_id, qty}`, about 31 bytes
/// each with their array index), every `_id` distinct: what the orphan scan reads.
pub fn small_docs_reply_body(n: usize) -> RawDocumentBuf {
    let mut batch = bson::RawArrayBuf::new();
    for i in 0..n as i32 {
        batch.push(rawdoc! { "_id": i, "qty": 10_i32 });
    }
    rawdoc! {
        "cursor": { "firstBatch": batch, "id": 0_i64, "ns": "demo.store_inventory" },
        "ok": 1.0,
    }
}

/// StaleConfig as a shard reports it through mongos.
pub fn stale_config_body() -> RawDocumentBuf {
    rawdoc! {
        "ok": 0.0,
        "errmsg": "sharding status of collection demo.store_inventory is not currently available for description and needs to be recovered from the config server",
        "code": 13388_i32,
        "codeName": "StaleConfig",
        "$clusterTime": cluster_time(),
        "operationTime": Timestamp { time: 1_764_400_000, increment: 7 },
    }
}

/// A `find` reply whose first batch holds about `bytes` bytes of 1 KiB documents.
pub fn big_cursor_reply_body(bytes: usize) -> RawDocumentBuf {
    let filler = "x".repeat(960);
    let mut batch = bson::RawArrayBuf::new();
    let mut i = 0_i32;
    while (i as usize) * 1024 < bytes {
        batch.push(rawdoc! { "_id": i, "sku": format!("A-{i:06}"), "note": filler.as_str() });
        i += 1;
    }
    rawdoc! {
        "cursor": { "firstBatch": batch, "id": 8_123_456_789_i64, "ns": "demo.store_inventory" },
        "ok": 1.0,
        "$clusterTime": cluster_time(),
        "operationTime": Timestamp { time: 1_764_400_000, increment: 7 },
    }
}

/// What mongos answers to `hello` / `isMaster`: enough for the Rust driver and pymongo.
pub fn hello_body(connection_id: i32) -> RawDocumentBuf {
    rawdoc! {
        "ismaster": true,
        "isWritablePrimary": true,
        "helloOk": true,
        "msg": "isdbgrid",
        "maxBsonObjectSize": 16_777_216_i32,
        "maxMessageSizeBytes": 48_000_000_i32,
        "maxWriteBatchSize": 100_000_i32,
        "localTime": DateTime::from_millis(1_764_400_000_000),
        "logicalSessionTimeoutMinutes": 30_i32,
        "connectionId": connection_id,
        "minWireVersion": 0_i32,
        "maxWireVersion": 21_i32,
        "readOnly": false,
        "ok": 1.0,
    }
}

/// `{isMaster: 1, helloOk: true, $db: "admin"}`, the driver's opening message.
pub fn hello_request() -> RawDocumentBuf {
    rawdoc! { "isMaster": 1_i32, "helloOk": true, "$db": "admin" }
}

/// The first key of a BSON document, without decoding anything else.
pub fn first_key(doc: &[u8]) -> &[u8] {
    let rest = doc.get(5..).unwrap_or(&[]);
    let nul = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
    &rest[..nul]
}

/// Whether `hay` contains `needle` (small inputs; no dependency needed).
pub fn contains(hay: &[u8], needle: &[u8]) -> bool {
    let Some((&first, _)) = needle.split_first() else {
        return true;
    };
    let mut at = 0;
    while let Some(i) = hay[at..].iter().position(|&b| b == first) {
        let start = at + i;
        if hay[start..].starts_with(needle) {
            return true;
        }
        at = start + 1;
    }
    false
}
