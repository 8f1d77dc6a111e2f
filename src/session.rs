//! One client connection: its own upstream connection, and the relay between the two.
//!
//! Requests are classified and decided on as they arrive; replies are looked at only when
//! they answer a tracked read or write. A message that is not rewritten leaves as the very
//! `Bytes` that arrived. Writes (for the write-stall watch) cost a command-name read and a
//! small per-session list; other commands pay nothing more.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use futures::StreamExt;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::time::Instant;
use tokio_util::codec::FramedRead;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::breaker::Transition;
use crate::command::{self, CommandInfo};
use crate::config::Config;
use crate::metrics::{LatencyBatch, LatencyHistogram, Metrics, NsHot, REQUEST_SLOTS};
use crate::policy::{
    self, Admission, Causal, Decision, ErrorReply, Mode, NsPolicy, Reason, Target,
};
use crate::rewrite::{self, RewriteSpec};
use crate::server::Shared;
use crate::stall::{self, WriteTracker};
use crate::tls::Stream;
use crate::wire::codec::FrameError;
use crate::wire::opmsg::{self, MORE_TO_COME};
use crate::wire::{Header, MessageCodec, OpCode, WireError};

/// A session adds its batched metrics after this many round trips, or this long after the
/// last time, whichever comes first (and when it ends).
const FLUSH_EVERY: u32 = 64;
const FLUSH_AFTER: Duration = Duration::from_secs(1);

/// Initial read-buffer size per direction; grows to the message size when needed.
const READ_BUFFER: usize = 8 * 1024;

/// Why a session ended, and which side caused it.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error("client sent a malformed message: {0}")]
    ClientProtocol(WireError),
    #[error("client i/o: {0}")]
    ClientIo(std::io::Error),
    #[error("upstream sent a malformed message: {0}")]
    UpstreamProtocol(WireError),
    #[error("upstream i/o: {0}")]
    UpstreamIo(std::io::Error),
}

impl SessionError {
    /// The client just went away: a reset or a broken pipe (Node.js's `client.close()`
    /// resets its sockets), or a stream cut without a TLS close_notify between two messages
    /// (`at_message_boundary`: nothing of a next message had arrived). Such an end is logged
    /// like a clean close, not as a warning.
    pub fn is_client_close(&self, at_message_boundary: bool) -> bool {
        use std::io::ErrorKind;
        let SessionError::ClientIo(e) = self else {
            return false;
        };
        match e.kind() {
            ErrorKind::ConnectionReset | ErrorKind::ConnectionAborted | ErrorKind::BrokenPipe => {
                true
            }
            ErrorKind::UnexpectedEof => at_message_boundary,
            _ => false,
        }
    }
}

/// A request some policy governs, with everything decided about it.
struct Governed<'r, 'a> {
    msg: &'r Bytes,
    body: &'r crate::wire::RequestBody<'a>,
    info: &'r CommandInfo<'a>,
    target: &'r Target<'a>,
    ns: &'r str,
    request_id: i32,
    now: Instant,
}

/// A read whose reply the session inspects.
#[derive(Debug)]
struct Tracked {
    request_id: i32,
    ns: String,
    command: String,
    policy: Arc<NsPolicy>,
    /// The client's message as it arrived (a retry is rewritten from it).
    original: Bytes,
    started: Instant,
    /// `maxTimeMS` in force for the read as sent (client's, or the cap).
    max_time_ms: Option<i64>,
    probe: bool,
    retry: bool,
    retried: bool,
}

pub struct Session {
    shared: Arc<Shared>,
    /// The config as of the current request (reloads apply from the next request on).
    config: Arc<Config>,
    config_generation: u64,
    peer: SocketAddr,
    id: u64,
    stop: CancellationToken,
    kill: CancellationToken,
    pending: Vec<Tracked>,
    /// Requests sent that still expect a final reply (for a graceful stop).
    outstanding: u32,
    /// The last reply relayed had moreToCome (an exhaust stream is running).
    streaming: bool,
    /// When the oldest request still waiting for its first reply was forwarded.
    waiting_since: Option<Instant>,
    latency: Option<LatencyHistogram>,
    /// Round-trip latencies and unclassified forwards not yet added to the shared metrics.
    batch: LatencyBatch,
    unflushed_forwards: u64,
    /// Counters of the last governed namespace this session bumped.
    hot: Option<Arc<NsHot>>,
    /// Reused for the "db.coll" key of governed reads.
    ns_buf: String,
    /// Not yet added to the shared metrics: outcomes on `hot`'s namespace, and requests by
    /// (command, decision).
    hot_counts: [u32; 3],
    /// Something above is not flushed yet.
    dirty: bool,
    request_counts: [[u32; REQUEST_SLOTS.1]; REQUEST_SLOTS.0],
    /// The upstream this client is paired with (its configured address).
    upstream: String,
    /// Writes sent and not answered yet (write-stall watch).
    writes: WriteTracker,
}

