//! A reply judged in pieces: [`StreamScan`] is fed a reply message piece by piece, as it is
//! relayed, and at the end says what [`crate::Reply::status_and_duplicates`] (or
//! [`crate::Reply::status`]) says of the whole message, without keeping the pieces.
//!
//! It reads OP_MSG (flags; kind-0 body; kind-1 and kind-2 sections passed over by their
//! sizes; the checksum, if flagged, not verified) and OP_REPLY (its first document), with
//! the length checks of the whole-message views. It descends only where the status and the
//! duplicate count look: the body's top level, the first `cursor` document, its first
//! `firstBatch`/`nextBatch` array and that array's documents up to their first `_id`.
//! Everything else is passed over by its declared length (checked as the element scanner
//! checks it, terminators included), never copied. Differences from the whole-message
//! functions, all on the side of reporting less:
//! - OP_COMPRESSED cannot be read in pieces: [`StreamScan::finish`] gives
//!   [`WireError::Streamed`].
//! - A `codeName` longer than [`CODE_NAME_MAX`] bytes is checked (UTF-8, terminator) but not
//!   kept: the status then has no `codeName` (an earlier short one is dropped too, since the
//!   last one is the one that counts).
//! - A batch document whose `_id` element is longer than [`STREAM_ID_MAX`] bytes is counted
//!   in [`DupCount::skipped`], not examined (it still counts toward `cap`, as it would there).
//!
//! A batch's documents that lie whole in the piece being fed are read straight from it with
//! the element scanner (`stream_scan/fast.rs`); the state machine reads what a piece cuts.
//!
//! Memory: a carry buffer for what is read whole (the header, an element's tag and key of up
//! to 16 bytes, a value of at most 8 bytes, a kept `codeName` or `_id`), under 4 KiB, and
//! the kept `_id`s (see `stream_scan/ids.rs`), at most `cap` × ([`STREAM_ID_MAX`] + 32) bytes.

mod elems;
mod fast;
mod ids;
mod message;

use crate::dupids::DupCount;
use crate::scan::{self, find_nul, Elem};
use crate::status::ReplyStatus;
use crate::{WireError, HEADER_LEN};
use ids::Ids;
use message::Utf8;

/// Largest `_id` element (type byte + "_id\0" + value) the streaming duplicate count keeps; a
/// document whose `_id` element is larger is counted in `DupCount::skipped`.
pub const STREAM_ID_MAX: usize = 256;

/// Longest `codeName` (in bytes, without its NUL) that is kept.
pub const CODE_NAME_MAX: usize = 1024;

/// Keys are kept up to this many bytes: the longest one looked for is `firstBatch`.
const KEY_KEEP: usize = 16;

/// `nul_pos` when no byte is to be checked.
const NO_POS: u64 = u64::MAX;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    Body,
    Cursor,
    Batch,
    Doc,
}

/// A document being walked: `left` bytes before its terminating NUL.
#[derive(Debug, Clone, Copy)]
struct Frame {
    role: Role,
    left: u64,
    /// False once nothing more of it is looked at: the rest is passed over.
    walk: bool,
}

/// What the value of the element being read is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Use {
    Skip,
    Ok,
    Code,
    CodeName,
    Cursor,
    Batch,
    Doc,
    Id,
}

/// The bytes wanted next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Need {
    /// Append this many bytes to the carry.
    Take(usize),
    /// Pass over this many bytes.
    Skip(u64),
    /// Scan for a NUL within `room` bytes, appending to the carry up to `keep` bytes in all.
    CStr { room: u64, keep: usize },
    /// What was wanted is there: [`StreamScan::advance`] decides what comes next.
    Ready,
    /// Nothing more is read (done, failed, or compressed); bytes are only counted.
    Stop,
}

/// What the bytes of the current [`Need`] are, so what to do once they are there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    Header,
    Flags,
    SecKind,
    SecLen(u8),
    SeqIdent,
    SeqDocLen,
    SeqDoc,
    NextSection,
    ReplyDocs,
    ReplyDocLen,
    Elem,
    Tag,
    Key,
    Fixed,
    Len,
    Value,
    Regex1,
    Regex2,
    Done,
}

/// Incremental reader of one reply message; see the module documentation.
#[derive(Debug)]
pub struct StreamScan {
    max: usize,
    cap: Option<usize>,
    fed: u64,
    /// Bytes the parser has consumed (its position in the message).
    pos: u64,
    declared: Option<u64>,
    need: Need,
    step: Step,
    carry: Vec<u8>,
    /// Absolute position of a byte that must be NUL (a value's terminator), or `NO_POS`.
    nul_pos: u64,
    nul_bad: bool,
    unterminated: bool,
    /// A CStr scan dropped bytes past its `keep`.
    overflow: bool,
    utf8: Option<Utf8>,
    error: Option<WireError>,
    compressed: bool,
    is_msg: bool,
    sections_end: u64,
    checksum: bool,
    bodies: usize,
    seq_end: u64,
    frames: [Frame; 4],
    depth: usize,
    /// The byte `Step::Tag` reads is the innermost document's terminator.
    term: bool,
    tag: u8,
    use_: Use,
    kept: bool,
    status: ReplyStatus,
    walk_dups: bool,
    cursor_seen: bool,
    dup_bad: bool,
    count: DupCount,
    /// Batch documents whose `_id` was looked at (kept or too large): what `cap` bounds.
    looked: usize,
    ids: Ids,
}

