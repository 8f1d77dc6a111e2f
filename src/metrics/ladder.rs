//! The primary ladder's and the orphan estimate's metrics: reads climbing to a rung, by
//! namespace, rung and result; ladder reads refused by an upstream's guard; and documents
//! staleguard saw twice in one `available` reply. Labels are bounded like the other
//! per-namespace metrics (`ns_label`), rungs and results by fixed lists.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use super::NsLabel;

/// The rungs a read can climb to.
pub const RUNGS: [&str; 2] = ["primary", "available"];

/// What a rung did for the read: answered it, failed too, was refused by the guard, or had
/// no time left in the read's budget.
pub const RESULTS: [&str; 4] = ["answered", "failed", "denied", "no_time"];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NsRungResult {
    pub namespace: String,
    pub rung: &'static str,
    pub result: &'static str,
}

#[derive(Default)]
pub struct LadderMetrics {
    pub attempts: Family<NsRungResult, Counter>,
    pub orphans: Family<NsLabel, Counter>,
}

impl std::fmt::Debug for LadderMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LadderMetrics").finish_non_exhaustive()
    }
}

impl LadderMetrics {
    pub(super) fn register(&self, r: &mut Registry) {
        r.register(
            "ladder_attempts",
            "Reads sent to a ladder rung (primary, available) after their first attempt failed or while their breaker was open, by namespace, rung and result (answered, failed, denied by the upstream's ladder_guard, no_time left in the read's budget)",
            self.attempts.clone(),
        );
        r.register(
            "orphans_estimated",
            "Documents returned twice (same _id) in one reply to a read served with readConcern available: orphans staleguard could see, a lower bound of those served",
            self.orphans.clone(),
        );
    }

    /// The count of one (namespace label, rung, result).
    pub fn attempts_of(&self, namespace: &str, rung: &'static str, result: &'static str) -> u64 {
        self.attempts
            .get(&NsRungResult {
                namespace: namespace.to_string(),
                rung,
                result,
            })
            .map_or(0, |c| c.get())
    }

    /// Orphans estimated for one namespace label.
    pub fn orphans_of(&self, namespace: &str) -> u64 {
        self.orphans
            .get(&NsLabel {
                namespace: namespace.to_string(),
            })
            .map_or(0, |c| c.get())
    }
}
