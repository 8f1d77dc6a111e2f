//! The request side past the gates (`gate.rs`): a read some policy governs is classified
//! from the message as opened, decided on (`policy::decide`, pure) and applied: forwarded as
//! it arrived, rewritten, sent to the primary, or answered by the proxy.

use std::time::SystemTime;

use bytes::Bytes;
use tokio::time::Instant;

use super::reply::Tracked;
use super::{tracked_command, Session, SessionError};
use crate::command::{self, ClassifyError, CommandInfo};
use crate::policy::{self, Admission, AfterPrimary, Decision, ErrorReply, Mode, Rung, Target};
use crate::rewrite;
use crate::wire::{Request, WireError};

/// One attempt of a followed read: which rung it is, what is still ahead of it, its budget.
struct Attempt {
    rung: Rung,
    /// The primary rung is still ahead.
    primary: bool,
    /// The `available` rung is still ahead.
    retry: bool,
    /// A sample of an open breaker (`bounded`: under its time bound).
    sample: bool,
    bounded: Option<policy::Bounded>,
    /// Sent with a `maxTimeMS` staleguard wrote.
    limit_ours: bool,
    /// The read's whole budget (the next rung spends what this attempt leaves).
    budget_ms: Option<i64>,
    /// The upstream's ladder slot (primary rung).
    permit: Option<crate::upstream::LadderPermit>,
    /// A dry run's read: `primary` and `retry` are the rungs it would climb, counted, not
    /// climbed.
    dry: bool,
}

impl Attempt {
    /// An attempt with nothing ahead of it and no budget (`available` sent at once).
    fn last(rung: Rung) -> Attempt {
        Attempt {
            rung,
            primary: false,
            retry: false,
            sample: false,
            bounded: None,
            limit_ours: false,
            budget_ms: None,
            permit: None,
            dry: false,
        }
    }
}

/// A governed request, with what was decided about it.
#[derive(Clone, Copy)]
struct Governed<'r, 'a> {
    req: &'r Request,
    info: &'r CommandInfo<'a>,
    target: &'r Target<'a>,
    ns: &'r str,
    now: Instant,
    /// What a dry run held back.
    held: Option<policy::HeldBack>,
}

impl Session {
    /// A read some policy may govern: classified, resolved, admitted, decided, applied.
    pub(super) fn govern(&mut self, req: Request) -> Result<(), SessionError> {
        let info = match command::classify_request(&req) {
            Ok(info) => info,
            Err(ClassifyError::NoCommand) => {
                self.pass(req.frame().clone(), true);
                return Ok(());
            }
            Err(ClassifyError::Malformed(what)) => {
                return Err(SessionError::ClientProtocol(WireError::BadBson(what)))
            }
        };
        let Some(target) = policy::resolve(&info, &self.config.policy) else {
            self.pass(req.frame().clone(), true);
            return Ok(());
        };
        // The "db.coll" key, built in a buffer the session reuses.
        let mut ns = std::mem::take(&mut self.ns_buf);
        ns.clear();
        ns.push_str(target.ns.db);
        ns.push('.');
        ns.push_str(target.ns.coll);
        let now = Instant::now();
        let admission = self.admit(&target, &ns, now);
        let decided = policy::decide(&target, &info, admission);
        let (decision, held) = policy::apply_dry_run(decided, &target.policy);
        if let Some(h) = held {
            tracing::debug!(ns = %ns, command = info.name, decision = h.name, dry_run = true, "would act (dry run)");
            if let Some(action) = h.action {
                self.counters.dry_run(&self.shared.metrics, &ns, action);
            }
        }
        let governed = Governed {
            req: &req,
            info: &info,
            target: &target,
            ns: &ns,
            now,
            held,
        };
        self.apply(decision, governed);
        self.ns_buf = ns;
        Ok(())
    }

    /// What the breaker of `ns` admits for an eligible read (and the write-stall watch's
    /// hold on fallback namespaces); other reads are not the breaker's business.
    fn admit(&self, target: &Target<'_>, ns: &str, now: Instant) -> Admission {
        if target.kind != policy::ReadKind::Eligible {
            return Admission::Closed;
        }
        if target.policy.mode == Mode::Fallback && self.shared.stall.holding() {
            self.shared.breakers.hold_on_read(ns, now);
        }
        self.shared.breakers.admit(ns, &target.policy, now)
    }

