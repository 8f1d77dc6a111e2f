//! The read policy against the simulated sharded cluster (`crates/sim`) instead of the scripted
//! fake: the errors come from the incident's own model (shard A's primary stalls, secondary
//! a1 restarts and cannot reload its routing table, mongos retries StaleConfig, `available`
//! skips the version check and the orphan filter).
//!
//! driver → front tap (what the driver sent) → staleguard → back tap (what reached mongos) →
//! the simulator's mongos. `tests/policy.rs` keeps the exact, byte-level checks; these tests
//! show the same behaviours end to end on the model, with short time limits (a refused read
//! costs `REFUSAL`, about 600 ms).
//!
//! Reads are pinned to nodes with `$readPreference: {mode: "secondary", tags: [...]}` sent in
//! a `run_command`: the Rust driver sends tag sets as `tagSets`, which mongos ignores.

use crate::policy_support;
use crate::support;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bson::{doc, rawdoc, Bson, Document, RawDocumentBuf};
use futures::TryStreamExt;
use mongodb::error::Error;
use mongodb::options::{CollectionOptions, ReadPreference, SelectionCriteria};
use mongodb::{Client, ClientSession, Collection};
use staleguard::breaker::State;
use staleguard::config::Config;
use staleguard::server::Running;
use staleguard::sim::{self, Cluster, MoveReport, SimConfig, SimHandle, TableState, TableStatus};

use policy_support::{
    available, body, command_error, command_name, is_confirm, level, max_time_ms, read_concern,
    select, try_body, with_pass_budget,
};
use support::py::run_check;
use support::tap::Tap;
use support::within;

const INVENTORY: &str = "demo.store_inventory";
const PAYMENTS: &str = "pay.transactions";
/// The documents the simulator preloads.
const INVENTORY_DOCS: usize = 2000;
const PAYMENT_DOCS: usize = 300;
/// How long a secondary waits for its stalled primary to persist a refresh.
const REFRESH_TIMEOUT: Duration = Duration::from_millis(300);
/// mongos's own StaleConfig retries: 2 attempts per read.
const STALE_RETRIES: u32 = 1;
/// How long a read that shard A refuses takes: one refresh timeout per mongos attempt.
const REFUSAL: Duration =
    Duration::from_millis(REFRESH_TIMEOUT.as_millis() as u64 * (STALE_RETRIES as u64 + 1));
/// The payment service's time limit in the tests that use one: below the refresh timeout, so
/// the sim answers MaxTimeMSExpired (50) instead of StaleConfig.
const PAYMENT_MAX_TIME_MS: i64 = 250;
/// How fast a fail-fast reply must arrive (the fastest of `FAIL_FAST_READS`; every one of
/// them must beat `SOONEST_REFUSAL`, the quickest the sim refuses a read in these tests).
const FAST: Duration = Duration::from_millis(50);
const FAIL_FAST_READS: usize = 3;
const SOONEST_REFUSAL: Duration = Duration::from_millis(PAYMENT_MAX_TIME_MS as u64);

/// `fallback` for the inventory, `strict` for `pay.*`, with the same breaker settings. One
/// driver client (one connection) reads in these tests, counting each error as it comes:
/// `min_connections = 1`, `per_connection` at its largest, `min_wait = "0s"` (the evidence
/// rules are tested in `tests/limits.rs` and `tests/evidence.rs`). Strict reads fail fast
/// while the breaker is open (`on_open = "refuse"`); the bound mode is measured against
/// the sim in `tests/partial.rs`.
fn namespaces(threshold: u32, cooldown: &str) -> String {
    format!(
        r#"
[defaults]
min_connections = 1
per_connection = 1000
min_wait = "0s"

[[namespaces]]
pattern = "demo.store_inventory"
mode = "fallback"
threshold = {threshold}
window = "10s"
cooldown = "{cooldown}"

[[namespaces]]
pattern = "pay.*"
mode = "strict"
on_open = "refuse"
threshold = {threshold}
window = "10s"
cooldown = "{cooldown}"
"#
    )
}

// ---------------------------------------------------------------------------------------
// The environment

/// The simulated cluster with staleguard in front of it.
struct SimEnv {
    sim: SimHandle,
    /// Between staleguard and the sim's mongos: what reached "mongos".
    back: Tap,
    proxy: Running,
    /// Between the driver and staleguard: what the driver sent.
    front: Tap,
}

impl SimEnv {
    /// The decision-table tests: the first attempt keeps the client's whole budget.
    async fn start(namespaces: &str) -> SimEnv {
        SimEnv::start_with(&with_pass_budget(namespaces), REFRESH_TIMEOUT).await
    }

    /// `config` as given (default budget split), the sim with `refresh_timeout`.
    async fn start_with(config: &str, refresh_timeout: Duration) -> SimEnv {
        let namespaces = config;
        let sim = sim::start(SimConfig {
            listen: "127.0.0.1:0".into(),
            refresh_timeout,
            stale_retries: STALE_RETRIES,
            find_host_timeout: Duration::from_millis(200),
            seed: 7,
            ..SimConfig::default()
        })
        .await
        .expect("sim starts");
        let back = Tap::start(sim.addr()).await;
        let text = format!(
            "listen = \"127.0.0.1:0\"\nupstreams = [\"{}\"]\nshutdown_timeout = \"0s\"\n\
             health_interval = \"off\"\n\n[admin]\nenabled = false\n{namespaces}",
            back.addr()
        );
        let config = match Config::parse(&text, Path::new("policy-sim-test.toml")) {
            Ok(c) => Arc::new(c),
            Err(errors) => panic!("test config rejected: {errors:?}\n{text}"),
        };
        let proxy = staleguard::server::start(config)
            .await
            .expect("start staleguard");
        let front = Tap::start(proxy.local_addr()).await;
        SimEnv {
            sim,
            back,
            proxy,
            front,
        }
    }

    /// A driver client through staleguard.
    async fn guarded(&self) -> Client {
        client(&self.front.addr().to_string()).await
    }

    /// A driver client straight to the sim's mongos.
    async fn direct(&self) -> Client {
        client(&self.sim.addr().to_string()).await
    }

    /// A URI for staleguard (through the front tap) and one for the sim.
    fn uris(&self) -> (String, String) {
        (
            format!("mongodb://{}/", self.front.addr()),
            format!("mongodb://{}/", self.sim.addr()),
        )
    }

    fn cluster(&self) -> Arc<Cluster> {
        self.sim.cluster()
    }

    /// Shard A's primary stalls (answers hello and reads, finishes no write), then `nodes`
    /// restart and lose their routing tables.
    fn incident(&self, nodes: &[&str]) {
        let cluster = self.cluster();
        cluster.stall_primary("shardA").expect("stall shard A");
        for node in nodes {
            let lost = cluster.restart_node(node).expect("restart");
            println!("{node} restarted, lost tables: {lost:?}");
            for ns in [INVENTORY, PAYMENTS] {
                assert_eq!(
                    self.table(node, ns).state,
                    TableState::Unknown,
                    "{node} {ns}"
                );
            }
        }
    }

    fn state(&self, ns: &str) -> State {
        self.proxy.shared().breakers.state(ns)
    }

