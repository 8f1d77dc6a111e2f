//! The odd and hostile clients, on raw sockets through staleguard, each looping until the
//! run ends and counting what it met (`Tally`). Authenticated ones are an application's own
//! connections with odd habits (their own short limits, slow queries, tags, views);
//! unauthenticated ones are anyone who reaches the port. The wire-level abuse (early
//! closes, reused ids, huge messages, deep pipelines, non-readers) is in `abuse.rs`.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bson::{doc, Document};
use tokio::time::Instant;

use super::bed::{INVENTORY, PAYMENTS, VIEW};
use super::plan::{Behaviour, Task};
use super::raw::{self, Conn};
use super::rng::Rng;

/// What each behaviour met, by (behaviour, what).
pub type Tally = Arc<Mutex<BTreeMap<(Behaviour, String), u64>>>;

/// What every attacker gets.
#[derive(Clone)]
pub struct Env {
    pub addr: SocketAddr,
    pub auth: bool,
    pub stop: Instant,
    pub tally: Tally,
}

impl Env {
    pub fn count(&self, b: Behaviour, what: impl Into<String>) {
        *self
            .tally
            .lock()
            .expect("tally")
            .entry((b, what.into()))
            .or_default() += 1;
    }

    pub fn running(&self) -> bool {
        Instant::now() < self.stop
    }

    /// Counts a reply by its code (`ok`, `13`, ...), or that none came.
    pub fn reply(&self, b: Behaviour, reply: Option<&Document>) {
        match reply {
            Some(r) if raw::code(r) == 0 => self.count(b, "ok"),
            Some(r) => self.count(b, format!("code {}", raw::code(r))),
            None => self.count(b, "no reply"),
        }
    }

    /// Sleeps `d`, or until the run ends.
    pub async fn pause(&self, d: Duration) {
        tokio::time::sleep_until(self.stop.min(Instant::now() + d)).await;
    }

    /// A connection past its handshake, authenticated when `authenticate` and auth is on.
    pub async fn open(&self, b: Behaviour, rng: &mut Rng, authenticate: bool) -> Option<Conn> {
        let Some(mut c) = Conn::connect(self.addr).await else {
            self.count(b, "connect failed");
            return None;
        };
        if self.auth && authenticate {
            let nonce = format!("chaos{}", rng.next());
            if !c.authenticate(rng.chance(0.5), &nonce).await {
                self.count(b, "auth failed");
                return None;
            }
        } else if c.hello().await.is_none() {
            self.count(b, "no hello reply");
            return None;
        }
        Some(c)
    }
}

/// A secondary read of `ns` with `extra` fields (a filter, a limit, a preference...).
pub fn find(ns: &str, extra: Document) -> Document {
    let (db, coll) = ns.split_once('.').unwrap_or(("test", ns));
    let mut body = doc! { "find": coll };
    body.extend(extra);
    if !body.contains_key("filter") {
        body.insert("filter", doc! {});
    }
    if !body.contains_key("$readPreference") {
        body.insert("$readPreference", doc! { "mode": "secondaryPreferred" });
    }
    body.insert("$db", db);
    body
}

