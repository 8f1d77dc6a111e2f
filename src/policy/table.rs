//! The pattern table: what each `[[namespaces]]` entry says (`Mode`, `Causal`, `NsPolicy`),
//! its patterns (`db.coll`, `db.*`, `db.prefix*`, `*`) and "most specific wins" matching.
//!
//! `lookup` runs per request: it hashes `db` once in a per-database map and does not allocate.
//! `config` builds a table from the file (and reports errors with their lines); tests and
//! embedders build one with [`PolicyTable::from_policies`].

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use crate::command::ReadPrefMode;

/// Default `trigger_codes`: the stale-routing and time-limit errors of the design.
pub const DEFAULT_TRIGGER_CODES: [i32; 9] = [13388, 63, 150, 249, 50, 262, 89, 133, 202];

/// Default `min_cooldown`: the first cooldown of a breaker that opened.
pub const DEFAULT_MIN_COOLDOWN: Duration = Duration::from_secs(1);
/// Default `attempt_share`: the first attempt gets half the read's budget, the next rung the
/// rest.
pub const DEFAULT_ATTEMPT_SHARE: f64 = 0.5;
/// Default `attempt_limit`: a secondary that can refresh answers in milliseconds, one that
/// cannot waits up to 30 s; 500 ms leaves the next rung room inside even a 1 s socket
/// timeout.
pub const DEFAULT_ATTEMPT_LIMIT: Duration = Duration::from_millis(500);
/// Default `min_wait`: a client's wait shorter than this is no evidence about the cluster.
pub const DEFAULT_MIN_WAIT: Duration = Duration::from_secs(1);
/// Default `min_connections`: one connection alone never opens a breaker.
pub const DEFAULT_MIN_CONNECTIONS: u32 = 2;
/// Default `per_connection`: each connection counts once per window.
pub const DEFAULT_PER_CONNECTION: u32 = 1;
/// Largest `min_connections`.
pub const MAX_MIN_CONNECTIONS: u32 = 100;
/// Largest `per_connection`.
pub const MAX_PER_CONNECTION: u32 = 1000;

/// Characters MongoDB forbids in database names: a pattern using one never matches.
pub(crate) const DB_FORBIDDEN: &[char] = &['/', '\\', ' ', '"', '$', '\0'];

/// Default `close_after`: answered samples in a row that close an open breaker.
pub const DEFAULT_CLOSE_AFTER: u32 = 3;
/// Default `open_time_limit`: the bound on a strict read sent while its breaker is open. A
/// secondary that can refresh answers in milliseconds; one that cannot waits until the limit.
/// A read that fails is sent once more under it, so a read that meets only stale members
/// fails within two bounds (about 400 ms).
pub const DEFAULT_OPEN_TIME_LIMIT: Duration = Duration::from_millis(200);
/// Default `confirm_time`: the time limit of the cheap read that confirms a time-limit error.
pub const DEFAULT_CONFIRM_TIME: Duration = Duration::from_millis(250);
/// Default `cooldown`: the longest wait between two probes of an open breaker.
pub const DEFAULT_COOLDOWN: Duration = Duration::from_secs(3);

/// What an open breaker does with the eligible reads of a strict namespace without a
/// primary rung.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnOpen {
    /// Send each with `maxTimeMS` at most `open_time_limit`: a healthy secondary answers, a
    /// stale or hung one fails within the bound (answered with the fail-fast error).
    Bound,
    /// Answer each with the fail-fast error, sending nothing (but one probe at a time).
    Refuse,
}

impl OnOpen {
    pub fn as_str(self) -> &'static str {
        match self {
            OnOpen::Bound => "bound",
            OnOpen::Refuse => "refuse",
        }
    }

    pub fn parse(s: &str) -> Option<OnOpen> {
        [OnOpen::Bound, OnOpen::Refuse]
            .into_iter()
            .find(|m| m.as_str() == s)
    }
}

/// What to do with eligible reads on a namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mode {
    Fallback,
    Strict,
    Passthrough,
}

impl Mode {
    /// The name used in the config file.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Fallback => "fallback",
            Mode::Strict => "strict",
            Mode::Passthrough => "passthrough",
        }
    }

    pub fn parse(s: &str) -> Option<Mode> {
        [Mode::Fallback, Mode::Strict, Mode::Passthrough]
            .into_iter()
            .find(|m| m.as_str() == s)
    }
}

