//! staleguard's own question. A streak of answered samples closes a breaker only as fast as
//! its readers' reads come back: a namespace whose healthy reads take seconds (a view's
//! pipeline, a slow query) would stay open long after a heal, one slow probe at a time. So
//! while a breaker is open and read, staleguard asks the cluster itself, once every
//! `min_cooldown`: the close question's [`CLOSE_READS`] cheap reads (`close.rs`), on its own
//! connections, `secondary` only, each routed by mongos to a member of every shard. No
//! client chooses what they read or when they are sent.
//!
//! - [`OWN_ANSWERS`] questions in a row all answered close it (24 cheap reads: with one of a
//!   shard's two secondaries stale, all miss it once in 2^24 pairs of questions).
//! - One that meets a trigger error starts the count over, and so does a failed sample of
//!   the namespace's own reads; the streak starts over too, as for a streak's question.
//! - An unknown answer (a cheap read late on a loaded machine, no connection, no rights, the
//!   queue full) neither counts nor starts the count over; [`OWN_UNKNOWN_REST`] in a row rest
//!   the next question for `cooldown`: without `[confirm]` credentials on a cluster that needs
//!   a login, the streak and its question close the breaker as before.
//!
//! Not while held by the write-stall watch, nor while another question of the breaker is in
//! flight, nor for a breaker nobody has read within `cooldown` (it costs the cluster nothing
//! until a reader comes, whose reads probe it).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::{Breaker, Breakers, CloseAnswer, State, CLOSE_READS};
use crate::policy::NsPolicy;

/// Own questions answered in a row that close an open breaker.
pub const OWN_ANSWERS: u32 = 2;

/// Unknown answers in a row after which the next own question waits `cooldown` more.
pub const OWN_UNKNOWN_REST: u32 = 2;

/// How often the confirming task looks for open breakers due their own question.
pub const OWN_TICK: Duration = Duration::from_millis(200);

impl Breakers {
    /// The open breakers due staleguard's own question at `now`, each marked as asking it
    /// (its answer comes back through [`Breakers::close_answer`]); `policy_of` gives a
    /// namespace's policy (none: not asked).
    pub fn own_questions(
        &self,
        now: Instant,
        policy_of: impl Fn(&str) -> Option<Arc<NsPolicy>>,
    ) -> Vec<(Arc<str>, Arc<NsPolicy>)> {
        if self.not_closed.load(Ordering::Acquire) == 0
            || !self.confirms_close.load(Ordering::Acquire)
        {
            return Vec::new();
        }
        let candidates: Vec<String> = self
            .map
            .iter()
            .filter(|e| e.state == State::Open && !e.held && !e.asking.in_flight())
            .map(|e| e.key().clone())
            .collect();
        let mut out = Vec::new();
        for ns in candidates {
            let Some(policy) = policy_of(&ns) else {
                continue;
            };
            let Some(mut b) = self.map.get_mut(&ns) else {
                continue;
            };
            let read = now.saturating_duration_since(self.last_used(&b)) < policy.cooldown;
            if read && !Breakers::still_asking(&mut b, &policy, now) && b.own_due(&policy, now) {
                b.asking.since = Some(now);
                b.asking.own = true;
                b.asking.own_last = Some(now);
                out.push((Arc::from(ns.as_str()), policy));
            }
        }
        out
    }
}

impl Breaker {
    /// Open, not held, and `min_cooldown` past the opening and the last own question.
    fn own_due(&self, policy: &NsPolicy, now: Instant) -> bool {
        let span = policy.min_cooldown.min(policy.cooldown);
        let since = self.asking.own_last.unwrap_or(self.opened_at);
        self.state == State::Open
            && !self.held
            && now >= since
            && now.saturating_duration_since(since) >= span
    }

    /// The cluster's answer to staleguard's own question: the close's reason when it
    /// closes the breaker.
    pub(super) fn own_answer(
        &mut self,
        policy: &NsPolicy,
        answer: &CloseAnswer,
        now: Instant,
    ) -> Option<String> {
        match answer {
            CloseAnswer::Answered => {
                self.asking.own_unknown = 0;
                self.asking.own_answered = self.asking.own_answered.saturating_add(1);
                let n = self.asking.own_answered;
                (n >= OWN_ANSWERS && !self.held).then(|| {
                    format!(
                        "staleguard's own questions answered {n} in a row ({} cheap reads)",
                        n as usize * CLOSE_READS
                    )
                })
            }
            CloseAnswer::Declined { code } => {
                tracing::info!(
                    code,
                    "staleguard's own question declined: a cheap read failed"
                );
                self.asking.own_unknown = 0;
                self.asking.own_answered = 0;
                self.streak = Default::default();
                self.last_failed = Some(now);
                None
            }
            CloseAnswer::Unknown => {
                self.own_unknown(policy, now);
                None
            }
        }
    }

