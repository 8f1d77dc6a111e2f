//! The reply side: every reply's header is read once (`wire::Reply`); a reply to a tracked
//! read (or a read that ended without one: client gone, upstream gone) is judged by
//! `policy::judge` (pure), and the session applies the verdict: the breaker, the metrics,
//! the log, and a resend rewritten from the request opened when it arrived.

use std::borrow::Cow;
use std::sync::Arc;

use tokio::time::Instant;

use super::Session;
use crate::breaker::{Counted, Sample};
use crate::command::ReadPrefMode;
use crate::policy::{
    self, Bounded, Ending, Evidence, Failure, Heard, NsPolicy, Rung, SampleEnd, Then, Verdict,
};
use crate::rewrite::{self, RewriteSpec};
use crate::upstream::LadderPermit;
use crate::wire::dupids::{DupCount, IdSet};
use crate::wire::{Reply, Request};

/// Documents of one `available` reply looked at for duplicate `_id`s (a sample: the
/// estimate is a lower bound; the scratch set stays below 64 KiB per connection).
pub(super) const ORPHAN_SCAN_CAP: usize = 4096;

/// A read whose reply the session inspects.
#[derive(Debug)]
pub(super) struct Tracked {
    pub(super) request_id: i32,
    /// Shared with the session's last tracked namespace: no allocation per read.
    pub(super) ns: Arc<str>,
    /// Borrowed from the metrics' command list when there (every read command is).
    pub(super) command: Cow<'static, str>,
    pub(super) policy: Arc<NsPolicy>,
    /// The client's request as opened on arrival (a retry is rewritten from it, with no
    /// second header read or decompression).
    pub(super) original: Request,
    /// When mongos could start its first attempt: the read's budget runs from here.
    pub(super) started: Instant,
    /// When mongos could start it (nothing sent before it was still waiting); `None`: not
    /// yet.
    pub(super) began: Option<Instant>,
    /// The read's whole budget (client's `maxTimeMS`, or the cap); `None`: no limit.
    pub(super) max_time_ms: Option<i64>,
    /// This attempt went out with a `maxTimeMS` staleguard wrote.
    pub(super) limit_ours: bool,
    /// The read lists tag sets.
    pub(super) tagged: bool,
    /// Its read preference mode (a confirming read uses the same, without tags).
    pub(super) pref: Option<ReadPrefMode>,
    /// A sample of an open breaker (`bounded`: under its time bound).
    pub(super) sample: bool,
    pub(super) bounded: Option<Bounded>,
    /// The primary rung is still ahead.
    pub(super) primary: bool,
    /// The `available` rung is still ahead.
    pub(super) retry: bool,
    /// The attempt in flight.
    pub(super) rung: Rung,
    /// The upstream's ladder slot, held while the primary rung is in flight.
    pub(super) permit: Option<LadderPermit>,
    /// Its place among the requests sent upstream that expect a final reply (see
    /// `Session::sent_finals`).
    pub(super) seq: u64,
    /// A repeated `_id` in its result can only be an orphan (`CommandInfo::unique_ids`).
    pub(super) unique_ids: bool,
    /// A dry run's read: a rung it would climb is counted, not climbed.
    pub(super) dry: bool,
}

impl Tracked {
    fn read(&self) -> policy::Read<'_> {
        policy::Read {
            policy: &self.policy,
            started: self.started,
            began: self.began,
            max_time_ms: self.max_time_ms,
            limit_ours: self.limit_ours,
            tagged: self.tagged,
            sample: self.sample,
            bounded: self.bounded,
            primary: self.primary,
            retry: self.retry,
            rung: self.rung,
        }
    }
}

