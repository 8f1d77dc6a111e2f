//! A large request on its way to mongos (larger than the client codec's streaming
//! threshold). One that nothing needs to look at whole goes on in pieces as it arrives
//! (`wire::StreamCodec`), so a mongos that reads nothing on the connection (one serving an
//! awaitable `hello`) leaves the rest in the client's socket, not in our memory. One that a
//! policy may need whole is held whole, within the proxy's budget of bytes held for mongos
//! (`SessionHandles::held_for_upstream`): past it, the session reads nothing more of it
//! until room comes back (backpressure), and `message_timeout` ends a wait that lasts.
//!
//! What is held per session is therefore its outboxes' room, a streamed piece, and at most
//! one large request held whole, counted in the budget until it has left the outbox and no
//! followed read keeps it.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use tokio::sync::{AcquireError, OwnedSemaphorePermit, Semaphore};
use tokio_util::codec::FramedRead;

use super::relay::Aside;
use super::{Inbound, Session, SessionError};
use crate::config::{HELD_FOR_UPSTREAM, HELD_UNIT};
use crate::stall;
use crate::wire::body::command_name_in_prefix;
use crate::wire::opmsg::MORE_TO_COME;
use crate::wire::{Head, Incoming, OpCode, StreamCodec, HEADER_LEN};

/// What a large request's head (its header and first bytes) says about it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum HeadGate {
    /// Forwarded untouched, in pieces; `expects_reply` is false for `moreToCome`.
    Pass { expects_reply: bool },
    /// A write the write-stall watch follows, forwarded untouched in pieces.
    Write,
    /// Something may need it whole: a command a policy may govern, a compressed or legacy
    /// message, a head that does not show its command name.
    Whole,
}

/// The early gates (`gate::gate`) as a large request's head can answer them: the same
/// answer the whole message would get, or [`HeadGate::Whole`] when only the whole message
/// can tell. `prefix` is the message's start (header included).
pub(super) fn head_gate(
    head: &Head,
    prefix: &[u8],
    policy_active: bool,
    watch_writes: bool,
) -> HeadGate {
    let msg = head.header.op_code == OpCode::MSG;
    let expects_reply = !(msg && head.flags & MORE_TO_COME != 0);
    if !(policy_active || watch_writes) {
        return HeadGate::Pass { expects_reply };
    }
    if !msg {
        return HeadGate::Whole;
    }
    if !expects_reply {
        return HeadGate::Pass { expects_reply };
    }
    let Some(name) = prefix.get(HEADER_LEN..).and_then(command_name_in_prefix) else {
        return HeadGate::Whole;
    };
    let write = stall::is_write_command(name);
    if watch_writes && write {
        HeadGate::Write
    } else if policy_active && !write {
        HeadGate::Whole
    } else {
        HeadGate::Pass { expects_reply }
    }
}

type Acquire = Pin<Box<dyn Future<Output = Result<OwnedSemaphorePermit, AcquireError>> + Send>>;

/// A session's share of the budget of bytes held for mongos.
#[derive(Default)]
pub(super) struct Held {
    /// The budget for the large request held whole (being read, queued, or kept by a
    /// followed read).
    permit: Option<OwnedSemaphorePermit>,
    /// Waiting for budget: the request is not read meanwhile.
    waiting: Option<Acquire>,
}

impl std::fmt::Debug for Held {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Held")
            .field("permit", &self.permit.as_ref().map(|p| p.num_permits()))
            .field("waiting", &self.waiting.is_some())
            .finish()
    }
}

impl Held {
    /// Budget for a request of `len` bytes held whole: taken now (true), or waited for
    /// (false: [`Held::acquired`] resolves once there is room). A request larger than the
    /// whole budget takes all of it.
    pub(super) fn take(&mut self, budget: &Arc<Semaphore>, len: usize, total: usize) -> bool {
        let units = len.min(total).div_ceil(HELD_UNIT);
        let units = u32::try_from(units).unwrap_or(u32::MAX);
        match budget.clone().try_acquire_many_owned(units) {
            Ok(p) => {
                self.keep(p);
                true
            }
            Err(_) => {
                self.waiting = Some(Box::pin(budget.clone().acquire_many_owned(units)));
                false
            }
        }
    }

