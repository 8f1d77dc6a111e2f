//! What happens to a reply, in its phases:
//!
//! 1. **head**: its place in the turn order (mongos answers a connection's requests in
//!    order) and the round trip it ends; what it answers ([`Arrival`], decided once): nothing
//!    followed, a followed write (the write-stall watch hears of it), an authentication step
//!    (the connection's proof), a followed read, or the late reply to a read staleguard
//!    answered itself (dropped);
//! 2. then either the **whole** reply (at most [`JUDGE_WHOLE`] bytes when something is
//!    followed), or its **pieces**, passed on as they come, and its **last piece**; a large
//!    reply can no longer be replaced: "already relayed" is a rule of the verdict
//!    (`policy::Then::relayed`), not an exception here;
//! 3. a followed read's **end**: `policy::judge` says what it means (`word`) and what
//!    follows (`then`); the word goes through the one evidence gate ([`Handler::hear`]:
//!    the breaker, or a question to the cluster first), and `Followed::settle` turns the
//!    verdict into the read's next step, which is carried out here: the reply goes on, is
//!    replaced by the fail-fast error, waits for the cluster's answer, or the read is sent
//!    again on its next rung.
//!
//! A read that ends without a reply (client gone, upstream gone, mongos silent past its
//! limit) is judged the same way.

use bytes::Bytes;
use tokio::time::Instant;

use super::arrival::{Arrival, Found, Pieces, JUDGE_WHOLE};
use super::followed::{Followed, Next};
use super::reads::Step;
use super::witness::Witnessing;
use super::Handler;
use crate::confirm::Answer;
use crate::policy::{self, Ending, Failure, Rung, Word};
use crate::rewrite::{self, RewriteSpec};
use crate::wire::dupids::IdSet;
use crate::wire::{Head, Incoming, Reply, ReplyStatus, StreamCodec, WireError};

/// Codes mongos returns only for a read it ran, past its authorization check (stale
/// routing, a time limit met while running, no member to run it on): a reply with one
/// proves the connection, as an answer does.
const RAN: [i32; 9] = [13388, 63, 150, 249, 50, 262, 202, 89, 133];

impl Handler {
    /// One message, or part of one, from the upstream.
    pub(super) fn on_incoming(&mut self, item: Incoming, codec: &mut StreamCodec) {
        match item {
            Incoming::Message(msg) => self.on_reply(msg),
            Incoming::Large(head) => codec.stream(self.on_head(&head)),
            Incoming::Piece(bytes) => self.piece(bytes),
            // The last piece: the reply is relayed (a stop waits for it, see `drained`).
            Incoming::Last {
                bytes,
                more_to_come,
            } => self.last_piece(bytes, more_to_come),
        }
    }

    /// The reply's place in the turn order: the round trip it ends (`now`: when it
    /// arrived), and, for a final one, the turn it passes to the next request. Returns its
    /// place.
    fn turn(&mut self, more_to_come: bool, now: Instant) -> u64 {
        if let Some(waited) = self.peers.reply_arrived(now) {
            self.meter.round_trip(waited);
        }
        let place = self.peers.finals_in() + 1;
        if !more_to_come {
            self.peers.final_in();
            self.reads.began(place + 1, now);
        }
        place
    }

    /// What reply `response_to` at `place` answers (`ok`: its outcome, when readable now),
    /// with the followed read it answers, taken out of the reads.
    fn arrive(
        &mut self,
        response_to: i32,
        more_to_come: bool,
        place: u64,
        ok: impl FnOnce() -> Option<bool>,
    ) -> (Arrival, Option<Followed>) {
        let arrival = if !self.reads.writes.is_empty() && {
            let seen = (response_to, !more_to_come, self.peers.finals_in());
            let watch = &self.shared.stall;
            self.reads.writes.replied(watch, seen, ok, Instant::now())
        } {
            (Arrival::Write, None)
        } else if let Some(step) = self.reads.proof_replied(response_to, place) {
            (Arrival::Proof(step), None)
        } else {
            match self.reads.answered(response_to, place) {
                // Dropped with its reply: staleguard answered it already.
                Some(f) if f.expired() => (Arrival::Late, None),
                Some(f) => (Arrival::Read, Some(f)),
                None => (Arrival::Nothing, None),
            }
        };
        self.give_up_passed();
        arrival
    }

