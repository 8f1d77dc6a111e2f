//! `[stall_watch.probe]`: an upsert through each upstream every `interval`, timed.

use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;

use super::credentials::{credentials, RawCreds};
use super::{ProbeConfig, DEFAULT_PROBE_ID, DEFAULT_PROBE_INTERVAL, DEFAULT_PROBE_NS};
use super::{DEFAULT_PROBE_SLOW, DEFAULT_PROBE_TIMEOUT, NONZERO};
use crate::config::scalars::duration;
use crate::config::spans::Ctx;
use crate::policy::DB_FORBIDDEN;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawProbe {
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

/// `[stall_watch.probe]`; `None` when invalid (errors recorded).
pub(super) fn probe(ctx: &mut Ctx, table: &Spanned<RawProbe>) -> Option<ProbeConfig> {
    let p = table.get_ref();
    let key = |k: &str| format!("stall_watch.probe.{k}");
    let (interval, slow, timeout) = timing(ctx, table);
    let ns = namespace(ctx, p);
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

/// `interval`, `slow` and `timeout`: each valid alone, and a timeout no longer than the
/// interval with `slow` below it.
fn timing(
    ctx: &mut Ctx,
    table: &Spanned<RawProbe>,
) -> (Option<Duration>, Option<Duration>, Option<Duration>) {
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
    (interval, slow, timeout)
}

/// `namespace`: `db.collection`, default `ops_probe.probe`.
fn namespace(ctx: &mut Ctx, p: &RawProbe) -> Option<(String, String)> {
    let key = |k: &str| format!("stall_watch.probe.{k}");
    match &p.namespace {
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
    }
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
