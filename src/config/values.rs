//! The value checkers of `[[namespaces]]` entries with a shape of their own: counts,
//! `threshold`, `ladder`, `read_preferences`, `trigger_codes`. Each reports a bad value with
//! its file, line and key and returns `None`.

use toml::Spanned;

use super::spans::Ctx;
use crate::command::ReadPrefMode;
use crate::policy::Mode;

/// A `ladder` as written: which rungs, where.
#[derive(Debug, Clone)]
pub(super) struct Ladder {
    pub(super) primary: bool,
    pub(super) available: bool,
    /// `available` comes last (or is absent).
    pub(super) ordered: bool,
    pub(super) line: usize,
}

/// A count in `1..=max`.
pub(super) fn count(ctx: &mut Ctx, v: &Spanned<i64>, key: &str, max: u32) -> Option<u32> {
    match u32::try_from(*v.get_ref()) {
        Ok(n) if (1..=max).contains(&n) => Some(n),
        _ => {
            let msg = format!("{} is out of range 1..={max}", v.get_ref());
            ctx.err(v, key, msg);
            None
        }
    }
}

pub(super) fn ladder(
    ctx: &mut Ctx,
    v: &Spanned<Vec<Spanned<String>>>,
    key: &str,
) -> Option<Ladder> {
    let mut l = Ladder {
        primary: false,
        available: false,
        ordered: true,
        line: ctx.line(v.span().start),
    };
    let mut ok = true;
    for (i, rung) in v.get_ref().iter().enumerate() {
        let k = format!("{key}[{i}]");
        let seen = match rung.get_ref().as_str() {
            "primary" => {
                if l.available {
                    l.ordered = false;
                }
                std::mem::replace(&mut l.primary, true)
            }
            "available" => std::mem::replace(&mut l.available, true),
            other => {
                let msg = format!("unknown rung `{other}`; expected `primary` or `available`");
                ctx.err(rung, &k, msg);
                ok = false;
                continue;
            }
        };
        if seen {
            let msg = format!("`{}` appears twice", rung.get_ref());
            ctx.err(rung, &k, msg);
            ok = false;
        }
    }
    ok.then_some(l)
}

/// The effective ladder of an entry against its mode: `available` never on strict, always
/// last on fallback.
pub(super) fn check_ladder(ctx: &mut Ctx, l: &Ladder, mode: Mode, key: &str) {
    let msg = match mode {
        Mode::Strict if l.available => {
            "`available` is never used on a strict namespace (it may return orphans); \
             strict ladders are [] or [\"primary\"]"
        }
        Mode::Fallback if !l.available || !l.ordered => {
            "a fallback ladder ends with `available`: [\"available\"] or [\"primary\", \"available\"]"
        }
        _ => return,
    };
    ctx.err_line(l.line, key, msg.to_string());
}

pub(super) fn threshold(ctx: &mut Ctx, v: &Spanned<i64>, key: &str) -> Option<u32> {
    match u32::try_from(*v.get_ref()) {
        Ok(n) if n >= 1 => Some(n),
        _ => {
            let msg = format!("{} is out of range 1..={}", v.get_ref(), u32::MAX);
            ctx.err(v, key, msg);
            None
        }
    }
}

pub(super) fn read_preferences(
    ctx: &mut Ctx,
    v: &Spanned<Vec<Spanned<String>>>,
    key: &str,
) -> Option<u8> {
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

pub(super) fn trigger_codes(
    ctx: &mut Ctx,
    v: &Spanned<Vec<Spanned<i64>>>,
    key: &str,
) -> Option<Vec<i32>> {
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
