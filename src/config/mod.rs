//! Configuration: TOML text → validated `Config`. Every error names file, line and key.
//!
//! Parsing runs in two passes. serde (`deny_unknown_fields`, values kept as
//! `toml::Spanned`) checks the shape: an unknown key or a wrong type stops it at the first
//! problem, reported alone. `validate` then checks every value and collects all problems.
//!
//! Besides malformed values, settings that can never take effect are errors too:
//! - any breaker/rewrite setting on a `passthrough` entry;
//! - `causal` on a `strict` entry (strict never rewrites, so there is nothing to drop or skip);
//! - `slow_read` >= `max_time` (the read would have been cut before it counted as slow);
//! - `primary` in `read_preferences` (primary reads are never eligible);
//! - a trigger code <= 0 (server error codes are positive);
//! - `max_time` below 1ms (it would be sent as `maxTimeMS: 0`, which means "no limit");
//! - a database name holding a character MongoDB forbids in database names;
//! - `admin.listen` equal to `listen` (unless both use port 0);
//! - `health_timeout` longer than `health_interval`;
//! - `[upstream_tls] ca` together with `insecure_skip_verify = true`;
//! - `[stall_watch]` settings that cannot act (see `stall`).
//!
//! The operations sections (`[admin]`, `[tls]`, `[upstream_tls]`, health checks) live in
//! `ops`; TLS files are read while validating, so a missing file names its key and line.
//! The write-stall watch (`[stall_watch]`) lives in `stall`.
//!
//! The per-namespace settings and their pattern table are `policy`'s; they are re-exported
//! here.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;

use crate::command::ReadPrefMode;
use crate::policy::{Pattern, DB_FORBIDDEN};
use crate::tls::{ServerTls, UpstreamTls};

mod ops;
mod stall;

pub use crate::policy::{Causal, Mode, NsPolicy, PolicyTable, DEFAULT_TRIGGER_CODES};
pub use ops::{DEFAULT_ADMIN_LISTEN, DEFAULT_HEALTH_INTERVAL, DEFAULT_HEALTH_TIMEOUT};
pub use stall::{
    Credentials, ProbeConfig, Secret, ShardsConfig, StallAction, StallConfig, DEFAULT_STALL_AFTER,
};

/// Default `listen`.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:27018";
/// Default single entry of `upstreams`.
pub const DEFAULT_UPSTREAM: &str = "127.0.0.1:27017";
/// Smallest accepted `max_message_size` (bytes).
pub const MIN_MESSAGE_SIZE: usize = 16_384;
/// Largest accepted `max_message_size` (bytes): the wire length is an `i32`.
pub const MAX_MESSAGE_SIZE_LIMIT: usize = i32::MAX as usize;

/// The proxy's configuration. Reload (SIGHUP or file change) validates the whole file first
/// and keeps the old config on any error.
#[derive(Debug, Clone)]
pub struct Config {
    /// The file this was read from.
    pub source: PathBuf,
    /// `listen`: where applications connect, `host:port`. Default `127.0.0.1:27018`.
    /// Needs a restart.
    pub listen: String,
    /// `upstreams`: mongos routers, `host:port` each. Default `["127.0.0.1:27017"]`; not
    /// empty. Reloads: new client connections use the new list.
    pub upstreams: Vec<String>,
    /// `max_message_size`: largest wire message accepted, in bytes. Default 48000000;
    /// 16384..=2147483647. Reloads: applies to new connections.
    pub max_message_size: usize,
    /// `connect_timeout`: time allowed to connect to an upstream. Default 5s; not zero.
    /// Reloads: applies to the next connection attempt.
    pub connect_timeout: Duration,
    /// `shutdown_timeout`: how long a graceful stop waits for connections to finish.
    /// Default 10s; zero stops at once. Reloads.
    pub shutdown_timeout: Duration,
    /// `[admin] listen`: address of the HTTP admin endpoint. Default `127.0.0.1:9187` in a
    /// file (`[admin] enabled = false` turns it off), none in [`Config::for_upstreams`].
    /// Needs a restart.
    pub admin_listen: Option<String>,
    /// `[admin] token`: bearer token required for every admin route but `/healthz` and
    /// `/readyz`. Default none (no authentication). Reloads.
    pub admin_token: Option<String>,
    /// `health_interval`: time between two `hello` checks of each upstream; `"off"` (none)
    /// disables them. Default 5s in a file, off in [`Config::for_upstreams`]. Reloads (from
    /// the next check).
    pub health_interval: Option<Duration>,
    /// `health_timeout`: time a check (connect, TLS and `hello`) may take. Default 2s; at
    /// most `health_interval`. Reloads.
    pub health_timeout: Duration,
    /// `[tls]`: client-facing TLS (`cert`, `key`, optional `client_ca`). Default none
    /// (plain TCP). Turning it on or off needs a restart; new files (certificate rotation)
    /// reload and apply to new connections.
    pub tls: Option<ServerTls>,
    /// `[upstream_tls]`: TLS to mongos (`ca`, `server_name`, optional `cert`/`key`,
    /// `insecure_skip_verify`). Default none (plain TCP). Reloads: new upstream connections.
    pub upstream_tls: Option<UpstreamTls>,
    /// `[defaults]` and `[[namespaces]]`: per-namespace policies. Default none (every read
    /// passes through). Reloads.
    pub policy: PolicyTable,
    /// `[stall_watch]`: the write-progress watch and its action. Default in a file: the
    /// passive watch with `observe`; off in [`Config::for_upstreams`]. Reloads.
    pub stall: StallConfig,
}

