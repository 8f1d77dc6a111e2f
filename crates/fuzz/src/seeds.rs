//! Seed inputs for the fuzz targets, made from the messages real drivers and mongos send
//! (the benchmarks' builders in `benches/common/msgs.rs`) and from the attacks of issue 11.
//! Each target's input layout is the one its property in `props.rs` reads.

use bson::raw::{RawDocument, RawDocumentBuf};
use bson::rawdoc;
use staleguard::wire::compressed::{SNAPPY, ZLIB, ZSTD};
use staleguard::wire::{reply, Header, OpCode, HEADER_LEN};

use crate::msgs;
use crate::props;

/// The four targets, by the name of their fuzz binary.
pub const TARGETS: [&str; 4] = ["frames", "classify", "rewrite", "reply"];

/// Command bodies: the driver's, and the duplicated-field and nesting attacks.
pub fn bodies() -> Vec<RawDocumentBuf> {
    let mut deep = rawdoc! { "$match": {} };
    for _ in 0..40 {
        deep = rawdoc! { "$lookup": { "from": "transactions", "as": "x", "pipeline": [deep] } };
    }
    vec![
        msgs::find_body(msgs::FALLBACK_DB, msgs::FALLBACK_COLL),
        msgs::find_body("pay", "transactions"),
        msgs::aggregate_body(),
        msgs::insert_body(),
        msgs::hello_request(),
        rawdoc! { "count": "transactions", "query": {}, "readConcern": { "level": "majority",
        "afterClusterTime": bson::Timestamp { time: 9, increment: 1 } }, "maxTimeMS": 500_i32,
        "$db": "pay", "$readPreference": { "mode": "secondary" } },
        rawdoc! { "distinct": "store_inventory", "key": "sku", "maxTimeMS": 1_i64,
        "$db": "demo", "$readPreference": { "mode": "nearest", "tags": [{ "node": "a1" }] } },
        rawdoc! { "explain": { "find": "transactions", "filter": {} }, "verbosity": "queryPlanner",
        "$db": "pay" },
        rawdoc! { "find": "transactions", "readConcern": { "level": "available" },
        "readConcern": { "level": "local" }, "$db": "pay",
        "$readPreference": { "mode": "secondary" } },
        rawdoc! { "find": "transactions", "$db": "pay", "$db": "demo",
        "$readPreference": { "mode": "secondary" } },
        rawdoc! { "mapReduce": "transactions", "map": "function(){}", "reduce": "function(){}",
        "out": { "inline": 1 }, "readConcern": { "level": "available" }, "$db": "pay" },
        rawdoc! { "aggregate": "orders", "pipeline": [deep], "cursor": {}, "$db": "pay",
        "$readPreference": { "mode": "secondary" } },
        rawdoc! { "aggregate": 1_i32, "pipeline": [{ "$changeStream": {} }], "cursor": {},
        "$db": "admin" },
    ]
}

/// Replies: mongos's find reply, StaleConfig, hello, a larger cursor.
pub fn reply_bodies() -> Vec<RawDocumentBuf> {
    vec![
        msgs::find_reply_body(),
        msgs::stale_config_body(),
        msgs::hello_body(3),
        msgs::big_cursor_reply_body(4096),
        reply::error_body(50, "MaxTimeMSExpired", "operation exceeded time limit"),
    ]
}

/// A legacy OP_QUERY on `ns` (a `$cmd` command or the driver's handshake).
pub fn op_query(request_id: i32, ns: &str, query: &RawDocument) -> Vec<u8> {
    let q = query.as_bytes();
    let total = HEADER_LEN + 4 + ns.len() + 1 + 8 + q.len();
    let mut out = Vec::with_capacity(total);
    Header {
        length: total as i32,
        request_id,
        response_to: 0,
        op_code: OpCode::QUERY,
    }
    .put(&mut out);
    out.extend_from_slice(&0_i32.to_le_bytes());
    out.extend_from_slice(ns.as_bytes());
    out.push(0);
    out.extend_from_slice(&0_i32.to_le_bytes());
    out.extend_from_slice(&(-1_i32).to_le_bytes());
    out.extend_from_slice(q);
    out
}

/// Whole request messages: every body as OP_MSG (with and without checksum), compressed
/// three ways, a bulk insert with a document sequence, legacy OP_QUERY commands.
pub fn requests() -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for (i, b) in bodies().iter().enumerate() {
        let plain = msgs::op_msg(i as i32 + 1, b, false);
        out.push(msgs::op_msg(i as i32 + 100, b, true));
        for c in [ZSTD, ZLIB, SNAPPY] {
            out.push(props::compressed(&plain, c));
        }
        out.push(plain);
    }
    let docs: Vec<_> = (0..5).map(msgs::order_doc).collect();
    out.push(msgs::op_msg_with_sequence(
        7,
        &msgs::insert_body(),
        "documents",
        &docs,
    ));
    out.push(op_query(8, "admin.$cmd", &msgs::hello_request()));
    out.push(op_query(
        9,
        "pay.$cmd",
        &rawdoc! { "$query": { "find": "transactions", "readConcern": { "level": "available" } },
        "$readPreference": { "mode": "secondary" } },
    ));
    out
}

/// Whole reply messages: OP_MSG, OP_REPLY, compressed.
pub fn replies() -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for (i, b) in reply_bodies().iter().enumerate() {
        let m = reply::op_msg(i as i32, 4, 0, b).to_vec();
        out.push(props::compressed(&m, ZSTD));
        out.push(reply::op_reply(i as i32, 4, b).to_vec());
        out.push(m);
    }
    out
}

/// The seed inputs of `target`, laid out as its property reads them.
pub fn corpus(target: &str) -> Vec<Vec<u8>> {
    let with = |prefix: &[u8], rest: &[u8]| [prefix, rest].concat();
    match target {
        // Piece size, then a stream of messages (single, and a pipelined pair).
        "frames" => {
            let reqs = requests();
            let mut out: Vec<Vec<u8>> = reqs.iter().map(|m| with(&[255], m)).collect();
            out.extend(reqs.windows(2).map(|w| with(&[7], &w.concat())));
            out.extend(replies().iter().map(|m| with(&[30], m)));
            out
        }
        // 1: a raw body; 0: a generated command (from the following choices).
        "classify" => {
            let mut out: Vec<Vec<u8>> = bodies().iter().map(|b| with(&[1], b.as_bytes())).collect();
            out.extend((0u8..16).map(|i| vec![0, i, i.wrapping_mul(37), 3, 1, 1, 0, 2, 9]));
            out
        }
        // Spec (available, drop afterClusterTime, maxTimeMS = u32 1000), raw body flag,
        // envelope (checksum, sequence, compressor), body; and generated bodies.
        "rewrite" => {
            let spec = [1u8, 1, 4, 0xe8, 0x03, 0, 0];
            let mut out = Vec::new();
            for (i, b) in bodies().iter().enumerate() {
                let envelope = [1u8, (i as u8 * 5) % 32];
                out.push([&spec[..], &envelope, b.as_bytes()].concat());
            }
            out.extend((0u8..16).map(|i| vec![1, i, 2, 0, i, 7, 3, 1, 1, 2, 0, 5]));
            out
        }
        // 1: a raw message; 0: a generated reply.
        "reply" => {
            let mut out: Vec<Vec<u8>> = replies().iter().map(|m| with(&[1], m)).collect();
            out.extend((0u8..16).map(|i| vec![0, i, 1, 2, 3, 4, i, 2, 1, 5]));
            out
        }
        other => panic!("unknown fuzz target {other}"),
    }
}
