//! `[stall_watch]`: the write-progress watch (passive signal, `[stall_watch.probe]`,
//! `[stall_watch.shards]`) and what a raised signal does (`on_write_stall`).
//!
//! Settings that can never take effect are errors here too: tuning keys under
//! `passive = false`, `open_fallback_breakers` with no signal or no fallback entry, the ticket
//! threshold when `server_version_7_plus = true`, a probe `slow` not below its `timeout`.
//! Passwords (`password`, or the variable `password_env` names) are kept in a [`Secret`]
//! whose `Debug` prints `<redacted>`; shard URIs must not carry credentials.

use std::fmt;
use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;

use super::scalars::duration;
use super::spans::{Ctx, Recorded};
use probe::{probe, RawProbe};
use shards::{shards, RawShards};

pub(in crate::config) mod credentials;
mod probe;
mod shards;

/// Default `stall_after`.
pub const DEFAULT_STALL_AFTER: Duration = Duration::from_secs(5);
/// Default `min_in_flight`.
pub const DEFAULT_MIN_IN_FLIGHT: u32 = 1;
/// Default `min_client_addresses`: one client, however many connections it opens, is never
/// the cluster's word alone.
pub const DEFAULT_MIN_CLIENT_ADDRESSES: u32 = 2;
/// Default `clear_after`, as a multiple of `stall_after`.
pub const DEFAULT_CLEAR_AFTER_STALLS: u32 = 3;
/// Default probe `interval`, `slow` and longest `timeout`.
pub const DEFAULT_PROBE_INTERVAL: Duration = Duration::from_secs(30);
pub const DEFAULT_PROBE_SLOW: Duration = Duration::from_secs(2);
pub const DEFAULT_PROBE_TIMEOUT: Duration = Duration::from_secs(10);
/// Default probe collection and document.
pub const DEFAULT_PROBE_NS: (&str, &str) = ("ops_probe", "probe");
pub const DEFAULT_PROBE_ID: &str = "writer-probe";
/// Defaults of `[stall_watch.shards]`: the article's thresholds.
pub const DEFAULT_POLL: Duration = Duration::from_secs(10);
pub const DEFAULT_FOR: Duration = Duration::from_secs(120);
pub const DEFAULT_TICKETS_AVAILABLE_MAX: i64 = 2;
pub const DEFAULT_QUEUED_WRITERS_MIN: i64 = 10;
pub const DEFAULT_RATE_RATIO: f64 = 0.1;
pub const DEFAULT_BASELINE: Duration = Duration::from_secs(3600);

/// A password: never printed by `Debug`, never logged, never shown on `/status`.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(s: String) -> Secret {
        Secret(s)
    }

    /// The password itself, for the driver's credential only.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// What a raised write-stall signal does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StallAction {
    /// Show it (status page, `/status`, metrics, logs); change nothing.
    Observe,
    /// Also hold the breakers of fallback namespaces open while it lasts.
    OpenFallbackBreakers,
}

impl StallAction {
    pub fn as_str(self) -> &'static str {
        match self {
            StallAction::Observe => "observe",
            StallAction::OpenFallbackBreakers => "open_fallback_breakers",
        }
    }
}

/// Login for the probe's or the poller's own driver connections.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credentials {
    pub username: String,
    pub password: Secret,
    /// `auth_source`, default `admin`.
    pub auth_source: String,
}

/// `[stall_watch.probe]`: an upsert through each upstream every `interval`.
#[derive(Debug, Clone, PartialEq)]
pub struct ProbeConfig {
    /// Default 30s.
    pub interval: Duration,
    /// A probe slower than this raises the signal. Default 2s; below `timeout`.
    pub slow: Duration,
    /// Client-side deadline of one probe. Default the smaller of 10s and `interval`; at most
    /// `interval` (probes never pile up).
    pub timeout: Duration,
    /// `namespace`, default `ops_probe.probe`: (db, collection).
    pub db: String,
    pub collection: String,
    /// `ids`: the `_id` of each probe document (one per shard when the collection is split
    /// so). Default `["writer-probe"]`.
    pub ids: Vec<String>,
    pub credentials: Option<Credentials>,
}

