//! What happens to a reply, from the moment it (or the head of a large one) arrives:
//!
//! 1. its place in the turn order (mongos answers a connection's requests in order), and
//!    the round trip it ends;
//! 2. nothing followed: it goes to the client as it came; a large one in pieces
//!    (`wire::ReplyCodec`), so a client that does not read leaves it in mongos's socket;
//! 3. a followed write's answer: the write-stall watch hears of it, the client gets it;
//! 4. the confirming read's answer: judged (`confirm`), never relayed;
//! 5. a tracked read's answer: judged by `policy::judge` (pure), and the verdict carried
//!    out: the breaker, the metrics, the log; the reply goes to the client, or is replaced
//!    by the fail-fast error, or by the next rung's resend (`policy::Then`, from the request
//!    opened on arrival); an `available` reply is also looked at for orphans;
//! 6. tracked reads whose turn passed under another `responseTo` are given up.
//!
//! A read that ends without a reply (client gone, upstream gone) is judged the same way.

use tokio::time::Instant;

use super::confirm::{Ask, Confirm};
use super::judging::JUDGE_WHOLE;
use super::reads::{Tracked, ORPHAN_SCAN_CAP};
use super::Handler;
use crate::breaker::{Counted, Sample};
use crate::policy::{self, Bounded, Ending, Evidence, Failure, Heard, Rung, SampleEnd, Then};
use crate::rewrite::{self, RewriteSpec};
use crate::upstream::LadderPermit;
use crate::wire::dupids::{DupCount, IdSet};
use crate::wire::{Head, Incoming, Reply, ReplyCodec, ReplyStatus, WireError};

impl Handler {
    /// One message, or part of one, from the upstream.
    pub(super) fn on_incoming(&mut self, item: Incoming, codec: &mut ReplyCodec) {
        match item {
            Incoming::Message(msg) => self.on_reply(msg),
            Incoming::Large(head) => codec.stream(self.start_stream(&head)),
            Incoming::Piece(bytes) => self.piece(bytes),
            // The last piece: the reply is relayed (a stop waits for it, see `drained`).
            Incoming::Last {
                bytes,
                more_to_come,
            } => self.last_piece(bytes, more_to_come),
        }
    }

    /// The head of a large reply: streamed, with the bookkeeping a whole reply gets on
    /// arrival done now, unless it may answer something followed and is small enough to be
    /// judged whole ([`JUDGE_WHOLE`]), or may be the confirming read's answer (never
    /// relayed); then it is read whole. A streamed reply that answers a tracked read or a
    /// followed write is judged in pieces (`judging.rs`).
    fn start_stream(&mut self, head: &Head) -> bool {
        let response_to = head.header.response_to;
        // Its place among the final replies, as in `on_reply`.
        let place = self.peers.finals_in() + 1;
        let r = &self.reads;
        let followed = r.may_answer(response_to) || !r.writes.is_empty() || r.confirm.is_some();
        if followed {
            let confirm = r.confirm.as_ref();
            let own = confirm.is_some_and(|c| c.answered_by(response_to, place));
            if own || head.header.length as usize <= JUDGE_WHOLE {
                return false;
            }
        }
        if let Some(waited) = self.peers.reply_arrived() {
            self.meter.round_trip(waited);
        }
        if !head.more_to_come() {
            self.peers.final_in();
            self.reads.began(place + 1);
        }
        if followed {
            self.judge_in_pieces(head, place);
        } else if !self.reads.no_tracked() {
            self.give_up_passed();
        }
        true
    }

