//! Every metric staleguard exports, in one place. Each `Server` owns its own registry (no
//! global recorder), so tests run side by side. Label cardinality is bounded: commands
//! outside a fixed list count as `other`, and only namespaces that have a policy get a label
//! of their own (at most `MAX_NS_LABELS`; past that they share `other`).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use dashmap::{DashMap, DashSet};
use prometheus_client::encoding::text::{encode_eof, encode_registry};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

mod breaker;
mod dry_run;
mod exposition;
mod fleet;
mod hot;
mod labels;
mod ladder;
pub mod latency;
mod limits;
mod process;
mod ring;
mod stall;
mod totals;
pub use breaker::{BreakerMetrics, ConfirmLabel, TransitionLabels, CONFIRM_RESULTS};
pub use dry_run::{DryRunMetrics, NsAction, DRY_RUN_ACTIONS};
pub use exposition::Format;
pub use fleet::{BudgetLabel, FleetEventLabels, FleetMetrics, BUDGET_RESULTS};
pub use hot::NsHot;
pub use labels::{CommandDecision, NsCode, NsKind, NsLabel, ResultLabel, SideLabel, UpstreamLabel};
pub use ladder::{LadderMetrics, NsRungResult, RESULTS as LADDER_RESULTS, RUNGS as LADDER_RUNGS};
pub use latency::{LatencyBatch, LatencyHistogram};
pub use limits::{LimitLabel, LimitMetrics, WhyLabel, IGNORED, LIMITS};
pub use stall::{
    ProbeLabel, ProbeResult, ShardLabel, SignalKind, SignalLabel, StallMetrics, UpstreamResult,
};

pub const MAX_NS_LABELS: usize = 1000;

/// Commands that get their own `command` label; anything else is `other`.
const COMMANDS: [&str; 16] = [
    "find",
    "aggregate",
    "count",
    "distinct",
    "getMore",
    "insert",
    "update",
    "delete",
    "findAndModify",
    "hello",
    "isMaster",
    "ping",
    "killCursors",
    "endSessions",
    "explain",
    "other",
];

/// Sizes of the (command, decision) table, for sessions that count locally.
pub const REQUEST_SLOTS: (usize, usize) = (COMMANDS.len(), DECISIONS.len());

/// Decisions that get their own `decision` label (see `policy::Decision::name`).
const DECISIONS: [&str; 8] = [
    "forward",
    "track",
    "track_retry",
    "bounded",
    "rewrite",
    "primary",
    "fail_fast",
    "refuse",
];

