//! Closing on the cluster's word: a streak of answered samples is only a reason to ask.
//! Samples are the words of reads clients chose, and in a partial incident (one secondary
//! of a shard stale, the other healthy) a streak of them says nothing of the stale member:
//! reads of another shard's documents, reads pinned by tags to the healthy member, reads
//! mongos happened to send there. So when the streak meets the close rule, an open breaker
//! asks the cluster instead of closing (the confirming task, `confirm`: [`CLOSE_READS`]
//! cheap reads on staleguard's own connections, each routed by mongos to a member of every
//! shard), and closes only when every one is answered.
//!
//! - **Answered** (every cheap read `ok: 1`): it closes, if its streak still meets the rule
//!   (a failed sample heard while the question was in flight spoils it).
//! - **Declined** (one met a trigger error: stale routing, 133, a time limit): it stays
//!   open and its streak starts over.
//! - **Unknown** (no answer to judge: the confirming task's queue full, no connection, no
//!   rights): it stays open, streak kept; after [`UNKNOWN_FALLBACK`] unknown answers in a
//!   row it closes on the streak alone (the rule before this one), so a confirmer that
//!   cannot answer does not keep a breaker open on a healed cluster.
//!
//! One question per breaker at a time, and none sooner than `min_cooldown` after the last:
//! no client can make the cluster be asked more often than its own streak already allows.
//! While a question is in flight the breaker changes state for nothing else. Without a
//! confirming task (breakers made on their own, as in unit tests), the streak closes at
//! once, as before.

use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::time::Instant;

use super::{Breakers, State, Transition};
use crate::policy::NsPolicy;

/// Cheap reads per close question. Each is routed by mongos to a member of every shard,
/// chosen at random among the eligible ones (the simulated cluster's `select.rs` does the
/// same), so with one of a shard's two secondaries stale all twelve miss it with chance
/// 2^-12 (1 in 4096) per question; with one of three, (2/3)^12, about 1 in 130. At most one
/// question per `min_cooldown` (1 s by default): a 30 s partial incident asks at most 30
/// times, and the chance that one of them closes the breaker is under 1 % (two
/// secondaries).
pub const CLOSE_READS: usize = 12;

/// Unknown answers in a row after which the streak alone closes (the rule without a
/// confirmer): a cluster that cannot be asked is not kept behind an open breaker.
pub const UNKNOWN_FALLBACK: u32 = 2;

/// A question in flight longer than this past twice `confirm_time` is taken as unknown
/// (the confirming task bounds its reads; this guards a question it lost).
const LOST_AFTER: Duration = Duration::from_secs(5);

/// One breaker's close question.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Asking {
    /// In flight since.
    pub(super) since: Option<Instant>,
    /// When the last one a streak raised was asked.
    last: Option<Instant>,
    /// Unknown answers in a row (to a streak's questions).
    unknown: u32,
    /// The question in flight is staleguard's own (`own.rs`), not a streak's.
    pub(super) own: bool,
    /// When staleguard's own question was last asked (or may next be, after an unknown
    /// answer), and its answers in a row.
    pub(super) own_last: Option<Instant>,
    pub(super) own_answered: u32,
    /// Unknown answers in a row to staleguard's own question.
    pub(super) own_unknown: u32,
}

impl Asking {
    pub(super) fn in_flight(&self) -> bool {
        self.since.is_some()
    }
}

/// What a breaker did with a word it heard ([`Breakers::hear`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Said {
    /// Nothing the caller acts on.
    Nothing,
    /// A transition (logged and counted already).
    Moved(Transition),
    /// The streak meets the close rule: the caller asks the cluster ([`CLOSE_READS`] cheap
    /// reads) and reports the answer with [`Breakers::close_answer`].
    AskToClose,
}

impl Said {
    pub fn transition(self) -> Option<Transition> {
        match self {
            Said::Moved(t) => Some(t),
            _ => None,
        }
    }
}

/// The cluster's answer to a close question.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CloseAnswer {
    /// Every cheap read answered `ok: 1`.
    Answered,
    /// A cheap read met a trigger error (its code).
    Declined { code: i32 },
    /// Nothing to judge.
    Unknown,
}

impl CloseAnswer {
    /// The `result` label of `close_questions_total`.
    pub fn label(&self) -> &'static str {
        match self {
            CloseAnswer::Answered => "answered",
            CloseAnswer::Declined { .. } => "declined",
            CloseAnswer::Unknown => "unknown",
        }
    }
}