/// A configuration problem, located.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}:{line}: {key}: {message}")]
pub struct ConfigError {
    pub file: String,
    /// 1-based; 0 when the problem is the file itself (unreadable).
    pub line: usize,
    /// Dotted path such as `namespaces[2].window` (entries counted from 0); `syntax` for a
    /// TOML syntax error, `file` for an unreadable file.
    pub key: String,
    pub message: String,
}

impl Config {
    /// All defaults, no `[[namespaces]]`: a pure relay from `listen` to `upstreams`.
    /// (Tests and embedders use this; the binary always reads a file.)
    pub fn for_upstreams(listen: &str, upstreams: Vec<String>) -> Config {
        Config {
            source: PathBuf::from("<built-in>"),
            listen: listen.to_string(),
            upstreams,
            max_message_size: crate::wire::DEFAULT_MAX_MESSAGE_SIZE,
            connect_timeout: Duration::from_secs(5),
            shutdown_timeout: Duration::from_secs(10),
            admin_listen: None,
            admin_token: None,
            health_interval: None,
            health_timeout: DEFAULT_HEALTH_TIMEOUT,
            tls: None,
            upstream_tls: None,
            policy: PolicyTable::default(),
            stall: StallConfig::off(),
        }
    }

    /// Reads and validates the file at `path`.
    pub fn load(path: &Path) -> Result<Config, Vec<ConfigError>> {
        match std::fs::read_to_string(path) {
            Ok(text) => Config::parse(&text, path),
            Err(e) => Err(vec![ConfigError {
                file: path.display().to_string(),
                line: 0,
                key: "file".to_string(),
                message: format!("cannot read config file: {e}"),
            }]),
        }
    }

