//! What happens to a request. It is opened once (`wire::Request`), its requestID checked
//! against the reads and writes still followed (a reused one closes the client), and sent
//! through the early gates (`gate.rs`): forwarded untouched, followed as a write (write-stall
//! watch), refused (legacy OP_QUERY), or governed. A governed read is classified from the
//! message as opened, decided on (`policy::decide`, pure) and carried out: forwarded as it
//! arrived, rewritten, sent to the primary, or answered by the proxy; a followed one becomes
//! a tracked read (`reads`) on the attempt its decision names (`policy::Attempt`).

use std::borrow::Cow;
use std::time::SystemTime;

use bytes::Bytes;
use tokio::time::Instant;

use super::gate::{self, Gate};
use super::reads::Tracked;
use super::{Handler, SessionError};
use crate::command::{self, ClassifyError, CommandInfo};
use crate::policy::{self, Admission, Attempt, Decision, ErrorReply, Mode, Target};
use crate::rewrite;
use crate::upstream::LadderPermit;
use crate::wire::{Request, WireError};

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

impl Handler {
    /// One request from the client. `Some`: a large compressed request to be decompressed
    /// off the workers (`gate::inflate_aside`) and then handed to [`Handler::on_inflated`].
    pub(super) fn on_request(&mut self, msg: Bytes) -> Result<Option<Request>, SessionError> {
        self.refresh_config();
        let max = self.config.max_message_size;
        let mut req = Request::new(msg, max).map_err(SessionError::ClientProtocol)?;
        self.refuse_reused_id(req.request_id())?;
        match gate::gate(&mut req, &self.config)? {
            Gate::Inflate => return Ok(Some(req)),
            gate => self.dispatch(gate, req)?,
        }
        Ok(None)
    }

    /// A request [`Handler::on_request`] set aside, now decompressed.
    pub(super) fn on_inflated(&mut self, mut req: Request) -> Result<(), SessionError> {
        let gate = gate::gate_open(&mut req, &self.config)?;
        self.dispatch(gate, req)
    }

    /// Picks up a reloaded config, from the next request on.
    fn refresh_config(&mut self) {
        let generation = self.shared.config.generation();
        if generation != self.config_generation {
            self.config = self.shared.config.load_full();
            self.config_generation = generation;
        }
    }

    /// The first gate: a request that reuses the requestID of a followed read or write
    /// still waiting for its reply closes the client, since its reply could be taken for
    /// theirs (an open breaker's probe above all). No driver does this: ids are unique among a
    /// connection's requests in flight.
    fn refuse_reused_id(&self, request_id: i32) -> Result<(), SessionError> {
        if !self.reads.reuses(request_id) {
            return Ok(());
        }
        self.meter.limit("reused_request_id");
        // The followed reads end unjudged: a sample among them says nothing (a probe gives
        // its slot back).
        let now = Instant::now();
        for t in self.reads.samples() {
            let unknown = crate::breaker::Sample::Unknown;
            self.shared
                .breakers
                .sampled(&t.ns, &t.policy, unknown, self.id, now);
        }
        Err(SessionError::ReusedRequestId(request_id))
    }

    fn dispatch(&mut self, gate: Gate, mut req: Request) -> Result<(), SessionError> {
        match gate {
            Gate::Pass { expects_reply } => self.pass(req.into_frame(), expects_reply),
            Gate::Write => self.send_write(req.request_id(), req.into_frame()),
            Gate::Read => self.govern(req)?,
            Gate::Legacy(refusal) => self.refuse_legacy(req.request_id(), &refusal),
            // Only from `gate`, handled by the caller; opened here as a last resort.
            Gate::Inflate => {
                let gate = gate::gate_open(&mut req, &self.config)?;
                return self.dispatch(gate, req);
            }
        }
        Ok(())
    }

