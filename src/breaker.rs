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

mod hold;

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

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
    /// Failed probes since the breaker opened: the cooldown is `min_cooldown * 2^step`.
    step: u32,
    /// The next read may probe without waiting out the cooldown (the stall cleared).
    early: bool,
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
            step: 0,
            early: false,
        }
    }

    /// How long this opening lasts: zero after an early-probe signal, else
    /// `min_cooldown * 2^step`, at most `cooldown`.
    fn cooldown(&self, policy: &NsPolicy) -> Duration {
        if self.early {
            return Duration::ZERO;
        }
        backoff(policy, self.step)
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
        self.early = false;
        self.reason = reason;
        self.probe_since = None;
        self.move_to(State::Open, why, now)
    }
}

/// The cooldown after `step` failed probes: `min_cooldown` doubled `step` times, at most
/// `cooldown` (and never below it when `min_cooldown` is larger).
pub fn backoff(policy: &NsPolicy, step: u32) -> Duration {
    let factor = 1u32.checked_shl(step).unwrap_or(u32::MAX);
    policy
        .min_cooldown
        .checked_mul(factor)
        .map_or(policy.cooldown, |d| d.min(policy.cooldown))
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
    /// When it opened (or was released by the write-stall watch).
    pub opened_at: Instant,
    /// Failed probes since it opened.
    pub step: u32,
    /// Its next read probes at once (the write stall cleared).
    pub early: bool,
}

impl Snapshot {
    /// When an open breaker lets its next probe through under `policy` (`None` while held,
    /// or when not open).
    pub fn next_probe(&self, policy: &NsPolicy) -> Option<Instant> {
        match self.state {
            State::Open if !self.held && self.early => Some(self.opened_at),
            State::Open if !self.held => Some(self.opened_at + backoff(policy, self.step)),
            _ => None,
        }
    }
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
                State::Open if now < b.opened_at + b.cooldown(policy) => {
                    return (open(b.opened_at + b.cooldown(policy) - now), None)
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
                let reopen = b.opened_at + b.cooldown(policy);
                if now >= reopen {
                    let why = if b.early {
                        "write stall cleared: early probe"
                    } else {
                        "cooldown elapsed"
                    };
                    b.early = false;
                    let t = b.move_to(State::HalfOpen, why.into(), now);
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
                b.step = 0;
                let why = format!(
                    "{} trigger errors within {:?} (last: {what})",
                    b.errors.len(),
                    window
                );
                Some(b.open(reason, why, now))
            }
            State::HalfOpen if probe => {
                b.step = b.step.saturating_add(1);
                let next = backoff(policy, b.step);
                let why = format!(
                    "probe failed: {what}; next probe in {}",
                    humantime::format_duration(next)
                );
                Some(b.open(reason, why, now))
            }
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
            b.step = 0;
            b.move_to(State::Closed, "probe succeeded".into(), now)
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
                opened_at: e.opened_at,
                step: e.step,
                early: e.early,
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
