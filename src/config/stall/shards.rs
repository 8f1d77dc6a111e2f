//! `[stall_watch.shards]`: the article's composite rule from each shard primary's
//! `serverStatus` (tickets, queued writers, write-op rate against its baseline).

use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;

use super::credentials::{credentials, RawCreds};
use super::{ShardsConfig, DEFAULT_BASELINE, DEFAULT_FOR, DEFAULT_POLL, NONZERO};
use super::{DEFAULT_QUEUED_WRITERS_MIN, DEFAULT_RATE_RATIO, DEFAULT_TICKETS_AVAILABLE_MAX};
use crate::config::scalars::duration;
use crate::config::spans::Ctx;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawShards {
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

/// `[stall_watch.shards]`; `None` when invalid (errors recorded).
pub(super) fn shards(ctx: &mut Ctx, table: &Spanned<RawShards>) -> Option<ShardsConfig> {
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
    let (poll, hold_for) = timing(ctx, s);
    let (tickets, queued, rate_ratio) = thresholds(ctx, s);
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

/// `poll` and `for`, each valid alone, and `for` no shorter than `poll`.
fn timing(ctx: &mut Ctx, s: &RawShards) -> (Option<Duration>, Option<Duration>) {
    let key = |k: &str| format!("stall_watch.shards.{k}");
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
    (poll, hold_for)
}

/// `tickets_available_max`, `queued_writers_min`, `rate_ratio`.
fn thresholds(ctx: &mut Ctx, s: &RawShards) -> (Option<i64>, Option<i64>, Option<f64>) {
    let key = |k: &str| format!("stall_watch.shards.{k}");
    let tickets = non_negative(
        ctx,
        &s.tickets_available_max,
        &key("tickets_available_max"),
        DEFAULT_TICKETS_AVAILABLE_MAX,
    );
    let queued = non_negative(
        ctx,
        &s.queued_writers_min,
        &key("queued_writers_min"),
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
    (tickets, queued, rate_ratio)
}

/// An optional count, zero or more; `default` when not set.
fn non_negative(ctx: &mut Ctx, v: &Option<Spanned<i64>>, key: &str, default: i64) -> Option<i64> {
    match v {
        None => Some(default),
        Some(v) if *v.get_ref() >= 0 => Some(*v.get_ref()),
        Some(v) => {
            let msg = format!("{} must be zero or more", v.get_ref());
            ctx.err(v, key, msg);
            None
        }
    }
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
