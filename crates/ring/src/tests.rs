//! The ring's streams against plain tokio sockets on loopback, on a runtime set up as a
//! session thread's is (`on_thread_park` hands submissions over, one driver task).

use std::sync::Mutex;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::driver::{RECV_LIMIT, RING};
use crate::{live, park, start, stop, Live, RingStream};

/// The counts are the process's: one test at a time.
static SERIAL: Mutex<()> = Mutex::new(());

/// How a test's ring receives.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Receives {
    /// Multishot, with the limit (this kernel).
    Multishot,
    /// One-shot, as on a kernel that refused the limit.
    OneShot,
    /// Multishot first, refused by the kernel (`Driver::refused`): the ring falls back.
    Refused,
}

/// Runs `f` on a current-thread runtime with a ring, then tears both down; three times, for
/// each kind of [`Receives`].
fn on_ring<F: std::future::Future<Output = ()>>(f: impl Fn() -> F) {
    for receives in [Receives::Multishot, Receives::OneShot, Receives::Refused] {
        on_ring_with(receives, &f);
    }
}

/// [`on_ring`] for one kind of receives; whether the ring's receives ended up one-shot.
fn on_ring_with<F: std::future::Future<Output = ()>>(
    receives: Receives,
    f: impl Fn() -> F,
) -> bool {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .on_thread_park(park)
        .build()
        .expect("runtime");
    let one_shot = rt.block_on(async {
        let driver = start().expect("io_uring available");
        RING.with(|r| {
            let mut r = r.borrow_mut();
            let d = r.as_mut().expect("a ring");
            let one_shot = receives == Receives::OneShot;
            (d.counts.one_shot).store(one_shot, std::sync::atomic::Ordering::Relaxed);
            d.refused = receives == Receives::Refused;
        });
        tokio::spawn(driver);
        f().await;
        RING.with(|r| r.borrow().as_ref().expect("a ring").one_shot())
    });
    drop(rt);
    stop();
    one_shot
}

/// A connected pair: (ours on the ring, the peer as a plain tokio socket).
async fn pair() -> (RingStream, TcpStream) {
    let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let peer = TcpStream::connect(l.local_addr().expect("addr"));
    let (peer, accepted) = tokio::join!(peer, l.accept());
    let ours = accepted.expect("accept").0.into_std().expect("std");
    (
        RingStream::new(ours).expect("onto the ring"),
        peer.expect("connect"),
    )
}

/// Puts a receive in flight on `s`: a read given 1 ms, before anything was sent. Whether
/// it timed out (nothing had arrived).
async fn arm_receive(s: &mut RingStream) -> bool {
    let mut b = [0u8; 1];
    tokio::time::timeout(Duration::from_millis(1), s.read(&mut b))
        .await
        .is_err()
}

/// `len` bytes of a pattern that shows bytes lost or reordered.
fn patterned(len: u32) -> Vec<u8> {
    (0..len).map(|i| (i % 251) as u8).collect()
}

/// Waits (bounded) until nothing is open on any ring.
async fn drained() {
    for _ in 0..200 {
        if live() == (Live { sockets: 0, ops: 0 }) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("ring not drained: {:?}", live());
}

#[test]
fn echoes_both_ways_and_reports_eof() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    on_ring(|| async {
        let (mut ours, mut peer) = pair().await;
        let (mut r, mut w) = ours.split();
        w.write_all(b"hello").await.expect("write");
        w.flush().await.expect("flush");
        let mut got = [0u8; 5];
        peer.read_exact(&mut got).await.expect("peer reads");
        assert_eq!(&got, b"hello");
        peer.write_all(b"world!").await.expect("peer writes");
        let mut got = [0u8; 6];
        r.read_exact(&mut got).await.expect("read");
        assert_eq!(&got, b"world!");
        // The peer closes: end of stream, then our shutdown reaches it.
        peer.shutdown().await.expect("peer shutdown");
        let mut rest = Vec::new();
        assert_eq!(r.read_to_end(&mut rest).await.expect("eof"), 0);
        w.shutdown().await.expect("shutdown");
        assert_eq!(peer.read(&mut [0u8; 1]).await.expect("peer eof"), 0);
        drop(ours);
        drained().await;
    });
}

