//! Issue 29: the breaker hears only the cluster, everywhere, and nothing is relaxed without
//! its word. Each case is tried as an outsider would, with raw sockets, against the real
//! proxy in front of a fake mongos that serves each connection's requests in order: what
//! decides whether a breaker stays open or closes (its samples), the questions staleguard
//! asks the cluster (on connections of its own, shared per namespace, bounded per client
//! connection), views, slow healthy reads, tag-pinned reads beside a primary rung, a mongos
//! that goes silent, and the fail-fast text.

use crate::policy_support;
use crate::support;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bson::{rawdoc, RawDocument, RawDocumentBuf};
use bytes::Bytes;
use staleguard::breaker::State;

use policy_support::{body, is_confirm, max_time_ms, read_concern, Env};
use support::mongos::Hooked;
use support::raw::{self, RawClient};

/// The shipped evidence rules (`min_connections = 2`, `per_connection = 1`, `min_wait = 1s`,
/// `threshold = 3`), bound mode on strict; a strict namespace with the primary rung.
const NAMESPACES: &str = r#"
[[namespaces]]
pattern = "demo.store_inventory"
mode = "fallback"

[[namespaces]]
pattern = "pay.*"
mode = "strict"

[[namespaces]]
pattern = "ledger.*"
mode = "strict"
ladder = ["primary"]
"#;

static IDS: AtomicI32 = AtomicI32::new(1);

fn id() -> i32 {
    IDS.fetch_add(1, Ordering::Relaxed)
}

/// A `find` on `db.coll` with `extra` fields (a secondary read unless `extra` says).
fn find(db: &str, coll: &str, extra: &RawDocument) -> Bytes {
    let mut b = rawdoc! {"find": coll};
    let mut pref = false;
    for e in extra.iter() {
        let (k, v) = e.expect("element");
        pref |= k == "$readPreference";
        b.append(k, bson::RawBson::from(v));
    }
    if !pref {
        b.append(
            bson::raw::cstr!("$readPreference"),
            rawdoc! {"mode": "secondary"},
        );
    }
    b.append(bson::raw::cstr!("$db"), db);
    raw::msg(id(), 0, &b)
}

fn ok(reply: &[u8]) -> bool {
    body(reply).get_f64("ok").ok() == Some(1.0)
}

fn code(reply: &[u8]) -> Option<i32> {
    body(reply).get_i32("code").ok()
}

fn errmsg(reply: &[u8]) -> String {
    body(reply).get_str("errmsg").unwrap_or("").to_string()
}

fn filter_has(b: &RawDocument, key: &str) -> bool {
    b.get_document("filter")
        .ok()
        .is_some_and(|f| f.get(key).ok().flatten().is_some())
}

fn own_limit(b: &RawDocument) -> Option<i64> {
    max_time_ms(b)
}

