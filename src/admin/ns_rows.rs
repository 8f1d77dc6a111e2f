//! One row per configured pattern and per namespace with a breaker, as `/status` and the
//! page show them: the breaker, what happens to its reads right now (in dry run, what
//! would), its counts and its ladder.

use std::time::SystemTime;

use serde::Serialize;
use tokio::time::Instant;

use super::text::rfc3339;
use crate::breaker::State;
use crate::handles::AdminHandles;
use crate::policy::{Mode, NsPolicy};

#[derive(Debug, Serialize)]
pub struct NsStatus {
    /// A configured pattern, or an exact namespace that has a breaker.
    pub namespace: String,
    /// `pattern` (a configured entry without a breaker of its own) or `namespace`.
    pub kind: &'static str,
    /// The governing pattern; none when no pattern governs it any more.
    pub pattern: Option<String>,
    /// `fallback`, `strict`, `passthrough`, or `unlisted`.
    pub mode: &'static str,
    /// `dry_run` is on (in the JSON: `dry_run.enabled`).
    #[serde(skip)]
    pub dry_run: bool,
    /// In the JSON as `dry_run`: on or off, and what it would have done.
    #[serde(rename = "dry_run")]
    pub dry_run_status: super::dry_run::DryRunStatus,
    /// `closed`, `open`; none for a wildcard pattern (breakers are per exact
    /// namespace: the ones it governs are listed on their own).
    pub breaker: Option<&'static str>,
    /// What the proxy does with eligible reads right now.
    pub action: String,
    /// The same in a few words, for the first screen: what its reads get now (in dry run:
    /// that they go out as sent, and what they would get).
    pub reads_now: String,
    pub errors_in_window: Option<usize>,
    pub threshold: Option<u32>,
    pub trigger_errors_total: Option<u64>,
    /// Reads rewritten to `available` since start (retries and preemptive rewrites).
    pub rewritten_total: Option<u64>,
    /// Reads answered with the fail-fast error since start.
    pub failed_fast_total: Option<u64>,
    pub last_transition: Option<String>,
    pub last_transition_seconds_ago: Option<u64>,
    /// Why the last transition happened.
    pub reason: Option<String>,
    /// While open: seconds until the next probe (none while held by the write-stall watch,
    /// or when every read is a sample: strict, `on_open = "bound"`).
    pub next_probe_seconds: Option<u64>,
    /// While open: samples answered in a row (it closes at `close_after`, from two
    /// connections, spanning `min_cooldown`).
    pub answered_in_a_row: Option<u32>,
    /// Held open by the write-stall watch (`on_write_stall = "open_fallback_breakers"`).
    pub held_by_write_stall: bool,
    /// The rungs a failing read climbs (`ladder`): `["primary"]`, `["available"]`, ...
    pub ladder: Vec<&'static str>,
    /// Reads sent to a rung after the first attempt failed or while the breaker was open,
    /// by what came of them (none for a wildcard pattern: counted per namespace).
    pub ladder_reads: Option<LadderReads>,
    /// Documents seen twice in one `available` reply batch (a lower bound of the orphans
    /// served); none for a wildcard pattern.
    pub orphans_estimated_total: Option<u64>,
}

#[derive(Debug, Serialize, Default)]
pub struct LadderReads {
    pub primary_answered: u64,
    pub primary_failed: u64,
    /// Refused by the upstream's `[ladder_guard]`.
    pub primary_denied: u64,
    pub available_answered: u64,
    pub available_failed: u64,
    /// A rung was due but the read's time budget was spent.
    pub no_time: u64,
}

impl LadderReads {
    fn of(metrics: &crate::metrics::Metrics, ns: &str) -> LadderReads {
        let n = |rung, result| metrics.ladder.attempts_of(ns, rung, result);
        LadderReads {
            primary_answered: n("primary", "answered"),
            primary_failed: n("primary", "failed"),
            primary_denied: n("primary", "denied"),
            available_answered: n("available", "answered"),
            available_failed: n("available", "failed"),
            no_time: n("primary", "no_time") + n("available", "no_time"),
        }
    }
}

