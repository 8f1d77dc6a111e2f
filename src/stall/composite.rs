//! The composite rule from each shard primary's `serverStatus` (`[stall_watch.shards]`), as
//! the article writes it: write tickets available <= `tickets_available_max`, more writers
//! queued than `queued_writers_min`, and the write-op rate (opcounters insert+update+delete per second)
//! below `rate_ratio` of its baseline, all for `for`. From 7.0 tickets are dynamic, so the
//! ticket condition is left out there. The baseline is a moving average of the rate over
//! polls without queueing (an approximation of the article's "same hour last week").
//!
//! [`RuleState::step`] is the rule, pure; the rest polls and reports.

use std::time::Duration;

use bson::{doc, Bson, Document};
use mongodb::options::{ClientOptions, Credential};
use mongodb::Client;
use serde::Serialize;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{Ctx, Evidence, Observation, SignalKind};
use crate::config::ShardsConfig;
use crate::metrics::ShardLabel;

const IDLE: Duration = Duration::from_secs(1);

/// The thresholds, from the config.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rule {
    pub tickets_available_max: i64,
    pub queued_writers_min: i64,
    pub rate_ratio: f64,
    pub hold_for: Duration,
    /// Time constant of the baseline's moving average.
    pub baseline: Duration,
}

impl Rule {
    pub fn of(c: &ShardsConfig) -> Rule {
        Rule {
            tickets_available_max: c.tickets_available_max,
            queued_writers_min: c.queued_writers_min,
            rate_ratio: c.rate_ratio,
            hold_for: c.hold_for,
            baseline: c.baseline,
        }
    }
}

/// What one poll read.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ShardReading {
    pub tickets_available: Option<i64>,
    pub queued_writers: i64,
    /// Write ops per second since the previous poll; none on the first poll.
    pub rate: Option<f64>,
    /// 7.0 or later: tickets are dynamic and not part of the rule.
    pub version_7_plus: bool,
}

/// Which conditions hold. `tickets_low` is none when it does not apply (7.0+, or the field
/// is missing); `rate_low` is false until there is a baseline to compare with.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Conditions {
    pub tickets_low: Option<bool>,
    pub writers_queued: bool,
    pub rate_low: bool,
}

impl Conditions {
    pub fn all(&self) -> bool {
        self.tickets_low.unwrap_or(true) && self.writers_queued && self.rate_low
    }
}

/// The rule's memory of one shard.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RuleState {
    pub baseline: Option<f64>,
    /// Since when every condition has held.
    pub holding_since: Option<Instant>,
    pub raised: bool,
}

impl RuleState {
    /// Judges one poll taken `dt` after the previous one.
    pub fn step(
        &mut self,
        rule: &Rule,
        r: &ShardReading,
        dt: Duration,
        now: Instant,
    ) -> Conditions {
        let tickets_low = if r.version_7_plus {
            None
        } else {
            r.tickets_available.map(|t| t <= rule.tickets_available_max)
        };
        let writers_queued = r.queued_writers > rule.queued_writers_min;
        let rate_low = match (r.rate, self.baseline) {
            (Some(rate), Some(base)) => base > 0.0 && rate < rule.rate_ratio * base,
            _ => false,
        };
        let c = Conditions {
            tickets_low,
            writers_queued,
            rate_low,
        };
        if c.all() {
            let since = *self.holding_since.get_or_insert(now);
            self.raised = now.saturating_duration_since(since) >= rule.hold_for;
        } else {
            self.holding_since = None;
            self.raised = false;
        }
        // Healthy polls (nothing queued, tickets free) feed the baseline.
        if let (Some(rate), false, false) = (r.rate, writers_queued, tickets_low == Some(true)) {
            let alpha = (dt.as_secs_f64() / rule.baseline.as_secs_f64().max(1e-9)).min(1.0);
            self.baseline = Some(match self.baseline {
                None => rate,
                Some(b) => b + alpha * (rate - b),
            });
        }
        c
    }
}

