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
//! client's own answer does not wait behind it. The session sends it and carries out what
//! its reply comes to (`reply.rs`); this file builds it and judges that reply.

use std::sync::Arc;

use bson::rawdoc;
use tokio::time::Instant;

use super::reads::Tracked;
use crate::command::ReadPrefMode;
use crate::policy::{self, Confirmation, Failure, NsPolicy, Reason};
use crate::wire::ReplyStatus;

/// What a time limit asks to confirm.
#[derive(Debug)]
pub(super) struct Ask {
    pub(super) ns: Arc<str>,
    pub(super) policy: Arc<NsPolicy>,
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

    /// The confirming read, with id `request_id` (logged: it is about to go).
    pub(super) fn message(&self, request_id: i32) -> bytes::Bytes {
        let ms = self
            .policy
            .confirm_time
            .as_millis()
            .clamp(1, i32::MAX as u128) as i64;
        crate::logs::sampled!(info, ns = %self.ns, evidence = %self.what, confirm_ms = ms, "time limit: confirming with a cheap read before it counts");
        message(&self.ns, self.pref, ms, request_id)
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

/// What the reply to a confirming read comes to.
pub(super) struct Confirmed {
    /// The `result` label of `confirm_reads_total`.
    pub(super) result: &'static str,
    /// The time limit was not confirmed: set aside (`evidence_ignored_total`).
    pub(super) set_aside: bool,
    /// It was confirmed: the failure the breaker of `ask.ns` counts, its reason and text.
    pub(super) count: Option<(Reason, String)>,
    pub(super) ask: Ask,
}

impl Confirm {
    /// `ask`'s read, sent with id `request_id` at place `seq`.
    pub(super) fn sent(ask: Ask, request_id: i32, seq: u64) -> Confirm {
        Confirm {
            request_id,
            seq,
            ask,
            sent: Instant::now(),
        }
    }

    /// `response_to` at place `seq` is this read's reply.
    pub(super) fn answered_by(&self, response_to: i32, seq: u64) -> bool {
        self.request_id == response_to && self.seq == seq
    }

    /// Its turn has passed without its reply (another request's answer took its place).
    pub(super) fn passed(&self, finals_in: u64) -> bool {
        self.seq <= finals_in
    }

    /// Its reply, judged (`policy::confirmation`) at `now`, and logged.
    pub(super) fn judged(self, status: Option<&ReplyStatus>, now: Instant) -> Confirmed {
        let c = self;
        let waited_ms = now.saturating_duration_since(c.sent).as_millis() as u64;
        let (result, set_aside, count) = match policy::confirmation(&c.ask.policy, status) {
            Confirmation::Confirmed { code, reason } => {
                crate::logs::sampled!(info, ns = %c.ask.ns, evidence = %c.ask.what, code, waited_ms, "time limit confirmed: the cheap read failed too");
                let what = format!("{}, confirmed by a limit-1 read: {code}", c.ask.what);
                // The confirming read's own code says best why (stale routing or a hang).
                let reason = if reason == Reason::StaleRouting {
                    reason
                } else {
                    c.ask.reason
                };
                ("confirmed", false, Some((reason, what)))
            }
            Confirmation::Unconfirmed => {
                tracing::debug!(ns = %c.ask.ns, evidence = %c.ask.what, waited_ms, "time limit not confirmed: the cheap read was answered");
                ("unconfirmed", true, None)
            }
            Confirmation::Unknown => {
                tracing::debug!(ns = %c.ask.ns, evidence = %c.ask.what, waited_ms, "time limit not confirmed: the cheap read's reply says nothing");
                ("unknown", false, None)
            }
        };
        Confirmed {
            result,
            set_aside,
            count,
            ask: c.ask,
        }
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
