//! The reply side's judgement: what the way a tracked read ended means for its namespace's
//! breaker, and what happens next to the read (its reply goes to the client, is replaced by
//! the fail-fast error, or the read climbs to the next rung: the ladder's move, `ladder`).
//! Pure, like `policy::decide` on the request side: the read, how it ended and the time in,
//! a [`Verdict`] out; no I/O, no shared state. The session only carries verdicts out.
//!
//! The evidence rules live here and nowhere else. The breaker acts for every client, so it
//! hears only what the cluster says about itself:
//! - stale routing (StaleConfig 13388, StaleShardVersion 63, StaleEpoch 150, StaleDbVersion
//!   249) is the cluster's word: counted at once;
//! - FailedToSatisfyReadPreference (133) is counted, but never for a read with tag sets (a
//!   tag set no member matches is the client's doing);
//! - a time limit (MaxTimeMSExpired 50, ExceededTimeLimit 262, NetworkInterfaceExceeded-
//!   TimeLimit 202, NetworkTimeout 89) or a slow reply is ambiguous: a slow query and a hung
//!   secondary look the same. It is never counted by itself: when the read's own limit was
//!   below `floor` it is set aside, otherwise the session confirms it with a cheap read of the
//!   same namespace on the same connection ([`confirmation`]), and only a confirming read
//!   that fails counts;
//! - a client that closes before its reply is never evidence (nothing is left to confirm
//!   on), and a reply is timed from when mongos could start the read (its connection had
//!   no earlier request waiting), not from when it was sent.
//!
//! A read admitted while the breaker is open is a *sample*: whatever it meets is reported to
//! the breaker as a sample (answered or failed), never as evidence, since the breaker is
//! open already.

use std::fmt;
use std::time::Duration;

use tokio::time::Instant;

use super::decide::Bounded;
use super::ladder::{self, Rung, Then};
use super::reason::Reason;
use super::table::NsPolicy;
use crate::wire::ReplyStatus;

/// A tracked read as the judge sees it.
#[derive(Debug, Clone, Copy)]
pub struct Read<'t> {
    pub policy: &'t NsPolicy,
    /// When mongos could start its first attempt (sent, or the earlier request on its
    /// connection answered): its budget runs from here, as a `maxTimeMS` runs from when the
    /// server starts the read.
    pub started: Instant,
    /// When mongos could start this attempt (no earlier request on its connection was
    /// waiting); `None`: not yet.
    pub began: Option<Instant>,
    /// The read's whole budget (the client's `maxTimeMS`, capped by `max_time`); the next
    /// rung spends what this attempt left of it. `None`: no limit.
    pub max_time_ms: Option<i64>,
    /// This attempt went out with a `maxTimeMS` staleguard wrote (a cap, the first
    /// attempt's share, an open breaker's bound).
    pub limit_ours: bool,
    /// The read lists tag sets (`CommandInfo::read_pref_tags`).
    pub tagged: bool,
    /// Admitted while the breaker was open: a sample (`bounded`: sent under the open
    /// breaker's time bound).
    pub sample: bool,
    pub bounded: Option<Bounded>,
    /// The primary rung is still ahead: a trigger error sends the read to the primary.
    pub primary: bool,
    /// The `available` rung is still ahead (fallback).
    pub retry: bool,
    /// Which attempt this is.
    pub rung: Rung,
}

/// How a tracked read ended.
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
}

/// How a sample of an open breaker ended (see `breaker::Sample`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SampleEnd {
    Answered,
    Failed,
    Unknown,
}

/// What the breaker hears of a read that ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Heard<'s> {
    /// Nothing; `Some(why)` when a trigger error (or what could have been one) was set aside.
    Nothing(Option<SetAside>),
    /// The cluster's word: counted now.
    Count(Failure<'s>),
    /// Ambiguous: counted only when a confirming read fails too.
    Confirm(Failure<'s>),
    /// A sample of an open breaker.
    Sample(SampleEnd),
}

/// Why a possible trigger error was set aside (the `why` of `evidence_ignored_total`).
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
}

