//! A request-latency histogram for the per-message path: atomic buckets (no lock), fed in
//! batches that each session keeps locally, so a round trip touches no shared cache line.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::encoding::{EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::{MetricType, TypedMetric};

/// Upper bounds: 50 µs doubling up to about 1.6 s (16 buckets), then +Inf.
const BUCKETS: usize = 16;
const FIRST_BOUND_NS: u64 = 50_000;

fn bucket_of(nanos: u64) -> usize {
    let mut bound = FIRST_BOUND_NS;
    for i in 0..BUCKETS {
        if nanos <= bound {
            return i;
        }
        bound *= 2;
    }
    BUCKETS
}

#[derive(Debug, Default)]
struct Inner {
    counts: [AtomicU64; BUCKETS + 1],
    sum_ns: AtomicU64,
}

/// Shared by every session that talks to one upstream.
#[derive(Debug, Clone, Default)]
pub struct LatencyHistogram {
    inner: Arc<Inner>,
}

impl LatencyHistogram {
    /// Adds a session's batch and empties it.
    pub fn flush(&self, batch: &mut LatencyBatch) {
        if batch.n == 0 {
            return;
        }
        for (shared, local) in self.inner.counts.iter().zip(batch.counts.iter_mut()) {
            if *local != 0 {
                shared.fetch_add(*local as u64, Ordering::Relaxed);
                *local = 0;
            }
        }
        self.inner.sum_ns.fetch_add(batch.sum_ns, Ordering::Relaxed);
        batch.sum_ns = 0;
        batch.n = 0;
    }

    /// (count, sum in seconds, cumulative buckets as (upper bound in seconds, count)).
    pub fn snapshot(&self) -> (u64, f64, Vec<(f64, u64)>) {
        let mut cumulative = 0;
        let mut buckets = Vec::with_capacity(BUCKETS + 1);
        let mut bound = FIRST_BOUND_NS as f64 / 1e9;
        for (i, c) in self.inner.counts.iter().enumerate() {
            cumulative += c.load(Ordering::Relaxed);
            let upper = if i == BUCKETS { f64::INFINITY } else { bound };
            buckets.push((upper, cumulative));
            bound *= 2.0;
        }
        let sum = self.inner.sum_ns.load(Ordering::Relaxed) as f64 / 1e9;
        (cumulative, sum, buckets)
    }
}

impl TypedMetric for LatencyHistogram {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for LatencyHistogram {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let (count, sum, buckets) = self.snapshot();
        encoder.encode_histogram::<NoLabelSet>(sum, count, &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}

/// One session's observations not yet added to the shared histogram.
#[derive(Debug, Default, Clone)]
pub struct LatencyBatch {
    counts: [u32; BUCKETS + 1],
    sum_ns: u64,
    n: u32,
}

impl LatencyBatch {
    pub fn observe(&mut self, d: Duration) {
        let ns = d.as_nanos().min(u64::MAX as u128) as u64;
        self.counts[bucket_of(ns)] += 1;
        self.sum_ns = self.sum_ns.saturating_add(ns);
        self.n += 1;
    }

    pub fn len(&self) -> u32 {
        self.n
    }

    pub fn is_empty(&self) -> bool {
        self.n == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_add_up_in_cumulative_buckets() {
        let h = LatencyHistogram::default();
        let mut b = LatencyBatch::default();
        b.observe(Duration::from_micros(10)); // first bucket (<= 50 µs)
        b.observe(Duration::from_micros(60)); // second (<= 100 µs)
        b.observe(Duration::from_secs(10)); // +Inf
        h.flush(&mut b);
        assert!(b.is_empty());
        let (count, sum, buckets) = h.snapshot();
        assert_eq!(count, 3);
        assert!((sum - 10.00007).abs() < 1e-9, "{sum}");
        assert_eq!(buckets[0], (0.00005, 1));
        assert_eq!(buckets[1].1, 2);
        assert_eq!(buckets[BUCKETS - 1].1, 2);
        assert_eq!(buckets[BUCKETS], (f64::INFINITY, 3));
    }
}
