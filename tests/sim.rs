//! The simulated sharded cluster through the official Rust driver: the articles' tables as
//! tests (secondary reads while shard A's primary cannot write, restarts, orphans during a
//! migration, the stall's serverStatus shape), plus the driver operations the demo needs.

use std::time::{Duration, Instant};

use bson::{doc, Bson, Document};
use futures::TryStreamExt;
use mongodb::error::{Error, ErrorKind};
use mongodb::options::{ReadConcern, ReadPreference, ReadPreferenceOptions, SelectionCriteria};
use mongodb::{Client, Collection};
use staleguard::sim::{self, SimConfig, SimHandle, TableState};

#[path = "sim/wire.rs"]
mod wire;

#[path = "sim/front.rs"]
mod front;

const INVENTORY: &str = "store_inventory";
/// The client's time limit on reads that may hang (mongos retries inside it).
const MAX_TIME: Duration = Duration::from_millis(1000);

fn config() -> SimConfig {
    SimConfig {
        listen: "127.0.0.1:0".to_string(),
        refresh_timeout: Duration::from_millis(300),
        find_host_timeout: Duration::from_millis(200),
        node_ports: true,
        ..SimConfig::default()
    }
}

async fn start(cfg: SimConfig) -> SimHandle {
    sim::start(cfg).await.expect("sim starts")
}

async fn client_for(uri_host: String, extra: &str) -> Client {
    let uri = format!("mongodb://{uri_host}/?serverSelectionTimeoutMS=5000{extra}");
    Client::with_uri_str(uri).await.expect("driver client")
}

async fn client(sim: &SimHandle) -> Client {
    client_for(sim.addr().to_string(), "").await
}

fn inventory(c: &Client) -> Collection<Document> {
    c.database("demo").collection(INVENTORY)
}

fn payments(c: &Client) -> Collection<Document> {
    c.database("pay").collection("transactions")
}

/// `$readPreference: secondary` with tag sets `[{node: <node>}, {}]`: that node on its
/// shard, any secondary on the other (a tag set matching no member of a shard would fail the
/// read there). Written out by hand: the Rust driver 3.9 serializes tag sets as `tagSets`,
/// which mongos does not read (see `rust_driver_tag_sets_do_not_reach_mongos`).
fn on(node: &str) -> Document {
    doc! { "mode": "secondary", "tags": [{ "node": node }, {}] }
}

/// A scatter read of the whole collection on `node`'s shard (plus any secondary of the
/// other shard), limited by [`MAX_TIME`]. Returns the document count.
async fn read_on(coll: &Collection<Document>, node: &str) -> Result<usize, Error> {
    read_with(coll, node, doc! {}).await
}

/// [`read_on`] with extra command fields (e.g. a `readConcern`).
async fn read_with(
    coll: &Collection<Document>,
    node: &str,
    extra: Document,
) -> Result<usize, Error> {
    let mut cmd = doc! {
        "find": coll.name(),
        "filter": {},
        "batchSize": 5000,
        "maxTimeMS": MAX_TIME.as_millis() as i64,
        "$readPreference": on(node),
    };
    cmd.extend(extra);
    let reply = coll
        .client()
        .database(&coll.namespace().db)
        .run_command(cmd)
        .await?;
    let cursor = reply.get_document("cursor").expect("cursor");
    assert_eq!(cursor.get_i64("id").ok(), Some(0), "one batch");
    Ok(cursor.get_array("firstBatch").expect("firstBatch").len())
}

fn code(err: &Error) -> i32 {
    match err.kind.as_ref() {
        ErrorKind::Command(c) => c.code,
        ErrorKind::Write(mongodb::error::WriteFailure::WriteError(w)) => w.code,
        other => panic!("not a command error: {other:?}"),
    }
}

