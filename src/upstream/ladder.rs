//! The guard on an upstream's primary rung: how many ladder reads (reads sent to the
//! primary because their secondary failed, or their breaker is open) one mongos may carry
//! in flight, and how many may start per second. Lock-free: two atomics, checked and
//! claimed with compare-and-swap; a claimed slot is a [`LadderPermit`] that frees itself
//! when dropped.

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
}

impl Denied {
    pub fn as_str(self) -> &'static str {
        match self {
            Denied::InFlight => "max_in_flight",
            Denied::Rate => "max_per_second",
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
        })
    }

    /// Ladder reads waiting for their reply now.
    pub fn in_flight(&self) -> u32 {
        self.in_flight.load(Ordering::Acquire)
    }
}

/// One ladder read's slot; dropping it (reply arrived, client gone) frees it.
#[derive(Debug, Default)]
pub struct LadderPermit {
    guard: Option<Arc<LadderGuard>>,
}

impl Drop for LadderPermit {
    fn drop(&mut self) {
        if let Some(g) = self.guard.take() {
            g.in_flight.fetch_sub(1, Ordering::AcqRel);
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
