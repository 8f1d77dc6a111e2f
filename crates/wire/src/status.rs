//! What a reply says about the command's outcome: top-level `ok`, `code`, `codeName`.

use crate::body::checked_header;
use crate::compressed::Compressed;
use crate::legacy::OpReply;
use crate::opmsg::OpMsg;
use crate::scan::{self, int_value, Elements};
use crate::{OpCode, WireError, HEADER_LEN};

/// What a reply says about the command's outcome.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReplyStatus {
    /// Top-level `ok` is 1 (double, int32, int64 or bool); false when absent.
    pub ok: bool,
    /// Top-level `code` (int32, int64 or whole double that fits an i32).
    pub code: Option<i32>,
    /// Top-level `codeName`; allocated only when present (error replies).
    pub code_name: Option<String>,
}

/// Reads `ok`, `code` and `codeName` of a whole reply message: OP_MSG, OP_COMPRESSED wrapping
/// OP_MSG or OP_REPLY, or OP_REPLY (its first document). Only top-level elements are visited;
/// a large `cursor` is skipped by its length. The checksum is not verified (the client does).
pub fn inspect_reply(msg: &[u8], max_message_size: usize) -> Result<ReplyStatus, WireError> {
    let header = checked_header(msg, max_message_size)?;
    let payload = &msg[HEADER_LEN..];
    match header.op_code {
        OpCode::MSG => reply_status(OpMsg::parse(payload)?.body.as_bytes()),
        OpCode::REPLY => reply_status(op_reply_doc(payload)?),
        OpCode::COMPRESSED => {
            let c = Compressed::parse(payload)?;
            let inner = c.decompress(max_message_size.saturating_sub(HEADER_LEN))?;
            match c.original_opcode {
                OpCode::MSG => reply_status(OpMsg::parse(&inner)?.body.as_bytes()),
                OpCode::REPLY => reply_status(op_reply_doc(&inner)?),
                other => Err(WireError::BadInnerOpcode(other)),
            }
        }
        other => Err(WireError::BadInnerOpcode(other)),
    }
}

fn op_reply_doc(payload: &[u8]) -> Result<&[u8], WireError> {
    let reply = OpReply::parse(payload)?;
    let first = reply
        .first
        .ok_or(WireError::Truncated("op_reply document"))?;
    Ok(first.as_bytes())
}

fn reply_status(body: &[u8]) -> Result<ReplyStatus, WireError> {
    let bad = |_| WireError::BadBson("reply body");
    let mut status = ReplyStatus::default();
    let mut elems = Elements::new(body).map_err(bad)?;
    while let Some(e) = elems.next_elem().map_err(bad)? {
        match e.key {
            b"ok" => {
                status.ok = match e.tag {
                    scan::BOOLEAN => e.value.first() == Some(&1),
                    _ => int_value(&e) == Some(1),
                }
            }
            b"code" => status.code = int_value(&e).and_then(|c| i32::try_from(c).ok()),
            b"codeName" if e.tag == scan::STRING => {
                status.code_name = Some(scan::str_value(e.value).map_err(bad)?.to_owned())
            }
            _ => {}
        }
    }
    Ok(status)
}

// ---------------------------------------------------------------------------------------
