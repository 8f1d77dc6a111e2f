//! The bound on the breaker map: a namespace's breaker is created within `max` slots, and
//! when they are all taken the closed breaker idle the longest makes room.

use std::sync::atomic::Ordering;

use dashmap::mapref::entry::Entry;
use dashmap::mapref::one::RefMut;
use tokio::time::Instant;

use super::{Breaker, Breakers, State};

impl Breakers {
    /// The breaker of `ns`, created if needed within the bound (see [`Breakers`]); `None`
    /// when the map is full of breakers that cannot be evicted.
    pub(super) fn slot(&self, ns: &str, now: Instant) -> Option<RefMut<'_, String, Breaker>> {
        loop {
            if let Some(b) = self.map.get_mut(ns) {
                return Some(b);
            }
            if self.reserve() {
                let b = match self.map.entry(ns.to_string()) {
                    Entry::Occupied(e) => {
                        // Created meanwhile by another session: the slot goes back.
                        self.taken.fetch_sub(1, Ordering::AcqRel);
                        e.into_ref()
                    }
                    Entry::Vacant(v) => v.insert(Breaker::new(now)),
                };
                let taken = self.taken.load(Ordering::Acquire);
                self.metrics.limits.breakers.set(taken as i64);
                return Some(b);
            }
            if !self.evict_idlest() {
                self.metrics.limits.hit("max_breakers");
                return None;
            }
        }
    }

    /// Takes one of the `max` slots, if one is free.
    fn reserve(&self) -> bool {
        self.taken
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.max).then_some(n + 1)
            })
            .is_ok()
    }

    /// Removes the closed, unheld breaker idle the longest; false when there is none.
    fn evict_idlest(&self) -> bool {
        let idlest = self
            .map
            .iter()
            .filter(|e| e.state == State::Closed && !e.held)
            .min_by_key(|e| e.last_seen)
            .map(|e| e.key().clone());
        let Some(ns) = idlest else {
            return false;
        };
        // Still closed and unheld? (It may have moved since the scan.)
        let removed = self
            .map
            .remove_if(&ns, |_, b| b.state == State::Closed && !b.held);
        if removed.is_some() {
            self.taken.fetch_sub(1, Ordering::AcqRel);
            self.metrics.limits.hit("max_breakers");
            tracing::debug!(ns = %ns, "breaker map full: idle closed breaker evicted");
        }
        // Either way something changed; the caller tries again.
        true
    }
}
