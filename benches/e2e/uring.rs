//! An io_uring floor (role `forwarder-uring`, target `floor-uring`): what a relay costs when
//! its sockets are driven by io_uring instead of epoll. One thread per core, each with its own ring
//! (single issuer, deferred task work), accepting on the shared listener; each connection
//! pair stays on the thread that accepted it. Per direction: one `recv` into an 8 KiB
//! buffer, then `send` of what came until all of it is sent, then the next `recv`. All
//! submissions and completions of a loop turn go through one `io_uring_enter`.
//!
//! It parses nothing. Set against the epoll floors (`floor`, `floor-percore`), it shows how
//! much an io_uring data path under staleguard could save, before anyone builds one.

use std::net::{TcpListener, TcpStream};
use std::os::fd::{AsRawFd, IntoRawFd, RawFd};

use io_uring::{opcode, squeue, types, IoUring};

const BUF: usize = 8 * 1024;
const ACCEPT: u64 = u64::MAX;

/// One direction: reads from `from`, writes to `to`.
struct Half {
    from: RawFd,
    to: RawFd,
    buf: Box<[u8; BUF]>,
    /// Bytes received and not yet sent: `buf[sent..filled]`.
    filled: usize,
    sent: usize,
    /// An operation of this half is in the ring.
    busy: bool,
}

struct Pair {
    halves: [Half; 2],
    closing: bool,
}

pub fn run(args: &[String]) {
    let upstream = crate::forwarder::upstream_arg(args);
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let lfd = listener.as_raw_fd();
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    // Each ring is made on its own thread (a single-issuer ring belongs to the thread that
    // made it); the address is announced only once every ring exists, so a machine without
    // io_uring makes the harness skip this target with the reason.
    let (made, rings_made) = std::sync::mpsc::channel();
    let workers: Vec<_> = (0..threads)
        .map(|_| {
            let (upstream, made) = (upstream.clone(), made.clone());
            std::thread::spawn(move || {
                let ring = IoUring::builder()
                    .setup_single_issuer()
                    .setup_defer_taskrun()
                    .build(4096)
                    .or_else(|_| IoUring::new(4096));
                match ring {
                    Ok(ring) => {
                        let _ = made.send(Ok(()));
                        worker(ring, lfd, &upstream);
                    }
                    Err(e) => {
                        let _ = made.send(Err(e));
                    }
                }
            })
        })
        .collect();
    for _ in 0..threads {
        if let Ok(Err(e)) | Err(e) = rings_made.recv().map_err(std::io::Error::other) {
            eprintln!("forwarder-uring: no io_uring here: {e}");
            std::process::exit(1);
        }
    }
    crate::procs::announce(listener.local_addr().expect("addr"));
    for w in workers {
        let _ = w.join();
    }
    drop(listener);
}

fn key(slot: usize, half: usize) -> u64 {
    ((slot as u64) << 1) | half as u64
}

fn worker(mut ring: IoUring, lfd: RawFd, upstream: &str) {
    let mut pairs: Vec<Option<Pair>> = Vec::new();
    let mut free: Vec<usize> = Vec::new();
    let mut queue: Vec<squeue::Entry> = Vec::new();
    let accept = || {
        opcode::Accept::new(types::Fd(lfd), std::ptr::null_mut(), std::ptr::null_mut())
            .build()
            .user_data(ACCEPT)
    };
    queue.push(accept());
    loop {
        {
            let mut sq = ring.submission();
            for e in queue.drain(..) {
                // SAFETY: every buffer an entry points at lives in a boxed `Half` that is
                // freed only once no operation of its pair is in the ring.
                if unsafe { sq.push(&e) }.is_err() {
                    panic!("submission queue full");
                }
            }
        }
        if ring.submit_and_wait(1).is_err() {
            continue;
        }
        let done: Vec<(u64, i32)> = ring
            .completion()
            .map(|c| (c.user_data(), c.result()))
            .collect();
        for (ud, res) in done {
            if ud == ACCEPT {
                queue.push(accept());
                if res < 0 {
                    continue;
                }
                let Some(pair) = open(res, upstream) else {
                    continue;
                };
                let slot = free.pop().unwrap_or_else(|| {
                    pairs.push(None);
                    pairs.len() - 1
                });
                pairs[slot] = Some(pair);
                let pair = pairs[slot].as_mut().unwrap();
                for h in 0..2 {
                    queue.push(next_op(&mut pair.halves[h], key(slot, h)));
                }
                continue;
            }
            let (slot, h) = ((ud >> 1) as usize, (ud & 1) as usize);
            let Some(pair) = pairs[slot].as_mut() else {
                continue;
            };
            let half = &mut pair.halves[h];
            half.busy = false;
            if res <= 0 || pair.closing {
                pair.closing = true;
                for h in &pair.halves {
                    // SAFETY: plain fds of this pair; wakes the other half's operation.
                    unsafe { libc::shutdown(h.from, libc::SHUT_RDWR) };
                }
                if pair.halves.iter().all(|h| !h.busy) {
                    for h in &pair.halves {
                        // SAFETY: no operation of this pair is in the ring any more.
                        unsafe { libc::close(h.from) };
                    }
                    pairs[slot] = None;
                    free.push(slot);
                }
                continue;
            }
            let n = res as usize;
            if half.filled == 0 {
                half.filled = n; // a recv completed
            } else {
                half.sent += n; // a send completed
                if half.sent == half.filled {
                    half.filled = 0;
                    half.sent = 0;
                }
            }
            queue.push(next_op(half, key(slot, h)));
        }
    }
}

/// The half's next operation: the rest of a send, or the next recv.
fn next_op(half: &mut Half, ud: u64) -> squeue::Entry {
    half.busy = true;
    if half.filled > half.sent {
        let rest = &half.buf[half.sent..half.filled];
        opcode::Send::new(types::Fd(half.to), rest.as_ptr(), rest.len() as u32)
            .build()
            .user_data(ud)
    } else {
        opcode::Recv::new(types::Fd(half.from), half.buf.as_mut_ptr(), BUF as u32)
            .build()
            .user_data(ud)
    }
}

/// Dials the upstream for an accepted client (blocking: connections are made before the
/// measured window), nodelay on both sides.
fn open(client: RawFd, upstream: &str) -> Option<Pair> {
    let Ok(up) = TcpStream::connect(upstream) else {
        // SAFETY: the accepted fd is ours alone.
        unsafe { libc::close(client) };
        return None;
    };
    let _ = up.set_nodelay(true);
    let one: libc::c_int = 1;
    // SAFETY: a valid socket fd and an int option.
    unsafe {
        libc::setsockopt(
            client,
            libc::IPPROTO_TCP,
            libc::TCP_NODELAY,
            (&one as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    let up = up.into_raw_fd();
    let half = |from, to| Half {
        from,
        to,
        buf: Box::new([0; BUF]),
        filled: 0,
        sent: 0,
        busy: false,
    };
    Some(Pair {
        halves: [half(client, up), half(up, client)],
        closing: false,
    })
}
