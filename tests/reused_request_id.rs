//! Issue 20 item 8: a request that reuses the requestID of a followed read or write still
//! waiting for its reply closes its client (no driver does this), so that another
//! message's reply is never taken for the followed one. Raw sockets against the proxy and
//! the fake mongos (which serves each connection in order); the official driver, with many
//! requests in flight on several connections, is never closed.

use crate::policy_support;
use crate::support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bson::{doc, rawdoc, Document, RawDocumentBuf};
use bytes::Bytes;
use futures::TryStreamExt;
use mongodb::options::{ReadPreference, SelectionCriteria};
use staleguard::breaker::State;

use policy_support::{Env, BASE_NAMESPACES};
use support::mongos::Hooked;
use support::raw::{self, RawClient};
use support::within;

/// How long the fake mongos takes on the finds and inserts these tests follow, so that they
/// are still waiting when the next request arrives.
const SLOW: Duration = Duration::from_millis(400);

fn secondary_find(id: i32, db: &str, coll: &str) -> Bytes {
    raw::msg(
        id,
        0,
        &rawdoc! {
            "find": coll,
            "filter": {},
            "$readPreference": {"mode": "secondary"},
            "$db": db,
        },
    )
}

fn ping(id: i32) -> Bytes {
    raw::msg(id, 0, &rawdoc! {"ping": 1, "$db": "admin"})
}

fn insert(id: i32, n: i32) -> Bytes {
    let docs: Vec<RawDocumentBuf> = vec![rawdoc! {"n": n}];
    raw::msg_with_sequence(
        id,
        0,
        &rawdoc! {"insert": "ledger", "$db": "pay"},
        "documents",
        &docs,
    )
}

fn reused_hits(env: &Env) -> u64 {
    let m = env.proxy.shared().metrics.render();
    let line = "staleguard_limit_hits_total{limit=\"reused_request_id\"} ";
    m.lines()
        .find_map(|l| l.strip_prefix(line))
        .unwrap_or_else(|| panic!("no {line}in\n{m}"))
        .parse()
        .expect("a count")
}

/// The commands named `name` that reached the fake mongos.
fn reached(env: &Env, name: &str) -> usize {
    env.fake
        .received_commands()
        .iter()
        .filter(|(n, _)| n == name)
        .count()
}

