//! What a decision means for the request in hand: the edit it makes before sending
//! (`rewrite_spec`), what a `dry_run` namespace does instead (`apply_dry_run`), and the error
//! reply that answers a fail-fast or a refusal (`fail_fast_reply`, `refusal_reply`).
//!
//! Pure like `decide`: values in, values out, the wall clock passed in. The session only
//! carries them out (sends, logs, counts).

use std::time::Duration;

use bytes::Bytes;

use super::attempt::{Attempt, Rung};
use super::decide::{Decision, Refusal};
use super::judge::Verdict;
use super::ladder::Then;
use super::reason::Reason;
use super::table::NsPolicy;
use crate::rewrite::RewriteSpec;
use crate::wire::reply;

/// Code and name of a refusal: `available` on a strict namespace is an invalid option there.
const REFUSAL_CODE: (i32, &str) = (72, "InvalidOptions");

/// The server's own code for a repeated field (its IDL parser's `throwDuplicateField`).
const DUPLICATE_CODE: (i32, &str) = (40413, "Location40413");

/// The server's own code for an OP_QUERY command it no longer accepts (5.1+).
const LEGACY_CODE: (i32, &str) = (352, "UnsupportedOpQueryCommand");

impl<'a> Decision<'a> {
    /// What a `dry_run` namespace does instead: forward unmodified, still counting errors
    /// (and still taking the probe, so the breaker moves as it would).
    pub fn dry(&self) -> Decision<'a> {
        match self {
            Decision::Forward => Decision::Forward,
            Decision::Track {
                probe, budget_ms, ..
            } => Decision::Track {
                cap_ms: None,
                budget_ms: *budget_ms,
                probe: *probe,
                retry: false,
                primary: false,
                bounded: None,
            },
            _ => Decision::Track {
                cap_ms: None,
                budget_ms: None,
                probe: false,
                retry: false,
                primary: false,
                bounded: None,
            },
        }
    }
}

/// What a dry run held back: the decision's name (for the log), the action it counts in
/// `dry_run_total` (none for a read tracked as it came), and the rungs the read would have
/// climbed on a trigger error (counted when one comes, see [`dry_verdict`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeldBack {
    pub name: &'static str,
    pub action: Option<&'static str>,
    /// The primary rung was ahead of the first attempt.
    pub primary: bool,
    /// The `available` rung was ahead of the first attempt.
    pub retry: bool,
}

impl HeldBack {
    fn of(decision: &Decision) -> HeldBack {
        let (action, primary, retry) = match *decision {
            Decision::Forward => (None, false, false),
            Decision::Track {
                bounded: Some(_), ..
            } => (Some("bounded"), false, false),
            Decision::Track {
                cap_ms,
                primary,
                retry,
                ..
            } => (cap_ms.map(|_| "time_limit"), primary, retry),
            Decision::Rewrite { .. } => (Some("rewrite"), false, false),
            Decision::Primary { .. } => (Some("primary"), false, false),
            Decision::FailFast { .. } => (Some("fail_fast"), false, false),
            Decision::Refuse(_) => (Some("refuse"), false, false),
        };
        HeldBack {
            name: decision.name(),
            action,
            primary,
            retry,
        }
    }
}

/// The decision to carry out on a namespace governed by `policy`, and, when `dry_run` held
/// back a decision that would have acted, what it held back. A request with a repeated
/// policy-relevant field is refused even in a dry run: it is not a policy decision on the
/// namespace but a request the proxy cannot read the way the server will.
pub fn apply_dry_run<'a>(
    decision: Decision<'a>,
    policy: &NsPolicy,
) -> (Decision<'a>, Option<HeldBack>) {
    let integrity = matches!(decision, Decision::Refuse(Refusal::Duplicate(_)));
    if policy.dry_run && decision != Decision::Forward && !integrity {
        let held = HeldBack::of(&decision);
        (decision.dry(), Some(held))
    } else {
        (decision, None)
    }
}

impl HeldBack {
    /// The attempt a dry run's read is followed as: the one it is sent as (`sent`, as the
    /// dry decision made it), judged with the rungs the real decision would have had
    /// ahead, which [`dry_verdict`] then counts instead of climbing.
    pub fn attempt(self, sent: Attempt) -> Attempt {
        Attempt {
            primary: self.primary,
            retry: self.retry,
            ..sent
        }
    }
}

