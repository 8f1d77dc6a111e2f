//! `staleguard demo`: the incident of the source articles, told with numbers. Starts the
//! simulated cluster and a staleguard proxy in-process, runs an inventory display and a
//! payment service twice each (straight to mongos, and through staleguard) and an order
//! service writing through staleguard, injects the incident partway, and prints a timeline
//! and a side-by-side summary. The proxy watches write progress (the orders it relays, and
//! each shard primary's serverStatus) and holds the inventory breaker open as soon as writes
//! stop completing, before any read fails.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
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
fn min_wait(payment_max_time: Duration) -> Duration {
    payment_max_time.min(crate::policy::DEFAULT_MIN_WAIT)
}

fn proxy_config(cluster: &sim::SimHandle, phase: Duration, payment_max_time: Duration) -> String {
    let sim = cluster.addr();
    let node = |n: &str| {
        cluster
            .node_addr(n)
            .map_or_else(String::new, |a| a.to_string())
    };
    let (a0, b0) = (node("a0"), node("b0"));
    let after = humantime::format_duration(stall_after(phase));
    let min_wait = humantime::format_duration(min_wait(payment_max_time));
    format!(
        r#"listen = "127.0.0.1:0"
upstreams = ["{sim}"]

[stall_watch]
stall_after = "{after}"
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

/// Runs the whole demo; prints as it goes when `echo`.
pub async fn run(opts: DemoOptions, echo: bool) -> Result<Report, Box<dyn std::error::Error>> {
    let cluster = sim::start(SimConfig {
        listen: "127.0.0.1:0".into(),
        refresh_timeout: opts.refresh_timeout,
        seed: opts.seed,
        node_ports: true,
        write_tickets: DEMO_WRITE_TICKETS,
        ..SimConfig::default()
    })
    .await?;
    let cfg_text = proxy_config(&cluster, opts.phase, opts.payment_max_time);
    let cfg = Config::parse(&cfg_text, std::path::Path::new("<demo>"))
        .map_err(|e| format!("demo config: {e:?}"))?;
    let proxy = crate::server::start(Arc::new(cfg)).await?;
    let ladder_text = ladder_config(&cfg_text);
    let mut ladder_cfg = Config::parse(&ladder_text, std::path::Path::new("<demo-ladder>"))
        .map_err(|e| format!("demo ladder config: {e:?}"))?;
    ladder_cfg.admin_listen = None;
    let ladder_proxy = crate::server::start(Arc::new(ladder_cfg)).await?;

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
        println!(
            "  and the payment service a third time through a second staleguard ({}) whose pay.* has the primary ladder: ladder = [\"primary\"]",
            ladder_proxy.local_addr()
        );
        println!("An order service inserts into demo.orders (on shard A) through staleguard, which watches whether writes complete");
        println!(
            "  (writes waiting over {} on two connections with none answered, and each shard primary's serverStatus) and holds the",
            humantime::format_duration(stall_after(opts.phase))
        );
        println!("  inventory breaker open while they do not (on_write_stall = \"open_fallback_breakers\").");
        println!();
    }
    let direct = client(&cluster.addr().to_string()).await?;
    let guarded = client(&proxy.local_addr().to_string()).await?;
    let laddered = client(&ladder_proxy.local_addr().to_string()).await?;
    // Its own pool: orders waiting on a stalled primary must not starve the reads.
    let orders = writer_client(&proxy.local_addr().to_string()).await?;
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
    // Milliseconds from the demo's start to a1's restart (0: not yet).
    let restart_at = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    let runs = [
        (Path::Direct, &direct, Workload::Inventory),
        (Path::Direct, &direct, Workload::Payments),
        (Path::Staleguard, &guarded, Workload::Inventory),
        (Path::Staleguard, &guarded, Workload::Payments),
        (Path::Ladder, &laddered, Workload::Payments),
        (Path::Staleguard, &orders, Workload::Orders),
    ];
    for (path, c, w) in runs {
        let seed = opts
            .seed
            .wrapping_mul(31)
            .wrapping_add(w as u64 * 7 + path as u64);
        tasks.push(tokio::spawn(workload(
            c.clone(),
            Run {
                w,
                path,
                seed,
                t0: tl.start,
                restart_at: restart_at.clone(),
                phase_ms: opts.phase.as_millis() as u64,
            },
            opts.clone(),
            tallies.clone(),
            running.clone(),
        )));
    }
    let stall_seen: Arc<Mutex<Option<Duration>>> = Arc::default();
    let watcher = tokio::spawn(watch_breakers(
        proxy_shared(&proxy),
        tl.clone(),
        running.clone(),
        stall_seen.clone(),
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
    restart_at.store(
        tl.start.elapsed().as_millis().max(1) as u64,
        Ordering::SeqCst,
    );
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

    let inventory = "demo.store_inventory";
    let orphans_on_donor = cluster
        .cluster()
        .status()
        .shards
        .iter()
        .map(|s| s.orphans.get(inventory).copied().unwrap_or(0))
        .sum();
    let report = Report {
        tallies: tallies.lock().map(|t| t.clone()).unwrap_or_default(),
        timeline: tl.lines.lock().map(|l| l.clone()).unwrap_or_default(),
        stall_detected_at: stall_seen.lock().ok().and_then(|s| *s),
        orphans_estimated: proxy.shared().metrics.ladder.orphans_of(inventory),
        orphans_on_donor,
    };
    ladder_proxy.shutdown().await;
    proxy.shutdown().await;
    cluster.shutdown().await;
    Ok(report)
}

fn proxy_shared(p: &Running) -> Arc<crate::handles::Handles> {
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

/// The order service's client: a pool large enough for the writes a stall holds.
async fn writer_client(addr: &str) -> Result<Client, mongodb::error::Error> {
    let mut o =
        ClientOptions::parse(format!("mongodb://{addr}/?serverSelectionTimeoutMS=5000")).await?;
    o.max_pool_size = Some(MAX_IN_FLIGHT as u32);
    Client::with_options(o)
}

async fn client(addr: &str) -> Result<Client, mongodb::error::Error> {
    let mut o =
        ClientOptions::parse(format!("mongodb://{addr}/?serverSelectionTimeoutMS=5000")).await?;
    o.selection_criteria = Some(SelectionCriteria::ReadPreference(
        ReadPreference::SecondaryPreferred {
            options: Default::default(),
        },
    ));
    // pymongo's and the Node.js driver's default: a pool smaller than the reads a workload
    // has in flight makes reads wait in the driver, which is not what the incident is about.
    o.max_pool_size = Some(100);
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

/// Says when a write-stall signal rises or clears, with its evidence.
fn watch_stall(
    shared: &crate::handles::Handles,
    tl: &Timeline,
    raised: &mut BTreeMap<String, bool>,
    first: &Mutex<Option<Duration>>,
) {
    for s in shared.stall.signals() {
        let key = format!("{}/{}", s.kind.as_str(), s.target);
        let before = raised.insert(key, s.raised).unwrap_or(false);
        if s.raised == before {
            continue;
        }
        let kind = match s.kind {
            crate::stall::SignalKind::Passive => "writes relayed",
            crate::stall::SignalKind::Probe => "write probe",
            crate::stall::SignalKind::Composite => "serverStatus",
        };
        let on = if s.kind == crate::stall::SignalKind::Composite {
            "on"
        } else {
            "through"
        };
        if s.raised {
            let since = s
                .since
                .map(|t| t.saturating_duration_since(tl.start).as_secs_f64())
                .unwrap_or_default();
            if let Ok(mut f) = first.lock() {
                f.get_or_insert(tl.start.elapsed());
            }
            tl.say(&format!(
                "staleguard: WRITE STALL suspected: writes are not completing {on} {} since {since:.1}s ({kind}: {})",
                s.place, s.summary
            ));
        } else {
            tl.say(&format!(
                "staleguard: writes complete again {on} {} ({kind}: {})",
                s.place, s.summary
            ));
        }
    }
}

async fn watch_breakers(
    shared: Arc<crate::handles::Handles>,
    tl: Arc<Timeline>,
    running: Arc<AtomicBool>,
    stall_seen: Arc<Mutex<Option<Duration>>>,
) {
    let mut last: BTreeMap<String, State> = BTreeMap::new();
    let mut raised: BTreeMap<String, bool> = BTreeMap::new();
    while running.load(Ordering::Relaxed) {
        watch_stall(&shared, &tl, &mut raised, &stall_seen);
        for s in shared.breakers.snapshot() {
            let before = last.insert(s.ns.clone(), s.state);
            if before == Some(s.state) || (before.is_none() && s.state == State::Closed) {
                continue;
            }
            let strict = s.ns.starts_with("pay.");
            let what = match (s.state, strict) {
                (State::Open, false) => "OPEN: its reads now go out with readConcern \"available\"",
                (State::Open, true) => {
                    "OPEN: its reads now go out bounded by a short time limit: healthy secondaries answer, the others fail fast instead of hanging (never relaxed)"
                }
                (State::Closed, _) => "closed: reads go out unmodified again",
            };
            let why = if s.held {
                "held open while writes are not completing, before any read failed".to_string()
            } else {
                s.last_reason.clone()
            };
            tl.say(&format!("staleguard: {} breaker {what} ({why})", s.ns));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn row_name(w: Workload, p: Path) -> (&'static str, &'static str) {
    (
        match w {
            Workload::Inventory => "inventory",
            Workload::Payments => "payments",
            Workload::Orders => "orders",
        },
        match p {
            Path::Direct => "direct",
            Path::Staleguard => "staleguard",
            Path::Ladder => "sg+ladder",
        },
    )
}

/// Payments during phase 3 only, the partial incident (secondary a1 stale, a2 healthy): the
/// common form of the incident, where an all-or-nothing breaker would fail reads a healthy
/// secondary answers.
fn partial_table(out: &mut String, report: &Report) {
    let _ = writeln!(out, "\nPayments answered by phase (1 healthy, 2 stalled, 3 a1 stale, 4 a1 and a2 stale, 5 resumed):");
    for p in [Path::Direct, Path::Staleguard, Path::Ladder] {
        let Some(t) = report.tallies.get(&(Workload::Payments, p)) else {
            continue;
        };
        let shares: Vec<String> = t
            .by_phase
            .iter()
            .map(|&(n, ok)| {
                if n == 0 {
                    "-".to_string()
                } else {
                    format!("{:.0}%", ok as f64 * 100.0 / n as f64)
                }
            })
            .collect();
        let _ = writeln!(
            out,
            "{:<10} {}",
            row_name(Workload::Payments, p).1,
            shares.join("  ")
        );
    }
    let _ = writeln!(
        out,
        "\nPartial incident (phase 3: a1 stale, a2 healthy), payments:\n{:<10} {:>8} {:>7} {:>10} {:>12}",
        "path", "requests", "ok %", "answered", "err p50 ms"
    );
    for p in [Path::Direct, Path::Staleguard, Path::Ladder] {
        let Some(t) = report.tallies.get(&(Workload::Payments, p)) else {
            continue;
        };
        let _ = writeln!(
            out,
            "{:<10} {:>8} {:>7.1} {:>10} {:>12}",
            row_name(Workload::Payments, p).1,
            t.partial_requests,
            t.partial_share() * 100.0,
            t.partial_ok,
            ms_or_dash(&t.partial_error_ms),
        );
    }
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
            "{wn:<10} {pn:<10} {:>8} {:>7.1} {:>8.1} {:>8.1} {:>12} {:>8}  {errors}",
            t.requests,
            t.ok_share() * 100.0,
            t.percentile(50.0),
            t.percentile(99.0),
            ms_or_dash(&t.error_ms),
            t.orphans,
        );
    }
    partial_table(&mut out, report);
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
        let _ = writeln!(
            out,
            "Orphan estimate: staleguard counted {} document(s) returned twice in its \"available\" replies \
             (staleguard_orphans_estimated_total); the display itself received {} twice (ground truth for what was served; \
             the simulated cluster holds {} orphan(s) on the donor).",
            report.orphans_estimated, g.orphans, report.orphans_on_donor,
        );
        let first = |t: &Tally| {
            t.first_after_restart.map_or_else(
                || "none sent".to_string(),
                |(ms, ok)| {
                    format!(
                        "{} after {ms:.0} ms",
                        if ok { "answered" } else { "failed" }
                    )
                },
            )
        };
        let _ = writeln!(
            out,
            "First inventory read after a1 restarted: straight to mongos {}; through staleguard {}.",
            first(d),
            first(g),
        );
    }
    if let (Some(d), Some(g)) = (
        get(Workload::Payments, Path::Direct),
        get(Workload::Payments, Path::Staleguard),
    ) {
        let _ = writeln!(
            out,
            "Payments: straight to mongos {} request(s) failed, each after waiting a median {:.0} ms (mongos retries StaleConfig \
             internally until the read's maxTimeMS runs out, and the driver adds its own round trips); through staleguard {} failed, \
             each within a median {:.1} ms: while the breaker is open, reads go out bounded by a short time limit, so a healthy \
             secondary still answers and a stale one fails fast; nothing is relaxed ({} orphans), and the service gets a clear error \
             instead of a hang.",
            d.requests - d.ok,
            d.error_p50(),
            g.requests - g.ok,
            g.error_p50(),
            g.orphans,
        );
    }
    if let (Some(d), Some(l)) = (
        get(Workload::Payments, Path::Direct),
        get(Workload::Payments, Path::Ladder),
    ) {
        let _ = writeln!(
            out,
            "Payments with the primary ladder: {:.1}% answered (straight to mongos {:.1}%), p99 {:.0} ms (direct {:.0} ms), \
             {} orphans: a strict read that meets StaleConfig or an open breaker is sent once to the shard's primary \
             (read concern untouched), which still has its routing table and filters orphans.",
            l.ok_share() * 100.0,
            d.ok_share() * 100.0,
            l.percentile(99.0),
            d.percentile(99.0),
            l.orphans,
        );
    }
    if let Some(o) = get(Workload::Orders, Path::Staleguard) {
        let when = report.stall_detected_at.map_or_else(
            || "staleguard did not see writes stop completing".to_string(),
            |t| {
                format!(
                    "staleguard said writes were not completing at {:.1}s",
                    t.as_secs_f64()
                )
            },
        );
        let first_read_error = [Workload::Inventory, Workload::Payments]
            .iter()
            .flat_map(|w| [Path::Direct, Path::Staleguard].map(|p| (*w, p)))
            .filter_map(|k| report.tallies.get(&k).and_then(|t| t.first_error_at))
            .min();
        let _ = writeln!(
            out,
            "Orders: {} insert(s) through staleguard, {:.1}% completed; while shard A's primary was stalled they waited \
             (no proxy can make a stalled primary write). {when}{}, and held the inventory breaker open from then on.",
            o.requests,
            o.ok_share() * 100.0,
            match (report.stall_detected_at, first_read_error) {
                (Some(s), Some(e)) => format!(
                    ", {} the first read failed ({:.1}s)",
                    if s < e { "before" } else { "after" },
                    e.as_secs_f64()
                ),
                _ => String::new(),
            },
        );
    }
    out
}