/// Refused the way the articles describe: StaleConfig once mongos's retries run out, or
/// the client's time limit first.
fn assert_refused(result: Result<usize, Error>, what: &str) {
    match result {
        Ok(n) => panic!("{what}: expected a refusal, got {n} documents"),
        Err(e) => assert!(
            matches!(code(&e), 13388 | 50),
            "{what}: expected StaleConfig or MaxTimeMSExpired, got {e}"
        ),
    }
}

fn table(sim: &SimHandle, node: &str, ns: &str) -> sim::TableStatus {
    let status = sim.cluster().status();
    let node = status.node(node).expect("node exists");
    node.table(ns).expect("table listed").clone()
}

/// Polls `cond` every 10 ms for up to 5 s.
async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "timed out: {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

// ---- the articles' tables -----------------------------------------------------------

/// Table row 1: a secondary that already holds a collection's table keeps serving it while
/// its primary cannot write.
#[tokio::test]
async fn loaded_table_keeps_working_while_primary_is_stalled() {
    let sim = start(config()).await;
    let c = client(&sim).await;
    assert_eq!(
        read_on(&inventory(&c), "a1").await.expect("warm-up read"),
        2000
    );
    sim.cluster().stall_primary("shardA").expect("stall");
    assert_eq!(
        read_on(&inventory(&c), "a1")
            .await
            .expect("read during stall"),
        2000
    );
    let t = table(&sim, "a1", "demo.store_inventory");
    assert_eq!(
        (t.refresh.successes, t.refresh.failures),
        (1, 0),
        "no refresh needed: {t:?}"
    );
    sim.shutdown().await;
}

/// Table row 2: a collection never read on the secondary needs a refresh, the refresh
/// needs a primary write, the write never completes: refused, and the node logs why.
#[tokio::test]
async fn never_read_collection_is_refused_while_primary_is_stalled() {
    let sim = start(config()).await;
    let c = client(&sim).await;
    assert_eq!(
        read_on(&inventory(&c), "a1").await.expect("warm-up read"),
        2000
    );
    sim.cluster().stall_primary("shardA").expect("stall");
    let t = Instant::now();
    assert_refused(read_on(&payments(&c), "a1").await, "pay.transactions on a1");
    assert!(
        t.elapsed() >= Duration::from_millis(300),
        "mongos retried before giving up"
    );
    let pay = table(&sim, "a1", "pay.transactions");
    assert_eq!(pay.state, TableState::Unknown);
    assert!(pay.refresh.failures >= 1, "{pay:?}");
    assert_eq!(pay.refresh.last_ok, Some(false));
    let why = pay.refresh.last_error.unwrap_or_default();
    assert!(why.contains("_flushRoutingTableCacheUpdates"), "{why}");
    // The table it had is still fine.
    assert_eq!(
        read_on(&inventory(&c), "a1").await.expect("loaded table"),
        2000
    );
    sim.shutdown().await;
}

/// Table row 3 and the article's reproduction: restarting a1 loses every table, so every
/// collection is refused on a1, including the one it served a moment ago; a2, never
/// restarted, keeps serving.
#[tokio::test]
async fn restarted_secondary_refuses_every_collection_and_a2_still_serves() {
    let sim = start(config()).await;
    let c = client(&sim).await;
    for node in ["a1", "a2"] {
        assert_eq!(read_on(&inventory(&c), node).await.expect("warm-up"), 2000);
        assert_eq!(read_on(&payments(&c), node).await.expect("warm-up"), 300);
    }
    sim.cluster().stall_primary("shardA").expect("stall");
    let lost = sim.cluster().restart_node("a1").expect("restart");
    assert_eq!(lost, vec!["demo.store_inventory", "pay.transactions"]);
    assert_refused(
        read_on(&inventory(&c), "a1").await,
        "inventory on restarted a1",
    );
    assert_refused(
        read_on(&payments(&c), "a1").await,
        "payments on restarted a1",
    );
    assert_eq!(
        table(&sim, "a1", "demo.store_inventory").state,
        TableState::Unknown
    );
    // Every later read too, as long as the primary cannot write.
    assert_refused(read_on(&inventory(&c), "a1").await, "inventory on a1 again");
    assert_eq!(
        read_on(&inventory(&c), "a2").await.expect("a2 serves"),
        2000
    );
    assert_eq!(read_on(&payments(&c), "a2").await.expect("a2 serves"), 300);
    // The escape hatch: `available` skips the version check, so a1 answers at once.
    let available = doc! { "readConcern": { "level": "available" } };
    let n = read_with(&inventory(&c), "a1", available).await;
    assert_eq!(n.expect("available on restarted a1"), 2000);
    sim.shutdown().await;
}

