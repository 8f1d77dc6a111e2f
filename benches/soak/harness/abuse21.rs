//! The attackers of issue 21 on the proxy port, beside issue 11's (`abuse.rs`): a 40 MB `ping`
//! then idle, clients that never read a 16 MB reply, silent connections, `$unwind` aggregates
//! on a fallback namespace, collection names that try to forge log lines, and reads with an
//! invalid `maxTimeMS` (the admin endpoint's and the config file's are in `abuse21_admin.rs`).
//! Each loops until its deadline and counts what it saw.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bson::{rawdoc, RawBson, RawDocumentBuf};
use staleguard::wire::{inspect_reply, Header};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::clients::round_trip;
use super::fake::BIG_REPLY;
use super::{msgs, ns};

/// Marker prefix of the reads with an invalid `maxTimeMS` (`mt-KIND-REQUESTID`).
pub const BAD_MAX_TIME_PREFIX: &str = "mt-";
/// Marker prefix of the control finds the fake answers with a repeated `_id`.
pub const DUP_PREFIX: &str = "dup-";
/// The fake's refusal of an invalid `maxTimeMS`, as a server's BadValue.
pub const FAKE_REFUSAL: &str = "soak fake: invalid maxTimeMS";
/// What the forging collection names try to start a log line with.
pub const FORGED: &str = "FORGED LOG LINE";
/// The large `ping` after which a connection stays idle.
pub const PING_SIZE: usize = 40_000_000;

#[derive(Default)]
pub struct Done21 {
    pub big_pings: AtomicU64,
    pub non_readers: AtomicU64,
    /// Non-readers the proxy had closed when they looked, `write_timeout` + 3 s later.
    pub non_readers_closed: AtomicU64,
    /// Non-readers still open then (they read the whole reply).
    pub non_readers_open: AtomicU64,
    /// Non-readers whose reply did not start within 20 s (not judged).
    pub non_readers_unanswered: AtomicU64,
    pub silent: AtomicU64,
    pub silent_closed: AtomicU64,
    /// Silent connections not closed within `first_message_timeout` + 5 s.
    pub silent_open: AtomicU64,
    /// The longest a silent connection stayed open, milliseconds.
    pub silent_max_ms: AtomicU64,
    pub slow_headers: AtomicU64,
    pub slow_headers_cut: AtomicU64,
    /// The longest a slow header sender stayed connected, milliseconds.
    pub slow_headers_max_ms: AtomicU64,
    pub admin_flood: AtomicU64,
    pub admin_503: AtomicU64,
    pub scrapes_ok: AtomicU64,
    pub scrapes_failed: AtomicU64,
    /// The longest the scraper went without an answer (from the abuse's start), ms.
    pub scrape_max_gap_ms: AtomicU64,
    pub config_writes: AtomicU64,
    pub unwind: AtomicU64,
    pub dup_finds: AtomicU64,
    pub forged: AtomicU64,
    pub bad_max_time: AtomicU64,
    /// Replies to them that were the fake's refusal, and those that were not.
    pub bad_max_time_refused: AtomicU64,
    pub bad_max_time_other: AtomicU64,
}

pub(super) fn max(a: &AtomicU64, v: u64) {
    a.fetch_max(v, Ordering::Relaxed);
}

pub(super) fn add(a: &AtomicU64) {
    a.fetch_add(1, Ordering::Relaxed);
}

pub(super) async fn connect(addr: SocketAddr) -> Option<TcpStream> {
    let s = TcpStream::connect(addr).await.ok()?;
    let _ = s.set_nodelay(true);
    Some(s)
}

pub(super) async fn sleep_until_or(d: Duration, until: Instant) {
    let left = until.saturating_duration_since(Instant::now());
    tokio::time::sleep(d.min(left)).await;
}

