//! The guard on an upstream's primary rung: how many ladder reads (reads sent to the
//! primary because their secondary failed, or their breaker is open) one mongos may carry
//! in flight, and how many may start per second. Lock-free: two atomics, checked and
//! claimed with compare-and-swap; a claimed slot is a [`LadderPermit`] that frees itself
//! when dropped.
//!
//! Each client connection gets a bounded share of it ([`ConnLadder`], kept by the session):
//! `per_connection` slots in flight, `per_connection_per_second` starts per second, and a
//! slot only for a read mongos starts at once. mongos serves a connection's requests one at
//! a time, in order: a read sent behind an earlier request still waiting for its final reply
//! (an awaitable `hello`, a slow query, an exhaust stream) would hold a slot while mongos has
//! not started it, so such a read is refused the rung (it does what it would without it).
//! Drivers send one request at a time per connection, so their reads always start at once;
//! and a connection's slot-holding read makes every later read on it wait, so a connection
//! never holds more than one slot.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use tokio::time::Instant;

use crate::config::LadderGuardConfig;

/// Why a ladder read was not let through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Denied {
    /// `max_in_flight` ladder reads are waiting already.
    InFlight,
    /// `max_per_second` ladder reads started within this second already.
    Rate,
    /// An earlier request on the read's connection has no final reply yet: mongos would not
    /// start the read at once.
    Queued,
    /// The read's connection holds `per_connection` slots already.
    ConnectionInFlight,
    /// The read's connection started `per_connection_per_second` within this second already.
    ConnectionRate,
    /// The fleet's `fleet_max_per_second` is spent for this second (`[fleet]`).
    FleetRate,
    /// The fleet's `fleet_max_in_flight` slots are taken (`[fleet]`).
    FleetInFlight,
}

impl Denied {
    pub fn as_str(self) -> &'static str {
        match self {
            Denied::InFlight => "max_in_flight",
            Denied::Rate => "max_per_second",
            Denied::Queued => "queued",
            Denied::ConnectionInFlight => "per_connection",
            Denied::ConnectionRate => "per_connection_per_second",
            Denied::FleetRate => "fleet_max_per_second",
            Denied::FleetInFlight => "fleet_max_in_flight",
        }
    }
}

/// One upstream's ladder reads: in flight, and started in the current second.
#[derive(Debug)]
pub struct LadderGuard {
    in_flight: AtomicU32,
    /// (second since `base`) << 32 | reads started in that second.
    window: AtomicU64,
    base: Instant,
}

impl Default for LadderGuard {
    fn default() -> Self {
        LadderGuard::new(Instant::now())
    }
}

impl LadderGuard {
    pub fn new(base: Instant) -> LadderGuard {
        LadderGuard {
            in_flight: AtomicU32::new(0),
            window: AtomicU64::new(0),
            base,
        }
    }

    /// Claims a slot for one ladder read under `limits` (read at each call, so a reload
    /// applies to the next read), or says which limit refused it.
    pub fn try_acquire(
        self: &Arc<Self>,
        limits: LadderGuardConfig,
        now: Instant,
    ) -> Result<LadderPermit, Denied> {
        let claimed = self
            .in_flight
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < limits.max_in_flight).then_some(n + 1)
            });
        if claimed.is_err() {
            return Err(Denied::InFlight);
        }
        let second = now.saturating_duration_since(self.base).as_secs() as u32 as u64;
        let counted = self
            .window
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |w| {
                let (s, n) = (w >> 32, w & 0xffff_ffff);
                if s != second {
                    Some(second << 32 | 1)
                } else if n < limits.max_per_second as u64 {
                    Some(w + 1)
                } else {
                    None
                }
            });
        if counted.is_err() {
            self.in_flight.fetch_sub(1, Ordering::AcqRel);
            return Err(Denied::Rate);
        }
        Ok(LadderPermit {
            guard: Some(self.clone()),
            share: None,
        })
    }

    /// Ladder reads waiting for their reply now.
    pub fn in_flight(&self) -> u32 {
        self.in_flight.load(Ordering::Acquire)
    }
}

/// One client connection's share of its upstream's guard: the primary-rung reads it started
/// in the current one-second window (its reads in flight are counted by the session).
#[derive(Debug, Default)]
pub struct ConnLadder {
    /// When the current window began, and the reads started in it.
    window: Option<(Instant, u32)>,
}

impl ConnLadder {
    /// Claims a slot of `guard` for one primary-rung read of this connection, or says which
    /// limit refused it. `held`: the connection's primary-rung reads in flight; `queued`: an
    /// earlier request on it still waits for its final reply. A refusal costs the
    /// connection nothing of its per-second share.
    pub fn try_acquire(
        &mut self,
        guard: &Arc<LadderGuard>,
        limits: LadderGuardConfig,
        held: usize,
        queued: bool,
        now: Instant,
    ) -> Result<LadderPermit, Denied> {
        if queued {
            return Err(Denied::Queued);
        }
        if held >= limits.per_connection as usize {
            return Err(Denied::ConnectionInFlight);
        }
        let (start, started) = match self.window {
            Some((start, n)) if now.saturating_duration_since(start) < SECOND => (start, n),
            _ => (now, 0),
        };
        if started >= limits.per_connection_per_second {
            return Err(Denied::ConnectionRate);
        }
        let permit = guard.try_acquire(limits, now)?;
        self.window = Some((start, started + 1));
        Ok(permit)
    }
}

const SECOND: std::time::Duration = std::time::Duration::from_secs(1);

