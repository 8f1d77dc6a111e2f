//! One io_uring per session thread, kept in a thread-local: the sockets on it (a slab of
//! [`Sock`]), submission (batched: pushed to the submission queue as streams ask, handed to
//! the kernel in one `io_uring_enter` when the thread is about to park, when the driver task
//! runs, or when the queue is full), and completion (the driver task reaps the completion
//! queue when the ring's fd turns readable in tokio's reactor, and wakes the streams).
//!
//! Memory the kernel may touch (a send's buffer, the receive buffers) belongs to the driver
//! and is freed only once no operation on it is in flight: a dropped stream's slot stays
//! until the completions of its operations (and of their cancellation) have arrived.

use std::cell::RefCell;
use std::io;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Waker;

use io_uring::{cqueue, opcode, squeue, types, IoUring};
use slab::Slab;

use crate::bufs::{self, BufRing};

/// Submission queue entries per ring (the completion queue gets twice as many; the kernel
/// keeps completions that overflow it).
const ENTRIES: u32 = 4096;
/// What a completion was for: the low byte of its `user_data`, the slot above it.
pub(crate) const RECV: u64 = 1;
pub(crate) const SEND: u64 = 2;
pub(crate) const CANCEL: u64 = 3;

/// One ring's sockets and operations in flight, as its thread last wrote them (plain
/// stores to a line of its own: the threads never write a line another one writes).
#[repr(align(128))]
#[derive(Default)]
pub(crate) struct Counts {
    pub(crate) sockets: AtomicUsize,
    pub(crate) ops: AtomicUsize,
    /// The ring is set up and not stopped.
    pub(crate) up: AtomicBool,
    /// The kernel refused a multishot receive with a limit (older than 6.17): the ring's
    /// receives are one-shot, one buffer each (`Driver::one_shot`; read by the metrics too).
    pub(crate) one_shot: AtomicBool,
    /// Receives that found none of the ring's buffers free and waited for one.
    pub(crate) starved: AtomicU64,
}

/// Every ring's counts (tests check they come back to zero: `crate::live`).
pub(crate) static COUNTS: Mutex<Vec<Arc<Counts>>> = Mutex::new(Vec::new());

thread_local! {
    pub(crate) static RING: RefCell<Option<Driver>> = const { RefCell::new(None) };
}

/// One socket's state, shared by its stream and the completions of its operations.
#[derive(Default)]
pub(crate) struct Sock {
    pub(crate) fd: RawFd,
    /// Operations of this socket in flight (receive, send, cancel).
    pub(crate) ops: u8,
    // The read side.
    /// A receive is armed: one op in flight, across every completion of a multishot
    /// receive that carries `IORING_CQE_F_MORE`.
    pub(crate) recv: bool,
    /// Bytes received and not yet taken by the stream (`inbox[taken..]`). A receive's bytes
    /// are copied here from the ring's shared buffer at its completion, and the buffer goes
    /// straight back: a connection whose session does not read (a client that stalls its
    /// own replies) holds its own bytes, at most [`RECV_LIMIT`] and one buffer's (one
    /// buffer's with one-shot receives), never one of the thread's buffers that every other
    /// connection's receives need.
    pub(crate) inbox: Vec<u8>,
    pub(crate) taken: usize,
    pub(crate) eof: bool,
    pub(crate) read_err: Option<i32>,
    /// Its receive found no free buffer: re-armed after the reap (`Driver::rearm_starved`).
    pub(crate) starved: bool,
    pub(crate) reader: Option<Waker>,
    // The write side.
    /// In flight while `send`: the kernel reads `out[sent..]`; nothing changes `out` then.
    pub(crate) out: Vec<u8>,
    pub(crate) sent: usize,
    pub(crate) send: bool,
    /// Written while a send was in flight: goes next.
    pub(crate) queued: Vec<u8>,
    pub(crate) write_err: Option<i32>,
    pub(crate) shut: bool,
    pub(crate) writer: Option<Waker>,
    /// Its stream is gone: the slot goes once `ops` is zero.
    pub(crate) dropped: bool,
}

impl Sock {
    /// Bytes written and not yet taken by the kernel.
    pub(crate) fn unsent(&self) -> usize {
        self.out.len() - self.sent + self.queued.len()
    }
}