/// `{ping: 1, pad: <40 MB>}`.
pub fn big_ping() -> Vec<u8> {
    let pad = bson::Binary {
        subtype: bson::spec::BinarySubtype::Generic,
        bytes: vec![b'p'; PING_SIZE],
    };
    msgs::op_msg(
        40,
        &rawdoc! { "ping": 1_i32, "pad": pad, "$db": "admin" },
        false,
    )
}

pub fn small_ping(id: i32) -> Vec<u8> {
    msgs::op_msg(id, &rawdoc! { "ping": 1_i32, "$db": "admin" }, false)
}

/// A small ping (as a driver's handshake comes first, within `first_message_timeout`), a
/// 40 MB one and a small one, answered; then the connection stays idle.
pub async fn ping_then_idle(s: &mut TcpStream, ping: &[u8]) -> bool {
    round_trip(s, &small_ping(39)).await.is_ok()
        && round_trip(s, ping).await.is_ok()
        && round_trip(s, &small_ping(41)).await.is_ok()
}

/// A 40 MB ping, then 5 s idle, then close; repeated.
pub async fn big_pinger(proxy: SocketAddr, ping: Arc<Vec<u8>>, done: Arc<Done21>, until: Instant) {
    while Instant::now() < until {
        let Some(mut s) = connect(proxy).await else {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        let r = tokio::time::timeout(Duration::from_secs(20), ping_then_idle(&mut s, &ping)).await;
        if matches!(r, Ok(true)) {
            add(&done.big_pings);
        }
        sleep_until_or(Duration::from_secs(5), until).await;
    }
}

/// A find on `demo.big` (16 MB batch): primary, so not followed and streamed; with
/// `tracked`, a secondary read on the fallback namespace, whose reply is judged (in pieces).
pub fn big_find(id: i32, tracked: bool) -> Vec<u8> {
    let mut b = rawdoc! { "find": ns::BIG, "filter": {}, "$db": ns::DEMO };
    if tracked {
        b.append(
            bson::raw::cstr!("$readPreference"),
            rawdoc! { "mode": "secondary" },
        );
    }
    msgs::op_msg(id, &b, false)
}

/// A connection with a small fixed receive buffer (no autotuning): the kernel takes little
/// of a reply off the proxy, as with a client far away or one whose buffer is full.
pub async fn small_window(proxy: SocketAddr) -> Option<TcpStream> {
    let socket = tokio::net::TcpSocket::new_v4().ok()?;
    socket.set_recv_buffer_size(64 * 1024).ok()?;
    let s = socket.connect(proxy).await.ok()?;
    let _ = s.set_nodelay(true);
    Some(s)
}

/// Waits (up to 20 s) until a reply's first bytes are there, without reading them.
pub async fn first_bytes(s: &TcpStream) -> bool {
    let mut b = [0u8; 1];
    matches!(
        tokio::time::timeout(Duration::from_secs(20), s.peek(&mut b)).await,
        Ok(Ok(1..))
    )
}

/// Reads what is left until the end: (closed, bytes). Not closed: no end within 10 s of
/// silence, or the whole 16 MB reply arrived (the proxy had kept it for us).
pub async fn drained(s: &mut TcpStream) -> (bool, usize) {
    let mut got = 0usize;
    let mut buf = vec![0u8; 1 << 16];
    loop {
        match tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return (got < BIG_REPLY, got),
            Ok(Ok(n)) => got += n,
            Err(_) => return (false, got),
        }
    }
}

