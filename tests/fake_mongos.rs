//! The fake mongos on its own (no proxy): the driver and raw sockets talk to it directly,
//! so a failure here is the fake's, not the proxy's.

use crate::support;

use std::time::{Duration, Instant};

use bson::{doc, rawdoc, Document};
use futures::TryStreamExt;
use mongodb::error::ErrorKind;
use mongodb::Client;
use staleguard::wire::opmsg::{CHECKSUM_PRESENT, EXHAUST_ALLOWED, MORE_TO_COME};
use staleguard::wire::OpCode;
use support::mongos::{FakeMongos, Hooked};
use support::raw::{self, RawClient};
use support::within;

async fn client(fake: &FakeMongos) -> Client {
    let uri = format!("mongodb://{}/?serverSelectionTimeoutMS=5000", fake.addr());
    Client::with_uri_str(uri).await.expect("driver client")
}

fn code(err: &mongodb::error::Error) -> i32 {
    match err.kind.as_ref() {
        ErrorKind::Command(c) => c.code,
        other => panic!("not a command error: {other:?}"),
    }
}

#[tokio::test]
async fn crud_semantics() {
    let fake = FakeMongos::start().await;
    let client = client(&fake).await;
    let coll = client.database("t").collection::<Document>("c");
    let docs: Vec<Document> = (0..10).map(|i| doc! { "_id": i, "g": i % 2 }).collect();
    coll.insert_many(docs).await.unwrap();

    let r = coll
        .update_one(doc! { "_id": 1 }, doc! { "$set": { "v": "x" } })
        .await
        .unwrap();
    assert_eq!((r.matched_count, r.modified_count), (1, 1));
    let r = coll
        .update_many(doc! { "g": 0 }, doc! { "$set": { "even": true } })
        .await
        .unwrap();
    assert_eq!(r.matched_count, 5);
    let r = coll
        .replace_one(doc! { "_id": 3 }, doc! { "replaced": 1 })
        .await
        .unwrap();
    assert_eq!(r.matched_count, 1);
    let r = coll
        .update_one(doc! { "_id": 100 }, doc! { "$set": { "new": 1 } })
        .upsert(true)
        .await
        .unwrap();
    assert_eq!(r.upserted_id, Some(bson::Bson::Int32(100)));

    let one = coll.find_one(doc! { "_id": 1 }).await.unwrap().unwrap();
    assert_eq!(one, doc! { "_id": 1, "g": 1, "v": "x" });
    let three = coll.find_one(doc! { "_id": 3 }).await.unwrap().unwrap();
    assert_eq!(three, doc! { "_id": 3, "replaced": 1 });
    let evens: Vec<Document> = coll
        .find(doc! { "even": true })
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    assert_eq!(evens.len(), 5);
    let limited: Vec<Document> = coll
        .find(doc! {})
        .skip(2)
        .limit(3)
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    let ids: Vec<i32> = limited.iter().map(|d| d.get_i32("_id").unwrap()).collect();
    assert_eq!(ids, vec![2, 3, 4]);

    assert_eq!(
        coll.delete_one(doc! { "g": 1 })
            .await
            .unwrap()
            .deleted_count,
        1
    );
    assert_eq!(coll.count_documents(doc! { "g": 1 }).await.unwrap(), 3);
    assert_eq!(coll.estimated_document_count().await.unwrap(), 10);
    let matched: Vec<Document> = coll
        .aggregate(vec![doc! { "$match": { "g": 0 } }, doc! { "$limit": 2 }])
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    assert_eq!(matched.len(), 2);
    assert_eq!(coll.delete_many(doc! {}).await.unwrap().deleted_count, 10);
    assert!(fake.documents("t.c").is_empty());
    client.shutdown().await;
}

#[tokio::test]
async fn dropped_cursor_is_killed() {
    let fake = FakeMongos::start().await;
    fake.seed("t.k", (0..10).map(|i| rawdoc! { "_id": i }));
    let client = client(&fake).await;
    let coll = client.database("t").collection::<Document>("k");
    let mut cursor = coll.find(doc! {}).batch_size(2).await.unwrap();
    assert!(cursor.advance().await.unwrap());
    drop(cursor);
    fake.wait_for("killCursors", |log| {
        log.commands.iter().any(|(n, _)| n == "killCursors")
    })
    .await;
    client.shutdown().await;
}