impl StreamScan {
    /// `dup_cap`: `Some(cap)` also counts documents of `cursor.firstBatch`/`cursor.nextBatch`
    /// whose `_id` appeared earlier in the same batch (at most `cap` documents examined, the
    /// rest counted as skipped), like `duplicate_ids`; `None` reads the status only.
    pub fn new(max_message_size: usize, dup_cap: Option<usize>) -> StreamScan {
        let frame = Frame {
            role: Role::Body,
            left: 0,
            walk: false,
        };
        StreamScan {
            max: max_message_size,
            cap: dup_cap,
            fed: 0,
            pos: 0,
            declared: None,
            need: Need::Take(HEADER_LEN),
            step: Step::Header,
            carry: Vec::with_capacity(64),
            nul_pos: NO_POS,
            nul_bad: false,
            unterminated: false,
            overflow: false,
            utf8: None,
            error: None,
            compressed: false,
            is_msg: false,
            sections_end: 0,
            checksum: false,
            bodies: 0,
            seq_end: 0,
            frames: [frame; 4],
            depth: 0,
            term: false,
            tag: 0,
            use_: Use::Skip,
            kept: false,
            status: ReplyStatus::default(),
            walk_dups: false,
            cursor_seen: false,
            dup_bad: false,
            count: DupCount::default(),
            looked: 0,
            ids: Ids::new(dup_cap.unwrap_or(0)),
        }
    }

    /// Tests: every `_id` hashed alike (the worst case for the table).
    #[cfg(test)]
    pub(crate) fn with_flat_hash(mut self) -> StreamScan {
        self.ids.flat();
        self
    }

    /// The next bytes of the message. Never panics, whatever the bytes.
    pub fn feed(&mut self, mut bytes: &[u8]) {
        self.fed = self.fed.saturating_add(bytes.len() as u64);
        loop {
            match self.need {
                Need::Stop => return,
                Need::Ready => self.advance(),
                _ if bytes.is_empty() => return,
                _ => {
                    let mut k = self.fast_batch(bytes);
                    if k == 0 {
                        k = self.consume(bytes);
                    }
                    bytes = bytes.get(k..).unwrap_or_default();
                }
            }
        }
    }

    /// After the last piece: what `Reply::status_and_duplicates` says of the whole message
    /// (the dup count `None` when `dup_cap` was `None`, or as that function gives it).
    pub fn finish(self) -> Result<(ReplyStatus, Option<DupCount>), WireError> {
        if let Some(e) = self.error {
            return Err(e);
        }
        let declared = self
            .declared
            .ok_or(WireError::Truncated("message header"))?;
        if self.fed != declared {
            return Err(WireError::Overrun {
                what: "message",
                len: declared as i64,
                room: usize::try_from(self.fed).unwrap_or(usize::MAX),
            });
        }
        if self.compressed {
            return Err(WireError::Streamed("compressed reply"));
        }
        if self.step != Step::Done {
            return Err(WireError::Truncated("message"));
        }
        let dups = (self.walk_dups && self.status.ok && !self.dup_bad).then_some(self.count);
        Ok((self.status, dups))
    }

    /// Bytes of memory this scanner holds now (carry buffer + kept ids), for tests/bounds.
    pub fn held(&self) -> usize {
        self.carry.capacity() + self.ids.held()
    }

    /// Consumes what the current need wants of `bytes` (at least one byte); returns how many.
    fn consume(&mut self, bytes: &[u8]) -> usize {
        let k = match self.need {
            Need::Take(n) => {
                let k = n.min(bytes.len());
                self.carry.extend_from_slice(&bytes[..k]);
                self.need = ready_if(n - k == 0, Need::Take(n - k));
                k
            }
            Need::Skip(n) => {
                let k = usize::try_from(n).unwrap_or(usize::MAX).min(bytes.len());
                if let Some(u) = &mut self.utf8 {
                    // A long codeName: its text is what lies before its NUL.
                    let text = self.nul_pos.saturating_sub(self.pos);
                    u.push(&bytes[..usize::try_from(text).unwrap_or(usize::MAX).min(k)]);
                }
                self.need = ready_if(n - k as u64 == 0, Need::Skip(n - k as u64));
                k
            }
            Need::CStr { room, keep } => {
                let lim = usize::try_from(room).unwrap_or(usize::MAX).min(bytes.len());
                let scanned = &bytes[..lim];
                let (k, text) = match find_nul(scanned) {
                    Some(i) => (i + 1, i),
                    None => (lim, lim),
                };
                let kept = k.min(keep.saturating_sub(self.carry.len()));
                self.carry.extend_from_slice(&scanned[..kept]);
                self.overflow |= kept < k;
                if let Some(u) = &mut self.utf8 {
                    u.push(&scanned[..text]);
                }
                let left = room - k as u64;
                self.need = if k > text {
                    Need::Ready
                } else if left == 0 {
                    self.unterminated = true;
                    Need::Ready
                } else {
                    Need::CStr { room: left, keep }
                };
                k
            }
            Need::Ready | Need::Stop => return 0,
        };
        if self.nul_pos >= self.pos && self.nul_pos - self.pos < k as u64 {
            let at = (self.nul_pos - self.pos) as usize;
            self.nul_bad |= bytes.get(at) != Some(&0);
        }
        self.pos += k as u64;
        for f in &mut self.frames[..self.depth] {
            f.left = f.left.saturating_sub(k as u64);
        }
        k
    }

