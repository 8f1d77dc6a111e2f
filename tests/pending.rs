//! Two bounds of RELIABILITY.md's table with a test of their own: `max_pending_reads` (a
//! client pipelining more tracked reads than the limit: the rest go out untracked, counted,
//! and every reply reaches its request) and a reply whose `responseTo` names another request
//! (the tracked read whose turn it was is given up; the next replies still reach the right
//! requests). Raw clients through the proxy to the in-process fake mongos, which answers
//! every read without `available` on the fallback collection with StaleConfig: a tracked
//! read is resent with `available` (its client gets `ok: 1`), an untracked one gets the error
//! as mongos sent it.

use crate::policy_support;
use crate::support;

use std::collections::BTreeMap;
use std::time::Duration;

use bson::rawdoc;
use bytes::Bytes;

use policy_support::{Env, BASE_NAMESPACES};
use support::mongos::Hooked;
use support::raw::{self, RawClient};

const COLL: &str = "store_inventory";
/// The `responseTo` of the fake's replies to `wrong` reads: no request has this id.
const WRONG: i32 = 999_999;

fn find(id: i32, marker: &str) -> Bytes {
    raw::msg(
        id,
        0,
        &rawdoc! {
            "find": COLL,
            "filter": {"marker": marker},
            "$readPreference": {"mode": "secondary"},
            "$db": "demo",
        },
    )
}

fn ping(id: i32) -> Bytes {
    raw::msg(id, 0, &rawdoc! {"ping": 1, "$db": "admin"})
}

fn marker(body: &bson::RawDocument) -> Option<String> {
    let f = body.get_document("filter").ok()?;
    Some(f.get_str("marker").ok()?.to_string())
}

/// StaleConfig for every find without `readConcern`; the read marked `slow` is answered
/// after 300 ms (so that the ones behind it are all sent before any reply), the ones
/// marked `wrong` get `ok: 1` under `responseTo` [`WRONG`].
async fn start(max_pending_reads: usize) -> Env {
    let env = Env::start(&format!(
        "max_pending_reads = {max_pending_reads}\n{BASE_NAMESPACES}"
    ))
    .await;
    env.fake.set_hook(|body| {
        body.get_str("find").ok()?;
        let m = marker(body).unwrap_or_default();
        if m == "wrong" {
            let ok = rawdoc! {
                "cursor": {"firstBatch": [], "id": 0_i64, "ns": "demo.store_inventory"},
                "ok": 1.0,
            };
            return Some(Hooked::reply_to(ok, WRONG));
        }
        if body.get_document("readConcern").is_ok() {
            return None;
        }
        let stale = Hooked::error(13388, "StaleConfig", "shard version not ok");
        Some(if m == "slow" {
            stale.after(Duration::from_millis(300))
        } else {
            stale
        })
    });
    env
}

fn metric(env: &Env, line: &str) -> u64 {
    let m = env.proxy.shared().metrics.render();
    m.lines()
        .find_map(|l| l.strip_prefix(line))
        .unwrap_or_else(|| panic!("no {line}in\n{m}"))
        .trim()
        .parse::<f64>()
        .expect("a number") as u64
}

fn pending_hits(env: &Env) -> u64 {
    metric(
        env,
        "staleguard_limit_hits_total{limit=\"max_pending_reads\"} ",
    )
}

