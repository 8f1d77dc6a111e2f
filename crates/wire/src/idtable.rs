//! The set of `_id`s one reply's scan has seen (`dupids.rs` over a whole reply,
//! `stream_scan/ids.rs` over its pieces): a keyed hash of an `_id` element read eight bytes
//! at a time ([`IdHasher`]), and an open-addressing table of the elements' offsets
//! ([`IdTable`]).
//!
//! - A repeat is found by hash, then confirmed byte for byte, so a collision never counts.
//! - A large `_id` costs no more to hash than a small one: its first [`HASH_HEAD`] and last
//!   [`HASH_TAIL`] bytes and its length are hashed.
//! - No input makes the table quadratic. The `_id`s are the clients' to choose, so the hash
//!   is keyed by a per-process random seed (an attacker cannot aim at a slot), and the probe
//!   steps of one scan are bounded: [`PROBE_START`] plus [`PROBE_CREDIT`] per `_id` (at half
//!   load a random hash needs about one step per `_id`). A scan that runs out stops
//!   examining: [`Insert::Spent`], the rest counted as not examined (the count is a lower
//!   bound already).

use std::sync::OnceLock;

/// Bytes of an `_id` value hashed from its start, and from its end.
pub const HASH_HEAD: usize = 48;
pub const HASH_TAIL: usize = 16;

/// Probe steps a scan may take before its first `_id`, and more per `_id` inserted.
pub const PROBE_START: usize = 64;
pub const PROBE_CREDIT: usize = 16;

/// The least number of slots a table has.
const MIN_SLOTS: usize = 16;

/// A keyed hash of `_id` elements. Not a cryptographic one: a folded 64×128-bit multiply of
/// the value's words with secret keys (as in wyhash/aHash), whose keys a client never sees.
#[derive(Debug, Clone, Copy)]
pub struct IdHasher {
    keys: [u64; 4],
    /// Tests: every `_id` gets the same hash (the worst case, collisions everywhere).
    #[cfg(test)]
    flat: bool,
}

static KEYS: OnceLock<[u64; 4]> = OnceLock::new();

#[inline(always)]
fn fold(a: u64, b: u64) -> u64 {
    let p = u128::from(a) * u128::from(b);
    (p as u64) ^ ((p >> 64) as u64)
}

#[inline(always)]
fn word(b: &[u8], at: usize) -> u64 {
    match b.get(at..at + 8) {
        Some(w) => u64::from_le_bytes([w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7]]),
        None => 0,
    }
}

#[inline(always)]
fn half(b: &[u8], at: usize) -> u64 {
    match b.get(at..at + 4) {
        Some(w) => u64::from(u32::from_le_bytes([w[0], w[1], w[2], w[3]])),
        None => 0,
    }
}

impl IdHasher {
    /// The process's hasher: keys drawn once, from the randomness the standard library seeds
    /// its `HashMap`s with (the operating system's).
    pub fn process() -> IdHasher {
        let keys = *KEYS.get_or_init(|| {
            use std::hash::{BuildHasher, Hasher};
            let state = std::collections::hash_map::RandomState::new();
            let mut keys = [0u64; 4];
            for (i, k) in keys.iter_mut().enumerate() {
                let mut h = state.build_hasher();
                h.write_usize(i);
                // Odd: a key is never zero, so no word alone zeroes a product.
                *k = h.finish() | 1;
            }
            keys
        });
        IdHasher {
            keys,
            #[cfg(test)]
            flat: false,
        }
    }

    /// Tests: a hasher under which every `_id` collides.
    #[cfg(test)]
    pub(crate) fn flat() -> IdHasher {
        IdHasher {
            flat: true,
            ..IdHasher::process()
        }
    }

    /// The hash of one `_id` element (type byte, the key `_id\0`, the value). The key is
    /// the same in every element and is not read; the type byte and the value's length are
    /// mixed in, then the value: whole up to 16 bytes (two overlapping reads, so every byte
    /// counts), else its first [`HASH_HEAD`] bytes 16 at a time and its last [`HASH_TAIL`].
    #[inline(always)]
    pub fn hash(&self, elem: &[u8]) -> u64 {
        #[cfg(test)]
        if self.flat {
            return 0x5eed_0000_0000_0000;
        }
        let [k0, k1, k2, k3] = self.keys;
        let tag = u64::from(elem.first().copied().unwrap_or(0));
        let v = elem.get(5..).unwrap_or_default();
        let n = v.len();
        let h = k0 ^ (tag << 56) ^ n as u64;
        if n <= 16 {
            let (a, b) = if n >= 8 {
                (word(v, 0), word(v, n - 8))
            } else if n >= 4 {
                (half(v, 0), half(v, n - 4))
            } else if n > 0 {
                let at = |i: usize| u64::from(v[i]);
                ((at(0) << 16) | (at(n / 2) << 8) | at(n - 1), 0)
            } else {
                (0, 0)
            };
            return fold(a ^ k1, b ^ h);
        }
        let mut h = h;
        let head = &v[..n.min(HASH_HEAD)];
        for c in head.chunks_exact(16) {
            h = fold(word(c, 0) ^ k1, word(c, 8) ^ h);
        }
        let tail = &v[n - HASH_TAIL..];
        fold(word(tail, 0) ^ k2, word(tail, 8) ^ h ^ k3)
    }
}

