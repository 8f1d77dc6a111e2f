//! Issue 20, item 7: attackers against the primary ladder's guard, through the real proxy
//! and raw sockets, against the simulated cluster during the incident (shard A's primary
//! stalled, secondary a1 restarted). Each attacker follows the rules a connection is held
//! to; the victim is one connection reading as a driver does, one request at a time.
//!
//! - 4 connections each leave a request mongos never finishes (an insert on the stalled
//!   primary) and pipeline primary-rung reads behind it: such reads would wait in mongos's
//!   queue for that connection, so they get no guard slot (they fail fast);
//! - 4 connections read as fast as they can: each is held to `per_connection_per_second`,
//!   so they cannot spend the upstream's `max_per_second`;
//! - meanwhile every read of the victim climbs to the primary and is answered;
//! - reads pinned by tag sets never go to the primary.

use crate::policy_support;
use crate::support;

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bson::{rawdoc, RawDocumentBuf};
use bytes::Bytes;
use staleguard::breaker::State;
use staleguard::config::Config;
use staleguard::sim::{self, SimConfig};

use support::raw::{self, RawClient};
use support::tap::Tap;

const PAYMENTS: &str = "pay.transactions";

/// `pay.*` strict with the primary rung, the built-in evidence rules (threshold 2 here);
/// the guard: 16 slots, 40 reads per second per upstream, so 4 per connection by default.
const CONFIG: &str = r#"
[[namespaces]]
pattern = "pay.*"
mode = "strict"
ladder = ["primary"]
threshold = 2
cooldown = "30s"
min_cooldown = "30s"

[ladder_guard]
max_in_flight = 16
max_per_second = 40
per_connection = 4
"#;

fn find(id: i32, read_preference: RawDocumentBuf) -> Bytes {
    raw::msg(
        id,
        0,
        &rawdoc! {
            "find": "transactions",
            "filter": {},
            "batchSize": 1000,
            "$readPreference": read_preference,
            "$db": "pay",
        },
    )
}

fn secondary() -> RawDocumentBuf {
    rawdoc! { "mode": "secondary" }
}

/// Pinned to a1 on shard A (b1 on shard B) by tag sets.
fn pinned_to_a1() -> RawDocumentBuf {
    rawdoc! { "mode": "secondary", "tags": [{ "node": "a1" }, { "node": "b1" }] }
}

fn ok(reply: &RawDocumentBuf) -> bool {
    reply.get_f64("ok").ok() == Some(1.0) || reply.get_i32("ok").ok() == Some(1)
}

fn fails_fast(reply: &RawDocumentBuf) -> bool {
    reply
        .get_str("errmsg")
        .is_ok_and(|m| m.starts_with("staleguard:"))
}