    /// An unknown answer to the own question: nothing counted either way; after
    /// [`OWN_UNKNOWN_REST`] in a row the next waits `cooldown` more.
    pub(super) fn own_unknown(&mut self, policy: &NsPolicy, now: Instant) {
        self.asking.own_unknown = self.asking.own_unknown.saturating_add(1);
        if self.asking.own_unknown >= OWN_UNKNOWN_REST {
            self.asking.own_unknown = 0;
            self.asking.own_last = now.checked_add(policy.cooldown).or(Some(now));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::breaker::{Counted, Heard, Reason, Witness};
    use crate::policy::Mode;

    const NS: &str = "pay.slow_view";

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// Strict; a confirming task runs; opened at `t0` by three connections.
    fn opened(t0: Instant) -> (Breakers, Arc<NsPolicy>) {
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
        (b, Arc::new(p))
    }

    fn due(b: &Breakers, p: &Arc<NsPolicy>, at: Instant) -> bool {
        let asked = b.own_questions(at, |_| Some(p.clone()));
        assert!(asked.len() <= 1);
        !asked.is_empty()
    }

    /// A read of the namespace at `at` (the breaker was read).
    fn read(b: &Breakers, p: &NsPolicy, at: Instant) {
        let _ = b.admit(NS, p, 9, true, at);
    }

    #[test]
    fn two_answered_questions_in_a_row_close_it_without_a_streak() {
        let t0 = Instant::now();
        let (b, p) = opened(t0);
        assert!(!due(&b, &p, t0 + ms(500)), "not before min_cooldown");
        let q1 = t0 + p.min_cooldown;
        assert!(due(&b, &p, q1));
        assert!(!due(&b, &p, q1 + ms(300)), "one question at a time");
        assert!(b
            .close_answer(NS, &p, &CloseAnswer::Answered, q1 + ms(20))
            .is_none());
        assert_eq!(b.state(NS), State::Open, "one answer is not enough");
        assert!(!due(&b, &p, q1 + ms(500)), "not sooner than min_cooldown");
        let q2 = q1 + p.min_cooldown;
        read(&b, &p, q2);
        assert!(due(&b, &p, q2));
        let t = b
            .close_answer(NS, &p, &CloseAnswer::Answered, q2 + ms(20))
            .expect("the second answer closes it");
        assert_eq!((t.from, t.to), (State::Open, State::Closed));
        assert!(
            t.reason.contains("own questions answered 2 in a row"),
            "{}",
            t.reason
        );
        assert!(
            !due(&b, &p, q2 + ms(5_000)),
            "nothing to ask of a closed breaker"
        );
    }

    #[test]
    fn a_trigger_error_or_a_failed_sample_starts_the_count_over() {
        let t0 = Instant::now();
        let (b, p) = opened(t0);
        let mut at = t0 + p.min_cooldown;
        let ask = |answer: CloseAnswer, at: Instant| {
            read(&b, &p, at);
            assert!(due(&b, &p, at));
            b.close_answer(NS, &p, &answer, at + ms(10))
        };
        assert!(ask(CloseAnswer::Answered, at).is_none());
        at += p.min_cooldown;
        assert!(ask(CloseAnswer::Declined { code: 13388 }, at).is_none());
        at += p.min_cooldown;
        assert!(
            ask(CloseAnswer::Answered, at).is_none(),
            "the count started over"
        );
        // A failed sample of the namespace's own reads between two questions.
        let who = Witness {
            conn: 4,
            proven: true,
            sent: at,
        };
        let failed = Heard::Failed {
            reason: Reason::StaleRouting,
            what: "13388",
        };
        b.hear(NS, &p, failed, true, who, at + ms(500));
        at += p.min_cooldown;
        assert!(
            ask(CloseAnswer::Answered, at).is_none(),
            "spoiled by the sample"
        );
        at += p.min_cooldown;
        assert!(ask(CloseAnswer::Answered, at).is_some());
    }

    #[test]
    fn unknown_answers_count_nothing_and_two_in_a_row_rest_it_for_cooldown() {
        let t0 = Instant::now();
        let (b, p) = opened(t0);
        let q1 = t0 + p.min_cooldown;
        assert!(due(&b, &p, q1));
        b.close_answer(NS, &p, &CloseAnswer::Answered, q1 + ms(10));
        // One unknown (a late cheap read): the next comes as usual, the answer kept.
        let q2 = q1 + p.min_cooldown;
        read(&b, &p, q2);
        assert!(due(&b, &p, q2));
        b.close_answer(NS, &p, &CloseAnswer::Unknown, q2 + ms(10));
        let q3 = q2 + p.min_cooldown;
        read(&b, &p, q3);
        assert!(due(&b, &p, q3));
        b.close_answer(NS, &p, &CloseAnswer::Unknown, q3 + ms(10));
        // Two in a row: rested for `cooldown`.
        let before = q3 + p.cooldown;
        read(&b, &p, before);
        assert!(!due(&b, &p, before));
        let after = q3 + p.cooldown + p.min_cooldown + ms(10);
        read(&b, &p, after);
        assert!(due(&b, &p, after));
        let t = b
            .close_answer(NS, &p, &CloseAnswer::Answered, after + ms(10))
            .expect("the answer before the unknowns still counts");
        assert!(t.reason.contains("answered 2 in a row"), "{}", t.reason);
    }

    #[test]
    fn not_asked_when_held_unread_or_without_a_confirming_task() {
        let t0 = Instant::now();
        let (b, p) = opened(t0);
        // Nobody read it for `cooldown` after it opened.
        assert!(!due(&b, &p, t0 + p.cooldown + ms(10)));
        read(&b, &p, t0 + p.cooldown + ms(20));
        assert!(due(&b, &p, t0 + p.cooldown + ms(30)));

        let (b, p) = opened(t0);
        b.map.get_mut(NS).expect("there").held = true;
        assert!(!due(&b, &p, t0 + p.min_cooldown));

        let alone = Breakers::default();
        let e = Counted {
            policy: &p,
            reason: Reason::StaleRouting,
            what: "13388",
            conn: 1,
        };
        for conn in 1..=3 {
            alone.record_failure(NS, &Counted { conn, ..e }, t0);
        }
        assert_eq!(alone.state(NS), State::Open);
        assert!(alone
            .own_questions(t0 + p.min_cooldown, |_| Some(p.clone()))
            .is_empty());
    }
}
