//! staleguard judged by Node.js clients nobody here wrote: the official `mongodb` driver
//! (a script, `tests/js/driver_check.js`) and `mongosh`, both from the npm registry, against
//! staleguard started in-process between a recording tap and the fake mongos.
//!
//! The packages (pinned by `tests/js/package-lock.json`) are installed once into
//! `<target dir>/jsdeps` by `tests/support/js.rs` under a file lock, so parallel tests and test
//! processes share them. If they cannot be installed (no node/npm, no registry), the tests
//! fail with npm's output: they never skip.

use crate::policy_support;
use crate::support;

use std::time::Duration;

use bson::doc;
use futures::TryStreamExt;
use mongodb::options::{CollectionOptions, ReadPreference, SelectionCriteria};
use staleguard::breaker::State;

use policy_support::*;
use support::js::{mongosh, run_check};
use support::within;

const INVENTORY: &str = "demo.store_inventory";
const ACCOUNTS: &str = "pay.accounts";
const ORDERS: &str = "shop.orders";

/// The Node driver's URI (server discovery as for a mongos).
fn uri(env: &Env) -> String {
    format!("mongodb://{}/", env.addr())
}

/// The same with zlib compression (built into the Node driver; the fake mongos agrees to it).
fn zlib_uri(env: &Env) -> String {
    format!("mongodb://{}/?compressors=zlib", env.addr())
}

/// Asserts every message in `msgs` is OP_COMPRESSED with zlib (id 2).
fn assert_zlib(msgs: &[bytes::Bytes], what: &str) {
    assert!(!msgs.is_empty(), "{what}: none");
    for m in msgs {
        assert_eq!(compressor_id(m), 2, "{what}: zlib");
    }
}

