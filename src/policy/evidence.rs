//! The one evidence rule: what a followed read's ending says about the cluster. Everything
//! that changes state other clients share (a breaker's opening, its samples while open, its
//! closing, what the fleet hears) takes its input from [`word`] and [`confirmation`], and
//! from nothing else.
//!
//! A breaker acts for every client, so it hears only the cluster's word about itself:
//! - a **failure** is stale routing (StaleConfig 13388, StaleShardVersion 63, StaleEpoch 150,
//!   StaleDbVersion 249), FailedToSatisfyReadPreference (133) on a read without tag sets, a
//!   code the operator added to `trigger_codes`, or a time limit that is not the client's own
//!   once the cluster confirms it ([`Word::Ask`]: a slow query and a hung secondary look the
//!   same);
//! - a **success** is an `ok: 1` reply to a read that a secondary must have served, or that
//!   reached the primary only because no secondary was selectable at all
//!   ([`Members::secondary_answers`]);
//! - everything else is **neutral**: Unauthorized and every other error code, the client's
//!   own short time limit, a reply the primary may have served, a client gone, an upstream
//!   gone, a reply that cannot be read, and any rung above the first (a primary's or an
//!   `available` answer says nothing about the secondaries).
//!
//! Whether a word changes anything is then the breaker's business (which connection said
//! it, how many it said already: `breaker::Breakers::hear`). Pure: no I/O, no shared state.

use std::fmt;
use std::time::Duration;

use tokio::time::Instant;

use super::attempt::{Members, Read, Rung};
use super::reason::Reason;
use super::table::NsPolicy;
use crate::wire::ReplyStatus;

/// Stale-routing codes: the cluster's own word that a shard could not check its routing.
pub(super) const ROUTING: [i32; 4] = [13388, 63, 150, 249];
/// Codes a read's own `maxTimeMS` can cause (the server's ExceededTimeLimitError class).
pub(super) const OWN_TIME_LIMIT: [i32; 3] = [50, 202, 262];
/// FailedToSatisfyReadPreference.
pub(super) const NO_MEMBER: i32 = 133;
/// NetworkTimeout: a time limit too, not of the read's own making.
pub(super) const NETWORK_TIMEOUT: i32 = 89;

/// How a followed read ended.
#[derive(Debug, Clone, Copy)]
pub enum Ending<'s> {
    /// The upstream replied; what the reply says.
    Reply(&'s ReplyStatus),
    /// The upstream replied with something whose status cannot be read.
    Unreadable,
    /// The client closed its connection before the reply.
    ClientGone,
    /// The upstream connection ended before the reply.
    UpstreamGone,
    /// The upstream stayed silent past the attempt's time limit and a grace: staleguard
    /// answered the client itself (the late reply, if any, is dropped).
    Silent,
}

/// What one read's ending says about the cluster.
#[derive(Debug, Clone, PartialEq)]
pub enum Word<'s> {
    /// Nothing; `Some(why)` when what could have been a failure was set aside
    /// (`evidence_ignored_total{why}`).
    Neutral(Option<SetAside>),
    /// The cluster's own word that a secondary could not serve the read.
    Failed(Failure<'s>),
    /// A time limit that is not the client's own: a failure only once the cluster confirms
    /// it (a cheap read of the namespace fails too, [`confirmation`]).
    Ask(Failure<'s>),
    /// A secondary served the read.
    Answered,
}

/// What a failure is made of: the breaker's reason, and the evidence for the log, the
/// breaker's last-transition text and the trigger-error metric.
#[derive(Debug, Clone, PartialEq)]
pub struct Failure<'s> {
    pub reason: Reason,
    pub evidence: Evidence<'s>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Evidence<'s> {
    /// A trigger error code in the reply.
    Code {
        code: i32,
        code_name: Option<&'s str>,
    },
    /// A reply (success or a non-trigger error) slower than the namespace's `slow_read`.
    Slow { elapsed: Duration, limit: Duration },
    /// The upstream did not answer within the attempt's time limit and a grace.
    Silent { waited: Duration },
}

/// Why a possible failure was set aside (the `why` of `evidence_ignored_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SetAside {
    /// A slow reply within the evidence floor.
    ShortWait,
    /// A time limit of the read's own `maxTimeMS`, below the evidence floor.
    ShortTimeLimit,
    /// The client closed its connection before the reply (mongos had started the read).
    ClientGone,
    /// The client closed before mongos could even start the read (queued behind an earlier
    /// request on its connection, e.g. an awaitable hello).
    Queued,
    /// FailedToSatisfyReadPreference on a read pinned by tag sets.
    Tagged,
    /// A confirming read was answered: the time limit was the read's own doing.
    Unconfirmed,
    /// Said on a connection that has not proved itself to the cluster (not authenticated,
    /// no read answered).
    Unproven,
}