/// How a rewrite treats causally consistent reads (`readConcern.afterClusterTime`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Causal {
    /// Rewrite anyway, removing `afterClusterTime` (the server rejects it with `available`).
    Drop,
    /// Leave such reads as they are.
    Skip,
}

impl Causal {
    /// The name used in the config file.
    pub fn as_str(self) -> &'static str {
        match self {
            Causal::Drop => "drop",
            Causal::Skip => "skip",
        }
    }

    pub fn parse(s: &str) -> Option<Causal> {
        [Causal::Drop, Causal::Skip]
            .into_iter()
            .find(|c| c.as_str() == s)
    }
}

/// The effective settings of one `[[namespaces]]` entry, defaults applied
/// (built-in, then `[defaults]`, then the entry). Every field reloads at runtime.
#[derive(Debug, Clone, PartialEq)]
pub struct NsPolicy {
    /// The pattern as written (`db.coll`, `db.*`, `db.prefix*`, `*`). Required.
    pub pattern: String,
    /// `fallback` | `strict` | `passthrough`. Required.
    pub mode: Mode,
    /// Trigger errors within `window` that open the breaker. Default 3, at least 1.
    pub threshold: u32,
    /// Sliding window for `threshold`. Default 10s, not zero.
    pub window: Duration,
    /// The longest wait between two probes of an open breaker (the wait doubles from
    /// `min_cooldown` with each failed one). Default 3s, not zero.
    pub cooldown: Duration,
    /// Bit set of `ReadPrefMode::bit()`: the read preferences that make a read eligible.
    /// Default secondary, secondaryPreferred, nearest; never `primary`; not empty.
    pub read_preferences: u8,
    /// Error codes that count as failures. Default [`DEFAULT_TRIGGER_CODES`]; not empty.
    pub trigger_codes: Vec<i32>,
    /// Cap on `maxTimeMS` of eligible reads. Default none; at least 1ms.
    pub max_time: Option<Duration>,
    /// Log and count what would happen without acting. Default false.
    pub dry_run: bool,
    /// Rewrites of reads carrying `afterClusterTime`. Default `drop`; not on strict entries.
    pub causal: Causal,
    /// A reply slower than this counts as a trigger error. Default none; below `max_time`.
    pub slow_read: Option<Duration>,
    /// The first wait for a probe after the breaker opens (each failed probe doubles the
    /// next wait, up to `cooldown`), and the least time a streak of answered samples must
    /// span to close it. Default 1s; not zero, at most `cooldown`.
    pub min_cooldown: Duration,
    /// Share of a read's time budget (client `maxTimeMS`, capped by `max_time`) its first
    /// attempt may spend, leaving the rest to the next rung. Default 0.5; in (0, 1].
    pub attempt_share: f64,
    /// Longest first attempt (the whole first attempt when the read has no budget).
    /// Default 500ms; 1ms..=2147483647ms, or `"off"` (none).
    pub attempt_limit: Option<Duration>,
    /// `ladder` includes `primary`: a read that fails (or meets an open breaker) is sent
    /// once more with `$readPreference: {mode: "primary"}`. Default false (opt in).
    pub primary_rung: bool,
    /// The least wait that makes a client's word evidence: a client that gives up, a slow
    /// reply, or a time-limit error (MaxTimeMSExpired, ExceededTimeLimit) counts only when
    /// the read waited (or was given) at least this long. Default 1s; at most `max_time`.
    pub min_wait: Duration,
    /// Distinct client connections whose errors must be inside `window` for the breaker to
    /// open. Default 2, 1..=100.
    pub min_connections: u32,
    /// Trigger errors one connection may contribute inside `window`; more are not counted.
    /// Default 1, 1..=1000.
    pub per_connection: u32,
    /// Strict without a primary rung: what an open breaker does with reads. Default
    /// `bound`.
    pub on_open: OnOpen,
    /// `on_open = "bound"`: the longest `maxTimeMS` of a read sent while open. Default
    /// 250ms; 1ms..=`min_wait`.
    pub open_time_limit: Duration,
    /// Answered samples in a row that close an open breaker. Default 3, 1..=1000.
    pub close_after: u32,
    /// `maxTimeMS` of the confirming read sent after a time-limit error. Default 250ms;
    /// 1ms..=1 minute.
    pub confirm_time: Duration,
}