/// A thread's ring. Field order matters: `uring` is dropped (closed) before `bufs`.
pub(crate) struct Driver {
    pub(crate) uring: IoUring,
    pub(crate) socks: Slab<Sock>,
    pub(crate) bufs: BufRing,
    /// Sockets whose receive found no buffer, re-armed all at once after the reap.
    starved: Vec<usize>,
    /// Send and receive buffers not in use, kept for the next ones (bounded).
    spare: Vec<Vec<u8>>,
    /// Wakers of one reap, woken once the ring is no longer borrowed.
    woken: Vec<Waker>,
    /// Tests stand in for a kernel that refuses the limit: multishot receives carry
    /// `MSG_WAITALL`, which every kernel refuses for them (`EINVAL`), as an older one
    /// refuses `optlen`.
    #[cfg(test)]
    pub(crate) refused: bool,
    /// Identifies the ring (a stream checks it is used on its own thread).
    pub(crate) id: u64,
    /// Operations of this ring in flight (queued or in the kernel).
    pub(crate) inflight: usize,
    pub(crate) counts: Arc<Counts>,
}

/// Bytes one multishot receive takes in all before it ends (the kernel's limit, the SQE's
/// `optlen`, Linux 6.17): a socket whose stream does not read holds at most this many plus
/// one buffer's in its inbox, and the rest stays in the kernel under TCP's flow control.
pub(crate) const RECV_LIMIT: usize = bufs::SIZE;

#[cfg(test)]
thread_local! {
    /// Buffers of the next ring set up on this thread: tests that starve a ring lower it.
    pub(crate) static BUFFERS: std::cell::Cell<u16> = const { std::cell::Cell::new(bufs::COUNT) };
}

/// How many receive buffers a new ring gets.
fn buffers() -> u16 {
    #[cfg(test)]
    return BUFFERS.with(std::cell::Cell::get);
    #[cfg(not(test))]
    bufs::COUNT
}

/// Spare send buffers kept per thread, and the largest kept.
const SPARE: usize = 64;
const SPARE_MAX: usize = 64 * 1024;

impl Driver {
    pub(crate) fn new(id: u64) -> io::Result<Driver> {
        let uring = IoUring::builder()
            // Only this thread submits: the kernel can skip some locking.
            .setup_single_issuer()
            // A completion does not interrupt the thread while it runs: it is posted at the
            // thread's next entry into the kernel, and the ring's flags say one waits
            // (`Driver::submit`). A sleeping thread is still woken.
            .setup_coop_taskrun()
            .setup_taskrun_flag()
            .build(ENTRIES)?;
        let bufs = BufRing::register(&uring, buffers())?;
        let counts = Arc::new(Counts::default());
        counts.up.store(true, Ordering::Relaxed);
        COUNTS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(counts.clone());
        Ok(Driver {
            uring,
            socks: Slab::new(),
            bufs,
            starved: Vec::new(),
            spare: Vec::new(),
            woken: Vec::new(),
            #[cfg(test)]
            refused: false,
            id,
            inflight: 0,
            counts,
        })
    }

    /// The ring's receives are one-shot (`Counts::one_shot`).
    pub(crate) fn one_shot(&self) -> bool {
        self.counts.one_shot.load(Ordering::Relaxed)
    }

    /// Queues `sqe`, handing the queue to the kernel first when it is full.
    pub(crate) fn push(&mut self, sqe: &squeue::Entry) {
        loop {
            // SAFETY: every entry pushed points only at memory the driver owns and keeps
            // until the operation's completion (a socket's `out`, the receive buffers), or
            // at nothing (receives select a buffer, cancels name a fd).
            if unsafe { self.uring.submission().push(sqe) }.is_ok() {
                self.inflight += 1;
                self.counts.ops.store(self.inflight, Ordering::Relaxed);
                return;
            }
            // Full: hand the queue to the kernel and reap (an EBUSY, completions
            // overflowing, clears as they are reaped).
            let _ = self.uring.submit();
            self.reap();
        }
    }

    /// Hands the queued entries to the kernel (one `io_uring_enter`), if there are any or
    /// if completions wait to be posted (cooperative task running: the kernel posts them as
    /// the call returns).
    pub(crate) fn submit(&mut self) {
        let mut sq = self.uring.submission();
        sq.sync();
        if !sq.is_empty() || sq.taskrun() {
            drop(sq);
            let _ = self.uring.submit();
        }
    }

    /// Queues a receive for socket `key` (a buffer is picked when bytes arrive): multishot,
    /// so it stays armed across arrivals (no submission and no poll armed anew per message)
    /// until it has taken [`RECV_LIMIT`] bytes, fails, meets the end of the stream or finds
    /// no buffer; one-shot where the kernel has no limit for multishot receives.
    pub(crate) fn arm_recv(&mut self, key: usize) {
        let one_shot = self.one_shot();
        let s = &mut self.socks[key];
        s.recv = true;
        s.ops += 1;
        let data = ((key as u64) << 8) | RECV;
        let sqe = if one_shot {
            opcode::Recv::new(types::Fd(s.fd), std::ptr::null_mut(), bufs::SIZE as u32)
                .buf_group(bufs::GROUP)
                .build()
                .flags(squeue::Flags::BUFFER_SELECT)
                .user_data(data)
        } else {
            let multi = opcode::RecvMulti::new(types::Fd(s.fd), bufs::GROUP);
            #[cfg(test)]
            let multi = multi.flags(if self.refused { libc::MSG_WAITALL } else { 0 });
            limited(multi.build().user_data(data), RECV_LIMIT as u32)
        };
        self.push(&sqe);
    }

