//! The side-by-side summary of a run, and what it means in plain words.

use std::fmt::Write as _;

use crate::{ms_or_dash, phase_shares, Path, Report, Tally, Workload};

fn row_name(w: Workload, p: Path) -> (&'static str, &'static str) {
    (
        match w {
            Workload::Inventory => "inventory",
            Workload::Payments => "payments",
            Workload::Orders => "orders",
        },
        match p {
            Path::Direct => "direct",
            Path::Staleguard => "staleguard",
            Path::Ladder => "sg+ladder",
        },
    )
}

/// Payments during phase 3 only, the partial incident (secondary a1 stale, a2 healthy): the
/// common form of the incident, where an all-or-nothing breaker would fail reads a healthy
/// secondary answers.
fn partial_table(out: &mut String, report: &Report) {
    let _ = writeln!(out, "\nPayments answered by phase (1 healthy, 2 stalled, 3 a1 stale, 4 a1 and a2 stale, 5 resumed):");
    for p in [Path::Direct, Path::Staleguard, Path::Ladder] {
        let Some(t) = report.tallies.get(&(Workload::Payments, p)) else {
            continue;
        };
        let shares = phase_shares(&t.by_phase);
        let _ = writeln!(
            out,
            "{:<10} {}",
            row_name(Workload::Payments, p).1,
            shares.join("  ")
        );
    }
    let _ = writeln!(
        out,
        "\nPartial incident (phase 3: a1 stale, a2 healthy), payments:\n{:<10} {:>8} {:>7} {:>10} {:>12}",
        "path", "requests", "ok %", "answered", "err p50 ms"
    );
    for p in [Path::Direct, Path::Staleguard, Path::Ladder] {
        let Some(t) = report.tallies.get(&(Workload::Payments, p)) else {
            continue;
        };
        let _ = writeln!(
            out,
            "{:<10} {:>8} {:>7.1} {:>10} {:>12}",
            row_name(Workload::Payments, p).1,
            t.partial_requests,
            t.partial_share() * 100.0,
            t.partial_ok,
            ms_or_dash(&t.partial_error_ms),
        );
    }
}

