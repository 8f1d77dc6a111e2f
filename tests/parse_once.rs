//! A governed read is opened once: one header read per message the session relays, and at
//! most one decompression per request, on the retry path too (the resend is rewritten from
//! the request opened on arrival). A compressed request is first peeked at (its command name
//! from a few hundred decompressed bytes); that counts as its one decompression, and opening
//! it whole goes on from there, with snappy, zlib and zstd alike. A legacy OP_QUERY is read
//! once too, compressed or not.
//!
//! The wire crate counts header reads and decompressions per thread (feature
//! `parse-counters`, on for tests). The session runs here on the test's own current-thread
//! runtime, between in-memory pipes, and the test plays client and mongos with raw bytes
//! (no wire parsing of its own while counting), so the counts are the session's alone.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bson::{rawdoc, RawDocument};
use bytes::Bytes;
use staleguard::config::Config;
use staleguard::handles::Handles;
use staleguard::policy::{Mode, NsPolicy, PolicyTable};
use staleguard::session::Session;
use staleguard::wire::counters::{counts, Counts};
use staleguard::wire::{compressed, reply, OpCode, Request, HEADER_LEN};
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};
use tokio_util::sync::CancellationToken;

const MAX: usize = 48_000_000;

fn config(cap: Option<Duration>) -> Config {
    let mut cfg = Config::for_upstreams("127.0.0.1:0", vec!["127.0.0.1:1".to_string()]);
    let mut inv = NsPolicy::with_defaults("demo.inventory", Mode::Fallback);
    inv.max_time = cap;
    // The whole budget on the first attempt (`PASS_BUDGET` in the policy tests): an uncapped
    // read then leaves as it arrived, which is what the counts below are about.
    inv.attempt_share = 1.0;
    inv.attempt_limit = None;
    cfg.policy = PolicyTable::from_policies(vec![inv]).expect("valid table");
    cfg
}

fn find(request_id: i32) -> Vec<u8> {
    let body = rawdoc! {
        "find": "inventory", "filter": {}, "maxTimeMS": 60_000,
        "$db": "demo", "$readPreference": {"mode": "secondaryPreferred"},
    };
    op_msg(request_id, 0, &body)
}

fn op_msg(request_id: i32, response_to: i32, body: &RawDocument) -> Vec<u8> {
    let len = (HEADER_LEN + 5 + body.as_bytes().len()) as i32;
    let mut out = Vec::new();
    for v in [len, request_id, response_to, OpCode::MSG, 0] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    out.push(0);
    out.extend_from_slice(body.as_bytes());
    out
}

/// The compressors a driver may use.
const COMPRESSORS: [u8; 3] = [compressed::SNAPPY, compressed::ZLIB, compressed::ZSTD];

/// `msg` wrapped in OP_COMPRESSED with `compressor`, built by hand: no header read.
fn wrap(msg: &[u8], compressor: u8) -> Vec<u8> {
    let data = compressed::compress(compressor, &msg[HEADER_LEN..]).expect("compresses");
    let len = (HEADER_LEN + 9 + data.len()) as i32;
    let mut out = Vec::new();
    for v in [len, i32_at(msg, 4), 0, OpCode::COMPRESSED, i32_at(msg, 12)] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    out.extend_from_slice(&((msg.len() - HEADER_LEN) as i32).to_le_bytes());
    out.push(compressor);
    out.extend_from_slice(&data);
    out
}

/// An OP_QUERY running `doc` on `ns`, built by hand.
fn op_query(request_id: i32, ns: &str, doc: &RawDocument) -> Vec<u8> {
    let mut payload = 0i32.to_le_bytes().to_vec();
    payload.extend_from_slice(ns.as_bytes());
    payload.push(0);
    payload.extend_from_slice(&0i32.to_le_bytes());
    payload.extend_from_slice(&(-1i32).to_le_bytes());
    payload.extend_from_slice(doc.as_bytes());
    let mut out = Vec::new();
    let len = (HEADER_LEN + payload.len()) as i32;
    for v in [len, request_id, 0, OpCode::QUERY] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    out.extend_from_slice(&payload);
    out
}

