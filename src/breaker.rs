//! Circuit breakers, one per exact namespace (`db.coll`) that has a policy: a sliding window
//! of confirmed trigger errors opens it; while open it takes *samples* (reads sent to the
//! secondaries on its terms), and it closes only on a streak of answered samples.
//!
//! Two ways of sampling (`entry::sends_every_read`): a strict namespace with `on_open =
//! "bound"` (the default) and no primary rung sends every read, with a short time limit, so
//! a healthy secondary still answers and only what fails fails; every other open breaker
//! lets one probe through at a time, the first `min_cooldown` after it opened, the next at
//! once after an answered probe, or after a wait that doubles with each failed one (up to
//! `cooldown`). A breaker closes after `close_after` answered samples in a row, from at least
//! two connections (one when `min_connections` is 1), spanning `min_cooldown`: one read that
//! met the healthy secondary of a half-stale shard does not close it. There is no half-open
//! state: a sample changes no state until the streak closes the breaker, so a partly stale
//! shard does not make it flap. When the write-stall signal clears,
//! [`Breakers::probe_early`] lets every open breaker probe at its next read.
//!
//! The write-stall watch may also *hold* a breaker open (`hold`): it stays open, without a
//! probe, while the signal lasts; releasing it then lets its next read probe, so the breaker
//! returns through its usual probes (and their streak) as soon as writes complete.
//!
//! Every transition is logged and counted here, by the method that makes it; callers get
//! the transition back only to look at it.
//!
//! Evidence a client cannot fake: what counts is decided by `policy::judge` (and confirmed
//! by the session where the judge says so); each counted error comes with the id of the
//! client connection whose read met it. A connection counts at most `per_connection` errors
//! within `window`, and the breaker opens only when `threshold` counted errors within
//! `window` come from at least `min_connections` connections. The window keeps at most
//! `max(threshold, min_connections * per_connection)` entries, so memory is bounded.
//!
//! The map is bounded per pattern (`bound.rs`): namespaces the config lists exactly always
//! have their breaker; each wildcard pattern has a guaranteed share of the rest and may
//! borrow up to `breaker_share` of it; an open breaker nobody reads expires.

mod bound;
mod close;
mod entry;
mod fleet;
mod hold;
mod own;
mod snapshot;

pub use entry::backoff;
use entry::Breaker;

pub use bound::MIN_EXPIRY;
pub use close::{CloseAnswer, Said, CLOSE_READS, UNKNOWN_FALLBACK};
pub use fleet::{closed_by_fleet, FleetClose, OwnSamples};
pub use own::{OWN_ANSWERS, OWN_TICK, OWN_UNKNOWN_REST};
pub use snapshot::Snapshot;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use dashmap::DashMap;
use tokio::time::Instant;

use crate::events;
use crate::metrics::Metrics;
use crate::policy::NsPolicy;

pub use crate::policy::{Admission, Reason};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    Closed,
    Open,
}

impl State {
    pub fn as_str(self) -> &'static str {
        match self {
            State::Closed => "closed",
            State::Open => "open",
        }
    }

    /// The value of the `breaker_state` gauge (2 for open, as before the half-open state
    /// was dropped, so dashboards and rules keep their meaning).
    pub fn gauge(self) -> i64 {
        match self {
            State::Closed => 0,
            State::Open => 2,
        }
    }
}

/// A state change, for logs and metrics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transition {
    pub from: State,
    pub to: State,
    pub reason: String,
    /// What the breaker stands open for (the fail-fast reply's code): the opening's kind.
    pub cause: Reason,
    /// The fleet instance whose opening opened it (`fleet`); none for this instance's own.
    pub opener: Option<Arc<str>>,
}

/// How a sample (a read admitted as `Probe` or `Bounded`) ended, for [`Breakers::sampled`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sample {
    /// Answered without a trigger error.
    Answered,
    /// A trigger error (or the sample's own time bound ran out).
    Failed,
    /// Nothing can be said (the client left, the reply was unreadable, ...): the probe's
    /// slot is freed, the streak is left as it was.
    Unknown,
}

/// All breakers, bounded per pattern (see `bound.rs`): a namespace without room is not
/// tracked (behaves as closed). A flood of names can neither grow memory nor take the
/// breakers of exactly listed namespaces or of other patterns.
#[derive(Debug)]
pub struct Breakers {
    map: DashMap<String, Breaker>,
    /// Who may hold how many slots of `map`; taken before any shard lock of `map`, never
    /// while one is held.
    bound: Mutex<bound::Bound>,
    /// The origin of each breaker's `last_read` clock.
    epoch: Instant,
    /// Breakers open. Changed under the breaker's map lock by [`Breakers::moved`]; while it
    /// is 0 every read is admitted without touching the map (a read of a line that changes
    /// only on transitions, no lock taken).
    not_closed: AtomicUsize,
    /// Where transitions are counted (`breaker_state`, `breaker_transitions_total`).
    metrics: Arc<Metrics>,
    /// While the write-stall watch holds fallback breakers open: why (see `hold`).
    hold: Mutex<Option<String>>,
    /// Told of every transition after it is counted (`fleet.rs`): must not block.
    hook: std::sync::OnceLock<fleet::Hook>,
    /// A confirming task answers close questions (`close.rs`): a streak asks before it
    /// closes.
    confirms_close: AtomicBool,
}

