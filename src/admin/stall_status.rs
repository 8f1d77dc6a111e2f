//! The write-stall watch as `/status` and the page show it: whether a stall is suspected,
//! since when (the whole stall's start), what staleguard does about it (in dry run: what it
//! would do), which breakers it holds, and every signal with its evidence.

use serde::Serialize;
use tokio::time::Instant;

use super::text::rfc3339;
use crate::config::{Config, StallAction};
use crate::handles::AdminHandles;
use crate::stall::Evidence;

/// The write-progress watch: is a write stall suspected, on what evidence, since when.
#[derive(Debug, Serialize)]
pub struct WriteStallStatus {
    /// `off` (nothing watched), `clear` or `suspected`.
    pub state: &'static str,
    /// The signals configured: `passive`, `probe`, `composite`.
    pub watching: Vec<&'static str>,
    /// `on_write_stall`: `observe` or `open_fallback_breakers`.
    pub action: &'static str,
    /// While suspected: the whole stall's start (the earliest start among the signals
    /// raised since the last moment none was).
    pub since: Option<String>,
    pub since_seconds_ago: Option<u64>,
    /// While suspected: where writes do not complete, from the signal that says most (the
    /// one naming a shard, else the earliest raised).
    pub place: Option<String>,
    /// `writes are not completing on <where> since <the whole stall's start>`.
    pub headline: Option<String>,
    /// Breakers held open by the action.
    pub held_breakers: Vec<String>,
    /// The held breakers whose namespace is in dry run: their reads go out as the client
    /// sent them (counted in `dry_run_total` as what would have been done).
    pub held_dry_run: Vec<String>,
    /// While suspected: what staleguard does about it right now, in words (what it would do,
    /// for namespaces in dry run).
    pub effect: Option<String>,
    /// Raised first.
    pub signals: Vec<SignalStatus>,
}

#[derive(Debug, Serialize)]
pub struct SignalStatus {
    /// `passive`, `probe` or `composite`.
    pub signal: &'static str,
    pub target: String,
    /// Where, in words (`upstream ...`, `shard A (shardA at host:port)`).
    pub place: String,
    /// `raised` or `clear`.
    pub state: &'static str,
    pub since: Option<String>,
    pub since_seconds_ago: Option<u64>,
    pub headline: Option<String>,
    /// The evidence in one line.
    pub summary: String,
    pub evidence: Evidence,
}

pub(super) fn write_stall(shared: &AdminHandles, config: &Config) -> WriteStallStatus {
    let now = Instant::now();
    let ago = |since: Option<Instant>| since.map(|s| now.saturating_duration_since(s).as_secs());
    let c = &config.stall;
    let mut watching = Vec::new();
    if c.passive {
        watching.push("passive");
    }
    if c.probe.is_some() {
        watching.push("probe");
    }
    if c.shards.is_some() {
        watching.push("composite");
    }
    let signals: Vec<SignalStatus> = shared
        .stall
        .signals()
        .into_iter()
        .map(|s| SignalStatus {
            signal: s.kind.as_str(),
            target: s.target.clone(),
            place: s.place.clone(),
            state: if s.raised { "raised" } else { "clear" },
            since: s.since_wall.map(rfc3339),
            since_seconds_ago: ago(s.since),
            headline: s.headline(),
            summary: s.summary.clone(),
            evidence: s.evidence.clone(),
        })
        .collect();
    let whole = shared.stall.stall_since();
    // The signal that says most about where: one naming the shard, else the first raised.
    let raised = || signals.iter().filter(|s| s.state == "raised");
    let telling = raised()
        .find(|s| s.evidence.shard.is_some())
        .or_else(|| raised().min_by_key(|s| std::cmp::Reverse(s.since_seconds_ago)));
    let (held_breakers, held_dry_run) = held(shared, config);
    let headline = telling.zip(whole).map(|(s, (_, wall))| {
        let on = if s.signal == "composite" {
            "on"
        } else {
            "through"
        };
        format!(
            "writes are not completing {on} {} since {}",
            s.place,
            rfc3339(wall)
        )
    });
    let effect = telling.map(|_| effect(config, &held_breakers, &held_dry_run));
    WriteStallStatus {
        state: match (&telling, c.enabled()) {
            (Some(_), _) => "suspected",
            (None, true) => "clear",
            (None, false) => "off",
        },
        watching,
        action: c.on_write_stall.as_str(),
        since: whole.map(|(_, wall)| rfc3339(wall)),
        since_seconds_ago: whole.map(|(at, _)| now.saturating_duration_since(at).as_secs()),
        place: telling.map(|s| s.place.clone()),
        headline,
        held_breakers,
        held_dry_run,
        effect,
        signals,
    }
}

/// The breakers the action holds open, and those of them in dry run.
fn held(shared: &AdminHandles, config: &Config) -> (Vec<String>, Vec<String>) {
    let mut held = Vec::new();
    let mut dry = Vec::new();
    for b in shared.breakers.snapshot().into_iter().filter(|b| b.held) {
        let in_dry_run =
            b.ns.split_once('.')
                .and_then(|(db, coll)| config.policy.lookup(db, coll))
                .is_some_and(|p| p.dry_run);
        if in_dry_run {
            dry.push(b.ns.clone());
        }
        held.push(b.ns);
    }
    (held, dry)
}

/// What the action does while a stall is suspected: true for the namespaces that act and
/// for those in dry run alike.
fn effect(config: &Config, held: &[String], dry: &[String]) -> String {
    if config.stall.on_write_stall == StallAction::Observe {
        return "only observing (on_write_stall = \"observe\"): fallback reads still meet their first failures before their breakers open".to_string();
    }
    let acting: Vec<&str> = held
        .iter()
        .filter(|n| !dry.contains(n))
        .map(String::as_str)
        .collect();
    let mut parts = Vec::new();
    if !acting.is_empty() {
        parts.push(format!(
            "holding the breakers of {} open: their reads go out with readConcern available before any fails",
            acting.join(", ")
        ));
    }
    if !dry.is_empty() {
        parts.push(format!(
            "holding the breakers of {} open in dry run: their reads would go out with readConcern available, but go out unchanged (nothing is rewritten)",
            dry.join(", ")
        ));
    }
    if parts.is_empty() {
        parts.push("ready to hold the breakers of fallback namespaces open as they are read (none held yet)".to_string());
    }
    parts.join("; ")
}
