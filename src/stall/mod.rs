//! The write-progress watch: notices a primary that answers heartbeats but completes no
//! write (see `docs/background.md` §1), and optionally acts before secondary reads fail.
//!
//! ```text
//! signals (each per target, raised or clear, with its evidence)
//!   passive    writes relayed per upstream (session → WriteTracker → atomics), judged
//!              every TICK: writes waiting > stall_after, none completing
//!   probe      [stall_watch.probe]: an upsert per upstream (and probe id) every interval
//!   composite  [stall_watch.shards]: serverStatus of each shard primary, the article's rule
//! tick         every TICK: judge the passive signal, then act (on_write_stall)
//! ```
//!
//! Acting (`open_fallback_breakers`) holds the breakers of fallback namespaces open while any
//! signal is raised: exact fallback patterns and fallback namespaces that have a breaker at
//! once, the namespaces of wildcard patterns as they are first read (the session asks
//! [`StallWatch::holding`]). When every signal clears, the breakers are released into an
//! ordinary cooldown and come back through their half-open probe. Strict namespaces are
//! never touched.

mod composite;
mod passive;
mod probe;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use dashmap::DashMap;
use serde::Serialize;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::config::{Config, Mode, StallAction};
use crate::metrics::{SignalKind as SignalKindLabel, SignalLabel, UpstreamLabel, UpstreamResult};
use crate::server::Shared;

pub use composite::{Conditions, Rule, RuleState, ShardReading};
pub use passive::{
    is_write_command, stalled as passive_stalled, PassiveSample, SessionWrites, UpstreamWrites,
    WriteTracker,
};

/// How often the passive signal is judged and the action applied.
pub const TICK: Duration = Duration::from_millis(250);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Which signal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SignalKind {
    Passive,
    Probe,
    Composite,
}

impl SignalKind {
    pub fn as_str(self) -> &'static str {
        match self {
            SignalKind::Passive => "passive",
            SignalKind::Probe => "probe",
            SignalKind::Composite => "composite",
        }
    }
}

/// The numbers behind a signal; only the fields of its kind are set.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Evidence {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub writes_in_flight: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub oldest_write_seconds: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_completion_seconds_ago: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub writes_completed: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub writes_abandoned: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub probe_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub probe_latency_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub probe_error: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shard: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server_version: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tickets_available: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queued_writers: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub write_ops_per_second: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub baseline_ops_per_second: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub write_latency_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub conditions: Option<Conditions>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub conditions_held_seconds: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub poll_error: Option<String>,
}

/// One signal on one target.
#[derive(Debug, Clone)]
pub struct Signal {
    pub kind: SignalKind,
    /// Stable key: an upstream address, `upstream/probe id`, a shard URI's hosts.
    pub target: String,
    /// In words: `upstream 127.0.0.1:27017`, `shard A (shardA at host:port)`.
    pub place: String,
    pub raised: bool,
    /// While raised: since when writes have not been completing.
    pub since: Option<Instant>,
    pub since_wall: Option<SystemTime>,
    /// The evidence in one line.
    pub summary: String,
    pub evidence: Evidence,
}

impl Signal {
    /// `writes are not completing on <place> since <time>` while raised.
    pub fn headline(&self) -> Option<String> {
        let since = self.since_wall?;
        Some(format!(
            "writes are not completing {} {} since {}",
            if self.kind == SignalKind::Composite {
                "on"
            } else {
                "through"
            },
            self.place,
            humantime::format_rfc3339_seconds(since)
        ))
    }
}

/// A signal's new reading, from one of the three sources.
#[derive(Debug, Clone)]
pub struct Observation {
    pub raised: bool,
    /// Since when writes have not been completing (used when the signal rises).
    pub since: Instant,
    pub summary: String,
    pub evidence: Evidence,
}

/// The watch's shared state (in `Shared`).
#[derive(Debug)]
pub struct StallWatch {
    epoch: Instant,
    upstreams: DashMap<String, Arc<UpstreamWrites>>,
    signals: Mutex<BTreeMap<(SignalKind, String), Signal>>,
    /// Fallback breakers are being held open (sessions hold new ones as they are read).
    holding: AtomicBool,
}

