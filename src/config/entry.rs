//! One `[[namespaces]]` entry (or `[defaults]`) as written (`RawEntry`), and its settings
//! read and checked one by one (`Overrides`); `namespaces` combines them into policies and
//! checks the settings against each other and the entry's mode.

use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;

use super::scalars::duration;
use super::spans::Ctx;
use super::values::{count, ladder, read_preferences, threshold, trigger_codes, Ladder};
use crate::policy::{Causal, NsPolicy, OnOpen, MAX_MIN_CONNECTIONS, MAX_PER_CONNECTION};

/// One `[[namespaces]]` entry, or `[defaults]` (where `pattern` and `mode` are refused).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawEntry {
    pub(super) pattern: Option<Spanned<String>>,
    pub(super) mode: Option<Spanned<String>>,
    pub(super) threshold: Option<Spanned<i64>>,
    pub(super) window: Option<Spanned<String>>,
    pub(super) cooldown: Option<Spanned<String>>,
    pub(super) read_preferences: Option<Spanned<Vec<Spanned<String>>>>,
    pub(super) trigger_codes: Option<Spanned<Vec<Spanned<i64>>>>,
    pub(super) max_time: Option<Spanned<String>>,
    pub(super) dry_run: Option<Spanned<bool>>,
    pub(super) causal: Option<Spanned<String>>,
    pub(super) slow_read: Option<Spanned<String>>,
    pub(super) min_cooldown: Option<Spanned<String>>,
    pub(super) attempt_share: Option<Spanned<f64>>,
    pub(super) attempt_limit: Option<Spanned<String>>,
    pub(super) ladder: Option<Spanned<Vec<Spanned<String>>>>,
    pub(super) min_wait: Option<Spanned<String>>,
    pub(super) min_connections: Option<Spanned<i64>>,
    pub(super) per_connection: Option<Spanned<i64>>,
    pub(super) on_open: Option<Spanned<String>>,
    pub(super) open_time_limit: Option<Spanned<String>>,
    pub(super) close_after: Option<Spanned<i64>>,
    pub(super) confirm_time: Option<Spanned<String>>,
}

impl RawEntry {
    /// The breaker/rewrite settings present in this entry: (name, byte offset).
    pub(super) fn settings_set(&self) -> Vec<(&'static str, usize)> {
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
            ("min_cooldown", at(&self.min_cooldown)),
            ("attempt_share", at(&self.attempt_share)),
            ("attempt_limit", at(&self.attempt_limit)),
            ("ladder", at(&self.ladder)),
            ("min_wait", at(&self.min_wait)),
            ("min_connections", at(&self.min_connections)),
            ("per_connection", at(&self.per_connection)),
            ("on_open", at(&self.on_open)),
            ("open_time_limit", at(&self.open_time_limit)),
            ("close_after", at(&self.close_after)),
            ("confirm_time", at(&self.confirm_time)),
        ]
        .into_iter()
        .filter_map(|(k, o)| o.map(|o| (k, o)))
        .collect()
    }
}

/// A duration with the line it was set on (for errors that compare two settings).
#[derive(Debug, Clone, Copy)]
pub(super) struct At {
    pub(super) value: Duration,
    pub(super) line: usize,
}

/// The settings one table sets, parsed; `None` = not set (or invalid, already reported).
#[derive(Debug, Default)]
pub(super) struct Overrides {
    pub(super) threshold: Option<u32>,
    pub(super) window: Option<Duration>,
    pub(super) cooldown: Option<Duration>,
    pub(super) read_preferences: Option<u8>,
    pub(super) trigger_codes: Option<Vec<i32>>,
    pub(super) max_time: Option<At>,
    pub(super) dry_run: Option<bool>,
    pub(super) causal: Option<Causal>,
    pub(super) slow_read: Option<At>,
    pub(super) min_cooldown: Option<At>,
    pub(super) attempt_share: Option<f64>,
    /// `Some(None)`: `"off"`.
    pub(super) attempt_limit: Option<Option<Duration>>,
    /// `ladder` has `primary`, with the line it was set on and its rungs as written.
    pub(super) ladder: Option<Ladder>,
    pub(super) min_wait: Option<Duration>,
    pub(super) min_connections: Option<u32>,
    pub(super) per_connection: Option<u32>,
    pub(super) on_open: Option<OnOpen>,
    pub(super) open_time_limit: Option<Duration>,
    pub(super) close_after: Option<u32>,
    pub(super) confirm_time: Option<Duration>,
}

