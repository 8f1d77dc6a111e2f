//! The chaos-clients harness (issue 29): honest paced readers through the official driver,
//! straight to the simulated mongos and through staleguard on the same schedule, beside odd
//! and hostile clients on raw sockets through staleguard; a healthy phase, then a partial
//! and a full incident (in the seed's order), each healed while the attackers keep going.
//! The invariants are judged from outside staleguard: the readers' outcomes, the simulated
//! cluster's read log and staleguard's admin endpoint.
//!
//! ```text
//! plan     the seed's decisions, the environment's knobs
//! bed      the simulated cluster and the proxy; incidents and heals
//! honest   Rust driver readers on both paths   attackers, abuse   raw-socket clients
//! py       pymongo readers on both paths       raw                wire and SCRAM by hand
//! watch    /metrics every 100 ms, /status events
//! judge    invariants (a), (b), (c)            report   figures and verdicts, printed
//! ```
//!
//! Shared by `tests/chaos.rs` (the short run in `cargo test`) and `benches/chaos` (the long
//! one).

mod abuse;
mod attackers;
mod bed;
mod honest;
mod judge;
pub mod plan;
mod py;
mod raw;
mod report;
mod rng;
mod watch;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mongodb::bson::doc;
use tokio::time::Instant;

use bed::Bed;
use honest::Kind;
use judge::{Phase, Seen, Timeline};
pub use plan::Options;
use plan::{Behaviour, Plan};
pub use report::Report;
use rng::Rng;

/// The honest kinds of a plan: how many readers each, and their pace.
fn kinds(plan: &Plan) -> Vec<(Kind, usize, Duration)> {
    let every = Duration::from_secs(1) / plan.rate.max(1);
    let mut k = vec![
        (Kind::Strict, plan.readers, every),
        (Kind::StrictB, 1, every),
        (Kind::Fallback, plan.readers, every),
    ];
    // Two readers each, so that the healthy window holds several of these long reads.
    if plan.has(Behaviour::SlowReads) {
        k.push((Kind::SlowStrict, 2, Duration::from_millis(1500)));
        k.push((Kind::SlowFallback, 2, Duration::from_millis(1500)));
    }
    if plan.has(Behaviour::Views) {
        k.push((Kind::View, 2, Duration::from_millis(2500)));
    }
    if plan.has(Behaviour::PreferredTags) {
        k.push((Kind::PreferredTags, 2, Duration::from_millis(500)));
    }
    if plan.has(Behaviour::PinnedReads) {
        k.push((Kind::Pinned, 2, Duration::from_millis(500)));
    }
    if plan.has(Behaviour::Pymongo) {
        k.push((Kind::PyStrict, 1, every));
    }
    k
}

/// An `_id` of `pay.transactions` on shard B (mongos's `explain` says where), from the seed.
async fn id_on_shard_b(bed: &Bed, rng: &mut Rng) -> i32 {
    let c = honest::client(&bed.uri(bed.mongos)).await;
    let pay = c.database("pay");
    let mut on_b = Vec::new();
    for id in 1..=40 {
        let plan = pay
            .run_command(doc! { "explain": { "find": "transactions", "filter": { "_id": id } } })
            .await
            .expect("explain");
        let shards = plan
            .get_document("queryPlanner")
            .and_then(|q| q.get_document("winningPlan"))
            .and_then(|w| w.get_array("shards"))
            .expect("shards");
        let names: Vec<&str> = shards
            .iter()
            .filter_map(|s| s.as_document()?.get_str("shardName").ok())
            .collect();
        if names == ["shardB"] {
            on_b.push(id);
        }
    }
    *rng.pick(&on_b)
}