impl Session {
    pub fn new(
        shared: Arc<Shared>,
        peer: SocketAddr,
        id: u64,
        stop: CancellationToken,
        kill: CancellationToken,
    ) -> Session {
        let config_generation = shared.config_generation();
        let config = shared.config.load_full();
        Session {
            shared,
            config,
            config_generation,
            peer,
            id,
            stop,
            kill,
            pending: Vec::new(),
            outstanding: 0,
            streaming: false,
            waiting_since: None,
            latency: None,
            batch: LatencyBatch::default(),
            unflushed_forwards: 0,
            hot: None,
            ns_buf: String::new(),
            hot_counts: [0; 3],
            dirty: false,
            request_counts: [[0; REQUEST_SLOTS.1]; REQUEST_SLOTS.0],
            upstream: String::new(),
            writes: WriteTracker::default(),
        }
    }

    pub async fn run(self, client: Stream) {
        let span = tracing::info_span!("conn", client.addr = %self.peer, id = self.id);
        self.relay(client).instrument(span).await
    }

    async fn relay(self, client: Stream) {
        let connected = self
            .shared
            .upstreams
            .connect(&self.config, &self.shared.metrics)
            .await;
        let (upstream, upstream_addr) = match connected {
            Ok(pair) => pair,
            Err(e) => {
                tracing::error!(error = %e, "closing client: no upstream reachable");
                return;
            }
        };
        tracing::debug!(upstream = %upstream_addr, "paired");
        let m = &self.shared.metrics;
        m.client_connections.inc();
        m.client_connections_total.inc();
        let latency = m
            .upstream_latency
            .get_or_create(&crate::metrics::UpstreamLabel {
                upstream: upstream_addr.to_string(),
            })
            .clone();
        let shared = self.shared.clone();
        let mut this = self;
        this.latency = Some(latency);
        this.upstream = upstream_addr;
        match (client, upstream) {
            // Plain TCP keeps its lock-free owned halves.
            (Stream::Plain(c), Stream::Plain(u)) => {
                let (cr, cw) = c.into_split();
                let (ur, uw) = u.into_split();
                this.pump(cr, cw, ur, uw).await;
            }
            (c, u) => {
                let (cr, cw) = tokio::io::split(c);
                let (ur, uw) = tokio::io::split(u);
                this.pump(cr, cw, ur, uw).await;
            }
        }
        shared.metrics.client_connections.dec();
    }