/// Resuming the primary: the queued writes complete in order and a1's next read works.
#[tokio::test]
async fn resuming_the_primary_heals_a1_and_completes_queued_writes() {
    let sim = start(config()).await;
    let c = client(&sim).await;
    assert_eq!(read_on(&inventory(&c), "a1").await.expect("warm-up"), 2000);
    sim.cluster().stall_primary("shardA").expect("stall");
    // Unsharded collections live on shard A (the databases' primary shard).
    let probe = c.database("ops_probe").collection::<Document>("probe");
    let writers: Vec<_> = (0..3)
        .map(|i| {
            let probe = probe.clone();
            tokio::spawn(async move { probe.insert_one(doc! { "_id": i, "seq": i }).await })
        })
        .collect();
    let cluster = sim.cluster();
    eventually("3 writes waiting", || {
        cluster
            .status()
            .shard("shardA")
            .is_some_and(|s| s.pending_writes >= 3)
    })
    .await;
    sim.cluster().restart_node("a1").expect("restart");
    let refused = sim
        .cluster()
        .restart_node("a0")
        .expect_err("a stalled primary");
    assert_eq!(refused.code, 20, "an election is not simulated");
    assert_refused(read_on(&inventory(&c), "a1").await, "a1 before resume");
    assert!(
        writers.iter().all(|w| !w.is_finished()),
        "writes hang while stalled"
    );
    let completed = sim.cluster().resume_primary("shardA").expect("resume");
    assert!(completed >= 3, "completed {completed}");
    for w in writers {
        w.await
            .expect("task")
            .expect("write completes after resume");
    }
    assert_eq!(probe.count_documents(doc! {}).await.expect("count"), 3);
    assert_eq!(
        read_on(&inventory(&c), "a1").await.expect("a1 healed"),
        2000
    );
    let t = table(&sim, "a1", "demo.store_inventory");
    assert!(matches!(t.state, TableState::Loaded { .. }), "{t:?}");
    assert_eq!(t.refresh.last_ok, Some(true));
    sim.shutdown().await;
}

