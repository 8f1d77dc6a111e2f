//! The write-stall watch against the simulated cluster: each signal (passive, probe,
//! serverStatus composite) rises when shard A's primary stops completing writes and clears
//! when it resumes; idle and normal workloads raise nothing; `open_fallback_breakers` turns
//! inventory reads to `available` before their first StaleConfig. Windows are shortened
//! (stall_after 1 s, probe every 500 ms, composite for 1 s) and the sim has 8 write tickets.
//! Also the `[stall_watch]` config: defaults, errors and redaction.

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bson::{doc, Document};
use mongodb::options::{ReadPreference, SelectionCriteria};
use mongodb::Client;
use staleguard::breaker::State;
use staleguard::config::{Config, StallAction};
use staleguard::server::Running;
use staleguard::sim::{self, SimConfig, SimHandle, TableState};
use staleguard::stall::{Signal, SignalKind};

const STALL_AFTER: Duration = Duration::from_secs(1);
/// The passive signal as these tests watch it: every writer here runs on this machine, so
/// every client has one address (`min_client_addresses = 1`; the rule's default of two is
/// tests/stall_evidence.rs's).
const PASSIVE: &str = "[stall_watch]\nstall_after = \"1s\"\nmin_client_addresses = 1\n";
const PROBE_INTERVAL: Duration = Duration::from_millis(500);

struct Rig {
    sim: SimHandle,
    proxy: Running,
}

impl Rig {
    async fn start(stall_and_namespaces: &str) -> Rig {
        let sim = sim::start(SimConfig {
            listen: "127.0.0.1:0".into(),
            node_ports: true,
            write_tickets: 8,
            refresh_timeout: Duration::from_millis(500),
            find_host_timeout: Duration::from_millis(300),
            ..SimConfig::default()
        })
        .await
        .expect("sim starts");
        let text = format!(
            "listen = \"127.0.0.1:0\"\nupstreams = [\"{}\"]\nhealth_interval = \"off\"\n[admin]\nlisten = \"127.0.0.1:0\"\n{}",
            sim.addr(),
            stall_and_namespaces
                .replace("{a0}", &sim.node_addr("a0").expect("a0").to_string())
                .replace("{b0}", &sim.node_addr("b0").expect("b0").to_string())
        );
        let config = Config::parse(&text, Path::new("<stall test>"))
            .unwrap_or_else(|e| panic!("{e:#?}\n{text}"));
        let proxy = staleguard::server::start(Arc::new(config))
            .await
            .expect("proxy starts");
        Rig { sim, proxy }
    }

    fn upstream(&self) -> String {
        self.sim.addr().to_string()
    }

    async fn client(&self, extra: &str) -> Client {
        let uri = format!(
            "mongodb://{}/?serverSelectionTimeoutMS=5000&maxPoolSize=64{extra}",
            self.proxy.local_addr()
        );
        Client::with_uri_str(uri).await.expect("driver client")
    }

    fn signals(&self) -> Vec<Signal> {
        self.proxy.shared().stall.signals()
    }

    fn raised(&self) -> Vec<Signal> {
        self.signals().into_iter().filter(|s| s.raised).collect()
    }

    fn metrics(&self) -> String {
        self.proxy.shared().metrics.render()
    }

    fn status_json(&self) -> serde_json::Value {
        let s = staleguard::admin::status::collect(&self.proxy.shared().admin(), true);
        serde_json::to_value(&s).expect("status serializes")
    }

    /// The status page as a browser gets it.
    async fn page(&self) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let addr = self.proxy.admin_addr().expect("admin endpoint");
        let mut s = tokio::net::TcpStream::connect(addr).await.expect("admin");
        let req = format!("GET / HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
        s.write_all(req.as_bytes()).await.expect("request");
        let mut out = String::new();
        s.read_to_string(&mut out).await.expect("page");
        out
    }

    async fn stop(self) {
        let _ = self.sim.cluster().resume_primary("shardA");
        self.proxy.shutdown().await;
        self.sim.shutdown().await;
    }
}

/// Inserts into `demo.orders` (unsharded: it lives on shard A) at a fixed rate, each insert
/// in its own task: a stalled write hangs, the next ones are sent anyway.
struct Writer {
    running: Arc<AtomicBool>,
    ok: Arc<AtomicU64>,
}

impl Writer {
    fn start(client: &Client, every: Duration) -> Writer {
        Writer::with_timeout(client, every, None)
    }

