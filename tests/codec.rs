//! Edge cases of the wire layer, without sockets: framing (`MessageCodec`), OP_MSG views,
//! OP_COMPRESSED and legacy OP_QUERY, plus property tests that hostile bytes never panic
//! and never make the decoder allocate past its bound.

use crate::support;

use bson::{rawdoc, RawDocumentBuf};
use bytes::{BufMut, Bytes, BytesMut};
use proptest::prelude::*;
use staleguard::wire::codec::FrameError;
use staleguard::wire::compressed::{compress, Compressed, NOOP, SNAPPY, ZLIB, ZSTD};
use staleguard::wire::legacy::OpQuery;
use staleguard::wire::opmsg::{verify_checksum, OpMsg, CHECKSUM_PRESENT, EXHAUST_ALLOWED};
use staleguard::wire::{Header, MessageCodec, OpCode, WireError, HEADER_LEN};
use support::mongos::wrap_compressed;
use support::raw;
use tokio_util::codec::Decoder;

const MAX: usize = 4096;
/// What the decoder may hold beyond the largest message it accepts.
const SLACK: usize = 64;
/// The growth the property test tolerates: never more than one maximal frame.
const GROWTH_BOUND: usize = MAX + SLACK;

fn ping(request_id: i32) -> Bytes {
    raw::msg(request_id, 0, &rawdoc! { "ping": 1, "$db": "admin" })
}

/// A header declaring `len`, followed by `body`.
fn with_length(len: i32, op_code: i32, body: &[u8]) -> Vec<u8> {
    let mut out = BytesMut::new();
    Header {
        length: len,
        request_id: 1,
        response_to: 0,
        op_code,
    }
    .put(&mut out);
    out.put_slice(body);
    out.to_vec()
}

/// An OP_MSG payload (after the header): flags then raw section bytes.
fn payload(flags: u32, sections: &[u8]) -> Vec<u8> {
    let mut out = flags.to_le_bytes().to_vec();
    out.extend_from_slice(sections);
    out
}

fn body_section(doc: &RawDocumentBuf) -> Vec<u8> {
    let mut out = vec![0];
    out.extend_from_slice(doc.as_bytes());
    out
}

fn sequence_section(id: &str, docs: &[&[u8]]) -> Vec<u8> {
    let size = 4 + id.len() + 1 + docs.iter().map(|d| d.len()).sum::<usize>();
    let mut out = vec![1];
    out.extend_from_slice(&(size as i32).to_le_bytes());
    out.extend_from_slice(id.as_bytes());
    out.push(0);
    for d in docs {
        out.extend_from_slice(d);
    }
    out
}

fn decode_err(input: &[u8]) -> FrameError {
    let mut buf = BytesMut::from(input);
    MessageCodec::new(MAX)
        .decode(&mut buf)
        .expect_err("decoder must refuse this input")
}

// ---- framing -------------------------------------------------------------------------

#[test]
fn frame_arriving_one_byte_at_a_time() {
    let msg = ping(1);
    let mut codec = MessageCodec::new(MAX);
    let mut buf = BytesMut::new();
    for (i, b) in msg.iter().enumerate() {
        buf.put_u8(*b);
        let got = codec.decode(&mut buf).expect("valid prefix");
        if i + 1 < msg.len() {
            assert!(
                got.is_none(),
                "frame produced after {} of {} bytes",
                i + 1,
                msg.len()
            );
        } else {
            assert_eq!(got, Some(msg.clone()));
        }
    }
    assert!(buf.is_empty());
}

#[test]
fn two_frames_in_one_buffer() {
    let (a, b) = (ping(1), ping(2));
    let mut buf = BytesMut::new();
    buf.put_slice(&a);
    buf.put_slice(&b);
    let mut codec = MessageCodec::new(MAX);
    assert_eq!(codec.decode(&mut buf).unwrap(), Some(a));
    assert_eq!(codec.decode(&mut buf).unwrap(), Some(b));
    assert_eq!(codec.decode(&mut buf).unwrap(), None);
}

