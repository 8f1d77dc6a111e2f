//! A quick in-process timing of the two micro targets, so the e2e command can print
//! PASS/MISS for them too (`cargo bench --bench hot_path` has the full criterion picture).

use std::hint::black_box;
use std::time::{Duration, Instant};

use bytes::Bytes;
use staleguard::rewrite::{rewrite, RewriteSpec};
use staleguard::wire::Request;

use crate::msgs;
use crate::work::{time_decode_classify, MAX};

pub struct Micro {
    pub decode_classify_ns: f64,
    pub rewrite_ns: f64,
    pub rewrite_crc_ns: f64,
}

/// The median over `batches` of the mean time per run inside a batch of `per_batch` runs.
fn median_ns(batches: usize, per_batch: u64, mut timed: impl FnMut(u64) -> Duration) -> f64 {
    timed(per_batch); // warm-up
    let mut v: Vec<f64> = (0..batches)
        .map(|_| timed(per_batch).as_nanos() as f64 / per_batch as f64)
        .collect();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Opens the message (`wire::Request`, from a cloned `Bytes`) and rewrites it, `iters` times.
fn time_rewrite(msg: &[u8], spec: &RewriteSpec, iters: u64) -> Duration {
    let frame = Bytes::copy_from_slice(msg);
    let start = Instant::now();
    for _ in 0..iters {
        let req = Request::open(black_box(frame.clone()), MAX).expect("opens");
        black_box(rewrite(&req, spec, MAX).expect("rewrites"));
    }
    start.elapsed()
}

pub fn run() -> Micro {
    let find = msgs::find_msg(false);
    let find_crc = msgs::find_msg(true);
    let spec = RewriteSpec {
        available: true,
        drop_after_cluster_time: true,
        max_time_ms: None,
        primary: false,
    };
    Micro {
        decode_classify_ns: median_ns(21, 20_000, |n| time_decode_classify(&find, n)),
        rewrite_ns: median_ns(21, 20_000, |n| time_rewrite(&find, &spec, n)),
        rewrite_crc_ns: median_ns(21, 20_000, |n| time_rewrite(&find_crc, &spec, n)),
    }
}
