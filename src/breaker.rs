//! Circuit breakers, one per exact namespace (`db.coll`) that has a policy: a sliding window
//! of trigger errors opens it, it stays open for a cooldown, then lets one probe through.
//!
//! The cooldown starts short (`min_cooldown`) and doubles with each failed probe, up to
//! `cooldown`; a probe that succeeds closes the breaker and starts the next opening short
//! again. When the write-stall signal clears, [`Breakers::probe_early`] lets every open
//! breaker probe at once: a healed cluster is noticed at the next read, not a cooldown later.
//!
//! The write-stall watch may also *hold* a breaker open (`hold`): it stays open, without a
//! probe, while the signal lasts; releasing it then lets its next read probe, so the breaker
//! returns through its usual half-open probe as soon as writes complete.
//!
//! Every transition is logged and counted here, by the method that makes it; callers get
//! the transition back only to look at it.
//!
//! Evidence a client cannot fake: each trigger error comes with the id of the client
//! connection whose read met it. A connection counts at most `per_connection` errors within
//! `window`, and the breaker opens only when `threshold` counted errors within `window` come
//! from at least `min_connections` connections (a failed half-open probe re-opens it alone:
//! the breaker already opened on such evidence). The window keeps at most
//! `max(threshold, min_connections * per_connection)` entries, so memory is bounded.
//!
//! The map is bounded per pattern (`bound.rs`): namespaces the config lists exactly always
//! have their breaker; each wildcard pattern has a guaranteed share of the rest and may
//! borrow up to `breaker_share` of it; an open breaker nobody reads expires.

mod bound;
mod entry;
mod hold;
mod snapshot;

pub use entry::backoff;
use entry::{Breaker, Wait};

pub use bound::MIN_EXPIRY;
pub use snapshot::Snapshot;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use dashmap::DashMap;
use tokio::time::Instant;

use crate::metrics::Metrics;
use crate::policy::NsPolicy;

pub use crate::policy::{Admission, Reason};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    Closed,
    Open,
    HalfOpen,
}

