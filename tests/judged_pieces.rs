//! Issue 21: a reply of more than 1 MiB to a tracked read is not held whole to be judged; it
//! goes on to the client in pieces and is judged as it passes (`src/session/judging.rs`).
//! What a judgement needs still happens: the orphans of an `available` reply are counted,
//! the client gets mongos's bytes untouched, and the read's time is that of mongos's answer,
//! not of the client's reading (a client that takes a large reply slowly does not make its
//! read look slow). Raw clients through the proxy to the in-process fake mongos.

use crate::policy_support;
use crate::support;

use std::time::{Duration, Instant};

use bson::{rawdoc, spec::BinarySubtype, Binary, RawArrayBuf, RawDocumentBuf};
use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use policy_support::{Env, BASE_NAMESPACES};
use staleguard::breaker::State;
use support::mongos::Hooked;
use support::raw::{self, RawClient};

/// A cursor reply of `docs` documents of about 1 KiB each, the last `dups` of which repeat
/// the `_id`s of the first ones.
fn batch(ns: &str, docs: i32, dups: i32) -> RawDocumentBuf {
    let mut arr = RawArrayBuf::new();
    for i in 0..docs {
        let id = if i >= docs - dups {
            i - (docs - dups)
        } else {
            i
        };
        let pad = Binary {
            subtype: BinarySubtype::Generic,
            bytes: vec![(i % 251) as u8; 1000],
        };
        arr.push(rawdoc! {"_id": format!("doc-{id}"), "pad": pad});
    }
    rawdoc! {
        "cursor": {"firstBatch": arr, "id": 0_i64, "ns": ns},
        "ok": 1.0,
    }
}

fn find(id: i32, db: &str, coll: &str) -> Bytes {
    raw::msg(
        id,
        0,
        &rawdoc! {
            "find": coll,
            "filter": {},
            "$readPreference": {"mode": "secondary"},
            "$db": db,
        },
    )
}

/// The value of the metric line starting with `prefix` (0 when absent).
fn metric(env: &Env, prefix: &str) -> f64 {
    let m = env.proxy.shared().metrics.render();
    m.lines()
        .find_map(|l| l.strip_prefix(prefix))
        .map_or(0.0, |v| v.trim().parse().expect("a number"))
}

/// Waits (up to 5 s, the batched metrics reach the registry within a second) for the metric
/// to read `want`.
async fn metric_reaches(env: &Env, prefix: &str, want: f64) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let got = metric(env, prefix);
        if got == want {
            return;
        }
        assert!(Instant::now() < deadline, "{prefix}: {got}, want {want}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A stale secondary, then the `available` resend answered with a 2 MB batch holding three
/// documents twice: the client gets that reply byte for byte (streamed, not held), and the
/// three orphans are counted, as for a reply judged whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_available_reply_over_1_mib_is_counted_for_orphans_as_it_passes() {
    let env = Env::start(BASE_NAMESPACES).await;
    env.fake.set_hook(|body| {
        body.get_str("find").ok()?;
        if body.get_document("readConcern").is_ok() {
            return Some(Hooked::reply(batch("demo.store_inventory", 2000, 3)));
        }
        Some(Hooked::error(13388, "StaleConfig", "shard version not ok"))
    });
    let mut c = RawClient::connect(env.proxy_addr()).await;
    let got = c.roundtrip(&find(7, "demo", "store_inventory")).await;
    assert!(got.len() > 2_000_000, "{}", got.len());
    let sent = env.fake.sent();
    assert_eq!(&got, sent.last().unwrap(), "the reply as mongos sent it");
    assert_eq!(raw::header(&got).response_to, 7);
    let orphans = "staleguard_orphans_estimated_total{namespace=\"demo.store_inventory\"} ";
    metric_reaches(&env, orphans, 3.0).await;
    // The same pair again on the same connection: counted again, no more.
    let again = c.roundtrip(&find(8, "demo", "store_inventory")).await;
    assert_eq!(raw::header(&again).response_to, 8);
    metric_reaches(&env, orphans, 6.0).await;
}

