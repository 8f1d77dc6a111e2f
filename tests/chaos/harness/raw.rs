//! Raw wire connections for the attackers: exact messages out, whole frames in, SCRAM by
//! hand when a behaviour authenticates. Nothing here panics on what the peer does: a closed
//! or silent connection is a `None`, and the attacker carries on.

use std::net::SocketAddr;
use std::time::Duration;

use bson::spec::BinarySubtype;
use bson::{doc, Binary, Bson, Document, RawDocumentBuf};
use bytes::Bytes;
use futures::StreamExt;
use staleguard::sim::scram;
use staleguard::wire::opmsg::OpMsg;
use staleguard::wire::reply::op_msg;
use staleguard::wire::{Header, MessageCodec, HEADER_LEN};
use tokio::io::AsyncWriteExt;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio_util::codec::FramedRead;

use super::bed::{PASSWORD, USER};

const MAX_MESSAGE: usize = 48_000_000;

pub struct Conn {
    frames: FramedRead<OwnedReadHalf, MessageCodec>,
    out: OwnedWriteHalf,
    next_id: i32,
}

/// An OP_MSG request with `body`.
pub fn message(id: i32, flags: u32, body: &Document) -> Bytes {
    match RawDocumentBuf::try_from(body) {
        Ok(raw) => op_msg(id, 0, flags, &raw),
        Err(_) => Bytes::new(),
    }
}

/// The body of a reply (OP_MSG), if it is one.
pub fn body(msg: &[u8]) -> Option<Document> {
    let header = Header::parse(msg)?;
    if header.op_code != 2013 {
        return None;
    }
    let m = OpMsg::parse(msg.get(HEADER_LEN..)?).ok()?;
    Document::try_from(m.body).ok()
}

/// The `responseTo` of a reply.
pub fn response_to(msg: &[u8]) -> Option<i32> {
    Header::parse(msg).map(|h| h.response_to)
}

/// The error code of a reply; 0 for `ok: 1`.
pub fn code(reply: &Document) -> i32 {
    if reply.get_f64("ok").ok() == Some(1.0) {
        0
    } else {
        reply.get_i32("code").unwrap_or(-1)
    }
}

impl Conn {
    pub async fn connect(addr: SocketAddr) -> Option<Conn> {
        let stream = tokio::time::timeout(Duration::from_secs(5), TcpStream::connect(addr))
            .await
            .ok()?
            .ok()?;
        let _ = stream.set_nodelay(true);
        let (rd, out) = stream.into_split();
        Some(Conn {
            frames: FramedRead::new(rd, MessageCodec::new(MAX_MESSAGE)),
            out,
            next_id: 1,
        })
    }

    pub fn id(&mut self) -> i32 {
        self.next_id = self.next_id.wrapping_add(1).max(1);
        self.next_id
    }

    pub async fn send(&mut self, bytes: &[u8]) -> Option<()> {
        tokio::time::timeout(Duration::from_secs(10), self.out.write_all(bytes))
            .await
            .ok()?
            .ok()
    }

    /// The next whole message within `wait`; `None` on close, error or silence.
    pub async fn recv(&mut self, wait: Duration) -> Option<Bytes> {
        tokio::time::timeout(wait, self.frames.next())
            .await
            .ok()??
            .ok()
    }

    /// Sends `body` and returns the reply's body.
    pub async fn command(&mut self, body: Document, wait: Duration) -> Option<Document> {
        let id = self.id();
        self.send(&message(id, 0, &body)).await?;
        let reply = self.recv(wait).await?;
        self::body(&reply)
    }

    /// The handshake a driver sends first (`hello` on `admin`); its reply.
    pub async fn hello(&mut self) -> Option<Document> {
        self.command(
            doc! { "hello": 1, "client": { "application": { "name": "chaos" } }, "$db": "admin" },
            Duration::from_secs(5),
        )
        .await
    }

    /// SCRAM-SHA-256 as the harness's user, speculatively in a hello or by `saslStart`.
    pub async fn authenticate(&mut self, speculative: bool, nonce: &str) -> bool {
        let mut client = scram::Client::new(USER, PASSWORD, nonce);
        let first = bin(client.first());
        let options = doc! { "skipEmptyExchange": true };
        let wait = Duration::from_secs(5);
        let started = if speculative {
            let hello = self
                .command(
                    doc! {
                        "hello": 1, "$db": "admin",
                        "speculativeAuthenticate": {
                            "saslStart": 1, "mechanism": "SCRAM-SHA-256", "payload": first,
                            "options": options, "db": "admin",
                        },
                    },
                    wait,
                )
                .await;
            hello.and_then(|h| h.get_document("speculativeAuthenticate").ok().cloned())
        } else {
            self.command(
                doc! {
                    "saslStart": 1, "mechanism": "SCRAM-SHA-256", "payload": first,
                    "options": options, "$db": "admin",
                },
                wait,
            )
            .await
        };
        let Some(server_first) = started.as_ref().and_then(payload) else {
            return false;
        };
        let Ok(last) = client.last(&server_first) else {
            return false;
        };
        let done = self
            .command(
                doc! { "saslContinue": 1, "conversationId": 1, "payload": bin(last), "$db": "admin" },
                wait,
            )
            .await;
        done.is_some_and(|d| d.get_bool("done").ok() == Some(true) && code(&d) == 0)
    }
}

fn bin(bytes: Vec<u8>) -> Binary {
    Binary {
        subtype: BinarySubtype::Generic,
        bytes,
    }
}

fn payload(reply: &Document) -> Option<Vec<u8>> {
    match reply.get("payload") {
        Some(Bson::Binary(b)) => Some(b.bytes.clone()),
        _ => None,
    }
}
