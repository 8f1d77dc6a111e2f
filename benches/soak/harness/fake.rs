//! The misbehaving fake mongos, in process: answers finds by echoing the request's marker,
//! reads duplicated fields by their first occurrence (as mongod 4.x does) and counts what a
//! hardened proxy must never let through; StaleConfig bursts and slow replies on the faulty
//! namespaces; resets and garbage on the chaos namespaces. For issue 21's attackers: a
//! 16 MB batch on `demo.big`, `$unwind` aggregates repeating `_id` on `demo.unwind`, reads
//! with an invalid `maxTimeMS` compared byte for byte with what their client sent, and
//! StaleConfig on every read of the `forge` database not asking for `available`.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bson::{rawdoc, RawDocument, RawDocumentBuf};
use bytes::BytesMut;
use staleguard::wire::legacy::OpQuery;
use staleguard::wire::opmsg::{OpMsg, MORE_TO_COME};
use staleguard::wire::reply::{error_body, op_msg, op_reply};
use staleguard::wire::{Header, MessageCodec, OpCode, HEADER_LEN};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::codec::Decoder;

use super::abuse21::{bad_max_time_msg, BAD_MAX_TIME_PREFIX, DUP_PREFIX, FAKE_REFUSAL};
use super::msgs;
use super::ns;

/// What the fake saw; read by the report.
#[derive(Default)]
pub struct Seen {
    pub requests: AtomicU64,
    pub stale_sent: AtomicU64,
    pub slow_sent: AtomicU64,
    pub resets: AtomicU64,
    pub garbage_sent: AtomicU64,
    pub compressed_refused: AtomicU64,
    /// Reads on a strict namespace that reached us asking for `available` (first occurrence
    /// of `$db`, `readConcern`, `level`): the policy was bypassed.
    pub strict_available: AtomicU64,
    /// Verifying reads on a quiet fallback namespace that reached us with `available`: some
    /// client's abuse opened that breaker.
    pub quiet_rewritten: AtomicU64,
    /// `$unwind` aggregates answered (with a repeated `_id`) to an `available` read.
    pub unwind_available: AtomicU64,
    /// Control finds on `demo.unwind` answered with one repeated `_id` (one orphan each) to
    /// an `available` read.
    pub dup_available: AtomicU64,
    /// 16 MB batches sent on `demo.big`.
    pub big_replies: AtomicU64,
    /// Reads with an invalid `maxTimeMS` that reached us, and those of them that did not
    /// arrive byte for byte as their client sent them (rewritten, or the limit replaced).
    pub bad_max_time_seen: AtomicU64,
    pub bad_max_time_altered: AtomicU64,
}

pub struct Fake {
    pub addr: SocketAddr,
    pub seen: Arc<Seen>,
}

/// StaleConfig bursts: for `BURST` out of every `PERIOD`, finds on the faulty namespaces
/// without `available` get StaleConfig.
const PERIOD: Duration = Duration::from_secs(5);
const BURST: Duration = Duration::from_millis(1200);
/// One faulty read in `SLOW_EVERY` is answered after up to `SLOW_MAX`.
const SLOW_EVERY: u64 = 20;
const SLOW_MAX_MS: u64 = 150;

pub async fn start() -> std::io::Result<Fake> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let seen = Arc::new(Seen::default());
    let epoch = Instant::now();
    let s = seen.clone();
    tokio::spawn(async move {
        loop {
            match listener.accept().await {
                Ok((sock, _)) => {
                    let _ = sock.set_nodelay(true);
                    tokio::spawn(serve(sock, s.clone(), epoch));
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            }
        }
    });
    Ok(Fake { addr, seen })
}

enum Answer {
    Reply(Vec<u8>),
    Slow(Vec<u8>, Duration),
    Reset,
    Garbage(Vec<u8>),
    Nothing,
}

