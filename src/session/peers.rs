//! The pair of peers as the session writes to them: one outbox each (`outbox`), and the turn
//! order of the conversation with mongos, which answers a connection's requests in order:
//! the requests sent that expect a final reply, the final replies received, and what the
//! client still waits for (a graceful stop waits for it).

use std::time::Duration;

use bytes::Bytes;
use tokio::io::AsyncWriteExt;
use tokio::time::Instant;

use super::outbox::Outbox;
use super::{Outbound, SessionError};

#[derive(Debug, Default)]
pub(super) struct Peers {
    /// Messages waiting to be written, per peer: the loop never waits on a write.
    pub(super) to_upstream: Outbox,
    pub(super) to_client: Outbox,
    /// Requests sent upstream that expect a final reply, and final replies received: mongos
    /// answers a connection's requests in order, so a request's place among them says which
    /// reply is its own.
    sent_finals: u64,
    finals_in: u64,
    /// Client requests sent that still expect a final reply (for a graceful stop).
    outstanding: u32,
    /// The last reply relayed had moreToCome (an exhaust stream is running).
    streaming: bool,
    /// When the oldest request still waiting for its first reply was forwarded.
    waiting_since: Option<Instant>,
    /// A client's large request is going to mongos in pieces (`upload`): nothing may go
    /// between them.
    uploading: bool,
    /// The proxy's own requests (a resend, a confirming read) that came meanwhile; they
    /// follow the last piece.
    own_after_upload: Vec<Bytes>,
}

impl Peers {
    /// A client's request to mongos; `expects_reply` is false for `moreToCome`.
    pub(super) fn forward(&mut self, msg: Bytes, expects_reply: bool) {
        self.sent(expects_reply);
        self.to_upstream.push(msg);
    }

    /// A client's request is sent: its place among those that expect a final reply.
    fn sent(&mut self, expects_reply: bool) {
        if expects_reply {
            self.sent_finals += 1;
            self.outstanding += 1;
            if self.waiting_since.is_none() {
                self.waiting_since = Some(Instant::now());
            }
        }
    }

    /// A client's large request going to mongos in pieces: counted as sent now (its place
    /// is taken), its pieces follow ([`Peers::upload_piece`], [`Peers::upload_last`]).
    pub(super) fn upload(&mut self, expects_reply: bool) {
        self.sent(expects_reply);
        self.uploading = true;
    }

    pub(super) fn upload_piece(&mut self, piece: Bytes) {
        self.to_upstream.push(piece);
    }

    /// The last piece: the proxy's own requests held meanwhile follow it.
    pub(super) fn upload_last(&mut self, piece: Bytes) {
        self.to_upstream.push(piece);
        self.uploading = false;
        for msg in self.own_after_upload.drain(..) {
            self.to_upstream.push(msg);
        }
    }

    /// A request of the proxy's own (a resend, the confirming read) that expects a final
    /// reply the client never sees; its place among the requests sent (after a large
    /// request going in pieces, when one is).
    pub(super) fn send_own(&mut self, msg: Bytes) -> u64 {
        self.sent_finals += 1;
        if self.uploading {
            self.own_after_upload.push(msg);
        } else {
            self.to_upstream.push(msg);
        }
        self.sent_finals
    }

    /// The place the next request sent will have.
    pub(super) fn next_place(&self) -> u64 {
        self.sent_finals + 1
    }

    /// Final replies received so far.
    pub(super) fn finals_in(&self) -> u64 {
        self.finals_in
    }

    /// Nothing sent is waiting for its final reply: a request sent now starts at once.
    pub(super) fn all_answered(&self) -> bool {
        self.finals_in == self.sent_finals
    }

    /// Nothing the client sent waits for its final reply.
    pub(super) fn nothing_outstanding(&self) -> bool {
        self.outstanding == 0
    }

    /// A reply (or the head of one) arrived: how long the oldest request waited for it, the
    /// first time since that request was sent.
    pub(super) fn reply_arrived(&mut self, now: Instant) -> Option<Duration> {
        self.waiting_since
            .take()
            .map(|t| now.saturating_duration_since(t))
    }

    /// A final reply arrived: its place among them (the request it answers).
    pub(super) fn final_in(&mut self) -> u64 {
        self.finals_in += 1;
        self.finals_in
    }

    /// A reply (whole, or the last piece of one) to the client; `more_to_come`: an exhaust
    /// stream goes on.
    pub(super) fn reply(&mut self, msg: Bytes, more_to_come: bool) {
        self.streaming = more_to_come;
        if !more_to_come {
            self.outstanding = self.outstanding.saturating_sub(1);
        }
        self.to_client.push(msg);
    }

