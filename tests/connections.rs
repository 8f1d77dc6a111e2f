//! Issue 21, item 2: what a connection may hold, with raw sockets. A client that never
//! sends its first message is closed at `first_message_timeout` (on by default); a silent
//! client at `idle_timeout` (on by default); one peer address past
//! `max_connections_per_peer` is refused like one past `max_connections`, other peers are
//! not. Every limit counts in `limit_hits_total` and shows in `limit_setting`.

use crate::support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bson::rawdoc;
use bytes::Bytes;
use staleguard::config::{Config, Limits};
use staleguard::server::Running;
use support::mongos::FakeMongos;
use support::raw::{self, RawClient};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

async fn proxy(fake: &FakeMongos, limits: impl FnOnce(&mut Limits)) -> Running {
    let mut cfg = Config::for_upstreams("127.0.0.1:0", vec![fake.addr().to_string()]);
    limits(&mut cfg.limits);
    staleguard::server::start(Arc::new(cfg))
        .await
        .expect("proxy starts")
}

fn ping(id: i32) -> Bytes {
    raw::msg(id, 0, &rawdoc! {"ping": 1, "$db": "admin"})
}

/// `limit_setting{limit}` as `/metrics` shows it.
fn setting(p: &Running, limit: &str) -> f64 {
    let m = p.shared().metrics.render();
    let prefix = format!("staleguard_limit_setting{{limit=\"{limit}\"}} ");
    m.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {prefix}in {m}"))
}

fn metric(p: &Running, line: &str) -> bool {
    p.shared().metrics.render().lines().any(|l| l == line)
}

/// Reads until the proxy closes the socket; how long that took.
async fn closed_after(s: &mut TcpStream, started: Instant) -> Duration {
    let mut buf = [0u8; 256];
    loop {
        match support::within("the proxy closes", s.read(&mut buf)).await {
            Ok(0) | Err(_) => return started.elapsed(),
            Ok(_) => {}
        }
    }
}

#[test]
fn defaults_bound_silent_connections() {
    let d = Limits::default();
    assert_eq!(d.first_message_timeout, Duration::from_secs(10));
    assert_eq!(d.idle_timeout, Some(Duration::from_secs(30 * 60)));
    assert_eq!(d.max_connections_per_peer, None);
    let path = std::path::Path::new("t.toml");
    let c = Config::parse("", path).expect("empty config");
    assert_eq!(
        c.limits, d,
        "a file without the keys gets the same defaults"
    );
    let c = Config::parse(
        "idle_timeout = \"off\"\nfirst_message_timeout = \"2s\"\nmax_connections_per_peer = 5\n",
        path,
    )
    .expect("valid");
    assert_eq!(c.limits.idle_timeout, None);
    assert_eq!(c.limits.first_message_timeout, Duration::from_secs(2));
    assert_eq!(c.limits.max_connections_per_peer, Some(5));
    for (bad, key) in [
        ("first_message_timeout = \"0s\"\n", "first_message_timeout"),
        ("first_message_timeout = \"off\"\n", "first_message_timeout"),
        ("max_connections_per_peer = 0\n", "max_connections_per_peer"),
    ] {
        let e = Config::parse(bad, path).expect_err(bad);
        assert_eq!(e[0].key, key, "{bad}: {e:?}");
    }
}