pub const DEFAULT_MAX_BREAKERS: usize = 10_000;

impl Default for Breakers {
    fn default() -> Self {
        Breakers::new(DEFAULT_MAX_BREAKERS)
    }
}

impl Breakers {
    /// Breakers that count their transitions in a registry of their own (tests).
    pub fn new(max: usize) -> Breakers {
        Breakers::with_metrics(max, Arc::new(Metrics::new()))
    }

    /// Breakers that count their transitions in `metrics`.
    pub fn with_metrics(max: usize, metrics: Arc<Metrics>) -> Breakers {
        Breakers {
            map: DashMap::new(),
            bound: Mutex::new(bound::Bound::new(max)),
            epoch: Instant::now(),
            not_closed: AtomicUsize::new(0),
            metrics,
            hold: Mutex::new(None),
            hook: std::sync::OnceLock::new(),
            confirms_close: AtomicBool::new(false),
        }
    }

    /// Counts a transition in `not_closed`; called with the breaker's entry still locked,
    /// so the transitions of one breaker are counted in the order they happened.
    fn moved(&self, t: Transition) -> Transition {
        match (t.from, t.to) {
            (State::Closed, State::Open) => {
                self.not_closed.fetch_add(1, Ordering::AcqRel);
            }
            (State::Open, State::Closed) => {
                self.not_closed.fetch_sub(1, Ordering::AcqRel);
            }
            _ => {}
        }
        t
    }

    /// Open breakers now.
    pub fn not_closed(&self) -> usize {
        self.not_closed.load(Ordering::Acquire)
    }

    /// Logs and counts a transition of `ns` (the one place that does).
    fn report(&self, ns: &str, t: Option<Transition>) -> Option<Transition> {
        if let Some(t) = &t {
            self.metrics.breaker_state(ns, t.to.gauge());
            self.metrics
                .breaker_transition(ns, t.from.as_str(), t.to.as_str());
            tracing::warn!(ns = %ns, from = t.from.as_str(), to = t.to.as_str(), reason = %t.reason, "breaker transition");
            self.metrics.recent.events.record(events::Event::breaker(
                ns,
                t.to == State::Open,
                &t.reason,
            ));
            if let Some(hook) = self.hook.get() {
                hook.call(ns, t);
            }
        }
        t
    }

    /// Decides what an eligible read on `ns` from client connection `conn` may do now;
    /// claims the probe when one is due. `climbs`: the read may go to the primary (its
    /// namespace has the primary rung and the read is not pinned by tag sets); one that
    /// cannot is admitted as it would be without the rung. The connection has proved itself
    /// to the cluster ([`Breakers::admit_as`] for one that may not have).
    pub fn admit(
        &self,
        ns: &str,
        policy: &NsPolicy,
        conn: u64,
        climbs: bool,
        now: Instant,
    ) -> Admission {
        self.admit_as(ns, policy, conn, climbs, true, now)
    }

    /// [`Breakers::admit`] for connection `conn`, `proven` or not: a connection that has not
    /// proved itself to the cluster takes a due probe only when no proven one has taken it
    /// for `cooldown` (its sample would be neutral, see [`Breakers::hear`]).
    pub fn admit_as(
        &self,
        ns: &str,
        policy: &NsPolicy,
        conn: u64,
        climbs: bool,
        proven: bool,
        now: Instant,
    ) -> Admission {
        // No breaker open anywhere (the common case): nothing to look up.
        if self.not_closed.load(Ordering::Acquire) == 0 {
            return Admission::Closed;
        }
        // Under a read lock first: no breaker, closed, bounded, or open with no probe due
        // (every request while a breaker is open included).
        {
            let Some(b) = self.map.get(ns) else {
                return Admission::Closed;
            };
            self.touch(&b, now);
            match b.peek(policy, conn, climbs, proven, now) {
                Admission::Probe => {}
                a => return a,
            }
        }
        // A probe is due: take the write lock and decide again (another session may have
        // claimed it in between).
        let Some(mut b) = self.map.get_mut(ns) else {
            return Admission::Closed;
        };
        let a = b.peek(policy, conn, climbs, proven, now);
        if a == Admission::Probe {
            b.claim_probe(conn, now);
            tracing::debug!(ns = %ns, "breaker open: probe sent to the secondaries");
        }
        a
    }

