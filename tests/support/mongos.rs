//! A fake mongos on `127.0.0.1:0`, built on staleguard's own wire layer.
//!
//! It answers what the official drivers send to a real mongos (handshake, streaming
//! monitoring, a small in-memory CRUD subset, exhaust getMore, compression, checksums,
//! fire-and-forget writes) and records every raw message in both directions, so tests can
//! prove what crossed the proxy byte for byte.
//!
//! Layout: this file owns sockets and recording; `request` turns raw bytes into a
//! [`Request`]; `commands` turns a request into a [`Plan`] (what to answer) using the store.

mod commands;
mod request;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicI32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bson::oid::ObjectId;
use bson::{RawDocument, RawDocumentBuf};
use bytes::{BufMut, Bytes, BytesMut};
use futures::StreamExt;
use staleguard::wire::compressed::compress;
use staleguard::wire::opmsg::{CHECKSUM_PRESENT, MORE_TO_COME};
use staleguard::wire::reply::{error_body, op_msg, op_reply};
use staleguard::wire::{Header, MessageCodec, OpCode, HEADER_LEN};
use tokio::io::AsyncWriteExt;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;
use tokio::task::{JoinHandle, JoinSet};
use tokio_util::codec::FramedRead;

use commands::{Plan, Store};
use request::Request;

/// mongos's `maxMessageSizeBytes`; also the fake's frame limit.
pub const MAX_MESSAGE_SIZE: usize = 48_000_000;

/// A scripted answer: what a hook wants done with a command instead of normal handling.
#[derive(Debug, Clone)]
pub struct Hooked {
    action: Action,
    delay: Duration,
}

#[derive(Debug, Clone)]
enum Action {
    Reply(RawDocumentBuf),
    /// A reply naming another request in `responseTo` (a broken or hostile upstream).
    ReplyTo(RawDocumentBuf, i32),
    Normal,
    Close,
}

impl Hooked {
    /// Answer with `body` (e.g. an error document).
    pub fn reply(body: RawDocumentBuf) -> Hooked {
        Hooked {
            action: Action::Reply(body),
            delay: Duration::ZERO,
        }
    }

    /// Answer `{ok: 0, errmsg, code, codeName}`.
    pub fn error(code: i32, code_name: &str, errmsg: &str) -> Hooked {
        Hooked::reply(error_body(code, code_name, errmsg))
    }

    /// Answer with `body`, but with `responseTo` set to `response_to` instead of the
    /// request's id: a reply that names another request.
    pub fn reply_to(body: RawDocumentBuf, response_to: i32) -> Hooked {
        Hooked {
            action: Action::ReplyTo(body, response_to),
            delay: Duration::ZERO,
        }
    }

    /// Close the connection without answering, as a crashing mongos would.
    pub fn close() -> Hooked {
        Hooked {
            action: Action::Close,
            delay: Duration::ZERO,
        }
    }

    /// Handle the command normally, but only after `delay`.
    pub fn delay(delay: Duration) -> Hooked {
        Hooked {
            action: Action::Normal,
            delay,
        }
    }

    /// Wait `delay` before acting.
    pub fn after(mut self, delay: Duration) -> Hooked {
        self.delay = delay;
        self
    }
}

type Hook = dyn Fn(&RawDocument) -> Option<Hooked> + Send + Sync;

/// Everything recorded so far, in arrival order across all connections.
#[derive(Debug, Default, Clone)]
pub struct Log {
    /// Every raw message received, exactly as it arrived (compressed ones still compressed).
    pub received: Vec<Bytes>,
    /// Every raw message sent, exactly as written.
    pub sent: Vec<Bytes>,
    /// Command name and decoded (decompressed) body of every OP_MSG and OP_QUERY received.
    pub commands: Vec<(String, RawDocumentBuf)>,
}