/// `(ok, code)` of each reply, by its `responseTo`; fails on a reply answering twice.
fn by_request(replies: &[Bytes]) -> BTreeMap<i32, (bool, Option<i32>)> {
    let mut out = BTreeMap::new();
    for r in replies {
        let body = raw::body(r);
        let ok = body.get_f64("ok").ok() == Some(1.0);
        let code = body.get_i32("code").ok();
        let to = raw::header(r).response_to;
        assert!(out.insert(to, (ok, code)).is_none(), "two replies to {to}");
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_max_pending_reads_reads_go_out_untracked_and_every_reply_arrives() {
    const LIMIT: usize = 4;
    const READS: i32 = 10;
    let env = start(LIMIT).await;
    assert_eq!(
        metric(
            &env,
            "staleguard_limit_setting{limit=\"max_pending_reads\"} "
        ),
        LIMIT as u64
    );
    let mut c = RawClient::connect(env.proxy_addr()).await;
    // Ten reads in one write: the first is answered after 300 ms, so all ten are sent while
    // the first four wait for their replies.
    let mut burst = Vec::new();
    for id in 1..=READS {
        burst.extend_from_slice(&find(id, if id == 1 { "slow" } else { "fast" }));
    }
    c.send(&burst).await;
    let mut replies = Vec::new();
    for _ in 0..READS {
        replies.push(c.recv().await);
    }
    let got = by_request(&replies);
    assert_eq!(got.len(), READS as usize, "{got:?}");
    for id in 1..=READS {
        let (ok, code) = got[&id];
        if id as usize <= LIMIT {
            // Tracked: the StaleConfig was swallowed and the read resent with `available`.
            assert!(ok && code.is_none(), "read {id}: {got:?}");
        } else {
            // Past the limit: forwarded untracked, mongos's error reaches the client.
            assert_eq!((ok, code), (false, Some(13388)), "read {id}: {got:?}");
        }
    }
    assert_eq!(pending_hits(&env), (READS as usize - LIMIT) as u64);
    let sent = env.upstream_bodies("find", COLL);
    let resent = sent
        .iter()
        .filter(|b| policy_support::read_concern(b).is_some())
        .count();
    assert_eq!((sent.len(), resent), (READS as usize + LIMIT, LIMIT));

    // The pending list emptied as the replies came: the next reads are tracked again.
    for id in 11..=11 + LIMIT as i32 {
        let r = c.roundtrip(&find(id, "fast")).await;
        assert_eq!(raw::header(&r).response_to, id);
        assert_eq!(raw::body(&r).get_f64("ok").ok(), Some(1.0), "read {id}");
    }
    assert_eq!(pending_hits(&env), (READS as usize - LIMIT) as u64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_naming_another_request_gives_up_the_tracked_read_and_the_next_replies_match() {
    // Two pending reads at most: were a read answered under another responseTo kept
    // pending, two of them would push the next read past the limit (untracked, counted).
    let env = start(2).await;
    let mut c = RawClient::connect(env.proxy_addr()).await;
    for id in [1, 2] {
        let r = c.roundtrip(&find(id, "wrong")).await;
        // Relayed as mongos sent it; the read it belonged to is given up.
        assert_eq!(raw::header(&r).response_to, WRONG);
        assert_eq!(raw::body(&r).get_f64("ok").ok(), Some(1.0));
    }
    let r = c.roundtrip(&find(3, "fast")).await;
    assert_eq!(raw::header(&r).response_to, 3);
    assert_eq!(
        raw::body(&r).get_f64("ok").ok(),
        Some(1.0),
        "tracked (resent with available), not past the limit"
    );
    assert_eq!(pending_hits(&env), 0);

    // Pipelined: the wrong reply comes first, then the StaleConfig of the tracked read behind
    // it (judged by its own place and id: resent), the ping's reply and the resend's.
    let mut burst = Vec::new();
    burst.extend_from_slice(&find(4, "wrong"));
    burst.extend_from_slice(&find(5, "fast"));
    burst.extend_from_slice(&ping(6));
    c.send(&burst).await;
    let replies = vec![c.recv().await, c.recv().await, c.recv().await];
    let order: Vec<i32> = replies.iter().map(|r| raw::header(r).response_to).collect();
    // The wrong reply first; the resend's answer and the ping's in the order mongos served
    // them (the resend goes out when the StaleConfig arrives, before or after the ping).
    assert_eq!(order[0], WRONG);
    let mut rest = order[1..].to_vec();
    rest.sort();
    assert_eq!(rest, vec![5, 6]);
    let got = by_request(&replies);
    assert_eq!(
        got[&5],
        (true, None),
        "the read behind it was judged and resent"
    );
    assert_eq!(got[&6], (true, None));
    assert_eq!(pending_hits(&env), 0);
    let resent: Vec<Option<String>> = env
        .upstream_bodies("find", COLL)
        .iter()
        .filter(|b| policy_support::read_concern(b).is_some())
        .map(|b| marker(b))
        .collect();
    assert_eq!(resent, vec![Some("fast".into()), Some("fast".into())]);
    // And the connection goes on.
    let r = c.roundtrip(&ping(7)).await;
    assert_eq!(raw::header(&r).response_to, 7);
}
