//! Issue 21, item 3: what one admin HTTP client may hold, with raw sockets. A head that
//! never finishes is cut at `header_read_timeout`; a response its client does not read is
//! cut at `request_timeout`; past `max_connections` a connection gets a bare 503; each is
//! counted in `limit_hits_total`. And the token from a file or an environment variable.
//!
//! Issue 30, item 3: whatever holds the cap, `/healthz` and `/readyz` are answered (the
//! health lane), to kubelet-style probes (a new connection each, a 1 s timeout); and one
//! address holds at most `max_connections_per_peer`.

use crate::ops_support;
use crate::support;

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use ops_support::http::get;
use ops_support::*;
use staleguard::config::Config;
use staleguard::server::Running;
use support::mongos::FakeMongos;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

async fn proxy(fake: &FakeMongos, edit: impl FnOnce(&mut Config)) -> Running {
    let mut c = config(vec![fake.addr().to_string()], vec![]);
    edit(&mut c);
    start(c).await
}

fn hits(p: &Running, limit: &str) -> u64 {
    let m = p.shared().metrics.render();
    let prefix = format!("staleguard_limit_hits_total{{limit=\"{limit}\"}} ");
    m.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {prefix}in {m}"))
}

/// Reads until the server closes; the bytes read and when the close came.
async fn until_closed(s: &mut TcpStream, started: Instant) -> (Vec<u8>, Duration) {
    let mut all = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        match support::within("the admin endpoint closes", s.read(&mut buf)).await {
            Ok(0) | Err(_) => return (all, started.elapsed()),
            Ok(n) => all.extend_from_slice(&buf[..n]),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_that_never_finishes_is_cut_at_header_read_timeout() {
    let fake = FakeMongos::start().await;
    let p = proxy(&fake, |c| {
        c.admin_limits.header_read_timeout = Duration::from_millis(400);
    })
    .await;
    let admin = admin(&p);
    let started = Instant::now();
    // A header line every 100 ms, forever.
    let mut slow = TcpStream::connect(admin).await.expect("connect");
    let trickle = tokio::spawn(async move {
        let _ = slow.write_all(b"GET /metrics HTTP/1.1\r\n").await;
        for i in 0..100 {
            let line = format!("X-Slow-{i}: x\r\n");
            if slow.write_all(line.as_bytes()).await.is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        until_closed(&mut slow, started).await.1
    });
    // One that sends nothing at all.
    let mut silent = TcpStream::connect(admin).await.expect("connect");
    let (_, silent_took) = until_closed(&mut silent, started).await;
    let slow_took = support::within("trickler", trickle).await.expect("task");
    for took in [slow_took, silent_took] {
        assert!(
            took >= Duration::from_millis(350) && took < Duration::from_secs(2),
            "closed after {took:?}"
        );
    }
    assert_eq!(hits(&p, "admin_header_read_timeout"), 2);
    // A keep-alive connection left idle after its request also closes, and that is no hit.
    let mut idle = TcpStream::connect(admin).await.expect("connect");
    idle.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .expect("request");
    let (answer, _) = until_closed(&mut idle, Instant::now()).await;
    assert!(String::from_utf8_lossy(&answer).starts_with("HTTP/1.1 200"));
    assert_eq!(hits(&p, "admin_header_read_timeout"), 2);
    // The endpoint still answers.
    assert_eq!(get(admin, "/healthz", &[]).await.status, 200);
    p.shutdown().await;
}

/// A client with a small receive buffer pipelines many requests for `/metrics` and reads
/// nothing: the answers fill the kernel's buffers, hyper waits to write the next one, and
/// `request_timeout` (counted from that request's head) cuts the connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn responses_never_read_are_cut_at_request_timeout() {
    const REQUESTS: usize = 2000;
    let fake = FakeMongos::start().await;
    let p = proxy(&fake, |c| {
        c.admin_limits.request_timeout = Duration::from_millis(500);
        c.admin_limits.header_read_timeout = Duration::from_secs(60);
    })
    .await;
    let admin = admin(&p);
    let one = get(admin, "/metrics", &[]).await.body.len();
    let s = TcpSocket::new_v4().expect("socket");
    s.set_recv_buffer_size(4096).expect("rcvbuf");
    let reader = s.connect(admin).await.expect("connect");
    let (mut rd, mut wr) = reader.into_split();
    let started = Instant::now();
    let requests = "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n".repeat(REQUESTS);
    let _writer = tokio::spawn(async move {
        let _ = wr.write_all(requests.as_bytes()).await;
        std::future::pending::<()>().await;
    });
    let deadline = Instant::now() + Duration::from_secs(5);
    while hits(&p, "admin_request_timeout") == 0 {
        assert!(Instant::now() < deadline, "never cut");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let cut = started.elapsed();
    assert!(cut >= Duration::from_millis(500), "cut after {cut:?}");
    // What the proxy had written before the cut arrives, then the close.
    let mut got = 0usize;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match support::within("the cut connection closes", rd.read(&mut buf)).await {
            Ok(0) | Err(_) => break,
            Ok(n) => got += n,
        }
    }
    println!(
        "{got} bytes of {REQUESTS} answers of about {one} bytes each arrived; cut after {cut:?}"
    );
    assert!(got < REQUESTS * one, "{got} bytes");
    assert_eq!(hits(&p, "admin_request_timeout"), 1);
    // Other clients are served meanwhile and after.
    assert_eq!(get(admin, "/healthz", &[]).await.status, 200);
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_max_connections_an_admin_client_gets_503_and_the_others_are_served() {
    let fake = FakeMongos::start().await;
    let p = proxy(&fake, |c| {
        c.admin_limits.max_connections = 4;
        c.admin_limits.header_read_timeout = Duration::from_secs(60);
    })
    .await;
    let admin: SocketAddr = admin(&p);
    let m = p.shared().metrics.render();
    assert!(
        m.lines()
            .any(|l| l.starts_with("staleguard_limit_setting{limit=\"admin_max_connections\"} 4")),
        "{m}"
    );
    let mut held = Vec::new();
    for _ in 0..4 {
        held.push(TcpStream::connect(admin).await.expect("connect"));
    }
    // Accepted in order: the fifth finds every place taken.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut fifth = TcpStream::connect(admin).await.expect("connect");
    let (answer, _) = until_closed(&mut fifth, Instant::now()).await;
    assert!(
        String::from_utf8_lossy(&answer).starts_with("HTTP/1.1 503 Service Unavailable"),
        "{}",
        String::from_utf8_lossy(&answer)
    );
    assert_eq!(hits(&p, "admin_max_connections"), 1);
    // The held ones are served.
    let mut first = held.remove(0);
    first
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .expect("request");
    let (answer, _) = until_closed(&mut first, Instant::now()).await;
    assert!(String::from_utf8_lossy(&answer).starts_with("HTTP/1.1 200"));
    // A place freed is a place taken.
    drop(held);
    let mut served = false;
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(20)).await;
        if get(admin, "/healthz", &[]).await.status == 200 {
            served = true;
            break;
        }
    }
    assert!(served);
    p.shutdown().await;
}

const ADMIN_ENV: &str = "STALEGUARD_TEST_ADMIN_TOKEN";

fn parse(text: &str, dir: &Path) -> Result<Config, Vec<staleguard::config::ConfigError>> {
    Config::parse(text, &dir.join("staleguard.toml"))
}

#[test]
fn the_token_comes_from_the_file_a_token_file_or_the_environment() {
    let dir = tempfile::tempdir().expect("temp dir");
    // A Secret mounted as a file, with the newline `echo` leaves.
    std::fs::write(dir.path().join("admin.token"), "from-file\n").expect("token file");
    let c = parse("[admin]\ntoken_file = \"admin.token\"\n", dir.path()).expect("valid");
    assert_eq!(c.admin_token.as_deref(), Some("from-file"));
    std::env::set_var(ADMIN_ENV, "from-env");
    let c = parse(
        &format!("[admin]\ntoken_env = \"{ADMIN_ENV}\"\n"),
        dir.path(),
    )
    .expect("valid");
    assert_eq!(c.admin_token.as_deref(), Some("from-env"));
    let c = parse("[admin]\ntoken = \"inline\"\n", dir.path()).expect("valid");
    assert_eq!(c.admin_token.as_deref(), Some("inline"));

    let bad = [
        (
            "[admin]\ntoken = \"a\"\ntoken_env = \"X\"\n".to_string(),
            "admin.token_env",
            "not several",
        ),
        (
            "[admin]\ntoken_file = \"missing.token\"\n".to_string(),
            "admin.token_file",
            "cannot read",
        ),
        (
            "[admin]\ntoken_env = \"STALEGUARD_TEST_UNSET_VARIABLE\"\n".to_string(),
            "admin.token_env",
            "STALEGUARD_TEST_UNSET_VARIABLE",
        ),
        (
            "[admin]\nenabled = false\ntoken_env = \"X\"\n".to_string(),
            "admin.token_env",
            "no effect",
        ),
        (
            "[admin]\nmax_connections = 0\n".to_string(),
            "admin.max_connections",
            "out of range",
        ),
        (
            "[admin]\nheader_read_timeout = \"0s\"\n".to_string(),
            "admin.header_read_timeout",
            "greater than zero",
        ),
        (
            "[admin]\nhistory_interval = \"500ms\"\n".to_string(),
            "admin.history_interval",
            "at least 1s",
        ),
        (
            "[admin]\nhistory_interval = \"2m\"\n".to_string(),
            "admin.history_interval",
            "at most 60s",
        ),
    ];
    for (text, key, says) in bad {
        let e = parse(&text, dir.path()).expect_err(&text);
        assert_eq!(e[0].key, key, "{text}: {e:?}");
        assert!(e[0].message.contains(says), "{text}: {e:?}");
    }
    std::fs::write(dir.path().join("spaced.token"), "two words\n").expect("token file");
    let e = parse("[admin]\ntoken_file = \"spaced.token\"\n", dir.path()).expect_err("spaces");
    assert!(e[0].message.contains("printable ASCII"), "{e:?}");
}

/// The token from the environment guards the routes, as an inline one does.
#[tokio::test]
async fn a_token_from_the_environment_guards_the_admin_routes() {
    let fake = FakeMongos::start().await;
    let dir = tempfile::tempdir().expect("temp dir");
    std::env::set_var("STALEGUARD_TEST_ADMIN_TOKEN_2", "s3cret");
    let text = format!(
        "listen = \"127.0.0.1:0\"\nupstreams = [\"{}\"]\n[admin]\nlisten = \"127.0.0.1:0\"\ntoken_env = \"STALEGUARD_TEST_ADMIN_TOKEN_2\"\n",
        fake.addr()
    );
    let c = parse(&text, dir.path()).expect("valid");
    let p = start(c).await;
    let admin = admin(&p);
    assert_eq!(get(admin, "/metrics", &[]).await.status, 401);
    let ok = get(admin, "/metrics", &[("Authorization", "Bearer s3cret")]).await;
    assert_eq!(ok.status, 200);
    assert_eq!(get(admin, "/healthz", &[]).await.status, 200);
    p.shutdown().await;
}

/// The case as written: under RLIMIT_NOFILE 512, 520 admin connections used to take
/// every descriptor, and new proxy clients timed out. Now the admin endpoint holds at most
/// `max_connections` of them, and a proxy client is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_connections_cannot_take_every_descriptor() {
    use support::bin::Binary;
    use support::raw::{self, RawClient};
    let fake = FakeMongos::start().await;
    let config = format!(
        "listen = \"127.0.0.1:0\"\nupstreams = [\"{}\"]\nhealth_interval = \"off\"\n[admin]\nlisten = \"127.0.0.1:0\"\nheader_read_timeout = \"60s\"\nmax_connections_per_peer = 64\n",
        fake.addr()
    );
    let proxy = Binary::start_under(&["prlimit", "--nofile=512:512", "--"], &config, &[]);
    let admin = proxy.admin().await;
    let listen = proxy.listen().await;
    let mut held = Vec::new();
    for _ in 0..520 {
        held.push(TcpStream::connect(admin).await.expect("connect admin"));
    }
    // Those past the cap are answered 503 and closed (the health lane holds at most 16 of
    // them at once, each at most 1 s, waiting for a head); the first 64 stay open.
    let answers = futures::future::join_all(held.into_iter().map(|mut s| async move {
        let mut buf = [0u8; 128];
        let answer = tokio::time::timeout(Duration::from_secs(3), s.read(&mut buf)).await;
        let refused = matches!(answer, Ok(Ok(n)) if buf[..n].starts_with(b"HTTP/1.1 503"));
        (refused, s)
    }))
    .await;
    let refused = answers.iter().filter(|(r, _)| *r).count();
    let held: Vec<TcpStream> = answers.into_iter().map(|(_, s)| s).collect();
    assert_eq!(refused, 520 - 64, "{}", proxy.log());
    let mut client = RawClient::connect(listen).await;
    let reply = client
        .roundtrip(&raw::msg(1, 0, &bson::rawdoc! {"ping": 1, "$db": "admin"}))
        .await;
    assert_eq!(raw::body(&reply).get_f64("ok").ok(), Some(1.0));
    drop(held);
    let mut m = String::new();
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let r = get(admin, "/metrics", &[]).await;
        if r.status == 200 {
            m = r.body;
            break;
        }
    }
    assert!(
        m.contains("staleguard_limit_hits_total{limit=\"admin_max_connections\"} 456"),
        "{m}"
    );
}

