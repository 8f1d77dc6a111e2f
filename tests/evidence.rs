//! Issue 20: the breaker believes the cluster, not the clients. Each attack follows the
//! evidence rules exactly (three connections, within `min_wait`, `min_connections` and
//! `per_connection`), against the real proxy in front of a fake mongos that serves each
//! connection's requests in order; each must leave every breaker closed and the victim's
//! reads as they would be without the attacker. The real incident must still open it.

use crate::policy_support;
use crate::support;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bson::{rawdoc, RawDocument};
use bytes::Bytes;
use staleguard::breaker::State;

use policy_support::{body, Env};
use support::mongos::Hooked;
use support::raw::{self, RawClient};

/// The shipped evidence rules (`min_connections = 2`, `per_connection = 1`,
/// `min_wait = "1s"`, `threshold = 3`), bound mode on strict.
const NAMESPACES: &str = r#"
[[namespaces]]
pattern = "demo.store_inventory"
mode = "fallback"

[[namespaces]]
pattern = "pay.*"
mode = "strict"
"#;

fn find(id: i32, db: &str, coll: &str, extra: &RawDocument) -> Bytes {
    let mut b = rawdoc! {
        "find": coll,
        "$readPreference": {"mode": "secondary"},
        "$db": db,
    };
    for e in extra.iter() {
        let (k, v) = e.expect("element");
        b.append(k, bson::RawBson::from(v));
    }
    raw::msg(id, 0, &b)
}

fn filter_is(body: &RawDocument, key: &str) -> bool {
    body.get_document("filter")
        .ok()
        .is_some_and(|f| f.get(key).ok().flatten().is_some())
}

fn code(reply: &[u8]) -> Option<i32> {
    body(reply).get_i32("code").ok()
}

fn ignored(env: &Env, why: &str) -> u64 {
    metric(
        env,
        &format!("staleguard_evidence_ignored_total{{why=\"{why}\"}}"),
    )
}

fn metric(env: &Env, prefix: &str) -> u64 {
    let text = env.proxy.shared().metrics.render();
    text.lines()
        .filter(|l| l.starts_with(prefix))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// A connection that has proved itself to the cluster: mongos answered one of its reads
/// (what counts for a breaker comes only from such connections).
async fn proven(addr: std::net::SocketAddr) -> RawClient {
    let mut c = RawClient::connect(addr).await;
    let reply = c
        .roundtrip(&find(999, "demo", "other", &rawdoc! {"filter": {}}))
        .await;
    assert_eq!(body(&reply).get_f64("ok").ok(), Some(1.0));
    c
}

/// Three attacker connections at once, each proved to the cluster, sending `msg(i)` and
/// reading its reply.
async fn three(env: &Env, msg: impl Fn(i32) -> Bytes) -> Vec<Bytes> {
    let mut tasks = Vec::new();
    for i in 0..3 {
        let addr = env.proxy_addr();
        let m = msg(i + 1);
        tasks.push(tokio::spawn(async move {
            let mut c = proven(addr).await;
            let r = c.roundtrip(&m).await;
            // Give the question to the cluster (if any) time to be answered.
            tokio::time::sleep(Duration::from_millis(700)).await;
            r
        }));
    }
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.expect("attacker"));
    }
    out
}

/// A victim's plain secondary read still answers, unmodified.
async fn victim_reads(env: &Env, db: &str, coll: &str) {
    let mut v = RawClient::connect(env.proxy_addr()).await;
    let reply = v
        .roundtrip(&find(900, db, coll, &rawdoc! {"filter": {}}))
        .await;
    assert_eq!(
        body(&reply).get_f64("ok").ok(),
        Some(1.0),
        "{:?}",
        body(&reply)
    );
    let ns = format!("{db}.{coll}");
    assert_eq!(env.state(&ns), State::Closed, "{ns}");
}

