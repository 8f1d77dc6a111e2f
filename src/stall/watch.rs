//! The watch's shared state: every signal (kind, target, raised or clear, evidence), the
//! per-upstream write counters the sessions feed, and whether the action is on.

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use dashmap::DashMap;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use super::{lock, Conditions, UpstreamWrites};
use crate::events::Event;
use crate::metrics::{Metrics, SignalKind as SignalKindLabel, SignalLabel};

/// Which signal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SignalKind {
    Passive,
    Probe,
    Composite,
}

impl SignalKind {
    pub fn as_str(self) -> &'static str {
        match self {
            SignalKind::Passive => "passive",
            SignalKind::Probe => "probe",
            SignalKind::Composite => "composite",
        }
    }
}

/// The numbers behind a signal; only the fields of its kind are set.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Evidence {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub writes_in_flight: Option<u32>,
    /// Client connections with a write waiting `stall_after` or longer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub connections_waiting: Option<u32>,
    /// Client addresses those connections come from (IPv6 by /64).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client_addresses_waiting: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub oldest_write_seconds: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_completion_seconds_ago: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub writes_completed: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub writes_abandoned: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub probe_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub probe_latency_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub probe_error: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shard: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server_version: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tickets_available: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queued_writers: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub write_ops_per_second: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub baseline_ops_per_second: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub write_latency_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub conditions: Option<Conditions>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub conditions_held_seconds: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub poll_error: Option<String>,
}

/// One signal on one target.
#[derive(Debug, Clone)]
pub struct Signal {
    pub kind: SignalKind,
    /// Stable key: an upstream address, `upstream/probe id`, a shard URI's hosts.
    pub target: String,
    /// In words: `upstream 127.0.0.1:27017`, `shard A (shardA at host:port)`.
    pub place: String,
    pub raised: bool,
    /// While raised: since when writes have not been completing.
    pub since: Option<Instant>,
    pub since_wall: Option<SystemTime>,
    /// The evidence in one line.
    pub summary: String,
    pub evidence: Evidence,
}

impl Signal {
    /// `writes are not completing on <place> since <time>` while raised.
    pub fn headline(&self) -> Option<String> {
        let since = self.since_wall?;
        Some(format!(
            "writes are not completing {} {} since {}",
            if self.kind == SignalKind::Composite {
                "on"
            } else {
                "through"
            },
            self.place,
            humantime::format_rfc3339_seconds(since)
        ))
    }
}

/// A signal's new reading, from one of the three sources.
#[derive(Debug, Clone)]
pub struct Observation {
    pub raised: bool,
    /// Since when writes have not been completing (used when the signal rises).
    pub since: Instant,
    pub summary: String,
    pub evidence: Evidence,
}

/// The watch's shared state (a handle sessions and the admin endpoint are given).
#[derive(Debug)]
pub struct StallWatch {
    pub(super) epoch: Instant,
    pub(super) upstreams: DashMap<String, Arc<UpstreamWrites>>,
    signals: Mutex<BTreeMap<(SignalKind, String), Signal>>,
    /// The action is on: fallback breakers are held open (sessions hold new ones as they
    /// are read, through `Breakers::hold_on_read`).
    pub(super) holding: AtomicBool,
    /// Some signal was raised at the last tick (to notice the moment every one clears).
    pub(super) was_raised: AtomicBool,
    /// The whole stall: since when some signal has been raised without a moment with none
    /// (the earliest start among the signals raised along the way).
    episode: Mutex<Option<(Instant, SystemTime)>>,
    /// With `[fleet]`: the probe ids (`probe:<id>`) and shards (`shard:<hosts>`) this
    /// instance leads; the others' signals come from their leader through Redis. None (no
    /// fleet, or Redis unreachable): it leads every one.
    led: Mutex<Option<HashSet<String>>>,
}

impl Default for StallWatch {
    fn default() -> Self {
        StallWatch::new()
    }
}

impl StallWatch {
    pub fn new() -> StallWatch {
        StallWatch {
            epoch: Instant::now(),
            upstreams: DashMap::new(),
            signals: Mutex::new(BTreeMap::new()),
            holding: AtomicBool::new(false),
            was_raised: AtomicBool::new(false),
            episode: Mutex::new(None),
            led: Mutex::new(None),
        }
    }

    /// The watch's clock: ms since its epoch, plus one (0 means "none" in the atomics).
    pub(crate) fn clock(&self, now: Instant) -> u64 {
        now.saturating_duration_since(self.epoch).as_millis() as u64 + 1
    }

    /// This instance probes or polls `what` (`probe:<id>`, `shard:<hosts>`) itself.
    pub fn leads(&self, what: &str) -> bool {
        lock(&self.led)
            .as_ref()
            .is_none_or(|led| led.contains(what))
    }

    /// What this instance leads (`probe:<id>`, `shard:<hosts>`, sorted); `None`: every one
    /// (no fleet, or Redis unreachable).
    pub fn led(&self) -> Option<Vec<String>> {
        let led = lock(&self.led);
        let mut v: Vec<String> = led.as_ref()?.iter().cloned().collect();
        v.sort();
        Some(v)
    }