    /// Relays until either side ends, the client misbehaves, or the proxy stops.
    pub async fn pump<CR, CW, UR, UW>(mut self, cr: CR, mut cw: CW, ur: UR, mut uw: UW)
    where
        CR: AsyncRead + Unpin,
        CW: AsyncWrite + Unpin,
        UR: AsyncRead + Unpin,
        UW: AsyncWrite + Unpin,
    {
        let max = self.config.max_message_size;
        let mut cr = FramedRead::with_capacity(cr, MessageCodec::new(max), READ_BUFFER);
        let mut ur = FramedRead::with_capacity(ur, MessageCodec::trusting(max), READ_BUFFER);
        let mut draining = false;
        let (kill, stop) = (self.kill.clone(), self.stop.clone());
        // Built once: re-creating them per loop turn registers with the tokens' shared Notify
        // on every message.
        let killed = kill.cancelled();
        let stopping = stop.cancelled();
        // Batched metrics reach the shared counters within FLUSH_AFTER even when the
        // session goes quiet: armed once per batch, not per message.
        let flush_timer = tokio::time::sleep(FLUSH_AFTER);
        tokio::pin!(killed, stopping, flush_timer);
        let mut flush_armed = true;
        let end: Result<&str, SessionError> = loop {
            if draining && (self.outstanding == 0 || self.streaming) {
                break Ok("proxy stopping");
            }
            if self.dirty && !flush_armed {
                flush_timer.as_mut().reset(Instant::now() + FLUSH_AFTER);
                flush_armed = true;
            }
            tokio::select! {
                _ = &mut killed => break Ok("shutdown deadline passed"),
                _ = &mut flush_timer, if flush_armed => {
                    flush_armed = false;
                    self.flush_metrics();
                }
                _ = &mut stopping, if !draining => draining = true,
                req = cr.next() => match req {
                    Some(Ok(msg)) => {
                        if let Err(e) = self.on_request(msg, &mut cw, &mut uw).await {
                            break Err(e);
                        }
                    }
                    Some(Err(e)) => break Err(client_err(e)),
                    None => {
                        self.client_gone();
                        break Ok("client closed");
                    }
                },
                rep = ur.next() => match rep {
                    Some(Ok(msg)) => {
                        if let Err(e) = self.on_reply(msg, &mut cw, &mut uw).await {
                            break Err(e);
                        }
                    }
                    Some(Err(e)) => break Err(upstream_err(e)),
                    None => break Ok("upstream closed"),
                },
            }
        };
        if !self.writes.is_empty() {
            // Not progress: the watch notes it, nothing clears on it.
            self.writes.abandon();
        }
        let at_message_boundary = cr.read_buffer().is_empty();
        match end {
            Ok(why) => tracing::debug!(reason = why, "session closed"),
            Err(e) if e.is_client_close(at_message_boundary) => {
                tracing::debug!(error = %e, "session closed: client went away")
            }
            Err(e @ (SessionError::ClientProtocol(_) | SessionError::ClientIo(_))) => {
                tracing::warn!(error = %e, "closing client")
            }
            Err(e) => tracing::warn!(error = %e, "closing client because its upstream failed"),
        }
        self.flush_metrics();
        let _ = cw.shutdown().await;
        let _ = uw.shutdown().await;
    }

    async fn on_request<C: AsyncWrite + Unpin, U: AsyncWrite + Unpin>(
        &mut self,
        msg: Bytes,
        cw: &mut C,
        uw: &mut U,
    ) -> Result<(), SessionError> {
        let generation = self.shared.config_generation();
        if generation != self.config_generation {
            self.config = self.shared.config.load_full();
            self.config_generation = generation;
        }
        let max = self.config.max_message_size;
        let header = Header::parse(&msg)
            .ok_or(SessionError::ClientProtocol(WireError::Truncated("header")))?;
        let op = header.op();
        let policy_active = self.policy_active();
        let watch_writes = self.config.stall.passive;
        if policy_active && matches!(op, OpCode::Query | OpCode::Compressed) {
            let judged = policy::judge_op_query(&msg, &self.config.policy, max);
            if let Some(refusal) = judged.map_err(SessionError::ClientProtocol)? {
                return self.refuse_legacy(header.request_id, &refusal, cw).await;
            }
        }
        if op == OpCode::Msg && !policy_active && !watch_writes {
            // Validate only: the structure must hold even when no policy needs the body.
            let view = opmsg::OpMsg::parse(&msg[crate::wire::HEADER_LEN..])
                .map_err(SessionError::ClientProtocol)?;
            if view.checksum_present() {
                opmsg::verify_checksum(&msg).map_err(SessionError::ClientProtocol)?;
            }
            let expects_reply = !view.more_to_come();
            return self.pass(msg, expects_reply, uw).await;
        }
        if !matches!(op, OpCode::Msg | OpCode::Compressed) || !(policy_active || watch_writes) {
            return self.pass(msg, true, uw).await;
        }
        let body = crate::wire::request_body(&msg, max).map_err(SessionError::ClientProtocol)?;
        let Some(doc) = body.body() else {
            return self.pass(msg.clone(), true, uw).await;
        };
        if body.flags() & MORE_TO_COME != 0 {
            return self.pass(msg.clone(), false, uw).await;
        }
        match command::command_name(doc) {
            Ok(Some(name)) if watch_writes && stall::is_write_command(name) => {
                let now = Instant::now();
                let (watch, upstream) = (&self.shared.stall, &self.upstream);
                self.writes.sent(watch, upstream, header.request_id, now);
                return self.pass(msg.clone(), true, uw).await;
            }
            // Every other command: a repeated policy-relevant field or a client's own
            // `available` is refused whatever the command (see `policy::resolve`).
            Ok(Some(name)) if policy_active && !stall::is_write_command(name) => {}
            Ok(_) => return self.pass(msg.clone(), true, uw).await,
            Err(command::ClassifyError::Malformed(what)) => {
                return Err(SessionError::ClientProtocol(WireError::BadBson(what)))
            }
            Err(command::ClassifyError::NoCommand) => {
                return self.pass(msg.clone(), true, uw).await
            }
        }
        let info = match command::classify(doc) {
            Ok(info) => info,
            Err(command::ClassifyError::NoCommand) => {
                return self.pass(msg.clone(), true, uw).await
            }
            Err(command::ClassifyError::Malformed(what)) => {
                return Err(SessionError::ClientProtocol(WireError::BadBson(what)))
            }
        };
        let Some(target) = policy::resolve(&info, &self.config.policy) else {
            return self.pass(msg.clone(), true, uw).await;
        };
        // The "db.coll" key, built in a buffer the session reuses.
        let mut ns = std::mem::take(&mut self.ns_buf);
        ns.clear();
        ns.push_str(target.ns.db);
        ns.push('.');
        ns.push_str(target.ns.coll);
        let now = Instant::now();
        let admission = if target.kind == policy::ReadKind::Eligible {
            if target.policy.mode == Mode::Fallback && self.shared.stall.holding() {
                stall::hold_on_read(&self.shared, &ns, now);
            }
            let (a, t) = self.shared.breakers.admit(&ns, &target.policy, now);
            if let Some(t) = t {
                self.log_transition(&ns, &t);
            }
            a
        } else {
            Admission::Closed
        };
        let decided = policy::decide(&target, &info, admission);
        let (decision, held_back) = policy::apply_dry_run(decided, &target.policy);
        if let Some(would) = held_back {
            tracing::debug!(ns = %ns, command = info.name, decision = would, dry_run = true, "would act (dry run)");
        }
        let req = Governed {
            msg: &msg,
            body: &body,
            info: &info,
            target: &target,
            ns: &ns,
            request_id: header.request_id,
            now,
        };
        let done = self.apply(decision, req, cw, uw).await;
        self.ns_buf = ns;
        done
    }

