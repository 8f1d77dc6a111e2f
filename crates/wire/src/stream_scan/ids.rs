//! The `_id`s a [`super::StreamScan`] keeps while it reads a cursor batch: one arena of
//! element bytes, one `(hash, start, end)` entry per distinct `_id`, and an open-addressing
//! table of entry numbers. A repeat is found by hash, then confirmed byte for byte, so a
//! collision never counts. Every buffer grows by doubling but never past what `max_ids`
//! `_id`s of [`super::STREAM_ID_MAX`] bytes need.

use super::STREAM_ID_MAX;
use crate::dupids::id_hash;

#[derive(Debug, Default)]
pub(super) struct Ids {
    arena: Vec<u8>,
    entries: Vec<(u64, u32, u32)>,
    /// Entry number + 1 per slot, 0 for an empty slot; length a power of two, at least twice
    /// the entries.
    slots: Vec<u32>,
    max_ids: usize,
}

impl Ids {
    pub(super) fn new(max_ids: usize) -> Ids {
        Ids {
            max_ids,
            ..Ids::default()
        }
    }

    /// Keeps `elem` (a whole `_id` element) unless an equal one is kept already; returns
    /// whether it was (a repeat).
    pub(super) fn insert(&mut self, elem: &[u8]) -> bool {
        let hash = id_hash(elem);
        if self.slots.len() < 2 * (self.entries.len() + 1) {
            self.rehash();
        }
        let mask = self.slots.len() - 1;
        let mut i = hash as usize & mask;
        while let Some(&slot) = self.slots.get(i) {
            if slot == 0 {
                break;
            }
            if let Some(&(h, a, b)) = self.entries.get(slot as usize - 1) {
                if h == hash && self.arena.get(a as usize..b as usize) == Some(elem) {
                    return true;
                }
            }
            i = (i + 1) & mask;
        }
        let limit = self.max_ids.saturating_mul(STREAM_ID_MAX);
        reserve_bounded(&mut self.arena, elem.len(), limit);
        reserve_bounded(&mut self.entries, 1, self.max_ids);
        let start = self.arena.len();
        self.arena.extend_from_slice(elem);
        // The arena holds bytes of one message (under 2 GiB): offsets fit u32.
        self.entries
            .push((hash, start as u32, self.arena.len() as u32));
        if let Some(slot) = self.slots.get_mut(i) {
            *slot = self.entries.len() as u32;
        }
        false
    }

    /// Bytes the buffers hold (their capacity).
    pub(super) fn held(&self) -> usize {
        self.arena.capacity()
            + self.entries.capacity() * std::mem::size_of::<(u64, u32, u32)>()
            + self.slots.capacity() * std::mem::size_of::<u32>()
    }

    fn rehash(&mut self) {
        let len = (2 * (self.entries.len() + 1)).next_power_of_two().max(16);
        let mask = len - 1;
        let mut slots = vec![0u32; len];
        for (n, &(hash, _, _)) in self.entries.iter().enumerate() {
            let mut i = hash as usize & mask;
            while slots.get(i).is_some_and(|&s| s != 0) {
                i = (i + 1) & mask;
            }
            if let Some(slot) = slots.get_mut(i) {
                *slot = n as u32 + 1;
            }
        }
        self.slots = slots;
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