impl SetAside {
    pub fn label(self) -> &'static str {
        match self {
            SetAside::ShortWait => "short_wait",
            SetAside::ShortTimeLimit => "short_time_limit",
            SetAside::ClientGone => "client_gone",
            SetAside::Queued => "queued",
            SetAside::Tagged => "tagged",
            SetAside::Unconfirmed => "unconfirmed",
            SetAside::Unproven => "unproven",
        }
    }
}

/// What `read`'s ending says about the cluster, at `now`.
pub fn word<'s>(read: &Read<'_>, ending: Ending<'s>, now: Instant) -> Word<'s> {
    if read.rung != Rung::First {
        return Word::Neutral(None);
    }
    match ending {
        Ending::UpstreamGone | Ending::Unreadable => Word::Neutral(None),
        Ending::ClientGone if read.began.is_some() => Word::Neutral(Some(SetAside::ClientGone)),
        Ending::ClientGone => Word::Neutral(Some(SetAside::Queued)),
        Ending::Silent => {
            let waited = now.saturating_duration_since(read.began.unwrap_or(read.started));
            Word::Ask(Failure {
                reason: Reason::TimeLimit,
                evidence: Evidence::Silent { waited },
            })
        }
        Ending::Reply(status) if status.ok => answered(read, now),
        Ending::Reply(status) => match status.code.filter(|&c| read.policy.is_trigger(c)) {
            Some(code) => failed(read, code, status.code_name.as_deref()),
            // Unauthorized and every other error: nothing about the secondaries.
            None => Word::Neutral(None),
        },
    }
}

/// An `ok: 1` reply: a secondary's answer when only a secondary can have served it, unless
/// it was slower than `slow_read` (ambiguous, like a time limit).
fn answered<'s>(read: &Read<'_>, now: Instant) -> Word<'s> {
    let elapsed = now.saturating_duration_since(read.began.unwrap_or(read.started));
    let slow = (!read.sample)
        .then_some(read.policy.slow_read)
        .flatten()
        .filter(|&limit| elapsed > limit);
    match slow {
        Some(_) if elapsed < read.policy.evidence_floor() => {
            Word::Neutral(Some(SetAside::ShortWait))
        }
        Some(limit) => Word::Ask(Failure {
            reason: Reason::TimeLimit,
            evidence: Evidence::Slow { elapsed, limit },
        }),
        None if read.members.secondary_answers => Word::Answered,
        None => Word::Neutral(None),
    }
}

/// Trigger error `code`: the cluster's word, the client's own doing, or a question.
fn failed<'s>(read: &Read<'_>, code: i32, code_name: Option<&'s str>) -> Word<'s> {
    let failure = Failure {
        reason: Reason::of_code(code),
        evidence: Evidence::Code { code, code_name },
    };
    if ROUTING.contains(&code) {
        return Word::Failed(failure);
    }
    if code == NO_MEMBER {
        return match read.members.tagged {
            // A tag set that no member matches is the client's choice.
            true => Word::Neutral(Some(SetAside::Tagged)),
            false => Word::Failed(failure),
        };
    }
    if OWN_TIME_LIMIT.contains(&code) {
        // The client's own limit, below the floor: its error is its own.
        let own = (!read.limit_ours).then_some(read.max_time_ms).flatten();
        if own.is_some_and(|ms| (ms as u128) < read.policy.evidence_floor().as_millis()) {
            return Word::Neutral(Some(SetAside::ShortTimeLimit));
        }
        return Word::Ask(failure);
    }
    if code == NETWORK_TIMEOUT {
        return Word::Ask(failure);
    }
    // A code the operator added to `trigger_codes`: their word that it is the cluster's.
    Word::Failed(failure)
}