/// The migration table: between the commit and the donor's deletion, `available` returns
/// the moved document from both shards; a versioned read filters the orphan. After the
/// deletion both return it once.
#[tokio::test]
async fn migration_orphans_show_under_available_only() {
    let sim = start(config()).await;
    let c = client(&sim).await;
    let coll = inventory(&c);
    let id = doc! { "productId": 7, "storeId": 3 };
    // Not an equality on the whole _id: mongos scatters to both shards.
    let filter = doc! { "_id.productId": 7, "_id.storeId": 3 };
    let to = which_shard_lacks(&coll, &id).await;
    let report = sim
        .cluster()
        .move_chunk(
            "demo.store_inventory",
            &Bson::Document(id.clone()),
            &to,
            Some(Duration::from_millis(1500)),
        )
        .expect("moveChunk");
    assert!(report.moved_docs > 0);
    assert_eq!(report.version.0, 2, "major version bumped");
    let orphans = sim
        .cluster()
        .status()
        .shard(&report.from)
        .expect("donor")
        .orphans["demo.store_inventory"];
    assert_eq!(orphans, report.moved_docs);

    let count = |rc: ReadConcern, sel: Option<SelectionCriteria>| {
        let (coll, filter) = (coll.clone(), filter.clone());
        async move {
            let mut find = coll.find(filter).read_concern(rc).max_time(MAX_TIME);
            if let Some(s) = sel {
                find = find.selection_criteria(s);
            }
            let docs: Vec<Document> = find.await?.try_collect().await?;
            Ok::<usize, Error>(docs.len())
        }
    };
    let secondaries = || {
        Some(SelectionCriteria::ReadPreference(
            ReadPreference::Secondary { options: None },
        ))
    };
    assert_eq!(
        count(ReadConcern::available(), None)
            .await
            .expect("available"),
        2
    );
    assert_eq!(count(ReadConcern::local(), None).await.expect("local"), 1);
    assert_eq!(
        count(ReadConcern::majority(), secondaries())
            .await
            .expect("majority on secondaries"),
        1
    );
    assert_eq!(
        count(ReadConcern::available(), secondaries())
            .await
            .expect("available on secondaries"),
        2
    );

    let cluster = sim.cluster();
    let donor = report.from.clone();
    eventually("orphans deleted", || {
        cluster
            .status()
            .shard(&donor)
            .is_some_and(|s| s.orphans["demo.store_inventory"] == 0)
    })
    .await;
    assert_eq!(
        count(ReadConcern::available(), None)
            .await
            .expect("available after"),
        1
    );
    assert_eq!(
        count(ReadConcern::local(), None)
            .await
            .expect("local after"),
        1
    );
    assert_eq!(coll.count_documents(doc! {}).await.expect("count"), 2000);
    sim.shutdown().await;
}

/// The shard that does not hold `_id` (explain names the one that does).
async fn which_shard_lacks(coll: &Collection<Document>, id: &Document) -> String {
    let db = coll.namespace().db;
    let plan = explain_shards(coll, &db, doc! { "_id": id.clone() }).await;
    assert_eq!(plan.len(), 1, "equality on _id targets one shard");
    if plan[0] == "shardA" {
        "shardB"
    } else {
        "shardA"
    }
    .to_string()
}

async fn explain_shards(coll: &Collection<Document>, db: &str, filter: Document) -> Vec<String> {
    let client = coll.client();
    let reply = client
        .database(db)
        .run_command(doc! { "explain": { "find": coll.name(), "filter": filter }, "verbosity": "queryPlanner" })
        .await
        .expect("explain");
    reply
        .get_document("queryPlanner")
        .and_then(|q| q.get_document("winningPlan"))
        .and_then(|w| w.get_array("shards"))
        .expect("shards in plan")
        .iter()
        .filter_map(|s| {
            s.as_document()?
                .get_str("shardName")
                .ok()
                .map(str::to_string)
        })
        .collect()
}

