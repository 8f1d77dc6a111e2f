//! The batch walked straight from a piece: where a cursor batch's next documents lie whole in
//! the piece being fed, [`StreamScan::fast_batch`] reads them over the borrowed bytes with
//! what `duplicate_ids` reads them with (`scan::plain_doc`, `dupids::doc_id`), instead of
//! byte state by byte state. The answer is the same; what is not plain (a document cut by
//! the piece's end, a batch element that is not a document or has a key of eight bytes or
//! more, anything malformed, an `_id` that is a regex) is left to the state machine, which
//! takes over at that element's first byte.

use super::{Role, Step, StreamScan, STREAM_ID_MAX};
use crate::dupids::doc_id;
use crate::scan;

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
        let (mut at, mut klen) = (0, 1);
        while self.looked < self.cap.unwrap_or(0) {
            let Some((v, end)) = scan::plain_doc(bytes, at, &mut klen) else {
                break;
            };
            let Some(id) = first_id(&bytes[v..end]) else {
                break;
            };
            if let Some(id) = id {
                // Room for as many `_id`s as the batch holds if its documents are all the
                // size of its first.
                let left = usize::try_from(batch.left).unwrap_or(usize::MAX);
                self.ids.expect(left / (end - at) + 1);
                self.looked += 1;
                self.record((id.len() <= STREAM_ID_MAX).then_some(id));
            }
            at = end;
        }
        if self.looked >= self.cap.unwrap_or(0) {
            // Past the cap the documents are only counted.
            let mut docs = 0u32;
            while let Some((_, end)) = scan::plain_doc(bytes, at, &mut klen) {
                at = end;
                docs += 1;
            }
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

/// The first `_id` element of a batch document (type byte, key and value), `Some(None)` when
/// it has none; `None` when the document is malformed before it, or the `_id` is a regex
/// (which the state machine sizes by its own rules).
fn first_id(doc: &[u8]) -> Option<Option<&[u8]>> {
    match doc_id(doc).ok()? {
        Some((a, _)) if doc.get(a) == Some(&0x0B) => None,
        Some((a, b)) => doc.get(a..b).map(Some),
        None => Some(None),
    }
}
