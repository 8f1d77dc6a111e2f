//! A raw wire client and message builders: exact bytes out, whole frames in.

use std::net::SocketAddr;

use bson::{RawDocument, RawDocumentBuf};
use bytes::{BufMut, Bytes, BytesMut};
use futures::StreamExt;
use staleguard::wire::compressed::Compressed;
use staleguard::wire::legacy::OpReply;
use staleguard::wire::opmsg::{OpMsg, CHECKSUM_PRESENT};
use staleguard::wire::reply::op_msg;
use staleguard::wire::{Header, MessageCodec, OpCode, HEADER_LEN};
use tokio::io::AsyncWriteExt;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio_util::codec::FramedRead;

use super::mongos::MAX_MESSAGE_SIZE;
use super::within;

pub struct RawClient {
    frames: FramedRead<OwnedReadHalf, MessageCodec>,
    out: OwnedWriteHalf,
}

impl RawClient {
    pub async fn connect(addr: SocketAddr) -> RawClient {
        let stream = within("raw connect", TcpStream::connect(addr))
            .await
            .expect("raw connect");
        RawClient::from_stream(stream)
    }

    /// A client over a stream connected by the caller (e.g. from a chosen local address).
    pub fn from_stream(stream: TcpStream) -> RawClient {
        stream.set_nodelay(true).expect("nodelay");
        let (rd, out) = stream.into_split();
        RawClient {
            frames: FramedRead::new(rd, MessageCodec::new(MAX_MESSAGE_SIZE)),
            out,
        }
    }

    /// Writes `bytes` as they are (a message, part of one, or garbage).
    pub async fn send(&mut self, bytes: &[u8]) {
        within("raw send", self.out.write_all(bytes))
            .await
            .expect("raw send");
    }

    /// The next whole message; fails the test on EOF, error or timeout.
    pub async fn recv(&mut self) -> Bytes {
        match self.try_recv().await {
            Some(msg) => msg,
            None => panic!("connection closed while a reply was expected"),
        }
    }

    /// The next whole message, or `None` once the peer has closed (or reset) the connection.
    pub async fn try_recv(&mut self) -> Option<Bytes> {
        within("raw recv", self.frames.next()).await?.ok()
    }

    /// Sends `msg` and returns the one reply.
    pub async fn roundtrip(&mut self, msg: &[u8]) -> Bytes {
        self.send(msg).await;
        self.recv().await
    }

    /// Waits for the peer to close; returns whatever whole messages came before.
    pub async fn expect_closed(&mut self) -> Vec<Bytes> {
        let mut before = Vec::new();
        while let Some(msg) = self.try_recv().await {
            before.push(msg);
        }
        before
    }
}

/// An OP_MSG request with one body section (and a CRC-32C if `flags` says so).
pub fn msg(request_id: i32, flags: u32, body: &RawDocument) -> Bytes {
    op_msg(request_id, 0, flags, body)
}

/// An OP_MSG request with a body and one kind-1 document sequence.
pub fn msg_with_sequence(
    request_id: i32,
    flags: u32,
    body: &RawDocument,
    id: &str,
    docs: &[RawDocumentBuf],
) -> Bytes {
    let mut out = BytesMut::new();
    Header {
        length: 0,
        request_id,
        response_to: 0,
        op_code: OpCode::MSG,
    }
    .put(&mut out);
    out.put_u32_le(flags);
    out.put_u8(0);
    out.put_slice(body.as_bytes());
    out.put_u8(1);
    let size: usize = 4 + id.len() + 1 + docs.iter().map(|d| d.as_bytes().len()).sum::<usize>();
    out.put_i32_le(size as i32);
    out.put_slice(id.as_bytes());
    out.put_u8(0);
    for d in docs {
        out.put_slice(d.as_bytes());
    }
    finish(out, flags & CHECKSUM_PRESENT != 0)
}

/// A legacy OP_QUERY for command `cmd` on `full_collection_name` (e.g. `admin.$cmd`).
pub fn query(request_id: i32, full_collection_name: &str, cmd: &RawDocument) -> Bytes {
    let mut out = BytesMut::new();
    Header {
        length: 0,
        request_id,
        response_to: 0,
        op_code: OpCode::QUERY,
    }
    .put(&mut out);
    out.put_i32_le(0);
    out.put_slice(full_collection_name.as_bytes());
    out.put_u8(0);
    out.put_i32_le(0);
    out.put_i32_le(-1);
    out.put_slice(cmd.as_bytes());
    finish(out, false)
}

/// Fills in the length (and the checksum, if asked).
fn finish(mut out: BytesMut, checksum: bool) -> Bytes {
    let len = out.len() + if checksum { 4 } else { 0 };
    out[..4].copy_from_slice(&(len as i32).to_le_bytes());
    if checksum {
        let sum = crc32c::crc32c(&out);
        out.put_u32_le(sum);
    }
    out.freeze()
}

pub fn header(msg: &[u8]) -> Header {
    Header::parse(msg).expect("a whole message")
}

/// The message inside an OP_COMPRESSED (or the message itself).
pub fn uncompressed(msg: &[u8]) -> Bytes {
    let h = header(msg);
    if h.op() != OpCode::Compressed {
        return Bytes::copy_from_slice(msg);
    }
    let c = Compressed::parse(&msg[HEADER_LEN..]).expect("op_compressed");
    let inner = c.decompress(MAX_MESSAGE_SIZE).expect("decompress");
    let mut out = BytesMut::with_capacity(HEADER_LEN + inner.len());
    Header {
        length: (HEADER_LEN + inner.len()) as i32,
        op_code: c.original_opcode,
        ..h
    }
    .put(&mut out);
    out.put_slice(&inner);
    out.freeze()
}

/// The OP_MSG flag bits of a (possibly compressed) message; 0 for other opcodes.
pub fn flags(msg: &[u8]) -> u32 {
    let msg = uncompressed(msg);
    match header(&msg).op() {
        OpCode::Msg => OpMsg::parse(&msg[HEADER_LEN..]).expect("op_msg").flags,
        _ => 0,
    }
}

/// The body of an OP_MSG, OP_REPLY or OP_QUERY-free OP_COMPRESSED message.
pub fn body(msg: &[u8]) -> RawDocumentBuf {
    let msg = uncompressed(msg);
    let payload = &msg[HEADER_LEN..];
    match header(&msg).op() {
        OpCode::Msg => OpMsg::parse(payload).expect("op_msg").body.to_owned(),
        OpCode::Reply => OpReply::parse(payload)
            .expect("op_reply")
            .first
            .expect("op_reply document")
            .to_owned(),
        other => panic!("no body in opcode {other:?}"),
    }
}