/// The first article: the stalled primary answers hello and reads; tickets drain as stuck
/// writes hold them, further writers queue, completed-write counters stop; no election,
/// no lag. On resume everything completes.
#[tokio::test]
async fn stalled_primary_answers_hello_while_tickets_drain() {
    let sim = start(SimConfig {
        write_tickets: 4,
        ..config()
    })
    .await;
    let c = client(&sim).await;
    let a0 = sim.node_addr("a0").expect("node port");
    let direct = client_for(a0.to_string(), "&directConnection=true").await;
    let admin = direct.database("admin");
    let probe = c.database("ops_probe").collection::<Document>("probe");
    probe
        .insert_one(doc! { "_id": "before" })
        .await
        .expect("healthy write");
    let before = admin
        .run_command(doc! { "serverStatus": 1 })
        .await
        .expect("serverStatus");
    let ops_before = write_ops(&before);

    sim.cluster().stall_primary("shardA").expect("stall");
    let mut writers = spawn_writes(&probe, 0..2);
    let cluster = sim.cluster();
    eventually("2 writes hold tickets", || {
        cluster
            .status()
            .shard("shardA")
            .is_some_and(|s| s.tickets_out == 2)
    })
    .await;
    let s = admin
        .run_command(doc! { "serverStatus": 1 })
        .await
        .expect("serverStatus");
    assert_eq!(tickets(&s), (2, 2, 4), "out, available, total");
    writers.extend(spawn_writes(&probe, 2..6));
    eventually("6 writes waiting", || {
        cluster
            .status()
            .shard("shardA")
            .is_some_and(|s| s.pending_writes == 6)
    })
    .await;

    let hello = admin
        .run_command(doc! { "hello": 1 })
        .await
        .expect("hello on a stalled primary");
    assert_eq!(hello.get_bool("isWritablePrimary").ok(), Some(true));
    assert_eq!(hello.get_str("setName").ok(), Some("shardA"));
    let s = admin
        .run_command(doc! { "serverStatus": 1 })
        .await
        .expect("serverStatus");
    assert_eq!(tickets(&s), (4, 0, 4));
    let queue = s
        .get_document("globalLock")
        .and_then(|g| g.get_document("currentQueue"))
        .expect("queue");
    assert_eq!(queue.get_i32("writers").ok(), Some(2));
    assert_eq!(write_ops(&s), ops_before, "no write completes");
    let elections = s
        .get_document("electionMetrics")
        .and_then(|e| e.get_document("electionTimeout"))
        .expect("metrics");
    assert_eq!(elections.get_i64("called").ok(), Some(0));
    assert_eq!(
        s.get_document("flowControl")
            .and_then(|f| f.get_bool("isLagged"))
            .ok(),
        Some(false)
    );
    let rs = admin
        .run_command(doc! { "replSetGetStatus": 1 })
        .await
        .expect("replSetGetStatus");
    assert_eq!(rs.get_i64("term").ok(), Some(1));
    let optimes: Vec<Bson> = rs
        .get_array("members")
        .expect("members")
        .iter()
        .filter_map(|m| m.as_document()?.get("optime").cloned())
        .collect();
    assert!(
        optimes.windows(2).all(|w| w[0] == w[1]),
        "no lag: {optimes:?}"
    );
    // Reads on the stalled primary still work.
    assert_eq!(
        payments(&c)
            .count_documents(doc! {})
            .await
            .expect("primary reads"),
        300
    );

    assert_eq!(sim.cluster().resume_primary("shardA").expect("resume"), 6);
    for w in writers {
        w.await.expect("task").expect("write completes");
    }
    let s = admin
        .run_command(doc! { "serverStatus": 1 })
        .await
        .expect("serverStatus");
    assert_eq!(write_ops(&s).0, ops_before.0 + 6);
    assert!(
        write_ops(&s).1 > ops_before.1,
        "stuck time shows as latency"
    );
    assert_eq!(tickets(&s), (0, 4, 4));
    sim.shutdown().await;
}

fn spawn_writes(
    probe: &Collection<Document>,
    ids: std::ops::Range<i32>,
) -> Vec<tokio::task::JoinHandle<mongodb::error::Result<mongodb::results::InsertOneResult>>> {
    ids.map(|i| {
        let probe = probe.clone();
        tokio::spawn(async move { probe.insert_one(doc! { "_id": i }).await })
    })
    .collect()
}

fn tickets(status: &Document) -> (i32, i32, i32) {
    let w = status
        .get_document("wiredTiger")
        .and_then(|w| w.get_document("concurrentTransactions"))
        .and_then(|c| c.get_document("write"))
        .expect("tickets");
    (
        w.get_i32("out").unwrap_or(-1),
        w.get_i32("available").unwrap_or(-1),
        w.get_i32("totalTickets").unwrap_or(-1),
    )
}

/// `opLatencies.writes.{ops, latency}`.
fn write_ops(status: &Document) -> (i64, i64) {
    let w = status
        .get_document("opLatencies")
        .and_then(|l| l.get_document("writes"))
        .expect("opLatencies");
    (
        w.get_i64("ops").unwrap_or(-1),
        w.get_i64("latency").unwrap_or(-1),
    )
}

