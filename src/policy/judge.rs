//! The reply side's judgement: what the way a tracked read ended means for its namespace's
//! breaker, and whether the read goes again. Pure, like `policy::decide` on the request side:
//! the read, how it ended and the time in, a [`Verdict`] out; no I/O, no shared state. The
//! session only applies verdicts.
//!
//! The evidence rules live here and nowhere else: which codes count, when a slow reply
//! counts, what a client that gave up counts as, when a read is sent again.
//!
//! A client's word alone is no evidence about the cluster (the breaker adds the rule that
//! errors come from `min_connections` connections, at most `per_connection` each). Here,
//! with `floor` the namespace's [`NsPolicy::evidence_floor`] (`min_wait`, or `max_time`
//! when shorter):
//! - a client that gave up counts only after waiting at least `floor`;
//! - a slow reply counts only when slower than both `slow_read` and `floor`;
//! - a time-limit code the read's own `maxTimeMS` can cause (MaxTimeMSExpired 50,
//!   ExceededTimeLimit 262) counts only when that limit, as sent, was at least `floor`.
//!
//! A read set aside this way changes nothing for the breaker (a half-open probe gives its
//! slot back), and its reply goes to the client as it came.

use std::fmt;
use std::time::Duration;

use tokio::time::Instant;

use super::budget::{next_rung_ms, primary_rung_ms};
use super::reason::Reason;
use super::table::{Causal, NsPolicy};
use crate::rewrite::RewriteSpec;
use crate::wire::ReplyStatus;

/// A tracked read as the judge sees it.
#[derive(Debug, Clone, Copy)]
pub struct Read<'t> {
    pub policy: &'t NsPolicy,
    /// When the read was sent (its first attempt).
    pub started: Instant,
    /// The read's whole budget (the client's `maxTimeMS`, capped by `max_time`); the resend
    /// spends what the first attempt left of it. `None`: no limit.
    pub max_time_ms: Option<i64>,
    /// The breaker's half-open probe.
    pub probe: bool,
    /// The primary rung is still ahead: a trigger error sends the read to the primary.
    pub primary: bool,
    /// The `available` rung is still ahead (fallback).
    pub retry: bool,
    /// Which attempt this is.
    pub rung: Rung,
}

/// One attempt of a read: the ladder's rungs, in the order a read climbs them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rung {
    /// The read as the client sent it (its `maxTimeMS` perhaps lowered to a share).
    First,
    /// Sent with `$readPreference: {mode: "primary"}`, read concern untouched.
    Primary,
    /// Sent with `readConcern: {level: "available"}`.
    Available,
}

impl Rung {
    /// The `rung` label of the ladder metric.
    pub fn as_str(self) -> &'static str {
        match self {
            Rung::First => "first",
            Rung::Primary => "primary",
            Rung::Available => "available",
        }
    }
}

/// How a tracked read ended.
#[derive(Debug, Clone, Copy)]
pub enum Ending<'s> {
    /// The upstream replied; what the reply says.
    Reply(&'s ReplyStatus),
    /// The upstream replied with something whose status cannot be read.
    Unreadable,
    /// The client closed its connection before the reply (its driver gave up).
    ClientGone,
    /// The upstream connection ended before the reply.
    UpstreamGone,
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
    /// The client left before the reply, after waiting this long.
    ClientGaveUp { waited: Duration },
}

/// What to do about a tracked read that ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict<'s> {
    /// A success for the breaker (a half-open probe closes it).
    Success,
    /// A failure for the breaker; whatever the upstream said goes to the client.
    /// `out_of_time`: this rung was due, but the read's budget is spent.
    Fail {
        failure: Failure<'s>,
        out_of_time: Option<Rung>,
    },
    /// The read climbs to rung `to`, sent again rewritten by `spec`; the client never sees
    /// this reply. `failure`: what the breaker counts (the first attempt's trigger error;
    /// `None` when a rung failed, which says nothing about the secondaries). `or_else`:
    /// when `to` is the primary and its guard refuses the read, the `available` resend to
    /// send instead (`None`: the reply goes to the client).
    Retry {
        failure: Option<Failure<'s>>,
        to: Rung,
        spec: RewriteSpec,
        or_else: Option<RewriteSpec>,
    },
    /// Nothing for the breaker.
    Ignore(Ignored),
}

