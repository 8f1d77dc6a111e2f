//! Wire-level abuse through staleguard: clients that leave in the middle, reuse request
//! ids, send huge messages or deep pipelines, or never read their replies. None of it may
//! change what other clients get.

use std::time::Duration;

use bson::{doc, Bson, Document};
use bytes::{BufMut, BytesMut};
use tokio::time::Instant;

use super::attackers::{find, Env};
use super::bed::{INVENTORY, PAYMENTS};
use super::plan::Behaviour;
use super::raw;
use super::rng::Rng;

/// Connects, sends a read and leaves: at once, halfway through the message, or a moment
/// after (before the reply).
pub async fn early_close(env: Env, mut rng: Rng) {
    let b = Behaviour::EarlyClose;
    while env.running() {
        let authenticate = rng.chance(0.5);
        if let Some(mut c) = env.open(b, &mut rng, authenticate).await {
            let ns = *rng.pick(&[PAYMENTS, INVENTORY]);
            let filter = if rng.chance(0.5) {
                doc! { "$where": "sleep(800) || true" }
            } else {
                doc! {}
            };
            let id = c.id();
            let msg = raw::message(
                id,
                0,
                &find(ns, doc! { "filter": filter, "maxTimeMS": 2000 }),
            );
            match rng.below(3) {
                0 => {
                    let _ = c.send(&msg).await;
                    env.count(b, "closed at once");
                }
                1 => {
                    let _ = c.send(&msg[..msg.len() / 2]).await;
                    env.count(b, "closed mid-message");
                }
                _ => {
                    let _ = c.send(&msg).await;
                    env.pause(Duration::from_millis(rng.range(10, 300))).await;
                    env.count(b, "closed before the reply");
                }
            }
            drop(c);
        }
        env.pause(Duration::from_millis(rng.range(200, 600))).await;
    }
}

/// Two reads in flight with one requestID (staleguard may close such a client: it is then
/// counted and a new connection opened), and an id used again after its reply (legal).
pub async fn request_id_reuse(env: Env, mut rng: Rng) {
    let b = Behaviour::RequestIdReuse;
    while env.running() {
        let Some(mut c) = env.open(b, &mut rng, true).await else {
            env.pause(Duration::from_millis(200)).await;
            continue;
        };
        while env.running() {
            let id = c.id();
            let (one, two) = (
                *rng.pick(&[PAYMENTS, INVENTORY]),
                *rng.pick(&[PAYMENTS, INVENTORY]),
            );
            let first = find(one, doc! { "limit": 1, "maxTimeMS": 1000 });
            let second = find(two, doc! { "limit": 1, "maxTimeMS": 1000 });
            let mut both = raw::message(id, 0, &first).to_vec();
            both.extend_from_slice(&raw::message(id, 0, &second));
            if c.send(&both).await.is_none() {
                break;
            }
            let mut closed = false;
            for _ in 0..2 {
                match c.recv(Duration::from_secs(5)).await {
                    Some(m) => env.reply(b, raw::body(&m).as_ref()),
                    None => {
                        closed = true;
                        break;
                    }
                }
            }
            if closed {
                env.count(b, "closed by the proxy");
                break;
            }
            // The same id once more, after its replies: what any client may do.
            let again = find(PAYMENTS, doc! { "limit": 1, "maxTimeMS": 1000 });
            if c.send(&raw::message(id, 0, &again)).await.is_none() {
                break;
            }
            let reply = c.recv(Duration::from_secs(5)).await;
            env.reply(b, reply.as_ref().and_then(|m| raw::body(m)).as_ref());
            env.pause(rng.jitter(Duration::from_millis(500), 0.3)).await;
        }
    }
}

