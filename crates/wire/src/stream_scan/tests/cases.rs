//! Hand-picked replies, compressed replies, and memory on a hostile one.

use bytes::Bytes;

use super::{agree, array, doc, el, header, message, streamed, string, MAX};
use crate::dupids::{DupCount, IdSet};
use crate::stream_scan::STREAM_ID_MAX;
use crate::{OpCode, Reply, WireError, HEADER_LEN};

#[test]
fn hand_picked_cases_agree() {
    let batch = |docs: &[Vec<u8>]| {
        let docs: Vec<_> = docs.iter().map(|d| [&[3u8][..], d].concat()).collect();
        el(
            0x03,
            b"cursor",
            &doc(&[el(0x04, b"firstBatch", &array(&docs))]),
        )
    };
    let id = |i: i32| doc(&[el(0x10, b"_id", &i.to_le_bytes())]);
    let ok = el(0x01, b"ok", &1f64.to_le_bytes());
    let bodies = [
        doc(&[batch(&[id(1), id(2), id(1), id(1)]), ok.clone()]),
        // Duplicated `ok`, the last wins; `code` reset by a later non-number.
        doc(&[ok.clone(), el(0x10, b"ok", &[0; 4])]),
        doc(&[
            el(0x10, b"code", &[5, 0, 0, 0]),
            el(0x0A, b"code", &[]),
            ok.clone(),
        ]),
        // A batch document whose terminator is wrong: no count, status stands... no: the
        // array's scan checks it, so only the count goes.
        doc(&[ok.clone(), batch(&[id(1), id(1)])]),
    ];
    for body in &bodies {
        let msg = message(body, 0, 0, false, false);
        agree(&msg, &[3, 40, 41], 100, false).unwrap();
    }
    let (r, _) = streamed(&message(&bodies[0], 0, 0, false, false), &[7], Some(100));
    let (status, dups) = r.unwrap();
    assert!(status.ok);
    assert_eq!(
        dups,
        Some(DupCount {
            examined: 4,
            duplicates: 2,
            skipped: 0
        })
    );
    // Break the first batch document's terminator: the count goes, the status stays.
    let mut msg = message(&bodies[3], 0, 0, false, false);
    let first_doc_end = msg.windows(4).position(|w| w == [1, 0, 0, 0]).unwrap() + 4;
    msg[first_doc_end] = 7;
    let (r, _) = streamed(&msg, &[30], Some(100));
    let whole = Reply::new(Bytes::from(msg))
        .status_and_duplicates(MAX, &mut IdSet::default(), 100)
        .unwrap();
    assert_eq!(r.unwrap(), whole);
    assert!(whole.0.ok && whole.1.is_none(), "{whole:?}");
}

#[test]
fn large_ids_are_skipped_not_kept() {
    let big = "x".repeat(300);
    let d = |s: &str| [&[3u8][..], &doc(&[el(0x02, b"_id", &string(s.as_bytes()))])].concat();
    let docs = [d(&big), d(&big), d("a"), d("a")];
    let cursor = el(
        0x03,
        b"cursor",
        &doc(&[el(0x04, b"nextBatch", &array(&docs))]),
    );
    let body = doc(&[cursor, el(0x08, b"ok", &[1])]);
    let msg = message(&body, 0, 0, false, false);
    let (r, _) = streamed(&msg, &[100, 200, 300], Some(10));
    let dups = r.unwrap().1.unwrap();
    assert_eq!(
        dups,
        DupCount {
            examined: 2,
            duplicates: 1,
            skipped: 2
        }
    );
    agree(&msg, &[50], 10, true).unwrap();
    // Large ones count toward the cap as they would whole.
    let (r, _) = streamed(&msg, &[], Some(3));
    assert_eq!(r.unwrap().1.unwrap().skipped, 3);
}

