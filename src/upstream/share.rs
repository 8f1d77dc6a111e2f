//! This instance's share of the fleet budget on primary-rung reads (`[ladder_guard]
//! fleet_max_per_second`, `fleet_max_in_flight`): starts granted for the current second
//! and in-flight slots granted, which the fleet task (`fleet::budget`) refills from Redis
//! every 100 ms. A read takes from it with a few atomics, after the local guard let it
//! through: nothing waits on Redis on a request's path.
//!
//! Beside its grant, each refill says how much of the fleet's budget nobody claimed, and
//! this instance's part of it (*spare*): the first reads of a burst take from it, so they
//! are not denied because the last 100 ms asked for little. Starts taken from the spare are
//! reported at the next refill, which counts them against the fleet's second.
//!
//! When the fleet budget cannot answer in time, the share stands aside and the local guard
//! alone decides (`ShareSaid::Unanswered`): the last refill failed (Redis slow, stopped or
//! gone), no grant is younger than `stale`, a read finds its share spent while a refill
//! has been waiting for Redis longer than `budget_timeout`, or the last grant's second has
//! ended and none for the new second has come yet. The fleet never makes a read
//! fail because Redis did not answer.

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
    /// When the refill now waiting for Redis started, in ms since `base` (0: none waits).
    asking_since: AtomicU64,
    /// The last refill failed (an error or `budget_timeout`): the local guard decides.
    failing: AtomicBool,
    /// How old a grant may be before the share stands aside, in ms.
    stale_ms: AtomicU64,
    /// How long a refill may wait for Redis before a read the share would deny is left to
    /// the local guard, in ms (`budget_timeout`).
    answer_ms: AtomicU64,
    /// Rate: (expiry in ms since `base`) << 32 | starts left.
    starts: AtomicU64,
    /// Rate: (expiry) << 32 | spare starts left (this instance's part of the unclaimed).
    spare: AtomicU64,
    rate_on: AtomicBool,
    /// In flight: slots granted plus spare (u32::MAX: no in-flight budget), and held now.
    slots: AtomicU32,
    held: AtomicU32,
    /// Reads that asked since the fleet task last looked (its demand estimate).
    asked: AtomicU32,
    /// Reads the share refused since the fleet task last looked.
    refused: AtomicU32,
    /// Starts taken from the spare since the fleet task last looked.
    borrowed: AtomicU32,
}

impl Default for FleetShare {
    fn default() -> Self {
        FleetShare {
            base: Instant::now(),
            on: AtomicBool::new(false),
            granted_at: AtomicU64::new(0),
            asking_since: AtomicU64::new(0),
            failing: AtomicBool::new(false),
            stale_ms: AtomicU64::new(0),
            answer_ms: AtomicU64::new(0),
            starts: AtomicU64::new(0),
            spare: AtomicU64::new(0),
            rate_on: AtomicBool::new(false),
            slots: AtomicU32::new(u32::MAX),
            held: AtomicU32::new(0),
            asked: AtomicU32::new(0),
            refused: AtomicU32::new(0),
            borrowed: AtomicU32::new(0),
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
    /// The fleet budget could not answer in time: the local guard alone decided.
    Unanswered,
}

/// A grant of starts from Redis: for the rest of the second (`left` of it), `granted`
/// starts and `spare` more to borrow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Starts {
    pub granted: u32,
    pub spare: u32,
    pub left: Duration,
}

/// A grant of in-flight slots: `granted` held in Redis's count, `spare` more to borrow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slots {
    pub granted: u32,
    pub spare: u32,
}

impl FleetShare {
    fn ms(&self, now: Instant) -> u64 {
        now.saturating_duration_since(self.base).as_millis() as u64 + 1
    }

