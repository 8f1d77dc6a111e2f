//! This instance's share of the fleet budget on primary-rung reads (`[ladder_guard]
//! fleet_max_per_second`, `fleet_max_in_flight`): starts granted for the current second
//! and in-flight slots granted, which the fleet task (`fleet::budget`) refills from Redis
//! every 100 ms. A read takes from it with a few atomics, after the local guard let it
//! through: nothing waits on Redis on a request's path.
//!
//! When the last grant is older than `stale` (Redis slow or unreachable, or no `[fleet]`
//! budget at all), the share stands aside and the local guard alone decides: the fleet
//! never makes a read fail because Redis did not answer.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::ladder::{Denied, LadderPermit};

/// The share, shared by every upstream's guard (one budget per cluster).
#[derive(Debug)]
pub struct FleetShare {
    base: Instant,
    /// A budget is configured and the fleet task runs.
    on: AtomicBool,
    /// When the last grant arrived, in ms since `base` (0: never).
    granted_at: AtomicU64,
    /// How old a grant may be before the share stands aside, in ms.
    stale_ms: AtomicU64,
    /// Rate: (expiry in ms since `base`) << 32 | starts left. 0 in the top half: no rate
    /// budget.
    starts: AtomicU64,
    rate_on: AtomicBool,
    /// In flight: slots granted (u32::MAX: no in-flight budget) and held now.
    slots: AtomicU32,
    held: AtomicU32,
    /// Reads that asked since the fleet task last looked (its demand estimate).
    asked: AtomicU32,
    /// Reads the share refused since the fleet task last looked.
    refused: AtomicU32,
}

impl Default for FleetShare {
    fn default() -> Self {
        FleetShare {
            base: Instant::now(),
            on: AtomicBool::new(false),
            granted_at: AtomicU64::new(0),
            stale_ms: AtomicU64::new(0),
            starts: AtomicU64::new(0),
            rate_on: AtomicBool::new(false),
            slots: AtomicU32::new(u32::MAX),
            held: AtomicU32::new(0),
            asked: AtomicU32::new(0),
            refused: AtomicU32::new(0),
        }
    }
}

/// What [`FleetShare::take`] said, for the metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShareSaid {
    /// No fleet budget configured: nothing counted.
    Off,
    Allowed,
    Denied,
    /// The last grant is too old: the local guard alone decided.
    Unanswered,
}

impl FleetShare {
    fn ms(&self, now: Instant) -> u64 {
        now.saturating_duration_since(self.base).as_millis() as u64 + 1
    }

    /// Turns the share on (a budget is configured); `stale`: how old a grant may be.
    pub fn turn_on(&self, stale: Duration) {
        self.stale_ms
            .store(stale.as_millis().max(1) as u64, Ordering::Release);
        self.on.store(true, Ordering::Release);
    }

    /// No budget configured (any longer): reads pass untouched.
    pub fn turn_off(&self) {
        self.on.store(false, Ordering::Release);
    }

    /// A grant from Redis: `starts` for the rest of the second (`left` of it), or no rate
    /// budget; `slots` in flight, or no in-flight budget.
    pub fn grant(&self, starts: Option<(u32, Duration)>, slots: Option<u32>, now: Instant) {
        let at = self.ms(now);
        match starts {
            Some((n, left)) => {
                let expiry = at + left.as_millis() as u64;
                let _ = self
                    .starts
                    .fetch_update(Ordering::AcqRel, Ordering::Acquire, |w| {
                        let (exp, have) = (w >> 32, w & 0xffff_ffff);
                        // Starts of the same second add up; a new second starts over.
                        let same = exp >= at && expiry.abs_diff(exp) < 500;
                        let kept = if same { have } else { 0 };
                        Some(expiry << 32 | (kept + n as u64).min(u32::MAX as u64))
                    });
                self.rate_on.store(true, Ordering::Release);
            }
            None => self.rate_on.store(false, Ordering::Release),
        }
        self.slots
            .store(slots.unwrap_or(u32::MAX), Ordering::Release);
        self.granted_at.store(at, Ordering::Release);
    }

