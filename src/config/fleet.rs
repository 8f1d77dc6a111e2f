//! `[fleet]`: instances that share incident state through Redis (see `fleet`). Optional:
//! without the section nothing changes and no Redis code runs.
//!
//! The URL is checked here (scheme `redis://` or `rediss://`, a host, a database number),
//! without connecting. The password comes from the URL or from the variable `password_env`
//! names, never both; it is kept in a [`Secret`] and the URL is shown with it masked.
//! `[ladder_guard] fleet_max_per_second` and `fleet_max_in_flight` are read here too (they
//! need `[fleet]`).

use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;

use super::scalars::duration;
use super::spans::Ctx;
use super::Secret;

/// Default `[fleet] prefix`.
pub const DEFAULT_FLEET_PREFIX: &str = "staleguard";
/// Default `[fleet] connect_timeout`.
pub const DEFAULT_FLEET_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// Default `[fleet] timeout`.
pub const DEFAULT_FLEET_TIMEOUT: Duration = Duration::from_millis(500);
/// Default `[fleet] budget_timeout`.
pub const DEFAULT_FLEET_BUDGET_TIMEOUT: Duration = Duration::from_millis(20);
/// Default `[fleet] lease`.
pub const DEFAULT_FLEET_LEASE: Duration = Duration::from_secs(3);

/// `[fleet]`, validated. Needs a restart to change (a reload keeps the running values and
/// says so).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FleetConfig {
    /// `redis`: the URL, password included when the URL carries one. Required.
    pub url: Secret,
    /// The URL with its password masked, for logs and `check-config`.
    pub shown: String,
    /// The value of the variable `password_env` names, when set.
    pub password: Option<Secret>,
    /// `name`: this instance's id in the fleet. Default: `listen` (host:port).
    pub name: String,
    /// `prefix`: the first part of every key and channel, so that several fleets can share
    /// one Redis. Default `staleguard`.
    pub prefix: String,
    /// `connect_timeout`: time one connection to Redis (TLS included) may take. Default 1s.
    pub connect_timeout: Duration,
    /// `timeout`: time any other Redis call may take; past it the link counts as down.
    /// Default 500ms; the link is also checked (PING) this often.
    pub timeout: Duration,
    /// `budget_timeout`: time the fleet budget's call on a primary-rung read may take; past
    /// it the read is judged by the local guard alone. Default 20ms.
    pub budget_timeout: Duration,
    /// `lease`: how long an opening's key and an in-flight slot outlive an instance that
    /// stopped renewing them (renewed every third of it). Default 3s.
    pub lease: Duration,
    /// `[ladder_guard] fleet_max_per_second`: primary-rung reads the whole fleet may start
    /// per second. Default none (each instance's `max_per_second` only). Reloads.
    pub max_per_second: Option<u32>,
    /// `[ladder_guard] fleet_max_in_flight`: primary-rung reads the whole fleet may have in
    /// flight. Default none (each instance's `max_in_flight` only). Reloads.
    pub max_in_flight: Option<u32>,
}

