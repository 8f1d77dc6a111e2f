//! The fast fake mongos (role `upstream`): canned replies, `hello`, StaleConfig for the first
//! few finds on one namespace, and counters that the harness reads with `{benchStats: 1}`.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;

use bson::{rawdoc, RawDocument};
use bytes::BytesMut;
use staleguard::wire::legacy::OpQuery;
use staleguard::wire::opmsg::{OpMsg, MORE_TO_COME};
use staleguard::wire::{reply, Header, MessageCodec, OpCode, DEFAULT_MAX_MESSAGE_SIZE, HEADER_LEN};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::codec::Decoder;

use crate::msgs;

/// `--stale-ns db.coll --stale-first N`: answer StaleConfig to the first N finds on db.coll
/// that do not carry `readConcern: {level: "available"}`. `--reply-bytes N`: answer every
/// other `find` with about N bytes of documents (0: the one-document reply); `--reply-docs
/// N`: with N small documents instead.
#[derive(Debug, Clone, Default)]
pub struct Opts {
    pub stale_ns: Option<(String, String)>,
    pub stale_first: i64,
    pub reply_bytes: usize,
    pub reply_docs: usize,
}

impl Opts {
    pub fn parse(args: &[String]) -> Opts {
        let mut o = Opts::default();
        let mut it = args.iter();
        while let Some(a) = it.next() {
            match a.as_str() {
                "--stale-ns" => {
                    o.stale_ns = it
                        .next()
                        .and_then(|ns| ns.split_once('.'))
                        .map(|(d, c)| (d.to_string(), c.to_string()))
                }
                "--stale-first" => {
                    o.stale_first = it.next().and_then(|n| n.parse().ok()).unwrap_or(0)
                }
                "--reply-bytes" => {
                    o.reply_bytes = it.next().and_then(|n| n.parse().ok()).unwrap_or(0)
                }
                "--reply-docs" => {
                    o.reply_docs = it.next().and_then(|n| n.parse().ok()).unwrap_or(0)
                }
                _ => {}
            }
        }
        o
    }
}

#[derive(Default)]
struct Stats {
    connections: AtomicI64,
    requests: AtomicU64,
    /// Finds on the stale namespace, and those of them carrying readConcern available.
    stale_ns_finds: AtomicU64,
    stale_ns_available: AtomicU64,
    stale_sent: AtomicU64,
}

struct Canned {
    find: Vec<u8>,
    stale: Vec<u8>,
    ok: Vec<u8>,
}

struct State {
    opts: Opts,
    stale_left: AtomicI64,
    stats: Stats,
    canned: Canned,
}

pub fn run(args: &[String]) {
    let opts = Opts::parse(args);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async move {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        crate::procs::announce(listener.local_addr().expect("addr"));
        let find = msgs::find_reply_for(opts.reply_bytes, opts.reply_docs);
        let state = Arc::new(State {
            stale_left: AtomicI64::new(opts.stale_first),
            opts,
            stats: Stats::default(),
            canned: Canned {
                find: reply::op_msg(0, 0, 0, &find).to_vec(),
                stale: reply::op_msg(0, 0, 0, &msgs::stale_config_body()).to_vec(),
                ok: reply::op_msg(0, 0, 0, &rawdoc! { "ok": 1.0 }).to_vec(),
            },
        });
        let mut next_id = 1_i32;
        loop {
            match listener.accept().await {
                Ok((sock, _)) => {
                    let _ = sock.set_nodelay(true);
                    tokio::spawn(serve(sock, state.clone(), next_id));
                    next_id = next_id.wrapping_add(1);
                }
                // EMFILE while the memory phase opens 10,000 connections: wait a little.
                Err(_) => tokio::time::sleep(std::time::Duration::from_millis(10)).await,
            }
        }
    });
}