    /// The demand since the last call: (asked, refused), reset.
    pub fn demand(&self) -> (u32, u32) {
        (
            self.asked.swap(0, Ordering::AcqRel),
            self.refused.swap(0, Ordering::AcqRel),
        )
    }

    /// Slots held now.
    pub fn held(&self) -> u32 {
        self.held.load(Ordering::Acquire)
    }

    /// One primary-rung read the local guard let through (`permit`): takes a start and a
    /// slot of the share, or refuses it (the permit is dropped, freeing the local slot).
    pub fn take(
        self: &Arc<Self>,
        permit: LadderPermit,
        now: Instant,
    ) -> (Result<LadderPermit, Denied>, ShareSaid) {
        if !self.on.load(Ordering::Acquire) {
            return (Ok(permit), ShareSaid::Off);
        }
        self.asked.fetch_add(1, Ordering::AcqRel);
        let at = self.ms(now);
        let granted = self.granted_at.load(Ordering::Acquire);
        if granted == 0 || at.saturating_sub(granted) > self.stale_ms.load(Ordering::Acquire) {
            return (Ok(permit), ShareSaid::Unanswered);
        }
        let slots = self.slots.load(Ordering::Acquire);
        let took_slot = self
            .held
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |h| {
                (h < slots).then_some(h + 1)
            });
        if took_slot.is_err() {
            self.refused.fetch_add(1, Ordering::AcqRel);
            return (Err(Denied::FleetInFlight), ShareSaid::Denied);
        }
        if self.rate_on.load(Ordering::Acquire) {
            let took = self
                .starts
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |w| {
                    let (exp, have) = (w >> 32, w & 0xffff_ffff);
                    (exp >= at && have > 0).then(|| w - 1)
                });
            if took.is_err() {
                self.held.fetch_sub(1, Ordering::AcqRel);
                self.refused.fetch_add(1, Ordering::AcqRel);
                return (Err(Denied::FleetRate), ShareSaid::Denied);
            }
        }
        (Ok(permit.with_share(self.clone())), ShareSaid::Allowed)
    }

    /// A slot comes back (the permit holding it was dropped).
    pub(super) fn release(&self) {
        self.held.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn off_stale_rate_and_slots() {
        let share = Arc::new(FleetShare::default());
        let t0 = Instant::now();
        let (r, said) = share.take(LadderPermit::default(), t0);
        assert!(r.is_ok());
        assert_eq!(said, ShareSaid::Off);
        share.turn_on(Duration::from_millis(300));
        assert_eq!(
            share.take(LadderPermit::default(), t0).1,
            ShareSaid::Unanswered
        );
        share.grant(Some((2, Duration::from_millis(500))), Some(1), t0);
        let (a, said) = share.take(LadderPermit::default(), t0);
        assert_eq!(said, ShareSaid::Allowed);
        let a = a.expect("first");
        assert_eq!(
            share.take(LadderPermit::default(), t0).0.unwrap_err(),
            Denied::FleetInFlight
        );
        drop(a);
        assert_eq!(share.held(), 0);
        let b = share
            .take(LadderPermit::default(), t0)
            .0
            .expect("second start");
        drop(b);
        assert_eq!(
            share.take(LadderPermit::default(), t0).0.unwrap_err(),
            Denied::FleetRate
        );
        // The second ended: no start left until the next grant.
        let later = t0 + Duration::from_millis(200);
        share.grant(Some((0, Duration::from_millis(300))), None, later);
        assert_eq!(
            share.take(LadderPermit::default(), later).0.unwrap_err(),
            Denied::FleetRate
        );
        assert_eq!(share.demand(), (6, 3));
        // No grant for longer than `stale`: the local guard alone.
        let (r, said) = share.take(LadderPermit::default(), later + Duration::from_secs(1));
        assert!(r.is_ok());
        assert_eq!(said, ShareSaid::Unanswered);
    }
}
