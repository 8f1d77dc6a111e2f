//! The read's state machine: the attempt a followed read is on (its rung, the rungs still
//! ahead of it, its budget), and every move it makes from one attempt to the next.
//!
//! ```text
//!   decide ─ Decision ─▶ Decision::attempt ─▶ Attempt (first, primary or available)
//!                        Decision::refused     the primary's guard said no: the rung after
//!   judge  ─ Then ─────▶ Then::Climb           the next rung, with what the budget leaves
//!                        Then::refused         the primary's guard said no: available, or
//!                                              the reply as it came
//!                        Attempt::climbed      the attempt the resend is followed as
//! ```
//!
//! Pure: values in, values out, no clock read, no I/O. The session claims the guard's slot
//! (shared state), sends, and keeps the `Attempt` these functions return; it works nothing
//! out itself.

use std::time::Duration;

use super::attempt::{Attempt, Read, Rung};
use super::budget::{next_rung_ms, primary_rung_ms, Remaining};
use super::decide::{AfterPrimary, Bounded, Decision};
use super::table::Causal;
use crate::rewrite::RewriteSpec;

impl Decision<'_> {
    /// The attempt a decision sends its read as, when it follows the read (`None`: it is
    /// forwarded unfollowed, or answered by the proxy). Its edit is `rewrite_spec`.
    pub fn attempt(&self) -> Option<Attempt> {
        match *self {
            Decision::Track {
                cap_ms,
                budget_ms,
                probe,
                retry,
                primary,
                bounded,
            } => Some(Attempt {
                rung: Rung::First,
                primary,
                retry,
                sample: probe,
                bounded,
                limit_ours: cap_ms.is_some(),
                budget_ms,
                asked: false,
            }),
            // Sent to `available` at once: nothing after it, no budget to carry.
            Decision::Rewrite { cap_ms, .. } => {
                Some(Attempt::last(Rung::Available, None, cap_ms.is_some()))
            }
            Decision::Primary {
                cap_ms,
                budget_ms,
                then,
            } => Some(Attempt {
                retry: matches!(then, AfterPrimary::Available { .. }),
                ..Attempt::last(Rung::Primary, budget_ms, cap_ms.is_some())
            }),
            Decision::Forward | Decision::FailFast { .. } | Decision::Refuse(_) => None,
        }
    }

    /// What a decision becomes when its primary rung cannot go (the upstream's ladder guard
    /// refused it, or its rewrite failed): the rung decided for after it. Any other decision
    /// is its own.
    pub fn refused(self) -> Self {
        match self {
            Decision::Primary { then, .. } => match then {
                AfterPrimary::Available {
                    drop_after_cluster_time,
                    cap_ms,
                } => Decision::Rewrite {
                    drop_after_cluster_time,
                    cap_ms,
                },
                AfterPrimary::FailFast {
                    reason,
                    probe_in,
                    errors,
                } => Decision::FailFast {
                    reason,
                    probe_in,
                    errors,
                },
            },
            other => other,
        }
    }
}

/// What happens to a tracked read after its reply (or its end without one).
#[derive(Debug, Clone, PartialEq)]
pub enum Then {
    /// Its reply (if any) goes to the client as it came.
    Reply,
    /// Its reply is replaced by the fail-fast error: a read sent under an open breaker's
    /// bound ran out of it (or met a trigger error).
    FailFast(Bounded),
    /// It climbs to rung `to`, sent again rewritten by `spec`; the client never sees this
    /// reply. `or_else`: when `to` is the primary and its guard refuses the read, the
    /// `available` resend to send instead (`None`: the reply goes to the client). The
    /// resend is followed as [`Attempt::climbed`].
    Climb {
        to: Rung,
        spec: RewriteSpec,
        or_else: Option<RewriteSpec>,
    },
    /// Rung `0` was due, but the read's budget is spent: the reply goes to the client.
    NoTime(Rung),
    /// A limit staleguard set cut the first attempt before a rung: the cluster is asked
    /// (a cheap read of the namespace) before the read climbs; [`after_confirm`] says what
    /// the answer leads to. The client never sees this reply.
    Confirm,
    /// mongos stayed silent past the attempt's limit: the client gets staleguard's own
    /// MaxTimeMSExpired, and the late reply is dropped when it comes.
    Silent,
}