    async fn apply<C: AsyncWrite + Unpin, U: AsyncWrite + Unpin>(
        &mut self,
        decision: Decision<'_>,
        req: Governed<'_, '_>,
        cw: &mut C,
        uw: &mut U,
    ) -> Result<(), SessionError> {
        let Governed {
            msg,
            body,
            info,
            target,
            ns,
            request_id,
            now,
        } = req;
        let msg = msg.clone();
        let max = self.config.max_message_size;
        let spec = policy::rewrite_spec(&decision);
        if let Some((c, d)) = Metrics::request_slot(info.name, decision.name()) {
            self.request_counts[c][d] += 1;
            self.dirty = true;
        }
        match decision {
            Decision::Forward => self.forward(msg, true, uw).await,
            Decision::Track {
                cap_ms,
                probe,
                retry,
            } => {
                let out = match spec {
                    Some(spec) => match rewrite::rewrite_request(&msg, body, &spec, max) {
                        Ok(b) => {
                            tracing::debug!(ns = %ns, command = info.name, max_time_ms = spec.max_time_ms, "maxTimeMS capped");
                            b
                        }
                        Err(e) => {
                            tracing::warn!(ns = %ns, error = %e, "cannot cap maxTimeMS, forwarding as is");
                            msg.clone()
                        }
                    },
                    None => msg.clone(),
                };
                if probe {
                    tracing::info!(ns = %ns, command = info.name, "half-open probe sent unmodified");
                }
                self.pending.push(Tracked {
                    request_id,
                    ns: ns.to_string(),
                    command: info.name.to_string(),
                    policy: target.policy.clone(),
                    original: msg,
                    started: now,
                    // maxTimeMS 0 means "no limit": no budget to spend.
                    max_time_ms: cap_ms.or(info.max_time_ms.filter(|&m| m > 0)),
                    probe,
                    retry,
                    retried: false,
                });
                self.forward(out, true, uw).await
            }
            Decision::Rewrite { .. } => {
                let Some(spec) = spec else {
                    // Not reached: `rewrite_spec` gives every rewrite a spec.
                    return self.forward(msg, true, uw).await;
                };
                match rewrite::rewrite_request(&msg, body, &spec, max) {
                    Ok(out) => {
                        self.bump(ns, 0);
                        tracing::debug!(ns = %ns, command = info.name, kind = "preemptive", dropped_after_cluster_time = info.read_concern.after_cluster_time, "read rewritten to readConcern available");
                        self.forward(out, true, uw).await
                    }
                    Err(e) => {
                        tracing::warn!(ns = %ns, error = %e, "rewrite failed, forwarding as is");
                        self.forward(msg, true, uw).await
                    }
                }
            }
            Decision::FailFast {
                reason,
                probe_in,
                errors,
            } => {
                let reply =
                    policy::fail_fast_reply(ns, reason, errors, probe_in, SystemTime::now());
                self.bump(ns, 1);
                tracing::debug!(ns = %ns, command = info.name, code = reply.code, reason = %reason, probe_in = ?probe_in, "fail fast: strict namespace, breaker open");
                self.reply_error(request_id, &reply, cw).await
            }
            Decision::Refuse(why) => {
                let reply = policy::refusal_reply(ns, why);
                self.bump(ns, 2);
                tracing::debug!(ns = %ns, command = info.name, code = reply.code, why = ?why, "refused");
                self.reply_error(request_id, &reply, cw).await
            }
        }
    }

