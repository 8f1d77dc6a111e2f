//! `[defaults]` and `[[namespaces]]`: each entry's pattern, mode and settings checked and
//! resolved (built-in defaults, then `[defaults]`, then the entry) into the policy table.
//!
//! Besides malformed values, settings an entry's mode can never use are errors: any
//! breaker/rewrite setting on `passthrough`, `causal` on `strict`, `slow_read` not below
//! `max_time`, `min_cooldown` above `cooldown`, `primary` in `read_preferences`, a trigger
//! code <= 0, two entries with one pattern, `available` in a strict entry's `ladder` (or a
//! fallback ladder that does not end with it), `attempt_share`/`attempt_limit` on a strict
//! entry without a primary rung.

use std::collections::HashMap;
use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;

use super::parse::duration;
use super::spans::Ctx;
use super::values::{
    check_ladder, count, ladder, read_preferences, threshold, trigger_codes, Ladder,
};
use crate::policy::{
    Causal, Mode, NsPolicy, OnOpen, Pattern, PolicyTable, MAX_MIN_CONNECTIONS, MAX_PER_CONNECTION,
};

/// One `[[namespaces]]` entry, or `[defaults]` (where `pattern` and `mode` are refused).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawEntry {
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
    min_cooldown: Option<Spanned<String>>,
    attempt_share: Option<Spanned<f64>>,
    attempt_limit: Option<Spanned<String>>,
    ladder: Option<Spanned<Vec<Spanned<String>>>>,
    min_wait: Option<Spanned<String>>,
    min_connections: Option<Spanned<i64>>,
    per_connection: Option<Spanned<i64>>,
    on_open: Option<Spanned<String>>,
    open_time_limit: Option<Spanned<String>>,
    close_after: Option<Spanned<i64>>,
    confirm_time: Option<Spanned<String>>,
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

/// The policy table of `[defaults]` and every `[[namespaces]]` entry; `None` when anything
/// is invalid (errors already recorded).
pub(super) fn table(
    ctx: &mut Ctx,
    defaults: Option<&Spanned<RawEntry>>,
    entries: &[Spanned<RawEntry>],
) -> Option<PolicyTable> {
    let defaults = defaults.map_or_else(Overrides::default, |d| read_defaults(ctx, d));
    policies(ctx, entries, &defaults)
}

/// Some entry asks for mode fallback (whether or not it is otherwise valid).
pub(super) fn any_fallback(entries: &[Spanned<RawEntry>]) -> bool {
    entries.iter().any(|e| {
        e.get_ref()
            .mode
            .as_ref()
            .is_some_and(|m| m.get_ref() == Mode::Fallback.as_str())
    })
}

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
    min_cooldown: Option<At>,
    attempt_share: Option<f64>,
    /// `Some(None)`: `"off"`.
    attempt_limit: Option<Option<Duration>>,
    /// `ladder` has `primary`, with the line it was set on and its rungs as written.
    ladder: Option<Ladder>,
    min_wait: Option<Duration>,
    min_connections: Option<u32>,
    per_connection: Option<u32>,
    on_open: Option<OnOpen>,
    open_time_limit: Option<Duration>,
    close_after: Option<u32>,
    confirm_time: Option<Duration>,
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
    if let Some(min) = o.min_cooldown {
        let cooldown = o
            .cooldown
            .unwrap_or(NsPolicy::with_defaults("*", Mode::Strict).cooldown);
        if min.value > cooldown {
            let msg = format!(
                "min_cooldown {} is above cooldown {}: the first cooldown cannot be longer than the longest",
                humantime::format_duration(min.value),
                humantime::format_duration(cooldown),
            );
            ctx.err_line(min.line, "defaults.min_cooldown", msg);
        }
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
    if mode != Mode::Passthrough {
        mode_checks(ctx, raw, &overrides, defaults, mode, &prefix);
    }
    let (pat, text, line) = pattern?;
    let mut policy = NsPolicy::with_defaults(&text, mode);
    defaults.apply(&mut policy);
    overrides.apply(&mut policy);
    Some((pat, policy, line))
}

/// Checks of settings against the entry's mode and each other, wherever they were set.
fn mode_checks(
    ctx: &mut Ctx,
    raw: &RawEntry,
    o: &Overrides,
    defaults: &Overrides,
    mode: Mode,
    prefix: &str,
) {
    let from = |mine: bool, name: &str| {
        if mine {
            format!("{prefix}.{name}")
        } else {
            format!("defaults.{name}")
        }
    };
    if let Some(l) = o.ladder.as_ref().or(defaults.ladder.as_ref()) {
        check_ladder(ctx, l, mode, &from(o.ladder.is_some(), "ladder"));
    }
    let primary = o
        .ladder
        .as_ref()
        .or(defaults.ladder.as_ref())
        .is_some_and(|l| l.primary);
    if mode == Mode::Strict && !primary {
        let set = [
            (
                "attempt_share",
                raw.attempt_share.as_ref().map(|v| v.span().start),
            ),
            (
                "attempt_limit",
                raw.attempt_limit.as_ref().map(|v| v.span().start),
            ),
        ];
        for (name, at) in set {
            if let Some(at) = at {
                let msg = "has no effect: a strict read without `ladder = [\"primary\"]` has no next rung to leave time for".to_string();
                let line = ctx.line(at);
                ctx.err_line(line, &format!("{prefix}.{name}"), msg);
            }
        }
    }
    if o.min_cooldown.is_some() || o.cooldown.is_some() {
        if let Some(min) = o.min_cooldown.or(defaults.min_cooldown) {
            let cooldown = o
                .cooldown
                .or(defaults.cooldown)
                .unwrap_or(NsPolicy::with_defaults("*", mode).cooldown);
            if min.value > cooldown {
                let msg = format!(
                    "min_cooldown {} (line {}) is above cooldown {}: the first cooldown cannot be longer than the longest",
                    humantime::format_duration(min.value),
                    min.line,
                    humantime::format_duration(cooldown),
                );
                ctx.err_line(
                    min.line,
                    &from(o.min_cooldown.is_some(), "min_cooldown"),
                    msg,
                );
            }
        }
    }
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
        Mode::Fallback => {
            for (name, v) in [
                ("on_open", at(&raw.on_open)),
                ("open_time_limit", at(&raw.open_time_limit)),
            ] {
                if let Some(offset) = v {
                    let line = ctx.line(offset);
                    let msg = "has no effect: an open breaker sends fallback reads with readConcern available".to_string();
                    ctx.err_line(line, &format!("{prefix}.{name}"), msg);
                }
            }
        }
    }
}

fn at<T>(v: &Option<Spanned<T>>) -> Option<usize> {
    v.as_ref().map(|s| s.span().start)
}