/// One kubelet-style probe: a new connection, `GET path` as kube-probe sends it, the answer
/// within 1 s (the kubelet's default `timeoutSeconds`); its status, or none.
async fn probe(admin: SocketAddr, path: &str) -> Option<u16> {
    let ask = async {
        let mut s = TcpStream::connect(admin).await.ok()?;
        let req = format!("GET {path} HTTP/1.1\r\nHost: {admin}\r\nUser-Agent: kube-probe/1.31\r\nAccept: */*\r\nConnection: close\r\n\r\n");
        s.write_all(req.as_bytes()).await.ok()?;
        let mut out = Vec::new();
        s.read_to_end(&mut out).await.ok()?;
        let text = String::from_utf8_lossy(&out).into_owned();
        text.split_whitespace().nth(1)?.parse().ok()
    };
    tokio::time::timeout(Duration::from_secs(1), ask)
        .await
        .ok()?
}

/// The attack: `n` keep-alive clients, each sending `GET /healthz` every 4 s on its
/// connection (and reconnecting when it is closed), until `stop`.
fn keep_alive_attackers(
    admin: SocketAddr,
    n: usize,
    stop: tokio_util::sync::CancellationToken,
) -> Vec<tokio::task::JoinHandle<()>> {
    (0..n)
        .map(|_| {
            let stop = stop.clone();
            tokio::spawn(async move {
                while !stop.is_cancelled() {
                    let Ok(mut s) = TcpStream::connect(admin).await else {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    };
                    let mut buf = [0u8; 1024];
                    loop {
                        let req = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n";
                        if s.write_all(req).await.is_err() {
                            break;
                        }
                        // Its answer (or the close), then the pause.
                        match tokio::time::timeout(Duration::from_secs(2), s.read(&mut buf)).await {
                            Ok(Ok(n)) if n > 0 => {}
                            _ => break,
                        }
                        tokio::select! {
                            _ = stop.cancelled() => return,
                            _ = tokio::time::sleep(Duration::from_secs(4)) => {}
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            })
        })
        .collect()
}

/// Issue 30, item 3, the case as written: 64 keep-alive connections each sending `GET
/// /healthz` every 4 s hold every place under `max_connections` (64; the per-peer cap set as
/// high, so that only the health lane can help), and 30 of 30 kubelet-style probes got 503.
/// Now every probe of `/healthz` and `/readyz` is answered 200 within its 1 s, while other
/// routes past the cap still get 503.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_is_answered_while_keep_alive_clients_hold_the_cap() {
    let fake = FakeMongos::start().await;
    let p = proxy(&fake, |c| {
        c.admin_limits.max_connections_per_peer = 64;
    })
    .await;
    let admin = admin(&p);
    let stop = tokio_util::sync::CancellationToken::new();
    let attackers = keep_alive_attackers(admin, 64, stop.clone());
    // Every place taken: the attackers' connections are served.
    let mut full = false;
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        if hits(&p, "admin_max_connections") > 0
            || get_raw_status(admin, "/metrics").await == Some(503)
        {
            full = true;
            break;
        }
    }
    assert!(full, "the attackers never filled the cap");
    let mut statuses = Vec::new();
    for i in 0..30 {
        let path = if i % 3 == 2 { "/readyz" } else { "/healthz" };
        let started = Instant::now();
        let status = probe(admin, path).await;
        statuses.push((path, status, started.elapsed()));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let answered = statuses.iter().filter(|(_, s, _)| *s == Some(200)).count();
    let slowest = statuses
        .iter()
        .map(|(_, _, t)| *t)
        .max()
        .unwrap_or_default();
    println!("kubelet-style probes answered 200: {answered} of 30, slowest {slowest:?}");
    assert_eq!(answered, 30, "{statuses:?}");
    // The cap still holds for everything else.
    assert_eq!(get_raw_status(admin, "/metrics").await, Some(503));
    assert!(hits(&p, "admin_max_connections") >= 30);
    stop.cancel();
    for a in attackers {
        let _ = a.await;
    }
    p.shutdown().await;
}

/// `GET path` on a new connection, whatever it is answered (none when nothing came).
async fn get_raw_status(admin: SocketAddr, path: &str) -> Option<u16> {
    let ask = async {
        let mut s = TcpStream::connect(admin).await.ok()?;
        let req = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        s.write_all(req.as_bytes()).await.ok()?;
        let mut out = Vec::new();
        s.read_to_end(&mut out).await.ok()?;
        String::from_utf8_lossy(&out)
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()
    };
    tokio::time::timeout(Duration::from_secs(3), ask)
        .await
        .ok()?
}

/// Issue 30, item 3: connections that send nothing, opened without pause (hundreds at once,
/// more as the lane pushes them out), cannot keep the probes out of the health lane either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_is_answered_through_a_flood_of_silent_connections() {
    let fake = FakeMongos::start().await;
    let p = proxy(&fake, |c| {
        c.admin_limits.max_connections = 4;
        c.admin_limits.header_read_timeout = Duration::from_secs(60);
    })
    .await;
    let admin = admin(&p);
    let stop = tokio_util::sync::CancellationToken::new();
    let flooding = {
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut held = std::collections::VecDeque::new();
            let mut opened = 0u64;
            while !stop.is_cancelled() {
                if let Ok(s) = TcpStream::connect(admin).await {
                    opened += 1;
                    held.push_back(s);
                }
                if held.len() > 400 {
                    held.pop_front();
                }
                tokio::task::yield_now().await;
            }
            opened
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut answered = 0;
    for _ in 0..20 {
        if probe(admin, "/healthz").await == Some(200) {
            answered += 1;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.cancel();
    let opened = flooding.await.expect("flood");
    println!("probes answered through the flood: {answered} of 20 ({opened} silent connections)");
    assert_eq!(answered, 20);
    assert!(opened > 100, "{opened}");
    assert!(
        hits(&p, "admin_health_lane") > 0,
        "the lane pushed some out"
    );
    p.shutdown().await;
}

/// Issue 30, item 3: one address (here 127.0.0.2) holds at most `max_connections_per_peer`
/// admin connections, so a scrape from another address is served while it holds them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_peer_holds_at_most_its_share_of_the_admin_cap() {
    let fake = FakeMongos::start().await;
    let p = proxy(&fake, |c| {
        c.admin_limits.max_connections = 8;
        c.admin_limits.max_connections_per_peer = 4;
        c.admin_limits.header_read_timeout = Duration::from_secs(60);
    })
    .await;
    let admin = admin(&p);
    let m = p.shared().metrics.render();
    assert!(
        m.contains("staleguard_limit_setting{limit=\"admin_max_connections_per_peer\"} 4"),
        "{m}"
    );
    let mut held = Vec::new();
    for _ in 0..8 {
        let socket = TcpSocket::new_v4().expect("socket");
        socket
            .bind("127.0.0.2:0".parse().expect("addr"))
            .expect("bind 127.0.0.2");
        held.push(socket.connect(admin).await.expect("connect"));
    }
    // The four past its share wait in the health lane for a head, then get 503.
    let answers = futures::future::join_all(held.drain(4..).map(|mut s| async move {
        let mut buf = [0u8; 64];
        let n = tokio::time::timeout(Duration::from_secs(3), s.read(&mut buf))
            .await
            .ok()
            .and_then(Result::ok)
            .unwrap_or(0);
        buf[..n].starts_with(b"HTTP/1.1 503")
    }))
    .await;
    assert!(answers.iter().all(|&r| r), "{answers:?}");
    assert_eq!(hits(&p, "admin_max_connections_per_peer"), 4);
    // Another address is served a route the lane would refuse.
    let r = get(admin, "/metrics", &[]).await;
    assert_eq!(r.status, 200);
    drop(held);
    p.shutdown().await;
}
