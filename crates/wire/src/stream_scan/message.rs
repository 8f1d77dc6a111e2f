//! The message around the body, read in pieces: header, OP_MSG flags and sections,
//! OP_REPLY's fixed fields and documents, with the checks `checked_header`, `OpMsg::parse`
//! and `OpReply::parse` make; and UTF-8 checked across pieces.

use super::{Frame, Need, Role, Step, StreamScan};
use crate::opmsg::{CHECKSUM_PRESENT, MORE_TO_COME};
use crate::{read_i32, OpCode, WireError, HEADER_LEN};

impl StreamScan {
    pub(super) fn last_i32(&self) -> i32 {
        read_i32(&self.carry, self.carry.len().saturating_sub(4)).unwrap_or(0)
    }

    pub(super) fn on_header(&mut self) {
        let len = read_i32(&self.carry, 0).unwrap_or(0);
        let op = read_i32(&self.carry, 12).unwrap_or(0);
        if len < HEADER_LEN as i32 || len as i64 > self.max as i64 {
            return self.fatal(WireError::BadLength {
                len: len as i64,
                max: self.max,
            });
        }
        let declared = len as u64;
        self.declared = Some(declared);
        let payload = declared - HEADER_LEN as u64;
        self.carry.clear();
        match op {
            OpCode::MSG if payload < 4 => self.fatal(WireError::Truncated("op_msg flags")),
            OpCode::MSG => {
                self.is_msg = true;
                self.walk_dups = self.cap.is_some();
                self.set(Need::Take(4), Step::Flags);
            }
            OpCode::REPLY if payload < 20 => self.fatal(WireError::Truncated("op_reply")),
            OpCode::REPLY => {
                self.sections_end = declared;
                self.set(Need::Skip(20), Step::ReplyDocs);
            }
            OpCode::COMPRESSED => {
                self.compressed = true;
                self.need = Need::Stop;
            }
            other => self.fatal(WireError::BadInnerOpcode(other)),
        }
    }

    pub(super) fn on_flags(&mut self) {
        let flags = self.last_i32() as u32;
        let unknown = flags & 0xffff & !(CHECKSUM_PRESENT | MORE_TO_COME);
        if unknown != 0 {
            return self.fatal(WireError::UnknownRequiredFlags(unknown));
        }
        let declared = self.declared.unwrap_or(0);
        self.checksum = flags & CHECKSUM_PRESENT != 0;
        self.sections_end = declared;
        if self.checksum {
            // The payload less its checksum must still hold the flags.
            if declared < (HEADER_LEN + 8) as u64 {
                return self.fatal(WireError::Truncated("op_msg checksum"));
            }
            self.sections_end = declared - 4;
        }
        self.next_section();
    }

    pub(super) fn next_section(&mut self) {
        self.carry.clear();
        if self.pos < self.sections_end {
            return self.set(Need::Take(1), Step::SecKind);
        }
        if self.bodies != 1 {
            return self.fatal(WireError::BodyCount(self.bodies));
        }
        let tail = if self.checksum { 4 } else { 0 };
        self.set(Need::Skip(tail), Step::Done);
    }

    pub(super) fn on_section_kind(&mut self) {
        let kind = self.carry.first().copied().unwrap_or(0);
        let what = match kind {
            0 if self.bodies > 0 => return self.fatal(WireError::BodyCount(self.bodies + 1)),
            0 => "op_msg body",
            1 => "op_msg document sequence",
            2 => "op_msg security token",
            other => return self.fatal(WireError::UnknownSectionKind(other)),
        };
        if self.sections_end - self.pos < 4 {
            return self.fatal(WireError::Truncated(what));
        }
        self.carry.clear();
        self.set(Need::Take(4), Step::SecLen(kind));
    }