    /// What this instance leads from now on (`None`: everything, as without a fleet).
    pub fn set_led(&self, led: Option<HashSet<String>>) {
        *lock(&self.led) = led;
    }

    /// The tracker of one upstream (created on first use).
    pub fn upstream(&self, addr: &str) -> Arc<UpstreamWrites> {
        if let Some(u) = self.upstreams.get(addr) {
            return u.clone();
        }
        self.upstreams
            .entry(addr.to_string())
            .or_insert_with(|| Arc::new(UpstreamWrites::new(addr)))
            .clone()
    }

    /// True while the action holds fallback breakers open: a session holds the breaker of
    /// a fallback namespace it reads.
    pub fn holding(&self) -> bool {
        self.holding.load(Ordering::SeqCst)
    }

    /// Every signal, raised first, then by kind and target.
    pub fn signals(&self) -> Vec<Signal> {
        let mut v: Vec<Signal> = lock(&self.signals).values().cloned().collect();
        v.sort_by_key(|s| (!s.raised, s.kind, s.target.clone()));
        v
    }

    /// Any signal raised.
    pub fn suspected(&self) -> bool {
        lock(&self.signals).values().any(|s| s.raised)
    }

    /// Since when writes have not been completing, for the stall as a whole: the earliest
    /// start among the signals raised since the last moment none was (a signal that rose
    /// first and cleared while another still holds keeps its start here). None: no signal
    /// raised.
    pub fn stall_since(&self) -> Option<(Instant, SystemTime)> {
        *lock(&self.episode)
    }

    /// The earliest raised signal.
    pub fn first_raised(&self) -> Option<Signal> {
        lock(&self.signals)
            .values()
            .filter(|s| s.raised)
            .min_by_key(|s| s.since)
            .cloned()
    }

    /// Records a reading; logs and counts a change of state.
    pub fn update(
        &self,
        shared_metrics: &Metrics,
        kind: SignalKind,
        target: &str,
        place: &str,
        r: Observation,
    ) {
        let now = Instant::now();
        let mut signals = lock(&self.signals);
        let s = signals
            .entry((kind, target.to_string()))
            .or_insert_with(|| Signal {
                kind,
                target: target.to_string(),
                place: place.to_string(),
                raised: false,
                since: None,
                since_wall: None,
                summary: String::new(),
                evidence: Evidence::default(),
            });
        let was = s.raised;
        s.place = place.to_string();
        s.summary = r.summary;
        s.evidence = r.evidence;
        s.raised = r.raised;
        let m = &shared_metrics.stall;
        if r.raised && !was {
            let since = r.since.min(now);
            s.since = Some(since);
            s.since_wall = Some(SystemTime::now() - now.saturating_duration_since(since));
            m.raised
                .get_or_create(&SignalKindLabel {
                    signal: kind.as_str(),
                })
                .inc();
            let headline = s.headline().unwrap_or_default();
            tracing::warn!(signal = kind.as_str(), target = %place, evidence = %s.summary, "write stall suspected: {headline}");
            let e = Event::stall(
                true,
                kind.as_str(),
                place,
                s.evidence.shard.as_deref(),
                &s.summary,
            );
            shared_metrics.recent.events.record(e);
        } else if !r.raised && was {
            s.since = None;
            s.since_wall = None;
            tracing::info!(signal = kind.as_str(), target = %place, evidence = %s.summary, "write stall signal cleared");
            let e = Event::stall(
                false,
                kind.as_str(),
                place,
                s.evidence.shard.as_deref(),
                &s.summary,
            );
            shared_metrics.recent.events.record(e);
        }
        m.signal
            .get_or_create(&SignalLabel {
                signal: kind.as_str(),
                target: target.to_string(),
            })
            .set(i64::from(r.raised));
        let any = signals.values().any(|s| s.raised);
        m.suspected.set(i64::from(any));
        let earliest = signals
            .values()
            .filter(|s| s.raised)
            .filter_map(|s| s.since.zip(s.since_wall))
            .min_by_key(|(at, _)| *at);
        let mut episode = lock(&self.episode);
        *episode = match (*episode, earliest) {
            (_, None) => None,
            (Some(e), Some(n)) if e.0 <= n.0 => Some(e),
            (_, n) => n,
        };
    }

    /// Forgets the signals of one kind whose target `keep` rejects (config changed).
    pub fn retain(&self, metrics: &Metrics, kind: SignalKind, keep: impl Fn(&str) -> bool) {
        let mut signals = lock(&self.signals);
        signals.retain(|(k, t), _| {
            let stay = *k != kind || keep(t);
            if !stay {
                metrics.stall.signal.remove(&SignalLabel {
                    signal: k.as_str(),
                    target: t.clone(),
                });
                tracing::info!(signal = k.as_str(), target = %t, "write stall signal no longer watched");
            }
            stay
        });
        let any = signals.values().any(|s| s.raised);
        metrics.stall.suspected.set(i64::from(any));
        if !any {
            *lock(&self.episode) = None;
        }
    }
}