impl NsPolicy {
    /// An entry with the built-in defaults (no `[defaults]` table applied).
    pub fn with_defaults(pattern: &str, mode: Mode) -> NsPolicy {
        NsPolicy {
            pattern: pattern.to_string(),
            mode,
            threshold: 3,
            window: Duration::from_secs(10),
            cooldown: DEFAULT_COOLDOWN,
            read_preferences: ReadPrefMode::Secondary.bit()
                | ReadPrefMode::SecondaryPreferred.bit()
                | ReadPrefMode::Nearest.bit(),
            trigger_codes: DEFAULT_TRIGGER_CODES.to_vec(),
            max_time: None,
            dry_run: false,
            causal: Causal::Drop,
            slow_read: None,
            min_cooldown: DEFAULT_MIN_COOLDOWN,
            attempt_share: DEFAULT_ATTEMPT_SHARE,
            attempt_limit: Some(DEFAULT_ATTEMPT_LIMIT),
            primary_rung: false,
            min_wait: DEFAULT_MIN_WAIT,
            min_connections: DEFAULT_MIN_CONNECTIONS,
            per_connection: DEFAULT_PER_CONNECTION,
            on_open: OnOpen::Bound,
            open_time_limit: DEFAULT_OPEN_TIME_LIMIT,
            close_after: DEFAULT_CLOSE_AFTER,
            confirm_time: DEFAULT_CONFIRM_TIME,
        }
    }

    /// The least wait that makes a client's word evidence: `min_wait`, or the operator's
    /// own `max_time` cap when that is shorter (a read cut by the cap was given all the
    /// time the operator allows).
    pub fn evidence_floor(&self) -> Duration {
        self.max_time
            .map_or(self.min_wait, |cap| cap.min(self.min_wait))
    }

    pub fn is_trigger(&self, code: i32) -> bool {
        self.trigger_codes.contains(&code)
    }

    /// The rungs a failing read climbs, in order, as written in `ladder`: `primary` when
    /// opted in, then `available` for fallback entries.
    pub fn ladder(&self) -> &'static [&'static str] {
        match (self.mode, self.primary_rung) {
            (Mode::Fallback, true) => &["primary", "available"],
            (Mode::Fallback, false) => &["available"],
            (Mode::Strict, true) => &["primary"],
            _ => &[],
        }
    }

    /// `mode` is one of the `read_preferences`.
    pub fn allows_read_pref(&self, mode: ReadPrefMode) -> bool {
        self.read_preferences & mode.bit() != 0
    }
}

/// A parsed pattern. Specificity: `Exact` > `Prefix` (longer first) > `Db` > `All`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum Pattern {
    Exact { db: String, coll: String },
    Prefix { db: String, prefix: String },
    Db(String),
    All,
}

impl Pattern {
    pub(crate) fn parse(s: &str) -> Result<Pattern, String> {
        const FORMS: &str = "expected `db.coll`, `db.*`, `db.prefix*` or `*`";
        if s == "*" {
            return Ok(Pattern::All);
        }
        if s.is_empty() {
            return Err(format!("empty pattern; {FORMS}"));
        }
        let Some((db, coll)) = s.split_once('.') else {
            return Err(format!("pattern `{s}` has no `.`; {FORMS}"));
        };
        if db.is_empty() {
            return Err(format!("pattern `{s}` has an empty database name; {FORMS}"));
        }
        if db.contains('*') {
            return Err(format!(
                "pattern `{s}` has `*` in the database name; only `*` alone matches every database"
            ));
        }
        if let Some(c) = db.chars().find(|c| DB_FORBIDDEN.contains(c)) {
            return Err(format!(
                "pattern `{s}`: database names cannot contain {c:?}, so it would never match"
            ));
        }
        let db = db.to_string();
        match coll.find('*') {
            None if coll.is_empty() => Err(format!(
                "pattern `{s}` has an empty collection name; write `{db}.*` for the whole database"
            )),
            None => Ok(Pattern::Exact {
                db,
                coll: coll.to_string(),
            }),
            Some(0) if coll.len() == 1 => Ok(Pattern::Db(db)),
            Some(i) if i + 1 == coll.len() => Ok(Pattern::Prefix {
                db,
                prefix: coll[..i].to_string(),
            }),
            Some(_) => Err(format!(
                "pattern `{s}`: `*` is allowed only at the end; {FORMS}"
            )),
        }
    }

