//! The active write probe (`[stall_watch.probe]`): every `interval`, through each upstream and
//! for each probe id, `update({_id: id}, {$set: {at: now}}, {upsert: true})` on the probe
//! collection with the official driver. Slower than `slow`, failed or cut at `timeout`: the
//! signal rises (as soon as `slow` passes, without waiting for the end); a probe that
//! answers within `slow` clears it. `maxTimeMS` would not help: a write stuck in the storage
//! engine does not check for interrupts, so the deadline is the client's.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bson::{doc, Document};
use mongodb::Client;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{lock, Ctx, Evidence, Observation, SignalKind};
use crate::config::{Config, ProbeConfig};
use crate::metrics::{ProbeLabel, ProbeResult};

/// How often a disabled probe looks at the config again.
const IDLE: Duration = Duration::from_secs(1);

/// The settings the probe clients were built from.
#[derive(PartialEq)]
struct Built {
    probe: ProbeConfig,
    upstreams: Vec<String>,
    tls: Option<(Option<std::path::PathBuf>, bool)>,
    connect_timeout: Duration,
}

pub async fn run(shared: Ctx, stop: CancellationToken) {
    let mut built: Option<Built> = None;
    let mut clients: HashMap<String, Client> = HashMap::new();
    let busy: Arc<Mutex<HashSet<String>>> = Arc::default();
    loop {
        let config = shared.config.load_full();
        let Some(probe) = config.stall.probe.clone() else {
            if built.take().is_some() {
                clients.clear();
                shared
                    .stall
                    .retain(&shared.metrics, SignalKind::Probe, |_| false);
            }
            if sleep_or_stop(&stop, IDLE).await {
                return;
            }
            continue;
        };
        let want = Built {
            probe: probe.clone(),
            upstreams: config.upstreams.clone(),
            tls: config
                .upstream_tls
                .as_ref()
                .map(|t| (t.ca.clone(), t.insecure_skip_verify)),
            connect_timeout: config.connect_timeout,
        };
        if built.as_ref() != Some(&want) {
            clients = build_clients(&config, &probe);
            let keys: HashSet<String> = targets(&config.upstreams, &probe).collect();
            shared
                .stall
                .retain(&shared.metrics, SignalKind::Probe, |t| keys.contains(t));
            built = Some(want);
        }
        for (upstream, client) in &clients {
            for id in &probe.ids {
                // With `[fleet]`, an id another instance leads is probed there (its signal
                // comes through Redis).
                if !shared.stall.leads(&format!("probe:{id}")) {
                    continue;
                }
                let key = target(upstream, id);
                if !lock(&busy).insert(key.clone()) {
                    // The last probe is still out (its timeout is at most the interval).
                    continue;
                }
                let task = ProbeTask {
                    shared: shared.clone(),
                    client: client.clone(),
                    upstream: upstream.clone(),
                    id: id.clone(),
                    key,
                    probe: probe.clone(),
                    busy: busy.clone(),
                };
                let stop = stop.clone();
                tokio::spawn(async move {
                    tokio::select! {
                        _ = stop.cancelled() => {}
                        _ = task.run() => {}
                    }
                });
            }
        }
        if sleep_or_stop(&stop, probe.interval).await {
            return;
        }
    }
}

async fn sleep_or_stop(stop: &CancellationToken, d: Duration) -> bool {
    tokio::select! {
        _ = stop.cancelled() => true,
        _ = tokio::time::sleep(d) => false,
    }
}

fn target(upstream: &str, id: &str) -> String {
    format!("{upstream}/{id}")
}

fn targets<'a>(upstreams: &'a [String], p: &'a ProbeConfig) -> impl Iterator<Item = String> + 'a {
    upstreams
        .iter()
        .flat_map(move |u| p.ids.iter().map(move |id| target(u, id)))
}

fn build_clients(config: &Config, p: &ProbeConfig) -> HashMap<String, Client> {
    let mut out = HashMap::new();
    for u in &config.upstreams {
        match client(config, p, u) {
            Ok(c) => {
                out.insert(u.clone(), c);
            }
            Err(e) => {
                tracing::error!(upstream = %u, error = %e, "write probe: cannot set up a driver client")
            }
        }
    }
    out
}

/// A driver client for one upstream: one attempt per probe (no retried writes), the probe
/// timeout for server selection, `[upstream_tls]`'s CA when set.
fn client(
    config: &Config,
    p: &ProbeConfig,
    upstream: &str,
) -> Result<Client, mongodb::error::Error> {
    let creds = p.credentials.as_ref();
    crate::upstream::driver_client(config, upstream, "staleguard-write-probe", p.timeout, creds)
}