    /// Validates `text`; `path` is only used to name the file in errors and `source`.
    pub fn parse(text: &str, path: &Path) -> Result<Config, Vec<ConfigError>> {
        let mut ctx = Ctx {
            file: path.display().to_string(),
            line_starts: line_starts(text),
            errors: Vec::new(),
        };
        let doc = match toml::de::DeTable::parse(text) {
            Ok(doc) => doc,
            Err(e) => {
                ctx.toml_error(&e, "syntax".to_string());
                return Err(ctx.errors);
            }
        };
        let raw: RawConfig = match toml::from_str(text) {
            Ok(raw) => raw,
            Err(e) => {
                let key = e
                    .span()
                    .and_then(|s| key_at(doc.get_ref(), s.start, ""))
                    .unwrap_or_default();
                ctx.toml_error(&e, key);
                return Err(ctx.errors);
            }
        };
        let config = validate(raw, path, &mut ctx);
        match config {
            Some(c) if ctx.errors.is_empty() => Ok(c),
            _ => {
                ctx.errors.sort_by_key(|e| e.line);
                Err(ctx.errors)
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// Shape (serde pass)

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    listen: Option<Spanned<String>>,
    upstreams: Option<Spanned<Vec<Spanned<String>>>>,
    max_message_size: Option<Spanned<i64>>,
    connect_timeout: Option<Spanned<String>>,
    shutdown_timeout: Option<Spanned<String>>,
    health_interval: Option<Spanned<String>>,
    health_timeout: Option<Spanned<String>>,
    admin: Option<Spanned<ops::RawAdmin>>,
    tls: Option<Spanned<ops::RawTls>>,
    upstream_tls: Option<Spanned<ops::RawUpstreamTls>>,
    stall_watch: Option<Spanned<stall::RawStall>>,
    defaults: Option<Spanned<RawEntry>>,
    #[serde(default)]
    namespaces: Vec<Spanned<RawEntry>>,
}

/// One `[[namespaces]]` entry, or `[defaults]` (where `pattern` and `mode` are refused).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEntry {
    pattern: Option<Spanned<String>>,
    mode: Option<Spanned<String>>,
    threshold: Option<Spanned<i64>>,
    window: Option<Spanned<String>>,
    cooldown: Option<Spanned<String>>,
    read_preferences: Option<Spanned<Vec<Spanned<String>>>>,
    trigger_codes: Option<Spanned<Vec<Spanned<i64>>>>,
    max_time: Option<Spanned<String>>,
    dry_run: Option<Spanned<bool>>,
    causal: Option<Spanned<String>>,
    slow_read: Option<Spanned<String>>,
}

impl RawEntry {
    /// The breaker/rewrite settings present in this entry: (name, byte offset).
    fn settings_set(&self) -> Vec<(&'static str, usize)> {
        fn at<T>(v: &Option<Spanned<T>>) -> Option<usize> {
            v.as_ref().map(|s| s.span().start)
        }
        [
            ("threshold", at(&self.threshold)),
            ("window", at(&self.window)),
            ("cooldown", at(&self.cooldown)),
            ("read_preferences", at(&self.read_preferences)),
            ("trigger_codes", at(&self.trigger_codes)),
            ("max_time", at(&self.max_time)),
            ("dry_run", at(&self.dry_run)),
            ("causal", at(&self.causal)),
            ("slow_read", at(&self.slow_read)),
        ]
        .into_iter()
        .filter_map(|(k, o)| o.map(|o| (k, o)))
        .collect()
    }
}

// ---------------------------------------------------------------------------------------
// Locating errors

struct Ctx {
    file: String,
    line_starts: Vec<usize>,
    errors: Vec<ConfigError>,
}

impl Ctx {
    /// 1-based line of a byte offset.
    fn line(&self, offset: usize) -> usize {
        self.line_starts.partition_point(|&s| s <= offset)
    }

    fn err_line(&mut self, line: usize, key: &str, message: String) {
        self.errors.push(ConfigError {
            file: self.file.clone(),
            line,
            key: key.to_string(),
            message,
        });
    }

    fn err<T>(&mut self, at: &Spanned<T>, key: &str, message: String) {
        let line = self.line(at.span().start);
        self.err_line(line, key, message);
    }

    fn toml_error(&mut self, e: &toml::de::Error, key: String) {
        let line = e.span().map_or(0, |s| self.line(s.start));
        let message = e.message().trim().replace('\n', "; ");
        self.err_line(line, &key, message);
    }
}

fn line_starts(text: &str) -> Vec<usize> {
    std::iter::once(0)
        .chain(text.match_indices('\n').map(|(i, _)| i + 1))
        .collect()
}

/// The dotted path of the key (or value) at byte `offset`, deepest first.
fn key_at(table: &toml::de::DeTable<'_>, offset: usize, prefix: &str) -> Option<String> {
    for (k, v) in table {
        let path = join(prefix, k.get_ref());
        if k.span().contains(&offset) {
            return Some(path);
        }
        if let Some(found) = value_key_at(v, offset, &path) {
            return Some(found);
        }
    }
    None
}

fn value_key_at(v: &Spanned<toml::de::DeValue<'_>>, offset: usize, path: &str) -> Option<String> {
    match v.get_ref() {
        toml::de::DeValue::Table(t) => {
            if let Some(found) = key_at(t, offset, path) {
                return Some(found);
            }
        }
        toml::de::DeValue::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                if let Some(found) = value_key_at(item, offset, &format!("{path}[{i}]")) {
                    return Some(found);
                }
            }
        }
        _ => {}
    }
    v.span().contains(&offset).then(|| path.to_string())
}

fn join(prefix: &str, key: &str) -> String {
    if prefix.is_empty() {
        key.to_string()
    } else {
        format!("{prefix}.{key}")
    }
}

// ---------------------------------------------------------------------------------------
// Values (validation pass)

/// A duration with the line it was set on (for errors that compare two settings).
#[derive(Debug, Clone, Copy)]
struct At {
    value: Duration,
    line: usize,
}

/// The settings one table sets, parsed; `None` = not set (or invalid, already reported).
#[derive(Debug, Default)]
struct Overrides {
    threshold: Option<u32>,
    window: Option<Duration>,
    cooldown: Option<Duration>,
    read_preferences: Option<u8>,
    trigger_codes: Option<Vec<i32>>,
    max_time: Option<At>,
    dry_run: Option<bool>,
    causal: Option<Causal>,
    slow_read: Option<At>,
}

impl Overrides {
    fn apply(&self, p: &mut NsPolicy) {
        p.threshold = self.threshold.unwrap_or(p.threshold);
        p.window = self.window.unwrap_or(p.window);
        p.cooldown = self.cooldown.unwrap_or(p.cooldown);
        p.read_preferences = self.read_preferences.unwrap_or(p.read_preferences);
        if let Some(codes) = &self.trigger_codes {
            p.trigger_codes.clone_from(codes);
        }
        p.max_time = self.max_time.map(|a| a.value).or(p.max_time);
        p.dry_run = self.dry_run.unwrap_or(p.dry_run);
        p.causal = self.causal.unwrap_or(p.causal);
        p.slow_read = self.slow_read.map(|a| a.value).or(p.slow_read);
    }
}