    /// The head of a large reply: streamed, unless it may answer something followed and is
    /// small enough to be judged whole ([`JUDGE_WHOLE`]); then it is read whole.
    fn on_head(&mut self, head: &Head) -> bool {
        let response_to = head.header.response_to;
        let followed = !self.reads.none() && self.reads.may_answer_any(response_to);
        if followed && head.header.length as usize <= JUDGE_WHOLE {
            return false;
        }
        let place = self.turn(head.more_to_come(), Instant::now());
        if !followed {
            self.give_up_passed();
            return true;
        }
        let (arrival, mut read) = self.arrive(response_to, head.more_to_come(), place, || None);
        if let Some(f) = read.as_mut() {
            // What needs only mongos's answer happens now: a client taking the reply slowly
            // holds nothing another client needs.
            if f.head() {
                self.witnessing().release_sample(f);
            }
        }
        let max = self.config.max_message_size;
        self.pieces = Pieces::start(arrival, read, max).map(Box::new);
        true
    }

    /// A piece of a large reply, on its way to the client.
    fn piece(&mut self, bytes: Bytes) {
        match self.pieces.as_mut() {
            Some(p) if p.discard => return,
            Some(p) => p.feed(&bytes),
            None => {}
        }
        self.peers.piece(bytes);
    }

    /// The last piece: what the reply answers is judged, then the piece goes on.
    fn last_piece(&mut self, bytes: Bytes, more_to_come: bool) {
        if let Some(mut p) = self.pieces.take() {
            if p.discard {
                tracing::debug!("late reply to a read staleguard answered itself: dropped");
                return;
            }
            p.feed(&bytes);
            let at = p.at;
            let (found, read, write) = p.finish();
            if write {
                let ok = found.as_ref().is_ok_and(|(s, _)| s.ok);
                self.reads.writes.outcome(ok);
            }
            if let Some(f) = read {
                let status = self.orphans(&f, found);
                self.end(f, status, at, true, None);
            }
        }
        self.peers.reply(bytes, more_to_come);
    }

    /// One whole reply from the upstream.
    fn on_reply(&mut self, msg: Bytes) {
        let reply = Reply::new(msg);
        // One reading of the clock for the reply: its round trip, the next read's start,
        // the time its read is judged at.
        let now = Instant::now();
        let place = self.turn(reply.more_to_come(), now);
        if self.reads.none() {
            return self.send_to_client(reply);
        }
        let max = self.config.max_message_size;
        let ok = || Some(reply.status(max).is_ok_and(|s| s.ok));
        match self.arrive(reply.response_to(), reply.more_to_come(), place, ok) {
            (Arrival::Read, Some(f)) => {
                let status = self.status(&f, &reply);
                let frame = reply.frame().clone();
                if !self.end(f, status, now, false, Some(frame)) {
                    self.send_to_client(reply)
                }
            }
            (Arrival::Proof(step), _) => {
                let proves = match step {
                    Step::Auth => reply.auth_accepted(max),
                    Step::Read => reply
                        .status(max)
                        .is_ok_and(|s| s.ok || s.code.is_some_and(|c| RAN.contains(&c))),
                };
                if proves {
                    self.reads.proof.prove();
                }
                self.send_to_client(reply)
            }
            (Arrival::Late, _) => {
                tracing::debug!("late reply to a read staleguard answered itself: dropped")
            }
            (Arrival::Nothing | Arrival::Write | Arrival::Read, _) => self.send_to_client(reply),
        }
    }

    fn send_to_client(&mut self, reply: Reply) {
        let more = reply.more_to_come();
        self.peers.reply(reply.into_frame(), more);
    }

