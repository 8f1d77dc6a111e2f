//! The counters of one namespace that a governed read may bump on every request, reached
//! through handles made once per namespace ([`Metrics::ns_hot`]): no label to build and no
//! family lock per request.

use std::sync::{Arc, OnceLock};

use prometheus_client::metrics::counter::Counter;

use super::{
    Metrics, NsKind, NsLabel, NsRungResult, DRY_RUN_ACTIONS, LADDER_RESULTS, LADDER_RUNGS,
    MAX_NS_LABELS,
};

/// Counters of one namespace that repeat per request while its breaker is open. The
/// ladder's and the orphan estimate's are made on first use (a series appears when it is
/// first counted, as before), then reached without a label `String` or the family's lock.
#[derive(Debug)]
pub struct NsHot {
    pub ns: String,
    pub preemptive: Counter,
    pub fail_fast: Counter,
    pub refusal: Counter,
    /// Governed reads answered `ok: 1` (`reads_answered_total`).
    pub answered: Counter,
    /// The namespace's label (`ns`, or "other" past the label bound).
    pub(super) label: String,
    pub(super) ladder: [[OnceLock<Counter>; LADDER_RESULTS.len()]; LADDER_RUNGS.len()],
    pub(super) orphans: OnceLock<Counter>,
    /// `dry_run_total`, by action.
    pub(super) dry_run: [OnceLock<Counter>; DRY_RUN_ACTIONS.len()],
}

impl Metrics {
    /// The per-namespace counters a governed read may bump, made once per namespace; a
    /// session keeps the last one it used, so a run of reads on one namespace neither
    /// allocates nor hashes.
    pub fn ns_hot(&self, ns: &str) -> Arc<NsHot> {
        if let Some(h) = self.hot.get(ns) {
            return h.clone();
        }
        let namespace = self.ns_label(ns);
        let hot = Arc::new(NsHot {
            ns: ns.to_string(),
            preemptive: self
                .rewrites
                .get_or_create(&NsKind {
                    namespace: namespace.clone(),
                    kind: "preemptive",
                })
                .clone(),
            fail_fast: self
                .fail_fasts
                .get_or_create(&NsLabel {
                    namespace: namespace.clone(),
                })
                .clone(),
            refusal: self
                .refusals
                .get_or_create(&NsLabel {
                    namespace: namespace.clone(),
                })
                .clone(),
            answered: self
                .answered
                .get_or_create(&NsLabel {
                    namespace: namespace.clone(),
                })
                .clone(),
            label: namespace,
            ladder: Default::default(),
            orphans: OnceLock::new(),
            dry_run: Default::default(),
        });
        if self.hot.len() < MAX_NS_LABELS {
            self.hot.insert(ns.to_string(), hot.clone());
        }
        hot
    }

    /// [`Metrics::ladder_attempt`] through `hot`'s handles (the per-request path).
    pub fn hot_ladder_attempt(&self, hot: &NsHot, rung: &'static str, result: &'static str) {
        let (Some(r), Some(k)) = (
            LADDER_RUNGS.iter().position(|x| *x == rung),
            LADDER_RESULTS.iter().position(|x| *x == result),
        ) else {
            return;
        };
        hot.ladder[r][k]
            .get_or_init(|| {
                self.ladder
                    .attempts
                    .get_or_create(&NsRungResult {
                        namespace: hot.label.clone(),
                        rung,
                        result,
                    })
                    .clone()
            })
            .inc();
    }

    /// [`Metrics::orphans_estimated`] through `hot`'s handle (the per-request path).
    pub fn hot_orphans_estimated(&self, hot: &NsHot, n: u64) {
        hot.orphans
            .get_or_init(|| {
                self.ladder
                    .orphans
                    .get_or_create(&NsLabel {
                        namespace: hot.label.clone(),
                    })
                    .clone()
            })
            .inc_by(n);
    }
}