fn validate(raw: RawConfig, path: &Path, ctx: &mut Ctx) -> Option<Config> {
    let listen = match &raw.listen {
        Some(v) => {
            check_addr(ctx, v, "listen", true);
            v.get_ref().clone()
        }
        None => DEFAULT_LISTEN.to_string(),
    };
    let upstreams = upstreams(ctx, raw.upstreams.as_ref());
    let max_message_size = max_message_size(ctx, raw.max_message_size.as_ref());
    let connect_timeout = raw
        .connect_timeout
        .as_ref()
        .map_or(Some(Duration::from_secs(5)), |v| {
            duration(ctx, v, "connect_timeout", Duration::from_nanos(1))
        });
    let shutdown_timeout = raw
        .shutdown_timeout
        .as_ref()
        .map_or(Some(Duration::from_secs(10)), |v| {
            duration(ctx, v, "shutdown_timeout", Duration::ZERO)
        });
    let (admin_listen, admin_token) = ops::admin(ctx, raw.admin.as_ref(), &listen);
    let (health_interval, health_timeout) = ops::health(
        ctx,
        raw.health_interval.as_ref(),
        raw.health_timeout.as_ref(),
    );
    let tls = ops::server_tls(ctx, raw.tls.as_ref(), path);
    let upstream_tls = ops::upstream_tls(ctx, raw.upstream_tls.as_ref(), path);
    let defaults = raw
        .defaults
        .as_ref()
        .map_or_else(Overrides::default, |d| read_defaults(ctx, d));
    let policy = policies(ctx, &raw.namespaces, &defaults);
    let fallback_entries = raw.namespaces.iter().any(|e| {
        e.get_ref()
            .mode
            .as_ref()
            .is_some_and(|m| m.get_ref() == Mode::Fallback.as_str())
    });
    let stall = stall::stall(ctx, raw.stall_watch.as_ref(), fallback_entries);
    Some(Config {
        source: path.to_path_buf(),
        listen,
        upstreams,
        max_message_size: max_message_size?,
        connect_timeout: connect_timeout?,
        shutdown_timeout: shutdown_timeout?,
        admin_listen,
        admin_token,
        health_interval: health_interval?,
        health_timeout: health_timeout?,
        tls: tls.ok()?,
        upstream_tls: upstream_tls.ok()?,
        policy: policy?,
        stall: stall.ok()?,
    })
}

/// `host:port` (or a socket address); port 0 only where `listen_side` (bind any port).
fn check_addr(ctx: &mut Ctx, v: &Spanned<String>, key: &str, listen_side: bool) -> bool {
    let s = v.get_ref();
    let port = match s.parse::<SocketAddr>() {
        Ok(a) => Ok(a.port()),
        Err(_) => match s.rsplit_once(':') {
            None => Err("expected `host:port`".to_string()),
            Some(("", _)) => Err("empty host".to_string()),
            Some((host, _)) if host.contains(|c: char| c == ':' || c.is_whitespace()) => Err(
                format!("invalid host `{host}` (write IPv6 as `[addr]:port`)"),
            ),
            Some((_, port)) => port
                .parse::<u16>()
                .map_err(|_| format!("invalid port `{port}` (0..=65535)")),
        },
    };
    let problem = match port {
        Ok(0) if !listen_side => Some("port 0 cannot be connected to".to_string()),
        Ok(_) => None,
        Err(e) => Some(e),
    };
    match problem {
        Some(p) => {
            ctx.err(v, key, format!("`{s}`: {p}"));
            false
        }
        None => true,
    }
}

fn upstreams(ctx: &mut Ctx, v: Option<&Spanned<Vec<Spanned<String>>>>) -> Vec<String> {
    let Some(list) = v else {
        return vec![DEFAULT_UPSTREAM.to_string()];
    };
    if list.get_ref().is_empty() {
        ctx.err(
            list,
            "upstreams",
            "must list at least one mongos `host:port`".into(),
        );
    }
    for (i, u) in list.get_ref().iter().enumerate() {
        check_addr(ctx, u, &format!("upstreams[{i}]"), false);
    }
    list.get_ref().iter().map(|u| u.get_ref().clone()).collect()
}

fn max_message_size(ctx: &mut Ctx, v: Option<&Spanned<i64>>) -> Option<usize> {
    let Some(v) = v else {
        return Some(crate::wire::DEFAULT_MAX_MESSAGE_SIZE);
    };
    match usize::try_from(*v.get_ref()) {
        Ok(n) if (MIN_MESSAGE_SIZE..=MAX_MESSAGE_SIZE_LIMIT).contains(&n) => Some(n),
        _ => {
            let msg = format!(
                "{} is out of range {MIN_MESSAGE_SIZE}..={MAX_MESSAGE_SIZE_LIMIT} bytes",
                v.get_ref()
            );
            ctx.err(v, "max_message_size", msg);
            None
        }
    }
}

