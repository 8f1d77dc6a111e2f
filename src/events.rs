//! The recent past, in bounded memory: a ring of the rare things an operator asks about
//! after an incident (breaker transitions, write-stall signals raised and cleared, config
//! reloads, upstreams going up or down), and per-entry series of what reads met, in fixed
//! buckets (`series`), for the status page's plots.
//!
//! Nothing here is on the per-request path: events are recorded where transitions happen
//! (a mutex on the ring; transitions are rare), and the series are fed by a timer from the
//! counters the metrics already keep. It imports nothing of the crate, so every layer that
//! makes an event can reach it (through `Metrics::recent`).

pub mod series;

use std::collections::VecDeque;
use std::sync::{Mutex, MutexGuard};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;

pub use series::{Buckets, EntrySeries, Series, BUCKETS, MAX_SERIES, MEASURES};

/// Events kept; the oldest is dropped when a new one comes.
pub const CAPACITY: usize = 256;

/// Longest text kept in one field of an event (longer ones are cut at a character boundary
/// and end with `…`): the ring's memory is bounded whatever a reason holds.
pub const MAX_TEXT: usize = 240;

/// What happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    BreakerOpened,
    BreakerClosed,
    WriteStallRaised,
    WriteStallCleared,
    ReloadApplied,
    ReloadRefused,
    UpstreamUp,
    UpstreamDown,
    /// `[fleet]`: Redis answers again (or for the first time): this instance shares again.
    FleetJoined,
    /// `[fleet]`: Redis lost: this instance acts alone.
    FleetLost,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::BreakerOpened => "breaker_opened",
            Kind::BreakerClosed => "breaker_closed",
            Kind::WriteStallRaised => "write_stall_raised",
            Kind::WriteStallCleared => "write_stall_cleared",
            Kind::ReloadApplied => "reload_applied",
            Kind::ReloadRefused => "reload_refused",
            Kind::UpstreamUp => "upstream_up",
            Kind::UpstreamDown => "upstream_down",
            Kind::FleetJoined => "fleet_joined",
            Kind::FleetLost => "fleet_lost",
        }
    }

    /// Bad news (a breaker opened, a stall raised, a reload refused, an upstream down).
    pub fn is_bad(self) -> bool {
        matches!(
            self,
            Kind::BreakerOpened
                | Kind::WriteStallRaised
                | Kind::ReloadRefused
                | Kind::UpstreamDown
                | Kind::FleetLost
        )
    }
}

/// One event.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Event {
    /// Wall clock, milliseconds since the Unix epoch.
    pub at_unix_ms: u64,
    pub kind: Kind,
    /// The namespace (breaker transitions).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// The shard, when it is known (the serverStatus signal names it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shard: Option<String>,
    /// Where, in words: an upstream address, `shard A (shardA at host:port)`, a config file.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub place: Option<String>,
    pub reason: String,
}

impl Event {
    /// An event of `kind` now, with its reason.
    pub fn new(kind: Kind, reason: &str) -> Event {
        Event {
            at_unix_ms: unix_ms(SystemTime::now()),
            kind,
            namespace: None,
            shard: None,
            place: None,
            reason: cut(reason),
        }
    }

    /// A breaker of `ns` opened (or closed), and why.
    pub fn breaker(ns: &str, opened: bool, reason: &str) -> Event {
        let kind = if opened {
            Kind::BreakerOpened
        } else {
            Kind::BreakerClosed
        };
        Event::new(kind, reason).namespace(ns)
    }

    /// A write-stall signal (`passive`, `probe`, `composite`) raised or cleared at `place`
    /// (on `shard` when known), with its evidence in one line.
    pub fn stall(
        raised: bool,
        signal: &str,
        place: &str,
        shard: Option<&str>,
        evidence: &str,
    ) -> Event {
        let kind = if raised {
            Kind::WriteStallRaised
        } else {
            Kind::WriteStallCleared
        };
        Event::new(kind, &format!("{signal}: {evidence}"))
            .place(place)
            .shard(shard)
    }

    /// A health check found upstream `addr` up (or down: `error`).
    pub fn upstream(addr: &str, error: Option<&str>) -> Event {
        match error {
            None => Event::new(Kind::UpstreamUp, "hello answered"),
            Some(e) => Event::new(Kind::UpstreamDown, e),
        }
        .place(addr)
    }

    /// `[fleet]`: this instance (`name`) reached Redis again, or lost it.
    pub fn fleet(connected: bool, name: &str) -> Event {
        if connected {
            Event::new(
                Kind::FleetJoined,
                "Redis answers: openings, budgets and probes are shared",
            )
        } else {
            Event::new(
                Kind::FleetLost,
                "Redis does not answer: acting alone (own breakers, local guard, every probe)",
            )
        }
        .place(name)
    }

    /// A config reload of `file` (asked by `trigger`) applied or refused; `messages`: its
    /// errors, or its warnings.
    pub fn reload(ok: bool, trigger: &str, file: &str, messages: &[String]) -> Event {
        let kind = if ok {
            Kind::ReloadApplied
        } else {
            Kind::ReloadRefused
        };
        let mut reason = format!("asked by {trigger}");
        if let Some(first) = messages.first() {
            reason.push_str(": ");
            reason.push_str(first);
            if messages.len() > 1 {
                reason.push_str(&format!(" (and {} more)", messages.len() - 1));
            }
        }
        Event::new(kind, &reason).place(file)
    }

