//! The primary ladder (issue 12) through the real driver against the fake mongos: a strict
//! read that meets a trigger error, or an open breaker, is sent once to the primary
//! (`$readPreference` only changed); the upstream's `[ladder_guard]` bounds it; a fallback
//! read climbs primary, then `available`; replies served with `available` are examined for
//! documents returned twice (the orphan estimate). Without `ladder`, behaviour is the
//! fail-fast of `tests/policy.rs`.

use crate::policy_support;
use crate::support;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bson::{doc, rawdoc, Document, RawDocument, RawDocumentBuf};
use futures::TryStreamExt;
use mongodb::options::{CollectionOptions, ReadPreference, SelectionCriteria};
use mongodb::{Client, Collection};
use staleguard::breaker::State;

use policy_support::*;
use support::mongos::Hooked;

const ACCOUNTS: &str = "pay.accounts";
const INVENTORY: &str = "demo.store_inventory";

/// The decision-table namespaces (`BASE_NAMESPACES`: one connection's errors count, a fixed
/// 30 s cooldown), both with the primary rung and the built-in budget split (written out:
/// `Env` otherwise gives the first attempt the whole budget), then `guard`.
fn namespaces(guard: &str) -> String {
    let split = "attempt_share = 0.5\nattempt_limit = \"500ms\"\n";
    let with_rung = BASE_NAMESPACES
        .replace(
            "mode = \"fallback\"\n",
            &format!("mode = \"fallback\"\nladder = [\"primary\", \"available\"]\n{split}"),
        )
        .replace(
            "mode = \"strict\"\n",
            &format!("mode = \"strict\"\nladder = [\"primary\"]\n{split}"),
        );
    assert_eq!(with_rung.matches("ladder =").count(), 2, "{with_rung}");
    format!("{with_rung}{guard}")
}

fn secondary_coll(client: &Client, ns: &str) -> Collection<Document> {
    let (db, coll) = ns.split_once('.').expect("db.coll");
    let opts = CollectionOptions::builder()
        .selection_criteria(SelectionCriteria::ReadPreference(
            ReadPreference::Secondary {
                options: Default::default(),
            },
        ))
        .build();
    client.database(db).collection_with_options(coll, opts)
}

async fn find(c: &Collection<Document>) -> mongodb::error::Result<Vec<Document>> {
    let cursor = c.find(doc! {}).max_time(Duration::from_secs(10)).await?;
    cursor.try_collect().await
}

fn read_pref_mode(body: &RawDocument) -> Option<String> {
    body.get_document("$readPreference")
        .ok()
        .and_then(|d| d.get_str("mode").ok())
        .map(str::to_string)
}

/// The cluster of the incident: secondary reads of `coll` fail with StaleConfig; primary
/// reads answer (from the seeded documents) unless `primary_down`; `available` reads answer.
struct Incident {
    primary_down: Arc<AtomicBool>,
    primary_reads: Arc<AtomicU64>,
}

fn incident(env: &Env, coll: &'static str) -> Incident {
    let primary_down = Arc::new(AtomicBool::new(false));
    let primary_reads = Arc::new(AtomicU64::new(0));
    let (down, reads) = (primary_down.clone(), primary_reads.clone());
    env.fake.set_hook(move |body| {
        if !is_read_on(body, coll) || level(body).as_deref() == Some("available") {
            return None;
        }
        let mode = read_pref_mode(body);
        if mode.is_none() || mode.as_deref() == Some("primary") {
            reads.fetch_add(1, Ordering::SeqCst);
            if !down.load(Ordering::SeqCst) {
                return None;
            }
            return Some(Hooked::error(13388, "StaleConfig", "primary refused too"));
        }
        Some(Hooked::error(13388, "StaleConfig", "secondary refused"))
    });
    Incident {
        primary_down,
        primary_reads,
    }
}