/// A humantime duration of at least `min` (`min` of 1ns means "not zero").
fn duration(ctx: &mut Ctx, v: &Spanned<String>, key: &str, min: Duration) -> Option<Duration> {
    match humantime::parse_duration(v.get_ref()) {
        Err(e) => {
            let msg = format!(
                "invalid duration `{}`: {e} (write e.g. \"250ms\", \"10s\", \"2m\")",
                v.get_ref()
            );
            ctx.err(v, key, msg);
            None
        }
        Ok(d) if d < min && min == Duration::from_nanos(1) => {
            ctx.err(v, key, "must be greater than zero".into());
            None
        }
        Ok(d) if d < min => {
            let msg = format!("must be at least {}", humantime::format_duration(min));
            ctx.err(v, key, msg);
            None
        }
        Ok(d) => Some(d),
    }
}

fn read_defaults(ctx: &mut Ctx, d: &Spanned<RawEntry>) -> Overrides {
    let d = d.get_ref();
    for (name, v) in [("pattern", &d.pattern), ("mode", &d.mode)] {
        if let Some(v) = v {
            let msg = "belongs in a [[namespaces]] entry, not in [defaults]".to_string();
            ctx.err(v, &format!("defaults.{name}"), msg);
        }
    }
    let o = read_overrides(ctx, d, "defaults");
    if let (Some(slow), Some(max)) = (o.slow_read, o.max_time) {
        slow_vs_max(ctx, slow, max, "defaults.slow_read");
    }
    o
}

fn slow_vs_max(ctx: &mut Ctx, slow: At, max: At, key: &str) {
    if slow.value >= max.value {
        let line = if key.ends_with("slow_read") {
            slow.line
        } else {
            max.line
        };
        let msg = format!(
            "slow_read {} (line {}) is not below max_time {} (line {}): the read is cut before it counts as slow",
            humantime::format_duration(slow.value),
            slow.line,
            humantime::format_duration(max.value),
            max.line,
        );
        ctx.err_line(line, key, msg);
    }
}

fn read_overrides(ctx: &mut Ctx, e: &RawEntry, prefix: &str) -> Overrides {
    let key = |name: &str| format!("{prefix}.{name}");
    let nonzero = Duration::from_nanos(1);
    let at = |ctx: &mut Ctx, v: &Spanned<String>, k: &str, min| {
        duration(ctx, v, k, min).map(|value| At {
            value,
            line: ctx.line(v.span().start),
        })
    };
    Overrides {
        threshold: e
            .threshold
            .as_ref()
            .and_then(|v| threshold(ctx, v, &key("threshold"))),
        window: e
            .window
            .as_ref()
            .and_then(|v| duration(ctx, v, &key("window"), nonzero)),
        cooldown: e
            .cooldown
            .as_ref()
            .and_then(|v| duration(ctx, v, &key("cooldown"), nonzero)),
        read_preferences: e
            .read_preferences
            .as_ref()
            .and_then(|v| read_preferences(ctx, v, &key("read_preferences"))),
        trigger_codes: e
            .trigger_codes
            .as_ref()
            .and_then(|v| trigger_codes(ctx, v, &key("trigger_codes"))),
        max_time: e.max_time.as_ref().and_then(|v| {
            let m = at(ctx, v, &key("max_time"), Duration::from_millis(1))?;
            if m.value.as_millis() > i32::MAX as u128 {
                ctx.err(v, &key("max_time"), "must be at most 2147483647ms".into());
                return None;
            }
            Some(m)
        }),
        dry_run: e.dry_run.as_ref().map(|v| *v.get_ref()),
        causal: e.causal.as_ref().and_then(|v| {
            let c = Causal::parse(v.get_ref());
            if c.is_none() {
                let msg = format!("unknown value `{}`; expected `drop` or `skip`", v.get_ref());
                ctx.err(v, &key("causal"), msg);
            }
            c
        }),
        slow_read: e
            .slow_read
            .as_ref()
            .and_then(|v| at(ctx, v, &key("slow_read"), nonzero)),
    }
}

fn threshold(ctx: &mut Ctx, v: &Spanned<i64>, key: &str) -> Option<u32> {
    match u32::try_from(*v.get_ref()) {
        Ok(n) if n >= 1 => Some(n),
        _ => {
            let msg = format!("{} is out of range 1..={}", v.get_ref(), u32::MAX);
            ctx.err(v, key, msg);
            None
        }
    }
}

fn read_preferences(ctx: &mut Ctx, v: &Spanned<Vec<Spanned<String>>>, key: &str) -> Option<u8> {
    if v.get_ref().is_empty() {
        ctx.err(
            v,
            key,
            "must not be empty (no read would ever be eligible)".into(),
        );
        return None;
    }
    let mut bits = 0u8;
    let mut ok = true;
    for (i, name) in v.get_ref().iter().enumerate() {
        let k = format!("{key}[{i}]");
        match ReadPrefMode::parse(name.get_ref()) {
            Some(ReadPrefMode::Primary) => {
                let msg =
                    "`primary` reads are never eligible, so this can never take effect".to_string();
                ctx.err(name, &k, msg);
                ok = false;
            }
            Some(m) => bits |= m.bit(),
            None => {
                let names: Vec<&str> = ReadPrefMode::ALL.iter().map(|m| m.as_str()).collect();
                let msg = format!(
                    "unknown read preference `{}`; expected one of {}",
                    name.get_ref(),
                    names.join(", ")
                );
                ctx.err(name, &k, msg);
                ok = false;
            }
        }
    }
    ok.then_some(bits)
}

