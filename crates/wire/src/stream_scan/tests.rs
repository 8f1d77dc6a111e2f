//! `StreamScan` against the whole-message functions, on generated, split and damaged
//! replies; its memory on hostile ones.

use bytes::Bytes;
use proptest::prelude::*;

use super::{StreamScan, CODE_NAME_MAX, STREAM_ID_MAX};
use crate::dupids::{DupCount, IdSet};
use crate::status::ReplyStatus;
use crate::{OpCode, Reply, WireError, HEADER_LEN};

const MAX: usize = 48_000_000;

// --- a small BSON writer (duplicate keys and odd values are the point) -------------------

fn el(tag: u8, key: &[u8], value: &[u8]) -> Vec<u8> {
    let mut e = vec![tag];
    e.extend_from_slice(key);
    e.push(0);
    e.extend_from_slice(value);
    e
}

fn doc(elems: &[Vec<u8>]) -> Vec<u8> {
    let len = 5 + elems.iter().map(Vec::len).sum::<usize>();
    let mut d = (len as i32).to_le_bytes().to_vec();
    for e in elems {
        d.extend_from_slice(e);
    }
    d.push(0);
    d
}

fn string(s: &[u8]) -> Vec<u8> {
    let mut v = ((s.len() + 1) as i32).to_le_bytes().to_vec();
    v.extend_from_slice(s);
    v.push(0);
    v
}

fn array(docs: &[Vec<u8>]) -> Vec<u8> {
    let elems: Vec<_> = docs
        .iter()
        .enumerate()
        .map(|(i, d)| el(d[0], i.to_string().as_bytes(), &d[1..]))
        .collect();
    doc(&elems)
}

/// A value of many BSON types: (tag, value bytes).
fn any_value() -> impl Strategy<Value = (u8, Vec<u8>)> {
    prop_oneof![
        any::<f64>().prop_map(|d| (0x01, d.to_le_bytes().to_vec())),
        "[a-z]{0,20}".prop_map(|s| (0x02, string(s.as_bytes()))),
        (0usize..4).prop_map(|n| (0x03, doc(&vec![el(0x10, b"x", &[1, 0, 0, 0]); n]))),
        (0usize..4).prop_map(|n| (0x04, array(&vec![vec![0x0A]; n]))),
        proptest::collection::vec(any::<u8>(), 0..12).prop_map(|b| {
            let mut v = (b.len() as i32).to_le_bytes().to_vec();
            v.push(0x80);
            v.extend_from_slice(&b);
            (0x05, v)
        }),
        Just((0x06, vec![])),
        Just((0x07, vec![7; 12])),
        any::<bool>().prop_map(|b| (0x08, vec![b as u8])),
        any::<i64>().prop_map(|t| (0x09, t.to_le_bytes().to_vec())),
        Just((0x0A, vec![])),
        ("[a-z]{0,300}", "[imsx]{0,3}").prop_map(|(p, o)| {
            let mut v = p.into_bytes();
            v.push(0);
            v.extend_from_slice(o.as_bytes());
            v.push(0);
            (0x0B, v)
        }),
        "[a-z]{0,8}".prop_map(|s| {
            let mut v = string(s.as_bytes());
            v.extend_from_slice(&[9; 12]);
            (0x0C, v)
        }),
        "[a-z]{0,8}".prop_map(|s| (0x0D, string(s.as_bytes()))),
        "[a-z]{0,8}".prop_map(|s| (0x0E, string(s.as_bytes()))),
        "[a-z]{0,8}".prop_map(|s| {
            let code = string(s.as_bytes());
            let scope = doc(&[]);
            let mut v = ((4 + code.len() + scope.len()) as i32).to_le_bytes().to_vec();
            v.extend_from_slice(&code);
            v.extend_from_slice(&scope);
            (0x0F, v)
        }),
        any::<i32>().prop_map(|i| (0x10, i.to_le_bytes().to_vec())),
        any::<u64>().prop_map(|t| (0x11, t.to_le_bytes().to_vec())),
        any::<i64>().prop_map(|i| (0x12, i.to_le_bytes().to_vec())),
        Just((0x13, vec![3; 16])),
        Just((0x7F, vec![])),
        Just((0xFF, vec![])),
    ]
}