impl State {
    pub fn as_str(self) -> &'static str {
        match self {
            State::Closed => "closed",
            State::Open => "open",
            State::HalfOpen => "half-open",
        }
    }

    /// The value of the `breaker_state` gauge.
    pub fn gauge(self) -> i64 {
        match self {
            State::Closed => 0,
            State::HalfOpen => 1,
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
    /// Breakers not closed (open or half-open). Changed under the breaker's map lock by
    /// [`Breakers::moved`]; while it is 0 every read is admitted without touching the map
    /// (a read of a line that changes only on transitions, no lock taken).
    not_closed: AtomicUsize,
    /// Where transitions are counted (`breaker_state`).
    metrics: Arc<Metrics>,
    /// While the write-stall watch holds fallback breakers open: why (see `hold`).
    hold: Mutex<Option<String>>,
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
        }
    }

    /// Logs and counts a transition of `ns` (the one place that does).
    /// Counts a transition in `not_closed`; called with the breaker's entry still locked,
    /// so the transitions of one breaker are counted in the order they happened.
    fn moved(&self, t: Transition) -> Transition {
        match (t.from == State::Closed, t.to == State::Closed) {
            (true, false) => {
                self.not_closed.fetch_add(1, Ordering::AcqRel);
            }
            (false, true) => {
                self.not_closed.fetch_sub(1, Ordering::AcqRel);
            }
            _ => {}
        }
        t
    }

    /// Open or half-open breakers now.
    pub fn not_closed(&self) -> usize {
        self.not_closed.load(Ordering::Acquire)
    }

    fn report(&self, ns: &str, t: Option<Transition>) -> Option<Transition> {
        if let Some(t) = &t {
            self.metrics.breaker_state(ns, t.to.gauge());
            tracing::warn!(ns = %ns, from = t.from.as_str(), to = t.to.as_str(), reason = %t.reason, "breaker transition");
        }
        t
    }

    /// Decides what an eligible read on `ns` may do now; claims the probe when half-open.
    /// Returns the admission and a transition (open → half-open) when one happened.
    pub fn admit(
        &self,
        ns: &str,
        policy: &NsPolicy,
        now: Instant,
    ) -> (Admission, Option<Transition>) {
        let (a, t) = self.decide_admission(ns, policy, now);
        (a, self.report(ns, t))
    }

    fn decide_admission(
        &self,
        ns: &str,
        policy: &NsPolicy,
        now: Instant,
    ) -> (Admission, Option<Transition>) {
        // No breaker open anywhere (the common case): nothing to look up.
        if self.not_closed.load(Ordering::Acquire) == 0 {
            return (Admission::Closed, None);
        }
        // Fast path under a read lock: no breaker yet, closed, or open with nothing to
        // change (the common cases, every request while a breaker is open included).
        {
            let Some(b) = self.map.get(ns) else {
                return (Admission::Closed, None);
            };
            self.touch(&b, now);
            match b.waiting(policy, now) {
                Wait::Closed => return (Admission::Closed, None),
                Wait::For(probe_in) => return (b.admission(probe_in), None),
                Wait::Probe => {}
            }
        }
        // Something changes: take the write lock and decide again (another session may have
        // moved the breaker in between).
        let Some(mut b) = self.map.get_mut(ns) else {
            return (Admission::Closed, None);
        };
        match b.waiting(policy, now) {
            Wait::Closed => (Admission::Closed, None),
            Wait::For(probe_in) => (b.admission(probe_in), None),
            Wait::Probe if b.state == State::Open => {
                let why = if b.early {
                    "write stall cleared: early probe"
                } else {
                    "cooldown elapsed"
                };
                b.early = false;
                let t = self.moved(b.move_to(State::HalfOpen, why.into(), now));
                b.probe_since = Some(now);
                (Admission::Probe, Some(t))
            }
            // A probe that never reported (its client vanished without us noticing) is
            // given up after one cooldown, so the breaker cannot stick half-open.
            Wait::Probe => {
                b.probe_since = Some(now);
                (Admission::Probe, None)
            }
        }
    }

    /// Counts a trigger error on `ns`, met by a read of client connection `conn`. `probe`
    /// says the request was the half-open probe.
    #[allow(clippy::too_many_arguments)]
    pub fn record_failure(
        &self,
        ns: &str,
        policy: &NsPolicy,
        reason: Reason,
        what: &str,
        probe: bool,
        conn: u64,
        now: Instant,
    ) -> Option<Transition> {
        let t = self.count_failure(ns, policy, reason, what, probe, conn, now);
        self.report(ns, t)
    }

    #[allow(clippy::too_many_arguments)]
    fn count_failure(
        &self,
        ns: &str,
        policy: &NsPolicy,
        reason: Reason,
        what: &str,
        probe: bool,
        conn: u64,
        now: Instant,
    ) -> Option<Transition> {
        let mut b = self.slot(ns, now)?;
        if b.state == State::HalfOpen && probe {
            // The probe is one read sent on the breaker's own terms: its failure re-opens.
            b.count(policy, conn, now);
            b.step = b.step.saturating_add(1);
            let next = backoff(policy, b.step);
            let why = format!(
                "probe failed: {what}; next probe in {}",
                humantime::format_duration(next)
            );
            return Some(self.moved(b.open(reason, why, now)));
        }
        if !b.count(policy, conn, now) {
            self.metrics.limits.ignored("per_connection");
            return None;
        }
        if b.state != State::Closed || !b.enough(policy) {
            return None;
        }
        b.step = 0;
        let why = format!(
            "{} trigger errors within {:?} (last: {what})",
            b.errors.len(),
            policy.window
        );
        Some(self.moved(b.open(reason, why, now)))
    }

    /// Reports a read on `ns` that answered without a trigger error. Only a probe's
    /// answer changes anything: other reads do not touch the map.
    pub fn record_success(&self, ns: &str, probe: bool, now: Instant) -> Option<Transition> {
        if !probe {
            return None;
        }
        let t = {
            let mut b = self.map.get_mut(ns)?;
            if b.state != State::HalfOpen {
                return None;
            }
            b.errors.clear();
            b.probe_since = None;
            b.step = 0;
            self.moved(b.move_to(State::Closed, "probe succeeded".into(), now))
        };
        self.report(ns, Some(t))
    }

    /// The write-stall signal cleared: every open breaker that is not held lets its next
    /// read through as a probe instead of waiting out its cooldown. Returns the namespaces
    /// concerned; holds are ended by [`Breakers::release_held`].
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{Causal, Mode};
    use std::time::Duration;

    fn policy() -> NsPolicy {
        NsPolicy {
            pattern: "demo.inv".into(),
            mode: Mode::Fallback,
            threshold: 3,
            window: Duration::from_secs(10),
            cooldown: Duration::from_secs(30),
            read_preferences: 0xff,
            trigger_codes: vec![13388, 50],
            max_time: None,
            dry_run: false,
            causal: Causal::Drop,
            slow_read: None,
            // The classic fixed cooldown unless a test asks for a short first one.
            min_cooldown: Duration::from_secs(30),
            attempt_share: 0.5,
            attempt_limit: Some(Duration::from_millis(500)),
            primary_rung: false,
            min_wait: Duration::from_secs(1),
            // The transition tests below count errors of one connection; the connection
            // rules have tests of their own.
            min_connections: 1,
            per_connection: 1000,
        }
    }

    fn fail(b: &Breakers, p: &NsPolicy, now: Instant, probe: bool) -> Option<Transition> {
        b.record_failure("demo.inv", p, Reason::StaleRouting, "13388", probe, 1, now)
    }

    fn fail_from(b: &Breakers, p: &NsPolicy, conn: u64, now: Instant) -> Option<Transition> {
        b.record_failure(
            "demo.inv",
            p,
            Reason::StaleRouting,
            "13388",
            false,
            conn,
            now,
        )
    }

    fn defaults() -> NsPolicy {
        NsPolicy::with_defaults("demo.inv", Mode::Fallback)
    }

    #[test]
    fn one_connection_alone_never_opens() {
        let b = Breakers::default();
        let p = defaults();
        let t0 = Instant::now();
        for i in 0..50 {
            assert!(fail_from(&b, &p, 7, t0 + Duration::from_millis(i)).is_none());
        }
        assert_eq!(b.state("demo.inv"), State::Closed);
        // Counted once in the window (per_connection = 1).
        assert_eq!(b.snapshot()[0].errors_in_window, 1);
    }

    #[test]
    fn threshold_errors_from_enough_connections_open() {
        let b = Breakers::default();
        let p = defaults();
        let t0 = Instant::now();
        // Two connections, each counted once: 2 < threshold 3.
        assert!(fail_from(&b, &p, 1, t0).is_none());
        assert!(fail_from(&b, &p, 2, t0).is_none());
        assert!(fail_from(&b, &p, 2, t0).is_none());
        let t = fail_from(&b, &p, 3, t0).expect("third connection opens");
        assert_eq!(t.to, State::Open);
    }

    #[test]
    fn per_connection_cap_and_min_connections_together() {
        let b = Breakers::default();
        let mut p = defaults();
        p.per_connection = 3;
        p.min_connections = 2;
        let t0 = Instant::now();
        for _ in 0..10 {
            assert!(fail_from(&b, &p, 1, t0).is_none(), "one connection");
        }
        assert!(
            fail_from(&b, &p, 2, t0).is_some(),
            "3 from one + 1 from another"
        );
    }

    #[test]
    fn window_memory_is_bounded_by_the_policy() {
        let b = Breakers::default();
        let mut p = defaults();
        p.min_connections = 100;
        let t0 = Instant::now();
        for conn in 0..10_000u64 {
            fail_from(&b, &p, conn, t0);
        }
        // max(threshold 3, 100 connections x 1) entries, not 10,000.
        assert_eq!(b.snapshot()[0].errors_in_window, 100);
        assert_eq!(b.state("demo.inv"), State::Open);
    }

    #[test]
    fn a_failed_probe_reopens_alone() {
        let b = Breakers::default();
        let p = defaults();
        let t0 = Instant::now();
        for conn in 1..=3 {
            fail_from(&b, &p, conn, t0);
        }
        let later = t0 + p.cooldown;
        assert_eq!(b.admit("demo.inv", &p, later).0, Admission::Probe);
        let t = b.record_failure("demo.inv", &p, Reason::TimeLimit, "50", true, 9, later);
        assert_eq!(t.expect("reopens").to, State::Open);
    }

    #[test]
    fn not_closed_follows_every_transition_and_removal() {
        let b = Breakers::default();
        let p = defaults();
        let t0 = Instant::now();
        assert_eq!(b.not_closed(), 0);
        for conn in 1..=3 {
            fail_from(&b, &p, conn, t0);
        }
        assert_eq!(b.not_closed(), 1, "open");
        // Open: reads are not admitted as if closed (the count sends them to the map).
        assert!(matches!(
            b.admit("demo.inv", &p, t0).0,
            Admission::Open { .. }
        ));
        let later = t0 + p.cooldown;
        assert_eq!(b.admit("demo.inv", &p, later).0, Admission::Probe);
        assert_eq!(b.not_closed(), 1, "half-open");
        // A plain read's success changes nothing; the probe's closes.
        assert!(b.record_success("demo.inv", false, later).is_none());
        assert_eq!(b.state("demo.inv"), State::HalfOpen);
        let t = b.record_success("demo.inv", true, later).expect("closes");
        assert_eq!(t.to, State::Closed);
        assert_eq!(b.not_closed(), 0, "closed");
        // Held open by the watch, then dropped by a reload: the count goes back to 0.
        assert!(b.hold_open("demo.other", "stall", later).is_some());
        assert_eq!(b.not_closed(), 1);
        b.retain(|ns| ns != "demo.other");
        assert_eq!(b.not_closed(), 0);
        assert_eq!(b.admit("demo.inv", &p, later).0, Admission::Closed);
    }

    #[test]
    fn a_cooldown_past_the_clock_never_overflows() {
        let b = Breakers::default();
        let mut p = defaults();
        p.min_connections = 1;
        p.threshold = 1;
        let t0 = Instant::now();
        fail_from(&b, &p, 1, t0);
        p.cooldown = Duration::MAX;
        p.min_cooldown = Duration::MAX;
        assert!(matches!(
            b.admit("demo.inv", &p, t0 + Duration::from_secs(1)).0,
            Admission::Open { probe_in, .. } if probe_in == Duration::MAX
        ));
    }

    #[test]
    fn a_full_map_evicts_the_idlest_closed_breaker() {
        let b = Breakers::new(3);
        let mut p = defaults();
        p.min_connections = 1;
        p.threshold = 1;
        let t0 = Instant::now();
        // One open breaker, two closed ones (threshold 2 for them).
        b.record_failure("a.open", &p, Reason::TimeLimit, "50", false, 1, t0);
        let mut closed = p.clone();
        closed.threshold = 2;
        b.record_failure("a.old", &closed, Reason::TimeLimit, "50", false, 1, t0);
        let t1 = t0 + Duration::from_millis(5);
        b.record_failure("a.new", &closed, Reason::TimeLimit, "50", false, 1, t1);
        // A new namespace takes the slot of the idlest closed one and can open.
        let t2 = t0 + Duration::from_millis(10);
        let t = b.record_failure("a.fresh", &p, Reason::TimeLimit, "50", false, 1, t2);
        assert_eq!(t.expect("opens").to, State::Open);
        assert_eq!(b.len(), 3);
        let names: Vec<String> = b.snapshot().into_iter().map(|s| s.ns).collect();
        assert_eq!(names, ["a.fresh", "a.new", "a.open"]);
        // Full of open breakers: a new one is not tracked.
        b.record_failure("a.new", &p, Reason::TimeLimit, "50", false, 2, t2);
        assert!(b
            .record_failure("a.x", &p, Reason::TimeLimit, "50", false, 1, t2)
            .is_none());
        assert_eq!(b.len(), 3);
    }

    #[test]
    fn opens_at_threshold_within_window() {
        let b = Breakers::default();
        let p = policy();
        let t0 = Instant::now();
        assert_eq!(b.admit("demo.inv", &p, t0).0, Admission::Closed);
        assert!(fail(&b, &p, t0, false).is_none());
        assert!(fail(&b, &p, t0 + Duration::from_secs(1), false).is_none());
        let t = fail(&b, &p, t0 + Duration::from_secs(2), false).expect("opens");
        assert_eq!((t.from, t.to), (State::Closed, State::Open));
        match b.admit("demo.inv", &p, t0 + Duration::from_secs(3)).0 {
            Admission::Open {
                reason, probe_in, ..
            } => {
                assert_eq!(reason, Reason::StaleRouting);
                assert_eq!(probe_in, Duration::from_secs(29));
            }
            other => panic!("expected open, got {other:?}"),
        }
    }

    #[test]
    fn errors_outside_the_window_do_not_add_up() {
        let b = Breakers::default();
        let p = policy();
        let t0 = Instant::now();
        fail(&b, &p, t0, false);
        fail(&b, &p, t0 + Duration::from_secs(5), false);
        // The first error has left the 10 s window by now.
        assert!(fail(&b, &p, t0 + Duration::from_secs(11), false).is_none());
        assert_eq!(b.state("demo.inv"), State::Closed);
        assert!(fail(&b, &p, t0 + Duration::from_secs(12), false).is_some());
    }

    #[test]
    fn half_open_lets_one_probe_and_success_closes() {
        let b = Breakers::default();
        let p = policy();
        let t0 = Instant::now();
        for i in 0..3 {
            fail(&b, &p, t0 + Duration::from_millis(i), false);
        }
        let later = t0 + Duration::from_secs(31);
        let (a, t) = b.admit("demo.inv", &p, later);
        assert_eq!(a, Admission::Probe);
        assert_eq!(t.expect("transition").to, State::HalfOpen);
        // A second request while the probe is out is treated as open.
        assert!(matches!(
            b.admit("demo.inv", &p, later).0,
            Admission::Open { .. }
        ));
        let t = b.record_success("demo.inv", true, later).expect("closes");
        assert_eq!((t.from, t.to), (State::HalfOpen, State::Closed));
        assert_eq!(b.admit("demo.inv", &p, later).0, Admission::Closed);
    }

    #[test]
    fn failed_probe_reopens_for_a_full_cooldown() {
        let b = Breakers::default();
        let p = policy();
        let t0 = Instant::now();
        for _ in 0..3 {
            fail(&b, &p, t0, false);
        }
        let later = t0 + Duration::from_secs(30);
        assert_eq!(b.admit("demo.inv", &p, later).0, Admission::Probe);
        let t = fail(&b, &p, later, true).expect("reopens");
        assert_eq!((t.from, t.to), (State::HalfOpen, State::Open));
        match b.admit("demo.inv", &p, later + Duration::from_secs(1)).0 {
            Admission::Open { probe_in, .. } => assert_eq!(probe_in, Duration::from_secs(29)),
            other => panic!("expected open, got {other:?}"),
        }
    }

    #[test]
    fn a_non_probe_success_does_not_close_half_open() {
        let b = Breakers::default();
        let p = policy();
        let t0 = Instant::now();
        for _ in 0..3 {
            fail(&b, &p, t0, false);
        }
        let later = t0 + Duration::from_secs(30);
        assert_eq!(b.admit("demo.inv", &p, later).0, Admission::Probe);
        assert!(b.record_success("demo.inv", false, later).is_none());
        assert_eq!(b.state("demo.inv"), State::HalfOpen);
    }

    #[test]
    fn held_breakers_stay_open_until_released_then_probe_at_once() {
        let b = Breakers::default();
        let p = policy();
        let t0 = Instant::now();
        let t = b.hold_open("demo.inv", "write stall", t0).expect("opens");
        assert_eq!((t.from, t.to), (State::Closed, State::Open));
        assert!(b.hold_open("demo.inv", "again", t0).is_none(), "held once");
        // Long past the cooldown: still open, no probe while held.
        let later = t0 + Duration::from_secs(300);
        assert!(matches!(
            b.admit("demo.inv", &p, later).0,
            Admission::Open {
                reason: Reason::WriteStall,
                ..
            }
        ));
        assert_eq!(b.release_held(later), ["demo.inv"]);
        assert!(!b.is_held("demo.inv"));
        // The stall is over: the next read probes, no cooldown first.
        let (a, t) = b.admit("demo.inv", &p, later);
        assert_eq!(a, Admission::Probe);
        assert_eq!(
            t.expect("half-open").reason,
            "write stall cleared: early probe"
        );
        b.record_success("demo.inv", true, later);
        assert_eq!(b.state("demo.inv"), State::Closed);
    }

    fn short(p: &mut NsPolicy) {
        p.min_cooldown = Duration::from_secs(1);
        p.cooldown = Duration::from_secs(10);
    }

    fn probe_in(b: &Breakers, p: &NsPolicy, now: Instant) -> Option<Duration> {
        match b.admit("demo.inv", p, now).0 {
            Admission::Open { probe_in, .. } => Some(probe_in),
            _ => None,
        }
    }

    #[test]
    fn cooldown_starts_short_and_doubles_on_each_failed_probe_up_to_cooldown() {
        let b = Breakers::default();
        let mut p = policy();
        short(&mut p);
        let mut now = Instant::now();
        for _ in 0..3 {
            fail(&b, &p, now, false);
        }
        // 1 s, then 2, 4, 8, and 10 (the cap) for good.
        for expected in [1, 2, 4, 8, 10, 10] {
            let wait = Duration::from_secs(expected);
            assert_eq!(probe_in(&b, &p, now), Some(wait), "step {expected}");
            assert!(probe_in(&b, &p, now + wait - Duration::from_millis(1)).is_some());
            now += wait;
            assert_eq!(b.admit("demo.inv", &p, now).0, Admission::Probe);
            let t = fail(&b, &p, now, true).expect("reopens");
            assert_eq!(t.to, State::Open);
        }
        // A probe that succeeds closes it and resets the backoff: the next opening is short.
        now += Duration::from_secs(10);
        assert_eq!(b.admit("demo.inv", &p, now).0, Admission::Probe);
        b.record_success("demo.inv", true, now);
        for _ in 0..3 {
            fail(&b, &p, now, false);
        }
        assert_eq!(probe_in(&b, &p, now), Some(Duration::from_secs(1)));
    }

    #[test]
    fn a_cleared_write_stall_lets_open_breakers_probe_at_once() {
        let b = Breakers::default();
        let mut p = policy();
        short(&mut p);
        let t0 = Instant::now();
        for _ in 0..3 {
            fail(&b, &p, t0, false);
        }
        // Backed off to 8 s.
        let mut now = t0;
        for wait in [1, 2, 4] {
            now += Duration::from_secs(wait);
            assert_eq!(b.admit("demo.inv", &p, now).0, Admission::Probe);
            fail(&b, &p, now, true);
        }
        assert_eq!(probe_in(&b, &p, now), Some(Duration::from_secs(8)));
        assert_eq!(b.probe_early(), ["demo.inv"]);
        assert!(b.probe_early().is_empty(), "once");
        let snap = &b.snapshot()[0];
        assert_eq!(snap.next_probe(&p), Some(now));
        let (a, t) = b.admit("demo.inv", &p, now + Duration::from_millis(1));
        assert_eq!(a, Admission::Probe);
        assert_eq!(t.expect("half-open").to, State::HalfOpen);
        // A closed or half-open breaker is left alone.
        assert!(b.probe_early().is_empty());
        // If that probe fails, the backoff goes on from where it was.
        fail(&b, &p, now, true);
        assert_eq!(probe_in(&b, &p, now), Some(Duration::from_secs(10)));
    }

    #[test]
    fn backoff_never_overflows_and_respects_the_cap() {
        let mut p = policy();
        short(&mut p);
        assert_eq!(backoff(&p, 0), Duration::from_secs(1));
        assert_eq!(backoff(&p, 3), Duration::from_secs(8));
        assert_eq!(backoff(&p, 40), Duration::from_secs(10));
        assert_eq!(backoff(&p, u32::MAX), Duration::from_secs(10));
        p.min_cooldown = p.cooldown;
        assert_eq!(backoff(&p, 0), p.cooldown);
    }

    #[test]
    fn holding_a_breaker_open_on_its_own_errors_keeps_its_reason() {
        let b = Breakers::default();
        let p = policy();
        let t0 = Instant::now();
        for _ in 0..3 {
            fail(&b, &p, t0, false);
        }
        assert!(b.hold_open("demo.inv", "write stall", t0).is_none());
        assert!(b.is_held("demo.inv"));
        match b.admit("demo.inv", &p, t0 + Duration::from_secs(60)).0 {
            Admission::Open { reason, .. } => assert_eq!(reason, Reason::StaleRouting),
            other => panic!("expected open, got {other:?}"),
        }
    }

    #[test]
    fn bounded_number_of_breakers() {
        let b = Breakers::new(2);
        let p = policy();
        let now = Instant::now();
        for ns in ["a.x", "a.y", "a.z"] {
            b.record_failure(ns, &p, Reason::TimeLimit, "50", false, 1, now);
        }
        assert_eq!(b.len(), 2);
        assert_eq!(b.state("a.z"), State::Closed);
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
