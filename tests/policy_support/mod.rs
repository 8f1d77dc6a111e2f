//! Helpers for the read-policy tests: the real proxy (`staleguard::server::start`) between a
//! recording tap (what the driver sent) and the fake mongos (what reached "mongos"), scripted
//! faults, and body comparisons.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bson::{rawdoc, RawBson, RawDocument, RawDocumentBuf};
use bytes::Bytes;
use mongodb::error::{Error, ErrorKind};
use mongodb::Client;
use staleguard::breaker::State;
use staleguard::config::Config;
use staleguard::server::Running;
use staleguard::wire::opmsg::OpMsg;
use staleguard::wire::{Header, OpCode, HEADER_LEN};

use crate::support::mongos::{FakeMongos, Hooked};
use crate::support::raw;
use crate::support::tap::Tap;

/// These tests check the decision table byte for byte: the first attempt keeps the client's
/// whole budget and reads without one go as sent (the split itself is tested against
/// the sim, `tests/policy_sim.rs`).
pub const PASS_BUDGET: &str = "attempt_share = 1.0\nattempt_limit = \"off\"\n";

/// `config` with [`PASS_BUDGET`] in its `[defaults]` table: added to the caller's own
/// `[defaults]` when it has one, else as a new table after the top-level keys (a table opened
/// before them would capture them).
pub fn with_pass_budget(config: &str) -> String {
    let mut out = String::with_capacity(config.len() + 64);
    let mut placed = false;
    for line in config.lines() {
        let header = line.trim_start();
        if !placed && header == "[defaults]" {
            out.push_str(line);
            out.push('\n');
            out.push_str(PASS_BUDGET);
            placed = true;
            continue;
        }
        if !placed && header.starts_with('[') && !config.lines().any(|l| l.trim() == "[defaults]") {
            out.push_str("[defaults]\n");
            out.push_str(PASS_BUDGET);
            out.push('\n');
            placed = true;
        }
        out.push_str(line);
        out.push('\n');
    }
    if !placed {
        out.push_str("[defaults]\n");
        out.push_str(PASS_BUDGET);
    }
    out
}

/// The namespaces most tests use: one fallback collection, the strict `pay` database
/// refusing reads while open (`on_open = "refuse"`: the bound mode has tests of its own in
/// `tests/evidence.rs`); a fixed 30 s cooldown (no short first one), so an open breaker
/// stays open through a test. These
/// tests walk the decision table with one driver client, so one connection's errors must
/// open a breaker and its waits of a few milliseconds must count: `min_connections = 1`,
/// `per_connection` at its largest and `min_wait = "0s"` (the evidence rules have their
/// own tests in `tests/limits.rs`, on [`DEFAULT_NAMESPACES`]).
pub const BASE_NAMESPACES: &str = r#"
[[namespaces]]
pattern = "demo.store_inventory"
mode = "fallback"
threshold = 3
window = "10s"
cooldown = "30s"
min_cooldown = "30s"
min_connections = 1
per_connection = 1000
min_wait = "0s"

[[namespaces]]
pattern = "pay.*"
mode = "strict"
on_open = "refuse"
threshold = 3
window = "10s"
cooldown = "30s"
min_cooldown = "30s"
min_connections = 1
per_connection = 1000
min_wait = "0s"
"#;

/// The same namespaces with the built-in evidence rules (`min_connections = 2`,
/// `per_connection = 1`, `min_wait = "1s"`).
pub const DEFAULT_NAMESPACES: &str = r#"
[[namespaces]]
pattern = "demo.store_inventory"
mode = "fallback"
threshold = 3
window = "10s"
cooldown = "30s"
min_cooldown = "30s"

[[namespaces]]
pattern = "pay.*"
mode = "strict"
threshold = 3
window = "10s"
cooldown = "30s"
min_cooldown = "30s"
"#;

/// driver → tap → staleguard → fake mongos.
pub struct Env {
    pub fake: FakeMongos,
    pub proxy: Running,
    /// Between the driver and the proxy: records what the driver really sent.
    pub tap: Tap,
    pub config: Arc<Config>,
}

impl Env {
    /// Starts everything with `namespaces` (TOML `[[namespaces]]` entries) as the policy.
    pub async fn start(namespaces: &str) -> Env {
        Env::start_text(namespaces, true).await
    }

    /// Like [`Env::start`], with the default first-attempt budget (`attempt_share`,
    /// `attempt_limit`) instead of [`PASS_BUDGET`].
    pub async fn start_budgeted(namespaces: &str) -> Env {
        Env::start_text(namespaces, false).await
    }