    fn keep(&mut self, p: OwnedSemaphorePermit) {
        match self.permit.as_mut() {
            Some(held) => held.merge(p),
            None => self.permit = Some(p),
        }
    }

    /// Waiting for budget.
    pub(super) fn is_waiting(&self) -> bool {
        self.waiting.is_some()
    }

    /// Resolves once the budget waited for is taken (pending forever when none is waited
    /// for). False: the budget is gone (the proxy is stopping).
    pub(super) fn acquired(&mut self) -> impl Future<Output = bool> + '_ {
        std::future::poll_fn(move |cx| {
            let Some(w) = self.waiting.as_mut() else {
                return std::task::Poll::Pending;
            };
            let done = std::task::ready!(w.as_mut().poll(cx));
            self.waiting = None;
            std::task::Poll::Ready(match done {
                Ok(p) => {
                    self.keep(p);
                    true
                }
                Err(_) => false,
            })
        })
    }

    /// Something is counted in the budget.
    pub(super) fn holds(&self) -> bool {
        self.permit.is_some()
    }

    /// Gives the budget back (the request held whole is gone from this session).
    pub(super) fn release(&mut self) {
        self.permit = None;
    }
}

impl Session {
    /// What came from the client: a whole request, the head of a large one (streamed or
    /// held whole), or a piece of one going on in pieces.
    pub(super) fn on_client_item<CR: Inbound>(
        &mut self,
        item: Incoming,
        cr: &mut FramedRead<CR, StreamCodec>,
    ) -> Result<Option<Box<Aside>>, SessionError> {
        match item {
            Incoming::Message(msg) => return self.on_request(msg),
            Incoming::Large(head) => self.on_upload_head(&head, cr)?,
            Incoming::Piece(piece) => {
                self.life.carried();
                self.h.peers.upload_piece(piece);
            }
            Incoming::Last { bytes, .. } => {
                self.life.carried();
                self.h.peers.upload_last(bytes);
            }
        }
        Ok(None)
    }

    /// The head of a large request (`cr`'s read buffer starts with it): sent on in pieces
    /// when the early gates can answer from it, else read whole within the budget, or
    /// waited for (the client is not read meanwhile).
    fn on_upload_head<CR>(
        &mut self,
        head: &Head,
        cr: &mut FramedRead<CR, StreamCodec>,
    ) -> Result<(), SessionError> {
        let request_id = head.header.request_id;
        self.h.refuse_reused_id(request_id)?;
        let config = &self.h.config;
        let policy_active = !config.policy.is_passthrough_only();
        let gate = head_gate(head, cr.read_buffer(), policy_active, config.stall.passive);
        match gate {
            HeadGate::Pass { expects_reply } => {
                self.h.meter.forwarded();
                self.h.peers.upload(expects_reply);
            }
            HeadGate::Write => {
                self.h.meter.forwarded();
                self.h.peers.upload(true);
                self.h.follow_write(request_id);
            }
            HeadGate::Whole => {
                let len = head.header.length as usize;
                let budget = &self.h.shared.held_for_upstream;
                if self.held.take(budget, len, HELD_FOR_UPSTREAM) {
                    cr.decoder_mut().stream(false);
                } else {
                    self.h.meter.limit("held_for_upstream");
                    tracing::debug!(
                        len,
                        "large request waits for the budget of bytes held for mongos"
                    );
                }
                return Ok(());
            }
        }
        self.life.request_read();
        cr.decoder_mut().stream(true);
        Ok(())
    }

