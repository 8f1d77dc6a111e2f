//! The relay loop: one `select!` over everything the session waits on, whose wake-up is
//! turned into an [`Event`] and handed to its owner: a request or a reply to the handler
//! (`request.rs`, `reply.rs`), a write step to the peers (`peers`), the stop, the kill and
//! the deadlines to the lifecycle (`life`). Writes never block it (see `outbox`). A stop
//! lets requests in flight finish; the kill (the stop's deadline) ends the session whatever
//! the peers do, reading or not.

use bytes::Bytes;
use futures::StreamExt;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::time::Instant;
use tokio_util::codec::FramedRead;

use super::counters::FLUSH_AFTER;
use super::life::{self, Life, Limit};
use super::{client_err, gate, upstream_err, Session, SessionError};
use crate::wire::codec::FrameError;
use crate::wire::{Incoming, MessageCodec, ReplyCodec, Request};

/// Initial read-buffer size per direction; grows to the message size when needed, and
/// goes back after a message larger than `wire::codec::SHRINK_AFTER`.
pub(super) const READ_BUFFER: usize = 8 * 1024;

/// Replies larger than this that nothing inspects go to the client in pieces (`reply.rs`).
const STREAM_ABOVE: usize = 64 * 1024;

/// The upstream side's decoder.
pub(super) fn reply_codec(max_message_size: usize) -> ReplyCodec {
    ReplyCodec::new(max_message_size, STREAM_ABOVE)
}

/// What woke the loop.
enum Event {
    /// A write step to one peer ended.
    Wrote(Result<(), SessionError>),
    Reply(Option<Result<Incoming, FrameError>>),
    Request(Option<Result<Bytes, FrameError>>),
    Stop,
    Kill,
    Flush,
    Tick,
    /// Time to look at the followed reads' deadlines (mongos silent past a read's limit).
    ReadsDue,
    /// The cluster answered a question a parked read waits on.
    Answer(Option<crate::confirm::Answer>),
}

/// While reads are followed, their deadlines are looked at this often (a coarse tick, not
/// a timer per read): staleguard answers a read mongos left silent within this of its
/// limit and grace.
const READS_TICK: std::time::Duration = std::time::Duration::from_millis(100);

/// What a turn comes to: `Ok(None)` goes on; `Ok(Some(why))` ends the session as it should,
/// `Err` as it should not.
type Turn = Result<Option<&'static str>, SessionError>;

impl Session {
    /// Relays until either side ends, the client misbehaves, or the proxy stops.
    pub async fn pump<CR, CW, UR, UW>(self, cr: CR, cw: CW, ur: UR, uw: UW)
    where
        CR: AsyncRead + Unpin,
        CW: AsyncWrite + Unpin,
        UR: AsyncRead + Unpin,
        UW: AsyncWrite + Unpin,
    {
        let max = self.h.config.max_message_size;
        let cr = FramedRead::with_capacity(cr, MessageCodec::new(max), READ_BUFFER);
        let ur = FramedRead::with_capacity(ur, reply_codec(max), READ_BUFFER);
        Box::new(self).relay_framed(cr, cw, ur, uw, None).await;
    }