    /// A followed read's reply status; an `available` answer is also examined for documents
    /// returned twice (orphans), in the same pass over its body.
    fn status(&mut self, f: &Followed, reply: &Reply) -> Result<ReplyStatus, WireError> {
        let max = self.config.max_message_size;
        if !f.scans_orphans() {
            return reply.status(max);
        }
        let cap = super::reads::ORPHAN_SCAN_CAP;
        let scan = |ids: &mut IdSet| reply.status_and_duplicates(max, ids, cap);
        let found = self.reads.scan(scan);
        self.orphans(f, found)
    }

    /// The status found, the orphans counted.
    fn orphans(&mut self, f: &Followed, found: Found) -> Result<ReplyStatus, WireError> {
        found.map(|(status, dups)| {
            if let Some(n) = dups {
                if n.duplicates > 0 {
                    crate::logs::sampled!(info, ns = %f.ns(), duplicates = n.duplicates, examined = n.examined, skipped = n.skipped, "available reply holds documents twice (orphans)");
                }
                self.meter.orphans(f.ns(), u64::from(n.duplicates));
            }
            status
        })
    }

    /// The end of a followed read's attempt: its reply's `status` (`at` when mongos
    /// answered; `relayed`: it went to the client already), judged and settled; `frame`:
    /// the reply, held back while the read waits for an answer. True when the reply is
    /// replaced (a resend, a question, staleguard's own error).
    fn end(
        &mut self,
        f: Followed,
        status: Result<ReplyStatus, WireError>,
        at: Instant,
        relayed: bool,
        frame: Option<Bytes>,
    ) -> bool {
        let ending = match &status {
            Ok(s) => Ending::Reply(s),
            Err(e) => {
                tracing::debug!(ns = %f.ns(), error = %e, "reply to a followed read not judged");
                Ending::Unreadable
            }
        };
        if let Ok(s) = &status {
            if s.ok || s.code.is_some_and(|c| RAN.contains(&c)) {
                // mongos let this connection read: it has proved itself.
                self.reads.proof.prove();
            }
        }
        let answered = status.as_ref().is_ok_and(|s| s.ok);
        if f.rung() != Rung::First {
            let result = if answered { "answered" } else { "failed" };
            self.meter.ladder_attempt(f.ns(), f.rung().as_str(), result);
        }
        let verdict = self.verdict(&f, ending, at);
        let in_path = matches!(verdict.then, policy::Then::Confirm) && !relayed;
        // A whole reply's arrival time is now still (its one clock read); the end of one
        // passed on in pieces came after its head's.
        let now = if relayed { Instant::now() } else { at };
        self.witnessing().hear(&f, &verdict.word, in_path, now);
        if answered && matches!(verdict.then, policy::Then::Reply) {
            self.meter.answered(f.ns());
        }
        let (ns, request_id) = (f.ns().clone(), f.request_id());
        let (next, spare) = f.settle_spare(&verdict, relayed, |f| self.claim_ladder(f.ns()));
        if spare.is_some() {
            self.reads.spare = spare;
        }
        let failure = match verdict.word {
            Word::Ask(failure) => Some(failure),
            _ => None,
        };
        self.take_step(next, &ns, request_id, failure, frame)
    }

