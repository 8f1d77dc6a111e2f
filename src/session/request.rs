//! The request side: each request is opened once (`wire::Request`), sent through the early
//! gates in one match, then (a read some policy governs) classified from the same opened
//! message, decided on (`policy::decide`, pure) and applied: forwarded as it arrived,
//! rewritten, or answered by the proxy.

use std::time::SystemTime;

use bytes::Bytes;
use tokio::time::Instant;

use super::reply::Tracked;
use super::{tracked_command, Session, SessionError};
use crate::command::{self, ClassifyError, CommandInfo};
use crate::policy::{self, Admission, AfterPrimary, Decision, ErrorReply, Mode, Target};
use crate::rewrite;
use crate::stall;
use crate::wire::{Request, WireError};

/// Where the early gates send a request.
enum Gate {
    /// Forwarded untouched; `expects_reply` is false for `moreToCome`.
    Pass { expects_reply: bool },
    /// A write the write-stall watch follows, then forwarded untouched.
    Write,
    /// A command a policy may govern (every command but the writes).
    Read,
    /// A legacy OP_QUERY refused on a database with governed namespaces.
    Legacy(policy::LegacyRefusal),
}

/// A governed request, with what was decided about it.
struct Governed<'r, 'a> {
    req: &'r Request,
    info: &'r CommandInfo<'a>,
    target: &'r Target<'a>,
    ns: &'r str,
    now: Instant,
}

impl Session {
    /// One request from the client.
    pub(super) fn on_request(&mut self, msg: Bytes) -> Result<(), SessionError> {
        self.refresh_config();
        let max = self.config.max_message_size;
        let mut req = Request::new(msg, max).map_err(SessionError::ClientProtocol)?;
        match self.gate(&mut req)? {
            Gate::Pass { expects_reply } => self.pass(req.into_frame(), expects_reply),
            Gate::Write => {
                let (watch, upstream) = (&self.shared.stall, &self.upstream);
                self.writes
                    .sent(watch, upstream, req.request_id(), Instant::now());
                self.pass(req.into_frame(), true);
            }
            Gate::Read => self.govern(req)?,
            Gate::Legacy(refusal) => self.refuse_legacy(req.request_id(), &refusal),
        }
        Ok(())
    }

    /// The early gates. Without any acting policy or write watch, only what `Request::new`
    /// checks (the OP_MSG structure and checksum) is looked at; otherwise the body is opened
    /// (decompressed, once) and its command name read, once.
    fn gate(&self, req: &mut Request) -> Result<Gate, SessionError> {
        let policy_active = self.policy_active();
        let watch_writes = self.config.stall.passive;
        if !(policy_active || watch_writes) {
            return Ok(Gate::Pass {
                expects_reply: !req.more_to_come(),
            });
        }
        if let Some(gate) = self.gate_compressed(req, policy_active, watch_writes)? {
            return Ok(gate);
        }
        let max = self.config.max_message_size;
        req.inflate(max).map_err(SessionError::ClientProtocol)?;
        if !req.is_command() {
            // A legacy opcode, or OP_COMPRESSED wrapping one (not decompressed by `inflate`).
            if policy_active {
                let judged = policy::judge_op_query(req.frame(), &self.config.policy, max);
                if let Some(r) = judged.map_err(SessionError::ClientProtocol)? {
                    return Ok(Gate::Legacy(r));
                }
            }
            return Ok(Gate::Pass {
                expects_reply: true,
            });
        }
        if req.more_to_come() {
            return Ok(Gate::Pass {
                expects_reply: false,
            });
        }
        Ok(match req.command_name() {
            Ok(Some(name)) if watch_writes && stall::is_write_command(name) => Gate::Write,
            // Every other command: a repeated policy-relevant field or a client's own
            // `available` is refused whatever the command (see `policy::resolve`).
            Ok(Some(name)) if policy_active && !stall::is_write_command(name) => Gate::Read,
            Ok(_) => Gate::Pass {
                expects_reply: true,
            },
            Err(m) => return Err(SessionError::ClientProtocol(WireError::BadBson(m.0))),
        })
    }

