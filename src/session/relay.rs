//! The relay loop: one `select!` over the lifecycle (`life`) and the peers, whose wake-up
//! is turned into an [`Event`] and handed to its owner: a request or a reply to the handler
//! (`request.rs`, `reply.rs`), a write step to the peers (`peers`), the stop, the kill and
//! the timer to the lifecycle's handling below. Writes never block it (see `outbox`). A stop
//! lets requests in flight finish; the kill (the stop's deadline) ends the session whatever
//! the peers do, reading or not.

use bytes::{Bytes, BytesMut};
use tokio::time::Instant;
use tokio_util::codec::FramedRead;

use super::bell::Ear;
use super::life::{self, Limit, Wake};
use super::{client_err, gate, upstream_err, Inbound, Outbound, Session, SessionError};
use crate::wire::codec::FrameError;
use crate::wire::{Incoming, Request, StreamCodec};

/// Initial read-buffer size per direction (`wire::codec::SMALL_ROOM`): grows to the message
/// size when needed (and the room kept between messages to 8 KiB for a connection whose
/// messages did not fit), and goes back after a message larger than
/// `wire::codec::SHRINK_AFTER`, and when the session goes quiet.
pub(super) const READ_BUFFER: usize = crate::wire::codec::SMALL_ROOM;

/// Messages larger than this that nothing inspects go on in pieces: replies to the client
/// (`reply.rs`), requests to mongos (`upload`).
const STREAM_ABOVE: usize = 64 * 1024;

/// The upstream side's decoder.
pub(super) fn reply_codec(max_message_size: usize) -> StreamCodec {
    StreamCodec::replies(max_message_size, STREAM_ABOVE)
}

/// The client side's decoder.
pub(super) fn request_codec(max_message_size: usize) -> StreamCodec {
    StreamCodec::requests(max_message_size, STREAM_ABOVE)
}

/// Events a session handles in one poll of its task before it lets the other sessions of
/// its thread run: a client that floods its connection delays the others on its thread by
/// at most this many of its messages at a time (tokio's own budget is 128 socket reads,
/// and one read may hold many messages). A client that waits for its replies never comes
/// near it.
const BURST: u32 = 16;