/// A slow query ending in 50 under the client's own `maxTimeMS` of a second or more: the
/// confirming read (limit 1, empty filter) is answered, so nothing counts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_queries_under_their_own_limit_are_confirmed_and_not_counted() {
    let env = Env::start(NAMESPACES).await;
    env.fake.set_hook(|b| {
        filter_is(b, "slow").then(|| {
            Hooked::error(50, "MaxTimeMSExpired", "operation exceeded time limit")
                .after(Duration::from_millis(1_050))
        })
    });
    let replies = three(&env, |i| {
        find(
            i,
            "pay",
            "transactions",
            &rawdoc! {"filter": {"slow": true}, "maxTimeMS": 1000},
        )
    })
    .await;
    for r in &replies {
        assert_eq!(code(r), Some(50), "mongos's own reply reaches the client");
    }
    assert_eq!(env.state("pay.transactions"), State::Closed);
    assert_eq!(env.errors("pay.transactions"), 0);
    // One cheap read answered the three questions (the others shared its answer).
    let unconfirmed = "staleguard_confirm_reads_total{result=\"unconfirmed\"}";
    let shared = "staleguard_confirm_reads_total{result=\"shared\"}";
    assert_eq!(metric(&env, unconfirmed) + metric(&env, shared), 3);
    assert!(metric(&env, unconfirmed) >= 1);
    // The confirming reads reached mongos as staleguard's limit-1 reads.
    let confirms: Vec<_> = env
        .upstream_bodies("find", "transactions")
        .into_iter()
        .filter(|b| {
            b.get_i32("limit").ok() == Some(1) && b.get_bool("singleBatch").ok() == Some(true)
        })
        .collect();
    assert_eq!(
        confirms.len(),
        3,
        "one question (three cheap reads) for the three"
    );
    assert_eq!(policy_support::max_time_ms(&confirms[0]), Some(250));
    // Its reply is tiny whatever the documents: a projection that keeps nothing.
    let projection = confirms[0].get_document("projection").expect("projection");
    assert_eq!(projection.get_i32("_id").ok(), Some(0));
    victim_reads(&env, "pay", "transactions").await;
}

/// On fallback, staleguard's own first-attempt limit (500 ms) cuts a slow query: never
/// counted by itself; the other clients' reads are not rewritten.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn staleguards_own_limit_on_a_slow_query_does_not_open_fallback() {
    let env = Env::start_budgeted(NAMESPACES).await;
    env.fake.set_hook(|b| {
        filter_is(b, "slow").then(|| {
            let ms = b.get_i64("maxTimeMS").ok().unwrap_or(2_000) as u64;
            Hooked::error(50, "MaxTimeMSExpired", "operation exceeded time limit")
                .after(Duration::from_millis(ms.min(2_000)))
        })
    });
    three(&env, |i| {
        find(
            i,
            "demo",
            "store_inventory",
            &rawdoc! {"filter": {"slow": true}},
        )
    })
    .await;
    assert_eq!(env.state("demo.store_inventory"), State::Closed);
    assert_eq!(env.errors("demo.store_inventory"), 0);
    let before = env.upstream_bodies("find", "store_inventory").len();
    victim_reads(&env, "demo", "store_inventory").await;
    let after = env.upstream_bodies("find", "store_inventory");
    let victim = &after[before..];
    assert!(
        victim
            .iter()
            .all(|b| b.get_document("readConcern").is_err()),
        "the victim's read went out without readConcern available: {victim:?}"
    );
}

/// 133 from a tag set no member matches is the client's choice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unmatched_tag_set_is_not_evidence() {
    let env = Env::start(NAMESPACES).await;
    env.fake.set_hook(|b| {
        b.get_document("$readPreference")
            .ok()
            .is_some_and(|p| p.get_array("tags").is_ok())
            .then(|| Hooked::error(133, "FailedToSatisfyReadPreference", "no member matches"))
    });
    let replies = three(&env, |i| {
        let body = rawdoc! {
            "find": "transactions",
            "filter": {},
            "$readPreference": {"mode": "secondary", "tags": [{"dc": "nowhere"}]},
            "$db": "pay",
        };
        raw::msg(i, 0, &body)
    })
    .await;
    assert!(replies.iter().all(|r| code(r) == Some(133)));
    assert_eq!(env.state("pay.transactions"), State::Closed);
    assert_eq!(ignored(&env, "tagged"), 3);
    victim_reads(&env, "pay", "transactions").await;
}

