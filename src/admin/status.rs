//! The status model behind `/status` (JSON) and `/` (HTML): one snapshot of the live
//! config, breakers, upstreams, the write-stall watch and counters.

use std::time::{Duration, SystemTime};

use serde::Serialize;
use tokio::time::Instant;

use crate::breaker::State;
use crate::handles::AdminHandles;
use crate::policy::{Mode, NsPolicy};
use crate::stall::Evidence;

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
    /// Redis answered the last check; otherwise it acts alone (its own breakers, its local
    /// guard, every probe and poll).
    pub connected: bool,
    /// The write probes and shard polls it runs for the fleet (`probe:<id>`,
    /// `shard:<hosts>`); none: every one, as it does alone.
    pub leads: Option<Vec<String>>,
    /// Primary-rung reads judged by its share of the fleet budget since start.
    pub budget: FleetBudgetCounts,
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

/// The write-progress watch: is a write stall suspected, on what evidence, since when.
#[derive(Debug, Serialize)]
pub struct WriteStallStatus {
    /// `off` (nothing watched), `clear` or `suspected`.
    pub state: &'static str,
    /// The signals configured: `passive`, `probe`, `composite`.
    pub watching: Vec<&'static str>,
    /// `on_write_stall`: `observe` or `open_fallback_breakers`.
    pub action: &'static str,
    /// While suspected: the earliest raised signal's start.
    pub since: Option<String>,
    pub since_seconds_ago: Option<u64>,
    /// `writes are not completing on <where> since <time>`.
    pub headline: Option<String>,
    /// Breakers held open by the action.
    pub held_breakers: Vec<String>,
    /// Raised first.
    pub signals: Vec<SignalStatus>,
}

#[derive(Debug, Serialize)]
pub struct SignalStatus {
    /// `passive`, `probe` or `composite`.
    pub signal: &'static str,
    pub target: String,
    /// Where, in words (`upstream ...`, `shard A (shardA at host:port)`).
    pub place: String,
    /// `raised` or `clear`.
    pub state: &'static str,
    pub since: Option<String>,
    pub since_seconds_ago: Option<u64>,
    pub headline: Option<String>,
    /// The evidence in one line.
    pub summary: String,
    pub evidence: Evidence,
}

#[derive(Debug, Serialize)]
pub struct NsStatus {
    /// A configured pattern, or an exact namespace that has a breaker.
    pub namespace: String,
    /// `pattern` (a configured entry without a breaker of its own) or `namespace`.
    pub kind: &'static str,
    /// The governing pattern; none when no pattern governs it any more.
    pub pattern: Option<String>,
    /// `fallback`, `strict`, `passthrough`, or `unlisted`.
    pub mode: &'static str,
    /// `dry_run` is on (in the JSON: `dry_run.enabled`).
    #[serde(skip)]
    pub dry_run: bool,
    /// In the JSON as `dry_run`: on or off, and what it would have done.
    #[serde(rename = "dry_run")]
    pub dry_run_status: super::dry_run::DryRunStatus,
    /// `closed`, `open`; none for a wildcard pattern (breakers are per exact
    /// namespace: the ones it governs are listed on their own).
    pub breaker: Option<&'static str>,
    /// What the proxy does with eligible reads right now.
    pub action: String,
    pub errors_in_window: Option<usize>,
    pub threshold: Option<u32>,
    pub trigger_errors_total: Option<u64>,
    /// Reads rewritten to `available` since start (retries and preemptive rewrites).
    pub rewritten_total: Option<u64>,
    /// Reads answered with the fail-fast error since start.
    pub failed_fast_total: Option<u64>,
    pub last_transition: Option<String>,
    pub last_transition_seconds_ago: Option<u64>,
    /// Why the last transition happened.
    pub reason: Option<String>,
    /// While open: seconds until the next probe (none while held by the write-stall watch,
    /// or when every read is a sample: strict, `on_open = "bound"`).
    pub next_probe_seconds: Option<u64>,
    /// While open: samples answered in a row (it closes at `close_after`, from two
    /// connections, spanning `min_cooldown`).
    pub answered_in_a_row: Option<u32>,
    /// Held open by the write-stall watch (`on_write_stall = "open_fallback_breakers"`).
    pub held_by_write_stall: bool,
    /// The rungs a failing read climbs (`ladder`): `["primary"]`, `["available"]`, ...
    pub ladder: Vec<&'static str>,
    /// Reads sent to a rung after the first attempt failed or while the breaker was open,
    /// by what came of them (none for a wildcard pattern: counted per namespace).
    pub ladder_reads: Option<LadderReads>,
    /// Documents seen twice in one `available` reply batch (a lower bound of the orphans
    /// served); none for a wildcard pattern.
    pub orphans_estimated_total: Option<u64>,
}

