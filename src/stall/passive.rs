//! The passive signal: writes relayed through each upstream, the age of the oldest one still
//! waiting, and when one last completed. Sessions keep their own list of writes in flight
//! ([`WriteTracker`]) and publish two numbers through atomics; the watch's tick sums them
//! per upstream. Nothing here runs for a request that is not a write.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::time::Instant;

use super::{lock, StallWatch};

/// Commands whose reply says a write finished (`moreToCome` writes get none and are not
/// counted). `findandmodify` is the legacy spelling drivers still accept.
pub fn is_write_command(name: &str) -> bool {
    matches!(
        name,
        "insert" | "update" | "delete" | "findAndModify" | "findandmodify" | "bulkWrite"
    )
}

/// What one session publishes: its writes in flight and when the oldest was sent.
#[derive(Debug, Default)]
pub struct SessionWrites {
    in_flight: AtomicU32,
    /// The watch's clock (ms since its epoch, plus one) of the oldest write; 0 = none.
    oldest: AtomicU64,
}

/// Everything relayed through one upstream.
#[derive(Debug)]
pub struct UpstreamWrites {
    pub addr: String,
    sessions: Mutex<Vec<Weak<SessionWrites>>>,
    completed: AtomicU64,
    failed: AtomicU64,
    abandoned: AtomicU64,
    /// The watch's clock of the last completed write; 0 = never.
    last_completion: AtomicU64,
    /// Owned by the watch's tick.
    pub(super) eval: Mutex<PassiveEval>,
}

/// The tick's memory of one upstream.
#[derive(Debug, Default)]
pub(super) struct PassiveEval {
    pub raised: bool,
    /// `completed` when the signal was raised: any completion after it clears the signal.
    pub completed_at_raise: u64,
    /// Counter values already exported as metrics.
    pub exported: [u64; 3],
}

/// One upstream's writes right now, as the rule sees them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PassiveSample {
    pub in_flight: u32,
    pub oldest_age: Option<Duration>,
    /// Time since the last completed write; none when none ever completed.
    pub since_completion: Option<Duration>,
    pub completed: u64,
    pub failed: u64,
    pub abandoned: u64,
}

/// The rule: at least `min_in_flight` writes waiting, the oldest for `stall_after` or more,
/// and none completed within `stall_after`. No writes waiting is never a stall.
pub fn stalled(s: &PassiveSample, stall_after: Duration, min_in_flight: u32) -> bool {
    s.in_flight > 0
        && s.in_flight >= min_in_flight
        && s.oldest_age.is_some_and(|a| a >= stall_after)
        && s.since_completion.is_none_or(|c| c >= stall_after)
}

impl UpstreamWrites {
    pub(super) fn new(addr: &str) -> UpstreamWrites {
        UpstreamWrites {
            addr: addr.to_string(),
            sessions: Mutex::new(Vec::new()),
            completed: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            abandoned: AtomicU64::new(0),
            last_completion: AtomicU64::new(0),
            eval: Mutex::new(PassiveEval::default()),
        }
    }

    fn register(&self) -> Arc<SessionWrites> {
        let slot = Arc::new(SessionWrites::default());
        let mut sessions = lock(&self.sessions);
        sessions.retain(|w| w.strong_count() > 0);
        sessions.push(Arc::downgrade(&slot));
        slot
    }

    /// Sums the live sessions (and forgets the ended ones).
    pub(super) fn sample(&self, now_ms: u64) -> PassiveSample {
        let mut in_flight = 0u32;
        let mut oldest = u64::MAX;
        lock(&self.sessions).retain(|w| match w.upgrade() {
            Some(s) => {
                in_flight = in_flight.saturating_add(s.in_flight.load(Ordering::Relaxed));
                match s.oldest.load(Ordering::Relaxed) {
                    0 => {}
                    o => oldest = oldest.min(o),
                }
                true
            }
            None => false,
        });
        let age = |at: u64| Duration::from_millis(now_ms.saturating_sub(at));
        let last = self.last_completion.load(Ordering::Relaxed);
        PassiveSample {
            in_flight,
            oldest_age: (oldest != u64::MAX).then(|| age(oldest)),
            since_completion: (last != 0).then(|| age(last)),
            completed: self.completed.load(Ordering::Relaxed),
            failed: self.failed.load(Ordering::Relaxed),
            abandoned: self.abandoned.load(Ordering::Relaxed),
        }
    }
}

/// A session's writes waiting for their reply (owned by the session; not shared).
#[derive(Debug, Default)]
pub struct WriteTracker {
    writes: Vec<(i32, u64)>,
    slot: Option<(Arc<SessionWrites>, Arc<UpstreamWrites>)>,
}

impl WriteTracker {
    pub fn is_empty(&self) -> bool {
        self.writes.is_empty()
    }

    /// Lets go of the room a burst of writes left, once none waits.
    pub fn shrink_idle(&mut self) {
        if self.writes.is_empty() && self.writes.capacity() > 16 {
            self.writes = Vec::new();
        }
    }

    /// A reply answering `response_to` would answer a tracked write.
    pub fn waits_for(&self, response_to: i32) -> bool {
        self.writes.iter().any(|w| w.0 == response_to)
    }

