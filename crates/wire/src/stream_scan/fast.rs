//! The batch walked straight from a piece: where a cursor batch's next documents lie whole in
//! the piece being fed, [`StreamScan::fast_batch`] reads them with the element scanner over
//! the borrowed bytes, as `duplicate_ids` does, instead of byte state by byte state. The
//! answer is the same; what is not plain (a document cut by the piece's end, a batch element
//! that is not a document, anything malformed, an `_id` that is a regex) is left to the state
//! machine, which takes over at that element's first byte.

use super::{Role, Step, StreamScan, STREAM_ID_MAX};
use crate::scan::{self, find_nul, Elements};

impl StreamScan {
    /// At the first byte of a batch element: reads the whole batch documents at the front of
    /// `bytes` and returns how many bytes they took (0: none, the state machine goes on).
    pub(super) fn fast_batch(&mut self, bytes: &[u8]) -> usize {
        let Some(batch) = self.top().filter(|f| f.role == Role::Batch && f.walk) else {
            return 0;
        };
        if self.step != Step::Tag || self.term || !self.carry.is_empty() {
            return 0;
        }
        // The batch's elements end before its terminator: `left` bytes from here.
        let room = usize::try_from(batch.left)
            .unwrap_or(usize::MAX)
            .min(bytes.len());
        let bytes = &bytes[..room];
        let cap = self.cap.unwrap_or(0);
        let mut at = 0;
        while self.looked < cap {
            let Some(doc) = whole_doc(&bytes[at..]) else {
                break;
            };
            let Some(id) = first_id(doc.value) else {
                break;
            };
            if let Some(id) = id {
                self.looked += 1;
                if id.len() <= STREAM_ID_MAX {
                    if self.ids.insert(id) {
                        self.count.duplicates = self.count.duplicates.saturating_add(1);
                    }
                    self.count.examined = self.count.examined.saturating_add(1);
                } else {
                    self.count.skipped = self.count.skipped.saturating_add(1);
                }
            }
            at += doc.end;
        }
        if self.looked >= cap {
            // Past the cap the documents are only counted.
            let (took, docs) = skip_docs(&bytes[at..]);
            at += took;
            self.count.skipped = self.count.skipped.saturating_add(docs);
        }
        if at > 0 {
            self.pos += at as u64;
            for f in &mut self.frames[..self.depth] {
                f.left = f.left.saturating_sub(at as u64);
            }
            self.next_elem();
        }
        at
    }
}

/// A batch element at the front of `b` that is a document lying whole in `b`, checked as the
/// state machine checks it; `None` for anything else.
fn whole_doc(b: &[u8]) -> Option<scan::Elem<'_>> {
    if *b.first()? != scan::DOCUMENT {
        return None;
    }
    let key_end = 1 + find_nul(b.get(1..)?)? + 1;
    let n = i32::from_le_bytes(b.get(key_end..key_end + 4)?.try_into().ok()?);
    let end = key_end.checked_add(usize::try_from(n).ok().filter(|&n| n >= 5)?)?;
    let value = b.get(key_end..end)?;
    (value.last() == Some(&0)).then_some(scan::Elem {
        tag: scan::DOCUMENT,
        key: &b[1..key_end - 1],
        value,
        start: 0,
        end,
    })
}

/// Passes over the batch documents lying whole at the front of `b`, checked as
/// [`whole_doc`] checks them; returns the bytes they take and how many they are. The loop
/// a reply of many small documents spends its time in once the cap is reached: a key is an
/// array index (a few digits), found within its first 16 bytes or left to the slow path.
fn skip_docs(b: &[u8]) -> (usize, u32) {
    let (mut at, mut docs) = (0usize, 0u32);
    while let Some(rest) = b.get(at..) {
        if rest.first() != Some(&scan::DOCUMENT) {
            break;
        }
        let key = &rest[1..rest.len().min(17)];
        let Some(nul) = key.iter().position(|&c| c == 0) else {
            break;
        };
        let v = nul + 2;
        let Some(len) = rest.get(v..v + 4) else {
            break;
        };
        let n = i32::from_le_bytes([len[0], len[1], len[2], len[3]]);
        if n < 5 {
            break;
        }
        let end = v + n as usize;
        if rest.get(end - 1) != Some(&0) {
            break;
        }
        at += end;
        docs += 1;
    }
    (at, docs)
}

/// The first `_id` element of a batch document (type byte, key and value), `Some(None)` when
/// it has none; `None` when the document is malformed before it, or the `_id` is a regex
/// (which the state machine sizes by its own rules).
fn first_id(doc: &[u8]) -> Option<Option<&[u8]>> {
    let mut fields = Elements::new(doc).ok()?;
    while let Some(f) = fields.next_elem().ok()? {
        if f.key == b"_id" {
            return (f.tag != 0x0B).then_some(Some(&doc[f.start..f.end]));
        }
    }
    Some(None)
}
