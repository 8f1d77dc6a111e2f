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

use super::parse::duration;
use super::spans::Ctx;
use crate::policy::DB_FORBIDDEN;

/// Default `stall_after`.
pub const DEFAULT_STALL_AFTER: Duration = Duration::from_secs(5);
/// Default `min_in_flight`.
pub const DEFAULT_MIN_IN_FLIGHT: u32 = 1;
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
    on_write_stall: Option<Spanned<String>>,
    probe: Option<Spanned<RawProbe>>,
    shards: Option<Spanned<RawShards>>,
}

/// The login keys of `[stall_watch.probe]` or `[stall_watch.shards]` (serde cannot flatten
/// them into a table that denies unknown keys).
struct RawCreds<'a> {
    username: Option<&'a Spanned<String>>,
    password: Option<&'a Spanned<String>>,
    password_env: Option<&'a Spanned<String>>,
    auth_source: Option<&'a Spanned<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawProbe {
    interval: Option<Spanned<String>>,
    slow: Option<Spanned<String>>,
    timeout: Option<Spanned<String>>,
    namespace: Option<Spanned<String>>,
    ids: Option<Spanned<Vec<Spanned<String>>>>,
    username: Option<Spanned<String>>,
    password: Option<Spanned<String>>,
    password_env: Option<Spanned<String>>,
    auth_source: Option<Spanned<String>>,
}

impl RawProbe {
    fn creds(&self) -> RawCreds<'_> {
        RawCreds {
            username: self.username.as_ref(),
            password: self.password.as_ref(),
            password_env: self.password_env.as_ref(),
            auth_source: self.auth_source.as_ref(),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawShards {
    uris: Option<Spanned<Vec<Spanned<String>>>>,
    poll: Option<Spanned<String>>,
    #[serde(rename = "for")]
    hold_for: Option<Spanned<String>>,
    tickets_available_max: Option<Spanned<i64>>,
    queued_writers_min: Option<Spanned<i64>>,
    rate_ratio: Option<Spanned<f64>>,
    baseline: Option<Spanned<String>>,
    server_version_7_plus: Option<Spanned<bool>>,
    username: Option<Spanned<String>>,
    password: Option<Spanned<String>>,
    password_env: Option<Spanned<String>>,
    auth_source: Option<Spanned<String>>,
}

impl RawShards {
    fn creds(&self) -> RawCreds<'_> {
        RawCreds {
            username: self.username.as_ref(),
            password: self.password.as_ref(),
            password_env: self.password_env.as_ref(),
            auth_source: self.auth_source.as_ref(),
        }
    }
}

// ---------------------------------------------------------------------------------------
// Values

const NONZERO: Duration = Duration::from_nanos(1);

/// `[stall_watch]`; `fallback_entries` says whether any `[[namespaces]]` entry is fallback.
/// `Err(())` when invalid (errors recorded).
pub(super) fn stall(
    ctx: &mut Ctx,
    raw: Option<&Spanned<RawStall>>,
    fallback_entries: bool,
) -> Result<StallConfig, ()> {
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
        return Err(());
    }
    Ok(c)
}

/// `passive`, `stall_after`, `min_in_flight` (the last two only mean something when passive).
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

fn probe(ctx: &mut Ctx, table: &Spanned<RawProbe>) -> Option<ProbeConfig> {
    let p = table.get_ref();
    let key = |k: &str| format!("stall_watch.probe.{k}");
    let interval = p
        .interval
        .as_ref()
        .map_or(Some(DEFAULT_PROBE_INTERVAL), |v| {
            duration(ctx, v, &key("interval"), NONZERO)
        });
    let slow = p.slow.as_ref().map_or(Some(DEFAULT_PROBE_SLOW), |v| {
        duration(ctx, v, &key("slow"), NONZERO)
    });
    let timeout = match &p.timeout {
        Some(v) => duration(ctx, v, &key("timeout"), NONZERO),
        None => interval.map(|i| i.min(DEFAULT_PROBE_TIMEOUT)),
    };
    if let (Some(i), Some(t), Some(v)) = (interval, timeout, &p.timeout) {
        if t > i {
            let msg = format!(
                "{} is longer than interval {}: probes would pile up on a stalled primary",
                humantime::format_duration(t),
                humantime::format_duration(i)
            );
            ctx.err(v, &key("timeout"), msg);
        }
    }
    if let (Some(s), Some(t)) = (slow, timeout) {
        if s >= t {
            let msg = format!(
                "slow {} is not below the probe timeout {}: a probe is cut before it counts as slow",
                humantime::format_duration(s),
                humantime::format_duration(t)
            );
            match (&p.slow, &p.timeout, &p.interval) {
                (Some(v), _, _) => ctx.err(v, &key("slow"), msg),
                (None, Some(v), _) => ctx.err(v, &key("timeout"), msg),
                (None, None, Some(v)) => ctx.err(v, &key("interval"), msg),
                _ => ctx.err(table, &key("slow"), msg),
            }
        }
    }
    let ns = match &p.namespace {
        None => Some((
            DEFAULT_PROBE_NS.0.to_string(),
            DEFAULT_PROBE_NS.1.to_string(),
        )),
        Some(v) => {
            let parsed = v
                .get_ref()
                .split_once('.')
                .filter(|(d, c)| {
                    !d.is_empty() && !c.is_empty() && !d.contains(DB_FORBIDDEN) && !c.contains('$')
                })
                .map(|(d, c)| (d.to_string(), c.to_string()));
            if parsed.is_none() {
                let msg = format!(
                    "`{}` is not a namespace: expected `db.collection`",
                    v.get_ref()
                );
                ctx.err(v, &key("namespace"), msg);
            }
            parsed
        }
    };
    let ids = match &p.ids {
        None => Some(vec![DEFAULT_PROBE_ID.to_string()]),
        Some(list) => ids(ctx, list, &key("ids")),
    };
    let credentials = credentials(ctx, &p.creds(), table, "stall_watch.probe");
    let (db, collection) = ns?;
    Some(ProbeConfig {
        interval: interval?,
        slow: slow?,
        timeout: timeout?,
        db,
        collection,
        ids: ids?,
        credentials: credentials.ok()?,
    })
}