/// `[stall_watch.shards]`: the article's composite rule from each shard primary's
/// `serverStatus`.
#[derive(Debug, Clone, PartialEq)]
pub struct ShardsConfig {
    /// `mongodb://host:port/?directConnection=true`, one per shard primary.
    pub uris: Vec<String>,
    /// Default 10s.
    pub poll: Duration,
    /// `for`: how long every condition must hold. Default 2m; at least `poll`.
    pub hold_for: Duration,
    /// Default 2 (ignored from 7.0: tickets are dynamic).
    pub tickets_available_max: i64,
    /// Default 10.
    pub queued_writers_min: i64,
    /// Default 0.1: the write-op rate is below this share of its baseline.
    pub rate_ratio: f64,
    /// Time constant of the baseline's moving average. Default 1h.
    pub baseline: Duration,
    /// `server_version_7_plus`: none = read `version` from serverStatus.
    pub server_version_7_plus: Option<bool>,
    pub credentials: Option<Credentials>,
}

/// `[stall_watch]`, defaults applied. Every setting reloads (the probe and the poller
/// reconnect when their settings change).
#[derive(Debug, Clone, PartialEq)]
pub struct StallConfig {
    /// Watch the writes relayed (default true in a file, false in `Config::for_upstreams`).
    pub passive: bool,
    /// Default 5s.
    pub stall_after: Duration,
    /// Default 1.
    pub min_in_flight: u32,
    /// Client addresses (IPv4, or IPv6 by /64) whose connections must each have a write
    /// waiting `stall_after`. Default 2.
    pub min_client_addresses: u32,
    /// `clear_after`: a raised passive signal whose rule stopped holding without any write
    /// answered (clients gave up) stays raised this long; none: 3 x `stall_after`.
    pub clear_after: Option<Duration>,
    /// Default observe.
    pub on_write_stall: StallAction,
    pub probe: Option<ProbeConfig>,
    pub shards: Option<ShardsConfig>,
}

impl StallConfig {
    /// Nothing watched (what `Config::for_upstreams` uses).
    pub fn off() -> StallConfig {
        StallConfig {
            passive: false,
            ..StallConfig::default()
        }
    }

    /// How long a raised passive signal outlives its rule when no write was answered.
    pub fn clear_after(&self) -> Duration {
        self.clear_after
            .unwrap_or(self.stall_after * DEFAULT_CLEAR_AFTER_STALLS)
    }

    /// Any signal source on.
    pub fn enabled(&self) -> bool {
        self.passive || self.probe.is_some() || self.shards.is_some()
    }
}

impl Default for StallConfig {
    /// The defaults of a config file without `[stall_watch]`: the passive watch, observe.
    fn default() -> Self {
        StallConfig {
            passive: true,
            stall_after: DEFAULT_STALL_AFTER,
            min_in_flight: DEFAULT_MIN_IN_FLIGHT,
            min_client_addresses: DEFAULT_MIN_CLIENT_ADDRESSES,
            clear_after: None,
            on_write_stall: StallAction::Observe,
            probe: None,
            shards: None,
        }
    }
}

// ---------------------------------------------------------------------------------------
// Shape

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawStall {
    passive: Option<Spanned<bool>>,
    stall_after: Option<Spanned<String>>,
    min_in_flight: Option<Spanned<i64>>,
    min_client_addresses: Option<Spanned<i64>>,
    clear_after: Option<Spanned<String>>,
    on_write_stall: Option<Spanned<String>>,
    probe: Option<Spanned<RawProbe>>,
    shards: Option<Spanned<RawShards>>,
}

// ---------------------------------------------------------------------------------------
// Values

const NONZERO: Duration = Duration::from_nanos(1);

/// `[stall_watch]`; `fallback_entries` says whether any `[[namespaces]]` entry is fallback.
/// `Err(Recorded)` when invalid.
pub(super) fn stall(
    ctx: &mut Ctx,
    raw: Option<&Spanned<RawStall>>,
    fallback_entries: bool,
) -> Result<StallConfig, Recorded> {
    let Some(table) = raw else {
        return Ok(StallConfig::default());
    };
    let t = table.get_ref();
    let before = ctx.errors.len();
    let mut c = StallConfig::default();
    passive(ctx, t, &mut c);
    if let Some(v) = &t.on_write_stall {
        match v.get_ref().as_str() {
            "observe" => c.on_write_stall = StallAction::Observe,
            "open_fallback_breakers" => c.on_write_stall = StallAction::OpenFallbackBreakers,
            other => {
                let msg = format!(
                    "unknown value `{other}`; expected `observe` or `open_fallback_breakers`"
                );
                ctx.err(v, "stall_watch.on_write_stall", msg);
            }
        }
    }
    c.probe = t.probe.as_ref().and_then(|p| probe(ctx, p));
    c.shards = t.shards.as_ref().and_then(|s| shards(ctx, s));
    if c.on_write_stall == StallAction::OpenFallbackBreakers {
        action_can_act(ctx, table, fallback_entries);
    }
    if ctx.errors.len() > before {
        return Err(Recorded);
    }
    Ok(c)
}