impl Default for StallWatch {
    fn default() -> Self {
        StallWatch::new()
    }
}

impl StallWatch {
    pub fn new() -> StallWatch {
        StallWatch {
            epoch: Instant::now(),
            upstreams: DashMap::new(),
            signals: Mutex::new(BTreeMap::new()),
            holding: AtomicBool::new(false),
        }
    }

    /// The watch's clock: ms since its epoch, plus one (0 means "none" in the atomics).
    pub(crate) fn clock(&self, now: Instant) -> u64 {
        now.saturating_duration_since(self.epoch).as_millis() as u64 + 1
    }

    /// The tracker of one upstream (created on first use).
    pub fn upstream(&self, addr: &str) -> Arc<UpstreamWrites> {
        if let Some(u) = self.upstreams.get(addr) {
            return u.clone();
        }
        self.upstreams
            .entry(addr.to_string())
            .or_insert_with(|| Arc::new(UpstreamWrites::new(addr)))
            .clone()
    }

    /// True while the action holds fallback breakers open: a session holds the breaker of
    /// a fallback namespace it reads.
    pub fn holding(&self) -> bool {
        self.holding.load(Ordering::SeqCst)
    }

    /// Every signal, raised first, then by kind and target.
    pub fn signals(&self) -> Vec<Signal> {
        let mut v: Vec<Signal> = lock(&self.signals).values().cloned().collect();
        v.sort_by_key(|s| (!s.raised, s.kind, s.target.clone()));
        v
    }

    /// Any signal raised.
    pub fn suspected(&self) -> bool {
        lock(&self.signals).values().any(|s| s.raised)
    }

    /// The earliest raised signal.
    pub fn first_raised(&self) -> Option<Signal> {
        lock(&self.signals)
            .values()
            .filter(|s| s.raised)
            .min_by_key(|s| s.since)
            .cloned()
    }

    /// Records a reading; logs and counts a change of state.
    pub fn update(
        &self,
        shared_metrics: &crate::metrics::Metrics,
        kind: SignalKind,
        target: &str,
        place: &str,
        r: Observation,
    ) {
        let now = Instant::now();
        let mut signals = lock(&self.signals);
        let s = signals
            .entry((kind, target.to_string()))
            .or_insert_with(|| Signal {
                kind,
                target: target.to_string(),
                place: place.to_string(),
                raised: false,
                since: None,
                since_wall: None,
                summary: String::new(),
                evidence: Evidence::default(),
            });
        let was = s.raised;
        s.place = place.to_string();
        s.summary = r.summary;
        s.evidence = r.evidence;
        s.raised = r.raised;
        let m = &shared_metrics.stall;
        if r.raised && !was {
            let since = r.since.min(now);
            s.since = Some(since);
            s.since_wall = Some(SystemTime::now() - now.saturating_duration_since(since));
            m.raised
                .get_or_create(&SignalKindLabel {
                    signal: kind.as_str(),
                })
                .inc();
            let headline = s.headline().unwrap_or_default();
            tracing::warn!(signal = kind.as_str(), target = %place, evidence = %s.summary, "write stall suspected: {headline}");
        } else if !r.raised && was {
            s.since = None;
            s.since_wall = None;
            tracing::info!(signal = kind.as_str(), target = %place, evidence = %s.summary, "write stall signal cleared");
        }
        m.signal
            .get_or_create(&SignalLabel {
                signal: kind.as_str(),
                target: target.to_string(),
            })
            .set(i64::from(r.raised));
        let any = signals.values().any(|s| s.raised);
        m.suspected.set(i64::from(any));
    }

    /// Forgets the signals of one kind whose target `keep` rejects (config changed).
    pub fn retain(
        &self,
        metrics: &crate::metrics::Metrics,
        kind: SignalKind,
        keep: impl Fn(&str) -> bool,
    ) {
        let mut signals = lock(&self.signals);
        signals.retain(|(k, t), _| {
            let stay = *k != kind || keep(t);
            if !stay {
                metrics.stall.signal.remove(&SignalLabel {
                    signal: k.as_str(),
                    target: t.clone(),
                });
                tracing::info!(signal = k.as_str(), target = %t, "write stall signal no longer watched");
            }
            stay
        });
        metrics
            .stall
            .suspected
            .set(i64::from(signals.values().any(|s| s.raised)));
    }
}

