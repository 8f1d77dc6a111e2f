//! The write-stall watch's view of this connection (`stall::WriteTracker`): a write waits
//! from its turn at mongos (every earlier request of the connection that expects a final
//! reply has had it) until any reply to it arrives, and not while the relay holds replies
//! back because the client does not read them. Only writes pay for this.

use bytes::Bytes;
use tokio::time::Instant;

use super::Session;
use crate::wire::Reply;

impl Session {
    /// Forwards a write untouched and follows it.
    pub(super) fn send_write(&mut self, request_id: i32, frame: Bytes) {
        self.pass(frame, true);
        let (watch, upstream) = (&self.shared.stall, &self.upstream);
        let turn = (request_id, self.sent_finals, self.finals_in);
        self.writes.sent(watch, upstream, turn, Instant::now());
    }

    /// A reply from the upstream (`finals_in` already counts it), while writes are
    /// followed: it may answer one, and a final reply passes the turn to the next write.
    /// True when it answered a followed write.
    pub(super) fn write_replied(&mut self, reply: &Reply) -> bool {
        let max = self.config.max_message_size;
        let ok = || reply.status(max).is_ok_and(|s| s.ok);
        let seen = (reply.response_to(), !reply.more_to_come(), self.finals_in);
        self.writes
            .replied(&self.shared.stall, seen, ok, Instant::now())
    }

    /// Whether the relay reads the upstream in this turn: when it does not (the client's
    /// outbox is full, or the session waits on a decompression of the client's), a reply
    /// that did arrive may wait in the socket, so the writes stop counting as waiting. A
    /// compare per turn; the clock only on a change.
    pub(super) fn upstream_reads(&mut self, reading: bool) {
        if self.writes.is_paused() == reading {
            self.writes
                .set_paused(!reading, &self.shared.stall, Instant::now());
        }
    }
}