/// A time limit staleguard set itself (its first-attempt share, the `max_time` cap, an open
/// breaker's bound) cut this attempt: a question to the cluster before anything is relaxed
/// or climbed.
pub fn own_limit_cut(read: &Read<'_>, code: i32) -> bool {
    read.limit_ours && (OWN_TIME_LIMIT.contains(&code) || code == NETWORK_TIMEOUT)
}

/// What a confirming read's reply says of the time limit it was sent to confirm.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Confirmation {
    /// It failed too (a trigger error, its own short limit included): the secondary it met
    /// is stale or hung. Counted, with the reason of its code.
    Confirmed { code: i32, reason: Reason },
    /// It was answered: the first read was slow on its own account.
    Unconfirmed,
    /// Nothing to judge (another error, e.g. no rights on the namespace; unreadable; no
    /// answer).
    Unknown,
}

/// Judges the reply to a confirming read of `policy`'s namespace (read with a mode whose
/// answer only a secondary gives, without tags).
pub fn confirmation(policy: &NsPolicy, status: Option<&ReplyStatus>) -> Confirmation {
    let Some(status) = status else {
        return Confirmation::Unknown;
    };
    if status.ok {
        return Confirmation::Unconfirmed;
    }
    match status.code {
        Some(code) if code != NO_MEMBER && policy.is_trigger(code) => Confirmation::Confirmed {
            code,
            reason: Reason::of_code(code),
        },
        _ => Confirmation::Unknown,
    }
}

impl Members {
    /// Members that can only be secondaries (a confirming read's, and the tests').
    pub const SECONDARY: Members = Members {
        tagged: false,
        secondary_answers: true,
    };
}

impl Evidence<'_> {
    /// The `code` label of the trigger-error metric.
    pub fn label(&self) -> String {
        match self {
            Evidence::Code { code, .. } => code.to_string(),
            Evidence::Slow { .. } => "slow".to_string(),
            Evidence::Silent { .. } => "silent".to_string(),
        }
    }

    /// The code this evidence carries, if any.
    pub fn code(&self) -> Option<i32> {
        match self {
            Evidence::Code { code, .. } => Some(*code),
            _ => None,
        }
    }
}