/// The counters two polls are compared on.
#[derive(Debug, Clone, Copy)]
struct Counters {
    at: Instant,
    write_ops: i64,
    latency_micros: i64,
    latency_ops: i64,
}

/// One shard primary being polled.
struct Poller {
    /// The URI's hosts (no credentials: URIs with credentials are refused).
    hosts: String,
    client: Option<Client>,
    set_name: Option<String>,
    last: Option<Counters>,
    state: RuleState,
}

pub async fn run(shared: Ctx, stop: CancellationToken) {
    let mut built: Option<ShardsConfig> = None;
    let mut pollers: Vec<Poller> = Vec::new();
    loop {
        let config = shared.config.load_full();
        let Some(shards) = config.stall.shards.clone() else {
            if built.take().is_some() {
                pollers.clear();
                shared
                    .stall
                    .retain(&shared.metrics, SignalKind::Composite, |_| false);
            }
            if sleep_or_stop(&stop, IDLE).await {
                return;
            }
            continue;
        };
        if built.as_ref() != Some(&shards) {
            pollers = build(&shards).await;
            let keys: Vec<String> = pollers.iter().map(|p| p.hosts.clone()).collect();
            shared
                .stall
                .retain(&shared.metrics, SignalKind::Composite, |t| {
                    keys.iter().any(|k| k == t)
                });
            built = Some(shards.clone());
        }
        let rule = Rule::of(&shards);
        // With `[fleet]`, a shard another instance leads is polled there (its signal comes
        // through Redis).
        let polls = pollers
            .iter_mut()
            .filter(|p| shared.stall.leads(&format!("shard:{}", p.hosts)))
            .map(|p| p.poll(&shared, &shards, rule));
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = futures::future::join_all(polls) => {}
        }
        if sleep_or_stop(&stop, shards.poll).await {
            return;
        }
    }
}

async fn sleep_or_stop(stop: &CancellationToken, d: Duration) -> bool {
    tokio::select! {
        _ = stop.cancelled() => true,
        _ = tokio::time::sleep(d) => false,
    }
}

/// The signal's target for a shard URI: its hosts.
pub fn shard_target(uri: &str) -> String {
    uri.trim_start_matches("mongodb://")
        .split(['/', '?'])
        .next()
        .unwrap_or("")
        .to_string()
}

async fn build(c: &ShardsConfig) -> Vec<Poller> {
    let mut out = Vec::new();
    for uri in &c.uris {
        let hosts = shard_target(uri);
        let client = match client(c, uri).await {
            Ok(cl) => Some(cl),
            Err(e) => {
                tracing::error!(shard = %hosts, error = %e, "write-stall watch: cannot set up a driver client for serverStatus");
                None
            }
        };
        out.push(Poller {
            hosts,
            client,
            set_name: None,
            last: None,
            state: RuleState::default(),
        });
    }
    out
}

async fn client(c: &ShardsConfig, uri: &str) -> Result<Client, mongodb::error::Error> {
    let mut o = ClientOptions::parse(uri).await?;
    o.app_name = Some("staleguard-stall-watch".to_string());
    if o.server_selection_timeout.is_none() {
        o.server_selection_timeout = Some(c.poll.min(Duration::from_secs(10)));
    }
    o.max_pool_size = Some(2);
    if let Some(cr) = &c.credentials {
        o.credential = Some(
            Credential::builder()
                .username(cr.username.clone())
                .password(cr.password.expose().to_string())
                .source(cr.auth_source.clone())
                .build(),
        );
    }
    Client::with_options(o)
}

/// A number at a dotted path (int32, int64 or double).
fn number(d: &Document, path: &str) -> Option<f64> {
    let mut cur = d;
    let mut parts = path.split('.').peekable();
    while let Some(p) = parts.next() {
        let v = cur.get(p)?;
        if parts.peek().is_none() {
            return match v {
                Bson::Int32(n) => Some(f64::from(*n)),
                Bson::Int64(n) => Some(*n as f64),
                Bson::Double(n) => Some(*n),
                _ => None,
            };
        }
        cur = v.as_document()?;
    }
    None
}