fn extra() -> impl Strategy<Value = Vec<u8>> {
    ("[a-zA-Z_]{1,20}", any_value()).prop_map(|(k, (t, v))| el(t, k.as_bytes(), &v))
}

/// An `_id` value: small ints (repeats), strings up to 300 bytes (some too large to keep),
/// documents, regexes, doubles.
fn id_value() -> impl Strategy<Value = (u8, Vec<u8>)> {
    prop_oneof![
        4 => (0i32..4).prop_map(|i| (0x10, i.to_le_bytes().to_vec())),
        1 => (0i64..3).prop_map(|i| (0x12, i.to_le_bytes().to_vec())),
        1 => (0i32..3).prop_map(|i| (0x01, (i as f64).to_le_bytes().to_vec())),
        3 => prop_oneof!["[ab]{0,3}", "a{240,300}"].prop_map(|s| (0x02, string(s.as_bytes()))),
        1 => (0i32..3).prop_map(|i| (0x03, doc(&[el(0x10, b"k", &i.to_le_bytes())]))),
        1 => any_value(),
    ]
}

/// A batch element: a document with an `_id` (extra fields around it, maybe a second
/// `_id`), one without, or a non-document.
fn batch_elem() -> impl Strategy<Value = (Vec<u8>, bool)> {
    prop_oneof![
        6 => (
            proptest::collection::vec(extra(), 0..2),
            id_value(),
            proptest::option::of(id_value()),
            proptest::collection::vec(extra(), 0..2),
        )
            .prop_map(|(before, (t, v), second, after)| {
                let id = el(t, b"_id", &v);
                let big = id.len() > STREAM_ID_MAX;
                let mut elems = before;
                elems.push(id);
                if let Some((t2, v2)) = second {
                    elems.push(el(t2, b"_id", &v2));
                }
                elems.extend(after);
                let mut d = vec![0x03];
                d.extend_from_slice(&doc(&elems));
                (d, big)
            }),
        1 => proptest::collection::vec(extra(), 0..3).prop_map(|e| {
            let mut d = vec![0x03];
            d.extend_from_slice(&doc(&e));
            (d, false)
        }),
        1 => any_value().prop_map(|(t, v)| {
            let mut d = vec![t];
            d.extend_from_slice(&v);
            (d, false)
        }),
    ]
}

/// A top-level element, and whether it holds an `_id` too large to keep.
fn top_elem() -> impl Strategy<Value = (Vec<u8>, bool)> {
    let ok = prop_oneof![
        Just((0x10, 1i32.to_le_bytes().to_vec())),
        Just((0x10, 0i32.to_le_bytes().to_vec())),
        Just((0x01, 1f64.to_le_bytes().to_vec())),
        Just((0x01, 0.5f64.to_le_bytes().to_vec())),
        Just((0x12, 1i64.to_le_bytes().to_vec())),
        Just((0x08, vec![1])),
        Just((0x08, vec![0])),
        Just((0x02, string(b"1"))),
    ];
    let code = prop_oneof![
        any::<i32>().prop_map(|c| (0x10, c.to_le_bytes().to_vec())),
        any::<i64>().prop_map(|c| (0x12, c.to_le_bytes().to_vec())),
        (-5i32..20000).prop_map(|c| (0x01, (c as f64).to_le_bytes().to_vec())),
        Just((0x08, vec![1])),
        any_value(),
    ];
    let code_name = prop_oneof![
        "[A-Za-z]{0,30}".prop_map(String::into_bytes),
        "é{500,600}".prop_map(String::into_bytes),
    ]
    .prop_map(|s| (0x02, string(&s)));
    let cursor = (
        proptest::collection::vec(extra(), 0..2),
        prop_oneof![Just(&b"firstBatch"[..]), Just(&b"nextBatch"[..])],
        any::<bool>(),
        proptest::collection::vec(batch_elem(), 0..12),
        proptest::collection::vec(extra(), 0..2),
    )
        .prop_map(|(before, key, is_array, docs, after)| {
            let big = docs.iter().any(|d| d.1);
            let docs: Vec<_> = docs.into_iter().map(|d| d.0).collect();
            let mut elems = vec![el(0x12, b"id", &0i64.to_le_bytes())];
            elems.extend(before);
            elems.push(el(if is_array { 0x04 } else { 0x03 }, key, &array(&docs)));
            elems.extend(after);
            (el(0x03, b"cursor", &doc(&elems)), big)
        });
    prop_oneof![
        3 => ok.prop_map(|(t, v)| (el(t, b"ok", &v), false)),
        2 => code.prop_map(|(t, v)| (el(t, b"code", &v), false)),
        2 => code_name.prop_map(|(t, v)| (el(t, b"codeName", &v), false)),
        3 => cursor,
        2 => extra().prop_map(|e| (e, false)),
        1 => "[a-z]{1100,1200}".prop_map(|k| (el(0x0A, k.as_bytes(), &[]), false)),
    ]
}