/// mongos's own StaleConfig retries: with a short budget and no client time limit, the
/// client gets StaleConfig naming the namespace.
#[tokio::test]
async fn stale_config_after_mongos_retries_run_out() {
    let sim = start(SimConfig {
        stale_retries: 2,
        refresh_timeout: Duration::from_millis(100),
        ..config()
    })
    .await;
    let c = client(&sim).await;
    sim.cluster().stall_primary("shardA").expect("stall");
    let t = Instant::now();
    let err = c
        .database("pay")
        .run_command(doc! { "find": "transactions", "$readPreference": on("a2") })
        .await
        .expect_err("refused");
    assert_eq!(code(&err), 13388, "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains("pay.transactions") && msg.contains("stale config"),
        "{msg}"
    );
    assert!(
        t.elapsed() >= Duration::from_millis(300),
        "3 attempts of 100 ms"
    );
    assert_eq!(sim.cluster().status().mongos.stale_config_errors, 3);
    sim.shutdown().await;
}

// ---- read preference, read concern -------------------------------------------------------

#[tokio::test]
async fn read_preference_tags() {
    let sim = start(config()).await;
    let c = client(&sim).await;
    let demo = c.database("demo");
    let find = |rp: Document| doc! { "find": INVENTORY, "filter": {}, "batchSize": 5000, "$readPreference": rp };
    // A tag set no member of shard B matches: `secondary` cannot be satisfied there...
    let err = demo
        .run_command(find(
            doc! { "mode": "secondary", "tags": [{ "node": "a1" }] },
        ))
        .await
        .expect_err("shard B has no a1");
    assert_eq!(code(&err), 133, "{err}");
    // ...while secondaryPreferred falls back to shard B's primary.
    let r = demo
        .run_command(find(
            doc! { "mode": "secondaryPreferred", "tags": [{ "node": "a1" }] },
        ))
        .await
        .expect("secondaryPreferred");
    let n = r
        .get_document("cursor")
        .and_then(|c| c.get_array("firstBatch"))
        .map(|b| b.len());
    assert_eq!(n.ok(), Some(2000));
    sim.shutdown().await;
}

/// The Rust driver 3.9 sends tag sets as `$readPreference.tagSets`; mongos reads only
/// `tags` and ignores unknown fields, so the tags never apply (any secondary serves).
#[tokio::test]
async fn rust_driver_tag_sets_do_not_reach_mongos() {
    let sim = start(config()).await;
    let c = client(&sim).await;
    let tag = [("node".to_string(), "a1".to_string())]
        .into_iter()
        .collect();
    let opts = ReadPreferenceOptions::builder().tag_sets(vec![tag]).build();
    let secondary_a1 = SelectionCriteria::ReadPreference(ReadPreference::Secondary {
        options: Some(opts),
    });
    let docs: Vec<Document> = inventory(&c)
        .find(doc! {})
        .selection_criteria(secondary_a1)
        .await
        .expect("tags ignored: shard B serves from any secondary")
        .try_collect()
        .await
        .expect("docs");
    assert_eq!(docs.len(), 2000);
    sim.shutdown().await;
}

/// `available` cannot be combined with a causal session's afterClusterTime (72), as the
/// server says; outside a session it is fine.
#[tokio::test]
async fn available_with_after_cluster_time_is_invalid_options() {
    let sim = start(config()).await;
    let c = client(&sim).await;
    let coll = payments(&c);
    let mut session = c
        .start_session()
        .causal_consistency(true)
        .await
        .expect("session");
    coll.find_one(doc! { "_id": 1 })
        .session(&mut session)
        .await
        .expect("first read sets operationTime");
    let err = coll
        .find(doc! {})
        .read_concern(ReadConcern::available())
        .session(&mut session)
        .await
        .expect_err("refused");
    assert_eq!(code(&err), 72, "{err}");
    assert!(err.to_string().contains(
        "afterClusterTime field can be set only if level is equal to majority, local, or snapshot"
    ));
    let direct = c
        .database("pay")
        .run_command(doc! { "find": "transactions", "readConcern": { "level": "available", "afterClusterTime": bson::Timestamp { time: 1, increment: 1 } } })
        .await
        .expect_err("refused");
    assert_eq!(code(&direct), 72);
    let n: Vec<Document> = coll
        .find(doc! {})
        .read_concern(ReadConcern::available())
        .await
        .expect("find")
        .try_collect()
        .await
        .expect("docs");
    assert_eq!(n.len(), 300);
    sim.shutdown().await;
}