    /// The relay over framed readers; `first` is a request read before the upstream was
    /// dialed. Gives the session back once it is over.
    pub(super) async fn relay_framed<CR, CW, UR, UW>(
        mut self: Box<Self>,
        mut cr: FramedRead<CR, MessageCodec>,
        mut cw: CW,
        mut ur: FramedRead<UR, ReplyCodec>,
        mut uw: UW,
        first: Option<Bytes>,
    ) -> Box<Self>
    where
        CR: AsyncRead + Unpin,
        CW: AsyncWrite + Unpin,
        UR: AsyncRead + Unpin,
        UW: AsyncWrite + Unpin,
    {
        if let Some(first) = first {
            if let Err(e) = self.request(first).await {
                self.finish(Err(e), true);
                Box::pin(self.close(&mut cw, &mut uw)).await;
                return self;
            }
        }
        let (kill, stop) = (self.life.kill.clone(), self.life.stop.clone());
        // Built once: re-creating them per loop turn registers with the tokens' shared Notify
        // on every message.
        let (killed, stopping) = (kill.cancelled(), stop.cancelled());
        // Batched metrics reach the shared metrics within FLUSH_AFTER even when the session
        // goes quiet: armed once per batch, not per message. The deadlines are looked at on
        // a tick, not per message.
        let flush_timer = tokio::time::sleep(FLUSH_AFTER);
        let limits_timer = tokio::time::sleep(life::limits_tick(&self.h.config.limits));
        // Armed while reads are followed, once per tick, never per message.
        let reads_timer = tokio::time::sleep(READS_TICK);
        let mut reads_armed = false;
        tokio::pin!(killed, stopping, flush_timer, limits_timer, reads_timer);
        let end: Result<&str, SessionError> = loop {
            let streaming = ur.decoder().is_streaming();
            if let Some(why) = self.over(streaming) {
                break Ok(why);
            }
            if self.life.rearm_flush(self.h.meter.is_dirty()) {
                flush_timer.as_mut().reset(Instant::now() + FLUSH_AFTER);
            }
            if !reads_armed && self.h.reads.watching() {
                reads_timer.as_mut().reset(Instant::now() + READS_TICK);
                reads_armed = true;
            }
            let (read_client, read_upstream) = self.reading(streaming);
            let (draining, flush_armed) = (self.life.is_draining(), self.life.flush_armed());
            let asking = self.h.reads.asking();
            let p = &mut self.h.peers;
            let reads = &mut self.h.reads;
            // Biased, in this order: writes; replies before new requests (finishing work
            // before taking more; each side is bounded by its outbox's room, so neither waits
            // long); then the kill, the stop and the timers, which are polled only in turns
            // where no message was ready (a timer that fires during a burst waits for its
            // end, which is the session's own traffic; the kill is also checked above).
            // Polling a token takes its lock: a message turn polls none. The kill comes
            // only after the stop: one token is waited on at a time.
            let event = tokio::select! {
                biased;
                w = p.to_upstream.step(&mut uw), if !p.to_upstream.is_idle() => {
                    Event::Wrote(w.map_err(SessionError::UpstreamIo))
                }
                w = p.to_client.step(&mut cw), if !p.to_client.is_idle() => {
                    Event::Wrote(w.map_err(SessionError::ClientIo))
                }
                rep = ur.next(), if read_upstream => Event::Reply(rep),
                answer = reads.next_answer(), if asking => Event::Answer(answer),
                req = cr.next(), if read_client => Event::Request(req),
                _ = &mut stopping, if !draining => Event::Stop,
                _ = &mut killed, if draining => Event::Kill,
                _ = &mut flush_timer, if flush_armed => Event::Flush,
                _ = &mut limits_timer => Event::Tick,
                _ = &mut reads_timer, if reads_armed => Event::ReadsDue,
            };
            match event {
                Event::Tick => {
                    let tick = life::limits_tick(&self.h.config.limits);
                    limits_timer.as_mut().reset(Instant::now() + tick);
                }
                Event::ReadsDue => reads_armed = false,
                _ => {}
            }
            match self.handle(event, &mut cr, &mut ur).await {
                Ok(None) => {}
                Ok(Some(why)) => break Ok(why),
                Err(e) => break Err(e),
            }
            if let Err(e) = self.h.peers.write_now(&mut cw, &mut uw) {
                break Err(e);
            }
        };
        // A client closed for not reading gets nothing more: a close that waited to write
        // to it would hold the session until the stop's deadline.
        let not_reading = matches!(end, Ok("write_timeout"));
        self.finish(end, cr.read_buffer().is_empty());
        if not_reading {
            self.h.peers.to_client.discard();
            return self;
        }
        // Boxed, like the decompression below: a session's task is as large as the largest
        // state it may ever wait in, and every idle connection pays for that size.
        Box::pin(self.close(&mut cw, &mut uw)).await;
        self
    }

    /// Hands what woke the loop to its owner.
    async fn handle<CR, UR>(
        &mut self,
        event: Event,
        cr: &mut FramedRead<CR, MessageCodec>,
        ur: &mut FramedRead<UR, ReplyCodec>,
    ) -> Turn
    where
        CR: AsyncRead + Unpin,
        UR: AsyncRead + Unpin,
    {
        match event {
            Event::Wrote(w) => w.map(|()| None),
            Event::Reply(Some(Ok(item))) => {
                self.h.on_incoming(item, ur.decoder_mut());
                Ok(None)
            }
            Event::Reply(Some(Err(e))) => Err(upstream_err(e)),
            Event::Reply(None) => {
                self.h.upstream_gone();
                Ok(Some("upstream closed"))
            }
            Event::Request(Some(Ok(msg))) => self.on_request(msg).await,
            Event::Request(Some(Err(e))) => Err(client_err(e)),
            Event::Request(None) => {
                self.h.client_gone();
                Ok(Some("client closed"))
            }
            Event::Stop => {
                self.life.drain();
                Ok(None)
            }
            Event::Kill => Ok(Some("shutdown deadline passed")),
            Event::Flush => {
                self.life.flushed();
                self.h.meter.flush();
                Ok(None)
            }
            Event::Tick => Ok(self.on_tick(cr.decoder(), Instant::now())),
            Event::ReadsDue => {
                self.h.on_deadline(Instant::now());
                Ok(None)
            }
            Event::Answer(Some(answer)) => {
                self.h.on_answer(answer);
                Ok(None)
            }
            Event::Answer(None) => Ok(None),
        }
    }