/// A dry-run read's verdict, judged with the rungs it would have had ahead: a climb (or a
/// rung due with no time left, which the undivided first attempt spent) is held back, the
/// reply goes to the client as it came, and the rung is the action counted (`primary`, or
/// `retry` for `available`).
pub fn dry_verdict(verdict: Verdict<'_>) -> (Verdict<'_>, Option<&'static str>) {
    let action = match verdict.then {
        Then::Climb { to, .. } | Then::NoTime(to) => match to {
            Rung::Primary => Some("primary"),
            Rung::Available => Some("retry"),
            Rung::First | Rung::Again => None,
        },
        Then::Reply | Then::FailFast(_) | Then::Confirm | Then::Silent => return (verdict, None),
    };
    let held = Verdict {
        then: Then::Reply,
        ..verdict
    };
    (held, action)
}

/// The edit `decision` makes to the request before it is sent. `None`: the request leaves
/// as the bytes that arrived (`Forward`, `Track` without a cap), or is not sent at all
/// (`FailFast`, `Refuse`).
pub fn rewrite_spec(decision: &Decision) -> Option<RewriteSpec> {
    match *decision {
        // A tracked read is never relaxed; only its time limit is lowered to the cap.
        Decision::Track {
            cap_ms: Some(ms), ..
        } => Some(RewriteSpec {
            max_time_ms: Some(ms),
            ..RewriteSpec::default()
        }),
        Decision::Rewrite {
            drop_after_cluster_time,
            cap_ms,
        } => Some(RewriteSpec {
            available: true,
            drop_after_cluster_time,
            max_time_ms: cap_ms,
            primary: false,
        }),
        // Read concern untouched: only the node changes.
        Decision::Primary { cap_ms, .. } => Some(RewriteSpec {
            primary: true,
            max_time_ms: cap_ms,
            ..RewriteSpec::default()
        }),
        Decision::Track { cap_ms: None, .. }
        | Decision::Forward
        | Decision::FailFast { .. }
        | Decision::Refuse(_) => None,
    }
}

/// An error the proxy answers with instead of sending the request: an ordinary OP_MSG
/// `{ok: 0, code, codeName, errmsg}` (never a closed socket, which drivers would retry).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ErrorReply {
    pub code: i32,
    pub code_name: &'static str,
    /// Starts with `staleguard:` and names the namespace.
    pub errmsg: String,
}

impl ErrorReply {
    /// The reply message, with its own `request_id`, answering the client's `response_to`.
    pub fn to_message(&self, request_id: i32, response_to: i32) -> Bytes {
        reply::error_reply(
            request_id,
            response_to,
            self.code,
            self.code_name,
            &self.errmsg,
        )
    }

    /// The same error as an OP_REPLY, the answer to a legacy OP_QUERY: the command reply
    /// fields plus `$err`; `query_failure` sets the QueryFailure flag (for queries that are
    /// not commands, whose errors old drivers read from `$err` and that flag).
    pub fn to_op_reply(&self, request_id: i32, response_to: i32, query_failure: bool) -> Bytes {
        let mut doc = reply::error_body(self.code, self.code_name, &self.errmsg);
        doc.append(bson::raw::cstr!("$err"), self.errmsg.as_str());
        let flags = if query_failure {
            reply::QUERY_FAILURE
        } else {
            0
        };
        reply::op_reply_with_flags(request_id, response_to, flags, &doc)
    }
}

/// The reply to a read on strict namespace `ns` while its breaker is open: the code says
/// why it opened (never one drivers retry). It does not say when the breaker will look
/// again: a client that knew could aim its reads at that moment.
pub fn fail_fast_reply(ns: &str, reason: Reason, errors: u32) -> ErrorReply {
    let (code, code_name) = reason.reply_code();
    let errmsg = format!(
        "staleguard: strict namespace {ns} fails fast: breaker open after {errors} errors ({reason}); not sent to mongos"
    );
    ErrorReply {
        code,
        code_name,
        errmsg,
    }
}

