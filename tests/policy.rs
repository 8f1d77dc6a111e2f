//! End-to-end tests of the read policy (design.md, "Decision rules" and "Breaker"):
//! official `mongodb` driver → recording tap → staleguard → fake mongos whose hooks script
//! StaleConfig errors, time limits and slow replies.
//!
//! Every test asserts what reached the fake byte for byte against what the driver sent (the
//! tap's copy), so "forwarded" means the very same bytes and "rewritten" means only
//! `readConcern` / `maxTimeMS` changed. Breaker cooldowns that tests wait out are 300ms of real
//! time (no paused clock: the driver's own timers and sockets run on the real clock).

use crate::policy_support;
use crate::support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bson::{doc, rawdoc, Document, RawDocument, RawDocumentBuf, Timestamp};
use futures::TryStreamExt;
use mongodb::options::{CollectionOptions, ReadConcern, ReadPreference, SelectionCriteria};
use mongodb::{Client, Collection};
use staleguard::breaker::State;
use staleguard::command::{classify, Ns};
use staleguard::config::Mode;
use staleguard::policy::{self, ReadKind};
use staleguard::wire::OpCode;

use policy_support::*;
use support::mongos::Hooked;
use support::raw::{self, RawClient};
use support::within;

const INVENTORY: &str = "demo.store_inventory";
const ACCOUNTS: &str = "pay.accounts";

// ---------------------------------------------------------------------------------------
// Small driver helpers

fn secondary() -> SelectionCriteria {
    SelectionCriteria::ReadPreference(ReadPreference::Secondary { options: None })
}

fn pref(mode: &str) -> Option<SelectionCriteria> {
    let p = match mode {
        "primary" => return None,
        "secondary" => ReadPreference::Secondary { options: None },
        "secondaryPreferred" => ReadPreference::SecondaryPreferred { options: None },
        "primaryPreferred" => ReadPreference::PrimaryPreferred { options: None },
        "nearest" => ReadPreference::Nearest { options: None },
        other => panic!("unknown mode {other}"),
    };
    Some(SelectionCriteria::ReadPreference(p))
}

/// `db.coll` with read preference `mode` ("primary" = the driver's default, no
/// `$readPreference` on the wire) and an optional read concern.
fn coll(client: &Client, ns: &str, mode: &str, rc: Option<ReadConcern>) -> Collection<Document> {
    let (db, name) = ns.split_once('.').expect("db.coll");
    let opts = CollectionOptions::builder()
        .selection_criteria(pref(mode))
        .read_concern(rc)
        .build();
    client.database(db).collection_with_options(name, opts)
}

/// `find({})` with an optional `maxTimeMS`, all documents collected.
async fn find(
    c: &Collection<Document>,
    max_time: Option<Duration>,
) -> mongodb::error::Result<Vec<Document>> {
    within("driver find", async {
        let mut f = c.find(doc! {});
        if let Some(t) = max_time {
            f = f.max_time(t);
        }
        f.await?.try_collect().await
    })
    .await
}

/// Asserts `got` equals `sent` except for `changed` keys, element for element and in order.
fn assert_same_except(sent: &RawDocument, got: &RawDocument, changed: &[&str]) {
    assert_eq!(
        without(sent, changed),
        without(got, changed),
        "fields other than {changed:?} must be unchanged\n sent: {sent:?}\n  got: {got:?}"
    );
}

/// Asserts the last `find` on `coll` reached the fake exactly as the driver sent it.
/// A cheap read of staleguard's own (`confirm`): its projection keeps nothing.
fn cheap(msg: &[u8]) -> bool {
    msg.windows(26).any(|w| w == b"staleguard_confirm_nothing")
}

/// Messages carrying `name` on `coll` that reached the fake mongos for clients (staleguard's
/// own cheap reads left out).
fn proxied(env: &Env, name: &str, coll: &str) -> Vec<bytes::Bytes> {
    let mut up = env.upstream(name, coll);
    up.retain(|m| !cheap(m));
    up
}

/// The cheap reads of `coll` that reached the fake mongos.
fn cheap_reads(env: &Env, coll: &str) -> usize {
    env.upstream("find", coll)
        .iter()
        .filter(|m| cheap(m))
        .count()
}

fn assert_last_forwarded(env: &Env, name: &str, coll: &str) {
    let up = proxied(env, name, coll);
    let sent = env.sent_by_driver(name, coll);
    let (Some(u), Some(s)) = (up.last(), sent.last()) else {
        panic!(
            "no {name} on {coll}: upstream {} sent {}",
            up.len(),
            sent.len()
        );
    };
    assert_eq!(u, s, "{name} on {coll} must be forwarded byte for byte");
}

/// Runs `n` secondary finds on `c` that are expected to succeed (fallback: retried).
async fn finds_ok(c: &Collection<Document>, n: usize) {
    for i in 0..n {
        find(c, None)
            .await
            .unwrap_or_else(|e| panic!("find {i} should succeed: {e}"));
    }
}

/// Runs `n` finds on `c` that are expected to fail with `code`.
async fn finds_fail(c: &Collection<Document>, n: usize, code: i32) {
    for i in 0..n {
        let e = find(c, None).await.expect_err("find should fail");
        assert_eq!(command_error(&e).0, code, "find {i}: {e}");
    }
}