pub struct Metrics {
    request_counters: [[OnceLock<Counter>; DECISIONS.len()]; COMMANDS.len()],
    hot: DashMap<String, Arc<NsHot>>,
    registry: Mutex<Registry>,
    pub client_connections: Gauge,
    pub client_connections_total: Counter,
    pub requests: Family<CommandDecision, Counter>,
    pub trigger_errors: Family<NsCode, Counter>,
    pub rewrites: Family<NsKind, Counter>,
    pub fail_fasts: Family<NsLabel, Counter>,
    pub refusals: Family<NsLabel, Counter>,
    /// Governed reads whose client got an `ok: 1` reply, by namespace.
    pub answered: Family<NsLabel, Counter>,
    /// 0 closed, 2 open.
    pub breaker_state: Family<NsLabel, Gauge>,
    pub upstream_up: Family<UpstreamLabel, Gauge>,
    pub upstream_latency: Family<UpstreamLabel, LatencyHistogram>,
    pub upstream_hello: Family<UpstreamLabel, Histogram, fn() -> Histogram>,
    pub upstream_silent: Family<UpstreamLabel, Counter>,
    pub reloads: Family<ResultLabel, Counter>,
    /// TLS handshakes that failed, by side (client, upstream).
    pub tls_failures: Family<SideLabel, Counter>,
    /// Trigger errors per namespace label, all codes together (for `/status`).
    ns_errors: DashMap<String, AtomicU64>,
    /// Forwarded requests with no decision to make, counted without a label lookup.
    forwarded: Counter,
    /// Every request from a client: governed (`requests`) and forwarded without a decision
    /// (`forwarded`) together, so that relay-only traffic shows too.
    client_requests: Counter,
    /// The process's own metrics, without the prefix (`process_cpu_seconds_total`, ...), and
    /// the io_urings' (named in full, `staleguard_uring_*`).
    process: Registry,
    seen_ns: DashSet<String>,
    ns_count: AtomicUsize,
    /// The write-stall watch's inputs and state.
    pub stall: StallMetrics,
    /// The primary ladder and the orphan estimate.
    pub ladder: LadderMetrics,
    /// The resource limits and the evidence set aside.
    pub limits: LimitMetrics,
    /// Breaker transitions and confirming reads.
    pub breakers: BreakerMetrics,
    /// Not metrics: the recent events and the series of the status page's plots (here so
    /// that everything that makes an event already holds it).
    pub recent: crate::events::Recent,
    /// `[fleet]` only (registered by [`Metrics::register_fleet`]).
    pub fleet: FleetMetrics,
    /// What dry-run namespaces would have done.
    pub dry_run: DryRunMetrics,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

fn latency_histogram() -> Histogram {
    // 50 µs .. ~1.6 s
    Histogram::new(exponential_buckets(0.000_05, 2.0, 16))
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let m = Metrics {
            request_counters: std::array::from_fn(|_| std::array::from_fn(|_| OnceLock::new())),
            hot: DashMap::new(),
            registry: Mutex::new(Registry::with_prefix("staleguard")),
            client_connections: Gauge::default(),
            client_connections_total: Counter::default(),
            requests: Family::default(),
            trigger_errors: Family::default(),
            rewrites: Family::default(),
            fail_fasts: Family::default(),
            refusals: Family::default(),
            answered: Family::default(),
            breaker_state: Family::default(),
            upstream_up: Family::default(),
            upstream_latency: Family::default(),
            upstream_hello: Family::new_with_constructor(latency_histogram),
            upstream_silent: Family::default(),
            reloads: Family::default(),
            tls_failures: Family::default(),
            ns_errors: DashMap::new(),
            forwarded: Counter::default(),
            client_requests: Counter::default(),
            process: {
                let mut r = Registry::default();
                r.register_collector(Box::new(process::ProcessCollector));
                r.register_collector(Box::new(ring::RingCollector));
                r
            },
            seen_ns: DashSet::new(),
            ns_count: AtomicUsize::new(0),
            stall: StallMetrics::default(),
            ladder: LadderMetrics::default(),
            limits: LimitMetrics::default(),
            breakers: BreakerMetrics::default(),
            recent: crate::events::Recent::default(),
            fleet: FleetMetrics::default(),
            dry_run: DryRunMetrics::default(),
        };
        if let Ok(mut r) = m.registry.lock() {
            r.register(
                "client_connections",
                "Client connections open now",
                m.client_connections.clone(),
            );
            r.register(
                "client_connections_accepted",
                "Client connections accepted",
                m.client_connections_total.clone(),
            );
            r.register(
                "requests",
                "Requests by command and decision (forward, track, track_retry, bounded, rewrite, primary, fail_fast, refuse)",
                m.requests.clone(),
            );
            r.register(
                "client_requests",
                "Requests from clients, every one: governed (also in requests_total, by decision) and forwarded without a decision (also in forwarded_unclassified_total); not empty in relay-only mode",
                m.client_requests.clone(),
            );
            r.register(
                "forwarded_unclassified",
                "Requests forwarded without classification (no policy applies, legacy opcodes, moreToCome)",
                m.forwarded.clone(),
            );
            r.register(
                "trigger_errors",
                "Trigger errors seen on governed reads, by namespace and code (timeout: client gave up, slow: slow_read)",
                m.trigger_errors.clone(),
            );
            r.register(
                "rewrites",
                "Reads rewritten to readConcern available, by namespace and kind (retry, preemptive)",
                m.rewrites.clone(),
            );
            r.register(
                "fail_fasts",
                "Reads answered with a fail-fast error, by namespace",
                m.fail_fasts.clone(),
            );
            r.register(
                "refusals",
                "Reads refused for asking readConcern available on a strict namespace",
                m.refusals.clone(),
            );
            r.register(
                "reads_answered",
                "Governed reads (tracked on a fallback or strict namespace) whose client got an ok reply, by namespace",
                m.answered.clone(),
            );
            r.register(
                "breaker_state",
                "Breaker state by namespace: 0 closed, 2 open",
                m.breaker_state.clone(),
            );
            r.register(
                "upstream_up",
                "Upstream health from periodic hello: 1 healthy, 0 not",
                m.upstream_up.clone(),
            );
            r.register(
                "upstream_request_seconds",
                "Time from forwarding a request to its first reply, by upstream",
                m.upstream_latency.clone(),
            );
            r.register(
                "upstream_hello_seconds",
                "Round trip of the health check's hello, by upstream",
                m.upstream_hello.clone(),
            );
            r.register(
                "upstream_silent_reads",
                "Followed reads an upstream left unanswered past their maxTimeMS and a grace (staleguard answered MaxTimeMSExpired), by upstream",
                m.upstream_silent.clone(),
            );
            r.register(
                "reloads",
                "Config reloads (SIGHUP, file change) by result: ok, error",
                m.reloads.clone(),
            );
            r.register(
                "tls_handshake_failures",
                "TLS handshakes that failed, by side (client, upstream)",
                m.tls_failures.clone(),
            );
            m.stall.register(&mut r);
            m.ladder.register(&mut r);
            m.limits.register(&mut r);
            m.breakers.register(&mut r);
            m.dry_run.register(&mut r);
        }
        // Both outcomes exist from the start at 0, so the first failed reload is an
        // increase that `increase()`/`rate()` can see (a series born at 1 is not).
        for result in ["ok", "error"] {
            let _ = m.reloads.get_or_create(&ResultLabel { result });
        }
        m
    }

