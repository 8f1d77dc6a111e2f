//! What `dry_run` namespaces would have done: `dry_run_total{namespace,action}`, counted
//! where the action is held back (the request side for what a decision would do, the reply
//! side for a retry or a climb to the primary after a trigger error), through each
//! namespace's cached handles (`NsHot`): no label to build and no family lock per request.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use super::{Metrics, NsHot};

/// The `action` labels: what staleguard would have done.
/// - `fail_fast`: answer with the fail-fast error (strict, breaker open)
/// - `bounded`: send under `open_time_limit` (strict, `on_open = "bound"`, breaker open)
/// - `rewrite`: rewrite to `readConcern: available` before sending (fallback, breaker open)
/// - `retry`: resend with `available` after a trigger error (fallback)
/// - `primary`: send to the primary (primary rung: breaker open, or after a trigger error)
/// - `refuse`: refuse a read asking for `available` on a strict namespace
/// - `time_limit`: lower the read's `maxTimeMS` (the `max_time` cap, the first attempt's
///   share of its budget)
pub const DRY_RUN_ACTIONS: [&str; 7] = [
    "fail_fast",
    "bounded",
    "rewrite",
    "retry",
    "primary",
    "refuse",
    "time_limit",
];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NsAction {
    pub namespace: String,
    pub action: &'static str,
}

#[derive(Default)]
pub struct DryRunMetrics {
    pub would: Family<NsAction, Counter>,
}

impl DryRunMetrics {
    pub(super) fn register(&self, r: &mut Registry) {
        r.register(
            "dry_run",
            "What dry_run namespaces would have done, by namespace and action (fail_fast, bounded, rewrite, retry, primary, refuse, time_limit); nothing of it was done",
            self.would.clone(),
        );
    }

    /// Every action's count for one namespace label, in [`DRY_RUN_ACTIONS`] order.
    pub fn counts_of(&self, namespace: &str) -> [(&'static str, u64); DRY_RUN_ACTIONS.len()] {
        DRY_RUN_ACTIONS.map(|action| {
            let n = self
                .would
                .get(&NsAction {
                    namespace: namespace.to_string(),
                    action,
                })
                .map_or(0, |c| c.get());
            (action, n)
        })
    }
}

impl Metrics {
    /// Counts one `action` (from [`DRY_RUN_ACTIONS`]) a dry run held back on `hot`'s
    /// namespace.
    pub fn hot_dry_run(&self, hot: &NsHot, action: &'static str) {
        let Some(i) = DRY_RUN_ACTIONS.iter().position(|a| *a == action) else {
            return;
        };
        hot.dry_run[i]
            .get_or_init(|| {
                self.dry_run
                    .would
                    .get_or_create(&NsAction {
                        namespace: hot.label.clone(),
                        action,
                    })
                    .clone()
            })
            .inc();
    }
}
