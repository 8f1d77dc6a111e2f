//! A breaker as the status page, the demo and tests see it.

use tokio::time::Instant;

use super::{backoff, Breakers, Reason, State};
use crate::policy::NsPolicy;

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
    /// Failed probes since it opened.
    pub step: u32,
    /// Its next read probes at once (the write stall cleared).
    pub early: bool,
}

impl Snapshot {
    /// When an open breaker lets its next probe through under `policy` (`None` while held,
    /// or when not open).
    pub fn next_probe(&self, policy: &NsPolicy) -> Option<Instant> {
        match self.state {
            State::Open if !self.held && self.early => Some(self.opened_at),
            State::Open if !self.held => self.opened_at.checked_add(backoff(policy, self.step)),
            _ => None,
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
            })
            .collect();
        v.sort_by(|a, b| a.ns.cmp(&b.ns));
        v
    }
}
