//! The invariants, judged on what was seen from outside: the honest readers' outcomes on
//! both paths, the simulated cluster's read log, and staleguard's `/metrics`.
//!
//! - **(a)** on the healthy cluster no breaker opens, and every honest read through
//!   staleguard ends as the same kind of read straight to mongos ends (or with mongos's own
//!   error for it, relayed: one attempt, as its client sent it), reaches mongos with the read
//!   concern and read preference its client sent, and is answered by the same member class
//!   (primary or secondary);
//! - **(b)** during each incident no breaker closes, and the paced strict reads (`strict`,
//!   `strict_b`, `pinned`, `py_strict`: each with its own 1 s budget) that ended while it
//!   lasted are answered through staleguard at least as often as straight to mongos (within
//!   two standard errors of the difference, at least 3 points: both are samples of a few
//!   dozen reads). Reads still waiting at the heal are left out on both paths: a read
//!   straight to mongos that waits out its budget is sometimes answered once the primary
//!   resumes, where staleguard has failed it fast;
//! - **(c)** after each heal every breaker is closed within 5 s, and stays closed until the
//!   next incident or the end.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use staleguard::sim::ReadRecord;

use super::honest::{Kind, Outcome, Read, Via};
use super::plan::Incident;
use super::watch::Scrape;

/// When things happened, since the run started.
#[derive(Debug, Clone)]
pub struct Timeline {
    pub warm_end: Duration,
    pub healthy_end: Duration,
    pub phases: Vec<Phase>,
}

#[derive(Debug, Clone)]
pub struct Phase {
    pub incident: Incident,
    pub start: Duration,
    pub heal: Duration,
    /// The next incident's start, or the run's end.
    pub end: Duration,
}

/// One invariant on one window.
#[derive(Debug, Clone)]
pub struct Check {
    pub invariant: char,
    pub window: String,
    pub what: String,
    pub ok: bool,
    pub detail: String,
}

pub struct Seen<'a> {
    pub reads: &'a [Read],
    pub log: &'a [ReadRecord],
    pub scrapes: &'a [Scrape],
}

/// The recovery bound of (c).
pub const RECOVERY: Duration = Duration::from_secs(5);

impl Seen<'_> {
    /// The last scrape at or before `t` (the first one when none is).
    fn scrape_at(&self, t: Duration) -> Option<&Scrape> {
        self.scrapes
            .iter()
            .take_while(|s| s.at <= t)
            .last()
            .or(self.scrapes.first())
    }

    /// Transitions into `to` by namespace between `from` and `until`.
    fn moved(&self, to: &str, from: Duration, until: Duration) -> BTreeMap<String, u64> {
        let before = if from.is_zero() {
            BTreeMap::new()
        } else {
            self.scrape_at(from).map(|s| s.into(to)).unwrap_or_default()
        };
        let after = self
            .scrape_at(until)
            .map(|s| s.into(to))
            .unwrap_or_default();
        after
            .into_iter()
            .filter_map(|(ns, n)| {
                let d = n.saturating_sub(before.get(&ns).copied().unwrap_or(0));
                (d > 0).then_some((ns, d))
            })
            .collect()
    }

    fn reads_in(&self, kind: Kind, via: Via, from: Duration, to: Duration) -> Vec<&Read> {
        self.reads
            .iter()
            .filter(|r| r.kind == kind && r.via == via && r.sent >= from && r.done() < to)
            .collect()
    }

    fn records(&self) -> BTreeMap<&str, Vec<&ReadRecord>> {
        let mut out: BTreeMap<&str, Vec<&ReadRecord>> = BTreeMap::new();
        for r in self.log {
            out.entry(r.comment.as_str()).or_default().push(r);
        }
        out
    }
}

fn class(r: &ReadRecord) -> &'static str {
    match (
        r.members.iter().any(|m| m.primary),
        r.members.iter().any(|m| !m.primary),
    ) {
        (true, true) => "primary+secondary",
        (true, false) => "primary",
        _ => "secondary",
    }
}