/// 40 MB each way at once: write-behind is bounded, reads go through the shared buffers.
#[test]
fn large_transfers_both_ways() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    on_ring(|| async {
        let (mut ours, peer) = pair().await;
        let data: Vec<u8> = (0..40_000_000u32)
            .map(|i| (i * 7 + i / 997) as u8)
            .collect();
        let (mut pr, mut pw) = peer.into_split();
        let sent = data.clone();
        let peer_side = tokio::spawn(async move {
            let w = async {
                pw.write_all(&sent).await.expect("peer writes");
                pw.shutdown().await.expect("peer shutdown");
            };
            let r = async {
                let mut got = Vec::new();
                pr.read_to_end(&mut got).await.expect("peer reads");
                got
            };
            tokio::join!(w, r).1
        });
        let (mut r, mut w) = ours.split();
        let write = async {
            for chunk in data.chunks(1 << 20) {
                w.write_all(chunk).await.expect("write");
            }
            w.shutdown().await.expect("shutdown");
        };
        let read = async {
            let mut got = Vec::new();
            r.read_to_end(&mut got).await.expect("read");
            got
        };
        let ((), got) = tokio::join!(write, read);
        assert!(got == data, "40 MB came in changed");
        assert!(
            peer_side.await.expect("peer") == data,
            "40 MB went out changed"
        );
        drop(ours);
        drained().await;
    });
}

/// Streams dropped with a receive in flight and with sends the peer does not take: every
/// operation is cancelled, every slot freed, every fd closed (the peer sees the close).
#[test]
fn dropped_with_operations_in_flight_drains() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    on_ring(|| async {
        let mut peers = Vec::new();
        for i in 0..50 {
            let (mut ours, peer) = pair().await;
            // A receive in flight.
            assert!(arm_receive(&mut ours).await);
            let (_, mut w) = ours.split();
            if i % 2 == 0 {
                // Sends the peer never reads: more than the socket buffers hold.
                let big = vec![1u8; 4 << 20];
                let _ = tokio::time::timeout(Duration::from_millis(50), w.write_all(&big)).await;
            }
            drop(ours);
            peers.push(peer);
        }
        drained().await;
        for mut p in peers {
            let mut sink = Vec::new();
            // Each closed: the peer reads whatever was taken, then the end.
            tokio::time::timeout(Duration::from_secs(5), p.read_to_end(&mut sink))
                .await
                .expect("closed")
                .ok();
        }
    });
}

/// More connections than the thread has receive buffers (256) receive bytes their sessions
/// never read: another connection's receive is still answered at once. (Before the driver
/// copied a receive out of the shared buffer, each such socket held one, and the 257th
/// receive on the thread waited for a buffer that never came back.)
#[test]
fn stalled_readers_do_not_starve_the_others() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    on_ring(|| async {
        let mut stalled = Vec::new();
        for _ in 0..270 {
            let (mut ours, mut peer) = pair().await;
            // A receive in flight, then never read again.
            arm_receive(&mut ours).await;
            peer.write_all(&[7u8; 1000]).await.expect("peer writes");
            stalled.push((ours, peer));
        }
        // Their receives complete (the thread parks and reaps).
        tokio::time::sleep(Duration::from_millis(200)).await;
        let (mut ours, mut peer) = pair().await;
        let (mut r, _) = ours.split();
        peer.write_all(b"ping").await.expect("peer writes");
        let mut got = [0u8; 4];
        tokio::time::timeout(Duration::from_secs(2), r.read_exact(&mut got))
            .await
            .expect("a receive starved by connections that do not read")
            .expect("read");
        assert_eq!(&got, b"ping");
        drop(ours);
        drop(stalled);
        drained().await;
    });
}