    /// Forwards a write untouched and follows it (write-stall watch): it waits from its turn
    /// at mongos (every earlier request that expects a final reply has had it) until any
    /// reply to it arrives.
    fn send_write(&mut self, request_id: i32, frame: Bytes) {
        self.pass(frame, true);
        let turn = (
            request_id,
            self.peers.next_place() - 1,
            self.peers.finals_in(),
        );
        let (watch, upstream) = (&self.shared.stall, &self.upstream);
        self.reads
            .writes
            .sent(watch, upstream, turn, Instant::now());
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
        let (decision, held) = policy::apply_dry_run(decided, &target.policy);
        if let Some(h) = held {
            tracing::debug!(ns = %ns, command = info.name, decision = h.name, dry_run = true, "would act (dry run)");
            if let Some(action) = h.action {
                self.meter.dry_run(&ns, action);
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

    /// Carries out a decision, counted as decided.
    fn apply(&mut self, decision: Decision<'_>, g: Governed<'_, '_>) {
        self.meter.request(g.info.name, decision.name());
        self.carry_out(decision, g)
    }

    fn carry_out(&mut self, decision: Decision<'_>, g: Governed<'_, '_>) {
        let Governed { req, info, ns, .. } = g;
        match decision {
            Decision::Forward => self.forward(req.frame().clone(), true),
            Decision::Track { .. } => self.track(&decision, g),
            Decision::Rewrite { .. } => self.send_available(&decision, g),
            Decision::Primary { .. } => self.send_primary(decision, g),
            Decision::FailFast {
                reason,
                probe_in,
                errors,
            } => self.fail_fast(g, reason, probe_in, errors),
            Decision::Refuse(why) => {
                let reply = policy::refusal_reply(ns, why);
                self.meter.refusal(ns);
                tracing::debug!(ns = %ns, command = info.name, code = reply.code, why = ?why, "refused");
                self.reply_error(req.request_id(), &reply);
            }
        }
    }

    /// The primary rung, when this upstream's guard has room (and the rewrite succeeds);
    /// else what the decision says follows it (`Decision::refused`).
    fn send_primary(&mut self, decision: Decision<'_>, g: Governed<'_, '_>) {
        let Governed { req, info, ns, .. } = g;
        if let Some(permit) = self.claim_ladder(ns) {
            let attempt = decision.attempt();
            if let (Some(out), Some(attempt)) =
                (self.edited(&decision, req, ns, info.name), attempt)
            {
                tracing::debug!(ns = %ns, command = info.name, "breaker open: read sent to the primary (ladder)");
                self.follow(out, g, attempt, Some(permit));
                return;
            }
        }
        self.carry_out(decision.refused(), g)
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
        self.meter.fail_fast(ns);
        tracing::debug!(ns = %ns, command = info.name, code = reply.code, reason = %reason, probe_in = ?probe_in, "fail fast: strict namespace, breaker open");
        self.reply_error(req.request_id(), &reply);
    }

    /// Sends a read rewritten to `available` before it goes (`decision` is a `Rewrite`),
    /// followed for the orphan estimate; as it arrived when the rewrite fails.
    fn send_available(&mut self, decision: &Decision, g: Governed<'_, '_>) {
        let Governed { req, info, ns, .. } = g;
        match (
            self.edited(decision, req, ns, info.name),
            decision.attempt(),
        ) {
            (Some(out), Some(attempt)) => {
                self.meter.preemptive_rewrite(ns);
                tracing::debug!(ns = %ns, command = info.name, kind = "preemptive", dropped_after_cluster_time = info.read_concern.after_cluster_time, "read rewritten to readConcern available");
                self.follow(out, g, attempt, None);
            }
            _ => self.forward(req.frame().clone(), true),
        }
    }

    /// Sends a read whose reply will be judged (with `maxTimeMS` capped when the decision
    /// says so), remembering it with the request as opened for a possible resend.
    fn track(&mut self, decision: &Decision, g: Governed<'_, '_>) {
        let Governed { req, info, ns, .. } = g;
        let Some(attempt) = decision.attempt() else {
            return self.forward(req.frame().clone(), true);
        };
        // A dry run's read is judged with the rungs it would have had (see `reply.rs`).
        let attempt = match g.held {
            Some(h) => Attempt {
                primary: h.primary,
                retry: h.retry,
                ..attempt
            },
            None => attempt,
        };
        let (out, attempt) = match self.edited(decision, req, ns, info.name) {
            Some(out) => (out, attempt),
            None => (req.frame().clone(), attempt.unedited()),
        };
        if attempt.bounded.is_some() {
            tracing::debug!(ns = %ns, command = info.name, "breaker open: read sent bounded by open_time_limit");
        }
        if !self.follow(out, g, attempt, None) && attempt.sample {
            self.shared.breakers.release_probe(ns);
        }
    }

    /// Sends `out` (the governed request, as `attempt`) and remembers it for its reply.
    /// Past `max_pending_reads` the read is sent but not followed (false): no next rung and
    /// no evidence from it (its ladder slot is freed at once).
    fn follow(
        &mut self,
        out: Bytes,
        g: Governed<'_, '_>,
        attempt: Attempt,
        permit: Option<LadderPermit>,
    ) -> bool {
        let Governed {
            req,
            info,
            target,
            ns,
            now,
            held,
        } = g;
        if self.reads.full(self.config.limits.max_pending_reads) {
            self.meter.limit("max_pending_reads");
            tracing::debug!(ns = %ns, command = info.name, "max_pending_reads reached: read forwarded untracked");
            self.forward(out, true);
            return false;
        }
        let tracked_ns = self.reads.ns(ns);
        // mongos serves a connection's requests in order: this read starts now only when
        // nothing sent before it is still waiting for its reply.
        let began = self.peers.all_answered().then_some(now);
        self.reads.track(Tracked {
            request_id: req.request_id(),
            ns: tracked_ns,
            command: tracked_command(info.name),
            policy: target.policy.clone(),
            original: req.clone(),
            started: now,
            began,
            attempt,
            tagged: info.read_pref_tags,
            pref: info.read_pref,
            permit,
            // `forward` below counts it.
            seq: self.peers.next_place(),
            unique_ids: info.unique_ids,
            dry: held.is_some(),
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
    fn pass(&mut self, msg: Bytes, expects_reply: bool) {
        self.meter.forwarded();
        self.forward(msg, expects_reply);
    }

    fn forward(&mut self, msg: Bytes, expects_reply: bool) {
        self.peers.forward(msg, expects_reply);
    }

    /// Answers legacy OP_QUERY `request_id` with the OP_REPLY of `refusal`, sending nothing.
    fn refuse_legacy(&mut self, request_id: i32, refusal: &policy::LegacyRefusal) {
        self.meter.refusal(&refusal.ns);
        tracing::debug!(ns = %refusal.ns, code = refusal.reply.code, "refused: legacy OP_QUERY on a database with governed namespaces");
        let out = refusal.to_message(self.shared.ids.request_id(), request_id);
        self.peers.answer(out);
    }

    /// Answers request `request_id` with `reply` instead of sending it upstream.
    fn reply_error(&mut self, request_id: i32, reply: &ErrorReply) {
        let out = reply.to_message(self.shared.ids.request_id(), request_id);
        self.peers.answer(out);
    }
}

/// A tracked read's command name without an allocation when the metrics know it (every read
/// command the policy tracks does).
fn tracked_command(name: &str) -> Cow<'static, str> {
    let known = crate::metrics::Metrics::command_label(name);
    if known == name {
        Cow::Borrowed(known)
    } else {
        Cow::Owned(name.to_string())
    }
}