    /// Carries out a decision.
    fn apply(&mut self, decision: Decision<'_>, g: Governed<'_, '_>) {
        let Governed {
            req,
            info,
            target,
            ns,
            ..
        } = g;
        self.counters.request(info.name, decision.name());
        match decision {
            Decision::Forward => self.forward(req.frame().clone(), true),
            Decision::Track { .. } => self.track(&decision, g),
            Decision::Rewrite { .. } => self.send_available(decision, g),
            Decision::Primary {
                budget_ms, then, ..
            } => {
                // The primary rung, when this upstream's guard has room; else what follows it.
                if let Some(permit) = self.claim_ladder(ns) {
                    let retry = matches!(then, AfterPrimary::Available { .. });
                    if let Some(out) = self.edited(&decision, req, ns, info.name) {
                        tracing::debug!(ns = %ns, command = info.name, "breaker open: read sent to the primary (ladder)");
                        let attempt = Attempt {
                            retry,
                            budget_ms,
                            permit: Some(permit),
                            ..Attempt::last(Rung::Primary)
                        };
                        self.follow(out, g, attempt);
                        return;
                    }
                }
                match then {
                    AfterPrimary::Available {
                        drop_after_cluster_time,
                    } => {
                        let cap_ms =
                            policy::capped_max_time(info.max_time_ms, target.policy.max_time);
                        let instead = Decision::Rewrite {
                            drop_after_cluster_time,
                            cap_ms,
                        };
                        self.send_available(instead, g);
                    }
                    AfterPrimary::FailFast {
                        reason,
                        probe_in,
                        errors,
                    } => self.fail_fast(g, reason, probe_in, errors),
                }
            }
            Decision::FailFast {
                reason,
                probe_in,
                errors,
            } => self.fail_fast(g, reason, probe_in, errors),
            Decision::Refuse(why) => {
                let reply = policy::refusal_reply(ns, why);
                self.counters.refusal(&self.shared.metrics, ns);
                tracing::debug!(ns = %ns, command = info.name, code = reply.code, why = ?why, "refused");
                self.reply_error(req.request_id(), &reply);
            }
        }
    }

    /// Answers a strict read whose breaker is open with the fail-fast error, sending nothing.
    fn fail_fast(
        &mut self,
        g: Governed<'_, '_>,
        reason: policy::Reason,
        probe_in: std::time::Duration,
        errors: u32,
    ) {
        let Governed { req, info, ns, .. } = g;
        let reply = policy::fail_fast_reply(ns, reason, errors, probe_in, SystemTime::now());
        self.counters.fail_fast(&self.shared.metrics, ns);
        tracing::debug!(ns = %ns, command = info.name, code = reply.code, reason = %reason, probe_in = ?probe_in, "fail fast: strict namespace, breaker open");
        self.reply_error(req.request_id(), &reply);
    }

    /// Sends a read rewritten to `available` before it goes (`decision` is a `Rewrite`),
    /// followed for the orphan estimate; as it arrived when the rewrite fails.
    fn send_available(&mut self, decision: Decision, g: Governed<'_, '_>) {
        let Governed { req, info, ns, .. } = g;
        match self.edited(&decision, req, ns, info.name) {
            Some(out) => {
                self.counters.preemptive_rewrite(&self.shared.metrics, ns);
                tracing::debug!(ns = %ns, command = info.name, kind = "preemptive", dropped_after_cluster_time = info.read_concern.after_cluster_time, "read rewritten to readConcern available");
                let attempt = Attempt::last(Rung::Available);
                self.follow(out, g, attempt);
            }
            None => self.forward(req.frame().clone(), true),
        }
    }

    /// Sends a read whose reply will be judged (with `maxTimeMS` capped when the decision
    /// says so), remembering it with the request as opened for a possible resend.
    fn track(&mut self, decision: &Decision, g: Governed<'_, '_>) {
        let Governed { req, info, ns, .. } = g;
        let Decision::Track {
            budget_ms,
            probe,
            retry,
            primary,
            bounded,
            ..
        } = *decision
        else {
            return self.forward(req.frame().clone(), true);
        };
        let edited = self.edited(decision, req, ns, info.name);
        let limit_ours = edited.is_some();
        let out = edited.unwrap_or_else(|| req.frame().clone());
        if bounded.is_some() {
            tracing::debug!(ns = %ns, command = info.name, "breaker open: read sent bounded by open_time_limit");
        }
        // A dry run's read is judged with the rungs it would have had (see `reply.rs`).
        let (primary, retry) = g.held.map_or((primary, retry), |h| (h.primary, h.retry));
        let first = Attempt {
            primary,
            retry,
            dry: g.held.is_some(),
            sample: probe,
            bounded,
            limit_ours,
            budget_ms,
            ..Attempt::last(Rung::First)
        };
        if !self.follow(out, g, first) && probe {
            self.shared.breakers.release_probe(ns);
        }
    }