#[test]
fn negative_length_is_refused() {
    let err = decode_err(&with_length(-16, OpCode::MSG, &[]));
    assert!(matches!(
        err,
        FrameError::Wire(WireError::BadLength { len: -16, .. })
    ));
    let err = decode_err(&i32::MIN.to_le_bytes());
    assert!(matches!(err, FrameError::Wire(WireError::BadLength { .. })));
}

#[test]
fn length_below_header_is_refused() {
    for len in [0, 4, 15] {
        let err = decode_err(&with_length(len, OpCode::MSG, &[]));
        assert!(
            matches!(err, FrameError::Wire(WireError::BadLength { .. })),
            "length {len}"
        );
    }
}

#[test]
fn length_above_max_is_refused_before_the_body() {
    for len in [MAX as i32 + 1, 48_000_001, i32::MAX] {
        // Only the four length bytes have arrived.
        let mut buf = BytesMut::with_capacity(16);
        buf.put_i32_le(len);
        let err = MessageCodec::new(MAX)
            .decode(&mut buf)
            .expect_err("oversized");
        assert!(
            matches!(err, FrameError::Wire(WireError::BadLength { .. })),
            "length {len}"
        );
        assert!(buf.capacity() <= 64, "reserved {} bytes", buf.capacity());
    }
}

#[test]
fn partial_frame_reserves_at_most_the_frame() {
    let mut buf = BytesMut::with_capacity(16);
    buf.put_i32_le(MAX as i32);
    assert_eq!(MessageCodec::new(MAX).decode(&mut buf).unwrap(), None);
    assert!(
        buf.capacity() >= MAX,
        "reserves room for the declared frame"
    );
    assert!(buf.capacity() <= MAX + SLACK, "reserved {}", buf.capacity());
}

/// A frame that filled the buffer exactly leaves it without room; between messages the
/// decoder gives it room for a whole small message again, so the next one takes one read
/// (not a 1-byte read, a 7-byte read, the rest and an EAGAIN).
#[test]
fn room_for_the_next_message_after_a_frame_that_filled_the_buffer() {
    let frame = ping(1);
    let mut buf = BytesMut::with_capacity(frame.len());
    buf.put_slice(&frame);
    let mut codec = MessageCodec::new(48 * 1024 * 1024);
    assert_eq!(codec.decode(&mut buf).unwrap(), Some(frame.clone()));
    assert_eq!(buf.capacity(), 0);
    assert_eq!(codec.decode(&mut buf).unwrap(), None);
    assert!(buf.capacity() >= 1024, "room {}", buf.capacity());
    // Once a message did not fit in that room, the connection keeps 8 KiB between messages,
    // until it goes idle.
    let large = with_length(3000, OpCode::MSG, &[1; 3000 - HEADER_LEN]);
    let mut buf = BytesMut::with_capacity(1024);
    buf.put_slice(&large[..1024]);
    assert_eq!(codec.decode(&mut buf).unwrap(), None);
    buf.put_slice(&large[1024..]);
    assert_eq!(codec.decode(&mut buf).unwrap().map(|f| f.len()), Some(3000));
    let mut buf = BytesMut::new();
    assert_eq!(codec.decode(&mut buf).unwrap(), None);
    assert!(buf.capacity() >= 8 * 1024, "room {}", buf.capacity());
    codec.idle();
    let mut buf = BytesMut::new();
    assert_eq!(codec.decode(&mut buf).unwrap(), None);
    assert!(buf.capacity() < 4 * 1024, "room {}", buf.capacity());
    // A maximum below that bounds the room too.
    let mut small = BytesMut::new();
    assert_eq!(MessageCodec::new(MAX).decode(&mut small).unwrap(), None);
    assert!(small.capacity() <= MAX, "room {}", small.capacity());
}