    fn set(&mut self, need: Need, step: Step) {
        self.need = match need {
            Need::Take(0) | Need::Skip(0) => Need::Ready,
            Need::CStr { room: 0, .. } => {
                self.unterminated = true;
                Need::Ready
            }
            other => other,
        };
        self.step = step;
    }

    fn fatal(&mut self, e: WireError) {
        self.error = Some(e);
        self.need = Need::Stop;
    }

    fn top(&self) -> Option<Frame> {
        self.frames.get(self.depth.checked_sub(1)?).copied()
    }

    /// Malformed bytes where the current document is read: fatal at the message level and in
    /// the body (the status cannot be read), the end of the duplicate count inside `cursor`.
    fn bad(&mut self, what: &'static str) {
        match self.top() {
            None
            | Some(Frame {
                role: Role::Body, ..
            }) => self.fatal(WireError::BadBson(what)),
            Some(_) => self.dup_break(),
        }
    }

    /// The batch cannot be walked: no count; the rest of `cursor` is passed over (its
    /// terminator is still checked, as the body's scan checks it).
    fn dup_break(&mut self) {
        self.dup_bad = true;
        while self.top().is_some_and(|f| f.role != Role::Cursor) {
            self.depth -= 1;
        }
        match self
            .depth
            .checked_sub(1)
            .and_then(|d| self.frames.get_mut(d))
        {
            Some(f) => f.walk = false,
            None => return self.fatal(WireError::BadBson("reply body")),
        }
        self.next_elem();
    }

    /// Called when the current need is met.
    fn advance(&mut self) {
        self.nul_pos = NO_POS;
        if std::mem::take(&mut self.nul_bad) {
            return self.bad("value terminator");
        }
        if std::mem::take(&mut self.unterminated) {
            return match self.step {
                Step::SeqIdent => {
                    self.fatal(WireError::UnterminatedCString("op_msg sequence identifier"))
                }
                _ => self.bad("cstring without terminator"),
            };
        }
        match self.step {
            Step::Header => self.on_header(),
            Step::Flags => self.on_flags(),
            Step::SecKind => self.on_section_kind(),
            Step::SecLen(kind) => self.on_section_len(kind),
            Step::SeqIdent => {
                if self.utf8.take().is_some_and(|u| u.valid()) {
                    self.seq_next()
                } else {
                    self.fatal(WireError::BadBson("op_msg sequence identifier"))
                }
            }
            Step::SeqDocLen => {
                if let Some(n) = self.doc_len(self.seq_end, "op_msg sequence document") {
                    self.skip_doc(n, Step::SeqDoc)
                }
            }
            Step::SeqDoc => self.seq_next(),
            Step::NextSection => self.next_section(),
            Step::ReplyDocs => self.reply_next(),
            Step::ReplyDocLen => match self.doc_len(self.sections_end, "op_reply document") {
                Some(n) if self.bodies == 0 => self.enter_body(n),
                Some(n) => self.skip_doc(n, Step::ReplyDocs),
                None => {}
            },
            Step::Elem => self.next_elem(),
            Step::Tag => self.on_tag(),
            Step::Key => self.on_key(),
            Step::Fixed => self.on_fixed(),
            Step::Len => self.on_len(),
            Step::Value => self.on_value(),
            Step::Regex1 => {
                let room = self.top().map_or(0, |f| f.left);
                self.set(
                    Need::CStr {
                        room,
                        keep: self.keep_limit(),
                    },
                    Step::Regex2,
                );
            }
            Step::Regex2 => {
                if self.use_ == Use::Id {
                    self.kept = !self.overflow;
                    self.id_done();
                }
                self.next_elem();
            }
            Step::Done => self.need = Need::Stop,
        }
    }
}

fn ready_if(done: bool, need: Need) -> Need {
    if done {
        Need::Ready
    } else {
        need
    }
}

/// An element view of a value read whole, for [`int_value`].
fn elem(tag: u8, value: &[u8]) -> Elem<'_> {
    Elem {
        tag,
        key: b"",
        value,
        start: 0,
        end: 0,
    }
}

fn is_int(tag: u8) -> bool {
    matches!(tag, scan::INT32 | scan::INT64 | scan::DOUBLE)
}

#[cfg(test)]
mod tests;
