//! `StreamScan` against the whole-message functions, on generated, split and damaged
//! replies; its memory on hostile ones.

use bytes::Bytes;
use proptest::prelude::*;

use super::{StreamScan, CODE_NAME_MAX, STREAM_ID_MAX};
use crate::dupids::{DupCount, IdSet};
use crate::status::ReplyStatus;
use crate::testbson::{doc, el, string};
use crate::{OpCode, Reply, WireError, HEADER_LEN};

const MAX: usize = 48_000_000;

// --- a small BSON writer (duplicate keys and odd values are the point) -------------------

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
            let mut v = ((4 + code.len() + scope.len()) as i32)
                .to_le_bytes()
                .to_vec();
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
        prop_oneof![4 => Just(true), 1 => Just(false)],
        proptest::collection::vec(batch_elem(), 0..12),
        proptest::collection::vec(extra(), 0..2),
        proptest::option::of(proptest::collection::vec(batch_elem(), 1..4)),
    )
        .prop_map(|(before, key, is_array, docs, after, second)| {
            // The second batch is read when the first is not an array.
            let big = docs.iter().chain(second.iter().flatten()).any(|d| d.1);
            let docs: Vec<_> = docs.into_iter().map(|d| d.0).collect();
            let mut elems = vec![el(0x12, b"id", &0i64.to_le_bytes())];
            elems.extend(before);
            elems.push(el(if is_array { 0x04 } else { 0x03 }, key, &array(&docs)));
            elems.extend(after);
            // A second batch: looked at only when the first is not an array.
            if let Some(docs) = second {
                let docs: Vec<_> = docs.into_iter().map(|d| d.0).collect();
                elems.push(el(0x04, b"nextBatch", &array(&docs)));
            }
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
    message_with(body, kind, flags, seq_before, seq_after, None)
}

/// [`message`] with one more section of kind `odd` (0: a second body, 2: a security
/// token, others unknown) before the checksum.
fn message_with(
    body: &[u8],
    kind: u8,
    flags: u32,
    seq_before: bool,
    seq_after: bool,
    odd: Option<u8>,
) -> Vec<u8> {
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
        if let Some(odd) = odd {
            payload.push(odd);
            payload.extend_from_slice(&doc(&[el(0x10, b"ok", &[0; 4])]));
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
    let op = if kind == 0 {
        OpCode::MSG
    } else {
        OpCode::REPLY
    };
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
    if s.code_name
        .as_ref()
        .is_some_and(|n| n.len() > CODE_NAME_MAX)
    {
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
        prop_oneof![8 => Just(None), 1 => Just(Some(0u8)), 1 => Just(Some(2)), 1 => Just(Some(3))],
        any::<bool>(),
    )
        .prop_map(|(elems, kind, flags, before, after, odd, ok_last)| {
            let big = elems.iter().any(|e| e.1);
            let mut elems: Vec<_> = elems.into_iter().map(|e| e.0).collect();
            // Most replies end with `ok: 1.0`.
            if ok_last {
                elems.push(el(0x01, b"ok", &1f64.to_le_bytes()));
            }
            let body = doc(&elems);
            (message_with(&body, kind, flags, before, after, odd), big)
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1000, ..ProptestConfig::default() })]

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
        flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 0..3),
        nudges in proptest::collection::vec((any::<usize>(), -3i32..=3), 0..3),
        cut in prop_oneof![3 => Just(None), 1 => any::<usize>().prop_map(Some)],
        junk in proptest::collection::vec(any::<u8>(), 0..3),
    ) {
        let mut msg = msg;
        for (at, x) in flips {
            let at = at % msg.len();
            msg[at] ^= x.max(1);
        }
        // Lengths off by a little: every i32 in the message is a candidate.
        for (at, delta) in nudges {
            let at = at % msg.len().saturating_sub(3).max(1);
            if let Some(b) = msg.get_mut(at..at + 4) {
                let v = i32::from_le_bytes([b[0], b[1], b[2], b[3]]).wrapping_add(delta);
                b.copy_from_slice(&v.to_le_bytes());
            }
        }
        if let Some(c) = cut {
            msg.truncate(c % (msg.len() + 1));
        }
        msg.extend_from_slice(&junk);
        agree(&msg, &cuts, 1000, big)?;
    }
}

mod cases;