    /// Sends `out` (the governed request, as `attempt`) and remembers it for its reply.
    /// Past `max_pending_reads` the read is sent but not followed (false): no next rung and
    /// no evidence from it (its ladder slot is freed at once).
    fn follow(&mut self, out: Bytes, g: Governed<'_, '_>, attempt: Attempt) -> bool {
        let Governed {
            req,
            info,
            target,
            ns,
            now,
            ..
        } = g;
        if self.pending.len() >= self.config.limits.max_pending_reads {
            self.shared.metrics.limits.hit("max_pending_reads");
            tracing::debug!(ns = %ns, command = info.name, "max_pending_reads reached: read forwarded untracked");
            self.forward(out, true);
            return false;
        }
        let tracked_ns = self.tracked_ns(ns);
        // mongos serves a connection's requests in order: this read starts now only when
        // nothing sent before it is still waiting for its reply.
        let began = (self.finals_in == self.sent_finals).then_some(now);
        self.pending.push(Tracked {
            request_id: req.request_id(),
            ns: tracked_ns,
            command: tracked_command(info.name),
            policy: target.policy.clone(),
            original: req.clone(),
            started: now,
            began,
            max_time_ms: attempt.budget_ms,
            limit_ours: attempt.limit_ours,
            tagged: info.read_pref_tags,
            pref: info.read_pref,
            sample: attempt.sample,
            bounded: attempt.bounded,
            primary: attempt.primary,
            retry: attempt.retry,
            rung: attempt.rung,
            permit: attempt.permit,
            dry: attempt.dry,
            // `forward` below counts it.
            seq: self.sent_finals + 1,
            unique_ids: info.unique_ids,
        });
        self.forward(out, true);
        true
    }

    /// The request rewritten by `decision`'s spec, from the opened request (no header read,
    /// no decompression). `None`: no spec, or the rewrite failed (logged); the very bytes
    /// that arrived go instead.
    fn edited(
        &mut self,
        decision: &Decision,
        req: &Request,
        ns: &str,
        command: &str,
    ) -> Option<Bytes> {
        let spec = policy::rewrite_spec(decision)?;
        let max = self.config.max_message_size;
        match rewrite::rewrite_into(req, &spec, max, &mut self.rewrite_buf) {
            Ok(out) => {
                if !spec.available {
                    tracing::debug!(ns = %ns, command, max_time_ms = spec.max_time_ms, "maxTimeMS capped");
                }
                Some(out)
            }
            Err(e) if spec.available => {
                tracing::warn!(ns = %ns, error = %e, "rewrite failed, forwarding as is");
                None
            }
            Err(e) => {
                tracing::warn!(ns = %ns, error = %e, "cannot cap maxTimeMS, forwarding as is");
                None
            }
        }
    }

    /// Forwards a request no policy looked at.
    pub(super) fn pass(&mut self, msg: Bytes, expects_reply: bool) {
        self.counters.forwarded();
        self.forward(msg, expects_reply);
    }

    fn forward(&mut self, msg: Bytes, expects_reply: bool) {
        if expects_reply {
            self.sent_finals += 1;
            self.outstanding += 1;
            if self.waiting_since.is_none() {
                self.waiting_since = Some(Instant::now());
            }
        }
        self.to_upstream.push(msg);
    }

    /// Answers legacy OP_QUERY `request_id` with the OP_REPLY of `refusal`, sending nothing.
    pub(super) fn refuse_legacy(&mut self, request_id: i32, refusal: &policy::LegacyRefusal) {
        self.counters.refusal(&self.shared.metrics, &refusal.ns);
        tracing::debug!(ns = %refusal.ns, code = refusal.reply.code, "refused: legacy OP_QUERY on a database with governed namespaces");
        let out = refusal.to_message(self.shared.ids.request_id(), request_id);
        self.to_client.push(out);
    }

    /// Answers request `request_id` with `reply` instead of sending it upstream.
    pub(super) fn reply_error(&mut self, request_id: i32, reply: &ErrorReply) {
        let out = reply.to_message(self.shared.ids.request_id(), request_id);
        self.to_client.push(out);
    }
}
