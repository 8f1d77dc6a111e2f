//! The bound on the breaker map, per pattern of the config, so that no flood of namespace
//! names can leave a namespace that matters without its breaker:
//!
//! - a namespace the config lists exactly (a pattern without `*`, fallback or strict) always
//!   gets its breaker: its slot is reserved out of `max`, it is never evicted, and no other
//!   name can take it;
//! - the rest of `max` is the *pool* of the wildcard patterns (`db.*`, `db.prefix*`, `*`).
//!   Each is guaranteed `pool / wildcard patterns` slots and may hold up to
//!   `max(guarantee, pool * share)` (`breaker_share`) while the pool has room;
//! - when the pool is full, a new namespace takes the slot of the idlest *evictable* breaker
//!   (a closed one, or an open or held one that has *expired*: no eligible read
//!   met it, and it made no transition, for `max(2 x cooldown, 60 s)` of its pattern); a
//!   pattern at its cap evicts only its own. A pattern below its guarantee that finds no
//!   evictable breaker takes back a slot from a pattern above its own guarantee, whatever
//!   that breaker's state (it was borrowed).
//!
//! So a flood under `pay.*` fills at most `pay.*`'s cap with open breakers; exact namespaces
//! and other patterns keep their slots. Eviction scans the map (under the bound's lock, not
//! on the per-read path) and keeps the [`BATCH`] idlest evictable breakers it found as the
//! next candidates, so a flood of new names pays about one scan per [`BATCH`] names.

use std::sync::atomic::Ordering;
use std::sync::MutexGuard;
use std::time::Duration;

use dashmap::mapref::entry::Entry;
use dashmap::mapref::one::RefMut;
use tokio::time::Instant;

use super::{Breaker, Breakers, State};
use crate::config::DEFAULT_BREAKER_SHARE;
use crate::policy::{Mode, PolicyTable};

/// The least time an open breaker nobody reads is kept (see [`Bound::expiry`]).
pub const MIN_EXPIRY: Duration = Duration::from_secs(60);
/// Evictable breakers freed by one scan of a full pool.
pub const BATCH: usize = 32;
/// How long a scan that found nothing to evict for a need stands for the next names.
pub const RESCAN_AFTER: Duration = Duration::from_secs(1);
/// `last_read` is written at most this often per breaker (a load per read otherwise).
const TOUCH_EVERY_MS: u64 = 1000;

/// Which slots a namespace's breaker counts against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Class {
    /// An exactly listed namespace: a reserved slot, never evicted.
    Exact,
    /// A namespace of the pool: index into [`Bound::counts`].
    Pooled(usize),
}

/// Who holds how many slots. Kept behind `Breakers::bound`.
#[derive(Debug)]
pub(super) struct Bound {
    max: usize,
    share: f64,
    /// The patterns (set at start and on each reload); `None`: one class holds the whole
    /// map (breakers built without a config, as in unit tests).
    table: Option<PolicyTable>,
    /// Pooled breakers per class: one per table entry, then the namespaces no acting
    /// pattern governs (a session still on the previous config after a reload).
    counts: Vec<usize>,
    pooled: usize,
    exact: usize,
    /// Acting exact entries (reserved slots) and acting wildcard entries.
    exact_entries: usize,
    wild_entries: usize,
    /// Evictable breakers the last scan found, idlest first: the next evictions take them
    /// (each checked again) before scanning anew.
    spare: Vec<(Instant, String, usize)>,
    /// Until when a scan for a need found nothing to evict (per class at its cap, then one
    /// for a full pool): new names meeting the same need are refused without a scan until
    /// then, so a flood against a pattern full of open breakers costs no scan per name.
    barren: Vec<Option<Instant>>,
}

impl Bound {
    pub(super) fn new(max: usize) -> Bound {
        Bound {
            max,
            share: DEFAULT_BREAKER_SHARE,
            table: None,
            counts: vec![0],
            pooled: 0,
            exact: 0,
            exact_entries: 0,
            wild_entries: 0,
            spare: Vec::new(),
            barren: vec![None; 2],
        }
    }