/// A header declaring a huge message, followed by a trickle: the buffer follows the bytes
/// that arrived (at most twice them, at least 8 KiB), never the declared length (issue 11:
/// 500 connections declaring 47 MB each reserved 23 GB of address space).
#[test]
fn declared_length_alone_reserves_only_what_arrived() {
    const BIG: usize = 48_000_000;
    let declared = 47_000_000;
    let mut codec = MessageCodec::new(BIG);
    let mut buf = BytesMut::with_capacity(16);
    buf.put_i32_le(declared);
    buf.put_slice(&[0u8; 12]);
    assert_eq!(codec.decode(&mut buf).unwrap(), None);
    assert!(
        buf.capacity() <= 8 * 1024 + SLACK,
        "reserved {}",
        buf.capacity()
    );
    let mut arrived = buf.len();
    let chunk = vec![7u8; 100_000];
    while arrived < 3_000_000 {
        let room = buf.capacity() - buf.len();
        let n = room.clamp(1, chunk.len());
        buf.put_slice(&chunk[..n]);
        arrived += n;
        assert_eq!(codec.decode(&mut buf).unwrap(), None);
        assert!(
            buf.capacity() <= (2 * arrived).max(8 * 1024) + SLACK,
            "holding {} bytes for {arrived} received",
            buf.capacity()
        );
    }
}

/// The upstream's codec trusts mongos's declared length: one allocation for a large reply.
#[test]
fn trusting_codec_makes_room_for_the_declared_frame() {
    let declared = 2_000_000;
    let mut buf = BytesMut::with_capacity(16);
    buf.put_i32_le(declared);
    buf.put_slice(&[0u8; 12]);
    let mut codec = MessageCodec::trusting(48_000_000);
    assert_eq!(codec.decode(&mut buf).unwrap(), None);
    assert!(buf.capacity() >= declared as usize);
    assert!(buf.capacity() <= declared as usize + SLACK);
}

/// `BytesMut::reserve` may double a buffer (3072 → 6144 for a 4096-byte frame); the decoder
/// must size its room from the frame, never past it.
#[test]
fn growing_partial_frame_reserves_at_most_the_frame() {
    // Most of a maximal frame is already buffered when the decoder first sees it.
    let msg = with_length(MAX as i32, OpCode::MSG, &vec![0; MAX - HEADER_LEN]);
    let have = 3 * MAX / 4;
    let mut buf = BytesMut::with_capacity(have);
    buf.put_slice(&msg[..have]);
    assert_eq!(buf.capacity(), have);
    assert_eq!(MessageCodec::new(MAX).decode(&mut buf).unwrap(), None);
    assert!(
        buf.capacity() >= MAX,
        "reserves room for the declared frame"
    );
    assert!(
        buf.capacity() <= MAX + SLACK,
        "decoder grew the buffer to {} for a {MAX}-byte frame",
        buf.capacity()
    );
}

/// A frame that arrives in small reads (a client trickling it, or one 32 KiB receive at a
/// time on `layout = "uring"`) is copied a bounded number of times as its buffer grows,
/// not once per read: 4 MB in 4 KiB reads moves the buffer about 10 times (doubling), where
/// growing at every read copied it 1,000 times (about 2 GB in all). The room still never
/// exceeds twice what has arrived (at least `MIN_ROOM`), nor the frame.
#[test]
fn a_frame_arriving_in_small_reads_is_not_copied_at_each_read() {
    const LEN: usize = 4_000_000;
    const READ: usize = 4096;
    let msg = with_length(LEN as i32, OpCode::MSG, &vec![7; LEN - HEADER_LEN]);
    let mut codec = MessageCodec::new(LEN);
    let mut buf = BytesMut::new();
    let (mut at, mut moves, mut copied) = (0, 0, 0usize);
    let frame = loop {
        let held = buf.as_ptr();
        if let Some(frame) = codec.decode(&mut buf).unwrap() {
            break frame;
        }
        if buf.as_ptr() != held && !buf.is_empty() {
            moves += 1;
            copied += buf.len();
            assert!(
                buf.capacity() <= (2 * buf.len()).max(8 * 1024),
                "room {} for {} bytes arrived",
                buf.capacity(),
                buf.len()
            );
        }
        // What `FramedRead` does: make sure of one byte of room (the decoder has made the
        // room it wants), then read at most what the socket has.
        let held = buf.as_ptr();
        buf.reserve(1);
        if buf.as_ptr() != held && !buf.is_empty() {
            moves += 1;
            copied += buf.len();
        }
        let n = READ.min(buf.capacity() - buf.len()).min(LEN - at);
        buf.put_slice(&msg[at..at + n]);
        at += n;
    };
    assert_eq!(&frame[..], &msg[..]);
    println!("the buffer moved {moves} times, {copied} bytes copied");
    assert!(
        moves <= 16 && copied <= 2 * LEN,
        "the buffer moved {moves} times, {copied} bytes copied, for a {LEN}-byte frame in \
         {READ}-byte reads"
    );
}

