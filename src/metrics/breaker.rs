//! The breakers' own metrics: every transition, and the confirming reads sent to tell a hung
//! secondary from a slow query. Labels are fixed lists (and namespaces bounded as
//! everywhere, through `Metrics::ns_label`).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TransitionLabels {
    pub namespace: String,
    pub from: &'static str,
    pub to: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ConfirmLabel {
    pub result: &'static str,
}

/// The `result` labels of `close_questions_total`.
pub const CLOSE_RESULTS: [&str; 3] = ["answered", "declined", "unknown"];

/// The `result` labels of `confirm_reads_total`.
pub const CONFIRM_RESULTS: [&str; 5] = ["confirmed", "unconfirmed", "unknown", "skipped", "shared"];

#[derive(Default)]
pub struct BreakerMetrics {
    pub transitions: Family<TransitionLabels, Counter>,
    pub confirms: Family<ConfirmLabel, Counter>,
    pub close_questions: Family<ConfirmLabel, Counter>,
}

impl BreakerMetrics {
    pub(super) fn register(&self, r: &mut Registry) {
        r.register(
            "breaker_transitions",
            "Breaker transitions by namespace, from and to (closed, open)",
            self.transitions.clone(),
        );
        r.register(
            "confirm_reads",
            "Questions to the cluster after a time-limit error, answered by a cheap read on staleguard's own connections: confirmed (the cheap read failed too: counted), unconfirmed (it was answered), unknown (no answer to judge: no rights, no reply), shared (answered by a cheap read of the same namespace in flight or within the last second), skipped (not asked: the connection asked within the window, has not proved itself, has counted its per_connection errors, or the bounds were reached)",
            self.confirms.clone(),
        );
        for result in CONFIRM_RESULTS {
            let _ = self.confirms.get_or_create(&ConfirmLabel { result });
        }
        r.register(
            "close_questions",
            "Questions to the cluster before an open breaker closes on its streak of answered samples, each answered by cheap reads on staleguard's own connections: answered (every one ok: closed), declined (one met a trigger error: kept open, streak reset), unknown (no answer to judge: kept open; the streak alone closes after two in a row)",
            self.close_questions.clone(),
        );
        for result in CLOSE_RESULTS {
            let _ = self.close_questions.get_or_create(&ConfirmLabel { result });
        }
    }

    pub fn close_question(&self, result: &'static str) {
        self.close_questions
            .get_or_create(&ConfirmLabel { result })
            .inc();
    }

    pub fn confirm(&self, result: &'static str) {
        self.confirms.get_or_create(&ConfirmLabel { result }).inc();
    }
}