// ---------------------------------------------------------------------------------------
// Fallback namespace: breaker closed → forward, resend with `available` on a trigger error

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fallback_closed_trigger_error_is_resent_with_available() {
    let env = Env::start(BASE_NAMESPACES).await;
    env.fake.seed(INVENTORY, seed_docs(5));
    let delay = Duration::from_millis(150);
    let fault = stale_reads(&env.fake, "store_inventory", 13388, delay);
    let client = env.client("").await;
    let c = coll(&client, INVENTORY, "secondary", None);

    let docs = find(&c, Some(Duration::from_secs(5)))
        .await
        .expect("the driver must get the documents, never the StaleConfig");
    assert_eq!(docs.len(), 5);
    assert_eq!(docs[0], doc! { "_id": 0, "item": "item 0" });
    assert_eq!(fault.hits(), 1);

    let sent = env.sent_by_driver("find", "store_inventory");
    assert_eq!(sent.len(), 1, "the driver sent one find and saw no error");
    let up = env.upstream("find", "store_inventory");
    assert_eq!(up.len(), 2, "original, then one resend");
    assert_eq!(up[0], sent[0], "the first attempt is the driver's bytes");
    let original = body(&up[0]);
    assert_eq!(read_concern(&original), None);
    assert_eq!(max_time_ms(&original), Some(5000));
    assert_eq!(
        original
            .get_document("$readPreference")
            .expect("$readPreference"),
        &*rawdoc! { "mode": "secondary" }
    );

    let resend = body(&up[1]);
    assert_eq!(read_concern(&resend), Some(available()));
    let budget = max_time_ms(&resend).expect("resend carries maxTimeMS");
    println!("resend maxTimeMS = {budget} (original 5000, 150ms spent before the error)");
    assert!(
        budget > 0 && budget <= 5000 - 150,
        "maxTimeMS must be reduced by the time spent: {budget}"
    );
    assert!(
        budget >= 5000 - 3000,
        "too much time counted as spent: {budget}"
    );
    assert_same_except(&original, &resend, &["readConcern", "maxTimeMS"]);
    assert_eq!(
        raw::header(&up[1]).request_id,
        raw::header(&up[0]).request_id,
        "the resend keeps the client's requestID so the reply still answers the client"
    );

    assert_eq!(env.state(INVENTORY), State::Closed);
    assert_eq!(env.errors(INVENTORY), 1, "the error was counted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fallback_retry_covers_find_aggregate_count_distinct_and_all_trigger_codes() {
    let env = Env::start(BASE_NAMESPACES).await;
    env.fake.seed(INVENTORY, seed_docs(4));
    // `distinct` is not served by the fake: answer it here, failing it like the others.
    let code = Arc::new(std::sync::atomic::AtomicI32::new(13388));
    let c2 = code.clone();
    env.fake.set_hook(move |b| {
        if !is_read_on(b, "store_inventory") {
            return None;
        }
        if level(b).as_deref() != Some("available") {
            let code = c2.load(Ordering::SeqCst);
            return Some(Hooked::error(code, code_name(code), "scripted"));
        }
        (command_name(b) == "distinct")
            .then(|| Hooked::reply(rawdoc! { "values": ["a", "b"], "ok": 1.0 }))
    });
    let client = env.client("").await;
    let c = coll(&client, INVENTORY, "secondaryPreferred", None);

    // find
    assert_eq!(find(&c, None).await.expect("find").len(), 4);
    // aggregate
    let agg: Vec<Document> = within("aggregate", async {
        c.aggregate(vec![doc! { "$match": {} }])
            .await?
            .try_collect()
            .await
    })
    .await
    .expect("aggregate");
    assert_eq!(agg.len(), 4);
    assert_eq!(env.errors(INVENTORY), 2);
    // The breaker would open at 3 errors: count and distinct get a fresh proxy.
    for (name, up) in [("find", 2), ("aggregate", 2)] {
        let msgs = env.upstream_bodies(name, "store_inventory");
        assert_eq!(msgs.len(), up, "{name}: original + resend");
        assert_eq!(read_concern(&msgs[0]), None);
        assert_eq!(read_concern(&msgs[1]), Some(available()));
        assert_same_except(&msgs[0], &msgs[1], &["readConcern"]);
    }

    let env2 = Env::start(BASE_NAMESPACES).await;
    env2.fake.seed(INVENTORY, seed_docs(4));
    let c3 = code.clone();
    env2.fake.set_hook(move |b| {
        if !is_read_on(b, "store_inventory") {
            return None;
        }
        if level(b).as_deref() != Some("available") {
            let code = c3.load(Ordering::SeqCst);
            return Some(Hooked::error(code, code_name(code), "scripted"));
        }
        (command_name(b) == "distinct")
            .then(|| Hooked::reply(rawdoc! { "values": ["a", "b"], "ok": 1.0 }))
    });
    let client2 = env2.client("").await;
    let c = coll(&client2, INVENTORY, "nearest", None);
    code.store(50, Ordering::SeqCst);
    let n = within("count", c.estimated_document_count())
        .await
        .expect("count");
    assert_eq!(n, 4);
    code.store(249, Ordering::SeqCst);
    let values = within("distinct", c.distinct("item", doc! {}))
        .await
        .expect("distinct");
    assert_eq!(values, vec![bson::Bson::from("a"), bson::Bson::from("b")]);
    for name in ["count", "distinct"] {
        let msgs = env2.upstream_bodies(name, "store_inventory");
        assert_eq!(msgs.len(), 2, "{name}: original + resend");
        assert_eq!(read_concern(&msgs[0]), None);
        assert_eq!(read_concern(&msgs[1]), Some(available()));
        assert_same_except(&msgs[0], &msgs[1], &["readConcern"]);
    }
    // 249 counts at once; the 50 counts once the confirming read fails too.
    wait_errors(&env2, INVENTORY, 2).await;
    assert_eq!(env2.state(INVENTORY), State::Closed);

    // Every default trigger code is retried (fresh proxy per code so the breaker stays closed);
    // the time limits are counted once a confirming read (limit 1) fails too.
    for trigger in [13388, 63, 150, 249, 50, 262, 89, 133, 202] {
        let confirmed = matches!(trigger, 50 | 262 | 89 | 202);
        let env = Env::start(BASE_NAMESPACES).await;
        env.fake.seed(INVENTORY, seed_docs(1));
        let fault = stale_reads(&env.fake, "store_inventory", trigger, Duration::ZERO);
        let client = env.client("").await;
        let c = coll(&client, INVENTORY, "secondary", None);
        let docs = find(&c, None)
            .await
            .unwrap_or_else(|e| panic!("code {trigger} must be retried: {e}"));
        assert_eq!(docs.len(), 1, "code {trigger}");
        wait_errors(&env, INVENTORY, 1).await;
        // The time limits are asked about with three cheap reads, which fail too.
        let cheap = if confirmed { 3 } else { 0 };
        assert_eq!(fault.hits(), 1 + cheap as u64, "code {trigger}");
        let all = env.upstream_bodies("find", "store_inventory");
        let (asked, up): (Vec<_>, Vec<_>) = all.into_iter().partition(|b| is_confirm(b));
        assert_eq!(up.len(), 2, "code {trigger}: original + resend");
        assert_eq!(read_concern(&up[1]), Some(available()), "code {trigger}");
        assert_eq!(
            asked.len(),
            cheap,
            "code {trigger}: the question's cheap reads"
        );
    }

    // A non-trigger error is neither retried nor counted.
    let env = Env::start(BASE_NAMESPACES).await;
    let _fault = stale_reads(&env.fake, "store_inventory", 11000, Duration::ZERO);
    let client = env.client("").await;
    let c = coll(&client, INVENTORY, "secondary", None);
    finds_fail(&c, 1, 11000).await;
    assert_eq!(env.upstream("find", "store_inventory").len(), 1);
    assert_last_forwarded(&env, "find", "store_inventory");
    assert_eq!(env.errors(INVENTORY), 0);
}

/// Waits (at most 5 s) until the breaker of `ns` holds `n` errors.
async fn wait_errors(env: &Env, ns: &str, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while env.errors(ns) < n {
        assert!(
            Instant::now() < deadline,
            "{ns}: {} errors, want {n}",
            env.errors(ns)
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(env.errors(ns), n, "{ns}");
}

// ---------------------------------------------------------------------------------------
// Fallback namespace: threshold → open → rewritten before sending

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fallback_threshold_opens_breaker_then_reads_are_rewritten_before_sending() {
    let env = Env::start(BASE_NAMESPACES).await;
    env.fake.seed(INVENTORY, seed_docs(3));
    let fault = stale_reads(&env.fake, "store_inventory", 13388, Duration::ZERO);
    let client = env.client("").await;
    let c = coll(&client, INVENTORY, "secondary", None);

    finds_ok(&c, 2).await;
    assert_eq!(env.state(INVENTORY), State::Closed);
    assert_eq!(env.errors(INVENTORY), 2);
    finds_ok(&c, 1).await;
    assert_eq!(
        env.state(INVENTORY),
        State::Open,
        "3 errors within the window"
    );
    assert_eq!(fault.hits(), 3);
    assert_eq!(env.upstream("find", "store_inventory").len(), 6);

    let docs = find(&c, Some(Duration::from_millis(2500)))
        .await
        .expect("find");
    assert_eq!(docs.len(), 3);
    assert_eq!(
        fault.hits(),
        3,
        "no error first: the read arrived already rewritten"
    );
    let up = env.upstream_bodies("find", "store_inventory");
    assert_eq!(up.len(), 7, "exactly one message for the fourth read");
    let sent = env.driver_bodies("find", "store_inventory");
    assert_eq!(sent.len(), 4);
    let (last_up, last_sent) = (&up[6], &sent[3]);
    assert_eq!(read_concern(last_sent), None);
    assert_eq!(read_concern(last_up), Some(available()));
    assert_eq!(
        max_time_ms(last_up),
        Some(2500),
        "no cap configured: maxTimeMS unchanged"
    );
    assert_same_except(last_sent, last_up, &["readConcern"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fallback_open_probes_go_unmodified_a_streak_closes_a_failure_backs_off() {
    let ns = BASE_NAMESPACES
        .replace("cooldown = \"30s\"", "cooldown = \"300ms\"")
        .replace("min_cooldown = \"30s\"", "min_cooldown = \"300ms\"");
    let env = Env::start(&ns).await;
    env.fake.seed(INVENTORY, seed_docs(2));
    let fault = stale_reads(&env.fake, "store_inventory", 13388, Duration::ZERO);
    let client = env.client("").await;
    let c = coll(&client, INVENTORY, "secondary", None);

    finds_ok(&c, 3).await;
    assert_eq!(env.state(INVENTORY), State::Open);
    tokio::time::sleep(Duration::from_millis(400)).await;

    // The probes: sent unmodified. One answer does not close the breaker; answers in a
    // row spanning min_cooldown (300 ms) do. After an answer the next read may probe at
    // once; here one connection reads, and probes go round robin, so it waits its turn
    // (min_cooldown past the due time) between probes.
    fault.set(false);
    let asked = cheap_reads(&env, "store_inventory");
    for i in 0..3 {
        if i > 0 {
            tokio::time::sleep(Duration::from_millis(320)).await;
        }
        let before = proxied(&env, "find", "store_inventory").len();
        assert_eq!(find(&c, None).await.expect("probe").len(), 2);
        let up = proxied(&env, "find", "store_inventory");
        assert_eq!(up.len(), before + 1);
        assert_last_forwarded(&env, "find", "store_inventory");
        assert_eq!(read_concern(&body(up.last().unwrap())), None);
        if i < 2 {
            assert_eq!(env.state(INVENTORY), State::Open, "answer {i}: not yet");
        }
    }
    // The streak asks the cluster first: twelve cheap reads, all answered, close it.
    env.wait_state(INVENTORY, State::Closed).await;
    assert_eq!(
        cheap_reads(&env, "store_inventory") - asked,
        staleguard::breaker::CLOSE_READS,
        "a streak of answers asks, and the cluster's answers close"
    );
    assert_eq!(env.errors(INVENTORY), 0, "closing clears the window");

    // Closed again: reads go unmodified.
    find(&c, None).await.expect("closed read");
    assert_last_forwarded(&env, "find", "store_inventory");

    // Open again, wait, and fail the probe: it stays open, and the client still gets data.
    fault.set(true);
    finds_ok(&c, 3).await;
    assert_eq!(env.state(INVENTORY), State::Open);
    tokio::time::sleep(Duration::from_millis(400)).await;
    let before = proxied(&env, "find", "store_inventory").len();
    let hits = fault.hits();
    assert_eq!(
        find(&c, None).await.expect("failed probe is retried").len(),
        2
    );
    let up = proxied(&env, "find", "store_inventory");
    assert_eq!(
        up.len(),
        before + 2,
        "the probe, then the resend with available"
    );
    assert_eq!(
        up[before],
        *env.sent_by_driver("find", "store_inventory")
            .last()
            .unwrap()
    );
    assert_eq!(read_concern(&body(&up[before + 1])), Some(available()));
    assert_eq!(fault.hits(), hits + 1);
    assert_eq!(
        env.state(INVENTORY),
        State::Open,
        "a failed probe keeps it open"
    );

    // The next probe waits again: the next read is rewritten before sending.
    find(&c, None).await.expect("rewritten read");
    let up = proxied(&env, "find", "store_inventory");
    assert_eq!(up.len(), before + 3);
    assert_eq!(read_concern(&body(up.last().unwrap())), Some(available()));
    assert_eq!(fault.hits(), hits + 1);
}

// ---------------------------------------------------------------------------------------
// Strict namespace

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strict_closed_forwards_counts_and_the_error_reaches_the_client() {
    let env = Env::start(BASE_NAMESPACES).await;
    env.fake.seed(ACCOUNTS, seed_docs(2));
    let fault = stale_reads(&env.fake, "accounts", 13388, Duration::ZERO);
    let client = env.client("").await;
    let c = coll(&client, ACCOUNTS, "secondary", None);

    let e = find(&c, Some(Duration::from_secs(10)))
        .await
        .expect_err("strict: error reaches the client");
    let (code, name, msg) = command_error(&e);
    assert_eq!((code, name.as_str()), (13388, "StaleConfig"));
    assert_eq!(
        msg, "scripted StaleConfig on accounts",
        "the upstream's own error"
    );
    assert_eq!(
        env.upstream("find", "accounts").len(),
        1,
        "not retried by the proxy"
    );
    assert_eq!(
        env.sent_by_driver("find", "accounts").len(),
        1,
        "not retried by the driver"
    );
    assert_last_forwarded(&env, "find", "accounts");
    assert_eq!(env.errors(ACCOUNTS), 1);
    assert_eq!(env.state(ACCOUNTS), State::Closed);

    // A healthy strict read is forwarded as is.
    fault.set(false);
    assert_eq!(find(&c, None).await.expect("healthy").len(), 2);
    assert_last_forwarded(&env, "find", "accounts");
    assert_eq!(
        env.errors(ACCOUNTS),
        1,
        "a success does not clear a closed window"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strict_max_time_is_capped() {
    let ns = r#"
[[namespaces]]
pattern = "pay.*"
mode = "strict"
max_time = "500ms"
"#;
    let env = Env::start(ns).await;
    env.fake.seed(ACCOUNTS, seed_docs(1));
    let client = env.client("").await;
    let c = coll(&client, ACCOUNTS, "secondary", None);

    // Client 10 s, cap 500ms → 500.
    find(&c, Some(Duration::from_secs(10))).await.expect("find");
    let (sent, up) = (
        env.driver_bodies("find", "accounts"),
        env.upstream_bodies("find", "accounts"),
    );
    assert_eq!(max_time_ms(&sent[0]), Some(10_000));
    assert_eq!(max_time_ms(&up[0]), Some(500));
    assert_same_except(&sent[0], &up[0], &["maxTimeMS"]);
    assert_eq!(read_concern(&up[0]), None);

    // Client 100 → unchanged (byte for byte).
    find(&c, Some(Duration::from_millis(100)))
        .await
        .expect("find");
    assert_last_forwarded(&env, "find", "accounts");
    assert_eq!(
        max_time_ms(&env.upstream_bodies("find", "accounts")[1]),
        Some(100)
    );

    // No maxTimeMS from the client → the cap is added.
    find(&c, None).await.expect("find");
    let (sent, up) = (
        env.driver_bodies("find", "accounts"),
        env.upstream_bodies("find", "accounts"),
    );
    assert_eq!(max_time_ms(&sent[2]), None);
    assert_eq!(max_time_ms(&up[2]), Some(500));
    assert_same_except(&sent[2], &up[2], &["maxTimeMS"]);

    // A primary read is not eligible: not capped.
    let p = coll(&client, ACCOUNTS, "primary", None);
    find(&p, Some(Duration::from_secs(10))).await.expect("find");
    assert_last_forwarded(&env, "find", "accounts");
}

/// Opens the breaker of `ns` with three `code` errors, then checks the fail-fast reply.
async fn strict_fail_fast(code: i32, want_code: i32, want_name: &str, reason: &str) {
    let env = Env::start(BASE_NAMESPACES).await;
    env.fake.seed(ACCOUNTS, seed_docs(2));
    let _fault = stale_reads(&env.fake, "accounts", code, Duration::ZERO);
    let client = env.client("").await;
    let c = coll(&client, ACCOUNTS, "secondary", None);

    finds_fail(&c, 3, code).await;
    // A time limit counts once its confirming read (sent after the reply) fails too.
    env.wait_state(ACCOUNTS, State::Open).await;
    let upstream_before = env.upstream_count();
    let driver_before = env.sent_by_driver("find", "accounts").len();

    // Warm: the connection is pooled, so the timing below is the proxy's answer only.
    let started = Instant::now();
    let e = find(&c, Some(Duration::from_secs(10)))
        .await
        .expect_err("fail fast");
    let took = started.elapsed();
    println!("fail-fast reply after {took:?}");
    let (got_code, got_name, msg) = command_error(&e);
    println!("fail-fast errmsg: {msg}");
    assert_eq!((got_code, got_name.as_str()), (want_code, want_name));
    assert!(msg.starts_with("staleguard:"), "{msg}");
    assert!(msg.contains("pay.accounts"), "names the namespace: {msg}");
    assert!(msg.contains(reason), "names the reason: {msg}");
    assert!(msg.contains("not sent to mongos"), "{msg}");
    assert!(
        !msg.contains("probe"),
        "never says when it probes again: {msg}"
    );
    assert!(took < Duration::from_millis(50), "fail fast took {took:?}");
    assert!(e.labels().is_empty(), "no retry labels: {:?}", e.labels());

    // Give a driver retry time to show up, then check nothing more was sent anywhere.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        env.sent_by_driver("find", "accounts").len(),
        driver_before + 1,
        "the driver did not retry"
    );
    assert_eq!(
        env.upstream_count(),
        upstream_before,
        "nothing was sent upstream"
    );
    assert_eq!(env.state(ACCOUNTS), State::Open);

    // The connection is still good (no socket close): a ping works on it.
    within(
        "ping",
        client.database("admin").run_command(doc! { "ping": 1 }),
    )
    .await
    .expect("ping after fail-fast");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strict_open_fails_fast_with_stale_config() {
    strict_fail_fast(13388, 13388, "StaleConfig", "stale routing").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strict_open_on_time_limits_fails_fast_with_code_50() {
    strict_fail_fast(50, 50, "MaxTimeMSExpired", "time limits").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strict_refusing_breaker_probes_then_closes_on_a_streak() {
    let ns = BASE_NAMESPACES
        .replace("cooldown = \"30s\"", "cooldown = \"300ms\"")
        .replace("min_cooldown = \"30s\"", "min_cooldown = \"300ms\"");
    let env = Env::start(&ns).await;
    env.fake.seed(ACCOUNTS, seed_docs(1));
    let fault = stale_reads(&env.fake, "accounts", 13388, Duration::ZERO);
    let client = env.client("").await;
    let c = coll(&client, ACCOUNTS, "secondary", None);

    finds_fail(&c, 3, 13388).await;
    assert_eq!(env.state(ACCOUNTS), State::Open);
    let up = env.upstream("find", "accounts").len();
    let e = find(&c, None).await.expect_err("open: fail fast");
    assert!(command_error(&e).2.starts_with("staleguard:"));
    assert_eq!(env.upstream("find", "accounts").len(), up);

    // After min_cooldown: a failing probe goes out unmodified, its error reaches the client,
    // and the breaker stays open; the next probe waits again.
    tokio::time::sleep(Duration::from_millis(400)).await;
    let e = find(&c, None).await.expect_err("probe fails");
    assert_eq!(command_error(&e).2, "scripted StaleConfig on accounts");
    assert_eq!(env.upstream("find", "accounts").len(), up + 1);
    assert_last_forwarded(&env, "find", "accounts");
    assert_eq!(env.state(ACCOUNTS), State::Open);
    let e = find(&c, None).await.expect_err("still open: fail fast");
    assert!(command_error(&e).2.starts_with("staleguard:"));
    assert_eq!(env.upstream("find", "accounts").len(), up + 1);

    // After another wait: answered probes, in a row over min_cooldown, close it. One
    // connection reads here, and probes go round robin: the one that took the last probe
    // waits min_cooldown past the due time for another to take the next.
    tokio::time::sleep(Duration::from_millis(700)).await;
    fault.set(false);
    let asked = cheap_reads(&env, "accounts");
    for i in 0..3 {
        if i > 0 {
            tokio::time::sleep(Duration::from_millis(320)).await;
        }
        assert_eq!(find(&c, None).await.expect("probe succeeds").len(), 1);
        assert_last_forwarded(&env, "find", "accounts");
    }
    // The streak asks the cluster first (twelve cheap reads, all answered) and then closes.
    env.wait_state(ACCOUNTS, State::Closed).await;
    assert_eq!(
        cheap_reads(&env, "accounts") - asked,
        staleguard::breaker::CLOSE_READS
    );
    find(&c, None).await.expect("closed");
    assert_eq!(proxied(&env, "find", "accounts").len(), up + 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strict_read_asking_for_available_is_refused() {
    let env = Env::start(BASE_NAMESPACES).await;
    env.fake.seed(ACCOUNTS, seed_docs(1));
    let client = env.client("").await;
    for mode in ["secondary", "nearest", "primary"] {
        let c = coll(&client, ACCOUNTS, mode, Some(ReadConcern::available()));
        let before = env.upstream_count();
        let started = Instant::now();
        let e = find(&c, None).await.expect_err("refused");
        let took = started.elapsed();
        let (code, name, msg) = command_error(&e);
        println!("{mode}: refused after {took:?}: {code} {name} {msg}");
        assert_eq!((code, name.as_str()), (72, "InvalidOptions"), "{mode}");
        assert!(msg.starts_with("staleguard:"), "{msg}");
        assert!(msg.contains("pay.accounts"), "{msg}");
        assert!(msg.contains("available"), "{msg}");
        assert_eq!(
            env.upstream_count(),
            before,
            "{mode}: nothing sent upstream"
        );
    }
    assert_eq!(env.upstream("find", "accounts").len(), 0);
    assert_eq!(
        env.sent_by_driver("find", "accounts").len(),
        3,
        "no driver retries"
    );
    assert!(
        env.breaker_namespaces().is_empty(),
        "a refusal is not a breaker error"
    );

    // Aggregate and count too.
    let c = coll(
        &client,
        ACCOUNTS,
        "secondary",
        Some(ReadConcern::available()),
    );
    let e = within("aggregate", c.aggregate(vec![doc! { "$match": {} }]))
        .await
        .expect_err("refused");
    assert_eq!(command_error(&e).0, 72);
    let e = within("count", c.estimated_document_count())
        .await
        .expect_err("refused");
    assert_eq!(command_error(&e).0, 72);
    assert_eq!(env.upstream("aggregate", "accounts").len(), 0);
    assert_eq!(env.upstream("count", "accounts").len(), 0);
}

// ---------------------------------------------------------------------------------------
// Fallback asking for available; unlisted namespaces

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fallback_read_asking_for_available_is_forwarded_unchanged() {
    let env = Env::start(BASE_NAMESPACES).await;
    env.fake.seed(INVENTORY, seed_docs(2));
    let _fault = stale_reads(&env.fake, "store_inventory", 13388, Duration::ZERO);
    let client = env.client("").await;
    let plain = coll(&client, INVENTORY, "secondary", None);
    let avail = coll(
        &client,
        INVENTORY,
        "secondary",
        Some(ReadConcern::available()),
    );

    assert_eq!(find(&avail, None).await.expect("available read").len(), 2);
    assert_eq!(env.upstream("find", "store_inventory").len(), 1);
    assert_last_forwarded(&env, "find", "store_inventory");

    // Also while the breaker is open.
    finds_ok(&plain, 3).await;
    assert_eq!(env.state(INVENTORY), State::Open);
    assert_eq!(find(&avail, None).await.expect("available read").len(), 2);
    assert_last_forwarded(&env, "find", "store_inventory");
    assert_eq!(
        level(&body(
            env.upstream("find", "store_inventory").last().unwrap()
        ))
        .as_deref(),
        Some("available")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unlisted_namespace_is_forwarded_byte_identical_even_during_errors() {
    let env = Env::start(BASE_NAMESPACES).await;
    let _fault = stale_reads(&env.fake, "other", 13388, Duration::ZERO);
    let client = env.client("").await;
    let c = coll(&client, "demo.other", "secondary", None);
    for i in 0..4 {
        let e = find(&c, Some(Duration::from_secs(1)))
            .await
            .expect_err("error passes through");
        assert_eq!(
            command_error(&e).2,
            "scripted StaleConfig on other",
            "find {i}"
        );
        let (up, sent) = (
            env.upstream("find", "other"),
            env.sent_by_driver("find", "other"),
        );
        assert_eq!(up.len(), i + 1, "not retried");
        assert_eq!(sent.len(), i + 1, "not retried by the driver");
        assert_eq!(up[i], sent[i], "byte for byte");
    }
    assert!(
        env.breaker_namespaces().is_empty(),
        "no breaker for an unlisted namespace"
    );
    assert_eq!(env.state("demo.other"), State::Closed);
}

// ---------------------------------------------------------------------------------------
// Strictest wins

const STRICTEST_NAMESPACES: &str = r#"
[defaults]
# One driver client walks the table: its own errors and short waits must count.
min_connections = 1
per_connection = 1000
min_wait = "0s"

[[namespaces]]
pattern = "demo.store_inventory"
mode = "fallback"

[[namespaces]]
pattern = "pay.*"
mode = "strict"
on_open = "refuse"

[[namespaces]]
pattern = "pay.cache"
mode = "fallback"
"#;

/// Answers every aggregate with an empty cursor, or with StaleConfig while `stale` is set and
/// the aggregate does not ask for `available`; reads of `store_inventory` fail the same way.
fn aggregate_hook(env: &Env, stale: Arc<AtomicBool>) {
    env.fake.set_hook(move |b| {
        let name = command_name(b);
        let is_available = level(b).as_deref() == Some("available");
        if stale.load(Ordering::SeqCst) && !is_available && matches!(name, "aggregate" | "find") {
            return Some(Hooked::error(13388, "StaleConfig", "scripted StaleConfig"));
        }
        (name == "aggregate").then(|| {
            let ns = format!(
                "{}.{}",
                b.get_str("$db").unwrap_or(""),
                collection(b).unwrap_or_default()
            );
            Hooked::reply(cursor_reply(&ns, &[]))
        })
    });
}

/// The governing namespace `policy::resolve` picks for `body` under `env`'s config.
fn governing(env: &Env, body: &RawDocument) -> Option<(String, Mode, ReadKind)> {
    let info = classify(body).expect("classify");
    policy::resolve(&info, &env.config.policy).map(|t| {
        let Ns { db, coll } = t.ns;
        (format!("{db}.{coll}"), t.mode, t.kind)
    })
}

async fn aggregate(
    c: &Collection<Document>,
    pipeline: Vec<Document>,
) -> mongodb::error::Result<Vec<Document>> {
    within("driver aggregate", async {
        c.aggregate(pipeline).await?.try_collect().await
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strictest_wins_lookup_from_strict_namespace() {
    let env = Env::start(STRICTEST_NAMESPACES).await;
    let stale = Arc::new(AtomicBool::new(true));
    aggregate_hook(&env, stale.clone());
    let client = env.client("").await;
    let cache = coll(&client, "pay.cache", "secondary", None);
    let lookup = vec![
        doc! { "$lookup": { "from": "x", "localField": "a", "foreignField": "b", "as": "joined" } },
    ];

    // What the driver sends, classified: pay.x (strict) governs, not pay.cache (fallback).
    let wire = rawdoc! {
        "aggregate": "cache",
        "pipeline": [ { "$lookup": { "from": "x", "localField": "a", "foreignField": "b", "as": "joined" } } ],
        "cursor": {},
        "$db": "pay",
        "$readPreference": { "mode": "secondary" },
    };
    assert_eq!(
        governing(&env, &wire),
        Some(("pay.x".to_string(), Mode::Strict, ReadKind::Eligible))
    );

    // Closed: errors reach the client (strict: no resend with available), counted on pay.x.
    for i in 0..3 {
        let e = aggregate(&cache, lookup.clone())
            .await
            .expect_err("strict error");
        assert_eq!(command_error(&e).0, 13388, "aggregate {i}");
        assert_eq!(
            env.upstream("aggregate", "cache").len(),
            i + 1,
            "not resent"
        );
        assert_last_forwarded(&env, "aggregate", "cache");
    }
    // The real body matches the classified one.
    assert_eq!(
        governing(&env, &env.driver_bodies("aggregate", "cache")[0]).map(|g| g.0),
        Some("pay.x".to_string())
    );
    assert_eq!(env.state("pay.x"), State::Open);
    assert_eq!(env.errors("pay.x"), 3);
    assert_eq!(
        env.breaker_namespaces(),
        vec!["pay.x".to_string()],
        "pay.cache has no breaker"
    );

    // Open: fail fast, naming pay.x; nothing sent.
    let before = env.upstream_count();
    let e = aggregate(&cache, lookup.clone())
        .await
        .expect_err("fail fast");
    let (code, _, msg) = command_error(&e);
    assert_eq!(code, 13388);
    assert!(
        msg.starts_with("staleguard:") && msg.contains("pay.x"),
        "{msg}"
    );
    assert_eq!(env.upstream_count(), before);

    // A plain read of pay.cache (fallback, its own breaker closed) is unaffected.
    stale.store(false, Ordering::SeqCst);
    aggregate(&cache, vec![doc! { "$match": {} }])
        .await
        .expect("pay.cache alone");
    assert_last_forwarded(&env, "aggregate", "cache");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strictest_wins_through_nested_union_with_and_facet() {
    let env = Env::start(STRICTEST_NAMESPACES).await;
    let stale = Arc::new(AtomicBool::new(true));
    aggregate_hook(&env, stale.clone());
    let client = env.client("").await;
    let inventory = coll(&client, INVENTORY, "secondary", None);
    let other = coll(&client, "demo.other", "secondary", None);
    let cache = coll(&client, "pay.cache", "secondary", None);

    // Open demo.store_inventory's breaker (fallback reads, retried).
    finds_ok(&inventory, 3).await;
    assert_eq!(env.state(INVENTORY), State::Open);

    // A fallback collection whose pipeline reaches pay.y through $unionWith → $facet → $lookup.
    let deep = vec![
        doc! { "$match": {} },
        doc! { "$unionWith": { "coll": "u", "pipeline": [
            { "$facet": { "f": [ { "$lookup": { "from": { "db": "pay", "coll": "y" }, "pipeline": [], "as": "p" } } ] } }
        ] } },
    ];
    let wire = rawdoc! {
        "aggregate": "store_inventory",
        "pipeline": [
            { "$match": {} },
            { "$unionWith": { "coll": "u", "pipeline": [
                { "$facet": { "f": [ { "$lookup": { "from": { "db": "pay", "coll": "y" }, "pipeline": [], "as": "p" } } ] } }
            ] } },
        ],
        "cursor": {},
        "$db": "demo",
        "$readPreference": { "mode": "secondary" },
    };
    assert_eq!(
        governing(&env, &wire),
        Some(("pay.y".to_string(), Mode::Strict, ReadKind::Eligible))
    );
    // pay.y closed: tracked as strict, so NOT rewritten although store_inventory is open.
    stale.store(false, Ordering::SeqCst);
    aggregate(&inventory, deep.clone())
        .await
        .expect("forwarded");
    assert_last_forwarded(&env, "aggregate", "store_inventory");
    assert_eq!(
        read_concern(&env.upstream_bodies("aggregate", "store_inventory")[0]),
        None
    );

    // Errors count on pay.y and reach the client; three open pay.y.
    stale.store(true, Ordering::SeqCst);
    for _ in 0..3 {
        let e = aggregate(&inventory, deep.clone())
            .await
            .expect_err("strict error");
        assert_eq!(command_error(&e).2, "scripted StaleConfig");
        assert_last_forwarded(&env, "aggregate", "store_inventory");
    }
    assert_eq!(env.state("pay.y"), State::Open);
    assert_eq!(env.upstream("aggregate", "store_inventory").len(), 4);

    // Now it fails fast, from the fallback collection and from an unlisted one.
    let before = env.upstream_count();
    let e = aggregate(&inventory, deep.clone())
        .await
        .expect_err("fail fast");
    let msg = command_error(&e).2;
    assert!(
        msg.starts_with("staleguard:") && msg.contains("pay.y"),
        "{msg}"
    );
    let e = aggregate(&other, deep.clone())
        .await
        .expect_err("fail fast (unlisted primary)");
    assert!(command_error(&e).2.contains("pay.y"));
    // $lookup on a same-database strict collection from a fallback one in `pay`, nested in a
    // $facet.
    let facet = vec![
        doc! { "$facet": { "a": [ { "$match": {} } ], "b": [ { "$lookup": { "from": "y", "pipeline": [], "as": "p" } } ] } },
    ];
    let e = aggregate(&cache, facet)
        .await
        .expect_err("fail fast via $facet");
    assert!(command_error(&e).2.contains("pay.y"));
    assert_eq!(env.upstream_count(), before, "nothing sent upstream");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unlisted_primary_namespace_reading_a_fallback_one_is_left_alone() {
    let env = Env::start(STRICTEST_NAMESPACES).await;
    let stale = Arc::new(AtomicBool::new(true));
    aggregate_hook(&env, stale.clone());
    let client = env.client("").await;
    finds_ok(&coll(&client, INVENTORY, "secondary", None), 3).await;
    assert_eq!(env.state(INVENTORY), State::Open);

    let other = coll(&client, "demo.other", "secondary", None);
    let pipeline = vec![
        doc! { "$lookup": { "from": "store_inventory", "localField": "a", "foreignField": "b", "as": "j" } },
    ];
    let wire = rawdoc! {
        "aggregate": "other",
        "pipeline": [ { "$lookup": { "from": "store_inventory", "localField": "a", "foreignField": "b", "as": "j" } } ],
        "cursor": {},
        "$db": "demo",
        "$readPreference": { "mode": "secondary" },
    };
    assert_eq!(
        governing(&env, &wire),
        None,
        "fallback acts only on its own primary namespace"
    );
    let e = aggregate(&other, pipeline).await.expect_err("error passes");
    assert_eq!(command_error(&e).0, 13388);
    assert_eq!(env.upstream("aggregate", "other").len(), 1);
    assert_last_forwarded(&env, "aggregate", "other");
}

// ---------------------------------------------------------------------------------------
// Causal consistency

const CAUSAL_NAMESPACES: &str = r#"
[defaults]
# One driver client walks the table: its own errors and short waits must count.
min_connections = 1
per_connection = 1000
min_wait = "0s"

[[namespaces]]
pattern = "demo.store_inventory"
mode = "fallback"

[[namespaces]]
pattern = "demo.causal_skip"
mode = "fallback"
causal = "skip"
"#;

/// A faithful-enough mongos for causal reads: replies carry `operationTime`; `available`
/// with `afterClusterTime` is rejected (InvalidOptions, as the server does); while `stale`,
/// other reads fail with StaleConfig.
fn causal_hook(env: &Env, stale: Arc<AtomicBool>, op_time: Timestamp) {
    env.fake.set_hook(move |b| {
        if command_name(b) != "find" {
            return None;
        }
        let ns = format!("{}.{}", b.get_str("$db").unwrap_or(""), collection(b).unwrap_or_default());
        let rc = b.get_document("readConcern").ok();
        let after = rc.is_some_and(|r| r.get("afterClusterTime").ok().flatten().is_some());
        let available = level(b).as_deref() == Some("available");
        if available && after {
            return Some(Hooked::error(
                72,
                "InvalidOptions",
                "afterClusterTime field can be set only if level is equal to majority, local, or snapshot",
            ));
        }
        if stale.load(Ordering::SeqCst) && !available {
            let mut e = support_error(13388, "StaleConfig");
            e.append(bson::raw::cstr!("operationTime"), op_time);
            return Some(Hooked::reply(e));
        }
        let mut r = cursor_reply(&ns, &seed_docs(2));
        r.append(bson::raw::cstr!("operationTime"), op_time);
        Some(Hooked::reply(r))
    });
}

fn support_error(code: i32, name: &str) -> RawDocumentBuf {
    staleguard::wire::reply::error_body(code, name, "scripted")
}

async fn session_find(
    c: &Collection<Document>,
    s: &mut mongodb::ClientSession,
) -> mongodb::error::Result<Vec<Document>> {
    within("session find", async {
        let mut cursor = c.find(doc! {}).session(&mut *s).await?;
        cursor.stream(s).try_collect().await
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn causal_rewrite_drops_after_cluster_time() {
    let env = Env::start(CAUSAL_NAMESPACES).await;
    let stale = Arc::new(AtomicBool::new(false));
    let t = Timestamp {
        time: 1_700_000_000,
        increment: 7,
    };
    causal_hook(&env, stale.clone(), t);
    let client = env.client("").await;
    let c = coll(&client, INVENTORY, "secondary", None);
    let mut s = within("session", client.start_session().causal_consistency(true))
        .await
        .expect("session");

    // First read: no operationTime yet, so no afterClusterTime.
    session_find(&c, &mut s).await.expect("first read");
    assert_eq!(
        read_concern(&env.driver_bodies("find", "store_inventory")[0]),
        None
    );

    // Closed breaker, StaleConfig: the resend drops afterClusterTime.
    stale.store(true, Ordering::SeqCst);
    let docs = session_find(&c, &mut s)
        .await
        .expect("retried without afterClusterTime");
    assert_eq!(docs.len(), 2);
    let sent = env.driver_bodies("find", "store_inventory");
    assert_eq!(
        read_concern(&sent[1]),
        Some(rawdoc! { "afterClusterTime": t }),
        "the driver sent a causal read"
    );
    let up = env.upstream_bodies("find", "store_inventory");
    assert_eq!(up.len(), 3);
    assert_eq!(up[1], sent[1]);
    assert_eq!(
        read_concern(&up[2]),
        Some(available()),
        "afterClusterTime dropped"
    );
    assert_same_except(&sent[1], &up[2], &["readConcern"]);

    // Open breaker: the preemptive rewrite drops it too.
    finds_ok(&c, 2).await;
    assert_eq!(env.state(INVENTORY), State::Open);
    session_find(&c, &mut s).await.expect("rewritten");
    let sent = env.driver_bodies("find", "store_inventory");
    let up = env.upstream_bodies("find", "store_inventory");
    let (last_sent, last_up) = (sent.last().unwrap(), up.last().unwrap());
    assert_eq!(
        read_concern(last_sent),
        Some(rawdoc! { "afterClusterTime": t })
    );
    assert_eq!(read_concern(last_up), Some(available()));
    assert_same_except(last_sent, last_up, &["readConcern"]);
    assert_eq!(up.len(), 3 + 4 + 1, "one message, no error first");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn causal_skip_leaves_causal_reads_alone() {
    let env = Env::start(CAUSAL_NAMESPACES).await;
    let stale = Arc::new(AtomicBool::new(true));
    let t = Timestamp {
        time: 1_700_000_001,
        increment: 1,
    };
    causal_hook(&env, stale.clone(), t);
    let client = env.client("").await;
    let c = coll(&client, "demo.causal_skip", "secondary", None);

    // Non-causal reads are still retried and open the breaker.
    finds_ok(&c, 3).await;
    assert_eq!(env.state("demo.causal_skip"), State::Open);

    let mut s = within("session", client.start_session().causal_consistency(true))
        .await
        .expect("session");
    // No operationTime yet: an ordinary read, rewritten (breaker open).
    session_find(&c, &mut s).await.expect("first session read");
    assert_eq!(
        level(env.upstream_bodies("find", "causal_skip").last().unwrap()).as_deref(),
        Some("available")
    );

    // Causal read: left alone, byte for byte, even with the breaker open; its error shows.
    let before = env.upstream("find", "causal_skip").len();
    let e = session_find(&c, &mut s).await.expect_err("left alone");
    assert_eq!(command_error(&e).0, 13388);
    let up = env.upstream("find", "causal_skip");
    assert_eq!(up.len(), before + 1, "not retried");
    assert_last_forwarded(&env, "find", "causal_skip");
    assert_eq!(
        read_concern(&body(up.last().unwrap())),
        Some(rawdoc! { "afterClusterTime": t })
    );

    // And with the breaker closed (fresh proxy) the causal read is not resent either.
    let env = Env::start(CAUSAL_NAMESPACES).await;
    causal_hook(&env, stale.clone(), t);
    let client = env.client("").await;
    let c = coll(&client, "demo.causal_skip", "secondary", None);
    let mut s = within("session", client.start_session().causal_consistency(true))
        .await
        .expect("session");
    stale.store(false, Ordering::SeqCst);
    session_find(&c, &mut s).await.expect("first");
    stale.store(true, Ordering::SeqCst);
    let e = session_find(&c, &mut s).await.expect_err("not resent");
    assert_eq!(command_error(&e).0, 13388);
    assert_eq!(env.upstream("find", "causal_skip").len(), 2);
    assert_last_forwarded(&env, "find", "causal_skip");
}

// ---------------------------------------------------------------------------------------
// Reads the policy never touches

/// An env with both breakers (demo.store_inventory, pay.accounts) open and faults still on.
async fn both_open() -> (Env, Client) {
    let env = Env::start(BASE_NAMESPACES).await;
    env.fake.seed(INVENTORY, seed_docs(5));
    env.fake.seed(ACCOUNTS, seed_docs(5));
    let on = Arc::new(AtomicBool::new(true));
    let flag = on.clone();
    env.fake.set_hook(move |b| {
        let name = command_name(b);
        let coll = collection(b).unwrap_or_default();
        let targeted = coll == "store_inventory" || coll == "accounts";
        let plain_read = matches!(name, "find" | "count" | "distinct")
            || (name == "aggregate"
                && !b.get_array("pipeline").is_ok_and(|p| {
                    p.into_iter().flatten().any(|s| {
                        s.as_document().is_some_and(|d| {
                            d.get("$out").ok().flatten().is_some()
                                || d.get("$merge").ok().flatten().is_some()
                        })
                    })
                }));
        if targeted
            && plain_read
            && flag.load(Ordering::SeqCst)
            && level(b).as_deref() != Some("available")
        {
            return Some(Hooked::error(13388, "StaleConfig", "scripted StaleConfig"));
        }
        match name {
            "explain" => Some(Hooked::reply(
                rawdoc! { "queryPlanner": { "namespace": "x" }, "ok": 1.0 },
            )),
            "aggregate" => Some(Hooked::reply(cursor_reply("x.y", &[]))),
            _ => None,
        }
    });
    let client = env.client("").await;
    finds_ok(&coll(&client, INVENTORY, "secondary", None), 3).await;
    finds_fail(&coll(&client, ACCOUNTS, "secondary", None), 3, 13388).await;
    assert_eq!(env.state(INVENTORY), State::Open);
    assert_eq!(env.state(ACCOUNTS), State::Open);
    on.store(false, Ordering::SeqCst);
    (env, client)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn primary_and_unlisted_read_preferences_are_never_touched_even_when_open() {
    let (env, client) = both_open().await;
    for ns in [INVENTORY, ACCOUNTS] {
        let coll_name = ns.split_once('.').unwrap().1;
        for mode in ["primary", "primaryPreferred"] {
            let c = coll(&client, ns, mode, None);
            let before = env.upstream("find", coll_name).len();
            let docs = find(&c, Some(Duration::from_secs(3)))
                .await
                .unwrap_or_else(|e| panic!("{ns} {mode}: {e}"));
            assert_eq!(docs.len(), 5);
            assert_eq!(
                env.upstream("find", coll_name).len(),
                before + 1,
                "{ns} {mode}"
            );
            assert_last_forwarded(&env, "find", coll_name);
            let b = body(env.upstream("find", coll_name).last().unwrap());
            assert_eq!(read_concern(&b), None);
            assert_eq!(
                b.get("$readPreference").ok().flatten().is_some(),
                mode != "primary"
            );
        }
        // A write on the namespace is forwarded too.
        let c = coll(&client, ns, "primary", None);
        within("insert", c.insert_one(doc! { "_id": 100 }))
            .await
            .expect("insert");
        assert_last_forwarded(&env, "insert", coll_name);
    }
    assert_eq!(env.state(INVENTORY), State::Open);
    assert_eq!(env.state(ACCOUNTS), State::Open);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn primary_reads_errors_are_not_retried_or_counted() {
    let env = Env::start(BASE_NAMESPACES).await;
    let _fault = stale_reads(&env.fake, "store_inventory", 13388, Duration::ZERO);
    let client = env.client("").await;
    let c = coll(&client, INVENTORY, "primary", None);
    finds_fail(&c, 4, 13388).await;
    assert_eq!(env.upstream("find", "store_inventory").len(), 4);
    assert_last_forwarded(&env, "find", "store_inventory");
    assert_eq!(env.errors(INVENTORY), 0);
    assert_eq!(env.state(INVENTORY), State::Closed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_more_is_never_rewritten() {
    let (env, client) = both_open().await;
    // Fallback: the find is rewritten, its getMores are not.
    let c = coll(&client, INVENTORY, "secondary", None);
    let docs: Vec<Document> = within("find batches", async {
        c.find(doc! {}).batch_size(2).await?.try_collect().await
    })
    .await
    .expect("cursor");
    assert_eq!(docs.len(), 5);
    assert_eq!(
        level(
            env.upstream_bodies("find", "store_inventory")
                .last()
                .unwrap()
        )
        .as_deref(),
        Some("available")
    );
    let (up, sent) = (
        env.upstream("getMore", "store_inventory"),
        env.sent_by_driver("getMore", "store_inventory"),
    );
    assert_eq!(up.len(), 2);
    assert_eq!(up, sent, "getMore forwarded byte for byte");

    // Strict: a cursor opened before the breaker opened keeps working.
    let env = Env::start(BASE_NAMESPACES).await;
    env.fake.seed(ACCOUNTS, seed_docs(5));
    let client = env.client("").await;
    let c = coll(&client, ACCOUNTS, "secondary", None);
    let mut cursor = within("find", c.find(doc! {}).batch_size(2))
        .await
        .expect("find");
    let first = within("first", cursor.try_next())
        .await
        .expect("first")
        .expect("doc");
    assert_eq!(first.get_i32("_id").ok(), Some(0));
    let fault = stale_reads(&env.fake, "accounts", 13388, Duration::ZERO);
    finds_fail(&c, 3, 13388).await;
    assert_eq!(env.state(ACCOUNTS), State::Open);
    fault.set(false);
    let rest: Vec<Document> = within("rest", cursor.try_collect()).await.expect("getMore");
    assert_eq!(rest.len(), 4);
    let (up, sent) = (
        env.upstream("getMore", "accounts"),
        env.sent_by_driver("getMore", "accounts"),
    );
    assert_eq!(up.len(), 2);
    assert_eq!(up, sent);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_out_merge_and_snapshot_reads_are_untouched() {
    let (env, client) = both_open().await;
    for (db, coll_name) in [("demo", "store_inventory"), ("pay", "accounts")] {
        let database = client.database(db);
        // explain
        let r = within(
            "explain",
            database
                .run_command(doc! { "explain": { "find": coll_name, "filter": {} }, "verbosity": "queryPlanner" })
                .selection_criteria(secondary()),
        )
        .await
        .unwrap_or_else(|e| panic!("explain on {db}: {e}"));
        assert_eq!(r.get_f64("ok").ok(), Some(1.0));
        let explain_up: Vec<_> = env
            .fake
            .received()
            .into_iter()
            .filter(|m| try_body(m).is_some_and(|b| command_name(&b) == "explain"))
            .collect();
        let explain_sent: Vec<_> = env
            .tap
            .to_server()
            .into_iter()
            .filter(|m| try_body(m).is_some_and(|b| command_name(&b) == "explain"))
            .collect();
        assert_eq!(
            explain_up, explain_sent,
            "explain on {db} forwarded byte for byte"
        );
        let b = body(explain_up.last().unwrap());
        assert_eq!(
            b.get_document("$readPreference").ok().map(|d| d.to_owned()),
            Some(rawdoc! { "mode": "secondary" })
        );

        // $out and $merge pipelines
        let c = coll(&client, &format!("{db}.{coll_name}"), "secondary", None);
        for stage in [
            doc! { "$out": "copy" },
            doc! { "$merge": { "into": "copy" } },
        ] {
            let before = env.upstream("aggregate", coll_name).len();
            aggregate(&c, vec![doc! { "$match": {} }, stage.clone()])
                .await
                .unwrap_or_else(|e| panic!("{stage} on {db}: {e}"));
            assert_eq!(env.upstream("aggregate", coll_name).len(), before + 1);
            assert_last_forwarded(&env, "aggregate", coll_name);
        }

        // snapshot reads (and anything with atClusterTime)
        for rc in [
            doc! { "level": "snapshot" },
            doc! { "level": "snapshot", "atClusterTime": Timestamp { time: 1_700_000_000, increment: 1 } },
            doc! { "level": "linearizable" },
        ] {
            let before = env.upstream("find", coll_name).len();
            let r = within(
                "snapshot find",
                database
                    .run_command(
                        doc! { "find": coll_name, "filter": {}, "readConcern": rc.clone() },
                    )
                    .selection_criteria(secondary()),
            )
            .await
            .unwrap_or_else(|e| panic!("{rc} on {db}: {e}"));
            assert_eq!(r.get_f64("ok").ok(), Some(1.0));
            assert_eq!(env.upstream("find", coll_name).len(), before + 1);
            assert_last_forwarded(&env, "find", coll_name);
        }
    }
    assert_eq!(env.state(INVENTORY), State::Open);
    assert_eq!(env.state(ACCOUNTS), State::Open);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transaction_reads_are_untouched() {
    let (env, _client) = both_open().await;
    let mut conn = RawClient::connect(env.proxy_addr()).await;
    let lsid = rawdoc! { "id": bson::Binary { subtype: bson::spec::BinarySubtype::Uuid, bytes: vec![7; 16] } };
    let mut id = 1;
    for (db, coll_name) in [("demo", "store_inventory"), ("pay", "accounts")] {
        // First statement (startTransaction), then a later one; both with a secondary
        // preference so that only the transaction fields make them ineligible.
        for first in [true, false] {
            let mut cmd = rawdoc! {
                "find": coll_name,
                "filter": {},
                "$db": db,
                "$readPreference": { "mode": "secondary" },
                "lsid": lsid.clone(),
                "txnNumber": 1_i64,
            };
            if first {
                cmd.append(bson::raw::cstr!("startTransaction"), true);
            }
            cmd.append(bson::raw::cstr!("autocommit"), false);
            let msg = raw::msg(id, 0, &cmd);
            id += 1;
            let before = env.fake.received().len();
            let reply = conn.roundtrip(&msg).await;
            let rb = raw::body(&reply);
            assert_eq!(
                rb.get_f64("ok").ok(),
                Some(1.0),
                "{db} first={first}: {rb:?}"
            );
            let received = env.fake.received();
            assert_eq!(received.len(), before + 1);
            assert_eq!(received[before], msg, "{db} first={first}: byte for byte");
        }
    }
    // With the fault on, a transaction read's error is passed through, not retried.
    let env = Env::start(BASE_NAMESPACES).await;
    let _fault = stale_reads(&env.fake, "store_inventory", 13388, Duration::ZERO);
    let mut conn = RawClient::connect(env.proxy_addr()).await;
    let cmd = rawdoc! {
        "find": "store_inventory", "filter": {}, "$db": "demo",
        "$readPreference": { "mode": "secondary" },
        "lsid": lsid.clone(), "txnNumber": 2_i64, "startTransaction": true, "autocommit": false,
    };
    let reply = conn.roundtrip(&raw::msg(99, 0, &cmd)).await;
    assert_eq!(raw::body(&reply).get_i32("code").ok(), Some(13388));
    assert_eq!(raw::header(&reply).response_to, 99);
    assert_eq!(env.upstream("find", "store_inventory").len(), 1);
    assert_eq!(env.errors(INVENTORY), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn driver_transaction_is_untouched() {
    let (env, client) = both_open().await;
    env.fake.set_hook(|b| {
        matches!(command_name(b), "commitTransaction" | "abortTransaction")
            .then(|| Hooked::reply(rawdoc! { "ok": 1.0 }))
    });
    let mut s = within("session", client.start_session())
        .await
        .expect("session");
    within("start", s.start_transaction())
        .await
        .expect("start transaction");
    for ns in [INVENTORY, ACCOUNTS] {
        let c = coll(&client, ns, "primary", None);
        let coll_name = ns.split_once('.').unwrap().1;
        let docs = session_find(&c, &mut s)
            .await
            .unwrap_or_else(|e| panic!("{ns}: {e}"));
        assert_eq!(docs.len(), 5);
        assert_last_forwarded(&env, "find", coll_name);
        let b = body(env.upstream("find", coll_name).last().unwrap());
        assert_eq!(b.get_bool("autocommit").ok(), Some(false));
    }
    within("commit", s.commit_transaction())
        .await
        .expect("commit");
}

// ---------------------------------------------------------------------------------------
// Compression

async fn compressed_retry(name: &str, id: u8) {
    let env = Env::start(BASE_NAMESPACES).await;
    env.fake.seed(INVENTORY, seed_docs(3));
    let fault = stale_reads(&env.fake, "store_inventory", 13388, Duration::ZERO);
    let client = env.client(&format!("&compressors={name}")).await;
    let c = coll(&client, INVENTORY, "secondary", None);
    let docs = find(&c, Some(Duration::from_secs(5)))
        .await
        .expect("retried");
    assert_eq!(docs.len(), 3);
    assert_eq!(fault.hits(), 1);
    let sent = env.sent_by_driver("find", "store_inventory");
    assert_eq!(sent.len(), 1);
    assert_eq!(
        opcode(&sent[0]),
        OpCode::Compressed,
        "{name}: the driver compressed"
    );
    let up = env.upstream("find", "store_inventory");
    assert_eq!(up.len(), 2);
    assert_eq!(up[0], sent[0], "{name}: first attempt forwarded as it came");
    assert_eq!(
        opcode(&up[1]),
        OpCode::Compressed,
        "{name}: resend compressed too"
    );
    assert_eq!(compressor_id(&up[1]), id, "{name}: same compressor");
    let (original, resend) = (body(&up[0]), body(&up[1]));
    assert_eq!(read_concern(&resend), Some(available()));
    let budget = max_time_ms(&resend).unwrap();
    assert!(budget > 0 && budget <= 5000, "{budget}");
    assert_same_except(&original, &resend, &["readConcern", "maxTimeMS"]);

    // Breaker open: the preemptive rewrite is compressed as well.
    finds_ok(&c, 2).await;
    assert_eq!(env.state(INVENTORY), State::Open);
    find(&c, None).await.expect("rewritten");
    let up = env.upstream("find", "store_inventory");
    let last = up.last().unwrap();
    assert_eq!(opcode(last), OpCode::Compressed);
    assert_eq!(compressor_id(last), id);
    assert_eq!(read_concern(&body(last)), Some(available()));
    assert_same_except(
        &body(
            env.sent_by_driver("find", "store_inventory")
                .last()
                .unwrap(),
        ),
        &body(last),
        &["readConcern"],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compressed_zstd_retry_is_rewritten() {
    compressed_retry("zstd", 3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compressed_zlib_retry_is_rewritten() {
    compressed_retry("zlib", 2).await;
}

/// A compressed read larger than the inline limit (64 KiB uncompressed) is decompressed off
/// the runtime's workers, then governed like any other: resent with `available`,
/// recompressed with the same compressor.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_compressed_read_is_opened_off_the_workers_and_retried() {
    let env = Env::start(BASE_NAMESPACES).await;
    env.fake.seed(INVENTORY, seed_docs(3));
    let fault = stale_reads(&env.fake, "store_inventory", 13388, Duration::ZERO);
    let client = env.client("&compressors=zstd").await;
    let c = coll(&client, INVENTORY, "secondary", None);
    let note = "x".repeat(200_000);
    let cursor = c
        .find(doc! {})
        .comment(bson::Bson::String(note.clone()))
        .max_time(Duration::from_secs(5))
        .await
        .expect("find");
    let docs: Vec<Document> = cursor.try_collect().await.expect("retried");
    assert_eq!(docs.len(), 3);
    assert_eq!(fault.hits(), 1);
    let metrics = &env.proxy.shared().metrics;
    assert_eq!(metrics.limits.off_worker_decompressions.get(), 1);
    let sent = env.sent_by_driver("find", "store_inventory");
    let up = env.upstream("find", "store_inventory");
    assert_eq!(up.len(), 2);
    assert_eq!(up[0], sent[0], "first attempt forwarded as it came");
    assert_eq!(opcode(&up[1]), OpCode::Compressed);
    let resend = body(&up[1]);
    assert_eq!(read_concern(&resend), Some(available()));
    assert_eq!(resend.get_str("comment").ok(), Some(note.as_str()));
    assert_same_except(&body(&up[0]), &resend, &["readConcern", "maxTimeMS"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compressed_snappy_retry_is_rewritten() {
    compressed_retry("snappy", 1).await;
}

// ---------------------------------------------------------------------------------------
// dry_run

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dry_run_counts_and_opens_but_never_acts() {
    let ns = BASE_NAMESPACES.replace("threshold = 3", "threshold = 3\ndry_run = true");
    let ns = format!("{ns}\n[[namespaces]]\npattern = \"pay.capped\"\nmode = \"strict\"\nmax_time = \"500ms\"\ndry_run = true\n");
    let env = Env::start(&ns).await;
    let _f = stale_reads(&env.fake, "store_inventory", 13388, Duration::ZERO);
    let client = env.client("").await;

    // Fallback: the client sees the original errors, nothing is resent or rewritten.
    let c = coll(&client, INVENTORY, "secondary", None);
    for i in 0..5 {
        let e = find(&c, Some(Duration::from_secs(2)))
            .await
            .expect_err("dry run: error shows");
        assert_eq!(
            command_error(&e).2,
            "scripted StaleConfig on store_inventory"
        );
        assert_eq!(env.upstream("find", "store_inventory").len(), i + 1);
        assert_last_forwarded(&env, "find", "store_inventory");
        if i == 2 {
            assert_eq!(env.state(INVENTORY), State::Open, "counted: opened at 3");
        }
    }
    assert_eq!(env.state(INVENTORY), State::Open);

    // Strict: no fail-fast, no cap.
    let _f = stale_reads(&env.fake, "accounts", 13388, Duration::ZERO);
    let a = coll(&client, ACCOUNTS, "secondary", None);
    for i in 0..5 {
        let e = find(&a, None).await.expect_err("dry run: error shows");
        assert_eq!(
            command_error(&e).2,
            "scripted StaleConfig on accounts",
            "find {i}"
        );
        assert_eq!(
            env.upstream("find", "accounts").len(),
            i + 1,
            "never failed fast"
        );
        assert_last_forwarded(&env, "find", "accounts");
    }
    assert_eq!(env.state(ACCOUNTS), State::Open);
    let capped = coll(&client, "pay.capped", "secondary", None);
    find(&capped, Some(Duration::from_secs(10)))
        .await
        .expect("capped");
    assert_last_forwarded(&env, "find", "capped");

    // A strict read asking for available is still forwarded under dry_run? The refusal is a
    // decision like any other: dry_run must not act on it.
    let avail = coll(
        &client,
        ACCOUNTS,
        "secondary",
        Some(ReadConcern::available()),
    );
    let _ = find(&avail, None).await;
    assert_last_forwarded(&env, "find", "accounts");
}

// ---------------------------------------------------------------------------------------
// Timeouts count as trigger errors

const TIMEOUT_NAMESPACES: &str = r#"
[defaults]
# One driver client walks the table: its own errors and short waits must count.
min_connections = 1
per_connection = 1000
min_wait = "0s"

[[namespaces]]
pattern = "demo.store_inventory"
mode = "fallback"

[[namespaces]]
pattern = "pay.*"
mode = "strict"

[[namespaces]]
pattern = "demo.slow"
mode = "fallback"
slow_read = "100ms"

[[namespaces]]
pattern = "pay.slow"
mode = "strict"
slow_read = "100ms"
"#;

/// Delays reads of the named collections by `delay` while `on`.
fn delay_hook(env: &Env, colls: &'static [&'static str], delay: Duration, on: Arc<AtomicBool>) {
    env.fake.set_hook(move |b| {
        let c = collection(b).unwrap_or_default();
        (on.load(Ordering::SeqCst)
            && colls.contains(&c.as_str())
            && matches!(command_name(b), "find" | "aggregate"))
        .then(|| Hooked::delay(delay))
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_socket_timeouts_are_never_evidence() {
    // The Rust driver has no socketTimeoutMS: a caller's timeout drops the operation, and the
    // driver then closes that connection, which is what the proxy sees of a socket timeout.
    // A client that leaves is never evidence: nothing is left to confirm on, and its own
    // timeout is its choice. (tests/policy_pymongo.rs does the same with pymongo.)
    let env = Env::start(TIMEOUT_NAMESPACES).await;
    env.fake.seed(INVENTORY, seed_docs(2));
    let on = Arc::new(AtomicBool::new(true));
    delay_hook(
        &env,
        &["store_inventory", "accounts"],
        Duration::from_millis(1000),
        on.clone(),
    );
    let client = env.client("").await;
    for ns in [INVENTORY, ACCOUNTS] {
        let c = coll(&client, ns, "secondary", None);
        for i in 0..3 {
            let r = tokio::time::timeout(Duration::from_millis(150), find(&c, None)).await;
            assert!(
                r.is_err(),
                "{ns} find {i} should time out on the client side"
            );
        }
    }
    let text = env.proxy.shared().metrics.render();
    let deadline = Instant::now() + Duration::from_secs(5);
    while !env
        .proxy
        .shared()
        .metrics
        .render()
        .contains("staleguard_evidence_ignored_total{why=\"client_gone\"} 6")
    {
        assert!(Instant::now() < deadline, "{text}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    for ns in [INVENTORY, ACCOUNTS] {
        assert_eq!(env.state(ns), State::Closed, "{ns}");
        assert_eq!(env.errors(ns), 0, "{ns}");
    }
}

/// Delays reads of `slow` by 200 ms, honouring a shorter `maxTimeMS` (answered with 50 when
/// it runs out first), as a server would.
fn slow_hook(env: &Env, on: Arc<AtomicBool>) {
    env.fake.set_hook(move |b| {
        let c = collection(b).unwrap_or_default();
        if !(on.load(Ordering::SeqCst) && c == "slow" && command_name(b) == "find") {
            return None;
        }
        let delay = Duration::from_millis(200);
        match max_time_ms(b).map(|ms| Duration::from_millis(ms as u64)) {
            Some(limit) if limit < delay => Some(
                Hooked::error(50, "MaxTimeMSExpired", "operation exceeded time limit").after(limit),
            ),
            _ => Some(Hooked::delay(delay)),
        }
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_reads_count_once_a_cheap_read_confirms_them() {
    // Open breakers stay open through the test (no probe within it).
    let ns = TIMEOUT_NAMESPACES.replace(
        "min_wait = \"0s\"",
        "min_wait = \"0s\"\nconfirm_time = \"100ms\"\ncooldown = \"30s\"\nmin_cooldown = \"30s\"",
    );
    let env = Env::start(&ns).await;
    env.fake.seed("demo.slow", seed_docs(2));
    env.fake.seed("pay.slow", seed_docs(2));
    let on = Arc::new(AtomicBool::new(true));
    slow_hook(&env, on.clone());
    let client = env.client("").await;
    for ns in ["demo.slow", "pay.slow"] {
        let c = coll(&client, ns, "secondary", None);
        for i in 0..3 {
            assert_eq!(find(&c, None).await.expect("slow but fine").len(), 2);
            // Counted when the confirming read (limit 1, maxTimeMS 100) fails too.
            let deadline = Instant::now() + Duration::from_secs(5);
            while env.errors(ns) < i + 1 && env.state(ns) == State::Closed {
                assert!(
                    Instant::now() < deadline,
                    "{ns}: slow reply {i} not counted"
                );
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
        env.wait_state(ns, State::Open).await;
        let confirms = env
            .upstream_bodies("find", "slow")
            .into_iter()
            .filter(|b| b.get_i32("limit").ok() == Some(1) && max_time_ms(b) == Some(100))
            .count();
        assert!(confirms >= 3, "{ns}: {confirms} confirming reads");
    }
    // A fast read does not count.
    on.store(false, Ordering::SeqCst);
    let fast = coll(&client, INVENTORY, "secondary", None);
    find(&fast, None).await.expect("fast");
    assert_eq!(env.errors(INVENTORY), 0);

    let c = coll(&client, "demo.slow", "secondary", None);
    find(&c, None).await.expect("rewritten");
    let ups = env.upstream_bodies("find", "slow");
    assert_eq!(level(ups.last().unwrap()).as_deref(), Some("available"));
    // Strict, open (`on_open = "bound"`): sent with maxTimeMS 200 and answered in time.
    let c = coll(&client, "pay.slow", "secondary", None);
    assert_eq!(find(&c, None).await.expect("bounded, answered").len(), 2);
    let ups = env.upstream_bodies("find", "slow");
    assert_eq!(max_time_ms(ups.last().unwrap()), Some(200));
}

// ---------------------------------------------------------------------------------------
// Configuration knobs: window, read_preferences, trigger_codes, passthrough, readConcern levels

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_outside_the_window_do_not_add_up_and_clients_share_a_breaker() {
    let ns = BASE_NAMESPACES.replace("window = \"10s\"", "window = \"500ms\"");
    let env = Env::start(&ns).await;
    env.fake.seed(INVENTORY, seed_docs(1));
    let _fault = stale_reads(&env.fake, "store_inventory", 13388, Duration::ZERO);
    let a = env.client("").await;
    let b = env.client("").await;
    let ca = coll(&a, INVENTORY, "secondary", None);
    let cb = coll(&b, INVENTORY, "secondary", None);
    finds_ok(&ca, 1).await;
    finds_ok(&cb, 1).await;
    assert_eq!(env.errors(INVENTORY), 2, "one breaker for both clients");
    tokio::time::sleep(Duration::from_millis(600)).await;
    finds_ok(&ca, 1).await;
    assert_eq!(
        env.state(INVENTORY),
        State::Closed,
        "the first two left the window"
    );
    finds_ok(&cb, 1).await;
    finds_ok(&ca, 1).await;
    assert_eq!(
        env.state(INVENTORY),
        State::Open,
        "three within the window, two clients"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_preferences_and_trigger_codes_are_per_namespace() {
    let ns = r#"
[[namespaces]]
pattern = "demo.store_inventory"
mode = "fallback"
read_preferences = ["nearest"]
trigger_codes = [96]
"#;
    let env = Env::start(ns).await;
    env.fake.seed(INVENTORY, seed_docs(1));
    let code = Arc::new(std::sync::atomic::AtomicI32::new(13388));
    let c2 = code.clone();
    env.fake.set_hook(move |b| {
        (is_read_on(b, "store_inventory") && level(b).as_deref() != Some("available")).then(|| {
            let code = c2.load(Ordering::SeqCst);
            Hooked::error(code, code_name(code), "scripted")
        })
    });
    let client = env.client("").await;

    // secondary is not in this namespace's list: untouched even on a trigger-looking error.
    let sec = coll(&client, INVENTORY, "secondary", None);
    code.store(96, Ordering::SeqCst);
    let e = find(&sec, None).await.expect_err("not eligible");
    assert_eq!(command_error(&e).0, 96);
    let up = env.upstream("find", "store_inventory");
    assert!(
        up.iter().all(|m| read_concern(&body(m)).is_none()),
        "never rewritten"
    );
    assert_eq!(up, env.sent_by_driver("find", "store_inventory"));
    assert!(env.breaker_namespaces().is_empty());

    // nearest: eligible, but 13388 is not among this namespace's trigger codes.
    let near = coll(&client, INVENTORY, "nearest", None);
    code.store(13388, Ordering::SeqCst);
    let e = find(&near, None).await.expect_err("not a trigger here");
    assert_eq!(command_error(&e).0, 13388);
    assert_last_forwarded(&env, "find", "store_inventory");
    assert_eq!(env.errors(INVENTORY), 0);

    // nearest + 96 (OperationFailed, listed here): retried with available by the proxy; the
    // driver sees no error.
    code.store(96, Ordering::SeqCst);
    let before = env.upstream("find", "store_inventory").len();
    assert_eq!(find(&near, None).await.expect("retried").len(), 1);
    let up = env.upstream_bodies("find", "store_inventory");
    assert_eq!(up.len(), before + 2);
    assert_eq!(read_concern(&up[before + 1]), Some(available()));
    assert_eq!(env.errors(INVENTORY), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passthrough_namespace_inside_a_strict_database_is_left_alone() {
    let ns = format!(
        "{BASE_NAMESPACES}\n[[namespaces]]\npattern = \"pay.public\"\nmode = \"passthrough\"\n"
    );
    let env = Env::start(&ns).await;
    env.fake.seed("pay.public", seed_docs(1));
    let _fault = stale_reads(&env.fake, "public", 13388, Duration::ZERO);
    let client = env.client("").await;
    let c = coll(&client, "pay.public", "secondary", None);
    finds_fail(&c, 4, 13388).await;
    assert_eq!(
        env.upstream("find", "public"),
        env.sent_by_driver("find", "public")
    );
    assert!(env.breaker_namespaces().is_empty());
    // Asking for available is not refused there.
    let avail = coll(
        &client,
        "pay.public",
        "secondary",
        Some(ReadConcern::available()),
    );
    assert_eq!(find(&avail, None).await.expect("allowed").len(), 1);
    assert_last_forwarded(&env, "find", "public");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_and_majority_read_concerns_are_replaced_by_available() {
    let env = Env::start(BASE_NAMESPACES).await;
    env.fake.seed(INVENTORY, seed_docs(1));
    let _fault = stale_reads(&env.fake, "store_inventory", 13388, Duration::ZERO);
    let client = env.client("").await;
    for (i, rc) in [ReadConcern::majority(), ReadConcern::local()]
        .into_iter()
        .enumerate()
    {
        let c = coll(&client, INVENTORY, "secondary", Some(rc));
        // i = 0: retry path (closed); afterwards the breaker is opened for i = 1.
        if i == 1 {
            finds_ok(&coll(&client, INVENTORY, "secondary", None), 2).await;
            assert_eq!(env.state(INVENTORY), State::Open);
        }
        find(&c, None).await.expect("served");
        let sent = env.sent_by_driver("find", "store_inventory");
        let up = env.upstream_bodies("find", "store_inventory");
        let (s, u) = (body(sent.last().unwrap()), up.last().unwrap().clone());
        assert!(level(&s).is_some(), "the driver sent a level: {s:?}");
        assert_eq!(read_concern(&u), Some(available()));
        assert_same_except(&s, &u, &["readConcern"]);
    }
}

// ---------------------------------------------------------------------------------------
// Raw wire: checksums and pipelined requests on one connection

fn raw_find(coll: &str, db: &str) -> RawDocumentBuf {
    rawdoc! {
        "find": coll,
        "filter": {},
        "maxTimeMS": 4000,
        "$db": db,
        "$readPreference": { "mode": "secondary" },
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checksummed_requests_are_rewritten_with_a_valid_checksum() {
    use staleguard::wire::opmsg::{verify_checksum, CHECKSUM_PRESENT};
    let env = Env::start(BASE_NAMESPACES).await;
    env.fake.seed(INVENTORY, seed_docs(2));
    let fault = stale_reads(&env.fake, "store_inventory", 13388, Duration::ZERO);
    let mut conn = RawClient::connect(env.proxy_addr()).await;
    for id in 1..=4 {
        let msg = raw::msg(id, CHECKSUM_PRESENT, &raw_find("store_inventory", "demo"));
        let reply = conn.roundtrip(&msg).await;
        assert_eq!(raw::header(&reply).response_to, id);
        let b = raw::body(&reply);
        assert_eq!(b.get_f64("ok").ok(), Some(1.0), "request {id}: {b:?}");
    }
    // 1-3: original + retry each (opens the breaker); 4: rewritten before sending.
    assert_eq!(fault.hits(), 3);
    let up = env.upstream("find", "store_inventory");
    assert_eq!(up.len(), 7);
    for (i, m) in up.iter().enumerate() {
        assert_ne!(
            raw::flags(m) & CHECKSUM_PRESENT,
            0,
            "message {i} keeps its checksum"
        );
        verify_checksum(m).unwrap_or_else(|e| panic!("message {i}: {e}"));
    }
    for i in [1, 3, 5, 6] {
        assert_eq!(
            read_concern(&body(&up[i])),
            Some(available()),
            "message {i}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_requests_each_get_their_own_retried_reply() {
    let env = Env::start(BASE_NAMESPACES).await;
    env.fake.seed(INVENTORY, seed_docs(2));
    env.fake.seed("demo.other", seed_docs(3));
    let _fault = stale_reads(
        &env.fake,
        "store_inventory",
        13388,
        Duration::from_millis(20),
    );
    let mut conn = RawClient::connect(env.proxy_addr()).await;
    let a = raw::msg(11, 0, &raw_find("store_inventory", "demo"));
    let b = raw::msg(12, 0, &raw_find("other", "demo"));
    let c = raw::msg(13, 0, &raw_find("store_inventory", "demo"));
    let mut all = Vec::new();
    all.extend_from_slice(&a);
    all.extend_from_slice(&b);
    all.extend_from_slice(&c);
    conn.send(&all).await;
    let mut got = std::collections::HashMap::new();
    for _ in 0..3 {
        let reply = conn.recv().await;
        let b = raw::body(&reply);
        let n = b
            .get_document("cursor")
            .and_then(|c| c.get_array("firstBatch"))
            .map(|a| a.into_iter().count())
            .unwrap_or_else(|_| panic!("not a cursor reply: {b:?}"));
        got.insert(raw::header(&reply).response_to, n);
    }
    assert_eq!(got, [(11, 2), (12, 3), (13, 2)].into_iter().collect());
    assert_eq!(env.errors(INVENTORY), 2);
}

// ---------------------------------------------------------------------------------------
// Retry edges

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_is_sent_once_and_its_own_error_reaches_the_client() {
    let env = Env::start(BASE_NAMESPACES).await;
    // Every read fails, `available` ones with a time limit.
    env.fake.set_hook(|b| {
        is_read_on(b, "store_inventory").then(|| {
            if level(b).as_deref() == Some("available") {
                Hooked::error(50, "MaxTimeMSExpired", "retry timed out")
            } else {
                Hooked::error(13388, "StaleConfig", "stale")
            }
        })
    });
    let client = env.client("").await;
    let c = coll(&client, INVENTORY, "secondary", None);
    let e = find(&c, None).await.expect_err("both attempts fail");
    assert_eq!(
        command_error(&e),
        (50, "MaxTimeMSExpired".into(), "retry timed out".into())
    );
    let up = env.upstream_bodies("find", "store_inventory");
    assert_eq!(up.len(), 2, "resent once, never twice");
    assert_eq!(read_concern(&up[1]), Some(available()));
    // Both replies were trigger errors, but the breaker counts failing reads: one.
    assert_eq!(env.errors(INVENTORY), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_retry_when_the_clients_time_budget_is_spent() {
    let env = Env::start(BASE_NAMESPACES).await;
    let _fault = stale_reads(
        &env.fake,
        "store_inventory",
        13388,
        Duration::from_millis(200),
    );
    let client = env.client("").await;
    let c = coll(&client, INVENTORY, "secondary", None);
    let e = find(&c, Some(Duration::from_millis(100)))
        .await
        .expect_err("no time left for a resend");
    assert_eq!(command_error(&e).0, 13388);
    assert_eq!(
        env.upstream("find", "store_inventory").len(),
        1,
        "not resent"
    );
    assert_last_forwarded(&env, "find", "store_inventory");
    assert_eq!(env.errors(INVENTORY), 1, "still counted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_time_zero_means_no_limit_and_the_read_is_still_resent() {
    // `maxTimeMS: 0` is "no limit" to mongod/mongos; the Rust driver sends it for
    // `max_time(Duration::ZERO)`.
    let env = Env::start(BASE_NAMESPACES).await;
    env.fake.seed(INVENTORY, seed_docs(1));
    let fault = stale_reads(
        &env.fake,
        "store_inventory",
        13388,
        Duration::from_millis(20),
    );
    let client = env.client("").await;
    let c = coll(&client, INVENTORY, "secondary", None);
    let sent_zero = find(&c, Some(Duration::ZERO)).await;
    let sent = env.driver_bodies("find", "store_inventory");
    assert_eq!(
        max_time_ms(&sent[0]),
        Some(0),
        "the driver sent maxTimeMS: 0"
    );
    let docs = sent_zero.expect("no time limit: the read must be resent with available");
    assert_eq!(docs.len(), 1);
    assert_eq!(fault.hits(), 1);
    let up = env.upstream_bodies("find", "store_inventory");
    assert_eq!(up.len(), 2);
    assert_eq!(read_concern(&up[1]), Some(available()));
    assert_eq!(max_time_ms(&up[1]), Some(0), "still no limit on the resend");
    assert_same_except(&up[0], &up[1], &["readConcern"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fallback_read_joining_a_passthrough_namespace_is_not_rewritten() {
    // design.md, Strictest wins: "rewritten only if every namespace it touches is fallback or
    // unlisted and the primary one is fallback". A passthrough namespace is neither.
    let ns = format!(
        "{BASE_NAMESPACES}\n[[namespaces]]\npattern = \"demo.audit\"\nmode = \"passthrough\"\n"
    );
    let env = Env::start(&ns).await;
    let stale = Arc::new(AtomicBool::new(true));
    aggregate_hook(&env, stale.clone());
    let client = env.client("").await;
    let inventory = coll(&client, INVENTORY, "secondary", None);
    finds_ok(&inventory, 3).await;
    assert_eq!(env.state(INVENTORY), State::Open);
    stale.store(false, Ordering::SeqCst);
    let join = vec![
        doc! { "$lookup": { "from": "audit", "localField": "a", "foreignField": "b", "as": "j" } },
    ];
    aggregate(&inventory, join).await.expect("aggregate");
    assert_last_forwarded(&env, "aggregate", "store_inventory");
}

// ---------------------------------------------------------------------------------------
// Reply shape and other details

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_fast_and_refusal_are_plain_op_msg_replies_on_a_connection_that_stays_open() {
    let env = Env::start(BASE_NAMESPACES).await;
    env.fake.seed(ACCOUNTS, seed_docs(1));
    let fault = stale_reads(&env.fake, "accounts", 13388, Duration::ZERO);
    let mut conn = RawClient::connect(env.proxy_addr()).await;
    for id in 1..=3 {
        let reply = conn
            .roundtrip(&raw::msg(id, 0, &raw_find("accounts", "pay")))
            .await;
        assert_eq!(
            raw::body(&reply).get_str("errmsg").ok(),
            Some("scripted StaleConfig on accounts")
        );
    }
    assert_eq!(env.state(ACCOUNTS), State::Open);
    fault.set(false);
    let before = env.upstream_count();

    let reply = conn
        .roundtrip(&raw::msg(40, 0, &raw_find("accounts", "pay")))
        .await;
    let h = raw::header(&reply);
    assert_eq!(h.op(), OpCode::Msg);
    assert_eq!(h.response_to, 40);
    assert_eq!(raw::flags(&reply), 0);
    let b = raw::body(&reply);
    let keys: Vec<&str> = b.iter().map(|e| e.unwrap().0.as_str()).collect();
    assert!(
        keys.contains(&"ok")
            && keys.contains(&"code")
            && keys.contains(&"codeName")
            && keys.contains(&"errmsg"),
        "{b:?}"
    );
    assert_eq!(b.get_f64("ok").ok(), Some(0.0));
    assert_eq!(b.get_i32("code").ok(), Some(13388));
    assert_eq!(b.get_str("codeName").ok(), Some("StaleConfig"));
    assert!(
        b.get("errorLabels").ok().flatten().is_none(),
        "no labels: {b:?}"
    );

    let mut ask = raw_find("accounts", "pay");
    ask.append(
        bson::raw::cstr!("readConcern"),
        rawdoc! { "level": "available" },
    );
    let reply = conn.roundtrip(&raw::msg(41, 0, &ask)).await;
    assert_eq!(raw::header(&reply).response_to, 41);
    let b = raw::body(&reply);
    assert_eq!(b.get_i32("code").ok(), Some(72));
    assert!(b.get_str("errmsg").unwrap().starts_with("staleguard:"));
    assert_eq!(env.upstream_count(), before, "neither was sent upstream");

    // The same connection still relays: a write to the strict namespace goes through.
    let insert = rawdoc! { "insert": "accounts", "documents": [ { "_id": 9 } ], "$db": "pay" };
    let reply = conn.roundtrip(&raw::msg(42, 0, &insert)).await;
    assert_eq!(raw::header(&reply).response_to, 42);
    assert_eq!(raw::body(&reply).get_i32("n").ok(), Some(1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compressed_strict_fail_fast_reaches_the_driver() {
    let env = Env::start(BASE_NAMESPACES).await;
    let _fault = stale_reads(&env.fake, "accounts", 13388, Duration::ZERO);
    let client = env.client("&compressors=zstd").await;
    let c = coll(&client, ACCOUNTS, "secondary", None);
    finds_fail(&c, 3, 13388).await;
    assert_eq!(
        opcode(&env.upstream("find", "accounts")[0]),
        OpCode::Compressed
    );
    let before = env.upstream_count();
    let e = find(&c, None).await.expect_err("fail fast");
    assert!(command_error(&e).2.starts_with("staleguard:"));
    assert_eq!(env.upstream_count(), before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_preference_tags_and_staleness_survive_the_rewrite() {
    let env = Env::start(BASE_NAMESPACES).await;
    env.fake.seed(INVENTORY, seed_docs(1));
    let _fault = stale_reads(&env.fake, "store_inventory", 13388, Duration::ZERO);
    let client = env
        .client("&readPreference=nearest&readPreferenceTags=dc:east&maxStalenessSeconds=120")
        .await;
    let c = coll(&client, INVENTORY, "primary", None); // inherits the client's preference
    finds_ok(&c, 1).await;
    let up = env.upstream_bodies("find", "store_inventory");
    assert_eq!(up.len(), 2);
    let rp = up[1]
        .get_document("$readPreference")
        .expect("$readPreference")
        .to_owned();
    assert_eq!(rp.get_str("mode").ok(), Some("nearest"));
    // (The Rust driver spells the tag sets `tagSets`; whatever it sends must pass unchanged.)
    assert_eq!(rp.get_i32("maxStalenessSeconds").ok(), Some(120), "{rp:?}");
    assert_eq!(
        up[0].get_document("$readPreference").unwrap(),
        &*rp,
        "unchanged"
    );
    assert_same_except(&up[0], &up[1], &["readConcern"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn change_streams_and_graph_lookup() {
    let env = Env::start(STRICTEST_NAMESPACES).await;
    let stale = Arc::new(AtomicBool::new(true));
    aggregate_hook(&env, stale.clone());
    let client = env.client("").await;
    finds_ok(&coll(&client, INVENTORY, "secondary", None), 3).await;
    assert_eq!(env.state(INVENTORY), State::Open);
    stale.store(false, Ordering::SeqCst);

    // $changeStream on a fallback namespace whose breaker is open: untouched.
    let r = within(
        "change stream",
        client
            .database("demo")
            .run_command(doc! { "aggregate": "store_inventory", "pipeline": [ { "$changeStream": {} } ], "cursor": {} })
            .selection_criteria(secondary()),
    )
    .await
    .expect("change stream aggregate");
    assert_eq!(r.get_f64("ok").ok(), Some(1.0));
    assert_last_forwarded(&env, "aggregate", "store_inventory");

    // $graphLookup from a strict collection makes a fallback read strict.
    let wire = rawdoc! {
        "aggregate": "cache", "$db": "pay", "cursor": {}, "$readPreference": { "mode": "secondary" },
        "pipeline": [ { "$graphLookup": { "from": "ledger", "startWith": "$a", "connectFromField": "a", "connectToField": "b", "as": "g" } } ],
    };
    assert_eq!(
        governing(&env, &wire),
        Some(("pay.ledger".to_string(), Mode::Strict, ReadKind::Eligible))
    );
    let cache = coll(&client, "pay.cache", "secondary", None);
    let graph = vec![
        doc! { "$graphLookup": { "from": "ledger", "startWith": "$a", "connectFromField": "a", "connectToField": "b", "as": "g" } },
    ];
    stale.store(true, Ordering::SeqCst);
    for _ in 0..3 {
        let e = aggregate(&cache, graph.clone())
            .await
            .expect_err("strict: error shows");
        assert_eq!(command_error(&e).0, 13388);
    }
    assert_eq!(env.state("pay.ledger"), State::Open);
    let before = env.upstream_count();
    let e = aggregate(&cache, graph).await.expect_err("fail fast");
    assert!(command_error(&e).2.contains("pay.ledger"));
    assert_eq!(env.upstream_count(), before);
}