struct State {
    log: Mutex<Log>,
    /// Woken whenever the log changes.
    changed: Notify,
    store: Mutex<Store>,
    hook: Mutex<Option<Arc<Hook>>>,
    await_cap: Mutex<Option<Duration>>,
    connections: AtomicUsize,
    next_request_id: AtomicI32,
    process_id: ObjectId,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A test that panicked while holding the lock has already failed; keep the data usable.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl State {
    fn next_request_id(&self) -> i32 {
        self.next_request_id.fetch_add(1, Ordering::Relaxed)
    }

    fn record(&self, f: impl FnOnce(&mut Log)) {
        f(&mut lock(&self.log));
        self.changed.notify_waiters();
    }

    fn hook(&self) -> Option<Arc<Hook>> {
        lock(&self.hook).clone()
    }

    fn await_cap(&self) -> Option<Duration> {
        *lock(&self.await_cap)
    }
}

/// The fake mongos. Dropping it stops the listener and closes every connection.
pub struct FakeMongos {
    addr: SocketAddr,
    state: Arc<State>,
    accept: JoinHandle<()>,
}

impl FakeMongos {
    /// Binds `127.0.0.1:0` and starts accepting.
    pub async fn start() -> FakeMongos {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind fake mongos");
        let addr = listener.local_addr().expect("fake mongos address");
        let state = Arc::new(State {
            log: Mutex::default(),
            changed: Notify::new(),
            store: Mutex::default(),
            hook: Mutex::default(),
            await_cap: Mutex::default(),
            connections: AtomicUsize::new(0),
            next_request_id: AtomicI32::new(1_000_000),
            process_id: ObjectId::new(),
        });
        let accept = tokio::spawn(accept_loop(listener, state.clone()));
        FakeMongos {
            addr,
            state,
            accept,
        }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Every raw message received, in order, across connections.
    pub fn received(&self) -> Vec<Bytes> {
        lock(&self.state.log).received.clone()
    }

    /// Every raw reply sent, in order, across connections.
    pub fn sent(&self) -> Vec<Bytes> {
        lock(&self.state.log).sent.clone()
    }

    /// Command name and decoded body of every command received, in order.
    pub fn received_commands(&self) -> Vec<(String, RawDocumentBuf)> {
        lock(&self.state.log).commands.clone()
    }

    /// A snapshot of everything recorded.
    pub fn log(&self) -> Log {
        lock(&self.state.log).clone()
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> usize {
        self.state.connections.load(Ordering::Relaxed)
    }

    /// Scripts replies: `f` sees every command body; `Some` overrides the normal handling.
    pub fn set_hook(&self, f: impl Fn(&RawDocument) -> Option<Hooked> + Send + Sync + 'static) {
        *lock(&self.state.hook) = Some(Arc::new(f));
    }

    pub fn clear_hook(&self) {
        *lock(&self.state.hook) = None;
    }

    /// Caps how long an awaitable hello waits (and the streaming interval), so tests can
    /// watch monitoring without waiting for the driver's `heartbeatFrequencyMS`.
    pub fn set_await_cap(&self, cap: Duration) {
        *lock(&self.state.await_cap) = Some(cap);
    }

    /// The documents stored for `ns` (`db.coll`), in insertion order.
    pub fn documents(&self, ns: &str) -> Vec<RawDocumentBuf> {
        lock(&self.state.store).documents(ns)
    }

    /// Makes `ns` a view on the collection `source` of the same database (what
    /// `listCollections` says of it).
    pub fn view(&self, ns: &str, source: &str) {
        lock(&self.state.store).view(ns, source);
    }

    /// Stores `docs` under `ns` as if they had been inserted.
    pub fn seed(&self, ns: &str, docs: impl IntoIterator<Item = RawDocumentBuf>) {
        lock(&self.state.store).seed(ns, docs);
    }

    /// Waits until `pred` holds for the log (woken on every change; fails after
    /// [`super::STEP`]).
    pub async fn wait_for(&self, what: &str, pred: impl Fn(&Log) -> bool) {
        super::within(what, async {
            loop {
                let changed = self.state.changed.notified();
                tokio::pin!(changed);
                changed.as_mut().enable();
                if pred(&lock(&self.state.log)) {
                    return;
                }
                changed.await;
            }
        })
        .await
    }
}

impl Drop for FakeMongos {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

async fn accept_loop(listener: TcpListener, state: Arc<State>) {
    // The connection tasks live in this set, so aborting the loop closes them all.
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                let _ = stream.set_nodelay(true);
                let id = state.connections.fetch_add(1, Ordering::Relaxed) as i32 + 1;
                conns.spawn(Conn::new(state.clone(), stream, id).serve());
            }
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
}

/// One accepted connection: requests are answered in order, as mongos does.
struct Conn {
    state: Arc<State>,
    id: i32,
    frames: FramedRead<OwnedReadHalf, MessageCodec>,
    out: OwnedWriteHalf,
    /// A message that arrived while the connection was waiting or streaming.
    pending: Option<Bytes>,
}

impl Conn {
    fn new(state: Arc<State>, stream: TcpStream, id: i32) -> Conn {
        let (rd, out) = stream.into_split();
        Conn {
            state,
            id,
            frames: FramedRead::new(rd, MessageCodec::new(MAX_MESSAGE_SIZE)),
            out,
            pending: None,
        }
    }

    async fn serve(mut self) {
        while let Some(raw) = self.next().await {
            self.state.record(|log| log.received.push(raw.clone()));
            // Malformed messages and checksum mismatches are connection-fatal on mongos.
            let Ok(req) = Request::decode(&raw, MAX_MESSAGE_SIZE) else {
                return;
            };
            self.state.record(|log| {
                log.commands
                    .push((req.command_name().to_string(), req.body.clone()))
            });
            if !self.answer(&req).await {
                return;
            }
        }
    }

    async fn next(&mut self) -> Option<Bytes> {
        match self.pending.take() {
            Some(msg) => Some(msg),
            None => self.frames.next().await?.ok(),
        }
    }

    /// Waits `d`, or less if the client sends something first. False if the client left.
    async fn pause(&mut self, d: Duration) -> bool {
        if self.pending.is_some() {
            return true;
        }
        tokio::select! {
            _ = tokio::time::sleep(d) => true,
            frame = self.frames.next() => match frame {
                Some(Ok(msg)) => {
                    self.pending = Some(msg);
                    true
                }
                _ => false,
            },
        }
    }

    /// Answers one request; false when the connection must close.
    async fn answer(&mut self, req: &Request) -> bool {
        let hooked = self.state.hook().and_then(|hook| hook(&req.body));
        let action = match hooked {
            Some(h) => {
                if !h.delay.is_zero() {
                    tokio::time::sleep(h.delay).await;
                }
                h.action
            }
            None => Action::Normal,
        };
        let plan = match action {
            Action::Close => return false,
            Action::ReplyTo(body, response_to) => {
                return self.send(req, response_to, false, &body).await;
            }
            Action::Reply(body) => Plan::One(body),
            Action::Normal => commands::plan(&self.state, req, self.id),
        };
        if req.flags & MORE_TO_COME != 0 {
            // Fire-and-forget (w:0): the work is done, nothing is answered.
            return true;
        }
        match plan {
            Plan::One(body) => self.send(req, req.header.request_id, false, &body).await,
            Plan::Exhaust(bodies) => self.exhaust(req, bodies).await,
            Plan::AwaitHello {
                first,
                every,
                exhaust,
            } => self.await_hello(req, first, every, exhaust).await,
        }
    }

    /// Sends every body, each answering the previous reply, all but the last with moreToCome.
    async fn exhaust(&mut self, req: &Request, bodies: Vec<RawDocumentBuf>) -> bool {
        let mut response_to = req.header.request_id;
        let last = bodies.len().saturating_sub(1);
        for (i, body) in bodies.iter().enumerate() {
            match self.send_msg(req, response_to, i < last, body).await {
                Some(id) => response_to = id,
                None => return false,
            }
        }
        true
    }

    /// An awaitable hello: answer after `first`; with exhaust, keep streaming a fresh hello
    /// every `every` until the client closes (or, against the rules, sends something).
    async fn await_hello(
        &mut self,
        req: &Request,
        first: Duration,
        every: Duration,
        exhaust: bool,
    ) -> bool {
        if !self.pause(first).await {
            return false;
        }
        let mut response_to = req.header.request_id;
        loop {
            let body = commands::hello_body(&self.state, &req.body, self.id);
            let Some(id) = self.send_msg(req, response_to, exhaust, &body).await else {
                return false;
            };
            if !exhaust || self.pending.is_some() {
                return true;
            }
            response_to = id;
            if !self.pause(every).await {
                return false;
            }
        }
    }

    async fn send(
        &mut self,
        req: &Request,
        response_to: i32,
        more: bool,
        body: &RawDocument,
    ) -> bool {
        self.send_msg(req, response_to, more, body).await.is_some()
    }

    /// Builds the reply in the request's format (OP_REPLY for OP_QUERY, OP_MSG with a
    /// checksum if the request had one, compressed like the request), records it and writes
    /// it. Returns its requestID.
    async fn send_msg(
        &mut self,
        req: &Request,
        response_to: i32,
        more: bool,
        body: &RawDocument,
    ) -> Option<i32> {
        let id = self.state.next_request_id();
        let msg = if req.legacy {
            op_reply(id, response_to, body)
        } else {
            let mut flags = req.flags & CHECKSUM_PRESENT;
            if more {
                flags |= MORE_TO_COME;
            }
            op_msg(id, response_to, flags, body)
        };
        let msg = match req.compressor {
            Some(c) => wrap_compressed(c, &msg),
            None => msg,
        };
        // Recorded before writing, so a client that has the reply always finds it here.
        self.state.record(|log| log.sent.push(msg.clone()));
        self.out.write_all(&msg).await.ok()?;
        Some(id)
    }
}

/// Known messages for the byte-for-byte tests (requests 100-107, one at a time): a legacy
/// isMaster, a hello, an insert of 50 documents as a document sequence, a find with a
/// checksum, three compressed ones (snappy, zlib, zstd) and a command mongos does not know.
/// Reply 4 (the count) says `n: 50`, reply 7 is error 59.
fn known_messages() -> Vec<Bytes> {
    let docs: Vec<RawDocumentBuf> = (0..50)
        .map(|i| bson::rawdoc! { "_id": i, "v": format!("value {i}") })
        .collect();
    let msg = |id: i32, flags: u32, body: &RawDocument| super::raw::msg(id, flags, body);
    vec![
        super::raw::query(100, "admin.$cmd", &bson::rawdoc! { "isMaster": 1 }),
        msg(
            101,
            0,
            &bson::rawdoc! { "hello": 1, "helloOk": true, "$db": "admin" },
        ),
        super::raw::msg_with_sequence(
            102,
            0,
            &bson::rawdoc! { "insert": "b4b", "$db": "app" },
            "documents",
            &docs,
        ),
        msg(
            103,
            CHECKSUM_PRESENT,
            &bson::rawdoc! { "find": "b4b", "batchSize": 10, "$db": "app" },
        ),
        wrap_compressed(
            3,
            &msg(104, 0, &bson::rawdoc! { "count": "b4b", "$db": "app" }),
        ),
        wrap_compressed(
            1,
            &msg(
                105,
                0,
                &bson::rawdoc! { "find": "b4b", "filter": { "_id": 7 }, "$db": "app" },
            ),
        ),
        wrap_compressed(
            2,
            &msg(106, 0, &bson::rawdoc! { "ping": 1, "$db": "admin" }),
        ),
        msg(
            107,
            0,
            &bson::rawdoc! { "noSuchCommand": 1, "$db": "admin" },
        ),
    ]
}

/// Sends [`known_messages`] over `conn` (to a proxy in front of `fake`), one at a time, and
/// checks that `fake` got exactly those bytes and the client exactly the bytes `fake` sent,
/// each reply answering its request.
pub async fn known_round_trips(conn: &mut super::raw::RawClient, fake: &FakeMongos) {
    let messages = known_messages();
    let mut replies = Vec::new();
    for m in &messages {
        let reply = conn.roundtrip(m).await;
        let (got, asked) = (super::raw::header(&reply), super::raw::header(m));
        assert_eq!(got.response_to, asked.request_id);
        replies.push(reply);
    }
    assert_eq!(fake.received(), messages, "client → mongos");
    assert_eq!(fake.sent(), replies, "mongos → client");
    assert_eq!(super::raw::body(&replies[4]).get_i32("n").ok(), Some(50));
    assert_eq!(super::raw::body(&replies[7]).get_i32("code").ok(), Some(59));
}

/// Wraps a whole message in OP_COMPRESSED with compressor `id` (same requestID/responseTo).
pub fn wrap_compressed(id: u8, msg: &[u8]) -> Bytes {
    let header = Header::parse(msg).expect("a whole message");
    let payload = &msg[HEADER_LEN..];
    let data = compress(id, payload).expect("compress");
    let len = HEADER_LEN + 9 + data.len();
    let mut out = BytesMut::with_capacity(len);
    Header {
        length: len as i32,
        request_id: header.request_id,
        response_to: header.response_to,
        op_code: OpCode::COMPRESSED,
    }
    .put(&mut out);
    out.put_i32_le(header.op_code);
    out.put_i32_le(payload.len() as i32);
    out.put_u8(id);
    out.put_slice(&data);
    out.freeze()
}