fn ids(ctx: &mut Ctx, list: &Spanned<Vec<Spanned<String>>>, key: &str) -> Option<Vec<String>> {
    if list.get_ref().is_empty() {
        ctx.err(
            list,
            key,
            "must list at least one probe document `_id`".into(),
        );
        return None;
    }
    let mut out: Vec<String> = Vec::new();
    let mut ok = true;
    for (i, id) in list.get_ref().iter().enumerate() {
        let s = id.get_ref();
        if s.is_empty() {
            ctx.err(id, &format!("{key}[{i}]"), "must not be empty".into());
            ok = false;
        } else if out.contains(s) {
            ctx.err(id, &format!("{key}[{i}]"), format!("`{s}` is listed twice"));
            ok = false;
        } else {
            out.push(s.clone());
        }
    }
    ok.then_some(out)
}

fn shards(ctx: &mut Ctx, table: &Spanned<RawShards>) -> Option<ShardsConfig> {
    let s = table.get_ref();
    let key = |k: &str| format!("stall_watch.shards.{k}");
    let uris = match &s.uris {
        None => {
            let msg =
                "missing; list each shard primary as `mongodb://host:port/?directConnection=true`"
                    .to_string();
            ctx.err(table, &key("uris"), msg);
            None
        }
        Some(list) => uris(ctx, list, &key("uris")),
    };
    let poll = s.poll.as_ref().map_or(Some(DEFAULT_POLL), |v| {
        duration(ctx, v, &key("poll"), NONZERO)
    });
    let hold_for = s.hold_for.as_ref().map_or(Some(DEFAULT_FOR), |v| {
        duration(ctx, v, &key("for"), NONZERO)
    });
    if let (Some(p), Some(f)) = (poll, hold_for) {
        if f < p {
            let msg = format!(
                "for {} is shorter than poll {}: the conditions are seen once per poll",
                humantime::format_duration(f),
                humantime::format_duration(p)
            );
            match (&s.hold_for, &s.poll) {
                (Some(v), _) => ctx.err(v, &key("for"), msg),
                (None, Some(v)) => ctx.err(v, &key("poll"), msg),
                (None, None) => {}
            }
        }
    }
    let non_negative = |ctx: &mut Ctx, v: &Option<Spanned<i64>>, name: &str, default: i64| match v {
        None => Some(default),
        Some(v) if *v.get_ref() >= 0 => Some(*v.get_ref()),
        Some(v) => {
            let msg = format!("{} must be zero or more", v.get_ref());
            ctx.err(v, &key(name), msg);
            None
        }
    };
    let tickets = non_negative(
        ctx,
        &s.tickets_available_max,
        "tickets_available_max",
        DEFAULT_TICKETS_AVAILABLE_MAX,
    );
    let queued = non_negative(
        ctx,
        &s.queued_writers_min,
        "queued_writers_min",
        DEFAULT_QUEUED_WRITERS_MIN,
    );
    let rate_ratio = match &s.rate_ratio {
        None => Some(DEFAULT_RATE_RATIO),
        Some(v) if *v.get_ref() > 0.0 && *v.get_ref() <= 1.0 => Some(*v.get_ref()),
        Some(v) => {
            let msg = format!("{} is out of range: above 0, at most 1", v.get_ref());
            ctx.err(v, &key("rate_ratio"), msg);
            None
        }
    };
    let baseline = s.baseline.as_ref().map_or(Some(DEFAULT_BASELINE), |v| {
        duration(ctx, v, &key("baseline"), NONZERO)
    });
    let v7 = s.server_version_7_plus.as_ref().map(|v| *v.get_ref());
    if let (Some(true), Some(t)) = (v7, &s.tickets_available_max) {
        let msg = "has no effect: from 7.0 write tickets are dynamic, so the rule does not use them (server_version_7_plus = true)".to_string();
        ctx.err(t, &key("tickets_available_max"), msg);
    }
    let credentials = credentials(ctx, &s.creds(), table, "stall_watch.shards");
    Some(ShardsConfig {
        uris: uris?,
        poll: poll?,
        hold_for: hold_for?,
        tickets_available_max: tickets?,
        queued_writers_min: queued?,
        rate_ratio: rate_ratio?,
        baseline: baseline?,
        server_version_7_plus: v7,
        credentials: credentials.ok()?,
    })
}

