//! The operations sections of the config: `[admin]`, `[tls]`, `[upstream_tls]` and the
//! health-check durations. TLS files are read and the rustls configs built here, so a
//! missing or unusable file is an error that names its key and line.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;

use super::scalars::{check_addr, duration};
use super::spans::{Ctx, Recorded};
use super::ConfirmConfig;
use crate::tls::{ServerTls, TlsError, UpstreamTls};

/// Default `[admin] listen`: loopback only.
pub const DEFAULT_ADMIN_LISTEN: &str = "127.0.0.1:9187";
/// Default `health_interval`.
pub const DEFAULT_HEALTH_INTERVAL: Duration = Duration::from_secs(5);
/// Default `health_timeout`.
pub const DEFAULT_HEALTH_TIMEOUT: Duration = Duration::from_secs(2);

/// Default `[admin] header_read_timeout`.
pub const DEFAULT_ADMIN_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(5);
/// Default `[admin] request_timeout`.
pub const DEFAULT_ADMIN_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Default `[admin] max_connections`: the kubelet's probes, a Prometheus or two and a few
/// browsers need a handful.
pub const DEFAULT_ADMIN_MAX_CONNECTIONS: usize = 64;
/// Default `[admin] max_connections_per_peer`: a quarter of the cap, so that one address
/// (a browser, a scraper, a misbehaving client) leaves the others room.
pub const DEFAULT_ADMIN_MAX_CONNECTIONS_PER_PEER: usize = 16;
/// Admin connections past either cap that may wait at once in the health lane for their
/// request head (`admin::lane`): `/healthz` and `/readyz` are answered there.
pub const ADMIN_HEALTH_LANE: usize = 16;
/// Default `[admin] history_interval`: 180 buckets of 10 s, the last 30 minutes.
pub const DEFAULT_HISTORY_INTERVAL: Duration = Duration::from_secs(10);

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawAdmin {
    listen: Option<Spanned<String>>,
    token: Option<Spanned<String>>,
    token_file: Option<Spanned<String>>,
    token_env: Option<Spanned<String>>,
    enabled: Option<Spanned<bool>>,
    header_read_timeout: Option<Spanned<String>>,
    request_timeout: Option<Spanned<String>>,
    max_connections: Option<Spanned<i64>>,
    max_connections_per_peer: Option<Spanned<i64>>,
    history_interval: Option<Spanned<String>>,
}