    /// The class of `ns` ("db.coll") under the current patterns.
    pub(super) fn class_of(&self, ns: &str) -> Class {
        let Some(t) = &self.table else {
            return Class::Pooled(0);
        };
        let other = Class::Pooled(t.entries().len());
        let Some((db, coll)) = ns.split_once('.') else {
            return other;
        };
        match t.find(db, coll) {
            Some(i) if t.entries()[i].mode == Mode::Passthrough => other,
            Some(i) if is_exact(t, i) => Class::Exact,
            Some(i) => Class::Pooled(i),
            None => other,
        }
    }

    /// Slots of the wildcard patterns: `max` less the reserved ones.
    pub(super) fn pool(&self) -> usize {
        self.max.saturating_sub(self.exact_entries)
    }

    /// Slots class `c` keeps whatever the others do.
    pub(super) fn guarantee(&self, c: usize) -> usize {
        match &self.table {
            None => self.pool(),
            Some(t) if c >= t.entries().len() => 0,
            Some(_) => self.pool() / self.wild_entries.max(1),
        }
    }

    /// Slots class `c` may hold at most.
    pub(super) fn cap(&self, c: usize) -> usize {
        let pool = self.pool();
        if self.table.is_none() || pool == 0 {
            return pool;
        }
        let share = ((pool as f64) * self.share).floor() as usize;
        share.max(self.guarantee(c)).clamp(1, pool)
    }

    /// How long an open or held breaker of class `c` lives without a read or a
    /// transition: twice the pattern's longest cooldown (a breaker read at least once per
    /// cooldown makes a transition or is read), and at least [`MIN_EXPIRY`].
    pub(super) fn expiry(&self, c: usize) -> Duration {
        let cooldown = self
            .table
            .as_ref()
            .and_then(|t| t.entries().get(c))
            .map_or(Duration::ZERO, |p| p.cooldown);
        cooldown.saturating_mul(2).max(MIN_EXPIRY)
    }

    fn add(&mut self, class: Class) {
        match class {
            Class::Exact => self.exact += 1,
            Class::Pooled(c) => {
                self.counts[c] += 1;
                self.pooled += 1;
            }
        }
    }

    fn sub(&mut self, class: Class) {
        match class {
            Class::Exact => self.exact = self.exact.saturating_sub(1),
            Class::Pooled(c) => {
                self.counts[c] = self.counts[c].saturating_sub(1);
                self.pooled = self.pooled.saturating_sub(1);
            }
        }
    }

    /// What creating a breaker of `class` needs.
    fn need(&self, class: Class) -> Need {
        let Class::Pooled(c) = class else {
            return Need::Free;
        };
        if self.counts[c] >= self.cap(c) {
            Need::Own(c)
        } else if self.pooled < self.pool() {
            Need::Free
        } else {
            Need::Any {
                reclaim: self.counts[c] < self.guarantee(c),
            }
        }
    }

    /// Where a fruitless scan for `need` is remembered (a reclaim always finds a borrower).
    fn barren_index(&self, need: Need) -> Option<usize> {
        match need {
            Need::Own(c) => Some(c),
            Need::Any { reclaim: false } => Some(self.counts.len()),
            _ => None,
        }
    }

    /// Breakers in the map now, as counted.
    fn total(&self) -> usize {
        self.pooled + self.exact
    }
}

fn is_exact(t: &PolicyTable, i: usize) -> bool {
    matches!(t.pattern(i), crate::policy::Pattern::Exact { .. })
}

/// What a new breaker needs before it can be inserted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Need {
    /// A slot is free (or reserved).
    Free,
    /// Its pattern is at its cap: one of the pattern's own evictable breakers must go.
    Own(usize),
    /// The pool is full: any evictable breaker; with `reclaim`, failing that, one a pattern
    /// holds above its guarantee.
    Any { reclaim: bool },
}