    /// A length just read, of a document or section starting 4 bytes back and ending by
    /// `end`: checked as `read_doc` checks it.
    pub(super) fn doc_len(&mut self, end: u64, what: &'static str) -> Option<u64> {
        let n = self.last_i32();
        let room = end.saturating_sub(self.pos) + 4;
        if n < 5 || n as u64 > room {
            self.fatal(WireError::Overrun {
                what,
                len: n as i64,
                room: usize::try_from(room).unwrap_or(usize::MAX),
            });
            return None;
        }
        Some(n as u64)
    }

    /// Passes over the rest of a document of `n` bytes whose length was just read, checking
    /// its last byte is NUL.
    pub(super) fn skip_doc(&mut self, n: u64, then: Step) {
        self.nul_pos = self.pos + n - 5;
        self.set(Need::Skip(n - 4), then);
    }

    pub(super) fn on_section_len(&mut self, kind: u8) {
        let end = self.sections_end;
        match kind {
            0 => {
                if let Some(n) = self.doc_len(end, "op_msg body") {
                    self.enter_body(n);
                }
            }
            1 => {
                if let Some(n) = self.doc_len(end, "op_msg document sequence") {
                    self.seq_end = self.pos - 4 + n;
                    self.utf8 = Some(Utf8::default());
                    let room = self.seq_end - self.pos;
                    self.set(Need::CStr { room, keep: 0 }, Step::SeqIdent);
                }
            }
            _ => {
                if let Some(n) = self.doc_len(end, "op_msg security token") {
                    self.skip_doc(n, Step::NextSection);
                }
            }
        }
    }

    pub(super) fn seq_next(&mut self) {
        self.carry.clear();
        if self.pos >= self.seq_end {
            return self.next_section();
        }
        if self.seq_end - self.pos < 4 {
            return self.fatal(WireError::Truncated("op_msg sequence document"));
        }
        self.set(Need::Take(4), Step::SeqDocLen);
    }

    pub(super) fn reply_next(&mut self) {
        self.carry.clear();
        if self.pos < self.sections_end {
            if self.sections_end - self.pos < 4 {
                return self.fatal(WireError::Truncated("op_reply document"));
            }
            return self.set(Need::Take(4), Step::ReplyDocLen);
        }
        if self.bodies == 0 {
            return self.fatal(WireError::Truncated("op_reply document"));
        }
        self.set(Need::Skip(0), Step::Done);
    }

    pub(super) fn enter_body(&mut self, n: u64) {
        self.bodies += 1;
        self.push(Role::Body, n);
    }

    pub(super) fn push(&mut self, role: Role, n: u64) {
        match self.frames.get_mut(self.depth) {
            Some(f) => {
                *f = Frame {
                    role,
                    left: n - 5,
                    walk: true,
                };
                self.depth += 1;
                self.next_elem();
            }
            None => self.fatal(WireError::BadBson("nesting")),
        }
    }
}

/// UTF-8 checked across pieces: an incomplete sequence at a piece's end waits for the next.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Utf8 {
    pending: [u8; 4],
    n: usize,
    bad: bool,
}

impl Utf8 {
    pub(super) fn push(&mut self, mut b: &[u8]) {
        while self.n > 0 && !self.bad {
            let Some((&first, rest)) = b.split_first() else {
                return;
            };
            b = rest;
            if let Some(p) = self.pending.get_mut(self.n) {
                *p = first;
            }
            self.n += 1;
            match std::str::from_utf8(&self.pending[..self.n.min(4)]) {
                Ok(_) => self.n = 0,
                Err(e) if e.error_len().is_some() || self.n >= 4 => self.bad = true,
                Err(_) => {}
            }
        }
        if self.bad {
            return;
        }
        if let Err(e) = std::str::from_utf8(b) {
            match e.error_len() {
                Some(_) => self.bad = true,
                None => {
                    let tail = &b[e.valid_up_to()..];
                    self.n = tail.len().min(3);
                    self.pending[..self.n].copy_from_slice(&tail[..self.n]);
                }
            }
        }
    }

    pub(super) fn valid(&self) -> bool {
        !self.bad && self.n == 0
    }
}
