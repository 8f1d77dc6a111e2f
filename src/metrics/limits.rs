//! The resource limits' metrics: what each limit is set to, how often it acted, and the
//! evidence the breakers set aside because a client's word alone cannot prove a failure.
//! Labels are fixed lists.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// Which limit (the `limit` label).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LimitLabel {
    pub limit: &'static str,
}

/// Why a trigger error was not counted (the `why` label).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WhyLabel {
    pub why: &'static str,
}

/// The `limit` labels, in the order `/metrics` lists them.
pub const LIMITS: [&str; 15] = [
    "max_connections",
    "max_connections_per_peer",
    "first_message_timeout",
    "message_timeout",
    "idle_timeout",
    "write_timeout",
    "upstream_write_timeout",
    "held_for_upstream",
    "max_pending_reads",
    "max_breakers",
    "admin_max_connections",
    "admin_max_connections_per_peer",
    "admin_health_lane",
    "admin_header_read_timeout",
    "admin_request_timeout",
];

/// `limit` labels with no setting: clients closed for breaking a protocol rule the
/// evidence relies on (`reused_request_id`: a requestID reused while a followed read or
/// write with that id waits for its reply).
pub const RULES: [&str; 1] = ["reused_request_id"];

/// The `why` labels of `evidence_ignored_total`.
pub const IGNORED: [&str; 9] = [
    "short_wait",
    "short_time_limit",
    "per_connection",
    "client_gone",
    "tagged",
    "unconfirmed",
    "queued",
    "unproven",
    "before_close",
];

#[derive(Default)]
pub struct LimitMetrics {
    /// The configured value of each limit (seconds for durations, 0 when off).
    pub setting: Family<LimitLabel, Gauge<f64, std::sync::atomic::AtomicU64>>,
    /// Times a limit acted: a refused or closed client, a read not tracked, a breaker
    /// evicted or not created.
    pub hits: Family<LimitLabel, Counter>,
    /// Breakers in the map now.
    pub breakers: Gauge,
    /// Trigger errors set aside as no evidence, by why.
    pub ignored: Family<WhyLabel, Counter>,
    /// Compressed requests decompressed on the blocking pool (larger than the inline limit).
    pub off_worker_decompressions: Counter,
}

impl LimitMetrics {
    pub(super) fn register(&self, r: &mut Registry) {
        r.register(
            "limit_setting",
            "The configured value of each resource limit (seconds for durations, 0 when off)",
            self.setting.clone(),
        );
        r.register(
            "limit_hits",
            "Times a resource limit acted (client refused or closed, read not tracked, breaker evicted), or a client was closed for reusing the requestID of a request still waiting (reused_request_id)",
            self.hits.clone(),
        );
        r.register("breakers", "Breakers in the map now", self.breakers.clone());
        r.register(
            "evidence_ignored",
            "Trigger errors not counted: short_wait (slow reply before min_wait), short_time_limit (the read's own maxTimeMS below min_wait), per_connection (past per_connection in the window), client_gone (the client closed before the reply), tagged (133 on a read with tag sets), unconfirmed (a time limit the confirming read did not confirm), queued (a read mongos had not started yet), unproven (said on a connection that has neither authenticated nor had a read answered)",
            self.ignored.clone(),
        );
        r.register(
            "off_worker_decompressions",
            "Compressed requests opened whole that declared more than 64 KiB uncompressed, decompressed on the blocking pool (at most half the cores at once) instead of a runtime worker",
            self.off_worker_decompressions.clone(),
        );
        // Every series exists from the start at 0, so a first hit is an increase.
        for limit in LIMITS {
            let _ = self.hits.get_or_create(&LimitLabel { limit });
            let _ = self.setting.get_or_create(&LimitLabel { limit });
        }
        for limit in RULES {
            let _ = self.hits.get_or_create(&LimitLabel { limit });
        }
        for why in IGNORED {
            let _ = self.ignored.get_or_create(&WhyLabel { why });
        }
    }

    /// A limit acted.
    pub fn hit(&self, limit: &'static str) {
        self.hits.get_or_create(&LimitLabel { limit }).inc();
    }

    /// A trigger error was set aside.
    pub fn ignored(&self, why: &'static str) {
        self.ignored.get_or_create(&WhyLabel { why }).inc();
    }

    /// Records a limit's configured value.
    pub fn set(&self, limit: &'static str, value: f64) {
        self.setting.get_or_create(&LimitLabel { limit }).set(value);
    }
}