impl Breakers {
    pub(super) fn bound(&self) -> MutexGuard<'_, Bound> {
        self.bound.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sets the patterns the bound follows and `breaker_share` (at start and after each
    /// reload, after [`Breakers::retain`]), and counts the breakers again under them.
    pub fn set_patterns(&self, table: &PolicyTable, share: f64) {
        let mut bound = self.bound();
        let acting = |i: &usize| table.entries()[*i].mode != Mode::Passthrough;
        let n = table.entries().len();
        bound.exact_entries = (0..n)
            .filter(acting)
            .filter(|&i| is_exact(table, i))
            .count();
        bound.wild_entries = (0..n)
            .filter(acting)
            .filter(|&i| !is_exact(table, i))
            .count();
        bound.share = share;
        bound.table = Some(table.clone());
        self.recount(&mut bound);
    }

    /// Counts every breaker again under the current patterns (the only way counts change
    /// but for inserts and removals made under the bound's lock).
    pub(super) fn recount(&self, bound: &mut Bound) {
        let classes = bound.table.as_ref().map_or(1, |t| t.entries().len() + 1);
        bound.counts = vec![0; classes];
        bound.spare.clear();
        bound.barren = vec![None; classes + 1];
        bound.pooled = 0;
        bound.exact = 0;
        for e in self.map.iter() {
            let class = bound.class_of(e.key());
            bound.add(class);
        }
        self.metrics.limits.breakers.set(bound.total() as i64);
    }

    /// Notes that an eligible read met breaker `b` at `now` (for expiry); writes at most
    /// once a second per breaker.
    pub(super) fn touch(&self, b: &Breaker, now: Instant) {
        let ms = self.clock_ms(now);
        let last = b.last_read.load(Ordering::Relaxed);
        if last == 0 || ms >= last + TOUCH_EVERY_MS {
            b.last_read.store(ms.max(1), Ordering::Relaxed);
        }
    }

    fn clock_ms(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.epoch).as_millis() as u64
    }

    /// The last time `b` was read, made a transition or counted an error.
    pub(super) fn last_used(&self, b: &Breaker) -> Instant {
        let read = match b.last_read.load(Ordering::Relaxed) {
            0 => self.epoch,
            ms => self.epoch + Duration::from_millis(ms),
        };
        b.last_seen.max(b.last_transition).max(read)
    }

    /// True when `b` may go to make room: closed and not held, or expired.
    fn evictable(&self, b: &Breaker, expiry: Duration, now: Instant) -> bool {
        let quiet = b.state == State::Closed && !b.held;
        quiet || now.saturating_duration_since(self.last_used(b)) >= expiry
    }