pub(super) fn namespaces(
    shared: &AdminHandles,
    table: &crate::policy::PolicyTable,
) -> Vec<NsStatus> {
    let now = Instant::now();
    let wall = SystemTime::now();
    let mut rows: Vec<NsStatus> = Vec::new();
    for snap in shared.breakers.snapshot() {
        let policy = snap
            .ns
            .split_once('.')
            .and_then(|(db, coll)| table.lookup(db, coll));
        let ago = now.saturating_duration_since(snap.since);
        let totals = shared.metrics.ns_totals(&snap.ns);
        let next_probe = snap
            .next_probe()
            .map(|at| at.saturating_duration_since(now));
        rows.push(NsStatus {
            namespace: snap.ns.clone(),
            kind: "namespace",
            pattern: policy.map(|p| p.pattern.clone()),
            mode: policy.map_or("unlisted", |p| p.mode.as_str()),
            dry_run: policy.is_some_and(|p| p.dry_run),
            dry_run_status: super::dry_run::DryRunStatus::of(
                &shared.metrics,
                &snap.ns,
                policy.is_some_and(|p| p.dry_run),
                true,
            ),
            breaker: Some(snap.state.as_str()),
            reads_now: reads_now(policy.map(|p| &**p), snap.state, snap.reason.reply_code().1),
            action: {
                let what = action(policy.map(|p| &**p), snap.state, snap.reason.reply_code().1);
                if snap.held {
                    format!("{what}; held open while writes are not completing (write-stall watch), then it probes at its next read")
                } else {
                    what
                }
            },
            errors_in_window: Some(snap.errors_in_window),
            threshold: policy.map(|p| p.threshold),
            trigger_errors_total: Some(shared.metrics.trigger_errors_total(&snap.ns)),
            rewritten_total: Some(totals[1]),
            failed_fast_total: Some(totals[2]),
            last_transition: Some(rfc3339(wall - ago)),
            last_transition_seconds_ago: Some(ago.as_secs()),
            reason: Some(snap.last_reason.clone()),
            next_probe_seconds: next_probe.map(|d| d.as_secs() + u64::from(d.subsec_nanos() > 0)),
            answered_in_a_row: (snap.state == State::Open).then_some(snap.streak),
            held_by_write_stall: snap.held,
            ladder: policy.map_or_else(Vec::new, |p| p.ladder().to_vec()),
            ladder_reads: Some(LadderReads::of(&shared.metrics, &snap.ns)),
            orphans_estimated_total: Some(shared.metrics.ladder.orphans_of(&snap.ns)),
        });
    }
    for p in table.entries() {
        if rows.iter().any(|r| r.namespace == p.pattern) {
            continue;
        }
        let exact = !p.pattern.ends_with('*');
        let totals = exact.then(|| shared.metrics.ns_totals(&p.pattern));
        rows.push(NsStatus {
            namespace: p.pattern.clone(),
            kind: "pattern",
            pattern: Some(p.pattern.clone()),
            mode: p.mode.as_str(),
            dry_run: p.dry_run,
            dry_run_status: super::dry_run::DryRunStatus::of(
                &shared.metrics,
                &p.pattern,
                p.dry_run,
                exact,
            ),
            breaker: exact.then_some(State::Closed.as_str()),
            action: action(Some(p), State::Closed, ""),
            reads_now: reads_now(Some(p), State::Closed, ""),
            errors_in_window: exact.then_some(0),
            threshold: Some(p.threshold),
            trigger_errors_total: exact.then(|| shared.metrics.trigger_errors_total(&p.pattern)),
            rewritten_total: totals.map(|t| t[1]),
            failed_fast_total: totals.map(|t| t[2]),
            last_transition: None,
            last_transition_seconds_ago: None,
            reason: None,
            next_probe_seconds: None,
            answered_in_a_row: None,
            held_by_write_stall: false,
            ladder: p.ladder().to_vec(),
            ladder_reads: exact.then(|| LadderReads::of(&shared.metrics, &p.pattern)),
            orphans_estimated_total: exact.then(|| shared.metrics.ladder.orphans_of(&p.pattern)),
        });
    }
    rows.sort_by(|a, b| {
        rank(a.breaker)
            .cmp(&rank(b.breaker))
            .then_with(|| a.namespace.cmp(&b.namespace))
    });
    rows
}

