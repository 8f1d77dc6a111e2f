//! The abusive clients of issue 11's "Why", each a loop until the deadline. They count what
//! they did; what it does to the proxy shows in the verifying clients, the fake mongos's
//! counters and the proxy's memory.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bson::{rawdoc, RawDocumentBuf};
use staleguard::wire::compressed::{compress, ZSTD};
use staleguard::wire::{Header, OpCode, HEADER_LEN};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use super::clients::{read_message, round_trip};
use super::{msgs, ns, seeds_op_query};

/// The declared size of the memory attacks: 47 MB, under the default 48 MB limit.
pub const BIG: usize = 47_000_000;

#[derive(Default)]
pub struct Done {
    pub poison: AtomicU64,
    pub tiny_max_time: AtomicU64,
    pub duplicated: AtomicU64,
    pub legacy: AtomicU64,
    pub trickle_bytes: AtomicU64,
    pub big_partial: AtomicU64,
    pub bombs: AtomicU64,
    pub pipelined: AtomicU64,
    pub flood: AtomicU64,
    pub chaos: AtomicU64,
}

fn find(db: &str, coll: &str, extra: RawDocumentBuf) -> RawDocumentBuf {
    let mut b = rawdoc! { "find": coll, "filter": {} };
    for (k, v) in extra.iter().map_while(Result::ok) {
        b.append(k, v);
    }
    b.append(bson::raw::cstr!("$db"), db);
    b.append(
        bson::raw::cstr!("$readPreference"),
        rawdoc! { "mode": "secondary" },
    );
    b
}

async fn connect(proxy: SocketAddr) -> Option<TcpStream> {
    let s = TcpStream::connect(proxy).await.ok()?;
    let _ = s.set_nodelay(true);
    Some(s)
}

/// A request, and its reply when one comes within a few seconds (errors are expected).
async fn ask(proxy: SocketAddr, msg: &[u8]) {
    if let Some(mut s) = connect(proxy).await {
        let _ = tokio::time::timeout(Duration::from_secs(5), round_trip(&mut s, msg)).await;
    }
}