fn list(m: &BTreeMap<String, u64>) -> String {
    m.iter()
        .map(|(ns, n)| format!("{ns} x{n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// (a) on the healthy window (and the warmup, for breakers).
pub fn healthy(seen: &Seen<'_>, t: &Timeline, kinds: &[Kind]) -> Vec<Check> {
    let window = "healthy".to_string();
    let opened = seen.moved("open", Duration::ZERO, t.healthy_end);
    let mut out = vec![Check {
        invariant: 'a',
        window: window.clone(),
        what: "no breaker opens".into(),
        ok: opened.is_empty(),
        detail: if opened.is_empty() {
            String::new()
        } else {
            format!("opened: {}", list(&opened))
        },
    }];
    let records = seen.records();
    for &kind in kinds {
        let direct = seen.reads_in(kind, Via::Direct, t.warm_end, t.healthy_end);
        let guarded = seen.reads_in(kind, Via::Staleguard, t.warm_end, t.healthy_end);
        let expected: BTreeSet<&Outcome> = direct.iter().map(|r| &r.outcome).collect();
        let classes: BTreeSet<&str> = direct
            .iter()
            .flat_map(|r| records.get(r.comment.as_str()).into_iter().flatten())
            .filter(|rec| rec.code.is_none())
            .map(|rec| class(rec))
            .collect();
        let mut outcome_misses: BTreeMap<String, usize> = BTreeMap::new();
        let (mut relaxed, mut climbed, mut moved) = (0, 0, 0);
        let own_limit = kind.max_time().map(|t| t.as_millis() as f64);
        for r in &guarded {
            let recs = records
                .get(r.comment.as_str())
                .map_or(&[][..], Vec::as_slice);
            // mongos's own error for the read as its client sent it (a time limit on a
            // loaded machine) is relayed, not made by staleguard: one attempt, with the
            // client's own limit, read preference and read concern.
            let relayed = match (r.outcome.clone(), recs) {
                (Outcome::Code(c), [rec]) => {
                    rec.code == Some(c)
                        && rec.max_time_ms == own_limit
                        && rec.mode == kind.mode()
                        && rec.read_concern.is_none()
                }
                _ => false,
            };
            if !expected.contains(&r.outcome) && !relayed {
                *outcome_misses.entry(r.outcome.to_string()).or_default() += 1;
            }
            for rec in recs {
                if rec.read_concern.is_some() {
                    relaxed += 1;
                }
                if rec.mode != kind.mode() {
                    climbed += 1;
                }
                if rec.code.is_none() && !classes.contains(class(rec)) {
                    moved += 1;
                }
            }
        }
        let shown: Vec<String> = expected.iter().map(ToString::to_string).collect();
        let compared = !direct.is_empty() && !guarded.is_empty();
        let misses: usize = outcome_misses.values().sum();
        out.push(Check {
            invariant: 'a',
            window: window.clone(),
            what: format!("{} reads end as straight to mongos", kind.name()),
            ok: compared && misses == 0,
            detail: if !compared {
                format!("nothing to compare ({} direct, {} through staleguard)", direct.len(), guarded.len())
            } else if misses > 0 {
                format!(
                    "{misses} of {} through staleguard ended {outcome_misses:?} where {} straight to mongos ended {{{}}}",
                    guarded.len(),
                    direct.len(),
                    shown.join(", ")
                )
            } else {
                String::new()
            },
        });
        out.push(Check {
            invariant: 'a',
            window: window.clone(),
            what: format!(
                "{} reads keep their read concern, read preference and member class",
                kind.name()
            ),
            ok: relaxed + climbed + moved == 0,
            detail: if relaxed + climbed + moved == 0 {
                String::new()
            } else {
                format!(
                    "of {} reads through staleguard: {relaxed} attempts reached mongos with another read concern, {climbed} with another read preference, {moved} were answered by another member class than {classes:?}",
                    guarded.len()
                )
            },
        });
    }
    out
}

/// Answered share of `reads`.
fn share(reads: &[&Read]) -> f64 {
    if reads.is_empty() {
        return 0.0;
    }
    reads.iter().filter(|r| r.outcome == Outcome::Ok).count() as f64 / reads.len() as f64
}

/// (b) on one incident.
pub fn incident(seen: &Seen<'_>, p: &Phase, kinds: &[Kind]) -> Vec<Check> {
    let window = format!("{:?} incident", p.incident).to_lowercase();
    let opened = seen.moved("open", p.start, p.heal);
    let closed = seen.moved("closed", p.start, p.heal);
    let mut out = vec![Check {
        invariant: 'b',
        window: window.clone(),
        what: "no breaker closes while it lasts".into(),
        ok: closed.is_empty(),
        detail: format!("opened: [{}]; closed: [{}]", list(&opened), list(&closed)),
    }];
    for &kind in kinds.iter().filter(|k| k.strict_paced()) {
        let direct = seen.reads_in(kind, Via::Direct, p.start, p.heal);
        let guarded = seen.reads_in(kind, Via::Staleguard, p.start, p.heal);
        let (d, g) = (share(&direct), share(&guarded));
        let n = (direct.len() + guarded.len()) as f64;
        let pooled = if n > 0.0 {
            (d * direct.len() as f64 + g * guarded.len() as f64) / n
        } else {
            0.0
        };
        let se = (pooled
            * (1.0 - pooled)
            * (1.0 / direct.len().max(1) as f64 + 1.0 / guarded.len().max(1) as f64))
            .sqrt();
        let tolerance = (2.0 * se).max(0.03);
        out.push(Check {
            invariant: 'b',
            window: window.clone(),
            what: format!(
                "{} reads answered at least as often as straight",
                kind.name()
            ),
            ok: !direct.is_empty() && !guarded.is_empty() && g + tolerance >= d,
            detail: format!(
                "{:.1} % of {} through staleguard, {:.1} % of {} straight (tolerance {:.1} points)",
                g * 100.0,
                guarded.len(),
                d * 100.0,
                direct.len(),
                tolerance * 100.0
            ),
        });
    }
    out
}

/// When every breaker was closed for good after `p`'s heal, since the heal.
pub fn recovery(seen: &Seen<'_>, p: &Phase) -> Option<Duration> {
    let after: Vec<&Scrape> = seen
        .scrapes
        .iter()
        .filter(|s| s.at >= p.heal && s.at < p.end)
        .collect();
    let last_open = after.iter().rposition(|s| !s.open().is_empty());
    match last_open {
        None => after.first().map(|_| Duration::ZERO),
        Some(i) => after.get(i + 1).map(|s| s.at - p.heal),
    }
}

/// (c) after one heal.
pub fn heal(seen: &Seen<'_>, p: &Phase) -> Check {
    let window = format!("after the {:?} incident", p.incident).to_lowercase();
    let rec = recovery(seen, p);
    let still: Vec<String> = seen
        .scrapes
        .iter()
        .rev()
        .find(|s| s.at < p.end)
        .map(|s| s.open().into_iter().map(str::to_string).collect())
        .unwrap_or_default();
    Check {
        invariant: 'c',
        window,
        what: format!(
            "every breaker closed within {} s, and stays closed",
            RECOVERY.as_secs()
        ),
        ok: rec.is_some_and(|r| r <= RECOVERY),
        detail: match rec {
            Some(r) => format!("all closed {:.1} s after the heal", r.as_secs_f64()),
            None => format!(
                "still open {:.0} s after the heal: {}",
                (p.end - p.heal).as_secs_f64(),
                still.join(", ")
            ),
        },
    }
}

/// Every check of a run.
pub fn all(seen: &Seen<'_>, t: &Timeline, kinds: &[Kind]) -> Vec<Check> {
    let mut out = healthy(seen, t, kinds);
    for p in &t.phases {
        out.extend(incident(seen, p, kinds));
        out.push(heal(seen, p));
    }
    out
}
