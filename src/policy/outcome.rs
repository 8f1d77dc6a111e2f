//! What a decision means for the request in hand: the edit it makes before sending
//! (`rewrite_spec`), what a `dry_run` namespace does instead (`apply_dry_run`), and the error
//! reply that answers a fail-fast or a refusal (`fail_fast_reply`, `refusal_reply`).
//!
//! Pure like `decide`: values in, values out, the wall clock passed in. The session only
//! carries them out (sends, logs, counts).

use std::time::{Duration, SystemTime};

use bytes::Bytes;

use super::decide::Decision;
use super::reason::Reason;
use super::table::NsPolicy;
use crate::rewrite::RewriteSpec;
use crate::wire::reply;

/// Code and name of a refusal: `available` on a strict namespace is an invalid option there.
const REFUSAL_CODE: (i32, &str) = (72, "InvalidOptions");

impl Decision {
    /// What a `dry_run` namespace does instead: forward unmodified, still counting errors
    /// (and still taking the probe, so the breaker moves as it would).
    pub fn dry(&self) -> Decision {
        match self {
            Decision::Forward => Decision::Forward,
            Decision::Track { probe, .. } => Decision::Track {
                cap_ms: None,
                probe: *probe,
                retry: false,
            },
            _ => Decision::Track {
                cap_ms: None,
                probe: false,
                retry: false,
            },
        }
    }
}

/// The decision to carry out on a namespace governed by `policy`, and, when `dry_run` held
/// back a decision that would have acted, that decision's name (for the log).
pub fn apply_dry_run(decision: Decision, policy: &NsPolicy) -> (Decision, Option<&'static str>) {
    if policy.dry_run && decision != Decision::Forward {
        let would = decision.name();
        (decision.dry(), Some(would))
    } else {
        (decision, None)
    }
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
            available: false,
            drop_after_cluster_time: false,
            max_time_ms: Some(ms),
        }),
        Decision::Rewrite {
            drop_after_cluster_time,
            cap_ms,
        } => Some(RewriteSpec {
            available: true,
            drop_after_cluster_time,
            max_time_ms: cap_ms,
        }),
        Decision::Track { cap_ms: None, .. }
        | Decision::Forward
        | Decision::FailFast { .. }
        | Decision::Refuse => None,
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
}

/// The reply to a read on strict namespace `ns` while its breaker is open: the code says
/// why it opened (never one drivers retry), the text when the next probe goes out.
pub fn fail_fast_reply(
    ns: &str,
    reason: Reason,
    errors: u32,
    probe_in: Duration,
    now: SystemTime,
) -> ErrorReply {
    let (code, code_name) = reason.reply_code();
    let at = humantime::format_rfc3339_seconds(now + probe_in);
    let errmsg = format!(
        "staleguard: strict namespace {ns} fails fast: breaker open after {errors} errors ({reason}); not sent to mongos; next probe in {:.1}s (at {at})",
        probe_in.as_secs_f64()
    );
    ErrorReply {
        code,
        code_name,
        errmsg,
    }
}

/// The reply to a read on strict namespace `ns` that asked for `readConcern: available`.
pub fn refusal_reply(ns: &str) -> ErrorReply {
    let errmsg = format!(
        "staleguard: readConcern level \"available\" is refused on strict namespace {ns}: it may return orphaned or misrouted documents; read with \"local\" or \"majority\""
    );
    ErrorReply {
        code: REFUSAL_CODE.0,
        code_name: REFUSAL_CODE.1,
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
            Decision::Refuse,
            Decision::Track {
                cap_ms: Some(5),
                probe: true,
                retry: true,
            },
        ] {
            match d.dry() {
                Decision::Track {
                    cap_ms: None,
                    retry: false,
                    ..
                } => {}
                other => panic!("{d:?} dry gave {other:?}"),
            }
        }
    }

    #[test]
    fn dry_run_only_on_dry_run_namespaces_and_only_when_acting() {
        let mut p = NsPolicy::with_defaults("a.b", Mode::Strict);
        assert_eq!(
            apply_dry_run(Decision::Refuse, &p),
            (Decision::Refuse, None)
        );
        p.dry_run = true;
        assert_eq!(
            apply_dry_run(Decision::Forward, &p),
            (Decision::Forward, None)
        );
        let (d, would) = apply_dry_run(Decision::Refuse, &p);
        assert_eq!((d, would), (Decision::Refuse.dry(), Some("refuse")));
    }

    #[test]
    fn rewrite_spec_per_decision() {
        let track = |cap_ms| Decision::Track {
            cap_ms,
            probe: false,
            retry: true,
        };
        assert_eq!(rewrite_spec(&Decision::Forward), None);
        assert_eq!(rewrite_spec(&track(None)), None);
        assert_eq!(
            rewrite_spec(&track(Some(500))),
            Some(RewriteSpec {
                available: false,
                drop_after_cluster_time: false,
                max_time_ms: Some(500),
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
            })
        );
        assert_eq!(rewrite_spec(&Decision::Refuse), None);
    }

    #[test]
    fn error_replies_name_the_namespace_and_use_unretried_codes() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let r = fail_fast_reply(
            "pay.tx",
            Reason::TimeLimit,
            3,
            Duration::from_millis(2500),
            now,
        );
        assert_eq!((r.code, r.code_name), (50, "MaxTimeMSExpired"));
        assert_eq!(
            r.errmsg,
            "staleguard: strict namespace pay.tx fails fast: breaker open after 3 errors \
             (time limits); not sent to mongos; next probe in 2.5s (at 2023-11-14T22:13:22Z)"
        );
        let r = refusal_reply("pay.tx");
        assert_eq!((r.code, r.code_name), (72, "InvalidOptions"));
        assert!(r.errmsg.starts_with("staleguard: ") && r.errmsg.contains("pay.tx"));
    }
}