/// Breaker poisoning: connect, send a secondary find on a quiet namespace, close at once.
pub async fn poison(proxy: SocketAddr, done: Arc<Done>, until: Instant) {
    let mut i = 0u32;
    while Instant::now() < until {
        i += 1;
        let (db, coll) = if i % 2 == 0 {
            (ns::PAY, ns::QUIET)
        } else {
            (ns::DEMO, ns::QUIET)
        };
        if let Some(mut s) = connect(proxy).await {
            let _ = s
                .write_all(&msgs::op_msg(1, &find(db, coll, rawdoc! {}), false))
                .await;
            drop(s);
            done.poison.fetch_add(1, Ordering::Relaxed);
        }
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
}

/// Reads with `maxTimeMS: 1` (the fake answers MaxTimeMSExpired), duplicated `readConcern`
/// and `$db`, and legacy OP_QUERY `pay.$cmd` reads asking for `available`.
pub async fn policy_abuse(proxy: SocketAddr, done: Arc<Done>, until: Instant) {
    let tiny = |db| find(db, ns::QUIET, rawdoc! { "maxTimeMS": 1_i32 });
    let dup_rc = rawdoc! {
        "find": ns::QUIET, "readConcern": { "level": "available" },
        "readConcern": { "level": "local" }, "$db": ns::PAY,
        "$readPreference": { "mode": "secondary" },
    };
    let dup_db = rawdoc! {
        "find": ns::QUIET, "readConcern": { "level": "available" }, "$db": ns::PAY,
        "$db": ns::DEMO, "$readPreference": { "mode": "secondary" },
    };
    let legacy = seeds_op_query(
        5,
        "pay.$cmd",
        &rawdoc! { "$query": { "find": ns::QUIET, "readConcern": { "level": "available" } },
        "$readPreference": { "mode": "secondary" } },
    );
    while Instant::now() < until {
        for db in [ns::PAY, ns::DEMO] {
            ask(proxy, &msgs::op_msg(2, &tiny(db), false)).await;
            done.tiny_max_time.fetch_add(1, Ordering::Relaxed);
        }
        for b in [&dup_rc, &dup_db] {
            ask(proxy, &msgs::op_msg(3, b, false)).await;
            done.duplicated.fetch_add(1, Ordering::Relaxed);
        }
        ask(proxy, &legacy).await;
        done.legacy.fetch_add(1, Ordering::Relaxed);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A first message that is answered: the connection is past `first_message_timeout` (short
/// in the soak), so what follows meets `message_timeout`.
async fn past_first_message(s: &mut TcpStream) -> bool {
    let ping = msgs::op_msg(4, &rawdoc! { "ping": 1_i32, "$db": "admin" }, false);
    matches!(
        tokio::time::timeout(Duration::from_secs(10), round_trip(s, &ping)).await,
        Ok(Ok(_))
    )
}

/// A ping, then a header declaring 47 MB, then one byte every 200 ms, on `conns`
/// connections (each reopened when the proxy closes it).
pub async fn trickle(proxy: SocketAddr, done: Arc<Done>, until: Instant) {
    let mut head = Vec::with_capacity(HEADER_LEN);
    Header {
        length: BIG as i32,
        request_id: 6,
        response_to: 0,
        op_code: OpCode::MSG,
    }
    .put(&mut head);
    while Instant::now() < until {
        let Some(mut s) = connect(proxy).await else {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        if !past_first_message(&mut s).await || s.write_all(&head).await.is_err() {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        }
        while Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(200)).await;
            if s.write_all(&[0]).await.is_err() {
                break;
            }
            done.trickle_bytes.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// A ping, then 47 MB − 1 bytes of a 47 MB message, then silence for `hold`, then close;
/// repeated.
pub async fn big_partial(proxy: SocketAddr, hold: Duration, done: Arc<Done>, until: Instant) {
    let mut msg = vec![0u8; BIG - 1];
    Header {
        length: BIG as i32,
        request_id: 7,
        response_to: 0,
        op_code: OpCode::MSG,
    }
    .put(&mut &mut msg[..HEADER_LEN]);
    while Instant::now() < until {
        let Some(mut s) = connect(proxy).await else {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        if !past_first_message(&mut s).await {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        }
        let sent = tokio::time::timeout(Duration::from_secs(20), s.write_all(&msg)).await;
        if matches!(sent, Ok(Ok(()))) {
            done.big_partial.fetch_add(1, Ordering::Relaxed);
        }
        let left = until.saturating_duration_since(Instant::now());
        tokio::time::sleep(hold.min(left)).await;
    }
}

/// An OP_COMPRESSED of about 1.5 KB that decompresses to a 47 MB find.
pub fn zstd_bomb() -> Vec<u8> {
    let pad = "a".repeat(BIG - 200);
    let body = rawdoc! { "find": ns::INVENTORY, "filter": { "pad": pad }, "$db": ns::DEMO };
    let mut inner = Vec::with_capacity(BIG);
    inner.extend_from_slice(&0u32.to_le_bytes());
    inner.push(0);
    inner.extend_from_slice(body.as_bytes());
    let data = compress(ZSTD, &inner).expect("zstd compresses");
    let total = HEADER_LEN + 9 + data.len();
    let mut out = Vec::with_capacity(total);
    Header {
        length: total as i32,
        request_id: 8,
        response_to: 0,
        op_code: OpCode::COMPRESSED,
    }
    .put(&mut out);
    out.extend_from_slice(&OpCode::MSG.to_le_bytes());
    out.extend_from_slice(&(inner.len() as i32).to_le_bytes());
    out.push(ZSTD);
    out.extend_from_slice(&data);
    out
}

/// zstd bombs, one at a time on one connection (reconnecting when closed).
pub async fn bombs(proxy: SocketAddr, bomb: Arc<Vec<u8>>, done: Arc<Done>, until: Instant) {
    while Instant::now() < until {
        let Some(mut s) = connect(proxy).await else {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        while Instant::now() < until {
            done.bombs.fetch_add(1, Ordering::Relaxed);
            let r = tokio::time::timeout(Duration::from_secs(10), round_trip(&mut s, &bomb)).await;
            if !matches!(r, Ok(Ok(_))) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// Pipelined reads that are never read: 2,000 finds written back to back, held 3 s, closed.
pub async fn pipeline(proxy: SocketAddr, done: Arc<Done>, until: Instant) {
    let one = msgs::op_msg(9, &find(ns::DEMO, ns::PIPE, rawdoc! {}), false);
    let burst = one.repeat(2000);
    while Instant::now() < until {
        let Some(mut s) = connect(proxy).await else {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        let _ = tokio::time::timeout(Duration::from_secs(3), s.write_all(&burst)).await;
        done.pipelined.fetch_add(2000, Ordering::Relaxed);
        let left = until.saturating_duration_since(Instant::now());
        tokio::time::sleep(Duration::from_secs(3).min(left)).await;
    }
}

/// Reads on ever new namespace names (the fake answers StaleConfig to each).
pub async fn flood(proxy: SocketAddr, done: Arc<Done>, until: Instant) {
    let mut n = 0u64;
    while Instant::now() < until {
        let Some(mut s) = connect(proxy).await else {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        while Instant::now() < until {
            n += 1;
            let coll = format!("{}{n}", ns::FLOOD_PREFIX);
            let msg = msgs::op_msg(10, &find(ns::DEMO, &coll, rawdoc! {}), false);
            let r = tokio::time::timeout(Duration::from_secs(10), round_trip(&mut s, &msg)).await;
            done.flood.fetch_add(1, Ordering::Relaxed);
            if !matches!(r, Ok(Ok(_))) {
                break;
            }
        }
    }
}

/// Reads on the chaos namespaces, whose upstream connection the fake resets or answers with
/// garbage: the proxy must close that pair only.
pub async fn chaos(proxy: SocketAddr, done: Arc<Done>, until: Instant) {
    let mut i = 0u32;
    while Instant::now() < until {
        i += 1;
        let coll = if i % 2 == 0 {
            ns::CHAOS_RESET
        } else {
            ns::CHAOS_GARBAGE
        };
        if let Some(mut s) = connect(proxy).await {
            let msg = msgs::op_msg(i as i32, &find(ns::DEMO, coll, rawdoc! {}), false);
            if s.write_all(&msg).await.is_ok() {
                let _ = tokio::time::timeout(Duration::from_secs(5), read_message(&mut s)).await;
            }
            done.chaos.fetch_add(1, Ordering::Relaxed);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
