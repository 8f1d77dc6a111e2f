//! The scalar checkers every section shares: humantime durations (bounded by
//! [`MAX_DURATION`]) and `host:port` addresses. Each reports a bad value with its file, line
//! and key and returns `None` (or `false`). Kept apart from parse.rs, which imports the
//! section files, so that the section files import nothing that imports them.

use std::net::SocketAddr;
use std::time::Duration;

use toml::Spanned;

use super::spans::Ctx;

/// The longest duration any setting accepts: deadlines are computed as `Instant + d`, which
/// must not overflow, and nothing the proxy waits for needs longer.
pub const MAX_DURATION: Duration = Duration::from_secs(24 * 60 * 60);

/// A humantime duration of at least `min` (`min` of 1ns means "not zero") and at most
/// [`MAX_DURATION`].
pub(super) fn duration(
    ctx: &mut Ctx,
    v: &Spanned<String>,
    key: &str,
    min: Duration,
) -> Option<Duration> {
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
        Ok(d) if d > MAX_DURATION => {
            let msg = format!(
                "`{}` is longer than the largest accepted duration, {}",
                v.get_ref(),
                humantime::format_duration(MAX_DURATION)
            );
            ctx.err(v, key, msg);
            None
        }
        Ok(d) => Some(d),
    }
}

/// `host:port` (or a socket address); port 0 only where `listen_side` (bind any port).
pub(super) fn check_addr(ctx: &mut Ctx, v: &Spanned<String>, key: &str, listen_side: bool) -> bool {
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
