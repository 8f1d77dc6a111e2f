//! The soak's figures and its checks: each check is required (holds today, asserted in CI)
//! or needs issue 11's hardening (asserted only with `--expect-hardening`).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use super::abuse::{Done, BIG};
use super::abuse21::{Done21, PING_SIZE};
use super::clients::Tally;
use super::fake::{Seen, BIG_REPLY};
use super::measure::EndFigures;
use super::report21::{issue21_checks, issue21_text};
use super::{Mem, Opts};

/// RSS the proxy may keep after the abuse ends, over what it had before it began. It was
/// +134 to +167 MiB until the binary fixed glibc's mmap threshold (`main.rs`): the buffers
/// of 47 MB messages came from a heap that does not shrink. With it: +5 to +8 MiB.
const RSS_GROWTH_MAX: u64 = 64 << 20;

#[derive(Debug, Clone)]
pub struct Check {
    pub name: &'static str,
    pub value: String,
    pub pass: bool,
    /// Holds only once issue 11's hardening (breaker evidence, duplicate fields, legacy
    /// commands, codec growth) has landed.
    pub needs_hardening: bool,
}

#[derive(Debug)]
pub struct Report {
    pub text: String,
    pub checks: Vec<Check>,
    pub expect_hardening: bool,
}

impl Report {
    /// The checks that must pass in this run and did not.
    pub fn failures(&self) -> Vec<&Check> {
        self.checks
            .iter()
            .filter(|c| !c.pass && (!c.needs_hardening || self.expect_hardening))
            .collect()
    }
}

pub(super) fn get(a: &std::sync::atomic::AtomicU64) -> u64 {
    a.load(Ordering::Relaxed)
}

pub(super) fn mib(b: u64) -> f64 {
    b as f64 / 1048576.0
}

