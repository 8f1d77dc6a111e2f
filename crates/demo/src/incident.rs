//! `staleguard incident`: drives the incident by name against a running simulated cluster
//! (`staleguard sim --node-ports`), with a small paced load of its own through a running
//! staleguard (`staleguard run`), so that its status page, `/status` and `/metrics` can be
//! watched as the incident happens. Four phases of equal length: healthy, shard A's primary
//! stalls, the scenario's secondaries restart, the primary resumes. Every few seconds it
//! prints what its clients got; at the end, what each phase meant.

use std::error::Error;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use mongodb::bson::doc;
use mongodb::Client;
use tokio::time::Instant;

use crate::run::{client, control, writer_client};
use crate::{workload, DemoOptions, Path, Run, Tallies, Tally, Workload};

/// Which incident.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scenario {
    /// Shard A's primary stalls (writes stop completing); no secondary restarts, so reads
    /// keep working: only the write-stall watch sees it.
    Stall,
    /// The stall, then secondary a1 restarts (stale), a2 stays healthy: the common, partial
    /// form of the incident.
    Partial,
    /// The stall, then a1 and a2 both restart: no secondary of shard A can serve versioned
    /// reads.
    Full,
}

impl Scenario {
    pub fn parse(s: &str) -> Option<Scenario> {
        match s {
            "stall" => Some(Scenario::Stall),
            "partial" => Some(Scenario::Partial),
            "full" => Some(Scenario::Full),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Scenario::Stall => "stall",
            Scenario::Partial => "partial",
            Scenario::Full => "full",
        }
    }

    fn restarts(self) -> &'static [&'static str] {
        match self {
            Scenario::Stall => &[],
            Scenario::Partial => &["a1"],
            Scenario::Full => &["a1", "a2"],
        }
    }
}

/// What `staleguard incident` is told.
#[derive(Debug, Clone)]
pub struct IncidentOptions {
    pub scenario: Scenario,
    /// The staleguard its load goes through (`listen` of `staleguard run`).
    pub proxy: String,
    /// The simulated cluster's mongos (faults are injected there, not through staleguard).
    pub cluster: String,
    /// The length of each of the four phases.
    pub phase: Duration,
    /// Requests per second per workload (inventory reads, payment reads, order inserts).
    pub rate: u32,
    /// How often a progress line is printed.
    pub every: Duration,
}

impl Default for IncidentOptions {
    fn default() -> Self {
        IncidentOptions {
            scenario: Scenario::Partial,
            proxy: "127.0.0.1:27018".into(),
            cluster: "127.0.0.1:27017".into(),
            phase: Duration::from_secs(20),
            rate: 10,
            every: Duration::from_secs(5),
        }
    }
}

const WORKLOADS: [Workload; 3] = [Workload::Inventory, Workload::Payments, Workload::Orders];

