//! The mongos front's behaviours that attacks on a proxy lean on (issue 29): auth
//! (SCRAM-SHA-256 through the Rust driver and by hand, speculative or not; Unauthorized
//! before it), views whose pipeline takes time, an awaitable hello that holds back the
//! requests behind it, `secondaryPreferred` falling back to the primary, the hop latency and
//! `$where` sleeps against `maxTimeMS`, and the read log that shows what each read became.

use std::time::{Duration, Instant};

use bson::spec::BinarySubtype;
use bson::{doc, rawdoc, Binary, Bson, Document, RawDocumentBuf};
use mongodb::error::ErrorKind;
use mongodb::Client;
use staleguard::sim::scram;
use staleguard::sim::{SimConfig, SimHandle};
use staleguard::wire::reply::op_msg;

use super::wire::{body_of, Raw};
use super::{client, client_for, code, config, start};

fn with_users() -> SimConfig {
    SimConfig {
        users: vec![("app".to_string(), "secret".to_string())],
        read_log: 1000,
        ..config()
    }
}

async fn as_app(sim: &SimHandle, password: &str) -> Client {
    client_for(
        format!("app:{password}@{}", sim.addr()),
        "&authSource=admin&directConnection=true",
    )
    .await
}

fn count_of(reply: &Document) -> usize {
    reply
        .get_document("cursor")
        .and_then(|c| c.get_array("firstBatch"))
        .map_or(0, Vec::len)
}

#[tokio::test]
async fn the_driver_authenticates_and_others_get_unauthorized() {
    let sim = start(with_users()).await;
    let app = as_app(&sim, "secret").await;
    let pay = app.database("pay");
    let r = pay
        .run_command(doc! { "find": "transactions", "filter": {}, "batchSize": 1000 })
        .await
        .expect("an authenticated read");
    assert_eq!(count_of(&r), 300);

    let anonymous = client(&sim).await;
    anonymous
        .database("admin")
        .run_command(doc! { "ping": 1 })
        .await
        .expect("ping needs no auth");
    let err = anonymous
        .database("pay")
        .run_command(doc! { "find": "transactions", "filter": {} })
        .await
        .expect_err("no credentials");
    assert_eq!(code(&err), 13, "{err}");

    let wrong = as_app(&sim, "guess").await;
    let err = wrong
        .database("pay")
        .run_command(doc! { "find": "transactions", "filter": {} })
        .await
        .expect_err("wrong password");
    assert!(
        matches!(err.kind.as_ref(), ErrorKind::Authentication { .. }),
        "{err}"
    );
    sim.shutdown().await;
}

fn bin(bytes: Vec<u8>) -> Binary {
    Binary {
        subtype: BinarySubtype::Generic,
        bytes,
    }
}

fn payload(reply: &Document) -> Vec<u8> {
    match reply.get("payload") {
        Some(Bson::Binary(b)) => b.bytes.clone(),
        other => panic!("no payload: {other:?}"),
    }
}

async fn command(c: &mut Raw, id: i32, body: Document) -> Document {
    let raw = RawDocumentBuf::try_from(&body).expect("raw");
    c.send(&op_msg(id, 0, 0, &raw)).await;
    body_of(&c.recv().await.expect("a reply")).2
}

fn find(id_filter: Document) -> Document {
    doc! { "find": "transactions", "filter": id_filter, "$db": "pay" }
}

