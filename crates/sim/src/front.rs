//! The sockets: one accept loop per listener (mongos, or one node), one task per connection.
//! Requests are answered in order, in the request's own format (OP_REPLY for OP_QUERY,
//! OP_MSG with a checksum if the request had one, compressed like the request except the
//! handshake); awaitable hello waits and, with `exhaustAllowed`, streams. Like mongos, a
//! connection reads its next request only once the previous one is answered: a request
//! sent behind an awaitable hello waits in the socket until the hello's reply has gone (and
//! behind an exhaust stream, for as long as the stream lasts).

use std::sync::Arc;
use std::time::Duration;

use bson::spec::BinarySubtype;
use bson::{doc, Binary, Document, RawDocumentBuf};
use bytes::{BufMut, Bytes, BytesMut};
use futures::StreamExt;
use tokio::io::AsyncWriteExt;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::codec::FramedRead;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use staleguard_wire::compressed::compress;
use staleguard_wire::opmsg::{CHECKSUM_PRESENT, EXHAUST_ALLOWED, MORE_TO_COME};
use staleguard_wire::reply::{op_msg, op_reply};
use staleguard_wire::{Header, MessageCodec, OpCode, DEFAULT_MAX_MESSAGE_SIZE, HEADER_LEN};

use super::auth::{self, ConnAuth};
use super::model::{lock, NodeId};
use super::request::Request;
use super::{commands, node, status, Cluster, SimError};

/// The least pause between two streamed hello replies (`maxAwaitTimeMS: 0` would spin).
const MIN_STREAM_PAUSE: Duration = Duration::from_millis(10);

/// Who answers on a listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Mongos,
    Node(NodeId),
}

