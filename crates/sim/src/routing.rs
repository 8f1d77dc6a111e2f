//! Routing metadata: the hashed shard key, chunks over the hash space, chunk and shard
//! versions, and targeting a filter to the shards that may hold matching documents.

use bson::oid::ObjectId;
use bson::{Bson, Document};

/// Index of a shard in the cluster (`0` = shardA, `1` = shardB).
pub type ShardId = usize;

/// A chunk version `(major, minor)` within one epoch. Majors change when a chunk changes
/// shard; minors on splits and on the donor's control chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct Version {
    pub major: u32,
    pub minor: u32,
}

impl Version {
    pub const fn new(major: u32, minor: u32) -> Version {
        Version { major, minor }
    }
}

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}|{}", self.major, self.minor)
    }
}

/// A shard version as mongos sends it and shards compare it: a version plus the epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardVersion {
    pub version: Version,
    pub epoch: ObjectId,
}

impl ShardVersion {
    /// 4.2's `isWriteCompatibleWith`: same epoch and same major version.
    pub fn compatible(&self, other: &ShardVersion) -> bool {
        self.epoch == other.epoch && self.version.major == other.version.major
    }
}

impl std::fmt::Display for ShardVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}||{}", self.version, self.epoch)
    }
}

/// Lowest hash value (stands for MinKey).
pub const HASH_MIN: i128 = i64::MIN as i128;
/// One past the highest hash value (stands for MaxKey).
pub const HASH_END: i128 = i64::MAX as i128 + 1;

/// A chunk: hashed `_id` values in `[min, max)`, owned by `shard`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunk {
    pub min: i128,
    pub max: i128,
    pub shard: ShardId,
    pub version: Version,
}

impl Chunk {
    pub fn contains(&self, hash: i64) -> bool {
        let h = hash as i128;
        self.min <= h && h < self.max
    }

    /// The bound as a shard-key document value: MinKey/MaxKey or the hash as Int64.
    pub fn bound(b: i128) -> Bson {
        if b <= HASH_MIN {
            Bson::MinKey
        } else if b >= HASH_END {
            Bson::MaxKey
        } else {
            Bson::Int64(b as i64)
        }
    }
}

/// One collection's routing table: a complete snapshot as the config server holds it at one
/// version. Nodes and mongos keep their own (possibly older) snapshots.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Table {
    pub ns: String,
    pub epoch: ObjectId,
    /// Sorted by `min`, covering the whole hash space without gaps.
    pub chunks: Vec<Chunk>,
}

impl Table {
    /// `n` chunks of equal width, dealt out round-robin in halves: the first half of the
    /// chunks to shard 0, the second half to shard 1 (with 4 chunks, 2 per shard).
    pub fn split_evenly(ns: &str, n: usize, shards: usize) -> Table {
        let n = n.max(1);
        let width = (HASH_END - HASH_MIN) / n as i128;
        let chunks = (0..n)
            .map(|i| Chunk {
                min: HASH_MIN + width * i as i128,
                max: if i + 1 == n {
                    HASH_END
                } else {
                    HASH_MIN + width * (i as i128 + 1)
                },
                shard: i * shards.max(1) / n,
                version: Version::new(1, i as u32),
            })
            .collect();
        Table {
            ns: ns.to_string(),
            epoch: ObjectId::new(),
            chunks,
        }
    }

    /// The collection version: the highest chunk version.
    pub fn version(&self) -> Version {
        self.chunks
            .iter()
            .map(|c| c.version)
            .max()
            .unwrap_or_default()
    }

    /// The shard version of `shard`: its highest chunk version, `0|0` if it owns none.
    pub fn shard_version(&self, shard: ShardId) -> ShardVersion {
        let version = self
            .chunks
            .iter()
            .filter(|c| c.shard == shard)
            .map(|c| c.version)
            .max()
            .unwrap_or_default();
        ShardVersion {
            version,
            epoch: self.epoch,
        }
    }

    pub fn chunk_for(&self, hash: i64) -> Option<&Chunk> {
        self.chunks.iter().find(|c| c.contains(hash))
    }

    pub fn owner(&self, hash: i64) -> Option<ShardId> {
        self.chunk_for(hash).map(|c| c.shard)
    }

    /// Shards owning at least one chunk, in id order.
    pub fn shards(&self) -> Vec<ShardId> {
        let mut out: Vec<ShardId> = self.chunks.iter().map(|c| c.shard).collect();
        out.sort_unstable();
        out.dedup();
        out
    }

    /// Hands the chunk containing `hash` to `to`, as a 4.2 migration commit does: the moved
    /// chunk gets `(collMajor+1, 0)`, and if the donor keeps chunks, its highest one becomes
    /// the control chunk at `(collMajor+1, 1)`. Returns the moved chunk's old state.
    pub fn migrate(&self, hash: i64, to: ShardId) -> Option<(Table, Chunk)> {
        let idx = self.chunks.iter().position(|c| c.contains(hash))?;
        let old = self.chunks[idx].clone();
        let major = self.version().major + 1;
        let mut next = self.clone();
        next.chunks[idx].shard = to;
        next.chunks[idx].version = Version::new(major, 0);
        let control = next
            .chunks
            .iter_mut()
            .filter(|c| c.shard == old.shard)
            .max_by_key(|c| c.version);
        if let Some(c) = control {
            c.version = Version::new(major, 1);
        }
        Some((next, old))
    }
}

/// Which shards a filter must go to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// Equality on the whole `_id`: the shards owning these hashes.
    Keys(Vec<i64>),
    /// Everything else: every shard that owns chunks.
    All,
}