/// What `FramedRead` does with a decoder: decode what is buffered, then read into the room
/// the buffer has (at least one byte), until `input` is used up. Returns the items and
/// drops none of them before the end (as a relay holding them in an outbox would).
fn read_through<D: Decoder>(codec: &mut D, buf: &mut BytesMut, input: &[u8]) -> Vec<D::Item>
where
    D::Error: std::fmt::Debug,
{
    let mut items = Vec::new();
    let mut at = 0;
    loop {
        while let Some(item) = codec.decode(buf).unwrap() {
            items.push(item);
        }
        if at == input.len() {
            return items;
        }
        buf.reserve(1);
        let n = (buf.capacity() - buf.len()).min(input.len() - at);
        buf.put_slice(&input[at..at + n]);
        at += n;
    }
}

/// [`read_through`] as the relay uses a decoder: each item is passed on and gone (written
/// out) before the decoder is asked for the next; returns the items' lengths.
fn relay_through(codec: &mut MessageCodec, buf: &mut BytesMut, input: &[u8]) -> Vec<usize> {
    let mut lens = Vec::new();
    let mut at = 0;
    loop {
        while let Some(item) = codec.decode(buf).unwrap() {
            lens.push(item.len());
        }
        if at == input.len() {
            return lens;
        }
        buf.reserve(1);
        let n = (buf.capacity() - buf.len()).min(input.len() - at);
        buf.put_slice(&input[at..at + n]);
        at += n;
    }
}

/// After a message larger than `SHRINK_AFTER`, the read buffer goes back to a small one,
/// both when nothing of the next message has arrived and when part of it came in the same
/// read (issue 21: a 40 MB ping kept 34.4 MiB for the connection's life).
#[test]
fn a_large_message_does_not_stay_in_the_read_buffer() {
    // What docs/capacity.md promises an idle connection keeps per direction (`SHRINK_AFTER`).
    const SHRINK_AFTER: usize = 16 * 1024;
    const BIG: usize = 48_000_000;
    let large = with_length(4_000_000, OpCode::MSG, &vec![1; 4_000_000 - HEADER_LEN]);
    let next = ping(2);
    for trusting in [false, true] {
        let codec = || {
            if trusting {
                MessageCodec::trusting(BIG)
            } else {
                MessageCodec::new(BIG)
            }
        };
        // Alone: the large frame is relayed and gone, then the buffer waits for the next.
        let mut c = codec();
        let mut buf = BytesMut::with_capacity(8 * 1024);
        assert_eq!(relay_through(&mut c, &mut buf, &large), vec![large.len()]);
        assert!(
            buf.capacity() <= SHRINK_AFTER,
            "trusting {trusting}: kept {} bytes",
            buf.capacity()
        );
        assert!(buf.capacity() >= next.len(), "room for a small message");
        assert_eq!(relay_through(&mut c, &mut buf, &next), vec![next.len()]);
        assert!(buf.capacity() <= SHRINK_AFTER, "kept {}", buf.capacity());
        // With the first bytes of the next message in the same read.
        let mut c = codec();
        let mut buf = BytesMut::with_capacity(8 * 1024);
        let mut both = large.clone();
        both.extend_from_slice(&next[..10]);
        assert_eq!(relay_through(&mut c, &mut buf, &both), vec![large.len()]);
        assert!(buf.capacity() <= SHRINK_AFTER, "kept {}", buf.capacity());
        assert_eq!(
            relay_through(&mut c, &mut buf, &next[10..]),
            vec![next.len()]
        );
        assert!(buf.capacity() <= SHRINK_AFTER, "kept {}", buf.capacity());
        // And when the relay still holds the frame while the decoder goes on.
        let mut c = codec();
        let mut buf = BytesMut::with_capacity(8 * 1024);
        let held = read_through(&mut c, &mut buf, &large);
        drop(held);
        assert_eq!(c.decode(&mut buf).unwrap(), None);
        assert!(buf.capacity() <= SHRINK_AFTER, "kept {}", buf.capacity());
    }
}

