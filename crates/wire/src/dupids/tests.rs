//! The duplicate count: hand-picked replies, and damaged generated ones against the
//! element scanner's plain walk.

use super::*;
use crate::testbson::{doc, el, string};
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
    let capacity = set.capacity();
    assert!(capacity > 0);
    duplicate_ids(body.as_bytes(), &mut set, 100).unwrap();
    assert_eq!(set.capacity(), capacity, "no new allocation once warm");
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
    let h = IdHasher::process();
    assert_eq!(
        h.hash(&elem(b'x')),
        h.hash(&elem(b'y')),
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

// --- against the plain walk ----------------------------------------------------------------

/// The count as the element scanner alone gives it: every batch element walked with
/// [`Elements`], every document's fields walked to its first `_id`, the `_id`s kept whole in
/// a `HashSet` (what `duplicate_ids` did before its fast paths and its table).
fn reference(body: &[u8], cap: usize) -> Result<DupCount, Malformed> {
    let mut count = DupCount::default();
    let Some(array) = batch(body)? else {
        return Ok(count);
    };
    let mut seen = std::collections::HashSet::new();
    let mut docs = Elements::new(array)?;
    while let Some(d) = docs.next_elem()? {
        if seen.len() + count.duplicates as usize >= cap {
            count.skipped += 1;
            continue;
        }
        if d.tag != scan::DOCUMENT {
            continue;
        }
        let mut fields = Elements::new(d.value)?;
        while let Some(f) = fields.next_elem()? {
            if f.key == b"_id" {
                if !seen.insert(d.value[f.start..f.end].to_vec()) {
                    count.duplicates += 1;
                }
                break;
            }
        }
    }
    count.examined = (seen.len() + count.duplicates as usize) as u32;
    Ok(count)
}

/// A cursor reply body around batch elements (tag, key, value).
fn body_of(elems: &[Vec<u8>]) -> Vec<u8> {
    let cursor = doc(&[
        el(0x12, b"id", &[0; 8]),
        el(0x04, b"firstBatch", &doc(elems)),
    ]);
    doc(&[
        el(0x03, b"cursor", &cursor),
        el(0x01, b"ok", &1f64.to_le_bytes()),
    ])
}

/// An `_id` value from a small set, so that some repeat: (tag, value bytes).
fn any_id() -> impl Strategy<Value = (u8, Vec<u8>)> {
    prop_oneof![
        (0i32..6).prop_map(|i| (0x10, i.to_le_bytes().to_vec())),
        (0u8..4).prop_map(|i| (0x07, vec![i; 12])),
        (0i64..3).prop_map(|i| (0x12, i.to_le_bytes().to_vec())),
        "[ab]{0,3}".prop_map(|s| (0x02, string(s.as_bytes()))),
        // Long strings: hashed by their ends, compared whole.
        (0u8..3).prop_map(|i| {
            let mut s = vec![b'x'; 90];
            s[45] = b'a' + i;
            (0x02, string(&s))
        }),
        (0i32..3).prop_map(|i| (0x03, doc(&[el(0x10, b"k", &i.to_le_bytes())]))),
        Just((0x0A, vec![])),
        Just((0x0B, b"a\0i\0".to_vec())),
    ]
}

/// A batch element: mostly documents with their `_id` first, some with it later or not
/// at all, some with long keys, some not documents.
fn any_element() -> impl Strategy<Value = (u8, Vec<u8>, Vec<u8>)> {
    let other = el(0x10, b"qty", &[7, 0, 0, 0]);
    let (a, b) = (other.clone(), other.clone());
    prop_oneof![
        6 => any_id().prop_map(move |(t, v)| (0x03, doc(&[el(t, b"_id", &v), a.clone()]))),
        2 => any_id().prop_map(move |(t, v)| (0x03, doc(&[b.clone(), el(t, b"_id", &v)]))),
        1 => Just((0x03, doc(&[other]))),
        1 => Just((0x10, 5i32.to_le_bytes().to_vec())),
    ]
    .prop_flat_map(|(tag, value)| {
        (
            Just(tag),
            prop_oneof![3 => Just(None), 1 => "[a-z0-9]{0,12}".prop_map(Some)],
            Just(value),
        )
    })
    .prop_map(|(tag, key, value)| (tag, key.map(String::into_bytes).unwrap_or_default(), value))
}

use proptest::prelude::*;

proptest! {
    /// The fast walk and the table give what the plain walk gives, on generated batches
    /// and on the same with one byte changed (malformed ones included: an error, never a
    /// panic, exactly when the plain walk errs).
    #[test]
    fn agrees_with_the_plain_walk(
        elems in proptest::collection::vec(any_element(), 0..40),
        cap in prop_oneof![Just(0usize), 1usize..8, Just(1000)],
        damage in proptest::option::of((any::<proptest::sample::Index>(), any::<u8>())),
    ) {
        let elems: Vec<Vec<u8>> = elems
            .iter()
            .enumerate()
            .map(|(i, (tag, key, value))| {
                // Array keys are the indexes; a generated one replaces some.
                let key = if key.is_empty() { i.to_string().into_bytes() } else { key.clone() };
                el(*tag, &key, value)
            })
            .collect();
        let mut body = body_of(&elems);
        if let Some((at, byte)) = damage {
            let at = at.index(body.len());
            body[at] = byte;
        }
        let mut set = IdSet::default();
        prop_assert_eq!(duplicate_ids(&body, &mut set, cap), reference(&body, cap));
        // Again with the set warm.
        prop_assert_eq!(duplicate_ids(&body, &mut set, cap), reference(&body, cap));
    }
}

#[test]
fn keys_of_eight_bytes_and_ids_further_in() {
    // Plain documents, then ones the fast walk leaves to the element scanner (a long key, a
    // non-document, an `_id` after another field), then plain ones again.
    let id = |i: i32| el(0x10, b"_id", &i.to_le_bytes());
    let q = el(0x10, b"q", &[1, 0, 0, 0]);
    let elems = vec![
        el(0x03, b"0", &doc(&[id(1), q.clone()])),
        el(0x03, b"longkey1", &doc(&[id(2)])),
        el(0x03, b"2", &doc(&[q.clone(), id(1)])),
        el(0x0A, b"3", &[]),
        el(0x03, b"4", &doc(&[id(2), q.clone()])),
        el(0x03, b"a_much_longer_key", &doc(&[q, id(3)])),
        el(0x03, b"6", &doc(&[id(3)])),
    ];
    let body = body_of(&elems);
    let want = DupCount {
        examined: 6,
        duplicates: 3,
        skipped: 0,
    };
    assert_eq!(reference(&body, 100), Ok(want));
    assert_eq!(duplicate_ids(&body, &mut IdSet::default(), 100), Ok(want));
    // Capped at 2: the rest, the non-document included, not examined.
    let capped = DupCount {
        examined: 2,
        duplicates: 0,
        skipped: 5,
    };
    assert_eq!(duplicate_ids(&body, &mut IdSet::default(), 2), Ok(capped));
    assert_eq!(reference(&body, 2), Ok(capped));
}

#[test]
fn a_cap_of_zero_examines_nothing() {
    let docs: Vec<_> = (0..10).map(|i| rawdoc! {"_id": i % 2}).collect();
    assert_eq!(
        count(&reply("firstBatch", docs), 0),
        DupCount {
            examined: 0,
            duplicates: 0,
            skipped: 10
        }
    );
}

/// Every `_id` with the same hash: repeats are still told from collisions by their bytes,
/// and the probing stops within its budget instead of growing with the square of the batch.
#[test]
fn colliding_hashes_are_compared_and_bounded() {
    let n: i32 = 20_000;
    let docs: Vec<_> = (0..n)
        .map(|i| rawdoc! {"_id": i % 30_000, "q": 1})
        .collect();
    let mut docs = docs;
    // Repeats of the first five, early.
    for i in 0..5i32 {
        docs.insert(10 + i as usize, rawdoc! {"_id": i});
    }
    let body = reply("firstBatch", docs);
    let mut set = IdSet::default();
    let started = std::time::Instant::now();
    let c = count_in(
        body.as_bytes(),
        &mut set,
        usize::MAX,
        crate::idtable::IdHasher::flat(),
    )
    .unwrap();
    assert_eq!(c.duplicates, 5, "{c:?}");
    assert!(c.examined > 15 && c.examined < 64, "{c:?}");
    assert_eq!((c.examined + c.skipped) as usize, n as usize + 5);
    // n²/2 string comparisons would take seconds; the budget keeps it to a few thousand.
    assert!(started.elapsed() < std::time::Duration::from_secs(1));
    // The stream scan stops at the same document.
    let msg = crate::reply::op_msg(1, 2, 0, &body);
    let mut s = crate::StreamScan::new(1 << 26, Some(usize::MAX)).with_flat_hash();
    for piece in msg.chunks(4096) {
        s.feed(piece);
    }
    assert_eq!(s.finish().unwrap().1, Some(c));
}