fn header(len: usize, op: i32) -> Vec<u8> {
    let mut h = Vec::new();
    for v in [len as i32, 9, 4, op] {
        h.extend_from_slice(&v.to_le_bytes());
    }
    h
}

/// A whole reply message from a body: OP_MSG (flags, optional kind-1 sections before and
/// after, checksum) or OP_REPLY (with an optional second document).
fn message(body: &[u8], kind: u8, flags: u32, seq_before: bool, seq_after: bool) -> Vec<u8> {
    let mut payload = Vec::new();
    if kind == 0 {
        payload.extend_from_slice(&flags.to_le_bytes());
        let seq = |p: &mut Vec<u8>| {
            let docs = [doc(&[el(0x10, b"a", &[1, 0, 0, 0])]), doc(&[])];
            let size = 4 + 10 + docs.iter().map(Vec::len).sum::<usize>();
            p.push(1);
            p.extend_from_slice(&(size as i32).to_le_bytes());
            p.extend_from_slice(b"documents\0");
            docs.iter().for_each(|d| p.extend_from_slice(d));
        };
        if seq_before {
            seq(&mut payload);
        }
        payload.push(0);
        payload.extend_from_slice(body);
        if seq_after {
            seq(&mut payload);
        }
        if flags & 1 != 0 {
            payload.extend_from_slice(&[1, 2, 3, 4]);
        }
    } else {
        payload.extend_from_slice(&[0; 20]);
        payload.extend_from_slice(body);
        if seq_after {
            payload.extend_from_slice(&doc(&[]));
        }
    }
    let op = if kind == 0 { OpCode::MSG } else { OpCode::REPLY };
    let mut msg = header(HEADER_LEN + payload.len(), op);
    msg.extend_from_slice(&payload);
    msg
}

type Outcome = Result<(ReplyStatus, Option<DupCount>), WireError>;

/// `msg` fed in the pieces `cuts` make.
fn streamed(msg: &[u8], cuts: &[usize], cap: Option<usize>) -> (Outcome, usize) {
    let mut cuts: Vec<usize> = cuts.iter().map(|c| c % (msg.len() + 1)).collect();
    cuts.sort_unstable();
    let mut s = StreamScan::new(MAX, cap);
    let mut at = 0;
    let mut held = 0;
    for c in cuts.into_iter().chain([msg.len()]) {
        s.feed(&msg[at..c]);
        held = held.max(s.held());
        at = c;
    }
    (s.finish(), held)
}

/// The stream agrees with the whole-message functions: the same `Ok`, or both `Err`.
/// With `big` (an `_id` too large to keep), the count may move documents from examined
/// (and repeats) to skipped, nothing else.
fn agree(msg: &[u8], cuts: &[usize], cap: usize, big: bool) -> Result<(), TestCaseError> {
    let reply = Reply::new(Bytes::copy_from_slice(msg));
    let whole = reply
        .status_and_duplicates(MAX, &mut IdSet::default(), cap)
        .map(|(s, d)| (unkept(s), d));
    let (stream, _) = streamed(msg, cuts, Some(cap));
    let compressed = msg.get(12..16) == Some(&OpCode::COMPRESSED.to_le_bytes()[..]);
    match (&whole, &stream) {
        (_, Err(_)) if compressed => {}
        (Err(_), Err(_)) => {}
        (Ok((ws, wd)), Ok((ss, sd))) if big => {
            prop_assert_eq!(ws, ss);
            prop_assert_eq!(wd.is_some(), sd.is_some());
            if let (Some(w), Some(s)) = (wd, sd) {
                prop_assert_eq!(w.examined + w.skipped, s.examined + s.skipped);
                prop_assert!(s.examined <= w.examined && s.duplicates <= w.duplicates);
            }
        }
        _ => prop_assert_eq!(&whole, &stream),
    }
    let status = reply.status(MAX).map(|s| (unkept(s), None));
    let (stream, _) = streamed(msg, cuts, None);
    match (&status, &stream) {
        (_, Err(_)) if compressed => {}
        (Err(_), Err(_)) => {}
        _ => prop_assert_eq!(&status, &stream),
    }
    Ok(())
}

