//! Confirming a time limit before it counts. A read that ran out of time may have met a hung
//! secondary or may just be slow (its own query, its own limit); only the cluster can tell.
//! So the session asks it: a cheap read of the same namespace (`find`, empty filter,
//! `limit: 1`, `singleBatch`, the same read preference mode without tags, `maxTimeMS` =
//! `confirm_time`) on the same client connection, with the client's own rights (staleguard
//! holds no credentials). Its reply is judged by `policy::confirmation` and never relayed:
//! a failure counts for the breaker, an answer does not.
//!
//! At most one confirming read is in flight per connection, and none while the namespace's
//! breaker is open (it is open already). It goes out after any resend of the read, so the
//! client's own answer does not wait behind it.

use std::sync::Arc;

use bson::rawdoc;
use tokio::time::Instant;

use super::reply::Tracked;
use super::Session;
use crate::breaker::Counted;
use crate::command::ReadPrefMode;
use crate::policy::{self, Confirmation, Failure, NsPolicy, Reason};
use crate::wire::Reply;

/// What a time limit asks to confirm.
#[derive(Debug)]
pub(super) struct Ask {
    ns: Arc<str>,
    policy: Arc<NsPolicy>,
    pref: Option<ReadPrefMode>,
    /// The evidence as text (the breaker's reason for opening, if it does).
    what: String,
    reason: Reason,
}

impl Ask {
    pub(super) fn of(t: &Tracked, failure: &Failure<'_>) -> Ask {
        Ask {
            ns: t.ns.clone(),
            policy: t.policy.clone(),
            pref: t.pref,
            what: failure.evidence.to_string(),
            reason: failure.reason,
        }
    }
}

/// The confirming read in flight on a connection.
#[derive(Debug)]
pub(super) struct Confirm {
    request_id: i32,
    /// Its place among the requests sent that expect a final reply.
    seq: u64,
    ask: Ask,
    sent: Instant,
}

impl Confirm {
    /// `response_to` at place `seq` is this read's reply.
    pub(super) fn answered_by(&self, response_to: i32, seq: u64) -> bool {
        self.request_id == response_to && self.seq == seq
    }

    /// Its turn has passed without its reply (another request's answer took its place).
    pub(super) fn passed(&self, finals_in: u64) -> bool {
        self.seq <= finals_in
    }
}

/// The confirming read of `ns` as an OP_MSG with id `request_id`.
pub(super) fn message(
    ns: &str,
    pref: Option<ReadPrefMode>,
    ms: i64,
    request_id: i32,
) -> bytes::Bytes {
    let (db, coll) = ns.split_once('.').unwrap_or((ns, ""));
    let mode = pref.unwrap_or(ReadPrefMode::SecondaryPreferred).as_str();
    let body = rawdoc! {
        "find": coll,
        "filter": {},
        "limit": 1,
        "singleBatch": true,
        "maxTimeMS": ms,
        "$db": db,
        "$readPreference": { "mode": mode },
    };
    crate::wire::reply::op_msg(request_id, 0, 0, &body)
}

impl Session {
    /// Sends the confirming read `ask` wants, unless one is in flight on this connection
    /// already, or its answer could change nothing: the breaker is open, or this
    /// connection has counted its `per_connection` errors within the window (so a
    /// connection pays for at most that many confirming reads per window).
    pub(super) fn send_confirm(&mut self, ask: Ask) {
        let metrics = &self.shared.metrics;
        let now = Instant::now();
        let counts = self
            .shared
            .breakers
            .would_count(&ask.ns, &ask.policy, self.id, now);
        if self.confirm.is_some() || !counts {
            metrics.breakers.confirm("skipped");
            return;
        }
        let ms = ask
            .policy
            .confirm_time
            .as_millis()
            .clamp(1, i32::MAX as u128) as i64;
        let request_id = self.shared.ids.request_id();
        let out = message(&ask.ns, ask.pref, ms, request_id);
        tracing::info!(ns = %ask.ns, evidence = %ask.what, confirm_ms = ms, "time limit: confirming with a cheap read before it counts");
        self.sent_finals += 1;
        self.confirm = Some(Confirm {
            request_id,
            seq: self.sent_finals,
            ask,
            sent: Instant::now(),
        });
        self.to_upstream.push(out);
    }

    /// The reply to the confirming read: judged, counted if it confirms, never relayed.
    pub(super) fn on_confirm_reply(&mut self, reply: &Reply) {
        let Some(c) = self.confirm.take() else {
            return;
        };
        let max = self.config.max_message_size;
        let status = reply.status(max).ok();
        let now = Instant::now();
        let waited_ms = now.saturating_duration_since(c.sent).as_millis() as u64;
        let metrics = &self.shared.metrics;
        match policy::confirmation(&c.ask.policy, status.as_ref()) {
            Confirmation::Confirmed { code, reason } => {
                metrics.breakers.confirm("confirmed");
                tracing::info!(ns = %c.ask.ns, evidence = %c.ask.what, code, waited_ms, "time limit confirmed: the cheap read failed too");
                let what = format!("{}, confirmed by a limit-1 read: {code}", c.ask.what);
                // The confirming read's own code says best why (stale routing or a hang).
                let reason = if reason == Reason::StaleRouting {
                    reason
                } else {
                    c.ask.reason
                };
                let counted = Counted {
                    policy: &c.ask.policy,
                    reason,
                    what: &what,
                    conn: self.id,
                };
                self.shared
                    .breakers
                    .record_failure(&c.ask.ns, &counted, now);
            }
            Confirmation::Unconfirmed => {
                metrics.breakers.confirm("unconfirmed");
                metrics.limits.ignored("unconfirmed");
                tracing::debug!(ns = %c.ask.ns, evidence = %c.ask.what, waited_ms, "time limit not confirmed: the cheap read was answered");
            }
            Confirmation::Unknown => {
                metrics.breakers.confirm("unknown");
                tracing::debug!(ns = %c.ask.ns, evidence = %c.ask.what, waited_ms, "time limit not confirmed: the cheap read's reply says nothing");
            }
        }
    }
}