impl Target {
    /// From a filter: `{_id: v}` (v not an operator document), `{_id: {$eq: v}}` or
    /// `{_id: {$in: [..]}}` target by hash; anything else scatters.
    pub fn of_filter(filter: &Document) -> Target {
        let Some(id) = filter.get("_id") else {
            return Target::All;
        };
        match id {
            Bson::Document(d) if d.keys().next().is_some_and(|k| k.starts_with('$')) => {
                match (d.len(), d.get("$eq"), d.get_array("$in")) {
                    (1, Some(v), _) => Target::Keys(vec![hash_value(v)]),
                    (1, _, Ok(vs)) => Target::Keys(vs.iter().map(hash_value).collect()),
                    _ => Target::All,
                }
            }
            v => Target::Keys(vec![hash_value(v)]),
        }
    }

    /// The shards to contact under `table`, in id order.
    pub fn shards(&self, table: &Table) -> Vec<ShardId> {
        match self {
            Target::All => table.shards(),
            Target::Keys(hashes) => {
                let mut out: Vec<ShardId> = hashes.iter().filter_map(|h| table.owner(*h)).collect();
                out.sort_unstable();
                out.dedup();
                out
            }
        }
    }
}

/// The hashed shard key of a value: FNV-1a 64 over a canonical encoding (numbers of equal
/// value hash alike whatever their BSON type, as MongoDB's hashed index does), finished with
/// a SplitMix64 mix so that neighbouring values spread over the whole space.
pub fn hash_value(v: &Bson) -> i64 {
    let mut h = Fnv::new();
    canonical(v, &mut h);
    mix(h.0) as i64
}

struct Fnv(u64);

impl Fnv {
    fn new() -> Fnv {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 ^= u64::from(*b);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
    }
}

fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn canonical(v: &Bson, h: &mut Fnv) {
    match v {
        Bson::Int32(_) | Bson::Int64(_) | Bson::Double(_) => match number(v) {
            Some(f) if f.fract() == 0.0 && f.abs() < 9.0e18 => {
                h.write(b"n");
                h.write(&(f as i64).to_le_bytes());
            }
            Some(f) => {
                h.write(b"d");
                h.write(&f.to_bits().to_le_bytes());
            }
            None => h.write(b"?"),
        },
        Bson::String(s) => {
            h.write(b"s");
            h.write(s.as_bytes());
            h.write(&[0]);
        }
        Bson::Document(d) => {
            h.write(b"o");
            for (k, v) in d {
                h.write(k.as_bytes());
                h.write(&[0]);
                canonical(v, h);
            }
            h.write(b"}");
        }
        Bson::Array(a) => {
            h.write(b"a");
            a.iter().for_each(|v| canonical(v, h));
            h.write(b"]");
        }
        other => {
            // Any other type: its own BSON encoding, prefixed by the element type.
            h.write(&[other.element_type() as u8]);
            if let Ok(bytes) = bson::doc! { "": other.clone() }.to_vec() {
                h.write(&bytes);
            }
        }
    }
}

/// A BSON number as f64 (Int64 beyond 2^53 loses precision, which is fine for hashing).
pub fn number(v: &Bson) -> Option<f64> {
    match v {
        Bson::Int32(i) => Some(f64::from(*i)),
        Bson::Int64(i) => Some(*i as f64),
        Bson::Double(f) => Some(*f),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    #[test]
    fn split_covers_space_and_halves() {
        let t = Table::split_evenly("d.c", 4, 2);
        assert_eq!(t.chunks.first().map(|c| c.min), Some(HASH_MIN));
        assert_eq!(t.chunks.last().map(|c| c.max), Some(HASH_END));
        for w in t.chunks.windows(2) {
            assert_eq!(w[0].max, w[1].min);
        }
        let owners: Vec<_> = t.chunks.iter().map(|c| c.shard).collect();
        assert_eq!(owners, vec![0, 0, 1, 1]);
        assert_eq!(t.version(), Version::new(1, 3));
        assert_eq!(t.shard_version(0).version, Version::new(1, 1));
    }

    #[test]
    fn numbers_hash_alike_and_documents_spread() {
        assert_eq!(hash_value(&Bson::Int32(7)), hash_value(&Bson::Int64(7)));
        assert_eq!(hash_value(&Bson::Int32(7)), hash_value(&Bson::Double(7.0)));
        let t = Table::split_evenly("d.c", 4, 2);
        let mut per_shard = [0usize; 2];
        for p in 1..=100 {
            for s in 1..=20 {
                let h = hash_value(&Bson::Document(doc! {"productId": p, "storeId": s}));
                per_shard[t.owner(h).unwrap_or(0)] += 1;
            }
        }
        assert!(per_shard.iter().all(|&n| n > 800), "{per_shard:?}");
    }

    #[test]
    fn migrate_bumps_major_and_control_chunk() {
        let t = Table::split_evenly("d.c", 4, 2);
        let h = (HASH_MIN + 1) as i64;
        let (next, old) = t.migrate(h, 1).expect("chunk");
        assert_eq!(old.shard, 0);
        assert_eq!(next.chunks[0].shard, 1);
        assert_eq!(next.chunks[0].version, Version::new(2, 0));
        assert_eq!(next.shard_version(0).version, Version::new(2, 1));
        assert!(!next.shard_version(0).compatible(&t.shard_version(0)));
    }

    #[test]
    fn targeting() {
        assert_eq!(Target::of_filter(&doc! {}), Target::All);
        assert_eq!(Target::of_filter(&doc! {"qty": 1}), Target::All);
        assert!(matches!(Target::of_filter(&doc! {"_id": 1}), Target::Keys(k) if k.len() == 1));
        assert!(matches!(
            Target::of_filter(&doc! {"_id": {"$in": [1, 2]}}),
            Target::Keys(k) if k.len() == 2
        ));
        assert_eq!(Target::of_filter(&doc! {"_id": {"$gt": 1}}), Target::All);
    }
}