impl Breakers {
    /// A confirming task runs: from now on a streak asks before it closes.
    pub fn confirm_closes(&self) {
        self.confirms_close.store(true, Ordering::Release);
    }

    /// The streak of `b` met the close rule at `now`: ask (`AskToClose`), wait, or close
    /// at once (no confirming task). Called with the breaker locked.
    pub(super) fn streak_met(
        &self,
        b: &mut super::Breaker,
        policy: &NsPolicy,
        now: Instant,
    ) -> Said {
        if !self.confirms_close.load(Ordering::Acquire) {
            return Said::Moved(self.moved(b.close(streak_text(b, now), now)));
        }
        if b.asking.in_flight() {
            return Said::Nothing;
        }
        let span = policy.min_cooldown.min(policy.cooldown);
        if (b.asking.last).is_some_and(|t| now.saturating_duration_since(t) < span) {
            return Said::Nothing;
        }
        b.asking.since = Some(now);
        b.asking.last = Some(now);
        Said::AskToClose
    }

    /// A question in flight too long is given up as unknown; true when `b` is asking.
    pub(super) fn still_asking(b: &mut super::Breaker, policy: &NsPolicy, now: Instant) -> bool {
        let Some(since) = b.asking.since else {
            return false;
        };
        let lost = policy
            .confirm_time
            .saturating_mul(2)
            .saturating_add(LOST_AFTER);
        if now.saturating_duration_since(since) >= lost {
            b.asking.since = None;
            if std::mem::take(&mut b.asking.own) {
                b.own_unknown(policy, now);
            } else {
                b.asking.unknown = b.asking.unknown.saturating_add(1);
            }
            return false;
        }
        true
    }

    /// The cluster's answer to the close question of `ns` (see the module doc); returns the
    /// close when it closed.
    pub fn close_answer(
        &self,
        ns: &str,
        policy: &NsPolicy,
        answer: &CloseAnswer,
        now: Instant,
    ) -> Option<Transition> {
        self.metrics.breakers.close_question(answer.label());
        let t = {
            let mut b = self.map.get_mut(ns)?;
            if b.state != State::Open || !b.asking.in_flight() {
                return None;
            }
            b.asking.since = None;
            if std::mem::take(&mut b.asking.own) {
                b.own_answer(policy, answer, now)
                    .map(|why| self.moved(b.close(why, now)))
            } else {
                self.streak_answer(ns, &mut b, policy, answer, now)
            }
        };
        self.report(ns, t)
    }

    /// The answer to the question a streak raised (see the module doc).
    fn streak_answer(
        &self,
        ns: &str,
        b: &mut super::Breaker,
        policy: &NsPolicy,
        answer: &CloseAnswer,
        now: Instant,
    ) -> Option<Transition> {
        let met = !b.held && b.streak.enough(policy, now);
        match answer {
            CloseAnswer::Answered if met => {
                let why = format!(
                    "{}; {CLOSE_READS} cheap reads answered",
                    streak_text(b, now)
                );
                Some(self.moved(b.close(why, now)))
            }
            CloseAnswer::Answered => None,
            CloseAnswer::Declined { code } => {
                tracing::warn!(ns = %ns, code, streak = b.streak.count, "breaker close declined: a cheap read failed");
                b.asking.unknown = 0;
                b.streak = Default::default();
                b.last_failed = Some(now);
                None
            }
            CloseAnswer::Unknown => {
                b.asking.unknown = b.asking.unknown.saturating_add(1);
                if !met || b.asking.unknown < UNKNOWN_FALLBACK {
                    return None;
                }
                let why = format!(
                    "{}; the cluster's answer unknown {} times",
                    streak_text(b, now),
                    b.asking.unknown
                );
                Some(self.moved(b.close(why, now)))
            }
        }
    }
}