std::thread_local! {
    /// Polls of session tasks on this thread so far: what tells a session whether its
    /// events came in one poll.
    static POLLS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// A session's task is polled: counted in `POLLS` (its caller polls the relay next).
pub(super) fn count_poll() {
    POLLS.with(|p| p.set(p.get().wrapping_add(1)));
}

/// The events handled in the current poll of the session's task.
#[derive(Debug, Default)]
struct Burst {
    poll: u64,
    events: u32,
}

impl Burst {
    /// One more event; true when the session has had its share of this poll.
    fn full(&mut self) -> bool {
        let poll = POLLS.with(std::cell::Cell::get);
        if poll != self.poll {
            (self.poll, self.events) = (poll, 0);
        }
        self.events += 1;
        self.events >= BURST
    }
}

/// What woke the loop.
enum Event {
    /// The lifecycle: the stop, the kill, the timer.
    Life(Wake),
    /// A write step to one peer ended.
    Wrote(Result<(), SessionError>),
    Reply(Option<Result<Incoming, FrameError>>),
    Request(Option<Result<Incoming, FrameError>>),
    /// The budget a large request held whole waited for came (false: it never will).
    Held(bool),
    /// The cluster answered a question a parked read waits on.
    Answer(Option<crate::confirm::Answer>),
}

/// What a turn comes to: `Done(None)` goes on, `Done(Some(why))` ends the session as it
/// should (an `Err` as it should not); `Aside`: a request waits for its decompression first.
enum Handled {
    Done(Option<&'static str>),
    Aside(Box<Aside>),
}

/// What a request leaves to do after its turn: a large compressed request is decompressed
/// off the workers first (`Session::aside`), and the batched metrics flushed after it when
/// they were due (`flush_due`). Handed on boxed: what a turn hands back is kept in the
/// session's task while the aside is waited for.
pub(super) struct Aside {
    req: Request,
    flush_due: bool,
}

impl Session {
    /// Relays until either side ends, the client misbehaves, or the proxy stops.
    pub async fn pump<CR, CW, UR, UW>(mut self, cr: CR, mut cw: CW, ur: UR, mut uw: UW)
    where
        CR: Inbound,
        CW: Outbound,
        UR: Inbound,
        UW: Outbound,
    {
        let max = self.h.config.max_message_size;
        let mut cr = FramedRead::with_capacity(cr, request_codec(max), READ_BUFFER);
        let mut ur = FramedRead::with_capacity(ur, reply_codec(max), READ_BUFFER);
        self.set_tick();
        self.relay_framed(&mut cr, &mut cw, &mut ur, &mut uw).await;
    }

    /// The deadlines are looked at on the relay's tick from now on.
    pub(super) fn set_tick(&mut self) {
        let tick = life::limits_tick(&self.h.config.limits);
        self.life.set_tick(tick, Instant::now());
    }

    /// The relay over framed readers, until either side ends, the client misbehaves, or
    /// the proxy stops.
    ///
    /// Not an `async fn`, and everything borrowed: an `async fn` keeps its arguments twice
    /// in its state (as given, and as the locals its body uses), and state a session's
    /// task holds while it waits is held by every idle connection for its whole life.
    #[allow(clippy::manual_async_fn)]
    pub(super) fn relay_framed<'a, CR, CW, UR, UW>(
        &'a mut self,
        cr: &'a mut FramedRead<CR, StreamCodec>,
        cw: &'a mut CW,
        ur: &'a mut FramedRead<UR, StreamCodec>,
        uw: &'a mut UW,
    ) -> impl std::future::Future<Output = ()> + 'a
    where
        CR: Inbound + 'a,
        CW: Outbound + 'a,
        UR: Inbound + 'a,
        UW: Outbound + 'a,
    {
        async move {
            // Each peer's read side is polled again only after it gave something or rang: a
            // turn does not take the other socket's readiness lock for nothing.
            let (mut client_ear, mut upstream_ear) = (Ear::default(), Ear::default());
            let mut burst = Burst::default();
            let end: Result<&str, SessionError> = loop {
                let streaming = ur.decoder().is_streaming();
                if let Some(why) = self.over(streaming || cr.decoder().is_streaming()) {
                    break Ok(why);
                }
                let (read_client, read_upstream) = self.reading(streaming);
                // The followed reads' deadlines (mongos silent past a read's limit) are
                // looked at on the lifecycle's timer while there are any.
                self.life.watch_reads(self.h.reads.watching());
                let asking = self.h.reads.asking();
                let Session { life, h, held, .. } = &mut *self;
                let (p, reads) = (&mut h.peers, &mut h.reads);
                let waiting = held.is_waiting();
                // Biased, in this order: the lifecycle (one load of its bell until something
                // rang, so a kill or a deadline is seen in the next turn even in a burst);
                // writes; replies before new requests (finishing work before taking more;
                // each side is bounded by its outbox's room, so neither waits long).
                let event = tokio::select! {
                    biased;
                    w = life.wake() => Event::Life(w),
                    w = p.to_upstream.step(uw), if !p.to_upstream.is_idle() => {
                        Event::Wrote(w.map_err(SessionError::UpstreamIo))
                    }
                    w = p.to_client.step(cw), if !p.to_client.is_idle() => {
                        Event::Wrote(w.map_err(SessionError::ClientIo))
                    }
                    rep = upstream_ear.next(ur), if read_upstream => Event::Reply(rep),
                    answer = reads.next_answer(), if asking => Event::Answer(answer),
                    req = client_ear.next(cr), if read_client => Event::Request(req),
                    ok = held.acquired(), if waiting => Event::Held(ok),
                };
                // The rare turn that waits (a decompression set aside) is boxed: its state is
                // not part of every session's task. (One expression: what a turn comes to is
                // not kept across the waits below.)
                match match self.handle(event, cr, ur) {
                    Ok(Handled::Aside(aside)) => Box::pin(self.aside(aside)).await.map(|()| None),
                    Ok(Handled::Done(why)) => Ok(why),
                    Err(e) => Err(e),
                } {
                    Ok(None) => {}
                    Ok(Some(why)) => break Ok(why),
                    Err(e) => break Err(e),
                }
                self.life.counted(self.h.meter.is_dirty());
                if let Err(e) = self.h.peers.write_now(cw, uw) {
                    break Err(e);
                }
                if self.held.holds() {
                    self.release_held(cr.decoder());
                }
                if burst.full() {
                    tokio::task::yield_now().await;
                }
            };
            // A peer closed for not reading gets nothing more: a close that waited to write
            // to it would hold the session until the stop's deadline. What was held for the
            // other one goes too (its requests or replies cannot be finished).
            let not_reading = matches!(end, Ok("write_timeout" | "upstream_write_timeout"));
            self.finish(end, cr.read_buffer().is_empty());
            self.held.release();
            if not_reading {
                self.h.peers.discard();
                return;
            }
            // Boxed, like the decompression above: a session's task is as large as the
            // largest state it may ever wait in, and every idle connection pays for that
            // size.
            Box::pin(self.close(cw, uw)).await;
        }
    }

    /// Hands what woke the loop to its owner.
    fn handle<CR, UR>(
        &mut self,
        event: Event,
        cr: &mut FramedRead<CR, StreamCodec>,
        ur: &mut FramedRead<UR, StreamCodec>,
    ) -> Result<Handled, SessionError>
    where
        CR: Inbound,
        UR: Inbound,
    {
        let why = match event {
            Event::Life(wake) => self.on_life(wake, cr, ur),
            Event::Wrote(w) => return w.map(|()| Handled::Done(None)),
            Event::Reply(Some(Ok(item))) => {
                self.life.carried();
                self.h.on_incoming(item, ur.decoder_mut());
                // The request it answered may have been the last frame alive of the client's
                // read buffer: the next request is read into the same allocation.
                let room = cr.decoder().reclaim_room();
                crate::wire::codec::reclaim(cr.read_buffer_mut(), room);
                None
            }
            Event::Reply(Some(Err(e))) => return Err(upstream_err(e)),
            Event::Reply(None) => {
                self.h.upstream_gone();
                Some("upstream closed")
            }
            Event::Request(Some(Ok(item))) => {
                return Ok(match self.on_client_item(item, cr)? {
                    Some(aside) => Handled::Aside(aside),
                    None => Handled::Done(None),
                })
            }
            Event::Request(Some(Err(e))) => return Err(client_err(e)),
            Event::Request(None) => {
                self.h.client_gone();
                Some("client closed")
            }
            Event::Answer(Some(answer)) => {
                self.h.on_answer(answer);
                None
            }
            Event::Answer(None) => None,
            Event::Held(true) => {
                cr.decoder_mut().stream(false);
                None
            }
            Event::Held(false) => Some("proxy stopping"),
        };
        Ok(Handled::Done(why))
    }

    /// What the lifecycle says: the stop (the session drains, `over`), the kill, or the
    /// timer: the followed reads' deadlines, the batched metrics flushed (and the buffers of
    /// a session gone quiet let go of), the deadlines kept on the client.
    fn on_life<CR, UR>(
        &mut self,
        wake: Wake,
        cr: &mut FramedRead<CR, StreamCodec>,
        ur: &mut FramedRead<UR, StreamCodec>,
    ) -> Option<&'static str> {
        match wake {
            Wake::Stop => None,
            Wake::Kill => Some("shutdown deadline passed"),
            Wake::Due { tick, flush, reads } => {
                if reads {
                    self.h.on_deadline(Instant::now());
                }
                if flush {
                    self.h.meter.flush();
                    if self.life.went_quiet() && self.h.peers.nothing_outstanding() {
                        self.trim(cr, ur);
                    }
                }
                if tick {
                    return self.on_tick(cr.read_buffer(), cr.decoder(), Instant::now());
                }
                None
            }
        }
    }

    /// A session gone quiet lets go of its buffers (read buffers, outbox slots, the
    /// followed reads' lists, the rewrite buffer): an idle connection pair holds little more
    /// than its task. The next message after it costs one small read more.
    fn trim<CR, UR>(
        &mut self,
        cr: &mut FramedRead<CR, StreamCodec>,
        ur: &mut FramedRead<UR, StreamCodec>,
    ) {
        for buf in [cr.read_buffer_mut(), ur.read_buffer_mut()] {
            if buf.is_empty() {
                *buf = BytesMut::new();
            }
        }
        cr.decoder_mut().idle();
        ur.decoder_mut().idle();
        self.h.peers.trim();
        self.h.trim();
        self.life.trimmed();
    }

    /// Which peers are read in this turn. A full outbox stops the reads that feed it (a
    /// request may be answered by the proxy itself, so client reads wait on both outboxes,
    /// and on the end of a reply being streamed to the client, whose pieces nothing may come
    /// between); the write-stall watch hears whether the upstream is read.
    fn reading(&mut self, streaming: bool) -> (bool, bool) {
        let read_client = self.h.peers.room_for_requests() && !streaming && !self.held.is_waiting();
        let read_upstream = self.h.peers.room_for_replies();
        self.h.upstream_reads(read_upstream);
        (read_client, read_upstream)
    }

    /// The session is over before this turn: a stop has nothing left to wait for (never in
    /// the middle of a reply being passed on in pieces, `streaming`).
    fn over(&self, streaming: bool) -> Option<&'static str> {
        let stopped = self.life.is_draining() && self.h.peers.drained() && !streaming;
        stopped.then_some("proxy stopping")
    }

    /// One request from the client (the batched metrics flushed every so many: a client
    /// that never pauses has no round trip to flush on); a large compressed one is left to
    /// [`Session::aside`].
    pub(super) fn on_request(&mut self, msg: Bytes) -> Result<Option<Box<Aside>>, SessionError> {
        let flush_due = self.life.request_read();
        if let Some(req) = self.h.on_request(msg)? {
            return Ok(Some(Box::new(Aside { req, flush_due })));
        }
        self.flush_if(flush_due);
        Ok(None)
    }

    fn flush_if(&mut self, due: bool) {
        if due && self.h.meter.is_dirty() {
            self.h.meter.flush();
        }
    }

    /// The rare path of [`Session::on_request`]: a large compressed request decompressed
    /// off the workers first (this session waits for it, others do not; the kill still ends
    /// the wait). Boxed by its callers, so its state is not part of every session's task.
    pub(super) async fn aside(&mut self, aside: Box<Aside>) -> Result<(), SessionError> {
        // The upstream is not read while this session waits (for a slot, too): a write's
        // reply arriving meanwhile is not waiting on the server. The loop's next turn
        // reads it again.
        self.h.upstream_reads(false);
        let Session { life, h, .. } = self;
        let (slots, max) = (&h.shared.inflate_slots, h.config.max_message_size);
        let opened = tokio::select! {
            r = gate::inflate_aside(aside.req, slots, max, &h.meter) => Some(r?),
            _ = life.killed() => None,
        };
        if let Some(opened) = opened {
            self.h.on_inflated(opened)?;
        }
        self.flush_if(aside.flush_due);
        Ok(())
    }

    /// The deadlines, on their tick: a message too slow to arrive, a client idle too long,
    /// a client that takes nothing written to it, a mongos that takes nothing written to it
    /// (`write_timeout` too: one serving an awaitable `hello` on this connection while the
    /// client piles a large request behind it); otherwise the lists a burst left are let go
    /// of. The handler's own deadlines (followed reads past their budget) are looked at on
    /// their own, shorter tick (`Wake::Due { reads }`, `Handler::on_deadline`).
    fn on_tick(&mut self, buf: &BytesMut, codec: &StreamCodec, now: Instant) -> Option<Limit> {
        let quiet = self.life.quiet_for(now);
        let p = &mut self.h.peers;
        let idle = p.nothing_outstanding();
        let limits = self.h.config.limits;
        let upstream_stuck = p.to_upstream.stuck_for(now);
        // A request going on in pieces that mongos does not take is mongos's delay, not the
        // client's (the upstream deadline below is for it).
        let waiting_on_upstream = codec.is_streaming() && !p.to_upstream.is_idle();
        let partial = (!buf.is_empty() || codec.in_large()) && !waiting_on_upstream;
        let partial_for = self.life.partial_for(now, partial);
        let limit = life::overdue(&limits, partial_for, quiet, idle)
            .or_else(|| {
                let stuck = p.to_client.stuck_for(now) >= limits.write_timeout;
                stuck.then_some("write_timeout")
            })
            .or_else(|| {
                (upstream_stuck >= limits.write_timeout).then_some("upstream_write_timeout")
            });
        match limit {
            Some(limit) => self.limit_hit(limit),
            None => self.h.reads.shrink_idle(),
        }
        limit
    }

    /// What is queued still goes out, and both sides are closed, unless the kill comes
    /// first (a peer that does not read cannot hold the session past it).
    pub(super) async fn close<C, U>(&mut self, cw: &mut C, uw: &mut U)
    where
        C: Outbound,
        U: Outbound,
    {
        let Session { life, h, .. } = self;
        tokio::select! {
            biased;
            _ = h.peers.close(cw, uw) => {}
            _ = life.killed() => {}
        }
    }

    /// Logs why the session ended and adds its last counts to the shared metrics.
    /// `at_message_boundary`: no part of a next request had arrived.
    pub(super) fn finish(&mut self, end: Result<&str, SessionError>, at_message_boundary: bool) {
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
