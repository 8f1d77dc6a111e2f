//! Every count a session makes, one way ([`Meter`]): per-request counts kept locally
//! (`Counters`) and added to the shared metrics in batches (every `FLUSH_EVERY` round trips,
//! within `FLUSH_AFTER` of going quiet, and at the end), so a request costs no shared
//! atomic; rare events (a limit hit, a trigger error, a confirming read) counted at once.

use std::sync::Arc;
use std::time::Duration;

use crate::metrics::{LatencyBatch, LatencyHistogram, Metrics, NsHot, REQUEST_SLOTS};

/// The session's one way to the metrics.
pub(super) struct Meter {
    metrics: Arc<Metrics>,
    counters: Counters,
}

impl Meter {
    pub(super) fn new(metrics: Arc<Metrics>) -> Meter {
        Meter {
            metrics,
            counters: Counters::default(),
        }
    }

    /// The client is paired with `upstream`: counted as connected, its round trips timed
    /// in that upstream's latency histogram.
    pub(super) fn connected(&mut self, upstream: &str) {
        let m = &self.metrics;
        m.client_connections.inc();
        m.client_connections_total.inc();
        let label = crate::metrics::UpstreamLabel {
            upstream: upstream.to_string(),
        };
        let latency = m.upstream_latency.get_or_create(&label).clone();
        self.counters.set_latency(latency);
    }

    /// The paired client's session ended.
    pub(super) fn disconnected(&self) {
        self.metrics.client_connections.dec();
    }

    /// Counts not yet added to the shared metrics wait.
    pub(super) fn is_dirty(&self) -> bool {
        self.counters.is_dirty()
    }

    /// Adds everything batched so far to the shared metrics.
    pub(super) fn flush(&mut self) {
        self.counters.flush(&self.metrics);
    }

    /// A limit acted (`limit_hits_total`).
    pub(super) fn limit(&self, limit: &'static str) {
        self.metrics.limits.hit(limit);
    }

    /// Possible evidence set aside (`evidence_ignored_total`).
    pub(super) fn ignored(&self, why: &'static str) {
        self.metrics.limits.ignored(why);
    }

    /// A large compressed request decompressed on the blocking pool.
    pub(super) fn off_worker_decompression(&self) {
        self.metrics.limits.off_worker_decompressions.inc();
    }

    /// A request no policy looked at.
    pub(super) fn forwarded(&mut self) {
        self.counters.forwarded();
    }

    /// A governed request and what was decided for it.
    pub(super) fn request(&mut self, command: &str, decision: &str) {
        self.counters.request(&self.metrics, command, decision);
    }

    /// A read on `ns` rewritten to `available` before it was sent.
    pub(super) fn preemptive_rewrite(&mut self, ns: &str) {
        self.counters.preemptive_rewrite(&self.metrics, ns);
    }

    /// A read on `ns` answered with a fail-fast error.
    pub(super) fn fail_fast(&mut self, ns: &str) {
        self.counters.fail_fast(&self.metrics, ns);
    }

    /// An `action` a dry run held back on `ns`.
    pub(super) fn dry_run(&mut self, ns: &str, action: &'static str) {
        self.counters.dry_run(&self.metrics, ns, action);
    }

    /// A governed read on `ns` whose client gets an `ok: 1` reply.
    pub(super) fn answered(&mut self, ns: &str) {
        self.counters.answered(&self.metrics, ns);
    }

    /// A request on `ns` refused.
    pub(super) fn refusal(&mut self, ns: &str) {
        self.counters.refusal(&self.metrics, ns);
    }

    /// A request's first reply came `elapsed` after it was sent.
    pub(super) fn round_trip(&mut self, elapsed: Duration) {
        self.counters.round_trip(&self.metrics, elapsed);
    }

    /// A rung of a read on `ns` ended (through the namespace's cached handles).
    pub(super) fn ladder_attempt(&mut self, ns: &str, rung: &'static str, result: &'static str) {
        self.counters
            .ladder_attempt(&self.metrics, ns, rung, result);
    }

    /// A rung of a read on `ns` that never went (refused by the guard, or no time left).
    pub(super) fn ladder_not_sent(&self, ns: &str, rung: &'static str, result: &'static str) {
        self.metrics.ladder_attempt(ns, rung, result);
    }