    pub(crate) fn matches(&self, db: &str, coll: &str) -> bool {
        match self {
            Pattern::Exact { db: d, coll: c } => d == db && c == coll,
            Pattern::Prefix { db: d, prefix } => d == db && coll.starts_with(prefix.as_str()),
            Pattern::Db(d) => d == db,
            Pattern::All => true,
        }
    }

    /// Higher is more specific.
    pub(crate) fn rank(&self) -> (u8, usize) {
        match self {
            Pattern::Exact { .. } => (3, 0),
            Pattern::Prefix { prefix, .. } => (2, prefix.len()),
            Pattern::Db(_) => (1, 0),
            Pattern::All => (0, 0),
        }
    }
}

/// FNV-1a: the policy maps are small, built from the config only, and looked up once per
/// governed read, where SipHash's flood resistance buys nothing and costs most of `lookup`.
#[derive(Debug, Clone, Copy)]
struct Fnv(u64);

impl Default for Fnv {
    fn default() -> Self {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
}

impl std::hash::Hasher for Fnv {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ b as u64).wrapping_mul(0x0100_0000_01b3);
        }
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

type FastMap<V> = HashMap<String, V, std::hash::BuildHasherDefault<Fnv>>;

/// The rules of one database, so that `lookup` hashes `db` once and never allocates.
#[derive(Debug, Clone, Default)]
struct DbRules {
    exact: FastMap<usize>,
    /// Longest prefix first (equal lengths cannot both match: they would be duplicates).
    prefixes: Vec<(String, usize)>,
    whole: Option<usize>,
}

/// Patterns → policies, with "most specific wins" lookup.
#[derive(Debug, Clone, Default)]
pub struct PolicyTable {
    /// File order.
    entries: Vec<Arc<NsPolicy>>,
    /// Parallel to `entries`.
    patterns: Vec<Pattern>,
    /// Parallel to `entries`: line of `pattern` in the file, 0 when built in code.
    lines: Vec<usize>,
    dbs: FastMap<DbRules>,
    all: Option<usize>,
    /// No entry is fallback or strict: nothing needs classifying.
    passthrough_only: bool,
}

impl PolicyTable {
    /// Builds a table from policies (for tests and embedders). Errors on a bad pattern or
    /// two entries with the same pattern.
    pub fn from_policies(policies: Vec<NsPolicy>) -> Result<PolicyTable, String> {
        let mut items = Vec::with_capacity(policies.len());
        for p in policies {
            let pat = Pattern::parse(&p.pattern)?;
            if items.iter().any(|(q, _, _)| *q == pat) {
                return Err(format!("pattern `{}` appears twice", p.pattern));
            }
            items.push((pat, p, 0));
        }
        Ok(PolicyTable::build(items))
    }

    /// `items` must not hold two equal patterns (the later would shadow the earlier).
    pub(crate) fn build(items: Vec<(Pattern, NsPolicy, usize)>) -> PolicyTable {
        let mut t = PolicyTable::default();
        for (i, (pat, policy, line)) in items.into_iter().enumerate() {
            match &pat {
                Pattern::Exact { db, coll } => {
                    let rules = t.dbs.entry(db.clone()).or_default();
                    rules.exact.insert(coll.clone(), i);
                }
                Pattern::Prefix { db, prefix } => {
                    let rules = t.dbs.entry(db.clone()).or_default();
                    rules.prefixes.push((prefix.clone(), i));
                }
                Pattern::Db(db) => t.dbs.entry(db.clone()).or_default().whole = Some(i),
                Pattern::All => t.all = Some(i),
            }
            t.entries.push(Arc::new(policy));
            t.patterns.push(pat);
            t.lines.push(line);
        }
        t.passthrough_only = t.entries.iter().all(|p| p.mode == Mode::Passthrough);
        for rules in t.dbs.values_mut() {
            rules
                .prefixes
                .sort_by_key(|(p, _)| std::cmp::Reverse(p.len()));
        }
        t
    }

    /// Index of the entry governing `db.coll`.
    pub(crate) fn find(&self, db: &str, coll: &str) -> Option<usize> {
        if let Some(rules) = self.dbs.get(db) {
            if let Some(&i) = rules.exact.get(coll) {
                return Some(i);
            }
            if let Some((_, i)) = rules.prefixes.iter().find(|(p, _)| coll.starts_with(p)) {
                return Some(*i);
            }
            if let Some(i) = rules.whole {
                return Some(i);
            }
        }
        self.all
    }