/// Why a read's end counts for nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ignored {
    /// A rung above the first ended: the read was counted on its first reply, not twice.
    /// `trigger`: the rung failed with that trigger code too; `ok`: it answered `ok: 1`;
    /// `no_time`: the next rung was due but the read's budget is spent.
    Retried {
        rung: Rung,
        trigger: Option<i32>,
        ok: bool,
        no_time: bool,
    },
    /// The reply's status cannot be read; a half-open probe gives its slot back.
    Unreadable { release_probe: bool },
    /// The upstream connection ended: that is the upstream's failure, not the namespace's.
    UpstreamGone,
    /// No evidence: the client gave up, or the reply was slow, before `floor`.
    ShortWait { release_probe: bool },
    /// No evidence: a time-limit error caused by the read's own `maxTimeMS`, below `floor`.
    ShortTimeLimit { release_probe: bool },
}

/// Codes a read's own `maxTimeMS` can cause.
const OWN_TIME_LIMIT: [i32; 2] = [50, 262];

/// Judges how a tracked read ended, at `now`.
pub fn judge<'s>(read: &Read<'_>, ending: Ending<'s>, now: Instant) -> Verdict<'s> {
    let elapsed = now.saturating_duration_since(read.started);
    match ending {
        Ending::UpstreamGone => Verdict::Ignore(Ignored::UpstreamGone),
        Ending::Unreadable => Verdict::Ignore(Ignored::Unreadable {
            release_probe: read.probe,
        }),
        // Its first attempt's error was counted; the read is not counted twice.
        Ending::ClientGone if read.rung != Rung::First => Verdict::Ignore(Ignored::Retried {
            rung: read.rung,
            trigger: None,
            ok: false,
            no_time: false,
        }),
        // A client that leaves at once proves nothing about the cluster.
        Ending::ClientGone if elapsed < read.policy.evidence_floor() => {
            Verdict::Ignore(Ignored::ShortWait {
                release_probe: read.probe,
            })
        }
        // The driver's socket timeout: counts as a time-limit error.
        Ending::ClientGone => Verdict::Fail {
            failure: Failure {
                reason: Reason::TimeLimit,
                evidence: Evidence::ClientGaveUp { waited: elapsed },
            },
            out_of_time: None,
        },
        Ending::Reply(status) => judge_reply(read, status, elapsed),
    }
}

fn judge_reply<'s>(read: &Read<'_>, status: &'s ReplyStatus, elapsed: Duration) -> Verdict<'s> {
    let policy = read.policy;
    let trigger = status.code.filter(|&c| !status.ok && policy.is_trigger(c));
    if read.rung != Rung::First {
        return judge_rung(read, status.ok, trigger, elapsed);
    }
    let floor = policy.evidence_floor();
    if let Some(code) = trigger {
        let own_limit = read.max_time_ms.filter(|_| OWN_TIME_LIMIT.contains(&code));
        if own_limit.is_some_and(|ms| (ms as u128) < floor.as_millis()) {
            return Verdict::Ignore(Ignored::ShortTimeLimit {
                release_probe: read.probe,
            });
        }
        let failure = Failure {
            reason: Reason::of_code(code),
            evidence: Evidence::Code {
                code,
                code_name: status.code_name.as_deref(),
            },
        };
        let next = match (read.primary, read.retry) {
            (true, _) => Rung::Primary,
            (false, true) => Rung::Available,
            (false, false) => {
                return Verdict::Fail {
                    failure,
                    out_of_time: None,
                }
            }
        };
        // The next rung carries what the first attempt left of the read's whole budget.
        let Ok(remaining) = next_rung_ms(read.max_time_ms, elapsed) else {
            return Verdict::Fail {
                failure,
                out_of_time: Some(next),
            };
        };
        return climb(read, Some(failure), next, remaining);
    }
    match policy.slow_read.filter(|&limit| elapsed > limit) {
        // Slower than slow_read but within the floor: an ordinary answer.
        Some(_) if elapsed < floor => Verdict::Success,
        Some(limit) => Verdict::Fail {
            failure: Failure {
                reason: Reason::TimeLimit,
                evidence: Evidence::Slow { elapsed, limit },
            },
            out_of_time: None,
        },
        None => Verdict::Success,
    }
}