    /// Which peers are read in this turn. A full outbox stops the reads that feed it (a
    /// request may be answered by the proxy itself, so client reads wait on both outboxes,
    /// and on the end of a reply being streamed to the client, whose pieces nothing may come
    /// between); the write-stall watch hears whether the upstream is read.
    fn reading(&mut self, streaming: bool) -> (bool, bool) {
        let read_client = self.h.peers.room_for_requests() && !streaming;
        let read_upstream = self.h.peers.room_for_replies();
        self.h.upstream_reads(read_upstream);
        (read_client, read_upstream)
    }

    /// The session is over before this turn: a stop has nothing left to wait for (never in
    /// the middle of a reply being passed on in pieces, `streaming`), or the kill came (seen
    /// by a busy session; an idle one is woken by the token).
    fn over(&self, streaming: bool) -> Option<&'static str> {
        if self.life.is_draining() && self.h.peers.drained() && !streaming {
            return Some("proxy stopping");
        }
        if Life::killed(&self.h.shared.killed) {
            return Some("shutdown deadline passed");
        }
        None
    }

    /// One request from the client (the batched metrics flushed every so many: a client
    /// that never pauses has no round trip to flush on).
    async fn on_request(&mut self, msg: Bytes) -> Turn {
        let flush_due = self.life.request_read();
        self.request(msg).await?;
        if flush_due && self.h.meter.is_dirty() {
            self.h.meter.flush();
        }
        Ok(None)
    }

    /// One request; a large compressed one is decompressed off the workers first (this
    /// session waits for it, others do not; the kill still ends the wait).
    async fn request(&mut self, msg: Bytes) -> Result<(), SessionError> {
        let Some(req) = self.h.on_request(msg)? else {
            return Ok(());
        };
        Box::pin(self.inflated(req)).await
    }

    /// The rare path of [`Session::request`], boxed so its state is not part of every
    /// session's task.
    async fn inflated(&mut self, req: Request) -> Result<(), SessionError> {
        let kill = self.life.kill.clone();
        // The upstream is not read while this session waits (for a slot, too): a write's
        // reply arriving meanwhile is not waiting on the server. The loop's next turn
        // reads it again.
        self.h.upstream_reads(false);
        let h = &self.h;
        let (slots, max) = (&h.shared.inflate_slots, h.config.max_message_size);
        let opened = tokio::select! {
            r = gate::inflate_aside(req, slots, max, &h.meter) => r?,
            _ = kill.cancelled() => return Ok(()),
        };
        self.h.on_inflated(opened)
    }

    /// The deadlines, on their tick: a message too slow to arrive, a client idle too long,
    /// a client that takes nothing written to it; otherwise the lists a burst left are let
    /// go of.
    fn on_tick(&mut self, codec: &MessageCodec, now: Instant) -> Option<Limit> {
        let quiet = self.life.quiet_for(now);
        let idle = self.h.peers.nothing_outstanding();
        let limits = self.h.config.limits;
        let limit = life::overdue(&limits, codec, quiet, idle).or_else(|| {
            let stuck = self.h.peers.to_client.stuck_for(now) >= limits.write_timeout;
            stuck.then_some("write_timeout")
        });
        match limit {
            Some(limit) => self.limit_hit(limit),
            None => self.h.reads.shrink_idle(),
        }
        limit
    }

    /// What is queued still goes out, and both sides are closed, unless the kill comes
    /// first (a peer that does not read cannot hold the session past it).
    async fn close<C, U>(&mut self, cw: &mut C, uw: &mut U)
    where
        C: AsyncWrite + Unpin,
        U: AsyncWrite + Unpin,
    {
        let kill = self.life.kill.clone();
        tokio::select! {
            biased;
            _ = self.h.peers.close(cw, uw) => {}
            _ = kill.cancelled() => {}
        }
    }

    /// Logs why the session ended and adds its last counts to the shared metrics.
    /// `at_message_boundary`: no part of a next request had arrived.
    fn finish(&mut self, end: Result<&str, SessionError>, at_message_boundary: bool) {
        if !self.h.reads.writes.is_empty() {
            // Not progress: the watch notes it, nothing clears on it.
            self.h.reads.writes.abandon();
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
        self.h.meter.flush();
    }
}
