//! Large replies that nothing inspects go to the client in pieces as they arrive
//! (`wire::ReplyCodec`), so a client that does not read one leaves it in mongos's socket
//! instead of in the proxy: the upstream is read only while the client's outbox has room.
//! Replies to tracked reads and writes are read whole, since they are judged.

use bytes::Bytes;

use super::Session;
use crate::wire::{Head, Incoming, ReplyCodec};

impl Session {
    /// One message, or part of one, from the upstream.
    pub(super) fn on_incoming(&mut self, item: Incoming, codec: &mut ReplyCodec) {
        match item {
            Incoming::Message(msg) => self.on_reply(msg),
            Incoming::Large(head) => codec.stream(self.start_stream(&head)),
            Incoming::Piece(bytes) => self.to_client.push(bytes),
            Incoming::Last {
                bytes,
                more_to_come,
            } => self.end_stream(bytes, more_to_come),
        }
    }

    /// The head of a large reply: streamed when it answers no tracked read and no write or
    /// confirming read waits (their turn order needs the whole reply's bookkeeping; then
    /// the bookkeeping a whole reply gets on arrival happens now); otherwise read whole.
    fn start_stream(&mut self, head: &Head) -> bool {
        let response_to = head.header.response_to;
        if self.pending.iter().any(|t| t.request_id == response_to)
            || !self.writes.is_empty()
            || self.confirm.is_some()
        {
            return false;
        }
        if let Some(t) = self.waiting_since.take() {
            self.counters.round_trip(&self.shared.metrics, t.elapsed());
        }
        if !head.more_to_come() {
            self.finals_in += 1;
            self.began_next();
        }
        if !self.pending.is_empty() {
            self.give_up_answered();
        }
        true
    }

    /// The last piece: the reply is relayed (a stop waits for it, see `drained`).
    fn end_stream(&mut self, bytes: Bytes, more_to_come: bool) {
        self.streaming = more_to_come;
        if !more_to_come {
            self.outstanding = self.outstanding.saturating_sub(1);
        }
        self.to_client.push(bytes);
    }
}
