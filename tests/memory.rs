//! Issue 21, item 1: memory a connection keeps after a large message, and what a client that
//! does not read its replies can make the proxy hold. The proxy runs as its own process (its
//! VmRSS is what is measured) in front of an upstream in this test that answers each request
//! with a reply of the size it asks for.
//!
//! The proxy runs with `MALLOC_MMAP_THRESHOLD_=65536`: glibc then serves every allocation of
//! 64 KiB and more with its own mapping and unmaps it when freed, so VmRSS shows what the
//! proxy holds rather than what the allocator keeps cached after a burst (that cache is
//! shared by all connections and bounded by the peak, not kept per connection; the figures
//! with glibc's default are printed by `cargo test --test it memory:: -- --nocapture` too).
//! `MEMORY_TEST_BIN=path` runs the same measurements on another build of the proxy.
//!
//! Each bound is also checked on `layout = "uring"` (the tests ending `_on_uring`; Linux),
//! after each session thread's receive buffers and spare send buffers, which are the
//! thread's and not a client's, have been made resident (`Proxy::warm_rings`, and a first
//! set of pairs for the idle-pair count).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bson::{rawdoc, spec::BinarySubtype, Binary, RawDocumentBuf};
use bytes::Bytes;
use futures::StreamExt;
use staleguard::wire::reply::op_msg;
use staleguard::wire::{Header, MessageCodec, OpCode, HEADER_LEN};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::codec::FramedRead;

