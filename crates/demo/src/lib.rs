//! `staleguard demo`: the incident of the source articles, told with numbers. Starts the
//! simulated cluster and staleguard proxies in-process (through [`Launch`], which the proxy's
//! crate implements), runs an inventory display and a
//! payment service twice each (straight to mongos, and through staleguard) and an order
//! service writing through staleguard, injects the incident partway, and prints a timeline
//! and a side-by-side summary. The proxy watches write progress (the orders it relays, and
//! each shard primary's serverStatus) and holds the inventory breaker open as soon as writes
//! stop completing, before any read fails.

//!
//! Here: the options, the tallies and the readers (the workloads); `run` drives the phases
//! and watches the proxy; `summary` prints the table.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mongodb::bson::{doc, Document};
use mongodb::options::{FindOneOptions, FindOptions};
use mongodb::{Client, Collection};
use tokio::time::Instant;

use staleguard_sim as sim;

mod incident;
mod proxy;
mod run;
mod summary;

pub use incident::{drive as drive_incident, IncidentOptions, Scenario};
pub use proxy::{BreakerView, Launch, Proxy, SignalView, StallKind};
pub use run::run;
pub use summary::summary;

/// How the demo is paced. Defaults finish in about 35 s.
#[derive(Debug, Clone)]
pub struct DemoOptions {
    /// Length of each phase (normal, stalled, one secondary restarted, both restarted,
    /// resumed).
    pub phase: Duration,
    /// The simulated secondary refresh limit (30 s in MongoDB 4.2; scaled down here).
    pub refresh_timeout: Duration,
    /// The inventory display's own request timeout (what its HTTP handler would allow).
    pub app_timeout: Duration,
    /// The payment service's `maxTimeMS`.
    pub payment_max_time: Duration,
    /// Requests per second per workload and path.
    pub rate: u32,
    pub seed: u64,
}