#[tokio::test]
async fn hooks_script_errors_delays_and_closes() {
    let fake = FakeMongos::start().await;
    fake.set_hook(|body| match body.get_str("find").ok()? {
        "stale" => Some(Hooked::error(
            13388,
            "StaleConfig",
            "shard version mismatch",
        )),
        "slow" => Some(Hooked::delay(Duration::from_millis(200))),
        "gone" => Some(Hooked::close()),
        _ => None,
    });
    let client = client(&fake).await;
    let db = client.database("t");

    let err = db
        .collection::<Document>("stale")
        .find_one(doc! {})
        .await
        .unwrap_err();
    assert_eq!(code(&err), 13388);
    let started = Instant::now();
    db.collection::<Document>("slow")
        .find_one(doc! {})
        .await
        .unwrap();
    assert!(started.elapsed() >= Duration::from_millis(200));
    let err = db
        .collection::<Document>("gone")
        .find_one(doc! {})
        .await
        .unwrap_err();
    assert!(matches!(err.kind.as_ref(), ErrorKind::Io(_)), "{err:?}");

    fake.clear_hook();
    db.collection::<Document>("stale")
        .find_one(doc! {})
        .await
        .unwrap();
    client.shutdown().await;
}

#[tokio::test]
async fn unknown_and_legacy_commands_are_refused() {
    let fake = FakeMongos::start().await;
    let mut conn = RawClient::connect(fake.addr()).await;
    let reply = conn
        .roundtrip(&raw::msg(
            1,
            0,
            &rawdoc! { "frobnicate": 1, "$db": "admin" },
        ))
        .await;
    let body = raw::body(&reply);
    assert_eq!(body.get_i32("code").ok(), Some(59));
    assert_eq!(body.get_str("codeName").ok(), Some("CommandNotFound"));

    let reply = conn
        .roundtrip(&raw::query(2, "t.$cmd", &rawdoc! { "find": "c" }))
        .await;
    assert_eq!(raw::header(&reply).op(), OpCode::Reply);
    assert_eq!(raw::body(&reply).get_i32("code").ok(), Some(352));
}

#[tokio::test]
async fn compression_is_negotiated_in_client_order() {
    let fake = FakeMongos::start().await;
    let mut conn = RawClient::connect(fake.addr()).await;
    let hello = rawdoc! { "hello": 1, "compression": ["snappy", "lz4", "zstd"], "$db": "admin" };
    let body = raw::body(&conn.roundtrip(&raw::msg(1, 0, &hello)).await);
    let names: Vec<&str> = body
        .get_array("compression")
        .unwrap()
        .into_iter()
        .map(|v| v.unwrap().as_str().unwrap())
        .collect();
    assert_eq!(names, ["snappy", "zstd"]);
    assert_eq!(body.get_bool("isWritablePrimary").ok(), Some(true));

    let hello = rawdoc! { "isMaster": 1, "compression": ["lz4"], "$db": "admin" };
    let body = raw::body(&conn.roundtrip(&raw::msg(2, 0, &hello)).await);
    assert!(body.get("compression").unwrap().is_none());
    assert_eq!(body.get_bool("ismaster").ok(), Some(true));
    assert_eq!(body.get_i32("maxWireVersion").ok(), Some(21));
}

#[tokio::test]
async fn awaitable_hello_streams_until_close() {
    let fake = FakeMongos::start().await;
    let mut conn = RawClient::connect(fake.addr()).await;
    let first = raw::body(
        &conn
            .roundtrip(&raw::msg(1, 0, &rawdoc! { "hello": 1, "$db": "admin" }))
            .await,
    );
    let tv = first.get_document("topologyVersion").unwrap().to_owned();

    let started = Instant::now();
    let awaited =
        rawdoc! { "hello": 1, "topologyVersion": tv, "maxAwaitTimeMS": 30_i64, "$db": "admin" };
    conn.send(&raw::msg(2, EXHAUST_ALLOWED, &awaited)).await;
    let mut previous = 2;
    for _ in 0..3 {
        let reply = conn.recv().await;
        assert_eq!(raw::header(&reply).response_to, previous);
        assert_ne!(raw::flags(&reply) & MORE_TO_COME, 0);
        previous = raw::header(&reply).request_id;
    }
    assert!(started.elapsed() >= Duration::from_millis(90));
    drop(conn);

    // A client with another mongos's topologyVersion is answered at once.
    let mut conn = RawClient::connect(fake.addr()).await;
    let stale = rawdoc! {
        "hello": 1,
        "topologyVersion": { "processId": bson::oid::ObjectId::new(), "counter": 0_i64 },
        "maxAwaitTimeMS": 60_000_i64,
        "$db": "admin",
    };
    let reply = within("immediate hello", conn.roundtrip(&raw::msg(3, 0, &stale))).await;
    assert_eq!(raw::flags(&reply) & MORE_TO_COME, 0);
}

#[tokio::test]
async fn bad_checksum_closes_the_connection() {
    let fake = FakeMongos::start().await;
    let mut conn = RawClient::connect(fake.addr()).await;
    let mut ping = raw::msg(1, CHECKSUM_PRESENT, &rawdoc! { "ping": 1, "$db": "admin" }).to_vec();
    *ping.last_mut().unwrap() ^= 0xff;
    conn.send(&ping).await;
    assert!(conn.expect_closed().await.is_empty());
    assert!(fake.sent().is_empty());
}
