//! What a reply says about the command's outcome: top-level `ok`, `code`, `codeName`.

use bytes::Bytes;

use crate::body::{check_length, checked_header};
use crate::compressed::Compressed;
use crate::dupids::{duplicate_ids, DupCount, IdSet};
use crate::legacy::OpReply;
use crate::opmsg::{self, OpMsg};
use crate::scan::{self, int_value, Elements};
use crate::{Header, OpCode, WireError, HEADER_LEN};

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
    status_after_header(&header, msg, max_message_size)
}

/// A reply message with its header read once: what the relay asks of every reply (which
/// request it answers, whether more follow) and, for a tracked read, its status.
#[derive(Debug, Clone)]
pub struct Reply {
    frame: Bytes,
    /// `None` for a frame shorter than a header (never one the codec cut).
    header: Option<Header>,
}

impl Reply {
    pub fn new(frame: Bytes) -> Reply {
        let header = Header::parse(&frame);
        Reply { frame, header }
    }

    /// The requestID this reply answers (0 without a header).
    pub fn response_to(&self) -> i32 {
        self.header.map_or(0, |h| h.response_to)
    }

    /// An OP_MSG with `moreToCome`: an exhaust stream goes on after it.
    pub fn more_to_come(&self) -> bool {
        self.frame.len() > 20
            && self.header.is_some_and(|h| h.op_code == OpCode::MSG)
            && opmsg::flags_of(&self.frame) & opmsg::MORE_TO_COME != 0
    }

    /// What [`inspect_reply`] says, without reading the header again.
    pub fn status(&self, max_message_size: usize) -> Result<ReplyStatus, WireError> {
        let header = self.header.ok_or(WireError::Truncated("message header"))?;
        check_length(&header, self.frame.len(), max_message_size)?;
        status_after_header(&header, &self.frame, max_message_size)
    }

    /// [`Reply::status`] and, for an `ok` OP_MSG reply, the documents of its cursor batch
    /// returned twice (at most `cap` examined, see [`crate::dupids`]): one header read,
    /// at most one decompression. The count is `None` for other replies; a batch that
    /// cannot be walked counts nothing (the status still stands).
    pub fn status_and_duplicates(
        &self,
        max_message_size: usize,
        set: &mut IdSet,
        cap: usize,
    ) -> Result<(ReplyStatus, Option<DupCount>), WireError> {
        let header = self.header.ok_or(WireError::Truncated("message header"))?;
        check_length(&header, self.frame.len(), max_message_size)?;
        with_body(&header, &self.frame, max_message_size, |body, is_msg| {
            let status = reply_status(body)?;
            let dups = (is_msg && status.ok)
                .then(|| duplicate_ids(body, set, cap).ok())
                .flatten();
            Ok((status, dups))
        })
    }

    /// The reply to an authentication step accepted the connection: `ok: 1` and the
    /// conversation over (`done: true` from `saslStart`/`saslContinue`; an `authenticate`
    /// reply naming its `user`; a handshake whose `speculativeAuthenticate` is done, or is
    /// x509's, which carries no `conversationId`). False for anything else, an unreadable
    /// reply included.
    pub fn auth_accepted(&self, max_message_size: usize) -> bool {
        let Some(header) = self.header else {
            return false;
        };
        if check_length(&header, self.frame.len(), max_message_size).is_err() {
            return false;
        }
        with_body(&header, &self.frame, max_message_size, |body, _| {
            Ok(auth_done(body))
        })
        .unwrap_or(false)
    }

    /// The message as it arrived.
    pub fn frame(&self) -> &Bytes {
        &self.frame
    }

    pub fn into_frame(self) -> Bytes {
        self.frame
    }
}

/// [`inspect_reply`] past the (checked) header.
fn status_after_header(
    header: &Header,
    msg: &[u8],
    max_message_size: usize,
) -> Result<ReplyStatus, WireError> {
    with_body(header, msg, max_message_size, |body, _| reply_status(body))
}

