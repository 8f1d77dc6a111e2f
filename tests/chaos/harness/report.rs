//! What a run prints: the seed and how to run it again, the figures of each window (per
//! honest kind, straight to mongos and through staleguard), the breakers' transitions with
//! staleguard's reasons, what the attackers met, and the verdict of every invariant.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use staleguard::sim::ReadRecord;
use tokio::time::Instant;

use super::bed::Lags;
use super::honest::{Kind, Outcome, Read, Via};
use super::judge::{Check, Timeline};
use super::plan::{Behaviour, Plan};
use super::watch::Event;

pub struct Report {
    pub plan: Plan,
    pub timeline: Timeline,
    pub reads: Vec<Read>,
    pub kinds: Vec<Kind>,
    pub checks: Vec<Check>,
    pub events: Vec<Event>,
    pub t0_unix_ms: u64,
    pub t0: Instant,
    /// The simulated cluster's read log (the honest reads' attempts).
    pub log: Vec<ReadRecord>,
    pub tally: BTreeMap<(Behaviour, String), u64>,
    pub lags: Lags,
}

pub fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The seed, and the command that runs it again.
pub fn seed_line(plan: &Plan) -> String {
    let names: Vec<&str> = plan.opts.behaviours.iter().map(|b| b.name()).collect();
    let behaviours = if plan.opts.behaviours.len() == Behaviour::ALL.len() {
        "all".to_string()
    } else if names.is_empty() {
        "none".to_string()
    } else {
        names.join(",")
    };
    let command = match plan.opts.long {
        true => "cargo bench --bench chaos",
        false => "cargo test --test chaos -- --nocapture",
    };
    format!(
        "chaos seed {seed}: to run it again, CHAOS_SEED={seed} CHAOS_BEHAVIOURS={behaviours} {command}",
        seed = plan.opts.seed
    )
}

/// Figures of one kind and path over reads sent in `[from, to)`.
pub struct Figures {
    pub reads: usize,
    pub answered: usize,
    pub p50: Duration,
    pub max: Duration,
    pub outcomes: BTreeMap<String, usize>,
}

impl Figures {
    pub fn of(reads: &[Read], kind: Kind, via: Via, from: Duration, to: Duration) -> Figures {
        let picked: Vec<&Read> = reads
            .iter()
            .filter(|r| r.kind == kind && r.via == via && r.sent >= from && r.sent < to)
            .collect();
        let mut took: Vec<Duration> = picked.iter().map(|r| r.took).collect();
        took.sort();
        let mut outcomes = BTreeMap::new();
        for r in picked.iter().filter(|r| r.outcome != Outcome::Ok) {
            *outcomes.entry(r.outcome.to_string()).or_default() += 1;
        }
        Figures {
            reads: picked.len(),
            answered: picked.iter().filter(|r| r.outcome == Outcome::Ok).count(),
            p50: took.get(took.len() / 2).copied().unwrap_or_default(),
            max: took.last().copied().unwrap_or_default(),
            outcomes,
        }
    }

    pub fn share(&self) -> f64 {
        if self.reads == 0 {
            0.0
        } else {
            self.answered as f64 / self.reads as f64
        }
    }
}

impl Report {
    /// The windows figures are given for: healthy, then each incident and its aftermath.
    pub fn windows(&self) -> Vec<(String, Duration, Duration)> {
        let t = &self.timeline;
        let mut w = vec![("healthy".to_string(), t.warm_end, t.healthy_end)];
        for p in &t.phases {
            let name = format!("{:?}", p.incident).to_lowercase();
            w.push((format!("{name} incident"), p.start, p.heal));
            w.push((format!("after {name}"), p.heal, p.end));
        }
        w
    }

    pub fn failures(&self) -> Vec<&Check> {
        self.checks.iter().filter(|c| !c.ok).collect()
    }

    /// How late the bed's runtimes ran in `[from, to)` (since the run started), or nothing
    /// when neither ran more than 20 ms late.
    pub fn lag(&self, from: Duration, to: Duration) -> String {
        let lags = self.lags.max_in(self.t0 + from, self.t0 + to);
        let shown: Vec<String> = lags
            .iter()
            .map(|(which, late)| format!("{which} {} ms", late.as_millis()))
            .collect();
        match shown.is_empty() {
            true => String::new(),
            false => format!("ticks up to {} late", shown.join(", ")),
        }
    }

    /// Every failed check, each with how late the bed ran in its window.
    pub fn failure_lines(&self) -> Vec<String> {
        self.failures()
            .iter()
            .map(|c| self.failure_line(c))
            .collect()
    }