/// `slow_read` 300 ms on `pay.*`: an 8 MB reply mongos sends at once, taken by its client
/// over about three seconds (its last piece leaves the proxy only once the client has taken
/// what the sockets cannot hold, up to 4 MiB here), is not a slow read (no confirming read goes out, no trigger
/// error); a small reply mongos sends after 600 ms is one (the control: a confirming read
/// goes out).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_taking_a_large_reply_slowly_does_not_make_its_read_slow() {
    let namespaces = r#"
[[namespaces]]
pattern = "pay.*"
mode = "strict"
on_open = "refuse"
slow_read = "300ms"
threshold = 3
window = "10s"
cooldown = "30s"
min_cooldown = "30s"
min_connections = 1
per_connection = 1000
min_wait = "0s"
"#;
    let env = Env::start(namespaces).await;
    env.fake.set_hook(|body| {
        let coll = body.get_str("find").ok()?;
        // The confirming read (`limit: 1`) is answered as a fake would, quickly.
        if body.get_i64("limit").is_ok() || body.get_i32("limit").is_ok() {
            return Some(Hooked::reply(batch("pay.x", 1, 0)));
        }
        Some(match coll {
            "big" => Hooked::reply(batch("pay.big", 8000, 0)),
            _ => Hooked::reply(batch("pay.late", 1, 0)).after(Duration::from_millis(600)),
        })
    });
    let finds = |env: &Env| {
        env.fake
            .received_commands()
            .iter()
            .filter(|(name, _)| name == "find")
            .count()
    };

    // A reader with a small receive buffer taking 128 KiB every 50 ms: about 3.2 s.
    let mut s = slow_client(env.proxy_addr()).await;
    s.write_all(&find(1, "pay", "big")).await.unwrap();
    let started = Instant::now();
    let len = read_slowly(&mut s).await;
    let took = started.elapsed();
    assert!(
        len > 8_000_000 && took > Duration::from_millis(2000),
        "{len} bytes in {took:?}"
    );
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        finds(&env),
        1,
        "no confirming read for a reply taken slowly"
    );
    let confirmed = "staleguard_confirm_reads_total{result=\"confirmed\"} ";
    assert_eq!(metric(&env, confirmed), 0.0);

    // The control: mongos itself answers late.
    let mut c = RawClient::connect(env.proxy_addr()).await;
    let late = c.roundtrip(&find(2, "pay", "late")).await;
    assert_eq!(raw::header(&late).response_to, 2);
    let deadline = Instant::now() + Duration::from_secs(5);
    while finds(&env) < 3 {
        assert!(
            Instant::now() < deadline,
            "a slow answer from mongos is confirmed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn find_marked(id: i32, marker: &str) -> Bytes {
    raw::msg(
        id,
        0,
        &rawdoc! {
            "find": "store_inventory",
            "filter": {"marker": marker},
            "$readPreference": {"mode": "secondary"},
            "$db": "demo",
        },
    )
}

/// A client with a small fixed receive buffer (16 KiB): what it does not take waits in the
/// proxy's socket and then in mongos's.
async fn slow_client(addr: std::net::SocketAddr) -> tokio::net::TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(16 * 1024).unwrap();
    socket.connect(addr).await.unwrap()
}

