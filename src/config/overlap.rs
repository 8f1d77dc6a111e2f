//! Warnings (the config is valid; `check-config` prints them and exits 0, `run` logs them)
//! about fallback and passthrough patterns that govern names a strict pattern also
//! matches. The most specific pattern wins (exact > longest prefix > `db.*` > `*`), so
//! `pay.t*` fallback beside `pay.*` strict relaxes `pay.transactions`: its reads are
//! retried and rewritten with `available` instead of failing fast. That may be on purpose
//! (an exception carved out of a strict database), or a pattern written too wide; either
//! way it is said.
//!
//! Exactly when: some name is matched by a strict pattern and governed by a non-strict one.
//! A name a non-strict pattern governs is matched by every less specific pattern that
//! overlaps it (a more specific pattern's names are a subset of any less specific one it
//! meets), so a pattern warns when it governs at least one name (found among a few
//! candidates: patterns more specific still may shadow part of it) and a strict pattern
//! less specific than it matches that name.

use super::{Config, ConfigError};
use crate::policy::{Mode, Pattern, PolicyTable};

impl Config {
    /// Everything valid but worth a second look (see `config/overlap.rs`), in file order.
    pub fn warnings(&self) -> Vec<ConfigError> {
        relaxed_strict(&self.policy)
            .into_iter()
            .map(|(line, key, message)| ConfigError {
                file: self.source.display().to_string(),
                line,
                key,
                message,
            })
            .collect()
    }
}

/// (line, key, message) of each non-strict pattern governing a name a strict one matches.
fn relaxed_strict(t: &PolicyTable) -> Vec<(usize, String, String)> {
    let mut out = Vec::new();
    for (n, policy) in t.entries().iter().enumerate() {
        if policy.mode == Mode::Strict {
            continue;
        }
        let Some((db, coll, strict)) = governed(t, n)
            .into_iter()
            .find_map(|(db, coll)| strict_match(t, &db, &coll).map(|s| (db, coll, s)))
        else {
            continue;
        };
        let s = &t.entries()[strict];
        let what = match policy.mode {
            Mode::Passthrough => "forwarded untouched",
            _ => "retried and rewritten with readConcern available",
        };
        let message = format!(
            "`{}` ({}) governs names that the strict `{}` (line {}) also matches, e.g. \
             `{db}.{coll}`: the most specific pattern wins, so their reads are {what}, \
             never failed fast; narrow `{}` if that is not meant",
            policy.pattern,
            policy.mode.as_str(),
            s.pattern,
            t.line(strict),
            policy.pattern,
        );
        out.push((t.line(n), format!("namespaces[{n}].pattern"), message));
    }
    out
}

/// A few names entry `n` governs (none when every candidate is shadowed by a more specific
/// pattern).
fn governed(t: &PolicyTable, n: usize) -> Vec<(String, String)> {
    const TAILS: [&str; 6] = ["x", "", "_", "0", "coll", "zz_9"];
    let candidates: Vec<(String, String)> = match t.pattern(n) {
        Pattern::Exact { db, coll } => vec![(db.clone(), coll.clone())],
        Pattern::Prefix { db, prefix } => TAILS
            .iter()
            .map(|tail| (db.clone(), format!("{prefix}{tail}")))
            .collect(),
        Pattern::Db(db) => TAILS
            .iter()
            .map(|tail| (db.clone(), tail.to_string()))
            .collect(),
        // The least specific pattern: no strict pattern is less specific than it.
        Pattern::All => Vec::new(),
    };
    candidates
        .into_iter()
        .filter(|(db, coll)| !coll.is_empty() && t.find(db, coll) == Some(n))
        .collect()
}

/// The most specific strict pattern matching `db.coll`.
fn strict_match(t: &PolicyTable, db: &str, coll: &str) -> Option<usize> {
    (0..t.entries().len())
        .filter(|&i| t.entries()[i].mode == Mode::Strict && t.pattern(i).matches(db, coll))
        .max_by_key(|&i| t.pattern(i).rank())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::NsPolicy;

    fn warned(entries: &[(&str, Mode)]) -> Vec<String> {
        let policies = entries
            .iter()
            .map(|(p, m)| NsPolicy::with_defaults(p, *m))
            .collect();
        let t = PolicyTable::from_policies(policies).expect("table");
        relaxed_strict(&t)
            .into_iter()
            .map(|(_, key, msg)| format!("{key}: {msg}"))
            .collect()
    }

    #[test]
    fn a_wider_or_narrower_pattern_warns_only_when_it_relaxes_strict_names() {
        use Mode::*;
        // The case: the prefix relaxes `pay.transactions`.
        let w = warned(&[("pay.*", Strict), ("pay.t*", Fallback)]);
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(
            w[0].starts_with("namespaces[1].pattern: `pay.t*` (fallback)"),
            "{w:?}"
        );
        assert!(
            w[0].contains("the strict `pay.*`") && w[0].contains("e.g. `pay.tx`"),
            "{w:?}"
        );
        // An exact exception and a passthrough one, and under a strict `*`.
        assert_eq!(
            warned(&[("pay.*", Strict), ("pay.ledger", Passthrough)]).len(),
            1
        );
        assert_eq!(warned(&[("*", Strict), ("logs.*", Passthrough)]).len(), 1);
        assert_eq!(
            warned(&[("pay.tx*", Strict), ("pay.txa*", Fallback)]).len(),
            1
        );
        // A strict pattern more specific than the other wins its names: nothing relaxed.
        assert!(warned(&[("pay.*", Fallback), ("pay.t*", Strict)]).is_empty());
        assert!(warned(&[("*", Passthrough), ("pay.*", Strict)]).is_empty());
        assert!(warned(&[("pay.x", Strict), ("pay.*", Fallback)]).is_empty());
        // Disjoint patterns.
        assert!(warned(&[("pay.*", Strict), ("demo.*", Fallback)]).is_empty());
        assert!(warned(&[("pay.t*", Strict), ("pay.u*", Fallback)]).is_empty());
        assert!(warned(&[("pay.tx", Strict), ("pay.ty", Fallback)]).is_empty());
        // Strict everywhere: nothing relaxed.
        assert!(warned(&[("pay.*", Strict), ("pay.t*", Strict)]).is_empty());
        // Between them, a strict prefix takes back what it matches; the rest still warns.
        let w = warned(&[("pay.*", Strict), ("pay.t*", Fallback), ("pay.tr*", Strict)]);
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(w[0].contains("`pay.t*`"), "{w:?}");
    }
}
