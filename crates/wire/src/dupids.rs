//! Documents returned twice in one reply: the orphans a proxy can see. A read served with
//! `readConcern: available` skips the shards' ownership filter, so a document that a
//! migration left behind on its donor comes back from both shards, with the same `_id`.
//!
//! [`duplicate_ids`] walks `cursor.firstBatch` / `cursor.nextBatch` of a reply body with the
//! element scanner, takes each document's raw `_id` (type byte and value bytes, compared
//! exactly, so `1` and `1.0` differ as they do to the server's `_id` index) and counts the
//! documents whose `_id` was seen earlier in the same reply. Bounded: at most `cap`
//! documents are looked at (the rest are reported as not examined); the only memory is an
//! [`IdSet`] the caller keeps and reuses, three integers per document (let go after a reply
//! of more than 256 documents). A large `_id` is hashed by its length and its first and last
//! bytes, and confirmed equal byte for byte. A whole reply message
//! is counted by [`crate::Reply::status_and_duplicates`], in the pass that reads its status.

use crate::scan::{self, Elements, Malformed};

/// Reusable scratch space: one (hash, start, end) per `_id`, offsets into the body.
#[derive(Debug, Default)]
pub struct IdSet {
    ids: Vec<(u64, u32, u32)>,
}

impl IdSet {
    /// Entries the set has room for without growing.
    pub fn capacity(&self) -> usize {
        self.ids.capacity()
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

/// Bytes of an `_id` element hashed from its start, and from its end: a large `_id` costs
/// no more to hash than a small one. Two `_id`s with the same hash are compared byte for
/// byte, so a collision never counts as a repeat.
const HASH_HEAD: usize = 48;
const HASH_TAIL: usize = 16;

/// An emptied set keeps room for this many `_id`s (4 KiB); a larger one is let go, so an
/// idle connection does not keep the scratch space of its largest reply.
const KEEP_IDS: usize = 256;

fn fnv(seed: u64, bytes: &[u8]) -> u64 {
    bytes
        .iter()
        .fold(seed, |h, &b| (h ^ b as u64).wrapping_mul(0x0100_0000_01b3))
}

/// The hash of one `_id` element: its length, its first [`HASH_HEAD`] and its last
/// [`HASH_TAIL`] bytes.
pub(crate) fn id_hash(elem: &[u8]) -> u64 {
    let seed = 0xcbf2_9ce4_8422_2325 ^ (elem.len() as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    if elem.len() <= HASH_HEAD + HASH_TAIL {
        return fnv(seed, elem);
    }
    let head = fnv(seed, &elem[..HASH_HEAD]);
    fnv(head, &elem[elem.len() - HASH_TAIL..])
}

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

/// Counts documents of a cursor reply `body` whose `_id` appears earlier in the same batch,
/// examining at most `cap` documents. A reply without a cursor batch counts nothing.
pub fn duplicate_ids(body: &[u8], set: &mut IdSet, cap: usize) -> Result<DupCount, Malformed> {
    set.ids.clear();
    let mut count = DupCount::default();
    let Some(array) = batch(body)? else {
        return Ok(count);
    };
    // Offsets are relative to `array`, which lies inside `body`: the set stores u32s.
    if array.len() > u32::MAX as usize {
        return Err(Malformed("batch larger than 4 GiB"));
    }
    let base = array.as_ptr() as usize;
    let mut docs = Elements::new(array)?;
    while let Some(d) = docs.next_elem()? {
        if set.ids.len() >= cap {
            count.skipped += 1;
            continue;
        }
        if d.tag != scan::DOCUMENT {
            continue;
        }
        let mut fields = Elements::new(d.value)?;
        while let Some(f) = fields.next_elem()? {
            if f.key == b"_id" {
                // The whole element: type byte, the key `_id\0` (the same for all), value.
                let end = f.value.as_ptr() as usize - base + f.value.len();
                let start = end - f.value.len() - b"\x00_id\0".len();
                let hash = id_hash(&array[start..end]);
                set.ids.push((hash, start as u32, end as u32));
                break;
            }
        }
    }
    count.examined = set.ids.len() as u32;
    let value = |&(_, s, e): &(u64, u32, u32)| &array[s as usize..e as usize];
    set.ids
        .sort_unstable_by(|a, b| a.0.cmp(&b.0).then_with(|| value(a).cmp(value(b))));
    count.duplicates = set
        .ids
        .windows(2)
        .filter(|w| w[0].0 == w[1].0 && value(&w[0]) == value(&w[1]))
        .count() as u32;
    if set.ids.capacity() > KEEP_IDS {
        set.ids = Vec::new();
    }
    Ok(count)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{OpCode, HEADER_LEN};
    use bson::{rawdoc, RawDocumentBuf};

    fn reply(batch_key: &str, docs: Vec<RawDocumentBuf>) -> RawDocumentBuf {
        let mut arr = bson::RawArrayBuf::new();
        for d in docs {
            arr.push(d);
        }
        let cursor = if batch_key == "firstBatch" {
            rawdoc! {"id": 0_i64, "ns": "demo.inv", "firstBatch": arr}
        } else {
            rawdoc! {"id": 0_i64, "ns": "demo.inv", "nextBatch": arr}
        };
        rawdoc! {"cursor": cursor, "ok": 1.0}
    }

    fn count(body: &RawDocumentBuf, cap: usize) -> DupCount {
        duplicate_ids(body.as_bytes(), &mut IdSet::default(), cap).expect("well formed")
    }

    #[test]
    fn counts_documents_whose_id_came_before() {
        let id = |p: i32, s: i32| rawdoc! {"productId": p, "storeId": s};
        let docs = vec![
            rawdoc! {"_id": id(1, 1), "qty": 10},
            rawdoc! {"_id": id(2, 1), "qty": 10},
            // The orphan copy from the donor shard: same _id, maybe other fields.
            rawdoc! {"_id": id(1, 1), "qty": 7},
            rawdoc! {"qty": 1},
            rawdoc! {"_id": id(1, 1)},
            rawdoc! {"_id": id(3, 1)},
        ];
        for key in ["firstBatch", "nextBatch"] {
            let c = count(&reply(key, docs.clone()), 1000);
            assert_eq!(
                c,
                DupCount {
                    examined: 5,
                    duplicates: 2,
                    skipped: 0
                },
                "{key}"
            );
        }
    }

    #[test]
    fn ids_compare_by_type_and_bytes() {
        // 1 (int32), 1 (int64), 1.0 (double) and "1" are four different _ids.
        let docs = vec![
            rawdoc! {"_id": 1},
            rawdoc! {"_id": 1_i64},
            rawdoc! {"_id": 1.0},
            rawdoc! {"_id": "1"},
            rawdoc! {"_id": 1_i64},
        ];
        assert_eq!(count(&reply("firstBatch", docs), 1000).duplicates, 1);
    }

    #[test]
    fn bounded_by_the_cap_and_the_set_is_reused() {
        let docs: Vec<_> = (0..10).map(|i| rawdoc! {"_id": i % 4}).collect();
        let body = reply("firstBatch", docs);
        let c = count(&body, 6);
        // _ids 0 1 2 3 0 1 examined: two repeats; four documents not looked at.
        assert_eq!(
            c,
            DupCount {
                examined: 6,
                duplicates: 2,
                skipped: 4
            }
        );
        let mut set = IdSet::default();
        for _ in 0..3 {
            assert_eq!(
                duplicate_ids(body.as_bytes(), &mut set, 100)
                    .unwrap()
                    .duplicates,
                6
            );
        }
        let capacity = set.ids.capacity();
        duplicate_ids(body.as_bytes(), &mut set, 100).unwrap();
        assert_eq!(set.ids.capacity(), capacity, "no new allocation once warm");
    }

    #[test]
    fn large_ids_hash_by_their_ends_and_compare_whole() {
        // 100 KiB string _ids that share their first and last bytes and differ in the middle:
        // all the same hash, none a repeat.
        let big = |mid: u8| {
            let mut s = vec![b'a'; 100 * 1024];
            s[50 * 1024] = mid;
            String::from_utf8(s).unwrap()
        };
        let elem = |mid: u8| {
            let mut e = vec![crate::scan::STRING];
            e.extend_from_slice(b"_id\0");
            e.extend_from_slice(&(big(mid).len() as i32 + 1).to_le_bytes());
            e.extend_from_slice(big(mid).as_bytes());
            e.push(0);
            e
        };
        assert_eq!(
            id_hash(&elem(b'x')),
            id_hash(&elem(b'y')),
            "a collision by design"
        );
        let mut docs: Vec<_> = (b'b'..b'z').map(|m| rawdoc! {"_id": big(m)}).collect();
        assert_eq!(
            count(&reply("firstBatch", docs.clone()), 1000).duplicates,
            0
        );
        // Real repeats among them still count, however large.
        docs.push(rawdoc! {"_id": big(b'c')});
        docs.push(rawdoc! {"_id": big(b'q'), "other": 1});
        assert_eq!(count(&reply("firstBatch", docs), 1000).duplicates, 2);
        // Same head and tail, another length: another hash.
        let short = rawdoc! {"_id": "a".repeat(99 * 1024)};
        let long = rawdoc! {"_id": "a".repeat(100 * 1024)};
        assert_eq!(
            count(&reply("firstBatch", vec![short, long]), 10).duplicates,
            0
        );
    }

    #[test]
    fn a_large_set_is_let_go() {
        let docs: Vec<_> = (0..1000).map(|i| rawdoc! {"_id": i}).collect();
        let mut set = IdSet::default();
        let c = duplicate_ids(reply("firstBatch", docs).as_bytes(), &mut set, 4096).unwrap();
        assert_eq!(c.examined, 1000);
        assert!(set.capacity() <= KEEP_IDS, "kept {}", set.capacity());
    }

    #[test]
    fn replies_without_a_batch_count_nothing() {
        for body in [
            rawdoc! {"ok": 1.0, "n": 5},
            rawdoc! {"ok": 0.0, "code": 13388},
            rawdoc! {"cursor": {"id": 0_i64}, "ok": 1.0},
        ] {
            assert_eq!(count(&body, 10), DupCount::default());
        }
        assert!(duplicate_ids(b"\x05\x00\x00\x00", &mut IdSet::default(), 10).is_err());
    }

    #[test]
    fn whole_messages_plain_and_compressed() {
        let body = reply("firstBatch", vec![rawdoc! {"_id": 1}, rawdoc! {"_id": 1}]);
        let msg = crate::reply::op_msg(7, 3, 0, &body);
        let mut set = IdSet::default();
        let dups = |m: &[u8], set: &mut IdSet| {
            let reply = crate::Reply::new(bytes::Bytes::copy_from_slice(m));
            let (status, c) = reply.status_and_duplicates(1 << 20, set, 100).unwrap();
            assert!(status.ok);
            c.expect("an ok OP_MSG reply is counted")
        };
        let c = dups(&msg, &mut set);
        assert_eq!((c.examined, c.duplicates), (2, 1));
        for id in [1u8, 2, 3] {
            let data = crate::compressed::compress(id, &msg[HEADER_LEN..]).unwrap();
            let mut z = Vec::new();
            crate::Header {
                length: (HEADER_LEN + 9 + data.len()) as i32,
                request_id: 7,
                response_to: 3,
                op_code: OpCode::COMPRESSED,
            }
            .put(&mut z);
            z.extend_from_slice(&OpCode::MSG.to_le_bytes());
            z.extend_from_slice(&((msg.len() - HEADER_LEN) as i32).to_le_bytes());
            z.push(id);
            z.extend_from_slice(&data);
            let c = dups(&z, &mut set);
            assert_eq!(c.duplicates, 1, "compressor {id}");
        }
    }
}
