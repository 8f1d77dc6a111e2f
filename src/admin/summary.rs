//! The first screen's answers, in `/status` as `summary` and at the top of the page: what is
//! wrong, since when, what staleguard does about it, and what clients got in the last
//! bucket, per `[[namespaces]]` entry. Short sentences; every one true in dry run too (a
//! namespace in dry run says that its reads go out as sent, and what they would get).

use std::time::{Duration, SystemTime};

use serde::Serialize;

use super::history::HistoryView;
use super::ns_rows::NsStatus;
use super::stall_status::WriteStallStatus;
use super::text::rfc3339;

/// What the summary is made from (parts of the status, taken before it is assembled).
pub struct Inputs<'a> {
    pub ready: bool,
    pub reload_failed: bool,
    pub write_stall: &'a WriteStallStatus,
    pub namespaces: &'a [NsStatus],
    /// `[fleet]` and Redis lost: this instance's name, and since when (seconds ago).
    pub fleet_alone: Option<(&'a str, Option<u64>)>,
    /// Upstreams whose last health check failed.
    pub upstreams_down: Vec<&'a str>,
    pub history: &'a HistoryView,
    /// Now, unix ms (the last bucket's age).
    pub now_unix_ms: u64,
}

#[derive(Debug, Serialize)]
pub struct Summary {
    /// `ok` (nothing wrong), `degraded` (something to look at; reads get what they would
    /// without staleguard), `incident` (a write stall, or a breaker open).
    pub state: &'static str,
    /// What is wrong, worst first, a short sentence each; empty when nothing is.
    pub wrong: Vec<String>,
    /// Since when: the earliest start among the stall, the open breakers and Redis lost
    /// (RFC 3339, UTC).
    pub since: Option<String>,
    pub since_seconds_ago: Option<u64>,
    /// What staleguard does about it, a short sentence each.
    pub doing: Vec<String>,
    /// What clients got in the plots' last bucket; none before the first bucket closes.
    pub right_now: Option<RightNow>,
}

/// The plots' last buckets (at least [`RIGHT_NOW`], at least one), per entry.
#[derive(Debug, Serialize)]
pub struct RightNow {
    /// How long the buckets added up span.
    pub seconds: f64,
    /// How long ago the last of them ended.
    pub ended_seconds_ago: u64,
    pub entries: Vec<NowRow>,
}

/// One `[[namespaces]]` entry (an exact namespace, or a pattern's namespaces together) in
/// the last bucket.
#[derive(Debug, Serialize)]
pub struct NowRow {
    pub entry: String,
    pub mode: &'static str,
    pub dry_run: bool,
    /// A breaker of the entry is open now (a pattern: any of its namespaces).
    pub open: bool,
    pub answered: u32,
    pub rewritten: u32,
    pub failed_fast: u32,
    pub primary: u32,
    pub trigger_errors: u32,
}

impl Summary {
    pub fn of(i: &Inputs<'_>) -> Summary {
        let open: Vec<&NsStatus> = i
            .namespaces
            .iter()
            .filter(|n| n.breaker == Some("open"))
            .collect();
        let w = i.write_stall;
        let mut wrong = Vec::new();
        let mut since: Vec<u64> = Vec::new();
        if let Some(place) = &w.place {
            let on = if w
                .signals
                .iter()
                .any(|s| s.state == "raised" && s.signal == "composite" && &s.place == place)
            {
                "on"
            } else {
                "through"
            };
            wrong.push(format!("Writes are not completing {on} {place}."));
            since.extend(w.since_seconds_ago);
        }
        for n in &open {
            // The reason's first clause: `write stall suspected`, `3 trigger errors within
            // 10s (last: 13388 StaleConfig)`, `opened by fleet instance sg-2`.
            let why = if n.held_by_write_stall {
                "held open while writes are not completing"
            } else {
                n.reason.as_deref().map_or("-", first_clause)
            };
            wrong.push(format!(
                "The breaker of {} ({}) is open: {why}.",
                n.namespace, n.mode
            ));
            since.extend(n.last_transition_seconds_ago);
        }
        if !i.ready {
            wrong.push("No upstream answered its last health check: not ready.".into());
        } else {
            for u in &i.upstreams_down {
                wrong.push(format!(
                    "Upstream {u} did not answer its last health check."
                ));
            }
        }
        if let Some((name, ago)) = i.fleet_alone {
            wrong.push(format!(
                "Redis does not answer: this instance ({name}) acts alone."
            ));
            since.extend(ago);
        }
        if i.reload_failed {
            wrong.push("The last config reload failed: the previous config is in force.".into());
        }
        let state = if w.place.is_some() || !open.is_empty() {
            "incident"
        } else if wrong.is_empty() {
            "ok"
        } else {
            "degraded"
        };
        let ago = since.into_iter().max();
        Summary {
            state,
            wrong,
            since: ago.map(|s| {
                let ms = i.now_unix_ms.saturating_sub(s * 1000);
                rfc3339(SystemTime::UNIX_EPOCH + Duration::from_millis(ms))
            }),
            since_seconds_ago: ago,
            doing: doing(i, &open),
            right_now: right_now(i),
        }
    }
}