impl Overrides {
    pub(super) fn apply(&self, p: &mut NsPolicy) {
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
        p.min_cooldown = self.min_cooldown.map_or(p.min_cooldown, |a| a.value);
        p.attempt_share = self.attempt_share.unwrap_or(p.attempt_share);
        p.attempt_limit = self.attempt_limit.unwrap_or(p.attempt_limit);
        if let Some(l) = &self.ladder {
            p.primary_rung = l.primary;
        }
        p.min_wait = self.min_wait.unwrap_or(p.min_wait);
        p.min_connections = self.min_connections.unwrap_or(p.min_connections);
        p.per_connection = self.per_connection.unwrap_or(p.per_connection);
        p.on_open = self.on_open.unwrap_or(p.on_open);
        p.open_time_limit = self.open_time_limit.unwrap_or(p.open_time_limit);
        p.close_after = self.close_after.unwrap_or(p.close_after);
        p.confirm_time = self.confirm_time.unwrap_or(p.confirm_time);
    }
}

pub(super) fn read_overrides(ctx: &mut Ctx, e: &RawEntry, prefix: &str) -> Overrides {
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
        min_cooldown: e
            .min_cooldown
            .as_ref()
            .and_then(|v| at(ctx, v, &key("min_cooldown"), nonzero)),
        attempt_share: e.attempt_share.as_ref().and_then(|v| {
            let x = *v.get_ref();
            if x > 0.0 && x <= 1.0 {
                Some(x)
            } else {
                let msg = format!(
                    "{x} is out of range: the first attempt's share of the budget is above 0 and at most 1"
                );
                ctx.err(v, &key("attempt_share"), msg);
                None
            }
        }),
        attempt_limit: e.attempt_limit.as_ref().and_then(|v| {
            if v.get_ref() == "off" {
                return Some(None);
            }
            let d = duration(ctx, v, &key("attempt_limit"), Duration::from_millis(1))?;
            if d.as_millis() > i32::MAX as u128 {
                ctx.err(v, &key("attempt_limit"), "must be at most 2147483647ms".into());
                return None;
            }
            Some(Some(d))
        }),
        ladder: e
            .ladder
            .as_ref()
            .and_then(|v| ladder(ctx, v, &key("ladder"))),
        min_wait: e
            .min_wait
            .as_ref()
            .and_then(|v| duration(ctx, v, &key("min_wait"), Duration::ZERO)),
        min_connections: e
            .min_connections
            .as_ref()
            .and_then(|v| count(ctx, v, &key("min_connections"), MAX_MIN_CONNECTIONS)),
        per_connection: e
            .per_connection
            .as_ref()
            .and_then(|v| count(ctx, v, &key("per_connection"), MAX_PER_CONNECTION)),
        on_open: e.on_open.as_ref().and_then(|v| {
            let o = OnOpen::parse(v.get_ref());
            if o.is_none() {
                let msg = format!("unknown value `{}`; expected `bound` or `refuse`", v.get_ref());
                ctx.err(v, &key("on_open"), msg);
            }
            o
        }),
        open_time_limit: e
            .open_time_limit
            .as_ref()
            .and_then(|v| bounded_ms(ctx, v, &key("open_time_limit"), i32::MAX as u64)),
        close_after: e
            .close_after
            .as_ref()
            .and_then(|v| count(ctx, v, &key("close_after"), MAX_PER_CONNECTION)),
        confirm_time: e
            .confirm_time
            .as_ref()
            .and_then(|v| bounded_ms(ctx, v, &key("confirm_time"), 60_000)),
    }
}

/// A duration of 1 ms up to `max_ms`.
fn bounded_ms(ctx: &mut Ctx, v: &Spanned<String>, key: &str, max_ms: u64) -> Option<Duration> {
    let d = duration(ctx, v, key, Duration::from_millis(1))?;
    if d.as_millis() > max_ms as u128 {
        ctx.err(v, key, format!("must be at most {max_ms}ms"));
        return None;
    }
    Some(d)
}