fn uris(ctx: &mut Ctx, list: &Spanned<Vec<Spanned<String>>>, key: &str) -> Option<Vec<String>> {
    if list.get_ref().is_empty() {
        ctx.err(list, key, "must list at least one shard primary".into());
        return None;
    }
    let mut out: Vec<String> = Vec::new();
    let mut ok = true;
    for (i, u) in list.get_ref().iter().enumerate() {
        let k = format!("{key}[{i}]");
        let s = u.get_ref();
        let problem = match s.strip_prefix("mongodb://") {
            None if s.starts_with("mongodb+srv://") => Some(
                "`mongodb+srv://` is not supported (no DNS resolver is built in); write `mongodb://host:port/?directConnection=true`".to_string(),
            ),
            None => Some(
                "expected `mongodb://host:port/?directConnection=true`".to_string(),
            ),
            Some(rest) => {
                let hosts = rest.split(['/', '?']).next().unwrap_or("");
                if hosts.contains('@') {
                    Some("must not carry credentials (they would show in logs and on /status); set username and password or password_env in [stall_watch.shards]".to_string())
                } else if hosts.is_empty() {
                    Some("has no host".to_string())
                } else if out.contains(s) {
                    Some("is listed twice".to_string())
                } else {
                    None
                }
            }
        };
        match problem {
            Some(p) => {
                ctx.err(u, &k, p);
                ok = false;
            }
            None => out.push(s.clone()),
        }
    }
    ok.then_some(out)
}

/// `username` with `password` or `password_env`, optional `auth_source`.
fn credentials<T>(
    ctx: &mut Ctx,
    c: &RawCreds<'_>,
    table: &Spanned<T>,
    prefix: &str,
) -> Result<Option<Credentials>, ()> {
    let key = |k: &str| format!("{prefix}.{k}");
    let Some(user) = c.username else {
        let mut bad = false;
        for (name, v) in [
            ("password", c.password),
            ("password_env", c.password_env),
            ("auth_source", c.auth_source),
        ] {
            if let Some(v) = v {
                ctx.err(v, &key(name), "has no effect without `username`".into());
                bad = true;
            }
        }
        return if bad { Err(()) } else { Ok(None) };
    };
    if user.get_ref().is_empty() {
        ctx.err(user, &key("username"), "must not be empty".into());
        return Err(());
    }
    let password = match (c.password, c.password_env) {
        (Some(p), Some(_)) => {
            let msg = "set either password or password_env, not both".to_string();
            ctx.err(p, &key("password"), msg);
            return Err(());
        }
        (Some(p), None) => Secret(p.get_ref().clone()),
        (None, Some(var)) => match std::env::var(var.get_ref()) {
            Ok(p) if !p.is_empty() => Secret(p),
            Ok(_) => {
                let msg = format!("environment variable `{}` is empty", var.get_ref());
                ctx.err(var, &key("password_env"), msg);
                return Err(());
            }
            Err(_) => {
                let msg = format!("environment variable `{}` is not set", var.get_ref());
                ctx.err(var, &key("password_env"), msg);
                return Err(());
            }
        },
        (None, None) => {
            let msg = "missing; `username` needs `password` or `password_env`".to_string();
            ctx.err(table, &key("password"), msg);
            return Err(());
        }
    };
    let auth_source = match c.auth_source {
        Some(a) if a.get_ref().is_empty() => {
            ctx.err(a, &key("auth_source"), "must not be empty".into());
            return Err(());
        }
        Some(a) => a.get_ref().clone(),
        None => "admin".to_string(),
    };
    Ok(Some(Credentials {
        username: user.get_ref().clone(),
        password,
        auth_source,
    }))
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
            "passive (at least {} write(s) waiting over {}, none completing)",
            c.min_in_flight,
            d(c.stall_after)
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