/// Runs one task until the run ends.
pub async fn run(task: Task, env: Env) {
    let Task { behaviour, mut rng } = task;
    // Start at a random moment of the first second, so the tasks do not move in step.
    env.pause(Duration::from_millis(rng.range(0, 1000))).await;
    match behaviour {
        Behaviour::ShortMaxTime => {
            let ns = *rng.pick(&[PAYMENTS, INVENTORY]);
            let read = move |_: &mut Rng| {
                find(ns, doc! { "limit": 1, "singleBatch": true, "maxTimeMS": 1 })
            };
            paced(behaviour, env, rng, true, Duration::from_millis(300), read).await
        }
        Behaviour::SlowTimeouts => {
            let ns = *rng.pick(&[PAYMENTS, INVENTORY]);
            let read = move |_: &mut Rng| {
                find(
                    ns,
                    doc! { "filter": { "$where": "sleep(1500) || true" }, "limit": 1, "maxTimeMS": 1000 },
                )
            };
            paced(behaviour, env, rng, true, Duration::from_millis(1500), read).await
        }
        Behaviour::Views => {
            let read = |_: &mut Rng| {
                find(
                    VIEW,
                    doc! { "limit": 1, "singleBatch": true, "maxTimeMS": 1500 },
                )
            };
            paced(behaviour, env, rng, true, Duration::from_secs(2), read).await
        }
        Behaviour::UnmatchedTags => {
            let read = |rng: &mut Rng| {
                let ns = *rng.pick(&[PAYMENTS, INVENTORY]);
                let limit = *rng.pick(&[500_i64, 1500, 3000]);
                find(
                    ns,
                    doc! {
                        "limit": 1, "singleBatch": true, "maxTimeMS": limit,
                        "$readPreference": { "mode": "secondary", "tags": [{ "node": "nowhere" }] },
                    },
                )
            };
            paced(behaviour, env, rng, true, Duration::from_secs(1), read).await
        }
        Behaviour::Unauthenticated => {
            let read = |rng: &mut Rng| {
                let ns = *rng.pick(&[PAYMENTS, INVENTORY]);
                find(
                    ns,
                    doc! { "limit": 1, "singleBatch": true, "maxTimeMS": 1000 },
                )
            };
            paced(behaviour, env, rng, false, Duration::from_millis(200), read).await
        }
        Behaviour::HelloPipeline => hello_pipeline(env, rng).await,
        Behaviour::EarlyClose => super::abuse::early_close(env, rng).await,
        Behaviour::RequestIdReuse => super::abuse::request_id_reuse(env, rng).await,
        Behaviour::HugeMessages => super::abuse::huge_messages(env, rng).await,
        Behaviour::DeepPipelines => super::abuse::deep_pipelines(env, rng).await,
        Behaviour::NonReaders => super::abuse::non_readers(env, rng).await,
        // Honest readers, run by the driver side.
        Behaviour::SlowReads
        | Behaviour::PreferredTags
        | Behaviour::PinnedReads
        | Behaviour::Pymongo => {}
    }
}

/// One connection sending `read()` about every `every`, one at a time, reconnecting when
/// it is closed.
async fn paced(
    b: Behaviour,
    env: Env,
    mut rng: Rng,
    authenticate: bool,
    every: Duration,
    read: impl Fn(&mut Rng) -> Document,
) {
    while env.running() {
        let Some(mut c) = env.open(b, &mut rng, authenticate).await else {
            env.pause(Duration::from_millis(200)).await;
            continue;
        };
        while env.running() {
            let body = read(&mut rng);
            let reply = c.command(body, Duration::from_secs(10)).await;
            env.reply(b, reply.as_ref());
            if reply.is_none() {
                break;
            }
            env.pause(rng.jitter(every, 0.2)).await;
        }
    }
}

/// Unauthenticated finds pipelined behind an awaitable hello: mongos answers them (with
/// Unauthorized when auth is on) only once the hello's wait is over.
async fn hello_pipeline(env: Env, mut rng: Rng) {
    let b = Behaviour::HelloPipeline;
    while env.running() {
        let Some(mut c) = env.open(b, &mut rng, false).await else {
            env.pause(Duration::from_millis(200)).await;
            continue;
        };
        let Some(tv) = c
            .hello()
            .await
            .and_then(|h| h.get_document("topologyVersion").ok().cloned())
        else {
            env.count(b, "no topologyVersion");
            continue;
        };
        while env.running() {
            let wait = rng.range(300, 1500) as i64;
            let finds = rng.range(1, 10);
            let hello_id = c.id();
            let mut batch = raw::message(
                hello_id,
                0,
                &doc! { "hello": 1, "topologyVersion": tv.clone(), "maxAwaitTimeMS": wait, "$db": "admin" },
            )
            .to_vec();
            for _ in 0..finds {
                let ns = *rng.pick(&[PAYMENTS, INVENTORY]);
                let id = c.id();
                let body = find(
                    ns,
                    doc! { "limit": 1, "singleBatch": true, "maxTimeMS": 1000 },
                );
                batch.extend_from_slice(&raw::message(id, 0, &body));
            }
            if c.send(&batch).await.is_none() {
                break;
            }
            let mut ok = true;
            for _ in 0..=finds {
                match c
                    .recv(Duration::from_millis(wait as u64) + Duration::from_secs(10))
                    .await
                {
                    Some(m) if raw::response_to(&m) == Some(hello_id) => env.count(b, "hello"),
                    Some(m) => env.reply(b, raw::body(&m).as_ref()),
                    None => {
                        env.count(b, "no reply");
                        ok = false;
                        break;
                    }
                }
            }
            if !ok {
                break;
            }
        }
    }
}