/// Takes one reply off `s` at about 2.5 MB/s (128 KiB every 50 ms); its length.
async fn read_slowly(s: &mut tokio::net::TcpStream) -> usize {
    let mut head = [0u8; 4];
    s.read_exact(&mut head).await.unwrap();
    let len = i32::from_le_bytes(head) as usize;
    let mut left = len - 4;
    let mut buf = vec![0u8; 128 * 1024];
    while left > 0 {
        let n = left.min(buf.len());
        s.read_exact(&mut buf[..n]).await.unwrap();
        left -= n;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    len
}

/// An open fallback breaker lets one probe through at a time. A probe whose 8 MB answer its
/// client takes slowly gives the probe back when mongos's answer starts (its outcome counts
/// at the end): another client's read meanwhile is the next probe, sent as the client sent
/// it, not rewritten to `available` for as long as the slow client reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_probe_taken_slowly_does_not_hold_the_next_probe_back() {
    let namespaces = r#"
[[namespaces]]
pattern = "demo.store_inventory"
mode = "fallback"
threshold = 3
window = "10s"
cooldown = "30s"
min_cooldown = "200ms"
min_connections = 1
per_connection = 1000
min_wait = "0s"
"#;
    let env = Env::start(namespaces).await;
    env.fake.set_hook(|body| {
        body.get_str("find").ok()?;
        if body.get_document("readConcern").is_ok() {
            return Some(Hooked::reply(batch("demo.store_inventory", 1, 0)));
        }
        let filter = body.get_document("filter").ok()?;
        Some(match filter.get_str("marker").unwrap_or("") {
            "stale" => Hooked::error(13388, "StaleConfig", "shard version not ok"),
            "big" => Hooked::reply(batch("demo.store_inventory", 8000, 0)),
            _ => Hooked::reply(batch("demo.store_inventory", 1, 0)),
        })
    });
    let mut c = RawClient::connect(env.proxy_addr()).await;
    for id in 1..=3 {
        c.roundtrip(&find_marked(id, "stale")).await;
    }
    env.wait_state("demo.store_inventory", State::Open).await;
    tokio::time::sleep(Duration::from_millis(400)).await;

    let mut slow = slow_client(env.proxy_addr()).await;
    slow.write_all(&find_marked(10, "big")).await.unwrap();
    let reader = tokio::spawn(async move { read_slowly(&mut slow).await });
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert!(!reader.is_finished(), "the slow client is still reading");
    // Another client's read, while the probe's answer is still on its way.
    let mut other = RawClient::connect(env.proxy_addr()).await;
    let got = other.roundtrip(&find_marked(11, "after")).await;
    assert_eq!(raw::header(&got).response_to, 11);
    assert!(!reader.is_finished(), "the slow client is still reading");
    let after: Vec<_> = env
        .fake
        .received_commands()
        .into_iter()
        .filter(|(_, b)| {
            b.get_document("filter")
                .ok()
                .and_then(|f| f.get_str("marker").ok())
                == Some("after")
        })
        .collect();
    assert_eq!(after.len(), 1, "one read: {after:?}");
    assert!(
        after[0].1.get_document("readConcern").is_err(),
        "sent as a probe, not rewritten: {:?}",
        after[0].1
    );
    assert!(reader.await.unwrap() > 8_000_000);
}

/// A cursor reply of `docs` documents of 1 KiB of bytes that do not compress.
fn incompressible_batch(ns: &str, docs: i32) -> RawDocumentBuf {
    let mut arr = RawArrayBuf::new();
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for i in 0..docs {
        let bytes = (0..1000)
            .map(|_| {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                (x >> 56) as u8
            })
            .collect();
        let pad = Binary {
            subtype: BinarySubtype::Generic,
            bytes,
        };
        arr.push(rawdoc! {"_id": i, "pad": pad});
    }
    rawdoc! {
        "cursor": {"firstBatch": arr, "id": 0_i64, "ns": ns},
        "ok": 1.0,
    }
}

/// A compressed reply over 1 MiB cannot be read in pieces: it goes to its client byte for
/// byte and is not judged (the read is not counted as answered), where the same reply
/// uncompressed is; the connection goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compressed_reply_over_1_mib_is_relayed_untouched_and_not_judged() {
    let env = Env::start(BASE_NAMESPACES).await;
    env.fake.set_hook(|body| {
        body.get_str("find").ok()?;
        Some(Hooked::reply(incompressible_batch("pay.big", 2000)))
    });
    let answered = "staleguard_reads_answered_total{namespace=\"pay.big\"} ";
    let mut c = RawClient::connect(env.proxy_addr()).await;
    let plain = c.roundtrip(&find(1, "pay", "big")).await;
    assert!(plain.len() > 2_000_000);
    metric_reaches(&env, answered, 1.0).await;

    // zlib (compressor id 2): the fake answers compressed, still over 1 MiB.
    let zlib = support::mongos::wrap_compressed(2, &find(2, "pay", "big"));
    let got = c.roundtrip(&zlib).await;
    assert_eq!(
        raw::header(&got).op_code,
        staleguard::wire::OpCode::COMPRESSED
    );
    assert!(got.len() > 2_000_000, "{}", got.len());
    assert_eq!(&got, env.fake.sent().last().unwrap(), "as mongos sent it");
    let ping = c
        .roundtrip(&raw::msg(3, 0, &rawdoc! {"ping": 1, "$db": "admin"}))
        .await;
    assert_eq!(raw::header(&ping).response_to, 3);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        metric(&env, answered),
        1.0,
        "the compressed reply was not judged"
    );
}
