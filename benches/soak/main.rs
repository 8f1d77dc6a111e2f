//! The soak: `cargo bench --bench soak -- --duration 1h [--expect-hardening] [--scale N]`.
//!
//! Runs the release staleguard binary between a misbehaving fake mongos and verifying plus
//! abusive clients for `--duration` (default 1h), prints the figures and every check, and
//! exits 1 when a check that must hold fails. `--expect-hardening` also asserts the checks
//! that need issue 11's hardening. `--scale N` multiplies the abusive load (default 5 for
//! the long run; the CI minute in `tests/soak.rs` uses 1).

mod harness;

use std::time::Duration;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let value = |flag: &str| {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let duration = value("--duration")
        .map(|d| humantime::parse_duration(&d).unwrap_or_else(|e| panic!("--duration {d}: {e}")))
        .unwrap_or(Duration::from_secs(3600));
    let scale: usize = value("--scale")
        .map(|s| s.parse().expect("--scale N"))
        .unwrap_or(5);
    let mut opts = harness::Opts::ci(std::path::Path::new(env!("CARGO_BIN_EXE_staleguard")));
    opts.duration = duration;
    let scale = scale.max(1);
    opts.verifiers *= scale.min(4);
    opts.trickle_conns *= scale;
    opts.big_partials = (opts.big_partials * scale).min(8);
    opts.bombers *= scale.min(4);
    opts.big_pingers = (scale / 2).max(1);
    opts.non_readers *= scale;
    opts.silent *= scale.min(4);
    opts.end_idle_pairs *= scale.min(4);
    opts.end_non_readers *= scale.min(2);
    opts.end_tracked *= scale.min(2);
    opts.end_slow_readers = 2;
    opts.hold = Duration::from_secs(10);
    opts.expect_hardening = args.iter().any(|a| a == "--expect-hardening");
    if let Some(level) = value("--log-level") {
        opts.log_level = level;
    }
    eprintln!("soak: {opts:?}");
    match harness::run(&opts) {
        Ok(report) => {
            println!("{}", report.text);
            let failed = report.failures();
            if !failed.is_empty() {
                for c in failed {
                    eprintln!("soak FAILED: {} ({})", c.name, c.value);
                }
                std::process::exit(1);
            }
        }
        Err(e) => {
            eprintln!("soak could not run: {e}");
            std::process::exit(2);
        }
    }
}