fn metric(env: &Env, prefix: &str) -> u64 {
    let text = env.proxy.shared().metrics.render();
    text.lines()
        .filter(|l| l.starts_with(prefix))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// A connection that proved itself: mongos answered one of its reads.
async fn proven(addr: SocketAddr) -> RawClient {
    let mut c = RawClient::connect(addr).await;
    let r = c
        .roundtrip(&find("demo", "other", &rawdoc! {"filter": {}}))
        .await;
    assert!(ok(&r), "{:?}", body(&r));
    c
}

/// Opens the breaker of `db.coll` with StaleConfig from three proven connections, while
/// `stale` is set (the hook answers reads with an empty filter with 13388).
async fn open_with_stale_config(env: &Env, db: &str, coll: &str) {
    for _ in 0..3 {
        let mut c = proven(env.proxy_addr()).await;
        let r = c.roundtrip(&find(db, coll, &rawdoc! {"filter": {}})).await;
        assert_eq!(code(&r), Some(13388), "{:?}", body(&r));
    }
    assert_eq!(env.state(&format!("{db}.{coll}")), State::Open);
}

/// The stale-routing incident on `coll` while `stale` holds; healthy answers otherwise;
/// `extra` decides first.
fn hook_incident(
    env: &Env,
    coll: &'static str,
    stale: Arc<AtomicBool>,
    extra: impl Fn(&RawDocument) -> Option<Hooked> + Send + Sync + 'static,
) {
    env.fake.set_hook(move |b| {
        if b.get_str("find").ok() != Some(coll) || is_confirm(b) {
            return None;
        }
        if let Some(h) = extra(b) {
            return Some(h);
        }
        stale
            .load(Ordering::Relaxed)
            .then(|| Hooked::error(13388, "StaleConfig", "stale"))
    });
}

/// After a real incident heals, a client whose reads carry its own `maxTimeMS: 1` keeps
/// sending them; the honest readers' answers close the breaker within 5 s anyway, and their
/// reads are answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn own_short_limits_do_not_hold_a_healed_breaker_open() {
    let env = Env::start_budgeted(NAMESPACES).await;
    let stale = Arc::new(AtomicBool::new(true));
    hook_incident(&env, "transactions", stale.clone(), |b| {
        (own_limit(b) == Some(1))
            .then(|| Hooked::error(50, "MaxTimeMSExpired", "operation exceeded time limit"))
    });
    open_with_stale_config(&env, "pay", "transactions").await;
    stale.store(false, Ordering::Relaxed);
    let healed = Instant::now();
    let addr = env.proxy_addr();
    let attacker = tokio::spawn(async move {
        let mut c = proven(addr).await;
        for _ in 0..25 {
            let m = find(
                "pay",
                "transactions",
                &rawdoc! {"filter": {}, "maxTimeMS": 1},
            );
            assert_eq!(code(&c.roundtrip(&m).await), Some(50));
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    });
    let mut victims = [proven(addr).await, proven(addr).await];
    while env.state("pay.transactions") == State::Open {
        assert!(healed.elapsed() < Duration::from_secs(5), "still open");
        for v in victims.iter_mut() {
            let m = find("pay", "transactions", &rawdoc! {"filter": {}});
            assert!(ok(&v.roundtrip(&m).await), "a healthy read is answered");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for v in victims.iter_mut() {
        let m = find("pay", "transactions", &rawdoc! {"filter": {}});
        assert!(ok(&v.roundtrip(&m).await));
    }
    attacker.await.expect("attacker");
    assert_eq!(env.state("pay.transactions"), State::Closed);
    assert!(
        metric(
            &env,
            "staleguard_evidence_ignored_total{why=\"short_time_limit\"}"
        ) >= 1
    );
}

/// During a real incident, reads that mongos refuses as Unauthorized (connections that
/// never authenticated, queued or not) are no answers: the breaker stays open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unauthorized_replies_never_close_an_open_breaker() {
    let env = Env::start_budgeted(NAMESPACES).await;
    let stale = Arc::new(AtomicBool::new(true));
    hook_incident(&env, "transactions", stale, |b| {
        filter_has(b, "unauthenticated")
            .then(|| Hooked::error(13, "Unauthorized", "command find requires authentication"))
    });
    open_with_stale_config(&env, "pay", "transactions").await;
    let opened = metric(
        &env,
        "staleguard_breaker_transitions_total{namespace=\"pay.transactions\",from=\"open\"",
    );
    let mut tasks = Vec::new();
    for i in 0..4 {
        let addr = env.proxy_addr();
        tasks.push(tokio::spawn(async move {
            // Two fresh connections, two that proved themselves with another read.
            let mut c = match i % 2 {
                0 => RawClient::connect(addr).await,
                _ => proven(addr).await,
            };
            for _ in 0..15 {
                let m = find(
                    "pay",
                    "transactions",
                    &rawdoc! {"filter": {"unauthenticated": 1}},
                );
                assert_eq!(code(&c.roundtrip(&m).await), Some(13));
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }));
    }
    for t in tasks {
        t.await.expect("attacker");
    }
    assert_eq!(env.state("pay.transactions"), State::Open);
    let closed = metric(
        &env,
        "staleguard_breaker_transitions_total{namespace=\"pay.transactions\",from=\"open\"",
    );
    assert_eq!(closed, opened, "never closed");
}

/// A slow view: its reads run out of their own (long enough) limit. The question goes to
/// the view's source collection, which answers at once: nothing counts, the breaker stays
/// closed, and strict reads of the view keep getting mongos's own answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_view_is_asked_about_on_its_source_collection() {
    let env = Env::start_budgeted(NAMESPACES).await;
    env.fake.view("pay.slow_view", "source");
    env.fake.seed("pay.source", [rawdoc! {"_id": 1}]);
    env.fake.set_hook(|b| {
        (b.get_str("find").ok() == Some("slow_view")).then(|| {
            Hooked::error(50, "MaxTimeMSExpired", "view pipeline too slow")
                .after(Duration::from_millis(1_050))
        })
    });
    for round in 0..2 {
        let mut tasks = Vec::new();
        for _ in 0..3 {
            let addr = env.proxy_addr();
            tasks.push(tokio::spawn(async move {
                let mut c = proven(addr).await;
                let m = find(
                    "pay",
                    "slow_view",
                    &rawdoc! {"filter": {}, "maxTimeMS": 1000},
                );
                let r = c.roundtrip(&m).await;
                tokio::time::sleep(Duration::from_millis(600)).await;
                r
            }));
        }
        for t in tasks {
            let r = t.await.expect("reader");
            assert_eq!(code(&r), Some(50), "round {round}: mongos's own reply");
            assert!(!errmsg(&r).starts_with("staleguard"), "{}", errmsg(&r));
        }
        assert_eq!(env.state("pay.slow_view"), State::Closed, "round {round}");
    }
    // The cheap reads read the source, never the view.
    let cheap: Vec<RawDocumentBuf> = env
        .upstream_bodies("find", "source")
        .into_iter()
        .filter(|b| is_confirm(b))
        .collect();
    assert!(!cheap.is_empty(), "asked on the source collection");
    assert!(env
        .upstream_bodies("find", "slow_view")
        .iter()
        .all(|b| !is_confirm(b)));
    assert!(env
        .fake
        .received_commands()
        .iter()
        .any(|(n, _)| n == "listCollections"));
}

/// On a healthy cluster a slow read (1.2 s) is answered through staleguard as mongos
/// answers it: staleguard's own first-attempt limit cuts it, the cluster is asked, answers,
/// and the read goes again unchanged: never `available`, never to the primary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_healthy_slow_read_is_never_relaxed_or_climbed() {
    let env = Env::start_budgeted(NAMESPACES).await;
    env.fake.set_hook(|b| {
        if !filter_has(b, "slow") {
            return None;
        }
        Some(match own_limit(b) {
            Some(ms) if ms < 1_200 => {
                Hooked::error(50, "MaxTimeMSExpired", "operation exceeded time limit")
                    .after(Duration::from_millis(ms as u64))
            }
            _ => Hooked::delay(Duration::from_millis(1_200)),
        })
    });
    let mut c = proven(env.proxy_addr()).await;
    let cases: [(&str, &str, Option<i32>); 4] = [
        ("demo", "store_inventory", Some(3000)),
        ("demo", "store_inventory", None),
        ("ledger", "entries", None),
        ("ledger", "entries", Some(3000)),
    ];
    for (db, coll, limit) in cases {
        for _ in 0..3 {
            let mut extra = rawdoc! {"filter": {"slow": true}};
            if let Some(ms) = limit {
                extra.append(bson::raw::cstr!("maxTimeMS"), ms);
            }
            let r = c.roundtrip(&find(db, coll, &extra)).await;
            assert!(ok(&r), "{db}.{coll} {limit:?}: {:?}", body(&r));
        }
        let sent = env.upstream_bodies("find", coll);
        for b in sent.iter().filter(|b| !is_confirm(b)) {
            assert_eq!(read_concern(b), None, "{db}.{coll}: never relaxed");
            let pref = b
                .get_document("$readPreference")
                .expect("a read preference");
            assert_eq!(
                pref.get_str("mode").ok(),
                Some("secondary"),
                "never to the primary"
            );
        }
        assert_eq!(env.state(&format!("{db}.{coll}")), State::Closed);
    }
}

/// A read pinned by tag sets on a strict namespace with the primary rung, while its
/// breaker is open: it never climbs, so it is sent as it would be without the rung (under
/// the bound) and its healthy tagged member answers it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tag_pinned_read_beside_a_primary_rung_is_sent_while_open() {
    let env = Env::start_budgeted(NAMESPACES).await;
    let stale = Arc::new(AtomicBool::new(true));
    hook_incident(&env, "entries", stale, |b| {
        let tagged = b
            .get_document("$readPreference")
            .ok()
            .is_some_and(|p| p.get("tags").ok().flatten().is_some());
        tagged.then(|| Hooked::delay(Duration::ZERO))
    });
    open_with_stale_config(&env, "ledger", "entries").await;
    let mut c = proven(env.proxy_addr()).await;
    let pinned = rawdoc! {
        "filter": {},
        "$readPreference": {"mode": "secondary", "tags": [{"dc": "east"}]},
    };
    let started = Instant::now();
    let r = c.roundtrip(&find("ledger", "entries", &pinned)).await;
    assert!(ok(&r), "answered by its tagged member: {:?}", body(&r));
    assert!(started.elapsed() < Duration::from_millis(500));
}

