//! Documents returned twice in one reply: the orphans a proxy can see. A read served with
//! `readConcern: available` skips the shards' ownership filter, so a document that a
//! migration left behind on its donor comes back from both shards, with the same `_id`.
//!
//! [`duplicate_ids`] walks `cursor.firstBatch` / `cursor.nextBatch` of a reply body, takes
//! each document's raw `_id` (type byte and value bytes, compared exactly, so `1` and `1.0`
//! differ as they do to the server's `_id` index) and counts the documents whose `_id` was
//! seen earlier in the same reply. Every element is checked as the element scanner checks
//! it: a plain document element is read by [`scan::plain_doc`], anything else by the
//! scanner; an `_id` that is a document's first field (the server puts it first) is read
//! at once, other documents are walked to it. Bounded: at most `cap` documents are looked
//! at (the rest are counted, as not examined); the only memory is an [`IdSet`] the caller
//! keeps and reuses, a table of eight bytes per slot, at most half full, sized once from
//! the batch's length and its first document's (let go after a reply of more than
//! [`KEEP_IDS`] documents). Hashing, the byte-for-byte confirmation and the bound on
//! probing are `idtable.rs`'s. A whole reply message is counted by
//! [`crate::Reply::status_and_duplicates`], in the pass that reads its status.

use crate::idtable::{IdHasher, IdTable, Insert};
use crate::scan::{self, Elements, Malformed};

/// Reusable scratch space: the table of the `_id`s seen, as offsets into the batch.
#[derive(Debug, Default)]
pub struct IdSet {
    table: IdTable,
}

impl IdSet {
    /// Entries the set has room for without growing.
    pub fn capacity(&self) -> usize {
        self.table.slot_capacity() / 2
    }
}

/// What one reply held.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DupCount {
    /// Documents examined (in the batch, up to the cap).
    pub examined: u32,
    /// Examined documents whose `_id` appeared earlier in the reply.
    pub duplicates: u32,
    /// Documents past the cap, not examined.
    pub skipped: u32,
}

/// Documents of one reply the proxy examines (the session's cap for both the whole-reply
/// and the streamed count); the rest of a batch is counted in [`DupCount::skipped`].
pub const ORPHAN_SCAN_CAP: usize = 4096;

/// An emptied set keeps room for this many `_id`s (4 KiB of slots); a larger one is let
/// go, so an idle connection does not keep the scratch space of its largest reply.
pub const KEEP_IDS: usize = 256;

/// The batch array's bytes of a cursor reply body, if it has one.
fn batch(body: &[u8]) -> Result<Option<&[u8]>, Malformed> {
    let mut top = Elements::new(body)?;
    while let Some(e) = top.next_elem()? {
        if e.key == b"cursor" && e.tag == scan::DOCUMENT {
            let mut cursor = Elements::new(e.value)?;
            while let Some(c) = cursor.next_elem()? {
                if (c.key == b"firstBatch" || c.key == b"nextBatch") && c.tag == scan::ARRAY {
                    return Ok(Some(c.value));
                }
            }
            return Ok(None);
        }
    }
    Ok(None)
}

/// Where the `_id` element of a (checked) batch document lies in it: read at once when it
/// is the first field, else found by walking the fields before it; `None` without one.
/// The same checks as walking the fields with [`Elements`] to the `_id`.
#[inline(always)]
pub(crate) fn doc_id(doc: &[u8]) -> Result<Option<(usize, usize)>, Malformed> {
    if let (Some(&tag), Some(b"_id\0"), Some(room)) = (
        doc.get(4),
        doc.get(5..9),
        doc.get(9..doc.len().saturating_sub(1)),
    ) {
        return Ok(Some((4, 9 + scan::value_size(tag, room)?)));
    }
    id_field(doc)
}

/// [`doc_id`] for a document that does not start with its `_id`.
#[inline(never)]
fn id_field(doc: &[u8]) -> Result<Option<(usize, usize)>, Malformed> {
    let mut fields = Elements::new(doc)?;
    while let Some(f) = fields.next_elem()? {
        if f.key == b"_id" {
            return Ok(Some((f.start, f.end)));
        }
    }
    Ok(None)
}

