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
    since: Option<Instant>,
    /// When the last one was asked.
    last: Option<Instant>,
    /// Unknown answers in a row.
    unknown: u32,
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
        let lost = policy.confirm_time.saturating_mul(2).saturating_add(LOST_AFTER);
        if now.saturating_duration_since(since) >= lost {
            b.asking.since = None;
            b.asking.unknown = b.asking.unknown.saturating_add(1);
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
            let met = !b.held && b.streak.enough(policy, now);
            match answer {
                CloseAnswer::Answered if met => {
                    let why = format!(
                        "{}; {CLOSE_READS} cheap reads answered",
                        streak_text(&b, now)
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
                        None
                    } else {
                        let why = format!(
                            "{}; the cluster's answer unknown {} times",
                            streak_text(&b, now),
                            b.asking.unknown
                        );
                        Some(self.moved(b.close(why, now)))
                    }
                }
            }
        };
        self.report(ns, t)
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