/// The side-by-side summary, then what it means in plain words.
pub fn summary(report: &Report) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<10} {:<10} {:>8} {:>7} {:>8} {:>8} {:>12} {:>8}  errors by kind",
        "workload", "path", "requests", "ok %", "p50 ms", "p99 ms", "err p50 ms", "orphans"
    );
    for ((w, p), t) in &report.tallies {
        let (wn, pn) = row_name(*w, *p);
        let errors = if t.errors.is_empty() {
            "-".to_string()
        } else {
            t.errors
                .iter()
                .map(|(k, n)| format!("{k}: {n}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let _ = writeln!(
            out,
            "{wn:<10} {pn:<10} {:>8} {:>7.1} {:>8.1} {:>8.1} {:>12} {:>8}  {errors}",
            t.requests,
            t.ok_share() * 100.0,
            t.percentile(50.0),
            t.percentile(99.0),
            ms_or_dash(&t.error_ms),
            t.orphans,
        );
    }
    partial_table(&mut out, report);
    phase_notes(&mut out, report);
    let get = |w, p| report.tallies.get(&(w, p));
    if let (Some(d), Some(g)) = (
        get(Workload::Inventory, Path::Direct),
        get(Workload::Inventory, Path::Staleguard),
    ) {
        let _ = writeln!(
            out,
            "\nInventory display: straight to mongos {:.1}% of requests failed (p99 {:.0} ms); through staleguard {:.1}% (p99 {:.0} ms). \
             The price: {} orphan document(s) served twice by readConcern \"available\" — acceptable for a display.",
            100.0 - d.ok_share() * 100.0,
            d.percentile(99.0),
            100.0 - g.ok_share() * 100.0,
            g.percentile(99.0),
            g.orphans,
        );
        let _ = writeln!(
            out,
            "Orphan estimate: staleguard counted {} document(s) returned twice in its \"available\" replies \
             (staleguard_orphans_estimated_total); the display itself received {} twice (ground truth for what was served; \
             the simulated cluster holds {} orphan(s) on the donor).",
            report.orphans_estimated, g.orphans, report.orphans_on_donor,
        );
        let first = |t: &Tally| {
            t.first_after_restart.map_or_else(
                || "none sent".to_string(),
                |(ms, ok)| {
                    format!(
                        "{} after {ms:.0} ms",
                        if ok { "answered" } else { "failed" }
                    )
                },
            )
        };
        let _ = writeln!(
            out,
            "First inventory read after a1 restarted: straight to mongos {}; through staleguard {}.",
            first(d),
            first(g),
        );
    }
    if let (Some(d), Some(g)) = (
        get(Workload::Payments, Path::Direct),
        get(Workload::Payments, Path::Staleguard),
    ) {
        let _ = writeln!(
            out,
            "Payments: straight to mongos {} request(s) failed, each after waiting a median {:.0} ms (mongos retries StaleConfig \
             internally until the read's maxTimeMS runs out, and the driver adds its own round trips); through staleguard {} failed, \
             each within a median {:.1} ms: while the breaker is open, reads go out bounded by a short time limit, so a healthy \
             secondary still answers and a stale one fails fast; nothing is relaxed ({} orphans), and the service gets a clear error \
             instead of a hang.",
            d.requests - d.ok,
            d.error_p50(),
            g.requests - g.ok,
            g.error_p50(),
            g.orphans,
        );
    }
    if let (Some(d), Some(l)) = (
        get(Workload::Payments, Path::Direct),
        get(Workload::Payments, Path::Ladder),
    ) {
        let _ = writeln!(
            out,
            "Payments with the primary ladder: {:.1}% answered (straight to mongos {:.1}%), p99 {:.0} ms (direct {:.0} ms), \
             {} orphans: a strict read that meets StaleConfig or an open breaker is sent once to the shard's primary \
             (read concern untouched), which still has its routing table and filters orphans.",
            l.ok_share() * 100.0,
            d.ok_share() * 100.0,
            l.percentile(99.0),
            d.percentile(99.0),
            l.orphans,
        );
    }
    if let Some(o) = get(Workload::Orders, Path::Staleguard) {
        let when = report.stall_detected_at.map_or_else(
            || "staleguard did not see writes stop completing".to_string(),
            |t| {
                format!(
                    "staleguard said writes were not completing at {:.1}s",
                    t.as_secs_f64()
                )
            },
        );
        let first_read_error = [Workload::Inventory, Workload::Payments]
            .iter()
            .flat_map(|w| [Path::Direct, Path::Staleguard].map(|p| (*w, p)))
            .filter_map(|k| report.tallies.get(&k).and_then(|t| t.first_error_at))
            .min();
        let _ = writeln!(
            out,
            "Orders: {} insert(s) through staleguard, {:.1}% completed; while shard A's primary was stalled they waited \
             (no proxy can make a stalled primary write). {when}{}, and held the inventory breaker open from then on.",
            o.requests,
            o.ok_share() * 100.0,
            match (report.stall_detected_at, first_read_error) {
                (Some(s), Some(e)) => format!(
                    ", {} the first read failed ({:.1}s)",
                    if s < e { "before" } else { "after" },
                    e.as_secs_f64()
                ),
                _ => String::new(),
            },
        );
    }
    out
}

/// A share in percent, or `-` for a phase that sent nothing.
fn pct((n, ok): (u64, u64)) -> String {
    if n == 0 {
        "-".to_string()
    } else {
        format!("{:.0}%", ok as f64 * 100.0 / n as f64)
    }
}

/// What each phase's payment numbers mean, with this run's own numbers: why staleguard
/// answers more in phase 3 and may answer fewer in phase 4.
fn phase_notes(out: &mut String, report: &Report) {
    let get = |p| report.tallies.get(&(Workload::Payments, p));
    let (Some(d), Some(g)) = (get(Path::Direct), get(Path::Staleguard)) else {
        return;
    };
    let both = |i: usize| {
        format!(
            "straight to mongos {}, through staleguard {}",
            pct(d.by_phase[i]),
            pct(g.by_phase[i])
        )
    };
    let _ = writeln!(
        out,
        "\nWhat each phase shows (payments, strict: never relaxed):"
    );
    let _ = writeln!(out, "  1 healthy: {}. Every read answers.", both(0));
    let _ = writeln!(
        out,
        "  2 shard A's primary stalls: {}. Reads still answer: the secondaries keep the routing tables they have; only writes wait (the orders), and staleguard's write-stall watch says so before any read fails.",
        both(1)
    );
    let (d3, g3) = (d.by_phase[2], g.by_phase[2]);
    let better = if g3.0 > 0 && d3.0 > 0 && g3.1 * d3.0 > d3.1 * g3.0 {
        "so staleguard answers more"
    } else {
        "so staleguard answers about as many, and its failures come sooner"
    };
    let _ = writeln!(
        out,
        "  3 a1 restarts (a1 stale, a2 healthy): {}. Straight to mongos, a read that meets a1 waits its whole maxTimeMS and fails; through staleguard, once the breaker is open, it fails within open_time_limit and is sent once more, and mongos often picks the healthy a2: {better}.",
        both(2)
    );
    let (d4, g4) = (d.by_phase[3], g.by_phase[3]);
    let without_late = |t: &crate::Tally| {
        pct((
            t.by_phase[3].0,
            t.by_phase[3].1.saturating_sub(t.answered_late[3]),
        ))
    };
    let _ = writeln!(
        out,
        "  4 a2 restarts too (no secondary of shard A can serve a versioned read): {}. The payments that answer are those on shard B. Straight to mongos, {} of its {} answers in this phase came after the primary resumed: those reads were still waiting out their maxTimeMS when it did (without them: {}). Through staleguard the same reads had already failed fast, within about two open_time_limit bounds ({} answered late): the price of not hanging{}.",
        both(3),
        d.answered_late[3],
        d4.1,
        without_late(d),
        g.answered_late[3],
        if g4.0 > 0 && d4.0 > 0 && g4.1 * d4.0 < d4.1 * g4.0 {
            ", and why this phase's row through staleguard can be lower"
        } else {
            ""
        }
    );
    let _ = writeln!(
        out,
        "  5 the primary resumes: {}. Secondaries refresh their routing tables; the breakers close on their samples.",
        both(4)
    );
    if let Some(l) = get(Path::Ladder) {
        let _ = writeln!(
            out,
            "  sg+ladder: {} in phase 3 and {} in phase 4: a read that meets a stale secondary, or an open breaker, goes to shard A's primary, which still has its routing table.",
            pct(l.by_phase[2]),
            pct(l.by_phase[3])
        );
    }
}