/// 202 answering the client's own `maxTimeMS: 1`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn network_interface_time_limit_under_a_tiny_limit_is_not_evidence() {
    let env = Env::start(NAMESPACES).await;
    env.fake.set_hook(|b| {
        (b.get_i32("maxTimeMS").ok() == Some(1)).then(|| {
            Hooked::error(
                202,
                "NetworkInterfaceExceededTimeLimit",
                "exceeded time limit",
            )
        })
    });
    three(&env, |i| {
        find(
            i,
            "pay",
            "transactions",
            &rawdoc! {"filter": {}, "maxTimeMS": 1},
        )
    })
    .await;
    assert_eq!(env.state("pay.transactions"), State::Closed);
    assert_eq!(ignored(&env, "short_time_limit"), 3);
    victim_reads(&env, "pay", "transactions").await;
}

/// A find pipelined behind an awaitable hello (mongos serves the connection in order, so
/// the find waits for the hello), closed after 1.2 s: not a read that mongos started.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_queued_behind_an_awaitable_hello_is_not_evidence() {
    let env = Env::start(NAMESPACES).await;
    // mongos blocks the connection while the awaitable hello waits (the fake's own hello
    // would answer early when another request arrives).
    env.fake.set_hook(|b| {
        b.get("maxAwaitTimeMS")
            .ok()
            .flatten()
            .map(|_| Hooked::delay(Duration::from_secs(10)))
    });
    let mut tasks = Vec::new();
    for i in 0..3 {
        let addr = env.proxy_addr();
        tasks.push(tokio::spawn(async move {
            let mut c = RawClient::connect(addr).await;
            let hello = rawdoc! {"hello": 1, "$db": "admin"};
            let first = c.roundtrip(&raw::msg(1, 0, &hello)).await;
            let tv = body(&first)
                .get_document("topologyVersion")
                .expect("topologyVersion")
                .to_owned();
            let awaitable = rawdoc! {
                "hello": 1,
                "topologyVersion": tv,
                "maxAwaitTimeMS": 10_000i64,
                "$db": "admin",
            };
            c.send(&raw::msg(2, 0, &awaitable)).await;
            c.send(&find(
                10 + i,
                "pay",
                "transactions",
                &rawdoc! {"filter": {}},
            ))
            .await;
            tokio::time::sleep(Duration::from_millis(1_200)).await;
            drop(c);
        }));
    }
    for t in tasks {
        t.await.expect("attacker");
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(env.state("pay.transactions"), State::Closed);
    assert_eq!(env.errors("pay.transactions"), 0);
    assert_eq!(ignored(&env, "queued"), 3);
}

