//! The lifecycle through a whole session (`Session::pump` between in-memory pipes), in paused
//! time: the stop, the kill, each deadline and the metrics flush, timed on the runtime's
//! clock, which moves only when every task waits.

use std::sync::Arc;
use std::time::Duration;

use bson::rawdoc;
use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::*;
use crate::config::Config;
use crate::handles::Handles;
use crate::session::Session;
use crate::wire::reply::op_msg;

/// A session between pipes: the client's end, mongos's end, its stop and kill, and the
/// shared handles (the metrics).
struct Piped {
    client: DuplexStream,
    mongos: DuplexStream,
    stop: CancellationToken,
    kill: CancellationToken,
    shared: Arc<Handles>,
    relay: JoinHandle<()>,
    started: Instant,
}

/// The pipes hold `pipe` bytes each way.
fn piped(config: Config, pipe: usize) -> Piped {
    let shared = Arc::new(Handles::new(Arc::new(config)));
    let (stop, kill) = (CancellationToken::new(), CancellationToken::new());
    let peer = "127.0.0.1:9".parse().expect("addr");
    let session = Session::new(shared.sessions.clone(), peer, 1, stop.clone(), kill.clone());
    let (client, proxy_client) = tokio::io::duplex(pipe);
    let (proxy_up, mongos) = tokio::io::duplex(pipe);
    let (cr, cw) = tokio::io::split(proxy_client);
    let (ur, uw) = tokio::io::split(proxy_up);
    let relay = tokio::spawn(session.pump(cr, cw, ur, uw));
    Piped {
        client,
        mongos,
        stop,
        kill,
        shared,
        relay,
        started: Instant::now(),
    }
}

fn limits(f: impl FnOnce(&mut crate::config::Limits)) -> Config {
    let mut c = Config::for_upstreams("127.0.0.1:0", vec!["127.0.0.1:1".into()]);
    f(&mut c.limits);
    c
}

fn ping(id: i32) -> Bytes {
    op_msg(id, 0, 0, &rawdoc! { "ping": 1, "$db": "admin" })
}

fn ok_reply(response_to: i32, pad: usize) -> Bytes {
    let filler = "x".repeat(pad);
    op_msg(7, response_to, 0, &rawdoc! { "ok": 1.0, "pad": filler })
}

/// Reads one whole message from `r`.
async fn read_msg(r: &mut DuplexStream) -> Vec<u8> {
    let mut head = [0u8; 4];
    r.read_exact(&mut head).await.expect("message length");
    let len = i32::from_le_bytes(head) as usize;
    let mut msg = head.to_vec();
    msg.resize(len, 0);
    r.read_exact(&mut msg[4..]).await.expect("message body");
    msg
}

/// How long the session ran, on the paused clock.
async fn ran(p: Piped) -> Duration {
    let started = p.started;
    p.relay.await.expect("session task");
    started.elapsed()
}

/// Within `setting` and 1.25 times it (the tick's promise).
fn within(took: Duration, setting: Duration) {
    assert!(
        took >= setting && took <= setting * 5 / 4,
        "ended after {took:?}, setting {setting:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_stop_lets_the_request_in_flight_finish_then_closes() {
    let mut p = piped(limits(|_| {}), 1 << 16);
    p.client.write_all(&ping(1)).await.expect("send");
    let sent = read_msg(&mut p.mongos).await;
    assert_eq!(sent, ping(1)[..]);
    p.stop.cancel();
    // The session waits for the reply however long mongos takes.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(
        !p.relay.is_finished(),
        "a stop must not cut a request in flight"
    );
    p.mongos.write_all(&ok_reply(1, 0)).await.expect("reply");
    assert_eq!(read_msg(&mut p.client).await, ok_reply(1, 0)[..]);
    // Then both sides are closed.
    let mut rest = Vec::new();
    p.client.read_to_end(&mut rest).await.expect("client eof");
    p.mongos.read_to_end(&mut rest).await.expect("mongos eof");
    assert!(rest.is_empty());
    p.relay.await.expect("session task");
}

#[tokio::test(start_paused = true)]
async fn a_stop_closes_an_idle_session_at_once() {
    let p = piped(limits(|_| {}), 1 << 16);
    tokio::time::sleep(Duration::from_millis(10)).await;
    p.stop.cancel();
    let took = ran(p).await;
    assert!(took < Duration::from_millis(20), "took {took:?}");
}