/// What staleguard does now, a short sentence each.
fn doing(i: &Inputs<'_>, open: &[&NsStatus]) -> Vec<String> {
    let mut out = Vec::new();
    for n in open {
        out.push(format!("{}: its reads {}.", n.namespace, n.reads_now));
    }
    let w = i.write_stall;
    if w.place.is_some() && w.action == "observe" {
        out.push("It only observes the write stall (on_write_stall = \"observe\").".into());
    }
    if w.place.is_some() && w.action == "open_fallback_breakers" && w.held_breakers.is_empty() {
        out.push("It holds each fallback namespace's breaker open as its reads arrive.".into());
    }
    if i.fleet_alone.is_some() {
        out.push(
            "It decides alone until Redis answers: its own breakers, its local guard, every probe."
                .into(),
        );
    }
    if out.is_empty() {
        let governed = i
            .namespaces
            .iter()
            .filter(|n| n.mode != "passthrough")
            .count();
        out.push(if governed == 0 {
            "It relays every read as sent: no [[namespaces]] entry governs any.".to_string()
        } else {
            "Every breaker is closed: governed reads go out as sent; a failed fallback read is retried with readConcern available.".to_string()
        });
    }
    out
}

/// How much of the recent past "right now" adds up: a bucket of 10 s is too noisy alone.
pub const RIGHT_NOW: f64 = 30.0;

/// The plots' last fine buckets spanning [`RIGHT_NOW`], per entry with something in the
/// window.
fn right_now(i: &Inputs<'_>) -> Option<RightNow> {
    let h = &i.history.fine;
    let end = *h.bucket_ends_unix_ms.last()?;
    let k = ((RIGHT_NOW / h.bucket_seconds.max(0.001)).ceil() as usize)
        .clamp(1, h.bucket_ends_unix_ms.len());
    let last = |v: &[u32]| v.iter().rev().take(k).sum::<u32>();
    let entries = h
        .entries
        .iter()
        .map(|e| {
            let row = i.namespaces.iter().find(|n| n.namespace == e.entry);
            let open = i.namespaces.iter().any(|n| {
                n.breaker == Some("open")
                    && (n.namespace == e.entry || n.pattern.as_deref() == Some(e.entry.as_str()))
            });
            NowRow {
                entry: e.entry.clone(),
                mode: row.map_or("unlisted", |r| r.mode),
                dry_run: row.is_some_and(|r| r.dry_run),
                open,
                answered: last(&e.answered),
                rewritten: last(&e.rewritten),
                failed_fast: last(&e.failed_fast),
                primary: last(&e.primary),
                trigger_errors: last(&e.trigger_errors),
            }
        })
        .collect();
    Some(RightNow {
        seconds: h.bucket_seconds * k as f64,
        ended_seconds_ago: i.now_unix_ms.saturating_sub(end) / 1000,
        entries,
    })
}

/// A reason's first clause: up to its first `: ` or ` (`, whichever comes first.
fn first_clause(reason: &str) -> &str {
    let end = [reason.find(": "), reason.find(" (")]
        .into_iter()
        .flatten()
        .min()
        .unwrap_or(reason.len());
    &reason[..end]
}

#[cfg(test)]
mod tests {
    use super::first_clause;

    #[test]
    fn reasons_are_cut_at_their_first_clause() {
        assert_eq!(
            first_clause("3 trigger errors within 10s (last: 13388 StaleConfig)"),
            "3 trigger errors within 10s"
        );
        assert_eq!(
            first_clause("write stall suspected: writes are not completing through x (probe)"),
            "write stall suspected"
        );
        assert_eq!(first_clause("plain"), "plain");
    }
}