/// Messages up to `SHRINK_AFTER` keep their buffer (no allocation per message).
#[test]
fn small_messages_reuse_the_read_buffer() {
    let mut c = MessageCodec::new(48_000_000);
    let mut buf = BytesMut::with_capacity(8 * 1024);
    let msg = with_length(12_000, OpCode::MSG, &vec![1; 12_000 - HEADER_LEN]);
    drop(read_through(&mut c, &mut buf, &msg));
    assert_eq!(c.decode(&mut buf).unwrap(), None);
    let at = buf.as_ptr();
    drop(read_through(&mut c, &mut buf, &msg));
    assert_eq!(c.decode(&mut buf).unwrap(), None);
    assert_eq!(buf.as_ptr(), at, "the same allocation, taken back");
}

/// The upstream side's decoder: a large message is offered first; streamed, it comes in
/// pieces no larger than the read room; read whole, it is one message; small ones are
/// messages as before. The buffer goes back to small after either.
#[test]
fn reply_codec_streams_large_messages_on_request() {
    const SHRINK_AFTER: usize = 16 * 1024;
    use staleguard::wire::replies::PIECE_ROOM;
    use staleguard::wire::{Incoming, StreamCodec};
    let mut large = with_length(1_000_000, OpCode::MSG, &vec![5; 1_000_000 - HEADER_LEN]);
    // moreToCome
    large[16] = 2;
    let small = ping(3);
    for stream in [true, false] {
        let mut c = StreamCodec::replies(48_000_000, 64 * 1024);
        let mut buf = BytesMut::with_capacity(8 * 1024);
        assert_eq!(
            read_through(&mut c, &mut buf, &small),
            vec![Incoming::Message(small.clone())]
        );
        // The head needs the flags: 19 bytes are not enough.
        let mut head_only = BytesMut::new();
        head_only.put_slice(&large[..19]);
        assert_eq!(
            StreamCodec::replies(48_000_000, 64 * 1024)
                .decode(&mut head_only)
                .unwrap(),
            None
        );
        assert!(head_only.capacity() < 64 * 1024, "no room made yet");
        buf.put_slice(&large[..20]);
        let Some(Incoming::Large(head)) = c.decode(&mut buf).unwrap() else {
            panic!("a large message is offered");
        };
        assert_eq!(head.header.length, 1_000_000);
        assert!(head.more_to_come());
        c.stream(stream);
        let mut got = read_through(&mut c, &mut buf, &large[20..]);
        got.extend(read_through(&mut c, &mut buf, &small));
        let mut joined = Vec::new();
        let mut last = None;
        for (i, item) in got.iter().enumerate() {
            match item {
                Incoming::Piece(b) => {
                    assert!(stream && b.len() <= PIECE_ROOM.max(8 * 1024));
                    joined.extend_from_slice(b);
                }
                Incoming::Last {
                    bytes,
                    more_to_come,
                } => {
                    assert!(stream && *more_to_come);
                    joined.extend_from_slice(bytes);
                    last = Some(i);
                }
                Incoming::Message(m) if m.len() == large.len() => {
                    assert!(!stream);
                    joined.extend_from_slice(m);
                    last = Some(i);
                }
                Incoming::Message(m) => {
                    assert_eq!(*m, small);
                    assert_eq!(Some(i), last.map(|l| l + 1), "after the large one");
                }
                Incoming::Large(_) => panic!("offered twice"),
            }
        }
        assert_eq!(joined, large, "stream {stream}");
        assert!(!c.is_streaming());
        drop(got);
        assert_eq!(c.decode(&mut buf).unwrap(), None);
        assert!(buf.capacity() <= SHRINK_AFTER, "kept {}", buf.capacity());
    }
}

// ---- OP_MSG --------------------------------------------------------------------------

#[test]
fn op_msg_section_overrunning_its_message() {
    let doc = rawdoc! { "ping": 1, "$db": "admin" };
    let mut sections = body_section(&doc);
    sections.truncate(sections.len() - 3); // the document claims more than is there
    let err = OpMsg::parse(&payload(0, &sections)).unwrap_err();
    assert!(matches!(err, WireError::Overrun { .. }), "{err:?}");
}