fn rank(breaker: Option<&str>) -> u8 {
    match breaker {
        Some("open") => 0,
        Some(_) => 2,
        None => 3,
    }
}

/// What happens to eligible reads, in words.
fn action(policy: Option<&NsPolicy>, state: State, code_name: &str) -> String {
    let Some(p) = policy else {
        return "forwarded untouched (no longer governed by a pattern)".into();
    };
    let what = match (p.mode, state, p.primary_rung) {
        (Mode::Passthrough, _, _) => "forwarded untouched".to_string(),
        (Mode::Fallback, State::Closed, false) => {
            "forwarded; a trigger error is retried with readConcern available".into()
        }
        (Mode::Fallback, State::Closed, true) => {
            "forwarded; a trigger error is retried on the primary, then with readConcern available".into()
        }
        (Mode::Fallback, State::Open, false) => {
            "rewritten to readConcern available before sending".into()
        }
        (Mode::Fallback, State::Open, true) => {
            "sent to the primary; if it fails (or the ladder guard is full), rewritten to readConcern available".into()
        }
        (Mode::Strict, State::Closed, false) => "forwarded; trigger errors are counted".into(),
        (Mode::Strict, State::Closed, true) => {
            "forwarded; a trigger error is retried on the primary".into()
        }
        (Mode::Strict, State::Open, false) if p.on_open == crate::policy::OnOpen::Bound => format!(
            "sent with maxTimeMS at most {} ms: healthy secondaries answer, the others fail fast with {code_name}",
            p.open_time_limit.as_millis()
        ),
        (Mode::Strict, State::Open, false) => {
            format!("failing fast with {code_name}, nothing sent (one probe at a time)")
        }
        (Mode::Strict, State::Open, true) => format!(
            "sent to the primary (read concern untouched); failing fast with {code_name} when the ladder guard is full"
        ),
    };
    if p.dry_run && p.mode != Mode::Passthrough {
        format!("dry run: sent as the client sent it, nothing changed (only logged and counted); would be {what}")
    } else {
        what
    }
}

/// What an eligible read gets now, in a few words (the first screen's).
fn reads_now(policy: Option<&NsPolicy>, state: State, code_name: &str) -> String {
    let Some(p) = policy else {
        return "go out as sent".into();
    };
    let what = match (p.mode, state, p.primary_rung) {
        (Mode::Passthrough, _, _) => return "go out as sent".into(),
        (_, State::Closed, _) => "go out as sent".to_string(),
        (Mode::Fallback, State::Open, false) => {
            "go out with readConcern available (orphans possible)".into()
        }
        (Mode::Fallback, State::Open, true) => {
            "go to the primary, then readConcern available if it fails".into()
        }
        (Mode::Strict, State::Open, false) if p.on_open == crate::policy::OnOpen::Bound => {
            format!(
                "go out bounded by {} ms; those that fail get {code_name} at once",
                p.open_time_limit.as_millis()
            )
        }
        (Mode::Strict, State::Open, false) => {
            format!("fail fast with {code_name}; nothing is sent")
        }
        (Mode::Strict, State::Open, true) => "go to the shard's primary".into(),
    };
    if p.dry_run && state == State::Open {
        format!("go out as sent (dry run); would {what}")
    } else {
        what
    }
}