#[derive(Debug, Serialize, Default)]
pub struct LadderReads {
    pub primary_answered: u64,
    pub primary_failed: u64,
    /// Refused by the upstream's `[ladder_guard]`.
    pub primary_denied: u64,
    pub available_answered: u64,
    pub available_failed: u64,
    /// A rung was due but the read's time budget was spent.
    pub no_time: u64,
}

impl LadderReads {
    fn of(metrics: &crate::metrics::Metrics, ns: &str) -> LadderReads {
        let n = |rung, result| metrics.ladder.attempts_of(ns, rung, result);
        LadderReads {
            primary_answered: n("primary", "answered"),
            primary_failed: n("primary", "failed"),
            primary_denied: n("primary", "denied"),
            available_answered: n("available", "answered"),
            available_failed: n("available", "failed"),
            no_time: n("primary", "no_time") + n("available", "no_time"),
        }
    }
}

pub fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_seconds(t).to_string()
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
    let upstreams = shared
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
        ready: listening && ready(shared),
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
        write_stall: write_stall(shared, &config),
        fleet: shared.fleet.as_ref().map(|f| {
            let m = &shared.metrics.fleet;
            FleetStatus {
                name: f.name.clone(),
                connected: f.connected(),
                leads: shared.stall.led(),
                budget: FleetBudgetCounts {
                    allowed: m.budget_count("allowed"),
                    denied: m.budget_count("denied"),
                    unanswered: m.budget_count("unanswered"),
                },
            }
        }),
        namespaces: namespaces(shared, &config.policy),
        events: super::history::events(shared),
        events_recorded_total: shared.metrics.recent.events.total(),
        history: super::history::history(shared),
    }
}

fn write_stall(shared: &AdminHandles, config: &crate::config::Config) -> WriteStallStatus {
    let now = Instant::now();
    let ago = |since: Option<Instant>| since.map(|s| now.saturating_duration_since(s).as_secs());
    let c = &config.stall;
    let mut watching = Vec::new();
    if c.passive {
        watching.push("passive");
    }
    if c.probe.is_some() {
        watching.push("probe");
    }
    if c.shards.is_some() {
        watching.push("composite");
    }
    let signals: Vec<SignalStatus> = shared
        .stall
        .signals()
        .into_iter()
        .map(|s| SignalStatus {
            signal: s.kind.as_str(),
            target: s.target.clone(),
            place: s.place.clone(),
            state: if s.raised { "raised" } else { "clear" },
            since: s.since_wall.map(rfc3339),
            since_seconds_ago: ago(s.since),
            headline: s.headline(),
            summary: s.summary.clone(),
            evidence: s.evidence.clone(),
        })
        .collect();
    let first = shared.stall.first_raised();
    let held_breakers = shared
        .breakers
        .snapshot()
        .into_iter()
        .filter(|b| b.held)
        .map(|b| b.ns)
        .collect();
    WriteStallStatus {
        state: match (&first, c.enabled()) {
            (Some(_), _) => "suspected",
            (None, true) => "clear",
            (None, false) => "off",
        },
        watching,
        action: c.on_write_stall.as_str(),
        since: first.as_ref().and_then(|s| s.since_wall).map(rfc3339),
        since_seconds_ago: first.as_ref().and_then(|s| ago(s.since)),
        headline: first.as_ref().and_then(|s| s.headline()),
        held_breakers,
        signals,
    }
}