/// Starts the watch: the tick (passive signal, action), the probe and the serverStatus
/// poller. Each follows config reloads and ends with `stop`.
pub fn start(shared: Arc<Shared>, stop: CancellationToken) {
    tokio::spawn(probe::run(shared.clone(), stop.clone()));
    tokio::spawn(composite::run(shared.clone(), stop.clone()));
    tokio::spawn(tick(shared, stop));
}

async fn tick(shared: Arc<Shared>, stop: CancellationToken) {
    let mut every = tokio::time::interval(TICK);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = every.tick() => {}
        }
        let config = shared.config.load_full();
        judge_passive(&shared, &config, Instant::now());
        act(&shared, &config, Instant::now());
    }
}

/// The passive signal of every upstream, judged now.
fn judge_passive(shared: &Shared, config: &Config, now: Instant) {
    let watch = &shared.stall;
    let m = &shared.metrics.stall;
    if !config.stall.passive {
        watch.retain(&shared.metrics, SignalKind::Passive, |_| false);
        return;
    }
    watch.upstreams.retain(|addr, _| {
        let keep = config.upstreams.contains(addr);
        if !keep {
            let label = UpstreamLabel {
                upstream: addr.clone(),
            };
            m.writes_in_flight.remove(&label);
            m.oldest_write.remove(&label);
        }
        keep
    });
    watch.retain(&shared.metrics, SignalKind::Passive, |t| {
        config.upstreams.iter().any(|u| u == t)
    });
    for addr in &config.upstreams {
        let up = watch.upstream(addr);
        let s = up.sample(watch.clock(now));
        export_passive(shared, addr, &up, &s);
        let mut eval = lock(&up.eval);
        let stalled = passive_stalled(&s, config.stall.stall_after, config.stall.min_in_flight);
        let raised = if eval.raised {
            // Only a completed write clears it: clients giving up is not progress.
            s.completed == eval.completed_at_raise
        } else {
            stalled
        };
        if raised && !eval.raised {
            eval.completed_at_raise = s.completed;
        }
        eval.raised = raised;
        drop(eval);
        let since = passive_since(watch, &s, now);
        watch.update(
            &shared.metrics,
            SignalKind::Passive,
            addr,
            &format!("upstream {addr}"),
            Observation {
                raised,
                since,
                summary: passive_summary(&s, config.stall.stall_after),
                evidence: Evidence {
                    writes_in_flight: Some(s.in_flight),
                    oldest_write_seconds: s.oldest_age.map(|d| d.as_secs_f64()),
                    last_completion_seconds_ago: s.since_completion.map(|d| d.as_secs_f64()),
                    writes_completed: Some(s.completed),
                    writes_abandoned: Some(s.abandoned),
                    ..Evidence::default()
                },
            },
        );
    }
}

/// When writes stopped completing: the last completion, or the oldest waiting write if it
/// came later.
fn passive_since(watch: &StallWatch, s: &PassiveSample, now: Instant) -> Instant {
    let last = s.since_completion.map(|d| now - d.min(now - watch.epoch));
    let oldest = s.oldest_age.map(|d| now - d.min(now - watch.epoch));
    match (last, oldest) {
        (Some(a), Some(b)) => a.max(b),
        (a, b) => a.or(b).unwrap_or(now),
    }
}

fn passive_summary(s: &PassiveSample, stall_after: Duration) -> String {
    let waiting = match (s.in_flight, s.oldest_age) {
        (0, _) => "no write waiting".to_string(),
        (n, Some(a)) => format!(
            "{n} write{} waiting, the oldest for {:.1} s",
            if n == 1 { "" } else { "s" },
            a.as_secs_f64()
        ),
        (n, None) => format!("{n} writes waiting"),
    };
    let done = match s.since_completion {
        None => "none completed yet".to_string(),
        Some(d) if d >= stall_after => format!("none completed for {:.1} s", d.as_secs_f64()),
        Some(d) => format!("last completed {:.1} s ago", d.as_secs_f64()),
    };
    let left = if s.abandoned > 0 {
        format!("; {} abandoned by clients that gave up", s.abandoned)
    } else {
        String::new()
    };
    format!("{waiting}; {done}{left}")
}