    /// Trigger errors the breaker of `ns` holds in its window (0 when it has no breaker).
    fn errors(&self, ns: &str) -> usize {
        self.proxy
            .shared()
            .breakers
            .snapshot()
            .into_iter()
            .find(|s| s.ns == ns)
            .map_or(0, |s| s.errors_in_window)
    }

    /// Bodies of the `name` commands on `ns` that reached the sim's mongos through staleguard.
    /// (staleguard's own confirming reads left out: see [`SimEnv::confirms`]).
    fn upstream(&self, name: &str, ns: &str) -> Vec<RawDocumentBuf> {
        let all = bodies(self.back.to_server(), name, ns);
        all.into_iter().filter(|b| !is_confirm(b)).collect()
    }

    /// The confirming reads staleguard sent on `ns` after time-limit errors.
    fn confirms(&self, ns: &str) -> Vec<RawDocumentBuf> {
        let all = bodies(self.back.to_server(), "find", ns);
        all.into_iter().filter(|b| is_confirm(b)).collect()
    }

    /// Bodies of the `name` commands on `ns` the driver sent to staleguard.
    fn sent_by_driver(&self, name: &str, ns: &str) -> Vec<RawDocumentBuf> {
        bodies(self.front.to_server(), name, ns)
    }

    /// Messages that reached the sim through staleguard, other than the drivers' `hello`s.
    fn upstream_count(&self) -> usize {
        self.back
            .to_server()
            .iter()
            .filter(|m| {
                !try_body(m)
                    .is_some_and(|b| matches!(command_name(&b), "hello" | "isMaster" | "ismaster"))
            })
            .count()
    }

    /// A node's routing table for `ns`, as the sim reports it.
    fn table(&self, node: &str, ns: &str) -> TableStatus {
        let status = self.cluster().status();
        let n = status.node(node).expect("node exists");
        n.table(ns).expect("table listed").clone()
    }

    /// mongos's StaleConfig count (one per attempt a shard refused).
    fn stale_config_errors(&self) -> u64 {
        self.cluster().status().mongos.stale_config_errors
    }

    async fn shutdown(self) {
        self.proxy.shutdown().await;
        self.sim.shutdown().await;
    }
}

async fn client(host: &str) -> Client {
    let uri = format!("mongodb://{host}/?serverSelectionTimeoutMS=5000&connectTimeoutMS=5000");
    Client::with_uri_str(uri).await.expect("driver client")
}

fn bodies(msgs: Vec<bytes::Bytes>, name: &str, ns: &str) -> Vec<RawDocumentBuf> {
    let (db, coll) = ns.split_once('.').expect("db.coll");
    select(msgs, name, coll)
        .iter()
        .map(|m| body(m))
        .filter(|b| b.get_str("$db").ok() == Some(db))
        .collect()
}

// ---------------------------------------------------------------------------------------
// Reads

/// `$readPreference: secondary` with tag sets `[{node: a}, {node: b}]`: node `a` serves shard
/// A's part of the read, node `b` shard B's (a tag set matching no member of a shard falls
/// through to the next one).
fn pinned(a: &str, b: &str) -> Document {
    doc! { "mode": "secondary", "tags": [{ "node": a }, { "node": b }] }
}

/// A `find` on `ns` with `$readPreference` `rp`, every document in one batch; `extra` adds
/// fields (`maxTimeMS`, `readConcern`).
async fn find_with(
    c: &Client,
    ns: &str,
    filter: Document,
    rp: Document,
    extra: Document,
) -> Result<Vec<Document>, Error> {
    let (db, coll) = ns.split_once('.').expect("db.coll");
    let mut cmd = doc! { "find": coll, "filter": filter, "batchSize": 5000 };
    if !rp.is_empty() {
        cmd.insert("$readPreference", rp);
    }
    cmd.extend(extra);
    let reply = within("find", c.database(db).run_command(cmd)).await?;
    let cursor = reply.get_document("cursor").expect("cursor");
    assert_eq!(cursor.get_i64("id").ok(), Some(0), "one batch");
    Ok(cursor
        .get_array("firstBatch")
        .expect("firstBatch")
        .iter()
        .map(|d| d.as_document().expect("a document").clone())
        .collect())
}

/// A scatter read pinned to `node` on shard A (and b1, healthy throughout, on shard B).
async fn find_on(
    c: &Client,
    ns: &str,
    filter: Document,
    node: &str,
    extra: Document,
) -> Result<Vec<Document>, Error> {
    find_with(c, ns, filter, pinned(node, "b1"), extra).await
}

/// Runs `fut` and returns its output and how long it took.
async fn timed<T>(fut: impl std::future::Future<Output = T>) -> (T, Duration) {
    let started = Instant::now();
    let out = fut.await;
    (out, started.elapsed())
}

/// Loads `nodes`' tables (and b1's) for both namespaces while every primary can write: the
/// first versioned read on a node refreshes it, mongos retries, the second attempt passes.
async fn warm(direct: &Client, nodes: &[&str]) {
    for node in nodes {
        for (ns, n) in [(INVENTORY, INVENTORY_DOCS), (PAYMENTS, PAYMENT_DOCS)] {
            let docs = find_on(direct, ns, doc! {}, node, doc! {})
                .await
                .unwrap_or_else(|e| panic!("warm-up read of {ns} on {node}: {e}"));
            assert_eq!(docs.len(), n, "{ns} on {node}");
        }
    }
}