fn trigger_codes(ctx: &mut Ctx, v: &Spanned<Vec<Spanned<i64>>>, key: &str) -> Option<Vec<i32>> {
    if v.get_ref().is_empty() {
        ctx.err(
            v,
            key,
            "must not be empty (the breaker could never open)".into(),
        );
        return None;
    }
    let mut codes = Vec::with_capacity(v.get_ref().len());
    for (i, c) in v.get_ref().iter().enumerate() {
        match i32::try_from(*c.get_ref()) {
            Ok(n) if n > 0 => codes.push(n),
            _ => {
                let msg = format!(
                    "{} can never match: server error codes are positive 32-bit integers",
                    c.get_ref()
                );
                ctx.err(c, &format!("{key}[{i}]"), msg);
            }
        }
    }
    (codes.len() == v.get_ref().len()).then_some(codes)
}

/// Every `[[namespaces]]` entry; `None` when any is invalid (errors already recorded).
fn policies(
    ctx: &mut Ctx,
    entries: &[Spanned<RawEntry>],
    defaults: &Overrides,
) -> Option<PolicyTable> {
    let mut items: Vec<(Pattern, NsPolicy, usize)> = Vec::with_capacity(entries.len());
    let mut first_seen: HashMap<Pattern, (usize, usize)> = HashMap::new();
    let mut ok = true;
    for (i, e) in entries.iter().enumerate() {
        let Some((pat, policy, line)) = entry(ctx, i, e, defaults) else {
            ok = false;
            continue;
        };
        if let Some(&(j, first_line)) = first_seen.get(&pat) {
            let msg = format!(
                "`{}` is also the pattern of namespaces[{j}] at line {first_line}; \
                 two entries cannot govern the same namespaces equally",
                policy.pattern
            );
            ctx.err_line(line, &format!("namespaces[{i}].pattern"), msg);
            ok = false;
            continue;
        }
        first_seen.insert(pat.clone(), (i, line));
        items.push((pat, policy, line));
    }
    ok.then(|| PolicyTable::build(items))
}

/// One entry: (pattern, effective policy, line of `pattern`).
fn entry(
    ctx: &mut Ctx,
    i: usize,
    e: &Spanned<RawEntry>,
    defaults: &Overrides,
) -> Option<(Pattern, NsPolicy, usize)> {
    let prefix = format!("namespaces[{i}]");
    let entry_line = ctx.line(e.span().start);
    let raw = e.get_ref();
    let pattern = match &raw.pattern {
        None => {
            let msg = "missing; every [[namespaces]] entry needs a pattern".to_string();
            ctx.err_line(entry_line, &format!("{prefix}.pattern"), msg);
            None
        }
        Some(p) => match Pattern::parse(p.get_ref()) {
            Ok(pat) => Some((pat, p.get_ref().clone(), ctx.line(p.span().start))),
            Err(msg) => {
                ctx.err(p, &format!("{prefix}.pattern"), msg);
                None
            }
        },
    };
    let mode = entry_mode(ctx, raw, &prefix, entry_line);
    let overrides = read_overrides(ctx, raw, &prefix);
    let mode = mode?;
    unreachable_settings(ctx, raw, mode, &prefix);
    if mode != Mode::Passthrough && (overrides.slow_read.is_some() || overrides.max_time.is_some())
    {
        if let (Some(slow), Some(max)) = (
            overrides.slow_read.or(defaults.slow_read),
            overrides.max_time.or(defaults.max_time),
        ) {
            let name = if overrides.slow_read.is_some() {
                "slow_read"
            } else {
                "max_time"
            };
            slow_vs_max(ctx, slow, max, &format!("{prefix}.{name}"));
        }
    }
    let (pat, text, line) = pattern?;
    let mut policy = NsPolicy::with_defaults(&text, mode);
    defaults.apply(&mut policy);
    overrides.apply(&mut policy);
    Some((pat, policy, line))
}

fn entry_mode(ctx: &mut Ctx, raw: &RawEntry, prefix: &str, entry_line: usize) -> Option<Mode> {
    let key = format!("{prefix}.mode");
    match &raw.mode {
        None => {
            let msg = "missing; expected `fallback`, `strict` or `passthrough`".to_string();
            ctx.err_line(entry_line, &key, msg);
            None
        }
        Some(m) => {
            let mode = Mode::parse(m.get_ref());
            if mode.is_none() {
                let msg = format!(
                    "unknown mode `{}`; expected `fallback`, `strict` or `passthrough`",
                    m.get_ref()
                );
                ctx.err(m, &key, msg);
            }
            mode
        }
    }
}