struct ProbeTask {
    shared: Ctx,
    client: Client,
    upstream: String,
    id: String,
    key: String,
    probe: ProbeConfig,
    busy: Arc<Mutex<HashSet<String>>>,
}

/// How one probe ended.
enum Outcome {
    Answered(Duration),
    Failed(Duration, String),
    TimedOut(Duration),
}

impl ProbeTask {
    async fn run(self) {
        let started = Instant::now();
        let coll = self
            .client
            .database(&self.probe.db)
            .collection::<Document>(&self.probe.collection);
        let write = coll
            .update_one(
                doc! { "_id": &self.id },
                doc! { "$set": { "at": bson::DateTime::now(), "by": "staleguard" } },
            )
            .upsert(true);
        let write = std::future::IntoFuture::into_future(write);
        tokio::pin!(write);
        let slow = self.probe.slow;
        let first = tokio::select! {
            r = &mut write => Some(r),
            _ = tokio::time::sleep(slow) => None,
        };
        let result = match first {
            Some(r) => Some(r),
            None => {
                // Slow already: say so now, keep waiting up to the deadline.
                self.report_waiting(started);
                let rest = self.probe.timeout.saturating_sub(slow);
                tokio::time::timeout(rest, &mut write).await.ok()
            }
        };
        let elapsed = started.elapsed();
        let outcome = match result {
            Some(Ok(_)) => Outcome::Answered(elapsed),
            Some(Err(e)) => Outcome::Failed(elapsed, e.to_string()),
            None => Outcome::TimedOut(elapsed),
        };
        self.report(started, outcome);
        lock(&self.busy).remove(&self.key);
    }

    fn place(&self) -> String {
        format!("upstream {} (probe {})", self.upstream, self.id)
    }

    fn report_waiting(&self, started: Instant) {
        let waited = started.elapsed();
        self.observe(
            true,
            started,
            format!(
                "probe upsert has not answered after {} ms (slow > {} ms)",
                waited.as_millis(),
                self.probe.slow.as_millis()
            ),
            Some(waited),
            None,
        );
    }

    fn report(&self, started: Instant, outcome: Outcome) {
        let m = &self.shared.metrics.stall;
        let (raised, summary, latency, error, result) = match outcome {
            Outcome::Answered(d) if d <= self.probe.slow => (
                false,
                format!("probe upsert answered in {} ms", d.as_millis()),
                d,
                None,
                "ok",
            ),
            Outcome::Answered(d) => (
                true,
                format!(
                    "probe upsert took {} ms (slow > {} ms)",
                    d.as_millis(),
                    self.probe.slow.as_millis()
                ),
                d,
                None,
                "slow",
            ),
            Outcome::Failed(d, e) => (
                true,
                format!("probe upsert failed after {} ms: {e}", d.as_millis()),
                d,
                Some(e),
                "failed",
            ),
            Outcome::TimedOut(d) => (
                true,
                format!(
                    "probe upsert did not answer within its {} ms deadline",
                    self.probe.timeout.as_millis()
                ),
                d,
                Some("timed out".to_string()),
                "failed",
            ),
        };
        m.probe_seconds
            .get_or_create(&ProbeLabel {
                upstream: self.upstream.clone(),
                id: self.id.clone(),
            })
            .set(latency.as_secs_f64());
        m.probes
            .get_or_create(&ProbeResult {
                upstream: self.upstream.clone(),
                id: self.id.clone(),
                result,
            })
            .inc();
        if raised {
            tracing::debug!(upstream = %self.upstream, id = %self.id, latency_ms = latency.as_millis() as u64, result, "write probe");
        }
        self.observe(raised, started, summary, Some(latency), error);
    }

    fn observe(
        &self,
        raised: bool,
        started: Instant,
        summary: String,
        latency: Option<Duration>,
        error: Option<String>,
    ) {
        // A probe from an older config (its target gone) must not bring its signal back.
        let config = self.shared.config.load();
        let current =
            config.stall.probe.as_ref().is_some_and(|p| {
                p.ids.contains(&self.id) && config.upstreams.contains(&self.upstream)
            });
        if !current {
            return;
        }
        self.shared.stall.update(
            &self.shared.metrics,
            SignalKind::Probe,
            &self.key,
            &self.place(),
            Observation {
                raised,
                since: started,
                summary,
                evidence: Evidence {
                    probe_id: Some(self.id.clone()),
                    probe_latency_ms: latency.map(|d| d.as_secs_f64() * 1000.0),
                    probe_error: error,
                    ..Evidence::default()
                },
            },
        );
    }
}