/// A peer that sends far more than its session reads: the socket's multishot receive ends
/// at its limit, so the rest waits in the kernel (TCP's flow control), and every byte still
/// arrives, in order, once the session reads again.
#[test]
fn an_unread_inbox_is_bounded() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    on_ring(|| async {
        let (mut ours, peer) = pair().await;
        let data = patterned(16_000_000);
        // A receive armed, then nothing read for a while.
        arm_receive(&mut ours).await;
        let (mut r, _) = ours.split();
        let sent = data.clone();
        let (_pr, mut pw) = peer.into_split();
        let writer = tokio::spawn(async move {
            pw.write_all(&sent).await.expect("peer writes");
            pw.shutdown().await.expect("peer shutdown");
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        let held = held();
        assert!(held > 0, "nothing received");
        assert!(
            held <= RECV_LIMIT + crate::bufs::SIZE,
            "an unread socket held {held} bytes (limit {RECV_LIMIT})"
        );
        let mut got = Vec::new();
        r.read_to_end(&mut got).await.expect("read");
        writer.await.expect("writer");
        assert!(
            got == data,
            "bytes lost or out of order ({} read)",
            got.len()
        );
        drop(ours);
        drained().await;
    });
}

/// A socket whose writes were all taken by the kernel keeps no send buffer, however much
/// it sent while a send was in flight (those bytes queue behind it; the buffer that went
/// out must not stay on as the next queue).
#[test]
fn a_socket_done_sending_keeps_no_send_buffer() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    on_ring(|| async {
        let (mut ours, peer) = pair().await;
        let data = patterned(8_000_000);
        let (mut pr, _pw) = peer.into_split();
        let reader = tokio::spawn(async move {
            let mut got = vec![0u8; 8_000_000];
            pr.read_exact(&mut got).await.expect("peer reads");
            got
        });
        // Writes of 100 KB, most of them made while a send is in flight.
        for c in data.chunks(100_000) {
            ours.write_all(c).await.expect("write");
        }
        let got = reader.await.expect("reader");
        assert!(got == data, "bytes lost or out of order");
        let kept = || {
            RING.with(|r| {
                let r = r.borrow();
                let d = r.as_ref().expect("a ring");
                let (_, s) = d.socks.iter().next().expect("our socket");
                (s.send, s.out.capacity() + s.queued.capacity())
            })
        };
        // The last send's completion may still be on its way.
        for _ in 0..100 {
            if !kept().0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(kept(), (false, 0), "(send in flight, send buffers kept)");
        drop(ours);
        drained().await;
    });
}

/// Bytes arrive on more sockets at once than the ring has buffers: the receives that found
/// none end (`ENOBUFS`), are counted, and are armed again once the reap has given the
/// buffers back, so every byte still arrives, in order. (Without the re-arm those sockets
/// would never receive again.)
#[test]
fn receives_that_find_no_buffer_are_armed_again() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let starved = || crate::stats().map_or(0, |s| s.starved);
    let before = starved();
    crate::driver::BUFFERS.with(|b| b.set(2));
    on_ring(|| async {
        let mut pairs = Vec::new();
        for _ in 0..16 {
            pairs.push(pair().await);
        }
        // Each socket's receive in flight.
        for (ours, _) in &mut pairs {
            arm_receive(ours).await;
        }
        // Every peer writes before this thread reaps: the receives the kernel runs on the
        // way back from those writes have two buffers between them.
        let msg = patterned(20_000);
        for (_, peer) in &mut pairs {
            peer.write_all(&msg).await.expect("peer writes");
        }
        for (ours, _) in &mut pairs {
            let mut got = vec![0u8; msg.len()];
            tokio::time::timeout(Duration::from_secs(5), ours.read_exact(&mut got))
                .await
                .expect("a receive that found no buffer was not armed again")
                .expect("read");
            assert!(got == msg, "bytes lost or out of order");
        }
        drop(pairs);
        drained().await;
    });
    crate::driver::BUFFERS.with(|b| b.set(crate::bufs::COUNT));
    assert!(
        starved() >= before + 3,
        "receives went without a buffer {} times: the test did not starve the ring",
        starved() - before
    );
}

/// Bytes received and not yet read, over every socket of this thread's ring.
fn held() -> usize {
    RING.with(|r| {
        let r = r.borrow();
        let d = r.as_ref().expect("a ring");
        d.socks.iter().map(|(_, s)| s.inbox.len() - s.taken).sum()
    })
}

/// A kernel that refuses the multishot receive's limit: the first receive fails, the ring
/// turns to one-shot receives and asks again, and no byte is lost; with the limit, the
/// ring keeps multishot receives.
#[test]
fn a_refused_limit_turns_the_ring_to_one_shot_receives() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let exchange = || async {
        let (mut ours, mut peer) = pair().await;
        let (mut r, _) = ours.split();
        peer.write_all(b"first").await.expect("peer writes");
        let mut got = [0u8; 5];
        r.read_exact(&mut got).await.expect("read");
        assert_eq!(&got, b"first");
        drop(ours);
        drained().await;
    };
    let refused = || async {
        exchange().await;
        // The metrics say so.
        let st = crate::stats().expect("a ring");
        assert_eq!((st.multishot, st.one_shot), (0, 1), "{st:?}");
    };
    assert!(on_ring_with(Receives::Refused, refused), "still multishot");
    let st = crate::stats().expect("rings were set up");
    assert_eq!(
        (st.multishot, st.one_shot),
        (0, 0),
        "a stopped ring counted: {st:?}"
    );
    assert!(
        !on_ring_with(Receives::Multishot, exchange),
        "one-shot without a refusal"
    );
}

/// A socket shut down by the peer while we write: the error comes back, not a hang.
#[test]
fn write_error_surfaces() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    on_ring(|| async {
        let (mut ours, peer) = pair().await;
        drop(peer);
        let (_, mut w) = ours.split();
        let mut failed = false;
        for _ in 0..100 {
            if w.write_all(&[0u8; 64 * 1024]).await.is_err() || w.flush().await.is_err() {
                failed = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert!(failed, "writing to a closed peer never failed");
        drop(ours);
        drained().await;
    });
}

#[test]
fn off_ring_threads_are_refused() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let s = std::net::TcpStream::connect(l.local_addr().expect("addr")).expect("connect");
    assert!(RingStream::new(s).is_err(), "no ring on this thread");
}