impl SetAside {
    pub fn label(self) -> &'static str {
        match self {
            SetAside::ShortWait => "short_wait",
            SetAside::ShortTimeLimit => "short_time_limit",
            SetAside::ClientGone => "client_gone",
            SetAside::Queued => "queued",
            SetAside::Tagged => "tagged",
        }
    }
}

/// What to do about a tracked read that ended.
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict<'s> {
    pub heard: Heard<'s>,
    pub then: Then,
}

impl<'s> Verdict<'s> {
    fn new(heard: Heard<'s>, then: Then) -> Verdict<'s> {
        Verdict { heard, then }
    }

    fn nothing(then: Then) -> Verdict<'s> {
        Verdict::new(Heard::Nothing(None), then)
    }
}

/// Stale-routing codes: the cluster's own word that a shard could not check its routing.
const ROUTING: [i32; 4] = [13388, 63, 150, 249];
/// Codes a read's own `maxTimeMS` can cause (the server's ExceededTimeLimitError class).
const OWN_TIME_LIMIT: [i32; 3] = [50, 202, 262];
/// FailedToSatisfyReadPreference.
const NO_MEMBER: i32 = 133;
/// NetworkTimeout: a time limit too, not of the read's own making.
const NETWORK_TIMEOUT: i32 = 89;

/// Judges how a tracked read ended, at `now`.
pub fn judge<'s>(read: &Read<'_>, ending: Ending<'s>, now: Instant) -> Verdict<'s> {
    let unknown = || {
        if read.sample && read.rung == Rung::First {
            Verdict::new(Heard::Sample(SampleEnd::Unknown), Then::Reply)
        } else {
            Verdict::nothing(Then::Reply)
        }
    };
    match ending {
        Ending::UpstreamGone | Ending::Unreadable => unknown(),
        Ending::ClientGone if read.rung != Rung::First || read.sample => unknown(),
        Ending::ClientGone => {
            let why = if read.began.is_some() {
                SetAside::ClientGone
            } else {
                SetAside::Queued
            };
            Verdict::new(Heard::Nothing(Some(why)), Then::Reply)
        }
        Ending::Reply(status) => judge_reply(read, status, now),
    }
}

fn judge_reply<'s>(read: &Read<'_>, status: &'s ReplyStatus, now: Instant) -> Verdict<'s> {
    let policy = read.policy;
    let elapsed = now.saturating_duration_since(read.started);
    let trigger = status.code.filter(|&c| !status.ok && policy.is_trigger(c));
    if read.rung != Rung::First {
        return judge_rung(read, trigger, elapsed);
    }
    let Some(code) = trigger else {
        return judge_answer(read, now);
    };
    let failure = Failure {
        reason: Reason::of_code(code),
        evidence: Evidence::Code {
            code,
            code_name: status.code_name.as_deref(),
        },
    };
    let heard = if read.sample {
        // 133 on a pinned read is the client's own doing, even as a sample.
        if code == NO_MEMBER && read.tagged {
            Heard::Sample(SampleEnd::Unknown)
        } else {
            Heard::Sample(SampleEnd::Failed)
        }
    } else {
        evidence(read, code, failure.clone())
    };
    if let Some(b) = read.bounded {
        // The bound's own time limit, or the cluster's word: sent once more under the same
        // bound when the read's own budget has room for it, then the fail-fast error,
        // unless the read's own, shorter limit ran out (its error is its own).
        let own_limit = !b.ours && OWN_TIME_LIMIT.contains(&code);
        let then = if own_limit {
            Then::Reply
        } else {
            ladder::again(read, b, elapsed)
        };
        return Verdict::new(heard, then);
    }
    // The next rung carries what the first attempt left of the read's whole budget.
    Verdict::new(heard, ladder::after_first(read, elapsed))
}

