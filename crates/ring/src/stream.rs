//! [`RingStream`]: a TCP socket driven by its thread's ring, as tokio's `AsyncRead` and
//! `AsyncWrite`. Reads copy from the socket's inbox, where the driver copied a receive's
//! bytes out of the thread's shared buffer the kernel picked (an idle socket holds no
//! buffer, a stalled one only its own bytes); writes copy into the socket's send buffer and
//! return at once (write-behind), up to [`WRITE_BEHIND`] bytes not yet taken by the kernel,
//! past which a write waits. A send's error comes back from the next write or flush; a
//! flush, as a plain socket's, does not wait for the kernel; a shutdown waits until the
//! kernel has taken every byte written.

use std::io;
use std::os::fd::IntoRawFd;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::driver::{Driver, Sock, RING};

/// Bytes written and not yet taken by the kernel, per socket, past which a write waits.
pub const WRITE_BEHIND: usize = 256 * 1024;

/// A TCP socket on this thread's ring. Used off the thread that made it, every call fails
/// (and dropping it there leaks the socket rather than touching another thread's ring).
#[derive(Debug)]
pub struct RingStream {
    key: usize,
    ring: u64,
}

/// Runs `f` on this thread's ring, if it is the one `ring` names.
fn with<R>(ring: u64, f: impl FnOnce(&mut Driver) -> R) -> io::Result<R> {
    RING.try_with(|r| {
        let mut r = r.try_borrow_mut().ok()?;
        let d = r.as_mut().filter(|d| d.id == ring)?;
        Some(f(d))
    })
    .ok()
    .flatten()
    .ok_or_else(|| io::Error::other("io_uring socket used off its session thread"))
}

impl RingStream {
    /// Moves `socket` onto this thread's ring (which must exist: `crate::start`).
    pub fn new(socket: std::net::TcpStream) -> io::Result<RingStream> {
        // The ring waits for the socket; a blocking fd never hands the ring EAGAIN.
        socket.set_nonblocking(false)?;
        let ring = crate::here().ok_or_else(|| io::Error::other("no io_uring on this thread"))?;
        let fd = socket.into_raw_fd();
        let key = with(ring, |d| {
            let key = d.socks.insert(Sock {
                fd,
                ..Sock::default()
            });
            d.count_sockets();
            key
        })
        .inspect_err(|_| {
            // SAFETY: the fd is ours (just taken from the socket) and nothing else has it.
            unsafe { libc::close(fd) };
        })?;
        Ok(RingStream { key, ring })
    }

    /// The read and write halves, borrowed (no lock between them: both are this thread's).
    pub fn split(&mut self) -> (ReadHalf<'_>, WriteHalf<'_>) {
        (ReadHalf(self), WriteHalf(self))
    }

    fn read_into(&self, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let key = self.key;
        with(self.ring, |d| {
            let s = &mut d.socks[key];
            if s.taken < s.inbox.len() {
                let got = &s.inbox[s.taken..];
                let n = got.len().min(buf.remaining());
                buf.put_slice(&got[..n]);
                s.taken += n;
                if s.taken == s.inbox.len() {
                    // All taken: an idle socket keeps no buffer.
                    s.taken = 0;
                    let done = std::mem::take(&mut s.inbox);
                    d.recycle(done);
                }
                return Poll::Ready(Ok(()));
            }
            if let Some(e) = s.read_err {
                return Poll::Ready(Err(io::Error::from_raw_os_error(e)));
            }
            if s.eof || buf.remaining() == 0 {
                return Poll::Ready(Ok(()));
            }
            set_waker(&mut s.reader, cx);
            if !s.recv && !s.starved {
                d.arm_recv(key);
            }
            Poll::Pending
        })?
    }

