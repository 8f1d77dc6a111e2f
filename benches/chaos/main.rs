//! `cargo bench --bench chaos`: the chaos-clients harness's long run (30 s healthy, each
//! incident 30 s and 15 s after its heal), for `CHAOS_RUNS` seeds (default 1; the first is `CHAOS_SEED` or the clock's,
//! each next one the previous plus one). Every knob of `tests/chaos/harness/plan.rs`
//! applies. Prints each run's figures and verdicts, then one line per run; exits 1 when
//! any invariant failed.

#[path = "../../tests/chaos/harness/mod.rs"]
mod harness;

fn main() {
    let runs: u64 = std::env::var("CHAOS_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    let first = match harness::Options::sized(true).with_env() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let mut lines = Vec::new();
    for i in 0..runs {
        let opts = harness::Options {
            seed: first.seed + i,
            ..first.clone()
        };
        let report = rt.block_on(harness::run(opts));
        report.print();
        let failed = report.failure_lines();
        lines.push(format!(
            "seed {}: {} of {} checks failed{}",
            report.plan.opts.seed,
            failed.len(),
            report.checks.len(),
            if failed.is_empty() {
                String::new()
            } else {
                format!(":\n    {}", failed.join("\n    "))
            }
        ));
    }
    println!("\nsummary:");
    for l in &lines {
        println!("  {l}");
    }
    if lines.iter().any(|l| !l.contains(": 0 of")) {
        std::process::exit(1);
    }
}
