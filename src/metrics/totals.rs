//! Per-namespace totals of the counters the status page plots, read on a timer (never per
//! request): answered, rewritten to `available`, failed fast, sent to the primary, trigger
//! errors, in `events::MEASURES` order.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;

use super::{Metrics, NsKind, NsLabel};

impl Metrics {
    /// The namespaces that have a label of their own (at most `MAX_NS_LABELS`; the ones
    /// past it share `other`, which is not returned).
    pub fn labelled_namespaces(&self) -> Vec<String> {
        self.seen_ns
            .iter()
            .map(|n| n.key().clone())
            .filter(|n| n != "other")
            .collect()
    }

    /// The totals of `ns` (a namespace label) since start: answered, rewritten, failed fast,
    /// sent to the primary, trigger errors.
    pub fn ns_totals(&self, ns: &str) -> [u64; 5] {
        let of = |family: &Family<NsLabel, Counter>| {
            family
                .get(&NsLabel {
                    namespace: ns.to_string(),
                })
                .map_or(0, |c| c.get())
        };
        let rewritten: u64 = ["preemptive", "retry"]
            .into_iter()
            .map(|kind| {
                self.rewrites
                    .get(&NsKind {
                        namespace: ns.to_string(),
                        kind,
                    })
                    .map_or(0, |c| c.get())
            })
            .sum();
        let primary = self.ladder.attempts_of(ns, "primary", "answered")
            + self.ladder.attempts_of(ns, "primary", "failed");
        [
            of(&self.answered),
            rewritten,
            of(&self.fail_fasts),
            primary,
            self.trigger_errors_total(ns),
        ]
    }
}