fn slow_finds_and_inserts(env: &Env) {
    env.fake.set_hook(|body| {
        (body.get_str("find").is_ok() || body.get_str("insert").is_ok())
            .then(|| Hooked::delay(SLOW))
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ping_reusing_a_governed_reads_request_id_closes_that_client_only() {
    let env = Env::start(BASE_NAMESPACES).await;
    env.fake
        .seed("pay.transactions", [rawdoc! {"_id": 1, "amount": 5}]);
    slow_finds_and_inserts(&env);
    // A victim uses the same id on its own connection: ids are per connection.
    let mut victim = RawClient::connect(env.proxy_addr()).await;
    victim.send(&secondary_find(7, "pay", "transactions")).await;
    let mut attacker = RawClient::connect(env.proxy_addr()).await;
    attacker
        .send(&secondary_find(7, "pay", "transactions"))
        .await;
    // Sent once the read is followed (the proxy has forwarded it).
    env.fake
        .wait_for("both finds reached mongos", |log| {
            log.commands.iter().filter(|(n, _)| n == "find").count() == 2
        })
        .await;
    attacker.send(&ping(7)).await;
    let before_close = attacker.expect_closed().await;
    assert!(
        before_close.is_empty(),
        "closed without answering either: {before_close:?}"
    );
    assert_eq!(reached(&env, "ping"), 0, "the ping never reached mongos");
    assert_eq!(reused_hits(&env), 1);

    // The victim's read is answered as usual, and its connection goes on.
    let reply = victim.recv().await;
    assert_eq!(raw::header(&reply).response_to, 7);
    let body = policy_support::body(&reply);
    assert_eq!(body.get_f64("ok").ok(), Some(1.0), "{body:?}");
    let batch = body
        .get_document("cursor")
        .and_then(|c| c.get_array("firstBatch"))
        .expect("firstBatch");
    assert_eq!(batch.into_iter().count(), 1);
    // Reusing an id whose reply has come is no reuse.
    let reply = victim.roundtrip(&ping(7)).await;
    assert_eq!(raw::header(&reply).response_to, 7);
    assert_eq!(reused_hits(&env), 1);
    assert_eq!(env.state("pay.transactions"), State::Closed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_reusing_a_waiting_writes_request_id_closes_the_client() {
    // The default config file watches writes (the passive write-stall signal).
    let env = Env::start(BASE_NAMESPACES).await;
    slow_finds_and_inserts(&env);
    let mut attacker = RawClient::connect(env.proxy_addr()).await;
    attacker.send(&insert(5, 1)).await;
    env.fake
        .wait_for("the insert reached mongos", |log| {
            log.commands.iter().any(|(n, _)| n == "insert")
        })
        .await;
    attacker.send(&insert(5, 2)).await;
    assert!(attacker.expect_closed().await.is_empty());
    assert_eq!(reached(&env, "insert"), 1, "the second insert was not sent");
    assert_eq!(reused_hits(&env), 1);
}

/// A fallback read met by StaleConfig is resent (`available`) behind whatever the client
/// sent meanwhile: a message with the read's id sent in between would be answered first and
/// taken for the resend's reply. It closes the client instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reused_id_cannot_answer_a_resent_read() {
    let env = Env::start(BASE_NAMESPACES).await;
    env.fake.set_hook(|body| {
        let available = body
            .get_document("readConcern")
            .ok()
            .and_then(|rc| rc.get_str("level").ok())
            == Some("available");
        (body.get_str("find").ok() == Some("store_inventory") && !available)
            .then(|| Hooked::error(13388, "StaleConfig", "stale").after(SLOW))
    });
    let mut attacker = RawClient::connect(env.proxy_addr()).await;
    attacker
        .send(&secondary_find(9, "demo", "store_inventory"))
        .await;
    env.fake
        .wait_for("the find reached mongos", |log| {
            log.commands.iter().any(|(n, _)| n == "find")
        })
        .await;
    attacker.send(&ping(9)).await;
    assert!(attacker.expect_closed().await.is_empty());
    assert_eq!(reached(&env, "ping"), 0);
    assert_eq!(reused_hits(&env), 1);
}

/// A fallback namespace whose breaker opens after three errors and probes 200 ms later; a
/// probe whose client vanishes would hold its slot for `cooldown` (30 s).
const QUICK_PROBE: &str = r#"
[[namespaces]]
pattern = "demo.store_inventory"
mode = "fallback"
threshold = 3
window = "10s"
cooldown = "30s"
min_cooldown = "200ms"
min_connections = 1
per_connection = 1000
min_wait = "0s"
"#;

fn available(body: &bson::RawDocument) -> bool {
    body.get_document("readConcern")
        .ok()
        .and_then(|rc| rc.get_str("level").ok())
        == Some("available")
}

/// The probe of an open breaker is pending when its client reuses its id: the client is
/// closed, the probe ends unjudged (no answer stands for it) and its slot is free at once,
/// so the next client's read is the probe, not an `available` read kept waiting 30 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_probe_whose_client_reuses_its_id_gives_its_slot_back() {
    let env = Env::start(QUICK_PROBE).await;
    let stale = Arc::new(AtomicBool::new(true));
    let flag = stale.clone();
    env.fake.set_hook(move |body| {
        if body.get_str("find").ok() != Some("store_inventory") || available(body) {
            return None;
        }
        Some(if flag.load(Ordering::Relaxed) {
            Hooked::error(13388, "StaleConfig", "stale")
        } else {
            Hooked::delay(SLOW)
        })
    });
    let mut c = RawClient::connect(env.proxy_addr()).await;
    for id in 1..=3 {
        // Met StaleConfig, answered by the `available` resend.
        let reply = c
            .roundtrip(&secondary_find(id, "demo", "store_inventory"))
            .await;
        assert_eq!(raw::header(&reply).response_to, id);
    }
    assert_eq!(env.state("demo.store_inventory"), State::Open);
    stale.store(false, Ordering::Relaxed);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let unmodified = |env: &Env| {
        env.fake
            .received_commands()
            .iter()
            .filter(|(n, b)| n == "find" && !available(b))
            .count()
    };
    let before = unmodified(&env);
    // The probe (sent unmodified), then a ping with its id.
    let mut attacker = RawClient::connect(env.proxy_addr()).await;
    attacker
        .send(&secondary_find(9, "demo", "store_inventory"))
        .await;
    env.fake
        .wait_for("the probe reached mongos", |log| {
            log.commands
                .iter()
                .filter(|(n, b)| n == "find" && !available(b))
                .count()
                > before
        })
        .await;
    attacker.send(&ping(9)).await;
    assert!(attacker.expect_closed().await.is_empty());
    assert_eq!(reused_hits(&env), 1);
    assert_eq!(env.state("demo.store_inventory"), State::Open);
    // The next read is the probe at once: unmodified, answered by the healthy fake.
    let mut next = RawClient::connect(env.proxy_addr()).await;
    let reply = next
        .roundtrip(&secondary_find(1, "demo", "store_inventory"))
        .await;
    assert_eq!(raw::header(&reply).response_to, 1);
    assert_eq!(
        unmodified(&env),
        before + 2,
        "the next read went as a probe, not `available`"
    );
}

/// The driver keeps many reads and writes in flight on several connections and is never
/// closed: its requestIDs are unique.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drivers_are_never_closed() {
    let env = Env::start(BASE_NAMESPACES).await;
    env.fake.seed(
        "pay.transactions",
        (0..20).map(|i| rawdoc! {"_id": i, "amount": i}),
    );
    env.fake.set_hook(|body| {
        (body.get_str("find").is_ok() || body.get_str("insert").is_ok())
            .then(|| Hooked::delay(Duration::from_millis(20)))
    });
    let client = env.client("&maxPoolSize=8").await;
    let secondary = SelectionCriteria::ReadPreference(ReadPreference::Secondary {
        options: Default::default(),
    });
    let mut tasks = tokio::task::JoinSet::new();
    for t in 0..16 {
        let pay = client.database("pay");
        let secondary = secondary.clone();
        tasks.spawn(async move {
            for i in 0..15 {
                let reads = pay.collection::<Document>("transactions");
                let docs: Vec<Document> = reads
                    .find(doc! {})
                    .selection_criteria(secondary.clone())
                    .await
                    .expect("find")
                    .try_collect()
                    .await
                    .expect("batches");
                assert_eq!(docs.len(), 20);
                pay.collection::<Document>("ledger")
                    .insert_one(doc! {"task": t, "i": i})
                    .await
                    .expect("insert");
            }
        });
    }
    within("the driver's reads and writes", async {
        while let Some(done) = tasks.join_next().await {
            done.expect("task");
        }
    })
    .await;
    assert_eq!(reused_hits(&env), 0);
    assert_eq!(env.fake.documents("pay.ledger").len(), 16 * 15);
}