    /// Each insert given up (its future dropped, its connection closed) after `give_up`,
    /// like a driver's socket timeout.
    fn with_timeout(client: &Client, every: Duration, give_up: Option<Duration>) -> Writer {
        let running = Arc::new(AtomicBool::new(true));
        let ok = Arc::new(AtomicU64::new(0));
        let coll = client.database("demo").collection::<Document>("orders");
        let (r, n) = (running.clone(), ok.clone());
        tokio::spawn(async move {
            let mut i = 0u64;
            while r.load(Ordering::Relaxed) {
                let (c, n) = (coll.clone(), n.clone());
                i += 1;
                tokio::spawn(async move {
                    let insert = c.insert_one(doc! { "seq": i as i64, "item": "widget" });
                    let done = match give_up {
                        Some(d) => tokio::time::timeout(d, insert).await.ok(),
                        None => Some(insert.await),
                    };
                    if done.is_some_and(|r| r.is_ok()) {
                        n.fetch_add(1, Ordering::Relaxed);
                    }
                });
                tokio::time::sleep(every).await;
            }
        });
        Writer { running, ok }
    }

    fn completed(&self) -> u64 {
        self.ok.load(Ordering::Relaxed)
    }

    fn stop(&self) {
        self.running.store(false, Ordering::Relaxed);
    }
}

/// Polls `cond` every 20 ms until it holds; panics after `limit`. Returns the time taken.
async fn until(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < limit, "timed out after {limit:?}: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    start.elapsed()
}

