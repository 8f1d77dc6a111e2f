//! Issue 29's chaos-clients harness, short run (about 50 s of clients, in CI; the harness is in
//! `tests/chaos/harness/`, the long run is `cargo bench --bench chaos`): honest driver
//! readers straight to the simulated mongos and through staleguard, beside odd and hostile
//! raw-socket clients through staleguard, on a healthy cluster, a partial and a full
//! incident, and after each heal. It asserts:
//!
//! - (a) on the healthy cluster no breaker opens, and every honest read through staleguard
//!   ends as straight to mongos, with the same read concern and member class;
//! - (b) during each incident no breaker closes, and paced strict reads are answered at
//!   least as often through staleguard as straight;
//! - (c) after each heal every breaker closes within 5 s while the attackers keep going.
//!
//! The seed is printed first and last; `CHAOS_SEED=<seed>` runs the same plan again, and
//! `CHAOS_BEHAVIOURS=views,short_max_time` (or `-views`, or `none`) picks the behaviours
//! (see `tests/chaos/harness/plan.rs` for every knob). Run with `-- --nocapture` to see
//! the figures and the verdicts; a failure names the invariants it broke.

#[path = "chaos/harness/mod.rs"]
mod harness;

/// The CI run: the whole short plan, a partial and a full incident included, judged by
/// (a), (b) and (c) (about 55 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_clients_change_nothing_for_honest_readers() {
    let opts = harness::Options::sized(false)
        .with_env()
        .unwrap_or_else(|e| panic!("{e}"));
    judge(opts).await;
}

/// A longer healthy cluster alone (20 s judged), every behaviour, judged by (a). Not in CI:
/// the whole plan's healthy phase covers (a) there, and two runs at once in one binary
/// would share the machine. `cargo test --test chaos -- --ignored healthy`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the whole plan covers (a) in CI; run alone with --ignored"]
async fn on_a_healthy_cluster_chaos_clients_change_nothing_for_honest_readers() {
    let mut opts = harness::Options::sized(false);
    opts.incidents = Some(Vec::new());
    opts.healthy = std::time::Duration::from_secs(20);
    let opts = opts.with_env().unwrap_or_else(|e| panic!("{e}"));
    judge(opts).await;
}

async fn judge(opts: harness::Options) {
    let report = harness::run(opts).await;
    report.print();
    let failed = report.failure_lines();
    assert!(
        failed.is_empty(),
        "{} invariant checks failed (seed {}):\n{}",
        failed.len(),
        report.plan.opts.seed,
        failed.join("\n")
    );
}
