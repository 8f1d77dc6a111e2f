//! Builders for messages the proxy originates: OP_MSG replies (policy decisions) and the
//! OP_MSG/OP_REPLY frames used by the simulated cluster and the tests.

use bson::{rawdoc, RawDocument, RawDocumentBuf};
use bytes::{BufMut, Bytes, BytesMut};

use super::{Header, OpCode, HEADER_LEN};

/// An OP_MSG with flag bits `flags` (checksum added when bit 0 is set) and one body section.
pub fn op_msg(request_id: i32, response_to: i32, flags: u32, body: &RawDocument) -> Bytes {
    let body = body.as_bytes();
    let crc = flags & super::opmsg::CHECKSUM_PRESENT != 0;
    let len = HEADER_LEN + 4 + 1 + body.len() + if crc { 4 } else { 0 };
    let mut out = BytesMut::with_capacity(len);
    Header {
        length: len as i32,
        request_id,
        response_to,
        op_code: OpCode::MSG,
    }
    .put(&mut out);
    out.put_u32_le(flags);
    out.put_u8(0);
    out.put_slice(body);
    if crc {
        let sum = crc32c::crc32c(&out);
        out.put_u32_le(sum);
    }
    out.freeze()
}

/// OP_REPLY `responseFlags` bit: the query failed, the document holds `$err`.
pub const QUERY_FAILURE: i32 = 2;

/// An OP_REPLY carrying one document, as answers to legacy OP_QUERY commands.
pub fn op_reply(request_id: i32, response_to: i32, doc: &RawDocument) -> Bytes {
    op_reply_with_flags(request_id, response_to, 0, doc)
}

/// An OP_REPLY with `responseFlags` and one document.
pub fn op_reply_with_flags(
    request_id: i32,
    response_to: i32,
    response_flags: i32,
    doc: &RawDocument,
) -> Bytes {
    let doc = doc.as_bytes();
    let len = HEADER_LEN + 20 + doc.len();
    let mut out = BytesMut::with_capacity(len);
    Header {
        length: len as i32,
        request_id,
        response_to,
        op_code: OpCode::REPLY,
    }
    .put(&mut out);
    out.put_i32_le(response_flags);
    out.put_i64_le(0);
    out.put_i32_le(0);
    out.put_i32_le(1);
    out.put_slice(doc);
    out.freeze()
}

/// The body of a command error: `{ok: 0, errmsg, code, codeName}`, the shape servers send.
/// No error labels are added, so drivers neither retry nor touch their pool because of it.
pub fn error_body(code: i32, code_name: &str, errmsg: &str) -> RawDocumentBuf {
    rawdoc! {
        "ok": 0.0,
        "errmsg": errmsg,
        "code": code,
        "codeName": code_name,
    }
}

/// A complete OP_MSG error reply to the request whose requestID is `response_to`.
pub fn error_reply(
    request_id: i32,
    response_to: i32,
    code: i32,
    code_name: &str,
    errmsg: &str,
) -> Bytes {
    op_msg(
        request_id,
        response_to,
        0,
        &error_body(code, code_name, errmsg),
    )
}