/// A rung above the first ended: nothing for the breaker (a primary's or an `available`
/// read's answer says nothing about the secondaries); the primary rung's trigger error
/// climbs on to `available` when that rung is ahead.
fn judge_rung<'s>(
    read: &Read<'_>,
    ok: bool,
    trigger: Option<i32>,
    elapsed: Duration,
) -> Verdict<'s> {
    let ended = |no_time| {
        Verdict::Ignore(Ignored::Retried {
            rung: read.rung,
            trigger,
            ok,
            no_time,
        })
    };
    if read.rung != Rung::Primary || !read.retry || trigger.is_none() {
        return ended(false);
    }
    match next_rung_ms(read.max_time_ms, elapsed) {
        Ok(remaining) => climb(read, None, Rung::Available, remaining),
        Err(()) => ended(true),
    }
}

/// The resend to rung `to` with `remaining` of the budget: the primary gets a share of it
/// when `available` follows (the guard's refusal sends `available` at once instead), the
/// last rung all of it.
fn climb<'s>(
    read: &Read<'_>,
    failure: Option<Failure<'s>>,
    to: Rung,
    remaining: Option<i64>,
) -> Verdict<'s> {
    let policy = read.policy;
    let available = RewriteSpec {
        available: true,
        drop_after_cluster_time: policy.causal == Causal::Drop,
        max_time_ms: remaining,
        primary: false,
    };
    match to {
        Rung::Primary => {
            let max_time_ms = Some(primary_rung_ms(
                remaining,
                read.retry,
                policy.attempt_share,
                policy.attempt_limit,
            ));
            Verdict::Retry {
                failure,
                to,
                spec: RewriteSpec {
                    primary: true,
                    max_time_ms,
                    ..RewriteSpec::default()
                },
                or_else: read.retry.then_some(available),
            }
        }
        _ => Verdict::Retry {
            failure,
            to: Rung::Available,
            spec: available,
            or_else: None,
        },
    }
}