/// mongosh's URI: one server, no discovery.
fn sh_uri(env: &Env) -> String {
    format!(
        "mongodb://{}/?directConnection=true&serverSelectionTimeoutMS=5000",
        env.addr()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_relay_of_an_ungoverned_namespace_is_byte_for_byte() {
    relay(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_relay_compressed_with_zlib_is_byte_for_byte() {
    relay(true).await;
}

async fn relay(zlib: bool) {
    let env = Env::start(BASE_NAMESPACES).await;
    let uri = if zlib { zlib_uri(&env) } else { uri(&env) };
    run_check("driver_check.js", "relay", vec![uri]).await;
    assert_eq!(env.fake.documents(ORDERS).len(), 3, "the inserts arrived");
    for name in ["insert", "find"] {
        let sent = env.sent_by_driver(name, "orders");
        let up = env.upstream(name, "orders");
        assert_eq!(sent.len(), 1, "the driver sent one {name}");
        if zlib {
            assert_zlib(&sent, name);
        }
        assert_eq!(
            up, sent,
            "{name}: what reached mongos is what the driver sent"
        );
    }
    // And back: the find's reply reached the driver as mongos wrote it.
    let find_reply = |msgs: Vec<bytes::Bytes>| {
        msgs.into_iter()
            .filter(|m| try_body(m).is_some_and(|b| b.get_document("cursor").is_ok()))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        find_reply(env.tap.to_client()),
        find_reply(env.fake.sent()),
        "cursor replies relayed byte for byte"
    );
    assert!(env.breaker_namespaces().is_empty(), "no breaker for shop.*");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_fallback_stale_config_is_hidden_by_a_retry() {
    fallback_retry(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_fallback_retry_of_a_zlib_compressed_find() {
    fallback_retry(true).await;
}

async fn fallback_retry(zlib: bool) {
    let env = Env::start(BASE_NAMESPACES).await;
    env.fake.seed(INVENTORY, seed_docs(5));
    let fault = stale_reads(
        &env.fake,
        "store_inventory",
        13388,
        Duration::from_millis(100),
    );
    let uri = if zlib { zlib_uri(&env) } else { uri(&env) };
    run_check("driver_check.js", "fallback-retry", vec![uri]).await;
    assert_eq!(fault.hits(), 1);
    let sent = env.sent_by_driver("find", "store_inventory");
    assert_eq!(sent.len(), 1, "the driver sent one find and saw no error");
    let up = env.upstream("find", "store_inventory");
    assert_eq!(up.len(), 2, "the driver's find, then one resend");
    assert_eq!(up[0], sent[0], "first attempt as the driver sent it");
    if zlib {
        assert_zlib(&sent, "the driver's find");
        let replies = env.tap.to_client();
        let docs_reply = replies
            .iter()
            .rfind(|m| try_body(m).is_some_and(|b| b.get_document("cursor").is_ok()))
            .expect("the documents' reply");
        assert_eq!(compressor_id(docs_reply), 2, "the reply the driver got");
    }
    let (original, resend) = (body(&up[0]), body(&up[1]));
    assert_eq!(
        level(&original),
        None,
        "the driver asked for no read concern"
    );
    assert_eq!(max_time_ms(&original), Some(5000), "the driver's maxTimeMS");
    assert_available_resend(&original, &resend);
    assert_eq!(env.state(INVENTORY), State::Closed);
    assert_eq!(env.errors(INVENTORY), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_strict_open_breaker_fails_fast_and_the_client_goes_on() {
    let env = Env::start(BASE_NAMESPACES).await;
    env.fake.seed(ACCOUNTS, seed_docs(1));
    stale_secondaries(&env, &["accounts"]);
    let out = run_check("driver_check.js", "strict-fail-fast", vec![uri(&env)]).await;
    assert!(out.contains("staleguard:"), "{out}");
    assert_eq!(env.state(ACCOUNTS), State::Open);
    let up = env.upstream_bodies("find", "accounts");
    assert_eq!(
        up.len(),
        4,
        "three failed reads and the primary read; not the refused one"
    );
    assert_eq!(
        env.sent_by_driver("find", "accounts").len(),
        5,
        "the driver did not retry the fail-fast reply"
    );
    // The script saw no new pooled connection, none closed and no pool cleared. Upstream:
    // one connection each for the pooled one (maxPoolSize 1), the monitor and its RTT
    // pinger, none for the refusal.
    let upstream_connections = env.fake.connections();
    println!("fake mongos accepted {upstream_connections} connections");
    assert!(
        upstream_connections <= 3,
        "staleguard opened {upstream_connections} upstream connections"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_strict_read_asking_for_available_is_refused() {
    let env = Env::start(BASE_NAMESPACES).await;
    env.fake.seed(ACCOUNTS, seed_docs(1));
    let out = run_check("driver_check.js", "strict-available", vec![uri(&env)]).await;
    assert!(out.contains("[72,72,72]"), "{out}");
    assert_eq!(env.sent_by_driver("find", "accounts").len(), 3);
    assert_eq!(
        env.upstream("find", "accounts").len(),
        0,
        "nothing reached mongos"
    );
    assert!(
        env.breaker_namespaces().is_empty(),
        "a refusal is not a breaker error"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mongosh_connects_reads_and_prints_a_strict_refusal() {
    let env = Env::start(BASE_NAMESPACES).await;
    env.fake.seed(ORDERS, seed_docs(3));
    env.fake.seed(ACCOUNTS, seed_docs(1));
    stale_secondaries(&env, &["accounts"]);

    let find = "EJSON.stringify(db.getSiblingDB('shop').orders.find().sort({_id: 1}).toArray())";
    let ran = mongosh(&sh_uri(&env), find).await;
    assert!(
        ran.success,
        "mongosh find failed:\n{}{}",
        ran.stdout, ran.stderr
    );
    assert_eq!(
        ran.stdout.trim(),
        r#"[{"_id":0,"item":"item 0"},{"_id":1,"item":"item 1"},{"_id":2,"item":"item 2"}]"#,
        "stderr: {}",
        ran.stderr
    );
    // Its handshake and startup commands went through to mongos (the fake answers
    // `getParameter` and `atlasVersion` with CommandNotFound, which mongosh shrugs off).
    let names: Vec<String> = env
        .fake
        .received_commands()
        .into_iter()
        .map(|c| c.0)
        .collect();
    println!("mongosh's commands upstream: {names:?}");
    for name in ["buildInfo", "find", "endSessions"] {
        assert!(names.iter().any(|n| n == name), "no {name} in {names:?}");
    }
    let sent = env.sent_by_driver("find", "orders");
    assert_eq!(sent.len(), 1);
    assert_eq!(
        env.upstream("find", "orders"),
        sent,
        "relayed byte for byte"
    );

    // Open the strict breaker with a Rust driver, then read from mongosh.
    let client = env.client("").await;
    let opts = CollectionOptions::builder()
        .selection_criteria(SelectionCriteria::ReadPreference(
            ReadPreference::Secondary { options: None },
        ))
        .build();
    let accounts = client
        .database("pay")
        .collection_with_options::<bson::Document>("accounts", opts);
    for _ in 0..3 {
        let e = within("driver find", async {
            accounts.find(doc! {}).await?.try_collect::<Vec<_>>().await
        })
        .await
        .expect_err("upstream StaleConfig");
        assert_eq!(command_error(&e).0, 13388);
    }
    env.wait_state(ACCOUNTS, State::Open).await;
    let before = env.upstream("find", "accounts").len();
    let read = "db.getSiblingDB('pay').accounts.find().readPref('secondary').toArray()";
    let ran = mongosh(&sh_uri(&env), read).await;
    let printed = format!("{}{}", ran.stdout, ran.stderr);
    assert!(
        !ran.success,
        "the refused read should fail mongosh:\n{printed}"
    );
    assert!(
        printed.contains("MongoServerError: staleguard: strict namespace pay.accounts fails fast"),
        "mongosh prints staleguard's error:\n{printed}"
    );
    assert_eq!(
        env.upstream("find", "accounts").len(),
        before,
        "the refused read was not sent"
    );
}