    async fn start_text(namespaces: &str, pass_budget: bool) -> Env {
        let fake = FakeMongos::start().await;
        let text = format!(
            "listen = \"127.0.0.1:0\"\nupstreams = [\"{}\"]\nshutdown_timeout = \"0s\"\n{namespaces}",
            fake.addr()
        );
        let text = if pass_budget {
            with_pass_budget(&text)
        } else {
            text
        };
        // The fake mongos answers as each test scripts it, not as a cluster would: an open
        // breaker's own questions (`breaker::own`, on by default) would meet its scripted
        // replies in the background and close breakers these tests watch close on their
        // samples. They are tested in `breaker::own` and by the chaos run on the sim.
        let text = format!("{text}\n[confirm]\nown_questions = false\n");
        let config = match Config::parse(&text, Path::new("policy-test.toml")) {
            Ok(c) => Arc::new(c),
            Err(errors) => panic!("test config rejected: {errors:?}\n{text}"),
        };
        let proxy = staleguard::server::start(config.clone())
            .await
            .expect("start staleguard");
        let tap = Tap::start(proxy.local_addr()).await;
        Env {
            fake,
            proxy,
            tap,
            config,
        }
    }

    /// Where drivers connect (the tap in front of the proxy).
    pub fn addr(&self) -> SocketAddr {
        self.tap.addr()
    }

    /// The proxy itself (raw clients that need no recording).
    pub fn proxy_addr(&self) -> SocketAddr {
        self.proxy.local_addr()
    }

    /// A driver client through the tap; `options` are extra URI options, each starting `&`.
    pub async fn client(&self, options: &str) -> Client {
        client(self.addr(), options).await
    }

    pub fn state(&self, ns: &str) -> State {
        self.proxy.shared().breakers.state(ns)
    }

    /// Trigger errors the breaker of `ns` holds in its window (0 when it has no breaker).
    pub fn errors(&self, ns: &str) -> usize {
        self.proxy
            .shared()
            .breakers
            .snapshot()
            .into_iter()
            .find(|s| s.ns == ns)
            .map_or(0, |s| s.errors_in_window)
    }

    /// Namespaces that have a breaker.
    pub fn breaker_namespaces(&self) -> Vec<String> {
        self.proxy
            .shared()
            .breakers
            .snapshot()
            .into_iter()
            .map(|s| s.ns)
            .collect()
    }