    /// Turns the share on (a budget is configured); `stale`: how old a grant may be;
    /// `answer`: how long a refill may wait for Redis (`budget_timeout`).
    pub fn turn_on(&self, stale: Duration, answer: Duration) {
        self.stale_ms
            .store(stale.as_millis().max(1) as u64, Ordering::Release);
        self.answer_ms
            .store(answer.as_millis().max(1) as u64, Ordering::Release);
        self.on.store(true, Ordering::Release);
    }

    /// No budget configured (any longer): reads pass untouched.
    pub fn turn_off(&self) {
        self.on.store(false, Ordering::Release);
    }

    /// A refill starts waiting for Redis.
    pub fn asking(&self, now: Instant) {
        self.asking_since.store(self.ms(now), Ordering::Release);
    }

    /// The refill failed: until the next grant, the local guard alone decides.
    pub fn failed(&self) {
        self.failing.store(true, Ordering::Release);
        self.asking_since.store(0, Ordering::Release);
    }

    /// A grant from Redis: starts for the rest of the second, or no rate budget; slots in
    /// flight, or no in-flight budget.
    pub fn grant(&self, starts: Option<Starts>, slots: Option<Slots>, now: Instant) {
        let at = self.ms(now);
        match starts {
            Some(s) => {
                let expiry = at + s.left.as_millis() as u64;
                let add = |cell: &AtomicU64, n: u32, keep: bool| {
                    let _ = cell.fetch_update(Ordering::AcqRel, Ordering::Acquire, |w| {
                        let (exp, have) = (w >> 32, w & 0xffff_ffff);
                        // Starts of the same second add up; a new second starts over.
                        let same = keep && exp >= at && expiry.abs_diff(exp) < 500;
                        let kept = if same { have } else { 0 };
                        Some(expiry << 32 | (kept + n as u64).min(u32::MAX as u64))
                    });
                };
                add(&self.starts, s.granted, true);
                // The spare is a fresh figure each time: what is unclaimed now.
                add(&self.spare, s.spare, false);
                self.rate_on.store(true, Ordering::Release);
            }
            None => self.rate_on.store(false, Ordering::Release),
        }
        let cap = slots.map_or(u32::MAX, |s| s.granted.saturating_add(s.spare));
        self.slots.store(cap, Ordering::Release);
        self.granted_at.store(at, Ordering::Release);
        self.asking_since.store(0, Ordering::Release);
        self.failing.store(false, Ordering::Release);
    }

    /// The demand since the last call: (asked, refused, borrowed), reset.
    pub fn demand(&self) -> (u32, u32, u32) {
        (
            self.asked.swap(0, Ordering::AcqRel),
            self.refused.swap(0, Ordering::AcqRel),
            self.borrowed.swap(0, Ordering::AcqRel),
        )
    }

    /// A refill failed: the starts it was to report as borrowed wait for the next one.
    pub fn keep_borrowed(&self, n: u32) {
        self.borrowed.fetch_add(n, Ordering::AcqRel);
    }

    /// Slots held now.
    pub fn held(&self) -> u32 {
        self.held.load(Ordering::Acquire)
    }

