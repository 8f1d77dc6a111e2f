//! The `_id`s a [`super::StreamScan`] keeps while it reads a cursor batch: one arena of
//! element bytes and an [`IdTable`] of their offsets in it (hashing, the byte-for-byte
//! confirmation and the bound on probing are `idtable.rs`'s, shared with the whole-reply
//! count). The arena grows by doubling but never past what `max_ids` `_id`s of
//! [`super::STREAM_ID_MAX`] bytes need; the table holds at most `2 × max_ids` slots.

use super::STREAM_ID_MAX;
use crate::idtable::{IdHasher, IdTable, Insert};

#[derive(Debug)]
pub(super) struct Ids {
    arena: Vec<u8>,
    table: IdTable,
    hasher: IdHasher,
    max_ids: usize,
    /// The table was sized for the batch ([`Ids::expect`]).
    sized: bool,
}

impl Ids {
    pub(super) fn new(max_ids: usize) -> Ids {
        Ids {
            arena: Vec::new(),
            table: IdTable::default(),
            hasher: IdHasher::process(),
            max_ids,
            sized: false,
        }
    }

    /// Tests: every `_id` hashed alike.
    #[cfg(test)]
    pub(super) fn flat(&mut self) {
        self.hasher = IdHasher::flat();
    }

    /// Before the first `_id`: room for about `expected` of them (at most `max_ids`); once.
    #[inline]
    pub(super) fn expect(&mut self, expected: usize) {
        if !self.sized && self.table.is_empty() {
            self.table.reset(expected.min(self.max_ids));
        }
        self.sized = true;
    }

    /// Keeps `elem` (a whole, checked `_id` element) unless an equal one is kept already:
    /// [`Insert::Repeat`] when it was, [`Insert::Spent`] when the table's probe steps are
    /// spent (nothing kept).
    #[inline]
    pub(super) fn insert(&mut self, elem: &[u8]) -> Insert {
        let hash = self.hasher.hash(elem);
        let at = self.arena.len();
        let found = self.table.insert(&self.arena, elem, hash, at);
        if found == Insert::New {
            let limit = self.max_ids.saturating_mul(STREAM_ID_MAX);
            reserve_bounded(&mut self.arena, elem.len(), limit);
            self.arena.extend_from_slice(elem);
        }
        found
    }

    /// Bytes the buffers hold (their capacity).
    pub(super) fn held(&self) -> usize {
        self.arena.capacity() + self.table.slot_capacity() * std::mem::size_of::<u64>()
    }
}

/// Room for `extra` more items: doubling, but not past `limit` items unless needed.
fn reserve_bounded<T>(v: &mut Vec<T>, extra: usize, limit: usize) {
    let needed = v.len().saturating_add(extra);
    if v.capacity() >= needed {
        return;
    }
    let want = v
        .capacity()
        .saturating_mul(2)
        .max(16)
        .min(limit)
        .max(needed);
    v.reserve_exact(want - v.len());
}