    /// Waits (polling, at most 5 s) until the breaker of `ns` is in `state`.
    pub async fn wait_state(&self, ns: &str, state: State) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while self.state(ns) != state {
            assert!(
                Instant::now() < deadline,
                "breaker {ns} stayed {:?}, expected {state:?} (errors {})",
                self.state(ns),
                self.errors(ns)
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Raw messages carrying command `name` on `coll` that reached the fake mongos.
    pub fn upstream(&self, name: &str, coll: &str) -> Vec<Bytes> {
        select(self.fake.received(), name, coll)
    }

    /// Raw messages carrying command `name` on `coll` that the driver sent to the proxy.
    pub fn sent_by_driver(&self, name: &str, coll: &str) -> Vec<Bytes> {
        select(self.tap.to_server(), name, coll)
    }

    /// Decoded bodies of [`Env::upstream`].
    pub fn upstream_bodies(&self, name: &str, coll: &str) -> Vec<RawDocumentBuf> {
        self.upstream(name, coll).iter().map(|m| body(m)).collect()
    }

    /// Decoded bodies of [`Env::from_driver`].
    pub fn driver_bodies(&self, name: &str, coll: &str) -> Vec<RawDocumentBuf> {
        self.sent_by_driver(name, coll)
            .iter()
            .map(|m| body(m))
            .collect()
    }

    /// Messages that reached the fake mongos, other than handshakes and monitoring (`hello`,
    /// `isMaster`), which a driver sends on its own schedule (new pooled connections,
    /// heartbeats).
    pub fn upstream_count(&self) -> usize {
        self.fake
            .received()
            .iter()
            .filter(|m| {
                !try_body(m)
                    .is_some_and(|b| matches!(command_name(&b), "hello" | "isMaster" | "ismaster"))
            })
            .count()
    }
}

/// A driver client for `addr`.
pub async fn client(addr: SocketAddr, options: &str) -> Client {
    let uri =
        format!("mongodb://{addr}/?serverSelectionTimeoutMS=5000&connectTimeoutMS=5000{options}");
    Client::with_uri_str(uri).await.expect("driver client")
}

/// Messages among `msgs` that are OP_MSG (possibly compressed) commands `name` on `coll`
/// (the string value of the first key; for `getMore`, the `collection` field).
/// staleguard's own confirming read (a `find` with `limit: 1`, `singleBatch` and no session:
/// drivers always send `lsid`).
pub fn is_confirm(b: &RawDocument) -> bool {
    b.get_i32("limit").ok() == Some(1)
        && b.get_bool("singleBatch").ok() == Some(true)
        && b.get_document("projection")
            .is_ok_and(|p| p.get("staleguard_confirm_nothing").ok().flatten().is_some())
}

pub fn select(msgs: Vec<Bytes>, name: &str, coll: &str) -> Vec<Bytes> {
    msgs.into_iter()
        .filter(|m| {
            let Some(b) = try_body(m) else { return false };
            command_name(&b) == name && collection(&b).as_deref() == Some(coll)
        })
        .collect()
}

/// The kind-0 body of an OP_MSG or OP_COMPRESSED(OP_MSG) message; `None` for other opcodes.
pub fn try_body(msg: &[u8]) -> Option<RawDocumentBuf> {
    let plain = raw::uncompressed(msg);
    let h = Header::parse(&plain)?;
    if h.op() != OpCode::Msg {
        return None;
    }
    Some(OpMsg::parse(&plain[HEADER_LEN..]).ok()?.body.to_owned())
}

pub fn body(msg: &[u8]) -> RawDocumentBuf {
    try_body(msg).expect("an OP_MSG command")
}

pub fn opcode(msg: &[u8]) -> OpCode {
    raw::header(msg).op()
}

/// The compressor id of an OP_COMPRESSED message (byte 24).
pub fn compressor_id(msg: &[u8]) -> u8 {
    assert_eq!(opcode(msg), OpCode::Compressed, "not OP_COMPRESSED");
    msg[HEADER_LEN + 8]
}

pub fn command_name(body: &RawDocument) -> &str {
    match body.iter().next() {
        Some(Ok((k, _))) => k.as_str(),
        _ => "",
    }
}

/// The collection a command names: the string first value, or `collection` (getMore).
pub fn collection(body: &RawDocument) -> Option<String> {
    match body.iter().next() {
        Some(Ok((_, v))) => match v.as_str() {
            Some(s) => Some(s.to_string()),
            None => body.get_str("collection").ok().map(str::to_string),
        },
        _ => None,
    }
}

/// The body's elements in order, without `keys`.
pub fn without(body: &RawDocument, keys: &[&str]) -> Vec<(String, RawBson)> {
    body.iter()
        .map(|e| e.expect("valid element"))
        .filter(|(k, _)| !keys.contains(&k.as_str()))
        .map(|(k, v)| (k.as_str().to_string(), RawBson::from(v)))
        .collect()
}

/// `readConcern` of a body, if any.
pub fn read_concern(body: &RawDocument) -> Option<RawDocumentBuf> {
    body.get_document("readConcern").ok().map(|d| d.to_owned())
}

/// `maxTimeMS` of a body as an integer, if any.
pub fn max_time_ms(body: &RawDocument) -> Option<i64> {
    match body.get("maxTimeMS").ok().flatten()? {
        bson::RawBsonRef::Int32(n) => Some(n as i64),
        bson::RawBsonRef::Int64(n) => Some(n),
        bson::RawBsonRef::Double(d) => Some(d as i64),
        other => panic!("maxTimeMS of unexpected type {other:?}"),
    }
}

/// `{level: "available"}`.
pub fn available() -> RawDocumentBuf {
    rawdoc! { "level": "available" }
}

/// The readConcern level a command asks for.
pub fn level(body: &RawDocument) -> Option<String> {
    body.get_document("readConcern")
        .ok()?
        .get_str("level")
        .ok()
        .map(str::to_string)
}

/// Is `body` a read (find/aggregate/count/distinct) on `coll`?
pub fn is_read_on(body: &RawDocument, coll: &str) -> bool {
    matches!(
        command_name(body),
        "find" | "aggregate" | "count" | "distinct"
    ) && collection(body).as_deref() == Some(coll)
}

/// The (code, codeName, errmsg) of a server error the driver returned.
pub fn command_error(e: &Error) -> (i32, String, String) {
    match &*e.kind {
        ErrorKind::Command(c) => (c.code, c.code_name.clone(), c.message.clone()),
        other => panic!("expected a command error, got {other:?}"),
    }
}

/// The code name the fake uses in scripted errors.
pub fn code_name(code: i32) -> &'static str {
    match code {
        13388 => "StaleConfig",
        63 => "StaleShardVersion",
        150 => "StaleEpoch",
        249 => "StaleDbVersion",
        50 => "MaxTimeMSExpired",
        262 => "ExceededTimeLimit",
        89 => "NetworkTimeout",
        133 => "FailedToSatisfyReadPreference",
        202 => "NetworkInterfaceExceededTimeLimit",
        96 => "OperationFailed",
        _ => "Error",
    }
}

/// A scripted fault on one collection: while `on`, every read of it that does not ask for
/// `available` fails with `code` after `delay`; reads with `available` (what the real shard
/// serves without the version check) are answered normally. `hits` counts the faults served.
#[derive(Clone)]
pub struct Fault {
    pub on: Arc<AtomicBool>,
    pub hits: Arc<AtomicU64>,
}

impl Fault {
    pub fn set(&self, on: bool) {
        self.on.store(on, Ordering::SeqCst);
    }

