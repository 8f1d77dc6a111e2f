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

use toml::Spanned;

use super::entry::{read_overrides, At, Overrides, RawEntry};
use super::spans::Ctx;
use super::values::check_ladder;
use crate::policy::{Mode, NsPolicy, Pattern, PolicyTable};

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
