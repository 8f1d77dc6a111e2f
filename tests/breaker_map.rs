//! Issue 20, item 6: the breaker map against a flood of names, through the real proxy and
//! raw sockets to an in-process fake mongos. An attacker that follows every evidence rule
//! (three connections, one error each per name) makes 10,000 names under `pay.*` reach their
//! breakers; `pay.transactions` (listed exactly) and `db.orders` (under another wildcard
//! pattern) must still open on a real incident afterwards.

use crate::policy_support;
use crate::support;

use std::time::Duration;

use bson::rawdoc;
use bytes::Bytes;
use staleguard::breaker::State;

use policy_support::Env;
use support::mongos::Hooked;
use support::raw::{self, RawClient};

/// The built-in evidence rules (threshold 3 from 2 connections, one error per connection).
const NAMESPACES: &str = r#"
[[namespaces]]
pattern = "pay.transactions"
mode = "strict"

[[namespaces]]
pattern = "pay.*"
mode = "strict"

[[namespaces]]
pattern = "db.*"
mode = "strict"
"#;

const FLOOD: usize = 10_000;
/// Reads one raw client has in flight at once (below `max_pending_reads`, so each is
/// tracked and its error reaches the breaker).
const PIPELINE: usize = 500;

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

/// `names` as secondary finds on `db`, pipelined [`PIPELINE`] at a time; returns the
/// replies' `code`s.
async fn flood(c: &mut RawClient, db: &str, names: &[String]) -> Vec<i32> {
    let mut codes = Vec::with_capacity(names.len());
    let mut id = 1;
    for chunk in names.chunks(PIPELINE) {
        let mut out = Vec::new();
        for coll in chunk {
            out.extend_from_slice(&secondary_find(id, db, coll));
            id += 1;
        }
        c.send(&out).await;
        for _ in chunk {
            let body = policy_support::body(&c.recv().await);
            codes.push(body.get_i32("code").unwrap_or(0));
        }
    }
    codes
}

fn metric(text: &str, line_start: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(line_start))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no `{line_start}` in /metrics"))
}

/// One read on `ns` from each of three fresh connections; the replies' bodies.
async fn incident_reads(env: &Env, db: &str, coll: &str) -> Vec<bson::RawDocumentBuf> {
    let mut out = Vec::new();
    for i in 0..3 {
        let mut c = RawClient::connect(env.proxy_addr()).await;
        let reply = c.roundtrip(&secondary_find(100 + i, db, coll)).await;
        out.push(policy_support::body(&reply));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_names_leaves_exact_and_other_patterns_their_breakers() {
    let env = Env::start(NAMESPACES).await;
    // Every secondary read in `pay` and `db` meets StaleConfig: the flood's names and the
    // later real incident alike.
    env.fake
        .set_hook(|_| Some(Hooked::error(13388, "StaleConfig", "stale")));
    let names: Vec<String> = (0..FLOOD).map(|i| format!("flood{i}")).collect();

    // Three attacker connections, each one error per name: every name has threshold errors
    // from enough connections.
    let started = std::time::Instant::now();
    let mut attackers = Vec::new();
    for _ in 0..3 {
        attackers.push(RawClient::connect(env.proxy_addr()).await);
    }
    let runs = attackers.iter_mut().map(|c| flood(c, "pay", &names));
    for codes in futures::future::join_all(runs).await {
        assert_eq!(codes.len(), FLOOD);
        assert!(codes.iter().all(|&c| c == 13388), "each reached mongos");
    }
    // A name evicted between its errors (as idlest closed breaker) is left closed: the
    // attacker sends those again until every breaker the flood holds is open.
    for _ in 0..5 {
        let closed: Vec<String> = env
            .proxy
            .shared()
            .breakers
            .snapshot()
            .into_iter()
            .filter(|s| s.state == State::Closed)
            .filter_map(|s| s.ns.strip_prefix("pay.").map(str::to_string))
            .collect();
        if closed.is_empty() {
            break;
        }
        let runs = attackers.iter_mut().map(|c| flood(c, "pay", &closed));
        futures::future::join_all(runs).await;
    }
    let flood_took = started.elapsed();

    let snapshot = env.proxy.shared().breakers.snapshot();
    let flood_breakers = snapshot.len();
    let open_flood = snapshot.iter().filter(|s| s.state == State::Open).count();
    // 10,000 slots less one reserved; two wildcard patterns: at most half of 9,999 each.
    assert_eq!(flood_breakers, 4_999, "pay.* holds its share, no more");
    assert_eq!(open_flood, 4_999, "the flood filled it with open breakers");
    let text = env.proxy.shared().metrics.render();
    assert_eq!(metric(&text, "staleguard_breakers "), flood_breakers as f64);
    assert!(metric(&text, "staleguard_limit_hits_total{limit=\"max_breakers\"}") > 0.0);

    // The real incident: pay.transactions (listed exactly) and db.orders (another pattern)
    // open on three connections' errors, and the next read fails fast.
    for (db, coll) in [("pay", "transactions"), ("db", "orders")] {
        let ns = format!("{db}.{coll}");
        let replies = incident_reads(&env, db, coll).await;
        assert!(replies
            .iter()
            .all(|b| b.get_i32("code").ok() == Some(13388)));
        assert_eq!(env.state(&ns), State::Open, "{ns} has its breaker");
        let mut c = RawClient::connect(env.proxy_addr()).await;
        let body = policy_support::body(&c.roundtrip(&secondary_find(200, db, coll)).await);
        let errmsg = body.get_str("errmsg").unwrap_or_default();
        assert!(errmsg.starts_with("staleguard:"), "{ns}: {errmsg}");
    }
    assert!(
        flood_took < Duration::from_secs(120),
        "flood took {flood_took:?}"
    );
    eprintln!("flood of 3 x {FLOOD} reads took {flood_took:?}: {open_flood} open breakers of {flood_breakers}");
}