    /// Queues a send of `out[sent..]` for socket `key`.
    pub(crate) fn arm_send(&mut self, key: usize) {
        let s = &mut self.socks[key];
        s.send = true;
        s.ops += 1;
        let rest = &s.out[s.sent..];
        let sqe = opcode::Send::new(types::Fd(s.fd), rest.as_ptr(), rest.len() as u32)
            .flags(libc::MSG_NOSIGNAL)
            .build()
            .user_data(((key as u64) << 8) | SEND);
        self.push(&sqe);
    }

    /// Queues the cancellation of every operation on socket `key`.
    pub(crate) fn cancel(&mut self, key: usize) {
        let s = &mut self.socks[key];
        s.ops += 1;
        let sqe = opcode::AsyncCancel2::new(types::CancelBuilder::fd(types::Fd(s.fd)).all())
            .build()
            .user_data(((key as u64) << 8) | CANCEL);
        self.push(&sqe);
    }

    /// A send or receive buffer: a spare one if any.
    pub(crate) fn buffer(&mut self) -> Vec<u8> {
        self.spare.pop().unwrap_or_default()
    }

    /// Keeps `buf` for a later send, or frees it.
    pub(crate) fn recycle(&mut self, mut buf: Vec<u8>) {
        if buf.capacity() > 0 && buf.capacity() <= SPARE_MAX && self.spare.len() < SPARE {
            buf.clear();
            self.spare.push(buf);
        }
    }

    /// Re-arms the receives that found no buffer (after a reap). Every buffer a completion
    /// reaped so far is back already (bytes are copied out at once), so a receive goes
    /// without only while the completions that took the buffers wait to be reaped: the
    /// next reap gives those back.
    pub(crate) fn rearm_starved(&mut self) {
        while let Some(key) = self.starved.pop() {
            let Some(s) = self.socks.get_mut(key) else {
                continue;
            };
            if s.starved && !s.dropped {
                s.starved = false;
                self.arm_recv(key);
            }
        }
    }

    /// Reaps every completion, updating the sockets; the wakers to wake are in `woken`.
    pub(crate) fn reap(&mut self) {
        loop {
            let Some(cqe) = self.uring.completion().next() else {
                return;
            };
            let key = (cqe.user_data() >> 8) as usize;
            let kind = cqe.user_data() & 0xff;
            let (res, flags) = (cqe.result(), cqe.flags());
            // A multishot receive's completions but its last leave it in flight.
            let more = cqueue::more(flags);
            if !more {
                self.inflight -= 1;
                self.counts.ops.store(self.inflight, Ordering::Relaxed);
            }
            let Some(s) = self.socks.get_mut(key) else {
                continue;
            };
            if !more {
                s.ops -= 1;
            }
            match kind {
                RECV => self.received(key, res, flags, more),
                SEND => self.sent(key, res),
                _ => {}
            }
            if self.socks[key].dropped && self.socks[key].ops == 0 {
                self.close(key);
            }
        }
    }

    fn received(&mut self, key: usize, res: i32, flags: u32, more: bool) {
        let s = &mut self.socks[key];
        if !more {
            s.recv = false;
        }
        let bid = cqueue::buffer_select(flags);
        if s.dropped {
            if let Some(bid) = bid {
                self.bufs.give_back(bid);
            }
            return;
        }
        match (res, bid) {
            (n, Some(bid)) if n > 0 => {
                let mut inbox = std::mem::take(&mut s.inbox);
                if inbox.capacity() == 0 {
                    inbox = self.buffer();
                }
                inbox.extend_from_slice(self.bufs.bytes(bid, n as usize));
                self.socks[key].inbox = inbox;
                self.bufs.give_back(bid);
            }
            (0, _) => s.eof = true,
            (e, _) if -e == libc::ENOBUFS => {
                s.starved = true;
                self.starved.push(key);
                // Read by the metrics; only this thread writes it.
                let n = self.counts.starved.load(Ordering::Relaxed);
                self.counts.starved.store(n + 1, Ordering::Relaxed);
                return;
            }
            // A kernel without the multishot limit (it refuses the SQE's `optlen`): from
            // now on this ring's receives are one-shot.
            (e, _) if -e == libc::EINVAL && !self.counts.one_shot.load(Ordering::Relaxed) => {
                self.counts.one_shot.store(true, Ordering::Relaxed);
                tracing::warn!(
                    ring = self.id,
                    "io_uring: the kernel refused the multishot receive's byte limit (Linux 6.17 \
                     or later has it); this session thread's receives are one-shot from now on"
                );
                self.arm_recv(key);
                return;
            }
            // Interrupted or cancelled while the stream still wants bytes: ask again.
            (e, _) if -e == libc::EINTR || -e == libc::EAGAIN || -e == libc::ECANCELED => {
                self.arm_recv(key);
                return;
            }
            (e, _) => s.read_err = Some(if e < 0 { -e } else { libc::EIO }),
        }
        let s = &mut self.socks[key];
        if let Some(w) = s.reader.take() {
            self.woken.push(w);
        }
    }