/// Waits (at most 5 s) until the breaker of `ns` is open.
async fn wait_open(env: &SimEnv, ns: &str) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while env.state(ns) != State::Open {
        assert!(Instant::now() < deadline, "{ns} did not open");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A strict read's error: (code, codeName, errmsg).
fn error_of(r: Result<Vec<Document>, Error>, what: &str) -> (i32, String, String) {
    match r {
        Ok(docs) => panic!("{what}: expected an error, got {} documents", docs.len()),
        Err(e) => command_error(&e),
    }
}

/// Sends [`FAIL_FAST_READS`] reads that must fail fast with the same `staleguard:` error;
/// returns it. Timing: the fastest within [`FAST`] (one slower reply on a loaded machine is
/// scheduling), every one well before the sim could have refused it.
async fn fail_fast(c: &Client, ns: &str, node: &str, extra: Document) -> (i32, String, String) {
    let mut first: Option<(i32, String, String)> = None;
    let mut times = Vec::new();
    for _ in 0..FAIL_FAST_READS {
        let (r, took) = timed(find_on(c, ns, doc! {}, node, extra.clone())).await;
        let (code, name, msg) = error_of(r, "fail fast");
        assert!(msg.starts_with("staleguard:"), "{msg}");
        if let Some(f) = &first {
            assert_eq!((f.0, f.1.as_str()), (code, name.as_str()), "{msg}");
        } else {
            first = Some((code, name, msg));
        }
        times.push(took);
    }
    println!("fail-fast replies on {ns} after {times:?}");
    assert!(times.iter().min().is_some_and(|t| *t < FAST), "{times:?}");
    assert!(times.iter().all(|t| *t < SOONEST_REFUSAL), "{times:?}");
    first.expect("a reply")
}

/// Migrates the chunk holding `_id: id` of `ns` to whichever shard does not hold it, with
/// the donor's orphans kept for a minute (longer than any test).
fn move_away(cluster: &Cluster, ns: &str, id: Bson) -> MoveReport {
    let delete_after = Some(Duration::from_secs(60));
    match cluster.move_chunk(ns, &id, "shardB", delete_after) {
        Ok(r) => r,
        // Already on shard B (IllegalOperation): move it to shard A.
        Err(e) if e.code == 20 => cluster
            .move_chunk(ns, &id, "shardA", delete_after)
            .expect("moveChunk to shard A"),
        Err(e) => panic!("moveChunk {ns}: {e}"),
    }
}

// ---------------------------------------------------------------------------------------
// 1. Fallback: answered through the `available` retry, then rewritten once the breaker opens

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fallback_reads_on_a_restarted_secondary_are_answered_then_rewritten() {
    let env = SimEnv::start(&namespaces(3, "30s")).await;
    let (guarded, direct) = (env.guarded().await, env.direct().await);

    // Healthy: a1 loads its table on the first read (mongos retries once inside), and no
    // error reaches staleguard.
    let docs = find_on(&guarded, INVENTORY, doc! {}, "a1", doc! {})
        .await
        .expect("healthy read");
    assert_eq!(docs.len(), INVENTORY_DOCS);
    assert!(matches!(
        env.table("a1", INVENTORY).state,
        TableState::Loaded { .. }
    ));
    assert_eq!(env.errors(INVENTORY), 0);
    assert_eq!(read_concern(&env.upstream("find", INVENTORY)[0]), None);

    env.incident(&["a1"]);

    // Straight to mongos, the read is refused: a1 cannot reload its table without a write
    // on its primary, and mongos gives up after its retries.
    let read = || doc! { "maxTimeMS": 2000 };
    let (r, took) = timed(find_on(&direct, INVENTORY, doc! {}, "a1", read())).await;
    let (code, _, msg) = error_of(r, "direct read on a1");
    assert_eq!(code, 13388, "{msg}");
    assert!(msg.contains("mongos gave up after 2 attempts"), "{msg}");
    assert!(took >= REFUSAL, "the refusal took {took:?}");

    // Through staleguard, breaker closed: each read meets the same refusal, is resent once
    // with `available` (the budget reduced by the time spent) and answers.
    let stale_before = env.stale_config_errors();
    let a1_failures = env.table("a1", INVENTORY).refresh.failures;
    for i in 1..=3 {
        let before = env.upstream("find", INVENTORY).len();
        let (r, took) = timed(find_on(&guarded, INVENTORY, doc! {}, "a1", read())).await;
        let docs = r.unwrap_or_else(|e| panic!("read {i} should be answered: {e}"));
        assert_eq!(docs.len(), INVENTORY_DOCS, "read {i}");
        assert!(took >= REFUSAL, "read {i} met the refusal first ({took:?})");
        let up = env.upstream("find", INVENTORY);
        assert_eq!(
            up.len(),
            before + 2,
            "read {i}: the original, then the resend"
        );
        let (original, resend) = (&up[before], &up[before + 1]);
        assert_eq!(read_concern(original), None);
        assert_eq!(max_time_ms(original), Some(2000));
        assert_eq!(read_concern(resend), Some(available()));
        let budget = max_time_ms(resend).expect("maxTimeMS on the resend");
        assert!(
            budget > 0 && budget <= 2000 - REFUSAL.as_millis() as i64,
            "read {i}: resend budget {budget}"
        );
        assert_eq!(env.errors(INVENTORY), i, "read {i}");
    }
    assert_eq!(env.state(INVENTORY), State::Open, "3 errors open it");
    let per_refusal = u64::from(STALE_RETRIES + 1);
    assert_eq!(
        env.stale_config_errors(),
        stale_before + 3 * per_refusal,
        "the three originals were refused in the sim; the resends passed"
    );
    assert_eq!(
        env.table("a1", INVENTORY).refresh.failures,
        a1_failures + 3 * (STALE_RETRIES + 1)
    );

    // Breaker open: one message per read, already `available`, answered at once; a1 serves
    // it without its routing table, which stays UNKNOWN.
    let before = env.upstream("find", INVENTORY).len();
    let (r, took) = timed(find_on(&guarded, INVENTORY, doc! {}, "a1", read())).await;
    assert_eq!(r.expect("rewritten read").len(), INVENTORY_DOCS);
    assert!(took < REFUSAL, "no refusal to wait for: {took:?}");
    let up = env.upstream("find", INVENTORY);
    assert_eq!(up.len(), before + 1, "sent once, rewritten before sending");
    let last = up.last().expect("a find");
    assert_eq!(read_concern(last), Some(available()));
    assert_eq!(max_time_ms(last), Some(2000), "no cap configured");
    assert_eq!(
        read_concern(env.sent_by_driver("find", INVENTORY).last().expect("sent")),
        None,
        "the driver asked for nothing special"
    );
    assert_eq!(env.stale_config_errors(), stale_before + 3 * per_refusal);
    let t = env.table("a1", INVENTORY);
    assert_eq!(t.state, TableState::Unknown, "{t:?}");
    assert_eq!(t.refresh.failures, a1_failures + 3 * (STALE_RETRIES + 1));

    // Nothing healed: straight to mongos it is still refused.
    let r = find_on(&direct, INVENTORY, doc! {}, "a1", read()).await;
    assert_eq!(error_of(r, "direct read again").0, 13388);
    env.shutdown().await;
}

// ---------------------------------------------------------------------------------------
// 2. Strict: the errors reach the client, then it fails fast and sends nothing

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strict_reads_on_a_restarted_secondary_fail_then_fail_fast() {
    let env = SimEnv::start(&namespaces(3, "30s")).await;
    let (guarded, direct) = (env.guarded().await, env.direct().await);
    warm(&direct, &["a1"]).await;
    env.incident(&["a1"]);

    for i in 1..=3 {
        let before = env.upstream("find", PAYMENTS).len();
        let (r, took) = timed(find_on(&guarded, PAYMENTS, doc! {}, "a1", doc! {})).await;
        let (code, name, msg) = error_of(r, "strict read on a1");
        assert_eq!((code, name.as_str()), (13388, "StaleConfig"), "read {i}");
        assert!(
            !msg.starts_with("staleguard:") && msg.contains("pay.transactions"),
            "read {i}: the sim's own error: {msg}"
        );
        assert!(took >= REFUSAL, "read {i} hung for the refusal: {took:?}");
        let up = env.upstream("find", PAYMENTS);
        assert_eq!(up.len(), before + 1, "read {i}: not resent");
        assert_eq!(read_concern(up.last().expect("a find")), None);
        assert_eq!(env.errors(PAYMENTS), i);
    }
    assert_eq!(env.state(PAYMENTS), State::Open);

    let upstream_before = env.upstream_count();
    let stale_before = env.stale_config_errors();
    let a1_failures = env.table("a1", PAYMENTS).refresh.failures;
    let (code, name, msg) = fail_fast(&guarded, PAYMENTS, "a1", doc! {}).await;
    println!("fail-fast errmsg: {msg}");
    assert_eq!((code, name.as_str()), (13388, "StaleConfig"));
    for part in ["pay.transactions", "stale routing", "not sent to mongos"] {
        assert!(msg.contains(part), "errmsg lacks {part:?}: {msg}");
    }
    // It does not tell when the breaker will look again.
    assert!(!msg.contains("probe"), "{msg}");

    // A strict read asking for `available` itself (what a1 would answer) is refused.
    let r = find_on(
        &guarded,
        PAYMENTS,
        doc! {},
        "a1",
        doc! { "readConcern": { "level": "available" } },
    )
    .await;
    let (code, _, msg) = error_of(r, "available on strict");
    assert_eq!(code, 72, "{msg}");
    assert!(msg.starts_with("staleguard:"), "{msg}");

    // Nothing of it reached the sim: no message, no StaleConfig, no refresh attempt on a1.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        env.upstream_count(),
        upstream_before,
        "nothing sent upstream"
    );
    assert_eq!(env.stale_config_errors(), stale_before);
    assert_eq!(env.table("a1", PAYMENTS).refresh.failures, a1_failures);
    assert_eq!(env.state(PAYMENTS), State::Open);

    // The connection stayed open: a ping on the same client works.
    within(
        "ping",
        guarded.database("admin").run_command(doc! { "ping": 1 }),
    )
    .await
    .expect("ping after fail-fast");

    // Straight to mongos the payment service still hangs for the whole refusal.
    let (r, took) = timed(find_on(&direct, PAYMENTS, doc! {}, "a1", doc! {})).await;
    assert_eq!(error_of(r, "direct strict read").0, 13388);
    assert!(took >= REFUSAL, "{took:?}");
    env.shutdown().await;
}

