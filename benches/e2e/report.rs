//! Medians, ratios to the floor, the markdown tables and the PASS/MISS list.

use std::collections::BTreeMap;
use std::fmt::Write;

use crate::counts::{Counts, CALLS};
use crate::load::Outcome;
use crate::memory::MemResult;
use crate::micro::Micro;

/// One measured window of one target.
#[derive(Debug, Clone)]
pub struct Sample {
    pub rps: f64,
    pub p50: f64,
    pub p99: f64,
    pub p999: f64,
    pub cpu_us: Option<f64>,
    /// The load generator's own CPU per round trip, µs.
    pub load_cpu_us: Option<f64>,
    /// The fake mongos's CPU per round trip, µs.
    pub upstream_cpu_us: Option<f64>,
    /// Kernel share of the proxy's CPU time.
    pub sys: Option<f64>,
    pub unexpected: u64,
    /// For the rewrite target: (finds that reached mongos with `available`, all finds).
    pub rewritten: Option<(i64, i64)>,
    /// The proxy's system calls and context switches in the window, and the round trips
    /// they are divided by (`E2E_COUNT=1`).
    pub counts: Option<(Counts, u64)>,
    pub count_error: Option<String>,
    /// The proxy's instructions per round trip (`E2E_CALLGRIND=1`).
    pub instructions: Option<f64>,
}

impl Sample {
    pub fn of(o: &Outcome) -> Sample {
        Sample {
            rps: o.per_sec(),
            p50: o.quantile_us(0.50),
            p99: o.quantile_us(0.99),
            p999: o.quantile_us(0.999),
            cpu_us: o.cpu_us_per_rt(),
            load_cpu_us: o.load_cpu_us_per_rt(),
            upstream_cpu_us: o.upstream_cpu_us_per_rt(),
            sys: o.sys_share(),
            unexpected: o.unexpected,
            rewritten: None,
            counts: match &o.counts {
                Some(Ok(c)) => Some((c.clone(), o.round_trips)),
                _ => None,
            },
            count_error: match (&o.counts, &o.instructions) {
                (Some(Err(e)), _) | (_, Some(Err(e))) => Some(e.clone()),
                _ => None,
            },
            instructions: o.instructions_per_rt(),
        }
    }