/// The three shapes of the conversation drivers use: the short one
/// (`skipEmptyExchange`), the long one (an empty last message), and the one started in
/// the handshake; each ends with `done: true` and `ok: 1`, and only then do reads pass.
#[tokio::test]
async fn scram_by_hand_short_long_and_speculative() {
    let sim = start(with_users()).await;
    for shape in ["short", "long", "speculative"] {
        let mut c = Raw::connect(sim.addr()).await;
        let refused = command(&mut c, 1, find(doc! {})).await;
        assert_eq!(refused.get_i32("code").ok(), Some(13), "{shape}: {refused}");
        let mut client = scram::Client::new("app", "secret", &format!("nonce-{shape}"));
        let first = bin(client.first());
        let options = doc! { "skipEmptyExchange": shape != "long" };
        let started = if shape == "speculative" {
            let hello = command(
                &mut c,
                2,
                doc! {
                    "hello": 1, "saslSupportedMechs": "admin.app", "$db": "admin",
                    "speculativeAuthenticate": {
                        "saslStart": 1, "mechanism": "SCRAM-SHA-256", "payload": first,
                        "options": options, "db": "admin",
                    },
                },
            )
            .await;
            let mechs = hello.get_array("saslSupportedMechs").expect("mechanisms");
            assert_eq!(mechs, &vec![Bson::from("SCRAM-SHA-256")]);
            hello
                .get_document("speculativeAuthenticate")
                .expect("speculative reply")
                .clone()
        } else {
            command(
                &mut c,
                2,
                doc! {
                    "saslStart": 1, "mechanism": "SCRAM-SHA-256", "payload": first,
                    "autoAuthorize": 1, "options": options, "$db": "admin",
                },
            )
            .await
        };
        assert_eq!(started.get_bool("done").ok(), Some(false), "{shape}");
        let last = client.last(&payload(&started)).expect("server-first");
        let mut reply = command(
            &mut c,
            3,
            doc! { "saslContinue": 1, "conversationId": 1, "payload": bin(last), "$db": "admin" },
        )
        .await;
        assert!(client.verify(&payload(&reply)), "{shape}: server proof");
        if shape == "long" {
            assert_eq!(reply.get_bool("done").ok(), Some(false));
            let still = command(&mut c, 4, find(doc! {})).await;
            assert_eq!(still.get_i32("code").ok(), Some(13), "not done yet");
            reply = command(
                &mut c,
                5,
                doc! { "saslContinue": 1, "conversationId": 1, "payload": bin(Vec::new()), "$db": "admin" },
            )
            .await;
        }
        assert_eq!(reply.get_bool("done").ok(), Some(true), "{shape}: {reply}");
        assert_eq!(reply.get_f64("ok").ok(), Some(1.0));
        let read = command(&mut c, 6, find(doc! { "_id": 7 })).await;
        assert_eq!(count_of(&read), 1, "{shape}: {read}");
    }
    // A wrong proof: AuthenticationFailed, and the connection stays unauthenticated.
    let mut c = Raw::connect(sim.addr()).await;
    let mut client = scram::Client::new("app", "not-it", "n");
    let start_reply = command(
        &mut c,
        1,
        doc! { "saslStart": 1, "mechanism": "SCRAM-SHA-256", "payload": bin(client.first()), "$db": "admin" },
    )
    .await;
    let last = client.last(&payload(&start_reply)).expect("server-first");
    let failed = command(
        &mut c,
        2,
        doc! { "saslContinue": 1, "conversationId": 1, "payload": bin(last), "$db": "admin" },
    )
    .await;
    assert_eq!(failed.get_i32("code").ok(), Some(18), "{failed}");
    let refused = command(&mut c, 3, find(doc! {})).await;
    assert_eq!(refused.get_i32("code").ok(), Some(13));
    sim.shutdown().await;
}