/// Watches for `d`, failing as soon as any signal is raised.
async fn nothing_raised_for(rig: &Rig, d: Duration, what: &str) {
    let start = Instant::now();
    while start.elapsed() < d {
        let raised = rig.raised();
        assert!(raised.is_empty(), "{what}: raised {raised:#?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn of_kind(rig: &Rig, kind: SignalKind) -> Vec<Signal> {
    rig.signals()
        .into_iter()
        .filter(|s| s.kind == kind)
        .collect()
}

// ---- passive ------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passive_signal_rises_within_stall_after_plus_one_second_and_clears_on_resume() {
    let rig = Rig::start(PASSIVE).await;
    let client = rig.client("").await;
    let writer = Writer::start(&client, Duration::from_millis(50));
    until("writes complete", Duration::from_secs(5), || {
        writer.completed() >= 10
    })
    .await;
    nothing_raised_for(&rig, Duration::from_millis(1500), "healthy writes").await;

    rig.sim.cluster().stall_primary("shardA").expect("stall");
    let took = until("passive signal", Duration::from_secs(5), || {
        !rig.raised().is_empty()
    })
    .await;
    assert!(
        took <= STALL_AFTER + Duration::from_secs(1),
        "raised after {took:?}"
    );
    let s = rig.raised().remove(0);
    assert_eq!(s.kind, SignalKind::Passive);
    assert_eq!(s.target, rig.upstream());
    let e = &s.evidence;
    assert!(e.writes_in_flight.unwrap_or(0) >= 2, "{e:?}");
    assert!(e.connections_waiting.unwrap_or(0) >= 2, "{e:?}");
    assert!(e.oldest_write_seconds.unwrap_or(0.0) >= 1.0, "{e:?}");
    let headline = s.headline().expect("headline while raised");
    assert!(
        headline.starts_with(&format!(
            "writes are not completing through upstream {}",
            rig.upstream()
        )),
        "{headline}"
    );

    // /status and /metrics say the same.
    let st = rig.status_json();
    let w = &st["write_stall"];
    assert_eq!(w["state"], "suspected", "{w:#}");
    assert_eq!(w["action"], "observe");
    assert!(w["headline"]
        .as_str()
        .unwrap_or("")
        .contains("writes are not completing"));
    assert_eq!(w["signals"][0]["signal"], "passive");
    assert!(
        w["signals"][0]["evidence"]["writes_in_flight"]
            .as_u64()
            .unwrap_or(0)
            >= 1
    );
    let m = rig.metrics();
    let up = rig.upstream();
    for line in [
        "staleguard_write_stall_suspected 1".to_string(),
        format!("staleguard_write_stall_signal{{signal=\"passive\",target=\"{up}\"}} 1"),
        "staleguard_write_stall_raised_total{signal=\"passive\"} 1".to_string(),
    ] {
        assert!(m.lines().any(|l| l == line), "missing {line}:\n{m}");
    }
    assert!(m.contains(&format!("staleguard_writes_in_flight{{upstream=\"{up}\"}}")));
    assert!(m.contains(&format!(
        "staleguard_oldest_write_seconds{{upstream=\"{up}\"}}"
    )));
    let page = rig.page().await;
    assert!(
        page.contains(&format!(
            "no write through upstream {up} completes (passive signal:"
        )),
        "{page}"
    );
    assert!(page.contains("id=\"write-stall-signals\""), "{page}");

    let before = writer.completed();
    rig.sim.cluster().resume_primary("shardA").expect("resume");
    until("passive signal clears", Duration::from_secs(2), || {
        rig.raised().is_empty()
    })
    .await;
    assert!(writer.completed() > before, "the waiting writes completed");
    assert_eq!(rig.status_json()["write_stall"]["state"], "clear");
    writer.stop();
    rig.stop().await;
}

/// Clients that give up are not progress (issue 32 item 2): writers whose socket timeout
/// (1.8 s) cuts their writes again and again during one stall leave the signal raised,
/// one raise for the whole stall; once they stop writing it clears `clear_after` later,
/// with nothing completed, and rises again when new writers wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_timing_out_during_one_stall_do_not_make_the_passive_signal_flap() {
    let rig = Rig::start(&format!("{PASSIVE}clear_after = \"2s\"\n")).await;
    let client = rig.client("&retryWrites=false").await;
    let writer = Writer::with_timeout(
        &client,
        Duration::from_millis(100),
        Some(Duration::from_millis(1800)),
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    rig.sim.cluster().stall_primary("shardA").expect("stall");
    until("passive signal", Duration::from_secs(5), || {
        !rig.raised().is_empty()
    })
    .await;
    let since = of_kind(&rig, SignalKind::Passive)[0].since;
    let completed = of_kind(&rig, SignalKind::Passive)[0]
        .evidence
        .writes_completed;
    // Three socket timeouts' worth of writers giving up and new ones waiting.
    let watched = Instant::now();
    while watched.elapsed() < Duration::from_secs(6) {
        let s = of_kind(&rig, SignalKind::Passive).remove(0);
        assert!(s.raised && s.since == since, "kept raised: {s:#?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let s = of_kind(&rig, SignalKind::Passive).remove(0);
    assert!(s.evidence.writes_abandoned.unwrap_or(0) > 0, "{s:#?}");
    let raises = rig.status_json()["events"].as_array().map_or(0, |e| {
        e.iter()
            .filter(|e| e["kind"] == "write_stall_raised")
            .count()
    });
    assert_eq!(raises, 1, "one stall, one raise");
    writer.stop();
    // No writer any more: it clears clear_after after the evidence went, nothing completed.
    until(
        "every waiting write abandoned, the signal clear",
        Duration::from_secs(8),
        || {
            of_kind(&rig, SignalKind::Passive)
                .first()
                .is_some_and(|s| s.evidence.writes_in_flight == Some(0) && !s.raised)
        },
    )
    .await;
    let s = of_kind(&rig, SignalKind::Passive).remove(0);
    assert_eq!(s.evidence.writes_completed, completed, "nothing completed");
    // New writers, still stalled: raised again.
    let writer = Writer::start(&client, Duration::from_millis(100));
    until("raised again", Duration::from_secs(5), || {
        !rig.raised().is_empty()
    })
    .await;
    // One write completing clears it.
    rig.sim.cluster().resume_primary("shardA").expect("resume");
    until(
        "cleared by a completed write",
        Duration::from_secs(2),
        || rig.raised().is_empty(),
    )
    .await;
    writer.stop();
    rig.stop().await;
}

// ---- probe --------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probe_rises_within_two_intervals_and_clears_on_resume() {
    let rig = Rig::start(
        "[stall_watch]\npassive = false\n[stall_watch.probe]\ninterval = \"500ms\"\nslow = \"300ms\"\n",
    )
    .await;
    until("first probe answered", Duration::from_secs(3), || {
        of_kind(&rig, SignalKind::Probe)
            .first()
            .is_some_and(|s| s.evidence.probe_latency_ms.is_some())
    })
    .await;
    nothing_raised_for(&rig, Duration::from_millis(1200), "healthy probes").await;
    let s = of_kind(&rig, SignalKind::Probe).remove(0);
    assert_eq!(s.target, format!("{}/writer-probe", rig.upstream()));
    assert!(s.evidence.probe_latency_ms.unwrap_or(1e9) < 300.0, "{s:#?}");

    rig.sim.cluster().stall_primary("shardA").expect("stall");
    let took = until("probe signal", Duration::from_secs(4), || {
        !rig.raised().is_empty()
    })
    .await;
    // Two intervals, plus a little scheduling slack on a shared machine.
    assert!(
        took <= 2 * PROBE_INTERVAL + Duration::from_millis(150),
        "raised after {took:?}"
    );
    let s = rig.raised().remove(0);
    assert_eq!(s.kind, SignalKind::Probe);
    assert!(s.summary.contains("probe upsert"), "{}", s.summary);
    assert!(
        s.evidence.probe_latency_ms.unwrap_or(0.0) >= 300.0,
        "{s:#?}"
    );

    rig.sim.cluster().resume_primary("shardA").expect("resume");
    until("probe signal clears", 3 * PROBE_INTERVAL, || {
        rig.raised().is_empty()
    })
    .await;
    // The probe document exists where the article puts it.
    let direct = Client::with_uri_str(format!("mongodb://{}/", rig.sim.addr()))
        .await
        .expect("client");
    let d = direct
        .database("ops_probe")
        .collection::<Document>("probe")
        .find_one(doc! { "_id": "writer-probe" })
        .await
        .expect("find");
    assert!(d.is_some_and(|d| d.contains_key("at")));
    rig.stop().await;
}

// ---- composite ----------------------------------------------------------------------

const SHARDS: &str = "[stall_watch.shards]\nuris = [\"mongodb://{a0}/?directConnection=true\", \"mongodb://{b0}/?directConnection=true\"]\npoll = \"200ms\"\nfor = \"1s\"\nbaseline = \"2s\"\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn composite_rises_once_its_window_has_passed_and_clears_on_resume() {
    let rig = Rig::start(&format!("[stall_watch]\npassive = false\n{SHARDS}")).await;
    let client = rig.client("").await;
    let writer = Writer::start(&client, Duration::from_millis(25));
    until("a baseline on shard A", Duration::from_secs(5), || {
        of_kind(&rig, SignalKind::Composite).iter().any(|s| {
            s.place.starts_with("shard A")
                && s.evidence.baseline_ops_per_second.unwrap_or(0.0) > 5.0
        })
    })
    .await;
    nothing_raised_for(&rig, Duration::from_millis(1500), "healthy shards").await;

    rig.sim.cluster().stall_primary("shardA").expect("stall");
    let took = until("composite signal", Duration::from_secs(6), || {
        !rig.raised().is_empty()
    })
    .await;
    assert!(took >= Duration::from_secs(1), "not before `for`: {took:?}");
    let raised = rig.raised();
    assert_eq!(raised.len(), 1, "only shard A: {raised:#?}");
    let s = &raised[0];
    assert_eq!(s.kind, SignalKind::Composite);
    assert!(s.place.starts_with("shard A (shardA at "), "{}", s.place);
    let headline = s.headline().expect("headline");
    assert!(
        headline.starts_with("writes are not completing on shard A"),
        "{headline}"
    );
    let e = &s.evidence;
    assert!(e.tickets_available.unwrap_or(99) <= 2, "{e:?}");
    assert!(e.queued_writers.unwrap_or(0) > 10, "{e:?}");
    let (rate, base) = (
        e.write_ops_per_second.unwrap_or(1e9),
        e.baseline_ops_per_second.unwrap_or(0.0),
    );
    assert!(rate < 0.1 * base, "{e:?}");
    let c = e.conditions.expect("conditions");
    assert!(c.tickets_low == Some(true) && c.writers_queued && c.rate_low);
    let m = rig.metrics();
    for name in [
        "staleguard_shard_write_tickets_available{shard=\"shardA\"}",
        "staleguard_shard_queued_writers{shard=\"shardA\"}",
        "staleguard_shard_write_ops_per_second{shard=\"shardA\"}",
        "staleguard_shard_write_ops_baseline{shard=\"shardA\"}",
        "staleguard_shard_write_latency_seconds{shard=\"shardA\"}",
        "staleguard_shard_write_stall{shard=\"shardA\"} 1",
        "staleguard_shard_write_stall{shard=\"shardB\"} 0",
    ] {
        assert!(m.contains(name), "missing {name}:\n{m}");
    }

    rig.sim.cluster().resume_primary("shardA").expect("resume");
    until("composite clears", Duration::from_secs(2), || {
        rig.raised().is_empty()
    })
    .await;
    writer.stop();
    rig.stop().await;
}

// ---- nothing raised -----------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_and_normal_workloads_raise_nothing() {
    let rig = Rig::start(&format!(
        "[stall_watch]\nstall_after = \"1s\"\nmin_client_addresses = 1\n[stall_watch.probe]\ninterval = \"500ms\"\nslow = \"300ms\"\n{SHARDS}"
    ))
    .await;
    // Idle: no traffic but the probe's.
    nothing_raised_for(&rig, Duration::from_secs(2), "idle").await;
    // A normal write workload, then quiet again (low night traffic).
    let client = rig.client("").await;
    let writer = Writer::start(&client, Duration::from_millis(20));
    nothing_raised_for(&rig, Duration::from_secs(3), "normal writes").await;
    assert!(writer.completed() > 50, "{}", writer.completed());
    writer.stop();
    nothing_raised_for(&rig, Duration::from_secs(2), "quiet after writes").await;
    let kinds: Vec<SignalKind> = rig.signals().iter().map(|s| s.kind).collect();
    for k in [
        SignalKind::Passive,
        SignalKind::Probe,
        SignalKind::Composite,
    ] {
        assert!(kinds.contains(&k), "{k:?} watched: {kinds:?}");
    }
    assert_eq!(rig.status_json()["write_stall"]["state"], "clear");
    rig.stop().await;
}

