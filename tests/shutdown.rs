//! Graceful stop: requests in flight finish, idle connections close, new ones are refused,
//! and a request that outlives `shutdown_timeout` is cut.

use crate::support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use bson::rawdoc;
use staleguard::config::Config;
use support::mongos::{FakeMongos, Hooked};
use support::raw::{self, RawClient};
use tokio::io::AsyncWriteExt;

async fn proxy(fake: &FakeMongos, grace: Duration) -> staleguard::server::Running {
    let mut cfg = Config::for_upstreams("127.0.0.1:0", vec![fake.addr().to_string()]);
    cfg.shutdown_timeout = grace;
    staleguard::server::start(Arc::new(cfg))
        .await
        .expect("proxy starts")
}

fn slow_pings(fake: &FakeMongos, delay: Duration) {
    fake.set_hook(move |body| {
        (body.get_str("comment").ok() == Some("slow")).then(|| Hooked::delay(delay))
    });
}

#[tokio::test]
async fn in_flight_request_finishes_then_connection_closes() {
    let fake = FakeMongos::start().await;
    slow_pings(&fake, Duration::from_millis(400));
    let p = proxy(&fake, Duration::from_secs(5)).await;
    let addr = p.local_addr();
    let mut busy = RawClient::connect(addr).await;
    let mut idle = RawClient::connect(addr).await;
    idle.roundtrip(&raw::msg(1, 0, &rawdoc! {"ping": 1, "$db": "admin"}))
        .await;
    busy.send(&raw::msg(
        7,
        0,
        &rawdoc! {"ping": 1, "comment": "slow", "$db": "admin"},
    ))
    .await;
    fake.wait_for("slow ping upstream", |log| {
        log.commands
            .iter()
            .any(|(_, b)| b.get_str("comment").ok() == Some("slow"))
    })
    .await;
    let started = Instant::now();
    let stopping = tokio::spawn(p.shutdown());
    // The idle client is closed at once; the busy one gets its reply first.
    assert!(idle.expect_closed().await.is_empty());
    let reply = busy.recv().await;
    assert_eq!(raw::header(&reply).response_to, 7);
    assert_eq!(raw::body(&reply).get_f64("ok").ok(), Some(1.0));
    assert!(busy.expect_closed().await.is_empty());
    stopping.await.expect("shutdown completes");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    assert!(tokio::net::TcpStream::connect(addr).await.is_err());
}

#[tokio::test]
async fn request_outliving_the_deadline_is_cut() {
    let fake = FakeMongos::start().await;
    slow_pings(&fake, Duration::from_secs(30));
    let p = proxy(&fake, Duration::from_millis(300)).await;
    let mut busy = RawClient::connect(p.local_addr()).await;
    busy.send(&raw::msg(
        9,
        0,
        &rawdoc! {"ping": 1, "comment": "slow", "$db": "admin"},
    ))
    .await;
    fake.wait_for("slow ping upstream", |log| {
        log.commands
            .iter()
            .any(|(_, b)| b.get_str("comment").ok() == Some("slow"))
    })
    .await;
    let started = Instant::now();
    p.shutdown().await;
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(250) && waited < Duration::from_secs(3),
        "shutdown took {waited:?}"
    );
    assert!(
        busy.expect_closed().await.is_empty(),
        "no reply after the cut"
    );
}