/// A view's pipeline costs its time on every read of it, `find {} limit 1` included, and
/// within the read's own `maxTimeMS`.
#[tokio::test]
async fn views_run_their_pipeline_and_take_its_time() {
    let sim = start(config()).await;
    let c = client(&sim).await;
    let admin = c.database("admin");
    admin
        .run_command(doc! {
            "simControl": "createView", "ns": "pay.pending", "viewOn": "transactions",
            "pipeline": [{ "$match": { "status": "pending" } }], "costMS": 300,
        })
        .await
        .expect("createView");
    let pay = c.database("pay");
    let t = Instant::now();
    let all = pay
        .run_command(doc! { "find": "pending", "filter": {}, "batchSize": 1000 })
        .await
        .expect("read the view");
    assert_eq!(count_of(&all), 100, "the pending third");
    assert!(
        t.elapsed() >= Duration::from_millis(300),
        "{:?}",
        t.elapsed()
    );
    let t = Instant::now();
    let one = pay
        .run_command(doc! { "find": "pending", "filter": {}, "limit": 1, "singleBatch": true, "maxTimeMS": 250 })
        .await
        .expect_err("a cheap read of an expensive view runs out of time");
    assert_eq!(code(&one), 50);
    assert!(t.elapsed() < Duration::from_millis(300));
    let n = pay
        .run_command(doc! { "count": "pending", "query": { "amount": { "$gt": 250 } } })
        .await
        .expect("count");
    assert!(n.get_i32("n").expect("n") < 100);
    let agg = pay
        .run_command(doc! { "aggregate": "pending", "pipeline": [{ "$count": "n" }], "cursor": {} })
        .await
        .expect("aggregate");
    let first = agg
        .get_document("cursor")
        .and_then(|c| c.get_array("firstBatch"));
    assert_eq!(
        first
            .ok()
            .and_then(|b| b.first())
            .and_then(Bson::as_document)
            .and_then(|d| d.get_i32("n").ok()),
        Some(100)
    );
    pay.run_command(doc! { "create": "settled", "viewOn": "transactions", "pipeline": [{ "$match": { "status": "settled" } }] })
        .await
        .expect("create a view");
    let err = pay
        .run_command(doc! { "create": "settled", "viewOn": "transactions" })
        .await
        .expect_err("exists");
    assert_eq!(code(&err), 48);
    let list = pay
        .run_command(doc! { "listCollections": 1 })
        .await
        .expect("listCollections");
    let views: Vec<(String, String)> = list
        .get_document("cursor")
        .and_then(|c| c.get_array("firstBatch"))
        .expect("batch")
        .iter()
        .filter_map(Bson::as_document)
        .filter(|d| d.get_str("type").ok() == Some("view"))
        .map(|d| {
            let on = d.get_document("options").and_then(|o| o.get_str("viewOn"));
            (
                d.get_str("name").unwrap_or("").to_string(),
                on.unwrap_or("").to_string(),
            )
        })
        .collect();
    assert_eq!(
        views,
        vec![
            ("pending".to_string(), "transactions".to_string()),
            ("settled".to_string(), "transactions".to_string())
        ]
    );
    // A filter by name lists that one entry (staleguard's confirming task asks so, and takes
    // a first entry that is a view for the namespace being a view).
    let names = |list: Document| -> Vec<String> {
        list.get_document("cursor")
            .and_then(|c| c.get_array("firstBatch"))
            .expect("batch")
            .iter()
            .filter_map(Bson::as_document)
            .map(|d| d.get_str("name").unwrap_or("").to_string())
            .collect()
    };
    for (name, want) in [
        ("transactions", vec!["transactions"]),
        ("settled", vec!["settled"]),
        ("nothing", vec![]),
    ] {
        let list = pay
            .run_command(
                doc! { "listCollections": 1, "filter": { "name": name }, "nameOnly": false },
            )
            .await
            .expect("listCollections with a filter");
        assert_eq!(names(list), want, "filter name {name}");
    }
    sim.shutdown().await;
}

/// mongos reads nothing more from a connection while its awaitable hello waits: a read
/// pipelined behind it is answered only after the hello's reply.
#[tokio::test]
async fn an_awaitable_hello_holds_back_the_requests_behind_it() {
    let sim = start(config()).await;
    let mut c = Raw::connect(sim.addr()).await;
    let hello = command(&mut c, 1, doc! { "hello": 1, "$db": "admin" }).await;
    let tv = hello.get_document("topologyVersion").expect("tv").clone();
    let awaitable =
        doc! { "hello": 1, "topologyVersion": tv, "maxAwaitTimeMS": 400_i64, "$db": "admin" };
    let mut both = op_msg(2, 0, 0, &RawDocumentBuf::try_from(&awaitable).expect("raw")).to_vec();
    both.extend_from_slice(&op_msg(3, 0, 0, &rawdoc! { "ping": 1, "$db": "admin" }));
    let sent = Instant::now();
    c.send(&both).await;
    let first = c.recv().await.expect("hello reply");
    assert_eq!(body_of(&first).0.response_to, 2);
    let second = c.recv().await.expect("ping reply");
    assert_eq!(body_of(&second).0.response_to, 3);
    assert!(
        sent.elapsed() >= Duration::from_millis(400),
        "the ping waited behind the hello: {:?}",
        sent.elapsed()
    );
    sim.shutdown().await;
}