// ---------------------------------------------------------------------------------------
// 3. Orphans: the price of fallback; never paid on strict

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orphans_are_served_twice_on_fallback_and_never_on_strict() {
    let env = SimEnv::start(&namespaces(2, "30s")).await;
    let (guarded, direct) = (env.guarded().await, env.direct().await);
    let cluster = env.cluster();

    // A migration of each collection just committed; the donors keep the moved documents
    // (orphans) until their range deleter runs, a minute from now.
    let inv_id = doc! { "productId": 7, "storeId": 3 };
    let inv_move = move_away(&cluster, INVENTORY, Bson::Document(inv_id.clone()));
    let pay_move = move_away(&cluster, PAYMENTS, Bson::Int32(1));
    let status = cluster.status();
    for (ns, m) in [(INVENTORY, &inv_move), (PAYMENTS, &pay_move)] {
        assert!(m.moved_docs > 0, "{ns}: {m:?}");
        let donor = status.shard(&m.from).expect("donor");
        assert_eq!(donor.orphans[ns], m.moved_docs, "{ns}");
    }
    // Scatter reads of one moved document: not an equality on the whole `_id`.
    let inv_filter = || doc! { "_id.productId": 7, "_id.storeId": 3 };
    let pay_filter = || doc! { "_id": { "$gte": 1, "$lte": 1 } };
    // The secondaries (a1, a2, b1) load the tables as they are after the migration.
    warm(&direct, &["a1", "a2"]).await;
    env.incident(&["a1"]);

    // Fallback: a1 refuses; the `available` resend answers, orphan filter skipped: the moved
    // document comes back twice, once from each shard.
    for i in 1..=2 {
        let docs = find_on(&guarded, INVENTORY, inv_filter(), "a1", doc! {})
            .await
            .unwrap_or_else(|e| panic!("fallback read {i}: {e}"));
        assert_eq!(docs.len(), 2, "read {i}: the document and its orphan");
    }
    assert_eq!(env.state(INVENTORY), State::Open);
    // Breaker open: rewritten before sending; the same price.
    let docs = find_on(&guarded, INVENTORY, inv_filter(), "a1", doc! {})
        .await
        .expect("rewritten read");
    assert_eq!(docs.len(), 2, "{docs:?}");
    assert!(docs
        .iter()
        .all(|d| d.get_document("_id").ok() == Some(&inv_id)));
    assert_eq!(
        level(env.upstream("find", INVENTORY).last().expect("a find")).as_deref(),
        Some("available")
    );
    let all = find_on(&guarded, INVENTORY, doc! {}, "a1", doc! {})
        .await
        .expect("whole collection");
    assert_eq!(
        all.len(),
        INVENTORY_DOCS + inv_move.moved_docs,
        "every orphan"
    );
    // A primary read is not eligible: forwarded as is, versioned, the orphan filtered.
    let docs = find_with(&guarded, INVENTORY, inv_filter(), doc! {}, doc! {})
        .await
        .expect("primary read");
    assert_eq!(docs.len(), 1);

    // Strict, breaker closed: a2 holds the new table, the read is forwarded unmodified and
    // versioned: the moved document once, the collection without orphans.
    let docs = find_on(&guarded, PAYMENTS, pay_filter(), "a2", doc! {})
        .await
        .expect("strict read on a2");
    assert_eq!(docs.len(), 1, "{docs:?}");
    let all = find_on(&guarded, PAYMENTS, doc! {}, "a2", doc! {})
        .await
        .expect("strict read on a2");
    assert_eq!(all.len(), PAYMENT_DOCS);
    // a1 refuses, the errors reach the client and open the breaker ...
    for i in 1..=2 {
        let r = find_on(&guarded, PAYMENTS, pay_filter(), "a1", doc! {}).await;
        let (code, _, msg) = error_of(r, "strict read on a1");
        assert_eq!(code, 13388, "read {i}: {msg}");
        assert!(!msg.starts_with("staleguard:"), "{msg}");
    }
    assert_eq!(env.state(PAYMENTS), State::Open);
    // ... then every strict read fails fast, even one a2 could answer; and asking for
    // `available` is refused.
    let r = find_on(&guarded, PAYMENTS, pay_filter(), "a2", doc! {}).await;
    assert!(error_of(r, "fail fast").2.starts_with("staleguard:"));
    let rc = || doc! { "readConcern": { "level": "available" } };
    let r = find_on(&guarded, PAYMENTS, pay_filter(), "a1", rc()).await;
    assert_eq!(error_of(r, "refused").0, 72);
    assert!(
        env.upstream("find", PAYMENTS)
            .iter()
            .all(|b| level(b).as_deref() != Some("available")),
        "no strict read ever reached mongos with available"
    );
    // What `available` would have served there: the orphan too.
    let docs = find_on(&direct, PAYMENTS, pay_filter(), "a1", rc())
        .await
        .expect("available straight to mongos");
    assert_eq!(docs.len(), 2);
    env.shutdown().await;
}