    /// The fleet budget cannot answer in time at `at`: the last refill failed, the last
    /// grant is too old, or a refill has waited longer than `budget_timeout`.
    fn unanswered(&self, at: u64) -> bool {
        let granted = self.granted_at.load(Ordering::Acquire);
        let asking = self.asking_since.load(Ordering::Acquire);
        self.failing.load(Ordering::Acquire)
            || granted == 0
            || at.saturating_sub(granted) > self.stale_ms.load(Ordering::Acquire)
            || (asking != 0 && at.saturating_sub(asking) > self.answer_ms.load(Ordering::Acquire))
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
        if self.unanswered(at) {
            return (Ok(permit), ShareSaid::Unanswered);
        }
        let slots = self.slots.load(Ordering::Acquire);
        let took_slot = self
            .held
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |h| {
                (h < slots).then_some(h + 1)
            });
        if took_slot.is_err() {
            return self.refuse(permit, Denied::FleetInFlight, at);
        }
        if self.rate_on.load(Ordering::Acquire) && !self.take_start(at) {
            self.held.fetch_sub(1, Ordering::AcqRel);
            // The last grant was for a second that has ended, and no grant for this one has
            // come yet (Redis slow, or a refill just due): the fleet has said nothing about
            // this second, so the local guard decides.
            if self.starts.load(Ordering::Acquire) >> 32 < at {
                return (Ok(permit), ShareSaid::Unanswered);
            }
            return self.refuse(permit, Denied::FleetRate, at);
        }
        (Ok(permit.with_share(self.clone())), ShareSaid::Allowed)
    }

    /// A start of this second: granted, else spare (counted as borrowed).
    fn take_start(&self, at: u64) -> bool {
        let one = |cell: &AtomicU64| {
            cell.fetch_update(Ordering::AcqRel, Ordering::Acquire, |w| {
                let (exp, have) = (w >> 32, w & 0xffff_ffff);
                (exp >= at && have > 0).then(|| w - 1)
            })
            .is_ok()
        };
        if one(&self.starts) {
            return true;
        }
        if one(&self.spare) {
            self.borrowed.fetch_add(1, Ordering::AcqRel);
            return true;
        }
        false
    }

    /// The share is spent: denied, unless the fleet budget is late to answer (then the
    /// local guard decides, as without the share).
    fn refuse(
        &self,
        permit: LadderPermit,
        why: Denied,
        at: u64,
    ) -> (Result<LadderPermit, Denied>, ShareSaid) {
        if self.unanswered(at) {
            return (Ok(permit), ShareSaid::Unanswered);
        }
        self.refused.fetch_add(1, Ordering::AcqRel);
        (Err(why), ShareSaid::Denied)
    }

    /// A slot comes back (the permit holding it was dropped).
    pub(super) fn release(&self) {
        self.held.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn starts(granted: u32, spare: u32, left_ms: u64) -> Option<Starts> {
        Some(Starts {
            granted,
            spare,
            left: Duration::from_millis(left_ms),
        })
    }

    fn slots(granted: u32, spare: u32) -> Option<Slots> {
        Some(Slots { granted, spare })
    }

    fn on() -> Arc<FleetShare> {
        let share = Arc::new(FleetShare::default());
        share.turn_on(Duration::from_millis(300), Duration::from_millis(20));
        share
    }

    fn take(share: &Arc<FleetShare>, at: Instant) -> (Option<LadderPermit>, ShareSaid) {
        let (r, said) = share.take(LadderPermit::default(), at);
        (r.ok(), said)
    }

    #[test]
    fn off_stale_rate_and_slots() {
        let share = Arc::new(FleetShare::default());
        let t0 = Instant::now();
        assert_eq!(take(&share, t0).1, ShareSaid::Off);
        share.turn_on(Duration::from_millis(300), Duration::from_millis(20));
        assert_eq!(take(&share, t0).1, ShareSaid::Unanswered);
        share.grant(starts(2, 0, 500), slots(1, 0), t0);
        let (a, said) = take(&share, t0);
        assert_eq!(said, ShareSaid::Allowed);
        let a = a.expect("first");
        assert_eq!(
            share.take(LadderPermit::default(), t0).0.unwrap_err(),
            Denied::FleetInFlight
        );
        drop(a);
        assert_eq!(share.held(), 0);
        drop(take(&share, t0).0.expect("second start"));
        assert_eq!(
            share.take(LadderPermit::default(), t0).0.unwrap_err(),
            Denied::FleetRate
        );
        // The second ended: no start left until the next grant.
        let later = t0 + Duration::from_millis(200);
        share.grant(starts(0, 0, 300), None, later);
        assert_eq!(
            share.take(LadderPermit::default(), later).0.unwrap_err(),
            Denied::FleetRate
        );
        assert_eq!(share.demand(), (6, 3, 0));
        // No grant for longer than `stale`: the local guard alone.
        let (r, said) = take(&share, later + Duration::from_secs(1));
        assert!(r.is_some());
        assert_eq!(said, ShareSaid::Unanswered);
    }

    /// Issue 30, item 5: the first reads of a burst take the spare (the grant followed an
    /// idle 100 ms) and are counted as borrowed for the next refill.
    #[test]
    fn a_burst_after_quiet_takes_the_spare() {
        let share = on();
        let t0 = Instant::now();
        // Idle: one start granted, 4 spare of the fleet's unclaimed budget.
        share.grant(starts(1, 4, 900), slots(1, 4), t0);
        let burst: Vec<_> = (0..5).map(|_| take(&share, t0)).collect();
        assert!(burst
            .iter()
            .all(|(p, s)| p.is_some() && *s == ShareSaid::Allowed));
        assert_eq!(
            take(&share, t0).1,
            ShareSaid::Denied,
            "the fleet's budget is spent"
        );
        assert_eq!(share.demand(), (6, 1, 4));
        // A new figure replaces the spare; the grant of the same second adds up.
        let next = t0 + Duration::from_millis(100);
        drop(burst);
        share.grant(starts(2, 0, 800), slots(2, 0), next);
        assert_eq!(take(&share, next).1, ShareSaid::Allowed);
        assert_eq!(take(&share, next).1, ShareSaid::Allowed);
        assert_eq!(take(&share, next).1, ShareSaid::Denied);
    }

    /// A grant's second has ended and the next second's grant has not come (a slow Redis,
    /// a refill just due): the fleet has not spoken about this second, so a read is left to
    /// the local guard rather than denied (the CI run saw 11 denials with Redis slowed by
    /// 400 ms and a budget 25 times the demand).
    #[test]
    fn a_new_second_without_its_grant_is_left_to_the_local_guard() {
        let share = on();
        let t0 = Instant::now();
        share.grant(starts(1, 0, 100), slots(8, 0), t0);
        assert_eq!(take(&share, t0).1, ShareSaid::Allowed);
        assert_eq!(
            take(&share, t0).1,
            ShareSaid::Denied,
            "this second is spent"
        );
        let next_second = t0 + Duration::from_millis(150);
        let (p, said) = take(&share, next_second);
        assert_eq!(said, ShareSaid::Unanswered);
        assert!(p.is_some());
        // Its grant comes: the share decides again.
        share.grant(starts(0, 0, 850), slots(8, 0), next_second);
        assert_eq!(take(&share, next_second).1, ShareSaid::Denied);
    }

    /// Issue 30, item 5: a refill that fails, or waits longer than `budget_timeout`, leaves
    /// the reads the share would deny to the local guard.
    #[test]
    fn a_late_or_failed_refill_leaves_reads_to_the_local_guard() {
        let share = on();
        let t0 = Instant::now();
        share.grant(starts(0, 0, 900), slots(4, 0), t0);
        assert_eq!(take(&share, t0).1, ShareSaid::Denied);
        // A refill asks Redis; within budget_timeout (20 ms) its answer is still awaited.
        let ask = t0 + Duration::from_millis(100);
        share.asking(ask);
        assert_eq!(
            take(&share, ask + Duration::from_millis(10)).1,
            ShareSaid::Denied
        );
        let (p, said) = take(&share, ask + Duration::from_millis(30));
        assert_eq!(said, ShareSaid::Unanswered);
        assert!(p.is_some());
        // It failed: every read goes to the local guard until a grant comes.
        share.failed();
        assert_eq!(
            take(&share, ask + Duration::from_millis(31)).1,
            ShareSaid::Unanswered
        );
        share.grant(
            starts(0, 0, 800),
            slots(4, 0),
            ask + Duration::from_millis(40),
        );
        assert_eq!(
            take(&share, ask + Duration::from_millis(41)).1,
            ShareSaid::Denied
        );
    }
}