    /// One whole reply from the upstream.
    fn on_reply(&mut self, msg: bytes::Bytes) {
        if let Some(waited) = self.peers.reply_arrived() {
            self.meter.round_trip(waited);
        }
        let reply = Reply::new(msg);
        // The place this reply has among the final replies: mongos answers a connection's
        // requests in order, so it answers request number `seq`.
        let seq = self.peers.finals_in() + 1;
        if !reply.more_to_come() {
            self.peers.final_in();
            self.reads.began(seq + 1);
        }
        if self.reads.none() {
            return self.send_to_client(reply);
        }
        // The write-stall watch's turn order and progress: every final reply passes the
        // turn; one answers a write only when its id and place both match.
        if !self.reads.writes.is_empty() && self.write_replied(&reply) {
            return self.send_to_client(reply);
        }
        let response_to = reply.response_to();
        let confirm = self.reads.confirm.as_ref();
        if confirm.is_some_and(|c| c.answered_by(response_to, seq)) {
            // staleguard's own read: judged, never relayed.
            return self.on_confirm_reply(&reply);
        }
        if let Some(t) = self.reads.answered(response_to, seq) {
            if self.inspect(t, &reply) {
                // Swallowed: a resend (or staleguard's own error) went out instead.
                return;
            }
        }
        self.confirm_passed();
        self.give_up_passed();
        self.send_to_client(reply)
    }

    /// The confirming read's turn passed under another responseTo: nothing to judge.
    pub(super) fn confirm_passed(&mut self) {
        let finals_in = self.peers.finals_in();
        let confirm = self.reads.confirm.as_ref();
        if confirm.is_some_and(|c| c.passed(finals_in)) {
            self.reads.confirm = None;
            self.meter.confirm("unknown");
        }
    }

    fn send_to_client(&mut self, reply: Reply) {
        let more = reply.more_to_come();
        self.peers.reply(reply.into_frame(), more);
    }

