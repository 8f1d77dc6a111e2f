//! The mongos front at the byte level: legacy OP_QUERY handshakes, fire-and-forget
//! requests, checksums, streaming hello, malformed messages.

use std::time::Duration;

use bson::{rawdoc, Document, RawDocumentBuf};
use bytes::{BufMut, Bytes, BytesMut};
use futures::StreamExt;
use staleguard::wire::legacy::OpReply;
use staleguard::wire::opmsg::{
    verify_checksum, OpMsg, CHECKSUM_PRESENT, EXHAUST_ALLOWED, MORE_TO_COME,
};
use staleguard::wire::reply::op_msg;
use staleguard::wire::{Header, MessageCodec, OpCode, DEFAULT_MAX_MESSAGE_SIZE, HEADER_LEN};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio_util::codec::FramedRead;

use super::{config, start};

pub(super) struct Raw {
    rd: FramedRead<tokio::net::tcp::OwnedReadHalf, MessageCodec>,
    wr: tokio::net::tcp::OwnedWriteHalf,
}

impl Raw {
    pub(super) async fn connect(addr: std::net::SocketAddr) -> Raw {
        let (rd, wr) = TcpStream::connect(addr)
            .await
            .expect("connect")
            .into_split();
        Raw {
            rd: FramedRead::new(rd, MessageCodec::new(DEFAULT_MAX_MESSAGE_SIZE)),
            wr,
        }
    }

    pub(super) async fn send(&mut self, msg: &[u8]) {
        self.wr.write_all(msg).await.expect("send");
    }

    /// The next message, or `None` if the server closed the connection.
    pub(super) async fn recv(&mut self) -> Option<Bytes> {
        tokio::time::timeout(Duration::from_secs(5), self.rd.next())
            .await
            .expect("a reply within 5 s")
            .and_then(Result::ok)
    }
}

pub(super) fn body_of(msg: &[u8]) -> (Header, u32, Document) {
    let header = Header::parse(msg).expect("header");
    assert_eq!(header.op_code, OpCode::MSG);
    let m = OpMsg::parse(&msg[HEADER_LEN..]).expect("op_msg");
    (header, m.flags, Document::try_from(m.body).expect("bson"))
}

fn op_query(request_id: i32, query: &RawDocumentBuf) -> Bytes {
    let mut p = BytesMut::new();
    p.put_i32_le(0);
    p.put_slice(b"admin.$cmd\0");
    p.put_i32_le(0);
    p.put_i32_le(-1);
    p.put_slice(query.as_bytes());
    let mut out = BytesMut::new();
    Header {
        length: (HEADER_LEN + p.len()) as i32,
        request_id,
        response_to: 0,
        op_code: OpCode::QUERY,
    }
    .put(&mut out);
    out.put_slice(&p);
    out.freeze()
}

#[tokio::test]
async fn legacy_is_master_is_answered_with_op_reply() {
    let sim = start(config()).await;
    let mut c = Raw::connect(sim.addr()).await;
    c.send(&op_query(7, &rawdoc! { "isMaster": 1, "helloOk": true }))
        .await;
    let reply = c.recv().await.expect("reply");
    let header = Header::parse(&reply).expect("header");
    assert_eq!((header.op_code, header.response_to), (OpCode::REPLY, 7));
    let r = OpReply::parse(&reply[HEADER_LEN..]).expect("op_reply");
    let doc = Document::try_from(r.first.expect("document")).expect("bson");
    assert_eq!(doc.get_bool("ismaster").ok(), Some(true));
    assert_eq!(doc.get_str("msg").ok(), Some("isdbgrid"));
    assert_eq!(doc.get_i32("maxWireVersion").ok(), Some(9));
    assert_eq!(doc.get_bool("helloOk").ok(), Some(true));
    sim.shutdown().await;
}

#[tokio::test]
async fn more_to_come_write_gets_no_reply_and_checksums_are_echoed() {
    let sim = start(config()).await;
    let mut c = Raw::connect(sim.addr()).await;
    let insert = rawdoc! { "insert": "w0", "documents": [{ "_id": 1 }], "writeConcern": { "w": 0 }, "$db": "t" };
    c.send(&op_msg(1, 0, MORE_TO_COME, &insert)).await;
    c.send(&op_msg(
        2,
        0,
        CHECKSUM_PRESENT,
        &rawdoc! { "count": "w0", "$db": "t" },
    ))
    .await;
    let reply = c.recv().await.expect("reply");
    verify_checksum(&reply).expect("valid checksum");
    let (header, flags, doc) = body_of(&reply);
    assert_eq!(
        header.response_to, 2,
        "the fire-and-forget insert got no reply"
    );
    assert_ne!(flags & CHECKSUM_PRESENT, 0);
    assert_eq!(doc.get_i32("n").ok(), Some(1));
    sim.shutdown().await;
}

#[tokio::test]
async fn awaitable_hello_streams_with_more_to_come() {
    let sim = start(config()).await;
    let mut c = Raw::connect(sim.addr()).await;
    c.send(&op_msg(1, 0, 0, &rawdoc! { "hello": 1, "$db": "admin" }))
        .await;
    let (_, _, first) = body_of(&c.recv().await.expect("hello"));
    let tv = first
        .get_document("topologyVersion")
        .expect("topologyVersion")
        .clone();
    let tv = RawDocumentBuf::try_from(&tv).expect("raw");
    let awaitable =
        rawdoc! { "hello": 1, "topologyVersion": tv, "maxAwaitTimeMS": 50_i64, "$db": "admin" };
    c.send(&op_msg(2, 0, EXHAUST_ALLOWED, &awaitable)).await;
    let mut expect_response_to = 2;
    for _ in 0..3 {
        let reply = c.recv().await.expect("streamed hello");
        let (header, flags, doc) = body_of(&reply);
        assert_eq!(
            header.response_to, expect_response_to,
            "each reply answers the previous one"
        );
        assert_ne!(flags & MORE_TO_COME, 0);
        assert_eq!(doc.get_bool("isWritablePrimary").ok(), Some(true));
        expect_response_to = header.request_id;
    }
    sim.shutdown().await;
}

#[tokio::test]
async fn malformed_message_closes_only_its_connection() {
    let sim = start(config()).await;
    let mut bad = Raw::connect(sim.addr()).await;
    let mut good = Raw::connect(sim.addr()).await;
    // An OP_MSG whose only section has an unknown kind.
    let mut msg = BytesMut::new();
    Header {
        length: 22,
        request_id: 1,
        response_to: 0,
        op_code: OpCode::MSG,
    }
    .put(&mut msg);
    msg.put_u32_le(0);
    msg.put_u8(9);
    msg.put_u8(0);
    bad.send(&msg).await;
    assert!(bad.recv().await.is_none(), "closed without a reply");
    good.send(&op_msg(5, 0, 0, &rawdoc! { "ping": 1, "$db": "admin" }))
        .await;
    let (header, _, doc) = body_of(&good.recv().await.expect("ping reply"));
    assert_eq!(header.response_to, 5);
    assert_eq!(doc.get_f64("ok").ok(), Some(1.0));
    // A well-formed but wrong command is an error reply, not a close.
    good.send(&op_msg(6, 0, 0, &rawdoc! { "find": "x" })).await;
    let (_, _, doc) = body_of(&good.recv().await.expect("error reply"));
    assert_eq!(doc.get_i32("code").ok(), Some(40571), "$db is required");
    sim.shutdown().await;
}
