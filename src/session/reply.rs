//! The reply side: every reply's header is read once (`wire::Reply`); a reply to a tracked
//! read (or a read that ended without one: client gone, upstream gone) is judged by
//! `policy::judge` (pure), and the session applies the verdict: the breaker, the metrics,
//! the log, and a resend rewritten from the request opened when it arrived.

use std::borrow::Cow;
use std::sync::Arc;

use tokio::time::Instant;

use super::Session;
use crate::policy::{self, Ending, Evidence, Failure, Ignored, NsPolicy, Rung, Verdict};
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
    pub(super) started: Instant,
    /// The read's whole budget (client's `maxTimeMS`, or the cap); `None`: no limit.
    pub(super) max_time_ms: Option<i64>,
    pub(super) probe: bool,
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
}

impl Tracked {
    fn read(&self) -> policy::Read<'_> {
        policy::Read {
            policy: &self.policy,
            started: self.started,
            max_time_ms: self.max_time_ms,
            probe: self.probe,
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
        if !reply.more_to_come() {
            self.finals_in += 1;
        }
        if self.pending.is_empty() && self.writes.is_empty() {
            return self.send_to_client(reply);
        }
        let response_to = reply.response_to();
        if !self.writes.is_empty() {
            let max = self.config.max_message_size;
            let ok = || reply.status(max).is_ok_and(|s| s.ok);
            let (watch, now) = (&self.shared.stall, Instant::now());
            if self.writes.answered(watch, response_to, ok, now) {
                return self.send_to_client(reply);
            }
        }
        let tracked = self
            .pending
            .iter()
            .position(|t| t.request_id == response_to);
        if let Some(i) = tracked {
            let t = self.pending.swap_remove(i);
            if self.inspect(t, &reply) {
                // Swallowed: a resend went out instead.
                return;
            }
        }
        self.give_up_answered();
        self.send_to_client(reply)
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
            if t.probe {
                self.shared.breakers.release_probe(&t.ns);
            }
        }
    }

    /// Judges the reply to a tracked read; returns true when a resend replaces it. A reply
    /// served with `available` is also examined for documents returned twice (orphans), in
    /// the same pass over its body.
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
        let verdict = policy::judge(&t.read(), ending, now);
        self.apply_verdict(t, verdict, now)
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
            self.apply_verdict(t, verdict, now);
        }
    }

    /// Carries out a verdict; returns true when a resend went out in place of the reply.
    fn apply_verdict(&mut self, mut t: Tracked, verdict: Verdict<'_>, now: Instant) -> bool {
        match verdict {
            Verdict::Success => {
                self.shared.breakers.record_success(&t.ns, t.probe, now);
                false
            }
            Verdict::Fail {
                failure,
                out_of_time,
            } => {
                self.count_failure(&t, &failure, now);
                if let Some(rung) = out_of_time {
                    self.shared
                        .metrics
                        .ladder_attempt(&t.ns, rung.as_str(), "no_time");
                    tracing::info!(ns = %t.ns, rung = rung.as_str(), "no time left for the next rung, returning the error");
                }
                false
            }
            Verdict::Retry {
                failure,
                to,
                spec,
                or_else,
            } => {
                if let Some(failure) = &failure {
                    self.count_failure(&t, failure, now);
                } else {
                    // The primary rung failed; available is next.
                    self.ladder_ended(&mut t, false);
                }
                let code = failure.as_ref().and_then(|f| match f.evidence {
                    Evidence::Code { code, .. } => Some(code),
                    _ => None,
                });
                if to == Rung::Primary {
                    match self.claim_ladder(&t.ns) {
                        Some(permit) => t.permit = Some(permit),
                        None => match or_else {
                            Some(spec) => return self.resend(t, Rung::Available, code, &spec),
                            None => return false,
                        },
                    }
                }
                self.resend(t, to, code, &spec)
            }
            Verdict::Ignore(Ignored::Retried {
                rung,
                trigger,
                ok,
                no_time,
            }) => {
                self.ladder_ended(&mut t, ok);
                if no_time {
                    self.shared
                        .metrics
                        .ladder_attempt(&t.ns, Rung::Available.as_str(), "no_time");
                }
                if let Some(code) = trigger {
                    // Whatever the last rung got goes to the client.
                    tracing::info!(ns = %t.ns, command = %t.command, code, rung = rung.as_str(), "the last rung failed too; returning its error");
                }
                false
            }
            Verdict::Ignore(Ignored::Unreadable {
                release_probe: true,
            }) => {
                self.shared.breakers.release_probe(&t.ns);
                false
            }
            Verdict::Ignore(
                ignored @ (Ignored::ShortWait { release_probe }
                | Ignored::ShortTimeLimit { release_probe }),
            ) => {
                let why = match ignored {
                    Ignored::ShortTimeLimit { .. } => "short_time_limit",
                    _ => "short_wait",
                };
                self.shared.metrics.limits.ignored(why);
                tracing::debug!(ns = %t.ns, command = %t.command, why, "not counted: a client's word below min_wait is no evidence");
                if release_probe {
                    self.shared.breakers.release_probe(&t.ns);
                }
                false
            }
            Verdict::Ignore(_) => false,
        }
    }

    /// A rung above the first ended: counted in the ladder metric, its guard slot freed.
    fn ladder_ended(&mut self, t: &mut Tracked, answered: bool) {
        t.permit = None;
        let result = if answered { "answered" } else { "failed" };
        self.counters
            .ladder_attempt(&self.shared.metrics, &t.ns, t.rung.as_str(), result);
    }

    /// A slot on this connection's upstream for one primary-rung read, or `None` (counted
    /// as `denied`) when the guard is full.
    pub(super) fn claim_ladder(&self, ns: &str) -> Option<LadderPermit> {
        let guard = self.ladder.as_ref()?;
        let limits = self.config.ladder_guard;
        let held = self.pending.iter().filter(|t| t.permit.is_some()).count();
        if held >= limits.per_connection as usize {
            self.shared.metrics.ladder_attempt(ns, "primary", "denied");
            tracing::debug!(ns = %ns, held, "primary rung refused: this connection holds its share of the ladder guard");
            return None;
        }
        match guard.try_acquire(limits, Instant::now()) {
            Ok(permit) => Some(permit),
            Err(denied) => {
                self.shared.metrics.ladder_attempt(ns, "primary", "denied");
                tracing::debug!(ns = %ns, limit = denied.as_str(), upstream = %self.upstream, "primary rung refused by the ladder guard");
                None
            }
        }
    }

    /// A failure for `t`'s breaker: logged, counted in the trigger-error metric, recorded.
    fn count_failure(&self, t: &Tracked, failure: &Failure<'_>, now: Instant) {
        let (ns, command) = (&t.ns, &t.command);
        match failure.evidence {
            Evidence::Code { code, code_name } => {
                let elapsed_ms = now.saturating_duration_since(t.started).as_millis() as u64;
                tracing::info!(ns = %ns, command = %command, code, code_name = code_name.unwrap_or(""), elapsed_ms, "trigger error");
            }
            Evidence::Slow { elapsed, .. } => {
                tracing::info!(ns = %ns, command = %command, elapsed_ms = elapsed.as_millis() as u64, "slow read counted as a time-limit error");
            }
            Evidence::ClientGaveUp { waited } => {
                tracing::info!(ns = %ns, command = %command, waited_ms = waited.as_millis() as u64, "client gave up before the reply: counted as a time-limit error");
            }
        }
        self.shared
            .metrics
            .trigger_error(ns, &failure.evidence.label());
        let what = failure.evidence.to_string();
        self.shared.breakers.record_failure(
            ns,
            &t.policy,
            failure.reason,
            &what,
            t.probe,
            self.id,
            now,
        );
    }

    /// Sends `t` again, to rung `to`, rewritten by `spec` (from the request opened on
    /// arrival); false when the rewrite fails and the error goes to the client instead.
    fn resend(&mut self, mut t: Tracked, to: Rung, code: Option<i32>, spec: &RewriteSpec) -> bool {
        let max = self.config.max_message_size;
        match rewrite::rewrite_into(&t.original, spec, max, &mut self.rewrite_buf) {
            Ok(out) => {
                match to {
                    Rung::Primary => {
                        tracing::info!(ns = %t.ns, command = %t.command, code, max_time_ms = ?spec.max_time_ms, "resending to the primary (ladder)")
                    }
                    _ => {
                        tracing::info!(ns = %t.ns, command = %t.command, kind = "retry", code, max_time_ms = ?spec.max_time_ms, "resending with readConcern available");
                        self.shared.metrics.rewrite(&t.ns, "retry");
                    }
                }
                if to == Rung::Available {
                    t.permit = None;
                }
                t.primary = false;
                t.retry &= to == Rung::Primary;
                t.rung = to;
                t.probe = false;
                self.sent_finals += 1;
                t.seq = self.sent_finals;
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