#[test]
fn compressed_fails_at_finish() {
    let body = doc(&[el(0x01, b"ok", &1f64.to_le_bytes())]);
    let inner = message(&body, 0, 0, false, false);
    let mut payload = OpCode::MSG.to_le_bytes().to_vec();
    payload.extend_from_slice(&((inner.len() - HEADER_LEN) as i32).to_le_bytes());
    payload.push(0); // noop compressor
    payload.extend_from_slice(&inner[HEADER_LEN..]);
    let mut msg = header(HEADER_LEN + payload.len(), OpCode::COMPRESSED);
    msg.extend_from_slice(&payload);
    let whole = Reply::new(Bytes::copy_from_slice(&msg))
        .status(MAX)
        .unwrap();
    assert!(whole.ok, "the whole-message view reads it");
    let (r, held) = streamed(&msg, &[5, 20], Some(10));
    assert_eq!(r, Err(WireError::Streamed("compressed reply")));
    assert!(held < 1024);
    assert!(WireError::Streamed("compressed reply")
        .to_string()
        .contains("compressed reply"));
}

/// A 16 MB reply built to make a scanner hold things: thousands of `_id`s at the size
/// limit, keys of 1100 bytes, a 1 MB codeName, a 1 MB regex `_id`, long strings.
fn hostile() -> Vec<u8> {
    let mut docs = Vec::new();
    for i in 0..6_000u32 {
        let s = format!("{i:0>240}");
        let key = "k".repeat(1100);
        let d = doc(&[
            el(0x0A, key.as_bytes(), &[]),
            el(0x02, b"_id", &string(s.as_bytes())),
            el(0x02, b"pad", &string(&[b'p'; 200])),
        ]);
        docs.push([&[3u8][..], &d].concat());
    }
    let mut regex = vec![b'r'; 1 << 20];
    regex.extend_from_slice(&[0, 0]);
    docs.push([&[3u8][..], &doc(&[el(0x0B, b"_id", &regex)])].concat());
    let cursor = el(
        0x03,
        b"cursor",
        &doc(&[el(0x04, b"firstBatch", &array(&docs))]),
    );
    let code_name = el(0x02, b"codeName", &string(&vec![b'c'; 1 << 20]));
    let long_key = el(0x02, "z".repeat(1 << 20).as_bytes(), &string(b"v"));
    let mut elems = vec![cursor, code_name, long_key, el(0x10, b"ok", &[1, 0, 0, 0])];
    let size: usize = elems.iter().map(Vec::len).sum();
    let fill = 16_000_000usize.saturating_sub(size + 64);
    elems.push(el(0x02, b"fill", &string(&vec![b'f'; fill])));
    message(&doc(&elems), 0, 1, true, true)
}

#[test]
fn held_memory_is_bounded_on_hostile_input() {
    let msg = hostile();
    assert!(msg.len() > 15_000_000, "{}", msg.len());
    let cuts: Vec<usize> = (1..)
        .map(|i| i * 64 * 1024)
        .take_while(|&c| c < msg.len())
        .collect();
    for cap in [None, Some(0), Some(100), Some(5000)] {
        let (r, held) = streamed(&msg, &cuts, cap);
        let (status, dups) = r.unwrap();
        assert!(status.ok && status.code_name.is_none());
        let ids = cap.unwrap_or(0) * (STREAM_ID_MAX + 32);
        eprintln!(
            "cap {cap:?}: held at most {held} bytes (bound {})",
            16 * 1024 + ids
        );
        assert!(held <= 16 * 1024 + ids, "cap {cap:?}: held {held}");
        if let Some(cap) = cap {
            let d = dups.unwrap();
            assert_eq!(d.examined as usize, cap.min(6_000));
            assert_eq!((d.examined + d.skipped) as usize, 6_001);
        }
    }
    // The same counts as the whole-message function.
    let whole = Reply::new(Bytes::from(msg))
        .status_and_duplicates(MAX, &mut IdSet::default(), 5000)
        .unwrap();
    assert_eq!(whole.1.unwrap().examined, 5000);
}