/// `[admin]` as validated.
pub(super) struct Admin {
    pub(super) listen: Option<String>,
    pub(super) token: Option<String>,
    pub(super) limits: Option<super::AdminLimits>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTls {
    cert: Option<Spanned<String>>,
    key: Option<Spanned<String>>,
    client_ca: Option<Spanned<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawUpstreamTls {
    ca: Option<Spanned<String>>,
    server_name: Option<Spanned<String>>,
    cert: Option<Spanned<String>>,
    key: Option<Spanned<String>>,
    insecure_skip_verify: Option<Spanned<bool>>,
}

/// `[admin]`: listen, token (from the file, a file or the environment), limits.
pub(super) fn admin(
    ctx: &mut Ctx,
    raw: Option<&Spanned<RawAdmin>>,
    listen: &str,
    config: &Path,
) -> Admin {
    let Some(raw) = raw else {
        return Admin {
            listen: Some(DEFAULT_ADMIN_LISTEN.to_string()),
            token: None,
            limits: Some(super::AdminLimits::default()),
        };
    };
    let a = raw.get_ref();
    let enabled = a.enabled.as_ref().is_none_or(|e| *e.get_ref());
    let limits = admin_limits(ctx, a);
    if !enabled {
        let set = [
            ("listen", &a.listen),
            ("token", &a.token),
            ("token_file", &a.token_file),
            ("token_env", &a.token_env),
            ("header_read_timeout", &a.header_read_timeout),
            ("request_timeout", &a.request_timeout),
        ];
        for (name, v) in set {
            if let Some(v) = v {
                let msg = "has no effect: [admin] enabled = false".to_string();
                ctx.err(v, &format!("admin.{name}"), msg);
            }
        }
        for (name, v) in [
            ("max_connections", &a.max_connections),
            ("max_connections_per_peer", &a.max_connections_per_peer),
        ] {
            if let Some(v) = v {
                let msg = "has no effect: [admin] enabled = false".to_string();
                ctx.err(v, &format!("admin.{name}"), msg);
            }
        }
        return Admin {
            listen: None,
            token: None,
            limits,
        };
    }
    let addr = match &a.listen {
        Some(v) => {
            // Port 0 binds a free port on each side, so equal text does not clash.
            let any_port = listen.ends_with(":0");
            if check_addr(ctx, v, "admin.listen", true) && v.get_ref() == listen && !any_port {
                let msg = format!("`{listen}` is also `listen`; use another port");
                ctx.err(v, "admin.listen", msg);
            }
            v.get_ref().clone()
        }
        None => DEFAULT_ADMIN_LISTEN.to_string(),
    };
    Admin {
        listen: Some(addr),
        token: token(ctx, a, config),
        limits,
    }
}

/// The admin token: `token` itself, the content of `token_file` (trailing whitespace
/// dropped, as a Secret mounted as a file or written with `echo` has a newline), or the
/// value of the environment variable `token_env`; at most one of the three.
fn token(ctx: &mut Ctx, a: &RawAdmin, config: &Path) -> Option<String> {
    let given: Vec<(&str, &Spanned<String>)> = [
        ("token", &a.token),
        ("token_file", &a.token_file),
        ("token_env", &a.token_env),
    ]
    .into_iter()
    .filter_map(|(k, v)| v.as_ref().map(|v| (k, v)))
    .collect();
    if let [_, (key, second), ..] = given.as_slice() {
        let msg = "set one of token, token_file and token_env, not several".to_string();
        ctx.err(*second, &format!("admin.{key}"), msg);
        return None;
    }
    let (key, v) = given.first()?;
    let value = match *key {
        "token_file" => {
            let path = resolve(config, v.get_ref());
            match std::fs::read_to_string(&path) {
                Ok(t) => t.trim_end().to_string(),
                Err(e) => {
                    let msg = format!("cannot read {}: {e}", path.display());
                    ctx.err(*v, "admin.token_file", msg);
                    return None;
                }
            }
        }
        "token_env" => match std::env::var(v.get_ref()) {
            Ok(t) => t,
            Err(e) => {
                let msg = format!("environment variable `{}`: {e}", v.get_ref());
                ctx.err(*v, "admin.token_env", msg);
                return None;
            }
        },
        _ => v.get_ref().clone(),
    };
    if value.is_empty() || !value.bytes().all(|b| b.is_ascii_graphic()) {
        let msg = "the token must be non-empty printable ASCII without spaces (it is sent as `Authorization: Bearer TOKEN`)".to_string();
        ctx.err(*v, &format!("admin.{key}"), msg);
        return None;
    }
    Some(value)
}

/// `[admin] header_read_timeout`, `request_timeout`, `max_connections`,
/// `max_connections_per_peer`.
fn admin_limits(ctx: &mut Ctx, a: &RawAdmin) -> Option<super::AdminLimits> {
    let d = super::AdminLimits::default();
    let nonzero = Duration::from_nanos(1);
    let header = a
        .header_read_timeout
        .as_ref()
        .map_or(Some(d.header_read_timeout), |v| {
            duration(ctx, v, "admin.header_read_timeout", nonzero)
        });
    let request = a
        .request_timeout
        .as_ref()
        .map_or(Some(d.request_timeout), |v| {
            duration(ctx, v, "admin.request_timeout", nonzero)
        });
    let mut count = |v: &Option<Spanned<i64>>, key: &str, default: usize| match v {
        None => Some(default),
        Some(v) => match usize::try_from(*v.get_ref()) {
            Ok(n) if (1..=65_536).contains(&n) => Some(n),
            _ => {
                let msg = format!("{} is out of range 1..=65536", v.get_ref());
                ctx.err(v, key, msg);
                None
            }
        },
    };
    let max = count(
        &a.max_connections,
        "admin.max_connections",
        d.max_connections,
    );
    let per_peer = count(
        &a.max_connections_per_peer,
        "admin.max_connections_per_peer",
        d.max_connections_per_peer,
    );
    let history = a
        .history_interval
        .as_ref()
        .map_or(Some(d.history_interval), |v| {
            let d = duration(ctx, v, "admin.history_interval", Duration::from_secs(1))?;
            if d > Duration::from_secs(60) {
                ctx.err(v, "admin.history_interval", "must be at most 60s".into());
                return None;
            }
            Some(d)
        });
    Some(super::AdminLimits {
        header_read_timeout: header?,
        request_timeout: request?,
        max_connections: max?,
        max_connections_per_peer: per_peer?,
        history_interval: history?,
    })
}

/// `health_interval` (`"off"` disables the checks), `health_timeout`: the timeout must fit
/// in the interval.
pub(super) fn health(
    ctx: &mut Ctx,
    interval: Option<&Spanned<String>>,
    timeout: Option<&Spanned<String>>,
) -> (Option<Option<Duration>>, Option<Duration>) {
    let nonzero = Duration::from_nanos(1);
    let i = match interval {
        None => Some(Some(DEFAULT_HEALTH_INTERVAL)),
        Some(v) if v.get_ref() == "off" => Some(None),
        Some(v) => duration(ctx, v, "health_interval", nonzero).map(Some),
    };
    let t = timeout.map_or(Some(DEFAULT_HEALTH_TIMEOUT), |v| {
        duration(ctx, v, "health_timeout", nonzero)
    });
    if let (Some(Some(iv)), Some(tv)) = (i, t) {
        if tv > iv {
            let msg = format!(
                "health_timeout {} is longer than health_interval {}: checks would overlap",
                humantime::format_duration(tv),
                humantime::format_duration(iv)
            );
            match (timeout, interval) {
                (Some(at), _) => ctx.err(at, "health_timeout", msg),
                (None, Some(at)) => ctx.err(at, "health_interval", msg),
                (None, None) => {}
            }
        }
    }
    (i, t)
}

/// A file path from the config: relative paths are relative to the config file's folder.
fn resolve(config: &Path, p: &str) -> PathBuf {
    let p = Path::new(p);
    if p.is_absolute() {
        return p.to_path_buf();
    }
    match config.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.join(p),
        _ => p.to_path_buf(),
    }
}

/// Reports a TLS error at the line of the setting it names (or of the table).
fn tls_err<T>(
    ctx: &mut Ctx,
    table: &str,
    table_at: &Spanned<T>,
    at: Option<&Spanned<String>>,
    e: TlsError,
) {
    let key = format!("{table}.{}", e.key);
    match at {
        Some(v) => ctx.err(v, &key, e.message),
        None => ctx.err(table_at, &key, e.message),
    }
}

/// `[tls]`: the client-facing acceptor. `Err(Recorded)` when invalid.
pub(super) fn server_tls(
    ctx: &mut Ctx,
    raw: Option<&Spanned<RawTls>>,
    config: &Path,
) -> Result<Option<ServerTls>, Recorded> {
    let Some(table) = raw else { return Ok(None) };
    let t = table.get_ref();
    let mut missing = false;
    for (name, v) in [("cert", &t.cert), ("key", &t.key)] {
        if v.is_none() {
            let msg = "missing; [tls] needs both cert and key (PEM files)".to_string();
            ctx.err(table, &format!("tls.{name}"), msg);
            missing = true;
        }
    }
    let (Some(cert), Some(key), false) = (&t.cert, &t.key, missing) else {
        return Err(Recorded);
    };
    let ca = t.client_ca.as_ref().map(|v| resolve(config, v.get_ref()));
    match ServerTls::new(
        &resolve(config, cert.get_ref()),
        &resolve(config, key.get_ref()),
        ca.as_deref(),
    ) {
        Ok(tls) => Ok(Some(tls)),
        Err(e) => {
            let at = match e.key {
                "cert" => Some(cert),
                "key" => Some(key),
                _ => t.client_ca.as_ref(),
            };
            tls_err(ctx, "tls", table, at, e);
            Err(Recorded)
        }
    }
}

/// `[upstream_tls]`: the upstream connector. `Err(Recorded)` when invalid.
pub(super) fn upstream_tls(
    ctx: &mut Ctx,
    raw: Option<&Spanned<RawUpstreamTls>>,
    config: &Path,
) -> Result<Option<UpstreamTls>, Recorded> {
    let Some(table) = raw else { return Ok(None) };
    let t = table.get_ref();
    let insecure = t
        .insecure_skip_verify
        .as_ref()
        .is_some_and(|v| *v.get_ref());
    if insecure {
        if let Some(ca) = &t.ca {
            let msg =
                "has no effect: insecure_skip_verify = true accepts any certificate".to_string();
            ctx.err(ca, "upstream_tls.ca", msg);
            return Err(Recorded);
        }
    }
    let client = match (&t.cert, &t.key) {
        (Some(c), Some(k)) => Some((resolve(config, c.get_ref()), resolve(config, k.get_ref()))),
        (None, None) => None,
        (Some(c), None) => {
            let msg = "is set without `key`: a client certificate needs both".to_string();
            ctx.err(c, "upstream_tls.cert", msg);
            return Err(Recorded);
        }
        (None, Some(k)) => {
            let msg = "is set without `cert`: a client certificate needs both".to_string();
            ctx.err(k, "upstream_tls.key", msg);
            return Err(Recorded);
        }
    };
    let ca = t.ca.as_ref().map(|v| resolve(config, v.get_ref()));
    match UpstreamTls::new(
        ca.as_deref(),
        t.server_name.as_ref().map(|s| s.get_ref().as_str()),
        client.as_ref().map(|(c, k)| (c.as_path(), k.as_path())),
        insecure,
    ) {
        Ok(tls) => Ok(Some(tls)),
        Err(e) => {
            let at = match e.key {
                "ca" => t.ca.as_ref(),
                "server_name" => t.server_name.as_ref(),
                "cert" => t.cert.as_ref(),
                _ => t.key.as_ref(),
            };
            tls_err(ctx, "upstream_tls", table, at, e);
            Err(Recorded)
        }
    }
}

/// `[confirm]`: the login of staleguard's own connections for confirming reads.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawConfirm {
    username: Option<Spanned<String>>,
    password: Option<Spanned<String>>,
    password_env: Option<Spanned<String>>,
    auth_source: Option<Spanned<String>>,
    own_questions: Option<Spanned<bool>>,
}

/// `[confirm]`; `None` when invalid (errors recorded).
pub(super) fn confirm(ctx: &mut Ctx, v: Option<&Spanned<RawConfirm>>) -> Option<ConfirmConfig> {
    let Some(table) = v else {
        return Some(ConfirmConfig::default());
    };
    let c = table.get_ref();
    let raw = super::stall::credentials::RawCreds {
        username: c.username.as_ref(),
        password: c.password.as_ref(),
        password_env: c.password_env.as_ref(),
        auth_source: c.auth_source.as_ref(),
    };
    let credentials = super::stall::credentials::credentials(ctx, &raw, table, "confirm").ok()?;
    let own_questions = c.own_questions.as_ref().is_none_or(|b| *b.get_ref());
    Some(ConfirmConfig {
        credentials,
        own_questions,
    })
}