/// Both attempts under an open breaker's bound met StaleConfig: the fail-fast error says so
/// (not "did not answer in time"), and does not announce when the breaker looks again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fail_fast_error_names_what_the_attempts_met() {
    let env = Env::start_budgeted(NAMESPACES).await;
    let stale = Arc::new(AtomicBool::new(true));
    hook_incident(&env, "transactions", stale, |_| None);
    open_with_stale_config(&env, "pay", "transactions").await;
    let mut c = proven(env.proxy_addr()).await;
    let r = c
        .roundtrip(&find("pay", "transactions", &rawdoc! {"filter": {}}))
        .await;
    assert_eq!(code(&r), Some(13388));
    let msg = errmsg(&r);
    assert!(msg.starts_with("staleguard:"), "{msg}");
    assert!(
        msg.contains("StaleConfig (13388), then StaleConfig (13388)"),
        "{msg}"
    );
    assert!(!msg.contains("in time") && !msg.contains("probe"), "{msg}");
}

/// mongos accepts a read and stays silent: the client gets staleguard's MaxTimeMSExpired
/// at its budget and a grace, not its own socket timeout; the late reply is dropped and the
/// connection goes on; the router is reported.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_mongos_is_answered_at_the_reads_budget() {
    let env = Env::start_budgeted(NAMESPACES).await;
    env.fake
        .set_hook(|b| filter_has(b, "silent").then(|| Hooked::delay(Duration::from_secs(4))));
    let mut c = proven(env.proxy_addr()).await;
    let started = Instant::now();
    let m = find(
        "pay",
        "transactions",
        &rawdoc! {"filter": {"silent": 1}, "maxTimeMS": 1000},
    );
    let r = c.roundtrip(&m).await;
    let took = started.elapsed();
    assert_eq!(code(&r), Some(50), "{:?}", body(&r));
    assert!(
        errmsg(&r).starts_with("staleguard: mongos did not answer"),
        "{}",
        errmsg(&r)
    );
    // Its maxTimeMS (1 s), the grace (1 s), the deadline tick (100 ms), and slack.
    assert!(took >= Duration::from_millis(1_900), "{took:?}");
    assert!(took < Duration::from_millis(2_800), "{took:?}");
    // The late reply is dropped; the next read is answered once mongos serves it.
    let r = c
        .roundtrip(&find("pay", "transactions", &rawdoc! {"filter": {}}))
        .await;
    assert!(ok(&r), "{:?}", body(&r));
    assert_eq!(metric(&env, "staleguard_upstream_silent_reads_total"), 1);
    let status = staleguard::admin::status::collect(&env.proxy.shared().admin(), true);
    assert_eq!(status.upstreams[0].silent_reads, 1);
}

