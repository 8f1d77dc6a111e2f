//! The orphan scan against the relay of the same reply (issue 31 item 4).
//!
//! `cargo bench -p staleguard-wire --bench orphan_scan` (`-- --quick` for a short run).
//!
//! Three threads in one process, joined by two loopback TCP connections:
//! "mongos" (the main thread) writes a canned cursor reply, the relay thread reads it with
//! the proxy's own upstream framing ([`StreamCodec::replies`], 64 KiB pieces) on a
//! current-thread tokio runtime and writes it to the client connection, the client thread
//! reads it all and says so; then the next reply. The relay runs each reply in one of two
//! modes, alternated in blocks:
//!
//! - **relay**: what staleguard does with a reply nothing inspects: a large one goes on in
//!   pieces as they arrive, a small one whole;
//! - **relay + scan**: what it does with the reply to a read it rewrote to `available`: a
//!   reply over 1 MiB goes on in pieces, each fed to a [`StreamScan`] counting duplicate
//!   `_id`s (at most [`ORPHAN_SCAN_CAP`] documents examined); one of at most 1 MiB is read
//!   whole and counted by [`Reply::status_and_duplicates`] before it goes on.
//!
//! The relay thread's CPU time (user + system, as `getrusage(RUSAGE_THREAD)` counts it; see
//! [`thread_cpu`]) from the end of one reply to the end of the next is that reply's cost:
//! the socket reads and writes (the kernel's copies), the framing, the runtime's wake-ups,
//! and in the second mode the scan. The ratio printed is (relay + scan) / relay, medians of
//! the per-block means. The scans are also timed alone over the same bytes, many times over
//! (a streamed one fed each piece just after copying it, as a read leaves it, the copies
//! taken off), for a figure the machine's load moves less.

use std::hint::black_box;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{mpsc, Arc};
use std::thread;

use bson::oid::ObjectId;
use bson::{rawdoc, RawArrayBuf, RawBsonRef, RawDocumentBuf};
use bytes::Bytes;
use futures::StreamExt;
use staleguard_wire::dupids::{IdSet, ORPHAN_SCAN_CAP};
use staleguard_wire::replies::PIECE_ROOM;
use staleguard_wire::{reply, Incoming, Reply, StreamCodec, StreamScan};
use tokio::io::AsyncWriteExt;
use tokio_util::codec::FramedRead;

const MAX: usize = staleguard_wire::DEFAULT_MAX_MESSAGE_SIZE;
/// The proxy's thresholds (`src/session/relay.rs`, `src/session/arrival.rs`).
const STREAM_ABOVE: usize = 64 * 1024;
const JUDGE_WHOLE: usize = 1024 * 1024;

const RELAY: u8 = 0;
const SCAN: u8 = 1;

/// One reply of the runs, with what its scan must find.
struct Case {
    name: String,
    msg: Bytes,
    docs: usize,
    /// Duplicates among the first `cap` documents, counted here with a `HashSet`.
    want: u32,
}

/// A cursor reply of `n` documents `{_id, qty}`; every `orphan_every`-th document repeats
/// the `_id` of the one 50 before it.
fn case(name: &str, n: usize, oid: bool, orphan_every: Option<usize>) -> Case {
    let mut arr = RawArrayBuf::new();
    let id_of = |i: usize| -> RawDocumentBuf {
        if oid {
            let mut b = [0u8; 12];
            b[..4].copy_from_slice(&0x6500_0000u32.to_be_bytes());
            b[4..].copy_from_slice(&(i as u64).wrapping_mul(0x9e37_79b9).to_be_bytes());
            rawdoc! {"_id": ObjectId::from_bytes(b), "qty": (i % 1000) as i32}
        } else {
            rawdoc! {"_id": i as i32, "qty": (i % 1000) as i32}
        }
    };
    for i in 0..n {
        let repeat = orphan_every.is_some_and(|k| i % k == k - 1 && i >= 50);
        arr.push(id_of(if repeat { i - 50 } else { i }));
    }
    let body = rawdoc! {
        "cursor": {"firstBatch": arr, "id": 0_i64, "ns": "demo.store_inventory"},
        "ok": 1.0,
    };
    let msg = reply::op_msg(7, 3, 0, &body);
    let want = reference_count(&body, ORPHAN_SCAN_CAP);
    Case {
        name: name.to_string(),
        msg,
        docs: n,
        want,
    }
}