/// Runs the plan once and judges it.
pub async fn run(opts: Options) -> Report {
    let plan = Plan::new(opts);
    println!("{}", report::seed_line(&plan));
    println!("plan: {}", plan.describe());
    let bed = Bed::start(&plan).await;
    let mut rng = plan.rng.clone();
    let id_b = id_on_shard_b(&bed, &mut rng).await;
    let kinds = kinds(&plan);
    let readers = honest::schedules(&kinds, &mut rng, id_b, plan.healthy_node());
    let python = match plan.has(Behaviour::Pymongo) {
        true => Some(py::python().await),
        false => None,
    };
    let mut clients = Vec::new();
    let mut py_readers = Vec::new();
    for r in readers {
        let addr = match r.via {
            honest::Via::Direct => bed.mongos,
            honest::Via::Staleguard => bed.guarded,
        };
        if r.kind == Kind::PyStrict {
            py_readers.push((bed.uri(addr), r));
        } else {
            clients.push((honest::client(&bed.uri(addr)).await, r));
        }
    }

    let t0 = Instant::now();
    let t0_unix_ms = report::unix_ms();
    let stop = t0 + plan.total();
    let reads = Arc::new(Mutex::new(Vec::new()));
    let scrapes = Arc::new(Mutex::new(Vec::new()));
    let tally = Arc::new(Mutex::new(BTreeMap::new()));
    let mut tasks = Vec::new();
    for (c, r) in clients {
        tasks.push(tokio::spawn(honest::run(c, r, t0, stop, reads.clone())));
    }
    let stop_unix_ms = t0_unix_ms + plan.total().as_millis() as u64;
    for (uri, r) in py_readers {
        let python = python
            .clone()
            .expect("the venv is made when pymongo readers run");
        let job = py::run(python, uri, r, t0_unix_ms, stop_unix_ms, reads.clone());
        tasks.push(tokio::spawn(job));
    }
    let env = attackers::Env {
        addr: bed.guarded,
        auth: plan.opts.auth,
        stop,
        tally: tally.clone(),
    };
    for task in plan.tasks.clone() {
        tasks.push(tokio::spawn(attackers::run(task, env.clone())));
    }
    let poller = tokio::spawn(watch::poll(bed.admin, t0, stop, scrapes.clone()));

    let o = &plan.opts;
    let since = |d: Duration| t0 + d;
    let mut at = o.warmup + o.healthy;
    let mut phases = Vec::new();
    for &incident in &plan.incidents {
        tokio::time::sleep_until(since(at)).await;
        bed.inject(incident, plan.partial_node);
        let start = t0.elapsed();
        tokio::time::sleep_until(since(at + o.incident)).await;
        bed.heal();
        let heal = t0.elapsed();
        at += o.incident + o.after;
        phases.push(Phase {
            incident,
            start,
            heal,
            end: at,
        });
    }
    tokio::time::sleep_until(stop).await;
    let _ = poller.await;
    let events = watch::events(bed.admin).await;
    // Readers give up within 8 s; an attacker may be in the middle of a long read.
    let deadline = Instant::now() + Duration::from_secs(12);
    for t in tasks {
        if tokio::time::timeout_at(deadline, t).await.is_err() {
            println!("chaos: a client task was still running at the end; left behind");
        }
    }
    let mut log = bed.sim.cluster().take_read_log();
    // Only the honest reads' attempts are kept (theirs carry a comment `h/...`).
    log.retain(|r| r.comment.starts_with("h/"));
    let timeline = Timeline {
        warm_end: o.warmup,
        healthy_end: o.warmup + o.healthy,
        phases,
    };
    let reads = std::mem::take(&mut *reads.lock().expect("reads"));
    let scrapes = std::mem::take(&mut *scrapes.lock().expect("scrapes"));
    let judged: Vec<Kind> = kinds.iter().map(|k| k.0).collect();
    let checks = judge::all(
        &Seen {
            reads: &reads,
            log: &log,
            scrapes: &scrapes,
        },
        &timeline,
        &judged,
    );
    let tally = std::mem::take(&mut *tally.lock().expect("tally"));
    let lags = bed.lags.clone();
    bed.stop().await;
    Report {
        plan,
        timeline,
        reads,
        kinds: judged,
        checks,
        events,
        t0_unix_ms,
        t0,
        log,
        tally,
        lags,
    }
}