    /// The policy governing `db.coll`, or `None` when no pattern matches (unlisted).
    /// Does not allocate.
    pub fn lookup(&self, db: &str, coll: &str) -> Option<&Arc<NsPolicy>> {
        self.find(db, coll).map(|i| &self.entries[i])
    }

    /// The fallback or strict entry that can govern some namespace of database `db` (strict
    /// ones first, then file order); with `strict_only`, strict entries alone. `None` when
    /// every pattern that can match in `db` is passthrough, or none can. A `*` pattern counts
    /// unless a `db.*` pattern shadows it. Not on the per-read path: it walks `db`'s rules.
    pub fn acting_in_db(&self, db: &str, strict_only: bool) -> Option<&Arc<NsPolicy>> {
        let rules = self.dbs.get(db);
        let own = rules.into_iter().flat_map(|r| {
            r.exact
                .values()
                .chain(r.prefixes.iter().map(|(_, i)| i))
                .chain(r.whole.iter())
        });
        let all = self.all.filter(|_| rules.is_none_or(|r| r.whole.is_none()));
        own.copied()
            .chain(all)
            .filter(|&i| match self.entries[i].mode {
                Mode::Strict => true,
                Mode::Fallback => !strict_only,
                Mode::Passthrough => false,
            })
            .min_by_key(|&i| (self.entries[i].mode != Mode::Strict, i))
            .map(|i| &self.entries[i])
    }

    /// Every entry, in file order.
    pub fn entries(&self) -> &[Arc<NsPolicy>] {
        &self.entries
    }

    /// The parsed pattern of entry `i` (as returned by `find`).
    pub(crate) fn pattern(&self, i: usize) -> &Pattern {
        &self.patterns[i]
    }

    /// The line of entry `i`'s `pattern` in the file; 0 when built in code.
    pub(crate) fn line(&self, i: usize) -> usize {
        self.lines[i]
    }

    /// True when no entry has mode fallback or strict (then nothing is ever classified).
    pub fn is_passthrough_only(&self) -> bool {
        self.passthrough_only
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pattern_forms() {
        let p = |s: &str| Pattern::parse(s).unwrap();
        assert_eq!(p("*"), Pattern::All);
        assert_eq!(p("a.*"), Pattern::Db("a".into()));
        assert_eq!(
            p("a.b.c*"),
            Pattern::Prefix {
                db: "a".into(),
                prefix: "b.c".into()
            }
        );
        assert_eq!(
            p("a.b.c"),
            Pattern::Exact {
                db: "a".into(),
                coll: "b.c".into()
            }
        );
        for bad in [
            "", "a", ".b", "a.", "*.b", "a*.b", "a.*b", "a.b*c", "a.**", "a b.c",
        ] {
            assert!(Pattern::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn acting_in_db() {
        let t = PolicyTable::from_policies(vec![
            NsPolicy::with_defaults("demo.inv", Mode::Fallback),
            NsPolicy::with_defaults("demo.secret*", Mode::Strict),
            NsPolicy::with_defaults("open.*", Mode::Passthrough),
            NsPolicy::with_defaults("side.x", Mode::Passthrough),
            NsPolicy::with_defaults("*", Mode::Fallback),
        ])
        .expect("table");
        let pat = |db: &str, strict: bool| t.acting_in_db(db, strict).map(|p| p.pattern.as_str());
        assert_eq!(pat("demo", false), Some("demo.secret*"), "strict first");
        assert_eq!(pat("demo", true), Some("demo.secret*"));
        // `open.*` shadows `*` for every collection of `open`.
        assert_eq!(pat("open", false), None);
        // `side.x` is passthrough, but `*` still covers the other collections of `side`.
        assert_eq!(pat("side", false), Some("*"));
        assert_eq!(pat("side", true), None);
        assert_eq!(pat("elsewhere", false), Some("*"));
        let none = PolicyTable::from_policies(vec![NsPolicy::with_defaults("pay.*", Mode::Strict)])
            .expect("table");
        assert_eq!(none.acting_in_db("demo", false).map(|p| p.mode), None);
        assert_eq!(
            none.acting_in_db("pay", true).map(|p| p.mode),
            Some(Mode::Strict)
        );
    }

    #[test]
    fn specificity_order() {
        let r = |s: &str| Pattern::parse(s).unwrap().rank();
        assert!(r("a.b") > r("a.bcdef*"));
        assert!(r("a.bc*") > r("a.b*"));
        assert!(r("a.b*") > r("a.*"));
        assert!(r("a.*") > r("*"));
    }
}