/// Finds on `pay.transactions` that reached the sim with `$readPreference.mode` primary.
fn primary_finds(back: &Tap) -> usize {
    back.to_server()
        .iter()
        .filter_map(|m| policy_support::try_body(m))
        .filter(|b| b.get_str("find").ok() == Some("transactions"))
        .filter(|b| {
            b.get_document("$readPreference")
                .ok()
                .and_then(|rp| rp.get_str("mode").ok())
                == Some("primary")
        })
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attackers_cannot_take_the_ladder_from_a_victim() {
    let sim = sim::start(SimConfig {
        listen: "127.0.0.1:0".into(),
        refresh_timeout: Duration::from_millis(300),
        stale_retries: 1,
        find_host_timeout: Duration::from_millis(200),
        seed: 7,
        ..SimConfig::default()
    })
    .await
    .expect("sim starts");
    let back = Tap::start(sim.addr()).await;
    let text = format!(
        "listen = \"127.0.0.1:0\"\nupstreams = [\"{}\"]\nshutdown_timeout = \"0s\"\n\
         health_interval = \"off\"\n\n[admin]\nenabled = false\n{CONFIG}",
        back.addr()
    );
    let config = Config::parse(&text, Path::new("ladder-attack.toml")).expect("config");
    let proxy = staleguard::server::start(Arc::new(config))
        .await
        .expect("start staleguard");
    let addr = proxy.local_addr();
    let cluster = sim.cluster();
    cluster.stall_primary("shardA").expect("stall shard A");
    cluster.restart_node("a1").expect("restart a1");

    // Three connections read pinned to a1: a1 refuses (StaleConfig), which counts and opens
    // the breaker, but a pinned read never climbs to the primary.
    for i in 0..3 {
        let mut c = RawClient::connect(addr).await;
        let reply = raw::body(&c.roundtrip(&find(1 + i, pinned_to_a1())).await);
        assert_eq!(reply.get_i32("code").ok(), Some(13388), "{reply:?}");
        assert!(!fails_fast(&reply) || i > 0, "the first reaches a1");
    }
    assert_eq!(proxy.shared().breakers.state(PAYMENTS), State::Open);
    assert_eq!(
        primary_finds(&back),
        0,
        "no pinned read went to the primary"
    );

    // Attack 1: a request mongos never finishes (an insert on shard A's stalled primary),
    // then 4 primary-rung reads pipelined behind it, on each of 4 connections.
    let mut stuck = Vec::new();
    for a in 0..4 {
        let mut c = RawClient::connect(addr).await;
        let insert = rawdoc! {
            "insert": "orders", "documents": [{ "_id": format!("attacker-{a}") }], "$db": "demo",
        };
        let mut out = raw::msg(10, 0, &insert).to_vec();
        for i in 0..4 {
            out.extend_from_slice(&find(20 + i, secondary()));
        }
        c.send(&out).await;
        stuck.push(c);
    }
    let in_flight = || {
        proxy
            .shared()
            .upstreams
            .list()
            .iter()
            .map(|u| u.ladder.in_flight())
            .sum::<u32>()
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        in_flight(),
        0,
        "no slot is held by a read mongos has not started"
    );
    for c in &mut stuck {
        for _ in 0..4 {
            let reply = raw::body(&c.recv().await);
            assert!(fails_fast(&reply), "queued behind the insert: {reply:?}");
        }
    }

    // Attack 2: 4 more connections read as fast as they can for 3 s, while the victim reads
    // 3 times a second, one request at a time.
    let before = primary_finds(&back);
    let attack_answered = Arc::new(AtomicU64::new(0));
    let attack_denied = Arc::new(AtomicU64::new(0));
    let until = Instant::now() + Duration::from_secs(3);
    let mut attackers = Vec::new();
    for a in 0..4 {
        let (answered, denied) = (attack_answered.clone(), attack_denied.clone());
        attackers.push(tokio::spawn(async move {
            let mut c = RawClient::connect(addr).await;
            let mut id = 1000 * (a + 1);
            while Instant::now() < until {
                id += 1;
                let reply = raw::body(&c.roundtrip(&find(id, secondary())).await);
                if ok(&reply) {
                    answered.fetch_add(1, Ordering::Relaxed);
                } else {
                    assert!(fails_fast(&reply), "{reply:?}");
                    denied.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    let mut victim = RawClient::connect(addr).await;
    let mut victim_answered = 0;
    for i in 0..9 {
        let started = Instant::now();
        let reply = raw::body(&victim.roundtrip(&find(500 + i, secondary())).await);
        assert!(ok(&reply), "victim read {i} answered: {reply:?}");
        let batch = reply
            .get_document("cursor")
            .and_then(|c| c.get_array("firstBatch"))
            .expect("a cursor");
        assert_eq!(
            batch.into_iter().count(),
            300,
            "the whole collection, from the primary"
        );
        victim_answered += 1;
        tokio::time::sleep(Duration::from_millis(330).saturating_sub(started.elapsed())).await;
    }
    for a in attackers {
        a.await.expect("attacker");
    }
    let (answered, denied) = (
        attack_answered.load(Ordering::Relaxed),
        attack_denied.load(Ordering::Relaxed),
    );
    println!(
        "victim {victim_answered}/9 answered; attackers {answered} answered, {denied} failed fast"
    );
    assert_eq!(victim_answered, 9);
    // Each attacker is held to 4 starts per second: about 3 s (4 windows at most) x 4 x 4.
    assert!(
        answered <= 4 * 4 * 4,
        "attackers' primary reads: {answered}"
    );
    assert!(
        denied > answered,
        "the attackers were refused most: {denied} vs {answered}"
    );
    let climbed = primary_finds(&back) - before;
    assert_eq!(
        climbed as u64,
        answered + 9,
        "every primary read: the attackers' and the victim's"
    );

    // After all that, a pinned read still never goes to the primary.
    let before = primary_finds(&back);
    let reply = raw::body(&victim.roundtrip(&find(900, pinned_to_a1())).await);
    assert!(fails_fast(&reply), "breaker open, no rung: {reply:?}");
    assert_eq!(primary_finds(&back), before);

    drop(stuck);
    proxy.shutdown().await;
    sim.shutdown().await;
}
