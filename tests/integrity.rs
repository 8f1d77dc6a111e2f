//! Policy integrity (issue 11, item 2): requests built to be read one way by staleguard and
//! another by mongod are refused with an error reply and never reach mongos.
//!
//! - a repeated policy-relevant field (`readConcern`, `$db`, `level`, ...): 40413, the code
//!   of the server's own duplicate-field error;
//! - a legacy OP_QUERY (plain or compressed) on a database with governed namespaces: an
//!   OP_REPLY with 352 UnsupportedOpQueryCommand; the OP_QUERY handshake still passes;
//! - a client's own `available` on a strict namespace, whatever the command (`mapReduce`);
//! - `available` with a pipeline too deep to read, on a database that has strict patterns.
//!
//! Duplicate keys and OP_QUERY cannot be sent through the driver, so those tests send
//! hand-built messages on a raw socket to the proxy (fake mongos behind it).

use crate::policy_support;
use crate::support;

use std::time::Duration;

use bson::raw::cstr;
use bson::{doc, rawdoc, RawDocumentBuf};
use staleguard::wire::reply::QUERY_FAILURE;
use staleguard::wire::{OpCode, HEADER_LEN};

use policy_support::*;
use support::mongos::wrap_compressed;
use support::raw::{self, RawClient};
use support::within;

/// Strict `pay.*`, fallback `demo.store_inventory`, and a strict collection beside it.
const NAMESPACES: &str = r#"
[[namespaces]]
pattern = "demo.store_inventory"
mode = "fallback"
cooldown = "30s"

[[namespaces]]
pattern = "pay.*"
mode = "strict"

[[namespaces]]
pattern = "shop.stock"
mode = "fallback"

[[namespaces]]
pattern = "shop.ledger"
mode = "strict"
"#;

/// Sends `msg`, returns the reply, and asserts nothing but handshakes reached mongos.
async fn refused(env: &Env, conn: &mut RawClient, msg: &[u8]) -> bson::RawDocumentBuf {
    let before = env.upstream_count();
    let reply = conn.roundtrip(msg).await;
    assert_eq!(
        raw::header(&reply).response_to,
        raw::header(msg).request_id,
        "the reply answers the request"
    );
    // Anything sent would have been answered before our reply, which came after it.
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(env.upstream_count(), before, "nothing may reach mongos");
    raw::body(&reply)
}