    /// The one gate: everything a read says about the cluster reaches a breaker here, after
    /// `policy::evidence` (and any confirmation) made it a [`Heard`]. `sample`: the read was
    /// admitted while the breaker was open; its word is then a sample, never an opening.
    /// What a connection that has not proved itself to the cluster says is neutral (a
    /// probe's slot is still given back). [`Said::AskToClose`]: the caller asks the cluster
    /// before the breaker closes (`close.rs`).
    pub fn hear(
        &self,
        ns: &str,
        policy: &NsPolicy,
        heard: Heard<'_>,
        sample: bool,
        who: Witness,
        now: Instant,
    ) -> Said {
        let heard = if who.proven { heard } else { Heard::Neutral };
        let outcome = match (sample, heard) {
            (false, Heard::Failed { .. }) if self.sent_before_close(ns, who.sent) => {
                self.metrics.limits.ignored("before_close");
                return Said::Nothing;
            }
            (false, Heard::Failed { reason, what }) => {
                let counted = Counted {
                    policy,
                    reason,
                    what,
                    conn: who.conn,
                };
                return self
                    .record_failure(ns, &counted, now)
                    .map_or(Said::Nothing, Said::Moved);
            }
            (false, Heard::Answered | Heard::Neutral) => return Said::Nothing,
            (true, Heard::Failed { .. }) => Sample::Failed,
            (true, Heard::Answered) => Sample::Answered,
            (true, Heard::Neutral) => Sample::Unknown,
        };
        self.sample(ns, policy, outcome, who.conn, now)
    }

    /// The breaker of `ns` is closed, and closed after `sent`.
    fn sent_before_close(&self, ns: &str, sent: Instant) -> bool {
        self.map
            .get(ns)
            .is_some_and(|b| b.state == State::Closed && b.closed_at.is_some_and(|c| sent < c))
    }

    /// Counts a trigger error on `ns`, met by a read of client connection `conn` while the
    /// breaker was closed (samples of an open breaker report through [`Breakers::sampled`]).
    fn record_failure(&self, ns: &str, e: &Counted<'_>, now: Instant) -> Option<Transition> {
        let t = self.count_failure(ns, e, now);
        self.report(ns, t)
    }

    fn count_failure(&self, ns: &str, e: &Counted<'_>, now: Instant) -> Option<Transition> {
        let mut b = self.slot(ns, now)?;
        if !b.count(e.policy, e.conn, now) {
            self.metrics.limits.ignored("per_connection");
            return None;
        }
        if b.state != State::Closed || !b.enough(e.policy) {
            return None;
        }
        let why = format!(
            "{} trigger errors within {:?} (last: {})",
            b.errors.len(),
            e.policy.window,
            e.what
        );
        Some(self.moved(b.open(e.reason, why, now, e.policy.min_cooldown)))
    }

    /// A confirmed error from connection `conn` would count now: the breaker is closed (or
    /// not there yet) and `conn` has not counted `per_connection` errors within the window.
    /// Nothing is changed (a read lock).
    pub fn would_count(&self, ns: &str, policy: &NsPolicy, conn: u64, now: Instant) -> bool {
        let Some(b) = self.map.get(ns) else {
            return true;
        };
        b.state == State::Closed && b.would_count(policy, conn, now)
    }

    /// Reports how a sample of `ns` (admitted as `Probe` or `Bounded`) from connection
    /// `conn` ended; returns the transition when a streak of answers closed the breaker
    /// (without a confirming task; with one, see [`Breakers::hear`]).
    #[cfg(test)]
    fn sampled(
        &self,
        ns: &str,
        policy: &NsPolicy,
        outcome: Sample,
        conn: u64,
        now: Instant,
    ) -> Option<Transition> {
        self.sample(ns, policy, outcome, conn, now).transition()
    }

    fn sample(
        &self,
        ns: &str,
        policy: &NsPolicy,
        outcome: Sample,
        conn: u64,
        now: Instant,
    ) -> Said {
        let said = {
            let Some(mut b) = self.map.get_mut(ns) else {
                return Said::Nothing;
            };
            if b.state != State::Open {
                return Said::Nothing;
            }
            let asking = Breakers::still_asking(&mut b, policy, now);
            match outcome {
                Sample::Failed => {
                    // Counted even while a close question is in flight: its answer then
                    // finds the streak broken and cannot close.
                    b.sample_failed(policy, now);
                    Said::Nothing
                }
                Sample::Unknown => {
                    b.probe_since = None;
                    b.freed = now;
                    Said::Nothing
                }
                Sample::Answered if b.held || asking => {
                    b.probe_since = None;
                    b.freed = now;
                    b.last_answered = Some(now);
                    Said::Nothing
                }
                Sample::Answered => match b.sample_ok(policy, conn, now) {
                    true => self.streak_met(&mut b, policy, now),
                    false => Said::Nothing,
                },
            }
        };
        match said {
            Said::Moved(t) => self.report(ns, Some(t)).map_or(Said::Nothing, Said::Moved),
            other => other,
        }
    }

    /// The write-stall signal cleared: every open breaker that is not held lets its next
    /// read through as a probe instead of waiting. Returns the namespaces concerned; holds
    /// are ended by [`Breakers::release_held`].
    pub fn probe_early(&self) -> Vec<String> {
        let mut out = Vec::new();
        for mut e in self.map.iter_mut() {
            if e.state == State::Open && !e.held && !e.early {
                e.early = true;
                out.push(e.key().clone());
            }
        }
        out.sort();
        if !out.is_empty() {
            tracing::info!(namespaces = ?out, "write stall cleared: open breakers probe at their next read");
        }
        out
    }