fn i32_at(b: &[u8], at: usize) -> i32 {
    i32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

/// One whole message off a pipe, by its length prefix alone.
async fn read_frame(r: &mut DuplexStream) -> Vec<u8> {
    let mut len = [0u8; 4];
    tokio::time::timeout(Duration::from_secs(10), r.read_exact(&mut len))
        .await
        .expect("a message within 10s")
        .expect("read");
    let mut frame = len.to_vec();
    frame.resize(i32::from_le_bytes(len) as usize, 0);
    r.read_exact(&mut frame[4..]).await.expect("read");
    frame
}

fn delta(before: Counts) -> Counts {
    let now = counts();
    Counts {
        header_parses: now.header_parses - before.header_parses,
        decompressions: now.decompressions - before.decompressions,
    }
}

/// What the session did for one retried find, step by step.
struct Steps {
    request: Counts,
    error_reply_and_resend: Counts,
    final_reply: Counts,
    /// What went upstream: the first attempt and the resend.
    sent: Vec<u8>,
    resent: Vec<u8>,
}

/// A session's stop and its task.
struct Running {
    stop: CancellationToken,
    relay: tokio::task::JoinHandle<()>,
}

/// A session between in-memory pipes: the client's end, mongos's end, and the session.
fn piped(cap: Option<Duration>) -> (DuplexStream, DuplexStream, Running) {
    let shared = Arc::new(Handles::new(Arc::new(config(cap))));
    let peer: SocketAddr = "127.0.0.1:9".parse().expect("addr");
    let stop = CancellationToken::new();
    let session = Session::new(
        shared.sessions.clone(),
        peer,
        1,
        stop.clone(),
        CancellationToken::new(),
    );
    let (client, proxy_client) = tokio::io::duplex(1 << 20);
    let (proxy_up, mongos) = tokio::io::duplex(1 << 20);
    let (cr, cw) = tokio::io::split(proxy_client);
    let (ur, uw) = tokio::io::split(proxy_up);
    let relay = tokio::spawn(session.pump(cr, cw, ur, uw));
    (client, mongos, Running { stop, relay })
}

impl Running {
    async fn stop(self) {
        self.stop.cancel();
        tokio::time::timeout(Duration::from_secs(5), self.relay)
            .await
            .expect("the session stops")
            .expect("session task");
    }
}

/// One governed find through a session: mongos answers StaleConfig, the session resends it
/// with `available`, mongos answers ok, the client gets that answer. `compressor`: the
/// request comes wrapped in OP_COMPRESSED.
async fn retried_find(compressor: Option<u8>, cap: Option<Duration>) -> Steps {
    let (mut client, mut mongos, session) = piped(cap);

    let plain = find(41);
    let request = match compressor {
        Some(c) => wrap(&plain, c),
        None => plain,
    };
    let stale = op_msg(
        900,
        41,
        &rawdoc! {"ok": 0.0, "code": 13388, "codeName": "StaleConfig", "errmsg": "stale"},
    );
    let ok = op_msg(
        901,
        41,
        &rawdoc! {"ok": 1.0, "cursor": {"id": 0_i64, "ns": "demo.inventory", "firstBatch": []}},
    );

    let start = counts();
    client.write_all(&request).await.expect("client writes");
    let sent = read_frame(&mut mongos).await;
    let request_counts = delta(start);

    let start = counts();
    mongos.write_all(&stale).await.expect("mongos writes");
    let resent = read_frame(&mut mongos).await;
    let error_reply_and_resend = delta(start);

    let start = counts();
    mongos.write_all(&ok).await.expect("mongos writes");
    let answer = read_frame(&mut client).await;
    let final_reply = delta(start);
    assert_eq!(
        answer, ok,
        "the resend's answer reaches the client as it came"
    );

    session.stop().await;
    Steps {
        request: request_counts,
        error_reply_and_resend,
        final_reply,
        sent,
        resent,
    }
}

fn read_concern_level(msg: &[u8]) -> Option<String> {
    let mut req = Request::new(Bytes::copy_from_slice(msg), MAX).expect("valid request");
    req.inflate(MAX).expect("inflates");
    let body = req.body().expect("a body");
    let level = body
        .get_document("readConcern")
        .ok()?
        .get_str("level")
        .ok()?;
    Some(level.to_string())
}

fn max_time_ms(msg: &[u8]) -> Option<i64> {
    let mut req = Request::new(Bytes::copy_from_slice(msg), MAX).expect("valid request");
    req.inflate(MAX).expect("inflates");
    let body = req.body().expect("a body");
    body.get_i32("maxTimeMS")
        .map(i64::from)
        .or_else(|_| body.get_i64("maxTimeMS"))
        .ok()
}

#[tokio::test]
async fn a_retried_find_is_opened_once() {
    let compressors = std::iter::once(None).chain(COMPRESSORS.map(Some));
    for compressor in compressors {
        for cap in [None, Some(Duration::from_secs(10))] {
            let what = format!("compressor: {compressor:?}, cap: {cap:?}");
            let s = retried_find(compressor, cap).await;
            // The request: one header read; decompressed once when it came compressed (the
            // peek at its command name included: opening it whole goes on from there).
            assert_eq!(
                s.request,
                Counts {
                    header_parses: 1,
                    decompressions: u64::from(compressor.is_some()),
                },
                "request ({what})"
            );
            // The error reply: its header read once; the resend is rewritten from the
            // request opened on arrival, with no header read and no decompression.
            assert_eq!(
                s.error_reply_and_resend,
                Counts {
                    header_parses: 1,
                    decompressions: 0,
                },
                "error reply and resend ({what})"
            );
            assert_eq!(
                s.final_reply,
                Counts {
                    header_parses: 1,
                    decompressions: 0,
                },
                "final reply ({what})"
            );
            // And it is the retry path: the first attempt as asked (capped when configured),
            // the resend with `available`.
            assert_eq!(read_concern_level(&s.sent), None, "{what}");
            assert_eq!(
                read_concern_level(&s.resent).as_deref(),
                Some("available"),
                "{what}"
            );
            let first_max_time = max_time_ms(&s.sent);
            match cap {
                None => assert_eq!(first_max_time, Some(60_000), "{what}"),
                Some(_) => assert_eq!(first_max_time, Some(10_000), "{what}"),
            }
            // The resend spends what the first attempt left of the whole budget.
            let budget = first_max_time.expect("a budget");
            let resent_max_time = max_time_ms(&s.resent).expect("the resend has a time limit");
            assert!(
                (1..=budget).contains(&resent_max_time),
                "resend maxTimeMS {resent_max_time} within the budget {budget} ({what})"
            );
            if cap.is_none() {
                let unchanged = match compressor {
                    Some(c) => wrap(&find(41), c),
                    None => find(41),
                };
                assert_eq!(s.sent, unchanged, "forwarded as it arrived ({what})");
            }
        }
    }
}

/// A legacy OP_QUERY on a governed database is refused with an OP_REPLY: read once (one header
/// read, and one decompression when it came compressed), judged from what was read, and
/// never forwarded.
#[tokio::test]
async fn a_refused_op_query_is_read_once() {
    let query = op_query(
        51,
        "demo.$cmd",
        &rawdoc! {"find": "inventory", "filter": {}},
    );
    for compressor in std::iter::once(None).chain(COMPRESSORS.map(Some)) {
        let (mut client, mut mongos, session) = piped(None);
        let request = match compressor {
            Some(c) => wrap(&query, c),
            None => query.clone(),
        };
        let start = counts();
        client.write_all(&request).await.expect("client writes");
        let answer = read_frame(&mut client).await;
        assert_eq!(
            delta(start),
            Counts {
                header_parses: 1,
                decompressions: u64::from(compressor.is_some()),
            },
            "OP_QUERY, compressor {compressor:?}"
        );
        assert_eq!(i32_at(&answer, 8), 51, "the refusal answers the query");
        assert_eq!(i32_at(&answer, 12), OpCode::REPLY, "as an OP_REPLY");
        let mut nothing = [0u8; 1];
        let forwarded =
            tokio::time::timeout(Duration::from_millis(50), mongos.read(&mut nothing)).await;
        assert!(forwarded.is_err(), "nothing reached mongos");
        session.stop().await;
    }
}

#[test]
fn reply_builders_and_counters_are_independent() {
    // The test's own message building reads no header (else the counts above would be
    // the test's, not the session's).
    let before = counts();
    let _ = wrap(&find(1), compressed::ZSTD);
    let _ = op_query(1, "demo.$cmd", &rawdoc! {"find": "c"});
    let _ = reply::op_msg(1, 2, 0, &rawdoc! {"ok": 1.0});
    assert_eq!(delta(before), Counts::default());
}