fn assert_duplicate(b: &bson::RawDocument, field: &str) {
    assert_eq!(b.get_f64("ok").ok(), Some(0.0), "{b:?}");
    assert_eq!(b.get_i32("code").ok(), Some(40413), "{b:?}");
    assert_eq!(b.get_str("codeName").ok(), Some("Location40413"));
    let msg = b.get_str("errmsg").expect("errmsg");
    let want = format!("staleguard: BSON field '{field}' is a duplicate field");
    assert!(msg.starts_with(&want), "{msg}");
    assert!(b.get("errorLabels").ok().flatten().is_none(), "no labels");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_read_concern_on_a_strict_namespace_is_refused() {
    let env = Env::start(NAMESPACES).await;
    let mut conn = RawClient::connect(env.proxy_addr()).await;
    // mongod 4.x reads the first readConcern (available); the last says local.
    let mut find = rawdoc! { "find": "transactions", "filter": {} };
    find.append(cstr!("readConcern"), rawdoc! { "level": "available" });
    find.append(cstr!("readConcern"), rawdoc! { "level": "local" });
    find.append(cstr!("$db"), "pay");
    find.append(cstr!("$readPreference"), rawdoc! { "mode": "secondary" });
    let b = refused(&env, &mut conn, &raw::msg(1, 0, &find)).await;
    assert_duplicate(&b, "readConcern");

    // The same inside one readConcern.
    let mut rc = RawDocumentBuf::new();
    rc.append(cstr!("level"), "available");
    rc.append(cstr!("level"), "local");
    let mut find = rawdoc! { "find": "transactions", "readConcern": rc, "$db": "pay" };
    find.append(cstr!("$readPreference"), rawdoc! { "mode": "secondary" });
    let b = refused(&env, &mut conn, &raw::msg(2, 0, &find)).await;
    assert_duplicate(&b, "readConcern.level");

    // The connection stays usable: a well-formed read goes through.
    env.fake.seed("pay.transactions", seed_docs(2));
    let ok = rawdoc! { "find": "transactions", "$db": "pay", "$readPreference": { "mode": "secondary" } };
    let reply = conn.roundtrip(&raw::msg(3, 0, &ok)).await;
    assert_eq!(raw::body(&reply).get_f64("ok").ok(), Some(1.0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_db_is_refused_and_never_resent_with_available() {
    let env = Env::start(NAMESPACES).await;
    // Reads of store_inventory fail with StaleConfig unless they ask for available: a
    // fallback read would be resent with available.
    let fault = stale_reads(&env.fake, "store_inventory", 13388, Duration::ZERO);
    let mut conn = RawClient::connect(env.proxy_addr()).await;
    // mongod 4.x reads the first $db (pay, strict); the last is demo (fallback).
    let mut find = rawdoc! { "find": "store_inventory", "filter": {} };
    find.append(cstr!("$db"), "pay");
    find.append(cstr!("$db"), "demo");
    find.append(cstr!("$readPreference"), rawdoc! { "mode": "secondary" });
    let b = refused(&env, &mut conn, &raw::msg(1, 0, &find)).await;
    assert_duplicate(&b, "$db");
    assert_eq!(fault.hits(), 0);
    assert!(
        env.upstream_bodies("find", "store_inventory").is_empty(),
        "neither the read nor an available resend reached mongos"
    );

    // Not governed under the last reading (`other` is unlisted), governed under the first.
    let mut find = rawdoc! { "find": "transactions" };
    find.append(cstr!("$db"), "pay");
    find.append(cstr!("$db"), "other");
    find.append(cstr!("readConcern"), rawdoc! { "level": "available" });
    let b = refused(&env, &mut conn, &raw::msg(2, 0, &find)).await;
    assert_duplicate(&b, "$db");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_policy_field_repeated_is_refused() {
    let env = Env::start(NAMESPACES).await;
    let mut conn = RawClient::connect(env.proxy_addr()).await;
    let pref = || rawdoc! { "mode": "secondary" };
    let mut cases: Vec<(RawDocumentBuf, &str)> = Vec::new();

    let mut d = rawdoc! { "find": "transactions", "$db": "pay" };
    d.append(cstr!("$readPreference"), rawdoc! { "mode": "primary" });
    d.append(cstr!("$readPreference"), pref());
    cases.push((d, "$readPreference"));

    let mut mode = RawDocumentBuf::new();
    mode.append(cstr!("mode"), "primary");
    mode.append(cstr!("mode"), "secondary");
    cases.push((
        rawdoc! { "find": "transactions", "$db": "pay", "$readPreference": mode },
        "$readPreference.mode",
    ));

    let mut d = rawdoc! { "find": "transactions", "$db": "pay", "$readPreference": pref() };
    d.append(cstr!("maxTimeMS"), 1);
    d.append(cstr!("maxTimeMS"), 60_000);
    cases.push((d, "maxTimeMS"));

    let mut d = rawdoc! { "find": "transactions" };
    d.append(cstr!("find"), "other");
    d.append(cstr!("$db"), "pay");
    cases.push((d, "find"));

    let mut d = rawdoc! { "aggregate": "transactions", "pipeline": [ { "$match": {} } ] };
    d.append(cstr!("pipeline"), bson::RawArrayBuf::new());
    d.append(cstr!("cursor"), rawdoc! {});
    d.append(cstr!("$db"), "pay");
    cases.push((d, "pipeline"));

    let mut d = rawdoc! { "find": "transactions", "$db": "pay", "autocommit": false };
    d.append(cstr!("autocommit"), false);
    cases.push((d, "autocommit"));

    let mut rc = RawDocumentBuf::new();
    rc.append(
        cstr!("afterClusterTime"),
        bson::Timestamp {
            time: 1,
            increment: 1,
        },
    );
    rc.append(
        cstr!("afterClusterTime"),
        bson::Timestamp {
            time: 2,
            increment: 1,
        },
    );
    cases.push((
        rawdoc! { "find": "transactions", "$db": "pay", "readConcern": rc },
        "readConcern.afterClusterTime",
    ));

    // In a pipeline stage: mongod reads one `from`, staleguard another.
    let mut lookup = rawdoc! { "as": "j" };
    lookup.append(cstr!("from"), "x");
    lookup.append(cstr!("from"), "y");
    cases.push((
        rawdoc! {
            "aggregate": "stock", "pipeline": [ { "$lookup": lookup } ], "cursor": {},
            "$db": "shop", "$readPreference": pref(),
        },
        "$lookup.from",
    ));
    let mut stage = rawdoc! { "$unionWith": "stock" };
    stage.append(cstr!("$unionWith"), "ledger");
    cases.push((
        rawdoc! {
            "aggregate": "stock", "pipeline": [ stage ], "cursor": {},
            "$db": "shop", "$readPreference": pref(),
        },
        "$unionWith",
    ));

    for (i, (body, field)) in cases.iter().enumerate() {
        let b = refused(&env, &mut conn, &raw::msg(i as i32 + 1, 0, body)).await;
        assert_duplicate(&b, field);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_fields_on_an_ungoverned_database_pass_untouched() {
    let env = Env::start(NAMESPACES).await;
    let mut conn = RawClient::connect(env.proxy_addr()).await;
    let mut find = rawdoc! { "find": "t" };
    find.append(cstr!("readConcern"), rawdoc! { "level": "available" });
    find.append(cstr!("readConcern"), rawdoc! { "level": "local" });
    find.append(cstr!("$db"), "elsewhere");
    let msg = raw::msg(7, 0, &find);
    let reply = conn.roundtrip(&msg).await;
    assert_eq!(raw::body(&reply).get_f64("ok").ok(), Some(1.0));
    let got = env.fake.received();
    assert!(
        got.iter().any(|m| m[..] == msg[..]),
        "forwarded byte for byte"
    );
}

// ---------------------------------------------------------------------------------------
// Legacy OP_QUERY

/// `{$query: {find, readConcern: available}, $readPreference: secondary}`, as a 4.x-era
/// driver would wrap a command for mongos.
fn legacy_find() -> RawDocumentBuf {
    rawdoc! {
        "$query": { "find": "transactions", "filter": {}, "readConcern": { "level": "available" } },
        "$readPreference": { "mode": "secondary" },
    }
}

fn assert_legacy_refusal(reply: &[u8], flags: i32) {
    assert_eq!(raw::header(reply).op(), OpCode::Reply);
    let response_flags = i32::from_le_bytes(reply[HEADER_LEN..HEADER_LEN + 4].try_into().unwrap());
    assert_eq!(response_flags, flags);
    let b = raw::body(reply);
    assert_eq!(b.get_f64("ok").ok(), Some(0.0), "{b:?}");
    assert_eq!(b.get_i32("code").ok(), Some(352), "{b:?}");
    assert_eq!(
        b.get_str("codeName").ok(),
        Some("UnsupportedOpQueryCommand")
    );
    let msg = b.get_str("errmsg").expect("errmsg");
    assert!(msg.starts_with("staleguard: Unsupported OP_QUERY"), "{msg}");
    assert_eq!(b.get_str("$err").ok(), Some(msg));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn legacy_op_query_commands_on_governed_databases_are_refused() {
    let env = Env::start(NAMESPACES).await;
    let mut conn = RawClient::connect(env.proxy_addr()).await;

    let q = raw::query(1, "pay.$cmd", &legacy_find());
    let reply = conn.roundtrip(&q).await;
    assert_legacy_refusal(&reply, 0);
    assert!(raw::body(&reply)
        .get_str("errmsg")
        .unwrap()
        .contains("find on pay.$cmd"));

    // The command document itself, `$readPreference` inside, `query` as the wrapper, and
    // a `$db` naming the governed database from an unlisted one: all refused.
    let direct = rawdoc! { "find": "transactions", "readConcern": { "level": "available" }, "$readPreference": { "mode": "secondary" } };
    let wrapped =
        rawdoc! { "query": { "count": "transactions" }, "$readPreference": { "mode": "nearest" } };
    let elsewhere = rawdoc! { "find": "transactions", "$db": "pay" };
    for (id, (ns, cmd)) in [
        ("pay.$cmd", &direct),
        ("pay.$cmd", &wrapped),
        ("other.$cmd", &elsewhere),
    ]
    .into_iter()
    .enumerate()
    {
        let reply = conn.roundtrip(&raw::query(10 + id as i32, ns, cmd)).await;
        assert_legacy_refusal(&reply, 0);
    }

    // Compressed (drivers compress OP_QUERY commands once compression is negotiated).
    let z = wrap_compressed(3, &raw::query(20, "pay.$cmd", &legacy_find()));
    let reply = conn.roundtrip(&z).await;
    assert_eq!(raw::header(&reply).response_to, 20);
    assert_legacy_refusal(&reply, 0);

    // A legacy query (not a command) on a governed collection: QueryFailure and `$err`.
    let reply = conn
        .roundtrip(&raw::query(
            30,
            "pay.transactions",
            &rawdoc! { "$query": {} },
        ))
        .await;
    assert_legacy_refusal(&reply, QUERY_FAILURE);

    tokio::time::sleep(Duration::from_millis(50)).await;
    let legacy_upstream = env
        .fake
        .received()
        .iter()
        .filter(|m| raw::header(m).op() != OpCode::Msg)
        .count();
    assert_eq!(legacy_upstream, 0, "no OP_QUERY reached mongos");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn legacy_handshake_and_ungoverned_op_query_pass_untouched() {
    let env = Env::start(NAMESPACES).await;
    let mut conn = RawClient::connect(env.proxy_addr()).await;
    let hello = rawdoc! { "isMaster": 1, "helloOk": true, "client": { "driver": { "name": "old", "version": "1" } } };
    let wrapped =
        rawdoc! { "$query": { "ismaster": 1 }, "$readPreference": { "mode": "primaryPreferred" } };
    let cases = [
        raw::query(1, "admin.$cmd", &hello),
        // The handshake passes even on a governed database.
        raw::query(2, "pay.$cmd", &wrapped),
        raw::query(3, "other.$cmd", &rawdoc! { "find": "t" }),
    ];
    for q in &cases {
        let reply = conn.roundtrip(q).await;
        assert_eq!(raw::header(&reply).op(), OpCode::Reply);
        assert!(
            !raw::body(&reply)
                .get_str("errmsg")
                .unwrap_or_default()
                .starts_with("staleguard"),
            "answered by mongos, not refused"
        );
    }
    let got = env.fake.received();
    for q in &cases {
        assert!(
            got.iter().any(|m| m[..] == q[..]),
            "forwarded byte for byte"
        );
    }
}

// ---------------------------------------------------------------------------------------
// `available` on a strict namespace, whatever the command; unreadable pipelines

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn map_reduce_asking_available_on_a_strict_namespace_is_refused() {
    let env = Env::start(NAMESPACES).await;
    let client = env.client("").await;
    let before = env.upstream_count();
    let map = bson::Bson::JavaScriptCode("function() { emit(this._id, 1); }".into());
    let reduce = bson::Bson::JavaScriptCode("function(k, v) { return Array.sum(v); }".into());
    let e = within(
        "mapReduce",
        client.database("pay").run_command(doc! {
            "mapReduce": "transactions", "map": map, "reduce": reduce, "out": { "inline": 1 },
            "readConcern": { "level": "available" },
        }),
    )
    .await
    .expect_err("refused");
    let (code, name, msg) = command_error(&e);
    assert_eq!((code, name.as_str()), (72, "InvalidOptions"));
    assert!(
        msg.starts_with("staleguard: readConcern level \"available\" is refused on strict namespace pay.transactions"),
        "{msg}"
    );
    assert_eq!(env.upstream_count(), before, "nothing reached mongos");

    // listIndexes too; on a fallback namespace it is forwarded.
    let e = within(
        "listIndexes",
        client.database("pay").run_command(doc! {
            "listIndexes": "transactions", "readConcern": { "level": "available" },
        }),
    )
    .await
    .expect_err("refused");
    assert_eq!(command_error(&e).0, 72);
    let reply = within(
        "another command asking available on a fallback namespace",
        client.database("demo").run_command(doc! {
            "ping": "store_inventory", "readConcern": { "level": "available" },
        }),
    )
    .await
    .expect("forwarded");
    assert_eq!(reply.get_f64("ok").ok(), Some(1.0));
}

/// A pipeline whose `$unionWith` sub-pipelines nest `depth` levels, reading `coll` at the
/// bottom.
fn nested(depth: usize, coll: &str) -> bson::Bson {
    let mut inner = bson::bson!([ { "$unionWith": coll } ]);
    for _ in 0..depth {
        inner = bson::bson!([ { "$unionWith": { "coll": "stock", "pipeline": inner } } ]);
    }
    inner
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn available_with_a_pipeline_too_deep_to_read_on_a_database_with_strict_patterns_is_refused()
{
    let env = Env::start(NAMESPACES).await;
    let client = env.client("").await;
    let before = env.upstream_count();
    let deep = nested(
        staleguard::command::MAX_PIPELINE_DEPTH as usize + 2,
        "ledger",
    );
    let e = within(
        "aggregate",
        client.database("shop").run_command(doc! {
            "aggregate": "stock", "pipeline": deep.clone(), "cursor": {},
            "readConcern": { "level": "available" },
        }),
    )
    .await
    .expect_err("refused");
    let (code, _, msg) = command_error(&e);
    assert_eq!(code, 72);
    assert!(msg.contains("nests deeper than 32 levels"), "{msg}");
    assert_eq!(env.upstream_count(), before, "nothing reached mongos");

    // Readable depth: ledger is seen, and the strict namespace refuses `available` itself.
    let e = within(
        "aggregate",
        client.database("shop").run_command(doc! {
            "aggregate": "stock", "pipeline": nested(3, "ledger"), "cursor": {},
            "readConcern": { "level": "available" },
        }),
    )
    .await
    .expect_err("refused");
    let msg = command_error(&e).2;
    assert!(msg.contains("strict namespace shop.ledger"), "{msg}");

    // On a database without strict patterns the deep pipeline is forwarded as before.
    let reply = within(
        "aggregate",
        client.database("demo").run_command(doc! {
            "aggregate": "store_inventory", "pipeline": nested(40, "x"), "cursor": {},
            "readConcern": { "level": "available" },
        }),
    )
    .await;
    assert!(
        reply.is_ok()
            || !command_error(&reply.unwrap_err())
                .2
                .starts_with("staleguard"),
        "forwarded to mongos"
    );
}
