//! The reply side's judgement: what the way a followed read ended says about the cluster
//! (`evidence::word`, the one rule), and what happens next to the read: its reply goes to
//! the client, is replaced by the fail-fast error, the cluster is asked first, or the read
//! climbs to the next rung (the ladder's move, `ladder`). Pure, like `policy::decide` on the
//! request side: the read, how it ended and the time in, a [`Verdict`] out; no I/O, no
//! shared state. The session only carries verdicts out.
//!
//! A read admitted while the breaker is open is a *sample*: the breaker takes what the
//! cluster said through it as a sample, never as an opening (it is open already); that is
//! the breaker's business (`breaker::Breakers::hear`), from the same word.

use tokio::time::Instant;

use super::attempt::{Read, Rung};
use super::evidence::{self, Ending, Word, OWN_TIME_LIMIT};
use super::ladder::{self, Then};

/// What to do about a followed read that ended.
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict<'s> {
    /// What its ending says about the cluster.
    pub word: Word<'s>,
    pub then: Then,
    /// The trigger code the attempt met, if any (the fail-fast text names what each attempt
    /// under an open breaker's bound met).
    pub met: Option<i32>,
}

/// Judges how a followed read ended, at `now`.
pub fn judge<'s>(read: &Read<'_>, ending: Ending<'s>, now: Instant) -> Verdict<'s> {
    let word = evidence::word(read, ending, now);
    let (then, met) = match ending {
        Ending::Reply(status) => {
            let met = status
                .code
                .filter(|&c| !status.ok && read.policy.is_trigger(c));
            (next(read, met, now), met)
        }
        // Nothing came back in time: the client gets staleguard's own answer, and nothing
        // is sent again on a connection mongos is not answering.
        Ending::Silent => (Then::Silent, None),
        Ending::ClientGone | Ending::UpstreamGone | Ending::Unreadable => (Then::Reply, None),
    };
    Verdict { word, then, met }
}