fn namespaces(shared: &AdminHandles, table: &crate::policy::PolicyTable) -> Vec<NsStatus> {
    let now = Instant::now();
    let wall = SystemTime::now();
    let mut rows: Vec<NsStatus> = Vec::new();
    for snap in shared.breakers.snapshot() {
        let policy = snap
            .ns
            .split_once('.')
            .and_then(|(db, coll)| table.lookup(db, coll));
        let ago = now.saturating_duration_since(snap.since);
        let totals = shared.metrics.ns_totals(&snap.ns);
        let next_probe = (snap.next_probe()).map(|at| at.saturating_duration_since(now));
        rows.push(NsStatus {
            namespace: snap.ns.clone(),
            kind: "namespace",
            pattern: policy.map(|p| p.pattern.clone()),
            mode: policy.map_or("unlisted", |p| p.mode.as_str()),
            dry_run: policy.is_some_and(|p| p.dry_run),
            dry_run_status: super::dry_run::DryRunStatus::of(
                &shared.metrics,
                &snap.ns,
                policy.is_some_and(|p| p.dry_run),
                true,
            ),
            breaker: Some(snap.state.as_str()),
            action: if snap.held {
                "rewritten to readConcern available before sending; held open while writes are not completing (write-stall watch), then one cooldown and a probe".to_string()
            } else {
                action(policy.map(|p| &**p), snap.state, snap.reason.reply_code().1)
            },
            errors_in_window: Some(snap.errors_in_window),
            threshold: policy.map(|p| p.threshold),
            trigger_errors_total: Some(shared.metrics.trigger_errors_total(&snap.ns)),
            rewritten_total: Some(totals[1]),
            failed_fast_total: Some(totals[2]),
            last_transition: Some(rfc3339(wall - ago)),
            last_transition_seconds_ago: Some(ago.as_secs()),
            reason: Some(snap.last_reason.clone()),
            next_probe_seconds: next_probe.map(|d| d.as_secs() + u64::from(d.subsec_nanos() > 0)),
            answered_in_a_row: (snap.state == State::Open).then_some(snap.streak),
            held_by_write_stall: snap.held,
            ladder: policy.map_or_else(Vec::new, |p| p.ladder().to_vec()),
            ladder_reads: Some(LadderReads::of(&shared.metrics, &snap.ns)),
            orphans_estimated_total: Some(shared.metrics.ladder.orphans_of(&snap.ns)),
        });
    }
    for p in table.entries() {
        if rows.iter().any(|r| r.namespace == p.pattern) {
            continue;
        }
        let exact = !p.pattern.ends_with('*');
        let totals = exact.then(|| shared.metrics.ns_totals(&p.pattern));
        rows.push(NsStatus {
            namespace: p.pattern.clone(),
            kind: "pattern",
            pattern: Some(p.pattern.clone()),
            mode: p.mode.as_str(),
            dry_run: p.dry_run,
            dry_run_status: super::dry_run::DryRunStatus::of(
                &shared.metrics,
                &p.pattern,
                p.dry_run,
                exact,
            ),
            breaker: exact.then_some(State::Closed.as_str()),
            action: action(Some(p), State::Closed, ""),
            errors_in_window: exact.then_some(0),
            threshold: Some(p.threshold),
            trigger_errors_total: exact.then(|| shared.metrics.trigger_errors_total(&p.pattern)),
            rewritten_total: totals.map(|t| t[1]),
            failed_fast_total: totals.map(|t| t[2]),
            last_transition: None,
            last_transition_seconds_ago: None,
            reason: None,
            next_probe_seconds: None,
            answered_in_a_row: None,
            held_by_write_stall: false,
            ladder: p.ladder().to_vec(),
            ladder_reads: exact.then(|| LadderReads::of(&shared.metrics, &p.pattern)),
            orphans_estimated_total: exact.then(|| shared.metrics.ladder.orphans_of(&p.pattern)),
        });
    }
    rows.sort_by(|a, b| {
        rank(a.breaker)
            .cmp(&rank(b.breaker))
            .then_with(|| a.namespace.cmp(&b.namespace))
    });
    rows
}

fn rank(breaker: Option<&str>) -> u8 {
    match breaker {
        Some("open") => 0,
        Some(_) => 2,
        None => 3,
    }
}

/// What happens to eligible reads, in words.
fn action(policy: Option<&NsPolicy>, state: State, code_name: &str) -> String {
    let Some(p) = policy else {
        return "forwarded untouched (no longer governed by a pattern)".into();
    };
    let what = match (p.mode, state, p.primary_rung) {
        (Mode::Passthrough, _, _) => "forwarded untouched".to_string(),
        (Mode::Fallback, State::Closed, false) => {
            "forwarded; a trigger error is retried with readConcern available".into()
        }
        (Mode::Fallback, State::Closed, true) => {
            "forwarded; a trigger error is retried on the primary, then with readConcern available".into()
        }
        (Mode::Fallback, State::Open, false) => {
            "rewritten to readConcern available before sending".into()
        }
        (Mode::Fallback, State::Open, true) => {
            "sent to the primary; if it fails (or the ladder guard is full), rewritten to readConcern available".into()
        }
        (Mode::Strict, State::Closed, false) => "forwarded; trigger errors are counted".into(),
        (Mode::Strict, State::Closed, true) => {
            "forwarded; a trigger error is retried on the primary".into()
        }
        (Mode::Strict, State::Open, false) if p.on_open == crate::policy::OnOpen::Bound => format!(
            "sent with maxTimeMS at most {} ms: healthy secondaries answer, the others fail fast with {code_name}",
            p.open_time_limit.as_millis()
        ),
        (Mode::Strict, State::Open, false) => {
            format!("failing fast with {code_name}, nothing sent (one probe at a time)")
        }
        (Mode::Strict, State::Open, true) => format!(
            "sent to the primary (read concern untouched); failing fast with {code_name} when the ladder guard is full"
        ),
    };
    if p.dry_run && p.mode != Mode::Passthrough {
        format!("dry run (only logged and counted); would be: {what}")
    } else {
        what
    }
}

/// `d` as `1h 2m`, `3m 4s` or `5s`.
pub fn short_duration(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m {}s", s / 60, s % 60),
        _ => format!("{}h {}m", s / 3600, (s % 3600) / 60),
    }
}
