//! Verifying clients: one request at a time with a unique marker and request id; every reply
//! must answer its own request (responseTo, and the marker and namespace echoed by the fake).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bson::{rawdoc, RawDocument};
use staleguard::wire::opmsg::OpMsg;
use staleguard::wire::{inspect_reply, Header, HEADER_LEN};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::msgs;

/// A reply slower than this is lost (the proxy's own deadlines are all shorter).
const REPLY_DEADLINE: Duration = Duration::from_secs(20);

/// Counters of one class of verifying client.
#[derive(Default)]
pub struct Tally {
    pub requests: AtomicU64,
    pub ok: AtomicU64,
    /// Error replies (ok: 0), answering the right request.
    pub errors: AtomicU64,
    /// A reply to another request, or naming another marker or namespace.
    pub mismatches: AtomicU64,
    /// No reply within the deadline, or the connection closed with the request pending.
    pub lost: AtomicU64,
    /// Latency of answered requests, microseconds (bounded reservoir).
    pub latencies: std::sync::Mutex<Vec<u64>>,
}

impl Tally {
    fn latency(&self, d: Duration) {
        let mut l = self.latencies.lock().unwrap_or_else(|p| p.into_inner());
        if l.len() < 200_000 {
            l.push(d.as_micros() as u64);
        }
    }

    /// (p50, p99) in milliseconds.
    pub fn percentiles(&self) -> (f64, f64) {
        let mut l = self
            .latencies
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        if l.is_empty() {
            return (0.0, 0.0);
        }
        l.sort_unstable();
        let at = |q: f64| l[((l.len() - 1) as f64 * q) as usize] as f64 / 1000.0;
        (at(0.5), at(0.99))
    }
}

/// One verifying client: reads `db.coll` with `mode` until `until`, reconnecting after a lost
/// connection; `id` makes its markers unique.
pub async fn verify(
    proxy: SocketAddr,
    id: usize,
    db: &'static str,
    coll: &'static str,
    tally: Arc<Tally>,
    until: Instant,
) {
    let mut seq = 0u64;
    while Instant::now() < until {
        let Ok(mut sock) = TcpStream::connect(proxy).await else {
            tally.lost.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        let _ = sock.set_nodelay(true);
        while Instant::now() < until {
            seq += 1;
            let marker = format!("v{id}-{seq}");
            let request_id = (id as i32) << 20 | (seq as i32 & 0xfffff);
            let body = rawdoc! {
                "find": coll,
                "filter": { "marker": marker.as_str() },
                "maxTimeMS": 5000_i32,
                "$db": db,
                "$readPreference": { "mode": "secondaryPreferred" },
            };
            tally.requests.fetch_add(1, Ordering::Relaxed);
            let started = Instant::now();
            let msg = msgs::op_msg(request_id, &body, false);
            let answered =
                match tokio::time::timeout(REPLY_DEADLINE, round_trip(&mut sock, &msg)).await {
                    Ok(Ok(reply)) => reply,
                    _ => {
                        tally.lost.fetch_add(1, Ordering::Relaxed);
                        break;
                    }
                };
            tally.latency(started.elapsed());
            match judge(&answered, request_id, &marker, db, coll) {
                Verdict::Ok => tally.ok.fetch_add(1, Ordering::Relaxed),
                Verdict::Error => tally.errors.fetch_add(1, Ordering::Relaxed),
                Verdict::Mismatch => tally.mismatches.fetch_add(1, Ordering::Relaxed),
            };
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
}

pub async fn round_trip(sock: &mut TcpStream, msg: &[u8]) -> std::io::Result<Vec<u8>> {
    sock.write_all(msg).await?;
    read_message(sock).await
}

/// Reads one whole message (bounded to 16 MiB: replies here are small).
pub async fn read_message(sock: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    let mut head = [0u8; 4];
    sock.read_exact(&mut head).await?;
    let len = i32::from_le_bytes(head);
    if !(HEADER_LEN as i32..=16 << 20).contains(&len) {
        return Err(std::io::Error::other(format!("reply length {len}")));
    }
    let mut out = vec![0u8; len as usize];
    out[..4].copy_from_slice(&head);
    sock.read_exact(&mut out[4..]).await?;
    Ok(out)
}

enum Verdict {
    Ok,
    Error,
    Mismatch,
}

fn judge(reply: &[u8], request_id: i32, marker: &str, db: &str, coll: &str) -> Verdict {
    let Some(h) = Header::parse(reply) else {
        return Verdict::Mismatch;
    };
    if h.response_to != request_id {
        return Verdict::Mismatch;
    }
    match inspect_reply(reply, 16 << 20) {
        Ok(s) if s.ok => {}
        Ok(_) => return Verdict::Error,
        Err(_) => return Verdict::Mismatch,
    }
    let Ok(m) = OpMsg::parse(&reply[HEADER_LEN..]) else {
        return Verdict::Mismatch;
    };
    let ns = format!("{db}.{coll}");
    if echoed(m.body) == Some((marker, ns.as_str())) {
        Verdict::Ok
    } else {
        Verdict::Mismatch
    }
}

/// The marker and namespace of the fake's `cursor.firstBatch[0]`.
fn echoed(body: &RawDocument) -> Option<(&str, &str)> {
    let doc = body
        .get_document("cursor")
        .ok()?
        .get_array("firstBatch")
        .ok()?
        .into_iter()
        .next()?
        .ok()?
        .as_document()?;
    Some((doc.get_str("marker").ok()?, doc.get_str("ns").ok()?))
}