/// What the breaker hears of trigger error `code` on a read sent while it was closed.
fn evidence<'s>(read: &Read<'_>, code: i32, failure: Failure<'s>) -> Heard<'s> {
    let floor = read.policy.evidence_floor();
    if ROUTING.contains(&code) {
        return Heard::Count(failure);
    }
    if code == NO_MEMBER {
        return if read.tagged {
            Heard::Nothing(Some(SetAside::Tagged))
        } else {
            Heard::Count(failure)
        };
    }
    if OWN_TIME_LIMIT.contains(&code) {
        // The client's own limit, below the floor: its error is its own.
        let own = (!read.limit_ours).then_some(read.max_time_ms).flatten();
        if own.is_some_and(|ms| (ms as u128) < floor.as_millis()) {
            return Heard::Nothing(Some(SetAside::ShortTimeLimit));
        }
        return Heard::Confirm(failure);
    }
    if code == NETWORK_TIMEOUT {
        return Heard::Confirm(failure);
    }
    // A code the operator added to `trigger_codes`: their word that it is the cluster's.
    Heard::Count(failure)
}

/// A reply without a trigger error: an answer, unless slower than `slow_read` (timed from
/// when mongos could start the read) and the floor, which is ambiguous like a time limit.
fn judge_answer<'s>(read: &Read<'_>, now: Instant) -> Verdict<'s> {
    if read.sample {
        return Verdict::new(Heard::Sample(SampleEnd::Answered), Then::Reply);
    }
    let began = read.began.unwrap_or(read.started);
    let elapsed = now.saturating_duration_since(began);
    match read.policy.slow_read.filter(|&limit| elapsed > limit) {
        Some(_) if elapsed < read.policy.evidence_floor() => {
            Verdict::new(Heard::Nothing(Some(SetAside::ShortWait)), Then::Reply)
        }
        Some(limit) => {
            let failure = Failure {
                reason: Reason::TimeLimit,
                evidence: Evidence::Slow { elapsed, limit },
            };
            Verdict::new(Heard::Confirm(failure), Then::Reply)
        }
        None => Verdict::nothing(Then::Reply),
    }
}

/// A rung above the first ended: nothing for the breaker (a primary's or an `available`
/// read's answer says nothing about the secondaries); what the read does next is the
/// ladder's (`ladder::after_rung`).
fn judge_rung<'s>(read: &Read<'_>, trigger: Option<i32>, elapsed: Duration) -> Verdict<'s> {
    Verdict::nothing(ladder::after_rung(read, trigger, elapsed))
}

/// What a confirming read's reply says of the time limit it was sent to confirm.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Confirmation {
    /// It failed too (a trigger error, its own short limit included): the secondary it met
    /// is stale or hung. Counted, with the reason of its code.
    Confirmed { code: i32, reason: Reason },
    /// It was answered: the first read was slow on its own account. Not counted.
    Unconfirmed,
    /// Nothing to judge (another error, e.g. no rights on the namespace; unreadable).
    Unknown,
}

/// Judges the reply to a confirming read of `policy`'s namespace.
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