    fn sent(&mut self, key: usize, res: i32) {
        let s = &mut self.socks[key];
        s.send = false;
        match res {
            n if n > 0 => {
                // Counted even for a dropped stream: its close sends only the rest.
                s.sent += n as usize;
                if s.dropped {
                    return;
                }
                if s.sent < s.out.len() {
                    return self.arm_send(key);
                }
                s.sent = 0;
                if !s.queued.is_empty() {
                    // The queued bytes go next; the finished buffer goes back to the spares
                    // (or is freed): kept as the queue, a socket would hold the largest
                    // buffer it ever sent for its whole life, idle or not.
                    let next = std::mem::take(&mut s.queued);
                    let done = std::mem::replace(&mut s.out, next);
                    self.recycle(done);
                    self.arm_send(key);
                } else {
                    let done = std::mem::take(&mut s.out);
                    self.recycle(done);
                }
            }
            _ if s.dropped => return,
            e if -e == libc::EINTR || -e == libc::EAGAIN => return self.arm_send(key),
            0 => s.write_err = Some(libc::EPIPE),
            e => s.write_err = Some(-e),
        }
        let s = &mut self.socks[key];
        if s.write_err.is_some() {
            let (out, queued) = (std::mem::take(&mut s.out), std::mem::take(&mut s.queued));
            s.sent = 0;
            self.recycle(out);
            self.recycle(queued);
        }
        if let Some(w) = self.socks[key].writer.take() {
            self.woken.push(w);
        }
    }

    /// A dropped stream's last operation is done: what it wrote and the kernel did not take
    /// yet goes out now if the socket has room (a plain socket's close keeps what it has
    /// taken), then the fd is closed and the slot freed.
    pub(crate) fn close(&mut self, key: usize) {
        let s = self.socks.remove(key);
        self.count_sockets();
        if s.write_err.is_none() && !s.shut {
            for part in [&s.out[s.sent..], &s.queued[..]] {
                if part.is_empty() {
                    continue;
                }
                // SAFETY: `part` is valid for its length; `fd` is still ours (closed below).
                let n = unsafe {
                    libc::send(
                        s.fd,
                        part.as_ptr().cast(),
                        part.len(),
                        libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
                    )
                };
                if n < 0 || (n as usize) < part.len() {
                    break;
                }
            }
        }
        // SAFETY: the fd was handed to the stream with its ownership, and no operation on
        // it is in flight (`ops == 0`), so nothing uses it after this.
        unsafe { libc::close(s.fd) };
        self.recycle(s.out);
        self.recycle(s.queued);
        self.recycle(s.inbox);
    }

    /// Publishes the number of sockets open on this ring.
    pub(crate) fn count_sockets(&self) {
        (self.counts.sockets).store(self.socks.len(), Ordering::Relaxed);
    }

    /// The wakers gathered by the last reaps.
    pub(crate) fn take_woken(&mut self) -> Vec<Waker> {
        std::mem::take(&mut self.woken)
    }

    /// Puts back the (emptied) waker list, keeping its allocation.
    pub(crate) fn put_woken(&mut self, woken: Vec<Waker>) {
        if self.woken.is_empty() {
            self.woken = woken;
        }
    }
}

/// `sqe` (a multishot receive) with the kernel's limit on the bytes it takes in all: the
/// SQE's `optlen`, a `u32` at byte 44, which the io-uring crate does not set.
fn limited(sqe: squeue::Entry, limit: u32) -> squeue::Entry {
    const OPTLEN: usize = 44;
    // SAFETY: `Entry` is `repr(C)` around the kernel's 64-byte `io_uring_sqe`, whose fields
    // are plain integers (and unions of them): any 64 bytes are a valid value.
    let mut raw: [u8; 64] = unsafe { std::mem::transmute(sqe) };
    raw[OPTLEN..OPTLEN + 4].copy_from_slice(&limit.to_ne_bytes());
    // SAFETY: as above.
    unsafe { std::mem::transmute::<[u8; 64], squeue::Entry>(raw) }
}
