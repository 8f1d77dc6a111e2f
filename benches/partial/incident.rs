//! The partial incident, as users live it: shard A's primary stalls (it answers heartbeats,
//! finishes no write) and only one of its two secondaries (a1) restarts, so about half the
//! secondary reads of shard A meet a node that cannot refresh its routing table while the
//! other half meet a healthy one. Paced readers (each its own driver client, so its own
//! connections) read `pay.transactions` (strict) and `demo.store_inventory` (fallback),
//! straight to the simulated mongos and through a staleguard with the shipped defaults,
//! side by side. Then the primary resumes (no write goes through staleguard, no write probe
//! is configured), and the time until both namespaces are back to unmodified, answered
//! reads is measured.
//!
//! Shared by `cargo bench --bench partial` (the figures, judged against issue 20's targets)
//! and `tests/partial.rs` (a shorter run with looser bounds).

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mongodb::bson::{doc, Document};
use mongodb::options::{ClientOptions, FindOneOptions, ReadPreference, SelectionCriteria};
use mongodb::Client;
use staleguard::breaker::State;
use staleguard::config::Config;
use staleguard::server::Running;
use staleguard::sim::{self, SimConfig, SimHandle};
use tokio::time::Instant;

pub const PAYMENTS: &str = "pay.transactions";
pub const INVENTORY: &str = "demo.store_inventory";

/// How a run is paced.
#[derive(Debug, Clone)]
pub struct Options {
    pub healthy: Duration,
    pub partial: Duration,
    /// How long after the heal reads are still watched (recovery is measured inside it).
    pub after: Duration,
    /// Readers per namespace and path.
    pub readers: usize,
    /// Reads per second per reader.
    pub rate: u32,
    /// The payment service's `maxTimeMS`.
    pub max_time: Duration,
    /// The simulated secondary refresh limit (30 s in 4.2).
    pub refresh_timeout: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            healthy: Duration::from_secs(3),
            partial: Duration::from_secs(30),
            after: Duration::from_secs(8),
            readers: 4,
            rate: 10,
            max_time: Duration::from_secs(1),
            refresh_timeout: Duration::from_secs(30),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Via {
    Direct,
    Staleguard,
}

/// One read as a reader saw it.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub ns: &'static str,
    pub via: Via,
    /// Sent, since the run started.
    pub at: Duration,
    pub ms: f64,
    pub ok: bool,
    pub error: Option<String>,
}

/// Figures of one namespace and path over a time range.
#[derive(Debug, Default, Clone)]
pub struct Figures {
    pub reads: usize,
    pub answered: usize,
    pub per_second: f64,
    pub failure_p50_ms: f64,
    /// The slowest read, answered or not (against the readers' `maxTimeMS`).
    pub slowest_ms: f64,
    pub errors: Vec<(String, usize)>,
}

impl Figures {
    pub fn share(&self) -> f64 {
        if self.reads == 0 {
            0.0
        } else {
            self.answered as f64 / self.reads as f64
        }
    }
}