/// What [`IdTable::insert`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Insert {
    /// Not seen before: now kept.
    New,
    /// An equal element was kept already.
    Repeat,
    /// The scan's probe steps are spent: nothing more is examined.
    Spent,
}

/// Open addressing with linear probing over `u64` slots: the hash's upper 32 bits, then the
/// element's offset + 1 in the bytes it lies in (0: an empty slot). A slot is looked at by
/// those 32 bits (its index is their low bits), and an equal hash is confirmed by comparing
/// the bytes. At most half the slots are full.
#[derive(Debug, Default)]
pub struct IdTable {
    slots: Vec<u64>,
    len: usize,
    /// Probe steps past a home slot taken since the last reset.
    steps: usize,
}

impl IdTable {
    /// Elements kept.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Slots allocated (the memory held is eight bytes each).
    pub fn slot_capacity(&self) -> usize {
        self.slots.capacity()
    }

    /// Empties the table for a new scan of about `expected` elements (it grows past that
    /// if needed), keeping its allocation when it is large enough.
    pub fn reset(&mut self, expected: usize) {
        let want = expected
            .saturating_mul(2)
            .checked_next_power_of_two()
            .unwrap_or(1 << 31)
            .clamp(MIN_SLOTS, 1 << 31);
        self.slots.clear();
        self.slots.resize(want, 0);
        self.len = 0;
        self.steps = 0;
    }

    /// Lets the allocation go.
    pub fn release(&mut self) {
        *self = IdTable::default();
    }

    /// `elem`, hashed `hash`, lies (or is about to be put, when new) at offset `at` of
    /// `src`, where every element kept so far lies at its own offset. Elements compared
    /// equal are equal: `src` holds at a kept offset a whole, checked BSON element, whose
    /// length is fixed by its type byte and by bytes within any element it shares a prefix
    /// of `elem.len()` bytes with (a length field, or a regex's terminators), so an equal
    /// prefix is an equal element.
    #[inline]
    pub fn insert(&mut self, src: &[u8], elem: &[u8], hash: u64, at: usize) -> Insert {
        if 2 * (self.len + 1) > self.slots.len() {
            self.grow();
        }
        // Offsets are of one message's bytes (under 2 GiB): this holds.
        let Some(off) = u32::try_from(at).ok().and_then(|a| a.checked_add(1)) else {
            return Insert::Spent;
        };
        let high = hash >> 32;
        let mask = self.slots.len() - 1;
        let i = high as usize & mask;
        match self.slots.get_mut(i) {
            // The common case: the home slot is free.
            Some(slot) if *slot == 0 => *slot = (high << 32) | u64::from(off),
            _ => return self.probe(src, elem, high, off),
        }
        self.len += 1;
        Insert::New
    }

    /// [`IdTable::insert`] past an occupied home slot: linear probing, within the budget.
    #[inline(never)]
    fn probe(&mut self, src: &[u8], elem: &[u8], high: u64, off: u32) -> Insert {
        // The budget, spent only here: PROBE_START, and PROBE_CREDIT per element kept.
        let budget = PROBE_START.saturating_add(PROBE_CREDIT.saturating_mul(self.len));
        let mask = self.slots.len() - 1;
        let mut i = high as usize & mask;
        loop {
            let Some(&slot) = self.slots.get(i) else {
                return Insert::Spent;
            };
            if slot == 0 {
                break;
            }
            if slot >> 32 == high {
                let at = (slot & 0xffff_ffff) as usize - 1;
                if src.get(at..at + elem.len()) == Some(elem) {
                    return Insert::Repeat;
                }
            }
            if self.steps >= budget {
                return Insert::Spent;
            }
            self.steps += 1;
            i = (i + 1) & mask;
        }
        if let Some(slot) = self.slots.get_mut(i) {
            *slot = (high << 32) | u64::from(off);
        }
        self.len += 1;
        Insert::New
    }

