//! End-to-end relay tests: official driver or raw sockets → staleguard → fake mongos.
//!
//! With no `[[namespaces]]` configured the proxy is a pure relay, so every test here also
//! checks that what arrives on the other side is what was sent.

use crate::support;

use std::net::SocketAddr;
use std::sync::Arc;

use bson::{doc, rawdoc, Document, RawDocumentBuf};
use bytes::Bytes;
use futures::TryStreamExt;
use mongodb::Client;
use staleguard::wire::opmsg::{verify_checksum, CHECKSUM_PRESENT, EXHAUST_ALLOWED, MORE_TO_COME};
use staleguard::wire::OpCode;
use support::mongos::{known_round_trips, FakeMongos, Hooked};
use support::raw::{self, RawClient};
use support::tap::Tap;
use support::within;

/// A fake mongos with the proxy in front of it.
struct Env {
    fake: FakeMongos,
    proxy: staleguard::server::Running,
}

impl Env {
    async fn start() -> Env {
        let fake = FakeMongos::start().await;
        let config =
            staleguard::config::Config::for_upstreams("127.0.0.1:0", vec![fake.addr().to_string()]);
        let proxy = staleguard::server::start(Arc::new(config))
            .await
            .expect("start proxy");
        Env { fake, proxy }
    }

    fn addr(&self) -> SocketAddr {
        self.proxy.local_addr()
    }

    async fn client(&self) -> Client {
        client(self.addr(), "").await
    }

    async fn raw(&self) -> RawClient {
        RawClient::connect(self.addr()).await
    }
}

/// A driver client for `addr`; `options` are extra URI options, each starting with `&`.
async fn client(addr: SocketAddr, options: &str) -> Client {
    let uri =
        format!("mongodb://{addr}/?serverSelectionTimeoutMS=5000&connectTimeoutMS=5000{options}");
    Client::with_uri_str(uri).await.expect("driver client")
}

async fn ping(client: &Client) {
    let reply = within(
        "ping",
        client.database("admin").run_command(doc! { "ping": 1 }),
    )
    .await
    .expect("ping");
    assert_eq!(reply.get_f64("ok").ok(), Some(1.0));
}

fn docs(n: i32) -> Vec<Document> {
    (0..n)
        .map(|i| doc! { "_id": i, "v": format!("value {i}") })
        .collect()
}

fn raw_docs(n: i32) -> Vec<RawDocumentBuf> {
    (0..n)
        .map(|i| rawdoc! { "_id": i, "v": format!("value {i}") })
        .collect()
}

/// The commands of a given name the fake received, in order.
fn commands(fake: &FakeMongos, name: &str) -> Vec<RawDocumentBuf> {
    fake.received_commands()
        .into_iter()
        .filter(|(n, _)| n == name)
        .map(|(_, body)| body)
        .collect()
}

// ---- driver sessions ------------------------------------------------------------------

#[tokio::test]
async fn driver_handshake_and_ping() {
    let env = Env::start().await;
    let client = env.client().await;
    ping(&client).await;

    let hello = env
        .fake
        .received_commands()
        .into_iter()
        .find(|(n, _)| matches!(n.as_str(), "hello" | "isMaster" | "ismaster"))
        .expect("a handshake reached mongos");
    assert!(
        hello.1.get("client").ok().flatten().is_some(),
        "driver handshake carries client metadata"
    );
    assert_eq!(commands(&env.fake, "ping").len(), 1);
    client.shutdown().await;
}

#[tokio::test]
async fn legacy_op_query_handshake() {
    let env = Env::start().await;
    let mut conn = env.raw().await;
    let request = raw::query(7, "admin.$cmd", &rawdoc! { "isMaster": 1, "helloOk": true });
    let reply = conn.roundtrip(&request).await;

    assert_eq!(raw::header(&reply).op(), staleguard::wire::OpCode::Reply);
    assert_eq!(raw::header(&reply).response_to, 7);
    let body = raw::body(&reply);
    assert_eq!(body.get_bool("ismaster").ok(), Some(true));
    assert_eq!(body.get_str("msg").ok(), Some("isdbgrid"));
    assert_eq!(body.get_bool("helloOk").ok(), Some(true));
    assert_eq!(body.get_i32("maxWireVersion").ok(), Some(21));
    assert_eq!(env.fake.received(), vec![request]);
    assert_eq!(env.fake.sent(), vec![reply]);
}