/// What reached mongos, in the read log: `secondaryPreferred` whose tag sets no secondary
/// matches is read from the primaries, `secondary` with them fails (133), plain
/// `secondaryPreferred` reads secondaries; a hop of 2 ms fails `maxTimeMS: 1`; a `$where`
/// sleep takes its time and is cut by `maxTimeMS`.
#[tokio::test]
async fn the_read_log_shows_members_read_concern_and_outcome() {
    let sim = start(SimConfig {
        read_log: 100,
        hop_latency: Duration::from_millis(2),
        ..config()
    })
    .await;
    let c = client(&sim).await;
    let demo = c.database("demo");
    let nowhere = doc! { "mode": "secondaryPreferred", "tags": [{ "node": "nowhere" }] };
    let r = demo
        .run_command(doc! { "find": "store_inventory", "filter": {}, "batchSize": 5000, "comment": "preferred-tags", "$readPreference": nowhere })
        .await
        .expect("the primaries answer");
    assert_eq!(count_of(&r), 2000);
    let err = demo
        .run_command(doc! { "find": "store_inventory", "filter": {}, "comment": "secondary-tags", "$readPreference": { "mode": "secondary", "tags": [{ "node": "nowhere" }] } })
        .await
        .expect_err("no member matches");
    assert_eq!(code(&err), 133);
    demo.run_command(doc! { "find": "store_inventory", "filter": {}, "comment": "plain", "readConcern": { "level": "available" }, "$readPreference": { "mode": "secondaryPreferred" } })
        .await
        .expect("secondaries");
    let err = demo
        .run_command(doc! { "find": "store_inventory", "filter": {}, "comment": "one-ms", "maxTimeMS": 1, "$readPreference": { "mode": "secondary" } })
        .await
        .expect_err("a 2 ms hop");
    assert_eq!(code(&err), 50);
    let t = Instant::now();
    let slow = demo
        .run_command(doc! { "find": "store_inventory", "filter": { "$where": "sleep(200) || true" }, "batchSize": 5000, "comment": "slow" })
        .await
        .expect("slow but answered");
    assert_eq!(count_of(&slow), 2000);
    assert!(t.elapsed() >= Duration::from_millis(200));
    let err = demo
        .run_command(doc! { "find": "store_inventory", "filter": { "$where": "sleep(200) || true" }, "maxTimeMS": 100 })
        .await
        .expect_err("cut by its own limit");
    assert_eq!(code(&err), 50);
    let none = demo
        .run_command(doc! { "find": "store_inventory", "filter": { "$where": "sleep(1)" } })
        .await
        .expect("sleep alone matches nothing");
    assert_eq!(count_of(&none), 0);
    let err = demo
        .run_command(doc! { "find": "store_inventory", "filter": { "$where": "this.qty > 1" } })
        .await
        .expect_err("not JavaScript");
    assert_eq!(code(&err), 2);

    let log = sim.cluster().take_read_log();
    let by = |c: &str| log.iter().find(|r| r.comment == c).expect(c).clone();
    let preferred = by("preferred-tags");
    assert!(preferred.tags && preferred.code.is_none());
    assert_eq!(preferred.members.len(), 2);
    assert!(preferred.members.iter().all(|m| m.primary), "{preferred:?}");
    assert_eq!(by("secondary-tags").code, Some(133));
    let plain = by("plain");
    assert_eq!(plain.read_concern.as_deref(), Some("available"));
    assert!(plain.members.iter().all(|m| !m.primary), "{plain:?}");
    assert_eq!(by("one-ms").code, Some(50));
    assert_eq!(by("one-ms").max_time_ms, Some(1.0));
    assert!(by("slow").finished - by("slow").started >= Duration::from_millis(200));
    assert_eq!(log.len(), 5, "reads without a comment are not logged");
    sim.shutdown().await;
}
