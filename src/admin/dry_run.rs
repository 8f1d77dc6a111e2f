//! What `dry_run` namespaces would have done: the `dry_run` object of each namespace in
//! `/status` (`staleguard_dry_run_total`); the page draws it as a table.

use serde::Serialize;
use std::collections::BTreeMap;

use crate::metrics::Metrics;

/// A namespace's dry run: on or off, and what it would have done so far.
#[derive(Debug, Serialize)]
pub struct DryRunStatus {
    pub enabled: bool,
    /// `dry_run_total` of this namespace by action (every action, zeros included); none for
    /// a wildcard pattern (counted per namespace, on the namespace's own row).
    pub would: Option<BTreeMap<&'static str, u64>>,
}

impl DryRunStatus {
    /// `ns`'s counts (`exact`: a namespace, not a wildcard pattern).
    pub fn of(metrics: &Metrics, ns: &str, enabled: bool, exact: bool) -> DryRunStatus {
        DryRunStatus {
            enabled,
            would: exact.then(|| metrics.dry_run.counts_of(ns).into_iter().collect()),
        }
    }

    /// Some action would have been taken.
    pub fn any(&self) -> bool {
        self.would
            .as_ref()
            .is_some_and(|w| w.values().any(|n| *n > 0))
    }
}
