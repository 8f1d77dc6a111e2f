//! Circuit breakers, one per exact namespace (`db.coll`) that has a policy: a sliding window
//! of trigger errors opens it, it stays open for `cooldown`, then lets one probe through.
//!
//! The write-stall watch may also *hold* a breaker open (`hold`): it stays open, without a
//! probe, while the signal lasts; releasing it then starts an ordinary cooldown, so the
//! breaker returns through its usual half-open probe.
//!
//! Every transition is logged and counted here, by the method that makes it; callers get
//! the transition back only to look at it.

mod hold;

use std::collections::VecDeque;
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

#[derive(Debug)]
struct Breaker {
    state: State,
    /// Trigger errors inside the window, oldest first (at most `threshold` kept).
    errors: VecDeque<Instant>,
    opened_at: Instant,
    reason: Reason,
    /// When the half-open probe was let through, if one is out.
    probe_since: Option<Instant>,
    last_transition: Instant,
    last_reason: String,
    /// Held open by the write-stall watch: no probe until released.
    held: bool,
}

impl Breaker {
    fn new(now: Instant) -> Breaker {
        Breaker {
            state: State::Closed,
            errors: VecDeque::new(),
            opened_at: now,
            reason: Reason::StaleRouting,
            probe_since: None,
            last_transition: now,
            last_reason: String::from("created"),
            held: false,
        }
    }

    fn move_to(&mut self, to: State, reason: String, now: Instant) -> Transition {
        let t = Transition {
            from: self.state,
            to,
            reason: reason.clone(),
        };
        self.state = to;
        self.last_transition = now;
        self.last_reason = reason;
        t
    }

    fn open(&mut self, reason: Reason, why: String, now: Instant) -> Transition {
        self.opened_at = now;
        self.reason = reason;
        self.probe_since = None;
        self.move_to(State::Open, why, now)
    }
}

/// A snapshot of one breaker, for status pages and tests.
#[derive(Debug, Clone)]
pub struct Snapshot {
    pub ns: String,
    pub state: State,
    pub errors_in_window: usize,
    pub reason: Reason,
    pub since: Instant,
    pub last_reason: String,
    /// Held open by the write-stall watch.
    pub held: bool,
}