#[tokio::test]
async fn insert_many_ten_thousand() {
    let env = Env::start().await;
    let client = env.client().await;
    let coll = client.database("app").collection::<Document>("bulk");

    let result = within("insert_many", coll.insert_many(docs(10_000)))
        .await
        .expect("insert_many");
    assert_eq!(result.inserted_ids.len(), 10_000);
    assert_eq!(env.fake.documents("app.bulk").len(), 10_000);
    let counted = within("count", coll.count_documents(doc! {}))
        .await
        .expect("count");
    assert_eq!(counted, 10_000);

    // The driver sends the documents as kind-1 sequences, never inside the body.
    let inserts = commands(&env.fake, "insert");
    assert!(!inserts.is_empty());
    assert!(inserts
        .iter()
        .all(|b| b.get("documents").ok().flatten().is_none()));
    client.shutdown().await;
}

#[tokio::test]
async fn cursor_over_get_more_batches() {
    let env = Env::start().await;
    env.fake.seed("app.many", raw_docs(1_000));
    let client = env.client().await;
    let coll = client.database("app").collection::<Document>("many");

    let cursor = within("find", coll.find(doc! {}).batch_size(100))
        .await
        .expect("find");
    let got: Vec<Document> = within("drain cursor", cursor.try_collect())
        .await
        .expect("cursor");

    let ids: Vec<i32> = got.iter().map(|d| d.get_i32("_id").expect("_id")).collect();
    assert_eq!(ids, (0..1_000).collect::<Vec<_>>());
    assert_eq!(commands(&env.fake, "getMore").len(), 9);
    client.shutdown().await;
}