/// Duplicates among the first `cap` documents' `_id`s, by the bson crate and a `HashSet`.
fn reference_count(body: &RawDocumentBuf, cap: usize) -> u32 {
    let batch = body
        .get_document("cursor")
        .and_then(|c| c.get_array("firstBatch"))
        .expect("a batch");
    let mut seen = std::collections::HashSet::new();
    let mut dups = 0;
    for doc in batch.into_iter().take(cap) {
        let Ok(RawBsonRef::Document(d)) = doc else {
            continue;
        };
        let id = match d.get("_id").expect("readable") {
            Some(RawBsonRef::ObjectId(o)) => o.bytes().to_vec(),
            Some(RawBsonRef::Int32(i)) => i.to_le_bytes().to_vec(),
            _ => continue,
        };
        if !seen.insert(id) {
            dups += 1;
        }
    }
    dups
}

/// This thread's CPU time so far, user and system, in nanoseconds: the scheduler's count
/// that `getrusage(RUSAGE_THREAD)` reports, read with `CLOCK_THREAD_CPUTIME_ID`, which
/// brings it up to date first (getrusage's figure lags by the time run since the thread
/// last slept or the last tick: a whole small reply here).
fn thread_cpu() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the struct it is given.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime");
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// One reply's cost on the relay thread.
#[derive(Clone, Copy)]
struct Cost {
    mode: u8,
    ns: u64,
}

/// The relay: what staleguard's session does with each reply, in the mode `mode` says at
/// the reply's head. Returns the cost of every reply once the upstream closes.
fn relay(upstream: TcpStream, client: TcpStream, mode: Arc<AtomicU8>, want: u32) -> Vec<Cost> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .expect("runtime");
    rt.block_on(async move {
        upstream.set_nonblocking(true).expect("nonblocking");
        client.set_nonblocking(true).expect("nonblocking");
        let up = tokio::net::TcpStream::from_std(upstream).expect("tokio stream");
        let mut down = tokio::net::TcpStream::from_std(client).expect("tokio stream");
        let mut frames = FramedRead::with_capacity(
            up,
            StreamCodec::replies(MAX, STREAM_ABOVE),
            staleguard_wire::codec::SMALL_ROOM,
        );
        let mut costs = Vec::new();
        let mut ids = IdSet::default();
        let mut stream: Option<StreamScan> = None;
        let mut current = RELAY;
        let mut last = thread_cpu();
        let done = |current: u8, last: &mut u64, costs: &mut Vec<Cost>| {
            let now = thread_cpu();
            costs.push(Cost {
                mode: current,
                ns: now - *last,
            });
            *last = now;
        };
        while let Some(item) = frames.next().await {
            match item.expect("framing") {
                Incoming::Large(head) => {
                    current = mode.load(Ordering::SeqCst);
                    let whole = current == SCAN && head.header.length as usize <= JUDGE_WHOLE;
                    if current == SCAN && !whole {
                        stream = Some(StreamScan::new(MAX, Some(ORPHAN_SCAN_CAP)));
                    }
                    frames.decoder_mut().stream(!whole);
                }
                Incoming::Piece(bytes) => {
                    if let Some(s) = stream.as_mut() {
                        s.feed(&bytes);
                    }
                    down.write_all(&bytes).await.expect("write");
                }
                Incoming::Last { bytes, .. } => {
                    if let Some(mut s) = stream.take() {
                        s.feed(&bytes);
                        let (status, dups) = s.finish().expect("readable");
                        assert!(status.ok);
                        assert_eq!(dups.expect("counted").duplicates, want);
                    }
                    down.write_all(&bytes).await.expect("write");
                    done(current, &mut last, &mut costs);
                }
                Incoming::Message(msg) => {
                    if msg.len() <= STREAM_ABOVE {
                        // Not offered as large: its mode is read now.
                        current = mode.load(Ordering::SeqCst);
                    }
                    let reply = Reply::new(msg);
                    if current == SCAN {
                        let (status, dups) = reply
                            .status_and_duplicates(MAX, &mut ids, ORPHAN_SCAN_CAP)
                            .expect("readable");
                        assert!(status.ok);
                        assert_eq!(dups.expect("counted").duplicates, want);
                    }
                    down.write_all(reply.frame()).await.expect("write");
                    done(current, &mut last, &mut costs);
                }
            }
        }
        costs
    })
}

