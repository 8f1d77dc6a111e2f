//! One namespace's breaker: its state, the window of trigger errors (with the connection
//! each came from), the samples taken while it is open, and the probe spacing.
//! [`super::Breakers`] holds them in its map and makes every transition through the methods
//! here.

use std::collections::VecDeque;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use tokio::time::Instant;

use super::{Reason, State, Transition};
use crate::policy::{Admission, NsPolicy, OnOpen};

#[derive(Debug)]
pub(super) struct Breaker {
    pub(super) state: State,
    /// Counted trigger errors inside the window, oldest first, with the client connection
    /// each came from (at most `max(threshold, min_connections * per_connection)` kept).
    pub(super) errors: VecDeque<(Instant, u64)>,
    /// The last error counted or refused, a read admitted while open, or the creation: how
    /// long it has been idle.
    pub(super) last_seen: Instant,
    pub(super) opened_at: Instant,
    pub(super) reason: Reason,
    /// When the probe in flight was let through (probe mode: one at a time).
    pub(super) probe_since: Option<Instant>,
    /// Probe mode: the next probe may go from this instant on.
    pub(super) probe_after: Instant,
    /// When the probe slot was last given back (a sample heard) or the breaker opened:
    /// how long a due probe has waited for a connection that has proved itself.
    pub(super) freed: Instant,
    pub(super) last_transition: Instant,
    /// When it last closed (none if it never did).
    pub(super) closed_at: Option<Instant>,
    pub(super) last_reason: String,
    /// Held open by the write-stall watch: no probe until released.
    pub(super) held: bool,
    /// Failed samples in a row since the breaker opened: the probe spacing is
    /// `min_cooldown * 2^step`, at most `cooldown`.
    pub(super) step: u32,
    /// The next read may probe without waiting (the stall cleared).
    pub(super) early: bool,
    /// Samples answered in a row while open (reset by a failed one), since when, and the
    /// first connections they came from.
    pub(super) streak: Streak,
    /// The connection that took the last probe: the next goes to another when one comes
    /// (see [`Breaker::peek`]).
    pub(super) last_prober: Option<u64>,
    /// When a sample was last answered (bound mode probes only without a recent one).
    pub(super) last_answered: Option<Instant>,
    /// The fleet instance whose opening opened this breaker (see `fleet`); none when it
    /// opened on this instance's own evidence, and always none while closed.
    pub(super) opener: Option<std::sync::Arc<str>>,
    /// When this instance's own last failed sample came, since it opened (none before one,
    /// and once one is answered): what the fleet's close weighs (`fleet.rs`).
    pub(super) last_failed: Option<Instant>,
    /// When an eligible read last met it, in ms since `Breakers::epoch` (0: never); kept
    /// by `Breakers::touch` under the map's read lock.
    pub(super) last_read: AtomicU64,
    /// The close question (`close.rs`): in flight since, when the last was asked (the next
    /// not before `min_cooldown` later), and how many answers in a row were unknown.
    pub(super) asking: super::close::Asking,
}

/// Successful samples in a row while a breaker is open: it closes on a streak, not on one
/// read that happened to meet a healthy node.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Streak {
    pub(super) count: u32,
    pub(super) since: Option<Instant>,
    /// The first two distinct connections of the streak (0 = none yet).
    conns: [u64; 2],
    /// The share each connection has used: its answers counted since the start of its
    /// current `min_cooldown` (the last few connections, oldest replaced first).
    shares: [Share; SHARES],
}

/// The connections whose share of a streak is remembered; a connection beyond them is one
/// more distinct connection, which the share could not have stopped anyway.
const SHARES: usize = 8;

#[derive(Debug, Clone, Copy, Default)]
struct Share {
    conn: u64,
    since: Option<Instant>,
    counted: u32,
}

impl Streak {
    /// Counts an answer from `conn` unless that connection already counted `per_connection`
    /// answers within its current `min_cooldown` (the same share it has of the openings);
    /// false when it was not counted.
    fn add(&mut self, policy: &NsPolicy, conn: u64, now: Instant) -> bool {
        if !self.take_share(policy, conn, now) {
            return false;
        }
        if self.count == 0 {
            self.since = Some(now);
        }
        self.count = self.count.saturating_add(1);
        if !self.conns.contains(&conn) {
            if let Some(slot) = self.conns.iter_mut().find(|c| **c == 0) {
                *slot = conn;
            }
        }
        true
    }