impl Session {
    /// One reply from the upstream.
    pub(super) fn on_reply(&mut self, msg: bytes::Bytes) {
        if let Some(t) = self.waiting_since.take() {
            self.counters.round_trip(&self.shared.metrics, t.elapsed());
        }
        let reply = Reply::new(msg);
        // The place this reply has among the final replies: mongos answers a connection's
        // requests in order, so it answers request number `seq`.
        let seq = self.finals_in + 1;
        if !reply.more_to_come() {
            self.finals_in = seq;
            self.began_next();
        }
        if self.pending.is_empty() && self.writes.is_empty() && self.confirm.is_none() {
            return self.send_to_client(reply);
        }
        // The write-stall watch's turn order and progress (`writes.rs`): every final reply
        // passes the turn; one answers a write only when its id and place both match.
        if !self.writes.is_empty() && self.write_replied(&reply) {
            return self.send_to_client(reply);
        }
        let response_to = reply.response_to();
        if self
            .confirm
            .as_ref()
            .is_some_and(|c| c.answered_by(response_to, seq))
        {
            // staleguard's own read: judged, never relayed.
            return self.on_confirm_reply(&reply);
        }
        // Both the id and the place must match: a reply to another request that reused a
        // tracked read's id never stands for it.
        let tracked = self
            .pending
            .iter()
            .position(|t| t.request_id == response_to && t.seq == seq);
        if let Some(i) = tracked {
            let t = self.pending.swap_remove(i);
            if self.inspect(t, &reply) {
                // Swallowed: a resend (or staleguard's own error) went out instead.
                return;
            }
        }
        if self
            .confirm
            .as_ref()
            .is_some_and(|c| c.passed(self.finals_in))
        {
            // Its turn passed under another responseTo: nothing to judge.
            self.confirm = None;
            self.shared.metrics.breakers.confirm("unknown");
        }
        self.give_up_answered();
        self.send_to_client(reply)
    }

    /// The request after the last one answered may start now at mongos: a tracked read (or
    /// the confirming read) waiting for its turn begins.
    pub(super) fn began_next(&mut self) {
        let next = self.finals_in + 1;
        let now = Instant::now();
        for t in self.pending.iter_mut().filter(|t| t.began.is_none()) {
            if t.seq == next {
                t.began = Some(now);
                if t.rung == Rung::First {
                    // Its budget, like its `maxTimeMS`, runs from when mongos starts it.
                    t.started = now;
                }
            }
        }
    }