/// The reply to a strict read on `ns` sent while its breaker was open, bounded by
/// `open_time_limit`, whose attempts all failed: `met` holds what each attempt met (a code,
/// or none when mongos did not answer at all). The same code as a fail-fast, never one
/// drivers retry.
pub fn bounded_fail_reply(
    ns: &str,
    reason: Reason,
    errors: u32,
    bound: Duration,
    met: &[Option<i32>],
) -> ErrorReply {
    let (code, code_name) = reason.reply_code();
    let attempts = match met.len() {
        1 => "its attempt".to_string(),
        n => format!("its {n} attempts"),
    };
    let what: Vec<String> = met.iter().map(|m| met_text(*m)).collect();
    let errmsg = format!(
        "staleguard: strict namespace {ns} fails fast: breaker open after {errors} errors ({reason}); the read was sent with maxTimeMS {} ms (open_time_limit) and {attempts} met: {}; healthy secondaries still answer",
        bound.as_millis(),
        what.join(", then ")
    );
    ErrorReply {
        code,
        code_name,
        errmsg,
    }
}

/// The reply to a followed read on `ns` that mongos did not answer within its attempt's
/// `maxTimeMS` (`limit`) and a grace: MaxTimeMSExpired, what mongos itself would have
/// answered had it kept its limit (not a code drivers retry, and not a network error: the
/// connection stays in the pool). The late reply is dropped when it comes.
pub fn silent_reply(ns: &str, limit: Duration, waited: Duration) -> ErrorReply {
    let errmsg = format!(
        "staleguard: mongos did not answer the read on {ns} within its maxTimeMS of {} ms (waited {} ms); answered by the proxy, the late reply will be dropped",
        limit.as_millis(),
        waited.as_millis()
    );
    ErrorReply {
        code: 50,
        code_name: "MaxTimeMSExpired",
        errmsg,
    }
}

/// What one attempt met, for an error text: the code with its name when it is one of the
/// trigger codes.
fn met_text(code: Option<i32>) -> String {
    let Some(code) = code else {
        return "no reply from mongos".to_string();
    };
    let name = match code {
        13388 => "StaleConfig",
        63 => "StaleShardVersion",
        150 => "StaleEpoch",
        249 => "StaleDbVersion",
        50 => "MaxTimeMSExpired",
        262 => "ExceededTimeLimit",
        202 => "NetworkInterfaceExceededTimeLimit",
        89 => "NetworkTimeout",
        133 => "FailedToSatisfyReadPreference",
        _ => return format!("error {code}"),
    };
    format!("{name} ({code})")
}

/// The reply to a refused request on `ns` (the governing namespace; `db.$cmd` for a
/// command without a collection).
pub fn refusal_reply(ns: &str, why: Refusal<'_>) -> ErrorReply {
    let (code, errmsg) = match why {
        Refusal::Available => (REFUSAL_CODE, format!(
            "staleguard: readConcern level \"available\" is refused on strict namespace {ns}: it may return orphaned or misrouted documents; read with \"local\" or \"majority\""
        )),
        Refusal::AvailableUnreadable => (REFUSAL_CODE, format!(
            "staleguard: readConcern level \"available\" is refused for {ns}: its pipeline nests deeper than {} levels or has a stage whose namespaces cannot be read, and its database has strict namespaces; read with \"local\" or \"majority\"",
            crate::command::MAX_PIPELINE_DEPTH
        )),
        Refusal::Duplicate(field) => (DUPLICATE_CODE, format!(
            "staleguard: BSON field '{field}' is a duplicate field; a command that repeats a field the read policy depends on is refused on a database with governed namespaces ({ns}); not sent to mongos"
        )),
    };
    ErrorReply {
        code: code.0,
        code_name: code.1,
        errmsg,
    }
}