/// Settings an entry's mode can never use.
fn unreachable_settings(ctx: &mut Ctx, raw: &RawEntry, mode: Mode, prefix: &str) {
    match mode {
        Mode::Passthrough => {
            for (name, offset) in raw.settings_set() {
                let line = ctx.line(offset);
                let msg =
                    "has no effect: mode is passthrough, reads are forwarded untouched".to_string();
                ctx.err_line(line, &format!("{prefix}.{name}"), msg);
            }
        }
        Mode::Strict => {
            if let Some(c) = &raw.causal {
                let msg = "has no effect: strict entries never rewrite reads".to_string();
                ctx.err(c, &format!("{prefix}.causal"), msg);
            }
        }
        Mode::Fallback => {}
    }
}

// ---------------------------------------------------------------------------------------
// Human-readable views (`staleguard check-config`)

fn fmt_duration(d: Duration) -> String {
    humantime::format_duration(d).to_string()
}

fn fmt_opt(d: Option<Duration>) -> String {
    d.map_or_else(|| "-".to_string(), fmt_duration)
}

/// The names of a read-preference bit set, comma-separated.
pub fn read_pref_names(bits: u8) -> String {
    ReadPrefMode::ALL
        .iter()
        .filter(|m| bits & m.bit() != 0)
        .map(|m| m.as_str())
        .collect::<Vec<_>>()
        .join(",")
}

/// The effective settings of one policy as table cells (settings are `-` for passthrough).
fn policy_cells(p: &NsPolicy) -> Vec<String> {
    let mut cells = vec![p.pattern.clone(), p.mode.as_str().to_string()];
    if p.mode == Mode::Passthrough {
        cells.extend(std::iter::repeat_n("-".to_string(), 9));
        return cells;
    }
    let codes: Vec<String> = p.trigger_codes.iter().map(|c| c.to_string()).collect();
    cells.extend([
        p.threshold.to_string(),
        fmt_duration(p.window),
        fmt_duration(p.cooldown),
        read_pref_names(p.read_preferences),
        codes.join(","),
        fmt_opt(p.max_time),
        fmt_opt(p.slow_read),
        p.dry_run.to_string(),
        if p.mode == Mode::Strict {
            "-"
        } else {
            p.causal.as_str()
        }
        .to_string(),
    ]);
    cells
}

/// Every top-level setting and every entry in effective form, as aligned text.
pub fn render_table(config: &Config) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "config            {}", config.source.display());
    let _ = writeln!(out, "listen            {}", config.listen);
    let admin = config.admin_listen.as_deref().unwrap_or("-");
    let _ = writeln!(out, "admin.listen      {admin}");
    let token = if config.admin_token.is_some() {
        "set"
    } else {
        "-"
    };
    let _ = writeln!(out, "admin.token       {token}");
    let _ = writeln!(out, "upstreams         {}", config.upstreams.join(", "));
    let _ = writeln!(out, "max_message_size  {}", config.max_message_size);
    let _ = writeln!(
        out,
        "connect_timeout   {}",
        fmt_duration(config.connect_timeout)
    );
    let _ = writeln!(
        out,
        "shutdown_timeout  {}",
        fmt_duration(config.shutdown_timeout)
    );
    let health = config.health_interval.map_or_else(
        || "off".to_string(),
        |every| {
            format!(
                "every {}, timeout {}",
                fmt_duration(every),
                fmt_duration(config.health_timeout)
            )
        },
    );
    let _ = writeln!(out, "health            {health}");
    let tls = config.tls.as_ref().map_or_else(
        || "-".to_string(),
        |t| {
            let mtls = t
                .client_ca
                .as_ref()
                .map_or(String::new(), |ca| format!(", client_ca {}", ca.display()));
            format!("cert {}{mtls}", t.cert.display())
        },
    );
    let _ = writeln!(out, "tls               {tls}");
    let up = config.upstream_tls.as_ref().map_or_else(
        || "-".to_string(),
        |t| match (&t.ca, t.insecure_skip_verify) {
            (_, true) => "on, certificate NOT verified (insecure_skip_verify)".to_string(),
            (Some(ca), false) => format!("on, ca {}", ca.display()),
            (None, false) => "on".to_string(),
        },
    );
    let _ = writeln!(out, "upstream_tls      {up}");
    let _ = writeln!(out, "stall_watch       {}", stall::describe(&config.stall));
    out.push('\n');
    let t = &config.policy;
    if t.entries().is_empty() {
        out.push_str("no [[namespaces]] entries: every read passes through untouched\n");
        return out;
    }
    let header = [
        "#",
        "line",
        "pattern",
        "mode",
        "threshold",
        "window",
        "cooldown",
        "read_preferences",
        "trigger_codes",
        "max_time",
        "slow_read",
        "dry_run",
        "causal",
    ];
    let mut rows = vec![header.iter().map(|h| h.to_string()).collect::<Vec<_>>()];
    for (i, p) in t.entries().iter().enumerate() {
        let mut row = vec![i.to_string(), t.line(i).to_string()];
        row.extend(policy_cells(p));
        rows.push(row);
    }
    let widths: Vec<usize> = (0..header.len())
        .map(|c| rows.iter().map(|r| r[c].len()).max().unwrap_or(0))
        .collect();
    for row in rows {
        let cells: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(cell, w)| format!("{cell:<w$}"))
            .collect();
        let _ = writeln!(out, "{}", cells.join("  ").trim_end());
    }
    out
}