    pub fn line(&self) -> String {
        let mut s = format!(
            "{:>8.0} req/s  p50 {:>7.1} µs  p99 {:>7.1} µs  p99.9 {:>7.1} µs",
            self.rps, self.p50, self.p99, self.p999
        );
        if let (Some(c), Some(k)) = (self.cpu_us, self.sys) {
            let _ = write!(s, "  cpu {c:>5.1} µs/rt ({:.0}% sys)", k * 100.0);
        }
        if let Some(l) = self.load_cpu_us {
            let _ = write!(s, "  load gen {l:>5.1} µs/rt");
        }
        if let Some(u) = self.upstream_cpu_us {
            let _ = write!(s, "  mongos {u:>5.1} µs/rt");
        }
        if let Some(i) = self.instructions {
            let _ = write!(s, "  instructions/rt {i:.0}");
        }
        if self.unexpected > 0 {
            let _ = write!(s, "  UNEXPECTED REPLIES {}", self.unexpected);
        }
        if let Some((a, f)) = self.rewritten {
            let _ = write!(s, "  rewritten {a}/{f}");
        }
        if let Some((c, rt)) = &self.counts {
            let per = |x: u64| x as f64 / (*rt).max(1) as f64;
            let _ = write!(
                s,
                "  syscalls/rt {:.2}  cs/rt {:.2}+{:.2}",
                per(c.syscalls),
                per(c.voluntary),
                per(c.nonvoluntary)
            );
        }
        if let Some(e) = &self.count_error {
            let _ = write!(s, "  counts failed: {e}");
        }
        s
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.retain(|x| !x.is_nan());
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// The medians of one (connections, target) cell.
#[derive(Debug, Clone, Copy)]
struct Med {
    rps: f64,
    p50: f64,
    p99: f64,
    p999: f64,
    cpu_us: f64,
    load_cpu_us: f64,
    upstream_cpu_us: f64,
    sys: f64,
}

fn med(samples: &[Sample]) -> Med {
    let m = |f: fn(&Sample) -> f64| median(samples.iter().map(f).collect());
    Med {
        rps: m(|s| s.rps),
        p50: m(|s| s.p50),
        p99: m(|s| s.p99),
        p999: m(|s| s.p999),
        cpu_us: m(|s| s.cpu_us.unwrap_or(f64::NAN)),
        load_cpu_us: m(|s| s.load_cpu_us.unwrap_or(f64::NAN)),
        upstream_cpu_us: m(|s| s.upstream_cpu_us.unwrap_or(f64::NAN)),
        sys: m(|s| s.sys.unwrap_or(f64::NAN)),
    }
}

pub struct Summary {
    pub rows: BTreeMap<(usize, String), Vec<Sample>>,
    pub memory: Vec<MemResult>,
    pub micro: Option<Micro>,
    pub notes: Vec<String>,
    judge_conns: usize,
    /// Bytes in each `find` reply (large with `E2E_REPLY_BYTES`).
    reply_len: usize,
}

/// One of issue 13's comparisons with HAProxy: target, what, the measure, its unit, the test.
type Check = (
    &'static str,
    &'static str,
    fn(&Med) -> f64,
    &'static str,
    fn(f64) -> bool,
);

/// From this reply size up, the tables show bytes per second and the targets judge them.
const LARGE_REPLY: usize = 64 * 1024;

const ORDER: [&str; 9] = [
    "direct",
    "floor",
    "floor-percore",
    "floor-uring",
    "haproxy",
    "staleguard",
    "staleguard-governed",
    "staleguard-governed-uring",
    "staleguard-rewrite",
];

/// Per round trip, the median over the rounds of one cell; NaN when not counted.
fn per_rt(samples: &[Sample], f: impl Fn(&Counts) -> u64) -> f64 {
    median(
        samples
            .iter()
            .filter_map(|s| s.counts.as_ref())
            .map(|(c, rt)| f(c) as f64 / (*rt).max(1) as f64)
            .collect(),
    )
}

fn ratio(a: f64, b: f64) -> String {
    if a.is_nan() || b.is_nan() || b == 0.0 {
        "–".into()
    } else {
        format!("{:.2}x", a / b)
    }
}

fn num(x: f64, prec: usize) -> String {
    if x.is_nan() {
        "–".into()
    } else {
        format!("{x:.prec$}")
    }
}

impl Summary {
    pub fn new(judge_conns: usize, reply_len: usize) -> Summary {
        Summary {
            rows: BTreeMap::new(),
            memory: Vec::new(),
            micro: None,
            notes: Vec::new(),
            judge_conns,
            reply_len,
        }
    }

    fn large(&self) -> bool {
        self.reply_len >= LARGE_REPLY
    }

    fn cell(&self, n: usize, target: &str) -> Option<Med> {
        self.rows
            .get(&(n, target.to_string()))
            .filter(|s| !s.is_empty())
            .map(|s| med(s))
    }

    pub fn render(&self) -> String {
        let mut out = String::new();
        if !self.rows.is_empty() {
            self.render_latency(&mut out);
            self.render_vs_haproxy(&mut out);
            self.render_counts(&mut out);
            self.render_instructions(&mut out);
        }
        if !self.memory.is_empty() {
            self.render_memory(&mut out);
        }
        self.render_targets(&mut out);
        for n in &self.notes {
            let _ = writeln!(out, "- {n}");
        }
        out
    }

    fn render_latency(&self, out: &mut String) {
        let rounds = self.rows.values().map(Vec::len).max().unwrap_or(0);
        let _ = writeln!(
            out,
            "## Round trips (medians of {rounds} rounds; ratios to the floor at the same connection count)\n"
        );
        let large = self.large();
        if large {
            let _ = writeln!(
                out,
                "Replies of {} bytes; MiB/s counts reply bytes delivered to the clients.\n",
                self.reply_len
            );
        }
        let _ = writeln!(
            out,
            "| target | conns | req/s |{} p50 µs | p99 µs | p99.9 µs | proxy CPU µs/rt | of it kernel | req/s vs floor | CPU vs floor | p99 vs floor |",
            if large { " reply MiB/s |" } else { "" }
        );
        let _ = writeln!(
            out,
            "|---|---:|---:|{}---:|---:|---:|---:|---:|---:|---:|---:|",
            if large { "---:|" } else { "" }
        );
        let conns: Vec<usize> = {
            let mut c: Vec<usize> = self.rows.keys().map(|(n, _)| *n).collect();
            c.dedup();
            c
        };
        for &n in &conns {
            let floor = self.cell(n, "floor");
            for t in ORDER {
                let Some(m) = self.cell(n, t) else { continue };
                let (r, c, p) = match floor {
                    Some(f) if t != "floor" => (
                        ratio(m.rps, f.rps),
                        ratio(m.cpu_us, f.cpu_us),
                        ratio(m.p99, f.p99),
                    ),
                    _ => ("".into(), "".into(), "".into()),
                };
                let mib = if large {
                    format!(" {} |", num(m.rps * self.reply_len as f64 / 1048576.0, 1))
                } else {
                    String::new()
                };
                let _ = writeln!(
                    out,
                    "| {t} | {n} | {} |{mib} {} | {} | {} | {} | {} | {r} | {c} | {p} |",
                    num(m.rps, 0),
                    num(m.p50, 1),
                    num(m.p99, 1),
                    num(m.p999, 1),
                    num(m.cpu_us, 1),
                    if m.sys.is_nan() {
                        "–".into()
                    } else {
                        format!("{:.0}%", m.sys * 100.0)
                    },
                );
            }
        }
        self.render_added(out);
        let bad: u64 = self.rows.values().flatten().map(|s| s.unexpected).sum();
        if bad > 0 {
            let _ = writeln!(
                out,
                "\n**{bad} replies had an unexpected length** (errors?)"
            );
        }
        let rewritten: Vec<_> = self
            .rows
            .values()
            .flatten()
            .filter_map(|s| s.rewritten)
            .collect();
        if !rewritten.is_empty() {
            let (a, f) = rewritten
                .iter()
                .fold((0, 0), |(a, f), (x, y)| (a + x, f + y));
            let _ = writeln!(
                out,
                "\nRewrite check: {a} of {f} finds on the fallback namespace reached the fake mongos with readConcern level \"available\"{}",
                if a == f && f > 0 { " (all)." } else { ": **NOT ALL REWRITTEN**." }
            );
        }
        out.push('\n');
    }

    /// CPU per round trip against HAProxy's at each connection count: the proxy's own (what
    /// the targets judge) and with the load generator's added (what a harness that counts the
    /// whole machine's CPU sees; the same load generator's cost is added to both sides, so
    /// that ratio is closer to 1). The medians of each column are taken over the rounds
    /// apart. The fake mongos's CPU completes the machine's account: when the three
    /// processes keep every core busy, req/s is the cores used over their summed CPU per
    /// round trip, which is how a proxy's CPU sets its throughput here.
    fn render_vs_haproxy(&self, out: &mut String) {
        let mut rows = String::new();
        let conns: Vec<usize> = {
            let mut c: Vec<usize> = self.rows.keys().map(|(n, _)| *n).collect();
            c.dedup();
            c
        };
        for &n in &conns {
            let Some(h) = self.cell(n, "haproxy") else {
                continue;
            };
            for t in ORDER.iter().filter(|t| **t != "direct") {
                let Some(m) = self.cell(n, t) else { continue };
                let (own, both, rps) = if *t == "haproxy" {
                    (String::new(), String::new(), String::new())
                } else {
                    (
                        ratio(m.cpu_us, h.cpu_us),
                        ratio(m.cpu_us + m.load_cpu_us, h.cpu_us + h.load_cpu_us),
                        ratio(m.rps, h.rps),
                    )
                };
                let all = m.cpu_us + m.load_cpu_us + m.upstream_cpu_us;
                let _ = writeln!(
                    rows,
                    "| {t} | {n} | {} | {} | {} | {} | {} | {} | {own} | {both} | {rps} |",
                    num(m.rps, 0),
                    num(m.cpu_us, 1),
                    num(m.load_cpu_us, 1),
                    num(m.upstream_cpu_us, 1),
                    num(all, 1),
                    num(all * m.rps / 1e6, 2),
                );
            }
        }
        if rows.is_empty() {
            return;
        }
        let _ = writeln!(
            out,
            "## CPU per round trip against HAProxy (µs; proxy: the proxy process, user + system, all threads; load gen: this process; mongos: the fake mongos; cores busy: the three together, CPU seconds per second)\n"
        );
        let _ = writeln!(
            out,
            "| target | conns | req/s | proxy | load gen | mongos | all three | cores busy | proxy vs HAProxy | proxy + load gen vs HAProxy | req/s vs HAProxy |"
        );
        let _ = writeln!(
            out,
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
        );
        out.push_str(&rows);
        out.push('\n');
    }

    /// Latency each proxy adds at one connection: its p50 and p99 minus direct's.
    fn render_added(&self, out: &mut String) {
        let Some(d) = self.cell(1, "direct") else {
            return;
        };
        let _ = writeln!(
            out,
            "\nLatency added at 1 connection (target minus direct, medians of the rounds):\n\n\
             | target | p50 added µs | p99 added µs |\n|---|---:|---:|"
        );
        for t in ORDER.iter().filter(|t| **t != "direct") {
            if let Some(m) = self.cell(1, t) {
                let _ = writeln!(
                    out,
                    "| {t} | {} | {} |",
                    num(m.p50 - d.p50, 1),
                    num(m.p99 - d.p99, 1)
                );
            }
        }
    }

    /// System calls and context switches per round trip, for the cells that were counted.
    fn render_counts(&self, out: &mut String) {
        let counted = |s: &Vec<Sample>| s.iter().any(|s| s.counts.is_some());
        if !self.rows.values().any(counted) {
            return;
        }
        // Only the calls some process made.
        let calls: Vec<&str> = CALLS
            .into_iter()
            .filter(|c| {
                self.rows.values().any(|s| {
                    s.iter()
                        .filter_map(|s| s.counts.as_ref())
                        .any(|(k, _)| k.by_call.get(*c).copied().unwrap_or(0) > 0)
                })
            })
            .collect();
        let _ = writeln!(
            out,
            "## System calls and context switches per round trip (proxy process, medians)\n"
        );
        let mut head = "| target | conns | syscalls |".to_string();
        let mut rule = "|---|---:|---:|".to_string();
        for c in &calls {
            let _ = write!(head, " {c} |");
            rule.push_str("---:|");
        }
        head.push_str(" other | voluntary cs | nonvoluntary cs |");
        rule.push_str("---:|---:|---:|");
        let _ = writeln!(out, "{head}\n{rule}");
        for ((n, t), samples) in ORDER
            .iter()
            .flat_map(|t| {
                let mut ns: Vec<usize> = self.rows.keys().map(|(n, _)| *n).collect();
                ns.dedup();
                ns.into_iter().map(move |n| (n, *t))
            })
            .filter_map(|(n, t)| self.rows.get(&(n, t.to_string())).map(|s| ((n, t), s)))
        {
            if !counted(samples) {
                continue;
            }
            let mut row = format!(
                "| {t} | {n} | {} |",
                num(per_rt(samples, |c| c.syscalls), 2)
            );
            for c in &calls {
                let v = per_rt(samples, |k| k.by_call.get(*c).copied().unwrap_or(0));
                let _ = write!(row, " {} |", num(v, 2));
            }
            let other = per_rt(samples, |k| {
                k.syscalls
                    .saturating_sub(calls.iter().filter_map(|c| k.by_call.get(*c)).sum())
            });
            let _ = write!(
                row,
                " {} | {} | {} |",
                num(other, 2),
                num(per_rt(samples, |c| c.voluntary), 2),
                num(per_rt(samples, |c| c.nonvoluntary), 2)
            );
            let _ = writeln!(out, "{row}");
        }
        out.push('\n');
    }

    /// User-space instructions per round trip (callgrind), for the cells that counted them.
    fn render_instructions(&self, out: &mut String) {
        let mut rows = String::new();
        for ((n, t), samples) in &self.rows {
            let each: Vec<f64> = samples.iter().filter_map(|s| s.instructions).collect();
            if each.is_empty() {
                continue;
            }
            let shown: Vec<String> = each.iter().map(|i| format!("{i:.0}")).collect();
            let _ = writeln!(
                rows,
                "| {t} | {n} | {:.0} | {} |",
                median(each.clone()),
                shown.join(", ")
            );
        }
        if rows.is_empty() {
            return;
        }
        let _ = writeln!(
            out,
            "## User-space instructions per round trip (callgrind)\n\n\
             | target | conns | median | rounds |\n|---|---:|---:|---|\n{rows}"
        );
    }

    fn render_memory(&self, out: &mut String) {
        let _ = writeln!(out, "## Memory (VmRSS)\n");
        let _ = writeln!(
            out,
            "| proxy | idle MiB | with idle pairs MiB | pairs | upstream conns seen | per pair KiB |"
        );
        let _ = writeln!(out, "|---|---:|---:|---:|---:|---:|");
        for m in &self.memory {
            let _ = writeln!(
                out,
                "| {} | {:.1} | {:.1} | {} | {} | {:.1} |",
                m.name,
                m.idle as f64 / 1048576.0,
                m.loaded as f64 / 1048576.0,
                m.pairs,
                m.upstream_conns.map_or("–".into(), |c| c.to_string()),
                m.per_pair_kib()
            );
        }
        out.push('\n');
    }

    fn render_targets(&self, out: &mut String) {
        let _ = writeln!(out, "## Targets (one run)\n");
        let n = self.judge_conns;
        let mut line = |ok: Option<bool>, what: String| verdict(out, ok, &what);
        let sg = self.cell(n, "staleguard");
        let rw = self.cell(n, "staleguard-rewrite");
        let floor = self.cell(n, "floor");
        let ha = self.cell(n, "haproxy");
        let cmp = |a: Option<Med>, b: Option<Med>, f: fn(&Med) -> f64| {
            a.zip(b).map(|(a, b)| (f(&a), f(&b), f(&a) / f(&b)))
        };
        let judge = |r: Option<(f64, f64, f64)>, ok: fn(f64) -> bool| r.map(|(_, _, x)| ok(x));
        let r = cmp(sg, floor, |m| m.rps);
        line(
            judge(r, |x| x >= 0.95),
            format!(
                "staleguard throughput >= 0.95x floor at {n} conns: {}",
                show(r, "req/s")
            ),
        );
        let r = cmp(sg, ha, |m| m.rps);
        line(
            judge(r, |x| x >= 1.0),
            format!(
                "staleguard throughput >= haproxy at {n} conns: {}",
                show(r, "req/s")
            ),
        );
        let r = cmp(sg, floor, |m| m.cpu_us);
        line(
            judge(r, |x| x <= 1.1),
            format!(
                "staleguard CPU per round trip <= 1.1x floor at {n} conns: {}",
                show(r, "µs")
            ),
        );
        let r = cmp(sg, floor, |m| m.p99);
        line(
            judge(r, |x| x <= 1.1),
            format!(
                "staleguard p99 <= 1.1x floor at {n} conns: {}",
                show(r, "µs")
            ),
        );
        let r = cmp(rw, floor, |m| m.rps);
        line(
            judge(r, |x| x >= 0.9),
            format!(
                "rewrite-path throughput >= 0.9x floor at {n} conns: {}",
                show(r, "req/s")
            ),
        );
        match &self.micro {
            Some(m) => {
                line(
                    Some(m.decode_classify_ns <= 200.0),
                    format!(
                        "decode + classify of the 300-byte find <= 200 ns: {:.0} ns",
                        m.decode_classify_ns
                    ),
                );
                line(
                    Some(m.rewrite_ns <= 1000.0),
                    format!(
                        "rewrite to available <= 1 µs: {:.0} ns ({:.0} ns with CRC-32C)",
                        m.rewrite_ns, m.rewrite_crc_ns
                    ),
                );
            }
            None => {
                line(None, "decode + classify <= 200 ns: not measured".into());
                line(None, "rewrite <= 1 µs: not measured".into());
            }
        }
        match self
            .memory
            .iter()
            .find(|m| m.name.starts_with("staleguard"))
        {
            Some(m) => line(
                Some(m.per_pair_kib() <= 32.0),
                format!(
                    "<= 32 KiB per idle connection pair: {:.1} KiB ({} pairs)",
                    m.per_pair_kib(),
                    m.pairs
                ),
            ),
            None => line(
                None,
                "<= 32 KiB per idle connection pair: not measured".into(),
            ),
        }
        out.push('\n');
        self.render_issue13(out);
    }

    /// Issue 13's targets: against HAProxy on the three paths at the judged connection
    /// count, 1 MB replies against the floor, and 16 KiB per idle pair.
    fn render_issue13(&self, out: &mut String) {
        let _ = writeln!(out, "## Targets of issue 13 (one run)\n");
        let n = self.judge_conns;
        let mut line = |ok: Option<bool>, what: String| verdict(out, ok, &what);
        let ha = self.cell(n, "haproxy");
        let vs = |t: &str, f: fn(&Med) -> f64| {
            self.cell(n, t)
                .zip(ha)
                .map(|(a, b)| (f(&a), f(&b), f(&a) / f(&b)))
        };
        if self.large() {
            let mib = |m: &Med| m.rps * self.reply_len as f64 / 1048576.0;
            let r = self
                .cell(n, "staleguard")
                .zip(self.cell(n, "floor"))
                .map(|(a, b)| (mib(&a), mib(&b), mib(&a) / mib(&b)));
            line(
                r.map(|(_, _, x)| x >= 0.95),
                format!(
                    "replies of {} bytes: staleguard >= 0.95x the floor's bytes per second at {n} conns: {}",
                    self.reply_len,
                    show(r, "MiB/s")
                ),
            );
            out.push('\n');
            return;
        }
        let checks: [Check; 5] = [
            (
                "staleguard-governed",
                "governed-read throughput >= 1.1x haproxy",
                |m| m.rps,
                "req/s",
                |x| x >= 1.1,
            ),
            (
                "staleguard-governed",
                "governed-read CPU per round trip <= 0.9x haproxy",
                |m| m.cpu_us,
                "µs",
                |x| x <= 0.9,
            ),
            (
                "staleguard-governed",
                "governed-read p99 <= haproxy",
                |m| m.p99,
                "µs",
                |x| x <= 1.0,
            ),
            (
                "staleguard-rewrite",
                "rewrite-path throughput >= 1.0x haproxy",
                |m| m.rps,
                "req/s",
                |x| x >= 1.0,
            ),
            (
                "staleguard",
                "passthrough throughput >= 1.15x haproxy",
                |m| m.rps,
                "req/s",
                |x| x >= 1.15,
            ),
        ];
        for (target, what, f, unit, ok) in checks {
            let r = vs(target, f);
            line(
                r.map(|(_, _, x)| ok(x)),
                format!("{what} at {n} conns: {}", show(r, unit)),
            );
        }
        match self
            .memory
            .iter()
            .find(|m| m.name.starts_with("staleguard"))
        {
            Some(m) => line(
                Some(m.per_pair_kib() <= 16.0),
                format!(
                    "<= 16 KiB per idle connection pair: {:.1} KiB ({} pairs)",
                    m.per_pair_kib(),
                    m.pairs
                ),
            ),
            None => line(
                None,
                "<= 16 KiB per idle connection pair: not measured".into(),
            ),
        }
        out.push('\n');
    }
}

/// One line of a PASS/MISS list.
fn verdict(out: &mut String, ok: Option<bool>, what: &str) {
    let tag = match ok {
        Some(true) => "PASS",
        Some(false) => "MISS",
        None => "n/a ",
    };
    let _ = writeln!(out, "- {tag} {what}");
}

/// A comparison (ours, theirs, ratio) for a PASS/MISS line.
fn show(r: Option<(f64, f64, f64)>, unit: &str) -> String {
    match r {
        Some((a, b, x)) => format!("{a:.1} vs {b:.1} {unit} = {x:.2}x"),
        None => "not measured".into(),
    }
}

/// nproc, CPU model, kernel and load, for the record.
pub fn machine() -> String {
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, m)| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    format!(
        "machine: {cpus} CPUs, {model}, kernel {}, {}",
        kernel.trim(),
        load_average("at the start")
    )
}

/// The 1/5/15-minute load averages: other work on the machine skews every number.
pub fn load_average(when: &str) -> String {
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    format!(
        "load average {when}: {}",
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    )
}