    /// Documents seen twice in one `available` reply on `ns`.
    pub(super) fn orphans(&mut self, ns: &str, n: u64) {
        self.counters.orphans(&self.metrics, ns, n);
    }

    /// A trigger error (or a slow reply) met by a read on `ns`.
    pub(super) fn trigger_error(&self, ns: &str, label: &str) {
        self.metrics.trigger_error(ns, label);
    }

    /// A read on `ns` resent with `available` after a trigger error.
    pub(super) fn retry_rewrite(&self, ns: &str) {
        self.metrics.rewrite(ns, "retry");
    }

    /// A read through `upstream` got no reply past its limit and a grace.
    pub(super) fn upstream_silent(&self, upstream: &str) {
        self.metrics.upstream_silent(upstream);
    }

    /// How a confirming read ended (`confirm_reads_total`).
    pub(super) fn confirm(&self, result: &'static str) {
        self.metrics.breakers.confirm(result);
    }
}

/// A session adds its batched metrics after this many round trips, or this long after the
/// last time, whichever comes first (and when it ends).
const FLUSH_EVERY: u32 = 64;
pub(super) const FLUSH_AFTER: Duration = Duration::from_secs(1);

#[derive(Default)]
struct Counters {
    latency: Option<LatencyHistogram>,
    /// Round-trip latencies not yet in `latency`.
    batch: LatencyBatch,
    /// Requests forwarded without a policy looking at them.
    forwards: u64,
    /// Counters of the last governed namespace this session counted an outcome on, and the
    /// outcomes not added to them yet.
    hot: Option<Arc<NsHot>>,
    preemptive: u32,
    fail_fast: u32,
    refusal: u32,
    answered: u32,
    /// Governed requests by (command, decision).
    requests: RequestCounts,
    /// Something above is not flushed yet.
    dirty: bool,
}

impl Counters {
    fn set_latency(&mut self, h: LatencyHistogram) {
        self.latency = Some(h);
    }

    fn is_dirty(&self) -> bool {
        self.dirty
    }

    /// A request no policy looked at.
    fn forwarded(&mut self) {
        self.forwards += 1;
        self.dirty = true;
    }

    /// A governed request and what was decided for it.
    fn request(&mut self, metrics: &Metrics, command: &str, decision: &str) {
        if let Some((c, d)) = Metrics::request_slot(command, decision) {
            self.requests.add(metrics, c, d);
            self.dirty = true;
        }
    }

    /// A read on `ns` rewritten to `available` before it was sent.
    fn preemptive_rewrite(&mut self, metrics: &Metrics, ns: &str) {
        self.hot(metrics, ns);
        self.preemptive += 1;
    }

    /// A read on `ns` answered with a fail-fast error.
    fn fail_fast(&mut self, metrics: &Metrics, ns: &str) {
        self.hot(metrics, ns);
        self.fail_fast += 1;
    }

    /// A read on `ns` refused for asking for `available`.
    fn refusal(&mut self, metrics: &Metrics, ns: &str) {
        self.hot(metrics, ns);
        self.refusal += 1;
    }

    /// An `action` a dry run held back on `ns` (counted at once, through the namespace's
    /// cached handles).
    fn dry_run(&mut self, metrics: &Metrics, ns: &str, action: &'static str) {
        self.hot(metrics, ns);
        if let Some(h) = &self.hot {
            metrics.hot_dry_run(h, action);
        }
    }

    /// A governed read on `ns` whose client gets an `ok: 1` reply.
    fn answered(&mut self, metrics: &Metrics, ns: &str) {
        self.hot(metrics, ns);
        self.answered += 1;
    }

    /// A request's first reply came `elapsed` after it was sent. Flushes every
    /// `FLUSH_EVERY` round trips.
    fn round_trip(&mut self, metrics: &Metrics, elapsed: Duration) {
        self.batch.observe(elapsed);
        self.dirty = true;
        if self.batch.len() >= FLUSH_EVERY {
            self.flush(metrics);
        }
    }

    /// Adds everything counted so far to the shared metrics.
    fn flush(&mut self, metrics: &Metrics) {
        self.dirty = false;
        self.flush_hot();
        self.requests.flush(metrics);
        if let Some(h) = &self.latency {
            h.flush(&mut self.batch);
        }
        if self.forwards > 0 {
            metrics.forwarded(self.forwards);
            self.forwards = 0;
        }
    }