// ---- plain driver operations --------------------------------------------------------------

#[tokio::test]
async fn driver_crud_and_explain() {
    let sim = start(config()).await;
    let c = client(&sim).await;
    let coll = c.database("demo").collection::<Document>("orders");
    let docs: Vec<Document> = (0..250)
        .map(|i| doc! { "_id": i, "store": i % 5, "qty": 2 })
        .collect();
    coll.insert_many(docs).await.expect("insert_many");
    let all: Vec<Document> = coll
        .find(doc! {})
        .batch_size(40)
        .await
        .expect("find")
        .try_collect()
        .await
        .expect("getMore");
    assert_eq!(all.len(), 250);
    assert_eq!(
        coll.count_documents(doc! { "store": 3 })
            .await
            .expect("count"),
        50
    );
    assert_eq!(
        coll.estimated_document_count().await.expect("estimate"),
        250
    );
    let mut stores = coll.distinct("store", doc! {}).await.expect("distinct");
    stores.sort_by_key(|b| b.as_i32());
    assert_eq!(stores, (0..5).map(Bson::Int32).collect::<Vec<_>>());
    let groups: Vec<Document> = coll
        .aggregate(vec![
            doc! { "$match": { "store": { "$lt": 2 } } },
            doc! { "$group": { "_id": "$store", "total": { "$sum": "$qty" }, "n": { "$sum": 1 } } },
            doc! { "$sort": { "_id": 1 } },
        ])
        .await
        .expect("aggregate")
        .try_collect()
        .await
        .expect("docs");
    assert_eq!(
        groups,
        vec![
            doc! { "_id": 0, "total": 100, "n": 50 },
            doc! { "_id": 1, "total": 100, "n": 50 }
        ]
    );
    let r = coll
        .update_many(doc! { "store": 0 }, doc! { "$inc": { "qty": 1 } })
        .await
        .expect("update");
    assert_eq!((r.matched_count, r.modified_count), (50, 50));
    let r = coll
        .update_one(doc! { "_id": 1000 }, doc! { "$set": { "store": 9 } })
        .upsert(true)
        .await
        .expect("upsert");
    assert_eq!(r.upserted_id, Some(Bson::Int32(1000)));
    let r = coll.delete_many(doc! { "store": 4 }).await.expect("delete");
    assert_eq!(r.deleted_count, 50);
    assert_eq!(coll.count_documents(doc! {}).await.expect("count"), 201);
    let err = coll
        .insert_one(doc! { "_id": 1 })
        .await
        .expect_err("duplicate");
    assert_eq!(code(&err), 11000);

    // Sharded collections: explain names the shards mongos targets.
    let inv = inventory(&c);
    let one = explain_shards(
        &inv,
        "demo",
        doc! { "_id": { "productId": 1, "storeId": 1 } },
    )
    .await;
    assert_eq!(one.len(), 1);
    let all = explain_shards(&inv, "demo", doc! { "qty": 10 }).await;
    assert_eq!(all, vec!["shardA", "shardB"]);
    let found = inv
        .find_one(doc! { "_id": { "productId": 1, "storeId": 1 } })
        .await
        .expect("find_one");
    assert_eq!(
        found,
        Some(doc! { "_id": { "productId": 1, "storeId": 1 }, "qty": 10 })
    );
    let r = inv
        .update_one(
            doc! { "_id": { "productId": 1, "storeId": 1 } },
            doc! { "$inc": { "qty": -1 } },
        )
        .await
        .expect("targeted update");
    assert_eq!(r.modified_count, 1);
    let err = inv
        .update_one(doc! { "qty": 10 }, doc! { "$inc": { "qty": -1 } })
        .await
        .expect_err("needs _id");
    assert_eq!(code(&err), 61);
    let unknown = c
        .database("admin")
        .run_command(doc! { "frobnicate": 1 })
        .await
        .expect_err("unknown");
    assert_eq!(code(&unknown), 59);
    sim.shutdown().await;
}