impl Evidence<'_> {
    /// The `code` label of the trigger-error metric.
    pub fn label(&self) -> String {
        match self {
            Evidence::Code { code, .. } => code.to_string(),
            Evidence::Slow { .. } => "slow".to_string(),
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
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{Causal, Mode};
    use crate::rewrite::RewriteSpec;

    const STALE: i32 = 13388;
    const MAX_TIME: i32 = 50;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn status(ok: bool, code: Option<i32>, name: Option<&str>) -> ReplyStatus {
        ReplyStatus {
            ok,
            code,
            code_name: name.map(str::to_string),
        }
    }

    /// Replies live for the whole test (leaked: a few bytes per test run).
    fn err(code: i32) -> &'static ReplyStatus {
        Box::leak(Box::new(status(false, Some(code), None)))
    }

    fn ok() -> &'static ReplyStatus {
        Box::leak(Box::new(status(true, None, None)))
    }

    /// A closed strict read sent at `t0` and started at once.
    fn read(p: &NsPolicy, t0: Instant, max_time_ms: Option<i64>) -> Read<'_> {
        Read {
            policy: p,
            started: t0,
            began: Some(t0),
            max_time_ms,
            limit_ours: false,
            tagged: false,
            sample: false,
            bounded: None,
            primary: false,
            retry: false,
            rung: Rung::First,
        }
    }

    fn heard<'s>(r: &Read<'_>, e: Ending<'s>, at: Instant) -> Heard<'s> {
        judge(r, e, at).heard
    }

    fn kind(h: &Heard<'_>) -> &'static str {
        match h {
            Heard::Nothing(None) => "nothing",
            Heard::Nothing(Some(why)) => why.label(),
            Heard::Count(_) => "count",
            Heard::Confirm(_) => "confirm",
            Heard::Sample(SampleEnd::Answered) => "sample_answered",
            Heard::Sample(SampleEnd::Failed) => "sample_failed",
            Heard::Sample(SampleEnd::Unknown) => "sample_unknown",
        }
    }

    /// The evidence table: what the breaker hears of each ending of a closed read.
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
            tagged: true,
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
        let stale = err(STALE);
        let max_time = err(MAX_TIME);
        let (e63, e133, e202, e262, e89, e2) =
            (err(63), err(133), err(202), err(262), err(89), err(2));
        let answer = ok();
        let rows: Vec<(&str, Read<'_>, Ending<'_>, Duration, &str)> = vec![
            // The cluster's word about routing: counted whatever the read's limit.
            ("stale", own(1), Ending::Reply(stale), ms(2), "count"),
            ("stale 63", plain, Ending::Reply(e63), ms(2), "count"),
            // 133: counted, but never on a read pinned by tag sets.
            ("133", plain, Ending::Reply(e133), ms(2), "count"),
            ("133 tagged", tagged, Ending::Reply(e133), ms(2), "tagged"),
            // The read's own limit below the floor: its own error (the ExceededTimeLimit
            // class: 50, 202, 262).
            (
                "50 own 1ms",
                own(1),
                Ending::Reply(max_time),
                ms(2),
                "short_time_limit",
            ),
            (
                "202 own 1ms",
                own(1),
                Ending::Reply(e202),
                ms(2),
                "short_time_limit",
            ),
            (
                "262 own 999ms",
                own(999),
                Ending::Reply(e262),
                ms(999),
                "short_time_limit",
            ),
            // At or above the floor, or no limit of its own: ambiguous, confirmed first.
            (
                "50 own 1s",
                own(1000),
                Ending::Reply(max_time),
                ms(1000),
                "confirm",
            ),
            (
                "50 no limit",
                plain,
                Ending::Reply(max_time),
                ms(2),
                "confirm",
            ),
            ("89", plain, Ending::Reply(e89), ms(2), "confirm"),
            // Under a limit staleguard set: never counted by itself, confirmed.
            (
                "50 ours 500ms",
                ours(500),
                Ending::Reply(max_time),
                ms(500),
                "confirm",
            ),
            (
                "50 ours 1ms",
                ours(1),
                Ending::Reply(max_time),
                ms(1),
                "confirm",
            ),
            // A client that closes is never evidence; before mongos started it, queued.
            ("gone", plain, Ending::ClientGone, ms(5_000), "client_gone"),
            (
                "gone queued",
                queued,
                Ending::ClientGone,
                ms(5_000),
                "queued",
            ),
            // Slow: timed from when mongos could start the read.
            ("slow", plain, Ending::Reply(answer), ms(1_500), "confirm"),
            (
                "slow in floor",
                plain,
                Ending::Reply(answer),
                ms(500),
                "short_wait",
            ),
            (
                "slow queued",
                late,
                Ending::Reply(answer),
                ms(5_100),
                "nothing",
            ),
            ("fast", plain, Ending::Reply(answer), ms(5), "nothing"),
            // Not a trigger code: nothing.
            ("other error", plain, Ending::Reply(e2), ms(5), "nothing"),
            (
                "upstream gone",
                plain,
                Ending::UpstreamGone,
                ms(5),
                "nothing",
            ),
            ("unreadable", plain, Ending::Unreadable, ms(5), "nothing"),
        ];
        for (name, r, e, after, want) in rows {
            assert_eq!(kind(&heard(&r, e, t0 + after)), want, "{name}");
        }
    }

    #[test]
    fn samples_report_to_the_breaker_only_as_samples() {
        let p = NsPolicy::with_defaults("pay.transactions", Mode::Strict);
        let t0 = Instant::now();
        let sample = Read {
            sample: true,
            ..read(&p, t0, None)
        };
        let tagged = Read {
            tagged: true,
            ..sample
        };
        let (answer, stale, max_time, e133) = (ok(), err(STALE), err(MAX_TIME), err(133));
        let cases: Vec<(Read<'_>, Ending<'_>, &str)> = vec![
            (sample, Ending::Reply(answer), "sample_answered"),
            (sample, Ending::Reply(stale), "sample_failed"),
            (sample, Ending::Reply(max_time), "sample_failed"),
            (tagged, Ending::Reply(e133), "sample_unknown"),
            (sample, Ending::ClientGone, "sample_unknown"),
            (sample, Ending::UpstreamGone, "sample_unknown"),
            (sample, Ending::Unreadable, "sample_unknown"),
        ];
        for (r, e, want) in cases {
            assert_eq!(kind(&heard(&r, e, t0 + ms(3))), want, "{e:?}");
        }
    }

    #[test]
    fn a_bounded_read_that_fails_is_sent_once_more_then_fails_fast() {
        let p = NsPolicy::with_defaults("pay.transactions", Mode::Strict);
        let bound = p.open_time_limit.as_millis() as u64;
        let t0 = Instant::now();
        let b = Bounded {
            reason: Reason::TimeLimit,
            errors: 3,
            ours: true,
        };
        let bounded = |budget: Option<i64>| Read {
            sample: true,
            bounded: Some(b),
            limit_ours: true,
            ..read(&p, t0, budget)
        };
        let again = Then::Climb {
            to: Rung::Again,
            spec: RewriteSpec {
                max_time_ms: Some(bound as i64),
                ..RewriteSpec::default()
            },
            or_else: None,
        };
        let second = |budget: Option<i64>| Read {
            rung: Rung::Again,
            sample: false,
            ..bounded(budget)
        };
        let own = Read {
            bounded: Some(Bounded { ours: false, ..b }),
            limit_ours: false,
            ..bounded(Some(100))
        };
        // (read, ending, at, then, heard)
        let cases: Vec<(&str, Read<'_>, &ReplyStatus, u64, Then, &str)> = vec![
            // The first attempt ran out of the bound, or met the cluster's word: once more
            // under the same bound, while the budget has a whole bound left (or none is set).
            (
                "time limit, room",
                bounded(Some(1000)),
                err(MAX_TIME),
                bound,
                again.clone(),
                "sample_failed",
            ),
            (
                "stale, room",
                bounded(Some(1000)),
                err(STALE),
                20,
                again.clone(),
                "sample_failed",
            ),
            (
                "no budget",
                bounded(None),
                err(MAX_TIME),
                bound,
                again.clone(),
                "sample_failed",
            ),
            // No room for a whole bound after the first: the fail-fast error.
            (
                "no room",
                bounded(Some(bound as i64 + 100)),
                err(MAX_TIME),
                bound,
                Then::FailFast(b),
                "sample_failed",
            ),
            // Answered within the bound: the answer goes to the client.
            (
                "answered",
                bounded(Some(1000)),
                ok(),
                20,
                Then::Reply,
                "sample_answered",
            ),
            // The read's own limit was the shorter one: its own error, as mongos sent it.
            (
                "own limit",
                own,
                err(MAX_TIME),
                100,
                Then::Reply,
                "sample_failed",
            ),
            // The second attempt: its failure is the fail-fast error, its answer the client's;
            // neither is a sample (the first attempt was).
            (
                "again fails",
                second(Some(1000)),
                err(MAX_TIME),
                2 * bound,
                Then::FailFast(b),
                "nothing",
            ),
            (
                "again stale",
                second(Some(1000)),
                err(STALE),
                bound + 5,
                Then::FailFast(b),
                "nothing",
            ),
            (
                "again answered",
                second(Some(1000)),
                ok(),
                bound + 5,
                Then::Reply,
                "nothing",
            ),
        ];
        for (name, r, status, at, then, heard) in cases {
            let v = judge(&r, Ending::Reply(status), t0 + ms(at));
            assert_eq!(v.then, then, "{name}");
            assert_eq!(kind(&v.heard), heard, "{name}");
        }
    }

    #[test]
    fn ladder_rungs() {
        let mut p = NsPolicy::with_defaults("demo.inventory", Mode::Fallback);
        p.primary_rung = true;
        let t0 = Instant::now();
        let first = Read {
            primary: true,
            retry: true,
            limit_ours: true,
            ..read(&p, t0, Some(1000))
        };
        // A trigger error on the first attempt climbs to the primary with a share of what
        // is left, `available` after it; the stale error is counted at once.
        let v = judge(&first, Ending::Reply(err(STALE)), t0 + ms(200));
        assert_eq!(kind(&v.heard), "count");
        match v.then {
            Then::Climb { to, spec, or_else } => {
                assert_eq!(to, Rung::Primary);
                assert!(spec.primary && !spec.available);
                assert_eq!(spec.max_time_ms, Some(400));
                assert_eq!(or_else.expect("available after").max_time_ms, Some(800));
            }
            other => panic!("{other:?}"),
        }
        // The primary failing climbs on to `available` with the rest; heard nothing.
        let on_primary = Read {
            rung: Rung::Primary,
            primary: false,
            ..first
        };
        let v = judge(&on_primary, Ending::Reply(err(MAX_TIME)), t0 + ms(600));
        assert_eq!(kind(&v.heard), "nothing");
        assert!(matches!(
            v.then,
            Then::Climb { to: Rung::Available, spec, .. } if spec.available && spec.max_time_ms == Some(400)
        ));
        // Past the budget: no time for the next rung.
        let v = judge(&on_primary, Ending::Reply(err(MAX_TIME)), t0 + ms(1000));
        assert_eq!(v.then, Then::NoTime(Rung::Available));
        let v = judge(&first, Ending::Reply(err(STALE)), t0 + ms(1000));
        assert_eq!(v.then, Then::NoTime(Rung::Primary));
        // The last rung's answer goes to the client; heard nothing.
        let last = Read {
            rung: Rung::Available,
            primary: false,
            retry: false,
            ..first
        };
        let v = judge(&last, Ending::Reply(err(STALE)), t0 + ms(900));
        assert_eq!(v, Verdict::nothing(Then::Reply));
        // A strict read without rungs: its error goes to the client.
        let strict = NsPolicy::with_defaults("pay.transactions", Mode::Strict);
        let v = judge(&read(&strict, t0, None), Ending::Reply(err(STALE)), t0);
        assert_eq!(v.then, Then::Reply);
        // Fallback, no primary rung: a confirmed-later time limit still climbs at once.
        let fallback = NsPolicy::with_defaults("demo.inventory", Mode::Fallback);
        let r = Read {
            retry: true,
            limit_ours: true,
            ..read(&fallback, t0, None)
        };
        let v = judge(&r, Ending::Reply(err(MAX_TIME)), t0 + ms(500));
        assert_eq!(kind(&v.heard), "confirm");
        assert!(matches!(
            v.then,
            Then::Climb { to: Rung::Available, spec, or_else: None } if spec.available && spec.max_time_ms.is_none()
        ));
    }

    #[test]
    fn causal_skip_keeps_after_cluster_time_on_resend() {
        let mut p = NsPolicy::with_defaults("demo.inventory", Mode::Fallback);
        p.causal = Causal::Skip;
        let t0 = Instant::now();
        let r = Read {
            retry: true,
            ..read(&p, t0, None)
        };
        match judge(&r, Ending::Reply(err(STALE)), t0).then {
            Then::Climb { spec, .. } => assert!(!spec.drop_after_cluster_time),
            other => panic!("{other:?}"),
        }
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
        let slow = Evidence::Slow {
            elapsed: ms(1500),
            limit: ms(200),
        };
        assert_eq!(slow.to_string(), "slow reply (1500 ms > 200 ms)");
        assert_eq!(slow.label(), "slow");
    }
}