    /// A piece of a large reply to the client.
    pub(super) fn piece(&mut self, msg: Bytes) {
        self.to_client.push(msg);
    }

    /// The proxy's own answer to a request it does not send (an error reply).
    pub(super) fn answer(&mut self, msg: Bytes) {
        self.to_client.push(msg);
    }

    /// The proxy's own answer in place of a reply mongos sent (and the session swallowed):
    /// the request is answered.
    pub(super) fn answer_instead(&mut self, msg: Bytes) {
        self.outstanding = self.outstanding.saturating_sub(1);
        self.streaming = false;
        self.to_client.push(msg);
    }

    /// Both outboxes have room: the client's requests may be read (a request may be
    /// answered by the proxy itself, so client reads wait on both).
    pub(super) fn room_for_requests(&self) -> bool {
        self.to_upstream.has_room() && self.to_client.has_room()
    }

    /// The client's outbox has room: replies may be read.
    pub(super) fn room_for_replies(&self) -> bool {
        self.to_client.has_room()
    }

    /// Everything in flight is answered and written (or an exhaust stream runs, which a
    /// stop cuts at once).
    pub(super) fn drained(&self) -> bool {
        (self.outstanding == 0 || self.streaming)
            && !self.uploading
            && self.to_client.is_idle()
            && self.to_upstream.is_idle()
    }

    /// Drops what waits for both peers (the session ends without sending it).
    pub(super) fn discard(&mut self) {
        self.to_client.discard();
        self.to_upstream.discard();
        self.own_after_upload = Vec::new();
    }

    /// An idle session lets go of its outboxes' slots.
    pub(super) fn trim(&mut self) {
        self.to_upstream.trim();
        self.to_client.trim();
    }

    /// Writes what the handlers queued, as far as the sockets take it now.
    pub(super) fn write_now<C, U>(&mut self, cw: &mut C, uw: &mut U) -> Result<(), SessionError>
    where
        C: Outbound,
        U: Outbound,
    {
        self.to_upstream
            .write_now(uw)
            .map_err(SessionError::UpstreamIo)?;
        self.to_client.write_now(cw).map_err(SessionError::ClientIo)
    }

    /// What is queued goes out, then both sides are closed (the caller bounds the wait).
    pub(super) async fn close<C, U>(&mut self, cw: &mut C, uw: &mut U)
    where
        C: Outbound,
        U: Outbound,
    {
        let _ = self.to_client.drain(cw).await;
        let _ = self.to_upstream.drain(uw).await;
        let _ = cw.shutdown().await;
        let _ = uw.shutdown().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg() -> Bytes {
        Bytes::from_static(b"m")
    }

    /// The turn order: a request's place among those that expect a final reply, what the
    /// client still waits for, and a stop that waits for it.
    #[test]
    fn turn_order_and_what_the_client_waits_for() {
        let mut p = Peers::default();
        assert!(p.all_answered() && p.nothing_outstanding() && p.drained());
        p.forward(msg(), true);
        // moreToCome: no reply expected, no place taken.
        p.forward(msg(), false);
        assert_eq!(p.next_place(), 2);
        assert!(!p.all_answered() && !p.nothing_outstanding());
        // The proxy's own request takes a place the client does not wait for.
        assert_eq!(p.send_own(msg()), 2);
        assert!(p.reply_arrived(Instant::now()).is_some());
        // Timed once per wait: a second reply does not count the same wait again.
        assert!(p.reply_arrived(Instant::now()).is_none());
        assert_eq!(p.final_in(), 1);
        p.reply(msg(), false);
        assert!(p.nothing_outstanding() && !p.all_answered());
        assert_eq!(p.final_in(), 2);
        assert!(p.all_answered());
        // Queued but not written: not drained.
        assert!(!p.drained());
    }

    /// An exhaust stream running counts as drained for a stop (it is cut at once), and the
    /// proxy's answer in place of a reply ends it.
    #[test]
    fn a_stream_does_not_hold_a_stop() {
        let mut p = Peers::default();
        p.forward(msg(), true);
        p.to_upstream = Outbox::default();
        p.reply(msg(), true);
        p.to_client = Outbox::default();
        assert!(p.drained());
        p.answer_instead(msg());
        p.to_client = Outbox::default();
        assert!(p.nothing_outstanding() && p.drained());
    }
}
