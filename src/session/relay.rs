//! The relay loop: reads both ways, hands each message to the request or reply side, and
//! writes what they queue without ever waiting on a write (see `outbox`). A stop lets
//! requests in flight finish; the kill (the stop's deadline) ends the session whatever the
//! peers do, reading or not.

use std::sync::atomic::Ordering;

use futures::StreamExt;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::time::Instant;
use tokio_util::codec::FramedRead;

use super::counters::FLUSH_AFTER;
use super::{client_err, upstream_err, Session, SessionError};
use crate::wire::{MessageCodec, ReplyCodec};

/// A session that never goes idle adds its batched metrics at least this often (messages).
const FLUSH_MSGS: u64 = 1024;

/// Initial read-buffer size per direction; grows to the message size when needed, and
/// goes back after a message larger than `wire::codec::SHRINK_AFTER`.
pub(super) const READ_BUFFER: usize = 8 * 1024;

/// Replies larger than this that nothing inspects go to the client in pieces (`stream`).
const STREAM_ABOVE: usize = 64 * 1024;

/// The upstream side's decoder.
pub(super) fn reply_codec(max_message_size: usize) -> ReplyCodec {
    ReplyCodec::new(max_message_size, STREAM_ABOVE)
}

impl Session {
    /// Relays until either side ends, the client misbehaves, or the proxy stops.
    ///
    /// One `select!` over every event the session waits on; its arms only dispatch, which
    /// is why the function is this long.
    pub fn pump<CR, CW, UR, UW>(
        self,
        cr: CR,
        cw: CW,
        ur: UR,
        uw: UW,
    ) -> impl std::future::Future<Output = ()>
    where
        CR: AsyncRead + Unpin,
        CW: AsyncWrite + Unpin,
        UR: AsyncRead + Unpin,
        UW: AsyncWrite + Unpin,
    {
        let max = self.config.max_message_size;
        let cr = FramedRead::with_capacity(cr, MessageCodec::new(max), READ_BUFFER);
        let ur = FramedRead::with_capacity(ur, reply_codec(max), READ_BUFFER);
        Box::new(self).relay_framed(cr, cw, ur, uw, None)
    }