pub async fn accept_loop(cluster: Arc<Cluster>, listener: TcpListener, role: Role) {
    loop {
        let accepted = tokio::select! {
            _ = cluster.stop.cancelled() => return,
            a = listener.accept() => a,
        };
        match accepted {
            Ok((stream, peer)) => {
                let _ = stream.set_nodelay(true);
                let id = cluster.connection_id();
                let span = tracing::debug_span!("sim_conn", role = ?role, client.addr = %peer, id);
                let conn = Conn::new(cluster.clone(), stream, role, id);
                cluster.tasks.spawn(conn.serve().instrument(span));
            }
            Err(e) => {
                // EMFILE and friends: back off instead of spinning; the loop survives.
                tracing::warn!(error = %e, "sim accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

struct Conn {
    cluster: Arc<Cluster>,
    role: Role,
    id: i32,
    frames: FramedRead<OwnedReadHalf, MessageCodec>,
    out: OwnedWriteHalf,
    auth: ConnAuth,
}

impl Conn {
    fn new(cluster: Arc<Cluster>, stream: TcpStream, role: Role, id: i32) -> Conn {
        let (rd, out) = stream.into_split();
        Conn {
            cluster,
            role,
            id,
            frames: FramedRead::new(rd, MessageCodec::new(DEFAULT_MAX_MESSAGE_SIZE)),
            out,
            auth: ConnAuth::default(),
        }
    }

    /// The token that closes this connection: shutdown, or its node restarting.
    fn closer(&self) -> CancellationToken {
        match self.role {
            Role::Mongos => self.cluster.stop.clone(),
            Role::Node(i) => lock(&self.cluster.state).nodes[i].incarnation.clone(),
        }
    }

    fn count_connection(&self, delta: i64) {
        if self.role == Role::Mongos {
            let mut st = lock(&self.cluster.state);
            let m = &mut st.mongos;
            m.connections = m.connections.saturating_add_signed(delta);
            if delta > 0 {
                m.connections_created += 1;
            }
        }
    }

    async fn serve(mut self) {
        let closer = self.closer();
        self.count_connection(1);
        loop {
            let msg = tokio::select! {
                _ = closer.cancelled() => break,
                m = self.next() => m,
            };
            let Some(msg) = msg else { break };
            let req = match Request::decode(msg, DEFAULT_MAX_MESSAGE_SIZE) {
                Ok(r) => r,
                Err(e) => {
                    tracing::debug!(error = %e, "closing sim connection");
                    break;
                }
            };
            let keep = tokio::select! {
                _ = closer.cancelled() => false,
                k = self.answer(&req) => k,
            };
            if !keep {
                break;
            }
        }
        self.count_connection(-1);
    }

    async fn next(&mut self) -> Option<Bytes> {
        match self.frames.next().await? {
            Ok(m) => Some(m),
            Err(e) => {
                tracing::debug!(error = %e, "bad frame from client");
                None
            }
        }
    }

    /// Answers one request; false when the connection must close.
    async fn answer(&mut self, req: &Request) -> bool {
        if matches!(req.name(), "hello" | "isMaster" | "ismaster") {
            return self.hello(req).await;
        }
        let name = req.name();
        let result = match (name, self.role) {
            ("saslStart", _) => match req.db() {
                Ok(db) => auth::start(&self.cluster, &mut self.auth, db, &req.body),
                Err(e) => Err(e),
            },
            ("saslContinue", _) => auth::continue_(&self.cluster, &mut self.auth, &req.body),
            _ if self.cluster.users.on()
                && !self.auth.authenticated()
                && auth::needs_auth(name) =>
            {
                Err(auth::unauthorized(name))
            }
            (_, Role::Mongos) => commands::run(&self.cluster, req).await,
            (_, Role::Node(i)) => node::run(&self.cluster, i, req).await,
        };
        if let Err(e) = &result {
            tracing::debug!(command = req.name(), code = e.code, error = %e.message, "sim command failed");
        }
        if req.flags & MORE_TO_COME != 0 {
            return true;
        }
        let body = self.finish(result);
        self.send(req, req.request_id, false, &body, true)
            .await
            .is_some()
    }

    /// The reply body with `operationTime` and `$clusterTime`, as drivers' sessions expect.
    fn finish(&self, result: Result<Document, SimError>) -> Document {
        let mut body = result.unwrap_or_else(|e| e.to_document());
        let now = lock(&self.cluster.state).clock.now();
        body.insert(
            "$clusterTime",
            doc! {
                "clusterTime": now,
                "signature": {
                    "hash": Binary { subtype: BinarySubtype::Generic, bytes: vec![0; 20] },
                    "keyId": 0_i64,
                },
            },
        );
        body.insert("operationTime", now);
        body
    }

    fn hello_body(&mut self, req: &Request) -> Document {
        let mut body = match self.role {
            Role::Mongos => status::mongos_hello(&self.cluster, &req.body, self.id),
            Role::Node(i) => status::node_hello(&self.cluster, i, &req.body, self.id),
        };
        body.extend(auth::hello_fields(&self.cluster, &mut self.auth, &req.body));
        self.finish(Ok(body))
    }

    fn process_id(&self) -> bson::oid::ObjectId {
        match self.role {
            Role::Mongos => self.cluster.process_id,
            Role::Node(i) => lock(&self.cluster.state).nodes[i].process_id,
        }
    }

    /// hello / isMaster; awaitable when it carries `topologyVersion` and `maxAwaitTimeMS`.
    async fn hello(&mut self, req: &Request) -> bool {
        let tv = req.body.get_document("topologyVersion").ok();
        let wait = req
            .body
            .get("maxAwaitTimeMS")
            .and_then(super::routing::number);
        let Some((tv, wait_ms)) = tv.zip(wait).filter(|(_, ms)| *ms >= 0.0) else {
            let body = self.hello_body(req);
            return self
                .send(req, req.request_id, false, &body, false)
                .await
                .is_some();
        };
        let every = Duration::from_millis(wait_ms as u64);
        let current = tv.get_object_id("processId").ok() == Some(self.process_id());
        let exhaust = req.flags & EXHAUST_ALLOWED != 0;
        // The topology never changes, so a current client waits the whole time; nothing is
        // read from the connection meanwhile (the caller's select ends the wait on shutdown).
        if current {
            tokio::time::sleep(every).await;
        }
        let mut response_to = req.request_id;
        loop {
            let body = self.hello_body(req);
            let Some(id) = self.send(req, response_to, exhaust, &body, false).await else {
                return false;
            };
            if !exhaust {
                return true;
            }
            // The stream goes on until the client closes; a write to a closed peer ends it.
            response_to = id;
            tokio::time::sleep(every.max(MIN_STREAM_PAUSE)).await;
        }
    }

    /// Writes one reply in the request's format; returns its requestID.
    async fn send(
        &mut self,
        req: &Request,
        response_to: i32,
        more: bool,
        body: &Document,
        compressible: bool,
    ) -> Option<i32> {
        let raw = RawDocumentBuf::try_from(body).ok()?;
        let id = self.cluster.request_id();
        let msg = if req.legacy {
            op_reply(id, response_to, &raw)
        } else {
            let mut flags = req.flags & CHECKSUM_PRESENT;
            if more {
                flags |= MORE_TO_COME;
            }
            op_msg(id, response_to, flags, &raw)
        };
        let msg = match (req.compressor, compressible) {
            (Some(c), true) => wrap_compressed(c, &msg).unwrap_or(msg),
            _ => msg,
        };
        self.out.write_all(&msg).await.ok()?;
        Some(id)
    }
}

/// Wraps a whole message in OP_COMPRESSED with compressor `id` (same header ids).
fn wrap_compressed(id: u8, msg: &[u8]) -> Option<Bytes> {
    let header = Header::parse(msg)?;
    let payload = msg.get(HEADER_LEN..)?;
    let data = compress(id, payload).ok()?;
    let len = HEADER_LEN + 9 + data.len();
    let mut out = BytesMut::with_capacity(len);
    Header {
        length: i32::try_from(len).ok()?,
        request_id: header.request_id,
        response_to: header.response_to,
        op_code: OpCode::COMPRESSED,
    }
    .put(&mut out);
    out.put_i32_le(header.op_code);
    out.put_i32_le(i32::try_from(payload.len()).ok()?);
    out.put_u8(id);
    out.put_slice(&data);
    Some(out.freeze())
}
