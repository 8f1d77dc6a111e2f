//! Helpers for the operations tests (admin, health, reload, TLS): a tiny HTTP client,
//! throw-away certificates, raw reads that a policy governs, and polling.
#![allow(dead_code)]

pub mod certs;
pub mod chromium;
pub mod http;
pub mod promtool;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bson::{rawdoc, RawDocumentBuf};
use bytes::Bytes;
use staleguard::config::{Config, Mode, NsPolicy, PolicyTable};
use staleguard::server::Running;

use crate::support::mongos::{FakeMongos, Hooked};
use crate::support::raw;

/// A config relaying to `upstreams`, admin endpoint on a free port, with `policies`.
pub fn config(upstreams: Vec<String>, policies: Vec<NsPolicy>) -> Config {
    let mut c = Config::for_upstreams("127.0.0.1:0", upstreams);
    c.admin_listen = Some("127.0.0.1:0".to_string());
    c.policy = PolicyTable::from_policies(policies).expect("policy table");
    c
}

/// A policy whose breaker one raw client can open (`min_connections = 1`, every error of
/// its connection counted, no evidence floor): these tests are about what the admin side
/// shows, not about the evidence rules (`tests/limits.rs`).
pub fn policy(pattern: &str, mode: Mode, threshold: u32) -> NsPolicy {
    let mut p = NsPolicy::with_defaults(pattern, mode);
    p.threshold = threshold;
    p.min_connections = 1;
    p.per_connection = 1000;
    p.min_wait = std::time::Duration::ZERO;
    p
}

pub async fn start(config: Config) -> Running {
    staleguard::server::start(Arc::new(config))
        .await
        .expect("start proxy")
}

pub fn admin(r: &Running) -> SocketAddr {
    r.admin_addr().expect("admin endpoint on")
}

/// An eligible read: `find` on `db.coll` with read preference secondary.
pub fn find(request_id: i32, db: &str, coll: &str) -> Bytes {
    raw::msg(
        request_id,
        0,
        &rawdoc! {
            "find": coll,
            "filter": {},
            "$db": db,
            "$readPreference": { "mode": "secondary" },
        },
    )
}

/// Makes the fake answer every `find` on database `db` with StaleConfig.
pub fn stale_on(fake: &FakeMongos, db: &'static str) {
    fake.set_hook(move |body| {
        let is_find = body.get_str("find").is_ok();
        let on_db = body.get_str("$db").ok() == Some(db);
        (is_find && on_db).then(|| {
            Hooked::error(
                13388,
                "StaleConfig",
                "shard version not ok: routing table unknown",
            )
        })
    });
}

/// The body of a reply.
pub fn reply_body(msg: &[u8]) -> RawDocumentBuf {
    raw::body(msg)
}

/// `errmsg` of a reply, or "".
pub fn errmsg(msg: &[u8]) -> String {
    reply_body(msg)
        .get_str("errmsg")
        .map(str::to_string)
        .unwrap_or_default()
}

/// Polls `cond` every 20 ms until it holds; fails the test after 10 s.
pub async fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + crate::support::STEP;
    while !cond() {
        if tokio::time::Instant::now() > deadline {
            panic!("timed out waiting for: {what}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
