//! The two passes from TOML text to a `Config`: serde checks the shape (`RawConfig`), then
//! `validate` checks every value, collecting all problems with their file:line:key. The
//! top-level settings are checked here; the sections in their own modules.

use std::path::Path;
use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;

use super::entry::RawEntry;
use super::namespaces;
use super::scalars::{check_addr, duration};
use super::spans::Ctx;
use super::{fleet, ops, stall, Config, ConfigError, LadderGuardConfig, Layout, Limits};
use super::{DEFAULT_LISTEN, DEFAULT_UPSTREAM, MAX_MESSAGE_SIZE_LIMIT, MIN_MESSAGE_SIZE};

impl Config {
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
        let mut ctx = Ctx::new(path.display().to_string(), text);
        // Every structural mistake at once (unknown keys, wrong types, missing fields),
        // then the values of everything else.
        let Some(raw) = super::structure::read::<RawConfig>(text, &mut ctx) else {
            ctx.errors.sort_by_key(|e| e.line);
            return Err(ctx.errors);
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
    layout: Option<Spanned<String>>,
    health_interval: Option<Spanned<String>>,
    health_timeout: Option<Spanned<String>>,
    max_connections: Option<Spanned<i64>>,
    max_connections_per_peer: Option<Spanned<i64>>,
    message_timeout: Option<Spanned<String>>,
    first_message_timeout: Option<Spanned<String>>,
    idle_timeout: Option<Spanned<String>>,
    write_timeout: Option<Spanned<String>>,
    max_pending_reads: Option<Spanned<i64>>,
    breaker_share: Option<Spanned<f64>>,
    admin: Option<Spanned<ops::RawAdmin>>,
    tls: Option<Spanned<ops::RawTls>>,
    upstream_tls: Option<Spanned<ops::RawUpstreamTls>>,
    stall_watch: Option<Spanned<stall::RawStall>>,
    ladder_guard: Option<Spanned<RawLadderGuard>>,
    fleet: Option<Spanned<fleet::RawFleet>>,
    confirm: Option<Spanned<ops::RawConfirm>>,
    defaults: Option<Spanned<RawEntry>>,
    #[serde(default)]
    namespaces: Vec<Spanned<RawEntry>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLadderGuard {
    max_in_flight: Option<Spanned<i64>>,
    per_connection: Option<Spanned<i64>>,
    max_per_second: Option<Spanned<i64>>,
    per_connection_per_second: Option<Spanned<i64>>,
    fleet_max_per_second: Option<Spanned<i64>>,
    fleet_max_in_flight: Option<Spanned<i64>>,
}

// ---------------------------------------------------------------------------------------
// Values (validation pass)

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
    let layout = raw.layout.as_ref().map_or(Some(Layout::default()), |v| {
        let layout = [Layout::PerCore, Layout::Shared, Layout::Uring]
            .into_iter()
            .find(|l| l.name() == v.get_ref());
        if layout.is_none() {
            ctx.err(
                v,
                "layout",
                format!(
                    "`{}`: expected \"per-core\", \"shared\" or \"uring\"",
                    v.get_ref()
                ),
            );
        }
        if layout == Some(Layout::Uring) && !cfg!(target_os = "linux") {
            ctx.err(v, "layout", "\"uring\" needs Linux (io_uring)".to_string());
            return None;
        }
        layout
    });
    let admin = ops::admin(ctx, raw.admin.as_ref(), &listen, path);
    let (health_interval, health_timeout) = ops::health(
        ctx,
        raw.health_interval.as_ref(),
        raw.health_timeout.as_ref(),
    );
    let tls = ops::server_tls(ctx, raw.tls.as_ref(), path);
    let upstream_tls = ops::upstream_tls(ctx, raw.upstream_tls.as_ref(), path);
    let policy = namespaces::table(ctx, raw.defaults.as_ref(), &raw.namespaces);
    let fallback_entries = namespaces::any_fallback(&raw.namespaces);
    let stall = stall::stall(ctx, raw.stall_watch.as_ref(), fallback_entries);
    let ladder_guard = ladder_guard(ctx, raw.ladder_guard.as_ref(), policy.as_ref());
    let limits = limits(ctx, &raw);
    let breaker_share = breaker_share(ctx, raw.breaker_share.as_ref());
    let guard = raw.ladder_guard.as_ref().map(|g| g.get_ref());
    let budgets = [
        guard.and_then(|g| g.fleet_max_per_second.as_ref()),
        guard.and_then(|g| g.fleet_max_in_flight.as_ref()),
    ];
    let fleet = fleet::fleet(ctx, raw.fleet.as_ref(), &listen, budgets);
    let confirm = ops::confirm(ctx, raw.confirm.as_ref());
    Some(Config {
        source: path.to_path_buf(),
        listen,
        upstreams,
        max_message_size: max_message_size?,
        connect_timeout: connect_timeout?,
        shutdown_timeout: shutdown_timeout?,
        layout: layout?,
        admin_listen: admin.listen,
        admin_token: admin.token,
        admin_limits: admin.limits?,
        health_interval: health_interval?,
        health_timeout: health_timeout?,
        tls: tls.ok()?,
        upstream_tls: upstream_tls.ok()?,
        policy: policy?,
        stall: stall.ok()?,
        ladder_guard: ladder_guard?,
        limits: limits?,
        breaker_share: breaker_share?,
        fleet: fleet.ok()?,
        confirm: confirm?,
    })
}

/// `breaker_share`: in (0, 1].
fn breaker_share(ctx: &mut Ctx, v: Option<&Spanned<f64>>) -> Option<f64> {
    let Some(v) = v else {
        return Some(super::DEFAULT_BREAKER_SHARE);
    };
    let share = *v.get_ref();
    if share > 0.0 && share <= 1.0 {
        return Some(share);
    }
    let msg = format!("{share} is out of range: above 0, at most 1");
    ctx.err(v, "breaker_share", msg);
    None
}

fn ladder_guard(
    ctx: &mut Ctx,
    v: Option<&Spanned<RawLadderGuard>>,
    policy: Option<&super::PolicyTable>,
) -> Option<LadderGuardConfig> {
    let mut out = LadderGuardConfig::default();
    let Some(v) = v else { return Some(out) };
    let laddered = policy.is_none_or(|t| t.entries().iter().any(|p| p.primary_rung));
    if !laddered {
        let msg =
            "has no effect: no [[namespaces]] entry has a primary rung (`ladder = [\"primary\"]`)";
        ctx.err(v, "ladder_guard", msg.to_string());
    }
    let mut ok = laddered;
    let raw = v.get_ref();
    for (name, value, slot) in [
        ("max_in_flight", &raw.max_in_flight, &mut out.max_in_flight),
        (
            "max_per_second",
            &raw.max_per_second,
            &mut out.max_per_second,
        ),
        (
            "per_connection",
            &raw.per_connection,
            &mut out.per_connection,
        ),
        (
            "per_connection_per_second",
            &raw.per_connection_per_second,
            &mut out.per_connection_per_second,
        ),
    ] {
        let Some(value) = value else { continue };
        match u32::try_from(*value.get_ref()) {
            Ok(n) if n >= 1 => *slot = n,
            _ => {
                let msg = format!("{} is out of range 1..={}", value.get_ref(), u32::MAX);
                ctx.err(value, &format!("ladder_guard.{name}"), msg);
                ok = false;
            }
        }
    }
    match &raw.per_connection_per_second {
        // A tenth of the upstream's rate unless set.
        None => out.per_connection_per_second = (out.max_per_second / 10).max(1),
        Some(v) if ok && out.per_connection_per_second > out.max_per_second => {
            let msg = format!(
                "{} is above max_per_second ({}): it can never take effect",
                out.per_connection_per_second, out.max_per_second
            );
            ctx.err(v, "ladder_guard.per_connection_per_second", msg);
            ok = false;
        }
        Some(_) => {}
    }
    ok.then_some(out)
}

/// `max_connections`, `max_connections_per_peer` (off by default), `message_timeout`,
/// `first_message_timeout`, `idle_timeout` (`"off"` turns it off), `write_timeout`,
/// `max_pending_reads`.
fn limits(ctx: &mut Ctx, raw: &RawConfig) -> Option<Limits> {
    let d = Limits::default();
    let nonzero = Duration::from_nanos(1);
    let max_connections = raw
        .max_connections
        .as_ref()
        .map_or(Some(d.max_connections), |v| {
            count(ctx, v, "max_connections", 1_000_000)
        });
    let message_timeout = raw
        .message_timeout
        .as_ref()
        .map_or(Some(d.message_timeout), |v| {
            duration(ctx, v, "message_timeout", nonzero)
        });
    let max_connections_per_peer = match &raw.max_connections_per_peer {
        None => Some(None),
        Some(v) => count(ctx, v, "max_connections_per_peer", 1_000_000).map(Some),
    };
    let first_message_timeout = raw
        .first_message_timeout
        .as_ref()
        .map_or(Some(d.first_message_timeout), |v| {
            duration(ctx, v, "first_message_timeout", nonzero)
        });
    let idle_timeout = match &raw.idle_timeout {
        None => Some(d.idle_timeout),
        Some(v) if v.get_ref() == "off" => Some(None),
        Some(v) => duration(ctx, v, "idle_timeout", nonzero).map(Some),
    };
    let write_timeout = raw
        .write_timeout
        .as_ref()
        .map_or(Some(d.write_timeout), |v| {
            duration(ctx, v, "write_timeout", nonzero)
        });
    let max_pending_reads = raw
        .max_pending_reads
        .as_ref()
        .map_or(Some(d.max_pending_reads), |v| {
            count(ctx, v, "max_pending_reads", 100_000)
        });
    Some(Limits {
        max_connections: max_connections?,
        message_timeout: message_timeout?,
        first_message_timeout: first_message_timeout?,
        idle_timeout: idle_timeout?,
        max_connections_per_peer: max_connections_per_peer?,
        write_timeout: write_timeout?,
        max_pending_reads: max_pending_reads?,
    })
}

/// A count in `1..=max`.
fn count(ctx: &mut Ctx, v: &Spanned<i64>, key: &str, max: usize) -> Option<usize> {
    match usize::try_from(*v.get_ref()) {
        Ok(n) if (1..=max).contains(&n) => Some(n),
        _ => {
            let msg = format!("{} is out of range 1..={max}", v.get_ref());
            ctx.err(v, key, msg);
            None
        }
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