    /// A probe whose outcome will never be known (e.g. a non-read reply); frees the slot.
    pub fn release_probe(&self, ns: &str) {
        if let Some(mut b) = self.map.get_mut(ns) {
            b.probe_since = None;
        }
    }

    pub fn state(&self, ns: &str) -> State {
        self.map.get(ns).map_or(State::Closed, |b| b.state)
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Drops breakers whose namespace no longer has an acting policy (after a reload).
    pub fn retain(&self, keep: impl Fn(&str) -> bool) {
        let mut bound = self.bound();
        self.map.retain(|k, b| {
            let kept = keep(k);
            if !kept && b.state != State::Closed {
                self.not_closed.fetch_sub(1, Ordering::AcqRel);
            }
            kept
        });
        self.recount(&mut bound);
    }
}

/// Who said a word: the client connection it came through (a connection counts only its
/// share), and whether that connection has proved itself to the cluster (see
/// `session::Proof`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Witness {
    pub conn: u64,
    pub proven: bool,
    /// When the read (the attempt) whose word this is went to the cluster: a trigger error
    /// of a read sent before its breaker last closed says nothing of the cluster since, and
    /// does not count toward opening it again.
    pub sent: Instant,
}

/// What a breaker hears of one read, from `policy::evidence` (after any confirmation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Heard<'a> {
    /// The cluster's word that a secondary could not serve the read: why, and the evidence
    /// as text (the breaker's last-transition reason).
    Failed { reason: Reason, what: &'a str },
    /// A secondary served the read.
    Answered,
    /// Nothing about the cluster.
    Neutral,
}