    /// What `f`'s ending comes to (`policy::judge`); in a dry run, what it would have come
    /// to is counted and the reply stands.
    fn verdict<'s>(
        &mut self,
        f: &Followed,
        ending: Ending<'s>,
        at: Instant,
    ) -> policy::Verdict<'s> {
        let verdict = policy::judge(&f.read(), ending, at);
        if !f.dry() {
            return verdict;
        }
        let (held, would) = policy::dry_verdict(verdict);
        if let Some(action) = would {
            tracing::debug!(ns = %f.ns(), command = %f.command(), action, dry_run = true, "would climb (dry run)");
            self.meter.dry_run(f.ns(), action);
        }
        held
    }

    /// The one evidence gate, as this connection's (`witness.rs`).
    pub(super) fn witnessing(&mut self) -> Witnessing<'_> {
        Witnessing {
            shared: &self.shared,
            meter: &self.meter,
            reads: &mut self.reads,
            conn: self.id,
            upstream: &self.upstream,
        }
    }

    /// Carries out a followed read's next step; true when its reply is replaced.
    fn take_step(
        &mut self,
        next: Next,
        ns: &str,
        request_id: i32,
        failure: Option<Failure<'_>>,
        frame: Option<Bytes>,
    ) -> bool {
        match next {
            Next::Reply => false,
            Next::NoTime(rung) => {
                self.meter.ladder_not_sent(ns, rung.as_str(), "no_time");
                crate::logs::sampled!(info, ns = %ns, rung = rung.as_str(), "no time left for the next rung, returning the error");
                false
            }
            Next::FailFast(reply) => {
                self.meter.fail_fast(ns);
                tracing::debug!(ns = %ns, code = reply.code, errmsg = %reply.errmsg, "fail fast: strict read under an open breaker's bound failed");
                let out = reply.to_message(self.shared.ids.request_id(), request_id);
                self.peers.answer_instead(out);
                true
            }
            Next::Silent(f, reply) => {
                self.meter.upstream_silent(&self.upstream);
                let out = reply.to_message(self.shared.ids.request_id(), request_id);
                self.peers.answer_instead(out);
                // Followed on, expired: its late reply is dropped when it comes.
                self.reads.follow(f);
                true
            }
            Next::Resend(f, to, spec) => self.resend(f, to, &spec),
            Next::Ask(f) => match (failure, frame) {
                (Some(failure), Some(frame)) => {
                    self.ask(f, &failure, frame);
                    true
                }
                // Nothing to ask with, or no reply to hold back: the reply goes on.
                _ => false,
            },
        }
    }

    /// The read waits, its reply `frame` held back, for the cluster's answer to the
    /// question its own time limit raised (`on_answer` settles it).
    fn ask(&mut self, f: Followed, failure: &Failure<'_>, frame: Bytes) {
        tracing::debug!(ns = %f.ns(), command = %f.command(), "staleguard's own limit cut the read: asking the cluster before the next rung");
        let mut q = self.witnessing().question(&f, failure, None);
        let (token, tx) = self.reads.park(f, frame);
        q.reply = Some((tx, token));
        if !self.shared.confirmer.ask(q) {
            self.meter.confirm("skipped");
            self.on_answer(Answer {
                token,
                confirmed: false,
            });
        }
    }

    /// The cluster answered a parked read's question: its next step.
    pub(super) fn on_answer(&mut self, answer: Answer) {
        let Some(p) = self.reads.unpark(answer.token) else {
            return;
        };
        let (ns, request_id) = (p.read.ns().clone(), p.read.request_id());
        let now = Instant::now();
        let next = p
            .read
            .answered(answer.confirmed, now, |f| self.claim_ladder(f.ns()));
        if !self.take_step(next, &ns, request_id, None, None) {
            // The held reply goes to the client after all.
            self.peers.reply(p.reply, false);
        }
    }

    /// Sends `f` again, to rung `to`, rewritten by `spec` (from the request opened on
    /// arrival; as it arrived when `spec` edits nothing); false when the rewrite fails and
    /// the reply goes to the client instead.
    fn resend(&mut self, mut f: Followed, to: Rung, spec: &RewriteSpec) -> bool {
        let max = self.config.max_message_size;
        let out = if *spec == RewriteSpec::default() {
            f.original().frame().clone()
        } else {
            match rewrite::rewrite_into(f.original(), spec, None, max, &mut self.rewrite_buf) {
                Ok(out) => out,
                Err(e) => {
                    tracing::warn!(ns = %f.ns(), error = %e, "cannot rewrite for the next rung, returning the error");
                    return false;
                }
            }
        };
        let (ns, command, ms) = (f.ns().clone(), f.command().to_string(), spec.max_time_ms);
        match to {
            Rung::Primary => {
                crate::logs::sampled!(info, ns = %ns, command = %command, max_time_ms = ?ms, "resending to the primary (ladder)")
            }
            Rung::Again => {
                tracing::debug!(ns = %ns, command = %command, max_time_ms = ?ms, "breaker open: bounded read failed, sending it once more under the bound")
            }
            Rung::First => {
                tracing::debug!(ns = %ns, command = %command, max_time_ms = ?ms, "the cluster answered: read sent again unchanged")
            }
            Rung::Available => {
                crate::logs::sampled!(info, ns = %ns, command = %command, kind = "retry", max_time_ms = ?ms, "resending with readConcern available");
                self.meter.retry_rewrite(&ns);
            }
        }
        let at_once = self.peers.all_answered();
        let seq = self.peers.send_own(out);
        f.sent(to, spec, seq, at_once);
        self.reads.follow(f);
        true
    }

    /// Followed reads whose turn for a reply has passed (mongos answered them with a
    /// `responseTo` that names another request): nothing can be judged of them, so they
    /// leave instead of waiting forever (a sample lets the next one go).
    fn give_up_passed(&mut self) {
        if self.reads.no_pending() {
            return;
        }
        for f in self.reads.passed(self.peers.finals_in()) {
            if !f.expired() {
                tracing::warn!(ns = %f.ns(), command = %f.command(), request_id = f.request_id(), "followed read answered with another responseTo; not judged");
            }
            if f.sample() {
                self.witnessing().release_sample(&f);
            }
        }
    }

    /// Followed reads mongos left unanswered past their limit and a grace: the client gets
    /// staleguard's own answer (`policy::Then::Silent`), and the breaker a question.
    pub(super) fn on_deadline(&mut self, now: Instant) {
        for token in self.reads.overdue_answers(now) {
            self.meter.confirm("unknown");
            self.on_answer(Answer {
                token,
                confirmed: false,
            });
        }
        for f in self.reads.silent(now) {
            tracing::warn!(ns = %f.ns(), command = %f.command(), upstream = %self.upstream, "mongos silent past the read's limit: answering the client");
            self.shared.upstreams.silent(&self.upstream);
            self.end_without_reply(f, Ending::Silent, now);
        }
    }

    /// The client left with followed reads unanswered.
    pub(super) fn client_gone(&mut self) {
        self.judge_all(Ending::ClientGone);
    }

    /// The upstream connection ended with followed reads unanswered.
    pub(super) fn upstream_gone(&mut self) {
        self.judge_all(Ending::UpstreamGone);
    }

    /// The session ends: every followed read (and a large reply half passed on) ends
    /// `ending`; nothing more is sent.
    fn judge_all(&mut self, ending: Ending<'_>) {
        let now = Instant::now();
        let half = self.pieces.take().and_then(|p| p.read);
        for f in half.into_iter().chain(self.reads.take_all()) {
            let verdict = policy::judge(&f.read(), ending, now);
            self.witnessing().hear(&f, &verdict.word, false, now);
        }
    }

    /// A followed read that ended without a reply while the session goes on.
    fn end_without_reply(&mut self, f: Followed, ending: Ending<'_>, now: Instant) {
        let verdict = self.verdict(&f, ending, now);
        self.witnessing().hear(&f, &verdict.word, false, now);
        let (ns, request_id) = (f.ns().clone(), f.request_id());
        let next = f.settle(&verdict, false, |_| None);
        self.take_step(next, &ns, request_id, None, None);
    }

    /// Whether the relay reads the upstream in this turn: when it does not (the client's
    /// outbox is full, or the session waits on a decompression of the client's), a reply
    /// that did arrive may wait in the socket, so the writes stop counting as waiting. A
    /// compare per turn; the clock only on a change.
    pub(super) fn upstream_reads(&mut self, reading: bool) {
        let writes = &mut self.reads.writes;
        if writes.is_paused() == reading {
            writes.set_paused(!reading, &self.shared.stall, Instant::now());
        }
    }
}
