//! The status model behind `/status` (JSON) and `/` (HTML): one snapshot of the live
//! config, breakers, upstreams, the write-stall watch and counters.

use std::time::SystemTime;

use serde::Serialize;

use super::history::EventView;
use super::ns_rows::{namespaces, NsStatus};
use super::stall_status::{write_stall, WriteStallStatus};
use super::summary::Summary;
use super::text::rfc3339;
use crate::events::Kind;
use crate::handles::AdminHandles;

#[derive(Debug, Serialize)]
pub struct Status {
    pub version: &'static str,
    pub started_at: String,
    pub uptime_seconds: u64,
    pub listen: String,
    pub tls: bool,
    pub upstream_tls: bool,
    /// Listening (not stopping) and at least one upstream healthy.
    pub ready: bool,
    pub config: ConfigStatus,
    pub client_connections: i64,
    /// `"off"` or the interval, e.g. `"5s"`.
    pub health_checks: String,
    pub upstreams: Vec<UpstreamStatus>,
    /// What the first screen says: what is wrong, since when, what staleguard does about
    /// it, what clients got in the last bucket.
    pub summary: Summary,
    pub write_stall: WriteStallStatus,
    /// `[fleet]`: this instance in the fleet; none without the section.
    pub fleet: Option<FleetStatus>,
    /// Open breakers first, then the rest; by namespace within each.
    pub namespaces: Vec<NsStatus>,
    /// The last `events::CAPACITY` breaker transitions, write-stall signals raised and
    /// cleared, reloads and upstreams up or down, most recent first.
    pub events: Vec<super::history::EventView>,
    /// Events recorded since start (the older ones dropped from `events`).
    pub events_recorded_total: u64,
    /// The plots' series: per entry, what reads met in each bucket of the last minutes.
    pub history: super::history::HistoryView,
}

/// This instance in the fleet (`[fleet]`).
#[derive(Debug, Serialize)]
pub struct FleetStatus {
    /// Its name in the fleet.
    pub name: String,
    /// The name is the default, `listen`'s address: the same on every instance started from
    /// one config (sidecars from one ConfigMap), whose openings then ignore each other.
    pub default_name: bool,
    /// Redis answered the last check; otherwise it acts alone (its own breakers, its local
    /// guard, every probe and poll).
    pub connected: bool,
    /// Since when it is connected (or alone): the last time that changed.
    pub since: Option<String>,
    pub since_seconds_ago: Option<u64>,
    /// The write probes and shard polls it runs for the fleet (`probe:<id>`,
    /// `shard:<hosts>`); none: every one, as it does alone.
    pub leads: Option<Vec<String>>,
    /// Primary-rung reads judged by its share of the fleet budget since start.
    pub budget: FleetBudgetCounts,
    /// `[ladder_guard] fleet_max_per_second` and `fleet_max_in_flight` (none: not set).
    pub fleet_max_per_second: Option<u32>,
    pub fleet_max_in_flight: Option<u32>,
}

#[derive(Debug, Serialize)]
pub struct FleetBudgetCounts {
    pub allowed: u64,
    /// Refused: the fleet's budget was spent.
    pub denied: u64,
    /// Redis did not answer in time (or the link is down): the local guard alone decided.
    pub unanswered: u64,
}

#[derive(Debug, Serialize)]
pub struct ConfigStatus {
    pub file: String,
    pub last_reload: ReloadView,
}

#[derive(Debug, Serialize)]
pub struct ReloadView {
    /// `ok` or `error`.
    pub result: &'static str,
    /// `start`, `signal`, `file`, `api`.
    pub trigger: String,
    pub at: String,
    /// Errors as `file:line: key: message` (or warnings when ok).
    pub messages: Vec<String>,
}

#[derive(Debug, Serialize)]
pub struct UpstreamStatus {
    pub address: String,
    /// `up`, `down`, `unknown`.
    pub health: &'static str,
    pub since: String,
    pub last_check: Option<String>,
    pub last_hello_ms: Option<f64>,
    pub last_error: Option<String>,
    /// Primary-rung reads through this router waiting for their reply (`[ladder_guard]`).
    pub ladder_in_flight: u32,
    /// Reads it left unanswered past their limit and a grace (staleguard answered them).
    pub silent_reads: u64,
    pub last_silent: Option<String>,
}