    /// The relay over framed readers; `first` is a request read before the upstream was
    /// dialed.
    pub(super) async fn relay_framed<CR, CW, UR, UW>(
        mut self: Box<Self>,
        mut cr: FramedRead<CR, MessageCodec>,
        mut cw: CW,
        mut ur: FramedRead<UR, ReplyCodec>,
        mut uw: UW,
        first: Option<bytes::Bytes>,
    ) where
        CR: AsyncRead + Unpin,
        CW: AsyncWrite + Unpin,
        UR: AsyncRead + Unpin,
        UW: AsyncWrite + Unpin,
    {
        if let Some(first) = first {
            if let Err(e) = self.request(first).await {
                self.finish(Err(e), true);
                return Box::pin(self.close(&mut cw, &mut uw)).await;
            }
        }
        let mut draining = false;
        let (kill, stop) = (self.kill.clone(), self.stop.clone());
        // Built once: re-creating them per loop turn registers with the tokens' shared Notify
        // on every message.
        let killed = kill.cancelled();
        let stopping = stop.cancelled();
        // Batched metrics reach the shared counters within FLUSH_AFTER even when the
        // session goes quiet: armed once per batch, not per message.
        let flush_timer = tokio::time::sleep(FLUSH_AFTER);
        // The message deadline and idle timeout are looked at on a tick, not per message:
        // `msgs` counts requests, and a tick that finds it unchanged extends the quiet.
        let tick = self.limits_tick();
        let limits_timer = tokio::time::sleep(tick);
        tokio::pin!(killed, stopping, flush_timer, limits_timer);
        let mut flush_armed = true;
        let (mut msgs, mut seen_msgs, mut quiet_since) = (0u64, 0u64, Instant::now());
        let end: Result<&str, SessionError> = loop {
            // Never in the middle of a reply being passed on in pieces.
            if draining && self.drained() && !ur.decoder().is_streaming() {
                break Ok("proxy stopping");
            }
            // The kill, seen by a busy session (an idle one is woken by `killed` below).
            if self.shared.killed.load(Ordering::Acquire) {
                break Ok("shutdown deadline passed");
            }
            if self.counters.is_dirty() && !flush_armed {
                flush_timer.as_mut().reset(Instant::now() + FLUSH_AFTER);
                flush_armed = true;
            }
            // A full outbox stops the reads that feed it (a request may be answered by the
            // proxy itself, so client reads wait on both, and on the end of a reply being
            // streamed to the client, whose pieces nothing may come between).
            let read_client = self.to_upstream.has_room()
                && self.to_client.has_room()
                && !ur.decoder().is_streaming();
            let read_upstream = self.to_client.has_room();
            self.upstream_reads(read_upstream);
            // Biased, in this order: writes; replies before new requests (finishing work
            // before taking more; each side is bounded by its outbox's room, so neither waits
            // long); then the kill, the stop and the timers, which are polled only in turns
            // where no message was ready (a timer that fires during a burst waits for its
            // end, which is the session's own traffic; the kill is also checked above).
            // Polling a token takes its lock: a message turn polls none.
            tokio::select! {
                biased;
                w = self.to_upstream.step(&mut uw), if !self.to_upstream.is_idle() => {
                    if let Err(e) = w {
                        break Err(SessionError::UpstreamIo(e));
                    }
                }
                w = self.to_client.step(&mut cw), if !self.to_client.is_idle() => {
                    if let Err(e) = w {
                        break Err(SessionError::ClientIo(e));
                    }
                }
                rep = ur.next(), if read_upstream => match rep {
                    Some(Ok(item)) => self.on_incoming(item, ur.decoder_mut()),
                    Some(Err(e)) => break Err(upstream_err(e)),
                    None => {
                        self.upstream_gone();
                        break Ok("upstream closed");
                    }
                },
                req = cr.next(), if read_client => match req {
                    Some(Ok(msg)) => {
                        msgs += 1;
                        if let Err(e) = self.request(msg).await {
                            break Err(e);
                        }
                        // The flush timer is polled only in idle turns; a client that never
                        // pauses (fire-and-forget writes have no round trip to flush on)
                        // still reaches the shared metrics every FLUSH_MSGS messages.
                        if msgs % FLUSH_MSGS == 0 && self.counters.is_dirty() {
                            self.counters.flush(&self.shared.metrics);
                        }
                    }
                    Some(Err(e)) => break Err(client_err(e)),
                    None => {
                        self.client_gone();
                        break Ok("client closed");
                    }
                },
                // The kill comes only after the stop: one token is waited on at a time.
                _ = &mut stopping, if !draining => draining = true,
                _ = &mut killed, if draining => break Ok("shutdown deadline passed"),
                _ = &mut flush_timer, if flush_armed => {
                    flush_armed = false;
                    self.counters.flush(&self.shared.metrics);
                }
                _ = &mut limits_timer => {
                    let now = Instant::now();
                    if msgs != seen_msgs {
                        (seen_msgs, quiet_since) = (msgs, now);
                    }
                    if let Some(limit) = self.overdue(cr.decoder(), now - quiet_since) {
                        self.limit_hit(limit);
                        break Ok(limit);
                    }
                    if self.to_client.stuck_for(now) >= self.config.limits.write_timeout {
                        self.limit_hit("write_timeout");
                        break Ok("write_timeout");
                    }
                    self.shrink_idle();
                    limits_timer.as_mut().reset(now + self.limits_tick());
                }
            }
            if let Err(e) = self.write_now(&mut cw, &mut uw) {
                break Err(e);
            }
        };
        // A client closed for not reading gets nothing more: a close that waited to write
        // to it would hold the session until the stop's deadline.
        let not_reading = matches!(end, Ok("write_timeout"));
        self.finish(end, cr.read_buffer().is_empty());
        if not_reading {
            self.to_client.discard();
            return;
        }
        // Boxed, like the decompression below: a session's task is as large as the largest
        // state it may ever wait in, and every idle connection pays for that size.
        Box::pin(self.close(&mut cw, &mut uw)).await;
    }