    /// A compressed request's gate from the first few hundred decompressed bytes: only a
    /// command some policy may act on is decompressed whole (a small message declaring tens of
    /// megabytes must not cost that much work to be told apart). `None`: open it whole.
    fn gate_compressed(
        &self,
        req: &Request,
        policy_active: bool,
        watch_writes: bool,
    ) -> Result<Option<Gate>, SessionError> {
        let prefix = match req.compressed_prefix(crate::wire::body::COMMAND_PREFIX) {
            Ok(Some(p)) => p,
            Ok(None) => return Ok(None),
            Err(e) => return Err(SessionError::ClientProtocol(e)),
        };
        let Some(name) = crate::wire::body::command_name_in_prefix(&prefix) else {
            return Ok(None);
        };
        let flags = u32::from_le_bytes([prefix[0], prefix[1], prefix[2], prefix[3]]);
        let expects_reply = flags & crate::wire::opmsg::MORE_TO_COME == 0;
        Ok(Some(if !expects_reply {
            Gate::Pass { expects_reply }
        } else if watch_writes && stall::is_write_command(name) {
            Gate::Write
        } else if policy_active {
            // Every non-write command is classified under an acting policy (a repeated
            // policy-relevant field or a client's own `available` is refused whatever the
            // command), so it is opened whole, as uncompressed ones are.
            return Ok(None);
        } else {
            Gate::Pass { expects_reply }
        }))
    }