    async fn on_reply<C: AsyncWrite + Unpin, U: AsyncWrite + Unpin>(
        &mut self,
        msg: Bytes,
        cw: &mut C,
        uw: &mut U,
    ) -> Result<(), SessionError> {
        if let Some(t) = self.waiting_since.take() {
            self.batch.observe(t.elapsed());
            self.maybe_flush();
        }
        if self.pending.is_empty() && self.writes.is_empty() {
            return self.send_to_client(msg, cw).await;
        }
        let response_to = Header::parse(&msg).map_or(0, |h| h.response_to);
        if !self.writes.is_empty() {
            let max = self.config.max_message_size;
            let ok = || crate::wire::inspect_reply(&msg, max).is_ok_and(|s| s.ok);
            let (watch, now) = (&self.shared.stall, Instant::now());
            if self.writes.answered(watch, response_to, ok, now) {
                return self.send_to_client(msg, cw).await;
            }
        }
        if !self.pending.is_empty() {
            if let Some(i) = self
                .pending
                .iter()
                .position(|t| t.request_id == response_to)
            {
                let t = self.pending.swap_remove(i);
                if self.inspect(t, &msg, uw).await? {
                    return Ok(());
                }
            }
        }
        self.send_to_client(msg, cw).await
    }

    /// Looks at the reply to a tracked read; returns true when it was swallowed because a
    /// retry went out instead.
    async fn inspect<U: AsyncWrite + Unpin>(
        &mut self,
        mut t: Tracked,
        msg: &Bytes,
        uw: &mut U,
    ) -> Result<bool, SessionError> {
        let now = Instant::now();
        let elapsed = now.saturating_duration_since(t.started);
        let status = match crate::wire::inspect_reply(msg, self.config.max_message_size) {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(ns = %t.ns, error = %e, "cannot read reply to a tracked read");
                if t.probe {
                    self.shared.breakers.release_probe(&t.ns);
                }
                return Ok(false);
            }
        };
        let breakers = &self.shared.breakers;
        let trigger = status
            .code
            .filter(|&c| !status.ok && t.policy.is_trigger(c));
        if t.retried {
            // The breaker counts failing reads, not attempts: the first error of this read
            // was counted already. Whatever the resend got goes to the client.
            if let Some(code) = trigger {
                tracing::info!(ns = %t.ns, command = %t.command, code, "resend failed too; returning its error");
            }
            return Ok(false);
        }
        if let Some(code) = trigger {
            let what = format!("{} {}", code, status.code_name.as_deref().unwrap_or(""));
            tracing::info!(ns = %t.ns, command = %t.command, code, code_name = status.code_name.as_deref().unwrap_or(""), elapsed_ms = elapsed.as_millis() as u64, "trigger error");
            self.shared.metrics.trigger_error(&t.ns, &code.to_string());
            let reason = Reason::of_code(code);
            if let Some(tr) =
                breakers.record_failure(&t.ns, &t.policy, reason, what.trim(), t.probe, now)
            {
                self.log_transition(&t.ns, &tr);
            }
            if t.retry {
                let remaining = t
                    .max_time_ms
                    .map(|m| m - elapsed.as_millis().min(i64::MAX as u128) as i64);
                if remaining.is_some_and(|r| r <= 0) {
                    tracing::info!(ns = %t.ns, "no time left to retry, returning the error");
                    return Ok(false);
                }
                let spec = RewriteSpec {
                    available: true,
                    drop_after_cluster_time: t.policy.causal == Causal::Drop,
                    max_time_ms: remaining,
                };
                match rewrite::rewrite_message(&t.original, &spec, self.config.max_message_size) {
                    Ok(out) => {
                        tracing::info!(ns = %t.ns, command = %t.command, kind = "retry", code, max_time_ms = ?remaining, "resending with readConcern available");
                        self.shared.metrics.rewrite(&t.ns, "retry");
                        t.retried = true;
                        t.probe = false;
                        self.pending.push(t);
                        uw.write_all(&out).await.map_err(SessionError::UpstreamIo)?;
                        return Ok(true);
                    }
                    Err(e) => {
                        tracing::warn!(ns = %t.ns, error = %e, "cannot rewrite for retry, returning the error")
                    }
                }
            }
            return Ok(false);
        }
        if let Some(slow) = t.policy.slow_read.filter(|&s| elapsed > s) {
            self.shared.metrics.trigger_error(&t.ns, "slow");
            let what = format!(
                "slow reply ({} ms > {} ms)",
                elapsed.as_millis(),
                slow.as_millis()
            );
            tracing::info!(ns = %t.ns, command = %t.command, elapsed_ms = elapsed.as_millis() as u64, "slow read counted as a time-limit error");
            if let Some(tr) =
                breakers.record_failure(&t.ns, &t.policy, Reason::TimeLimit, &what, t.probe, now)
            {
                self.log_transition(&t.ns, &tr);
            }
        } else if let Some(tr) = breakers.record_success(&t.ns, t.probe, now) {
            self.log_transition(&t.ns, &tr);
        }
        Ok(false)
    }

    /// The client left with tracked reads unanswered: its driver gave up (socket timeout),
    /// which counts as a time-limit error.
    fn client_gone(&mut self) {
        let now = Instant::now();
        for t in std::mem::take(&mut self.pending) {
            if t.retried {
                // Its first attempt's error was counted; the read is not counted twice.
                continue;
            }
            let waited = now.saturating_duration_since(t.started);
            tracing::info!(ns = %t.ns, command = %t.command, waited_ms = waited.as_millis() as u64, "client gave up before the reply: counted as a time-limit error");
            self.shared.metrics.trigger_error(&t.ns, "timeout");
            let what = format!("client gave up after {} ms", waited.as_millis());
            if let Some(tr) = self.shared.breakers.record_failure(
                &t.ns,
                &t.policy,
                Reason::TimeLimit,
                &what,
                t.probe,
                now,
            ) {
                self.log_transition(&t.ns, &tr);
            }
        }
    }

    fn log_transition(&self, ns: &str, t: &Transition) {
        self.shared.metrics.breaker(ns, t.to);
        tracing::warn!(ns = %ns, from = t.from.as_str(), to = t.to.as_str(), reason = %t.reason, "breaker transition");
    }

    fn policy_active(&self) -> bool {
        !self.config.policy.is_passthrough_only()
    }

    /// Forwards a request no policy looked at.
    async fn pass<U: AsyncWrite + Unpin>(
        &mut self,
        msg: Bytes,
        expects_reply: bool,
        uw: &mut U,
    ) -> Result<(), SessionError> {
        self.unflushed_forwards += 1;
        self.dirty = true;
        self.forward(msg, expects_reply, uw).await
    }

    /// Counts one of `ns`'s per-request outcomes (0 preemptive rewrite, 1 fail-fast,
    /// 2 refusal) locally; they reach the shared counters with the other batched metrics.
    fn bump(&mut self, ns: &str, which: usize) {
        if self.hot.as_ref().is_none_or(|h| h.ns != ns) {
            self.flush_hot();
            self.hot = Some(self.shared.metrics.ns_hot(ns));
        }
        self.hot_counts[which] += 1;
        self.dirty = true;
    }

    fn flush_hot(&mut self) {
        if let Some(h) = &self.hot {
            for (n, c) in self
                .hot_counts
                .iter_mut()
                .zip([&h.preemptive, &h.fail_fast, &h.refusal])
            {
                if *n > 0 {
                    c.inc_by(*n as u64);
                    *n = 0;
                }
            }
        }
    }

    fn maybe_flush(&mut self) {
        self.dirty = true;
        if self.batch.len() >= FLUSH_EVERY {
            self.flush_metrics();
        }
    }

    /// Adds this session's batched counts to the shared metrics.
    fn flush_metrics(&mut self) {
        self.dirty = false;
        self.flush_hot();
        for (c, row) in self.request_counts.iter_mut().enumerate() {
            for (d, n) in row.iter_mut().enumerate() {
                if *n > 0 {
                    self.shared.metrics.add_requests(c, d, *n as u64);
                    *n = 0;
                }
            }
        }
        if let Some(h) = &self.latency {
            h.flush(&mut self.batch);
        }
        if self.unflushed_forwards > 0 {
            self.shared.metrics.forwarded(self.unflushed_forwards);
            self.unflushed_forwards = 0;
        }
    }

    async fn forward<U: AsyncWrite + Unpin>(
        &mut self,
        msg: Bytes,
        expects_reply: bool,
        uw: &mut U,
    ) -> Result<(), SessionError> {
        if expects_reply {
            self.outstanding += 1;
            if self.waiting_since.is_none() {
                self.waiting_since = Some(Instant::now());
            }
        }
        uw.write_all(&msg).await.map_err(SessionError::UpstreamIo)
    }

    async fn send_to_client<C: AsyncWrite + Unpin>(
        &mut self,
        msg: Bytes,
        cw: &mut C,
    ) -> Result<(), SessionError> {
        let more = msg.len() > 20
            && Header::parse(&msg).is_some_and(|h| h.op_code == OpCode::MSG)
            && opmsg::flags_of(&msg) & MORE_TO_COME != 0;
        self.streaming = more;
        if !more {
            self.outstanding = self.outstanding.saturating_sub(1);
        }
        cw.write_all(&msg).await.map_err(SessionError::ClientIo)
    }

    /// Answers legacy OP_QUERY `request_id` with the OP_REPLY of `refusal`, sending nothing.
    async fn refuse_legacy<C: AsyncWrite + Unpin>(
        &mut self,
        request_id: i32,
        refusal: &policy::LegacyRefusal,
        cw: &mut C,
    ) -> Result<(), SessionError> {
        self.bump(&refusal.ns, 2);
        tracing::debug!(ns = %refusal.ns, code = refusal.reply.code, "refused: legacy OP_QUERY on a database with governed namespaces");
        let out = refusal.to_message(self.shared.request_id(), request_id);
        cw.write_all(&out).await.map_err(SessionError::ClientIo)
    }

    /// Answers request `request_id` with `reply` instead of sending it upstream.
    async fn reply_error<C: AsyncWrite + Unpin>(
        &mut self,
        request_id: i32,
        reply: &ErrorReply,
        cw: &mut C,
    ) -> Result<(), SessionError> {
        let out = reply.to_message(self.shared.request_id(), request_id);
        cw.write_all(&out).await.map_err(SessionError::ClientIo)
    }
}