/// A counted trigger error: the namespace's policy, why, the evidence as text, and the
/// client connection whose read met it.
#[derive(Debug, Clone, Copy)]
pub struct Counted<'a> {
    pub policy: &'a NsPolicy,
    pub reason: Reason,
    pub what: &'a str,
    pub conn: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Mode;
    use std::time::Duration;

    const NS: &str = "demo.inv";

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn fallback() -> NsPolicy {
        NsPolicy::with_defaults(NS, Mode::Fallback)
    }

    fn strict() -> NsPolicy {
        NsPolicy::with_defaults(NS, Mode::Strict)
    }

    fn fail(b: &Breakers, p: &NsPolicy, conn: u64, now: Instant) -> Option<Transition> {
        let e = Counted {
            policy: p,
            reason: Reason::StaleRouting,
            what: "13388",
            conn,
        };
        b.record_failure(NS, &e, now)
    }

    /// Opens `NS` with errors from three connections at `t0`.
    fn opened(b: &Breakers, p: &NsPolicy, t0: Instant) {
        for conn in 1..=3 {
            fail(b, p, conn, t0);
        }
        assert_eq!(b.state(NS), State::Open);
    }

    fn sample(b: &Breakers, p: &NsPolicy, o: Sample, conn: u64, at: Instant) -> Option<Transition> {
        b.sampled(NS, p, o, conn, at)
    }

    #[test]
    fn one_connection_alone_never_opens() {
        let b = Breakers::default();
        let p = fallback();
        let t0 = Instant::now();
        for i in 0..50 {
            assert!(fail(&b, &p, 7, t0 + ms(i)).is_none());
        }
        assert_eq!(b.state(NS), State::Closed);
        // Counted once in the window (per_connection = 1).
        assert_eq!(b.snapshot()[0].errors_in_window, 1);
    }

    #[test]
    fn threshold_errors_from_enough_connections_open() {
        let b = Breakers::default();
        let p = fallback();
        let t0 = Instant::now();
        assert!(fail(&b, &p, 1, t0).is_none());
        assert!(fail(&b, &p, 2, t0).is_none());
        assert!(fail(&b, &p, 2, t0).is_none());
        let t = fail(&b, &p, 3, t0).expect("third connection opens");
        assert_eq!((t.from, t.to), (State::Closed, State::Open));
    }

    #[test]
    fn per_connection_cap_and_min_connections_together() {
        let b = Breakers::default();
        let mut p = fallback();
        p.per_connection = 3;
        let t0 = Instant::now();
        for _ in 0..10 {
            assert!(fail(&b, &p, 1, t0).is_none(), "one connection");
        }
        assert!(fail(&b, &p, 2, t0).is_some(), "3 from one + 1 from another");
    }

    #[test]
    fn window_memory_is_bounded_by_the_policy() {
        let b = Breakers::default();
        let mut p = fallback();
        p.min_connections = 100;
        let t0 = Instant::now();
        for conn in 0..10_000u64 {
            fail(&b, &p, conn, t0);
        }
        assert_eq!(b.snapshot()[0].errors_in_window, 100);
        assert_eq!(b.state(NS), State::Open);
    }

    #[test]
    fn would_count_says_whether_a_confirming_read_could_change_anything() {
        let b = Breakers::default();
        let p = strict();
        let t0 = Instant::now();
        assert!(b.would_count(NS, &p, 1, t0), "no breaker yet");
        fail(&b, &p, 1, t0);
        assert!(!b.would_count(NS, &p, 1, t0), "connection 1 used its share");
        assert!(b.would_count(NS, &p, 2, t0));
        assert!(
            b.would_count(NS, &p, 1, t0 + p.window + ms(1)),
            "left the window"
        );
        fail(&b, &p, 2, t0);
        fail(&b, &p, 3, t0);
        assert_eq!(b.state(NS), State::Open);
        assert!(!b.would_count(NS, &p, 4, t0), "open already");
    }

    #[test]
    fn errors_outside_the_window_do_not_add_up() {
        let b = Breakers::default();
        let p = fallback();
        let t0 = Instant::now();
        fail(&b, &p, 1, t0);
        fail(&b, &p, 2, t0 + Duration::from_secs(5));
        // The first error has left the 10 s window by now.
        assert!(fail(&b, &p, 3, t0 + Duration::from_secs(11)).is_none());
        assert!(fail(&b, &p, 4, t0 + Duration::from_secs(12)).is_some());
    }

    #[test]
    fn an_open_strict_breaker_sends_every_read_bounded_and_closes_on_a_streak() {
        let b = Breakers::default();
        let p = strict();
        let t0 = Instant::now();
        opened(&b, &p, t0);
        assert_eq!(
            b.admit(NS, &p, 99, false, t0),
            Admission::Bounded {
                reason: Reason::StaleRouting,
                errors: 3
            }
        );
        // Answers from one connection only: not enough, however many.
        for i in 1..=10 {
            assert!(sample(&b, &p, Sample::Answered, 5, t0 + ms(200 * i)).is_none());
        }
        assert_eq!(b.state(NS), State::Open);
        // A failure starts the streak over.
        sample(&b, &p, Sample::Failed, 6, t0 + ms(2_100));
        assert_eq!(b.snapshot()[0].streak, 0);
        // Two connections, but one connection's answers count once per min_cooldown (its
        // share): 5 again within the second adds nothing.
        let s = t0 + ms(3_000);
        assert!(sample(&b, &p, Sample::Answered, 5, s).is_none());
        assert!(sample(&b, &p, Sample::Answered, 6, s + ms(100)).is_none());
        assert!(sample(&b, &p, Sample::Answered, 5, s + ms(200)).is_none());
        assert_eq!(b.snapshot()[0].streak, 2);
        // An unknown ending (client gone) changes nothing.
        assert!(sample(&b, &p, Sample::Unknown, 7, s + ms(300)).is_none());
        let t = sample(&b, &p, Sample::Answered, 5, s + ms(1_000)).expect("closes");
        assert_eq!((t.from, t.to), (State::Open, State::Closed));
        assert!(
            t.reason.contains("3 samples answered in a row"),
            "{}",
            t.reason
        );
        assert_eq!(b.admit(NS, &p, 99, false, s + ms(1_000)), Admission::Closed);
    }

    /// The partial incident: one secondary stale, one healthy; samples alternate. The
    /// breaker must not flap.
    #[test]
    fn a_half_stale_shard_does_not_make_it_flap() {
        let b = Breakers::default();
        let p = strict();
        let t0 = Instant::now();
        opened(&b, &p, t0);
        let mut transitions = 0;
        for i in 0..600u64 {
            // 20 samples a second for 30 s, from 4 connections; every other one fails,
            // two answered in a row now and then.
            let outcome = if i % 3 == 0 {
                Sample::Failed
            } else {
                Sample::Answered
            };
            if sample(&b, &p, outcome, 1 + i % 4, t0 + ms(50 * i)).is_some() {
                transitions += 1;
            }
        }
        assert_eq!(transitions, 0);
        assert_eq!(b.state(NS), State::Open);
    }

    #[test]
    fn refuse_mode_probes_one_at_a_time() {
        let b = Breakers::default();
        let mut p = strict();
        p.on_open = crate::policy::OnOpen::Refuse;
        let t0 = Instant::now();
        opened(&b, &p, t0);
        // The first probe after min_cooldown.
        assert!(
            matches!(b.admit(NS, &p, 99, false, t0 + ms(999)), Admission::Open { probe_in, .. } if probe_in == ms(1))
        );
        assert_eq!(b.admit(NS, &p, 99, false, t0 + ms(1_000)), Admission::Probe);
        assert!(
            matches!(
                b.admit(NS, &p, 99, false, t0 + ms(1_000)),
                Admission::Open { .. }
            ),
            "one at a time"
        );
    }

    #[test]
    fn probe_mode_backs_off_on_failures_and_probes_at_once_after_an_answer() {
        let b = Breakers::default();
        let mut p = fallback();
        p.cooldown = Duration::from_secs(10);
        let t0 = Instant::now();
        opened(&b, &p, t0);
        let mut now = t0;
        // Waits of 1 s (min_cooldown), then 1, 2, 4, 8, and 10 (the cap) for good; each
        // probe taken by another connection than the last.
        for (conn, wait) in [1, 1, 2, 4, 8, 10, 10].into_iter().enumerate() {
            let (conn, w) = (conn as u64 + 10, Duration::from_secs(wait));
            assert!(
                matches!(b.admit(NS, &p, conn, false, now), Admission::Open { probe_in, .. } if probe_in == w),
                "{wait}"
            );
            now += w;
            assert_eq!(b.admit(NS, &p, conn, false, now), Admission::Probe);
            assert!(sample(&b, &p, Sample::Failed, conn, now).is_none());
        }
        // An answered probe: the next read probes at once, and the wait starts over.
        now += Duration::from_secs(10);
        assert_eq!(b.admit(NS, &p, 1, false, now), Admission::Probe);
        sample(&b, &p, Sample::Answered, 1, now);
        assert_eq!(b.admit(NS, &p, 2, false, now), Admission::Probe);
        sample(&b, &p, Sample::Failed, 2, now);
        assert!(
            matches!(b.admit(NS, &p, 1, false, now), Admission::Open { probe_in, .. } if probe_in == Duration::from_secs(1))
        );
        // Three answers from two connections over a second close it.
        let mut at = now + Duration::from_secs(1);
        for conn in [1, 2, 1] {
            assert_eq!(b.admit(NS, &p, conn, false, at), Admission::Probe);
            sample(&b, &p, Sample::Answered, conn, at);
            at += ms(500);
        }
        assert_eq!(b.state(NS), State::Closed);
    }

    /// Probes go round robin: the connection that took the last one waits `min_cooldown`
    /// past the due time for another to take the next; alone, it still probes.
    #[test]
    fn probes_go_round_robin_across_connections() {
        let b = Breakers::default();
        let p = fallback();
        let t0 = Instant::now();
        opened(&b, &p, t0);
        let due = t0 + Duration::from_secs(1);
        assert_eq!(b.admit(NS, &p, 1, false, due), Admission::Probe);
        sample(&b, &p, Sample::Answered, 1, due);
        // Due again at once, but not for connection 1 ...
        assert!(matches!(
            b.admit(NS, &p, 1, false, due),
            Admission::Open { probe_in, .. } if probe_in == Duration::from_secs(1)
        ));
        // ... which another connection takes.
        assert_eq!(b.admit(NS, &p, 2, false, due), Admission::Probe);
        sample(&b, &p, Sample::Answered, 2, due + ms(10));
        // Alone, connection 2 waits its turn, then probes.
        assert!(matches!(
            b.admit(NS, &p, 2, false, due + ms(20)),
            Admission::Open { .. }
        ));
        let later = due + ms(10) + p.min_cooldown;
        assert_eq!(b.admit(NS, &p, 2, false, later), Admission::Probe);
    }

    /// A connection that has not proved itself never holds the probe while a proven one
    /// could take it: its neutral samples, however many, leave the slot to the readers whose
    /// answers close the breaker; it probes only when none has for `cooldown` past the due
    /// time.
    #[test]
    fn unproven_connections_leave_the_probe_to_proven_ones() {
        let b = Breakers::default();
        let p = fallback();
        let t0 = Instant::now();
        opened(&b, &p, t0);
        let due = t0 + p.min_cooldown;
        // Due, and many unproven connections come first: none takes it.
        for conn in 100..120 {
            assert!(matches!(
                b.admit_as(NS, &p, conn, false, false, due),
                Admission::Open { probe_in, .. } if probe_in == p.cooldown
            ));
        }
        // A proven connection takes it, and a streak from proven ones closes the breaker
        // while unproven ones keep asking in between.
        let mut at = due;
        for (i, conn) in [1, 2, 1].into_iter().enumerate() {
            assert_eq!(
                b.admit_as(NS, &p, conn, false, true, at),
                Admission::Probe,
                "{i}"
            );
            assert!(matches!(
                b.admit_as(NS, &p, 100 + i as u64, false, false, at + ms(1)),
                Admission::Open { .. }
            ));
            let t = sample(&b, &p, Sample::Answered, conn, at + ms(5));
            assert_eq!(t.is_some(), i == 2, "{i}");
            at += p.min_cooldown;
        }
        assert_eq!(b.state(NS), State::Closed);
        // With no proven reader at all, an unproven one probes once the probe has waited
        // `cooldown` past its due time (and since the last sample was heard).
        let t1 = at + Duration::from_secs(60);
        opened(&b, &p, t1);
        let due = t1 + p.min_cooldown;
        assert!(matches!(
            b.admit_as(NS, &p, 100, false, false, due + p.cooldown - ms(1)),
            Admission::Open { .. }
        ));
        assert_eq!(
            b.admit_as(NS, &p, 100, false, false, due + p.cooldown),
            Admission::Probe
        );
        sample(&b, &p, Sample::Unknown, 100, due + p.cooldown + ms(10));
        assert!(matches!(
            b.admit_as(NS, &p, 101, false, false, due + p.cooldown + ms(20)),
            Admission::Open { .. }
        ));
        assert_eq!(
            b.admit_as(NS, &p, 1, false, true, due + p.cooldown + ms(20)),
            Admission::Probe
        );
    }

    /// Bound mode sends every read bounded, but one at a time goes as a probe (unbounded):
    /// a namespace whose healthy reads take longer than the bound still closes.
    #[test]
    fn bound_mode_lets_one_unbounded_probe_through_at_a_time() {
        let b = Breakers::default();
        let p = strict();
        let t0 = Instant::now();
        opened(&b, &p, t0);
        let due = t0 + p.min_cooldown;
        assert!(matches!(
            b.admit(NS, &p, 1, false, due - ms(1)),
            Admission::Bounded { .. }
        ));
        assert_eq!(b.admit(NS, &p, 1, false, due), Admission::Probe);
        // One at a time: the others are bounded meanwhile.
        assert!(matches!(
            b.admit(NS, &p, 2, false, due),
            Admission::Bounded { .. }
        ));
        // The slow probe answers; the next one goes from another connection at once.
        // The slow probe answers: while samples are answered no unbounded probe is needed;
        // after min_cooldown without one, the next goes (from another connection).
        let answered = due + ms(1_200);
        sample(&b, &p, Sample::Answered, 1, answered);
        assert!(matches!(
            b.admit(NS, &p, 2, false, answered + ms(999)),
            Admission::Bounded { .. }
        ));
        assert_eq!(
            b.admit(NS, &p, 2, false, answered + p.min_cooldown),
            Admission::Probe
        );
    }

    /// A tag-pinned read on a strict namespace with the primary rung is admitted as it
    /// would be without the rung: sent bounded, not refused.
    #[test]
    fn a_read_that_cannot_climb_is_admitted_as_without_the_rung() {
        let b = Breakers::default();
        let mut p = strict();
        p.primary_rung = true;
        let t0 = Instant::now();
        opened(&b, &p, t0);
        assert!(matches!(
            b.admit(NS, &p, 1, true, t0),
            Admission::Open { .. }
        ));
        assert!(matches!(
            b.admit(NS, &p, 1, false, t0),
            Admission::Bounded { .. }
        ));
    }

    #[test]
    fn a_probe_that_never_reports_is_given_up_after_cooldown() {
        let b = Breakers::default();
        let p = fallback();
        let t0 = Instant::now();
        opened(&b, &p, t0);
        let at = t0 + Duration::from_secs(1);
        assert_eq!(b.admit(NS, &p, 99, false, at), Admission::Probe);
        assert!(matches!(
            b.admit(NS, &p, 99, false, at + p.cooldown - ms(1)),
            Admission::Open { .. }
        ));
        assert_eq!(
            b.admit(NS, &p, 99, false, at + p.cooldown),
            Admission::Probe
        );
        b.release_probe(NS);
        assert_eq!(
            b.admit(NS, &p, 99, false, at + p.cooldown),
            Admission::Probe
        );
    }

    #[test]
    fn not_closed_and_transitions_follow_every_change() {
        let metrics = Arc::new(Metrics::new());
        let b = Breakers::with_metrics(10, metrics.clone());
        let p = strict();
        let t0 = Instant::now();
        assert_eq!(b.not_closed(), 0);
        opened(&b, &p, t0);
        assert_eq!(b.not_closed(), 1);
        for (at, conn) in [(0, 1), (400, 2), (1_000, 1)] {
            sample(&b, &p, Sample::Answered, conn, t0 + ms(at));
        }
        assert_eq!(b.state(NS), State::Closed);
        assert_eq!(b.not_closed(), 0);
        let text = metrics.render();
        assert!(
            text.contains(r#"staleguard_breaker_transitions_total{namespace="demo.inv",from="closed",to="open"} 1"#),
            "{text}"
        );
        assert!(text.contains(r#"staleguard_breaker_transitions_total{namespace="demo.inv",from="open",to="closed"} 1"#));
        // Held open by the watch, then dropped by a reload: the count goes back to 0.
        assert!(b.hold_open("demo.other", "stall", t0).is_some());
        assert_eq!(b.not_closed(), 1);
        b.retain(|ns| ns != "demo.other");
        assert_eq!(b.not_closed(), 0);
        assert_eq!(b.admit(NS, &p, 99, false, t0), Admission::Closed);
    }

    #[test]
    fn a_cooldown_past_the_clock_never_overflows() {
        let b = Breakers::default();
        let mut p = fallback();
        p.min_connections = 1;
        p.threshold = 1;
        p.cooldown = Duration::MAX;
        p.min_cooldown = Duration::MAX;
        let t0 = Instant::now();
        fail(&b, &p, 1, t0);
        assert!(matches!(
            b.admit(NS, &p, 99, false, t0 + Duration::from_secs(1)),
            Admission::Open { .. }
        ));
    }

    #[test]
    fn a_full_map_evicts_the_idlest_closed_breaker() {
        let b = Breakers::new(3);
        let mut p = fallback();
        p.min_connections = 1;
        p.threshold = 1;
        let mut closed = p.clone();
        closed.threshold = 2;
        let t0 = Instant::now();
        let f = |ns: &str, p: &NsPolicy, conn, at| {
            let e = Counted {
                policy: p,
                reason: Reason::TimeLimit,
                what: "50",
                conn,
            };
            b.record_failure(ns, &e, at)
        };
        f("a.open", &p, 1, t0);
        f("a.old", &closed, 1, t0);
        f("a.new", &closed, 1, t0 + ms(5));
        // A new namespace takes the slot of the idlest closed one and can open.
        let t = f("a.fresh", &p, 1, t0 + ms(10));
        assert_eq!(t.expect("opens").to, State::Open);
        let names: Vec<String> = b.snapshot().into_iter().map(|s| s.ns).collect();
        assert_eq!(names, ["a.fresh", "a.new", "a.open"]);
        // Full of open breakers: a new one is not tracked.
        f("a.new", &p, 2, t0 + ms(10));
        assert!(f("a.x", &p, 1, t0 + ms(10)).is_none());
        assert_eq!(b.len(), 3);
    }

    #[test]
    fn held_breakers_stay_open_until_released_then_probe_at_once() {
        let b = Breakers::default();
        let p = fallback();
        let t0 = Instant::now();
        let t = b.hold_open(NS, "write stall", t0).expect("opens");
        assert_eq!((t.from, t.to), (State::Closed, State::Open));
        assert!(b.hold_open(NS, "again", t0).is_none(), "held once");
        let later = t0 + Duration::from_secs(300);
        assert!(matches!(
            b.admit(NS, &p, 99, false, later),
            Admission::Open {
                reason: Reason::WriteStall,
                ..
            }
        ));
        // Samples do not close a held breaker.
        assert!(sample(&b, &p, Sample::Answered, 1, later).is_none());
        assert_eq!(b.release_held(later), [NS]);
        assert!(!b.is_held(NS));
        assert_eq!(b.admit(NS, &p, 99, false, later), Admission::Probe);
    }

    #[test]
    fn a_cleared_write_stall_lets_open_breakers_probe_at_once() {
        let b = Breakers::default();
        let p = fallback();
        let t0 = Instant::now();
        opened(&b, &p, t0);
        let mut now = t0;
        for (conn, wait) in [(1, 1), (2, 1), (3, 2)] {
            now += Duration::from_secs(wait);
            assert_eq!(b.admit(NS, &p, conn, false, now), Admission::Probe);
            sample(&b, &p, Sample::Failed, conn, now);
        }
        assert!(matches!(
            b.admit(NS, &p, 4, false, now),
            Admission::Open { .. }
        ));
        assert_eq!(b.probe_early(), [NS]);
        assert!(b.probe_early().is_empty(), "once");
        assert_eq!(b.admit(NS, &p, 4, false, now + ms(1)), Admission::Probe);
    }

    #[test]
    fn holding_a_breaker_open_on_its_own_errors_keeps_its_reason() {
        let b = Breakers::default();
        let p = fallback();
        let t0 = Instant::now();
        opened(&b, &p, t0);
        assert!(b.hold_open(NS, "write stall", t0).is_none());
        assert!(b.is_held(NS));
        match b.admit(NS, &p, 99, false, t0 + Duration::from_secs(60)) {
            Admission::Open { reason, .. } => assert_eq!(reason, Reason::StaleRouting),
            other => panic!("expected open, got {other:?}"),
        }
    }

    #[test]
    fn backoff_never_overflows_and_respects_the_cap() {
        let mut p = fallback();
        p.cooldown = Duration::from_secs(10);
        assert_eq!(backoff(&p, 0), Duration::from_secs(1));
        assert_eq!(backoff(&p, 1), Duration::from_secs(1));
        assert_eq!(backoff(&p, 4), Duration::from_secs(8));
        assert_eq!(backoff(&p, 40), Duration::from_secs(10));
        assert_eq!(backoff(&p, u32::MAX), Duration::from_secs(10));
    }

    #[test]
    fn codes_map_to_reasons_and_unretried_reply_codes() {
        assert_eq!(Reason::of_code(13388), Reason::StaleRouting);
        assert_eq!(Reason::of_code(249), Reason::StaleRouting);
        assert_eq!(Reason::of_code(50), Reason::TimeLimit);
        assert_eq!(Reason::of_code(262), Reason::TimeLimit);
        // Neither reply code is in the drivers' retryable-reads list.
        let retryable = [
            262, 11600, 11602, 10107, 13435, 13436, 189, 134, 91, 7, 6, 89, 9001,
        ];
        for r in [Reason::StaleRouting, Reason::TimeLimit] {
            assert!(!retryable.contains(&r.reply_code().0));
        }
    }
}