    /// A read some policy may govern: classified, resolved, admitted, decided, applied.
    fn govern(&mut self, req: Request) -> Result<(), SessionError> {
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
        let (decision, held_back) = policy::apply_dry_run(decided, &target.policy);
        if let Some(would) = held_back {
            tracing::debug!(ns = %ns, command = info.name, decision = would, dry_run = true, "would act (dry run)");
        }
        let governed = Governed {
            req: &req,
            info: &info,
            target: &target,
            ns: &ns,
            now,
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
        self.shared.breakers.admit(ns, &target.policy, now).0
    }

    /// Carries out a decision.
    fn apply(&mut self, decision: Decision<'_>, g: Governed<'_, '_>) {
        let Governed {
            req,
            info,
            target,
            ns,
            now,
        } = g;
        self.counters.request(info.name, decision.name());
        match decision {
            Decision::Forward => self.forward(req.frame().clone(), true),
            Decision::Track { .. } => self.track(&decision, req, info, target, ns, now),
            Decision::Rewrite { .. } => self.send_available(decision, req, info, ns),
            // The session does not send the primary rung yet (README "Not built yet"): the
            // read does what it does without a ladder, `available` or the fail-fast error.
            Decision::Primary {
                then:
                    AfterPrimary::Available {
                        drop_after_cluster_time,
                    },
                budget_ms,
                ..
            } => {
                let without_ladder = Decision::Rewrite {
                    drop_after_cluster_time,
                    cap_ms: budget_ms,
                };
                self.send_available(without_ladder, req, info, ns);
            }
            Decision::Primary {
                then:
                    AfterPrimary::FailFast {
                        reason,
                        probe_in,
                        errors,
                    },
                ..
            }
            | Decision::FailFast {
                reason,
                probe_in,
                errors,
            } => {
                let reply =
                    policy::fail_fast_reply(ns, reason, errors, probe_in, SystemTime::now());
                self.counters.fail_fast(&self.shared.metrics, ns);
                tracing::debug!(ns = %ns, command = info.name, code = reply.code, reason = %reason, probe_in = ?probe_in, "fail fast: strict namespace, breaker open");
                self.reply_error(req.request_id(), &reply);
            }
            Decision::Refuse(why) => {
                let reply = policy::refusal_reply(ns, why);
                self.counters.refusal(&self.shared.metrics, ns);
                tracing::debug!(ns = %ns, command = info.name, code = reply.code, why = ?why, "refused");
                self.reply_error(req.request_id(), &reply);
            }
        }
    }

    /// Sends a read rewritten to `available` before it goes (`decision` is a `Rewrite`); as
    /// it arrived when the rewrite fails.
    fn send_available(
        &mut self,
        decision: Decision,
        req: &Request,
        info: &CommandInfo<'_>,
        ns: &str,
    ) {
        match self.edited(&decision, req, ns, info.name) {
            Some(out) => {
                self.counters.preemptive_rewrite(&self.shared.metrics, ns);
                tracing::debug!(ns = %ns, command = info.name, kind = "preemptive", dropped_after_cluster_time = info.read_concern.after_cluster_time, "read rewritten to readConcern available");
                self.forward(out, true);
            }
            None => self.forward(req.frame().clone(), true),
        }
    }

    /// Sends a read whose reply will be judged (with `maxTimeMS` capped when the decision
    /// says so), remembering it with the request as opened for a possible resend.
    fn track(
        &mut self,
        decision: &Decision,
        req: &Request,
        info: &CommandInfo<'_>,
        target: &Target<'_>,
        ns: &str,
        now: Instant,
    ) {
        let Decision::Track {
            budget_ms,
            probe,
            retry,
            ..
        } = *decision
        else {
            return self.forward(req.frame().clone(), true);
        };
        let out = self
            .edited(decision, req, ns, info.name)
            .unwrap_or_else(|| req.frame().clone());
        if self.pending.len() >= self.config.limits.max_pending_reads {
            // Sent, but not followed: no retry and no evidence from it.
            self.shared.metrics.limits.hit("max_pending_reads");
            tracing::debug!(ns = %ns, command = info.name, "max_pending_reads reached: read forwarded untracked");
            if probe {
                self.shared.breakers.release_probe(ns);
            }
            return self.forward(out, true);
        }
        if probe {
            tracing::info!(ns = %ns, command = info.name, "half-open probe sent unmodified");
        }
        let tracked_ns = self.tracked_ns(ns);
        self.pending.push(Tracked {
            request_id: req.request_id(),
            ns: tracked_ns,
            command: tracked_command(info.name),
            policy: target.policy.clone(),
            original: req.clone(),
            started: now,
            // The whole budget: the resend spends what the first attempt left (none: no
            // limit either).
            max_time_ms: budget_ms,
            probe,
            retry,
            retried: false,
            // `forward` below counts it.
            seq: self.sent_finals + 1,
        });
        self.forward(out, true);
    }

    /// The request rewritten by `decision`'s spec, from the opened request (no header read,
    /// no decompression). `None`: no spec, or the rewrite failed (logged); the very bytes
    /// that arrived go instead.
    fn edited(&self, decision: &Decision, req: &Request, ns: &str, command: &str) -> Option<Bytes> {
        let spec = policy::rewrite_spec(decision)?;
        match rewrite::rewrite(req, &spec, self.config.max_message_size) {
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
    fn pass(&mut self, msg: Bytes, expects_reply: bool) {
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
    fn refuse_legacy(&mut self, request_id: i32, refusal: &policy::LegacyRefusal) {
        self.counters.refusal(&self.shared.metrics, &refusal.ns);
        tracing::debug!(ns = %refusal.ns, code = refusal.reply.code, "refused: legacy OP_QUERY on a database with governed namespaces");
        let out = refusal.to_message(self.shared.ids.request_id(), request_id);
        self.to_client.push(out);
    }

    /// Answers request `request_id` with `reply` instead of sending it upstream.
    fn reply_error(&mut self, request_id: i32, reply: &ErrorReply) {
        let out = reply.to_message(self.shared.ids.request_id(), request_id);
        self.to_client.push(out);
    }
}