/// Calls `f` with the reply's body document (decompressed once when compressed) and
/// whether it is an OP_MSG body (an OP_REPLY's first document otherwise).
fn with_body<R>(
    header: &Header,
    msg: &[u8],
    max_message_size: usize,
    f: impl FnOnce(&[u8], bool) -> Result<R, WireError>,
) -> Result<R, WireError> {
    let payload = &msg[HEADER_LEN..];
    match header.op_code {
        OpCode::MSG => f(OpMsg::parse(payload)?.body.as_bytes(), true),
        OpCode::REPLY => f(op_reply_doc(payload)?, false),
        OpCode::COMPRESSED => {
            let c = Compressed::parse(payload)?;
            let inner = c.decompress(max_message_size.saturating_sub(HEADER_LEN))?;
            match c.original_opcode {
                OpCode::MSG => f(OpMsg::parse(&inner)?.body.as_bytes(), true),
                OpCode::REPLY => f(op_reply_doc(&inner)?, false),
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

/// See [`Reply::auth_accepted`].
fn auth_done(body: &[u8]) -> bool {
    let Ok(status) = reply_status(body) else {
        return false;
    };
    let Ok(mut elems) = Elements::new(body) else {
        return false;
    };
    let (mut done, mut user, mut speculative) = (None, false, None);
    while let Ok(Some(e)) = elems.next_elem() {
        match e.key {
            b"done" => done = Some(e.tag == scan::BOOLEAN && e.value.first() == Some(&1)),
            b"user" => user = true,
            b"speculativeAuthenticate" if e.tag == scan::DOCUMENT => speculative = Some(e.value),
            _ => {}
        }
    }
    if !status.ok {
        return false;
    }
    match (done, speculative) {
        (Some(done), _) => done,
        (None, Some(doc)) => speculative_done(doc),
        (None, None) => user,
    }
}

/// A handshake's `speculativeAuthenticate` reply ends the conversation: `done: true`, or no
/// `conversationId` at all (x509 answers with the user it authenticated).
fn speculative_done(doc: &[u8]) -> bool {
    let Ok(mut elems) = Elements::new(doc) else {
        return false;
    };
    let (mut done, mut conversation) = (None, false);
    while let Ok(Some(e)) = elems.next_elem() {
        match e.key {
            b"done" => done = Some(e.tag == scan::BOOLEAN && e.value.first() == Some(&1)),
            b"conversationId" => conversation = true,
            _ => {}
        }
    }
    done.unwrap_or(!conversation)
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

#[cfg(test)]
mod tests {
    use bson::rawdoc;

    use super::*;
    use crate::reply::op_msg;

    fn accepted(body: bson::RawDocumentBuf) -> bool {
        Reply::new(op_msg(1, 2, 0, &body)).auth_accepted(1 << 20)
    }

    /// What ends an authentication conversation, as mongos answers each step.
    #[test]
    fn auth_accepted_table() {
        let rows = [
            // SCRAM: saslStart, then saslContinue until done.
            (
                "saslStart",
                rawdoc! {"conversationId": 1, "done": false, "payload": "", "ok": 1.0},
                false,
            ),
            (
                "saslContinue done",
                rawdoc! {"conversationId": 1, "done": true, "payload": "", "ok": 1.0},
                true,
            ),
            (
                "refused",
                rawdoc! {"ok": 0.0, "code": 18, "codeName": "AuthenticationFailed", "done": true},
                false,
            ),
            // x509 `authenticate`.
            (
                "authenticate",
                rawdoc! {"dbname": "$external", "user": "CN=app", "ok": 1.0},
                true,
            ),
            // A handshake: x509 speculative (done, no conversation), SCRAM's first step, none.
            (
                "speculative x509",
                rawdoc! {"isWritablePrimary": true, "speculativeAuthenticate": {"dbname": "$external", "user": "CN=app"}, "ok": 1.0},
                true,
            ),
            (
                "speculative scram",
                rawdoc! {"isWritablePrimary": true, "speculativeAuthenticate": {"conversationId": 1, "done": false, "payload": ""}, "ok": 1.0},
                false,
            ),
            (
                "plain hello",
                rawdoc! {"isWritablePrimary": true, "ok": 1.0},
                false,
            ),
            (
                "a read",
                rawdoc! {"cursor": {"id": 0_i64, "firstBatch": []}, "ok": 1.0},
                false,
            ),
        ];
        for (name, body, want) in rows {
            assert_eq!(accepted(body), want, "{name}");
        }
        // Not a reply at all.
        assert!(!Reply::new(Bytes::from_static(b"short")).auth_accepted(1 << 20));
    }
}