/// Connections that send nothing, or dribble a first message, are closed at
/// `first_message_timeout` although `message_timeout` and `idle_timeout` are far longer; a
/// client that sends its handshake at once is not touched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_never_sends_its_first_message_is_closed() {
    let fake = FakeMongos::start().await;
    let p = proxy(&fake, |l| {
        l.first_message_timeout = Duration::from_millis(400);
        l.message_timeout = Duration::from_secs(60);
        l.idle_timeout = Some(Duration::from_secs(60));
    })
    .await;
    assert_eq!(setting(&p, "first_message_timeout"), 0.4);
    assert_eq!(setting(&p, "idle_timeout"), 60.0);
    let started = Instant::now();
    let mut silent = Vec::new();
    for _ in 0..10 {
        silent.push(TcpStream::connect(p.local_addr()).await.expect("connect"));
    }
    // One starts a message and trickles a byte every 100 ms.
    let mut dribbler = TcpStream::connect(p.local_addr()).await.expect("connect");
    let msg = ping(1);
    let dribble = tokio::spawn(async move {
        for b in msg.iter().take(msg.len() - 1) {
            if dribbler.write_all(&[*b]).await.is_err() {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let mut buf = [0u8; 16];
        matches!(
            tokio::time::timeout(Duration::from_secs(5), dribbler.read(&mut buf)).await,
            Ok(Ok(0) | Err(_))
        )
    });
    let mut prompt = RawClient::connect(p.local_addr()).await;
    prompt.roundtrip(&ping(2)).await;
    for s in silent.iter_mut() {
        let took = closed_after(s, started).await;
        assert!(
            took >= Duration::from_millis(350) && took < Duration::from_secs(2),
            "closed after {took:?}"
        );
    }
    assert!(
        support::within("dribbler", dribble).await.expect("task"),
        "the dribbler is closed before its message is whole"
    );
    // Well past the deadline, the prompt client still works.
    prompt.roundtrip(&ping(3)).await;
    assert!(
        metric(
            &p,
            "staleguard_limit_hits_total{limit=\"first_message_timeout\"} 11"
        ),
        "{}",
        p.shared().metrics.render()
    );
    p.shutdown().await;
}

/// After a round trip, a client silent for `idle_timeout` with nothing in flight is closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_client_is_closed_at_idle_timeout() {
    let fake = FakeMongos::start().await;
    let p = proxy(&fake, |l| l.idle_timeout = Some(Duration::from_millis(300))).await;
    let mut c = RawClient::connect(p.local_addr()).await;
    c.roundtrip(&ping(1)).await;
    let started = Instant::now();
    assert!(c.expect_closed().await.is_empty());
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(250) && took < Duration::from_secs(2),
        "closed after {took:?}"
    );
    assert!(metric(
        &p,
        "staleguard_limit_hits_total{limit=\"idle_timeout\"} 1"
    ));
    p.shutdown().await;
}

/// A client socket bound to a given loopback address (127.0.0.0/8 is all loopback on Linux).
async fn connect_from(ip: &str, to: SocketAddr) -> RawClient {
    let s = TcpSocket::new_v4().expect("socket");
    s.bind(format!("{ip}:0").parse().expect("addr"))
        .expect("bind");
    let stream = s.connect(to).await.expect("connect");
    RawClient::from_stream(stream)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_max_connections_per_peer_that_peer_is_refused_and_others_are_not() {
    let fake = FakeMongos::start().await;
    let p = proxy(&fake, |l| l.max_connections_per_peer = Some(2)).await;
    let addr = p.local_addr();
    assert_eq!(setting(&p, "max_connections_per_peer"), 2.0);
    let mut a = connect_from("127.0.0.1", addr).await;
    let mut b = connect_from("127.0.0.1", addr).await;
    a.roundtrip(&ping(1)).await;
    b.roundtrip(&ping(2)).await;
    // The third from the same address: an error reply that says why, then a close.
    let mut c = connect_from("127.0.0.1", addr).await;
    let reply = c.roundtrip(&ping(3)).await;
    assert_eq!(raw::header(&reply).response_to, 3);
    let body = raw::body(&reply);
    assert_eq!(body.get_i32("code").ok(), Some(6), "{body:?}");
    let errmsg = body.get_str("errmsg").unwrap_or_default();
    assert!(
        errmsg.contains("too many connections from 127.0.0.1")
            && errmsg.contains("max_connections_per_peer = 2"),
        "{errmsg}"
    );
    assert!(c.expect_closed().await.is_empty());
    // Another address is not affected.
    let mut other = connect_from("127.0.0.2", addr).await;
    other.roundtrip(&ping(4)).await;
    let mut other2 = connect_from("127.0.0.2", addr).await;
    other2.roundtrip(&ping(5)).await;
    // The first two still work; a place freed is a place taken.
    a.roundtrip(&ping(6)).await;
    drop(b);
    let mut d = None;
    for _ in 0..50 {
        let mut try_d = connect_from("127.0.0.1", addr).await;
        let reply = try_d.roundtrip(&ping(7)).await;
        if raw::body(&reply).get_f64("ok").ok() == Some(1.0) {
            d = Some(try_d);
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        d.is_some(),
        "a place freed by a closed connection is given again"
    );
    let m = p.shared().metrics.render();
    let hits = m
        .lines()
        .find_map(|l| {
            l.strip_prefix("staleguard_limit_hits_total{limit=\"max_connections_per_peer\"} ")
        })
        .and_then(|n| n.parse::<u64>().ok())
        .unwrap_or(0);
    assert!(hits >= 1, "{m}");
    assert!(metric(
        &p,
        "staleguard_limit_hits_total{limit=\"max_connections\"} 0"
    ));
    p.shutdown().await;
}