/// Runs the four phases and prints as it goes; returns what each workload got.
pub async fn drive(o: IncidentOptions) -> Result<Vec<(Workload, Tally)>, Box<dyn Error>> {
    let admin = client(&o.cluster).await?;
    let probe = admin
        .database("admin")
        .run_command(doc! {"simControl": "status"})
        .await;
    if let Err(e) = probe {
        return Err(format!(
            "{} does not answer simControl ({e}): it must be staleguard's simulated cluster, started with `staleguard sim --node-ports`",
            o.cluster
        )
        .into());
    }
    // A previous run may have left shard A stalled: start healthy.
    control(
        &admin,
        doc! {"simControl": "resumePrimary", "shard": "shardA"},
    )
    .await;
    let readers = client(&o.proxy).await?;
    let writers = writer_client(&o.proxy).await?;
    let t0 = Instant::now();
    let say = |what: &str| println!("[{:>5.1}s] {what}", t0.elapsed().as_secs_f64());
    println!(
        "staleguard incident --scenario {}: {} req/s each of inventory reads (demo.store_inventory, fallback in config/sim.toml), payment reads (pay.transactions, strict) and order inserts (demo.orders, on shard A), through staleguard at {}; faults injected at the simulated mongos {}. Phases of {}.",
        o.scenario.name(),
        o.rate,
        o.proxy,
        o.cluster,
        humantime::format_duration(o.phase)
    );
    println!("Watch staleguard's page meanwhile: http://127.0.0.1:9187/ (its [admin] listen), and /status, /metrics.");
    let tallies: Tallies = Arc::default();
    let running = Arc::new(AtomicBool::new(true));
    let restart_at = Arc::new(AtomicU64::new(0));
    let opts = DemoOptions {
        phase: o.phase,
        rate: o.rate,
        ..DemoOptions::default()
    };
    let mut tasks = Vec::new();
    for w in WORKLOADS {
        let c = if w == Workload::Orders {
            &writers
        } else {
            &readers
        };
        tasks.push(tokio::spawn(workload(
            c.clone(),
            Run {
                w,
                path: Path::Staleguard,
                seed: 7 + w as u64,
                t0,
                restart_at: restart_at.clone(),
                phase_ms: o.phase.as_millis() as u64,
            },
            opts.clone(),
            tallies.clone(),
            running.clone(),
        )));
    }
    let report = progress(&tallies, o.every, &running, t0);
    let phases = async {
        phases(&admin, &o, (&restart_at, t0), &say).await;
        running.store(false, Ordering::Relaxed);
    };
    tokio::join!(report, phases);
    for t in tasks {
        let _ = t.await;
    }
    let done: Vec<(Workload, Tally)> = WORKLOADS
        .iter()
        .map(|w| {
            let t = tallies
                .lock()
                .ok()
                .and_then(|t| t.get(&(*w, Path::Staleguard)).cloned())
                .unwrap_or_default();
            (*w, t)
        })
        .collect();
    print!("{}", explain(&o, &done));
    Ok(done)
}

async fn phases(
    admin: &Client,
    o: &IncidentOptions,
    (restart_at, t0): (&AtomicU64, Instant),
    say: &impl Fn(&str),
) {
    say("phase 1: healthy cluster; every read answers, every order completes");
    tokio::time::sleep(o.phase).await;
    control(
        admin,
        doc! {"simControl": "stallPrimary", "shard": "shardA"},
    )
    .await;
    say("phase 2: shard A's primary stalls: it answers heartbeats but completes no write; orders wait. staleguard's write-stall watch should say so within its stall_after, before any read fails");
    tokio::time::sleep(o.phase).await;
    let restarts = o.scenario.restarts();
    for node in restarts {
        control(admin, doc! {"simControl": "restartNode", "node": *node}).await;
    }
    restart_at.store(t0.elapsed().as_millis().max(1) as u64, Ordering::SeqCst);
    match o.scenario {
        Scenario::Stall => say("phase 3: still stalled, no secondary restarted: reads keep answering; only writes wait"),
        Scenario::Partial => say("phase 3: secondary a1 restarted: it lost its routing table and cannot reload it without a primary write; a2 is healthy (the partial incident)"),
        Scenario::Full => say("phase 3: secondaries a1 and a2 restarted: no secondary of shard A can serve versioned reads"),
    }
    tokio::time::sleep(o.phase).await;
    control(
        admin,
        doc! {"simControl": "resumePrimary", "shard": "shardA"},
    )
    .await;
    say("phase 4: shard A's primary resumes: the waiting orders complete, secondaries refresh, breakers close on their probes");
    tokio::time::sleep(o.phase).await;
}