    /// A failed check, with how late the bed ran in its window when it did.
    pub fn failure_line(&self, c: &Check) -> String {
        let window = self
            .windows()
            .into_iter()
            .find(|(name, _, _)| {
                *name == c.window
                    || name
                        .strip_prefix("after ")
                        .is_some_and(|n| c.window == format!("after the {n} incident"))
            })
            .map(|(_, from, to)| self.lag(from, to))
            .unwrap_or_default();
        let lag = match window.is_empty() {
            true => String::new(),
            false => format!(" [the machine starved the bed in this window: {window}]"),
        };
        format!(
            "({}) {}: {}: {}{lag}",
            c.invariant, c.window, c.what, c.detail
        )
    }

    /// Every honest read and every attempt the read log holds, as tab-separated lines
    /// (`CHAOS_DUMP=<file>`), for looking at one read closely.
    pub fn dump(&self) -> String {
        let mut out = String::from("# read\tcomment\tkind\tvia\tsent_ms\ttook_ms\toutcome\n");
        for r in &self.reads {
            let _ = writeln!(
                out,
                "read\t{}\t{}\t{:?}\t{}\t{}\t{}",
                r.comment,
                r.kind.name(),
                r.via,
                r.sent.as_millis(),
                r.took.as_millis(),
                r.outcome
            );
        }
        out.push_str("# attempt\tcomment\tcommand\tns\tread_concern\tmode\tmax_time_ms\tmembers\tcode\tstarted_ms\tfinished_ms\n");
        for a in &self.log {
            let members: Vec<String> = a
                .members
                .iter()
                .map(|m| format!("{}{}", m.node, if m.primary { "(p)" } else { "" }))
                .collect();
            let _ = writeln!(
                out,
                "attempt\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}",
                a.comment,
                a.command,
                a.ns,
                a.read_concern.as_deref().unwrap_or("-"),
                a.mode,
                a.max_time_ms.map_or("-".to_string(), |m| m.to_string()),
                members.join(","),
                a.code.map_or("ok".to_string(), |c| c.to_string()),
                a.started.saturating_duration_since(self.t0).as_millis(),
                a.finished.saturating_duration_since(self.t0).as_millis()
            );
        }
        out
    }

    pub fn print(&self) {
        if let Ok(path) = std::env::var("CHAOS_DUMP") {
            match std::fs::write(&path, self.dump()) {
                Ok(()) => println!("chaos: reads and attempts written to {path}"),
                Err(e) => println!("chaos: CHAOS_DUMP={path}: {e}"),
            }
        }
        println!("{}", seed_line(&self.plan));
        println!("plan: {}", self.plan.describe());
        for (name, from, to) in self.windows() {
            let lag = self.lag(from, to);
            println!(
                "\n{name} ({:.1}-{:.1} s{}{lag})\n  {:<15} {:<10} {:>5} {:>9} {:>8} {:>8}  not answered",
                from.as_secs_f64(),
                to.as_secs_f64(),
                if lag.is_empty() { "" } else { "; the bed's " },
                "kind",
                "via",
                "reads",
                "answered",
                "p50 ms",
                "max ms"
            );
            for &kind in &self.kinds {
                for via in [Via::Direct, Via::Staleguard] {
                    let f = Figures::of(&self.reads, kind, via, from, to);
                    println!(
                        "  {:<15} {:<10} {:>5} {:>8.1}% {:>8.0} {:>8.0}  {:?}",
                        kind.name(),
                        format!("{via:?}").to_lowercase(),
                        f.reads,
                        f.share() * 100.0,
                        f.p50.as_secs_f64() * 1000.0,
                        f.max.as_secs_f64() * 1000.0,
                        f.outcomes
                    );
                }
            }
        }
        println!("\nbreaker transitions (staleguard's /status events; the last 256 events):");
        for e in &self.events {
            let at = e.at_unix_ms.saturating_sub(self.t0_unix_ms) as f64 / 1000.0;
            println!(
                "  {at:>6.1} s  {:<15} {:<22} {}",
                e.kind, e.namespace, e.reason
            );
        }
        println!("\nwhat the attackers met:");
        let mut by: BTreeMap<Behaviour, Vec<String>> = BTreeMap::new();
        for ((b, what), n) in &self.tally {
            by.entry(*b).or_default().push(format!("{what} x{n}"));
        }
        for (b, items) in by {
            println!("  {:<17} {}", b.name(), items.join(", "));
        }
        println!("\ninvariants:");
        for c in &self.checks {
            println!(
                "  {} ({}) {:<24} {}{}",
                if c.ok { "PASS" } else { "FAIL" },
                c.invariant,
                c.window,
                c.what,
                if c.detail.is_empty() {
                    String::new()
                } else {
                    format!(": {}", c.detail)
                }
            );
        }
        let failed = self.failures();
        println!(
            "\n{} of {} checks failed; {}",
            failed.len(),
            self.checks.len(),
            seed_line(&self.plan)
        );
    }
}