impl Default for DemoOptions {
    fn default() -> Self {
        DemoOptions {
            phase: Duration::from_secs(6),
            refresh_timeout: Duration::from_secs(3),
            app_timeout: Duration::from_millis(1500),
            payment_max_time: Duration::from_millis(1000),
            rate: 25,
            seed: 7,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Workload {
    Inventory,
    Payments,
    /// Inserts into `demo.orders` (unsharded, so on shard A), through staleguard only: the
    /// traffic the passive write-stall signal watches.
    Orders,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Path {
    Direct,
    Staleguard,
    /// Payments through a second staleguard whose `pay.*` entry has the primary ladder
    /// (`ladder = ["primary"]`).
    Ladder,
}

/// Outcomes of one workload on one path.
#[derive(Debug, Default, Clone)]
pub struct Tally {
    pub requests: u64,
    pub ok: u64,
    pub errors: BTreeMap<String, u64>,
    pub latencies_ms: Vec<f64>,
    /// Documents returned more than once by store views (orphans served).
    pub orphans: u64,
    pub error_ms: Vec<f64>,
    /// When the first error arrived, since the demo started.
    pub first_error_at: Option<Duration>,
    /// The first request sent after secondary a1 restarted: how long it took (ms) and
    /// whether it answered.
    pub first_after_restart: Option<(f64, bool)>,
    /// Requests sent during phase 3, the partial incident (a1 stale, a2 healthy): sent,
    /// answered, and how long each failure took (ms).
    pub partial_requests: u64,
    pub partial_ok: u64,
    pub partial_error_ms: Vec<f64>,
    /// Requests and answers by the phase they were sent in (1 to 5).
    pub by_phase: [(u64, u64); 5],
    /// Of those answers, the ones that came after their phase had ended (a read still
    /// waiting when the next phase began, e.g. when the primary resumed).
    pub answered_late: [u64; 5],
}

impl Tally {
    fn ok_share(&self) -> f64 {
        if self.requests == 0 {
            return 0.0;
        }
        self.ok as f64 / self.requests as f64
    }

    /// Median time an error took to arrive (how long the caller waited to learn of it).
    fn error_p50(&self) -> f64 {
        median(&self.error_ms)
    }

    fn partial_share(&self) -> f64 {
        if self.partial_requests == 0 {
            return 0.0;
        }
        self.partial_ok as f64 / self.partial_requests as f64
    }

    pub fn percentile(&self, p: f64) -> f64 {
        if self.latencies_ms.is_empty() {
            return 0.0;
        }
        let mut v = self.latencies_ms.clone();
        v.sort_by(|a, b| a.total_cmp(b));
        let i = ((p / 100.0) * (v.len() - 1) as f64).round() as usize;
        v[i.min(v.len() - 1)]
    }
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// A median in ms, or `-` when there is none.
/// Each phase's share answered ("97%"), or "-" for a phase with no request.
fn phase_shares(by_phase: &[(u64, u64)]) -> Vec<String> {
    by_phase
        .iter()
        .map(|&(n, ok)| {
            if n == 0 {
                "-".to_string()
            } else {
                format!("{:.0}%", ok as f64 * 100.0 / n as f64)
            }
        })
        .collect()
}

fn ms_or_dash(v: &[f64]) -> String {
    if v.is_empty() {
        "-".to_string()
    } else {
        format!("{:.1}", median(v))
    }
}

/// What a demo run measured.
#[derive(Debug, Default)]
pub struct Report {
    pub tallies: BTreeMap<(Workload, Path), Tally>,
    pub timeline: Vec<String>,
    /// When staleguard first said writes are not completing, since the demo started.
    pub stall_detected_at: Option<Duration>,
    /// staleguard's orphan estimate for the inventory (`orphans_estimated_total`):
    /// documents it saw twice in one `available` reply.
    pub orphans_estimated: u64,
    /// The simulated cluster's orphans of the inventory on the donor (documents that would
    /// come back twice from an `available` read of the whole collection).
    pub orphans_on_donor: usize,
}

/// Requests one workload may have waiting at once before it sheds load.
const MAX_IN_FLIGHT: usize = 200;

type Tallies = Arc<Mutex<BTreeMap<(Workload, Path), Tally>>>;

struct Timeline {
    start: Instant,
    lines: Mutex<Vec<String>>,
    echo: bool,
}

impl Timeline {
    fn say(&self, what: &str) {
        let line = format!("[{:>5.1}s] {what}", self.start.elapsed().as_secs_f64());
        if self.echo {
            println!("{line}");
        }
        if let Ok(mut l) = self.lines.lock() {
            l.push(line);
        }
    }
}

/// Write tickets per simulated primary: few, so a stall drains them within a phase.
const DEMO_WRITE_TICKETS: u32 = 16;

/// How long writes must wait before staleguard suspects a stall: well inside a phase.
fn stall_after(phase: Duration) -> Duration {
    let ms = (phase / 3).min(Duration::from_secs(2)).as_millis() as u64;
    Duration::from_millis(ms / 100 * 100).max(Duration::from_millis(100))
}

/// The demo's evidence floor: its clock is compressed (phases of seconds, a payment
/// `maxTimeMS` that may be below a second), so `min_wait` is the payment service's own
/// time limit when that is below the 1 s default: its reads cut by that limit still count.
fn min_wait(payment_max_time: Duration, default: Duration) -> Duration {
    payment_max_time.min(default)
}

fn proxy_config(
    cluster: &sim::SimHandle,
    phase: Duration,
    payment_max_time: Duration,
    default_min_wait: Duration,
) -> String {
    let sim = cluster.addr();
    let node = |n: &str| {
        cluster
            .node_addr(n)
            .map_or_else(String::new, |a| a.to_string())
    };
    let (a0, b0) = (node("a0"), node("b0"));
    let after = humantime::format_duration(stall_after(phase));
    let min_wait = humantime::format_duration(min_wait(payment_max_time, default_min_wait));
    format!(
        r#"listen = "127.0.0.1:0"
upstreams = ["{sim}"]

[stall_watch]
stall_after = "{after}"
# Every client of this demo runs on this machine (one client address); in production the
# default of two addresses keeps one client's writes from raising the signal alone.
min_client_addresses = 1
on_write_stall = "open_fallback_breakers"

[stall_watch.shards]
uris = ["mongodb://{a0}/?directConnection=true", "mongodb://{b0}/?directConnection=true"]
poll = "250ms"
for = "{after}"
baseline = "5s"

[defaults]
threshold = 3
window = "10s"
cooldown = "4s"
min_wait = "{min_wait}"

[[namespaces]]
pattern = "demo.store_inventory"
mode = "fallback"

[[namespaces]]
pattern = "pay.*"
mode = "strict"
"#
    )
}

/// The same config with the primary ladder on the strict payments entry.
/// The demo's payment service is one driver client whose few pooled connections carry the
/// whole service's reads, so each connection may start as many primary-rung reads per second
/// as the upstream allows (the default share, a tenth, is sized for many connections).
fn ladder_config(plain: &str) -> String {
    let mut c = plain.replace(
        "pattern = \"pay.*\"\nmode = \"strict\"\n",
        "pattern = \"pay.*\"\nmode = \"strict\"\nladder = [\"primary\"]\n",
    );
    c.push_str("\n[ladder_guard]\nper_connection_per_second = 100\n");
    c
}

/// A tiny deterministic generator (xorshift) so runs are repeatable.
struct Rng(u64);

impl Rng {
    fn next(&mut self, n: u64) -> u64 {
        let mut x = self.0.max(1);
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x % n
    }
}

fn classify_error(e: &mongodb::error::Error) -> String {
    if let mongodb::error::ErrorKind::Command(c) = e.kind.as_ref() {
        if c.message.starts_with("staleguard:") {
            return format!("fail-fast {}", c.code_name);
        }
        return c.code_name.clone();
    }
    "network/other".to_string()
}

fn record(tallies: &Tallies, run: &Run, sent_at: Duration, ms: f64, outcome: Result<u64, String>) {
    let Ok(mut t) = tallies.lock() else { return };
    let t = t.entry((run.w, run.path)).or_default();
    t.requests += 1;
    let restart = run.restart_at.load(Ordering::SeqCst);
    let sent_ms = sent_at.as_millis() as u64;
    if restart > 0 && sent_ms >= restart && t.first_after_restart.is_none() {
        t.first_after_restart = Some((ms, outcome.is_ok()));
    }
    let phase = (sent_ms / run.phase_ms.max(1)).min(4) as usize;
    t.by_phase[phase].0 += 1;
    t.by_phase[phase].1 += u64::from(outcome.is_ok());
    let done_ms = sent_ms + ms as u64;
    if outcome.is_ok() && phase < 4 && done_ms >= (phase as u64 + 1) * run.phase_ms {
        t.answered_late[phase] += 1;
    }
    let partial = restart > 0 && sent_ms >= restart && sent_ms < restart + run.phase_ms;
    if partial {
        t.partial_requests += 1;
        match &outcome {
            Ok(_) => t.partial_ok += 1,
            Err(_) => t.partial_error_ms.push(ms),
        }
    }
    t.latencies_ms.push(ms);
    match outcome {
        Ok(orphans) => {
            t.ok += 1;
            t.orphans += orphans;
        }
        Err(kind) => {
            *t.errors.entry(kind).or_default() += 1;
            t.error_ms.push(ms);
            if t.first_error_at.is_none() {
                t.first_error_at = Some(run.t0.elapsed());
            }
        }
    }
}

/// Which workload on which path, seeded, timed from the demo's start.
#[derive(Debug, Clone)]
struct Run {
    w: Workload,
    path: Path,
    seed: u64,
    t0: Instant,
    /// Milliseconds from `t0` to a1's restart (0: not yet).
    restart_at: Arc<AtomicU64>,
    /// The length of a phase, in ms (phase 3, the partial incident, starts at the restart).
    phase_ms: u64,
}

/// One inventory-display request: mostly a single product, every fifth a whole store's
/// shelf (which goes to every shard, so orphans would show twice). Returns the number of
/// documents returned more than once.
async fn inventory_request(
    coll: Collection<Document>,
    store: i32,
    product: Option<i32>,
) -> Result<u64, mongodb::error::Error> {
    let Some(product) = product else {
        let mut cur = coll
            .find(doc! {"_id.storeId": store})
            .with_options(FindOptions::builder().batch_size(200).build())
            .await?;
        let mut seen = std::collections::HashSet::new();
        let mut dup = 0u64;
        while cur.advance().await? {
            let d = cur.deserialize_current()?;
            let id = d
                .get_document("_id")
                .map(|i| i.to_string())
                .unwrap_or_default();
            if !seen.insert(id) {
                dup += 1;
            }
        }
        return Ok(dup);
    };
    coll.find_one(doc! {"_id": {"productId": product, "storeId": store}})
        .await?;
    Ok(0)
}

/// Drives one workload on one path at a fixed arrival rate (requests do not wait for each
/// other, as independent users would not), until `running` turns false.
async fn workload(
    c: Client,
    run: Run,
    opts: DemoOptions,
    tallies: Tallies,
    running: Arc<AtomicBool>,
) {
    let w = run.w;
    let inv = c.database("demo").collection::<Document>("store_inventory");
    let pay = c.database("pay").collection::<Document>("transactions");
    let orders = c.database("demo").collection::<Document>("orders");
    let mut rng = Rng(run.seed | 1);
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / opts.rate as f64));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let in_flight = Arc::new(tokio::sync::Semaphore::new(MAX_IN_FLIGHT));
    let mut tasks = tokio::task::JoinSet::new();
    while running.load(Ordering::Relaxed) {
        tick.tick().await;
        let Ok(permit) = in_flight.clone().try_acquire_owned() else {
            record(
                &tallies,
                &run,
                run.t0.elapsed(),
                0.0,
                Err("not sent: too many waiting".into()),
            );
            continue;
        };
        let (store, product, id) = (
            rng.next(20) as i32 + 1,
            (rng.next(5) != 0).then(|| rng.next(100) as i32 + 1),
            rng.next(300) as i32 + 1,
        );
        let (inv, pay, tallies, opts) = (inv.clone(), pay.clone(), tallies.clone(), opts.clone());
        let orders = orders.clone();
        let run = run.clone();
        tasks.spawn(async move {
            let started = Instant::now();
            let sent_at = run.t0.elapsed();
            let outcome = match w {
                Workload::Inventory => {
                    match tokio::time::timeout(
                        opts.app_timeout,
                        inventory_request(inv, store, product),
                    )
                    .await
                    {
                        Ok(Ok(dup)) => Ok(dup),
                        Ok(Err(e)) => Err(classify_error(&e)),
                        Err(_) => Err("app timeout".to_string()),
                    }
                }
                Workload::Payments => {
                    let fut = pay.find_one(doc! {"_id": id}).with_options(
                        FindOneOptions::builder()
                            .max_time(opts.payment_max_time)
                            .build(),
                    );
                    // The service's own guard, well above maxTimeMS.
                    match tokio::time::timeout(opts.payment_max_time * 3, fut).await {
                        Ok(Ok(_)) => Ok(0),
                        Ok(Err(e)) => Err(classify_error(&e)),
                        Err(_) => Err("app timeout".to_string()),
                    }
                }
                Workload::Orders => {
                    let order = doc! { "store": store, "product": product.unwrap_or(0), "qty": 1 };
                    // Orders wait as long as a phase: longer than stall_after, so the wait
                    // itself is what staleguard sees.
                    match tokio::time::timeout(opts.phase, orders.insert_one(order)).await {
                        Ok(Ok(_)) => Ok(0),
                        Ok(Err(e)) => Err(classify_error(&e)),
                        Err(_) => Err("app timeout".to_string()),
                    }
                }
            };
            record(
                &tallies,
                &run,
                sent_at,
                started.elapsed().as_secs_f64() * 1000.0,
                outcome,
            );
            drop(permit);
        });
        while tasks.try_join_next().is_some() {}
    }
    while tasks.join_next().await.is_some() {}
}