#[test]
fn op_msg_unknown_section_kind() {
    let doc = rawdoc! { "ping": 1 };
    let mut sections = body_section(&doc);
    sections.push(3);
    sections.extend_from_slice(doc.as_bytes());
    let err = OpMsg::parse(&payload(0, &sections)).unwrap_err();
    assert_eq!(err, WireError::UnknownSectionKind(3));
}

#[test]
fn op_msg_wrong_checksum() {
    let good = raw::msg(5, CHECKSUM_PRESENT, &rawdoc! { "ping": 1, "$db": "admin" });
    verify_checksum(&good).expect("valid checksum");
    OpMsg::parse(&good[HEADER_LEN..]).expect("parses with checksum");

    let mut bad = good.to_vec();
    let at = bad.len() - 6; // a body byte, not the checksum itself
    bad[at] ^= 0x20;
    assert!(matches!(
        verify_checksum(&bad),
        Err(WireError::ChecksumMismatch { .. })
    ));
    let mut bad = good.to_vec();
    *bad.last_mut().unwrap() ^= 1;
    assert!(matches!(
        verify_checksum(&bad),
        Err(WireError::ChecksumMismatch { .. })
    ));
}

#[test]
fn op_msg_unknown_required_flag() {
    let sections = body_section(&rawdoc! { "ping": 1 });
    let err = OpMsg::parse(&payload(1 << 2, &sections)).unwrap_err();
    assert_eq!(err, WireError::UnknownRequiredFlags(1 << 2));
    // Unknown optional bits (16..31) are ignored; exhaustAllowed is one of the known ones.
    let optional = payload(EXHAUST_ALLOWED | 1 << 20, &sections);
    assert_eq!(
        OpMsg::parse(&optional).unwrap().flags,
        EXHAUST_ALLOWED | 1 << 20
    );
}

#[test]
fn op_msg_two_body_sections() {
    let doc = rawdoc! { "ping": 1 };
    let mut sections = body_section(&doc);
    sections.extend(body_section(&doc));
    assert_eq!(
        OpMsg::parse(&payload(0, &sections)).unwrap_err(),
        WireError::BodyCount(2)
    );
    let only_sequence = sequence_section("documents", &[doc.as_bytes()]);
    assert_eq!(
        OpMsg::parse(&payload(0, &only_sequence)).unwrap_err(),
        WireError::BodyCount(0)
    );
}

#[test]
fn op_msg_sequence_document_overruns_sequence() {
    let doc = rawdoc! { "_id": 1, "x": "some text" };
    let mut sections = body_section(&rawdoc! { "insert": "c", "$db": "d" });
    let mut seq = sequence_section("documents", &[doc.as_bytes()]);
    // Shrink the declared sequence size so the document sticks out of it; keep the bytes.
    let size = i32::from_le_bytes(seq[1..5].try_into().unwrap()) - 4;
    seq[1..5].copy_from_slice(&size.to_le_bytes());
    sections.extend(seq);
    let err = OpMsg::parse(&payload(0, &sections)).unwrap_err();
    assert!(
        matches!(
            err,
            WireError::Overrun {
                what: "op_msg sequence document",
                ..
            } | WireError::UnknownSectionKind(_)
        ),
        "{err:?}"
    );
    // With the section size right, the same message is fine.
    let mut sections = body_section(&rawdoc! { "insert": "c", "$db": "d" });
    sections.extend(sequence_section("documents", &[doc.as_bytes()]));
    assert_eq!(OpMsg::parse(&payload(0, &sections)).unwrap().sequences, 1);
}

#[test]
fn op_msg_sequence_size_overruns_message() {
    let mut sections = body_section(&rawdoc! { "insert": "c", "$db": "d" });
    let mut seq = sequence_section("documents", &[rawdoc! { "a": 1 }.as_bytes()]);
    let size = i32::from_le_bytes(seq[1..5].try_into().unwrap()) + 100;
    seq[1..5].copy_from_slice(&size.to_le_bytes());
    sections.extend(seq);
    let err = OpMsg::parse(&payload(0, &sections)).unwrap_err();
    assert!(matches!(err, WireError::Overrun { .. }), "{err:?}");
}

