//! The per-request work the session does before deciding, as a timed routine shared by
//! `hot_path` (criterion) and `e2e` (its quick PASS/MISS check).

#![allow(dead_code)]

use std::hint::black_box;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use staleguard::command::classify_request;
use staleguard::wire::{MessageCodec, Request, DEFAULT_MAX_MESSAGE_SIZE};
use tokio_util::codec::Decoder;

pub const MAX: usize = DEFAULT_MAX_MESSAGE_SIZE;

/// Cuts one frame off the read buffer (`MessageCodec`), opens it once (`wire::Request`,
/// decompressing OP_COMPRESSED) and classifies it from there (`classify_request`), as the
/// session's request side does.
pub fn decode_classify(codec: &mut MessageCodec, buf: &mut BytesMut) -> usize {
    let frame = codec
        .decode(buf)
        .expect("valid frame")
        .expect("whole frame in the buffer");
    let mut req = Request::new(frame, MAX).expect("valid request");
    req.inflate(MAX).expect("valid compressed request");
    let info = classify_request(&req).expect("classifiable");
    info.name.len() + info.other_namespaces.len() + usize::from(info.read_pref.is_some())
}

/// Times `iters` runs of [`decode_classify`] with the frames laid back to back in read
/// buffers, as a socket read leaves them; filling the buffers is not timed.
pub fn time_decode_classify(msg: &[u8], iters: u64) -> Duration {
    let per_buf = ((1 << 20) / msg.len().max(1)).clamp(1, 1024) as u64;
    let mut codec = MessageCodec::new(MAX);
    let mut total = Duration::ZERO;
    let mut left = iters;
    while left > 0 {
        let n = left.min(per_buf);
        let mut buf = BytesMut::with_capacity(msg.len() * n as usize);
        for _ in 0..n {
            buf.extend_from_slice(msg);
        }
        let start = Instant::now();
        for _ in 0..n {
            black_box(decode_classify(&mut codec, black_box(&mut buf)));
        }
        total += start.elapsed();
        left -= n;
    }
    total
}