    /// The budget of a large request held whole goes back once it is gone from this
    /// session: read (the codec holds none), written (the outbox to mongos is back under its
    /// room) and kept by no followed read.
    pub(super) fn release_held(&mut self, codec: &StreamCodec) {
        let gone =
            !codec.holds_whole() && self.h.peers.to_upstream.has_room() && !self.h.reads.watching();
        if gone {
            self.held.release();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::reply::op_msg;
    use crate::wire::Header;
    use bson::rawdoc;

    fn head_of(msg: &[u8]) -> Head {
        let header = Header::parse(msg).unwrap();
        let flags = match header.op_code {
            OpCode::MSG => u32::from_le_bytes(msg[16..20].try_into().unwrap()),
            _ => 0,
        };
        Head { header, flags }
    }

    fn gate_of(msg: &[u8], policy: bool, watch: bool) -> HeadGate {
        head_gate(&head_of(msg), msg, policy, watch)
    }

    /// Each row: the request, then the gate with (policy, watch) = (off, off), (on, off),
    /// (off, on), (on, on), as `gate::gate` answers them for the whole message.
    #[test]
    fn a_head_gets_the_answer_the_whole_message_would() {
        use HeadGate::*;
        let pass = Pass {
            expects_reply: true,
        };
        let insert = op_msg(1, 0, 0, &rawdoc! { "insert": "c", "$db": "d" });
        let find = op_msg(1, 0, 0, &rawdoc! { "find": "c", "$db": "d" });
        let ping = op_msg(1, 0, 0, &rawdoc! { "ping": 1, "$db": "d" });
        let quiet = op_msg(1, 0, MORE_TO_COME, &rawdoc! { "insert": "c", "$db": "d" });
        let mut compressed = insert.to_vec();
        compressed[12..16].copy_from_slice(&OpCode::COMPRESSED.to_le_bytes());
        let no_reply = Pass {
            expects_reply: false,
        };
        let rows: [(&[u8], [HeadGate; 4]); 5] = [
            (&insert, [pass, pass, Write, Write]),
            (&find, [pass, Whole, pass, Whole]),
            (&ping, [pass, Whole, pass, Whole]),
            (&quiet, [no_reply; 4]),
            (&compressed, [pass, Whole, Whole, Whole]),
        ];
        for (msg, want) in rows {
            let got = [(false, false), (true, false), (false, true), (true, true)]
                .map(|(p, w)| gate_of(msg, p, w));
            assert_eq!(got, want, "{:?}", Header::parse(msg));
        }
    }

    #[test]
    fn a_head_that_hides_its_command_name_is_held_whole() {
        // A document sequence before the body: the name is not at the front.
        let body = op_msg(1, 0, 0, &rawdoc! { "insert": "c", "$db": "d" });
        let mut seq = body[..20].to_vec();
        seq.push(1);
        seq.extend_from_slice(&9i32.to_le_bytes());
        seq.extend_from_slice(b"docs\0");
        seq.extend_from_slice(&body[20..]);
        assert_eq!(gate_of(&seq, false, true), HeadGate::Whole);
        // Cut before the name's end.
        assert_eq!(gate_of(&body[..28], true, true), HeadGate::Whole);
    }

    #[tokio::test]
    async fn the_budget_is_taken_waited_for_and_given_back() {
        let budget = Arc::new(Semaphore::new(4));
        let mut a = Held::default();
        assert!(a.take(&budget, 3 * HELD_UNIT, 4 * HELD_UNIT));
        assert!(a.holds() && !a.is_waiting());
        let mut b = Held::default();
        // Larger than what is left: waited for.
        assert!(!b.take(&budget, 2 * HELD_UNIT, 4 * HELD_UNIT));
        assert!(b.is_waiting());
        a.release();
        assert!(b.acquired().await);
        assert!(b.holds() && !b.is_waiting());
        // Larger than the whole budget: all of it.
        b.release();
        let mut c = Held::default();
        assert!(c.take(&budget, 100 * HELD_UNIT, 4 * HELD_UNIT));
        assert_eq!(budget.available_permits(), 0);
    }
}
