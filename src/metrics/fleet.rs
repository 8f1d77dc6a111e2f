//! The fleet's metrics (`[fleet]`, see `fleet`): whether this instance reaches Redis, the
//! openings and closes it published and applied, and what the fleet budget said to
//! primary-rung reads. Registered only when `[fleet]` is set, so an instance without it
//! exports what it did before.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FleetEventLabels {
    /// `published` (this instance's own), `applied` (another's, changing a breaker here),
    /// `declined` (another's close not applied: this instance's own last sample failed) or
    /// `contradicted` (another's opening closed by this instance's own samples, and not
    /// applied again).
    pub direction: &'static str,
    /// `open` or `close`.
    pub kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SkippedLabel {
    pub why: &'static str,
}

/// The `why` labels of `fleet_skipped_total`: what the fleet read from Redis and set aside.
pub const SKIPPED: [&str; 5] = [
    "too_large",
    "not_read",
    "not_utf8",
    "malformed",
    "unusable_index",
];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BudgetLabel {
    pub result: &'static str,
}

/// The `result` labels of `fleet_budget_total`: `allowed`, `denied` (the fleet's budget is
/// spent), `unanswered` (Redis did not answer within `budget_timeout`, or the link is
/// down: the local guard alone decided).
pub const BUDGET_RESULTS: [&str; 3] = ["allowed", "denied", "unanswered"];

#[derive(Default)]
pub struct FleetMetrics {
    pub connected: Gauge,
    pub events: Family<FleetEventLabels, Counter>,
    pub budget: Family<BudgetLabel, Counter>,
    pub skipped: Family<SkippedLabel, Counter>,
    pub name_conflicts: Counter,
}

impl std::fmt::Debug for FleetMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FleetMetrics").finish_non_exhaustive()
    }
}

impl FleetMetrics {
    pub(super) fn register(&self, r: &mut Registry) {
        r.register(
            "fleet_connected",
            "1 while this instance reaches the fleet's Redis, 0 while it acts alone",
            self.connected.clone(),
        );
        r.register(
            "fleet_events",
            "Breaker openings and closes shared through the fleet: published (this instance's own) or applied (another's, changing a breaker here), by kind (open, close)",
            self.events.clone(),
        );
        r.register(
            "fleet_budget",
            "Primary-rung reads judged by the fleet budget: allowed, denied (the fleet's budget spent), unanswered (Redis did not answer in time: the local guard alone decided)",
            self.budget.clone(),
        );
        r.register(
            "fleet_skipped",
            "Entries of the fleet's openings index set aside: too_large (a field or value over its cap, never sent by Redis), not_read (past the entries or bytes read at once), not_utf8 (a field name that is not UTF-8), malformed (not a fleet message, or under another field), unusable_index (the index keys hold another type)",
            self.skipped.clone(),
        );
        r.register(
            "fleet_name_conflicts",
            "Times this instance found its [fleet] name held by another live instance and joined under a suffixed name",
            self.name_conflicts.clone(),
        );
        for why in SKIPPED {
            let _ = self.skipped.get_or_create(&SkippedLabel { why });
        }
        for direction in ["published", "applied", "declined", "contradicted"] {
            for kind in ["open", "close"] {
                let _ = self
                    .events
                    .get_or_create(&FleetEventLabels { direction, kind });
            }
        }
        for result in BUDGET_RESULTS {
            let _ = self.budget.get_or_create(&BudgetLabel { result });
        }
    }

    pub fn event(&self, direction: &'static str, kind: &'static str) {
        self.events
            .get_or_create(&FleetEventLabels { direction, kind })
            .inc();
    }

    /// `n` index entries set aside, by why (one of [`SKIPPED`]).
    pub fn skipped(&self, why: &'static str, n: u64) {
        self.skipped.get_or_create(&SkippedLabel { why }).inc_by(n);
    }

    pub fn name_conflict(&self) {
        self.name_conflicts.inc();
    }

    pub fn budget(&self, result: &'static str) {
        self.budget.get_or_create(&BudgetLabel { result }).inc();
    }

    /// Primary-rung reads judged by the fleet budget with `result` so far.
    pub fn budget_count(&self, result: &'static str) -> u64 {
        self.budget.get_or_create(&BudgetLabel { result }).get()
    }
}
