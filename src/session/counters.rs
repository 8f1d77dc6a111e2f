//! Per-session counts, kept locally and added to the shared metrics in batches (every
//! `FLUSH_EVERY` round trips, within `FLUSH_AFTER` of going quiet, and at the end), so a
//! request costs no shared atomic.

use std::sync::Arc;
use std::time::Duration;

use crate::metrics::{LatencyBatch, LatencyHistogram, Metrics, NsHot, REQUEST_SLOTS};

/// A session adds its batched metrics after this many round trips, or this long after the
/// last time, whichever comes first (and when it ends).
const FLUSH_EVERY: u32 = 64;
pub(super) const FLUSH_AFTER: Duration = Duration::from_secs(1);

#[derive(Default)]
pub(super) struct Counters {
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
    /// Governed requests by (command, decision).
    requests: [[u32; REQUEST_SLOTS.1]; REQUEST_SLOTS.0],
    /// Something above is not flushed yet.
    dirty: bool,
}

impl Counters {
    pub(super) fn set_latency(&mut self, h: LatencyHistogram) {
        self.latency = Some(h);
    }

    pub(super) fn is_dirty(&self) -> bool {
        self.dirty
    }

    /// A request no policy looked at.
    pub(super) fn forwarded(&mut self) {
        self.forwards += 1;
        self.dirty = true;
    }

    /// A governed request and what was decided for it.
    pub(super) fn request(&mut self, command: &str, decision: &str) {
        if let Some((c, d)) = Metrics::request_slot(command, decision) {
            self.requests[c][d] += 1;
            self.dirty = true;
        }
    }

    /// A read on `ns` rewritten to `available` before it was sent.
    pub(super) fn preemptive_rewrite(&mut self, metrics: &Metrics, ns: &str) {
        self.hot(metrics, ns);
        self.preemptive += 1;
    }

    /// A read on `ns` answered with a fail-fast error.
    pub(super) fn fail_fast(&mut self, metrics: &Metrics, ns: &str) {
        self.hot(metrics, ns);
        self.fail_fast += 1;
    }

    /// A read on `ns` refused for asking for `available`.
    pub(super) fn refusal(&mut self, metrics: &Metrics, ns: &str) {
        self.hot(metrics, ns);
        self.refusal += 1;
    }

    /// A request's first reply came `elapsed` after it was sent. Flushes every
    /// `FLUSH_EVERY` round trips.
    pub(super) fn round_trip(&mut self, metrics: &Metrics, elapsed: Duration) {
        self.batch.observe(elapsed);
        self.dirty = true;
        if self.batch.len() >= FLUSH_EVERY {
            self.flush(metrics);
        }
    }

    /// Adds everything counted so far to the shared metrics.
    pub(super) fn flush(&mut self, metrics: &Metrics) {
        self.dirty = false;
        self.flush_hot();
        for (c, row) in self.requests.iter_mut().enumerate() {
            for (d, n) in row.iter_mut().enumerate() {
                if *n > 0 {
                    metrics.add_requests(c, d, *n as u64);
                    *n = 0;
                }
            }
        }
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
    pub(super) fn ladder_attempt(
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

    /// An `action` a dry run held back on `ns` (counted at once, through the namespace's
    /// cached handles).
    pub(super) fn dry_run(&mut self, metrics: &Metrics, ns: &str, action: &'static str) {
        self.hot(metrics, ns);
        if let Some(h) = &self.hot {
            metrics.hot_dry_run(h, action);
        }
    }

    /// Documents seen twice in one `available` reply on `ns` (0 too: the series exists
    /// from the first such reply).
    pub(super) fn orphans(&mut self, metrics: &Metrics, ns: &str, n: u64) {
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
        ] {
            if *n > 0 {
                c.inc_by(*n as u64);
                *n = 0;
            }
        }
    }
}