    /// A reply (`finals_in` already counts it) while writes are followed: it may answer
    /// one, and a final reply passes the turn to the next write. True when it answered a
    /// followed write.
    fn write_replied(&mut self, reply: &Reply) -> bool {
        let max = self.config.max_message_size;
        let ok = || Some(reply.status(max).is_ok_and(|s| s.ok));
        let seen = (
            reply.response_to(),
            !reply.more_to_come(),
            self.peers.finals_in(),
        );
        let watch = &self.shared.stall;
        self.reads.writes.replied(watch, seen, ok, Instant::now())
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

    /// Tracked reads whose turn for a reply has passed (mongos answered them with a
    /// `responseTo` that names another request): nothing can be judged of them, so they
    /// leave instead of waiting forever (a probe gives its slot back).
    pub(super) fn give_up_passed(&mut self) {
        for t in self.reads.passed(self.peers.finals_in()) {
            tracing::warn!(ns = %t.ns, command = %t.command, request_id = t.request_id, "tracked read answered with another responseTo; not judged");
            if t.attempt.sample {
                self.sampled(&t, SampleEnd::Unknown);
            }
        }
    }

    /// Judges the reply to a tracked read; returns true when the reply is replaced (by a
    /// resend, or by staleguard's own error). A reply served with `available` is also
    /// examined for documents returned twice (orphans), in the same pass over its body.
    fn inspect(&mut self, t: Tracked, reply: &Reply) -> bool {
        let now = Instant::now();
        let max = self.config.max_message_size;
        let status = if t.attempt.rung == Rung::Available && t.unique_ids {
            let scan = |ids: &mut IdSet| reply.status_and_duplicates(max, ids, ORPHAN_SCAN_CAP);
            self.reads.scan(scan).map(|(status, dups)| {
                if let Some(n) = dups {
                    self.count_orphans(&t.ns, n);
                }
                status
            })
        } else {
            reply.status(max)
        };
        self.judge_status(t, status, now, false)
    }

    /// Judges `t` by its reply's `status` at `now` and carries the verdict out; returns true
    /// when the reply is replaced. `relayed`: the reply already went to the client (judged
    /// in pieces, `judging.rs`), so it stands whatever the verdict says.
    pub(super) fn judge_status(
        &mut self,
        t: Tracked,
        status: Result<ReplyStatus, WireError>,
        now: Instant,
        relayed: bool,
    ) -> bool {
        let ending = match &status {
            Ok(s) => Ending::Reply(s),
            Err(e @ WireError::Streamed(_)) => {
                tracing::debug!(ns = %t.ns, error = %e, "large reply to a tracked read not judged");
                Ending::Unreadable
            }
            Err(e) => {
                tracing::warn!(ns = %t.ns, error = %e, "cannot read reply to a tracked read");
                Ending::Unreadable
            }
        };
        let answered = status.as_ref().is_ok_and(|s| s.ok);
        let mut verdict = self.verdict(&t, ending, now);
        if relayed && !matches!(verdict.then, Then::Reply | Then::NoTime(_)) {
            tracing::info!(ns = %t.ns, command = %t.command, "reply too large to hold went to the client as it came; the next step of its read was not taken");
            verdict.then = Then::Reply;
        }
        self.apply_verdict(t, verdict, answered, now)
    }

    /// What `t`'s ending comes to (`policy::judge`); in a dry run, what it would have come
    /// to is counted and the reply stands.
    pub(super) fn verdict<'s>(
        &mut self,
        t: &Tracked,
        ending: Ending<'s>,
        now: Instant,
    ) -> policy::Verdict<'s> {
        let verdict = policy::judge(&t.read(), ending, now);
        if !t.dry {
            return verdict;
        }
        let (held, would) = policy::dry_verdict(verdict);
        if let Some(action) = would {
            tracing::debug!(ns = %t.ns, command = %t.command, action, dry_run = true, "would climb (dry run)");
            self.meter.dry_run(&t.ns, action);
        }
        held
    }

    /// Documents an `available` reply returned twice (same `_id`): orphans the proxy can
    /// see, added to the orphan estimate.
    pub(super) fn count_orphans(&mut self, ns: &str, n: DupCount) {
        if n.duplicates > 0 {
            crate::logs::sampled!(info, ns = %ns, duplicates = n.duplicates, examined = n.examined, skipped = n.skipped, "available reply holds documents twice (orphans)");
        }
        self.meter.orphans(ns, u64::from(n.duplicates));
    }

    /// The client left with tracked reads unanswered.
    pub(super) fn client_gone(&mut self) {
        self.judge_all(Ending::ClientGone);
    }

    /// The upstream connection ended with tracked reads unanswered.
    pub(super) fn upstream_gone(&mut self) {
        self.judge_all(Ending::UpstreamGone);
    }

    fn judge_all(&mut self, ending: Ending<'_>) {
        let now = Instant::now();
        self.judging_gone(ending, now);
        for t in self.reads.take_all() {
            let verdict = policy::judge(&t.read(), ending, now);
            self.apply_verdict(t, verdict, false, now);
        }
        self.reads.confirm = None;
    }

    /// Carries out a verdict; returns true when the reply is replaced (a resend went out,
    /// or staleguard's own error). `answered`: the reply said `ok: 1`.
    pub(super) fn apply_verdict(
        &mut self,
        mut t: Tracked,
        verdict: policy::Verdict<'_>,
        answered: bool,
        now: Instant,
    ) -> bool {
        let policy::Verdict { heard, then } = verdict;
        if t.attempt.rung != Rung::First {
            // A rung ended: counted in the ladder metric, its guard slot freed.
            t.permit = None;
            let result = if answered { "answered" } else { "failed" };
            let rung = t.attempt.rung.as_str();
            self.meter.ladder_attempt(&t.ns, rung, result);
        }
        let mut confirm = None;
        match heard {
            Heard::Nothing(None) => {}
            Heard::Nothing(Some(why)) => {
                self.meter.ignored(why.label());
                tracing::debug!(ns = %t.ns, command = %t.command, why = why.label(), "not counted: no evidence about the cluster");
            }
            Heard::Count(failure) => self.count_failure(&t, &failure, now),
            Heard::Confirm(failure) => {
                log_failure(&t, &failure, now);
                self.meter.trigger_error(&t.ns, &failure.evidence.label());
                confirm = Some(Ask::of(&t, &failure));
            }
            Heard::Sample(end) => self.sampled(&t, end),
        }
        if answered && matches!(then, Then::Reply) {
            self.meter.answered(&t.ns);
        }
        let replaced = match then {
            Then::Reply => false,
            Then::NoTime(rung) => {
                self.meter.ladder_not_sent(&t.ns, rung.as_str(), "no_time");
                crate::logs::sampled!(info, ns = %t.ns, rung = rung.as_str(), "no time left for the next rung, returning the error");
                false
            }
            Then::FailFast(b) => {
                self.bounded_failed(&t, b);
                true
            }
            then @ Then::Climb { .. } => self.climb(t, then),
        };
        // After the resend, so the client's answer does not wait behind it at mongos.
        if let Some(ask) = confirm {
            self.send_confirm(ask);
        }
        replaced
    }

    /// A failure for `t`'s breaker, the cluster's own word: logged, counted in the
    /// trigger-error metric, recorded.
    fn count_failure(&self, t: &Tracked, failure: &Failure<'_>, now: Instant) {
        log_failure(t, failure, now);
        self.meter.trigger_error(&t.ns, &failure.evidence.label());
        let what = failure.evidence.to_string();
        let counted = Counted {
            policy: &t.policy,
            reason: failure.reason,
            what: &what,
            conn: self.id,
        };
        self.shared.breakers.record_failure(&t.ns, &counted, now);
    }

    /// A sample's outcome, to its breaker.
    pub(super) fn sampled(&self, t: &Tracked, end: SampleEnd) {
        let outcome = match end {
            SampleEnd::Answered => Sample::Answered,
            SampleEnd::Failed => Sample::Failed,
            SampleEnd::Unknown => Sample::Unknown,
        };
        let now = Instant::now();
        self.shared
            .breakers
            .sampled(&t.ns, &t.policy, outcome, self.id, now);
    }

    /// A read sent under an open breaker's bound failed: the client gets the fail-fast
    /// error in place of mongos's reply.
    fn bounded_failed(&mut self, t: &Tracked, b: Bounded) {
        let bound = t.policy.open_time_limit;
        let reply = policy::bounded_fail_reply(&t.ns, b.reason, b.errors, bound);
        self.meter.fail_fast(&t.ns);
        tracing::debug!(ns = %t.ns, command = %t.command, code = reply.code, "fail fast: strict read under an open breaker's bound was not answered");
        let out = reply.to_message(self.shared.ids.request_id(), t.request_id);
        self.peers.answer_instead(out);
    }

    /// Sends `t` up the ladder as `then` (a `Then::Climb`) says; to the primary only with a
    /// slot of its guard, else as `Then::refused` says. False when nothing could be sent and
    /// the reply goes to the client.
    fn climb(&mut self, mut t: Tracked, then: Then) -> bool {
        let then = match then {
            Then::Climb {
                to: Rung::Primary, ..
            } => match self.claim_ladder(&t.ns) {
                Some(permit) => {
                    t.permit = Some(permit);
                    then
                }
                None => then.refused(),
            },
            other => other,
        };
        match then {
            Then::Climb { to, spec, .. } => self.resend(t, to, &spec),
            _ => false,
        }
    }

    /// A slot on this connection's upstream for one primary-rung read about to be sent,
    /// within this connection's share (`upstream::ConnLadder`: only when mongos starts it at
    /// once), or `None` (counted as `denied`).
    pub(super) fn claim_ladder(&mut self, ns: &str) -> Option<LadderPermit> {
        // The read would be the next request sent: mongos starts it once every earlier one
        // has its final reply.
        let queued = !self.peers.all_answered();
        match self.reads.claim_ladder(self.config.ladder_guard, queued)? {
            // Within the local guard: then within this instance's share of the fleet
            // budget (`[fleet]`; passes untouched without one).
            Ok(permit) => match self.shared.fleet_budget(permit, Instant::now()) {
                Ok(permit) => Some(permit),
                Err(denied) => {
                    self.meter.ladder_not_sent(ns, "primary", "denied");
                    tracing::debug!(ns = %ns, limit = denied.as_str(), "primary rung refused by the fleet budget");
                    None
                }
            },
            Err((denied, held)) => {
                self.meter.ladder_not_sent(ns, "primary", "denied");
                tracing::debug!(ns = %ns, limit = denied.as_str(), held, upstream = %self.upstream, "primary rung refused by the ladder guard");
                None
            }
        }
    }

    /// Sends `t` again, to rung `to`, rewritten by `spec` (from the request opened on
    /// arrival); false when the rewrite fails and the error goes to the client instead.
    fn resend(&mut self, mut t: Tracked, to: Rung, spec: &RewriteSpec) -> bool {
        let max = self.config.max_message_size;
        let out = match rewrite::rewrite_into(&t.original, spec, max, &mut self.rewrite_buf) {
            Ok(out) => out,
            Err(e) => {
                tracing::warn!(ns = %t.ns, error = %e, "cannot rewrite for the next rung, returning the error");
                return false;
            }
        };
        match to {
            Rung::Primary => {
                crate::logs::sampled!(info, ns = %t.ns, command = %t.command, max_time_ms = ?spec.max_time_ms, "resending to the primary (ladder)");
            }
            Rung::Again => {
                tracing::debug!(ns = %t.ns, command = %t.command, max_time_ms = ?spec.max_time_ms, "breaker open: bounded read failed, sending it once more under the bound");
            }
            _ => {
                crate::logs::sampled!(info, ns = %t.ns, command = %t.command, kind = "retry", max_time_ms = ?spec.max_time_ms, "resending with readConcern available");
                self.meter.retry_rewrite(&t.ns);
            }
        }
        if to == Rung::Available {
            t.permit = None;
        }
        t.attempt = t.attempt.climbed(to, spec);
        t.seq = self.peers.send_own(out);
        t.began = (self.peers.finals_in() + 1 == t.seq).then(Instant::now);
        self.reads.track(t);
        true
    }

    /// Sends the confirming read `ask` wants, unless one is in flight on this connection
    /// already, or its answer could change nothing: the breaker is open, or this
    /// connection has counted its `per_connection` errors within the window (so a
    /// connection pays for at most that many confirming reads per window).
    fn send_confirm(&mut self, ask: Ask) {
        let now = Instant::now();
        let breakers = &self.shared.breakers;
        let counts = breakers.would_count(&ask.ns, &ask.policy, self.id, now);
        if self.reads.confirm.is_some() || !counts {
            self.meter.confirm("skipped");
            return;
        }
        let request_id = self.shared.ids.request_id();
        let out = ask.message(request_id);
        let seq = self.peers.send_own(out);
        self.reads.confirm = Some(Confirm::sent(ask, request_id, seq));
    }

    /// The reply to the confirming read: judged, counted if it confirms, never relayed.
    fn on_confirm_reply(&mut self, reply: &Reply) {
        let Some(c) = self.reads.confirm.take() else {
            return;
        };
        let status = reply.status(self.config.max_message_size).ok();
        let now = Instant::now();
        let judged = c.judged(status.as_ref(), now);
        self.meter.confirm(judged.result);
        if judged.set_aside {
            self.meter.ignored("unconfirmed");
        }
        if let Some((reason, what)) = &judged.count {
            let ask = &judged.ask;
            let counted = Counted {
                policy: &ask.policy,
                reason: *reason,
                what,
                conn: self.id,
            };
            self.shared.breakers.record_failure(&ask.ns, &counted, now);
        }
    }
}

/// A trigger error met by `t`, in the log.
fn log_failure(t: &Tracked, failure: &Failure<'_>, now: Instant) {
    let (ns, command) = (&t.ns, &t.command);
    match failure.evidence {
        Evidence::Code { code, code_name } => {
            let elapsed_ms = now.saturating_duration_since(t.started).as_millis() as u64;
            crate::logs::sampled!(info, ns = %ns, command = %command, code, code_name = code_name.unwrap_or(""), elapsed_ms, "trigger error");
        }
        Evidence::Slow { elapsed, .. } => {
            crate::logs::sampled!(info, ns = %ns, command = %command, elapsed_ms = elapsed.as_millis() as u64, "slow read");
        }
    }
}