/// One of every value type at every level the scanner walks: the body, `cursor`, the batch,
/// a batch document before its `_id`, and the `_id` itself.
fn every_type() -> Vec<Vec<u8>> {
    let code = string(b"f");
    let mut cws = ((4 + code.len() + 5) as i32).to_le_bytes().to_vec();
    cws.extend_from_slice(&code);
    cws.extend_from_slice(&doc(&[]));
    let mut dbp = string(b"ns");
    dbp.extend_from_slice(&[7; 12]);
    let mut bin = 2i32.to_le_bytes().to_vec();
    bin.extend_from_slice(&[0, 1, 2]);
    vec![
        el(0x01, b"d", &2f64.to_le_bytes()),
        el(0x02, b"s", &string(b"str")),
        el(0x03, b"o", &doc(&[el(0x10, b"i", &[1, 0, 0, 0])])),
        el(0x04, b"a", &doc(&[el(0x0A, b"0", &[])])),
        el(0x05, b"b", &bin),
        el(0x07, b"oid", &[5; 12]),
        el(0x08, b"t", &[1]),
        el(0x0B, b"re", b"ab\0i\0"),
        el(0x0C, b"p", &dbp),
        el(0x0D, b"js", &string(b"x")),
        el(0x0E, b"sy", &string(b"y")),
        el(0x0F, b"cw", &cws),
        el(0x10, b"i", &[3, 0, 0, 0]),
        el(0x12, b"l", &[4; 8]),
        el(0x13, b"dec", &[6; 16]),
    ]
}

/// Every byte flipped and every i32 nudged by a little, at every offset of a reply with all
/// value types at every level: the stream fails where the whole fails, agrees elsewhere.
#[test]
fn every_offset_damaged_agrees() {
    let all = every_type();
    let with = |last: Vec<u8>| {
        let mut e = all.clone();
        e.push(last);
        e
    };
    let mut batch_docs = Vec::new();
    for id in [
        el(0x10, b"_id", &[1, 0, 0, 0]),
        el(0x02, b"_id", &string(b"k")),
    ] {
        let d = doc(&with(id.clone()));
        batch_docs.push([&[3u8][..], &d].concat());
        batch_docs.push([&[3u8][..], &doc(&[id])].concat());
    }
    for t in every_type() {
        // Each type as an `_id`, last in its document (its end meets the terminator).
        let id = [
            &[t[0]][..],
            b"_id\0",
            &t[t.iter().position(|&b| b == 0).unwrap() + 1..],
        ]
        .concat();
        batch_docs.push([&[3u8][..], &doc(&[id])].concat());
    }
    // A non-document in the batch.
    batch_docs.push(vec![0x10, 9, 0, 0, 0]);
    let cursor = doc(&with(el(0x04, b"firstBatch", &array(&batch_docs))));
    let mut top = all.clone();
    top.push(el(0x03, b"cursor", &cursor));
    top.push(el(0x02, b"codeName", &string(b"Name")));
    top.push(el(0x10, b"code", &[2, 0, 0, 0]));
    top.push(el(0x01, b"ok", &1f64.to_le_bytes()));
    let body = doc(&top);
    for (kind, flags, seq) in [(0u8, 1u32, true), (1, 0, false)] {
        let msg = message(&body, kind, flags, seq, seq);
        agree(&msg, &[], 3, false).unwrap();
        let (r, _) = streamed(&msg, &[], Some(3));
        assert!(r.unwrap().0.ok);
        let mut damaged = 0;
        for at in 0..msg.len() {
            let mut variants = Vec::new();
            for x in [0x01u8, 0x80, 0xff] {
                let mut m = msg.clone();
                m[at] ^= x;
                variants.push(m);
            }
            for delta in [-2i32, -1, 1, 2] {
                let mut m = msg.clone();
                if let Some(b) = m.get_mut(at..at + 4) {
                    let v = i32::from_le_bytes([b[0], b[1], b[2], b[3]]).wrapping_add(delta);
                    b.copy_from_slice(&v.to_le_bytes());
                    variants.push(m);
                }
            }
            for m in variants {
                let whole = Reply::new(Bytes::copy_from_slice(&m)).status_and_duplicates(
                    MAX,
                    &mut IdSet::default(),
                    3,
                );
                damaged += whole.is_err() as usize;
                agree(&m, &[at, at + 1, at + 3], 3, false).unwrap();
            }
        }
        assert!(damaged > 200, "{damaged} of the variants are malformed");
    }
}