impl Then {
    /// What a climb to the primary becomes when the upstream's ladder guard refuses it: the
    /// `available` resend when that rung is ahead, else the reply as it came. Anything else
    /// is its own.
    pub fn refused(self) -> Then {
        match self {
            Then::Climb {
                to: Rung::Primary,
                or_else,
                ..
            } => match or_else {
                Some(spec) => Then::Climb {
                    to: Rung::Available,
                    spec,
                    or_else: None,
                },
                None => Then::Reply,
            },
            other => other,
        }
    }

    /// The same verdict for a reply that already went to the client (a large one, relayed
    /// in pieces as it came): nothing can replace it or follow it any more, so every step
    /// but a rung already out of time is the reply as it came.
    pub fn relayed(self) -> Then {
        match self {
            Then::NoTime(rung) => Then::NoTime(rung),
            _ => Then::Reply,
        }
    }
}

/// What the cluster's answer to the question [`Then::Confirm`] raised leads to, `elapsed`
/// into the read's budget: confirmed (the cheap read failed too), the rung ahead as a trigger
/// error would lead; otherwise the read is sent again as the client sent it, with what is
/// left of its budget (never relaxed, never to the primary, without evidence).
pub fn after_confirm(read: &Read<'_>, confirmed: bool, elapsed: Duration) -> Then {
    if confirmed {
        return after_first(read, elapsed);
    }
    match next_rung_ms(read.max_time_ms, elapsed) {
        Remaining::Spent => Then::NoTime(Rung::First),
        left => Then::Climb {
            to: Rung::First,
            spec: RewriteSpec {
                max_time_ms: left.ms(),
                ..RewriteSpec::default()
            },
            or_else: None,
        },
    }
}

/// The first attempt met a trigger error (and no bound answers it): the next rung ahead,
/// with what the first attempt left of the read's budget (`elapsed` of it spent).
pub(super) fn after_first(read: &Read<'_>, elapsed: Duration) -> Then {
    let next = match (read.primary, read.retry) {
        (true, _) => Rung::Primary,
        (false, true) => Rung::Available,
        (false, false) => return Then::Reply,
    };
    match next_rung_ms(read.max_time_ms, elapsed) {
        Remaining::Spent => Then::NoTime(next),
        left => climb(read, next, left.ms()),
    }
}

/// A rung above the first ended (`trigger`: with a trigger error): the primary rung's
/// trigger error climbs on to `available` when that rung is ahead; anything else, the reply.
pub(super) fn after_rung(read: &Read<'_>, trigger: Option<i32>, elapsed: Duration) -> Then {
    if read.rung == Rung::Again {
        // The second attempt under the bound: its failure is the fail-fast error.
        return match (trigger, read.bounded) {
            (Some(_), Some(b)) => Then::FailFast(b),
            _ => Then::Reply,
        };
    }
    if read.rung != Rung::Primary || !read.retry || trigger.is_none() {
        return Then::Reply;
    }
    match next_rung_ms(read.max_time_ms, elapsed) {
        Remaining::Spent => Then::NoTime(Rung::Available),
        left => climb(read, Rung::Available, left.ms()),
    }
}