// ---------------------------------------------------------------------------------------
// 4. Heal: once the primary writes again, the half-open probes succeed and close

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_the_primary_resumes_the_probes_close_both_breakers() {
    let cooldown = Duration::from_millis(500);
    // The samples' close is watched here; staleguard's own questions (on by default) would
    // close both before the streak does (`after_the_primary_resumes_own_questions_...`).
    let config = format!(
        "[confirm]\nown_questions = false\n{}",
        namespaces(2, "500ms")
    );
    let env = SimEnv::start(&config).await;
    let (guarded, direct) = (env.guarded().await, env.direct().await);
    warm(&direct, &["a1", "a2"]).await;
    // Both secondaries: the confirming reads (any secondary) meet a stale one too.
    env.incident(&["a1", "a2"]);
    let pay_read = || doc! { "maxTimeMS": PAYMENT_MAX_TIME_MS };

    // Open both: the inventory on StaleConfig, the payments on the service's time limit
    // (confirmed by staleguard's cheap read).
    for _ in 0..2 {
        let docs = find_on(&guarded, INVENTORY, doc! {}, "a1", doc! {})
            .await
            .expect("fallback read answered");
        assert_eq!(docs.len(), INVENTORY_DOCS);
        let r = find_on(&guarded, PAYMENTS, doc! {}, "a1", pay_read()).await;
        let (code, name, msg) = error_of(r, "strict read on a1");
        assert_eq!((code, name.as_str()), (50, "MaxTimeMSExpired"), "{msg}");
    }
    assert_eq!(env.state(INVENTORY), State::Open);
    let deadline = Instant::now() + Duration::from_secs(5);
    while env.state(PAYMENTS) != State::Open {
        assert!(
            Instant::now() < deadline,
            "payments not opened by confirmed time limits"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        !env.confirms(PAYMENTS).is_empty(),
        "confirming reads were sent"
    );
    let (code, name, msg) = fail_fast(&guarded, PAYMENTS, "a1", pay_read()).await;
    assert_eq!((code, name.as_str()), (50, "MaxTimeMSExpired"), "{msg}");
    assert!(msg.contains("time limits"), "{msg}");

    // Still stalled after the wait: each probe goes out unmodified, meets the refusal,
    // and the breaker stays open (the fallback one is still answered through a resend).
    // One connection reads here: probes go round robin, so the connection that took the
    // last one waits `min(min_cooldown, cooldown)` more for another to take it.
    tokio::time::sleep(2 * cooldown + Duration::from_millis(100)).await;
    let before = env.upstream("find", INVENTORY).len();
    let docs = find_on(&guarded, INVENTORY, doc! {}, "a1", doc! {})
        .await
        .expect("failed probe, answered by the resend");
    assert_eq!(docs.len(), INVENTORY_DOCS);
    let up = env.upstream("find", INVENTORY);
    assert_eq!(up.len(), before + 2);
    assert_eq!(read_concern(&up[before]), None, "the probe is unmodified");
    assert_eq!(read_concern(&up[before + 1]), Some(available()));
    assert_eq!(
        env.state(INVENTORY),
        State::Open,
        "a failed probe keeps it open"
    );
    let before = env.upstream("find", PAYMENTS).len();
    let r = find_on(&guarded, PAYMENTS, doc! {}, "a1", pay_read()).await;
    let (code, _, msg) = error_of(r, "failed strict probe");
    assert_eq!(code, 50);
    assert!(!msg.starts_with("staleguard:"), "the sim's error: {msg}");
    assert_eq!(env.upstream("find", PAYMENTS).len(), before + 1);
    assert_eq!(env.state(PAYMENTS), State::Open);

    // Shard A's primary resumes: the flushes the secondaries waited for complete.
    let completed = env.cluster().resume_primary("shardA").expect("resume");
    assert!(completed >= 1, "completed {completed}");
    tokio::time::sleep(2 * cooldown + Duration::from_millis(100)).await;

    // The probes go out unmodified and answer; a streak of answers (close_after = 3,
    // spanning the 500 ms cooldown) closes each breaker.
    for (ns, n, extra) in [
        (INVENTORY, INVENTORY_DOCS, doc! {}),
        (PAYMENTS, PAYMENT_DOCS, pay_read()),
    ] {
        let mut reads = 0;
        while env.state(ns) == State::Open {
            assert!(reads < 12, "{ns}: still open after {reads} answered probes");
            let before = env.upstream("find", ns).len();
            let docs = find_on(&guarded, ns, doc! {}, "a1", extra.clone())
                .await
                .unwrap_or_else(|e| panic!("{ns} probe {reads}: {e}"));
            assert_eq!(docs.len(), n, "{ns} probe {reads}");
            let up = env.upstream("find", ns);
            assert_eq!(up.len(), before + 1, "{ns} probe {reads}: sent once");
            assert_eq!(
                up.last().expect("a find"),
                env.sent_by_driver("find", ns).last().expect("sent"),
                "{ns} probe {reads}: forwarded as the driver sent it"
            );
            reads += 1;
            // Past the lone connection's turn for the next probe (round robin).
            tokio::time::sleep(cooldown + Duration::from_millis(100)).await;
        }
        // The payments' failed probe asked the cluster about its time limit; when the cheap
        // reads reach the secondaries after the resume they are answered, and that answer
        // is an answered sample of the streak (then the close question's twelve reads).
        let least = if ns == PAYMENTS { 2 } else { 3 };
        assert!(reads >= least, "{ns}: closed after {reads} answers");
        assert_eq!(env.errors(ns), 0);
        let t = env.table("a1", ns);
        assert!(matches!(t.state, TableState::Loaded { .. }), "{ns}: {t:?}");
        assert_eq!(t.refresh.last_ok, Some(true));
    }
    env.shutdown().await;
}

// ---------------------------------------------------------------------------------------
// 5. Causal sessions: the rewrite drops afterClusterTime, which the sim would refuse

async fn session_find(
    c: &Collection<Document>,
    s: &mut ClientSession,
    filter: Document,
) -> mongodb::error::Result<Vec<Document>> {
    within("session find", async {
        let mut cursor = c.find(filter).session(&mut *s).await?;
        cursor.stream(s).try_collect().await
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn causal_session_reads_are_rewritten_without_after_cluster_time() {
    let env = SimEnv::start(&namespaces(2, "30s")).await;
    let (guarded, direct) = (env.guarded().await, env.direct().await);
    // Every secondary holds its tables: the driver's reads go to any of them.
    warm(&direct, &["a1", "a2"]).await;
    for node in ["b1", "b2"] {
        let docs = find_with(&direct, INVENTORY, doc! {}, pinned("a1", node), doc! {})
            .await
            .expect("warm shard B");
        assert_eq!(docs.len(), INVENTORY_DOCS);
    }
    let opts = CollectionOptions::builder()
        .selection_criteria(SelectionCriteria::ReadPreference(
            ReadPreference::Secondary { options: None },
        ))
        .build();
    let coll = guarded
        .database("demo")
        .collection_with_options::<Document>("store_inventory", opts);
    let mut s = within("session", guarded.start_session().causal_consistency(true))
        .await
        .expect("session");
    let filter = || doc! { "_id.productId": 7 };
    let docs = session_find(&coll, &mut s, filter())
        .await
        .expect("first read");
    assert_eq!(docs.len(), 20);
    assert!(s.operation_time().is_some(), "the sim sent operationTime");

    // Both secondaries of shard A restart: every secondary read there is refused.
    env.incident(&["a1", "a2"]);

    // Closed breaker: the driver's causal read is refused, resent as `available` without
    // afterClusterTime, and the sim accepts it.
    let docs = session_find(&coll, &mut s, filter())
        .await
        .expect("resent without afterClusterTime");
    assert_eq!(docs.len(), 20);
    let sent = env.sent_by_driver("find", INVENTORY);
    let driver_rc = read_concern(sent.last().expect("sent")).expect("a causal read");
    let after = driver_rc
        .get("afterClusterTime")
        .ok()
        .flatten()
        .and_then(|t| t.as_timestamp())
        .expect("afterClusterTime");
    let up = env.upstream("find", INVENTORY);
    let n = up.len();
    assert_eq!(
        &up[n - 2],
        sent.last().expect("sent"),
        "the original as sent"
    );
    assert_eq!(read_concern(&up[n - 1]), Some(available()), "dropped");
    assert_eq!(env.errors(INVENTORY), 1);

    session_find(&coll, &mut s, filter())
        .await
        .expect("second refusal, resent");
    assert_eq!(env.state(INVENTORY), State::Open);

    // Open breaker: rewritten before sending, afterClusterTime dropped, answered at once.
    let before = env.upstream("find", INVENTORY).len();
    let (r, took) = timed(session_find(&coll, &mut s, filter())).await;
    assert_eq!(r.expect("rewritten causal read").len(), 20);
    assert!(took < REFUSAL, "no refusal to wait for: {took:?}");
    let sent = env.sent_by_driver("find", INVENTORY);
    assert!(
        read_concern(sent.last().expect("sent")).is_some_and(|rc| rc
            .get("afterClusterTime")
            .ok()
            .flatten()
            .is_some()),
        "the driver sent a causal read"
    );
    let up = env.upstream("find", INVENTORY);
    assert_eq!(up.len(), before + 1);
    assert_eq!(read_concern(up.last().expect("a find")), Some(available()));

    // Why the drop matters: `available` with afterClusterTime is what the sim refuses.
    let rc = doc! { "level": "available", "afterClusterTime": after };
    let r = find_with(
        &direct,
        INVENTORY,
        filter(),
        doc! { "mode": "secondary" },
        doc! { "readConcern": rc },
    )
    .await;
    let (code, name, msg) = error_of(r, "available with afterClusterTime");
    assert_eq!((code, name.as_str()), (72, "InvalidOptions"), "{msg}");
    env.shutdown().await;
}

// ---------------------------------------------------------------------------------------
// 6. pymongo against the sim through staleguard

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pymongo_fallback_answers_and_strict_fails_fast_on_the_sim() {
    let env = SimEnv::start(&namespaces(3, "30s")).await;
    warm(&env.direct().await, &["a1"]).await;
    env.incident(&["a1"]);
    let (guarded, direct) = env.uris();

    run_check(
        "policy_sim_check.py",
        "fallback",
        vec![guarded.clone(), direct.clone()],
    )
    .await;
    assert_eq!(env.state(INVENTORY), State::Open);
    let up = env.upstream("find", INVENTORY);
    assert_eq!(
        up.len(),
        3 * 2 + 1,
        "3 originals and resends, then 1 rewritten"
    );
    for b in &up {
        let rp = b.get_document("$readPreference").expect("$readPreference");
        assert_eq!(
            rp.to_owned(),
            rawdoc! { "mode": "secondary", "tags": [{ "node": "a1" }, { "node": "b1" }] },
            "pymongo's tags reach mongos"
        );
    }
    for (i, b) in up.iter().enumerate() {
        let want = (i % 2 == 1 || i == 6).then(available);
        assert_eq!(read_concern(b), want, "find {i}");
    }
    assert_eq!(env.table("a1", INVENTORY).state, TableState::Unknown);

    let out = run_check("policy_sim_check.py", "strict", vec![guarded, direct]).await;
    assert!(out.contains("staleguard:"), "{out}");
    assert_eq!(env.state(PAYMENTS), State::Open);
    assert_eq!(
        env.upstream("find", PAYMENTS).len(),
        3,
        "the fail-fast read was not sent"
    );
    assert_eq!(
        env.sent_by_driver("find", PAYMENTS).len(),
        3 + FAIL_FAST_READS,
        "pymongo did not retry the fail-fast reply"
    );
    env.shutdown().await;
}

// ---------------------------------------------------------------------------------------
// 7. Issue 12: the time-limit path answered inside the client's own maxTimeMS, and a fast
//    return to unmodified reads once the primary resumes (default settings)

/// The namespaces with the default budget split and backoff (no test overrides).
const DEFAULT_NAMESPACES: &str = r#"
[[namespaces]]
pattern = "demo.store_inventory"
mode = "fallback"

[[namespaces]]
pattern = "pay.*"
mode = "strict"
"#;

/// The sim's refresh limit as in MongoDB 4.2: longer than any client limit here, so a
/// stuck secondary shows as a time limit, never as StaleConfig.
const REAL_REFRESH: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn time_limit_path_fallback_answers_from_the_first_read_inside_its_max_time() {
    let env = SimEnv::start_with(DEFAULT_NAMESPACES, REAL_REFRESH).await;
    let (guarded, direct) = (env.guarded().await, env.direct().await);
    warm(&direct, &["a1"]).await;
    env.incident(&["a1"]);
    let limit = doc! { "maxTimeMS": 2000 };

    // Straight to mongos: the read waits for a refresh that never comes, until its 2 s.
    let (r, took) = timed(find_on(&direct, INVENTORY, doc! {}, "a1", limit.clone())).await;
    let (code, _, msg) = error_of(r, "direct read on a1");
    assert_eq!(code, 50, "{msg}");
    assert!(took >= Duration::from_millis(1900), "{took:?}");

    // Through staleguard the very first read answers, well inside its own 2 s.
    let (r, took) = timed(find_on(&guarded, INVENTORY, doc! {}, "a1", limit)).await;
    let docs = r.expect("the first read is answered");
    assert_eq!(docs.len(), INVENTORY_DOCS);
    assert!(
        took < Duration::from_millis(1500),
        "answered after {took:?}"
    );
    let up = env.upstream("find", INVENTORY);
    assert_eq!(up.len(), 2, "the first attempt and the resend");
    // min(2000 * 0.5, attempt_limit 500 ms); the resend gets the rest of the 2 s.
    assert_eq!(max_time_ms(&up[0]), Some(500));
    assert_eq!(
        read_concern(&up[0]),
        None,
        "the first attempt is not relaxed"
    );
    assert_eq!(read_concern(&up[1]), Some(available()));
    let rest = max_time_ms(&up[1]).expect("the resend keeps a limit");
    assert!((1..=1500).contains(&rest), "resend maxTimeMS {rest}");

    // A read without any limit: its first attempt gets attempt_limit, the resend none.
    let (r, took) = timed(find_on(&guarded, INVENTORY, doc! {}, "a1", doc! {})).await;
    assert_eq!(r.expect("answered").len(), INVENTORY_DOCS);
    assert!(
        took < Duration::from_millis(1500),
        "answered after {took:?}"
    );
    let up = env.upstream("find", INVENTORY);
    assert_eq!(up.len(), 4);
    assert_eq!(max_time_ms(&up[2]), Some(500));
    assert_eq!(max_time_ms(&up[3]), None);
    assert_eq!(read_concern(&up[3]), Some(available()));
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pymongo_time_limit_path_answers_from_the_first_read() {
    let env = SimEnv::start_with(DEFAULT_NAMESPACES, REAL_REFRESH).await;
    warm(&env.direct().await, &["a1"]).await;
    env.incident(&["a1"]);
    let (guarded, direct) = env.uris();
    run_check("policy_sim_check.py", "budget", vec![guarded, direct]).await;
    let up = env.upstream("find", INVENTORY);
    assert_eq!(
        up.len(),
        2,
        "pymongo's first read: the first attempt and the resend"
    );
    assert_eq!(max_time_ms(&up[0]), Some(500));
    assert_eq!(read_concern(&up[1]), Some(available()));
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_resume_primary_both_namespaces_are_back_to_unmodified_reads_within_5s() {
    // Default budget split and backoff (min_cooldown 1 s, cooldown 3 s); the evidence rules
    // relaxed as in the other sim tests, since one driver connection opens the breakers here.
    // Both secondaries restarted, so staleguard's confirming reads meet a stale one too.
    let env = SimEnv::start_with(&namespaces(3, "3s"), REAL_REFRESH).await;
    let (guarded, direct) = (env.guarded().await, env.direct().await);
    warm(&direct, &["a1", "a2"]).await;
    env.incident(&["a1", "a2"]);
    let pay_read = || doc! { "maxTimeMS": PAYMENT_MAX_TIME_MS };
    // Open both breakers (3 trigger errors each), then let the incident last a while: the
    // probes fail and the cooldown grows (1 s, 2 s, ...).
    for _ in 0..3 {
        let docs = find_on(&guarded, INVENTORY, doc! {}, "a1", doc! {})
            .await
            .expect("fallback answered");
        assert_eq!(docs.len(), INVENTORY_DOCS);
        let _ = find_on(&guarded, PAYMENTS, doc! {}, "a1", pay_read()).await;
    }
    // Time limits count once staleguard's confirming read fails too.
    wait_open(&env, INVENTORY).await;
    wait_open(&env, PAYMENTS).await;
    let incident = Instant::now();
    while incident.elapsed() < Duration::from_secs(3) {
        let _ = find_on(&guarded, INVENTORY, doc! {}, "a1", doc! {}).await;
        let _ = find_on(&guarded, PAYMENTS, doc! {}, "a1", pay_read()).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    env.cluster().resume_primary("shardA").expect("resume");
    let resumed = Instant::now();
    // Reads keep coming, as an application's would; within 5 s both namespaces' reads go
    // out as the driver sent them again (apart from the first attempt's time limit) and
    // answer.
    let mut back = [None, None];
    while back.iter().any(Option::is_none) && resumed.elapsed() < Duration::from_secs(5) {
        for (i, (ns, extra)) in [(INVENTORY, doc! {}), (PAYMENTS, pay_read())]
            .into_iter()
            .enumerate()
        {
            if back[i].is_some() {
                continue;
            }
            let before = env.upstream("find", ns).len();
            let r = find_on(&guarded, ns, doc! {}, "a1", extra).await;
            let up = env.upstream("find", ns);
            let unmodified = up.len() == before + 1
                && read_concern(&up[before]).is_none()
                && up[before]
                    .get_document("$readPreference")
                    .ok()
                    .map(|d| d.to_owned())
                    == RawDocumentBuf::try_from(&pinned("a1", "b1")).ok();
            if r.is_ok() && unmodified && env.state(ns) == State::Closed {
                back[i] = Some(resumed.elapsed());
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    println!("back to unmodified reads after {back:?}");
    assert!(
        back.iter().all(Option::is_some),
        "not back within 5 s: {back:?}"
    );
    env.shutdown().await;
}

// ---------------------------------------------------------------------------------------
// 8. Issue 12: the primary ladder answers strict reads during the incident without
//    orphans, and the orphan estimate of fallback reads against the sim's ground truth

/// Strict `pay.*` with the primary rung; fallback inventory as usual (`available`).
fn ladder_namespaces() -> String {
    namespaces(2, "30s").replace(
        "pattern = \"pay.*\"\nmode = \"strict\"",
        "pattern = \"pay.*\"\nmode = \"strict\"\nladder = [\"primary\"]",
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_ladder_strict_reads_answer_from_the_primary_with_no_orphans() {
    let env = SimEnv::start(&ladder_namespaces()).await;
    let (guarded, direct) = (env.guarded().await, env.direct().await);
    let cluster = env.cluster();
    let pay_move = move_away(&cluster, PAYMENTS, Bson::Int32(1));
    let inv_move = move_away(
        &cluster,
        INVENTORY,
        Bson::Document(doc! { "productId": 7, "storeId": 3 }),
    );
    assert!(pay_move.moved_docs > 0 && inv_move.moved_docs > 0);
    warm(&direct, &["a1", "a2"]).await;
    // Both of shard A's secondaries restart: an unpinned secondary read fails on either.
    env.incident(&["a1", "a2"]);
    let secondary = || doc! { "mode": "secondary" };

    // Straight to mongos, shard A's secondaries refuse the payment read.
    let r = find_with(&direct, PAYMENTS, doc! {}, secondary(), doc! {}).await;
    assert_eq!(error_of(r, "direct read").0, 13388);

    // Through staleguard, every read answers: the first ones climb after the refusal,
    // then (breaker open) go to the primary at once. Every answer is the whole collection,
    // versioned by the primary: no orphan.
    for i in 1..=4 {
        let (r, took) = timed(find_with(&guarded, PAYMENTS, doc! {}, secondary(), doc! {})).await;
        let docs = r.unwrap_or_else(|e| panic!("payment read {i}: {e}"));
        assert_eq!(docs.len(), PAYMENT_DOCS, "read {i}: no orphans");
        println!("payment read {i} answered after {took:?}");
    }
    assert_eq!(env.state(PAYMENTS), State::Open);
    let up = env.upstream("find", PAYMENTS);
    assert_eq!(up.len(), 2 + 2 + 1 + 1, "two climbs, then the primary only");
    for body in &up[4..] {
        let pref = body
            .get_document("$readPreference")
            .expect("a read preference");
        assert_eq!(pref.get_str("mode").ok(), Some("primary"));
        assert_eq!(read_concern(body), None, "never available");
    }
    let ladder = &env.proxy.shared().metrics.ladder;
    assert_eq!(ladder.attempts_of(PAYMENTS, "primary", "answered"), 4);
    assert_eq!(ladder.orphans_of(PAYMENTS), 0);

    // A read pinned to a1 by its tag sets never goes to the primary (issue 20): the client
    // chose its members. The breaker is open, so it fails fast, and nothing is sent.
    let sent = env.upstream("find", PAYMENTS).len();
    let r = find_on(&guarded, PAYMENTS, doc! {}, "a1", doc! {}).await;
    let (code, _, msg) = error_of(r, "pinned read");
    assert_eq!(code, 13388);
    assert!(msg.starts_with("staleguard:"), "{msg}");
    assert_eq!(env.upstream("find", PAYMENTS).len(), sent, "nothing sent");

    // The fallback inventory is served with `available`: a read of the moved document
    // gets it twice (from the donor as an orphan, and from its owner). The estimate counts
    // each copy seen in one reply batch: here, exactly the orphans served.
    let mut served_orphans = 0;
    for _ in 0..3 {
        let docs = find_on(
            &guarded,
            INVENTORY,
            doc! { "_id.productId": 7, "_id.storeId": 3 },
            "a1",
            doc! {},
        )
        .await
        .expect("fallback read");
        let distinct: std::collections::HashSet<String> =
            docs.iter().map(|d| format!("{:?}", d.get("_id"))).collect();
        served_orphans += docs.len() - distinct.len();
    }
    assert_eq!(served_orphans, 3, "one orphan per read");
    assert_eq!(ladder.orphans_of(INVENTORY), served_orphans as u64);
    env.shutdown().await;
}

/// Issue 21, item 5: `$unwind` repeats each document's `_id` once per array element, so its
/// replies hold the same `_id` many times without any orphan; they are never counted. A
/// `find`, and an aggregation of stages that keep `_id` (`$match`, `$sort`, ...), still count
/// the orphans a migration left behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unwind_replies_never_count_as_orphans_and_real_orphans_still_do() {
    let env = SimEnv::start(&namespaces(2, "30s")).await;
    let (guarded, direct) = (env.guarded().await, env.direct().await);
    let cluster = env.cluster();
    let moved = move_away(
        &cluster,
        INVENTORY,
        Bson::Document(doc! { "productId": 7, "storeId": 3 }),
    );
    assert!(moved.moved_docs > 0);
    // Five documents with 50 sizes each, inserted after the
    // migration (so none of them has an orphan) while shard A's primary still writes.
    let sizes: Vec<i32> = (0..50).collect();
    let docs: Vec<Document> = (0..5)
        .map(|i| doc! { "_id": { "productId": 5000 + i, "storeId": 1 }, "sizes": sizes.clone() })
        .collect();
    within(
        "insert",
        direct
            .database("demo")
            .collection::<Document>("store_inventory")
            .insert_many(docs),
    )
    .await
    .expect("insert the documents to unwind");
    env.incident(&["a1"]);
    let orphans = || env.proxy.shared().metrics.ladder.orphans_of(INVENTORY);

    // Reads of the moved document on a1 climb to `available` (then, breaker open, are
    // rewritten): each gets it twice, and the estimate counts the copy.
    let moved_doc = || doc! { "_id.productId": 7, "_id.storeId": 3 };
    for i in 1..=2 {
        let docs = find_on(&guarded, INVENTORY, moved_doc(), "a1", doc! {})
            .await
            .unwrap_or_else(|e| panic!("fallback read {i}: {e}"));
        assert_eq!(docs.len(), 2, "read {i}: the document and its orphan");
    }
    assert_eq!(env.state(INVENTORY), State::Open);
    assert_eq!(orphans(), 2);

    let aggregate = |pipeline: Vec<Document>| {
        let cmd = doc! {
            "aggregate": "store_inventory",
            "pipeline": pipeline,
            "cursor": { "batchSize": 5000 },
            "$readPreference": pinned("a1", "b1"),
        };
        let db = guarded.database("demo");
        async move {
            let reply = within("aggregate", db.run_command(cmd))
                .await
                .expect("aggregate answers");
            let batch = reply
                .get_document("cursor")
                .and_then(|c| c.get_array("firstBatch"))
                .expect("firstBatch")
                .clone();
            batch
                .into_iter()
                .map(|d| d.as_document().expect("a document").clone())
                .collect::<Vec<_>>()
        }
    };
    // Five `$unwind` replies, served `available`: 250 documents each, 5 distinct `_id`s.
    for i in 1..=5 {
        let docs = aggregate(vec![
            doc! { "$match": { "_id.productId": { "$gte": 5000 } } },
            doc! { "$unwind": "$sizes" },
        ])
        .await;
        let distinct: std::collections::HashSet<String> =
            docs.iter().map(|d| format!("{:?}", d.get("_id"))).collect();
        assert_eq!((docs.len(), distinct.len()), (250, 5), "unwind reply {i}");
        let sent = env.upstream("aggregate", INVENTORY);
        assert_eq!(
            level(sent.last().expect("sent")).as_deref(),
            Some("available")
        );
    }
    assert_eq!(orphans(), 2, "no orphan counted for $unwind");

    // An aggregation of stages that keep `_id` still counts; so does a find.
    let docs = aggregate(vec![
        doc! { "$match": moved_doc() },
        doc! { "$sort": { "qty": 1 } },
        doc! { "$limit": 10 },
    ])
    .await;
    assert_eq!(docs.len(), 2);
    assert_eq!(orphans(), 3);
    find_on(&guarded, INVENTORY, moved_doc(), "a1", doc! {})
        .await
        .expect("rewritten find");
    assert_eq!(orphans(), 4);
    env.shutdown().await;
}

/// staleguard's own questions (`breaker::own`): with a streak that can never close it
/// (`close_after` at its largest), a strict breaker that is read stays open while the
/// incident lasts (its cheap reads meet the stale secondaries) and closes about two
/// `min_cooldown`s (1 s each) after the primary resumes, on 24 cheap reads of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_the_primary_resumes_own_questions_close_a_breaker_no_streak_can() {
    let config = r#"
[defaults]
min_connections = 1
per_connection = 1000
min_wait = "0s"

[[namespaces]]
pattern = "pay.*"
mode = "strict"
on_open = "refuse"
threshold = 2
window = "10s"
cooldown = "3s"
close_after = 1000
"#;
    let env = SimEnv::start(config).await;
    let (guarded, direct) = (env.guarded().await, env.direct().await);
    warm(&direct, &["a1", "a2"]).await;
    env.incident(&["a1", "a2"]);
    let pay_read = || doc! { "maxTimeMS": PAYMENT_MAX_TIME_MS };
    for _ in 0..2 {
        let r = find_on(&guarded, PAYMENTS, doc! {}, "a1", pay_read()).await;
        let (code, _, msg) = error_of(r, "strict read on a stale secondary");
        assert_eq!(code, 50, "{msg}");
    }
    wait_open(&env, PAYMENTS).await;
    // Read while the incident lasts: three own questions at least, each declined.
    let until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < until {
        let _ = find_on(&guarded, PAYMENTS, doc! {}, "a1", pay_read()).await;
        assert_eq!(
            env.state(PAYMENTS),
            State::Open,
            "closed during the incident"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let completed = env.cluster().resume_primary("shardA").expect("resume");
    assert!(completed >= 1, "completed {completed}");
    let healed = Instant::now();
    while env.state(PAYMENTS) == State::Open {
        assert!(
            healed.elapsed() < Duration::from_secs(6),
            "still open 6 s after the heal"
        );
        let _ = find_on(&guarded, PAYMENTS, doc! {}, "a1", pay_read()).await;
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let took = healed.elapsed();
    let snap = env.proxy.shared().breakers.snapshot();
    let s = snap.iter().find(|s| s.ns == PAYMENTS).expect("its breaker");
    assert!(
        s.last_reason.contains("own questions answered 2 in a row"),
        "{}",
        s.last_reason
    );
    println!("closed {took:?} after the heal: {}", s.last_reason);
    assert!(took < Duration::from_millis(4_500), "{took:?}");
    env.shutdown().await;
}
