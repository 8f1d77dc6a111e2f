//! Issue 21, item 7: a `maxTimeMS` the server refuses (negative, fractional, a string, NaN,
//! past 2147483647) is never rewritten with the first attempt's limit, never retried and
//! never counted: the read reaches mongos byte for byte and the client gets mongos's answer.
//! Raw messages through the proxy to the fake mongos, which answers every read of the
//! fallback collection with StaleConfig (a tracked read would be retried with `available`
//! and counted for the breaker).

use crate::policy_support;
use crate::support;

use std::str::FromStr;

use bson::{rawdoc, RawBson, RawDocumentBuf};
use bytes::Bytes;
use staleguard::breaker::State;

use policy_support::*;
use support::mongos::Hooked;
use support::raw::{self, RawClient};

const NS: &str = "demo.store_inventory";

/// A fallback namespace with the default time budget (first attempt at most 500 ms) and a
/// breaker that one counted error opens.
const NAMESPACES: &str = r#"
[[namespaces]]
pattern = "demo.store_inventory"
mode = "fallback"
attempt_share = 0.5
attempt_limit = "500ms"
threshold = 1
window = "10s"
cooldown = "30s"
min_cooldown = "30s"
min_connections = 1
per_connection = 1000
min_wait = "0s"
"#;

fn find(request_id: i32, max_time: Option<RawBson>) -> Bytes {
    let mut body = rawdoc! {
        "find": "store_inventory",
        "filter": {},
        "$readPreference": {"mode": "secondary"},
        "$db": "demo",
    };
    if let Some(v) = max_time {
        body.append(bson::raw::cstr!("maxTimeMS"), v);
    }
    raw::msg(request_id, 0, &body)
}

fn invalid() -> Vec<(&'static str, RawBson)> {
    let decimal = |s: &str| RawBson::Decimal128(bson::Decimal128::from_str(s).unwrap());
    vec![
        ("negative", RawBson::Int32(-1)),
        ("fractional", RawBson::Double(1.5)),
        ("string", RawBson::String("500".into())),
        ("NaN", RawBson::Double(f64::NAN)),
        ("past int32", RawBson::Int64(i32::MAX as i64 + 1)),
        ("past int32, double", RawBson::Double(3e9)),
        ("negative decimal", decimal("-0.6")),
        ("boolean", RawBson::Boolean(true)),
    ]
}

/// The finds on the collection that reached mongos.
fn finds(env: &Env) -> Vec<Bytes> {
    env.upstream("find", "store_inventory")
}

async fn sends_untouched(env: &Env, conn: &mut RawClient, id: i32, what: &str, v: RawBson) {
    let (before, errors) = (finds(env).len(), env.errors(NS));
    let msg = find(id, Some(v));
    let reply = conn.roundtrip(&msg).await;
    let body = raw::body(&reply);
    assert_eq!(
        body.get_i32("code").ok(),
        Some(13388),
        "{what}: mongos's answer"
    );
    // Anything more sent (a retry) would have come before the reply.
    let after = finds(env);
    assert_eq!(after.len(), before + 1, "{what}: sent once, not retried");
    assert_eq!(after[before], msg, "{what}: byte for byte");
    assert_eq!(env.errors(NS), errors, "{what}: not counted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_max_time_ms_goes_out_untouched_and_uncounted() {
    let env = Env::start(NAMESPACES).await;
    env.fake.set_hook(|b| {
        (b.get_str("find").ok() == Some("store_inventory")
            && b.get_document("readConcern").is_err())
        .then(|| Hooked::error(13388, "StaleConfig", "stale"))
    });
    let mut conn = RawClient::connect(env.proxy_addr()).await;
    let mut id = 1;
    for (what, v) in invalid() {
        sends_untouched(&env, &mut conn, id, what, v).await;
        id += 1;
    }
    assert_eq!(env.state(NS), State::Closed);

    // The same read with a valid maxTimeMS is governed: its first attempt gets 500 ms, the
    // StaleConfig is counted (the breaker opens: threshold 1) and the read is resent with
    // `available`, whose answer the client gets.
    let before = finds(&env).len();
    let reply = conn
        .roundtrip(&find(id, Some(RawBson::Int32(10_000))))
        .await;
    id += 1;
    assert_eq!(raw::body(&reply).get_f64("ok").ok(), Some(1.0));
    let sent: Vec<RawDocumentBuf> = finds(&env)[before..].iter().map(|m| body(m)).collect();
    assert_eq!(sent.len(), 2, "first attempt and the available resend");
    assert_eq!(max_time_ms(&sent[0]), Some(500));
    assert_eq!(read_concern(&sent[1]), Some(available()));
    env.wait_state(NS, State::Open).await;

    // With the breaker open, a valid read is rewritten before it is sent; an invalid one
    // still goes out as the client sent it, and gets mongos's answer.
    for (what, v) in invalid() {
        sends_untouched(&env, &mut conn, id, what, v).await;
        id += 1;
    }
    assert_eq!(env.state(NS), State::Open);
}