// ---- the action ---------------------------------------------------------------------

const INVENTORY: &str = "demo.store_inventory";

fn inventory_reader(client: &Client) -> mongodb::Collection<Document> {
    client
        .database("demo")
        .collection::<Document>("store_inventory")
}

async fn read_inventory(coll: &mongodb::Collection<Document>, store: i32) -> usize {
    let mut n = 0;
    let mut cur = coll
        .find(doc! { "_id.storeId": store })
        .selection_criteria(SelectionCriteria::ReadPreference(
            ReadPreference::SecondaryPreferred {
                options: Default::default(),
            },
        ))
        .max_time(Duration::from_secs(2))
        .await
        .expect("inventory read");
    while cur.advance().await.expect("next batch") {
        n += 1;
    }
    n
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_fallback_breakers_turns_inventory_reads_available_before_their_first_stale_config() {
    let rig = Rig::start(
        "[stall_watch]\nstall_after = \"1s\"\nmin_client_addresses = 1\non_write_stall = \"open_fallback_breakers\"\n\
         [defaults]\ncooldown = \"1s\"\n\
         [[namespaces]]\npattern = \"demo.store_inventory\"\nmode = \"fallback\"\n\
         [[namespaces]]\npattern = \"pay.*\"\nmode = \"strict\"\n",
    )
    .await;
    let shared = rig.proxy.shared().clone();
    let client = rig.client("").await;
    let inv = inventory_reader(&client);
    assert!(read_inventory(&inv, 3).await >= 100, "warm-up read");
    assert!(shared.breakers.is_empty(), "no breaker before any error");

    let writer = Writer::start(&client, Duration::from_millis(50));
    tokio::time::sleep(Duration::from_millis(300)).await;
    rig.sim.cluster().stall_primary("shardA").expect("stall");
    until(
        "signal raised and the inventory breaker held",
        Duration::from_secs(5),
        || shared.breakers.is_held(INVENTORY),
    )
    .await;
    assert_eq!(shared.breakers.state(INVENTORY), State::Open);
    assert!(
        shared.breakers.snapshot().iter().all(|b| b.ns == INVENTORY),
        "strict namespaces untouched"
    );
    let st = rig.status_json();
    assert_eq!(st["write_stall"]["held_breakers"][0], INVENTORY, "{st:#}");
    let row = st["namespaces"]
        .as_array()
        .and_then(|r| r.iter().find(|n| n["namespace"] == INVENTORY))
        .cloned()
        .expect("inventory row");
    assert_eq!(row["breaker"], "open");
    assert_eq!(row["held_by_write_stall"], true);
    assert!(
        row["reason"]
            .as_str()
            .unwrap_or("")
            .contains("writes are not completing"),
        "{row:#}"
    );

    // Now the reflex the articles warn about: restart both secondaries of shard A.
    let stale_before = rig.sim.cluster().status().mongos.stale_config_errors;
    for node in ["a1", "a2"] {
        rig.sim.cluster().restart_node(node).expect("restart");
    }
    for store in 1..=10 {
        assert!(read_inventory(&inv, store).await >= 100, "store {store}");
    }
    // No StaleConfig anywhere: not through the proxy ...
    assert_eq!(shared.metrics.trigger_errors_total(INVENTORY), 0);
    let m = rig.metrics();
    assert!(
        m.contains(
            "staleguard_rewrites_total{namespace=\"demo.store_inventory\",kind=\"preemptive\"}"
        ),
        "{m}"
    );
    assert!(
        !m.contains("staleguard_trigger_errors_total{namespace=\"demo.store_inventory\""),
        "{m}"
    );
    // ... and not at mongos: the reads went out `available`, so the restarted secondaries
    // never needed their routing table (nor tried to refresh it).
    let status = rig.sim.cluster().status();
    assert_eq!(status.mongos.stale_config_errors, stale_before);
    for node in ["a1", "a2"] {
        let t = status.node(node).and_then(|n| n.table(INVENTORY)).cloned();
        if let Some(t) = t {
            assert_eq!(t.state, TableState::Unknown, "{node}: {t:?}");
            assert_eq!(
                t.refresh.failures, 0,
                "{node} never tried to refresh: {t:?}"
            );
        }
    }
    // Payments are strict: the action never touches them, their reads are not relaxed.
    assert_eq!(shared.breakers.state("pay.transactions"), State::Closed);

    // Resume: the signal clears, the breaker is released into its cooldown and closes
    // through its half-open probe (it is never force-closed).
    rig.sim.cluster().resume_primary("shardA").expect("resume");
    until("released", Duration::from_secs(3), || {
        !shared.breakers.is_held(INVENTORY)
    })
    .await;
    assert_eq!(
        shared.breakers.state(INVENTORY),
        State::Open,
        "not force-closed"
    );
    let deadline = Instant::now() + Duration::from_secs(8);
    while shared.breakers.state(INVENTORY) != State::Closed {
        assert!(Instant::now() < deadline, "closed by its probe");
        read_inventory(&inv, 1).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    writer.stop();
    rig.stop().await;
}

/// A `db.*` pattern has no exact namespace until it is read: its namespaces are held as
/// they are first read while the stall lasts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wildcard_fallback_namespaces_are_held_as_they_are_first_read() {
    let rig = Rig::start(
        "[stall_watch]\nstall_after = \"1s\"\nmin_client_addresses = 1\non_write_stall = \"open_fallback_breakers\"\n\
         [[namespaces]]\npattern = \"demo.*\"\nmode = \"fallback\"\n",
    )
    .await;
    let shared = rig.proxy.shared().clone();
    let client = rig.client("").await;
    let writer = Writer::start(&client, Duration::from_millis(50));
    tokio::time::sleep(Duration::from_millis(300)).await;
    rig.sim.cluster().stall_primary("shardA").expect("stall");
    until("signal raised", Duration::from_secs(5), || {
        shared.stall.holding()
    })
    .await;
    assert!(shared.breakers.is_empty(), "nothing to hold before a read");
    read_inventory(&inventory_reader(&client), 2).await;
    assert!(shared.breakers.is_held(INVENTORY));
    rig.sim.cluster().resume_primary("shardA").expect("resume");
    until("released", Duration::from_secs(3), || {
        !shared.breakers.is_held(INVENTORY)
    })
    .await;
    writer.stop();
    rig.stop().await;
}

// ---- config -------------------------------------------------------------------------

fn parse(text: &str) -> Result<Config, Vec<staleguard::config::ConfigError>> {
    Config::parse(text, Path::new("staleguard.toml"))
}

fn errors(text: &str) -> Vec<String> {
    match parse(text) {
        Ok(_) => panic!("expected errors:\n{text}"),
        Err(e) => e.iter().map(|e| e.to_string()).collect(),
    }
}

#[test]
fn stall_watch_defaults() {
    let c = parse("").expect("empty file");
    let s = &c.stall;
    assert!(s.passive, "the passive watch is on in a file");
    assert_eq!(s.stall_after, Duration::from_secs(5));
    assert_eq!(s.min_in_flight, 1);
    assert_eq!(
        s.min_client_addresses, 2,
        "two clients, not two connections"
    );
    assert_eq!(s.clear_after(), Duration::from_secs(15), "3 x stall_after");
    let c = parse("[stall_watch]\nstall_after = \"2s\"\n").expect("valid");
    assert_eq!(c.stall.clear_after(), Duration::from_secs(6));
    let c =
        parse("[stall_watch]\nclear_after = \"0s\"\nmin_client_addresses = 1\n").expect("valid");
    assert_eq!(
        (c.stall.clear_after(), c.stall.min_client_addresses),
        (Duration::ZERO, 1)
    );
    assert_eq!(s.on_write_stall, StallAction::Observe);
    assert!(s.probe.is_none() && s.shards.is_none());
    assert!(!Config::for_upstreams("127.0.0.1:0", vec!["m:1".into()])
        .stall
        .enabled());

    let c = parse("[stall_watch.probe]\n[stall_watch.shards]\nuris = [\"mongodb://h:1/?directConnection=true\"]\n")
        .expect("valid");
    let p = c.stall.probe.expect("probe");
    assert_eq!(
        (p.interval, p.slow, p.timeout),
        (
            Duration::from_secs(30),
            Duration::from_secs(2),
            Duration::from_secs(10)
        )
    );
    assert_eq!(
        (p.db.as_str(), p.collection.as_str()),
        ("ops_probe", "probe")
    );
    assert_eq!(p.ids, ["writer-probe"]);
    let sh = c.stall.shards.expect("shards");
    assert_eq!(
        (sh.poll, sh.hold_for),
        (Duration::from_secs(10), Duration::from_secs(120))
    );
    assert_eq!((sh.tickets_available_max, sh.queued_writers_min), (2, 10));
    assert_eq!(sh.rate_ratio, 0.1);
    assert_eq!(sh.server_version_7_plus, None);
    // A short interval shortens the default timeout with it.
    let c = parse("[stall_watch.probe]\ninterval = \"500ms\"\nslow = \"300ms\"\n").expect("valid");
    assert_eq!(
        c.stall.probe.expect("probe").timeout,
        Duration::from_millis(500)
    );
}

#[test]
fn stall_watch_errors_name_line_and_key() {
    let e = errors(
        "[stall_watch]\nstall_after = \"soon\"\nmin_in_flight = 0\non_write_stall = \"panic\"\n",
    );
    assert_eq!(e.len(), 3, "{e:#?}");
    assert!(
        e[0].starts_with("staleguard.toml:2: stall_watch.stall_after:"),
        "{e:#?}"
    );
    assert!(
        e[1].starts_with("staleguard.toml:3: stall_watch.min_in_flight:"),
        "{e:#?}"
    );
    assert!(
        e[2].starts_with("staleguard.toml:4: stall_watch.on_write_stall: unknown value"),
        "{e:#?}"
    );

    let e = errors("[stall_watch]\nmin_client_addresses = 0\nclear_after = \"later\"\n");
    assert_eq!(e.len(), 2, "{e:#?}");
    assert!(
        e[0].starts_with(
            "staleguard.toml:2: stall_watch.min_client_addresses: 0 is out of range 1..=1000"
        ),
        "{e:#?}"
    );
    assert!(
        e[1].starts_with("staleguard.toml:3: stall_watch.clear_after: invalid duration"),
        "{e:#?}"
    );
    let e = errors("[stall_watch]\npassive = false\nclear_after = \"2s\"\n");
    assert!(
        e[0].contains("stall_watch.clear_after: has no effect: passive = false"),
        "{e:#?}"
    );

    let e = errors("[stall_watch]\npassive = false\nstall_after = \"2s\"\n");
    assert!(
        e[0].contains("stall_watch.stall_after: has no effect: passive = false"),
        "{e:#?}"
    );

    let e = errors("[stall_watch]\npassive = false\non_write_stall = \"open_fallback_breakers\"\n[[namespaces]]\npattern = \"a.b\"\nmode = \"fallback\"\n");
    assert!(
        e[0].contains("3: stall_watch.on_write_stall: has no effect: every signal is off"),
        "{e:#?}"
    );
    let e = errors("[stall_watch]\non_write_stall = \"open_fallback_breakers\"\n");
    assert!(
        e[0].contains("no [[namespaces]] entry has mode fallback"),
        "{e:#?}"
    );

    let e = errors("[stall_watch.probe]\ninterval = \"1s\"\ntimeout = \"2s\"\n");
    assert!(
        e[0].starts_with("staleguard.toml:3: stall_watch.probe.timeout:"),
        "{e:#?}"
    );
    let e = errors("[stall_watch.probe]\nslow = \"10s\"\n");
    assert!(
        e[0].starts_with("staleguard.toml:2: stall_watch.probe.slow: slow 10s is not below"),
        "{e:#?}"
    );
    let e = errors("[stall_watch.probe]\nnamespace = \"nodot\"\nids = [\"a\", \"a\"]\n");
    assert!(e[0].contains("stall_watch.probe.namespace"), "{e:#?}");
    assert!(
        e[1].contains("stall_watch.probe.ids[1]: `a` is listed twice"),
        "{e:#?}"
    );
    let e = errors("[stall_watch.probe]\npassword = \"x\"\n");
    assert!(
        e[0].contains("stall_watch.probe.password: has no effect without `username`"),
        "{e:#?}"
    );
    let e = errors("[stall_watch.probe]\nusername = \"probe\"\npassword_env = \"STALEGUARD_TEST_SURELY_UNSET\"\n");
    assert!(
        e[0].contains("environment variable `STALEGUARD_TEST_SURELY_UNSET` is not set"),
        "{e:#?}"
    );
    let e = errors("[stall_watch.probe]\nretries = 3\n");
    assert!(
        e[0].contains("stall_watch.probe.retries") || e[0].contains("unknown field"),
        "{e:#?}"
    );

    let e = errors("[stall_watch.shards]\nuris = [\"mongodb://u:secret@h:1/\", \"h:2\", \"mongodb+srv://x\"]\n");
    assert_eq!(e.len(), 3, "{e:#?}");
    assert!(
        e[0].contains("stall_watch.shards.uris[0]: must not carry credentials"),
        "{e:#?}"
    );
    assert!(
        !e.iter().any(|m| m.contains("secret")),
        "the password is not echoed: {e:#?}"
    );
    assert!(e[1].contains("uris[1]"), "{e:#?}");
    assert!(
        e[2].contains("uris[2]: `mongodb+srv://` is not supported"),
        "{e:#?}"
    );
    let e = errors("[stall_watch.shards]\nuris = [\"mongodb://h:1\"]\nserver_version_7_plus = true\ntickets_available_max = 1\nrate_ratio = 1.5\nfor = \"1s\"\n");
    assert!(
        e.iter()
            .any(|m| m.contains("5: stall_watch.shards.rate_ratio")),
        "{e:#?}"
    );
    assert!(
        e.iter()
            .any(|m| m.contains("4: stall_watch.shards.tickets_available_max: has no effect")),
        "{e:#?}"
    );
    assert!(
        e.iter()
            .any(|m| m.contains("6: stall_watch.shards.for: for 1s is shorter than poll 10s")),
        "{e:#?}"
    );
}

#[test]
fn passwords_are_never_printed() {
    std::env::set_var("STALEGUARD_TEST_PROBE_PASSWORD", "from-the-env-123");
    let c = parse(
        "[stall_watch.probe]\nusername = \"probe\"\npassword = \"hunter2-in-file\"\n\
         [stall_watch.shards]\nuris = [\"mongodb://h:1/?directConnection=true\"]\n\
         username = \"monitor\"\npassword_env = \"STALEGUARD_TEST_PROBE_PASSWORD\"\nauth_source = \"ops\"\n",
    )
    .expect("valid");
    let probe = c.stall.probe.clone().expect("probe");
    let creds = probe.credentials.clone().expect("credentials");
    assert_eq!(creds.password.expose(), "hunter2-in-file");
    assert_eq!(creds.auth_source, "admin");
    let shard_creds = c
        .stall
        .shards
        .clone()
        .and_then(|s| s.credentials)
        .expect("credentials");
    assert_eq!(shard_creds.password.expose(), "from-the-env-123");
    assert_eq!(shard_creds.auth_source, "ops");
    let debug = format!("{c:?}");
    assert!(
        !debug.contains("hunter2") && !debug.contains("from-the-env"),
        "{debug}"
    );
    assert!(debug.contains("<redacted>"));
    let table = staleguard::config::render_table(&c);
    assert!(
        !table.contains("hunter2") && table.contains("as probe"),
        "{table}"
    );
}

#[test]
fn shipped_config_documents_the_stall_watch() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/staleguard.toml");
    let text = std::fs::read_to_string(&path).expect("shipped config");
    for key in [
        "[stall_watch]",
        "stall_after",
        "min_in_flight",
        "on_write_stall",
        "[stall_watch.probe]",
        "password_env",
        "[stall_watch.shards]",
        "server_version_7_plus",
    ] {
        assert!(text.contains(key), "config/staleguard.toml lacks {key}");
    }
    let c = Config::load(&path).expect("shipped config parses");
    assert!(c.stall.passive);
}
