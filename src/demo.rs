//! `staleguard demo`: the incident of the source articles, told with numbers. Starts the
//! simulated cluster and a staleguard proxy in-process, runs an inventory display and a
//! payment service twice each (straight to mongos, and through staleguard), injects the
//! incident partway, and prints a timeline and a side-by-side summary.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mongodb::bson::{doc, Document};
use mongodb::options::{
    ClientOptions, FindOneOptions, FindOptions, ReadPreference, SelectionCriteria,
};
use mongodb::{Client, Collection};
use tokio::time::Instant;

use crate::breaker::State;
use crate::config::Config;
use crate::server::Running;
use crate::sim::{self, SimConfig};

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
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Path {
    Direct,
    Staleguard,
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
        let mut v = self.error_ms.clone();
        v.sort_by(|a, b| a.total_cmp(b));
        v.get(v.len() / 2).copied().unwrap_or(0.0)
    }

    fn percentile(&self, p: f64) -> f64 {
        if self.latencies_ms.is_empty() {
            return 0.0;
        }
        let mut v = self.latencies_ms.clone();
        v.sort_by(|a, b| a.total_cmp(b));
        let i = ((p / 100.0) * (v.len() - 1) as f64).round() as usize;
        v[i.min(v.len() - 1)]
    }
}