#[tokio::test]
async fn compressed_connections() {
    let sim = start(config()).await;
    for compressor in ["snappy", "zlib", "zstd"] {
        let c = client_for(
            sim.addr().to_string(),
            &format!("&compressors={compressor}"),
        )
        .await;
        let docs: Vec<Document> = inventory(&c)
            .find(doc! { "_id.productId": 3 })
            .await
            .expect("find")
            .try_collect()
            .await
            .expect("docs");
        assert_eq!(docs.len(), 20, "{compressor}");
        c.database("t")
            .collection::<Document>(compressor)
            .insert_one(doc! { "x": 1 })
            .await
            .expect("insert");
    }
    sim.shutdown().await;
}

#[tokio::test]
async fn sim_control_command() {
    let sim = start(config()).await;
    let c = client(&sim).await;
    let admin = c.database("admin");
    let r = admin
        .run_command(doc! { "simControl": "stallPrimary", "shard": "shardB" })
        .await
        .expect("stall");
    assert_eq!(r.get_bool("stalled").ok(), Some(true));
    let r = admin
        .run_command(doc! { "simControl": "restartNode", "node": "b2" })
        .await
        .expect("restart");
    assert_eq!(
        r.get_array("lostTables").map(|a| a.len()).ok(),
        Some(0),
        "b2 had loaded nothing"
    );
    let r = admin
        .run_command(doc! { "simControl": "resumePrimary", "shard": "shardB" })
        .await
        .expect("resume");
    assert_eq!(r.get_i64("completedWrites").ok(), Some(0));
    let r = admin
        .run_command(doc! { "simControl": "moveChunk", "ns": "pay.transactions", "find": { "_id": 1 }, "to": "shardA", "deleteAfter": 0 })
        .await;
    let r = match r {
        Ok(r) => r,
        Err(e) if code(&e) == 20 => admin
            .run_command(doc! { "simControl": "moveChunk", "ns": "pay.transactions", "find": { "_id": 1 }, "to": "shardB", "deleteAfter": 0 })
            .await
            .expect("moveChunk"),
        Err(e) => panic!("moveChunk: {e}"),
    };
    assert_eq!(
        r.get_document("version")
            .and_then(|v| v.get_i64("major"))
            .ok(),
        Some(2)
    );
    let r = admin
        .run_command(doc! { "simControl": "configure", "refreshTimeoutMS": 250 })
        .await
        .expect("configure");
    assert_eq!(
        r.get_document("settings")
            .and_then(|s| s.get_i64("refreshTimeoutMS"))
            .ok(),
        Some(250)
    );
    let s = admin
        .run_command(doc! { "simControl": "status" })
        .await
        .expect("status");
    let nodes = s.get_array("nodes").expect("nodes");
    assert_eq!(nodes.len(), 6);
    let b2 = nodes
        .iter()
        .filter_map(Bson::as_document)
        .find(|n| n.get_str("name").ok() == Some("b2"))
        .expect("b2");
    assert_eq!(b2.get_i64("restarts").ok(), Some(1));
    let err = admin
        .run_command(doc! { "simControl": "explode" })
        .await
        .expect_err("unknown action");
    assert_eq!(code(&err), 2);
    let err = c
        .database("demo")
        .run_command(doc! { "simControl": "status" })
        .await
        .expect_err("admin only");
    assert_eq!(code(&err), 13);
    sim.shutdown().await;
}