fn pair() -> (TcpStream, TcpStream) {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let a = TcpStream::connect(l.local_addr().expect("addr")).expect("connect");
    let (b, _) = l.accept().expect("accept");
    a.set_nodelay(true).expect("nodelay");
    b.set_nodelay(true).expect("nodelay");
    (a, b)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Microseconds per reply in `mode`: the median of the blocks' means.
fn per_reply(costs: &[Cost], block: usize, mode: u8) -> f64 {
    median(
        costs
            .chunks(block)
            .filter(|c| c.len() == block && c[0].mode == mode)
            .map(|b| b.iter().map(|c| c.ns).sum::<u64>() as f64 / b.len() as f64 / 1000.0)
            .collect(),
    )
}

/// The relay runs of one case: `rounds` rounds of a block of each mode (their order
/// alternating), `block` replies each, after a block of warm-up. Returns µs per reply,
/// relayed and relayed + scanned.
fn relay_runs(case: &Case, rounds: usize, block: usize) -> (f64, f64) {
    let (mut to_proxy, from_mongos) = pair();
    let (to_client, mut client) = pair();
    let mode = Arc::new(AtomicU8::new(RELAY));
    let want = case.want;
    let relay_mode = mode.clone();
    let relayer = thread::spawn(move || relay(from_mongos, to_client, relay_mode, want));
    let (tx, rx) = mpsc::channel();
    let len = case.msg.len();
    let reader = thread::spawn(move || {
        let mut buf = vec![0u8; 256 * 1024];
        let room = buf.len();
        loop {
            let mut left = len;
            while left > 0 {
                match client.read(&mut buf[..left.min(room)]) {
                    Ok(0) | Err(_) => return,
                    Ok(n) => left -= n,
                }
            }
            if tx.send(()).is_err() {
                return;
            }
        }
    });
    let mut send = |m: u8| {
        mode.store(m, Ordering::SeqCst);
        to_proxy.write_all(&case.msg).expect("mongos write");
        rx.recv().expect("client read");
    };
    for _ in 0..block {
        send(RELAY);
    }
    for r in 0..rounds {
        let order = if r % 2 == 0 {
            [RELAY, SCAN]
        } else {
            [SCAN, RELAY]
        };
        for m in order {
            for _ in 0..block {
                send(m);
            }
        }
    }
    drop(to_proxy);
    let costs = relayer.join().expect("relay thread");
    reader.join().expect("client thread");
    let costs = &costs[block..];
    (
        per_reply(costs, block, RELAY),
        per_reply(costs, block, SCAN),
    )
}

/// µs of this thread's CPU per call of `f`, the median of `rounds` timings of `iters` calls.
fn timed(rounds: usize, iters: usize, mut f: impl FnMut()) -> f64 {
    f();
    median(
        (0..rounds)
            .map(|_| {
                let a = thread_cpu();
                for _ in 0..iters {
                    f();
                }
                (thread_cpu() - a) as f64 / iters as f64 / 1000.0
            })
            .collect(),
    )
}

/// The scans alone over `case`'s bytes: the whole-message count, and the stream scan fed
/// pieces of [`PIECE_ROOM`] bytes, each just copied (as the relay's read leaves it in the
/// cache); with the proxy's cap and with every document examined.
fn scan_alone(case: &Case, rounds: usize, iters: usize) -> [f64; 4] {
    let mut ids = IdSet::default();
    let reply = Reply::new(case.msg.clone());
    let mut whole = |cap: usize| {
        let want = (cap == ORPHAN_SCAN_CAP).then_some(case.want);
        timed(rounds, iters, || {
            let (_, d) = reply
                .status_and_duplicates(MAX, &mut ids, cap)
                .expect("readable");
            let d = d.expect("counted");
            assert!(want.is_none_or(|w| d.duplicates == w));
        })
    };
    let (w_cap, w_all) = (whole(ORPHAN_SCAN_CAP), whole(usize::MAX));
    // Each piece is copied to where the relay reads it before it is fed, as a piece comes
    // warm from the socket's read; the copies alone are timed too and taken off.
    let mut piece = vec![0u8; PIECE_ROOM];
    let mut streamed = |cap: Option<usize>| {
        let want = (cap == Some(ORPHAN_SCAN_CAP)).then_some(case.want);
        timed(rounds, iters, || {
            let mut s = cap.map(|cap| StreamScan::new(MAX, Some(cap)));
            for p in case.msg.chunks(PIECE_ROOM) {
                piece[..p.len()].copy_from_slice(p);
                if let Some(s) = s.as_mut() {
                    s.feed(&piece[..p.len()]);
                }
            }
            if let Some(s) = s {
                let d = s.finish().expect("readable").1.expect("counted");
                assert!(want.is_none_or(|w| d.duplicates == w));
            }
            black_box(&piece);
        })
    };
    let copies = streamed(None);
    let s_cap = streamed(Some(ORPHAN_SCAN_CAP)) - copies;
    let s_all = streamed(Some(usize::MAX)) - copies;
    [w_cap, w_all, s_cap, s_all]
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick");
    // `cargo bench` passes `--bench`; a filter picks cases by name.
    let filter = args.iter().skip(1).find(|a| !a.starts_with("--")).cloned();
    let rounds = if quick { 3 } else { 9 };
    let cases = [
        case("100k int _id", 100_000, false, None),
        case("100k ObjectId", 100_000, true, None),
        case("100k ObjectId, 1 orphan/100", 100_000, true, Some(100)),
        case("1k ObjectId, 1 orphan/100", 1_000, true, Some(100)),
    ];
    println!(
        "orphan scan vs relay: cap {ORPHAN_SCAN_CAP} documents, {rounds} rounds of a block per mode, relay thread CPU per reply (CLOCK_THREAD_CPUTIME_ID)\n"
    );
    println!("| reply | bytes | relay µs | relay + scan µs | (relay + scan) / relay | scan alone µs: whole, whole all docs, stream, stream all docs | (relay + scan alone) / relay |");
    println!("|---|---:|---|---|---:|---|---:|");
    for c in &cases {
        if filter
            .as_ref()
            .is_some_and(|f| !c.name.contains(f.as_str()))
        {
            continue;
        }
        // About 2 million documents per block: 20 replies of 100,000, 2,000 of 1,000.
        let block = (2_000_000 / c.docs).clamp(10, 2000) / if quick { 4 } else { 1 };
        let (relay, scanned) = relay_runs(c, rounds, block);
        let iters = (2_000_000 / c.docs).clamp(5, 2000);
        let alone = scan_alone(c, rounds, if quick { iters / 4 + 1 } else { iters });
        // The scan the proxy runs on this reply: the stream scan above 1 MiB, else whole.
        let proxy_scan = if c.msg.len() > JUDGE_WHOLE {
            alone[2]
        } else {
            alone[0]
        };
        let f = |x: f64| {
            if x < 100.0 {
                format!("{x:.1}")
            } else {
                format!("{x:.0}")
            }
        };
        println!(
            "| {} ({} docs, {} dups counted) | {} | {} | {} | {:.2} | {}, {}, {}, {} | {:.2} |",
            c.name,
            c.docs,
            c.want,
            c.msg.len(),
            f(relay),
            f(scanned),
            scanned / relay,
            f(alone[0]),
            f(alone[1]),
            f(alone[2]),
            f(alone[3]),
            (relay + proxy_scan) / relay,
        );
    }
}