    fn write_from(
        &self,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let key = self.key;
        with(self.ring, |d| {
            let s = &mut d.socks[key];
            if let Some(e) = s.write_err {
                return Poll::Ready(Err(io::Error::from_raw_os_error(e)));
            }
            if s.shut {
                return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into()));
            }
            let total: usize = bufs.iter().map(|b| b.len()).sum();
            if total == 0 {
                return Poll::Ready(Ok(0));
            }
            let mut room = WRITE_BEHIND.saturating_sub(s.unsent());
            if room == 0 {
                set_waker(&mut s.writer, cx);
                return Poll::Pending;
            }
            let idle = !s.send;
            if idle && s.out.capacity() == 0 {
                let spare = d.buffer();
                d.socks[key].out = spare;
            } else if !idle && s.queued.capacity() == 0 {
                let spare = d.buffer();
                d.socks[key].queued = spare;
            }
            let s = &mut d.socks[key];
            // Nothing in flight: the bytes go straight into the buffer sent next; else
            // behind the send in flight (whose buffer the kernel is reading).
            let to = if idle { &mut s.out } else { &mut s.queued };
            let mut n = 0;
            for b in bufs {
                let take = b.len().min(room);
                to.extend_from_slice(&b[..take]);
                (n, room) = (n + take, room - take);
                if room == 0 {
                    break;
                }
            }
            if idle {
                s.sent = 0;
                d.arm_send(key);
            }
            Poll::Ready(Ok(n))
        })?
    }

    /// A flush, as a plain TCP socket's: nothing to wait for (the bytes written are the
    /// kernel's to send, here at the thread's next submission), only a send's error to
    /// report. Waiting for the send's completion instead would wake the session once more
    /// per message for nothing.
    fn flush(&self) -> Poll<io::Result<()>> {
        with(self.ring, |d| match d.socks[self.key].write_err {
            Some(e) => Poll::Ready(Err(io::Error::from_raw_os_error(e))),
            None => Poll::Ready(Ok(())),
        })?
    }

    /// Waits until the kernel has taken every byte written (before a shutdown).
    fn flush_sent(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        with(self.ring, |d| {
            let s = &mut d.socks[self.key];
            if let Some(e) = s.write_err {
                return Poll::Ready(Err(io::Error::from_raw_os_error(e)));
            }
            if s.send {
                set_waker(&mut s.writer, cx);
                return Poll::Pending;
            }
            Poll::Ready(Ok(()))
        })?
    }

    fn shut_down(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        std::task::ready!(self.flush_sent(cx))?;
        with(self.ring, |d| {
            let s = &mut d.socks[self.key];
            if s.shut {
                return Ok(());
            }
            s.shut = true;
            // SAFETY: the fd is this socket's, open until its slot is freed.
            match unsafe { libc::shutdown(s.fd, libc::SHUT_WR) } {
                0 => Ok(()),
                _ => Err(io::Error::last_os_error()),
            }
        })?
        .into()
    }
}

/// Keeps `cx`'s waker in `slot` (cloned only when it differs).
fn set_waker(slot: &mut Option<std::task::Waker>, cx: &Context<'_>) {
    match slot {
        Some(w) if w.will_wake(cx.waker()) => {}
        _ => *slot = Some(cx.waker().clone()),
    }
}

impl Drop for RingStream {
    fn drop(&mut self) {
        let key = self.key;
        // Off its thread (or during the thread's exit) the socket is leaked, never closed
        // under an operation in flight.
        let _ = with(self.ring, |d| {
            let s = &mut d.socks[key];
            s.dropped = true;
            s.reader = None;
            s.writer = None;
            let (inbox, busy) = (std::mem::take(&mut s.inbox), s.recv || s.send);
            d.recycle(inbox);
            if busy {
                // The slot and its buffers go when the last completion arrives.
                d.cancel(key);
            } else if d.socks[key].ops == 0 {
                d.close(key);
            }
        });
    }
}

/// The read half of a [`RingStream`].
#[derive(Debug)]
pub struct ReadHalf<'a>(&'a RingStream);

/// The write half of a [`RingStream`].
#[derive(Debug)]
pub struct WriteHalf<'a>(&'a RingStream);

impl AsyncRead for RingStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.read_into(cx, buf)
    }
}

impl AsyncRead for ReadHalf<'_> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.0.read_into(cx, buf)
    }
}

/// The write side, for the stream and its write half alike.
macro_rules! write_impl {
    ($t:ty, $s:ident => $e:expr) => {
        impl AsyncWrite for $t {
            fn poll_write(
                self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                buf: &[u8],
            ) -> Poll<io::Result<usize>> {
                let $s = &*self;
                $e.write_from(cx, &[io::IoSlice::new(buf)])
            }

            fn poll_write_vectored(
                self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                bufs: &[io::IoSlice<'_>],
            ) -> Poll<io::Result<usize>> {
                let $s = &*self;
                $e.write_from(cx, bufs)
            }

            fn is_write_vectored(&self) -> bool {
                true
            }

            fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                let $s = &*self;
                $e.flush()
            }

            fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                let $s = &*self;
                $e.shut_down(cx)
            }
        }
    };
}

write_impl!(RingStream, s => s);
write_impl!(WriteHalf<'_>, s => s.0);
