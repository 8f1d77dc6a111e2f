//! The element walk of [`StreamScan`]: the body's top level, and inside the first `cursor`
//! document, its batch and the batch's documents, as `reply_status` and `duplicate_ids`
//! read them.

use super::{elem, is_int, Need, Role, Step, StreamScan, Use, Utf8, CODE_NAME_MAX};
use super::{KEY_KEEP, STREAM_ID_MAX};
use crate::idtable::Insert;
use crate::scan;
use crate::WireError;

impl StreamScan {
    /// The next element of the innermost document, its terminator, or (once it is not
    /// walked) the rest of it passed over.
    pub(super) fn next_elem(&mut self) {
        self.carry.clear();
        self.overflow = false;
        self.kept = false;
        let Some(f) = self.top() else {
            return self.after_body();
        };
        if f.left == 0 || f.walk {
            self.term = f.left == 0;
            self.set(Need::Take(1), Step::Tag);
        } else {
            self.set(Need::Skip(f.left), Step::Elem);
        }
    }

    fn after_body(&mut self) {
        if self.is_msg {
            self.next_section()
        } else {
            self.set(Need::Skip(0), Step::ReplyDocs)
        }
    }

    pub(super) fn on_tag(&mut self) {
        let Some(f) = self.top() else {
            return self.after_body();
        };
        let byte = self.carry.first().copied().unwrap_or(1);
        if !self.term {
            self.tag = byte;
            self.carry.clear();
            return self.set(
                Need::CStr {
                    room: f.left,
                    keep: KEY_KEEP + 1,
                },
                Step::Key,
            );
        }
        // The terminator.
        self.depth -= 1;
        if byte != 0 {
            return match f.role {
                Role::Body | Role::Cursor => self.fatal(WireError::BadBson("document terminator")),
                Role::Batch | Role::Doc => self.dup_break(),
            };
        }
        if f.role == Role::Batch {
            // Only the first batch is read; the rest of `cursor` is passed over.
            if let Some(parent) = self
                .depth
                .checked_sub(1)
                .and_then(|d| self.frames.get_mut(d))
            {
                parent.walk = false;
            }
        }
        self.next_elem();
    }

    pub(super) fn on_key(&mut self) {
        let Some(f) = self.top() else {
            return self.after_body();
        };
        let key: &[u8] = match self.carry.split_last() {
            Some((0, key)) if !self.overflow => key,
            _ => b"",
        };
        let tag = self.tag;
        let use_ = match f.role {
            Role::Body => match key {
                b"ok" | b"code" if !is_int(tag) && tag != scan::BOOLEAN => {
                    if key == b"ok" {
                        self.status.ok = false;
                    } else {
                        self.status.code = None;
                    }
                    Use::Skip
                }
                b"ok" => Use::Ok,
                b"code" if tag == scan::BOOLEAN => {
                    self.status.code = None;
                    Use::Skip
                }
                b"code" => Use::Code,
                b"codeName" if tag == scan::STRING => Use::CodeName,
                b"cursor" if tag == scan::DOCUMENT && self.walk_dups && !self.cursor_seen => {
                    self.cursor_seen = true;
                    Use::Cursor
                }
                _ => Use::Skip,
            },
            Role::Cursor => match key {
                b"firstBatch" | b"nextBatch" if tag == scan::ARRAY => Use::Batch,
                _ => Use::Skip,
            },
            Role::Batch if self.looked >= self.cap.unwrap_or(0) => {
                self.count.skipped = self.count.skipped.saturating_add(1);
                Use::Skip
            }
            Role::Batch if tag == scan::DOCUMENT => Use::Doc,
            Role::Batch => Use::Skip,
            Role::Doc if key == b"_id" => {
                self.looked += 1;
                // Only the first `_id` of a document counts.
                if let Some(d) = self
                    .depth
                    .checked_sub(1)
                    .and_then(|d| self.frames.get_mut(d))
                {
                    d.walk = false;
                }
                Use::Id
            }
            Role::Doc => Use::Skip,
        };
        self.use_ = use_;
        self.carry.clear();
        self.overflow = false;
        if use_ == Use::Id {
            self.carry.extend_from_slice(&[tag, b'_', b'i', b'd', 0]);
        }
        self.value(f.left);
    }

    pub(super) fn keep_limit(&self) -> usize {
        if self.use_ == Use::Id {
            STREAM_ID_MAX
        } else {
            0
        }
    }