    /// The breaker of `ns`, created if needed within the bound (see the module doc); `None`
    /// when its pattern has no room and nothing can be evicted for it.
    pub(super) fn slot(&self, ns: &str, now: Instant) -> Option<RefMut<'_, String, Breaker>> {
        if let Some(b) = self.map.get_mut(ns) {
            return Some(b);
        }
        let mut bound = self.bound();
        let class = bound.class_of(ns);
        loop {
            match bound.need(class) {
                Need::Free => break,
                need => {
                    if !self.evict(&mut bound, need, now) {
                        self.metrics.limits.hit("max_breakers");
                        tracing::debug!(ns = %ns, "breaker map: no room for this pattern");
                        return None;
                    }
                }
            }
        }
        // Every insert happens under the bound's lock: `ns` cannot have appeared unless it
        // was there before the lock (then it is returned as it is).
        let b = match self.map.entry(ns.to_string()) {
            Entry::Occupied(e) => e.into_ref(),
            Entry::Vacant(v) => {
                bound.add(class);
                v.insert(Breaker::new(now))
            }
        };
        self.metrics.limits.breakers.set(bound.total() as i64);
        Some(b)
    }

    /// Frees room for `need`: the idlest evictable breaker it may take (from the candidates
    /// the last scan left, else from a new scan), else (reclaim) the idlest breaker of a
    /// pattern above its guarantee. False when nothing could go.
    fn evict(&self, bound: &mut Bound, need: Need, now: Instant) -> bool {
        if self.evict_spare(bound, need, now) {
            return true;
        }
        let barren = bound.barren_index(need);
        if barren
            .and_then(|i| bound.barren[i])
            .is_some_and(|until| now < until)
        {
            return false;
        }
        let mut soft = Idlest::default();
        let mut hard = Idlest::default();
        let reclaim = matches!(need, Need::Any { reclaim: true });
        for e in self.map.iter() {
            let Class::Pooled(c) = bound.class_of(e.key()) else {
                continue;
            };
            let used = self.last_used(&e);
            if self.evictable(&e, bound.expiry(c), now) {
                soft.offer(used, e.key(), c);
            } else if reclaim && bound.counts[c] > bound.guarantee(c) {
                hard.offer(used, e.key(), c);
            }
        }
        bound.spare = soft.best;
        if self.evict_spare(bound, need, now) {
            return true;
        }
        // Borrowed slots come back one at a time (at most a guarantee's worth in all).
        let Some((_, ns, c)) = hard.best.into_iter().next() else {
            if let Some(i) = barren {
                bound.barren[i] = now.checked_add(RESCAN_AFTER);
            }
            return false;
        };
        match self.map.remove(&ns) {
            Some((ns, b)) => {
                self.evicted(bound, Class::Pooled(c), &ns, &b, "borrowed slot taken back");
                true
            }
            None => false,
        }
    }

    /// Evicts the idlest candidate of the last scan that `need` may take and that is still
    /// evictable and unused since.
    fn evict_spare(&self, bound: &mut Bound, need: Need, now: Instant) -> bool {
        while let Some(i) = bound
            .spare
            .iter()
            .position(|&(_, _, c)| !matches!(need, Need::Own(own) if own != c))
        {
            let (used, ns, c) = bound.spare.remove(i);
            let expiry = bound.expiry(c);
            let still = |_: &String, b: &Breaker| {
                self.last_used(b) == used && self.evictable(b, expiry, now)
            };
            if let Some((ns, b)) = self.map.remove_if(&ns, still) {
                self.evicted(bound, Class::Pooled(c), &ns, &b, "idle");
                return true;
            }
        }
        false
    }

    /// Accounts for a breaker that left the map to make room.
    fn evicted(&self, bound: &mut Bound, class: Class, ns: &str, b: &Breaker, why: &str) {
        bound.sub(class);
        self.metrics.limits.hit("max_breakers");
        if b.state == State::Closed {
            tracing::debug!(ns = %ns, why, "breaker map full: closed breaker evicted");
            return;
        }
        self.not_closed.fetch_sub(1, Ordering::AcqRel);
        self.metrics.breaker_dropped(ns);
        tracing::info!(ns = %ns, state = b.state.as_str(), why, "breaker map full: breaker evicted (its next read starts closed)");
    }
}

/// The [`BATCH`] idlest breakers offered: (last use, namespace, class), idlest first.
#[derive(Default)]
struct Idlest {
    best: Vec<(Instant, String, usize)>,
}