/// The batch element at `at` of `array` (`elems`: its elements, without the terminator):
/// its type, where it starts, and where its value starts and ends. A plain document is
/// read by [`scan::plain_doc`], anything else by the element scanner, which checks it.
#[inline(always)]
fn element(
    array: &[u8],
    elems: &[u8],
    at: usize,
    klen: &mut usize,
) -> Result<(u8, usize, (usize, usize)), Malformed> {
    match scan::plain_doc(elems, at, klen) {
        Some(v) => Ok((scan::DOCUMENT, at, v)),
        None => any_element(array, at),
    }
}

/// [`element`] by the element scanner.
#[inline(never)]
fn any_element(array: &[u8], at: usize) -> Result<(u8, usize, (usize, usize)), Malformed> {
    let e = Elements::resume(array, at)?
        .next_elem()?
        .ok_or(Malformed("batch element"))?;
    Ok((e.tag, e.start, (e.end - e.value.len(), e.end)))
}

/// The elements from `at` to the end of the batch, each checked, counted.
#[inline(never)]
fn count_rest(
    array: &[u8],
    elems: &[u8],
    mut at: usize,
    mut klen: usize,
) -> Result<u32, Malformed> {
    let mut n = 0u32;
    loop {
        while let Some((_, end)) = scan::plain_doc(elems, at, &mut klen) {
            at = end;
            n += 1;
        }
        if at >= elems.len() {
            return Ok(n);
        }
        at = any_element(array, at)?.2 .1;
        n += 1;
    }
}

/// Counts documents of a cursor reply `body` whose `_id` appears earlier in the same batch,
/// examining at most `cap` documents. A reply without a cursor batch counts nothing.
pub fn duplicate_ids(body: &[u8], set: &mut IdSet, cap: usize) -> Result<DupCount, Malformed> {
    let count = count_in(body, set, cap, IdHasher::process());
    if set.table.slot_capacity() > 2 * KEEP_IDS {
        set.table.release();
    }
    count
}

/// [`duplicate_ids`] under `hasher`.
fn count_in(
    body: &[u8],
    set: &mut IdSet,
    cap: usize,
    hasher: IdHasher,
) -> Result<DupCount, Malformed> {
    let mut count = DupCount::default();
    let Some(array) = batch(body)? else {
        return Ok(count);
    };
    // Offsets into `array` are kept as u32s.
    if array.len() >= u32::MAX as usize {
        return Err(Malformed("batch larger than 4 GiB"));
    }
    let table = &mut set.table;
    let mut sized = false;
    let mut limit = cap;
    // The elements end before the array's terminator.
    Elements::new(array)?;
    let elems = &array[..array.len() - 1];
    let (mut at, mut klen) = (4, 1);
    while at < elems.len() {
        let (tag, start, value) = element(array, elems, at, &mut klen)?;
        at = value.1;
        if count.examined as usize >= limit {
            count.skipped += 1 + count_rest(array, elems, at, klen)?;
            break;
        }
        if tag != scan::DOCUMENT {
            continue;
        }
        let Some((a, b)) = doc_id(&array[value.0..value.1])? else {
            continue;
        };
        let id = &array[value.0 + a..value.0 + b];
        if !sized {
            // Room for as many documents as the batch holds if they are all this size (it
            // grows past that if they are not).
            table.reset(limit.min(array.len() / (value.1 - start) + 1));
            sized = true;
        }
        match table.insert(array, id, hasher.hash(id), value.0 + a) {
            Insert::New => count.examined += 1,
            Insert::Repeat => {
                count.examined += 1;
                count.duplicates += 1;
            }
            Insert::Spent => {
                count.skipped += 1;
                limit = count.examined as usize;
            }
        }
    }
    Ok(count)
}

#[cfg(test)]
mod tests;