    /// One request; a large compressed one is decompressed off the workers first (this
    /// session waits for it, others do not; the kill still ends the wait).
    async fn request(&mut self, msg: bytes::Bytes) -> Result<(), SessionError> {
        let Some(req) = self.on_request(msg)? else {
            return Ok(());
        };
        Box::pin(self.inflated(req)).await
    }

    /// The rare path of [`Session::request`], boxed so its state is not part of every
    /// session's task.
    async fn inflated(&mut self, req: crate::wire::Request) -> Result<(), SessionError> {
        let kill = self.kill.clone();
        // The upstream is not read while this session waits (for a slot, too): a write's
        // reply arriving meanwhile is not waiting on the server. The loop's next turn
        // reads it again.
        self.upstream_reads(false);
        let opened = tokio::select! {
            r = self.inflate_aside(req) => r?,
            _ = kill.cancelled() => return Ok(()),
        };
        self.on_inflated(opened)
    }

    /// What is queued still goes out, and both sides are closed, unless the kill comes
    /// first (a peer that does not read cannot hold the session past it).
    async fn close<C, U>(&mut self, cw: &mut C, uw: &mut U)
    where
        C: AsyncWrite + Unpin,
        U: AsyncWrite + Unpin,
    {
        let kill = self.kill.clone();
        let close = async {
            let _ = self.to_client.drain(cw).await;
            let _ = self.to_upstream.drain(uw).await;
            let _ = cw.shutdown().await;
            let _ = uw.shutdown().await;
        };
        tokio::select! {
            biased;
            _ = close => {}
            _ = kill.cancelled() => {}
        }
    }

    /// Lets go of the room a burst of pipelined reads or writes left in the session's lists
    /// once they are empty (looked at on the limits tick, not per message).
    fn shrink_idle(&mut self) {
        if self.pending.is_empty() && self.pending.capacity() > 16 {
            self.pending = Vec::new();
        }
        self.writes.shrink_idle();
    }

    /// Everything in flight is answered and written (or an exhaust stream runs, which a
    /// stop cuts at once).
    fn drained(&self) -> bool {
        (self.outstanding == 0 || self.streaming)
            && self.to_client.is_idle()
            && self.to_upstream.is_idle()
    }

    /// Writes what the handlers queued, as far as the sockets take it now.
    fn write_now<C, U>(&mut self, cw: &mut C, uw: &mut U) -> Result<(), SessionError>
    where
        C: AsyncWrite + Unpin,
        U: AsyncWrite + Unpin,
    {
        self.to_upstream
            .write_now(uw)
            .map_err(SessionError::UpstreamIo)?;
        self.to_client.write_now(cw).map_err(SessionError::ClientIo)
    }

    /// Logs why the session ended and adds its last counts to the shared metrics.
    /// `at_message_boundary`: no part of a next request had arrived.
    fn finish(&mut self, end: Result<&str, SessionError>, at_message_boundary: bool) {
        if !self.writes.is_empty() {
            // Not progress: the watch notes it, nothing clears on it.
            self.writes.abandon();
        }
        match end {
            Ok(why) => tracing::debug!(reason = why, "session closed"),
            Err(e) if e.is_client_close(at_message_boundary) => {
                tracing::debug!(error = %e, "session closed: client went away")
            }
            Err(
                e @ (SessionError::ClientProtocol(_)
                | SessionError::ClientIo(_)
                | SessionError::ReusedRequestId(_)),
            ) => {
                tracing::warn!(error = %e, "closing client")
            }
            Err(e) => tracing::warn!(error = %e, "closing client because its upstream failed"),
        }
        self.counters.flush(&self.shared.metrics);
    }
}
