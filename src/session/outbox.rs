//! What waits to be written to one peer. The relay never waits on a write: it writes what
//! the socket takes, keeps the rest here in order, and stops reading what would add to an
//! outbox that is already full. A peer that stops reading therefore stalls only the
//! direction that feeds it, never the loop, the other direction or a stop.

use std::collections::VecDeque;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll, Waker};
use std::time::Duration;

use bytes::{Buf, Bytes};
use tokio::time::Instant;

use super::Outbound;

/// Past this many bytes waiting, the relay reads nothing more that could add to them (the
/// socket buffers give the slack; this bounds what one session holds on top).
const ROOM: usize = 64 * 1024;
/// At most this many queued messages go out in one `writev`.
const GATHER: usize = 16;
/// An emptied queue keeps room for this many messages; a larger one (after a burst of
/// small messages) is let go.
const KEEP_SLOTS: usize = 64;

#[derive(Debug, Default)]
pub(super) struct Outbox {
    queue: VecDeque<Bytes>,
    /// Bytes in `queue` not written yet.
    bytes: usize,
    /// Written but not flushed (TLS may hold records until flushed).
    unflushed: bool,
    /// Writes and flushes done so far: what tells a peer that takes nothing from a slow one.
    progress: u64,
    /// `progress` as the first check that found bytes waiting saw it, and when.
    stuck: Option<(u64, Instant)>,
}

impl Outbox {
    pub(super) fn push(&mut self, msg: Bytes) {
        self.bytes += msg.len();
        self.queue.push_back(msg);
    }

    /// Everything is written and flushed.
    pub(super) fn is_idle(&self) -> bool {
        self.queue.is_empty() && !self.unflushed
    }

    /// Below the bound: reading what may add to this outbox can go on.
    pub(super) fn has_room(&self) -> bool {
        self.bytes < ROOM
    }

    /// One step: one write of the oldest messages, or a flush once all is written.
    /// Cancel-safe: dropped before it completes, it has written nothing. Its state is two
    /// references: the relay waits on a step per peer in every turn, and whatever a step
    /// holds across a wait (a gather list of `GATHER` slices) would be part of every
    /// session's task for the connection's whole life.
    pub(super) fn step<'a, W: Outbound>(
        &'a mut self,
        w: &'a mut W,
    ) -> impl Future<Output = io::Result<()>> + 'a {
        std::future::poll_fn(move |cx| self.poll_step(w, cx))
    }

    /// [`Outbox::step`], polled.
    fn poll_step<W: Outbound>(&mut self, w: &mut W, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let w = Pin::new(w);
        let n = match self.queue.len() {
            0 => {
                ready!(w.poll_flush(cx))?;
                self.unflushed = false;
                self.progress += 1;
                return Poll::Ready(Ok(()));
            }
            // One message (the common case): a plain `send`, which costs the kernel less
            // than `writev` (no iovec import, no VFS layer).
            1 => ready!(w.poll_write(cx, self.queue[0].chunk()))?,
            // Several (pipelined requests, a burst of replies): one `writev` for as many as
            // fit in `GATHER`.
            _ => {
                let mut slices = [io::IoSlice::new(&[]); GATHER];
                let mut k = 0;
                for (slot, msg) in slices.iter_mut().zip(&self.queue) {
                    *slot = io::IoSlice::new(msg.chunk());
                    k += 1;
                }
                ready!(w.poll_write_vectored(cx, &slices[..k]))?
            }
        };
        if n == 0 {
            return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
        }
        self.bytes -= n;
        self.unflushed = true;
        self.progress += 1;
        self.consume(n);
        Poll::Ready(Ok(()))
    }

    /// How long bytes have waited here with none taken by the peer, as seen by successive
    /// calls (the session's limits tick): zero when idle or when a write went out since the
    /// previous call.
    pub(super) fn stuck_for(&mut self, now: Instant) -> Duration {
        if self.is_idle() {
            self.stuck = None;
            return Duration::ZERO;
        }
        match self.stuck {
            Some((seen, since)) if seen == self.progress => now.saturating_duration_since(since),
            _ => {
                self.stuck = Some((self.progress, now));
                Duration::ZERO
            }
        }
    }

    /// Lets go of the queue's slots when nothing waits (an idle session).
    pub(super) fn trim(&mut self) {
        if self.is_idle() && self.queue.capacity() > 0 {
            self.queue = VecDeque::new();
        }
    }

    /// Drops what waits (the peer is being closed without it).
    pub(super) fn discard(&mut self) {
        *self = Outbox::default();
    }

    /// Drops `n` written bytes from the front of the queue.
    fn consume(&mut self, mut n: usize) {
        while n > 0 {
            let Some(front) = self.queue.front_mut() else {
                return;
            };
            let take = n.min(front.len());
            front.advance(take);
            n -= take;
            if !front.has_remaining() {
                self.queue.pop_front();
            }
        }
        if self.queue.is_empty() && self.queue.capacity() > KEEP_SLOTS {
            self.queue = VecDeque::new();
        }
    }

    /// Writes what `w` takes now, without waiting: the common case sends a message in the
    /// loop turn that produced it. Polling with a no-op waker is fine here, because the loop
    /// polls every pending write with its own waker right after.
    pub(super) fn write_now<W: Outbound>(&mut self, w: &mut W) -> io::Result<()> {
        let mut cx = Context::from_waker(Waker::noop());
        while !self.is_idle() {
            match self.poll_step(w, &mut cx) {
                Poll::Ready(done) => done?,
                Poll::Pending => break,
            }
        }
        Ok(())
    }

    /// Writes and flushes everything, waiting as long as it takes (callers bound it).
    pub(super) async fn drain<W: Outbound>(&mut self, w: &mut W) -> io::Result<()> {
        while !self.is_idle() {
            self.step(w).await?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn writes_in_order_and_keeps_what_the_peer_does_not_take() {
        let (mut w, mut r) = tokio::io::duplex(8);
        let mut out = Outbox::default();
        out.push(Bytes::from_static(b"hello "));
        out.push(Bytes::from_static(b"world"));
        out.write_now(&mut w).unwrap();
        // The pipe holds 8 bytes: the rest waits, and the outbox says so.
        assert!(!out.is_idle());
        assert_eq!(out.bytes, 3);
        let reader = tokio::spawn(async move {
            let mut got = Vec::new();
            tokio::io::AsyncReadExt::read_to_end(&mut r, &mut got)
                .await
                .unwrap();
            got
        });
        out.drain(&mut w).await.unwrap();
        assert!(out.is_idle() && out.has_room());
        drop(w);
        assert_eq!(reader.await.unwrap(), b"hello world");
    }

    #[test]
    fn full_past_the_bound() {
        let mut out = Outbox::default();
        out.push(Bytes::from(vec![0; ROOM - 1]));
        assert!(out.has_room());
        out.push(Bytes::from_static(b"x"));
        assert!(!out.has_room());
    }
}