async fn serve(mut sock: TcpStream, seen: Arc<Seen>, epoch: Instant) {
    let mut codec = MessageCodec::new(staleguard::wire::DEFAULT_MAX_MESSAGE_SIZE);
    let mut buf = BytesMut::with_capacity(16 * 1024);
    loop {
        loop {
            let frame = match codec.decode(&mut buf) {
                Ok(Some(f)) => f,
                Ok(None) => break,
                Err(_) => return,
            };
            seen.requests.fetch_add(1, Ordering::Relaxed);
            match answer(&frame, &seen, epoch) {
                Answer::Reply(r) => {
                    if sock.write_all(&r).await.is_err() {
                        return;
                    }
                }
                Answer::Slow(r, d) => {
                    tokio::time::sleep(d).await;
                    if sock.write_all(&r).await.is_err() {
                        return;
                    }
                }
                Answer::Reset => {
                    // SO_LINGER 0: the close is a TCP reset, as a crashing mongos's.
                    let _ = sock.set_zero_linger();
                    return;
                }
                Answer::Garbage(g) => {
                    let _ = sock.write_all(&g).await;
                }
                Answer::Nothing => {}
            }
        }
        // A 40 MB ping must not stay in this buffer for the life of an idle connection.
        if buf.is_empty() && buf.capacity() > 1 << 20 {
            buf = BytesMut::with_capacity(16 * 1024);
        }
        match sock.read_buf(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
    }
}

fn answer(frame: &[u8], seen: &Seen, epoch: Instant) -> Answer {
    let Some(h) = Header::parse(frame) else {
        return Answer::Nothing;
    };
    let payload = &frame[HEADER_LEN..];
    match h.op() {
        OpCode::Query => {
            let Ok(q) = OpQuery::parse(payload) else {
                return Answer::Nothing;
            };
            // `pay.$cmd` with `{$query: {find, readConcern}}`: mongos up to 5.0 runs it.
            let db = q.full_collection_name.split('.').next().unwrap_or("");
            let cmd = q
                .query
                .get_document("$query")
                .or_else(|_| q.query.get_document("query"))
                .unwrap_or(q.query);
            let body = if first_key(cmd) == Some("find") {
                note_read(cmd, Some(db), seen);
                find_reply(cmd, db)
            } else {
                msgs::hello_body(1)
            };
            Answer::Reply(op_reply(1, h.request_id, &body).to_vec())
        }
        OpCode::Msg => {
            let Ok(m) = OpMsg::parse(payload) else {
                return Answer::Nothing;
            };
            if m.flags & MORE_TO_COME != 0 {
                return Answer::Nothing;
            }
            let reply = |b: &RawDocument| op_msg(1, h.request_id, 0, b).to_vec();
            command(m.body, frame, seen, epoch, h.request_id, reply)
        }
        OpCode::Compressed => {
            // Never decompressed here: the soak's compressed messages are the zstd bombs.
            seen.compressed_refused.fetch_add(1, Ordering::Relaxed);
            let body = error_body(2, "BadValue", "compressed requests are not served here");
            Answer::Reply(op_msg(1, h.request_id, 0, &body).to_vec())
        }
        _ => Answer::Nothing,
    }
}

fn command(
    body: &RawDocument,
    frame: &[u8],
    seen: &Seen,
    epoch: Instant,
    request_id: i32,
    reply: impl Fn(&RawDocument) -> Vec<u8>,
) -> Answer {
    match first_key(body) {
        Some("find") => {}
        Some("aggregate") => return aggregate(body, seen, epoch, reply),
        Some("hello" | "isMaster" | "ismaster") => {
            return Answer::Reply(reply(&msgs::hello_body(1)))
        }
        _ => return Answer::Reply(reply(&rawdoc! { "ok": 1.0 })),
    }
    let db = first_str(body, "$db").unwrap_or("");
    let coll = first_str(body, "find").unwrap_or("");
    let available = note_read(body, None, seen);
    if let Some(m) = marker(body).filter(|m| m.starts_with(BAD_MAX_TIME_PREFIX)) {
        // Rebuilt from the marker exactly as the attacker built it: any byte changed on the
        // way (a rewrite, a replaced limit) shows.
        seen.bad_max_time_seen.fetch_add(1, Ordering::Relaxed);
        if bad_max_time_msg(m, db, coll).as_deref() != Some(frame) {
            seen.bad_max_time_altered.fetch_add(1, Ordering::Relaxed);
        }
        return Answer::Reply(reply(&error_body(2, "BadValue", FAKE_REFUSAL)));
    }
    if (db, coll) == (ns::DEMO, ns::BIG) {
        seen.big_replies.fetch_add(1, Ordering::Relaxed);
        return Answer::Reply(big_reply(request_id));
    }
    let max_time = first_int(body, "maxTimeMS");
    if max_time.is_some_and(|t| (1..=2).contains(&t)) {
        let e = error_body(50, "MaxTimeMSExpired", "operation exceeded time limit");
        return Answer::Reply(reply(&e));
    }
    match coll {
        ns::CHAOS_RESET => {
            seen.resets.fetch_add(1, Ordering::Relaxed);
            return Answer::Reset;
        }
        ns::CHAOS_GARBAGE => {
            seen.garbage_sent.fetch_add(1, Ordering::Relaxed);
            return Answer::Garbage(garbage(request_id));
        }
        _ => {}
    }
    let faulty = ns::is_faulty(db, coll);
    let n = seen.requests.load(Ordering::Relaxed);
    let flood = coll.starts_with(ns::FLOOD_PREFIX) || db == ns::FORGE_DB;
    if !available && ((faulty && in_burst(epoch)) || flood) {
        seen.stale_sent.fetch_add(1, Ordering::Relaxed);
        return Answer::Reply(reply(&msgs::stale_config_body()));
    }
    if marker(body).is_some_and(|m| m.starts_with(DUP_PREFIX)) {
        // Two documents with one `_id`: what an orphan next to its owner looks like.
        if available {
            seen.dup_available.fetch_add(1, Ordering::Relaxed);
        }
        let ns = format!("{db}.{coll}");
        let dup = rawdoc! {
            "cursor": { "firstBatch": [{ "_id": 7_i32 }, { "_id": 7_i32 }], "id": 0_i64,
                "ns": ns.as_str() },
            "ok": 1.0,
        };
        return Answer::Reply(reply(&dup));
    }
    let r = reply(&find_reply(body, db));
    if faulty && n % SLOW_EVERY == 0 {
        seen.slow_sent.fetch_add(1, Ordering::Relaxed);
        return Answer::Slow(r, Duration::from_millis(n * 7 % SLOW_MAX_MS));
    }
    Answer::Reply(r)
}

/// An aggregate on `demo.unwind`: StaleConfig in the bursts (without `available`), else the
/// result of an `$unwind`, four documents with the same `_id`.
fn aggregate(
    body: &RawDocument,
    seen: &Seen,
    epoch: Instant,
    reply: impl Fn(&RawDocument) -> Vec<u8>,
) -> Answer {
    let db = first_str(body, "$db").unwrap_or("");
    let coll = first_str(body, "aggregate").unwrap_or("");
    let available = first_doc(body, "readConcern")
        .and_then(|rc| first_str(rc, "level"))
        .is_some_and(|l| l == "available");
    if available && ns::is_strict_db(db) {
        seen.strict_available.fetch_add(1, Ordering::Relaxed);
    }
    if !available && ns::is_faulty(db, coll) && in_burst(epoch) {
        seen.stale_sent.fetch_add(1, Ordering::Relaxed);
        return Answer::Reply(reply(&msgs::stale_config_body()));
    }
    if available {
        seen.unwind_available.fetch_add(1, Ordering::Relaxed);
    }
    let ns = format!("{db}.{coll}");
    let r = rawdoc! {
        "cursor": { "firstBatch": [
            { "_id": 1_i32, "item": 1_i32 }, { "_id": 1_i32, "item": 2_i32 },
            { "_id": 1_i32, "item": 3_i32 }, { "_id": 1_i32, "item": 4_i32 },
        ], "id": 0_i64, "ns": ns.as_str() },
        "ok": 1.0,
    };
    Answer::Reply(reply(&r))
}

/// Size of the `demo.big` batch: 16 documents of 1,000,000 bytes.
pub const BIG_REPLY: usize = 16_000_000;

/// The 16 MB reply of `demo.big`, built once; each copy gets its `responseTo`.
fn big_reply(request_id: i32) -> Vec<u8> {
    static BIG: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    let whole = BIG.get_or_init(|| {
        let mut batch = bson::RawArrayBuf::new();
        for i in 0..16_i32 {
            let pad = bson::Binary {
                subtype: bson::spec::BinarySubtype::Generic,
                bytes: vec![b'b'; BIG_REPLY / 16],
            };
            batch.push(rawdoc! { "_id": i, "pad": pad });
        }
        let body = rawdoc! {
            "cursor": { "firstBatch": batch, "id": 0_i64, "ns": "demo.big" },
            "ok": 1.0,
        };
        op_msg(1, 0, 0, &body).to_vec()
    });
    let mut out = whole.clone();
    out[8..12].copy_from_slice(&request_id.to_le_bytes());
    out
}

fn in_burst(epoch: Instant) -> bool {
    let t = epoch.elapsed().as_millis() % PERIOD.as_millis();
    t < BURST.as_millis()
}

/// Counts a read that reached us: `available` on a strict namespace (read as mongod would,
/// first occurrences), and verifying reads rewritten on the quiet fallback namespace.
/// Returns whether the read asks for `available`.
fn note_read(cmd: &RawDocument, legacy_db: Option<&str>, seen: &Seen) -> bool {
    let db = legacy_db.or_else(|| first_str(cmd, "$db")).unwrap_or("");
    let available = first_doc(cmd, "readConcern")
        .and_then(|rc| first_str(rc, "level"))
        .is_some_and(|l| l == "available");
    if available && ns::is_strict_db(db) {
        seen.strict_available.fetch_add(1, Ordering::Relaxed);
    }
    let coll = first_str(cmd, "find").unwrap_or("");
    if available && (db, coll) == (ns::DEMO, ns::QUIET) && marker(cmd).is_some() {
        seen.quiet_rewritten.fetch_add(1, Ordering::Relaxed);
    }
    available
}

/// `{cursor: {firstBatch: [{marker, ns}], id: 0, ns}, ok: 1}`: the reply names its request.
fn find_reply(cmd: &RawDocument, db: &str) -> RawDocumentBuf {
    let ns = format!("{db}.{}", first_str(cmd, "find").unwrap_or(""));
    let marker = marker(cmd).unwrap_or("");
    rawdoc! {
        "cursor": { "firstBatch": [{ "marker": marker, "ns": ns.as_str() }], "id": 0_i64,
            "ns": ns.as_str() },
        "ok": 1.0,
    }
}

fn marker(cmd: &RawDocument) -> Option<&str> {
    first_doc(cmd, "filter").and_then(|f| first_str(f, "marker"))
}

/// A reply that is not one: a header declaring 8 bytes, or an OP_MSG with a broken body.
fn garbage(request_id: i32) -> Vec<u8> {
    if request_id % 2 == 0 {
        let mut g = vec![0u8; 32];
        g[0] = 8;
        g
    } else {
        let mut m = op_msg(1, request_id, 0, &rawdoc! { "ok": 1.0, "x": "yyyy" }).to_vec();
        let n = m.len();
        m[n - 8] = 0x7f;
        m
    }
}

fn elements(doc: &RawDocument) -> impl Iterator<Item = (&str, bson::RawBsonRef<'_>)> {
    doc.iter()
        .map_while(Result::ok)
        .map(|(k, v)| (k.as_str(), v))
}

fn first_key(doc: &RawDocument) -> Option<&str> {
    elements(doc).next().map(|(k, _)| k)
}

fn first_str<'a>(doc: &'a RawDocument, key: &str) -> Option<&'a str> {
    elements(doc).find(|(k, _)| *k == key)?.1.as_str()
}

fn first_doc<'a>(doc: &'a RawDocument, key: &str) -> Option<&'a RawDocument> {
    elements(doc).find(|(k, _)| *k == key)?.1.as_document()
}

fn first_int(doc: &RawDocument, key: &str) -> Option<i64> {
    match elements(doc).find(|(k, _)| *k == key)?.1 {
        bson::RawBsonRef::Int32(v) => Some(v as i64),
        bson::RawBsonRef::Int64(v) => Some(v),
        bson::RawBsonRef::Double(v) => Some(v as i64),
        _ => None,
    }
}