fn int(d: &Document, path: &str) -> Option<i64> {
    number(d, path).map(|n| n as i64)
}

/// `shardA` → `shard A`, `shard-01` → `shard 01`, anything else → `shard <name>`.
pub fn shard_label(set_name: &str) -> String {
    let rest = set_name
        .strip_prefix("shard")
        .or_else(|| set_name.strip_prefix("Shard"))
        .map(|r| r.trim_start_matches(['-', '_', ' ']))
        .filter(|r| !r.is_empty());
    match rest {
        Some(r) => format!("shard {r}"),
        None => format!("shard {set_name}"),
    }
}

fn major_version(v: &str) -> Option<u32> {
    v.split('.').next()?.parse().ok()
}

impl Poller {
    fn place(&self) -> String {
        match &self.set_name {
            Some(n) => format!("{} ({n} at {})", shard_label(n), self.hosts),
            None => format!("shard primary {}", self.hosts),
        }
    }

    async fn poll(&mut self, shared: &Ctx, c: &ShardsConfig, rule: Rule) {
        let Some(client) = &self.client else { return };
        let admin = client.database("admin");
        let asked = admin.run_command(doc! { "serverStatus": 1 });
        let limit = c.poll.max(Duration::from_millis(100));
        let status = match tokio::time::timeout(limit, asked).await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => return self.poll_failed(shared, e.to_string()),
            Err(_) => {
                return self.poll_failed(shared, "serverStatus did not answer in time".into())
            }
        };
        let now = Instant::now();
        if let Ok(name) = status
            .get_document("repl")
            .and_then(|r| r.get_str("setName"))
        {
            self.set_name = Some(name.to_string());
        }
        let version = status.get_str("version").unwrap_or("").to_string();
        let v7 = c
            .server_version_7_plus
            .unwrap_or_else(|| major_version(&version).is_some_and(|v| v >= 7));
        let (rate, latency_ms, dt) = self.rates(&status, now);
        let reading = ShardReading {
            tickets_available: int(&status, "wiredTiger.concurrentTransactions.write.available"),
            queued_writers: int(&status, "globalLock.currentQueue.writers").unwrap_or(0),
            rate,
            version_7_plus: v7,
        };
        let cond = self.state.step(&rule, &reading, dt, now);
        self.export(shared, &reading, latency_ms);
        let held = self
            .state
            .holding_since
            .map(|s| now.saturating_duration_since(s));
        let summary = summary(
            &reading,
            &cond,
            self.state.baseline,
            latency_ms,
            held,
            &rule,
        );
        let evidence = Evidence {
            shard: self.set_name.clone(),
            server_version: Some(version),
            tickets_available: reading.tickets_available,
            queued_writers: Some(reading.queued_writers),
            write_ops_per_second: rate,
            baseline_ops_per_second: self.state.baseline,
            write_latency_ms: latency_ms,
            conditions: Some(cond),
            conditions_held_seconds: held.map(|d| d.as_secs_f64()),
            ..Evidence::default()
        };
        shared.stall.update(
            &shared.metrics,
            SignalKind::Composite,
            &self.hosts,
            &self.place(),
            Observation {
                raised: self.state.raised,
                since: self.state.holding_since.unwrap_or(now),
                summary,
                evidence,
            },
        );
    }

    /// Write ops per second and ms per write since the last poll, and the time between.
    fn rates(&mut self, status: &Document, now: Instant) -> (Option<f64>, Option<f64>, Duration) {
        let counters = Counters {
            at: now,
            write_ops: ["insert", "update", "delete"]
                .iter()
                .filter_map(|k| int(status, &format!("opcounters.{k}")))
                .sum(),
            latency_micros: int(status, "opLatencies.writes.latency").unwrap_or(0),
            latency_ops: int(status, "opLatencies.writes.ops").unwrap_or(0),
        };
        let last = self.last.replace(counters);
        match last {
            // Counters that went back mean a restart: start comparing afresh.
            Some(l) if counters.write_ops >= l.write_ops && now > l.at => {
                let dt = now - l.at;
                let rate = (counters.write_ops - l.write_ops) as f64 / dt.as_secs_f64();
                let ops = counters.latency_ops - l.latency_ops;
                let lat = (ops > 0).then(|| {
                    (counters.latency_micros - l.latency_micros) as f64 / ops as f64 / 1000.0
                });
                (Some(rate), lat, dt)
            }
            _ => (None, None, Duration::ZERO),
        }
    }

    /// Every input of the rule, and its state, as metrics.
    fn export(&self, shared: &Ctx, reading: &ShardReading, latency_ms: Option<f64>) {
        let m = &shared.metrics.stall;
        let label = ShardLabel {
            shard: self.set_name.clone().unwrap_or_else(|| self.hosts.clone()),
        };
        if let Some(t) = reading.tickets_available {
            m.tickets_available.get_or_create(&label).set(t);
        }
        m.queued_writers
            .get_or_create(&label)
            .set(reading.queued_writers);
        if let Some(r) = reading.rate {
            m.write_rate.get_or_create(&label).set(r);
        }
        if let Some(b) = self.state.baseline {
            m.write_baseline.get_or_create(&label).set(b);
        }
        if let Some(l) = latency_ms {
            m.write_latency.get_or_create(&label).set(l / 1000.0);
        }
        m.composite
            .get_or_create(&label)
            .set(i64::from(self.state.raised));
    }

    /// A failed poll changes no condition; it is counted and shown.
    fn poll_failed(&mut self, shared: &Ctx, error: String) {
        let label = ShardLabel {
            shard: self.set_name.clone().unwrap_or_else(|| self.hosts.clone()),
        };
        shared.metrics.stall.poll_errors.get_or_create(&label).inc();
        tracing::warn!(shard = %self.hosts, error = %error, "write-stall watch: serverStatus poll failed");
        let raised = self.state.raised;
        shared.stall.update(
            &shared.metrics,
            SignalKind::Composite,
            &self.hosts,
            &self.place(),
            Observation {
                raised,
                since: self.state.holding_since.unwrap_or_else(Instant::now),
                summary: format!("serverStatus poll failed: {error}"),
                evidence: Evidence {
                    shard: self.set_name.clone(),
                    poll_error: Some(error),
                    ..Evidence::default()
                },
            },
        );
    }
}

