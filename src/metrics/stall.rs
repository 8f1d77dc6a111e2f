//! The write-stall watch's metrics (`stall`): every input of every signal, so operators can
//! build their own rules, and the signals themselves. Labels are bounded by the config
//! (upstreams, probe ids, shard URIs).

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::UpstreamLabel;

type FloatGauge = Gauge<f64, AtomicU64>;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct UpstreamResult {
    pub upstream: String,
    pub result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProbeLabel {
    pub upstream: String,
    pub id: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProbeResult {
    pub upstream: String,
    pub id: String,
    pub result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ShardLabel {
    pub shard: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SignalLabel {
    pub signal: &'static str,
    pub target: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SignalKind {
    pub signal: &'static str,
}

#[derive(Default)]
pub struct StallMetrics {
    /// 1 while any write-stall signal is raised.
    pub suspected: Gauge,
    pub signal: Family<SignalLabel, Gauge>,
    pub raised: Family<SignalKind, Counter>,
    pub writes_in_flight: Family<UpstreamLabel, Gauge>,
    pub oldest_write: Family<UpstreamLabel, FloatGauge>,
    pub write_replies: Family<UpstreamResult, Counter>,
    pub probe_seconds: Family<ProbeLabel, FloatGauge>,
    pub probes: Family<ProbeResult, Counter>,
    pub tickets_available: Family<ShardLabel, Gauge>,
    pub queued_writers: Family<ShardLabel, Gauge>,
    pub write_rate: Family<ShardLabel, FloatGauge>,
    pub write_baseline: Family<ShardLabel, FloatGauge>,
    pub write_latency: Family<ShardLabel, FloatGauge>,
    pub composite: Family<ShardLabel, Gauge>,
    pub poll_errors: Family<ShardLabel, Counter>,
}

impl StallMetrics {
    pub(super) fn register(&self, r: &mut Registry) {
        r.register(
            "write_stall_suspected",
            "1 while any write-stall signal is raised",
            self.suspected.clone(),
        );
        r.register(
            "write_stall_signal",
            "Write-stall signals by kind (passive, probe, composite) and target: 1 raised, 0 clear",
            self.signal.clone(),
        );
        r.register(
            "write_stall_raised",
            "Times a write-stall signal was raised, by kind",
            self.raised.clone(),
        );
        r.register(
            "writes_in_flight",
            "Relayed writes waiting for their reply, by upstream: from their turn at mongos (earlier requests on the connection answered), while the client reads its replies (moreToCome writes excluded)",
            self.writes_in_flight.clone(),
        );
        r.register(
            "oldest_write_seconds",
            "Time the oldest relayed write has waited since its turn at mongos, by upstream (0 when none)",
            self.oldest_write.clone(),
        );
        r.register(
            "write_replies",
            "Relayed writes by outcome: completed (ok reply), failed (error reply), abandoned (client left first); a completed or failed write is progress of the server",
            self.write_replies.clone(),
        );
        r.register(
            "probe_seconds",
            "Duration of the last write probe, by upstream and probe id (time waited so far when it timed out)",
            self.probe_seconds.clone(),
        );
        r.register(
            "probes",
            "Write probes by result: ok, slow, failed",
            self.probes.clone(),
        );
        r.register(
            "shard_write_tickets_available",
            "serverStatus wiredTiger.concurrentTransactions.write.available, by shard",
            self.tickets_available.clone(),
        );
        r.register(
            "shard_queued_writers",
            "serverStatus globalLock.currentQueue.writers, by shard",
            self.queued_writers.clone(),
        );
        r.register(
            "shard_write_ops_per_second",
            "Rate of opcounters insert+update+delete between two polls, by shard",
            self.write_rate.clone(),
        );
        r.register(
            "shard_write_ops_baseline",
            "Moving average of the write-op rate over healthy polls, by shard",
            self.write_baseline.clone(),
        );
        r.register(
            "shard_write_latency_seconds",
            "delta(opLatencies.writes.latency) / delta(opLatencies.writes.ops) between two polls, by shard",
            self.write_latency.clone(),
        );
        r.register(
            "shard_write_stall",
            "The composite serverStatus rule by shard: 1 raised, 0 clear",
            self.composite.clone(),
        );
        r.register(
            "shard_poll_errors",
            "serverStatus polls that failed, by shard",
            self.poll_errors.clone(),
        );
    }
}

impl std::fmt::Debug for StallMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StallMetrics").finish_non_exhaustive()
    }
}