    pub fn namespace(mut self, ns: &str) -> Event {
        self.namespace = Some(cut(ns));
        self
    }

    pub fn shard(mut self, shard: Option<&str>) -> Event {
        self.shard = shard.map(cut);
        self
    }

    pub fn place(mut self, place: &str) -> Event {
        self.place = Some(cut(place));
        self
    }
}

/// Milliseconds since the Unix epoch (0 before it).
pub fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// `s`, at most [`MAX_TEXT`] bytes.
fn cut(s: &str) -> String {
    if s.len() <= MAX_TEXT {
        return s.to_string();
    }
    let mut end = MAX_TEXT - '…'.len_utf8();
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

/// The ring of the last [`CAPACITY`] events.
#[derive(Debug, Default)]
pub struct Ring {
    inner: Mutex<RingInner>,
}

#[derive(Debug, Default)]
struct RingInner {
    events: VecDeque<Event>,
    /// Events recorded since start (the ring holds the last `CAPACITY` of them).
    total: u64,
}

impl Ring {
    fn lock(&self) -> MutexGuard<'_, RingInner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Keeps `e`, dropping the oldest event when the ring is full.
    pub fn record(&self, e: Event) {
        let mut r = self.lock();
        if r.events.len() == CAPACITY {
            r.events.pop_front();
        }
        r.events.push_back(e);
        r.total += 1;
    }

    /// The events kept, most recent first.
    pub fn recent(&self) -> Vec<Event> {
        self.lock().events.iter().rev().cloned().collect()
    }

    /// Events recorded since start, the dropped ones included.
    pub fn total(&self) -> u64 {
        self.lock().total
    }

    /// A write-stall signal was raised at some time in `(after, until]` (unix ms).
    pub fn stall_raised_between(&self, after: u64, until: u64) -> bool {
        self.lock()
            .events
            .iter()
            .rev()
            .take_while(|e| e.at_unix_ms > after)
            .any(|e| e.kind == Kind::WriteStallRaised && e.at_unix_ms <= until)
    }
}

/// The recent past the status page shows: the events, and the series of what reads met,
/// in fine buckets (`[admin] history_interval`, 30 minutes at the default) and in coarse
/// ones ([`COARSE`] times wider, 3 hours at the default).
#[derive(Debug, Default)]
pub struct Recent {
    pub events: Ring,
    series: Mutex<Series>,
    coarse: Mutex<Series>,
}

/// How many fine buckets one coarse bucket spans.
pub const COARSE: u64 = 6;

impl Recent {
    /// The fine series, to sample into or to read.
    pub fn series(&self) -> MutexGuard<'_, Series> {
        self.series.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The coarse series, to sample into or to read.
    pub fn coarse(&self) -> MutexGuard<'_, Series> {
        self.coarse.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: u64, kind: Kind) -> Event {
        Event {
            at_unix_ms: ms,
            ..Event::new(kind, "why")
        }
    }

    #[test]
    fn ring_keeps_the_last_events_most_recent_first() {
        let r = Ring::default();
        for i in 0..(CAPACITY as u64 + 10) {
            r.record(at(i, Kind::BreakerOpened));
        }
        let v = r.recent();
        assert_eq!(v.len(), CAPACITY);
        assert_eq!(v[0].at_unix_ms, CAPACITY as u64 + 9);
        assert_eq!(v[CAPACITY - 1].at_unix_ms, 10);
        assert_eq!(r.total(), CAPACITY as u64 + 10);
    }

    #[test]
    fn long_texts_are_cut_at_a_character_boundary() {
        let long = "é".repeat(500);
        let e = Event::new(Kind::ReloadRefused, &long).namespace(&long);
        assert!(e.reason.len() <= MAX_TEXT, "{}", e.reason.len());
        assert!(e.reason.ends_with('…'));
        assert!(e.namespace.as_deref().is_some_and(|n| n.len() <= MAX_TEXT));
        assert_eq!(Event::new(Kind::UpstreamUp, "short").reason, "short");
    }

    #[test]
    fn stall_raised_between_looks_only_at_that_span() {
        let r = Ring::default();
        r.record(at(100, Kind::WriteStallRaised));
        r.record(at(200, Kind::BreakerOpened));
        r.record(at(300, Kind::WriteStallCleared));
        assert!(r.stall_raised_between(99, 100));
        assert!(!r.stall_raised_between(100, 300));
        assert!(!r.stall_raised_between(0, 99));
    }

    #[test]
    fn kinds_serialize_as_their_names() {
        let e = at(5, Kind::WriteStallCleared).shard(Some("shardA"));
        let j = serde_json::to_value(&e).unwrap_or_default();
        assert_eq!(j["kind"], "write_stall_cleared");
        assert_eq!(j["kind"], Kind::WriteStallCleared.as_str());
        assert_eq!(j["shard"], "shardA");
        assert!(j.get("namespace").is_none());
    }
}