/// What a demo run measured.
#[derive(Debug, Default)]
pub struct Report {
    pub tallies: BTreeMap<(Workload, Path), Tally>,
    pub timeline: Vec<String>,
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

fn proxy_config(sim: std::net::SocketAddr) -> String {
    format!(
        r#"listen = "127.0.0.1:0"
upstreams = ["{sim}"]

[defaults]
threshold = 3
window = "10s"
cooldown = "4s"

[[namespaces]]
pattern = "demo.store_inventory"
mode = "fallback"

[[namespaces]]
pattern = "pay.*"
mode = "strict"
"#
    )
}

/// Runs the whole demo; prints as it goes when `echo`.
pub async fn run(opts: DemoOptions, echo: bool) -> Result<Report, Box<dyn std::error::Error>> {
    let cluster = sim::start(SimConfig {
        listen: "127.0.0.1:0".into(),
        refresh_timeout: opts.refresh_timeout,
        seed: opts.seed,
        ..SimConfig::default()
    })
    .await?;
    let cfg_text = proxy_config(cluster.addr());
    let cfg = Config::parse(&cfg_text, std::path::Path::new("<demo>"))
        .map_err(|e| format!("demo config: {e:?}"))?;
    let proxy = crate::server::start(Arc::new(cfg)).await?;

    let tl = Arc::new(Timeline {
        start: Instant::now(),
        lines: Mutex::new(Vec::new()),
        echo,
    });
    if echo {
        println!("staleguard demo: simulated sharded cluster (mongos at {}, shards A and B: primary + 2 secondaries each)", cluster.addr());
        println!(
            "staleguard proxy at {}: demo.store_inventory = fallback, pay.* = strict",
            proxy.local_addr()
        );
        if let Some(admin) = proxy.admin_addr() {
            println!("staleguard status page: http://{admin}/ (watch the breakers change during the run)");
        }
        println!("Two services read from secondaries (secondaryPreferred), each once straight to mongos and once through staleguard:");
        println!("  inventory display: demo.store_inventory, product lookups and store views, gives up after {} ms", opts.app_timeout.as_millis());
        println!(
            "  payment service:   pay.transactions lookups with maxTimeMS {} ms",
            opts.payment_max_time.as_millis()
        );
        println!();
    }
    let direct = client(&cluster.addr().to_string()).await?;
    let guarded = client(&proxy.local_addr().to_string()).await?;
    let admin = client(&cluster.addr().to_string()).await?;

    // A chunk migration finished a moment ago; its documents still sit on the donor
    // (orphans) until the range deleter runs, long after this demo.
    match migrate_one_chunk(&admin).await {
        Ok(n) => tl.say(&format!(
            "setup: a chunk of demo.store_inventory ({n} documents) just moved to another shard; its old copies stay behind as orphans until cleanup"
        )),
        Err(e) => tl.say(&format!("setup: moveChunk failed: {e}")),
    }

    let tallies: Tallies = Arc::default();
    let running = Arc::new(AtomicBool::new(true));
    let mut tasks = Vec::new();
    for (path, c) in [(Path::Direct, &direct), (Path::Staleguard, &guarded)] {
        for w in [Workload::Inventory, Workload::Payments] {
            let seed = opts
                .seed
                .wrapping_mul(31)
                .wrapping_add(w as u64 * 7 + path as u64);
            tasks.push(tokio::spawn(workload(
                c.clone(),
                w,
                path,
                seed,
                opts.clone(),
                tallies.clone(),
                running.clone(),
            )));
        }
    }
    let watcher = tokio::spawn(watch_breakers(
        proxy_shared(&proxy),
        tl.clone(),
        running.clone(),
    ));

    let phase = opts.phase;
    tl.say("phase 1: healthy cluster, all reads answer");
    tokio::time::sleep(phase).await;
    control(
        &admin,
        doc! {"simControl": "stallPrimary", "shard": "shardA"},
    )
    .await;
    tl.say("phase 2: shard A's primary stalls: it answers heartbeats but finishes no write (no failover happens)");
    tokio::time::sleep(phase).await;
    control(&admin, doc! {"simControl": "restartNode", "node": "a1"}).await;
    tl.say("phase 3: secondary a1 is restarted; it lost its routing table and can only reload it through a primary write");
    tokio::time::sleep(phase).await;
    control(&admin, doc! {"simControl": "restartNode", "node": "a2"}).await;
    tl.say("phase 4: the operator restarts a2 too, \"to revive it\"; now no secondary of shard A can serve versioned reads");
    tokio::time::sleep(phase).await;
    control(
        &admin,
        doc! {"simControl": "resumePrimary", "shard": "shardA"},
    )
    .await;
    tl.say("phase 5: shard A's primary resumes; secondaries refresh their routing tables");
    tokio::time::sleep(phase).await;
    running.store(false, Ordering::Relaxed);
    for t in tasks {
        let _ = t.await;
    }
    let _ = watcher.await;
    tl.say("done");

    let report = Report {
        tallies: tallies.lock().map(|t| t.clone()).unwrap_or_default(),
        timeline: tl.lines.lock().map(|l| l.clone()).unwrap_or_default(),
    };
    proxy.shutdown().await;
    cluster.shutdown().await;
    Ok(report)
}

fn proxy_shared(p: &Running) -> Arc<crate::server::Shared> {
    p.shared().clone()
}

/// Moves the chunk holding one inventory document to the other shard, with the orphan
/// cleanup far in the future. Returns how many documents moved.
async fn migrate_one_chunk(admin: &Client) -> Result<i64, mongodb::error::Error> {
    let mut last = None;
    for to in ["shardB", "shardA"] {
        let cmd = doc! {"simControl": "moveChunk", "ns": "demo.store_inventory",
        "find": {"_id": {"productId": 1, "storeId": 1}}, "to": to, "deleteAfter": 600_000};
        match admin.database("admin").run_command(cmd).await {
            Ok(reply) => {
                return Ok(reply
                    .get_i64("movedDocs")
                    .or_else(|_| reply.get_i32("movedDocs").map(i64::from))
                    .unwrap_or(0))
            }
            // Already there: move it the other way.
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| mongodb::error::Error::custom("no shard to move to")))
}

async fn control(admin: &Client, cmd: Document) {
    if let Err(e) = admin.database("admin").run_command(cmd.clone()).await {
        eprintln!("demo: control command {cmd} failed: {e}");
    }
}

async fn client(addr: &str) -> Result<Client, mongodb::error::Error> {
    let mut o =
        ClientOptions::parse(format!("mongodb://{addr}/?serverSelectionTimeoutMS=5000")).await?;
    o.selection_criteria = Some(SelectionCriteria::ReadPreference(
        ReadPreference::SecondaryPreferred {
            options: Default::default(),
        },
    ));
    o.max_pool_size = Some(16);
    Client::with_options(o)
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

fn record(tallies: &Tallies, key: (Workload, Path), ms: f64, outcome: Result<u64, String>) {
    let Ok(mut t) = tallies.lock() else { return };
    let t = t.entry(key).or_default();
    t.requests += 1;
    t.latencies_ms.push(ms);
    match outcome {
        Ok(orphans) => {
            t.ok += 1;
            t.orphans += orphans;
        }
        Err(kind) => {
            *t.errors.entry(kind).or_default() += 1;
            t.error_ms.push(ms);
        }
    }
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
    w: Workload,
    path: Path,
    seed: u64,
    opts: DemoOptions,
    tallies: Tallies,
    running: Arc<AtomicBool>,
) {
    let inv = c.database("demo").collection::<Document>("store_inventory");
    let pay = c.database("pay").collection::<Document>("transactions");
    let mut rng = Rng(seed | 1);
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / opts.rate as f64));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let in_flight = Arc::new(tokio::sync::Semaphore::new(MAX_IN_FLIGHT));
    let mut tasks = tokio::task::JoinSet::new();
    while running.load(Ordering::Relaxed) {
        tick.tick().await;
        let Ok(permit) = in_flight.clone().try_acquire_owned() else {
            record(
                &tallies,
                (w, path),
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
        tasks.spawn(async move {
            let started = Instant::now();
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
            };
            record(
                &tallies,
                (w, path),
                started.elapsed().as_secs_f64() * 1000.0,
                outcome,
            );
            drop(permit);
        });
        while tasks.try_join_next().is_some() {}
    }
    while tasks.join_next().await.is_some() {}
}

async fn watch_breakers(
    shared: Arc<crate::server::Shared>,
    tl: Arc<Timeline>,
    running: Arc<AtomicBool>,
) {
    let mut last: BTreeMap<String, State> = BTreeMap::new();
    while running.load(Ordering::Relaxed) {
        for s in shared.breakers.snapshot() {
            let before = last.insert(s.ns.clone(), s.state);
            if before == Some(s.state) || (before.is_none() && s.state == State::Closed) {
                continue;
            }
            let strict = s.ns.starts_with("pay.");
            let what = match (s.state, strict) {
                (State::Open, false) => "OPEN: its reads now go out with readConcern \"available\"",
                (State::Open, true) => {
                    "OPEN: its reads now fail fast instead of hanging (never relaxed)"
                }
                (State::HalfOpen, _) => "half-open: one probe read goes out unmodified",
                (State::Closed, _) => "closed: reads go out unmodified again",
            };
            tl.say(&format!(
                "staleguard: {} breaker {what} ({})",
                s.ns, s.last_reason
            ));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn row_name(w: Workload, p: Path) -> (&'static str, &'static str) {
    (
        match w {
            Workload::Inventory => "inventory",
            Workload::Payments => "payments",
        },
        match p {
            Path::Direct => "direct",
            Path::Staleguard => "staleguard",
        },
    )
}

/// The side-by-side summary, then what it means in plain words.
pub fn summary(report: &Report) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<10} {:<10} {:>8} {:>7} {:>8} {:>8} {:>12} {:>8}  errors by kind",
        "workload", "path", "requests", "ok %", "p50 ms", "p99 ms", "err p50 ms", "orphans"
    );
    for ((w, p), t) in &report.tallies {
        let (wn, pn) = row_name(*w, *p);
        let errors = if t.errors.is_empty() {
            "-".to_string()
        } else {
            t.errors
                .iter()
                .map(|(k, n)| format!("{k}: {n}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let _ = writeln!(
            out,
            "{wn:<10} {pn:<10} {:>8} {:>7.1} {:>8.1} {:>8.1} {:>12.1} {:>8}  {errors}",
            t.requests,
            t.ok_share() * 100.0,
            t.percentile(50.0),
            t.percentile(99.0),
            t.error_p50(),
            t.orphans,
        );
    }
    let get = |w, p| report.tallies.get(&(w, p));
    if let (Some(d), Some(g)) = (
        get(Workload::Inventory, Path::Direct),
        get(Workload::Inventory, Path::Staleguard),
    ) {
        let _ = writeln!(
            out,
            "\nInventory display: straight to mongos {:.1}% of requests failed (p99 {:.0} ms); through staleguard {:.1}% (p99 {:.0} ms). \
             The price: {} orphan document(s) served twice by readConcern \"available\" — acceptable for a display.",
            100.0 - d.ok_share() * 100.0,
            d.percentile(99.0),
            100.0 - g.ok_share() * 100.0,
            g.percentile(99.0),
            g.orphans,
        );
    }
    if let (Some(d), Some(g)) = (
        get(Workload::Payments, Path::Direct),
        get(Workload::Payments, Path::Staleguard),
    ) {
        let _ = writeln!(
            out,
            "Payments: straight to mongos {} request(s) failed, each after waiting a median {:.0} ms; through staleguard {} failed, \
             each within a median {:.1} ms: the breaker fails the whole namespace fast while it is open (reads that would have \
             found a healthy node included) and never relaxes it ({} orphans), so the service gets a clear error at once instead of a hang.",
            d.requests - d.ok,
            d.error_p50(),
            g.requests - g.ok,
            g.error_p50(),
            g.orphans,
        );
    }
    out
}