/// Prints what each workload got since the last line, every `every`, until `running` ends.
async fn progress(tallies: &Tallies, every: Duration, running: &AtomicBool, t0: Instant) {
    let mut last: Vec<(u64, u64)> = vec![(0, 0); WORKLOADS.len()];
    let mut errs: Vec<std::collections::BTreeMap<String, u64>> = vec![Default::default(); 3];
    let mut tick = tokio::time::interval(every);
    tick.tick().await;
    while running.load(Ordering::Relaxed) {
        tick.tick().await;
        let Ok(t) = tallies.lock() else { return };
        let mut parts = Vec::new();
        for (k, w) in WORKLOADS.iter().enumerate() {
            let Some(tally) = t.get(&(*w, Path::Staleguard)) else {
                continue;
            };
            let (n, ok) = (tally.requests - last[k].0, tally.ok - last[k].1);
            let mut new_errors: Vec<String> = tally
                .errors
                .iter()
                .filter_map(|(kind, &c)| {
                    let before = errs[k].get(kind).copied().unwrap_or(0);
                    (c > before).then(|| format!("{} {kind}", c - before))
                })
                .collect();
            new_errors.sort();
            let name = match w {
                Workload::Inventory => "inventory",
                Workload::Payments => "payments",
                Workload::Orders => "orders",
            };
            let done = if *w == Workload::Orders {
                "completed"
            } else {
                "answered"
            };
            parts.push(if n == 0 {
                format!("{name}: none finished (waiting)")
            } else if new_errors.is_empty() {
                format!("{name} {ok}/{n} {done}")
            } else {
                format!("{name} {ok}/{n} {done} ({})", new_errors.join(", "))
            });
            last[k] = (tally.requests, tally.ok);
            errs[k] = tally.errors.clone();
        }
        println!(
            "[{:>5.1}s]   clients, last {}: {}",
            t0.elapsed().as_secs_f64(),
            humantime::format_duration(every),
            parts.join(" · ")
        );
    }
}

/// Per phase and workload, the share that answered, and what it means.
fn explain(o: &IncidentOptions, done: &[(Workload, Tally)]) -> String {
    use std::fmt::Write as _;
    let mut out =
        String::from("\nSent in each phase, answered (orders: completed) through staleguard:\n");
    let _ = writeln!(
        out,
        "{:<10} {:>9} {:>9} {:>12} {:>9}",
        "workload", "healthy", "stalled", "restarted", "resumed"
    );
    for (w, t) in done {
        let cells = crate::phase_shares(&t.by_phase[..4]);
        let name = match w {
            Workload::Inventory => "inventory",
            Workload::Payments => "payments",
            Workload::Orders => "orders",
        };
        let _ = writeln!(
            out,
            "{name:<10} {:>9} {:>9} {:>12} {:>9}",
            cells[0], cells[1], cells[2], cells[3]
        );
    }
    out.push('\n');
    out.push_str("Orders sent while the primary was stalled wait until it resumes (no proxy can make a stalled primary write); those given up by the client's own timeout count as not completed.\n");
    match o.scenario {
        Scenario::Stall => out.push_str("Reads answer throughout: no secondary restarted, so every one still has its routing table. The write-stall watch said writes were not completing, and with on_write_stall = \"open_fallback_breakers\" it held the inventory breaker open (its reads went out with readConcern available, answering all the same).\n"),
        Scenario::Partial => out.push_str("After a1 restarted, an inventory read that met a1 was answered again with readConcern available (fallback), so the inventory kept answering. Payments (strict): the first reads that met a1 waited their whole maxTimeMS (MaxTimeMSExpired) until staleguard had seen enough of them to open the breaker; from then on each read went out bounded by open_time_limit and, if it met a1, was sent once more, where mongos often picked the healthy a2: most payments still answered, the rest got staleguard's error at once (\"fail-fast\") instead of hanging.\n"),
        Scenario::Full => out.push_str("With a1 and a2 both restarted, inventory reads answered with readConcern available (possibly with orphans). Payment reads could not be answered by any secondary of shard A: the first ones waited their whole maxTimeMS, then, with the breaker open, they failed fast with a staleguard: error (strict is never relaxed) until the primary resumed.\n"),
    }
    out.push_str("The page keeps the incident: its plots zoom to it, and Recent events lists the breakers and write-stall signals.\n");
    out
}