#[allow(clippy::too_many_arguments)]
pub fn build(
    opts: &Opts,
    took: Duration,
    tallies: &[(&'static str, &'static str, Arc<Tally>)],
    seen: &Seen,
    done: &Done,
    d21: &Done21,
    d30: &super::abuse30::Done30,
    mem: Mem,
    end: &EndFigures,
    metrics: &str,
    alive: Result<(), String>,
    log: &str,
) -> Report {
    let mut text = format!(
        "soak: {:.0} s (abuse for all but the last {:.0} s), {} verifying clients per namespace\n\n\
         verifying clients     requests        ok    errors  mismatch  lost   p50 ms   p99 ms\n",
        took.as_secs_f64(),
        super::settle(opts.duration).as_secs_f64(),
        opts.verifiers,
    );
    let (mut requests, mut mismatches, mut lost) = (0, 0, 0);
    let errors_of = |db: &str, coll: &str| -> u64 {
        tallies
            .iter()
            .find(|(d, c, _)| (*d, *c) == (db, coll))
            .map_or(0, |(_, _, t)| get(&t.errors))
    };
    let fallback_errors = errors_of("demo", "inventory") + errors_of("demo", "quiet");
    let quiet_strict_errors = errors_of("pay", "quiet");
    let mut progress = true;
    for (db, coll, t) in tallies {
        let (p50, p99) = t.percentiles();
        let r = get(&t.requests);
        progress &= get(&t.ok) > 0;
        requests += r;
        mismatches += get(&t.mismatches);
        lost += get(&t.lost);
        text.push_str(&format!(
            "  {:<18} {:>9} {:>9} {:>9} {:>9} {:>5} {:>8.2} {:>8.2}\n",
            format!("{db}.{coll}"),
            r,
            get(&t.ok),
            get(&t.errors),
            get(&t.mismatches),
            get(&t.lost),
            p50,
            p99
        ));
    }
    text.push_str(&format!(
        "\nupstream faults: {} StaleConfig, {} slow replies, {} resets, {} garbage replies; \
         {} requests, {} compressed refused\n\
         abuse: {} poisoning connects, {} maxTimeMS:1 reads, {} duplicated-field reads, \
         {} OP_QUERY $cmd reads, {} trickled bytes on {} connections, {} sends of 47 MB − 1 \
         on {}, {} zstd bombs, {} pipelined unread reads, {} flood reads, {} chaos reads\n\
         staleguard memory: RSS start {:.1} MiB, end {:.1} MiB, max {:.1} MiB; \
         VmSize start {:.1} MiB, max {:.1} MiB\n\n",
        get(&seen.stale_sent),
        get(&seen.slow_sent),
        get(&seen.resets),
        get(&seen.garbage_sent),
        get(&seen.requests),
        get(&seen.compressed_refused),
        get(&done.poison),
        get(&done.tiny_max_time),
        get(&done.duplicated),
        get(&done.legacy),
        get(&done.trickle_bytes),
        opts.trickle_conns,
        get(&done.big_partial),
        opts.big_partials,
        get(&done.bombs),
        get(&done.pipelined),
        get(&done.flood),
        get(&done.chaos),
        mib(mem.rss_start),
        mib(mem.rss_end),
        mib(mem.rss_max),
        mib(mem.vm_start),
        mib(mem.vm_max),
    ));
    let faults = get(&seen.stale_sent) > 0
        && get(&seen.slow_sent) > 0
        && get(&seen.resets) > 0
        && get(&seen.garbage_sent) > 0;
    // What the abuse may legitimately hold: the 47 MB − 1 bytes really sent, plus a few MB
    // per trickling connection (issue 11, "Done when").
    let vm_allowed = opts.big_partials as u64 * 2 * BIG as u64
        + opts.trickle_conns as u64 * (4 << 20)
        + (opts.big_pingers as u64 + 1) * 2 * PING_SIZE as u64
        + (opts.non_readers + opts.end_non_readers) as u64 * (1 << 20)
        + opts.end_tracked as u64 * 2 * BIG_REPLY as u64
        + (256 << 20);
    let vm_growth = mem.vm_max.saturating_sub(mem.vm_start);
    let rss_growth = mem.rss_end.saturating_sub(mem.rss_start);
    let mut checks = vec![
        Check {
            name: "every verifying class made progress",
            value: format!("{requests} requests"),
            pass: progress,
            needs_hardening: false,
        },
        Check {
            name: "faults were injected (StaleConfig, slow, reset, garbage)",
            value: format!("{}", faults),
            pass: faults,
            needs_hardening: false,
        },
        Check {
            name: "no reply reaches the wrong request (mismatches)",
            value: mismatches.to_string(),
            pass: mismatches == 0,
            needs_hardening: false,
        },
        Check {
            name: "well-behaved clients lose no reply",
            value: lost.to_string(),
            pass: lost == 0,
            needs_hardening: false,
        },
        Check {
            name: "errors on fallback namespaces",
            value: fallback_errors.to_string(),
            pass: fallback_errors == 0,
            needs_hardening: false,
        },
        Check {
            name: "staleguard alive at the end",
            value: match &alive {
                Ok(()) => "yes".into(),
                Err(e) => format!("no: {e}; log tail: {}", tail(log)),
            },
            pass: alive.is_ok(),
            needs_hardening: false,
        },
        Check {
            name: "RSS after the abuse within 64 MiB of before",
            value: format!("+{:.1} MiB", mib(rss_growth)),
            pass: rss_growth <= RSS_GROWTH_MAX,
            needs_hardening: false,
        },
        Check {
            name: "no breaker poisoning: strict reads on pay.quiet never fail",
            value: quiet_strict_errors.to_string(),
            pass: quiet_strict_errors == 0,
            needs_hardening: true,
        },
        Check {
            name: "no breaker poisoning: demo.quiet reads never rewritten",
            value: get(&seen.quiet_rewritten).to_string(),
            pass: get(&seen.quiet_rewritten) == 0,
            needs_hardening: true,
        },
        Check {
            name: "no `available` reaches mongos on a strict namespace (dup fields, OP_QUERY)",
            value: get(&seen.strict_available).to_string(),
            pass: get(&seen.strict_available) == 0,
            needs_hardening: true,
        },
        Check {
            name: "address space bounded by bytes actually sent",
            value: format!(
                "+{:.0} MiB (allowed {:.0} MiB)",
                mib(vm_growth),
                mib(vm_allowed)
            ),
            pass: vm_growth <= vm_allowed,
            needs_hardening: true,
        },
    ];
    text.push_str(&issue21_text(seen, d21, end, metrics));
    checks.extend(issue21_checks(seen, d21, end, metrics, log));
    text.push_str(&super::abuse30::issue30_text(d30, metrics));
    let abuse = opts.duration.saturating_sub(super::settle(opts.duration));
    checks.extend(super::abuse30::issue30_checks(d30, metrics, log, abuse));
    text.push_str("checks:\n");
    for c in &checks {
        let verdict = match (c.pass, c.needs_hardening) {
            (true, _) => "PASS",
            (false, false) => "FAIL",
            (false, true) if opts.expect_hardening => "FAIL",
            (false, true) => "fail (pending hardening, not asserted)",
        };
        let tag = if c.needs_hardening {
            "[hardening]"
        } else {
            "[required] "
        };
        text.push_str(&format!(
            "  {tag} {:<76} {:<34} {verdict}\n",
            c.name, c.value
        ));
    }
    Report {
        text,
        checks,
        expect_hardening: opts.expect_hardening,
    }
}

fn tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(5)..].join(" | ")
}