#[tokio::test]
async fn fifteen_megabyte_document_roundtrip() {
    let env = Env::start().await;
    let client = env.client().await;
    let coll = client.database("app").collection::<Document>("big");
    let payload: Vec<u8> = (0..15_000_000u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    let big = doc! {
        "_id": "big",
        "blob": bson::Binary { subtype: bson::spec::BinarySubtype::Generic, bytes: payload },
    };

    within("insert big", coll.insert_one(big.clone()))
        .await
        .expect("insert big");
    let back = within("find big", coll.find_one(doc! { "_id": "big" }))
        .await
        .expect("find big")
        .expect("big document present");
    assert!(back == big, "15 MB document came back changed");
    client.shutdown().await;
}

async fn compression_roundtrip(name: &str, id: u8) {
    let env = Env::start().await;
    let client = client(env.addr(), &format!("&compressors={name}")).await;
    let coll = client.database("app").collection::<Document>("squeezed");

    within("insert", coll.insert_many(docs(500)))
        .await
        .expect("insert");
    let got: Vec<Document> = within("find", async {
        coll.find(doc! {}).batch_size(50).await?.try_collect().await
    })
    .await
    .expect("find");
    assert_eq!(got, docs(500));

    let compressed: Vec<Bytes> = env
        .fake
        .received()
        .into_iter()
        .filter(|m| raw::header(m).op() == OpCode::Compressed)
        .collect();
    assert!(
        !compressed.is_empty(),
        "{name}: the fake received no OP_COMPRESSED"
    );
    assert!(
        compressed.iter().all(|m| m[24] == id),
        "{name}: compressor id"
    );
    client.shutdown().await;
}

#[tokio::test]
async fn compression_zstd() {
    compression_roundtrip("zstd", 3).await;
}

#[tokio::test]
async fn compression_zlib() {
    compression_roundtrip("zlib", 2).await;
}

#[tokio::test]
async fn compression_snappy() {
    compression_roundtrip("snappy", 1).await;
}

/// The driver's streaming monitor: one awaitable hello with exhaustAllowed, then a stream of
/// moreToCome replies, each answering the one before.
#[tokio::test]
async fn streaming_hello_through_proxy() {
    let env = Env::start().await;
    env.fake.set_await_cap(std::time::Duration::from_millis(20));
    let tap = Tap::start(env.addr()).await;
    let client = client(tap.addr(), "&heartbeatFrequencyMS=500").await;
    ping(&client).await;

    tap.wait_for("three streamed hellos reach the client", |_, down| {
        down.iter().filter(|m| is_streamed(m)).count() >= 3
    })
    .await;
    let down = tap.to_client();
    let streamed: Vec<&Bytes> = down.iter().filter(|m| is_streamed(m)).collect();
    // After the first, each streamed reply answers the previous streamed reply.
    let chained = streamed
        .windows(2)
        .filter(|w| raw::header(w[1]).response_to == raw::header(w[0]).request_id)
        .count();
    assert!(chained >= 2, "responseTo chain broken: {chained}");
    for m in &streamed {
        assert!(env.fake.sent().contains(m), "streamed reply altered");
    }
    ping(&client).await;
    client.shutdown().await;
}

fn is_streamed(msg: &[u8]) -> bool {
    raw::flags(msg) & MORE_TO_COME != 0
        && raw::body(msg)
            .get("topologyVersion")
            .ok()
            .flatten()
            .is_some()
}

// ---- raw sockets ----------------------------------------------------------------------

#[tokio::test]
async fn exhaust_get_more_raw() {
    let env = Env::start().await;
    env.fake.seed("app.ex", raw_docs(10));
    let mut conn = env.raw().await;

    let find = raw::msg(
        1,
        0,
        &rawdoc! { "find": "ex", "batchSize": 2, "$db": "app" },
    );
    let first = raw::body(&conn.roundtrip(&find).await);
    let cursor = first.get_document("cursor").expect("cursor");
    let id = cursor.get_i64("id").expect("Int64 cursor id");
    assert_ne!(id, 0);

    let get_more = raw::msg(
        2,
        EXHAUST_ALLOWED,
        &rawdoc! { "getMore": id, "collection": "ex", "batchSize": 3, "$db": "app" },
    );
    conn.send(&get_more).await;
    let mut replies = vec![conn.recv().await];
    while raw::flags(replies.last().expect("a reply")) & MORE_TO_COME != 0 {
        replies.push(conn.recv().await);
    }

    assert_eq!(replies.len(), 3, "8 documents in batches of 3");
    let mut expect_to = 2;
    let mut ids = Vec::new();
    for r in &replies {
        assert_eq!(raw::header(r).response_to, expect_to);
        expect_to = raw::header(r).request_id;
        let body = raw::body(r);
        let batch = body
            .get_document("cursor")
            .and_then(|c| c.get_array("nextBatch"))
            .expect("nextBatch");
        ids.extend(
            batch
                .into_iter()
                .map(|d| d.unwrap().as_document().unwrap().get_i32("_id").unwrap()),
        );
    }
    assert_eq!(ids, (2..10).collect::<Vec<_>>());
    let last = raw::body(replies.last().unwrap());
    assert_eq!(
        last.get_document("cursor").unwrap().get_i64("id").ok(),
        Some(0)
    );
    assert_eq!(
        &env.fake.sent()[1..],
        &replies[..],
        "exhaust replies relayed byte for byte"
    );
}

/// Exhaust replies larger than the streaming threshold go to the client in pieces as they
/// arrive (nothing inspects them): still byte for byte, each with its moreToCome, and a
/// request pipelined behind them is answered after them.
#[tokio::test]
async fn large_exhaust_replies_stream_through_byte_for_byte() {
    let env = Env::start().await;
    let docs: Vec<RawDocumentBuf> = (0..9)
        .map(|i| rawdoc! { "_id": i, "pad": "p".repeat(200_000) })
        .collect();
    env.fake.seed("app.bigex", docs);
    let mut conn = env.raw().await;
    let find = raw::msg(
        1,
        0,
        &rawdoc! { "find": "bigex", "batchSize": 0, "$db": "app" },
    );
    let first = raw::body(&conn.roundtrip(&find).await);
    let id = first
        .get_document("cursor")
        .and_then(|c| c.get_i64("id"))
        .expect("cursor id");
    let get_more = raw::msg(
        2,
        EXHAUST_ALLOWED,
        &rawdoc! { "getMore": id, "collection": "bigex", "batchSize": 3, "$db": "app" },
    );
    conn.send(&get_more).await;
    let mut replies = vec![conn.recv().await];
    while raw::flags(replies.last().expect("a reply")) & MORE_TO_COME != 0 {
        replies.push(conn.recv().await);
    }
    assert_eq!(replies.len(), 3, "9 documents in batches of 3");
    assert!(replies.iter().all(|r| r.len() > 600_000), "large replies");
    assert_eq!(&env.fake.sent()[1..], &replies[..], "byte for byte");
    let ping = raw::msg(3, 0, &rawdoc! { "ping": 1, "$db": "admin" });
    let pong = conn.roundtrip(&ping).await;
    assert_eq!(raw::header(&pong).response_to, 3);
}

#[tokio::test]
async fn checksum_message_roundtrip() {
    let env = Env::start().await;
    let mut conn = env.raw().await;
    let ping = raw::msg(11, CHECKSUM_PRESENT, &rawdoc! { "ping": 1, "$db": "admin" });
    verify_checksum(&ping).expect("test builds a valid checksum");

    let reply = conn.roundtrip(&ping).await;
    assert_eq!(
        env.fake.received(),
        vec![ping],
        "checksummed request relayed unchanged"
    );
    assert_ne!(raw::flags(&reply) & CHECKSUM_PRESENT, 0);
    verify_checksum(&reply).expect("reply checksum");
    assert_eq!(raw::body(&reply).get_f64("ok").ok(), Some(1.0));
    assert_eq!(env.fake.sent(), vec![reply]);
}

/// A corrupted checksum is connection-fatal (mongos closes); the client must be closed too.
#[tokio::test]
async fn bad_checksum_closes_the_client() {
    let env = Env::start().await;
    let client = env.client().await;
    let mut conn = env.raw().await;
    let mut corrupt =
        raw::msg(12, CHECKSUM_PRESENT, &rawdoc! { "ping": 1, "$db": "admin" }).to_vec();
    *corrupt.last_mut().unwrap() ^= 0xff;
    conn.send(&corrupt).await;
    let before_close = conn.expect_closed().await;
    assert!(
        before_close
            .iter()
            .all(|m| raw::body(m).get_f64("ok").ok() != Some(1.0)),
        "a corrupted message was answered ok"
    );
    ping(&client).await;
    client.shutdown().await;
}

/// w:0: the request carries moreToCome, nothing is answered, the document still lands.
#[tokio::test]
async fn unacknowledged_write() {
    let env = Env::start().await;
    let mut conn = env.raw().await;
    let insert = raw::msg_with_sequence(
        21,
        MORE_TO_COME,
        &rawdoc! { "insert": "fire", "writeConcern": { "w": 0 }, "$db": "app" },
        "documents",
        &[rawdoc! { "_id": 1, "note": "no reply" }],
    );
    conn.send(&insert).await;
    let ping = raw::msg(22, 0, &rawdoc! { "ping": 1, "$db": "admin" });
    let reply = conn.roundtrip(&ping).await;

    // The first thing back answers the ping: the insert got no reply.
    assert_eq!(raw::header(&reply).response_to, 22);
    assert_eq!(env.fake.received(), vec![insert, ping]);
    assert_eq!(
        env.fake.documents("app.fire"),
        vec![rawdoc! { "_id": 1, "note": "no reply" }]
    );
}

/// N known messages over one raw connection: the fake receives exactly these bytes and the
/// client gets exactly the bytes the fake sent, in order.
#[tokio::test]
async fn byte_for_byte_raw() {
    let env = Env::start().await;
    let mut conn = env.raw().await;
    known_round_trips(&mut conn, &env.fake).await;
}

/// A whole driver session through a recording tap in front of the proxy: everything the fake
/// received is something the driver sent, everything the driver got is something the fake sent.
#[tokio::test]
async fn byte_for_byte_driver_session() {
    let env = Env::start().await;
    let tap = Tap::start(env.addr()).await;
    let client = client(tap.addr(), "").await;
    let coll = client.database("app").collection::<Document>("session");
    within("insert", coll.insert_many(docs(300)))
        .await
        .expect("insert");
    let got: Vec<Document> = within("find", async {
        coll.find(doc! {}).batch_size(64).await?.try_collect().await
    })
    .await
    .expect("find");
    assert_eq!(got.len(), 300);
    within(
        "update",
        coll.update_one(doc! { "_id": 5 }, doc! { "$set": { "v": "five" } }),
    )
    .await
    .expect("update");
    within("delete", coll.delete_many(doc! { "_id": 6 }))
        .await
        .expect("delete");
    client.shutdown().await;

    // Wait until everything the driver sent has reached the fake.
    let up = tap.to_server();
    env.fake
        .wait_for("driver traffic reaches mongos", |log| {
            up.iter().all(|m| log.received.contains(m))
        })
        .await;
    let (received, sent) = (env.fake.received(), env.fake.sent());
    for m in &received {
        assert!(up.contains(m), "mongos got a message the client never sent");
    }
    let down = tap.to_client();
    for m in &down {
        assert!(sent.contains(m), "client got a message mongos never sent");
    }
    assert!(received.len() >= 8 && down.len() >= 8);
}

// ---- failure isolation ----------------------------------------------------------------

#[tokio::test]
async fn bad_input_closes_only_that_client() {
    let env = Env::start().await;
    let client = env.client().await;
    ping(&client).await;

    let header_only = |len: i32| {
        let mut m = len.to_le_bytes().to_vec();
        m.extend_from_slice(&[0; 12]);
        m
    };
    let inputs: Vec<Vec<u8>> = vec![
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(),
        header_only(-5),
        header_only(12),
        header_only(49_000_000),
        header_only(i32::MAX),
    ];
    for input in inputs {
        let mut bad = env.raw().await;
        bad.send(&input).await;
        bad.expect_closed().await;
        ping(&client).await;
    }
    assert_eq!(commands(&env.fake, "ping").len(), 6);
    client.shutdown().await;
}

#[tokio::test]
async fn upstream_drop_closes_only_its_client() {
    let env = Env::start().await;
    env.fake
        .set_hook(|body| (body.get_str("find").ok() == Some("doomed")).then(Hooked::close));
    let client = env.client().await;
    ping(&client).await;
    let mut bystander = env.raw().await;
    let before = bystander
        .roundtrip(&raw::msg(1, 0, &rawdoc! { "ping": 1, "$db": "admin" }))
        .await;
    assert_eq!(raw::header(&before).response_to, 1);

    let mut victim = env.raw().await;
    victim
        .send(&raw::msg(9, 0, &rawdoc! { "find": "doomed", "$db": "app" }))
        .await;
    assert!(
        victim.expect_closed().await.is_empty(),
        "no reply, just a close"
    );

    let after = bystander
        .roundtrip(&raw::msg(2, 0, &rawdoc! { "ping": 1, "$db": "admin" }))
        .await;
    assert_eq!(raw::header(&after).response_to, 2);
    ping(&client).await;
    client.shutdown().await;
}

#[tokio::test]
async fn concurrent_clients_get_only_their_replies() {
    let env = Env::start().await;
    let seed = (0..20)
        .flat_map(|owner| (0..5).map(move |k| rawdoc! { "_id": owner * 100 + k, "owner": owner }));
    env.fake.seed("app.shared", seed);
    let client = env.client().await;
    let coll = client.database("app").collection::<Document>("shared");

    let mut tasks = tokio::task::JoinSet::new();
    for owner in 0..20 {
        let coll = coll.clone();
        tasks.spawn(async move {
            for _ in 0..10 {
                let got: Vec<Document> = coll
                    .find(doc! { "owner": owner })
                    .await?
                    .try_collect()
                    .await?;
                assert_eq!(got.len(), 5);
                assert!(got.iter().all(|d| d.get_i32("owner").ok() == Some(owner)));
            }
            Ok::<_, mongodb::error::Error>(())
        });
        let addr = env.addr();
        tasks.spawn(async move {
            let mut conn = RawClient::connect(addr).await;
            for i in 0..10 {
                let id = owner * 1000 + i;
                let find = raw::msg(
                    id,
                    0,
                    &rawdoc! { "find": "shared", "filter": { "owner": owner }, "$db": "app" },
                );
                let reply = conn.roundtrip(&find).await;
                assert_eq!(raw::header(&reply).response_to, id);
                let body = raw::body(&reply);
                let batch = body
                    .get_document("cursor")
                    .and_then(|c| c.get_array("firstBatch"))
                    .expect("batch");
                let owners: Vec<i32> = batch
                    .into_iter()
                    .map(|d| d.unwrap().as_document().unwrap().get_i32("owner").unwrap())
                    .collect();
                assert_eq!(owners, vec![owner; 5]);
            }
            Ok(())
        });
    }
    while let Some(done) = within("concurrent clients", tasks.join_next()).await {
        done.expect("task panicked").expect("driver error");
    }
    client.shutdown().await;
}

#[tokio::test]
async fn shutdown_refuses_new_connections() {
    let env = Env::start().await;
    let addr = env.addr();
    let mut conn = env.raw().await;
    conn.roundtrip(&raw::msg(1, 0, &rawdoc! { "ping": 1, "$db": "admin" }))
        .await;
    drop(conn);

    within("proxy shutdown", env.proxy.shutdown()).await;
    let refused = tokio::net::TcpStream::connect(addr).await;
    assert!(refused.is_err(), "proxy still accepts after shutdown");
}
