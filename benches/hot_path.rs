//! Micro-benchmarks of the per-message work: framing + body view + classification, the
//! `readConcern: available` rewrite, reply inspection, and the policy decision.
//!
//! `cargo bench --bench hot_path` (criterion; `-- <filter>` to run a subset).

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use bson::RawDocument;
use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use staleguard::breaker::{Admission, Reason};
use staleguard::command::{classify, classify_request};
use staleguard::config::{Mode, NsPolicy, PolicyTable};
use staleguard::policy::{decide, resolve};
use staleguard::rewrite::{rewrite, RewriteSpec};
use staleguard::wire::reply;
use staleguard::wire::{inspect_reply, Request};

#[path = "common/msgs.rs"]
mod msgs;
#[path = "common/work.rs"]
mod work;

use work::{time_decode_classify, MAX};

fn bench_decode_classify(c: &mut Criterion) {
    let cases = [
        ("find_300b", msgs::find_msg(false)),
        ("aggregate_nested_lookup", msgs::aggregate_msg()),
        ("insert_100_docs_kind1", msgs::insert_msg()),
        ("find_zstd", msgs::find_zstd_msg()),
    ];
    let mut g = c.benchmark_group("decode_classify");
    for (name, msg) in &cases {
        g.throughput(Throughput::Bytes(msg.len() as u64));
        g.bench_function(format!("{name}/{}B", msg.len()), |b| {
            b.iter_custom(|iters| time_decode_classify(msg, iters))
        });
    }
    g.finish();

    // The parts of the find case, to see where the time goes.
    let find = msgs::find_msg(false);
    let mut g = c.benchmark_group("decode_classify_parts");
    let frame = bytes::Bytes::from(find.clone());
    g.bench_function("request_open/find_300b", |b| {
        b.iter_batched(
            || frame.clone(),
            |frame| Request::new(black_box(frame), MAX),
            BatchSize::SmallInput,
        )
    });
    let body = msgs::find_body(msgs::FALLBACK_DB, msgs::FALLBACK_COLL);
    g.bench_function("classify/find_300b", |b| {
        b.iter(|| classify(black_box(&body)).map(|i| i.name.len()))
    });
    g.finish();
}

/// The request side's per-message work before deciding: `Request::new` + `inflate`, then
/// `classify_request` from the first key the request found. (Until issue 23 this group also
/// timed the older way, `request_body` then `classify` from the body; that API is gone.)
fn bench_open_then_classify(c: &mut Criterion) {
    let mut g = c.benchmark_group("open_then_classify");
    for (name, msg) in [
        ("find_300b", msgs::find_msg(false)),
        ("find_zstd", msgs::find_zstd_msg()),
    ] {
        let frame = bytes::Bytes::from(msg);
        // The session owns each frame it cuts off the read buffer: the clone (a reference
        // count) is made, and the request dropped, outside the timing.
        g.bench_function(format!("Request+classify_request/{name}"), |b| {
            b.iter_batched(
                || frame.clone(),
                |frame| {
                    let mut req = Request::new(frame, MAX).expect("valid");
                    req.inflate(MAX).expect("valid");
                    let n = classify_request(&req).expect("classifiable").name.len();
                    (n, req)
                },
                BatchSize::SmallInput,
            )
        });
    }
    g.finish();
}

fn bench_rewrite(c: &mut Criterion) {
    let spec = RewriteSpec {
        available: true,
        drop_after_cluster_time: true,
        max_time_ms: None,
        primary: false,
    };
    let capped = RewriteSpec {
        available: false,
        drop_after_cluster_time: false,
        max_time_ms: Some(500),
        primary: false,
    };
    // Each iteration opens the message and rewrites it (a cloned `Bytes`: a reference
    // count), as the relay does for a governed read's first attempt.
    let plain = bytes::Bytes::from(msgs::find_msg(false));
    let crc = bytes::Bytes::from(msgs::find_msg(true));
    let zstd = bytes::Bytes::from(msgs::find_zstd_msg());
    let open_rewrite = |msg: &bytes::Bytes, spec: &RewriteSpec| {
        let req = Request::open(black_box(msg.clone()), MAX).expect("opens");
        rewrite(&req, spec, MAX).expect("rewrites")
    };
    let mut g = c.benchmark_group("rewrite");
    g.bench_function("find_available", |b| b.iter(|| open_rewrite(&plain, &spec)));
    g.bench_function("find_available_crc", |b| {
        b.iter(|| open_rewrite(&crc, &spec))
    });
    g.bench_function("find_max_time_cap", |b| {
        b.iter(|| open_rewrite(&plain, &capped))
    });
    g.bench_function("find_zstd_available", |b| {
        b.iter(|| open_rewrite(&zstd, &spec))
    });
    g.finish();
}

fn bench_inspect_reply(c: &mut Criterion) {
    let error = reply::op_msg(5, 17, 0, &msgs::stale_config_body()).to_vec();
    let small = reply::op_msg(5, 17, 0, &msgs::find_reply_body()).to_vec();
    let big = reply::op_msg(5, 17, 0, &msgs::big_cursor_reply_body(1 << 20)).to_vec();
    // What a tracked read's reply costs when the driver negotiated compression.
    let big_zstd = msgs::compressed(&big);
    let mut g = c.benchmark_group("inspect_reply");
    for (name, msg) in [
        ("stale_config_error", &error),
        ("find_1_doc", &small),
        ("cursor_1mb", &big),
        ("cursor_1mb_zstd", &big_zstd),
    ] {
        g.bench_function(format!("{name}/{}B", msg.len()), |b| {
            b.iter(|| inspect_reply(black_box(msg), MAX).expect("valid reply"))
        });
    }
    g.finish();
}

fn table() -> PolicyTable {
    PolicyTable::from_policies(vec![
        NsPolicy::with_defaults("demo.store_inventory", Mode::Fallback),
        NsPolicy::with_defaults("demo.catalog*", Mode::Fallback),
        NsPolicy::with_defaults("pay.*", Mode::Strict),
        NsPolicy::with_defaults("pay.audit", Mode::Passthrough),
    ])
    .expect("valid table")
}

fn bench_policy(c: &mut Criterion) {
    let table = Arc::new(table());
    let open = Admission::Open {
        reason: Reason::StaleRouting,
        probe_in: Duration::from_secs(20),
        errors: 3,
    };
    let bodies = [
        (
            "unlisted_find",
            msgs::find_body(msgs::PASS_DB, msgs::PASS_COLL),
            Admission::Closed,
        ),
        (
            "fallback_find_closed",
            msgs::find_body("demo", "store_inventory"),
            Admission::Closed,
        ),
        (
            "fallback_find_open",
            msgs::find_body("demo", "store_inventory"),
            open,
        ),
        ("strict_find_open", msgs::find_body("pay", "ledger"), open),
        (
            "aggregate_lookup_closed",
            msgs::aggregate_body(),
            Admission::Closed,
        ),
    ];
    let mut g = c.benchmark_group("policy_resolve_decide");
    for (name, body, admission) in &bodies {
        let info = classify(RawDocument::from_bytes(body.as_bytes()).expect("valid"))
            .expect("classifiable");
        g.bench_function(*name, |b| {
            b.iter(|| resolve(black_box(&info), &table).map(|t| decide(&t, &info, *admission)))
        });
    }
    g.finish();
}

fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(50)
}

criterion_group! {
    name = benches;
    config = config();
    targets = bench_decode_classify, bench_open_then_classify, bench_rewrite, bench_inspect_reply, bench_policy
}
criterion_main!(benches);