/// One ladder read's slot; dropping it (reply arrived, client gone) frees it.
#[derive(Debug, Default)]
pub struct LadderPermit {
    guard: Option<Arc<LadderGuard>>,
    /// The slot of the fleet's budget it also holds (`[fleet]`).
    share: Option<Arc<super::FleetShare>>,
}

impl LadderPermit {
    /// The permit also holds a slot of the fleet's share, freed with it.
    pub(super) fn with_share(mut self, share: Arc<super::FleetShare>) -> LadderPermit {
        self.share = Some(share);
        self
    }
}

impl Drop for LadderPermit {
    fn drop(&mut self) {
        if let Some(g) = self.guard.take() {
            g.in_flight.fetch_sub(1, Ordering::AcqRel);
        }
        if let Some(s) = self.share.take() {
            s.release();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn limits(max_in_flight: u32, max_per_second: u32) -> LadderGuardConfig {
        LadderGuardConfig {
            max_in_flight,
            max_per_second,
            per_connection: 4,
            per_connection_per_second: max_per_second,
        }
    }

    #[test]
    fn in_flight_limit_frees_on_drop() {
        let t0 = Instant::now();
        let g = Arc::new(LadderGuard::new(t0));
        let l = limits(2, 100);
        let a = g.try_acquire(l, t0).expect("first");
        let b = g.try_acquire(l, t0).expect("second");
        assert_eq!(g.try_acquire(l, t0).unwrap_err(), Denied::InFlight);
        assert_eq!(g.in_flight(), 2);
        drop(a);
        let c = g.try_acquire(l, t0).expect("a slot came back");
        drop((b, c));
        assert_eq!(g.in_flight(), 0);
        // A lower limit after a reload applies at once.
        let _d = g.try_acquire(limits(1, 100), t0).expect("one");
        assert_eq!(
            g.try_acquire(limits(1, 100), t0).unwrap_err(),
            Denied::InFlight
        );
    }

    #[test]
    fn per_second_limit_resets_each_second_and_a_refusal_holds_no_slot() {
        let t0 = Instant::now();
        let g = Arc::new(LadderGuard::new(t0));
        let l = limits(100, 3);
        for _ in 0..3 {
            drop(g.try_acquire(l, t0).expect("within the rate"));
        }
        let later = t0 + Duration::from_millis(999);
        assert_eq!(g.try_acquire(l, later).unwrap_err(), Denied::Rate);
        assert_eq!(g.in_flight(), 0, "a refused read holds no in-flight slot");
        let next = t0 + Duration::from_secs(1);
        for _ in 0..3 {
            drop(g.try_acquire(l, next).expect("a new second"));
        }
        assert_eq!(g.try_acquire(l, next).unwrap_err(), Denied::Rate);
    }

    #[test]
    fn a_connection_gets_a_bounded_share_and_only_for_reads_that_start_at_once() {
        let t0 = Instant::now();
        let g = Arc::new(LadderGuard::new(t0));
        let l = LadderGuardConfig {
            max_in_flight: 16,
            max_per_second: 100,
            per_connection: 1,
            per_connection_per_second: 3,
        };
        let mut conn = ConnLadder::default();
        // Behind an unanswered request: refused, and nothing of the share is spent.
        assert_eq!(
            conn.try_acquire(&g, l, 0, true, t0).unwrap_err(),
            Denied::Queued
        );
        assert_eq!(g.in_flight(), 0);
        let a = conn.try_acquire(&g, l, 0, false, t0).expect("first");
        assert_eq!(
            conn.try_acquire(&g, l, 1, false, t0).unwrap_err(),
            Denied::ConnectionInFlight
        );
        drop(a);
        for _ in 0..2 {
            drop(
                conn.try_acquire(&g, l, 0, false, t0)
                    .expect("within the share"),
            );
        }
        let later = t0 + Duration::from_millis(999);
        assert_eq!(
            conn.try_acquire(&g, l, 0, false, later).unwrap_err(),
            Denied::ConnectionRate
        );
        // Another connection still has its own share of the upstream's 100 per second.
        let mut other = ConnLadder::default();
        drop(
            other
                .try_acquire(&g, l, 0, false, later)
                .expect("other connection"),
        );
        // A new window.
        let next = t0 + Duration::from_secs(1);
        drop(
            conn.try_acquire(&g, l, 0, false, next)
                .expect("next second"),
        );
        // A refusal by the upstream's guard does not spend the connection's share.
        let tight = LadderGuardConfig {
            max_per_second: 1,
            ..l
        };
        let fresh = Arc::new(LadderGuard::new(t0));
        drop(
            other
                .try_acquire(&fresh, tight, 0, false, next)
                .expect("the one"),
        );
        let mut third = ConnLadder::default();
        for _ in 0..5 {
            assert_eq!(
                third
                    .try_acquire(&fresh, tight, 0, false, next)
                    .unwrap_err(),
                Denied::Rate
            );
        }
        let after = next + Duration::from_secs(1);
        for _ in 0..1 {
            drop(
                third
                    .try_acquire(&fresh, tight, 0, false, after)
                    .expect("its share intact"),
            );
        }
    }

    #[test]
    fn concurrent_claims_never_exceed_the_limit() {
        let t0 = Instant::now();
        let g = Arc::new(LadderGuard::new(t0));
        let l = limits(8, u32::MAX);
        let held = std::sync::Mutex::new(Vec::new());
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..50 {
                        if let Ok(p) = g.try_acquire(l, t0) {
                            held.lock().unwrap().push(p);
                        }
                    }
                });
            }
        });
        assert_eq!(held.lock().unwrap().len(), 8);
        assert_eq!(g.in_flight(), 8);
        held.lock().unwrap().clear();
        assert_eq!(g.in_flight(), 0);
    }
}