// ---- OP_COMPRESSED -------------------------------------------------------------------

/// An OP_COMPRESSED payload (after the header).
fn compressed_payload(compressor: u8, declared: i32, data: &[u8]) -> Vec<u8> {
    let mut out = OpCode::MSG.to_le_bytes().to_vec();
    out.extend_from_slice(&declared.to_le_bytes());
    out.push(compressor);
    out.extend_from_slice(data);
    out
}

#[test]
fn compressed_roundtrip_each_compressor() {
    let msg = ping(3);
    for id in [NOOP, SNAPPY, ZLIB, ZSTD] {
        let wrapped = wrap_compressed(id, &msg);
        let c = Compressed::parse(&wrapped[HEADER_LEN..]).unwrap();
        assert_eq!(c.compressor, id);
        assert_eq!(c.original_opcode, OpCode::MSG);
        assert_eq!(c.decompress(MAX).unwrap(), &msg[HEADER_LEN..]);
    }
}

#[test]
fn compressed_wrong_declared_size() {
    let inner = &ping(3)[HEADER_LEN..];
    for id in [NOOP, SNAPPY, ZLIB, ZSTD] {
        let data = compress(id, inner).unwrap();
        for declared in [inner.len() as i32 - 1, inner.len() as i32 + 1] {
            let p = compressed_payload(id, declared, &data);
            let err = Compressed::parse(&p).unwrap().decompress(MAX).unwrap_err();
            assert!(
                matches!(
                    err,
                    WireError::SizeMismatch { .. } | WireError::Decompress(_)
                ),
                "compressor {id}, declared {declared}: {err:?}"
            );
        }
    }
}

#[test]
fn compressed_unknown_compressor() {
    let p = compressed_payload(4, 10, &[0; 10]);
    assert_eq!(
        Compressed::parse(&p).unwrap_err(),
        WireError::UnknownCompressor(4)
    );
}

#[test]
fn compressed_declared_size_over_max() {
    for declared in [MAX as i32 + 1, i32::MAX, -1] {
        let p = compressed_payload(ZLIB, declared, &compress(ZLIB, &[0; 64]).unwrap());
        let err = Compressed::parse(&p).unwrap().decompress(MAX).unwrap_err();
        assert!(
            matches!(err, WireError::BadLength { .. }),
            "{declared}: {err:?}"
        );
    }
}

#[test]
fn compressed_cannot_wrap_compressed() {
    let mut p = compressed_payload(NOOP, 4, &[0; 4]);
    p[..4].copy_from_slice(&OpCode::COMPRESSED.to_le_bytes());
    assert_eq!(
        Compressed::parse(&p).unwrap_err(),
        WireError::BadInnerOpcode(OpCode::COMPRESSED)
    );
}

// ---- legacy --------------------------------------------------------------------------

#[test]
fn legacy_op_query_parse() {
    let cmd = rawdoc! { "isMaster": 1, "helloOk": true };
    let msg = raw::query(9, "admin.$cmd", &cmd);
    assert_eq!(Header::parse(&msg).unwrap().op(), OpCode::Query);
    let q = OpQuery::parse(&msg[HEADER_LEN..]).unwrap();
    assert_eq!(q.full_collection_name, "admin.$cmd");
    assert_eq!(q.number_to_skip, 0);
    assert_eq!(q.number_to_return, -1);
    assert_eq!(q.command(), &*cmd);

    // The `$query` wrapping older drivers use when they add a read preference.
    let wrapped = rawdoc! { "$query": { "isMaster": 1 }, "$readPreference": { "mode": "primary" } };
    let msg = raw::query(10, "admin.$cmd", &wrapped);
    let q = OpQuery::parse(&msg[HEADER_LEN..]).unwrap();
    assert_eq!(q.command(), &*rawdoc! { "isMaster": 1 });

    // A truncated query document is an error, not a panic.
    let short = &msg[HEADER_LEN..msg.len() - 3];
    assert!(OpQuery::parse(short).is_err());
}

// ---- properties ----------------------------------------------------------------------