    fn take_share(&mut self, policy: &NsPolicy, conn: u64, now: Instant) -> bool {
        let span = policy.min_cooldown.min(policy.cooldown);
        let per = policy.per_connection.max(1);
        let fresh = |s: &Share| {
            s.since
                .is_none_or(|t| now.saturating_duration_since(t) >= span)
        };
        if let Some(s) = self
            .shares
            .iter_mut()
            .find(|s| s.conn == conn && s.since.is_some())
        {
            if fresh(s) {
                (s.since, s.counted) = (Some(now), 1);
                return true;
            }
            if s.counted >= per {
                return false;
            }
            s.counted += 1;
            return true;
        }
        // A new connection takes the slot of the one whose share started longest ago.
        if let Some(slot) = self.shares.iter_mut().min_by_key(|s| s.since) {
            *slot = Share {
                conn,
                since: Some(now),
                counted: 1,
            };
        }
        true
    }

    pub(super) fn connections(&self) -> u32 {
        self.conns.iter().filter(|&&c| c != 0).count() as u32
    }

    /// Enough to close under `policy`: `close_after` in a row, from `min(min_connections, 2)`
    /// connections, spanning at least `min_cooldown` (or `cooldown`, when shorter).
    pub(super) fn enough(&self, policy: &NsPolicy, now: Instant) -> bool {
        let span = policy.min_cooldown.min(policy.cooldown);
        let spans = self
            .since
            .is_some_and(|s| now.saturating_duration_since(s) >= span);
        self.count >= policy.close_after.max(1)
            && self.connections() >= policy.min_connections.clamp(1, 2)
            && spans
    }
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
            probe_after: now,
            freed: now,
            last_transition: now,
            closed_at: None,
            last_reason: String::from("created"),
            held: false,
            step: 0,
            early: false,
            streak: Streak::default(),
            last_prober: None,
            last_answered: None,
            opener: None,
            last_failed: None,
            last_read: AtomicU64::new(0),
            asking: Default::default(),
        }
    }

    pub(super) fn move_to(&mut self, to: State, reason: String, now: Instant) -> Transition {
        let t = Transition {
            from: self.state,
            to,
            reason: reason.clone(),
            cause: self.reason,
            opener: self.opener.clone(),
        };
        self.state = to;
        self.last_transition = now;
        self.last_reason = reason;
        t
    }

    /// Opens; the first probe may go `first_wait` later.
    pub(super) fn open(
        &mut self,
        reason: Reason,
        why: String,
        now: Instant,
        first_wait: Duration,
    ) -> Transition {
        self.opened_at = now;
        self.early = false;
        self.reason = reason;
        self.probe_since = None;
        self.step = 0;
        self.probe_after = later(now, first_wait);
        self.freed = now;
        self.streak = Streak::default();
        (self.last_prober, self.last_answered) = (None, None);
        self.last_failed = None;
        self.asking = Default::default();
        self.move_to(State::Open, why, now)
    }

    pub(super) fn close(&mut self, why: String, now: Instant) -> Transition {
        self.errors.clear();
        self.probe_since = None;
        self.step = 0;
        self.early = false;
        self.streak = Streak::default();
        self.asking = Default::default();
        self.closed_at = Some(now);
        let t = self.move_to(State::Closed, why, now);
        self.opener = None;
        t
    }

    /// What an eligible read from connection `conn` meets now, without claiming anything (a
    /// read lock is enough): `Probe` says a probe is due, to be claimed with
    /// [`Breaker::claim_probe`]. `climbs`: the read may go to the primary (the namespace has
    /// the primary rung and the read is not pinned by tag sets). `proven`: `conn` has proved
    /// itself to the cluster (see `Breakers::hear`).
    pub(super) fn peek(
        &self,
        policy: &NsPolicy,
        conn: u64,
        climbs: bool,
        proven: bool,
        now: Instant,
    ) -> Admission {
        if self.state == State::Closed {
            return Admission::Closed;
        }
        if self.held {
            // Unknown while held: probing starts when the write stall clears.
            return self.admission(policy.cooldown);
        }
        let bounded = Admission::Bounded {
            reason: self.reason,
            errors: self.errors.len() as u32,
        };
        let every_read = sends_every_read(policy, climbs);
        // Sending every read bounded, one read at a time still goes as a probe, sent as a
        // closed read would be, when no sample was answered within `min_cooldown`: the bound
        // says nothing of a namespace whose healthy reads take longer, and only answers
        // close the breaker. While bounded samples are answered, none is needed.
        let not_yet = |probe_in| match every_read {
            true => bounded,
            false => self.admission(probe_in),
        };
        let span = policy.min_cooldown.min(policy.cooldown);
        let answered_lately =
            (self.last_answered).is_some_and(|t| now.saturating_duration_since(t) < span);
        if every_read && answered_lately {
            return bounded;
        }
        // A probe that never reported (its client vanished without us noticing) is given
        // up after `cooldown`, so the breaker cannot stop probing.
        if let Some(since) = self.probe_since {
            match since.checked_add(policy.cooldown) {
                Some(at) if now < at => return not_yet(at - now),
                None => return not_yet(policy.cooldown),
                Some(_) => {}
            }
        }
        if !self.early && now < self.probe_after {
            return not_yet(self.probe_after - now);
        }
        // Round robin: the connection that took the last probe waits `min_cooldown` past
        // the due time for another connection to take this one.
        if self.last_prober == Some(conn) {
            let turn = later(self.probe_after, policy.min_cooldown.min(policy.cooldown));
            if now < turn {
                return not_yet(turn - now);
            }
        }
        // What a connection that has not proved itself says is neutral, so its probe could
        // only keep the slot busy while the readers whose answers close the breaker wait:
        // it takes one only when none of them has for `cooldown` past the due time (a
        // breaker whose readers are all new still probes).
        if !proven {
            let turn = later(self.probe_after.max(self.freed), policy.cooldown);
            if now < turn {
                return not_yet(turn - now);
            }
        }
        Admission::Probe
    }

    /// Takes the due probe for one read of connection `conn`.
    pub(super) fn claim_probe(&mut self, conn: u64, now: Instant) {
        self.early = false;
        self.probe_since = Some(now);
        self.last_prober = Some(conn);
        self.last_seen = now;
    }

    /// Acting as open, a probe due in `probe_in`.
    pub(super) fn admission(&self, probe_in: Duration) -> Admission {
        Admission::Open {
            reason: self.reason,
            probe_in,
            errors: self.errors.len() as u32,
        }
    }

    /// A sample (a probe, or a read sent bounded while open) answered: the streak grows;
    /// `true` when it is enough to close.
    pub(super) fn sample_ok(&mut self, policy: &NsPolicy, conn: u64, now: Instant) -> bool {
        self.probe_since = None;
        self.freed = now;
        self.step = 0;
        // After a good answer the next read may probe at once: a healed cluster is seen
        // at the pace of its readers.
        self.probe_after = now;
        self.last_answered = Some(now);
        let counted = self.streak.add(policy, conn, now);
        if counted {
            self.last_failed = None;
        }
        counted && self.state == State::Open && self.streak.enough(policy, now)
    }

    /// A sample failed: the streak starts over, and the next probe waits longer.
    pub(super) fn sample_failed(&mut self, policy: &NsPolicy, now: Instant) {
        self.probe_since = None;
        self.freed = now;
        self.streak = Streak::default();
        // staleguard's own answers in a row are broken too (`own.rs`).
        self.asking.own_answered = 0;
        self.last_failed = Some(now);
        self.step = self.step.saturating_add(1);
        let wait = backoff(policy, self.step);
        self.probe_after = later(now, wait);
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

    /// An error from `conn` now would be counted (its share of the window is not used up).
    pub(super) fn would_count(&self, policy: &NsPolicy, conn: u64, now: Instant) -> bool {
        let in_window = |t: Instant| now.saturating_duration_since(t) <= policy.window;
        let from_conn = self
            .errors
            .iter()
            .filter(|&&(t, c)| c == conn && in_window(t))
            .count();
        from_conn < policy.per_connection.max(1) as usize
    }

    /// The window holds enough to open: `threshold` errors from `min_connections`
    /// connections.
    pub(super) fn enough(&self, policy: &NsPolicy) -> bool {
        self.errors.len() >= policy.threshold as usize
            && distinct_at_least(&self.errors, policy.min_connections as usize)
    }
}