    /// Makes `ns` the namespace outcomes are counted on (flushing the previous one's).
    /// A read on `ns` that ended at `rung` of its ladder (counted at once, through the
    /// namespace's cached handles: no label to build, no family lock).
    fn ladder_attempt(
        &mut self,
        metrics: &Metrics,
        ns: &str,
        rung: &'static str,
        result: &'static str,
    ) {
        self.hot(metrics, ns);
        if let Some(h) = &self.hot {
            metrics.hot_ladder_attempt(h, rung, result);
        }
    }

    /// Documents seen twice in one `available` reply on `ns` (0 too: the series exists
    /// from the first such reply).
    fn orphans(&mut self, metrics: &Metrics, ns: &str, n: u64) {
        self.hot(metrics, ns);
        if let Some(h) = &self.hot {
            metrics.hot_orphans_estimated(h, n);
        }
    }

    fn hot(&mut self, metrics: &Metrics, ns: &str) {
        if self.hot.as_ref().is_none_or(|h| h.ns != ns) {
            self.flush_hot();
            self.hot = Some(metrics.ns_hot(ns));
        }
        self.dirty = true;
    }

    fn flush_hot(&mut self) {
        let Some(h) = &self.hot else {
            return;
        };
        for (n, c) in [
            (&mut self.preemptive, &h.preemptive),
            (&mut self.fail_fast, &h.fail_fast),
            (&mut self.refusal, &h.refusal),
            (&mut self.answered, &h.answered),
        ] {
            if *n > 0 {
                c.inc_by(*n as u64);
                *n = 0;
            }
        }
    }
}

/// Kinds of (command, decision) a session counts between two flushes before it flushes
/// early: a connection sends few kinds of command.
const KINDS: usize = 4;

/// Governed requests by (command, decision) since the last flush: the few kinds met, each
/// with its place in the metrics' table (`Metrics::request_slot`), instead of a count for
/// each of the table's places in every session.
#[derive(Default)]
struct RequestCounts {
    /// (command, decision, requests).
    kinds: [(u8, u8, u32); KINDS],
    len: u8,
}

impl RequestCounts {
    fn add(&mut self, metrics: &Metrics, c: usize, d: usize) {
        // The table has fewer places than a byte counts (checked below).
        let (c, d) = (c as u8, d as u8);
        let len = usize::from(self.len);
        if let Some(k) = self.kinds[..len].iter_mut().find(|k| k.0 == c && k.1 == d) {
            k.2 += 1;
            return;
        }
        if len == KINDS {
            self.flush(metrics);
        }
        self.kinds[usize::from(self.len)] = (c, d, 1);
        self.len += 1;
    }

    fn flush(&mut self, metrics: &Metrics) {
        for &(c, d, n) in &self.kinds[..usize::from(self.len)] {
            metrics.add_requests(usize::from(c), usize::from(d), u64::from(n));
        }
        self.len = 0;
    }
}

const _: () = assert!(REQUEST_SLOTS.0 <= 256 && REQUEST_SLOTS.1 <= 256);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::CommandDecision;

    fn count(m: &Metrics, command: &'static str, decision: &'static str) -> u64 {
        m.requests
            .get_or_create(&CommandDecision { command, decision })
            .get()
    }

    /// More kinds than the session keeps between flushes: the early flush loses nothing,
    /// and each count reaches its own series.
    #[test]
    fn request_counts_reach_the_metrics_whatever_the_kinds() {
        let m = Metrics::new();
        let mut c = Counters::default();
        let kinds = [
            ("find", "track"),
            ("find", "forward"),
            ("aggregate", "track"),
            ("getMore", "forward"),
            ("insert", "forward"),
            ("find", "track"),
        ];
        for _ in 0..3 {
            for (command, decision) in kinds {
                c.request(&m, command, decision);
            }
        }
        assert!(c.is_dirty());
        c.flush(&m);
        assert_eq!(count(&m, "find", "track"), 6);
        for (command, decision) in &kinds[1..5] {
            assert_eq!(count(&m, command, decision), 3, "{command} {decision}");
        }
        // Flushed counts are not added twice.
        c.flush(&m);
        assert_eq!(count(&m, "find", "track"), 6);
        assert!(size_of::<RequestCounts>() <= 40);
    }
}
