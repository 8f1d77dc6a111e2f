//! What happens to a request. It is opened once (`wire::Request`), its requestID checked
//! against the reads and writes still followed (a reused one closes the client), and sent
//! through the early gates (`gate.rs`): forwarded untouched, followed as a write (write-stall
//! watch), refused (legacy OP_QUERY), or governed. A governed read is classified from the
//! message as opened, decided on (`policy::decide`, pure) and carried out: forwarded as it
//! arrived, rewritten, sent to the primary, or answered by the proxy; a followed one becomes
//! a [`Followed`] read (`followed.rs`) on the attempt its decision names (`policy::Attempt`).
//! While the connection has not proved itself to the cluster, its authentication steps are
//! followed too (`reads::Proof`).

use bytes::Bytes;
use tokio::time::Instant;

use super::followed::{First, Followed};
use super::gate::{self, Gate};
use super::reads::Step;
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
    pub(super) fn refuse_reused_id(&mut self, request_id: i32) -> Result<(), SessionError> {
        if !self.reads.reuses(request_id) {
            return Ok(());
        }
        self.meter.limit("reused_request_id");
        // The followed reads end unjudged: a sample among them says nothing (a probe gives
        // its slot back).
        for f in self.reads.take_all() {
            if f.sample() {
                self.witnessing().release_sample(&f);
            }
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
        self.follow_write(request_id);
    }

    /// Follows write `request_id`, just sent (whole, or the head of one going in pieces).
    pub(super) fn follow_write(&mut self, request_id: i32) {
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
            self.follow_proof(&req, &info);
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
        let admission = self.admit(&target, &info, &ns, now);
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
    /// hold on fallback namespaces); other reads are not the breaker's business. A read
    /// pinned by tag sets never climbs to the primary, so it is admitted as it would be
    /// without the primary rung.
    fn admit(
        &self,
        target: &Target<'_>,
        info: &CommandInfo<'_>,
        ns: &str,
        now: Instant,
    ) -> Admission {
        if target.kind != policy::ReadKind::Eligible {
            return Admission::Closed;
        }
        if target.policy.mode == Mode::Fallback && self.shared.stall.holding() {
            self.shared.breakers.hold_on_read(ns, now);
        }
        let climbs = target.policy.primary_rung && !info.read_pref_tags;
        let breakers = &self.shared.breakers;
        let proven = self.reads.proof.proven();
        breakers.admit_as(ns, &target.policy, self.id, climbs, proven, now)
    }

    /// Carries out a decision, counted as decided.
    fn apply(&mut self, decision: Decision<'_>, g: Governed<'_, '_>) {
        self.meter.request(g.info.name, decision.name());
        self.carry_out(decision, g)
    }

    fn carry_out(&mut self, decision: Decision<'_>, g: Governed<'_, '_>) {
        let Governed { req, info, ns, .. } = g;
        match decision {
            Decision::Forward => {
                self.follow_proof(req, info);
                self.forward(req.frame().clone(), true)
            }
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
            if let (Some(out), Some(attempt)) = (self.edited(&decision, req, ns, info), attempt) {
                tracing::debug!(ns = %ns, command = info.name, "breaker open: read sent to the primary (ladder)");
                self.follow(out, g, attempt, Some(permit), written(&decision));
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
        let reply = policy::fail_fast_reply(ns, reason, errors);
        self.meter.fail_fast(ns);
        tracing::debug!(ns = %ns, command = info.name, code = reply.code, reason = %reason, probe_in = ?probe_in, "fail fast: strict namespace, breaker open");
        self.reply_error(req.request_id(), &reply);
    }

    /// Sends a read rewritten to `available` before it goes (`decision` is a `Rewrite`),
    /// followed for the orphan estimate; as it arrived when the rewrite fails.
    fn send_available(&mut self, decision: &Decision, g: Governed<'_, '_>) {
        let Governed { req, info, ns, .. } = g;
        match (self.edited(decision, req, ns, info), decision.attempt()) {
            (Some(out), Some(attempt)) => {
                self.meter.preemptive_rewrite(ns);
                tracing::debug!(ns = %ns, command = info.name, kind = "preemptive", dropped_after_cluster_time = info.read_concern.after_cluster_time, "read rewritten to readConcern available");
                self.follow(out, g, attempt, None, written(decision));
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
            Some(h) => h.attempt(attempt),
            None => attempt,
        };
        let (out, attempt) = match self.edited(decision, req, ns, info) {
            Some(out) => (out, attempt),
            None => (req.frame().clone(), attempt.unedited()),
        };
        if attempt.bounded.is_some() {
            tracing::debug!(ns = %ns, command = info.name, "breaker open: read sent bounded by open_time_limit");
        }
        if !self.follow(out, g, attempt, None, written(decision)) && attempt.sample {
            self.shared.breakers.release_probe(ns);
        }
    }

    /// Sends `out` (the governed request, as `attempt`, with the `maxTimeMS` staleguard
    /// `written` when it wrote one) and remembers it for its reply. Past
    /// `max_pending_reads` the read is sent but not followed (false): no next rung and no
    /// evidence from it (its ladder slot is freed at once).
    fn follow(
        &mut self,
        out: Bytes,
        g: Governed<'_, '_>,
        attempt: Attempt,
        permit: Option<LadderPermit>,
        written: Option<i64>,
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
        // The limit the attempt goes out with: the one staleguard wrote, or the client's own.
        let limit_ms = match attempt.limit_ours {
            true => written,
            false => info.max_time_ms.filter(|&ms| ms > 0),
        };
        let first = First {
            req,
            info,
            ns: self.reads.ns(ns),
            policy: target.policy.clone(),
            attempt,
            permit,
            limit_ms,
            // `forward` below counts it.
            seq: self.peers.next_place(),
            now,
            // mongos serves a connection's requests in order: this read starts now only when
            // nothing sent before it is still waiting for its reply.
            at_once: self.peers.all_answered(),
            dry: held.is_some(),
        };
        let followed = Followed::first(first, self.reads.spare.take());
        self.reads.follow(followed);
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
        info: &CommandInfo<'_>,
    ) -> Option<Bytes> {
        let spec = policy::rewrite_spec(decision)?;
        let max = self.config.max_message_size;
        let places = info.places.as_ref();
        match rewrite::rewrite_into(req, &spec, places, max, &mut self.rewrite_buf) {
            Ok(out) => {
                if !spec.available {
                    tracing::debug!(ns = %ns, command = info.name, max_time_ms = spec.max_time_ms, "maxTimeMS capped");
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

    /// Until the connection has proved itself, the reply to an authentication step or a
    /// read it sends is followed: mongos accepting the one, or answering the other `ok: 1`,
    /// proves it (`reads::Proof`).
    fn follow_proof(&mut self, req: &Request, info: &CommandInfo<'_>) {
        if self.reads.proof.proven() {
            return;
        }
        let step = if is_auth_step(info) {
            Step::Auth
        } else if command::is_read_command(info.name) {
            Step::Read
        } else {
            return;
        };
        let place = self.peers.next_place();
        self.reads.follow_proof(req.request_id(), place, step);
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

    /// Answers request `request_id` with `reply` instead of sending it upstream.
    fn reply_error(&mut self, request_id: i32, reply: &ErrorReply) {
        let out = reply.to_message(self.shared.ids.request_id(), request_id);
        self.peers.answer(out);
    }
}

/// The `maxTimeMS` `decision` writes on the request, if any.
fn written(decision: &Decision<'_>) -> Option<i64> {
    policy::rewrite_spec(decision).and_then(|spec| spec.max_time_ms)
}

/// An authentication step whose reply says whether mongos accepted the connection:
/// `saslStart`, `saslContinue`, `authenticate`, or a `hello` carrying
/// `speculativeAuthenticate`.
fn is_auth_step(info: &CommandInfo<'_>) -> bool {
    matches!(info.name, "saslStart" | "saslContinue" | "authenticate") || info.speculative_auth
}