/// A client and a mongos that both stop reading: big messages fill the socket buffers both
/// ways, so every write the session has to make waits. The stop still finishes at its
/// deadline (the session never waits on a write in a way that hides the kill).
#[tokio::test]
async fn peers_that_stop_reading_cannot_hold_a_stop() {
    const BIG: usize = 16 << 20;
    let grace = Duration::from_millis(500);
    let big = |id: i32| {
        raw::msg(
            id,
            0,
            &rawdoc! {"ping": 1, "pad": "x".repeat(BIG), "$db": "admin"},
        )
    };
    let mongos = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let mut cfg = Config::for_upstreams(
        "127.0.0.1:0",
        vec![mongos.local_addr().expect("addr").to_string()],
    );
    cfg.shutdown_timeout = grace;
    cfg.health_interval = None;
    let p = staleguard::server::start(Arc::new(cfg))
        .await
        .expect("proxy starts");
    let client = tokio::net::TcpStream::connect(p.local_addr())
        .await
        .expect("connect");
    let (_never_read, mut client_out) = client.into_split();
    // The client sends two big requests and reads nothing; mongos reads nothing. (The proxy
    // dials mongos on the client's first message.)
    let requests = big(1).to_vec();
    let more = big(2).to_vec();
    let _client = tokio::spawn(async move {
        let _ = client_out.write_all(&requests).await;
        let _ = client_out.write_all(&more).await;
        std::future::pending::<()>().await;
    });
    let (mut upstream, _) = mongos.accept().await.expect("the proxy dials mongos");
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Then mongos sends a big message of its own: the proxy's way to the client fills too.
    let reply = big(3).to_vec();
    let _mongos = tokio::spawn(async move {
        let _ = upstream.write_all(&reply).await;
        std::future::pending::<()>().await;
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = Instant::now();
    tokio::time::timeout(grace + Duration::from_secs(10), p.shutdown())
        .await
        .expect("the stop finishes although neither peer reads");
    let took = started.elapsed();
    // Requests were in flight, so the stop waited for its deadline, and not much longer.
    assert!(
        took >= grace - Duration::from_millis(50) && took < grace + Duration::from_secs(2),
        "stop took {took:?} with shutdown_timeout {grace:?}"
    );
}

/// A client that never pauses (pipelined pings, replies read as fast as they come): the
/// session always has a message ready, so only the per-message kill check can end it. The
/// stop still finishes at its deadline.
#[tokio::test]
async fn a_client_that_never_pauses_cannot_hold_a_stop() {
    let fake = FakeMongos::start().await;
    let grace = Duration::from_millis(300);
    let p = proxy(&fake, grace).await;
    let client = tokio::net::TcpStream::connect(p.local_addr())
        .await
        .expect("connect");
    let (mut client_in, mut client_out) = client.into_split();
    let _reader = tokio::spawn(async move {
        let mut sink = vec![0u8; 64 * 1024];
        while let Ok(n) = tokio::io::AsyncReadExt::read(&mut client_in, &mut sink).await {
            if n == 0 {
                break;
            }
        }
    });
    let batch: Vec<u8> = (1..=64)
        .flat_map(|id| raw::msg(id, 0, &rawdoc! {"ping": 1, "$db": "admin"}).to_vec())
        .collect();
    let writer = tokio::spawn(async move {
        let mut sent = 0u64;
        while client_out.write_all(&batch).await.is_ok() {
            sent += 1;
        }
        sent
    });
    fake.wait_for("pings upstream", |log| log.commands.len() > 1000)
        .await;
    let started = Instant::now();
    tokio::time::timeout(grace + Duration::from_secs(10), p.shutdown())
        .await
        .expect("the stop finishes although the client never pauses");
    let took = started.elapsed();
    assert!(
        took < grace + Duration::from_secs(2),
        "stop took {took:?} with shutdown_timeout {grace:?}"
    );
    let batches = tokio::time::timeout(Duration::from_secs(5), writer)
        .await
        .expect("the client's writes fail once the proxy closed")
        .expect("writer");
    assert!(batches > 0);
}

/// Issue 21, item 3: the binary exits on SIGTERM within `shutdown_timeout` + 2 s whatever
/// its admin peers do: connections that sent half a request head, one that sent a body's
/// first bytes, idle keep-alive ones, one that never sent anything; and a proxy client
/// with a request in flight that mongos never answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_exits_on_time_whatever_admin_peers_do() {
    use support::bin::Binary;
    use tokio::io::AsyncReadExt;
    let fake = FakeMongos::start().await;
    slow_pings(&fake, Duration::from_secs(60));
    let grace = Duration::from_secs(1);
    // Long header and request timeouts: the stop alone must end these connections.
    let config = format!(
        "listen = \"127.0.0.1:0\"\nupstreams = [\"{}\"]\nhealth_interval = \"off\"\nshutdown_timeout = \"1s\"\n[admin]\nlisten = \"127.0.0.1:0\"\nheader_read_timeout = \"5m\"\nrequest_timeout = \"5m\"\n",
        fake.addr()
    );
    let mut proxy = Binary::start(&config, &[]);
    let admin = proxy.admin().await;
    let listen = proxy.listen().await;
    let mut held = Vec::new();
    for i in 0..20 {
        let mut s = tokio::net::TcpStream::connect(admin).await.expect("admin");
        let half = match i % 4 {
            0 => "GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: ".to_string(),
            1 => "POST /status HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\nab".to_string(),
            2 => "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n".to_string(),
            _ => String::new(),
        };
        s.write_all(half.as_bytes()).await.expect("half a request");
        if i % 4 == 2 {
            // A whole request, answered; the connection stays open (keep-alive).
            let mut buf = [0u8; 512];
            let n = support::within("healthz", s.read(&mut buf))
                .await
                .expect("read");
            assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
        }
        held.push(s);
    }
    let mut busy = RawClient::connect(listen).await;
    busy.send(&raw::msg(
        5,
        0,
        &rawdoc! {"ping": 1, "comment": "slow", "$db": "admin"},
    ))
    .await;
    fake.wait_for("slow ping upstream", |log| {
        log.commands
            .iter()
            .any(|(_, b)| b.get_str("comment").ok() == Some("slow"))
    })
    .await;
    let started = Instant::now();
    proxy.sigterm();
    let status = tokio::task::block_in_place(|| proxy.wait_exit(grace + Duration::from_secs(10)));
    let took = started.elapsed();
    assert!(
        status.is_some(),
        "still running {took:?} after SIGTERM:\n{}",
        proxy.log()
    );
    assert!(
        took < grace + Duration::from_secs(2),
        "exited {took:?} after SIGTERM with shutdown_timeout {grace:?}:\n{}",
        proxy.log()
    );
    assert!(status.is_some_and(|s| s.success()), "{status:?}");
    drop(held);
}