    /// Starts reading a value of type `self.tag` with `left` bytes before the terminator of
    /// its document, as `value_size` sizes it.
    fn value(&mut self, left: u64) {
        let fixed: u64 = match self.tag {
            0x01 | 0x09 | 0x11 | 0x12 => 8,
            0x10 => 4,
            0x08 => 1,
            0x07 => 12,
            0x13 => 16,
            0x06 | 0x0A | 0x7F | 0xFF => 0,
            0x02 | 0x03 | 0x04 | 0x05 | 0x0C | 0x0D | 0x0E | 0x0F if left < 4 => {
                return self.bad("value length")
            }
            0x02 | 0x03 | 0x04 | 0x05 | 0x0C | 0x0D | 0x0E | 0x0F => {
                return self.set(Need::Take(4), Step::Len)
            }
            0x0B => {
                let keep = self.keep_limit();
                return self.set(Need::CStr { room: left, keep }, Step::Regex1);
            }
            _ => return self.bad("unknown element type"),
        };
        if fixed > left {
            return self.bad("element overruns its document");
        }
        match self.use_ {
            Use::Ok | Use::Code | Use::Id => self.set(Need::Take(fixed as usize), Step::Fixed),
            _ => self.set(Need::Skip(fixed), Step::Value),
        }
    }

    pub(super) fn on_fixed(&mut self) {
        let value = &self.carry[..];
        match self.use_ {
            Use::Ok => {
                self.status.ok = match self.tag {
                    scan::BOOLEAN => value.first() == Some(&1),
                    tag => scan::int_value(&elem(tag, value)) == Some(1),
                }
            }
            Use::Code => {
                self.status.code =
                    scan::int_value(&elem(self.tag, value)).and_then(|c| i32::try_from(c).ok())
            }
            _ => {
                self.kept = true;
                self.id_done();
            }
        }
        self.next_elem();
    }

    /// A length-prefixed value's length read: checked as `value_size` checks it.
    pub(super) fn on_len(&mut self) {
        let n = self.last_i32() as i64;
        let left = self.top().map_or(0, |f| f.left) as i64;
        // The bytes after the length, and where among them the NUL must be.
        let (rest, nul) = match self.tag {
            0x02 | 0x0D | 0x0E if n >= 1 && n <= left => (n, Some(n - 1)),
            0x03 | 0x04 if n >= 5 && n - 4 <= left => (n - 4, Some(n - 5)),
            0x05 if n >= 0 && n < left => (n + 1, None),
            0x0C if n >= 1 && n + 12 <= left => (n + 12, Some(n - 1)),
            0x0F if n >= 14 && n - 4 <= left => (n - 4, None),
            _ => return self.bad("value length"),
        };
        let (rest, n) = (rest as u64, n as u64);
        match self.use_ {
            Use::Cursor => return self.push(Role::Cursor, n),
            Use::Batch => return self.push(Role::Batch, n),
            Use::Doc => return self.push(Role::Doc, n),
            _ => {}
        }
        self.nul_pos = nul.map_or(super::NO_POS, |at| self.pos + at as u64);
        let keep = match self.use_ {
            Use::CodeName => n - 1 <= CODE_NAME_MAX as u64,
            Use::Id => self.carry.len() as u64 + rest <= STREAM_ID_MAX as u64,
            _ => false,
        };
        self.kept = keep;
        if keep {
            if self.use_ == Use::CodeName {
                self.carry.clear();
            }
            self.set(Need::Take(rest as usize), Step::Value);
        } else {
            if self.use_ == Use::CodeName {
                self.utf8 = Some(Utf8::default());
            }
            self.set(Need::Skip(rest), Step::Value);
        }
    }

    pub(super) fn on_value(&mut self) {
        match self.use_ {
            Use::CodeName if self.kept => {
                let text = self.carry.split_last().map_or(&[][..], |(_, t)| t);
                match std::str::from_utf8(text) {
                    Ok(s) => self.status.code_name = Some(s.to_owned()),
                    Err(_) => return self.fatal(WireError::BadBson("reply body")),
                }
            }
            Use::CodeName => {
                if !self.utf8.take().is_some_and(|u| u.valid()) {
                    return self.fatal(WireError::BadBson("reply body"));
                }
                // Too long to keep: reported as absent.
                self.status.code_name = None;
            }
            Use::Id => self.id_done(),
            _ => {}
        }
        self.next_elem();
    }

    /// A batch document's `_id` read: kept and compared when small enough, else skipped.
    pub(super) fn id_done(&mut self) {
        if self.kept {
            let id = std::mem::take(&mut self.carry);
            self.record(Some(&id));
            self.carry = id;
        } else {
            self.record(None);
        }
    }

    /// A batch document's `_id` (`None`: too large to keep), looked at: a repeat counted,
    /// or, when the table's probe steps are spent, this and every later document skipped.
    #[inline]
    pub(super) fn record(&mut self, id: Option<&[u8]>) {
        let Some(id) = id else {
            self.count.skipped = self.count.skipped.saturating_add(1);
            return;
        };
        match self.ids.insert(id) {
            Insert::New => {}
            Insert::Repeat => self.count.duplicates = self.count.duplicates.saturating_add(1),
            Insert::Spent => {
                self.count.skipped = self.count.skipped.saturating_add(1);
                self.cap = Some(self.looked);
                return;
            }
        }
        self.count.examined = self.count.examined.saturating_add(1);
    }
}