/// A bounded first attempt failed: send it once more under the same bound when the read's
/// own budget has room for a whole bound after what the first attempt spent (or it has no
/// budget), otherwise the fail-fast error. Each attempt's secondary is mongos's choice, so
/// with one stale secondary beside a healthy one most reads that met the stale one are
/// answered by the second attempt; a read that meets only stale ones still fails within two
/// bounds.
pub(super) fn again(read: &Read<'_>, b: Bounded, elapsed: Duration) -> Then {
    let bound = read
        .policy
        .open_time_limit
        .as_millis()
        .clamp(1, i32::MAX as u128) as i64;
    let room = match next_rung_ms(read.max_time_ms, elapsed) {
        Remaining::Unbounded => true,
        Remaining::Ms(left) => left >= bound,
        Remaining::Spent => false,
    };
    if !b.ours || !room {
        return Then::FailFast(b);
    }
    Then::Climb {
        to: Rung::Again,
        spec: RewriteSpec {
            max_time_ms: Some(bound),
            ..RewriteSpec::default()
        },
        or_else: None,
    }
}

/// The resend to rung `to` with `remaining` of the budget: the primary gets a share of it
/// when `available` follows (the guard's refusal sends `available` at once instead), the
/// last rung all of it.
fn climb(read: &Read<'_>, to: Rung, remaining: Option<i64>) -> Then {
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
            Then::Climb {
                to,
                spec: RewriteSpec {
                    primary: true,
                    max_time_ms,
                    ..RewriteSpec::default()
                },
                or_else: read.retry.then_some(available),
            }
        }
        _ => Then::Climb {
            to: Rung::Available,
            spec: available,
            or_else: None,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{judge, Ending, Members, Mode, NsPolicy, Reason};
    use crate::wire::ReplyStatus;
    use tokio::time::Instant;

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

    const FIRST: Attempt = Attempt {
        rung: Rung::First,
        primary: false,
        retry: false,
        sample: false,
        bounded: None,
        limit_ours: false,
        budget_ms: None,
        asked: false,
    };

    const BOUND: Bounded = Bounded {
        reason: Reason::StaleRouting,
        errors: 3,
        ours: true,
    };

    fn fail_fast() -> AfterPrimary {
        AfterPrimary::FailFast {
            reason: Reason::StaleRouting,
            probe_in: ms(5_000),
            errors: 3,
        }
    }

    /// The attempt each decision sends its read as.
    #[test]
    fn first_attempt_table() {
        let track = |cap_ms, budget_ms, probe, retry, primary, bounded| Decision::Track {
            cap_ms,
            budget_ms,
            probe,
            retry,
            primary,
            bounded,
        };
        let available = Decision::Rewrite {
            drop_after_cluster_time: true,
            cap_ms: Some(300),
        };
        let primary = |then| Decision::Primary {
            cap_ms: Some(500),
            budget_ms: Some(1000),
            then,
        };
        let then_available = AfterPrimary::Available {
            drop_after_cluster_time: true,
            cap_ms: None,
        };
        let rows: Vec<(&str, Decision, Option<Attempt>)> = vec![
            ("forward", Decision::Forward, None),
            (
                "fail fast",
                Decision::FailFast {
                    reason: Reason::StaleRouting,
                    probe_in: ms(1),
                    errors: 1,
                },
                None,
            ),
            (
                "track, client's own limit",
                track(None, Some(1000), false, false, false, None),
                Some(Attempt {
                    budget_ms: Some(1000),
                    ..FIRST
                }),
            ),
            (
                "track, both rungs ahead, a share of the budget",
                track(Some(500), Some(1000), false, true, true, None),
                Some(Attempt {
                    primary: true,
                    retry: true,
                    limit_ours: true,
                    budget_ms: Some(1000),
                    ..FIRST
                }),
            ),
            (
                "probe",
                track(None, None, true, true, false, None),
                Some(Attempt {
                    retry: true,
                    sample: true,
                    ..FIRST
                }),
            ),
            (
                "bounded",
                track(Some(250), Some(1000), true, false, false, Some(BOUND)),
                Some(Attempt {
                    sample: true,
                    bounded: Some(BOUND),
                    limit_ours: true,
                    budget_ms: Some(1000),
                    ..FIRST
                }),
            ),
            (
                "available at once: nothing after it",
                available,
                Some(Attempt {
                    rung: Rung::Available,
                    limit_ours: true,
                    ..FIRST
                }),
            ),
            (
                "primary, then available",
                primary(then_available),
                Some(Attempt {
                    rung: Rung::Primary,
                    retry: true,
                    limit_ours: true,
                    budget_ms: Some(1000),
                    ..FIRST
                }),
            ),
            (
                "primary, then the fail-fast error",
                primary(fail_fast()),
                Some(Attempt {
                    rung: Rung::Primary,
                    limit_ours: true,
                    budget_ms: Some(1000),
                    ..FIRST
                }),
            ),
        ];
        for (name, decision, want) in rows {
            assert_eq!(decision.attempt(), want, "{name}");
        }
        // An edit that could not be made: the bytes that arrived, no limit of ours.
        let capped = track(Some(500), Some(1000), false, true, true, None);
        let sent = capped.attempt().expect("followed").unedited();
        assert!(!sent.limit_ours && sent.primary && sent.retry);
    }

    /// The primary's guard refusing the rung (or its rewrite failing), on either side.
    #[test]
    fn guard_refusal_table() {
        let primary = |then| Decision::Primary {
            cap_ms: Some(500),
            budget_ms: Some(1000),
            then,
        };
        let then_available = AfterPrimary::Available {
            drop_after_cluster_time: true,
            cap_ms: Some(800),
        };
        let rows: Vec<(&str, Decision, Decision)> = vec![
            (
                "fallback: available at once, capped",
                primary(then_available),
                Decision::Rewrite {
                    drop_after_cluster_time: true,
                    cap_ms: Some(800),
                },
            ),
            (
                "strict: the fail-fast error",
                primary(fail_fast()),
                Decision::FailFast {
                    reason: Reason::StaleRouting,
                    probe_in: ms(5_000),
                    errors: 3,
                },
            ),
            ("no primary rung", Decision::Forward, Decision::Forward),
        ];
        for (name, decision, want) in rows {
            assert_eq!(decision.refused(), want, "{name}");
        }
        let spec = |ms| RewriteSpec {
            available: true,
            drop_after_cluster_time: true,
            max_time_ms: Some(ms),
            primary: false,
        };
        let to_primary = |or_else| Then::Climb {
            to: Rung::Primary,
            spec: RewriteSpec {
                primary: true,
                max_time_ms: Some(400),
                ..RewriteSpec::default()
            },
            or_else,
        };
        let to_available = Then::Climb {
            to: Rung::Available,
            spec: spec(800),
            or_else: None,
        };
        let rows: Vec<(&str, Then, Then)> = vec![
            (
                "available ahead: sent there instead, with the rest of the budget",
                to_primary(Some(spec(800))),
                to_available.clone(),
            ),
            ("nothing ahead: the reply", to_primary(None), Then::Reply),
            (
                "available needs no slot",
                to_available.clone(),
                to_available,
            ),
            ("reply", Then::Reply, Then::Reply),
            (
                "no time",
                Then::NoTime(Rung::Primary),
                Then::NoTime(Rung::Primary),
            ),
        ];
        for (name, then, want) in rows {
            assert_eq!(then.refused(), want, "{name}");
        }
    }

    /// The attempt a resend is followed as.
    #[test]
    fn climbed_table() {
        let to_primary = RewriteSpec {
            primary: true,
            max_time_ms: Some(400),
            ..RewriteSpec::default()
        };
        let unbounded = RewriteSpec {
            available: true,
            ..RewriteSpec::default()
        };
        let both = Attempt {
            primary: true,
            retry: true,
            limit_ours: true,
            budget_ms: Some(1000),
            ..FIRST
        };
        let sample = Attempt {
            retry: true,
            sample: true,
            bounded: Some(BOUND),
            ..FIRST
        };
        let on_primary = Attempt {
            rung: Rung::Primary,
            retry: true,
            limit_ours: true,
            budget_ms: Some(1000),
            ..FIRST
        };
        let rows: Vec<(&str, Attempt, Rung, RewriteSpec, Attempt)> = vec![
            (
                "first to primary: available still ahead",
                both,
                Rung::Primary,
                to_primary,
                on_primary,
            ),
            (
                "first to available (the guard refused): nothing ahead",
                both,
                Rung::Available,
                unbounded,
                Attempt {
                    rung: Rung::Available,
                    budget_ms: Some(1000),
                    ..FIRST
                },
            ),
            (
                "a sample's resend is no sample, never bounded",
                sample,
                Rung::Available,
                unbounded,
                Attempt {
                    rung: Rung::Available,
                    ..FIRST
                },
            ),
            (
                "primary to available",
                on_primary,
                Rung::Available,
                RewriteSpec {
                    max_time_ms: Some(600),
                    ..unbounded
                },
                Attempt {
                    rung: Rung::Available,
                    limit_ours: true,
                    budget_ms: Some(1000),
                    ..FIRST
                },
            ),
        ];
        for (name, from, to, spec, want) in rows {
            assert_eq!(from.climbed(to, &spec), want, "{name}");
        }
    }

    /// One fallback read with the primary rung, walked through its ladder: decided, judged,
    /// climbed, refused, until its reply goes to the client.
    #[test]
    fn a_read_walks_its_ladder() {
        let mut p = NsPolicy::with_defaults("demo.inventory", Mode::Fallback);
        p.primary_rung = true;
        let t0 = Instant::now();
        let (stale, max_time) = (err(13388), err(50));
        let decided = Decision::Track {
            cap_ms: Some(500),
            budget_ms: Some(1000),
            probe: false,
            retry: true,
            primary: true,
            bounded: None,
        };
        let first = decided.attempt().expect("followed");
        // Stale at 200 ms: to the primary with a share of the 800 ms left.
        let then = judge(
            &first.read(&p, t0, Some(t0), Members::SECONDARY),
            Ending::Reply(&stale),
            t0 + ms(200),
        )
        .then;
        let Then::Climb {
            to: Rung::Primary,
            spec,
            ..
        } = then
        else {
            panic!("{then:?}")
        };
        assert_eq!(spec.max_time_ms, Some(400));
        // The guard refuses: available at once, with all that is left.
        match then.clone().refused() {
            Then::Climb {
                to: Rung::Available,
                spec,
                or_else: None,
            } => assert_eq!(spec.max_time_ms, Some(800)),
            other => panic!("{other:?}"),
        }
        // The guard lets it through; the primary times out at 600 ms: available with 400.
        let on_primary = first.climbed(Rung::Primary, &spec);
        let then = judge(
            &on_primary.read(&p, t0, Some(t0), Members::SECONDARY),
            Ending::Reply(&max_time),
            t0 + ms(600),
        )
        .then;
        let Then::Climb {
            to: Rung::Available,
            spec,
            or_else: None,
        } = then
        else {
            panic!("{then:?}")
        };
        assert_eq!(spec.max_time_ms, Some(400));
        // The last rung: whatever it meets goes to the client.
        let last = on_primary.climbed(Rung::Available, &spec);
        assert!(!last.primary && !last.retry);
        let v = judge(
            &last.read(&p, t0, Some(t0), Members::SECONDARY),
            Ending::Reply(&stale),
            t0 + ms(900),
        );
        assert_eq!(v.then, Then::Reply);
        // Past the budget on the primary: no time for available.
        let v = judge(
            &on_primary.read(&p, t0, Some(t0), Members::SECONDARY),
            Ending::Reply(&max_time),
            t0 + ms(1000),
        );
        assert_eq!(v.then, Then::NoTime(Rung::Available));
    }
}