impl Evidence<'_> {
    /// The `code` label of the trigger-error metric.
    pub fn label(&self) -> String {
        match self {
            Evidence::Code { code, .. } => code.to_string(),
            Evidence::Slow { .. } => "slow".to_string(),
            Evidence::ClientGaveUp { .. } => "timeout".to_string(),
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
            Evidence::ClientGaveUp { waited } => {
                write!(f, "client gave up after {} ms", waited.as_millis())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Mode;

    const STALE: i32 = 13388;
    const MAX_TIME: i32 = 50;

    fn policy(mode: Mode) -> NsPolicy {
        let mut p = NsPolicy::with_defaults("demo.inventory", mode);
        p.slow_read = Some(Duration::from_millis(200));
        // The table below is about codes and timing, not the evidence floor (tested apart).
        p.min_wait = Duration::from_millis(10);
        p
    }

    fn read(p: &NsPolicy, started: Instant, max_time_ms: Option<i64>, probe: bool) -> Read<'_> {
        Read {
            policy: p,
            started,
            max_time_ms,
            probe,
            primary: false,
            retry: false,
            rung: Rung::First,
        }
    }

    #[test]
    fn a_clients_word_below_the_floor_is_no_evidence() {
        let ms = Duration::from_millis;
        let mut p = NsPolicy::with_defaults("pay.transactions", Mode::Strict);
        p.slow_read = Some(ms(200));
        let capped = NsPolicy {
            max_time: Some(ms(300)),
            ..p.clone()
        };
        let start = Instant::now();

        let max_time = status(false, Some(MAX_TIME), Some("MaxTimeMSExpired"));
        let exceeded = status(false, Some(262), Some("ExceededTimeLimit"));
        let stale = status(false, Some(STALE), Some("StaleConfig"));
        let ok = status(true, None, None);
        let short_wait = |probe| {
            Verdict::Ignore(Ignored::ShortWait {
                release_probe: probe,
            })
        };
        let short_limit = |probe| {
            Verdict::Ignore(Ignored::ShortTimeLimit {
                release_probe: probe,
            })
        };
        // Connect, read, close at once: nothing (a probe gives its slot back).
        assert_eq!(
            judge(
                &read(&p, start, None, false),
                Ending::ClientGone,
                start + ms(5)
            ),
            short_wait(false)
        );
        assert_eq!(
            judge(
                &read(&p, start, None, true),
                Ending::ClientGone,
                start + ms(999)
            ),
            short_wait(true)
        );
        assert!(matches!(
            judge(
                &read(&p, start, None, false),
                Ending::ClientGone,
                start + ms(1000)
            ),
            Verdict::Fail { .. }
        ));
        // maxTimeMS: 1 answered with 50 (or 262): the client's own limit, nothing.
        assert_eq!(
            judge(
                &read(&p, start, Some(1), false),
                Ending::Reply(&max_time),
                start + ms(2)
            ),
            short_limit(false)
        );
        assert_eq!(
            judge(
                &read(&p, start, Some(999), true),
                Ending::Reply(&exceeded),
                start + ms(999)
            ),
            short_limit(true)
        );
        assert!(matches!(
            judge(
                &read(&p, start, Some(1000), false),
                Ending::Reply(&max_time),
                start + ms(1000)
            ),
            Verdict::Fail { .. }
        ));
        // No limit of its own: the cluster's time limit, counted.
        assert!(matches!(
            judge(
                &read(&p, start, None, false),
                Ending::Reply(&max_time),
                start + ms(2)
            ),
            Verdict::Fail { .. }
        ));
        // StaleConfig is the cluster's word whatever the read's limit.
        assert!(matches!(
            judge(
                &read(&p, start, Some(1), false),
                Ending::Reply(&stale),
                start + ms(2)
            ),
            Verdict::Fail { .. }
        ));
        // Slower than slow_read but not than the floor: an ordinary answer.
        assert_eq!(
            judge(
                &read(&p, start, None, false),
                Ending::Reply(&ok),
                start + ms(500)
            ),
            Verdict::Success
        );
        assert!(matches!(
            judge(
                &read(&p, start, None, false),
                Ending::Reply(&ok),
                start + ms(1001)
            ),
            Verdict::Fail { .. }
        ));
        // The operator's max_time below min_wait lowers the floor to it.
        let p = capped;
        assert_eq!(
            judge(
                &read(&p, start, Some(1), false),
                Ending::Reply(&max_time),
                start + ms(2)
            ),
            short_limit(false)
        );
        assert!(matches!(
            judge(
                &read(&p, start, Some(300), false),
                Ending::Reply(&max_time),
                start + ms(300)
            ),
            Verdict::Fail { .. }
        ));
        assert!(matches!(
            judge(
                &read(&p, start, None, false),
                Ending::ClientGone,
                start + ms(300)
            ),
            Verdict::Fail { .. }
        ));
    }

    fn status(ok: bool, code: Option<i32>, name: Option<&str>) -> ReplyStatus {
        ReplyStatus {
            ok,
            code,
            code_name: name.map(str::to_string),
        }
    }

    fn code(reason: Reason, code: i32, name: &str) -> Failure<'_> {
        Failure {
            reason,
            evidence: Evidence::Code {
                code,
                code_name: Some(name),
            },
        }
    }

    /// One row: a read (fallback reads retry, strict ones do not) that ended `after` its
    /// start, and the verdict it must get.
    struct Row<'s> {
        what: &'static str,
        mode: Mode,
        probe: bool,
        retried: bool,
        max_time_ms: Option<i64>,
        ending: Ending<'s>,
        after: Duration,
        want: Verdict<'s>,
    }

    fn check(rows: &[Row<'_>]) {
        let start = Instant::now();
        for r in rows {
            let p = policy(r.mode);
            let read = Read {
                policy: &p,
                started: start,
                max_time_ms: r.max_time_ms,
                probe: r.probe,
                primary: false,
                retry: r.mode == Mode::Fallback,
                rung: if r.retried {
                    Rung::Available
                } else {
                    Rung::First
                },
            };
            let got = judge(&read, r.ending, start + r.after);
            assert_eq!(got, r.want, "{}", r.what);
        }
    }

    #[test]
    fn decision_table_reply_side() {
        let stale = status(false, Some(STALE), Some("StaleConfig"));
        let time_limit = status(false, Some(MAX_TIME), Some("MaxTimeMSExpired"));
        let other = status(false, Some(11000), Some("DuplicateKey"));
        let ok = status(true, None, None);
        let ms = Duration::from_millis;
        let available = |max_time_ms| RewriteSpec {
            available: true,
            drop_after_cluster_time: true,
            max_time_ms,
            primary: false,
        };
        let fail = |failure| Verdict::Fail {
            failure,
            out_of_time: None,
        };
        let retry = |failure, spec| Verdict::Retry {
            failure: Some(failure),
            to: Rung::Available,
            spec,
            or_else: None,
        };
        let slow = |elapsed| {
            fail(Failure {
                reason: Reason::TimeLimit,
                evidence: Evidence::Slow {
                    elapsed,
                    limit: ms(200),
                },
            })
        };
        let gave_up = |waited| {
            fail(Failure {
                reason: Reason::TimeLimit,
                evidence: Evidence::ClientGaveUp { waited },
            })
        };
        #[rustfmt::skip]
        let rows = [
            // Trigger code.
            Row { what: "fallback, trigger: resend with available, no budget", mode: Mode::Fallback, probe: false, retried: false, max_time_ms: None, ending: Ending::Reply(&stale), after: ms(30), want: retry(code(Reason::StaleRouting, STALE, "StaleConfig"), available(None)) },
            Row { what: "fallback, trigger: the resend gets what is left of maxTimeMS", mode: Mode::Fallback, probe: false, retried: false, max_time_ms: Some(500), ending: Ending::Reply(&time_limit), after: ms(120), want: retry(code(Reason::TimeLimit, MAX_TIME, "MaxTimeMSExpired"), available(Some(380))) },
            Row { what: "fallback, the first attempt's share timed out: the resend gets the rest of the whole budget", mode: Mode::Fallback, probe: false, retried: false, max_time_ms: Some(1_000), ending: Ending::Reply(&time_limit), after: ms(500), want: retry(code(Reason::TimeLimit, MAX_TIME, "MaxTimeMSExpired"), available(Some(500))) },
            Row { what: "fallback, trigger 1 ms before the budget ends: the resend gets 1 ms", mode: Mode::Fallback, probe: false, retried: false, max_time_ms: Some(1_000), ending: Ending::Reply(&time_limit), after: ms(999), want: retry(code(Reason::TimeLimit, MAX_TIME, "MaxTimeMSExpired"), available(Some(1))) },
            Row { what: "fallback, trigger past the budget: counted, not resent", mode: Mode::Fallback, probe: false, retried: false, max_time_ms: Some(1_000), ending: Ending::Reply(&time_limit), after: ms(1_200), want: Verdict::Fail { failure: code(Reason::TimeLimit, MAX_TIME, "MaxTimeMSExpired"), out_of_time: Some(Rung::Available) } },
            Row { what: "fallback, trigger, maxTimeMS spent: counted, not resent", mode: Mode::Fallback, probe: false, retried: false, max_time_ms: Some(100), ending: Ending::Reply(&time_limit), after: ms(100), want: Verdict::Fail { failure: code(Reason::TimeLimit, MAX_TIME, "MaxTimeMSExpired"), out_of_time: Some(Rung::Available) } },
            Row { what: "strict, trigger: counted, the error goes to the client", mode: Mode::Strict, probe: false, retried: false, max_time_ms: Some(500), ending: Ending::Reply(&stale), after: ms(30), want: fail(code(Reason::StaleRouting, STALE, "StaleConfig")) },
            Row { what: "the resend's trigger error is not counted again", mode: Mode::Fallback, probe: false, retried: true, max_time_ms: None, ending: Ending::Reply(&stale), after: ms(30), want: Verdict::Ignore(Ignored::Retried { rung: Rung::Available, trigger: Some(STALE), ok: false, no_time: false }) },
            // Other error.
            Row { what: "other error: a success for the breaker", mode: Mode::Strict, probe: false, retried: false, max_time_ms: None, ending: Ending::Reply(&other), after: ms(30), want: Verdict::Success },
            Row { what: "slow other error: a time-limit error", mode: Mode::Strict, probe: false, retried: false, max_time_ms: None, ending: Ending::Reply(&other), after: ms(250), want: slow(ms(250)) },
            Row { what: "unreadable reply: nothing counted", mode: Mode::Fallback, probe: false, retried: false, max_time_ms: None, ending: Ending::Unreadable, after: ms(30), want: Verdict::Ignore(Ignored::Unreadable { release_probe: false }) },
            // Success.
            Row { what: "success", mode: Mode::Fallback, probe: false, retried: false, max_time_ms: None, ending: Ending::Reply(&ok), after: ms(30), want: Verdict::Success },
            Row { what: "the resend's success", mode: Mode::Fallback, probe: false, retried: true, max_time_ms: None, ending: Ending::Reply(&ok), after: ms(30), want: Verdict::Ignore(Ignored::Retried { rung: Rung::Available, trigger: None, ok: true, no_time: false }) },
            // Slow reply.
            Row { what: "slow success: a time-limit error", mode: Mode::Fallback, probe: false, retried: false, max_time_ms: None, ending: Ending::Reply(&ok), after: ms(201), want: slow(ms(201)) },
            Row { what: "exactly slow_read is not slow", mode: Mode::Fallback, probe: false, retried: false, max_time_ms: None, ending: Ending::Reply(&ok), after: ms(200), want: Verdict::Success },
            // Client gone.
            Row { what: "client gave up: a time-limit error", mode: Mode::Strict, probe: false, retried: false, max_time_ms: None, ending: Ending::ClientGone, after: ms(40), want: gave_up(ms(40)) },
            Row { what: "client gave up on the resend: counted once already", mode: Mode::Fallback, probe: false, retried: true, max_time_ms: None, ending: Ending::ClientGone, after: ms(40), want: Verdict::Ignore(Ignored::Retried { rung: Rung::Available, trigger: None, ok: false, no_time: false }) },
            // Upstream gone.
            Row { what: "upstream gone: nothing counted", mode: Mode::Strict, probe: true, retried: false, max_time_ms: None, ending: Ending::UpstreamGone, after: ms(40), want: Verdict::Ignore(Ignored::UpstreamGone) },
            // Probe result (the session passes `probe` to the breaker with the verdict).
            Row { what: "probe success closes", mode: Mode::Strict, probe: true, retried: false, max_time_ms: None, ending: Ending::Reply(&ok), after: ms(30), want: Verdict::Success },
            Row { what: "strict probe, trigger: re-opens", mode: Mode::Strict, probe: true, retried: false, max_time_ms: None, ending: Ending::Reply(&stale), after: ms(30), want: fail(code(Reason::StaleRouting, STALE, "StaleConfig")) },
            Row { what: "fallback probe, trigger: re-opens and resends", mode: Mode::Fallback, probe: true, retried: false, max_time_ms: None, ending: Ending::Reply(&stale), after: ms(30), want: retry(code(Reason::StaleRouting, STALE, "StaleConfig"), available(None)) },
            Row { what: "slow probe: re-opens", mode: Mode::Strict, probe: true, retried: false, max_time_ms: None, ending: Ending::Reply(&ok), after: ms(300), want: slow(ms(300)) },
            Row { what: "probe whose client gave up: re-opens", mode: Mode::Strict, probe: true, retried: false, max_time_ms: None, ending: Ending::ClientGone, after: ms(40), want: gave_up(ms(40)) },
            Row { what: "unreadable probe reply: the probe slot is given back", mode: Mode::Strict, probe: true, retried: false, max_time_ms: None, ending: Ending::Unreadable, after: ms(30), want: Verdict::Ignore(Ignored::Unreadable { release_probe: true }) },
        ];
        check(&rows);
    }

    #[test]
    fn ladder_rungs() {
        let ms = Duration::from_millis;
        let stale = status(false, Some(STALE), Some("StaleConfig"));
        let ok = status(true, None, None);
        let start = Instant::now();
        let strict = policy(Mode::Strict);
        let fallback = policy(Mode::Fallback);
        let read = |p, budget, rung, retry| Read {
            policy: p,
            started: start,
            max_time_ms: budget,
            probe: false,
            primary: rung == Rung::First,
            retry,
            rung,
        };
        let primary = |max_time_ms| RewriteSpec {
            primary: true,
            max_time_ms,
            ..RewriteSpec::default()
        };
        let available = |max_time_ms| RewriteSpec {
            available: true,
            drop_after_cluster_time: true,
            max_time_ms,
            primary: false,
        };
        let counted = Some(code(Reason::StaleRouting, STALE, "StaleConfig"));
        let ended = |rung, trigger, ok, no_time| {
            Verdict::Ignore(Ignored::Retried {
                rung,
                trigger,
                ok,
                no_time,
            })
        };
        #[rustfmt::skip]
        let rows: [(&str, Read<'_>, Ending<'_>, Duration, Verdict<'_>); 10] = [
            ("strict: the primary is the last rung, with all that is left",
             read(&strict, Some(1000), Rung::First, false), Ending::Reply(&stale), ms(30),
             Verdict::Retry { failure: counted.clone(), to: Rung::Primary, spec: primary(Some(970)), or_else: None }),
            ("fallback: the primary gets a share of what is left, available the rest if refused",
             read(&fallback, Some(1000), Rung::First, true), Ending::Reply(&stale), ms(100),
             Verdict::Retry { failure: counted.clone(), to: Rung::Primary, spec: primary(Some(450)), or_else: Some(available(Some(900))) }),
            ("fallback without a budget: the primary gets attempt_limit, available none",
             read(&fallback, None, Rung::First, true), Ending::Reply(&stale), ms(100),
             Verdict::Retry { failure: counted.clone(), to: Rung::Primary, spec: primary(Some(500)), or_else: Some(available(None)) }),
            ("no time left for the primary: counted, the error to the client",
             read(&strict, Some(1000), Rung::First, false), Ending::Reply(&stale), ms(1000),
             Verdict::Fail { failure: counted.clone().unwrap(), out_of_time: Some(Rung::Primary) }),
            ("the primary failed, available ahead: climbs on, nothing counted",
             read(&fallback, Some(1000), Rung::Primary, true), Ending::Reply(&stale), ms(600),
             Verdict::Retry { failure: None, to: Rung::Available, spec: available(Some(400)), or_else: None }),
            ("the primary failed, available ahead, budget spent",
             read(&fallback, Some(1000), Rung::Primary, true), Ending::Reply(&stale), ms(1000),
             ended(Rung::Primary, Some(STALE), false, true)),
            ("strict: the primary failed too: its error to the client, nothing counted",
             read(&strict, Some(1000), Rung::Primary, false), Ending::Reply(&stale), ms(600),
             ended(Rung::Primary, Some(STALE), false, false)),
            ("the primary answered (slow or not): nothing for the breaker",
             read(&strict, None, Rung::Primary, false), Ending::Reply(&ok), ms(5000),
             ended(Rung::Primary, None, true, false)),
            ("the client left during the primary rung: not counted",
             read(&strict, None, Rung::Primary, false), Ending::ClientGone, ms(5000),
             ended(Rung::Primary, None, false, false)),
            ("available answered after the primary",
             read(&fallback, None, Rung::Available, false), Ending::Reply(&ok), ms(30),
             ended(Rung::Available, None, true, false)),
        ];
        for (what, read, ending, after, want) in rows {
            assert_eq!(judge(&read, ending, start + after), want, "{what}");
        }
    }

    #[test]
    fn causal_skip_keeps_after_cluster_time_on_resend() {
        let mut p = policy(Mode::Fallback);
        p.causal = Causal::Skip;
        let start = Instant::now();
        let read = Read {
            policy: &p,
            started: start,
            max_time_ms: None,
            probe: false,
            primary: false,
            retry: true,
            rung: Rung::First,
        };
        let stale = status(false, Some(STALE), None);
        match judge(&read, Ending::Reply(&stale), start) {
            Verdict::Retry { spec, .. } => assert!(!spec.drop_after_cluster_time),
            other => panic!("expected a retry, got {other:?}"),
        }
    }

    #[test]
    fn evidence_text_and_labels() {
        let named = Evidence::Code {
            code: STALE,
            code_name: Some("StaleConfig"),
        };
        assert_eq!(
            (named.to_string(), named.label()),
            ("13388 StaleConfig".to_string(), "13388".to_string())
        );
        let unnamed = Evidence::Code {
            code: 50,
            code_name: None,
        };
        assert_eq!(unnamed.to_string(), "50");
        let slow = Evidence::Slow {
            elapsed: Duration::from_millis(250),
            limit: Duration::from_millis(200),
        };
        assert_eq!(
            (slow.to_string(), slow.label()),
            (
                "slow reply (250 ms > 200 ms)".to_string(),
                "slow".to_string()
            )
        );
        let gone = Evidence::ClientGaveUp {
            waited: Duration::from_millis(40),
        };
        assert_eq!(
            (gone.to_string(), gone.label()),
            (
                "client gave up after 40 ms".to_string(),
                "timeout".to_string()
            )
        );
    }
}