impl FleetConfig {
    /// A reload: `[fleet]` itself needs a restart, so `new` gets `old`'s section back, with
    /// the new budgets (which reload). Returns the warning when something was put back.
    pub fn keep_on_reload(
        old: &Option<FleetConfig>,
        new: &mut Option<FleetConfig>,
    ) -> Option<String> {
        let budgets = |f: &FleetConfig| (f.max_per_second, f.max_in_flight);
        let link = |f: &Option<FleetConfig>| {
            f.clone().map(|mut f| {
                (f.max_per_second, f.max_in_flight) = (None, None);
                f
            })
        };
        if link(old) == link(new) {
            return None;
        }
        let shown = |f: &Option<FleetConfig>| {
            f.as_ref()
                .map_or("off".to_string(), |f| format!("{} as {}", f.shown, f.name))
        };
        let warning = format!(
            "fleet: changed to `{}` in the file; needs a restart, still `{}`",
            shown(new),
            shown(old)
        );
        let kept = new.as_ref().map(budgets);
        *new = old.clone();
        if let (Some(f), Some((rate, slots))) = (new.as_mut(), kept) {
            (f.max_per_second, f.max_in_flight) = (rate, slots);
        }
        Some(warning)
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawFleet {
    redis: Option<Spanned<String>>,
    password_env: Option<Spanned<String>>,
    name: Option<Spanned<String>>,
    prefix: Option<Spanned<String>>,
    connect_timeout: Option<Spanned<String>>,
    timeout: Option<Spanned<String>>,
    budget_timeout: Option<Spanned<String>>,
    lease: Option<Spanned<String>>,
}

/// The longest `name` and `prefix`: they travel in every message and key.
const MAX_NAME: usize = 128;

/// `[fleet]`: `Ok(None)` without the section, `Err` when an error was reported.
pub(super) fn fleet(
    ctx: &mut Ctx,
    v: Option<&Spanned<RawFleet>>,
    listen: &str,
    budgets: [Option<&Spanned<i64>>; 2],
) -> Result<Option<FleetConfig>, ()> {
    let [per_second, in_flight] = budgets;
    let max_per_second = budget(ctx, per_second, "fleet_max_per_second", v.is_some());
    let max_in_flight = budget(ctx, in_flight, "fleet_max_in_flight", v.is_some());
    let Some(v) = v else {
        return max_per_second.and(max_in_flight).map(|_| None);
    };
    let raw = v.get_ref();
    let before = ctx.errors.len();
    let url = match &raw.redis {
        Some(u) => check_url(ctx, u),
        None => {
            ctx.err(
                v,
                "fleet.redis",
                "missing: `redis = \"redis://host:port/0\"`".into(),
            );
            None
        }
    };
    let password = raw.password_env.as_ref().and_then(|var| env(ctx, var));
    if let (Some((_, true)), Some(var)) = (&url, &raw.password_env) {
        let msg = "the URL carries a password already: set it in one place".to_string();
        ctx.err(var, "fleet.password_env", msg);
    }
    let name = word(ctx, raw.name.as_ref(), "fleet.name", listen);
    let prefix = word(
        ctx,
        raw.prefix.as_ref(),
        "fleet.prefix",
        DEFAULT_FLEET_PREFIX,
    );
    let nonzero = Duration::from_millis(1);
    let mut time = |v: &Option<Spanned<String>>, key: &str, default: Duration| match v {
        None => Some(default),
        Some(v) => duration(ctx, v, key, nonzero),
    };
    let connect_timeout = time(
        &raw.connect_timeout,
        "fleet.connect_timeout",
        DEFAULT_FLEET_CONNECT_TIMEOUT,
    );
    let timeout = time(&raw.timeout, "fleet.timeout", DEFAULT_FLEET_TIMEOUT);
    let budget_timeout = time(
        &raw.budget_timeout,
        "fleet.budget_timeout",
        DEFAULT_FLEET_BUDGET_TIMEOUT,
    );
    let lease = time(&raw.lease, "fleet.lease", DEFAULT_FLEET_LEASE);
    if let (Some(l), Some(t), Some(raw_lease)) = (lease, timeout, &raw.lease) {
        if l < t * 3 {
            let msg = format!(
                "must be at least 3 x timeout ({}): it is renewed every third of it",
                humantime::format_duration(t * 3)
            );
            ctx.err(raw_lease, "fleet.lease", msg);
        }
    }
    if ctx.errors.len() > before {
        return Err(());
    }
    let ((url, _), shown) = match url {
        Some(u) => {
            let shown = masked(&u.0);
            (u, shown)
        }
        None => return Err(()),
    };
    Ok(Some(FleetConfig {
        url: Secret::new(url),
        shown,
        password,
        name: name.ok_or(())?,
        prefix: prefix.ok_or(())?,
        connect_timeout: connect_timeout.ok_or(())?,
        timeout: timeout.ok_or(())?,
        budget_timeout: budget_timeout.ok_or(())?,
        lease: lease.ok_or(())?,
        max_per_second: max_per_second?,
        max_in_flight: max_in_flight?,
    }))
}

/// The URL, and whether it carries a password.
fn check_url(ctx: &mut Ctx, v: &Spanned<String>) -> Option<(String, bool)> {
    let s = v.get_ref();
    let problem = match url_parts(s) {
        Err(p) => Some(p),
        Ok(with_password) => match redis::Client::open(s.as_str()) {
            Ok(_) => return Some((s.clone(), with_password)),
            Err(_) => Some("not a URL the Redis client accepts".to_string()),
        },
    };
    let msg = format!(
        "`{}`: {} (write `redis://host:port/db` or `rediss://host:port/db`)",
        masked(s),
        problem.unwrap_or_default()
    );
    ctx.err(v, "fleet.redis", msg);
    None
}

/// Checks the scheme and the host; says whether the URL carries a password.
fn url_parts(s: &str) -> Result<bool, String> {
    let rest = s
        .strip_prefix("redis://")
        .or_else(|| s.strip_prefix("rediss://"))
        .ok_or_else(|| "the scheme must be redis:// or rediss://".to_string())?;
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    let (userinfo, host) = match authority.rsplit_once('@') {
        Some((u, h)) => (Some(u), h),
        None => (None, authority),
    };
    if host.is_empty() || host.starts_with(':') {
        return Err("no host".to_string());
    }
    Ok(userinfo.is_some_and(|u| u.split_once(':').is_some_and(|(_, p)| !p.is_empty())))
}

/// `s` with the password of its userinfo (if any) replaced by `***`.
pub fn masked(s: &str) -> String {
    let Some((scheme, rest)) = s.split_once("://") else {
        return s.to_string();
    };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => {
            let user = userinfo.split_once(':').map_or(userinfo, |(u, _)| u);
            let shown = if userinfo.contains(':') {
                format!("{user}:***")
            } else {
                user.to_string()
            };
            format!("{scheme}://{shown}@{host}{tail}")
        }
        None => s.to_string(),
    }
}

fn env(ctx: &mut Ctx, var: &Spanned<String>) -> Option<Secret> {
    match std::env::var(var.get_ref()) {
        Ok(p) if !p.is_empty() => Some(Secret::new(p)),
        Ok(_) => {
            let msg = format!("environment variable `{}` is empty", var.get_ref());
            ctx.err(var, "fleet.password_env", msg);
            None
        }
        Err(_) => {
            let msg = format!("environment variable `{}` is not set", var.get_ref());
            ctx.err(var, "fleet.password_env", msg);
            None
        }
    }
}

/// `name` or `prefix`: printable ASCII without spaces, at most [`MAX_NAME`] bytes.
fn word(ctx: &mut Ctx, v: Option<&Spanned<String>>, key: &str, default: &str) -> Option<String> {
    let Some(v) = v else {
        return Some(default.to_string());
    };
    let s = v.get_ref();
    let printable = s.bytes().all(|b| b.is_ascii_graphic());
    if s.is_empty() || s.len() > MAX_NAME || !printable {
        let msg = format!("must be 1 to {MAX_NAME} printable ASCII characters without spaces");
        ctx.err(v, key, msg);
        return None;
    }
    Some(s.clone())
}

/// `[ladder_guard] fleet_max_per_second` and `fleet_max_in_flight`: each at least 1, and only
/// with `[fleet]`.
fn budget(
    ctx: &mut Ctx,
    value: Option<&Spanned<i64>>,
    name: &str,
    fleet: bool,
) -> Result<Option<u32>, ()> {
    let Some(value) = value else { return Ok(None) };
    let key = format!("ladder_guard.{name}");
    if !fleet {
        ctx.err(value, &key, "has no effect without [fleet]".to_string());
        return Err(());
    }
    match u32::try_from(*value.get_ref()) {
        Ok(n) if n >= 1 => Ok(Some(n)),
        _ => {
            let msg = format!("{} is out of range 1..={}", value.get_ref(), u32::MAX);
            ctx.err(value, &key, msg);
            Err(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use std::path::Path;

    fn parse(text: &str) -> Result<Config, Vec<String>> {
        Config::parse(text, Path::new("f.toml"))
            .map_err(|e| e.into_iter().map(|e| e.to_string()).collect())
    }

    #[test]
    fn without_the_section_nothing() {
        assert_eq!(parse("").expect("valid").fleet, None);
        let e = parse(
            "[ladder_guard]\nfleet_max_per_second = 5\n[[namespaces]]\npattern = \"a.b\"\nmode = \"strict\"\nladder = [\"primary\"]\n",
        )
        .unwrap_err();
        assert_eq!(
            e,
            ["f.toml:2: ladder_guard.fleet_max_per_second: has no effect without [fleet]"]
        );
    }

    #[test]
    fn defaults_and_masking() {
        let c =
            parse("listen = \"10.0.0.1:27018\"\n[fleet]\nredis = \"rediss://:s3cret@r:6380/2\"\n")
                .expect("valid");
        let f = c.fleet.expect("fleet");
        assert_eq!(f.name, "10.0.0.1:27018");
        assert_eq!(f.shown, "rediss://:***@r:6380/2");
        assert!(!format!("{f:?}").contains("s3cret"));
        assert_eq!(f.prefix, DEFAULT_FLEET_PREFIX);
        assert_eq!(f.timeout, DEFAULT_FLEET_TIMEOUT);
        assert_eq!((f.max_per_second, f.max_in_flight), (None, None));
    }

    #[test]
    fn errors_name_file_line_and_key() {
        let e = parse(
            "[fleet]\nredis = \"http://r:1\"\nname = \"a b\"\ntimeout = \"1s\"\nlease = \"2s\"\n",
        )
        .unwrap_err();
        assert_eq!(e.len(), 3, "{e:?}");
        assert!(
            e[0].starts_with("f.toml:2: fleet.redis: `http://r:1`: the scheme"),
            "{e:?}"
        );
        assert!(e[1].starts_with("f.toml:3: fleet.name: must be"), "{e:?}");
        assert!(
            e[2].starts_with("f.toml:5: fleet.lease: must be at least 3 x timeout"),
            "{e:?}"
        );
        let e = parse(
            "[fleet]\nredis = \"redis://:pw@r:1/0\"\npassword_env = \"SG_FLEET_TEST_UNSET_VAR\"\n",
        )
        .unwrap_err();
        assert_eq!(e.len(), 2, "{e:?}");
        assert!(
            e.iter()
                .all(|e| e.starts_with("f.toml:3: fleet.password_env")),
            "{e:?}"
        );
        assert!(!e.concat().contains("pw@"), "{e:?}");
        let e = parse("[fleet]\nname = \"x\"\n").unwrap_err();
        assert_eq!(
            e,
            ["f.toml:1: fleet.redis: missing: `redis = \"redis://host:port/0\"`"]
        );
    }

    #[test]
    fn passwords_are_masked_and_detected() {
        assert_eq!(masked("redis://h:6379/0"), "redis://h:6379/0");
        assert_eq!(masked("redis://:pw@h:6379/0"), "redis://:***@h:6379/0");
        assert_eq!(masked("rediss://u:p@w@h:1/2"), "rediss://u:***@h:1/2");
        assert_eq!(url_parts("redis://:pw@h:6379/0"), Ok(true));
        assert_eq!(url_parts("redis://user@h:6379/0"), Ok(false));
        assert_eq!(url_parts("redis://h"), Ok(false));
        assert!(url_parts("http://h").is_err());
        assert!(url_parts("redis://:1/0").is_err());
        assert!(url_parts("redis:///0").is_err());
    }
}