    /// A write with `request_id` went to `upstream`.
    pub fn sent(&mut self, watch: &StallWatch, upstream: &str, request_id: i32, now: Instant) {
        let at = watch.clock(now);
        let (slot, _) = self.slot.get_or_insert_with(|| {
            let up = watch.upstream(upstream);
            (up.register(), up)
        });
        if self.writes.is_empty() {
            slot.oldest.store(at, Ordering::Relaxed);
        }
        self.writes.push((request_id, at));
        slot.in_flight
            .store(self.writes.len() as u32, Ordering::Relaxed);
    }

    /// A reply answering `response_to` arrived. When it answers a tracked write, `ok` is
    /// asked whether the write completed (an ok reply, write errors included) or failed.
    /// Returns whether it answered a tracked write.
    pub fn answered(
        &mut self,
        watch: &StallWatch,
        response_to: i32,
        ok: impl FnOnce() -> bool,
        now: Instant,
    ) -> bool {
        let Some(i) = self.writes.iter().position(|w| w.0 == response_to) else {
            return false;
        };
        self.writes.swap_remove(i);
        let Some((slot, up)) = &self.slot else {
            return true;
        };
        if ok() {
            up.completed.fetch_add(1, Ordering::Relaxed);
            up.last_completion
                .store(watch.clock(now), Ordering::Relaxed);
        } else {
            up.failed.fetch_add(1, Ordering::Relaxed);
        }
        let oldest = self.writes.iter().map(|w| w.1).min().unwrap_or(0);
        slot.oldest.store(oldest, Ordering::Relaxed);
        slot.in_flight
            .store(self.writes.len() as u32, Ordering::Relaxed);
        true
    }

    /// The client left with writes unanswered: not progress, only noted.
    pub fn abandon(&mut self) {
        if let Some((slot, up)) = &self.slot {
            up.abandoned
                .fetch_add(self.writes.len() as u64, Ordering::Relaxed);
            slot.in_flight.store(0, Ordering::Relaxed);
            slot.oldest.store(0, Ordering::Relaxed);
        }
        self.writes.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(in_flight: u32, oldest: u64, since_completion: Option<u64>) -> PassiveSample {
        PassiveSample {
            in_flight,
            oldest_age: (in_flight > 0).then(|| Duration::from_millis(oldest)),
            since_completion: since_completion.map(Duration::from_millis),
            completed: 0,
            failed: 0,
            abandoned: 0,
        }
    }

    #[test]
    fn the_rule() {
        let after = Duration::from_secs(5);
        // No traffic is never a stall.
        assert!(!stalled(&sample(0, 0, None), after, 1));
        assert!(!stalled(&sample(0, 0, Some(60_000)), after, 1));
        // Waiting long enough, nothing completed for as long.
        assert!(stalled(&sample(3, 5_000, Some(5_000)), after, 1));
        assert!(stalled(&sample(1, 9_000, None), after, 1));
        // A completion within the window: progress.
        assert!(!stalled(&sample(3, 9_000, Some(4_999)), after, 1));
        // Not waiting long enough yet.
        assert!(!stalled(&sample(3, 4_999, Some(9_000)), after, 1));
        // Fewer waiting than required.
        assert!(!stalled(&sample(1, 9_000, None), after, 2));
    }

    #[test]
    fn a_burst_of_writes_leaves_no_room_behind() {
        let watch = StallWatch::new();
        let t0 = Instant::now();
        let mut t = WriteTracker::default();
        for id in 0..100 {
            t.sent(&watch, "m:1", id, t0);
        }
        assert!(t.waits_for(42) && !t.waits_for(100));
        t.shrink_idle();
        assert!(t.writes.capacity() >= 100, "kept while writes wait");
        for id in 0..100 {
            assert!(t.answered(&watch, id, || true, t0));
        }
        t.shrink_idle();
        assert_eq!(t.writes.capacity(), 0);
    }

    #[test]
    fn trackers_publish_in_flight_oldest_and_completions() {
        let watch = StallWatch::new();
        let t0 = Instant::now();
        let mut a = WriteTracker::default();
        let mut b = WriteTracker::default();
        a.sent(&watch, "m:1", 1, t0);
        a.sent(&watch, "m:1", 2, t0 + Duration::from_secs(1));
        b.sent(&watch, "m:1", 7, t0 + Duration::from_secs(2));
        let up = watch.upstream("m:1");
        let now = watch.clock(t0 + Duration::from_secs(3));
        let s = up.sample(now);
        assert_eq!(s.in_flight, 3);
        assert_eq!(s.oldest_age, Some(Duration::from_secs(3)));
        assert_eq!(s.since_completion, None);
        // An unrelated reply changes nothing.
        assert!(!a.answered(&watch, 99, || true, t0));
        assert!(a.answered(&watch, 1, || true, t0 + Duration::from_secs(3)));
        let s = up.sample(now);
        assert_eq!((s.in_flight, s.completed), (2, 1));
        assert_eq!(s.oldest_age, Some(Duration::from_secs(2)));
        assert_eq!(s.since_completion, Some(Duration::ZERO));
        // An error reply is not a completion; a client leaving is not either.
        assert!(a.answered(&watch, 2, || false, t0 + Duration::from_secs(3)));
        b.abandon();
        let s = up.sample(now);
        assert_eq!(
            (s.in_flight, s.completed, s.failed, s.abandoned),
            (0, 1, 1, 1)
        );
        assert_eq!(s.oldest_age, None);
        drop(a);
        drop(b);
        let _ = up.sample(now);
        assert!(
            lock(&up.sessions).is_empty(),
            "ended sessions are forgotten"
        );
    }
}
