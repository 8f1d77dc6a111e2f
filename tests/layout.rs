//! `layout`: with `per-core` (the default) and `uring` every session runs on a session
//! thread, one per core, and those threads end with the proxy; `shared` starts none. All
//! three relay for the official driver. `uring` (plain sockets on one io_uring per session
//! thread) is also driven through raw sockets: byte for byte, 40 MB each way, clients and
//! upstreams closing, many connections, the stop; after each, nothing is left on the rings
//! (`staleguard_ring::live`). Where the kernel refuses io_uring (a seccomp filter on the
//! binary), `uring` does not start.
//!
//! The tests of this file run one at a time (`SERIAL`): they count the process's session
//! threads and the sockets on its rings.

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use bson::{doc, rawdoc, Document, RawDocumentBuf};
use futures::TryStreamExt;
use staleguard::config::{Config, Layout};
use support::mongos::{known_round_trips, FakeMongos, Hooked};
use support::raw::{self, RawClient};
use support::within;

/// Held by each test for its whole run (a failed test releases it as it unwinds).
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// This process's session threads: (thread id, time run so far in ns).
fn session_threads() -> Vec<(String, u64)> {
    let mut out = Vec::new();
    for task in std::fs::read_dir("/proc/self/task").expect("/proc/self/task") {
        let dir = task.expect("task").path();
        let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
        if !comm.starts_with("sg-session-") {
            continue;
        }
        // The first field of schedstat: time spent on a CPU, in nanoseconds.
        let ran = std::fs::read_to_string(dir.join("schedstat"))
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse().ok())
            .unwrap_or(0);
        out.push((comm.trim().to_string(), ran));
    }
    out.sort();
    out
}

fn ran(threads: &[(String, u64)]) -> u64 {
    threads.iter().map(|t| t.1).sum()
}

/// Starts a proxy with `layout` in front of `fake`, runs 200 finds through the driver, and
/// returns the proxy.
async fn relay_finds(fake: &FakeMongos, layout: Layout) -> staleguard::server::Running {
    let mut cfg = Config::for_upstreams("127.0.0.1:0", vec![fake.addr().to_string()]);
    cfg.layout = layout;
    let proxy = staleguard::server::start(Arc::new(cfg))
        .await
        .expect("proxy starts");
    let uri = format!(
        "mongodb://{}/?directConnection=true&serverSelectionTimeoutMS=5000",
        proxy.local_addr()
    );
    let client = mongodb::Client::with_uri_str(uri).await.expect("driver");
    let coll = client.database("t").collection::<Document>(layout.name());
    coll.insert_many((0..5).map(|i| doc! {"_id": i}))
        .await
        .expect("insert through the proxy");
    for _ in 0..200 {
        let docs: Vec<Document> = within("find", async {
            coll.find(doc! {}).await.expect("find").try_collect().await
        })
        .await
        .expect("cursor");
        assert_eq!(docs.len(), 5);
    }
    client.shutdown().await;
    proxy
}

/// One test for the three layouts (and the others of this file wait, `SERIAL`), so that no
/// other proxy of this binary starts session threads while it counts them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_core_sessions_live_on_session_threads_that_end_with_the_proxy() {
    let _serial = SERIAL.lock().await;
    assert!(session_threads().is_empty(), "{:?}", session_threads());
    let fake = FakeMongos::start().await;
    for layout in [Layout::PerCore, Layout::Uring] {
        threads_end_with_the_proxy(&fake, layout).await;
    }
    let proxy = relay_finds(&fake, Layout::Shared).await;
    assert!(session_threads().is_empty(), "{:?}", session_threads());
    proxy.shutdown().await;
}

/// `layout`'s sessions run on its session threads, which end with the proxy.
async fn threads_end_with_the_proxy(fake: &FakeMongos, layout: Layout) {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let before = Instant::now();
    let proxy = relay_finds(fake, layout).await;
    let threads = session_threads();
    let names: Vec<String> = (0..cores).map(|i| format!("sg-session-{i}")).collect();
    assert_eq!(
        threads.iter().map(|t| t.0.clone()).collect::<Vec<_>>(),
        names
    );
    // The relay's work happened there: 200 round trips of reading, classifying and writing
    // take tens of milliseconds of those threads' time in a debug build; run elsewhere, the
    // same finds leave them under one (the accept loop and the upstreams are elsewhere).
    assert!(
        ran(&threads) > 5_000_000,
        "session threads ran {} ns in {:?}",
        ran(&threads),
        before.elapsed()
    );
    proxy.shutdown().await;
    threads_gone().await;
    assert_eq!(
        rings_hold(),
        (0, 0),
        "{layout:?}: sockets and operations left on rings"
    );
}