    pub fn hits(&self) -> u64 {
        self.hits.load(Ordering::SeqCst)
    }
}

/// Installs a [`Fault`] hook on `fake` for reads of `coll` (any database).
pub fn stale_reads(fake: &FakeMongos, coll: &str, code: i32, delay: Duration) -> Fault {
    let fault = Fault {
        on: Arc::new(AtomicBool::new(true)),
        hits: Arc::new(AtomicU64::new(0)),
    };
    let f = fault.clone();
    let coll = coll.to_string();
    fake.set_hook(move |body| {
        if !f.on.load(Ordering::SeqCst) || !is_read_on(body, &coll) {
            return None;
        }
        if level(body).as_deref() == Some("available") {
            return None;
        }
        f.hits.fetch_add(1, Ordering::SeqCst);
        let msg = format!("scripted {} on {coll}", code_name(code));
        Some(Hooked::error(code, code_name(code), &msg).after(delay))
    });
    fault
}

/// The incident on `colls`: their secondary reads fail with StaleConfig; primary reads and
/// `available` reads are answered.
pub fn stale_secondaries(env: &Env, colls: &'static [&'static str]) {
    env.fake.set_hook(move |body| {
        if !colls.iter().any(|c| is_read_on(body, c)) || level(body).as_deref() == Some("available")
        {
            return None;
        }
        let mode = body
            .get_document("$readPreference")
            .ok()
            .and_then(|d| d.get_str("mode").ok());
        if mode.is_none_or(|m| m == "primary") {
            return None;
        }
        Some(Hooked::error(
            13388,
            "StaleConfig",
            "secondary cannot refresh",
        ))
    });
}

/// `n` small documents `{_id: i, item: "item i"}`.
pub fn seed_docs(n: i32) -> Vec<RawDocumentBuf> {
    (0..n)
        .map(|i| rawdoc! { "_id": i, "item": format!("item {i}") })
        .collect()
}

/// A cursor reply with `docs` as the first batch (id 0) for `ns`.
pub fn cursor_reply(ns: &str, docs: &[RawDocumentBuf]) -> RawDocumentBuf {
    let mut batch = bson::RawArrayBuf::new();
    for d in docs {
        batch.push(d.clone());
    }
    rawdoc! { "cursor": { "firstBatch": batch, "id": 0_i64, "ns": ns }, "ok": 1.0 }
}

/// A secondary read the driver sent once with `maxTimeMS` 5000 (`original`, as it reached
/// the fake), then the proxy's `available` resend: the driver's read preference, the resend
/// with `available` and the rest of the budget, nothing else changed.
pub fn assert_available_resend(original: &RawDocument, resend: &RawDocument) {
    assert_eq!(
        original
            .get_document("$readPreference")
            .ok()
            .map(|d| d.to_owned()),
        Some(bson::rawdoc! { "mode": "secondary" })
    );
    assert_eq!(read_concern(resend), Some(available()));
    let budget = max_time_ms(resend).expect("maxTimeMS");
    assert!(budget > 0 && budget <= 5000 - 100, "budget {budget}");
    assert_eq!(
        without(original, &["readConcern", "maxTimeMS"]),
        without(resend, &["readConcern", "maxTimeMS"])
    );
}