/// One connection's reads keep running out of their own limit on a healthy cluster: it
/// starts at most one question (three cheap reads) per window, and its next request never
/// waits behind one (they go on connections of staleguard's own).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_connection_starts_one_question_per_window_and_never_waits_for_it() {
    let env = Env::start_budgeted(NAMESPACES).await;
    env.fake.set_hook(|b| {
        filter_has(b, "slow").then(|| {
            Hooked::error(50, "MaxTimeMSExpired", "operation exceeded time limit")
                .after(Duration::from_millis(1_000))
        })
    });
    let mut c = proven(env.proxy_addr()).await;
    for _ in 0..6 {
        let m = find(
            "pay",
            "transactions",
            &rawdoc! {"filter": {"slow": 1}, "maxTimeMS": 1000},
        );
        assert_eq!(code(&c.roundtrip(&m).await), Some(50));
        // The next request at once: answered without waiting for any question.
        let t = Instant::now();
        let r = c
            .roundtrip(&find("pay", "transactions", &rawdoc! {"filter": {}}))
            .await;
        assert!(ok(&r));
        assert!(
            t.elapsed() < Duration::from_millis(150),
            "{:?}",
            t.elapsed()
        );
    }
    let cheap = env
        .upstream_bodies("find", "transactions")
        .into_iter()
        .filter(|b| is_confirm(b))
        .count();
    assert_eq!(cheap, 3, "one question (three cheap reads) in the window");
    assert_eq!(env.state("pay.transactions"), State::Closed);
}
