//! The soak's figures and its checks: each check is required (holds today, asserted in CI)
//! or needs issue 11's hardening (asserted only with `--expect-hardening`).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use super::abuse::{Done, BIG};
use super::abuse21::{forged_collection, Done21, FORGED, PING_SIZE};
use super::clients::Tally;
use super::fake::{Seen, BIG_REPLY};
use super::measure::EndFigures;
use super::{metric, Mem, Opts};
use super::{ADMIN_HEADER_READ_TIMEOUT, FIRST_MESSAGE_TIMEOUT};

/// Issue 21's targets: an idle pair after any message, and a client not reading a reply.
const PAIR_MAX: f64 = 64.0 * 1024.0;
const NON_READER_MAX: f64 = 8.0 * 1048576.0;
/// The longest the well-behaved scraper may go without an answer: the flood holds the cap
/// until `header_read_timeout` cuts it; the rest is slack for a loaded machine.
const SCRAPE_GAP_MAX: Duration = Duration::from_secs(10);

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

fn get(a: &std::sync::atomic::AtomicU64) -> u64 {
    a.load(Ordering::Relaxed)
}

fn mib(b: u64) -> f64 {
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

/// `staleguard_NAME{LABEL}` in the final `/metrics`, 0 when absent.
fn m(metrics: &str, name_and_labels: &str) -> u64 {
    metric(metrics, &format!("staleguard_{name_and_labels} ")).unwrap_or(0.0) as u64
}

fn limit_hits(metrics: &str, limit: &str) -> u64 {
    m(metrics, &format!("limit_hits_total{{limit=\"{limit}\"}}"))
}

fn kib(b: f64) -> f64 {
    b / 1024.0
}

fn issue21_text(seen: &Seen, d: &Done21, end: &EndFigures, metrics: &str) -> String {
    format!(
        "issue 21: {} 40 MB pings then idle; {} clients not reading a 16 MB reply ({} closed, {} \
         still open, {} not answered within 20 s; {} 16 MB replies sent); {} silent connections ({} closed, longest {} ms, \
         {} left open); admin: {} slow header senders ({} cut, longest {} ms), {} flood \
         connections ({} got 503), scraper {} answers / {} misses, longest gap {} ms; {} config \
         rewrites in two pieces (reloads ok {}, error {}); {} $unwind aggregates ({} answered \
         to `available`), {} control finds ({} with a repeated _id to `available`), orphans on \
         demo.unwind {}; {} forging reads; {} invalid maxTimeMS reads ({} reached mongos, {} \
         altered; {} got mongos's refusal, {} something else)\n\
         limit hits: first_message_timeout {}, write_timeout {}, message_timeout {}, \
         max_pending_reads {}, admin_max_connections {}, admin_header_read_timeout {}\n\
         end phase: RSS base {:.1} MiB; {} idle pairs after a 40 MB ping {:.1} MiB ({:.1} KiB \
         per pair); {} clients not reading a streamed 16 MB reply {:.1} MiB ({:.1} KiB each, {} \
         closed by write_timeout); {} not reading a judged one {:.1} MiB ({:.1} KiB each, {} \
         closed); RSS {:.1} MiB, then {} slow readers (1 MiB/s) of a streamed 16 MB \
         reply {:.1} MiB, {:.1} KiB each, {} still open after {} s, of a judged one {:.1} MiB, {:.1} KiB each, {} still open ({} bytes \
         read in all); the phase took {:.1} s (the pings {:.1} s){}\n\n",
        get(&d.big_pings),
        get(&d.non_readers),
        get(&d.non_readers_closed),
        get(&d.non_readers_open),
        get(&d.non_readers_unanswered),
        get(&seen.big_replies),
        get(&d.silent),
        get(&d.silent_closed),
        get(&d.silent_max_ms),
        get(&d.silent_open),
        get(&d.slow_headers),
        get(&d.slow_headers_cut),
        get(&d.slow_headers_max_ms),
        get(&d.admin_flood),
        get(&d.admin_503),
        get(&d.scrapes_ok),
        get(&d.scrapes_failed),
        get(&d.scrape_max_gap_ms),
        get(&d.config_writes),
        m(metrics, "reloads_total{result=\"ok\"}"),
        m(metrics, "reloads_total{result=\"error\"}"),
        get(&d.unwind),
        get(&seen.unwind_available),
        get(&d.dup_finds),
        get(&seen.dup_available),
        m(
            metrics,
            "orphans_estimated_total{namespace=\"demo.unwind\"}"
        ),
        get(&d.forged),
        get(&d.bad_max_time),
        get(&seen.bad_max_time_seen),
        get(&seen.bad_max_time_altered),
        get(&d.bad_max_time_refused),
        get(&d.bad_max_time_other),
        limit_hits(metrics, "first_message_timeout"),
        limit_hits(metrics, "write_timeout"),
        limit_hits(metrics, "message_timeout"),
        limit_hits(metrics, "max_pending_reads"),
        limit_hits(metrics, "admin_max_connections"),
        limit_hits(metrics, "admin_header_read_timeout"),
        mib(end.rss_base),
        end.idle_pairs,
        mib(end.rss_idle),
        kib(end.per_pair()),
        end.non_readers,
        mib(end.rss_non_readers),
        kib(end.per_non_reader()),
        end.non_readers_closed,
        end.tracked,
        mib(end.rss_tracked),
        kib(end.per_tracked()),
        end.tracked_closed,
        mib(end.rss_before_slow),
        end.slow_readers,
        mib(end.rss_slow_streamed),
        kib(end.per_slow_streamed()),
        end.slow_streamed_open,
        super::measure::SLOW_FOR.as_secs(),
        mib(end.rss_slow_judged),
        kib(end.per_slow_judged()),
        end.slow_judged_open,
        end.slow_read_bytes,
        end.took.as_secs_f64(),
        end.pings_took.as_secs_f64(),
        end.error
            .as_ref()
            .map(|e| format!(" (end phase failed: {e})"))
            .unwrap_or_default(),
    )
}

fn check(name: &'static str, value: String, pass: bool) -> Check {
    Check {
        name,
        value,
        pass,
        needs_hardening: true,
    }
}

fn issue21_checks(
    seen: &Seen,
    d: &Done21,
    end: &EndFigures,
    metrics: &str,
    log: &str,
) -> Vec<Check> {
    let end_ok = end.error.is_none();
    let orphans = m(
        metrics,
        "orphans_estimated_total{namespace=\"demo.unwind\"}",
    );
    let dups = get(&seen.dup_available);
    let forged_lines = log.lines().filter(|l| l.starts_with(FORGED)).count();
    let raw_escapes = log.matches('\u{1b}').count();
    // The forging namespace reached the log, escaped (a breaker transition at warn).
    let escaped = format!("{}", forged_collection().escape_debug());
    let shown =
        log.contains(&format!("forge.{escaped}")) || log.contains(&format!("forge.x\\n{FORGED}"));
    let reloads_ok = m(metrics, "reloads_total{result=\"ok\"}");
    let silent_max = Duration::from_millis(get(&d.silent_max_ms));
    let slow_max = Duration::from_millis(get(&d.slow_headers_max_ms));
    let gap = Duration::from_millis(get(&d.scrape_max_gap_ms));
    vec![
        check(
            "idle pair after a 40 MB ping keeps <= 64 KiB (end phase)",
            format!("{:.1} KiB ({} pairs)", kib(end.per_pair()), end.idle_pairs),
            end_ok && end.idle_pairs > 0 && get(&d.big_pings) > 0 && end.per_pair() <= PAIR_MAX,
        ),
        check(
            "client not reading a streamed 16 MB reply costs <= 8 MiB",
            format!("{:.1} KiB each", kib(end.per_non_reader())),
            end_ok && end.non_readers > 0 && end.per_non_reader() <= NON_READER_MAX,
        ),
        check(
            "non-readers closed by write_timeout (abuse and end phase)",
            format!(
                "{}+{} closed, {} open; hits {}",
                get(&d.non_readers_closed),
                end.non_readers_closed + end.tracked_closed,
                get(&d.non_readers_open),
                limit_hits(metrics, "write_timeout")
            ),
            end_ok
                && get(&d.non_readers_closed) > 0
                && get(&d.non_readers_open) == 0
                && end.non_readers_closed == end.non_readers
                && end.tracked_closed == end.tracked
                && limit_hits(metrics, "write_timeout") >= (end.non_readers + end.tracked) as u64,
        ),
        check(
            "silent connections closed by first_message_timeout",
            format!(
                "{} closed, {} open, longest {} ms",
                get(&d.silent_closed),
                get(&d.silent_open),
                silent_max.as_millis()
            ),
            get(&d.silent_closed) > 0
                && get(&d.silent_open) == 0
                && silent_max <= FIRST_MESSAGE_TIMEOUT + Duration::from_secs(3)
                && limit_hits(metrics, "first_message_timeout") >= get(&d.silent_closed),
        ),
        check(
            "admin: slow heads cut at header_read_timeout, flood refused",
            format!(
                "{} cut (longest {} ms), {} got 503",
                get(&d.slow_headers_cut),
                slow_max.as_millis(),
                get(&d.admin_503)
            ),
            get(&d.slow_headers_cut) > 0
                && slow_max <= ADMIN_HEADER_READ_TIMEOUT + Duration::from_secs(3)
                && get(&d.admin_503) > 0
                && limit_hits(metrics, "admin_max_connections") > 0
                && limit_hits(metrics, "admin_header_read_timeout") > 0,
        ),
        check(
            "admin: a well-behaved scraper is answered throughout",
            format!(
                "{} answers, longest gap {:.1} s",
                get(&d.scrapes_ok),
                gap.as_secs_f64()
            ),
            get(&d.scrapes_ok) > 0 && gap <= SCRAPE_GAP_MAX,
        ),
        check(
            "config written in two pieces: only whole files applied",
            format!(
                "{} writes, {} reloads ok, pay `available` {}",
                get(&d.config_writes),
                reloads_ok,
                get(&seen.strict_available)
            ),
            get(&d.config_writes) > 0 && reloads_ok > 0 && get(&seen.strict_available) == 0,
        ),
        check(
            "$unwind never counted as orphans (demo.unwind = control finds)",
            format!(
                "{orphans} counted, {dups} control, {} $unwind",
                get(&seen.unwind_available)
            ),
            orphans == dups && dups > 0 && get(&seen.unwind_available) > 0,
        ),
        check(
            "no forged log line (pretty log), namespace logged escaped",
            format!("{forged_lines} forged, {raw_escapes} ESC, shown {shown}"),
            forged_lines == 0 && raw_escapes == 0 && shown,
        ),
        check(
            "invalid maxTimeMS reaches mongos byte for byte, answered by mongos",
            format!(
                "{} seen, {} altered, {} other replies",
                get(&seen.bad_max_time_seen),
                get(&seen.bad_max_time_altered),
                get(&d.bad_max_time_other)
            ),
            get(&seen.bad_max_time_seen) > 0
                && get(&seen.bad_max_time_altered) == 0
                && get(&d.bad_max_time_other) == 0,
        ),
    ]
}