/// Waits (bounded) until the session threads have ended: they end, and stop their rings,
/// after the proxy's stop returns.
async fn threads_gone() {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !session_threads().is_empty() {
        assert!(
            Instant::now() < deadline,
            "session threads outlived the proxy: {:?}",
            session_threads()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Sockets open on the process's io_uring rings, and operations in flight.
fn rings_hold() -> (usize, usize) {
    let live = staleguard_ring::live();
    (live.sockets, live.ops)
}

/// Waits (bounded) until the rings hold `sockets` sockets.
async fn rings_settle(sockets: usize, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while rings_hold().0 != sockets {
        assert!(
            Instant::now() < deadline,
            "{what}: rings hold {:?}, expected {sockets} sockets",
            rings_hold()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A fake mongos with a `layout = "uring"` proxy in front of it.
async fn uring_proxy(
    config: impl FnOnce(&mut Config),
) -> (FakeMongos, staleguard::server::Running) {
    let fake = FakeMongos::start().await;
    let mut cfg = Config::for_upstreams("127.0.0.1:0", vec![fake.addr().to_string()]);
    cfg.layout = Layout::Uring;
    config(&mut cfg);
    let proxy = staleguard::server::start(Arc::new(cfg))
        .await
        .expect("proxy starts with io_uring");
    (fake, proxy)
}

/// Stops the proxy; then nothing is left on the rings, and its session threads are gone
/// (the next test counts them).
async fn stop(proxy: staleguard::server::Running) {
    within("stop", proxy.shutdown()).await;
    rings_settle(0, "after the stop").await;
    assert_eq!(rings_hold(), (0, 0));
    threads_gone().await;
}

fn ping(id: i32) -> bytes::Bytes {
    raw::msg(id, 0, &rawdoc! { "ping": 1, "$db": "admin" })
}

/// Known messages over one raw connection: the fake gets exactly these bytes and the client
/// exactly the bytes the fake sent, and both sockets of the pair are on the ring (as the
/// `staleguard_uring_*` metrics say, and the rings are no longer counted after the stop).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uring_relays_byte_for_byte() {
    let _serial = SERIAL.lock().await;
    let (fake, proxy) = uring_proxy(|_| {}).await;
    let mut conn = RawClient::connect(proxy.local_addr()).await;
    known_round_trips(&mut conn, &fake).await;
    assert_eq!(rings_hold().0, 2, "client and upstream sockets on the ring");
    // The metrics show the rings: one per session thread, multishot on this kernel.
    let text = proxy.shared().metrics.render();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    for line in [
        format!("staleguard_uring_rings{{receives=\"multishot\"}} {cores}"),
        "staleguard_uring_rings{receives=\"one_shot\"} 0".to_string(),
        "staleguard_uring_sockets 2".to_string(),
    ] {
        assert!(text.lines().any(|l| l == line), "no `{line}` in\n{text}");
    }
    assert!(
        text.lines()
            .any(|l| l.starts_with("staleguard_uring_receives_starved_total ")),
        "{text}"
    );
    drop(conn);
    rings_settle(0, "client gone").await;
    // Each session thread stops its ring before it ends (`stop` waits for that).
    stop(proxy).await;
    let st = staleguard_ring::stats().expect("rings were set up");
    assert_eq!(
        (st.multishot, st.one_shot),
        (0, 0),
        "rings counted after the stop"
    );
}

/// 40 MB to mongos (an insert's document sequence) and 40 MB back (a reply's body), both
/// byte for byte.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uring_relays_forty_megabytes_each_way() {
    let _serial = SERIAL.lock().await;
    let (fake, proxy) = uring_proxy(|_| {}).await;
    let blob = |seed: u32| -> Vec<u8> {
        (0..10_000_000u32)
            .map(|i| (i.wrapping_mul(2_654_435_761).wrapping_add(seed) >> 13) as u8)
            .collect()
    };
    let docs: Vec<RawDocumentBuf> = (0..4)
        .map(|i| rawdoc! { "_id": i, "blob": bson::Binary { subtype: bson::spec::BinarySubtype::Generic, bytes: blob(i as u32) } })
        .collect();
    let insert = raw::msg_with_sequence(
        1,
        0,
        &rawdoc! { "insert": "big", "$db": "app" },
        "documents",
        &docs,
    );
    assert!(insert.len() > 40_000_000);
    let mut conn = RawClient::connect(proxy.local_addr()).await;
    let reply = conn.roundtrip(&insert).await;
    assert_eq!(raw::body(&reply).get_i32("n").ok(), Some(4));
    assert!(
        fake.received()[0] == insert,
        "40 MB request changed on the way"
    );
    let body = rawdoc! { "ok": 1.0, "blob": bson::Binary { subtype: bson::spec::BinarySubtype::Generic, bytes: [blob(7), blob(8), blob(9), blob(10)].concat() } };
    fake.set_hook(move |cmd| {
        (cmd.get_str("find").ok() == Some("big")).then(|| Hooked::reply(body.clone()))
    });
    let big = conn
        .roundtrip(&raw::msg(2, 0, &rawdoc! { "find": "big", "$db": "app" }))
        .await;
    assert!(big.len() > 40_000_000, "{} bytes", big.len());
    assert!(fake.sent()[1] == big, "40 MB reply changed on the way");
    assert_eq!(raw::header(&conn.roundtrip(&ping(3)).await).response_to, 3);
    drop(conn);
    rings_settle(0, "client gone").await;
    stop(proxy).await;
}

/// A client that leaves halfway through a message, and an upstream that closes: each closes
/// only its own pair; a bystander goes on; nothing is left on the rings.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uring_closes_only_the_pair_that_ended() {
    let _serial = SERIAL.lock().await;
    let (fake, proxy) = uring_proxy(|_| {}).await;
    fake.set_hook(|cmd| (cmd.get_str("find").ok() == Some("doomed")).then(Hooked::close));
    let mut bystander = RawClient::connect(proxy.local_addr()).await;
    assert_eq!(
        raw::header(&bystander.roundtrip(&ping(1)).await).response_to,
        1
    );

    // Half a message, then gone (the pair exists: a first message dialed the upstream).
    let mut leaver = RawClient::connect(proxy.local_addr()).await;
    assert_eq!(
        raw::header(&leaver.roundtrip(&ping(5)).await).response_to,
        5
    );
    let half = raw::msg(
        6,
        0,
        &rawdoc! { "find": "c", "filter": { "x": "y".repeat(100_000) }, "$db": "app" },
    );
    leaver.send(&half[..half.len() / 2]).await;
    rings_settle(4, "two pairs").await;
    drop(leaver);
    rings_settle(2, "the leaver's pair closed").await;

    // The upstream closes: its client is closed, with no reply.
    let mut victim = RawClient::connect(proxy.local_addr()).await;
    victim
        .send(&raw::msg(9, 0, &rawdoc! { "find": "doomed", "$db": "app" }))
        .await;
    assert!(
        victim.expect_closed().await.is_empty(),
        "no reply, just a close"
    );
    rings_settle(2, "the victim's pair closed").await;

    assert_eq!(
        raw::header(&bystander.roundtrip(&ping(2)).await).response_to,
        2
    );
    drop(bystander);
    stop(proxy).await;
}

/// 400 connections opened, used and closed, 50 at a time: the rings end with nothing open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uring_many_connections_leave_nothing_behind() {
    let _serial = SERIAL.lock().await;
    let (fake, proxy) = uring_proxy(|_| {}).await;
    let addr = proxy.local_addr();
    for round in 0..8 {
        let clients = (0..50).map(|i| async move {
            let mut c = RawClient::connect(addr).await;
            let id = round * 100 + i;
            assert_eq!(raw::header(&c.roundtrip(&ping(id)).await).response_to, id);
        });
        futures::future::join_all(clients).await;
    }
    rings_settle(0, "every client gone").await;
    assert_eq!(rings_hold(), (0, 0));
    assert_eq!(fake.received().len(), 400);
    stop(proxy).await;
}

/// The stop: a request in flight is answered, then its connection closed; idle ones are
/// closed; the rings end empty.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uring_stop_drains_then_closes() {
    let _serial = SERIAL.lock().await;
    let (fake, proxy) = uring_proxy(|c| c.shutdown_timeout = Duration::from_secs(5)).await;
    fake.set_hook(|cmd| {
        (cmd.get_str("find").ok() == Some("slow"))
            .then(|| Hooked::delay(Duration::from_millis(300)))
    });
    let mut idle = RawClient::connect(proxy.local_addr()).await;
    assert_eq!(raw::header(&idle.roundtrip(&ping(1)).await).response_to, 1);
    let mut busy = RawClient::connect(proxy.local_addr()).await;
    busy.send(&raw::msg(2, 0, &rawdoc! { "find": "slow", "$db": "app" }))
        .await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    let stopping = tokio::spawn(proxy.shutdown());
    let answered = busy.expect_closed().await;
    assert_eq!(
        answered.len(),
        1,
        "the request in flight is answered before the close"
    );
    assert_eq!(raw::header(&answered[0]).response_to, 2);
    assert!(idle.expect_closed().await.is_empty());
    within("stop", stopping).await.expect("stopped");
    rings_settle(0, "after the stop").await;
    assert_eq!(rings_hold(), (0, 0));
}

/// Where io_uring is refused (a container's seccomp profile, as Docker's default one does,
/// or `kernel.io_uring_disabled`), `layout = "uring"` does not start: the process exits with
/// an error naming the key, and never listens. The proxy runs as a child whose seccomp
/// filter fails `io_uring_setup` with EPERM.
#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
#[test]
fn uring_refused_by_the_kernel_stops_the_start_naming_layout() {
    use std::os::unix::process::CommandExt;
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("uring.toml");
    let listen = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    let addr = listen.local_addr().expect("addr");
    drop(listen);
    std::fs::write(
        &path,
        format!("listen = \"{addr}\"\nupstreams = [\"127.0.0.1:9\"]\nlayout = \"uring\"\n"),
    )
    .expect("config");
    let filter = no_io_uring_filter();
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_staleguard"));
    cmd.args(["run", "--config"])
        .arg(&path)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    // SAFETY: between fork and exec the closure makes two `prctl` calls (async-signal-safe)
    // on a filter built before the fork.
    unsafe {
        cmd.pre_exec(move || {
            let prog = libc::sock_fprog {
                len: filter.len() as u16,
                filter: filter.as_ptr() as *mut libc::sock_filter,
            };
            if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
                || libc::prctl(
                    libc::PR_SET_SECCOMP,
                    libc::SECCOMP_MODE_FILTER,
                    &prog as *const libc::sock_fprog,
                ) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().expect("staleguard starts");
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the proxy did not exit with io_uring refused");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().expect("stderr"), &mut stderr)
        .expect("its stderr");
    println!("{status}: {stderr}");
    assert!(!status.success(), "it must not start: {stderr}");
    assert!(
        stderr.contains("layout = \"uring\"") && stderr.contains("io_uring"),
        "the error names the key and io_uring: {stderr}"
    );
    assert!(
        std::net::TcpStream::connect(addr).is_err(),
        "nothing listens on {addr}"
    );
}

/// A seccomp filter (x86_64) that fails `io_uring_setup` with EPERM and allows the rest.
#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
fn no_io_uring_filter() -> Vec<libc::sock_filter> {
    const AUDIT_ARCH_X86_64: u32 = 0xc000_003e;
    // `struct seccomp_data`: the syscall number at offset 0, the architecture at 4.
    let (nr, arch) = (0, 4);
    let stmt = |code: u32, k: u32| libc::sock_filter {
        code: code as u16,
        jt: 0,
        jf: 0,
        k,
    };
    let jeq = |k: u32, jt: u8, jf: u8| libc::sock_filter {
        code: (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16,
        jt,
        jf,
        k,
    };
    let load = libc::BPF_LD | libc::BPF_W | libc::BPF_ABS;
    let ret = libc::BPF_RET | libc::BPF_K;
    vec![
        stmt(load, arch),
        jeq(AUDIT_ARCH_X86_64, 1, 0),
        stmt(ret, libc::SECCOMP_RET_ALLOW),
        stmt(load, nr),
        jeq(libc::SYS_io_uring_setup as u32, 0, 1),
        stmt(ret, libc::SECCOMP_RET_ERRNO | libc::EPERM as u32),
        stmt(ret, libc::SECCOMP_RET_ALLOW),
    ]
}