    /// Tracked reads whose turn for a reply has passed (mongos answered them with a
    /// `responseTo` that names another request): nothing can be judged of them, so they
    /// leave the pending list instead of waiting forever (a probe gives its slot back).
    pub(super) fn give_up_answered(&mut self) {
        let finals_in = self.finals_in;
        if self.pending.iter().all(|t| t.seq > finals_in) {
            return;
        }
        let (gone, kept): (Vec<Tracked>, Vec<Tracked>) = std::mem::take(&mut self.pending)
            .into_iter()
            .partition(|t| t.seq <= finals_in);
        self.pending = kept;
        for t in gone {
            tracing::warn!(ns = %t.ns, command = %t.command, request_id = t.request_id, "tracked read answered with another responseTo; not judged");
            if t.sample {
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
        let status = if t.rung == Rung::Available && t.unique_ids {
            let scanned = reply.status_and_duplicates(max, &mut self.ids, ORPHAN_SCAN_CAP);
            if self.ids.capacity() > ORPHAN_SCAN_CAP {
                self.ids = IdSet::default();
            }
            scanned.map(|(status, dups)| {
                if let Some(n) = dups {
                    self.count_orphans(&t.ns, n);
                }
                status
            })
        } else {
            reply.status(max)
        };
        let ending = match &status {
            Ok(s) => Ending::Reply(s),
            Err(e) => {
                tracing::warn!(ns = %t.ns, error = %e, "cannot read reply to a tracked read");
                Ending::Unreadable
            }
        };
        let answered = status.as_ref().is_ok_and(|s| s.ok);
        let mut verdict = policy::judge(&t.read(), ending, now);
        if t.dry {
            let (held, would) = policy::dry_verdict(verdict);
            if let Some(action) = would {
                tracing::debug!(ns = %t.ns, command = %t.command, action, dry_run = true, "would climb (dry run)");
                self.counters.dry_run(&self.shared.metrics, &t.ns, action);
            }
            verdict = held;
        }
        self.apply_verdict(t, verdict, answered, now)
    }

    /// Documents an `available` reply returned twice (same `_id`): orphans the proxy can
    /// see, added to the orphan estimate.
    fn count_orphans(&mut self, ns: &str, n: DupCount) {
        if n.duplicates > 0 {
            tracing::info!(ns = %ns, duplicates = n.duplicates, examined = n.examined, skipped = n.skipped, "available reply holds documents twice (orphans)");
        }
        self.counters
            .orphans(&self.shared.metrics, ns, u64::from(n.duplicates));
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
        for t in std::mem::take(&mut self.pending) {
            let verdict = policy::judge(&t.read(), ending, now);
            self.apply_verdict(t, verdict, false, now);
        }
        self.confirm = None;
    }

    /// Carries out a verdict; returns true when the reply is replaced (a resend went out,
    /// or staleguard's own error). `answered`: the reply said `ok: 1`.
    fn apply_verdict(
        &mut self,
        mut t: Tracked,
        verdict: Verdict<'_>,
        answered: bool,
        now: Instant,
    ) -> bool {
        let Verdict { heard, then } = verdict;
        if t.rung != Rung::First {
            // A rung ended: counted in the ladder metric, its slot freed.
            self.ladder_ended(&mut t, answered);
        }
        let mut confirm = None;
        match heard {
            Heard::Nothing(None) => {}
            Heard::Nothing(Some(why)) => {
                self.shared.metrics.limits.ignored(why.label());
                tracing::debug!(ns = %t.ns, command = %t.command, why = why.label(), "not counted: no evidence about the cluster");
            }
            Heard::Count(failure) => self.count_failure(&t, &failure, now),
            Heard::Confirm(failure) => {
                self.log_failure(&t, &failure, now);
                self.shared
                    .metrics
                    .trigger_error(&t.ns, &failure.evidence.label());
                confirm = Some(super::confirm::Ask::of(&t, &failure));
            }
            Heard::Sample(end) => self.sampled(&t, end),
        }
        let replaced = match then {
            Then::Reply => false,
            Then::NoTime(rung) => {
                self.shared
                    .metrics
                    .ladder_attempt(&t.ns, rung.as_str(), "no_time");
                tracing::info!(ns = %t.ns, rung = rung.as_str(), "no time left for the next rung, returning the error");
                false
            }
            Then::FailFast(b) => {
                self.bounded_failed(&t, b);
                true
            }
            Then::Climb { to, spec, or_else } => self.climb(t, to, &spec, or_else),
        };
        // After the resend, so the client's answer does not wait behind it at mongos.
        if let Some(ask) = confirm {
            self.send_confirm(ask);
        }
        replaced
    }

    /// Sends `t` to rung `to` (or `or_else` when the primary's guard refuses it); false when
    /// nothing could be sent and the reply goes to the client.
    fn climb(
        &mut self,
        mut t: Tracked,
        to: Rung,
        spec: &RewriteSpec,
        or_else: Option<RewriteSpec>,
    ) -> bool {
        if to == Rung::Primary {
            match self.claim_ladder(&t.ns) {
                Some(permit) => t.permit = Some(permit),
                None => match or_else {
                    Some(spec) => return self.resend(t, Rung::Available, &spec),
                    None => return false,
                },
            }
        }
        self.resend(t, to, spec)
    }

    /// A sample's outcome, to its breaker.
    fn sampled(&self, t: &Tracked, end: SampleEnd) {
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
        self.counters.fail_fast(&self.shared.metrics, &t.ns);
        tracing::debug!(ns = %t.ns, command = %t.command, code = reply.code, "fail fast: strict read under an open breaker's bound was not answered");
        self.outstanding = self.outstanding.saturating_sub(1);
        self.streaming = false;
        self.reply_error(t.request_id, &reply);
    }

    /// A rung above the first ended: counted in the ladder metric, its guard slot freed.
    fn ladder_ended(&mut self, t: &mut Tracked, answered: bool) {
        t.permit = None;
        let result = if answered { "answered" } else { "failed" };
        self.counters
            .ladder_attempt(&self.shared.metrics, &t.ns, t.rung.as_str(), result);
    }

    /// A slot on this connection's upstream for one primary-rung read about to be sent,
    /// within this connection's share (`upstream::ConnLadder`: only when mongos starts it at
    /// once), or `None` (counted as `denied`).
    pub(super) fn claim_ladder(&mut self, ns: &str) -> Option<LadderPermit> {
        let guard = self.ladder.as_ref()?;
        let held = self.pending.iter().filter(|t| t.permit.is_some()).count();
        // The read would be request `sent_finals + 1`: mongos starts it once every earlier
        // one has its final reply.
        let queued = self.finals_in < self.sent_finals;
        let limits = self.config.ladder_guard;
        let claimed = self
            .ladder_share
            .try_acquire(guard, limits, held, queued, Instant::now());
        claimed
            .map_err(|denied| {
                self.shared.metrics.ladder_attempt(ns, "primary", "denied");
                tracing::debug!(ns = %ns, limit = denied.as_str(), held, upstream = %self.upstream, "primary rung refused by the ladder guard");
            })
            .ok()
    }

    /// A trigger error met by `t`, in the log.
    fn log_failure(&self, t: &Tracked, failure: &Failure<'_>, now: Instant) {
        let (ns, command) = (&t.ns, &t.command);
        match failure.evidence {
            Evidence::Code { code, code_name } => {
                let elapsed_ms = now.saturating_duration_since(t.started).as_millis() as u64;
                tracing::info!(ns = %ns, command = %command, code, code_name = code_name.unwrap_or(""), elapsed_ms, "trigger error");
            }
            Evidence::Slow { elapsed, .. } => {
                tracing::info!(ns = %ns, command = %command, elapsed_ms = elapsed.as_millis() as u64, "slow read");
            }
        }
    }

    /// A failure for `t`'s breaker, the cluster's own word: logged, counted in the
    /// trigger-error metric, recorded.
    fn count_failure(&self, t: &Tracked, failure: &Failure<'_>, now: Instant) {
        self.log_failure(t, failure, now);
        self.shared
            .metrics
            .trigger_error(&t.ns, &failure.evidence.label());
        let what = failure.evidence.to_string();
        let counted = Counted {
            policy: &t.policy,
            reason: failure.reason,
            what: &what,
            conn: self.id,
        };
        self.shared.breakers.record_failure(&t.ns, &counted, now);
    }

    /// Sends `t` again, to rung `to`, rewritten by `spec` (from the request opened on
    /// arrival); false when the rewrite fails and the error goes to the client instead.
    fn resend(&mut self, mut t: Tracked, to: Rung, spec: &RewriteSpec) -> bool {
        let max = self.config.max_message_size;
        match rewrite::rewrite_into(&t.original, spec, max, &mut self.rewrite_buf) {
            Ok(out) => {
                match to {
                    Rung::Primary => {
                        tracing::info!(ns = %t.ns, command = %t.command, max_time_ms = ?spec.max_time_ms, "resending to the primary (ladder)")
                    }
                    _ => {
                        tracing::info!(ns = %t.ns, command = %t.command, kind = "retry", max_time_ms = ?spec.max_time_ms, "resending with readConcern available");
                        self.shared.metrics.rewrite(&t.ns, "retry");
                    }
                }
                if to == Rung::Available {
                    t.permit = None;
                }
                t.primary = false;
                t.retry &= to == Rung::Primary;
                t.rung = to;
                t.sample = false;
                t.bounded = None;
                t.limit_ours = spec.max_time_ms.is_some();
                self.sent_finals += 1;
                t.seq = self.sent_finals;
                t.began = (self.finals_in + 1 == t.seq).then(Instant::now);
                self.pending.push(t);
                self.to_upstream.push(out);
                true
            }
            Err(e) => {
                tracing::warn!(ns = %t.ns, error = %e, "cannot rewrite for the next rung, returning the error");
                false
            }
        }
    }

    fn send_to_client(&mut self, reply: Reply) {
        let more = reply.more_to_come();
        self.streaming = more;
        if !more {
            self.outstanding = self.outstanding.saturating_sub(1);
        }
        self.to_client.push(reply.into_frame());
    }
}