/// What a run measured.
#[derive(Debug, Default)]
pub struct Report {
    pub outcomes: Vec<Outcome>,
    /// When the incident started and when the primary resumed, since the run started.
    pub incident_at: Duration,
    pub heal_at: Duration,
    /// Breaker transitions of each namespace during the incident, and in all.
    pub transitions_in_incident: Vec<(&'static str, u64)>,
    /// When each namespace's breaker first opened, since the incident started.
    pub opened_after: Vec<(&'static str, Option<Duration>)>,
    /// Since the heal: until every breaker closed (and stayed closed).
    pub recovery: Option<Duration>,
    /// Reads rewritten to `available` (retries included) from `max_time` after the
    /// recovery to the end: reads sent after it (stragglers sent before it may still be
    /// retried within their `maxTimeMS`).
    pub rewrites_after_recovery: u64,
}

impl Report {
    /// Figures of `ns` via `via` for reads sent within `[from, to)`.
    pub fn figures(&self, ns: &str, via: Via, from: Duration, to: Duration) -> Figures {
        let picked: Vec<&Outcome> = self
            .outcomes
            .iter()
            .filter(|o| o.ns == ns && o.via == via && o.at >= from && o.at < to)
            .collect();
        let answered = picked.iter().filter(|o| o.ok).count();
        let mut failed: Vec<f64> = picked.iter().filter(|o| !o.ok).map(|o| o.ms).collect();
        failed.sort_by(|a, b| a.total_cmp(b));
        let mut errors: std::collections::BTreeMap<String, usize> = Default::default();
        for o in &picked {
            if let Some(e) = &o.error {
                *errors.entry(e.clone()).or_default() += 1;
            }
        }
        let secs = (to - from).as_secs_f64().max(1e-9);
        Figures {
            reads: picked.len(),
            answered,
            per_second: answered as f64 / secs,
            failure_p50_ms: failed.get(failed.len() / 2).copied().unwrap_or(0.0),
            slowest_ms: picked.iter().map(|o| o.ms).fold(0.0, f64::max),
            errors: errors.into_iter().collect(),
        }
    }
}

/// The shipped config's policies (`config/staleguard.toml`: defaults everywhere), in front of
/// `upstream`.
fn proxy_config(upstream: &str) -> String {
    format!(
        r#"listen = "127.0.0.1:0"
upstreams = ["{upstream}"]
health_interval = "off"
shutdown_timeout = "0s"

[admin]
enabled = false

[[namespaces]]
pattern = "demo.store_inventory"
mode = "fallback"

[[namespaces]]
pattern = "pay.*"
mode = "strict"
"#
    )
}

async fn client(addr: &str) -> Client {
    let mut o = ClientOptions::parse(format!("mongodb://{addr}/?directConnection=true"))
        .await
        .expect("client options");
    o.selection_criteria = Some(SelectionCriteria::ReadPreference(
        ReadPreference::SecondaryPreferred {
            options: Default::default(),
        },
    ));
    o.server_selection_timeout = Some(Duration::from_secs(5));
    o.connect_timeout = Some(Duration::from_secs(5));
    Client::with_options(o).expect("client")
}

fn short_error(e: &mongodb::error::Error) -> String {
    match e.kind.as_ref() {
        mongodb::error::ErrorKind::Command(c) if c.message.starts_with("staleguard:") => {
            format!("staleguard {}", c.code)
        }
        mongodb::error::ErrorKind::Command(c) => c.code.to_string(),
        _ => "network/other".to_string(),
    }
}

/// One paced reader: what it reads, through which path, how fast, and when.
#[derive(Debug, Clone, Copy)]
struct Reader {
    ns: &'static str,
    via: Via,
    rate: u32,
    max_time: Duration,
    start: Instant,
    stop: Instant,
}

/// Reads `ns` at `rate` per second until `stop`, recording each outcome.
async fn reader(c: Client, r: Reader, out: Arc<Mutex<Vec<Outcome>>>) {
    let Reader {
        ns,
        via,
        rate,
        max_time,
        start,
        stop,
    } = r;
    let (db, coll) = ns.split_once('.').expect("db.coll");
    let coll = c.database(db).collection::<Document>(coll);
    let every = Duration::from_secs(1) / rate.max(1);
    let mut next = Instant::now();
    while Instant::now() < stop {
        tokio::time::sleep_until(next).await;
        next += every;
        // A reader that fell behind its pace does not make up for it in a burst.
        let now = Instant::now();
        if next < now {
            next = now;
        }
        let opts = FindOneOptions::builder().max_time(max_time).build();
        let sent = Instant::now();
        let r = tokio::time::timeout(max_time * 5, coll.find_one(doc! {}).with_options(opts)).await;
        let ms = sent.elapsed().as_secs_f64() * 1000.0;
        let (ok, error) = match r {
            Ok(Ok(_)) => (true, None),
            Ok(Err(e)) => (false, Some(short_error(&e))),
            Err(_) => (false, Some("client timeout".to_string())),
        };
        let o = Outcome {
            ns,
            via,
            at: sent.duration_since(start),
            ms,
            ok,
            error,
        };
        out.lock().expect("outcomes").push(o);
    }
}

fn transitions(proxy: &Running, ns: &str) -> u64 {
    let text = proxy.shared().metrics.render();
    let prefix = format!("staleguard_breaker_transitions_total{{namespace=\"{ns}\",");
    text.lines()
        .filter(|l| l.starts_with(&prefix))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

fn rewrites(proxy: &Running) -> u64 {
    let text = proxy.shared().metrics.render();
    text.lines()
        .filter(|l| l.starts_with("staleguard_rewrites_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

/// Runs the incident once.
pub async fn run(opts: &Options) -> Report {
    let sim: SimHandle = sim::start(SimConfig {
        listen: "127.0.0.1:0".into(),
        refresh_timeout: opts.refresh_timeout,
        seed: 7,
        ..SimConfig::default()
    })
    .await
    .expect("sim starts");
    let mongos = sim.addr().to_string();
    let config =
        Config::parse(&proxy_config(&mongos), Path::new("partial-incident.toml")).expect("config");
    let proxy = staleguard::server::start(Arc::new(config))
        .await
        .expect("staleguard starts");
    let guarded = proxy.local_addr().to_string();

    let start = Instant::now();
    let heal_at = opts.healthy + opts.partial;
    let stop = start + heal_at + opts.after;
    let out = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for ns in [PAYMENTS, INVENTORY] {
        for (via, addr) in [(Via::Direct, &mongos), (Via::Staleguard, &guarded)] {
            for _ in 0..opts.readers {
                let c = client(addr).await;
                let r = Reader {
                    ns,
                    via,
                    rate: opts.rate,
                    max_time: opts.max_time,
                    start,
                    stop,
                };
                tasks.push(tokio::spawn(reader(c, r, out.clone())));
            }
        }
    }

    tokio::time::sleep_until(start + opts.healthy).await;
    let cluster = sim.cluster();
    cluster.stall_primary("shardA").expect("stall shard A");
    cluster.restart_node("a1").expect("restart a1");
    let incident_at = start.elapsed();
    let before: Vec<u64> = [PAYMENTS, INVENTORY]
        .iter()
        .map(|ns| transitions(&proxy, ns))
        .collect();
    let mut opened_after: Vec<(&'static str, Option<Duration>)> =
        vec![(PAYMENTS, None), (INVENTORY, None)];
    while Instant::now() < start + heal_at {
        for (ns, at) in opened_after.iter_mut() {
            if at.is_none() && proxy.shared().breakers.state(ns) == State::Open {
                *at = Some(start.elapsed().saturating_sub(incident_at));
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let transitions_in_incident = [PAYMENTS, INVENTORY]
        .iter()
        .zip(before)
        .map(|(ns, b)| (*ns, transitions(&proxy, ns) - b))
        .collect();

    cluster.resume_primary("shardA").expect("resume shard A");
    let heal = start.elapsed();
    // Recovery: every breaker closed, and stays so to the end.
    let mut recovered: Option<Duration> = None;
    let mut rewrites_at_recovery: Option<u64> = None;
    while Instant::now() < stop {
        let closed = [PAYMENTS, INVENTORY]
            .iter()
            .all(|ns| proxy.shared().breakers.state(ns) == State::Closed);
        match (closed, recovered) {
            (true, None) => recovered = Some(start.elapsed() - heal),
            (false, Some(_)) => {
                recovered = None;
                rewrites_at_recovery = None;
            }
            _ => {}
        }
        // Reads in flight at the recovery have had their maxTimeMS to finish.
        let settled = recovered.is_some_and(|r| start.elapsed() - heal >= r + opts.max_time);
        if settled && rewrites_at_recovery.is_none() {
            rewrites_at_recovery = Some(rewrites(&proxy));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    for t in tasks {
        let _ = t.await;
    }
    let rewrites_after_recovery = rewrites_at_recovery.map_or(u64::MAX, |r| rewrites(&proxy) - r);
    let outcomes = std::mem::take(&mut *out.lock().expect("outcomes"));
    proxy.shutdown().await;
    Report {
        outcomes,
        incident_at,
        heal_at: heal,
        transitions_in_incident,
        opened_after,
        recovery: recovered,
        rewrites_after_recovery,
    }
}