/// The streak, as a close's reason.
fn streak_text(b: &super::Breaker, now: Instant) -> String {
    format!(
        "{} samples answered in a row over {} ms, from {} connections",
        b.streak.count,
        b.streak
            .since
            .map_or(0, |s| now.saturating_duration_since(s).as_millis()),
        b.streak.connections()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::breaker::{Counted, Heard, Reason, Witness};
    use crate::policy::{Admission, Mode};

    const NS: &str = "pay.t";

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// Strict, bound mode; a confirming task runs; opened at `t0` by three connections.
    fn opened(t0: Instant) -> (Breakers, NsPolicy) {
        let b = Breakers::default();
        b.confirm_closes();
        let p = NsPolicy::with_defaults(NS, Mode::Strict);
        for conn in 1..=3 {
            let e = Counted {
                policy: &p,
                reason: Reason::StaleRouting,
                what: "13388",
                conn,
            };
            b.record_failure(NS, &e, t0);
        }
        assert_eq!(b.state(NS), State::Open);
        (b, p)
    }

    fn hear(b: &Breakers, p: &NsPolicy, heard: Heard<'_>, conn: u64, at: Instant) -> Said {
        let who = Witness {
            conn,
            proven: true,
            sent: at,
        };
        b.hear(NS, p, heard, true, who, at)
    }

    /// Three answered samples from two connections over `min_cooldown`, from `at`: the
    /// last one's word.
    fn streak(b: &Breakers, p: &NsPolicy, at: Instant) -> Said {
        hear(b, p, Heard::Answered, 1, at);
        hear(b, p, Heard::Answered, 2, at + ms(500));
        hear(b, p, Heard::Answered, 1, at + p.min_cooldown)
    }

    /// Reads sent before the breaker closed that fail after it (they hung through the heal,
    /// or their confirmation came late) do not open it again; reads sent after it do.
    #[test]
    fn errors_of_reads_sent_before_the_close_do_not_reopen_it() {
        let t0 = Instant::now();
        let (b, p) = opened(t0);
        let at = t0 + ms(1_000);
        assert_eq!(streak(&b, &p, at), Said::AskToClose);
        let closed_at = at + p.min_cooldown + ms(30);
        b.close_answer(NS, &p, &CloseAnswer::Answered, closed_at)
            .expect("closes");
        let failed = Heard::Failed {
            reason: Reason::StaleRouting,
            what: "13388",
        };
        let word = |conn: u64, sent: Instant, at: Instant| {
            let who = Witness {
                conn,
                proven: true,
                sent,
            };
            b.hear(NS, &p, failed, false, who, at)
        };
        let before = closed_at - ms(500);
        for conn in 10..20 {
            assert_eq!(word(conn, before, closed_at + ms(conn)), Said::Nothing);
        }
        assert_eq!(
            b.state(NS),
            State::Closed,
            "errors of reads sent before the close"
        );
        let after = closed_at + ms(100);
        for conn in 20..22 {
            assert_eq!(word(conn, after, after + ms(100)), Said::Nothing);
        }
        assert!(matches!(word(22, after, after + ms(200)), Said::Moved(_)));
        assert_eq!(b.state(NS), State::Open);
    }

    #[test]
    fn a_streak_asks_and_closes_only_when_every_cheap_read_is_answered() {
        let t0 = Instant::now();
        let (b, p) = opened(t0);
        let at = t0 + ms(1_000);
        assert_eq!(streak(&b, &p, at), Said::AskToClose);
        let asked = at + p.min_cooldown;
        assert_eq!(b.state(NS), State::Open, "asking, not closed");
        // While the question is in flight: more answers neither close nor ask again, and
        // reads are still sent bounded (no unbounded probe).
        assert_eq!(
            hear(&b, &p, Heard::Answered, 2, asked + ms(10)),
            Said::Nothing
        );
        assert!(matches!(
            b.admit(NS, &p, 5, false, asked + ms(20)),
            Admission::Bounded { .. }
        ));
        let t = b
            .close_answer(NS, &p, &CloseAnswer::Answered, asked + ms(30))
            .expect("closes");
        assert_eq!((t.from, t.to), (State::Open, State::Closed));
        assert!(t.reason.contains("12 cheap reads answered"), "{}", t.reason);
        // A late second answer changes nothing.
        assert!(b
            .close_answer(NS, &p, &CloseAnswer::Answered, asked + ms(40))
            .is_none());
    }

    /// The partial incident: a streak of answers from the healthy member, the cluster's
    /// cheap reads meet the stale one. It stays open, the streak starts over, and the next
    /// question waits for a new streak (at least `min_cooldown`).
    #[test]
    fn a_declined_question_keeps_it_open_and_resets_the_streak() {
        let t0 = Instant::now();
        let (b, p) = opened(t0);
        let at = t0 + ms(1_000);
        assert_eq!(streak(&b, &p, at), Said::AskToClose);
        let asked = at + p.min_cooldown;
        let declined = CloseAnswer::Declined { code: 13388 };
        assert!(b.close_answer(NS, &p, &declined, asked + ms(5)).is_none());
        assert_eq!(b.state(NS), State::Open);
        assert_eq!(b.snapshot()[0].streak, 0);
        assert_eq!(
            b.own_samples(NS).and_then(|s| s.last_failed),
            Some(asked + ms(5)),
            "the fleet sees a failure of its own"
        );
        // Answers at once after: a new streak, which needs min_cooldown again.
        let next = asked + ms(10);
        hear(&b, &p, Heard::Answered, 1, next);
        assert_eq!(
            hear(&b, &p, Heard::Answered, 2, next + ms(100)),
            Said::Nothing
        );
        assert_eq!(
            hear(&b, &p, Heard::Answered, 1, next + p.min_cooldown),
            Said::AskToClose
        );
        assert!(b
            .close_answer(NS, &p, &CloseAnswer::Answered, next + p.min_cooldown)
            .is_some());
    }

    /// A failed sample heard while the question is in flight spoils it: the answer finds
    /// the streak broken and does not close.
    #[test]
    fn a_failure_while_asking_spoils_the_answer() {
        let t0 = Instant::now();
        let (b, p) = opened(t0);
        let at = t0 + ms(1_000);
        assert_eq!(streak(&b, &p, at), Said::AskToClose);
        let asked = at + p.min_cooldown;
        let failed = Heard::Failed {
            reason: Reason::StaleRouting,
            what: "13388",
        };
        assert_eq!(hear(&b, &p, failed, 3, asked + ms(2)), Said::Nothing);
        assert!(b
            .close_answer(NS, &p, &CloseAnswer::Answered, asked + ms(5))
            .is_none());
        assert_eq!(b.state(NS), State::Open);
    }

    /// A confirmer that cannot answer: the first unknown keeps it open (streak kept), the
    /// next question goes no sooner than `min_cooldown` later, and a second unknown in a
    /// row closes on the streak alone.
    #[test]
    fn unknown_answers_twice_in_a_row_fall_back_to_the_streak() {
        let t0 = Instant::now();
        let (b, p) = opened(t0);
        let at = t0 + ms(1_000);
        assert_eq!(streak(&b, &p, at), Said::AskToClose);
        let asked = at + p.min_cooldown;
        assert!(b
            .close_answer(NS, &p, &CloseAnswer::Unknown, asked + ms(5))
            .is_none());
        assert_eq!(b.state(NS), State::Open);
        // Answered samples within min_cooldown of the last question do not ask again.
        assert_eq!(
            hear(&b, &p, Heard::Answered, 2, asked + ms(600)),
            Said::Nothing
        );
        assert_eq!(
            hear(&b, &p, Heard::Answered, 1, asked + p.min_cooldown),
            Said::AskToClose
        );
        let t = b
            .close_answer(
                NS,
                &p,
                &CloseAnswer::Unknown,
                asked + p.min_cooldown + ms(5),
            )
            .expect("closes on the streak");
        assert!(t.reason.contains("unknown 2 times"), "{}", t.reason);
    }

    /// An answer between two unknowns starts the count over; a question never answered is
    /// given up (as unknown) after twice `confirm_time` and 5 s, so it cannot block closing.
    #[test]
    fn a_lost_question_is_given_up() {
        let t0 = Instant::now();
        let (b, p) = opened(t0);
        let at = t0 + ms(1_000);
        assert_eq!(streak(&b, &p, at), Said::AskToClose);
        let asked = at + p.min_cooldown;
        let lost = asked + p.confirm_time * 2 + LOST_AFTER;
        assert_eq!(
            hear(&b, &p, Heard::Answered, 2, lost - ms(1)),
            Said::Nothing
        );
        assert_eq!(hear(&b, &p, Heard::Answered, 1, lost), Said::AskToClose);
        // That lost one counted as the first unknown.
        let t = b.close_answer(NS, &p, &CloseAnswer::Unknown, lost + ms(1));
        assert!(t.is_some());
    }

    /// Without a confirming task (breakers on their own), the streak closes at once.
    #[test]
    fn without_a_confirmer_the_streak_closes_at_once() {
        let b = Breakers::default();
        let p = NsPolicy::with_defaults(NS, Mode::Strict);
        let t0 = Instant::now();
        for conn in 1..=3 {
            let e = Counted {
                policy: &p,
                reason: Reason::StaleRouting,
                what: "13388",
                conn,
            };
            b.record_failure(NS, &e, t0);
        }
        let said = streak(&b, &p, t0 + ms(1_000));
        assert!(matches!(said, Said::Moved(t) if t.to == State::Closed));
    }
}