    /// Adds the fleet's metrics to the registry (once, when `[fleet]` starts).
    pub fn register_fleet(&self) {
        if let Ok(mut r) = self.registry.lock() {
            self.fleet.register(&mut r);
        }
    }

    /// Every metric in OpenMetrics (see [`Metrics::render_as`]).
    pub fn render(&self) -> String {
        self.render_as(Format::OpenMetrics)
    }

    /// Every metric in `format` (counter families named by their `_total` sample in both,
    /// see `metrics/exposition.rs`).
    pub fn render_as(&self, format: Format) -> String {
        let mut om = String::new();
        if let Ok(r) = self.registry.lock() {
            let _ = encode_registry(&mut om, &r);
        }
        let _ = encode_registry(&mut om, &self.process);
        let _ = encode_eof(&mut om);
        exposition::finish(&om, format)
    }

    /// The `command` label for a command name (bounded set).
    pub fn command_label(name: &str) -> &'static str {
        COMMANDS
            .iter()
            .find(|c| **c == name)
            .copied()
            .unwrap_or("other")
    }

    /// The `namespace` label: the namespace itself while fewer than `MAX_NS_LABELS` have
    /// been seen, `other` after that.
    pub fn ns_label(&self, ns: &str) -> String {
        if self.seen_ns.contains(ns) {
            return ns.to_string();
        }
        if self.ns_count.load(Ordering::Relaxed) >= MAX_NS_LABELS {
            return "other".to_string();
        }
        if self.seen_ns.insert(ns.to_string()) {
            self.ns_count.fetch_add(1, Ordering::Relaxed);
        }
        ns.to_string()
    }

    /// Adds requests forwarded without classification (sessions count them locally and add
    /// them in batches).
    pub fn forwarded(&self, n: u64) {
        self.forwarded.inc_by(n);
        self.client_requests.inc_by(n);
    }

    pub fn request(&self, command: &str, decision: &'static str) {
        if let Some((c, d)) = Metrics::request_slot(command, decision) {
            self.add_requests(c, d, 1);
        }
    }

    /// Where a (command, decision) pair is counted, for sessions that count locally.
    pub fn request_slot(command: &str, decision: &str) -> Option<(usize, usize)> {
        let c = COMMANDS
            .iter()
            .position(|c| *c == command)
            .unwrap_or(COMMANDS.len() - 1);
        let d = DECISIONS.iter().position(|d| *d == decision)?;
        Some((c, d))
    }

    /// Adds `n` requests to a slot from `request_slot`.
    pub fn add_requests(&self, c: usize, d: usize, n: u64) {
        self.client_requests.inc_by(n);
        // Each (command, decision) counter is looked up in the family once, then kept.
        self.request_counters[c][d]
            .get_or_init(|| {
                self.requests
                    .get_or_create(&CommandDecision {
                        command: COMMANDS[c],
                        decision: DECISIONS[d],
                    })
                    .clone()
            })
            .inc_by(n);
    }

    pub fn trigger_error(&self, ns: &str, code: &str) {
        let namespace = self.ns_label(ns);
        self.ns_errors
            .entry(namespace.clone())
            .or_default()
            .fetch_add(1, Ordering::Relaxed);
        self.trigger_errors
            .get_or_create(&NsCode {
                namespace,
                code: code.to_string(),
            })
            .inc();
    }

    /// Trigger errors counted for `ns` since start, every code together.
    pub fn trigger_errors_total(&self, ns: &str) -> u64 {
        self.ns_errors
            .get(ns)
            .map_or(0, |n| n.load(Ordering::Relaxed))
    }

    pub fn rewrite(&self, ns: &str, kind: &'static str) {
        self.rewrites
            .get_or_create(&NsKind {
                namespace: self.ns_label(ns),
                kind,
            })
            .inc();
    }

    /// Counts a read that climbed to `rung` of `ns`'s ladder, and what came of it
    /// (`rung` from [`LADDER_RUNGS`], `result` from [`LADDER_RESULTS`]).
    pub fn ladder_attempt(&self, ns: &str, rung: &'static str, result: &'static str) {
        self.hot_ladder_attempt(&self.ns_hot(ns), rung, result);
    }

    /// Adds documents seen twice in one `available` reply on `ns` (0 too: the series of a
    /// namespace served `available` exists from its first such reply).
    pub fn orphans_estimated(&self, ns: &str, n: u64) {
        self.hot_orphans_estimated(&self.ns_hot(ns), n);
    }

    /// Sets a namespace's breaker gauge: 0 closed, 2 open (the breaker module
    /// maps its states, and reports every transition through here).
    pub fn breaker_state(&self, ns: &str, gauge: i64) {
        self.breaker_state
            .get_or_create(&NsLabel {
                namespace: self.ns_label(ns),
            })
            .set(gauge);
    }

    /// A breaker moved (counted in `breaker_transitions_total`).
    pub fn breaker_transition(&self, ns: &str, from: &'static str, to: &'static str) {
        self.breakers
            .transitions
            .get_or_create(&TransitionLabels {
                namespace: self.ns_label(ns),
                from,
                to,
            })
            .inc();
    }

    /// A read through `upstream` got no reply past its limit and a grace.
    pub fn upstream_silent(&self, upstream: &str) {
        let upstream = upstream.to_string();
        self.upstream_silent
            .get_or_create(&UpstreamLabel { upstream })
            .inc();
    }

    pub fn upstream_health(&self, upstream: &str, up: bool) {
        self.upstream_up
            .get_or_create(&UpstreamLabel {
                upstream: upstream.to_string(),
            })
            .set(up as i64);
    }

    /// Forgets the breaker gauge of a namespace whose breaker was dropped (reload).
    pub fn breaker_dropped(&self, ns: &str) {
        self.breaker_state.remove(&NsLabel {
            namespace: ns.to_string(),
        });
    }

    pub fn upstream_hello(&self, upstream: &str, latency: Duration) {
        self.upstream_hello
            .get_or_create(&UpstreamLabel {
                upstream: upstream.to_string(),
            })
            .observe(latency.as_secs_f64());
    }

    /// Forgets the health gauge of an upstream removed from the config.
    pub fn upstream_removed(&self, upstream: &str) {
        let label = UpstreamLabel {
            upstream: upstream.to_string(),
        };
        self.upstream_up.remove(&label);
    }

    pub fn tls_failure(&self, side: &'static str) {
        self.tls_failures.get_or_create(&SideLabel { side }).inc();
    }

    pub fn reload(&self, ok: bool) {
        self.reloads
            .get_or_create(&ResultLabel {
                result: if ok { "ok" } else { "error" },
            })
            .inc();
    }
}

#[cfg(test)]
mod ladder_tests {
    use super::*;

    #[test]
    fn ladder_and_orphan_metrics_are_exported_with_their_labels() {
        let m = Metrics::new();
        m.ladder_attempt("pay.tx", "primary", "answered");
        m.ladder_attempt("pay.tx", "primary", "answered");
        m.ladder_attempt("pay.tx", "primary", "denied");
        m.orphans_estimated("demo.inv", 3);
        m.orphans_estimated("demo.inv", 0);
        let text = m.render();
        assert!(
            text.contains(
                r#"staleguard_ladder_attempts_total{namespace="pay.tx",rung="primary",result="answered"} 2"#
            ),
            "{text}"
        );
        assert!(
            text.contains(r#"staleguard_orphans_estimated_total{namespace="demo.inv"} 3"#),
            "{text}"
        );
        assert_eq!(m.ladder.attempts_of("pay.tx", "primary", "denied"), 1);
        assert_eq!(m.ladder.orphans_of("demo.inv"), 3);
        assert_eq!(m.ladder.orphans_of("nothing.here"), 0);
    }
}