/// What the stream reports of a status: a `codeName` over `CODE_NAME_MAX` is not kept.
fn unkept(mut s: ReplyStatus) -> ReplyStatus {
    if s.code_name.as_ref().is_some_and(|n| n.len() > CODE_NAME_MAX) {
        s.code_name = None;
    }
    s
}

fn reply_msg() -> impl Strategy<Value = (Vec<u8>, bool)> {
    (
        proptest::collection::vec(top_elem(), 0..8),
        prop_oneof![3 => Just(0u8), 1 => Just(1u8)],
        prop_oneof![Just(0u32), Just(1), Just(2), Just(3), Just(1 << 16)],
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(|(elems, kind, flags, before, after)| {
            let big = elems.iter().any(|e| e.1);
            let body = doc(&elems.into_iter().map(|e| e.0).collect::<Vec<_>>());
            (message(&body, kind, flags, before, after), big)
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 600, ..ProptestConfig::default() })]

    #[test]
    fn pieces_give_what_the_whole_gives(
        (msg, big) in reply_msg(),
        cuts in proptest::collection::vec(any::<usize>(), 0..40),
        cap in prop_oneof![Just(0usize), 1usize..6, Just(1000)],
    ) {
        agree(&msg, &cuts, cap, big)?;
        // One byte at a time.
        let bytes: Vec<usize> = (1..msg.len()).collect();
        agree(&msg, &bytes, cap, big)?;
    }

    #[test]
    fn damaged_messages_fail_or_agree(
        (msg, big) in reply_msg(),
        cuts in proptest::collection::vec(any::<usize>(), 0..20),
        flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..4),
        cut in prop_oneof![3 => Just(None), 1 => any::<usize>().prop_map(Some)],
        junk in proptest::collection::vec(any::<u8>(), 0..3),
    ) {
        let mut msg = msg;
        for (at, x) in flips {
            let at = at % msg.len();
            msg[at] ^= x.max(1);
        }
        if let Some(c) = cut {
            msg.truncate(c % (msg.len() + 1));
        }
        msg.extend_from_slice(&junk);
        agree(&msg, &cuts, 1000, big)?;
    }
}

#[test]
fn hand_picked_cases_agree() {
    let batch = |docs: &[Vec<u8>]| {
        let docs: Vec<_> = docs.iter().map(|d| [&[3u8][..], d].concat()).collect();
        el(0x03, b"cursor", &doc(&[el(0x04, b"firstBatch", &array(&docs))]))
    };
    let id = |i: i32| doc(&[el(0x10, b"_id", &i.to_le_bytes())]);
    let ok = el(0x01, b"ok", &1f64.to_le_bytes());
    let bodies = [
        doc(&[batch(&[id(1), id(2), id(1), id(1)]), ok.clone()]),
        // Duplicated `ok`, the last wins; `code` reset by a later non-number.
        doc(&[ok.clone(), el(0x10, b"ok", &[0; 4])]),
        doc(&[el(0x10, b"code", &[5, 0, 0, 0]), el(0x0A, b"code", &[]), ok.clone()]),
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
    let cursor = el(0x03, b"cursor", &doc(&[el(0x04, b"nextBatch", &array(&docs))]));
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
    let whole = Reply::new(Bytes::copy_from_slice(&msg)).status(MAX).unwrap();
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
    let cursor = el(0x03, b"cursor", &doc(&[el(0x04, b"firstBatch", &array(&docs))]));
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
    let cuts: Vec<usize> = (1..).map(|i| i * 64 * 1024).take_while(|&c| c < msg.len()).collect();
    for cap in [None, Some(0), Some(100), Some(5000)] {
        let (r, held) = streamed(&msg, &cuts, cap);
        let (status, dups) = r.unwrap();
        assert!(status.ok && status.code_name.is_none());
        let ids = cap.unwrap_or(0) * (STREAM_ID_MAX + 32);
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
