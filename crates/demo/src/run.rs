//! `run`: starts the simulated cluster and two proxies, the workloads, then the incident
//! phase by phase, watching what the proxy says about its breakers and about writes.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mongodb::bson::{doc, Document};
use mongodb::options::{ClientOptions, ReadPreference, SelectionCriteria};
use mongodb::Client;
use tokio::time::Instant;

use crate::sim::{self, SimConfig};
use crate::{ladder_config, proxy_config, stall_after, workload, Launch, Proxy, StallKind};
use crate::{DemoOptions, Path, Report, Run, Tallies, Timeline, Workload};
use crate::{DEMO_WRITE_TICKETS, MAX_IN_FLIGHT};

/// Runs the whole demo; prints as it goes when `echo`.
pub async fn run<L: Launch>(
    launch: &L,
    opts: DemoOptions,
    echo: bool,
) -> Result<Report, Box<dyn std::error::Error>> {
    let cluster = sim::start(SimConfig {
        listen: "127.0.0.1:0".into(),
        refresh_timeout: opts.refresh_timeout,
        seed: opts.seed,
        node_ports: true,
        write_tickets: DEMO_WRITE_TICKETS,
        ..SimConfig::default()
    })
    .await?;
    let cfg_text = proxy_config(
        &cluster,
        opts.phase,
        opts.payment_max_time,
        L::DEFAULT_MIN_WAIT,
    );
    let proxy = launch.start(&cfg_text, true).await?;
    let ladder_proxy = launch.start(&ladder_config(&cfg_text), false).await?;

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
        match proxy.admin_addr() {
            Some(admin) if admin.to_string() == L::DEFAULT_ADMIN_LISTEN => {
                println!("staleguard status page: http://{admin}/ (watch the breakers change during the run)");
            }
            Some(admin) => println!(
                "staleguard status page: http://{admin}/ (watch the breakers change during the run; {} was taken, by a staleguard already running here perhaps, so the demo's page is on this free port)",
                L::DEFAULT_ADMIN_LISTEN
            ),
            None => println!(
                "staleguard status page: none ({} was taken as the demo started; the demo runs without it)",
                L::DEFAULT_ADMIN_LISTEN
            ),
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
    let stall_seen: Mutex<Option<Duration>> = Mutex::default();
    tokio::join!(
        async {
            phases(&admin, &tl, opts.phase, &restart_at).await;
            running.store(false, Ordering::Relaxed);
        },
        watch_breakers(&proxy, &tl, &running, &stall_seen),
    );
    for t in tasks {
        let _ = t.await;
    }
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
        orphans_estimated: proxy.orphans_estimated(inventory),
        orphans_on_donor,
    };
    ladder_proxy.shutdown().await;
    proxy.shutdown().await;
    cluster.shutdown().await;
    Ok(report)
}

/// The incident, phase by phase, each `phase` long.
async fn phases(admin: &Client, tl: &Timeline, phase: Duration, restart_at: &AtomicU64) {
    tl.say("phase 1: healthy cluster, all reads answer");
    tokio::time::sleep(phase).await;
    control(
        admin,
        doc! {"simControl": "stallPrimary", "shard": "shardA"},
    )
    .await;
    tl.say("phase 2: shard A's primary stalls: it answers heartbeats but finishes no write (no failover happens)");
    tokio::time::sleep(phase).await;
    control(admin, doc! {"simControl": "restartNode", "node": "a1"}).await;
    restart_at.store(
        tl.start.elapsed().as_millis().max(1) as u64,
        Ordering::SeqCst,
    );
    tl.say("phase 3: secondary a1 is restarted; it lost its routing table and can only reload it through a primary write");
    tokio::time::sleep(phase).await;
    control(admin, doc! {"simControl": "restartNode", "node": "a2"}).await;
    tl.say("phase 4: the operator restarts a2 too, \"to revive it\"; now no secondary of shard A can serve versioned reads");
    tokio::time::sleep(phase).await;
    control(
        admin,
        doc! {"simControl": "resumePrimary", "shard": "shardA"},
    )
    .await;
    tl.say("phase 5: shard A's primary resumes; secondaries refresh their routing tables");
    tokio::time::sleep(phase).await;
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

pub(crate) async fn control(admin: &Client, cmd: Document) {
    if let Err(e) = admin.database("admin").run_command(cmd.clone()).await {
        eprintln!("demo: control command {cmd} failed: {e}");
    }
}

/// The order service's client: a pool large enough for the writes a stall holds.
pub(crate) async fn writer_client(addr: &str) -> Result<Client, mongodb::error::Error> {
    let mut o =
        ClientOptions::parse(format!("mongodb://{addr}/?serverSelectionTimeoutMS=5000")).await?;
    o.max_pool_size = Some(MAX_IN_FLIGHT as u32);
    Client::with_options(o)
}

pub(crate) async fn client(addr: &str) -> Result<Client, mongodb::error::Error> {
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

/// Says when a write-stall signal rises or clears, with its evidence.
fn watch_stall(
    proxy: &impl Proxy,
    tl: &Timeline,
    raised: &mut BTreeMap<String, bool>,
    first: &Mutex<Option<Duration>>,
) {
    for s in proxy.stall_signals() {
        let key = format!("{:?}/{}", s.kind, s.target);
        let before = raised.insert(key, s.raised).unwrap_or(false);
        if s.raised == before {
            continue;
        }
        let kind = match s.kind {
            StallKind::Passive => "writes relayed",
            StallKind::Probe => "write probe",
            StallKind::Composite => "serverStatus",
        };
        let on = if s.kind == StallKind::Composite {
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

/// Says when a breaker opens or closes, and (through `watch_stall`) when a write-stall
/// signal rises or clears, until `running` turns false.
async fn watch_breakers(
    proxy: &impl Proxy,
    tl: &Timeline,
    running: &AtomicBool,
    stall_seen: &Mutex<Option<Duration>>,
) {
    let mut last: BTreeMap<String, bool> = BTreeMap::new();
    let mut raised: BTreeMap<String, bool> = BTreeMap::new();
    while running.load(Ordering::Relaxed) {
        watch_stall(proxy, tl, &mut raised, stall_seen);
        for s in proxy.breakers() {
            let before = last.insert(s.ns.clone(), s.open);
            if before == Some(s.open) || (before.is_none() && !s.open) {
                continue;
            }
            let strict = s.ns.starts_with("pay.");
            let what = match (s.open, strict) {
                (true, false) => "OPEN: its reads now go out with readConcern \"available\"",
                (true, true) => {
                    "OPEN: its reads now go out bounded by a short time limit: healthy secondaries answer, the others fail fast instead of hanging (never relaxed)"
                }
                (false, _) => "closed: reads go out unmodified again",
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
