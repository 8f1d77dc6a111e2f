//! A breaker as the status page, the demo and tests see it.

use tokio::time::Instant;

use super::{Breakers, Reason, State};

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
    /// Failed samples in a row since it opened (or since the last answered one).
    pub step: u32,
    /// Its next read probes at once (the write stall cleared).
    pub early: bool,
    /// When the next probe may go (probe mode).
    pub probe_after: Instant,
    /// Samples answered in a row while open.
    pub streak: u32,
}

impl Snapshot {
    /// When an open breaker lets its next probe through (`None` while held or when not
    /// open).
    pub fn next_probe(&self) -> Option<Instant> {
        match self.state {
            State::Open if self.held => None,
            State::Open if self.early => Some(self.opened_at.min(self.probe_after)),
            State::Open => Some(self.probe_after),
            State::Closed => None,
        }
    }
}

impl Breakers {
    /// Every breaker, by namespace.
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
                probe_after: e.probe_after,
                streak: e.streak.count,
            })
            .collect();
        v.sort_by(|a, b| a.ns.cmp(&b.ns));
        v
    }
}
