//! One prober per fleet: the write probe of each probe id (`[stall_watch.probe] ids`, through
//! every upstream) and the `serverStatus` poll of each shard (`[stall_watch.shards]`) run on
//! one instance, the holder of a lease in Redis (`P:lead:probe:<id>`, `P:lead:shard:<hosts>`:
//! `SET NX PX lease` of this process's own token, so two instances that share a name never
//! both lead, renewed every third of `lease` by its holder). The leader writes its signals
//! to Redis (`P:signal:<kind>:<target>`, kept two leases); the others read them every third
//! of `lease` (values of at most `index::MAX_SIGNAL` bytes: a larger one is not sent) and
//! show them as their own (`/status`, the metrics, and the action: `open_fallback_breakers`
//! acts on them too).
//!
//! A leader that dies stops renewing: its lease expires `lease` after its last renewal, and
//! the next instance to try (every third of `lease`) takes it, so a dead leader is replaced
//! within 2 lease periods. Redis unreachable: every instance leads everything (probes and
//! polls on its own), as without a fleet.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::Script;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::conn::{self, within, LinkError, CLAIM};
use super::Fleet;
use crate::config::{Config, FleetConfig};
use crate::metrics::Metrics;
use crate::stall::{shard_target, Evidence, Observation, SignalKind, StallWatch};
use crate::state::LiveConfig;

/// Added to the place of a signal read from the leader.
const FROM_LEADER: &str = " (probed by the fleet's leader)";

/// A leader's signal as it travels through Redis.
#[derive(Debug, Serialize, Deserialize)]
struct Shared {
    place: String,
    raised: bool,
    summary: String,
    /// While raised: how long ago writes stopped completing, in ms.
    since_ms_ago: u64,
    evidence: Evidence,
}

/// What the task is given.
pub(super) struct Leading {
    pub(super) config: Arc<LiveConfig>,
    pub(super) stall: Arc<StallWatch>,
    pub(super) metrics: Arc<Metrics>,
    pub(super) fleet: FleetConfig,
    pub(super) me: Arc<Fleet>,
}

/// The probe ids and shards to lead (`probe:<id>`, `shard:<hosts>`), with the signal
/// targets of each.
fn wanted(config: &Config) -> Vec<(String, SignalKind, Vec<String>)> {
    let mut out = Vec::new();
    if let Some(p) = &config.stall.probe {
        for id in &p.ids {
            let targets = config.upstreams.iter().map(|u| format!("{u}/{id}"));
            out.push((format!("probe:{id}"), SignalKind::Probe, targets.collect()));
        }
    }
    if let Some(s) = &config.stall.shards {
        for uri in &s.uris {
            let hosts = shard_target(uri);
            out.push((format!("shard:{hosts}"), SignalKind::Composite, vec![hosts]));
        }
    }
    out
}

/// The task: runs until `stop`.
pub(super) async fn run(l: Leading, stop: CancellationToken) {
    let Ok(client) = conn::client(&l.fleet) else {
        return;
    };
    let script = Script::new(CLAIM);
    let mut conn: Option<MultiplexedConnection> = None;
    let every = (l.fleet.lease / 3).max(Duration::from_millis(10));
    loop {
        let config = l.config.load_full();
        let wanted = wanted(&config);
        if !wanted.is_empty() {
            let r = match conn.as_mut() {
                Some(c) => l.round(c, &script, &wanted).await,
                None => match conn::connect(&client, &l.fleet).await {
                    Ok(c) => l.round(conn.insert(c), &script, &wanted).await,
                    Err(e) => Err(e),
                },
            };
            if let Err(e) = r {
                // Alone: lead everything until Redis answers again.
                if l.stall_led_by_others() {
                    tracing::info!(error = %e, "fleet: probing and polling on this instance until Redis answers");
                }
                l.stall.set_led(None);
                conn = None;
            }
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
    }
}

impl Leading {
    fn stall_led_by_others(&self) -> bool {
        // `leads` of a name no id has is true only when this instance leads everything.
        !self.stall.leads("\u{0}")
    }

    fn key(&self, what: &str) -> String {
        format!("{}:lead:{what}", self.fleet.prefix)
    }

    fn signal_key(&self, kind: SignalKind, target: &str) -> String {
        format!("{}:signal:{}:{target}", self.fleet.prefix, kind.as_str())
    }

    /// Takes or renews each lease, publishes the signals of what this instance leads, and
    /// mirrors the others'.
    async fn round(
        &self,
        c: &mut MultiplexedConnection,
        script: &Script,
        wanted: &[(String, SignalKind, Vec<String>)],
    ) -> Result<(), LinkError> {
        let t = self.fleet.timeout;
        let lease_ms = self.fleet.lease.as_millis() as u64;
        let mut led = HashSet::new();
        for (what, _, _) in wanted {
            let mut call = script.key(self.key(what));
            call.arg(&self.me.token).arg(lease_ms);
            let won: i64 = within(t, call.invoke_async(c)).await?;
            if won == 1 {
                led.insert(what.clone());
            }
        }
        let was: Vec<bool> = wanted.iter().map(|(w, ..)| self.stall.leads(w)).collect();
        for ((what, ..), was) in wanted.iter().zip(was) {
            if was != led.contains(what) {
                let role = if led.contains(what) {
                    "leads"
                } else {
                    "follows"
                };
                tracing::info!(what = %what, role, "fleet: prober");
            }
        }
        self.stall.set_led(Some(led.clone()));
        let mut pipe = redis::pipe();
        let mut any = false;
        let signals = self.stall.signals();
        for (_, kind, targets) in wanted.iter().filter(|(w, ..)| led.contains(w)) {
            for s in signals
                .iter()
                .filter(|s| s.kind == *kind && targets.contains(&s.target))
            {
                let shared = Shared {
                    place: s.place.trim_end_matches(FROM_LEADER).to_string(),
                    raised: s.raised,
                    summary: s.summary.clone(),
                    since_ms_ago: s.since.map_or(0, |at| at.elapsed().as_millis() as u64),
                    evidence: s.evidence.clone(),
                };
                let value = serde_json::to_string(&shared).unwrap_or_default();
                pipe.cmd("SET")
                    .arg(self.signal_key(*kind, &s.target))
                    .arg(value)
                    .arg("PX")
                    .arg(lease_ms * 2)
                    .ignore();
                any = true;
            }
        }
        if any {
            within(t, pipe.query_async::<()>(c)).await?;
        }
        let followed: Vec<(SignalKind, &String)> = wanted
            .iter()
            .filter(|(w, ..)| !led.contains(w))
            .flat_map(|(_, kind, targets)| targets.iter().map(move |t| (*kind, t)))
            .collect();
        if followed.is_empty() {
            return Ok(());
        }
        let keys: Vec<String> = followed
            .iter()
            .map(|(k, t)| self.signal_key(*k, t))
            .collect();
        let values = super::index::get_small(c, t, &keys).await?;
        let now = Instant::now();
        for ((kind, target), value) in followed.into_iter().zip(values) {
            let Some(s) = value.and_then(|v| serde_json::from_slice::<Shared>(&v).ok()) else {
                continue;
            };
            let since = now
                .checked_sub(Duration::from_millis(s.since_ms_ago))
                .unwrap_or(now);
            let place = format!("{}{FROM_LEADER}", s.place);
            let o = Observation {
                raised: s.raised,
                since,
                summary: s.summary,
                evidence: s.evidence,
            };
            self.stall.update(&self.metrics, kind, target, &place, o);
        }
        Ok(())
    }
}