fn export_passive(shared: &Shared, addr: &str, up: &UpstreamWrites, s: &PassiveSample) {
    let m = &shared.metrics.stall;
    let label = UpstreamLabel {
        upstream: addr.to_string(),
    };
    m.writes_in_flight
        .get_or_create(&label)
        .set(i64::from(s.in_flight));
    m.oldest_write
        .get_or_create(&label)
        .set(s.oldest_age.map_or(0.0, |d| d.as_secs_f64()));
    let mut eval = lock(&up.eval);
    for (i, (result, now)) in [
        ("completed", s.completed),
        ("failed", s.failed),
        ("abandoned", s.abandoned),
    ]
    .into_iter()
    .enumerate()
    {
        let delta = now.saturating_sub(eval.exported[i]);
        if delta > 0 || eval.exported[i] == 0 {
            m.write_replies
                .get_or_create(&UpstreamResult {
                    upstream: addr.to_string(),
                    result,
                })
                .inc_by(delta);
        }
        eval.exported[i] = now;
    }
}

/// `on_write_stall`: holds fallback breakers open while any signal is raised; releases
/// them into an ordinary cooldown when every signal has cleared.
fn act(shared: &Shared, config: &Config, now: Instant) {
    let watch = &shared.stall;
    let raised = watch.first_raised();
    let acting = config.stall.on_write_stall == StallAction::OpenFallbackBreakers;
    match raised {
        Some(signal) if acting => {
            let why = signal
                .headline()
                .unwrap_or_else(|| "write stall suspected".to_string());
            let why = format!("write stall suspected: {why}");
            for p in config.policy.entries() {
                if p.mode == Mode::Fallback && !p.pattern.ends_with('*') {
                    hold(shared, &p.pattern, &why, now);
                }
            }
            for b in shared.breakers.snapshot() {
                let fallback =
                    b.ns.split_once('.')
                        .and_then(|(db, coll)| config.policy.lookup(db, coll))
                        .is_some_and(|p| p.mode == Mode::Fallback);
                if fallback && !b.held {
                    hold(shared, &b.ns, &why, now);
                }
            }
            if !watch.holding.swap(true, Ordering::SeqCst) {
                tracing::warn!(
                    action = "open_fallback_breakers",
                    "write stall: holding the breakers of fallback namespaces open"
                );
            }
        }
        _ => {
            if watch.holding.swap(false, Ordering::SeqCst) {
                release(shared, now);
            }
        }
    }
}

fn release(shared: &Shared, now: Instant) {
    let released = shared.breakers.release_held(now);
    if !released.is_empty() {
        tracing::info!(namespaces = ?released, "write stall over (or action off): breakers released; each probes after its cooldown");
    }
}

fn hold(shared: &Shared, ns: &str, why: &str, now: Instant) {
    if let Some(t) = shared.breakers.hold_open(ns, why, now) {
        shared.metrics.breaker_state(ns, t.to.gauge());
        tracing::warn!(ns = %ns, from = t.from.as_str(), to = t.to.as_str(), reason = %t.reason, "breaker transition");
    }
}

/// A session reads a fallback namespace while the action holds breakers: hold this one
/// too (a `db.*` pattern has no exact namespace until it is read).
pub fn hold_on_read(shared: &Shared, ns: &str, now: Instant) {
    if shared.breakers.is_held(ns) {
        return;
    }
    let why = shared
        .stall
        .first_raised()
        .and_then(|s| s.headline())
        .map_or_else(
            || "write stall suspected".to_string(),
            |h| format!("write stall suspected: {h}"),
        );
    hold(shared, ns, &why, now);
    // The stall may have cleared meanwhile; the tick released before this hold landed.
    if !shared.stall.holding.load(Ordering::SeqCst) {
        release(shared, now);
    }
}