impl Idlest {
    fn offer(&mut self, used: Instant, ns: &str, class: usize) {
        if self.best.len() == BATCH && self.best.last().is_some_and(|(t, _, _)| *t <= used) {
            return;
        }
        let at = self.best.partition_point(|(t, _, _)| *t <= used);
        self.best.insert(at, (used, ns.to_string(), class));
        self.best.truncate(BATCH);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{Admission, NsPolicy, Reason};

    const S: fn(u64) -> Duration = Duration::from_secs;

    /// `pay.transactions` exact, `pay.*` and `db.*` wildcards (cooldown 30 s: expiry 60 s).
    fn table() -> PolicyTable {
        PolicyTable::from_policies(vec![
            NsPolicy::with_defaults("pay.transactions", Mode::Strict),
            NsPolicy::with_defaults("pay.*", Mode::Strict),
            NsPolicy::with_defaults("db.*", Mode::Fallback),
            NsPolicy::with_defaults("pay.audit", Mode::Passthrough),
        ])
        .expect("table")
    }

    /// One error from one connection opens, and the cooldown outlasts the tests' reads.
    fn opens_at_once() -> NsPolicy {
        let mut p = NsPolicy::with_defaults("pay.*", Mode::Strict);
        p.threshold = 1;
        p.min_connections = 1;
        p.min_cooldown = S(30);
        p
    }

    fn breakers(max: usize, share: f64) -> Breakers {
        let b = Breakers::new(max);
        b.set_patterns(&table(), share);
        b
    }

    fn open(b: &Breakers, ns: &str, now: Instant) -> bool {
        let p = opens_at_once();
        let e = super::super::Counted {
            policy: &p,
            reason: Reason::StaleRouting,
            what: "13388",
            conn: 1,
        };
        b.record_failure(ns, &e, now);
        b.state(ns) == State::Open
    }

    fn count_under(b: &Breakers, prefix: &str) -> usize {
        b.snapshot()
            .iter()
            .filter(|s| s.ns.starts_with(prefix))
            .count()
    }

    #[test]
    fn shares_follow_the_patterns() {
        let b = breakers(10, 0.5);
        let bound = b.bound();
        // One reserved slot (the passthrough entry reserves none); 9 in the pool, two
        // wildcard patterns: 4 guaranteed each, at most max(4, 9 x 0.5) = 4.
        assert_eq!(bound.pool(), 9);
        assert_eq!(bound.class_of("pay.transactions"), Class::Exact);
        assert_eq!(bound.class_of("pay.x"), Class::Pooled(1));
        assert_eq!(bound.class_of("db.x"), Class::Pooled(2));
        assert_eq!(
            bound.class_of("pay.audit"),
            Class::Pooled(4),
            "not governed"
        );
        assert_eq!(bound.class_of("other.x"), Class::Pooled(4), "not governed");
        assert_eq!((bound.guarantee(1), bound.cap(1)), (4, 4));
        assert_eq!(bound.guarantee(4), 0);
        assert_eq!(bound.expiry(1), S(60));
        drop(bound);
        let wide = breakers(10, 1.0);
        assert_eq!(wide.bound().cap(1), 9);
        // Without patterns (unit tests of the breaker): one class, the whole map.
        let plain = Breakers::new(3);
        let bound = plain.bound();
        assert_eq!((bound.class_of("a.b"), bound.cap(0)), (Class::Pooled(0), 3));
    }

    #[test]
    fn a_flood_under_one_pattern_leaves_exact_and_other_patterns_their_breakers() {
        let b = breakers(10, 0.5);
        let t0 = Instant::now();
        let opened = (0..1000)
            .filter(|i| open(&b, &format!("pay.flood{i}"), t0))
            .count();
        assert_eq!(opened, 4, "pay.* holds its cap, no more");
        assert!(
            open(&b, "pay.transactions", t0),
            "exact: always its breaker"
        );
        for i in 0..4 {
            assert!(open(&b, &format!("db.c{i}"), t0), "db.* keeps its share");
        }
        assert_eq!(b.len(), 9);
        assert!(!open(&b, "pay.late", t0 + S(1)), "pay.* is still full");
    }

    #[test]
    fn a_pattern_below_its_guarantee_takes_back_borrowed_slots() {
        let b = breakers(10, 1.0);
        let t0 = Instant::now();
        for i in 0..20 {
            open(&b, &format!("pay.flood{i}"), t0 + Duration::from_millis(i));
        }
        assert_eq!(count_under(&b, "pay.flood"), 9, "borrowed the whole pool");
        // db.* is guaranteed 4: each takes back the idlest borrowed slot, open or not.
        for i in 0..4 {
            assert!(open(&b, &format!("db.c{i}"), t0 + S(1)), "db.c{i}");
        }
        assert_eq!(count_under(&b, "pay.flood"), 5);
        assert_eq!(
            b.state("pay.flood0"),
            State::Closed,
            "the idlest went first"
        );
        assert_eq!(b.not_closed(), 9);
        // Its guarantee met, db.* cannot take more while every breaker is open and read.
        assert!(!open(&b, "db.c4", t0 + S(1)));
        // And pay.* (at its guarantee plus one) cannot take them back.
        assert!(!open(&b, "pay.again", t0 + S(3)));
    }

    #[test]
    fn an_open_breaker_nobody_reads_expires_when_its_slot_is_needed() {
        let b = breakers(10, 0.5);
        let p = opens_at_once();
        let t0 = Instant::now();
        for i in 0..4 {
            assert!(open(&b, &format!("pay.x{i}"), t0));
        }
        // Within the expiry every one stays, and a new name gets nothing.
        assert!(!open(&b, "pay.new", t0 + S(30)));
        // pay.x0 is read (still inside its cooldown: no transition, only the read).
        assert!(!matches!(
            b.admit("pay.x0", &p, 99, false, t0 + S(20)),
            Admission::Closed
        ));
        // 61 s on, the three unread ones have expired; the read one has not.
        assert!(open(&b, "pay.new", t0 + S(61)));
        assert_eq!(b.state("pay.x0"), State::Open);
        assert_eq!(count_under(&b, "pay.x"), 3);
        assert_eq!(b.not_closed(), 4);
        // The candidates found by that scan serve the next names.
        assert!(open(&b, "pay.new2", t0 + S(61)));
        assert!(open(&b, "pay.new3", t0 + S(61)));
        assert!(!open(&b, "pay.new4", t0 + S(61)));
        assert_eq!(b.state("pay.x0"), State::Open);
    }

    #[test]
    fn a_fruitless_scan_stands_for_a_second() {
        let b = breakers(10, 0.5);
        let t0 = Instant::now();
        for i in 0..4 {
            open(&b, &format!("pay.x{i}"), t0);
        }
        assert!(!open(&b, "pay.a", t0 + Duration::from_millis(59_800)));
        // Expired now, but the scan a moment ago found nothing: refused without a scan.
        assert!(!open(&b, "pay.b", t0 + Duration::from_millis(60_500)));
        assert!(open(&b, "pay.c", t0 + S(61)));
    }

    #[test]
    fn exact_namespaces_always_have_their_breaker_even_past_max() {
        let many: Vec<NsPolicy> = (0..5)
            .map(|i| NsPolicy::with_defaults(&format!("pay.t{i}"), Mode::Strict))
            .chain([NsPolicy::with_defaults("db.*", Mode::Fallback)])
            .collect();
        let b = Breakers::new(3);
        b.set_patterns(&PolicyTable::from_policies(many).expect("table"), 0.5);
        let t0 = Instant::now();
        for i in 0..5 {
            assert!(open(&b, &format!("pay.t{i}"), t0));
        }
        assert!(!open(&b, "db.x", t0), "no pool left");
        assert_eq!(b.len(), 5);
    }

    #[test]
    fn a_reload_counts_again_under_the_new_patterns() {
        let b = breakers(10, 0.5);
        let t0 = Instant::now();
        for i in 0..4 {
            open(&b, &format!("pay.x{i}"), t0);
        }
        // pay.x0 becomes an exact entry and pay.* goes away: its other breakers are dropped
        // (as `reload` does) and the rest counted again.
        let next = PolicyTable::from_policies(vec![
            NsPolicy::with_defaults("pay.x0", Mode::Strict),
            NsPolicy::with_defaults("db.*", Mode::Fallback),
        ])
        .expect("table");
        b.retain(|ns| ns == "pay.x0");
        b.set_patterns(&next, 0.5);
        assert_eq!(b.not_closed(), 1);
        let bound = b.bound();
        assert_eq!((bound.exact, bound.pooled, bound.pool()), (1, 0, 9));
        assert_eq!(bound.cap(0), 9, "one wildcard pattern: the whole pool");
        drop(bound);
        for i in 0..9 {
            assert!(open(&b, &format!("db.c{i}"), t0));
        }
        assert!(!open(&b, "db.c9", t0));
    }
}