/// Ready to serve: at least one upstream answered its last health check (with checks off:
/// at least one upstream is configured).
pub fn ready(shared: &AdminHandles) -> bool {
    let checks_on = shared.config.load().health_interval.is_some();
    shared.upstreams.any_up(checks_on)
}

/// Takes the snapshot. `listening` is false once the proxy is stopping.
pub fn collect(shared: &AdminHandles, listening: bool) -> Status {
    let config = shared.config.load_full();
    let now = SystemTime::now();
    let reload = shared.runtime.reload_status();
    let upstreams: Vec<UpstreamStatus> = shared
        .upstreams
        .list()
        .iter()
        .map(|u| {
            let i = u.info();
            UpstreamStatus {
                address: u.addr.clone(),
                health: i.health.as_str(),
                since: rfc3339(i.since),
                last_check: i.last_check.map(rfc3339),
                last_hello_ms: i.last_latency.map(|d| d.as_secs_f64() * 1000.0),
                last_error: i.last_error,
                ladder_in_flight: u.ladder.in_flight(),
                silent_reads: i.silent_reads,
                last_silent: i.last_silent.map(rfc3339),
            }
        })
        .collect();
    let ready = listening && ready(shared);
    let write_stall = write_stall(shared, &config);
    let namespaces = namespaces(shared, &config.policy);
    let events = super::history::events(shared);
    let history = super::history::history(shared);
    let fleet = fleet(shared, &config, &events);
    let summary = Summary::of(&super::summary::Inputs {
        ready,
        reload_failed: !reload.ok,
        write_stall: &write_stall,
        namespaces: &namespaces,
        fleet_alone: fleet
            .as_ref()
            .filter(|f| !f.connected)
            .map(|f| (f.name.as_str(), f.since_seconds_ago)),
        upstreams_down: upstreams
            .iter()
            .filter(|u| u.health == "down")
            .map(|u| u.address.as_str())
            .collect(),
        history: &history,
        now_unix_ms: crate::events::unix_ms(now),
    });
    Status {
        version: env!("CARGO_PKG_VERSION"),
        started_at: rfc3339(shared.runtime.started),
        uptime_seconds: now
            .duration_since(shared.runtime.started)
            .unwrap_or_default()
            .as_secs(),
        listen: shared
            .runtime
            .local_addr()
            .map_or_else(|| config.listen.clone(), |a| a.to_string()),
        tls: config.tls.is_some(),
        upstream_tls: config.upstream_tls.is_some(),
        ready,
        config: ConfigStatus {
            file: config.source.display().to_string(),
            last_reload: ReloadView {
                result: if reload.ok { "ok" } else { "error" },
                trigger: reload.trigger,
                at: rfc3339(reload.at),
                messages: reload.messages,
            },
        },
        client_connections: shared.metrics.client_connections.get(),
        health_checks: config.health_interval.map_or_else(
            || "off".into(),
            |d| humantime::format_duration(d).to_string(),
        ),
        upstreams,
        summary,
        write_stall,
        fleet,
        namespaces,
        events,
        events_recorded_total: shared.metrics.recent.events.total(),
        history,
    }
}

/// `[fleet]`: this instance's part, with since when it is connected or alone (from the
/// events).
fn fleet(
    shared: &AdminHandles,
    config: &crate::config::Config,
    events: &[EventView],
) -> Option<FleetStatus> {
    let f = shared.fleet.as_ref()?;
    let m = &shared.metrics.fleet;
    let last = events
        .iter()
        .find(|e| matches!(e.event.kind, Kind::FleetJoined | Kind::FleetLost));
    let budgets = config.fleet.as_ref();
    Some(FleetStatus {
        name: f.name(),
        default_name: budgets.is_some_and(|b| b.name == config.listen),
        connected: f.connected(),
        since: last.map(|e| e.at.clone()),
        since_seconds_ago: last.map(|e| e.seconds_ago),
        leads: shared.stall.led(),
        budget: FleetBudgetCounts {
            allowed: m.budget_count("allowed"),
            denied: m.budget_count("denied"),
            unanswered: m.budget_count("unanswered"),
        },
        fleet_max_per_second: budgets.and_then(|b| b.max_per_second),
        fleet_max_in_flight: budgets.and_then(|b| b.max_in_flight),
    })
}
