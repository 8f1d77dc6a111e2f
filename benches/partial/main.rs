//! `cargo bench --bench partial`: the partial incident (one secondary of shard A stale, one
//! healthy, shard A's primary stalled) through the simulated cluster, paced readers straight
//! to mongos beside readers through staleguard, judged against issue 20's targets:
//!
//! - strict reads through staleguard answered at least as often as direct (share within 10
//!   points, at least 0.95x direct's answered reads per second), failing in a median under
//!   half of direct's;
//! - its slowest strict read outlives its `maxTimeMS` by at most 60 ms;
//! - `pay.transactions` makes at most 4 breaker transitions in 30 s;
//! - fallback reads 100 % answered;
//! - recovery within 5 s of the heal, with no write through staleguard and no write probe.
//!
//! Knobs (environment): PARTIAL_SECS (30), PARTIAL_READERS (4 per namespace and path),
//! PARTIAL_RATE (10 reads/s per reader), PARTIAL_RUNS (1).

#[path = "incident.rs"]
mod incident;

use std::time::Duration;

use incident::{Options, Report, Via, INVENTORY, PAYMENTS};

fn env<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let opts = Options {
        partial: Duration::from_secs(env("PARTIAL_SECS", 30)),
        readers: env("PARTIAL_READERS", 4),
        rate: env("PARTIAL_RATE", 10),
        ..Options::default()
    };
    let runs: usize = env("PARTIAL_RUNS", 1);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let mut missed = 0;
    for i in 1..=runs {
        println!(
            "run {i}/{runs}: partial incident {:?} ({} readers x {} reads/s per namespace and path, maxTimeMS {:?})",
            opts.partial, opts.readers, opts.rate, opts.max_time
        );
        let report = rt.block_on(incident::run(&opts));
        missed += judge(&report, opts.max_time);
    }
    if missed > 0 {
        println!("MISSED: {missed} target(s)");
    }
}

/// Prints the figures and the verdicts; returns how many targets were missed.
fn judge(r: &Report, max_time: Duration) -> usize {
    let (from, to) = (r.incident_at, r.heal_at);
    println!(
        "{:<22} {:<10} {:>6} {:>9} {:>8} {:>12} {:>11}  errors",
        "namespace", "via", "reads", "answered", "ans/s", "fail p50 ms", "slowest ms"
    );
    for ns in [PAYMENTS, INVENTORY] {
        for via in [Via::Direct, Via::Staleguard] {
            let f = r.figures(ns, via, from, to);
            println!(
                "{:<22} {:<10} {:>6} {:>8.1}% {:>8.2} {:>12.0} {:>11.0}  {:?}",
                ns,
                format!("{via:?}").to_lowercase(),
                f.reads,
                f.share() * 100.0,
                f.per_second,
                f.failure_p50_ms,
                f.slowest_ms,
                f.errors
            );
        }
    }
    let direct = r.figures(PAYMENTS, Via::Direct, from, to);
    let guarded = r.figures(PAYMENTS, Via::Staleguard, from, to);
    let inventory = r.figures(INVENTORY, Via::Staleguard, from, to);
    let secs = (to - from).as_secs_f64();
    let pay_transitions = r
        .transitions_in_incident
        .iter()
        .find(|(ns, _)| *ns == PAYMENTS)
        .map_or(0, |(_, n)| *n);
    let allowed = (4.0 * secs / 30.0).ceil() as u64;
    let r_max_ms = max_time.as_millis();
    println!("breakers opened after: {:?}", r.opened_after);
    println!(
        "breaker transitions during the incident: {:?}",
        r.transitions_in_incident
    );
    println!(
        "recovery after the heal: {:?} (rewrites after it: {})",
        r.recovery, r.rewrites_after_recovery
    );
    let checks = [
        (
            format!(
                "strict share within 10 points of direct ({:.1}% vs {:.1}%)",
                guarded.share() * 100.0,
                direct.share() * 100.0
            ),
            guarded.share() + 0.10 >= direct.share(),
        ),
        (
            format!(
                "strict answered/s at least 0.95x direct ({:.2} vs {:.2})",
                guarded.per_second, direct.per_second
            ),
            guarded.per_second >= 0.95 * direct.per_second,
        ),
        (
            format!(
                "strict failure median under half of direct ({:.0} ms vs {:.0} ms)",
                guarded.failure_p50_ms, direct.failure_p50_ms
            ),
            guarded.failure_p50_ms < direct.failure_p50_ms / 2.0,
        ),
        (
            format!(
                "strict slowest read within its maxTimeMS + 60 ms ({:.0} ms, maxTimeMS {} ms)",
                guarded.slowest_ms, r_max_ms
            ),
            guarded.slowest_ms <= r_max_ms as f64 + 60.0,
        ),
        (
            format!("pay.transactions transitions <= {allowed} in {secs:.0} s ({pay_transitions})"),
            pay_transitions <= allowed,
        ),
        (
            format!(
                "fallback reads 100% answered ({:.1}%)",
                inventory.share() * 100.0
            ),
            inventory.reads > 0 && inventory.answered == inventory.reads,
        ),
        (
            format!("recovery within 5 s of the heal ({:?})", r.recovery),
            r.recovery.is_some_and(|d| d <= Duration::from_secs(5))
                && r.rewrites_after_recovery == 0,
        ),
    ];
    let mut missed = 0;
    for (what, ok) in checks {
        println!("{} {what}", if ok { "PASS" } else { "MISS" });
        missed += usize::from(!ok);
    }
    missed
}