/// `passive`, `stall_after`, `min_in_flight`, `min_client_addresses`, `clear_after` (the
/// last four only mean something when passive).
fn passive(ctx: &mut Ctx, t: &RawStall, c: &mut StallConfig) {
    if let Some(p) = &t.passive {
        c.passive = *p.get_ref();
    }
    if let Some(v) = &t.stall_after {
        c.stall_after = duration(ctx, v, "stall_watch.stall_after", NONZERO).unwrap_or_default();
    }
    if let Some(v) = &t.min_in_flight {
        match u32::try_from(*v.get_ref()) {
            Ok(n) if n >= 1 => c.min_in_flight = n,
            _ => {
                let msg = format!("{} is out of range 1..={}", v.get_ref(), u32::MAX);
                ctx.err(v, "stall_watch.min_in_flight", msg);
            }
        }
    }
    if let Some(v) = &t.min_client_addresses {
        match u32::try_from(*v.get_ref()) {
            Ok(n) if (1..=1000).contains(&n) => c.min_client_addresses = n,
            _ => {
                let msg = format!("{} is out of range 1..=1000", v.get_ref());
                ctx.err(v, "stall_watch.min_client_addresses", msg);
            }
        }
    }
    if let Some(v) = &t.clear_after {
        c.clear_after = duration(ctx, v, "stall_watch.clear_after", Duration::ZERO);
    }
    if c.passive {
        return;
    }
    let set = [
        (
            "stall_after",
            t.stall_after.as_ref().map(|s| s.span().start),
        ),
        (
            "min_in_flight",
            t.min_in_flight.as_ref().map(|s| s.span().start),
        ),
        (
            "min_client_addresses",
            t.min_client_addresses.as_ref().map(|s| s.span().start),
        ),
        (
            "clear_after",
            t.clear_after.as_ref().map(|s| s.span().start),
        ),
    ];
    for (name, at) in set {
        if let Some(offset) = at {
            let line = ctx.line(offset);
            let msg = "has no effect: passive = false".to_string();
            ctx.err_line(line, &format!("stall_watch.{name}"), msg);
        }
    }
}

/// `open_fallback_breakers` needs a signal and a fallback entry to act on.
fn action_can_act(ctx: &mut Ctx, table: &Spanned<RawStall>, fallback_entries: bool) {
    let t = table.get_ref();
    let at = t
        .on_write_stall
        .as_ref()
        .map_or(table.span().start, |v| v.span().start);
    let line = ctx.line(at);
    let no_signal = t.passive.as_ref().is_some_and(|p| !*p.get_ref())
        && t.probe.is_none()
        && t.shards.is_none();
    let problem = if no_signal {
        "has no effect: every signal is off (passive = false, no [stall_watch.probe], no [stall_watch.shards])"
    } else if !fallback_entries {
        "has no effect: no [[namespaces]] entry has mode fallback"
    } else {
        return;
    };
    ctx.err_line(line, "stall_watch.on_write_stall", problem.to_string());
}

/// One line for `check-config`.
pub fn describe(c: &StallConfig) -> String {
    if !c.enabled() {
        return "off".to_string();
    }
    let d = |d: Duration| humantime::format_duration(d).to_string();
    let mut parts = Vec::new();
    if c.passive {
        parts.push(format!(
            "passive (writes waiting over {} on 2+ connections from {}+ client addresses, at least {} in all, none answered; a raised signal clears at the first answer, or {} after its evidence went)",
            d(c.stall_after),
            c.min_client_addresses,
            c.min_in_flight,
            d(c.clear_after()),
        ));
    }
    if let Some(p) = &c.probe {
        parts.push(format!(
            "probe {}.{} every {} (slow {}, timeout {}{})",
            p.db,
            p.collection,
            d(p.interval),
            d(p.slow),
            d(p.timeout),
            p.credentials
                .as_ref()
                .map_or(String::new(), |c| format!(", as {}", c.username))
        ));
    }
    if let Some(s) = &c.shards {
        parts.push(format!(
            "serverStatus of {} shard primar{} every {} (for {})",
            s.uris.len(),
            if s.uris.len() == 1 { "y" } else { "ies" },
            d(s.poll),
            d(s.hold_for)
        ));
    }
    format!(
        "{}; on_write_stall {}",
        parts.join("; "),
        c.on_write_stall.as_str()
    )
}