    /// Twice the slots, the kept elements placed again by their stored hash bits.
    fn grow(&mut self) {
        let len = (self.slots.len() * 2).max(MIN_SLOTS);
        let mask = len - 1;
        let mut slots = vec![0u64; len];
        for &s in self.slots.iter().filter(|&&s| s != 0) {
            let mut i = (s >> 32) as usize & mask;
            while slots.get(i).is_some_and(|&t| t != 0) {
                i = (i + 1) & mask;
            }
            if let Some(t) = slots.get_mut(i) {
                *t = s;
            }
        }
        self.slots = slots;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn elem(tag: u8, value: &[u8]) -> Vec<u8> {
        let mut e = vec![tag];
        e.extend_from_slice(b"_id\0");
        e.extend_from_slice(value);
        e
    }

    #[test]
    fn every_byte_of_a_small_value_counts() {
        let h = IdHasher::process();
        for n in 0..=16usize {
            let base = vec![0x41u8; n];
            let mut seen = std::collections::HashSet::new();
            assert!(seen.insert(h.hash(&elem(0x05, &base))));
            for i in 0..n {
                let mut v = base.clone();
                v[i] ^= 1;
                // Distinct values of one length: distinct (a,b) words, so a collision here
                // would be the multiply's, about 2^-64.
                assert!(seen.insert(h.hash(&elem(0x05, &v))), "n {n} byte {i}");
            }
        }
        // The type byte and the length count.
        assert_ne!(
            h.hash(&elem(0x10, &[1, 0, 0, 0])),
            h.hash(&elem(0x07, &[1, 0, 0, 0]))
        );
        assert_ne!(h.hash(&elem(0x05, &[0; 3])), h.hash(&elem(0x05, &[0; 4])));
        // Short and malformed elements hash without a panic.
        for n in 0..6 {
            h.hash(&vec![7u8; n]);
        }
    }

    #[test]
    fn collisions_are_compared_byte_for_byte() {
        let flat = IdHasher::flat();
        let mut src = Vec::new();
        let mut t = IdTable::default();
        let mut put = |t: &mut IdTable, e: &[u8]| {
            let r = t.insert(&src, e, flat.hash(e), src.len());
            if r == Insert::New {
                src.extend_from_slice(e);
            }
            r
        };
        let (a, b) = (elem(0x10, &[1, 0, 0, 0]), elem(0x10, &[2, 0, 0, 0]));
        assert_eq!(flat.hash(&a), flat.hash(&b));
        assert_eq!(put(&mut t, &a), Insert::New);
        assert_eq!(put(&mut t, &b), Insert::New);
        assert_eq!(put(&mut t, &a), Insert::Repeat);
        assert_eq!(put(&mut t, &b), Insert::Repeat);
        assert_eq!(t.len(), 2);
    }

    #[test]
    fn probes_are_bounded_when_everything_collides() {
        let flat = IdHasher::flat();
        let mut src = Vec::new();
        let mut t = IdTable::default();
        t.reset(10_000);
        let mut kept = 0usize;
        for i in 0..10_000u32 {
            let e = elem(0x10, &i.to_le_bytes());
            match t.insert(&src, &e, flat.hash(&e), src.len()) {
                Insert::New => {
                    src.extend_from_slice(&e);
                    kept += 1;
                }
                Insert::Repeat => panic!("{i} is new"),
                Insert::Spent => break,
            }
        }
        // Each insert probes past every kept element: k(k-1)/2 steps for k kept, within
        // PROBE_START + PROBE_CREDIT * k.
        assert!(kept > 10 && kept < 64, "kept {kept}");
        let random = IdHasher::process();
        let (mut src, mut t) = (Vec::new(), IdTable::default());
        for i in 0..100_000u32 {
            let e = elem(0x10, &i.to_le_bytes());
            let r = t.insert(&src, &e, random.hash(&e), src.len());
            assert_eq!(r, Insert::New, "{i}");
            src.extend_from_slice(&e);
        }
        assert_eq!(t.len(), 100_000);
        assert!(t.slot_capacity() <= 262_144, "{}", t.slot_capacity());
    }

    #[test]
    fn a_table_keeps_its_allocation_when_reset() {
        let mut t = IdTable::default();
        t.reset(100);
        let cap = t.slot_capacity();
        assert_eq!(cap, 256);
        t.reset(50);
        assert_eq!(t.slot_capacity(), cap);
        assert!(t.is_empty());
    }
}