/// The reply to a legacy OP_QUERY refused on `full_collection_name` (whose database has
/// governed namespaces); `command` is the command it carries, if any.
pub fn legacy_refusal_reply(full_collection_name: &str, command: Option<&str>) -> ErrorReply {
    let what = match command {
        Some(name) => format!("OP_QUERY command {name}"),
        None => "OP_QUERY".to_string(),
    };
    let errmsg = format!(
        "staleguard: Unsupported {what} on {full_collection_name}: legacy OP_QUERY requests are refused on databases with governed namespaces (the read policy applies to OP_MSG only); use a driver that sends OP_MSG (MongoDB 3.6 and later)"
    );
    ErrorReply {
        code: LEGACY_CODE.0,
        code_name: LEGACY_CODE.1,
        errmsg,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Mode;

    #[test]
    fn dry_run_never_acts() {
        for d in [
            Decision::Rewrite {
                drop_after_cluster_time: true,
                cap_ms: Some(1),
            },
            Decision::FailFast {
                reason: Reason::TimeLimit,
                probe_in: Duration::ZERO,
                errors: 1,
            },
            Decision::Refuse(Refusal::Available),
            Decision::Track {
                cap_ms: Some(5),
                budget_ms: Some(10),
                probe: true,
                retry: true,
                primary: true,
                bounded: None,
            },
            Decision::Primary {
                cap_ms: Some(5),
                budget_ms: None,
                then: crate::policy::AfterPrimary::Available {
                    drop_after_cluster_time: true,
                    cap_ms: None,
                },
            },
        ] {
            match d.dry() {
                Decision::Track {
                    cap_ms: None,
                    retry: false,
                    primary: false,
                    ..
                } => {}
                other => panic!("{d:?} dry gave {other:?}"),
            }
        }
    }

    #[test]
    fn dry_run_only_on_dry_run_namespaces_and_only_when_acting() {
        let mut p = NsPolicy::with_defaults("a.b", Mode::Strict);
        let refuse = Decision::Refuse(Refusal::Available);
        assert_eq!(apply_dry_run(refuse.clone(), &p), (refuse.clone(), None));
        p.dry_run = true;
        assert_eq!(
            apply_dry_run(Decision::Forward, &p),
            (Decision::Forward, None)
        );
        let (d, would) = apply_dry_run(refuse.clone(), &p);
        assert_eq!(d, refuse.dry());
        assert_eq!(
            would.map(|h| (h.name, h.action)),
            Some(("refuse", Some("refuse")))
        );
        // A repeated field is refused even in a dry run.
        let dup = Decision::Refuse(Refusal::Duplicate("$db"));
        assert_eq!(apply_dry_run(dup.clone(), &p), (dup, None));
    }

    #[test]
    fn dry_run_counts_what_each_decision_would_do() {
        let mut p = NsPolicy::with_defaults("a.b", Mode::Fallback);
        p.dry_run = true;
        let track = |cap_ms, retry, primary, bounded| Decision::Track {
            cap_ms,
            budget_ms: Some(1000),
            probe: false,
            retry,
            primary,
            bounded,
        };
        let bound = crate::policy::Bounded {
            ours: true,
            reason: Reason::TimeLimit,
            errors: 3,
        };
        let held = |d| {
            apply_dry_run(d, &p)
                .1
                .map(|h| (h.action, h.primary, h.retry))
        };
        assert_eq!(
            held(track(None, false, false, None)),
            Some((None, false, false))
        );
        assert_eq!(
            held(track(Some(500), true, true, None)),
            Some((Some("time_limit"), true, true))
        );
        assert_eq!(
            held(track(Some(250), false, false, Some(bound))),
            Some((Some("bounded"), false, false))
        );
        let rewrite = Decision::Rewrite {
            drop_after_cluster_time: true,
            cap_ms: None,
        };
        assert_eq!(held(rewrite), Some((Some("rewrite"), false, false)));
        let ff = Decision::FailFast {
            reason: Reason::TimeLimit,
            probe_in: Duration::ZERO,
            errors: 3,
        };
        assert_eq!(held(ff), Some((Some("fail_fast"), false, false)));
        let primary = Decision::Primary {
            cap_ms: None,
            budget_ms: None,
            then: crate::policy::AfterPrimary::Available {
                drop_after_cluster_time: true,
                cap_ms: None,
            },
        };
        assert_eq!(held(primary), Some((Some("primary"), false, false)));
        assert_eq!(held(Decision::Forward), None);
    }

    #[test]
    fn a_dry_run_climb_is_held_back_and_named() {
        use crate::policy::{Rung, Then, Verdict, Word};
        let climb = |to| Verdict {
            word: Word::Neutral(None),
            met: None,
            then: Then::Climb {
                to,
                spec: RewriteSpec::default(),
                or_else: None,
            },
        };
        for (v, action) in [
            (climb(Rung::Primary), Some("primary")),
            (climb(Rung::Available), Some("retry")),
            (
                Verdict {
                    word: Word::Neutral(None),
                    met: None,
                    then: Then::NoTime(Rung::Available),
                },
                Some("retry"),
            ),
            (
                Verdict {
                    word: Word::Neutral(None),
                    met: None,
                    then: Then::Reply,
                },
                None,
            ),
        ] {
            let (held, got) = dry_verdict(v);
            assert_eq!(got, action);
            assert_eq!(held.then, Then::Reply);
        }
    }

    #[test]
    fn rewrite_spec_per_decision() {
        let track = |cap_ms| Decision::Track {
            cap_ms,
            budget_ms: Some(1000),
            probe: false,
            retry: true,
            primary: false,
            bounded: None,
        };
        assert_eq!(rewrite_spec(&Decision::Forward), None);
        assert_eq!(rewrite_spec(&track(None)), None);
        assert_eq!(
            rewrite_spec(&track(Some(500))),
            Some(RewriteSpec {
                max_time_ms: Some(500),
                ..RewriteSpec::default()
            })
        );
        let rewrite = Decision::Rewrite {
            drop_after_cluster_time: true,
            cap_ms: None,
        };
        assert_eq!(
            rewrite_spec(&rewrite),
            Some(RewriteSpec {
                available: true,
                drop_after_cluster_time: true,
                max_time_ms: None,
                primary: false,
            })
        );
        let primary = Decision::Primary {
            cap_ms: Some(300),
            budget_ms: Some(600),
            then: crate::policy::AfterPrimary::FailFast {
                reason: Reason::TimeLimit,
                probe_in: Duration::ZERO,
                errors: 3,
            },
        };
        assert_eq!(
            rewrite_spec(&primary),
            Some(RewriteSpec {
                primary: true,
                max_time_ms: Some(300),
                ..RewriteSpec::default()
            })
        );
        assert_eq!(rewrite_spec(&Decision::Refuse(Refusal::Available)), None);
    }

    #[test]
    fn error_replies_name_the_namespace_and_use_unretried_codes() {
        let r = fail_fast_reply("pay.tx", Reason::TimeLimit, 3);
        assert_eq!((r.code, r.code_name), (50, "MaxTimeMSExpired"));
        // No word of when the breaker looks again.
        assert_eq!(
            r.errmsg,
            "staleguard: strict namespace pay.tx fails fast: breaker open after 3 errors \
             (time limits); not sent to mongos"
        );
        // A bounded read names what its attempts met, not "in time" when they met errors.
        let bound = Duration::from_millis(200);
        let r = bounded_fail_reply("pay.tx", Reason::StaleRouting, 3, bound, &[Some(13388); 2]);
        assert_eq!((r.code, r.code_name), (13388, "StaleConfig"));
        assert!(
            r.errmsg
                .contains("its 2 attempts met: StaleConfig (13388), then StaleConfig (13388)"),
            "{}",
            r.errmsg
        );
        assert!(!r.errmsg.contains("in time"), "{}", r.errmsg);
        let r = bounded_fail_reply("pay.tx", Reason::StaleRouting, 3, bound, &[Some(50), None]);
        assert!(
            r.errmsg
                .contains("met: MaxTimeMSExpired (50), then no reply from mongos"),
            "{}",
            r.errmsg
        );
        let r = bounded_fail_reply("pay.tx", Reason::TimeLimit, 3, bound, &[Some(2)]);
        assert!(
            r.errmsg.contains("its attempt met: error 2"),
            "{}",
            r.errmsg
        );
        let r = silent_reply(
            "pay.tx",
            Duration::from_millis(1000),
            Duration::from_millis(1100),
        );
        assert_eq!((r.code, r.code_name), (50, "MaxTimeMSExpired"));
        assert!(
            r.errmsg.contains("within its maxTimeMS of 1000 ms"),
            "{}",
            r.errmsg
        );
        let r = refusal_reply("pay.tx", Refusal::Available);
        assert_eq!((r.code, r.code_name), (72, "InvalidOptions"));
        assert!(r.errmsg.starts_with("staleguard: ") && r.errmsg.contains("pay.tx"));
        let r = refusal_reply("pay.tx", Refusal::AvailableUnreadable);
        assert_eq!((r.code, r.code_name), (72, "InvalidOptions"));
        assert!(r.errmsg.contains("deeper than 32 levels"), "{}", r.errmsg);
        let r = refusal_reply("pay.tx", Refusal::Duplicate("readConcern.level"));
        assert_eq!((r.code, r.code_name), (40413, "Location40413"));
        assert!(
            r.errmsg
                .starts_with("staleguard: BSON field 'readConcern.level' is a duplicate field"),
            "{}",
            r.errmsg
        );
        let r = legacy_refusal_reply("pay.$cmd", Some("find"));
        assert_eq!((r.code, r.code_name), (352, "UnsupportedOpQueryCommand"));
        assert!(r
            .errmsg
            .starts_with("staleguard: Unsupported OP_QUERY command find on pay.$cmd"));
    }
}
