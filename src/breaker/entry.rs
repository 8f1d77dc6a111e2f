//! One namespace's breaker: its state, the window of trigger errors (with the connection
//! each came from), and the cooldown arithmetic. [`super::Breakers`] holds them in its map
//! and makes every transition through the methods here.

use std::collections::VecDeque;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use tokio::time::Instant;

use super::{Reason, State, Transition};
use crate::policy::{Admission, NsPolicy};

#[derive(Debug)]
pub(super) struct Breaker {
    pub(super) state: State,
    /// Counted trigger errors inside the window, oldest first, with the client connection
    /// each came from (at most `max(threshold, min_connections * per_connection)` kept).
    pub(super) errors: VecDeque<(Instant, u64)>,
    /// The last error counted or refused, or the creation: how long it has been idle.
    pub(super) last_seen: Instant,
    pub(super) opened_at: Instant,
    pub(super) reason: Reason,
    /// When the half-open probe was let through, if one is out.
    pub(super) probe_since: Option<Instant>,
    pub(super) last_transition: Instant,
    pub(super) last_reason: String,
    /// Held open by the write-stall watch: no probe until released.
    pub(super) held: bool,
    /// Failed probes since the breaker opened: the cooldown is `min_cooldown * 2^step`.
    pub(super) step: u32,
    /// The next read may probe without waiting out the cooldown (the stall cleared).
    pub(super) early: bool,
    /// When an eligible read last met it, in ms since `Breakers::epoch` (0: never); kept
    /// by `Breakers::touch` under the map's read lock.
    pub(super) last_read: AtomicU64,
}

impl Breaker {
    pub(super) fn new(now: Instant) -> Breaker {
        Breaker {
            state: State::Closed,
            errors: VecDeque::new(),
            last_seen: now,
            opened_at: now,
            reason: Reason::StaleRouting,
            probe_since: None,
            last_transition: now,
            last_reason: String::from("created"),
            held: false,
            step: 0,
            early: false,
            last_read: AtomicU64::new(0),
        }
    }

    /// How long this opening lasts: zero after an early-probe signal, else
    /// `min_cooldown * 2^step`, at most `cooldown`.
    pub(super) fn cooldown(&self, policy: &NsPolicy) -> Duration {
        if self.early {
            return Duration::ZERO;
        }
        backoff(policy, self.step)
    }

    pub(super) fn move_to(&mut self, to: State, reason: String, now: Instant) -> Transition {
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

    pub(super) fn open(&mut self, reason: Reason, why: String, now: Instant) -> Transition {
        self.opened_at = now;
        self.early = false;
        self.reason = reason;
        self.probe_since = None;
        self.move_to(State::Open, why, now)
    }

    /// What an eligible read meets now. `Instant + cooldown` is checked: a deadline past
    /// the clock's range is never reached.
    /// An opening lasts [`Breaker::cooldown`]; a probe that never reports is given up
    /// after the full `cooldown`.
    pub(super) fn waiting(&self, policy: &NsPolicy, now: Instant) -> Wait {
        let until = |from: Instant, cooldown: Duration| match from.checked_add(cooldown) {
            Some(at) if now >= at => Wait::Probe,
            Some(at) => Wait::For(at - now),
            None => Wait::For(cooldown),
        };
        match self.state {
            State::Closed => Wait::Closed,
            // Unknown while held: the cooldown starts when the write stall clears.
            State::Open if self.held => Wait::For(policy.cooldown),
            State::Open => until(self.opened_at, self.cooldown(policy)),
            State::HalfOpen => match self.probe_since {
                Some(since) => until(since, policy.cooldown),
                None => Wait::Probe,
            },
        }
    }

    pub(super) fn admission(&self, probe_in: Duration) -> Admission {
        Admission::Open {
            reason: self.reason,
            probe_in,
            errors: self.errors.len() as u32,
        }
    }

    /// Counts a trigger error from connection `conn` unless that connection already
    /// counted `per_connection` within the window; false when it was not counted.
    pub(super) fn count(&mut self, policy: &NsPolicy, conn: u64, now: Instant) -> bool {
        self.last_seen = now;
        let window = policy.window;
        while self
            .errors
            .front()
            .is_some_and(|&(t, _)| now.saturating_duration_since(t) > window)
        {
            self.errors.pop_front();
        }
        let from_conn = self.errors.iter().filter(|&&(_, c)| c == conn).count();
        if from_conn >= policy.per_connection.max(1) as usize {
            return false;
        }
        self.errors.push_back((now, conn));
        while self.errors.len() > keep(policy) {
            self.errors.pop_front();
        }
        true
    }

    /// The window holds enough to open: `threshold` errors from `min_connections`
    /// connections.
    pub(super) fn enough(&self, policy: &NsPolicy) -> bool {
        self.errors.len() >= policy.threshold as usize
            && distinct_at_least(&self.errors, policy.min_connections as usize)
    }
}

/// The window entries a breaker keeps: enough to hold `threshold` errors, and (as each
/// connection holds at most `per_connection`) enough to hold `min_connections` connections.
pub(super) fn keep(policy: &NsPolicy) -> usize {
    let per_conns = policy.min_connections as usize * policy.per_connection.max(1) as usize;
    (policy.threshold.max(1) as usize).max(per_conns)
}

/// At least `n` distinct connections among `errors` (n is at most `MAX_MIN_CONNECTIONS`).
pub(super) fn distinct_at_least(errors: &VecDeque<(Instant, u64)>, n: usize) -> bool {
    let mut seen = [0u64; crate::policy::MAX_MIN_CONNECTIONS as usize];
    let mut found = 0;
    for &(_, conn) in errors {
        if found >= n {
            break;
        }
        if !seen[..found].contains(&conn) && found < seen.len() {
            seen[found] = conn;
            found += 1;
        }
    }
    found >= n
}

/// What a breaker lets an eligible read do now.
pub(super) enum Wait {
    Closed,
    /// Act as open; a probe is let through in this long.
    For(Duration),
    /// The cooldown is over: this read may be the probe.
    Probe,
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