/// A client and a mongos that never pause: the kill ends the session within a few turns.
#[tokio::test(start_paused = true)]
async fn the_kill_ends_a_busy_session() {
    let p = piped(limits(|_| {}), 1 << 16);
    let (mut cr, mut cw) = tokio::io::split(p.client);
    let (mut mr, mut mw) = tokio::io::split(p.mongos);
    let replies = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let counted = replies.clone();
    // mongos answers every request; the client keeps eight in flight.
    let server = tokio::spawn(async move {
        let mut id = 0;
        loop {
            let mut head = [0u8; 16];
            if mr.read_exact(&mut head).await.is_err() {
                return;
            }
            let len = i32::from_le_bytes([head[0], head[1], head[2], head[3]]) as usize;
            let mut rest = vec![0u8; len - 16];
            if mr.read_exact(&mut rest).await.is_err() {
                return;
            }
            id += 1;
            let to = i32::from_le_bytes([head[4], head[5], head[6], head[7]]);
            if mw.write_all(&ok_reply(to, id % 7)).await.is_err() {
                return;
            }
        }
    });
    let reader = tokio::spawn(async move {
        while let Ok(n) = cr.read(&mut [0u8; 4096]).await {
            if n == 0 {
                return;
            }
            counted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    });
    let writer = tokio::spawn(async move {
        let mut id = 0;
        while cw.write_all(&ping(id)).await.is_ok() {
            id += 1;
        }
    });
    while replies.load(std::sync::atomic::Ordering::Relaxed) < 200 {
        tokio::task::yield_now().await;
    }
    assert!(!p.relay.is_finished(), "busy");
    p.kill.cancel();
    let mut turns = 0;
    while !p.relay.is_finished() {
        tokio::task::yield_now().await;
        turns += 1;
        assert!(turns < 1000, "the kill did not end a busy session");
    }
    p.relay.await.expect("session task");
    for t in [server, reader, writer] {
        t.await.expect("peer task");
    }
}

#[tokio::test(start_paused = true)]
async fn idle_timeout_acts_within_a_quarter_more_than_its_setting() {
    let idle = Duration::from_secs(8);
    let p = piped(limits(|l| l.idle_timeout = Some(idle)), 1 << 16);
    within(ran(p).await, idle);
}

#[tokio::test(start_paused = true)]
async fn message_timeout_acts_within_a_quarter_more_than_its_setting() {
    let limit = Duration::from_secs(6);
    let mut p = piped(limits(|l| l.message_timeout = limit), 1 << 16);
    // The first bytes of a message that never ends.
    p.client.write_all(&ping(1)[..10]).await.expect("send");
    let _client = p.client;
    let started = Instant::now();
    p.relay.await.expect("session task");
    within(started.elapsed(), limit);
}

#[tokio::test(start_paused = true)]
async fn write_timeout_acts_within_a_quarter_more_than_its_setting() {
    let limit = Duration::from_secs(4);
    // Pipes of 4 KiB: a reply of 200 KiB fills the client's pipe and the session's outbox.
    let mut p = piped(limits(|l| l.write_timeout = limit), 4096);
    p.client.write_all(&ping(1)).await.expect("send");
    let _ = read_msg(&mut p.mongos).await;
    let reply = ok_reply(1, 200 * 1024);
    let (_mr, mut mw) = tokio::io::split(p.mongos);
    let up = tokio::spawn(async move { mw.write_all(&reply).await });
    // The client reads nothing from here on: the pipes and the outbox fill at once (no time
    // passes while tasks run), and nothing more is taken.
    let sent = Instant::now();
    p.relay.await.expect("session task");
    within(sent.elapsed(), limit);
    drop(p.client);
    let _ = up.await;
}

#[tokio::test(start_paused = true)]
async fn counts_reach_the_shared_metrics_within_flush_after() {
    let mut p = piped(limits(|_| {}), 1 << 16);
    p.client.write_all(&ping(1)).await.expect("send");
    let _ = read_msg(&mut p.mongos).await;
    let counted = || {
        let text = p.shared.metrics.render();
        text.lines()
            .filter(|l| !l.starts_with('#'))
            .find(|l| l.contains("forwarded_unclassified_total"))
            .and_then(|l| l.split_whitespace().nth(1))
            .is_some_and(|v| v == "1")
    };
    assert!(
        !counted(),
        "counted at once: the batch would not be a batch"
    );
    let sent = Instant::now();
    while !counted() && sent.elapsed() < FLUSH_AFTER * 2 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Looked at every 10 ms.
    let step = Duration::from_millis(10);
    assert!(
        sent.elapsed() <= FLUSH_AFTER + step,
        "flushed after {:?}",
        sent.elapsed()
    );
    p.stop.cancel();
}
