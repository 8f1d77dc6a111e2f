//! Holding breakers open for the write-stall watch (`on_write_stall =
//! "open_fallback_breakers"`): while a stall is suspected, the breakers of fallback
//! namespaces stay open without probing; when it clears they are released, and each probes
//! at its next read. The watch decides when (`stall`); this is how.

use std::sync::MutexGuard;

use tokio::time::Instant;

use super::{Breakers, Reason, State, Transition};

impl Breakers {
    fn hold_reason(&self) -> MutexGuard<'_, Option<String>> {
        self.hold.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Opens `ns` (creating its breaker, within the bound) and holds it open until
    /// [`Breakers::release_held`]. Returns the transition when it was not open already;
    /// nothing when it is held already.
    pub fn hold_open(&self, ns: &str, why: &str, now: Instant) -> Option<Transition> {
        let t = self.hold_one(ns, why, now);
        self.report(ns, t)
    }

    fn hold_one(&self, ns: &str, why: &str, now: Instant) -> Option<Transition> {
        if self.map.get(ns).is_some_and(|b| b.held) {
            return None;
        }
        let mut b = self.slot(ns, now)?;
        if b.held {
            return None;
        }
        b.held = true;
        b.step = 0;
        if b.state == State::Open {
            // Open on its own errors already: it keeps its reason, and now waits for the
            // stall to clear before probing.
            return None;
        }
        Some(self.moved(b.open(
            Reason::WriteStall,
            why.to_string(),
            now,
            std::time::Duration::ZERO,
        )))
    }

    /// Ends every hold: the stall is over, so each held breaker probes at its next read
    /// (and, if that probe fails, backs off from `min_cooldown`). Returns the namespaces
    /// released.
    pub fn release_held(&self, now: Instant) -> Vec<String> {
        let mut out = Vec::new();
        for mut e in self.map.iter_mut() {
            if e.held {
                e.held = false;
                e.opened_at = now;
                e.probe_since = None;
                e.step = 0;
                e.early = true;
                e.probe_after = now;
                e.streak = Default::default();
                out.push(e.key().clone());
            }
        }
        out.sort();
        out
    }

    pub fn is_held(&self, ns: &str) -> bool {
        self.map.get(ns).is_some_and(|b| b.held)
    }

    /// The watch's action while a stall is suspected: holds `namespaces` open, and keeps
    /// `why` for the fallback namespaces first read while the hold lasts
    /// ([`Breakers::hold_on_read`]). Called again on every tick of the watch.
    pub fn hold_fallback<'a>(
        &self,
        namespaces: impl IntoIterator<Item = &'a str>,
        why: &str,
        now: Instant,
    ) {
        *self.hold_reason() = Some(why.to_string());
        for ns in namespaces {
            self.hold_open(ns, why, now);
        }
    }

    /// The stall is over (or the action was turned off): releases every held breaker.
    pub fn end_hold(&self, now: Instant) {
        *self.hold_reason() = None;
        self.release(now);
    }

    /// A session reads a fallback namespace while the watch holds breakers: hold this one
    /// too (a `db.*` pattern has no exact namespace until it is read).
    pub fn hold_on_read(&self, ns: &str, now: Instant) {
        if self.is_held(ns) {
            return;
        }
        let why = self
            .hold_reason()
            .clone()
            .unwrap_or_else(|| "write stall suspected".to_string());
        self.hold_open(ns, &why, now);
        // The stall may have cleared meanwhile; the watch released before this hold landed.
        if self.hold_reason().is_none() {
            self.release(now);
        }
    }

    fn release(&self, now: Instant) {
        let released = self.release_held(now);
        if !released.is_empty() {
            tracing::info!(namespaces = ?released, "write stall over (or action off): breakers released; each probes at its next read");
        }
    }
}