/// The text the breaker keeps as the cause of its last transition.
impl fmt::Display for Evidence<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Evidence::Code { code, code_name } => match code_name {
                Some(name) if !name.is_empty() => write!(f, "{code} {name}"),
                _ => write!(f, "{code}"),
            },
            Evidence::Slow { elapsed, limit } => write!(
                f,
                "slow reply ({} ms > {} ms)",
                elapsed.as_millis(),
                limit.as_millis()
            ),
            Evidence::Silent { waited } => {
                write!(f, "no reply from mongos in {} ms", waited.as_millis())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{Bounded, Mode};

    const STALE: i32 = 13388;
    const MAX_TIME: i32 = 50;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// Replies live for the whole test (leaked: a few bytes per test run).
    fn status(ok: bool, code: Option<i32>) -> &'static ReplyStatus {
        Box::leak(Box::new(ReplyStatus {
            ok,
            code,
            code_name: None,
        }))
    }

    fn err(code: i32) -> &'static ReplyStatus {
        status(false, Some(code))
    }

    fn ok() -> &'static ReplyStatus {
        status(true, None)
    }

    /// A first attempt sent at `t0` and started at once, that only a secondary answers.
    fn read(p: &NsPolicy, t0: Instant, max_time_ms: Option<i64>) -> Read<'_> {
        Read {
            policy: p,
            started: t0,
            began: Some(t0),
            max_time_ms,
            limit_ours: false,
            members: Members::SECONDARY,
            sample: false,
            bounded: None,
            primary: false,
            retry: false,
            rung: Rung::First,
            asked: false,
        }
    }

    fn kind(w: &Word<'_>) -> &'static str {
        match w {
            Word::Neutral(None) => "neutral",
            Word::Neutral(Some(why)) => why.label(),
            Word::Failed(_) => "failed",
            Word::Ask(_) => "ask",
            Word::Answered => "answered",
        }
    }

    /// The one rule: what each ending of a first attempt says, whatever the breaker's state.
    #[test]
    fn evidence_table() {
        let mut p = NsPolicy::with_defaults("pay.transactions", Mode::Strict);
        p.slow_read = Some(ms(200));
        let t0 = Instant::now();
        let plain = read(&p, t0, None);
        let own = |limit| read(&p, t0, Some(limit));
        let ours = |limit| Read {
            limit_ours: true,
            ..read(&p, t0, Some(limit))
        };
        let tagged = Read {
            members: Members {
                tagged: true,
                secondary_answers: true,
            },
            ..plain
        };
        let maybe_primary = Read {
            members: Members {
                tagged: false,
                secondary_answers: false,
            },
            ..plain
        };
        let queued = Read {
            began: None,
            ..plain
        };
        let late = Read {
            began: Some(t0 + ms(5_000)),
            ..plain
        };
        let sample = Read {
            sample: true,
            ..plain
        };
        let bounded_own = Read {
            sample: true,
            bounded: Some(Bounded {
                reason: Reason::StaleRouting,
                errors: 3,
                ours: false,
            }),
            ..own(100)
        };
        let bounded_ours = Read {
            limit_ours: true,
            ..Read {
                bounded: Some(Bounded {
                    reason: Reason::StaleRouting,
                    errors: 3,
                    ours: true,
                }),
                ..sample
            }
        };
        let primary_rung = Read {
            rung: Rung::Primary,
            ..plain
        };
        let available_rung = Read {
            rung: Rung::Available,
            ..plain
        };
        let r = Ending::Reply;
        let rows: Vec<(&str, Read<'_>, Ending<'_>, u64, &str)> = vec![
            // The cluster's word about routing: a failure whatever the read's limit.
            ("stale", own(1), r(err(STALE)), 2, "failed"),
            ("stale 63", plain, r(err(63)), 2, "failed"),
            ("stale sample", sample, r(err(STALE)), 2, "failed"),
            // 133: a failure, but never on a read pinned by tag sets.
            ("133", plain, r(err(133)), 2, "failed"),
            ("133 tagged", tagged, r(err(133)), 2, "tagged"),
            // The read's own limit below the floor: its own error (50, 202, 262), as a
            // sample too, and under an open breaker's bound when its own was shorter.
            (
                "50 own 1ms",
                own(1),
                r(err(MAX_TIME)),
                2,
                "short_time_limit",
            ),
            ("202 own 1ms", own(1), r(err(202)), 2, "short_time_limit"),
            (
                "262 own 999ms",
                own(999),
                r(err(262)),
                999,
                "short_time_limit",
            ),
            (
                "own 1ms sample",
                Read {
                    sample: true,
                    ..own(1)
                },
                r(err(MAX_TIME)),
                2,
                "short_time_limit",
            ),
            (
                "bounded own",
                bounded_own,
                r(err(MAX_TIME)),
                100,
                "short_time_limit",
            ),
            // At or above the floor, no limit of its own, or staleguard's own: a question.
            ("50 own 1s", own(1000), r(err(MAX_TIME)), 1000, "ask"),
            ("50 no limit", plain, r(err(MAX_TIME)), 2, "ask"),
            ("89", plain, r(err(89)), 2, "ask"),
            ("50 ours 500ms", ours(500), r(err(MAX_TIME)), 500, "ask"),
            ("50 ours 1ms", ours(1), r(err(MAX_TIME)), 1, "ask"),
            ("bound ours", bounded_ours, r(err(MAX_TIME)), 200, "ask"),
            ("silent", plain, Ending::Silent, 1300, "ask"),
            // Not a trigger code: nothing, Unauthorized included (also as a sample).
            ("unauthorized", plain, r(err(13)), 5, "neutral"),
            ("unauthorized sample", sample, r(err(13)), 5, "neutral"),
            ("other error", plain, r(err(2)), 5, "neutral"),
            // A client that closes is never evidence; before mongos started it, queued.
            ("gone", plain, Ending::ClientGone, 5_000, "client_gone"),
            ("gone queued", queued, Ending::ClientGone, 5_000, "queued"),
            ("upstream gone", plain, Ending::UpstreamGone, 5, "neutral"),
            ("unreadable", plain, Ending::Unreadable, 5, "neutral"),
            // Answers: a secondary's, or neutral when the primary may have given it.
            ("fast", plain, r(ok()), 5, "answered"),
            ("sample answered", sample, r(ok()), 5, "answered"),
            ("tagged secondary", tagged, r(ok()), 5, "answered"),
            ("maybe the primary", maybe_primary, r(ok()), 5, "neutral"),
            (
                "maybe the primary, sample",
                Read {
                    sample: true,
                    ..maybe_primary
                },
                r(ok()),
                5,
                "neutral",
            ),
            // Slow: timed from when mongos could start the read; a question past the floor.
            ("slow", plain, r(ok()), 1_500, "ask"),
            ("slow in floor", plain, r(ok()), 500, "short_wait"),
            ("slow queued", late, r(ok()), 5_100, "answered"),
            // Rungs above the first say nothing about the secondaries.
            (
                "primary rung stale",
                primary_rung,
                r(err(STALE)),
                5,
                "neutral",
            ),
            ("primary rung ok", primary_rung, r(ok()), 5, "neutral"),
            ("available ok", available_rung, r(ok()), 5, "neutral"),
        ];
        for (name, read, ending, after, want) in rows {
            let got = word(&read, ending, t0 + ms(after));
            assert_eq!(kind(&got), want, "{name}");
        }
    }

    #[test]
    fn an_own_limit_cut_is_only_a_limit_staleguard_wrote() {
        let p = NsPolicy::with_defaults("demo.inventory", Mode::Fallback);
        let t0 = Instant::now();
        let ours = Read {
            limit_ours: true,
            ..read(&p, t0, Some(1000))
        };
        assert!(own_limit_cut(&ours, MAX_TIME));
        assert!(own_limit_cut(&ours, 262));
        assert!(own_limit_cut(&ours, 89));
        assert!(!own_limit_cut(&ours, STALE));
        assert!(!own_limit_cut(&read(&p, t0, Some(1000)), MAX_TIME));
    }

    #[test]
    fn confirmation_table() {
        let p = NsPolicy::with_defaults("pay.transactions", Mode::Strict);
        let c = |s: Option<&ReplyStatus>| confirmation(&p, s);
        assert_eq!(c(Some(ok())), Confirmation::Unconfirmed);
        assert_eq!(
            c(Some(err(MAX_TIME))),
            Confirmation::Confirmed {
                code: 50,
                reason: Reason::TimeLimit
            }
        );
        assert_eq!(
            c(Some(err(STALE))),
            Confirmation::Confirmed {
                code: STALE,
                reason: Reason::StaleRouting
            }
        );
        // Not the cluster's word about this namespace: unauthorized, or no member at all.
        assert_eq!(c(Some(err(13))), Confirmation::Unknown);
        assert_eq!(c(Some(err(133))), Confirmation::Unknown);
        assert_eq!(c(None), Confirmation::Unknown);
    }

    #[test]
    fn evidence_text_and_labels() {
        let e = Evidence::Code {
            code: STALE,
            code_name: Some("StaleConfig"),
        };
        assert_eq!(e.to_string(), "13388 StaleConfig");
        assert_eq!(e.label(), "13388");
        assert_eq!(e.code(), Some(STALE));
        let slow = Evidence::Slow {
            elapsed: ms(1500),
            limit: ms(200),
        };
        assert_eq!(slow.to_string(), "slow reply (1500 ms > 200 ms)");
        assert_eq!(slow.label(), "slow");
        let silent = Evidence::Silent { waited: ms(1300) };
        assert_eq!(silent.to_string(), "no reply from mongos in 1300 ms");
        assert_eq!(silent.label(), "silent");
    }
}