fn summary(
    r: &ShardReading,
    c: &Conditions,
    baseline: Option<f64>,
    latency_ms: Option<f64>,
    held: Option<Duration>,
    rule: &Rule,
) -> String {
    let tickets = match (r.version_7_plus, r.tickets_available) {
        (true, _) => "write tickets not used (7.0+: dynamic)".to_string(),
        (false, Some(t)) => format!("{t} write tickets available"),
        (false, None) => "write tickets not reported".to_string(),
    };
    let rate = match (r.rate, baseline) {
        (Some(x), Some(b)) => format!("{x:.1} writes/s (baseline {b:.1}/s)"),
        (Some(x), None) => format!("{x:.1} writes/s (no baseline yet)"),
        (None, _) => "write rate from the next poll".to_string(),
    };
    let latency = match latency_ms {
        Some(l) => format!("write latency {l:.1} ms"),
        None => "no write completed since the last poll".to_string(),
    };
    let held = match held {
        Some(h) if c.all() => format!(
            "; all conditions for {:.1} s of {:.1} s",
            h.as_secs_f64(),
            rule.hold_for.as_secs_f64()
        ),
        _ => String::new(),
    };
    format!(
        "{tickets}, {} writers queued, {rate}, {latency}{held}",
        r.queued_writers
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule() -> Rule {
        Rule {
            tickets_available_max: 2,
            queued_writers_min: 10,
            rate_ratio: 0.1,
            hold_for: Duration::from_secs(120),
            baseline: Duration::from_secs(60),
        }
    }

    fn reading(tickets: i64, queued: i64, rate: f64) -> ShardReading {
        ShardReading {
            tickets_available: Some(tickets),
            queued_writers: queued,
            rate: Some(rate),
            version_7_plus: false,
        }
    }

    #[test]
    fn raises_only_when_every_condition_holds_for_the_window() {
        let r = rule();
        let mut s = RuleState::default();
        let t0 = Instant::now();
        let dt = Duration::from_secs(10);
        // Healthy traffic builds the baseline.
        for i in 0..6 {
            let c = s.step(&r, &reading(120, 0, 500.0), dt, t0 + dt * i);
            assert!(!c.all());
        }
        assert_eq!(s.baseline, Some(500.0));
        // Stalled: no tickets, a queue, nothing completing ...
        let stall = t0 + Duration::from_secs(100);
        let c = s.step(&r, &reading(0, 40, 0.0), dt, stall);
        assert!(c.all() && !s.raised, "not for long enough yet");
        s.step(
            &r,
            &reading(0, 45, 0.0),
            dt,
            stall + Duration::from_secs(119),
        );
        assert!(!s.raised);
        s.step(
            &r,
            &reading(0, 50, 0.0),
            dt,
            stall + Duration::from_secs(120),
        );
        assert!(s.raised);
        // ... and the baseline did not learn the stall.
        assert_eq!(s.baseline, Some(500.0));
        // The queue drains: clear at once.
        s.step(
            &r,
            &reading(128, 0, 900.0),
            dt,
            stall + Duration::from_secs(130),
        );
        assert!(!s.raised && s.holding_since.is_none());
    }

    #[test]
    fn single_signals_and_idle_never_raise() {
        let r = rule();
        let t0 = Instant::now();
        let dt = Duration::from_secs(10);
        let cases = [
            // Low night traffic: tickets free, nothing queued, rate near zero.
            reading(128, 0, 0.0),
            // A burst: queue, but writes complete at the usual rate.
            reading(0, 50, 480.0),
            // Tickets busy, no queue.
            reading(1, 3, 10.0),
        ];
        for case in cases {
            let mut s = RuleState {
                baseline: Some(500.0),
                ..RuleState::default()
            };
            for i in 0..30 {
                s.step(&r, &case, dt, t0 + dt * i);
                assert!(!s.raised, "{case:?}");
            }
        }
        // No baseline at all (no healthy traffic seen): the rate condition cannot hold.
        let mut s = RuleState::default();
        for i in 0..30 {
            s.step(&r, &reading(0, 50, 0.0), dt, t0 + dt * i);
            assert!(!s.raised);
        }
    }

    #[test]
    fn from_7_0_the_ticket_condition_is_left_out() {
        let r = Rule {
            hold_for: Duration::from_secs(10),
            ..rule()
        };
        let mut s = RuleState {
            baseline: Some(100.0),
            ..RuleState::default()
        };
        let t0 = Instant::now();
        let seven = ShardReading {
            tickets_available: Some(100),
            version_7_plus: true,
            ..reading(100, 30, 0.0)
        };
        let dt = Duration::from_secs(5);
        for i in 0..3 {
            let c = s.step(&r, &seven, dt, t0 + dt * i);
            assert_eq!(c.tickets_low, None);
        }
        assert!(s.raised);
    }

    #[test]
    fn labels_and_numbers() {
        assert_eq!(shard_label("shardA"), "shard A");
        assert_eq!(shard_label("shard-01"), "shard 01");
        assert_eq!(shard_label("rs0"), "shard rs0");
        assert_eq!(shard_label("shard"), "shard shard");
        let d = doc! { "a": { "b": 3_i64, "c": 2.5, "d": "x" } };
        assert_eq!(number(&d, "a.b"), Some(3.0));
        assert_eq!(number(&d, "a.c"), Some(2.5));
        assert_eq!(number(&d, "a.d"), None);
        assert_eq!(number(&d, "a.e"), None);
        assert_eq!(major_version("7.0.2"), Some(7));
        assert_eq!(major_version("4.4.0-staleguard-sim"), Some(4));
    }
}