/// A find of several MB (a long string in its filter), or a header that declares 40 MB,
/// some of the body, then silence.
pub async fn huge_messages(env: Env, mut rng: Rng) {
    let b = Behaviour::HugeMessages;
    while env.running() {
        let authenticate = rng.chance(0.7);
        if let Some(mut c) = env.open(b, &mut rng, authenticate).await {
            if rng.chance(0.6) {
                let mb = rng.range(2, 8) as usize;
                let blob = "x".repeat(mb << 20);
                let ns = *rng.pick(&[PAYMENTS, INVENTORY]);
                let body = find(ns, doc! { "filter": { "blob": blob }, "maxTimeMS": 5000 });
                let reply = c.command(body, Duration::from_secs(20)).await;
                env.reply(b, reply.as_ref());
            } else {
                let mut head = BytesMut::new();
                head.put_i32_le(40_000_000);
                head.put_i32_le(c.id());
                head.put_i32_le(0);
                head.put_i32_le(2013);
                head.put_u32_le(0);
                head.put_slice(&vec![b'y'; 64 << 10]);
                let _ = c.send(&head).await;
                env.count(b, "declared 40 MB");
                let stall = Duration::from_millis(rng.range(1000, 4000));
                if c.recv(stall).await.is_none() {
                    env.count(b, "closed or silent");
                }
            }
        }
        env.pause(Duration::from_millis(rng.range(1500, 3500)))
            .await;
    }
}

/// `$facet` in `$facet` 40 levels down; a pipeline of 500 stages; now and then asking
/// for `available` on a strict namespace (refused).
pub async fn deep_pipelines(env: Env, mut rng: Rng) {
    let b = Behaviour::DeepPipelines;
    while env.running() {
        let Some(mut c) = env.open(b, &mut rng, true).await else {
            env.pause(Duration::from_millis(200)).await;
            continue;
        };
        while env.running() {
            let ns = *rng.pick(&[PAYMENTS, INVENTORY]);
            let (db, coll) = ns.split_once('.').unwrap_or(("pay", "transactions"));
            // Each begins with `$limit: 1`, so the cluster runs the rest on one document:
            // the depth and the length are for staleguard, and 500 `$match` stages over every
            // document held a worker of the simulated cluster for up to 2 s (debug build),
            // so that it answered everyone late, as no mongos busy with one client does.
            let limit = Bson::Document(doc! { "$limit": 1 });
            let pipeline: Vec<Bson> = match rng.below(3) {
                0 => {
                    let mut p: Vec<Bson> = vec![limit.clone()];
                    for _ in 0..40 {
                        p = vec![Bson::Document(doc! { "$facet": { "f": p } })];
                    }
                    vec![limit, p.remove(0)]
                }
                _ => std::iter::once(limit)
                    .chain((1..500).map(|i| {
                        Bson::Document(doc! { "$match": { "amount": { "$gte": i % 7 } } })
                    }))
                    .collect(),
            };
            let mut body = doc! {
                "aggregate": coll, "pipeline": pipeline, "cursor": {}, "maxTimeMS": 2000,
                "$readPreference": { "mode": "secondaryPreferred" }, "$db": db,
            };
            if rng.chance(0.25) {
                body.insert("readConcern", doc! { "level": "available" });
            }
            let reply = c.command(body, Duration::from_secs(10)).await;
            env.reply(b, reply.as_ref());
            if reply.is_none() {
                break;
            }
            env.pause(rng.jitter(Duration::from_secs(1), 0.3)).await;
        }
    }
}

/// Reads asking for large batches (the whole inventory, about 110 KB each), sent without
/// ever reading a reply; the connection is kept until the proxy closes it or 20 s pass.
pub async fn non_readers(env: Env, mut rng: Rng) {
    let b = Behaviour::NonReaders;
    while env.running() {
        let Some(mut c) = env.open(b, &mut rng, true).await else {
            env.pause(Duration::from_millis(200)).await;
            continue;
        };
        let held_until = Instant::now() + Duration::from_secs(20);
        let mut sent = 0;
        while env.running() && Instant::now() < held_until {
            if sent < 60 {
                let id = c.id();
                let body: Document = find(INVENTORY, doc! { "batchSize": 5000, "maxTimeMS": 5000 });
                if c.send(&raw::message(id, 0, &body)).await.is_none() {
                    env.count(b, "closed by the proxy");
                    break;
                }
                sent += 1;
                env.count(b, "unread read");
            }
            env.pause(Duration::from_millis(rng.range(100, 400))).await;
        }
    }
}