/// Feeds `bytes` to a decoder in `chunk`-sized pieces. Returns the frames; stops at the
/// first error. Checks that the decoder itself never grows the buffer past the bound.
fn feed(bytes: &[u8], chunk: usize) -> Result<Vec<Bytes>, FrameError> {
    let mut codec = MessageCodec::new(MAX);
    let mut buf = BytesMut::with_capacity(chunk);
    let mut frames = Vec::new();
    let mut rest = bytes;
    loop {
        // The test's own writes never grow the buffer; only the decoder may.
        let room = buf.capacity() - buf.len();
        if room == 0 {
            buf.reserve(chunk);
        }
        let n = rest.len().min(chunk).min(buf.capacity() - buf.len());
        buf.put_slice(&rest[..n]);
        rest = &rest[n..];
        loop {
            let before = buf.capacity();
            let got = codec.decode(&mut buf)?;
            let after = buf.capacity();
            assert!(
                after <= before || after <= GROWTH_BOUND,
                "decoder grew the buffer from {before} to {after} (max {MAX})"
            );
            match got {
                Some(frame) => frames.push(frame),
                None => break,
            }
        }
        if rest.is_empty() {
            return Ok(frames);
        }
    }
}

proptest! {
    #[test]
    fn decoder_survives_arbitrary_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..9000), chunk in 1usize..700) {
        let _ = feed(&bytes, chunk);
    }

    #[test]
    fn decoder_survives_valid_header_then_noise(len in 16i32..(MAX as i32), op in prop_oneof![Just(OpCode::MSG), Just(OpCode::COMPRESSED), Just(OpCode::QUERY), any::<i32>()], body in proptest::collection::vec(any::<u8>(), 0..5000), chunk in 1usize..1500) {
        let input = with_length(len, op, &body);
        if let Ok(frames) = feed(&input, chunk) {
            let complete = input.len() >= len as usize;
            // Whatever follows the first frame is noise and may or may not frame.
            prop_assert_eq!(frames.is_empty(), !complete);
            if complete {
                prop_assert_eq!(&frames[0][..], &input[..len as usize]);
            }
        }
    }

    #[test]
    fn views_survive_arbitrary_payloads(bytes in proptest::collection::vec(any::<u8>(), 0..3000)) {
        let _ = OpMsg::parse(&bytes);
        let _ = OpQuery::parse(&bytes);
        let _ = staleguard::wire::legacy::OpReply::parse(&bytes);
        if let Ok(c) = Compressed::parse(&bytes) {
            let _ = c.decompress(MAX);
        }
        let _ = verify_checksum(&bytes);
    }

    #[test]
    fn op_msg_survives_mutation(flip in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8), truncate in any::<prop::sample::Index>()) {
        let mut sections = body_section(&rawdoc! { "insert": "c", "ordered": true, "$db": "d" });
        let doc = rawdoc! { "_id": 1, "s": "text" };
        sections.extend(sequence_section("documents", &[doc.as_bytes(), doc.as_bytes()]));
        let mut p = payload(CHECKSUM_PRESENT, &sections);
        p.extend_from_slice(&[0; 4]);
        for (at, byte) in flip {
            let i = at.index(p.len());
            p[i] = byte;
        }
        let cut = truncate.index(p.len() + 1);
        let _ = OpMsg::parse(&p[..cut]);
    }

    #[test]
    fn compressed_survives_noise(compressor in 0u8..4, declared in any::<i32>(), data in proptest::collection::vec(any::<u8>(), 0..2000)) {
        let p = compressed_payload(compressor, declared, &data);
        let c = Compressed::parse(&p).expect("known compressor, plain opcode");
        if let Ok(out) = c.decompress(MAX) {
            prop_assert_eq!(out.len() as i64, declared as i64);
        }
    }

    #[test]
    fn compressed_noise_after_valid_stream(compressor in 1u8..4, keep in any::<prop::sample::Index>(), junk in proptest::collection::vec(any::<u8>(), 0..64)) {
        let inner = &ping(1)[HEADER_LEN..];
        let mut data = compress(compressor, inner).unwrap();
        data.truncate(keep.index(data.len() + 1));
        data.extend_from_slice(&junk);
        let p = compressed_payload(compressor, inner.len() as i32, &data);
        let _ = Compressed::parse(&p).unwrap().decompress(MAX);
    }
}