/// The read's next step after its reply, which met `trigger` (a trigger code) or not.
fn next(read: &Read<'_>, trigger: Option<i32>, now: Instant) -> Then {
    let elapsed = now.saturating_duration_since(read.started);
    if read.rung != Rung::First {
        return ladder::after_rung(read, trigger, elapsed);
    }
    let Some(code) = trigger else {
        return Then::Reply;
    };
    if let Some(b) = read.bounded {
        // The bound's own time limit, or the cluster's word: sent once more under the same
        // bound when the read's own budget has room for it, then the fail-fast error,
        // unless the read's own, shorter limit ran out (its error is its own).
        let own_limit = !b.ours && OWN_TIME_LIMIT.contains(&code);
        return if own_limit {
            Then::Reply
        } else {
            ladder::again(read, b, elapsed)
        };
    }
    // A limit staleguard set cut the read before a rung that would relax it or send it to
    // the primary: a question, not an answer. The cluster is asked first, unless the read
    // is a sample of an open breaker, whose opening was the cluster's word already (the
    // question then only says what the sample met).
    let question = !read.asked && !read.sample && (read.primary || read.retry);
    if question && evidence::own_limit_cut(read, code) {
        return Then::Confirm;
    }
    // The next rung carries what the first attempt left of the read's whole budget.
    ladder::after_first(read, elapsed)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::policy::{after_confirm, Bounded, Causal, Members, Mode, NsPolicy, Reason};
    use crate::rewrite::RewriteSpec;
    use crate::wire::ReplyStatus;

    const STALE: i32 = 13388;
    const MAX_TIME: i32 = 50;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn err(code: i32) -> ReplyStatus {
        ReplyStatus {
            ok: false,
            code: Some(code),
            code_name: None,
        }
    }

    fn ok() -> ReplyStatus {
        ReplyStatus {
            ok: true,
            code: None,
            code_name: None,
        }
    }

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

    fn then(r: &Read<'_>, s: &ReplyStatus, at: Instant) -> Then {
        judge(r, Ending::Reply(s), at).then
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
        let cases: Vec<(&str, Read<'_>, ReplyStatus, u64, Then)> = vec![
            // The bound ran out, or the cluster's word: once more under the same bound,
            // while the budget has a whole bound left (or none is set).
            (
                "time limit, room",
                bounded(Some(1000)),
                err(MAX_TIME),
                bound,
                again.clone(),
            ),
            (
                "stale, room",
                bounded(Some(1000)),
                err(STALE),
                20,
                again.clone(),
            ),
            (
                "no budget",
                bounded(None),
                err(MAX_TIME),
                bound,
                again.clone(),
            ),
            // No room for a whole bound after the first: the fail-fast error.
            (
                "no room",
                bounded(Some(bound as i64 + 100)),
                err(MAX_TIME),
                bound,
                Then::FailFast(b),
            ),
            ("answered", bounded(Some(1000)), ok(), 20, Then::Reply),
            // The read's own limit was the shorter one: its own error, as mongos sent it.
            ("own limit", own, err(MAX_TIME), 100, Then::Reply),
            // The second attempt: its failure is the fail-fast error, its answer the client's.
            (
                "again fails",
                second(Some(1000)),
                err(MAX_TIME),
                2 * bound,
                Then::FailFast(b),
            ),
            (
                "again stale",
                second(Some(1000)),
                err(STALE),
                bound + 5,
                Then::FailFast(b),
            ),
            (
                "again answered",
                second(Some(1000)),
                ok(),
                bound + 5,
                Then::Reply,
            ),
        ];
        for (name, r, status, at, want) in cases {
            let v = judge(&r, Ending::Reply(&status), t0 + ms(at));
            assert_eq!(v.then, want, "{name}");
            let met = status.code.filter(|_| !status.ok);
            assert_eq!(v.met, met, "{name}");
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
        // is left, `available` after it; the stale error is a failure.
        let stale = err(STALE);
        let v = judge(&first, Ending::Reply(&stale), t0 + ms(200));
        assert!(matches!(v.word, Word::Failed(_)));
        match v.then {
            Then::Climb { to, spec, or_else } => {
                assert_eq!(to, Rung::Primary);
                assert!(spec.primary && !spec.available);
                assert_eq!(spec.max_time_ms, Some(400));
                assert_eq!(or_else.expect("available after").max_time_ms, Some(800));
            }
            other => panic!("{other:?}"),
        }
        // The primary failing climbs on to `available` with the rest; neutral.
        let on_primary = Read {
            rung: Rung::Primary,
            primary: false,
            ..first
        };
        let max_time = err(MAX_TIME);
        let v = judge(&on_primary, Ending::Reply(&max_time), t0 + ms(600));
        assert_eq!(v.word, Word::Neutral(None));
        assert!(matches!(
            v.then,
            Then::Climb { to: Rung::Available, spec, .. } if spec.available && spec.max_time_ms == Some(400)
        ));
        // Past the budget: no time for the next rung.
        assert_eq!(
            then(&on_primary, &err(MAX_TIME), t0 + ms(1000)),
            Then::NoTime(Rung::Available)
        );
        assert_eq!(
            then(&first, &err(STALE), t0 + ms(1000)),
            Then::NoTime(Rung::Primary)
        );
        // The last rung's answer goes to the client.
        let last = Read {
            rung: Rung::Available,
            primary: false,
            retry: false,
            ..first
        };
        assert_eq!(then(&last, &err(STALE), t0 + ms(900)), Then::Reply);
        // A strict read without rungs: its error goes to the client.
        let strict = NsPolicy::with_defaults("pay.transactions", Mode::Strict);
        assert_eq!(then(&read(&strict, t0, None), &err(STALE), t0), Then::Reply);
    }

    /// staleguard's own limit cutting a read before a rung is a question: the cluster is
    /// asked before anything is relaxed or sent to the primary; its answer decides.
    #[test]
    fn an_own_limit_cut_asks_before_it_climbs() {
        let fallback = NsPolicy::with_defaults("demo.inventory", Mode::Fallback);
        let t0 = Instant::now();
        let cut = Read {
            retry: true,
            limit_ours: true,
            ..read(&fallback, t0, Some(3000))
        };
        let max_time = err(MAX_TIME);
        let v = judge(&cut, Ending::Reply(&max_time), t0 + ms(500));
        assert!(matches!(v.word, Word::Ask(_)));
        assert_eq!(v.then, Then::Confirm);
        // The cluster confirmed (the cheap read failed too): available with what is left.
        assert!(matches!(
            after_confirm(&cut, true, ms(800)),
            Then::Climb { to: Rung::Available, spec, .. } if spec.available && spec.max_time_ms == Some(2200)
        ));
        // It answered: the read goes again as the client sent it, with what is left.
        assert_eq!(
            after_confirm(&cut, false, ms(800)),
            Then::Climb {
                to: Rung::First,
                spec: RewriteSpec {
                    max_time_ms: Some(2200),
                    ..RewriteSpec::default()
                },
                or_else: None,
            }
        );
        // Without a budget: as it came, no limit.
        let unlimited = Read {
            max_time_ms: None,
            ..cut
        };
        assert_eq!(
            after_confirm(&unlimited, false, ms(800)),
            Then::Climb {
                to: Rung::First,
                spec: RewriteSpec::default(),
                or_else: None,
            }
        );
        assert_eq!(
            after_confirm(&cut, false, ms(3000)),
            Then::NoTime(Rung::First)
        );
        // A stale error is the cluster's word: no question, the rung at once.
        assert!(matches!(
            then(&cut, &err(STALE), t0 + ms(20)),
            Then::Climb {
                to: Rung::Available,
                ..
            }
        ));
        // A probe of an open breaker climbs at once: the opening was the cluster's word.
        let probe = Read {
            sample: true,
            ..cut
        };
        assert!(matches!(
            then(&probe, &err(MAX_TIME), t0 + ms(500)),
            Then::Climb {
                to: Rung::Available,
                ..
            }
        ));
        // The unchanged resend is not asked about again.
        let asked = Read { asked: true, ..cut };
        assert!(matches!(
            then(&asked, &err(MAX_TIME), t0 + ms(2000)),
            Then::Climb {
                to: Rung::Available,
                ..
            }
        ));
        // Strict with the primary rung: the same question before the primary.
        let mut strict = NsPolicy::with_defaults("pay.transactions", Mode::Strict);
        strict.primary_rung = true;
        let r = Read {
            primary: true,
            limit_ours: true,
            ..read(&strict, t0, None)
        };
        assert_eq!(then(&r, &err(MAX_TIME), t0 + ms(500)), Then::Confirm);
        // The client's own limit (no rung ahead to climb to): its error, no question.
        let own = read(&strict, t0, Some(2000));
        assert_eq!(then(&own, &err(MAX_TIME), t0 + ms(2000)), Then::Reply);
    }

    #[test]
    fn silence_is_answered_by_the_proxy_and_a_relayed_reply_stands() {
        let p = NsPolicy::with_defaults("pay.transactions", Mode::Strict);
        let t0 = Instant::now();
        let v = judge(&read(&p, t0, Some(1000)), Ending::Silent, t0 + ms(1300));
        assert_eq!((v.then, v.met), (Then::Silent, None));
        let climb = Then::Climb {
            to: Rung::Available,
            spec: RewriteSpec::default(),
            or_else: None,
        };
        assert_eq!(climb.relayed(), Then::Reply);
        assert_eq!(Then::Confirm.relayed(), Then::Reply);
        assert_eq!(
            Then::NoTime(Rung::Primary).relayed(),
            Then::NoTime(Rung::Primary)
        );
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
        match then(&r, &err(STALE), t0) {
            Then::Climb { spec, .. } => assert!(!spec.drop_after_cluster_time),
            other => panic!("{other:?}"),
        }
    }
}