/// `now + wait`, or a century from now when that is past the clock's range (a wait of
/// `Duration::MAX` never ends in practice).
fn later(now: Instant, wait: Duration) -> Instant {
    const CENTURY: Duration = Duration::from_secs(100 * 365 * 86_400);
    now.checked_add(wait)
        .or_else(|| now.checked_add(CENTURY))
        .unwrap_or(now)
}

/// While open, every eligible read of `policy` goes out bounded (strict, `on_open =
/// "bound"`, and the read cannot climb to the primary: no primary rung, or the read is
/// pinned by tag sets, which never climbs), rather than one probe at a time.
pub(super) fn sends_every_read(policy: &NsPolicy, climbs: bool) -> bool {
    policy.mode == crate::policy::Mode::Strict && policy.on_open == OnOpen::Bound && !climbs
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

/// The wait before the next probe after `step` failed samples: `min_cooldown` doubled
/// `step - 1` times (`step` 0 and 1: `min_cooldown`), at most `cooldown` (and never below
/// it when `min_cooldown` is larger).
pub fn backoff(policy: &NsPolicy, step: u32) -> Duration {
    let factor = 1u32.checked_shl(step.saturating_sub(1)).unwrap_or(u32::MAX);
    policy
        .min_cooldown
        .checked_mul(factor)
        .map_or(policy.cooldown, |d| d.min(policy.cooldown))
}