fn client_err(e: FrameError) -> SessionError {
    match e {
        FrameError::Wire(w) => SessionError::ClientProtocol(w),
        FrameError::Io(io) => SessionError::ClientIo(io),
    }
}

fn upstream_err(e: FrameError) -> SessionError {
    match e {
        FrameError::Wire(w) => SessionError::UpstreamProtocol(w),
        FrameError::Io(io) => SessionError::UpstreamIo(io),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Error, ErrorKind};

    #[test]
    fn a_client_going_away_is_a_normal_close() {
        let client = |kind| SessionError::ClientIo(Error::new(kind, "x"));
        for kind in [
            ErrorKind::ConnectionReset,
            ErrorKind::ConnectionAborted,
            ErrorKind::BrokenPipe,
        ] {
            assert!(client(kind).is_client_close(false), "{kind:?}");
        }
        assert!(client(ErrorKind::UnexpectedEof).is_client_close(true));
        // Cut in the middle of a message, or any other failure: worth a warning.
        assert!(!client(ErrorKind::UnexpectedEof).is_client_close(false));
        assert!(!client(ErrorKind::Other).is_client_close(true));
        assert!(!SessionError::ClientProtocol(WireError::Truncated("x")).is_client_close(true));
        let upstream = SessionError::UpstreamIo(Error::new(ErrorKind::ConnectionReset, "x"));
        assert!(!upstream.is_client_close(true));
    }
}