/// Asks for the 16 MB batch and never reads; looks `write_timeout` + 12 s after the reply's
/// first bytes arrived whether the proxy closed the connection.
pub async fn non_reader(
    proxy: SocketAddr,
    write_timeout: Duration,
    done: Arc<Done21>,
    until: Instant,
) {
    let mut id = 0;
    while Instant::now() < until {
        id += 1;
        let Some(mut s) = small_window(proxy).await else {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        if s.write_all(&big_find(id, false)).await.is_err() {
            continue;
        }
        add(&done.non_readers);
        // `write_timeout` counts from when bytes wait for us: from the reply's first bytes
        // (a loaded harness can take seconds to send it), seen without taking them.
        if !first_bytes(&s).await {
            add(&done.non_readers_unanswered);
            continue;
        }
        // Before the proxy's outbox holds bytes for us, the reply must fill the sockets
        // between us (a few MB, from a fake mongos that shares this loaded process): ample
        // slack, since reading before the proxy has given up would make progress.
        tokio::time::sleep(write_timeout + Duration::from_secs(12)).await;
        match drained(&mut s).await {
            (true, _) => add(&done.non_readers_closed),
            (false, _) => add(&done.non_readers_open),
        }
    }
}

/// Four connections at a time that never send a byte; each waits for the proxy's close.
pub async fn silent(
    proxy: SocketAddr,
    first_message_timeout: Duration,
    done: Arc<Done21>,
    until: Instant,
) {
    while Instant::now() < until {
        let mut waits = tokio::task::JoinSet::new();
        for _ in 0..4 {
            let Some(mut s) = connect(proxy).await else {
                continue;
            };
            add(&done.silent);
            let done = done.clone();
            waits.spawn(async move {
                let opened = Instant::now();
                let mut b = [0u8; 64];
                let limit = first_message_timeout + Duration::from_secs(5);
                match tokio::time::timeout(limit, s.read(&mut b)).await {
                    Ok(Ok(0)) | Ok(Err(_)) => {
                        add(&done.silent_closed);
                        max(&done.silent_max_ms, opened.elapsed().as_millis() as u64);
                    }
                    _ => add(&done.silent_open),
                }
            });
        }
        while waits.join_next().await.is_some() {}
        sleep_until_or(Duration::from_millis(200), until).await;
    }
}

fn secondary(mut b: RawDocumentBuf, db: &str) -> RawDocumentBuf {
    b.append(bson::raw::cstr!("$db"), db);
    b.append(
        bson::raw::cstr!("$readPreference"),
        rawdoc! { "mode": "secondary" },
    );
    b
}

/// `$unwind` aggregates on `demo.unwind` (faulty: StaleConfig bursts, so they are resent or
/// rewritten with `available`), and one control find in four whose `available` reply holds a
/// repeated `_id`, on three connections.
pub async fn unwind(proxy: SocketAddr, done: Arc<Done21>, until: Instant) {
    let agg = secondary(
        rawdoc! { "aggregate": ns::UNWIND, "pipeline": [{ "$unwind": "$items" }],
        "cursor": {} },
        ns::DEMO,
    );
    let agg = msgs::op_msg(50, &agg, false);
    let mut n = 0u64;
    while Instant::now() < until {
        let Some(mut s) = connect(proxy).await else {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        while Instant::now() < until {
            n += 1;
            let msg = if n % 4 == 0 {
                let marker = format!("{DUP_PREFIX}{n}");
                let f = secondary(
                    rawdoc! { "find": ns::UNWIND, "filter": { "marker": marker } },
                    ns::DEMO,
                );
                add(&done.dup_finds);
                msgs::op_msg(51, &f, false)
            } else {
                add(&done.unwind);
                agg.clone()
            };
            let r = tokio::time::timeout(Duration::from_secs(10), round_trip(&mut s, &msg)).await;
            if !matches!(r, Ok(Ok(_))) {
                break;
            }
            sleep_until_or(Duration::from_millis(100), until).await;
        }
    }
}

/// The collection name of the forging reads: a newline, the forged line, ANSI escapes.
pub fn forged_collection() -> String {
    format!("x\n{FORGED} \u{1b}[31mred\u{1b}[0m\r\u{1b}[2K")
}

/// Secondary finds on the forging collection of `forge` (StaleConfig until the breaker
/// opens, which is logged at warn with the namespace), from one connection.
pub async fn forger(proxy: SocketAddr, done: Arc<Done21>, until: Instant) {
    let f = secondary(
        rawdoc! { "find": forged_collection(), "filter": {} },
        ns::FORGE_DB,
    );
    let msg = msgs::op_msg(60, &f, false);
    while Instant::now() < until {
        let Some(mut s) = connect(proxy).await else {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        while Instant::now() < until {
            add(&done.forged);
            let r = tokio::time::timeout(Duration::from_secs(10), round_trip(&mut s, &msg)).await;
            if !matches!(r, Ok(Ok(_))) {
                break;
            }
            sleep_until_or(Duration::from_millis(300), until).await;
        }
    }
}

/// The invalid `maxTimeMS` values: negative, fractional, a string, NaN, past int32 (as int64
/// and as a double).
fn bad_value(kind: usize) -> Option<RawBson> {
    Some(match kind {
        0 => RawBson::Int32(-1),
        1 => RawBson::Double(1.5),
        2 => RawBson::String("500".into()),
        3 => RawBson::Double(f64::NAN),
        4 => RawBson::Int64(i32::MAX as i64 + 1),
        5 => RawBson::Double(3e9),
        _ => return None,
    })
}

const BAD_KINDS: usize = 6;

fn bad_max_time_read(kind: usize, db: &str, coll: &str, request_id: i32) -> Option<Vec<u8>> {
    let marker = format!("{BAD_MAX_TIME_PREFIX}{kind}-{request_id}");
    let mut b = rawdoc! { "find": coll, "filter": { "marker": marker } };
    b.append(bson::raw::cstr!("maxTimeMS"), bad_value(kind)?);
    Some(msgs::op_msg(request_id, &secondary(b, db), false))
}

/// The read an invalid-`maxTimeMS` attacker sent, rebuilt from its marker (for the fake).
pub fn bad_max_time_msg(marker: &str, db: &str, coll: &str) -> Option<Vec<u8>> {
    let (kind, id) = marker.strip_prefix(BAD_MAX_TIME_PREFIX)?.split_once('-')?;
    bad_max_time_read(kind.parse().ok()?, db, coll, id.parse().ok()?)
}

/// Reads with every invalid `maxTimeMS` on the faulty fallback and strict namespaces; each
/// must get the fake's refusal (forwarded, never failed fast or answered by the proxy).
pub async fn bad_max_time(proxy: SocketAddr, done: Arc<Done21>, until: Instant) {
    let mut id = 0i32;
    while Instant::now() < until {
        let Some(mut s) = connect(proxy).await else {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        'conn: while Instant::now() < until {
            for (db, coll) in [(ns::DEMO, ns::INVENTORY), (ns::PAY, ns::LEDGER)] {
                for kind in 0..BAD_KINDS {
                    id = id.wrapping_add(1) & 0x7fff_ffff;
                    let Some(msg) = bad_max_time_read(kind, db, coll, id) else {
                        continue;
                    };
                    add(&done.bad_max_time);
                    let r = tokio::time::timeout(Duration::from_secs(10), round_trip(&mut s, &msg));
                    let Ok(Ok(reply)) = r.await else {
                        break 'conn;
                    };
                    if is_fake_refusal(&reply, id) {
                        add(&done.bad_max_time_refused);
                    } else {
                        add(&done.bad_max_time_other);
                    }
                }
            }
            sleep_until_or(Duration::from_millis(50), until).await;
        }
    }
}

fn is_fake_refusal(reply: &[u8], id: i32) -> bool {
    let right_id = Header::parse(reply).is_some_and(|h| h.response_to == id);
    let status = inspect_reply(reply, 1 << 20);
    right_id
        && status.is_ok_and(|s| !s.ok && s.code == Some(2))
        && reply
            .windows(FAKE_REFUSAL.len())
            .any(|w| w == FAKE_REFUSAL.as_bytes())
}