/// The real incident: a secondary that cannot refresh answers every read of the namespace
/// (the confirming read included) with a time limit, or with StaleConfig. Three connections
/// open the breaker, as fast as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_secondary_is_confirmed_and_opens_the_breaker() {
    let env = Env::start(NAMESPACES).await;
    env.fake.set_hook(|b| {
        (b.get_str("find").ok() == Some("transactions")).then(|| {
            let ms = b
                .get_i64("maxTimeMS")
                .ok()
                .or(b.get_i32("maxTimeMS").ok().map(i64::from));
            Hooked::error(50, "MaxTimeMSExpired", "operation exceeded time limit")
                .after(Duration::from_millis(ms.unwrap_or(1_000) as u64))
        })
    });
    let started = Instant::now();
    three(&env, |i| {
        find(
            i,
            "pay",
            "transactions",
            &rawdoc! {"filter": {}, "maxTimeMS": 1000},
        )
    })
    .await;
    assert_eq!(env.state("pay.transactions"), State::Open);
    assert!(started.elapsed() < Duration::from_secs(3));
    let confirmed = "staleguard_confirm_reads_total{result=\"confirmed\"}";
    let shared = "staleguard_confirm_reads_total{result=\"shared\"}";
    assert_eq!(metric(&env, confirmed) + metric(&env, shared), 3);
    assert!(metric(&env, confirmed) >= 1);
    // Open, bound mode: a read goes out with maxTimeMS 200, once more under the same bound
    // when that fails, and fails fast with staleguard's error when neither attempt is
    // answered within it.
    let mut c = RawClient::connect(env.proxy_addr()).await;
    let before = env.upstream_bodies("find", "transactions").len();
    let t = Instant::now();
    let reply = c
        .roundtrip(&find(
            50,
            "pay",
            "transactions",
            &rawdoc! {"filter": {}, "maxTimeMS": 1000},
        ))
        .await;
    let b = body(&reply);
    assert_eq!(b.get_i32("code").ok(), Some(50));
    assert!(
        b.get_str("errmsg").unwrap().starts_with("staleguard:"),
        "{b:?}"
    );
    assert!(
        t.elapsed() < Duration::from_millis(700),
        "{:?}",
        t.elapsed()
    );
    let sent = env.upstream_bodies("find", "transactions");
    let attempts = &sent[before..];
    assert_eq!(attempts.len(), 2, "{attempts:?}");
    for a in attempts {
        assert_eq!(policy_support::max_time_ms(a), Some(200));
    }
    // One stale secondary beside a healthy one: the first attempt meets the stale one, the
    // second (mongos's choice again) the healthy one, and the client gets its answer.
    let turn = Arc::new(AtomicU64::new(0));
    let t2 = turn.clone();
    env.fake.set_hook(move |b| {
        let stale = b.get_str("find").ok() == Some("transactions")
            && t2.fetch_add(1, Ordering::SeqCst) % 2 == 0;
        stale.then(|| Hooked::error(13388, "StaleConfig", "stale"))
    });
    let reply = c
        .roundtrip(&find(
            52,
            "pay",
            "transactions",
            &rawdoc! {"filter": {}, "maxTimeMS": 1000},
        ))
        .await;
    assert_eq!(
        body(&reply).get_f64("ok").ok(),
        Some(1.0),
        "{:?}",
        body(&reply)
    );
    assert_eq!(turn.load(Ordering::SeqCst), 2);
    // A healthy secondary answers within the bound: the read is answered.
    env.fake.clear_hook();
    let reply = c
        .roundtrip(&find(
            51,
            "pay",
            "transactions",
            &rawdoc! {"filter": {}, "maxTimeMS": 1000},
        ))
        .await;
    assert_eq!(body(&reply).get_f64("ok").ok(), Some(1.0));
}

/// A proxy whose `pay.transactions` breaker three connections opened with StaleConfig (every
/// find on it answers 13388 until the hook is cleared).
async fn opened_by_stale_config() -> Env {
    let env = Env::start(NAMESPACES).await;
    env.fake.set_hook(|b| {
        (b.get_str("find").ok() == Some("transactions"))
            .then(|| Hooked::error(13388, "StaleConfig", "stale"))
    });
    three(&env, |i| {
        find(i, "pay", "transactions", &rawdoc! {"filter": {}})
    })
    .await;
    assert_eq!(env.state("pay.transactions"), State::Open);
    env
}

/// StaleConfig is the cluster's word: counted at once from three connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_config_from_several_connections_opens_at_once() {
    let env = opened_by_stale_config().await;
    assert_eq!(
        metric(&env, "staleguard_confirm_reads_total{result=\"confirmed\"}"),
        0,
        "no confirming read needed"
    );
}

/// An open breaker closes on a streak of answers from two connections, not on one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_breaker_closes_on_sustained_success_only() {
    let env = opened_by_stale_config().await;
    env.fake.clear_hook();
    let mut a = RawClient::connect(env.proxy_addr()).await;
    let mut b = RawClient::connect(env.proxy_addr()).await;
    // One connection's answers alone never close it.
    for i in 0..5 {
        a.roundtrip(&find(
            100 + i,
            "pay",
            "transactions",
            &rawdoc! {"filter": {}},
        ))
        .await;
    }
    assert_eq!(env.state("pay.transactions"), State::Open);
    // Two connections over more than min_cooldown (1 s) do.
    let t = Instant::now();
    let mut i = 200;
    while env.state("pay.transactions") == State::Open {
        assert!(t.elapsed() < Duration::from_secs(4), "still open");
        for c in [&mut a, &mut b] {
            c.roundtrip(&find(i, "pay", "transactions", &rawdoc! {"filter": {}}))
                .await;
            i += 1;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        metric(&env, "staleguard_breaker_transitions_total{namespace=\"pay.transactions\",from=\"open\",to=\"closed\"}") == 1
    );
}