/// All breakers. Bounded: past `max` namespaces, new ones are not tracked (they behave as
/// closed), so a flood of random names cannot grow memory.
#[derive(Debug)]
pub struct Breakers {
    map: DashMap<String, Breaker>,
    max: usize,
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
            max,
            metrics,
            hold: Mutex::new(None),
        }
    }

    /// Logs and counts a transition of `ns` (the one place that does).
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
        // Fast path under a read lock: no breaker yet, closed, or open with nothing to
        // change (the common cases, every request while a breaker is open included).
        {
            let Some(b) = self.map.get(ns) else {
                return (Admission::Closed, None);
            };
            let open = |probe_in| Admission::Open {
                reason: b.reason,
                probe_in,
                errors: b.errors.len() as u32,
            };
            match b.state {
                State::Closed => return (Admission::Closed, None),
                // Unknown while held: the cooldown starts when the write stall clears.
                State::Open if b.held => return (open(policy.cooldown), None),
                State::Open if now < b.opened_at + policy.cooldown => {
                    return (open(b.opened_at + policy.cooldown - now), None)
                }
                State::HalfOpen => match b.probe_since {
                    Some(since) if now < since + policy.cooldown => {
                        return (open(since + policy.cooldown - now), None)
                    }
                    _ => {}
                },
                State::Open => {}
            }
        }
        // Something changes: take the write lock and decide again (another session may have
        // moved the breaker in between).
        let Some(mut b) = self.map.get_mut(ns) else {
            return (Admission::Closed, None);
        };
        match b.state {
            State::Closed => (Admission::Closed, None),
            State::Open if b.held => (
                Admission::Open {
                    reason: b.reason,
                    // Unknown: the cooldown starts when the write stall clears.
                    probe_in: policy.cooldown,
                    errors: b.errors.len() as u32,
                },
                None,
            ),
            State::Open => {
                let reopen = b.opened_at + policy.cooldown;
                if now >= reopen {
                    let t = b.move_to(State::HalfOpen, "cooldown elapsed".into(), now);
                    b.probe_since = Some(now);
                    (Admission::Probe, Some(t))
                } else {
                    let errors = b.errors.len() as u32;
                    (
                        Admission::Open {
                            reason: b.reason,
                            probe_in: reopen - now,
                            errors,
                        },
                        None,
                    )
                }
            }
            State::HalfOpen => match b.probe_since {
                // A probe that never reported (its client vanished without us noticing) is
                // given up after one cooldown, so the breaker cannot stick half-open.
                Some(since) if now < since + policy.cooldown => (
                    Admission::Open {
                        reason: b.reason,
                        probe_in: since + policy.cooldown - now,
                        errors: b.errors.len() as u32,
                    },
                    None,
                ),
                _ => {
                    b.probe_since = Some(now);
                    (Admission::Probe, None)
                }
            },
        }
    }

    /// Counts a trigger error on `ns`. `probe` says the request was the half-open probe.
    pub fn record_failure(
        &self,
        ns: &str,
        policy: &NsPolicy,
        reason: Reason,
        what: &str,
        probe: bool,
        now: Instant,
    ) -> Option<Transition> {
        let t = self.count_failure(ns, policy, reason, what, probe, now);
        self.report(ns, t)
    }

    fn count_failure(
        &self,
        ns: &str,
        policy: &NsPolicy,
        reason: Reason,
        what: &str,
        probe: bool,
        now: Instant,
    ) -> Option<Transition> {
        let mut b = match self.map.get_mut(ns) {
            Some(b) => b,
            None => {
                if self.map.len() >= self.max {
                    return None;
                }
                self.map
                    .entry(ns.to_string())
                    .or_insert_with(|| Breaker::new(now));
                self.map.get_mut(ns)?
            }
        };
        let window = policy.window;
        while b
            .errors
            .front()
            .is_some_and(|&t| now.saturating_duration_since(t) > window)
        {
            b.errors.pop_front();
        }
        b.errors.push_back(now);
        while b.errors.len() > policy.threshold.max(1) as usize {
            b.errors.pop_front();
        }
        match b.state {
            State::Closed if b.errors.len() >= policy.threshold as usize => {
                let why = format!(
                    "{} trigger errors within {:?} (last: {what})",
                    b.errors.len(),
                    window
                );
                Some(b.open(reason, why, now))
            }
            State::HalfOpen if probe => Some(b.open(reason, format!("probe failed: {what}"), now)),
            _ => None,
        }
    }

    /// Reports a read on `ns` that answered without a trigger error.
    pub fn record_success(&self, ns: &str, probe: bool, now: Instant) -> Option<Transition> {
        let t = {
            let mut b = self.map.get_mut(ns)?;
            if !(probe && b.state == State::HalfOpen) {
                return None;
            }
            b.errors.clear();
            b.probe_since = None;
            b.move_to(State::Closed, "probe succeeded".into(), now)
        };
        self.report(ns, Some(t))
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

    pub fn snapshot(&self) -> Vec<Snapshot> {
        let mut v: Vec<Snapshot> = self
            .map
            .iter()
            .map(|e| Snapshot {
                ns: e.key().clone(),
                state: e.state,
                errors_in_window: e.errors.len(),
                reason: e.reason,
                since: e.last_transition,
                last_reason: e.last_reason.clone(),
                held: e.held,
            })
            .collect();
        v.sort_by(|a, b| a.ns.cmp(&b.ns));
        v
    }

    /// Drops breakers whose namespace no longer has an acting policy (after a reload).
    pub fn retain(&self, keep: impl Fn(&str) -> bool) {
        self.map.retain(|k, _| keep(k));
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
        }
    }

    fn fail(b: &Breakers, p: &NsPolicy, now: Instant, probe: bool) -> Option<Transition> {
        b.record_failure("demo.inv", p, Reason::StaleRouting, "13388", probe, now)
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
    fn held_breakers_stay_open_until_released_then_probe_after_cooldown() {
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
        // The cooldown starts at the release.
        assert!(matches!(
            b.admit("demo.inv", &p, later + Duration::from_secs(29)).0,
            Admission::Open { .. }
        ));
        assert_eq!(
            b.admit("demo.inv", &p, later + Duration::from_secs(30)).0,
            Admission::Probe
        );
        b.record_success("demo.inv", true, later + Duration::from_secs(30));
        assert_eq!(b.state("demo.inv"), State::Closed);
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
            b.record_failure(ns, &p, Reason::TimeLimit, "50", false, now);
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