fn why(pat: &Pattern) -> String {
    match pat {
        Pattern::Exact { .. } => "exact namespace: the most specific kind of pattern".to_string(),
        Pattern::Prefix { db, prefix } => format!(
            "longest collection prefix `{prefix}*` in `{db}` (no exact entry for this namespace)"
        ),
        Pattern::Db(db) => {
            format!("whole database `{db}.*` (no exact or collection-prefix entry matches)")
        }
        Pattern::All => "catch-all `*` (no entry names this database)".to_string(),
    }
}

fn effect(p: &NsPolicy) -> String {
    let when = format!(
        "after {} trigger errors within {}, for {}",
        p.threshold,
        fmt_duration(p.window),
        fmt_duration(p.cooldown)
    );
    let text = match p.mode {
        Mode::Passthrough => return "reads are forwarded untouched".to_string(),
        Mode::Fallback => format!(
            "eligible reads failing with a trigger error are retried with readConcern \
             available; {when} reads are rewritten before they are sent"
        ),
        Mode::Strict => format!(
            "{when} eligible reads fail fast; reads asking for readConcern available are refused"
        ),
    };
    if p.dry_run {
        format!("{text} (dry_run: only logged and counted)")
    } else {
        text
    }
}

/// Which entry governs `ns` (`db.coll`) and why, or that it is unlisted.
pub fn explain(config: &Config, ns: &str) -> String {
    let Some((db, coll)) = ns
        .split_once('.')
        .filter(|(d, c)| !d.is_empty() && !c.is_empty())
    else {
        return format!("`{ns}` is not a namespace: expected `db.coll`\n");
    };
    let t = &config.policy;
    let Some(i) = t.find(db, coll) else {
        return format!(
            "{ns}: unlisted: passthrough (no pattern matches; reads are forwarded untouched)\n"
        );
    };
    let p = &t.entries()[i];
    let mut out = format!(
        "{ns}: matches namespaces[{i}] `{}` (line {}): {}\n",
        p.pattern,
        t.line(i),
        p.mode.as_str()
    );
    let _ = writeln!(out, "  why: {}", why(&t.pattern(i)));
    let mut others: Vec<usize> = (0..t.entries().len())
        .filter(|&j| j != i && t.pattern(j).matches(db, coll))
        .collect();
    others.sort_by(|a, b| t.pattern(*b).rank().cmp(&t.pattern(*a).rank()));
    for j in others {
        let o = &t.entries()[j];
        let _ = writeln!(
            out,
            "  also matches, less specific: namespaces[{j}] `{}` (line {}): {}",
            o.pattern,
            t.line(j),
            o.mode.as_str()
        );
    }
    let _ = writeln!(out, "  effect: {}", effect(p));
    if p.mode != Mode::Passthrough {
        let cells = policy_cells(p);
        let names = [
            "threshold",
            "window",
            "cooldown",
            "read_preferences",
            "trigger_codes",
            "max_time",
            "slow_read",
            "dry_run",
            "causal",
        ];
        for (name, value) in names.iter().zip(&cells[2..]) {
            let _ = writeln!(out, "  {name:<17}{value}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_offsets_to_lines() {
        let ctx = Ctx {
            file: String::new(),
            line_starts: line_starts("ab\n\ncd\n"),
            errors: Vec::new(),
        };
        assert_eq!([0, 2, 3, 4, 6, 7].map(|o| ctx.line(o)), [1, 1, 2, 3, 3, 4]);
    }

    #[test]
    fn key_paths_from_offsets() {
        let text = "a = 1\n[t]\nb = [1, 2]\n[[n]]\nc = 'x'\n[[n]]\nd = 'y'\n";
        let doc = toml::de::DeTable::parse(text).unwrap();
        let at = |needle: &str| key_at(doc.get_ref(), text.find(needle).unwrap(), "");
        assert_eq!(at("a =").as_deref(), Some("a"));
        assert_eq!(at("b =").as_deref(), Some("t.b"));
        assert_eq!(at("2]").as_deref(), Some("t.b[1]"));
        assert_eq!(at("c =").as_deref(), Some("n[0].c"));
        assert_eq!(at("'y'").as_deref(), Some("n[1].d"));
    }
}