/// Answers each OP_MSG with `{ok: 1, pad: <binary>}` of about `reply` bytes (the request's
/// `reply` field; a small reply without it).
async fn sized_upstream() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            tokio::spawn(async move {
                let (r, mut w) = s.into_split();
                let mut frames = FramedRead::new(r, MessageCodec::trusting(48_000_000));
                while let Some(Ok(m)) = frames.next().await {
                    let h = Header::parse(&m).unwrap();
                    if h.op_code != OpCode::MSG {
                        continue;
                    }
                    let body = bson::RawDocument::from_bytes(&m[HEADER_LEN + 5..]).unwrap();
                    let size = body.get_i64("reply").unwrap_or(0).max(0) as usize;
                    let pad = Binary {
                        subtype: BinarySubtype::Generic,
                        bytes: vec![7; size],
                    };
                    let out = op_msg(1, h.request_id, 0, &rawdoc! {"ok": 1.0, "pad": pad});
                    if w.write_all(&out).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

/// A command of about `size` bytes asking for a reply of `reply` bytes.
fn request(id: i32, size: usize, reply: i64) -> Bytes {
    let pad = Binary {
        subtype: BinarySubtype::Generic,
        bytes: vec![1; size],
    };
    let body: RawDocumentBuf = rawdoc! {"ping": 1, "reply": reply, "pad": pad, "$db": "admin"};
    op_msg(id, 0, 0, &body)
}

/// What a test's `extra` config says to run on io_uring.
const URING: &str = "layout = \"uring\"";

struct Proxy {
    child: std::process::Child,
    addr: String,
    admin: String,
    _dir: tempfile::TempDir,
}

impl Proxy {
    async fn start(upstream: SocketAddr, extra: &str, malloc_default: bool) -> Proxy {
        let free = || std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let (a, b) = (free(), free());
        let (port, admin_port) = (
            a.local_addr().unwrap().port(),
            b.local_addr().unwrap().port(),
        );
        drop((a, b));
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("memory.toml");
        std::fs::write(
            &path,
            format!(
                "listen = \"127.0.0.1:{port}\"\nupstreams = [\"{upstream}\"]\nhealth_interval = \"off\"\n{extra}\n[admin]\nlisten = \"127.0.0.1:{admin_port}\"\n"
            ),
        )
        .unwrap();
        // `MEMORY_TEST_BIN` measures another build (an older one, a release build).
        let bin = std::env::var("MEMORY_TEST_BIN")
            .unwrap_or_else(|_| env!("CARGO_BIN_EXE_staleguard").to_string());
        let mut cmd = std::process::Command::new(bin);
        cmd.args(["run", "--config"])
            .arg(&path)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
        if !malloc_default {
            cmd.env("MALLOC_MMAP_THRESHOLD_", "65536");
        }
        let child = cmd.spawn().expect("the proxy runs");
        let addr = format!("127.0.0.1:{port}");
        for _ in 0..200 {
            if TcpStream::connect(&addr).await.is_ok() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        let proxy = Proxy {
            child,
            addr,
            admin: format!("127.0.0.1:{admin_port}"),
            _dir: dir,
        };
        if extra.contains(URING) {
            proxy.warm_rings().await;
        }
        proxy
    }

    /// `layout = "uring"`: each session thread's receive buffers (256 of 32 KiB, shared by
    /// its connections) become resident as they are used; they are the thread's, not a
    /// client's. So that RSS shows what clients make the proxy hold, a client on each
    /// thread (connections go to the threads in turn) sends a 9 MB write first, which
    /// passes through every buffer of its thread's ring, and leaves.
    async fn warm_rings(&self) {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let mut warm = Vec::new();
        for _ in 0..cores {
            warm.push(TcpStream::connect(&self.addr).await.unwrap());
        }
        let pad = Binary {
            subtype: BinarySubtype::Generic,
            bytes: vec![1; 9_000_000],
        };
        let insert = rawdoc! {"insert": "w", "documents": [{"pad": pad}], "$db": "warm"};
        let insert = op_msg(1, 0, 0, &insert);
        for s in warm.iter_mut() {
            s.write_all(&insert).await.unwrap();
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    fn rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("VmRSS")
    }

    async fn metrics(&self) -> String {
        let mut s = TcpStream::connect(&self.admin).await.unwrap();
        s.write_all(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        out
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Sends `msg` and reads one whole reply.
async fn round_trip(s: &mut TcpStream, msg: &[u8]) -> usize {
    s.write_all(msg).await.unwrap();
    let mut head = [0u8; 4];
    s.read_exact(&mut head).await.unwrap();
    let len = i32::from_le_bytes(head) as usize;
    let mut rest = vec![0u8; len - 4];
    s.read_exact(&mut rest).await.unwrap();
    len
}

/// Idle pairs after large messages both ways cost what idle pairs after small ones cost.
async fn idle_pairs_after_large_messages(malloc_default: bool, extra: &str) -> (f64, f64) {
    let upstream = sized_upstream().await;
    let proxy = Proxy::start(upstream, extra, malloc_default).await;
    if extra.contains(URING) {
        // Each session thread keeps up to 64 spare send buffers of up to 64 KiB (4 MiB)
        // besides its receive buffers: the thread's, not a pair's. A first set of pairs
        // carries the same messages and leaves before the count starts.
        let _ = pairs_carrying_large_messages(&proxy).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let idle = proxy.rss_kib();
    let (small, large) = pairs_carrying_large_messages(&proxy).await;
    let per = |rss: u64| rss.saturating_sub(idle) as f64 / PAIRS as f64;
    println!(
        "{extra} malloc {}: idle {idle} KiB; {PAIRS} pairs after small messages {small} KiB ({:.1} KiB per pair); after 1 MB both ways and one 40 MB ping {large} KiB ({:.1} KiB per pair)",
        if malloc_default { "default" } else { "mmap threshold 64 KiB" },
        per(small),
        per(large)
    );
    (per(small), per(large))
}

const PAIRS: usize = 128;

/// `PAIRS` connections carry a small round trip each, then a 1 MB request and a 1 MB reply
/// and a small round trip each, and one of them the 40 MB ping (and a 16 MB reply);
/// the proxy's RSS after the small messages and after the large ones, each half a second
/// after the last (the connections stay open until then, and close on return).
async fn pairs_carrying_large_messages(proxy: &Proxy) -> (u64, u64) {
    let mut conns = Vec::new();
    for i in 0..PAIRS {
        let mut s = TcpStream::connect(&proxy.addr).await.unwrap();
        round_trip(&mut s, &request(i as i32, 10, 10)).await;
        conns.push(s);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let small = proxy.rss_kib();
    for (i, s) in conns.iter_mut().enumerate() {
        let n = round_trip(s, &request(100 + i as i32, 1_000_000, 1_000_000)).await;
        assert!(n > 1_000_000);
        round_trip(s, &request(200 + i as i32, 10, 10)).await;
    }
    round_trip(&mut conns[0], &request(300, 40_000_000, 16_000_000)).await;
    round_trip(&mut conns[0], &request(301, 10, 10)).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    (small, proxy.rss_kib())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_pair_keeps_at_most_64_kib_after_any_message() {
    let (small, large) = idle_pairs_after_large_messages(false, "").await;
    // Before the change each pair kept about 2 MiB here (the 1 MB request and reply).
    assert!(
        large <= 64.0,
        "{large:.1} KiB per idle pair after large messages ({small:.1} KiB after small ones)"
    );
    // With glibc's defaults, printed for the record (its cache is not per connection).
    idle_pairs_after_large_messages(true, "").await;
}

/// The same on `layout = "uring"`: a socket whose bytes were all read keeps no receive
/// buffer, and its writes leave nothing behind once the kernel has taken them.
#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_pair_keeps_at_most_64_kib_after_any_message_on_uring() {
    let (small, large) = idle_pairs_after_large_messages(false, URING).await;
    assert!(
        large <= 64.0,
        "{large:.1} KiB per idle pair after large messages ({small:.1} KiB after small ones)"
    );
}

/// Clients that never read their reply (`request(i)` asks each for a 16 MB one): at most
/// 1 MiB of RSS each while held (issue 21's bound is 8 MiB), and every one closed at
/// `write_timeout` (2 s), before its whole reply, counted in `limit_hits_total`.
async fn non_readers_cost_little_and_are_closed(
    proxy: &Proxy,
    what: &str,
    request: impl Fn(usize) -> Bytes,
) {
    const CLIENTS: usize = 12;
    let before = proxy.rss_kib();
    let mut conns = Vec::new();
    for i in 0..CLIENTS {
        // A fixed small receive buffer (no autotuning): the kernel takes little of the
        // reply off the proxy, as with a client far away or one whose buffer is full.
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.set_recv_buffer_size(64 * 1024).unwrap();
        let mut s = socket.connect(proxy.addr.parse().unwrap()).await.unwrap();
        s.write_all(&request(i)).await.unwrap();
        conns.push(s);
    }
    let started = Instant::now();
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let held = proxy.rss_kib().saturating_sub(before) / CLIENTS as u64;
    println!("{held} KiB per client that does not read {what}");
    assert!(held <= 8 * 1024, "{held} KiB per client");
    // Far below: about the outbox bound and one read buffer (and a judging scan's few
    // bytes), not the reply.
    assert!(held <= 1024, "{held} KiB per client");
    // Closed after write_timeout (checked on a tick of a quarter of it, so within 2.5 s of
    // the last byte taken): reading then finds what the sockets held, and the end.
    tokio::time::sleep_until((started + Duration::from_millis(3500)).into()).await;
    for s in conns.iter_mut() {
        let mut got = 0usize;
        let mut buf = vec![0u8; 1 << 16];
        let end = loop {
            match tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf)).await {
                Ok(Ok(0)) | Ok(Err(_)) => break true,
                Ok(Ok(n)) => got += n,
                Err(_) => break false,
            }
        };
        assert!(end, "closed by the proxy");
        assert!(got < 16_000_000, "the reply was cut ({got} bytes)");
    }
    let metrics = proxy.metrics().await;
    let line = format!("staleguard_limit_hits_total{{limit=\"write_timeout\"}} {CLIENTS}");
    assert!(metrics.contains(&line), "{metrics}");
}

/// Clients that send a request for a 16 MB reply and never read: the proxy stops reading
/// mongos once a little is queued for each (the rest stays in mongos's socket), and closes
/// them after `write_timeout`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_does_not_read_costs_little_and_is_closed() {
    let upstream = sized_upstream().await;
    let proxy = Proxy::start(upstream, "write_timeout = \"2s\"", false).await;
    let what = "a 16 MB reply";
    non_readers_cost_little_and_are_closed(&proxy, what, |i| request(i as i32, 10, 16_000_000))
        .await;
    // A client that reads gets the whole reply.
    let mut s = TcpStream::connect(&proxy.addr).await.unwrap();
    let n = round_trip(&mut s, &request(99, 10, 16_000_000)).await;
    assert!(n > 16_000_000);
}

/// The same on `layout = "uring"`: the upstream socket's receive stays armed across
/// messages, but ends at its limit (32 KiB) once the session stops reading, so the reply
/// still waits in mongos's socket, not in the proxy. Each session thread's receive buffers
/// are made resident first ([`Proxy::warm_rings`]): they are the thread's, not the
/// clients'.
#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_does_not_read_costs_little_and_is_closed_on_uring() {
    let upstream = sized_upstream().await;
    let extra = "layout = \"uring\"\nwrite_timeout = \"2s\"";
    let proxy = Proxy::start(upstream, extra, false).await;
    non_readers_cost_little_and_are_closed(&proxy, "a 16 MB reply (uring)", |i| {
        request(i as i32, 10, 16_000_000)
    })
    .await;
    let mut s = TcpStream::connect(&proxy.addr).await.unwrap();
    let n = round_trip(&mut s, &request(99, 10, 16_000_000)).await;
    assert!(n > 16_000_000);
}

/// A command on `pay.tx` asking for a reply of `reply` bytes: a secondary `find` (a tracked
/// read of a strict namespace) or an `insert` (a write the stall watch follows). Both
/// replies are judged; a large one is judged in pieces as it passes.
fn judged_request(id: i32, write: bool, reply: i64) -> Bytes {
    let body: RawDocumentBuf = if write {
        rawdoc! {"insert": "tx", "documents": [{"a": 1}], "reply": reply, "$db": "pay"}
    } else {
        rawdoc! {
            "find": "tx", "filter": {}, "reply": reply, "$db": "pay",
            "$readPreference": {"mode": "secondaryPreferred"},
        }
    };
    op_msg(id, 0, 0, &body)
}

/// Clients that never read a 16 MB reply to a tracked read or a followed write: the reply is
/// judged in pieces as it passes, so it waits in mongos's socket, not in the proxy (issue
/// 21's bound: at most 8 MiB each), and they are closed after `write_timeout`. A client that
/// reads gets the whole reply byte for byte, and it is judged: a read answered, a write
/// completed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_does_not_read_a_judged_reply_costs_little_and_is_closed() {
    judged_replies_not_read("").await;
}

/// The same on `layout = "uring"`.
#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_does_not_read_a_judged_reply_costs_little_and_is_closed_on_uring() {
    judged_replies_not_read(URING).await;
}

async fn judged_replies_not_read(layout: &str) {
    let upstream = sized_upstream().await;
    let extra = format!(
        "{layout}\nwrite_timeout = \"2s\"\n[[namespaces]]\npattern = \"pay.*\"\nmode = \"strict\"\n"
    );
    let proxy = Proxy::start(upstream, &extra, false).await;
    non_readers_cost_little_and_are_closed(&proxy, "a judged 16 MB reply", |i| {
        judged_request(i as i32 + 1, i % 2 == 0, 16_000_000)
    })
    .await;
    // Clients that read get the whole reply, as mongos sent it, and it is judged.
    for (id, write) in [(101, false), (102, true)] {
        let mut s = TcpStream::connect(&proxy.addr).await.unwrap();
        s.write_all(&judged_request(id, write, 16_000_000))
            .await
            .unwrap();
        let mut head = [0u8; 16];
        s.read_exact(&mut head).await.unwrap();
        let len = i32::from_le_bytes(head[..4].try_into().unwrap()) as usize;
        let mut rest = vec![0u8; len - 16];
        s.read_exact(&mut rest).await.unwrap();
        let pad = Binary {
            subtype: BinarySubtype::Generic,
            bytes: vec![7; 16_000_000],
        };
        let sent = op_msg(1, id, 0, &rawdoc! {"ok": 1.0, "pad": pad});
        assert_eq!(&head[..], &sent[..16], "header as mongos sent it");
        assert!(rest[..] == sent[16..], "body as mongos sent it");
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let metrics = proxy.metrics().await;
        let answered = metrics.lines().any(|l| {
            l.starts_with("staleguard_reads_answered_total{")
                && l.contains("pay.tx")
                && !l.ends_with(" 0")
        });
        let completed = metrics.lines().any(|l| {
            l.starts_with("staleguard_write_replies_total{")
                && l.contains("completed")
                && !l.ends_with(" 0")
        });
        if answered && completed {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "judged: read answered {answered}, write completed {completed}\n{metrics}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A mongos that reads each connection's first message and then nothing more, as one
/// serving an awaitable `hello` (it would answer after `maxAwaitTimeMS`); it holds the
/// connection a minute.
async fn deaf_upstream() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            tokio::spawn(async move {
                let (r, _w) = s.into_split();
                let mut frames = FramedRead::new(r, MessageCodec::trusting(48_000_000));
                let _hello = frames.next().await;
                tokio::time::sleep(Duration::from_secs(60)).await;
            });
        }
    });
    addr
}

/// An awaitable `hello` (mongos answers it after 30 s, reading nothing meanwhile).
fn awaitable_hello(id: i32) -> Bytes {
    let body = rawdoc! {
        "hello": 1,
        "topologyVersion": {"processId": bson::oid::ObjectId::new(), "counter": 0_i64},
        "maxAwaitTimeMS": 30_000_i64,
        "$db": "admin",
    };
    op_msg(id, 0, 0, &body)
}

/// What the proxy's `/metrics` says for one sample line (0 when absent).
fn sample(metrics: &str, name: &str) -> f64 {
    metrics
        .lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| l.strip_prefix(name))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

/// Issue 30's attack: `CLIENTS` clients each send an awaitable `hello` then one 40 MB
/// `ping`, to a mongos that reads nothing while it serves the `hello`. Checks what each
/// bound promises: the RSS the proxy gains for all of them while they wait stays within
/// `max_held` KiB; every session ends, within `write_timeout` (2 s, a tick more) of mongos
/// taking nothing (`upstream_write_timeout`), its client gone or not; the memory goes back.
async fn hello_then_large_ping(proxy: &Proxy, max_held: u64) {
    const CLIENTS: usize = 8;
    let ping = request(1, 40_000_000, 0);
    let before = proxy.rss_kib();
    let mut senders = Vec::new();
    for _ in 0..CLIENTS {
        let mut s = TcpStream::connect(&proxy.addr).await.unwrap();
        let ping = ping.clone();
        senders.push(tokio::spawn(async move {
            s.write_all(&awaitable_hello(2)).await.unwrap();
            // Blocks once the proxy stops taking it; fails once the proxy closes.
            let _ = s.write_all(&ping).await;
        }));
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let held = proxy.rss_kib().saturating_sub(before);
    // The clients go away (their sockets still hold what they could not send).
    for s in &senders {
        s.abort();
    }
    let metrics = proxy.metrics().await;
    println!(
        "{} KiB per attacking client while held (RSS {before} KiB before, limit hits: \
         upstream_write_timeout {}, held_for_upstream {})",
        held / CLIENTS as u64,
        sample(
            &metrics,
            "staleguard_limit_hits_total{limit=\"upstream_write_timeout\"}"
        ),
        sample(
            &metrics,
            "staleguard_limit_hits_total{limit=\"held_for_upstream\"}"
        ),
    );
    assert!(held <= max_held, "{held} KiB held for {CLIENTS} clients");
    // Every session ends: those sending in pieces when mongos has taken nothing for
    // write_timeout, those waiting for the budget when the one holding it ends (or at
    // message_timeout).
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let m = proxy.metrics().await;
        if sample(&m, "staleguard_client_connections") == 0.0 {
            break;
        }
        assert!(Instant::now() < deadline, "sessions still open:\n{m}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let m = proxy.metrics().await;
    assert!(
        sample(
            &m,
            "staleguard_limit_hits_total{limit=\"upstream_write_timeout\"}"
        ) >= 1.0,
        "{m}"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after = proxy.rss_kib();
    println!("RSS {after} KiB after the attack ({before} KiB before)");
    assert!(
        after <= before + 8 * 1024,
        "{after} KiB after, {before} KiB before"
    );
}

/// Requests no policy needs whole go to mongos in pieces: a mongos that reads nothing
/// leaves them in the client's socket, not in the proxy (the issue measured 38 MiB per
/// client, held for the `hello`'s whole wait and after the clients left).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mongos_that_reads_nothing_holds_nothing_of_a_streamed_request() {
    let upstream = deaf_upstream().await;
    let proxy = Proxy::start(upstream, "write_timeout = \"2s\"", false).await;
    // At most 1 MiB each.
    hello_then_large_ping(&proxy, 8 * 1024).await;
}

/// The same on `layout = "uring"` (each socket's inbox holds at most 64 KiB; a write may
/// leave 256 KiB not yet taken by the kernel).
#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mongos_that_reads_nothing_holds_nothing_of_a_streamed_request_on_uring() {
    let upstream = deaf_upstream().await;
    let extra = format!("{URING}\nwrite_timeout = \"2s\"");
    let proxy = Proxy::start(upstream, &extra, false).await;
    hello_then_large_ping(&proxy, 8 * 1024).await;
}

/// Requests a policy may need whole (any command but a write, once a namespace is
/// governed) are held whole only within the proxy's budget of bytes held for mongos
/// (64 MiB for every session together); the others wait unread.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_held_whole_for_mongos_stay_within_the_budget() {
    held_whole_within_the_budget("").await;
}

/// The same on `layout = "uring"`, whose receives take at most 32 KiB at a time (a request
/// held whole grew its buffer at each of them, copying it whole: reading a 40 MB one took
/// seconds).
#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_held_whole_for_mongos_stay_within_the_budget_on_uring() {
    held_whole_within_the_budget(URING).await;
}

async fn held_whole_within_the_budget(layout: &str) {
    let upstream = deaf_upstream().await;
    let governed = format!("{layout}\nwrite_timeout = \"2s\"\nmessage_timeout = \"3s\"\n[[namespaces]]\npattern = \"demo.inventory\"\nmode = \"fallback\"\n");
    let proxy = Proxy::start(upstream, &governed, false).await;
    // At most the 64 MiB budget and a little per client (the issue measured 315 MiB).
    hello_then_large_ping(&proxy, 72 * 1024).await;
    let m = proxy.metrics().await;
    assert!(
        sample(
            &m,
            "staleguard_limit_hits_total{limit=\"held_for_upstream\"}"
        ) >= 1.0,
        "{m}"
    );
}