fn attempts(env: &Env, ns: &str, rung: &'static str, result: &'static str) -> u64 {
    env.proxy
        .shared()
        .metrics
        .ladder
        .attempts_of(ns, rung, result)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strict_reads_climb_to_the_primary_closed_and_open() {
    let env = Env::start(&namespaces("")).await;
    env.fake.seed(ACCOUNTS, seed_docs(3));
    let inc = incident(&env, "accounts");
    let client = env.client("").await;
    let c = secondary_coll(&client, ACCOUNTS);

    // Breaker closed: the secondary's StaleConfig is counted, the read goes to the primary
    // and answers; the client never sees the error.
    for i in 1..=3 {
        let docs = find(&c).await.expect("answered by the primary");
        assert_eq!(docs.len(), 3);
        let up = env.upstream_bodies("find", "accounts");
        assert_eq!(up.len(), 2 * i);
        let (first, second) = (&up[2 * i - 2], &up[2 * i - 1]);
        assert_eq!(read_pref_mode(first).as_deref(), Some("secondary"));
        assert_eq!(read_pref_mode(second).as_deref(), Some("primary"));
        assert_eq!(
            second.get_document("$readPreference").unwrap(),
            rawdoc! { "mode": "primary" }.as_ref(),
            "tags and staleness removed"
        );
        assert_eq!(
            read_concern(second),
            read_concern(first),
            "read concern untouched"
        );
        assert_eq!(read_concern(second), None, "never available");
        // The first attempt leaves room; the primary, the last rung, gets the rest.
        assert_eq!(max_time_ms(first), Some(500));
        let rest = max_time_ms(second).expect("a limit");
        assert!((9_000..=10_000).contains(&rest), "{rest}");
    }
    assert_eq!(env.state(ACCOUNTS), State::Open);
    assert_eq!(attempts(&env, ACCOUNTS, "primary", "answered"), 3);

    // Breaker open: straight to the primary, the secondary is not tried.
    let before = env.upstream("find", "accounts").len();
    let docs = find(&c).await.expect("answered by the primary");
    assert_eq!(docs.len(), 3);
    let up = env.upstream_bodies("find", "accounts");
    assert_eq!(up.len(), before + 1);
    assert_eq!(read_pref_mode(&up[before]).as_deref(), Some("primary"));
    assert_eq!(attempts(&env, ACCOUNTS, "primary", "answered"), 4);
    assert_eq!(inc.primary_reads.load(Ordering::SeqCst), 4);

    // The primary fails too: its own error reaches the client, nothing more is sent.
    inc.primary_down.store(true, Ordering::SeqCst);
    let e = find(&c).await.expect_err("the primary failed");
    let (code, _, msg) = command_error(&e);
    assert_eq!((code, msg.as_str()), (13388, "primary refused too"));
    assert_eq!(env.upstream("find", "accounts").len(), before + 2);
    assert_eq!(attempts(&env, ACCOUNTS, "primary", "failed"), 1);
    assert_eq!(
        env.proxy
            .shared()
            .upstreams
            .list()
            .iter()
            .map(|u| u.ladder.in_flight())
            .sum::<u32>(),
        0,
        "every guard slot given back"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_guard_a_strict_read_fails_fast_as_without_the_ladder() {
    let env = Env::start(&namespaces("\n[ladder_guard]\nmax_per_second = 1\n")).await;
    env.fake.seed(ACCOUNTS, seed_docs(2));
    let _inc = incident(&env, "accounts");
    let client = env.client("").await;
    let c = secondary_coll(&client, ACCOUNTS);

    // Within one second at most one read climbs; the others get what the secondary said
    // (closed) or the fail-fast error (open). Retry until the pattern is seen inside one
    // second, since a second may turn between two reads.
    let mut denied_seen = false;
    for _ in 0..6 {
        let r = find(&c).await;
        if let Err(e) = r {
            let (code, _, msg) = command_error(&e);
            assert_eq!(code, 13388);
            assert!(
                msg == "secondary refused" || msg.starts_with("staleguard:"),
                "{msg}"
            );
            denied_seen = true;
        }
    }
    assert!(denied_seen, "the guard refused some climbs");
    let denied = attempts(&env, ACCOUNTS, "primary", "denied");
    let answered = attempts(&env, ACCOUNTS, "primary", "answered");
    assert!(denied >= 1, "denied {denied}");
    assert!(answered >= 1, "answered {answered}");
    assert_eq!(denied + answered, 6);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fallback_climbs_primary_then_available() {
    let env = Env::start(&namespaces("")).await;
    env.fake.seed(INVENTORY, seed_docs(4));
    let inc = incident(&env, "store_inventory");
    inc.primary_down.store(true, Ordering::SeqCst);
    let client = env.client("").await;
    let c = secondary_coll(&client, INVENTORY);

    let docs = find(&c).await.expect("answered by available");
    assert_eq!(docs.len(), 4);
    let up = env.upstream_bodies("find", "store_inventory");
    assert_eq!(up.len(), 3, "secondary, primary, available");
    assert_eq!(read_pref_mode(&up[1]).as_deref(), Some("primary"));
    assert_eq!(read_concern(&up[1]), None);
    assert_eq!(read_concern(&up[2]), Some(available()));
    assert_eq!(read_pref_mode(&up[2]).as_deref(), Some("secondary"));
    // Budget: 10 s; the primary gets its share of what was left (at most attempt_limit),
    // available the rest.
    assert_eq!(max_time_ms(&up[0]), Some(500));
    assert_eq!(max_time_ms(&up[1]), Some(500));
    let rest = max_time_ms(&up[2]).expect("a limit");
    assert!((8_000..=10_000).contains(&rest), "{rest}");
    assert_eq!(attempts(&env, INVENTORY, "primary", "failed"), 1);
    assert_eq!(attempts(&env, INVENTORY, "available", "answered"), 1);

    // The primary answers: the read stops there.
    inc.primary_down.store(false, Ordering::SeqCst);
    let docs = find(&c).await.expect("answered by the primary");
    assert_eq!(docs.len(), 4);
    assert_eq!(env.upstream("find", "store_inventory").len(), 5);
    assert_eq!(attempts(&env, INVENTORY, "primary", "answered"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn documents_returned_twice_by_available_reads_are_counted_as_orphans() {
    let env = Env::start(&namespaces("")).await;
    // Answers every read of the inventory: secondary reads with StaleConfig, `available`
    // reads with a batch holding _id 1 and 2 twice (a donor's orphans and their owners).
    env.fake.set_hook(|body: &RawDocument| {
        if !is_read_on(body, "store_inventory") {
            return None;
        }
        if level(body).as_deref() == Some("available") {
            let docs: Vec<RawDocumentBuf> = [1, 2, 3, 1, 2]
                .iter()
                .map(|&i| rawdoc! { "_id": i, "item": "x" })
                .collect();
            return Some(Hooked::reply(cursor_reply(INVENTORY, &docs)));
        }
        Some(Hooked::error(13388, "StaleConfig", "secondary refused"))
    });
    let client = env.client("").await;
    let c = secondary_coll(&client, INVENTORY);
    // Breaker closed: secondary, primary (refused too), available.
    assert_eq!(find(&c).await.expect("available").len(), 5);
    let orphans = |env: &Env| env.proxy.shared().metrics.ladder.orphans_of(INVENTORY);
    assert_eq!(orphans(&env), 2);
    for _ in 0..2 {
        find(&c).await.expect("available");
    }
    assert_eq!(env.state(INVENTORY), State::Open);
    assert_eq!(orphans(&env), 6);
    // Open: the primary first, then available sent at once.
    find(&c).await.expect("available");
    assert_eq!(orphans(&env), 8);
}

/// One connection pipelining many reads on a strict namespace whose breaker is open holds
/// one primary-rung slot at most, whatever `per_connection` says: mongos serves the
/// connection in order, so only the first read starts at once; the others would wait
/// behind it holding slots, and fail fast instead (issue 20: a slot counts from when mongos
/// starts the read). Read one at a time, as drivers do, each climbs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_connection_cannot_take_every_ladder_slot() {
    let env = Env::start(&namespaces(
        "\n[ladder_guard]\nmax_in_flight = 8\nper_connection = 2\n",
    ))
    .await;
    env.fake.seed(ACCOUNTS, seed_docs(1));
    // Secondary reads refused; primary reads answered only after a while, so that the
    // pipelined ones are all in flight together.
    env.fake.set_hook(|body: &RawDocument| {
        if !is_read_on(body, "accounts") {
            return None;
        }
        match read_pref_mode(body).as_deref() {
            Some("primary") => Some(
                Hooked::reply(cursor_reply(ACCOUNTS, &seed_docs(1)))
                    .after(Duration::from_millis(300)),
            ),
            _ => Some(Hooked::error(13388, "StaleConfig", "secondary refused")),
        }
    });
    let client = env.client("").await;
    let c = secondary_coll(&client, ACCOUNTS);
    for _ in 0..3 {
        let _ = find(&c).await;
    }
    assert_eq!(env.state(ACCOUNTS), State::Open);
    let answered = attempts(&env, ACCOUNTS, "primary", "answered");

    let mut raw = support::raw::RawClient::connect(env.proxy_addr()).await;
    for i in 0..6 {
        let read = rawdoc! {
            "find": "accounts",
            "$db": "pay",
            "$readPreference": { "mode": "secondary" },
        };
        raw.send(&support::raw::msg(100 + i, 0, &read)).await;
    }
    let mut fail_fast = 0;
    let mut ok = 0;
    for _ in 0..6 {
        let reply = support::raw::body(&raw.recv().await);
        if reply
            .get_str("errmsg")
            .is_ok_and(|m| m.starts_with("staleguard:"))
        {
            fail_fast += 1;
        } else {
            ok += 1;
        }
    }
    assert_eq!((ok, fail_fast), (1, 5), "one climbed, five failed fast");
    assert_eq!(
        attempts(&env, ACCOUNTS, "primary", "answered"),
        answered + 1
    );
    assert_eq!(attempts(&env, ACCOUNTS, "primary", "denied"), 5);
    // One at a time on the same connection: every read starts at once and climbs.
    for i in 0..3 {
        let read = rawdoc! {
            "find": "accounts",
            "$db": "pay",
            "$readPreference": { "mode": "secondary" },
        };
        let reply = support::raw::body(&raw.roundtrip(&support::raw::msg(200 + i, 0, &read)).await);
        assert_eq!(reply.get_f64("ok").ok(), Some(1.0), "{reply:?}");
    }
    assert_eq!(
        attempts(&env, ACCOUNTS, "primary", "answered"),
        answered + 4
    );
}