async fn serve(mut sock: TcpStream, state: Arc<State>, conn_id: i32) {
    state.stats.connections.fetch_add(1, Ordering::Relaxed);
    let mut codec = MessageCodec::new(DEFAULT_MAX_MESSAGE_SIZE);
    let mut buf = BytesMut::with_capacity(4096);
    let mut out = Vec::with_capacity(1024.max(state.canned.find.len()));
    let mut reply_id = 1_i32;
    'conn: loop {
        loop {
            match codec.decode(&mut buf) {
                Ok(Some(frame)) => {
                    reply_id = reply_id.wrapping_add(1);
                    answer(&state, &frame, conn_id, reply_id, &mut out);
                }
                Ok(None) => break,
                Err(_) => break 'conn,
            }
        }
        if !out.is_empty() {
            if sock.write_all(&out).await.is_err() {
                break;
            }
            out.clear();
        }
        match sock.read_buf(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
    }
    state.stats.connections.fetch_sub(1, Ordering::Relaxed);
}

/// Appends `msg` to `out` with its requestID and responseTo set.
fn put(out: &mut Vec<u8>, msg: &[u8], request_id: i32, response_to: i32) {
    let at = out.len();
    out.extend_from_slice(msg);
    out[at + 4..at + 8].copy_from_slice(&request_id.to_le_bytes());
    out[at + 8..at + 12].copy_from_slice(&response_to.to_le_bytes());
}

fn answer(state: &State, frame: &[u8], conn_id: i32, reply_id: i32, out: &mut Vec<u8>) {
    let Some(h) = Header::parse(frame) else {
        return;
    };
    state.stats.requests.fetch_add(1, Ordering::Relaxed);
    let payload = &frame[HEADER_LEN..];
    match h.op() {
        OpCode::Query => {
            if OpQuery::parse(payload).is_ok() {
                let hello = reply::op_reply(reply_id, h.request_id, &msgs::hello_body(conn_id));
                out.extend_from_slice(&hello);
            }
        }
        OpCode::Msg => {
            let Ok(m) = OpMsg::parse(payload) else {
                return;
            };
            if m.flags & MORE_TO_COME != 0 {
                return;
            }
            let canned = command_reply(state, m.body, conn_id);
            match canned {
                Reply::Canned(bytes) => put(out, bytes, reply_id, h.request_id),
                Reply::Built(doc) => {
                    out.extend_from_slice(&reply::op_msg(reply_id, h.request_id, 0, &doc))
                }
            }
        }
        _ => put(out, &state.canned.ok, reply_id, h.request_id),
    }
}

enum Reply<'s> {
    Canned(&'s [u8]),
    Built(bson::RawDocumentBuf),
}

fn command_reply<'s>(state: &'s State, body: &RawDocument, conn_id: i32) -> Reply<'s> {
    let bytes = body.as_bytes();
    match msgs::first_key(bytes) {
        b"find" => {
            if let Some((db, coll)) = &state.opts.stale_ns {
                let on_ns = body.get_str("find").is_ok_and(|c| c == coll)
                    && body.get_str("$db").is_ok_and(|d| d == db);
                if on_ns {
                    state.stats.stale_ns_finds.fetch_add(1, Ordering::Relaxed);
                    if msgs::contains(bytes, msgs::LEVEL_AVAILABLE) {
                        state
                            .stats
                            .stale_ns_available
                            .fetch_add(1, Ordering::Relaxed);
                    } else if state.stale_left.fetch_sub(1, Ordering::Relaxed) > 0 {
                        state.stats.stale_sent.fetch_add(1, Ordering::Relaxed);
                        return Reply::Canned(&state.canned.stale);
                    }
                }
            }
            Reply::Canned(&state.canned.find)
        }
        b"hello" | b"isMaster" | b"ismaster" => Reply::Built(msgs::hello_body(conn_id)),
        b"benchStats" => {
            let s = &state.stats;
            Reply::Built(rawdoc! {
                "connections": s.connections.load(Ordering::Relaxed),
                "requests": s.requests.load(Ordering::Relaxed) as i64,
                "staleNsFinds": s.stale_ns_finds.load(Ordering::Relaxed) as i64,
                "staleNsAvailable": s.stale_ns_available.load(Ordering::Relaxed) as i64,
                "staleSent": s.stale_sent.load(Ordering::Relaxed) as i64,
                "ok": 1.0,
            })
        }
        _ => Reply::Canned(&state.canned.ok),
    }
}
