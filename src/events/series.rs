//! What reads met, per configured `[[namespaces]]` entry, in fixed buckets: the last
//! [`BUCKETS`] samples of the counters' increase (a timer takes them, see
//! `admin::history`), and whether a write-stall signal was raised during each bucket.
//!
//! Memory is bounded: at most [`MAX_SERIES`] entries, each [`BUCKETS`] buckets of
//! [`MEASURES`] counts. An entry is one exact namespace or one pattern (its namespaces
//! added together), so a flood of names under a pattern makes no new series.

use std::collections::VecDeque;

/// What each bucket counts, in this order.
pub const MEASURES: [&str; 5] = [
    "answered",
    "rewritten",
    "failed_fast",
    "primary",
    "trigger_errors",
];

/// Buckets kept per entry (30 minutes of 10 s buckets).
pub const BUCKETS: usize = 180;

/// Entries with a series of their own; entries past it (in config order) have none.
pub const MAX_SERIES: usize = 64;

/// Monotonic totals of one entry, in [`MEASURES`] order.
pub type Totals = [u64; MEASURES.len()];

/// The increase of each measure during one bucket.
pub type Buckets = [u32; MEASURES.len()];

/// One entry's buckets, oldest first, aligned with [`Series::ends`].
#[derive(Debug, Clone)]
pub struct EntrySeries {
    pub entry: String,
    /// The totals at the last sample (what the next one is measured from).
    last: Totals,
    pub buckets: VecDeque<Buckets>,
}

impl EntrySeries {
    /// Something happened in the window.
    pub fn active(&self) -> bool {
        self.buckets.iter().any(|b| b.iter().any(|&n| n > 0))
    }

    /// One measure over the window, oldest first.
    pub fn measure(&self, i: usize) -> impl Iterator<Item = u32> + '_ {
        self.buckets.iter().map(move |b| b[i])
    }

    /// One measure added up over the window.
    pub fn sum(&self, i: usize) -> u64 {
        self.measure(i).map(u64::from).sum()
    }
}

/// Every entry's series, and the buckets' ends and write-stall bands they share.
#[derive(Debug, Default)]
pub struct Series {
    width_ms: u64,
    /// Each bucket's end, unix ms, oldest first.
    ends: VecDeque<u64>,
    /// A write-stall signal was raised during the bucket.
    stall: VecDeque<bool>,
    entries: Vec<EntrySeries>,
    samples: u64,
}

impl Series {
    /// Closes a bucket of `width_ms` ending at `end_ms`. `totals` are the entries in force,
    /// in the order to show them, with their counters' totals now. An entry first seen at
    /// the very first sample counts from zero (the counters started with the proxy); one
    /// that appears later (a reload) counts from its totals now. A change of width starts
    /// the buckets afresh.
    pub fn sample(&mut self, end_ms: u64, width_ms: u64, stall: bool, totals: &[(String, Totals)]) {
        let first = self.samples == 0;
        self.samples += 1;
        if width_ms != self.width_ms {
            self.width_ms = width_ms;
            self.ends.clear();
            self.stall.clear();
            for e in &mut self.entries {
                e.buckets.clear();
            }
        }
        self.ends.push_back(end_ms);
        self.stall.push_back(stall);
        let len = self.ends.len().min(BUCKETS + 1);
        let mut kept: Vec<EntrySeries> = Vec::with_capacity(totals.len().min(MAX_SERIES));
        for (name, now) in totals {
            if kept.len() == MAX_SERIES || kept.iter().any(|e| &e.entry == name) {
                continue;
            }
            let mut e = match self.entries.iter().position(|e| &e.entry == name) {
                Some(i) => self.entries.swap_remove(i),
                None => EntrySeries {
                    entry: name.clone(),
                    last: if first { [0; MEASURES.len()] } else { *now },
                    buckets: std::iter::repeat_n([0; MEASURES.len()], len - 1).collect(),
                },
            };
            let mut b = [0; MEASURES.len()];
            for (i, n) in b.iter_mut().enumerate() {
                *n = u32::try_from(now[i].saturating_sub(e.last[i])).unwrap_or(u32::MAX);
            }
            e.last = *now;
            e.buckets.push_back(b);
            kept.push(e);
        }
        // Entries no longer configured stay, counting nothing, while their window shows
        // something (and there is room).
        for mut e in std::mem::take(&mut self.entries) {
            e.buckets.push_back([0; MEASURES.len()]);
            if kept.len() < MAX_SERIES && e.active() {
                kept.push(e);
            }
        }
        self.entries = kept;
        if self.ends.len() > BUCKETS {
            self.ends.pop_front();
            self.stall.pop_front();
        }
        for e in &mut self.entries {
            while e.buckets.len() > self.ends.len() {
                e.buckets.pop_front();
            }
        }
    }

    /// The width of a bucket, ms (0 before the first sample).
    pub fn width_ms(&self) -> u64 {
        self.width_ms
    }

    /// Each bucket's end, unix ms, oldest first.
    pub fn ends(&self) -> &VecDeque<u64> {
        &self.ends
    }

    /// Whether a write-stall signal was raised during each bucket, oldest first.
    pub fn stall(&self) -> &VecDeque<bool> {
        &self.stall
    }

    pub fn entries(&self) -> &[EntrySeries] {
        &self.entries
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(n: [u64; 5]) -> Totals {
        n
    }

    #[test]
    fn buckets_hold_the_increase_and_stay_aligned() {
        let mut s = Series::default();
        s.sample(10, 10, false, &[("a.x".into(), t([5, 0, 0, 0, 1]))]);
        s.sample(20, 10, true, &[("a.x".into(), t([8, 2, 0, 0, 1]))]);
        let e = &s.entries()[0];
        assert_eq!(
            e.buckets.iter().copied().collect::<Vec<_>>(),
            vec![[5, 0, 0, 0, 1], [3, 2, 0, 0, 0]]
        );
        assert_eq!(
            s.stall().iter().copied().collect::<Vec<_>>(),
            vec![false, true]
        );
        assert_eq!(s.ends().iter().copied().collect::<Vec<_>>(), vec![10, 20]);
        assert_eq!(e.sum(0), 8);
        // A later entry starts from its totals now, padded to the shared length.
        s.sample(
            30,
            10,
            false,
            &[
                ("a.x".into(), t([8, 2, 0, 0, 1])),
                ("b.*".into(), t([100, 0, 0, 0, 0])),
            ],
        );
        let b = &s.entries()[1];
        assert_eq!(b.entry, "b.*");
        assert_eq!(b.buckets.len(), 3);
        assert!(
            !b.active(),
            "no spike of the totals counted before it was sampled"
        );
    }

    #[test]
    fn memory_is_bounded_in_time_and_entries() {
        let mut s = Series::default();
        let many: Vec<(String, Totals)> = (0..MAX_SERIES + 20)
            .map(|i| (format!("db.c{i}"), t([0; 5])))
            .collect();
        for k in 0..(BUCKETS as u64 + 50) {
            let totals: Vec<(String, Totals)> = many
                .iter()
                .map(|(n, _)| (n.clone(), t([k, k, 0, 0, 0])))
                .collect();
            s.sample(k * 10, 10, false, &totals);
        }
        assert_eq!(s.entries().len(), MAX_SERIES);
        assert_eq!(s.ends().len(), BUCKETS);
        assert_eq!(s.stall().len(), BUCKETS);
        assert!(s.entries().iter().all(|e| e.buckets.len() == BUCKETS));
        assert_eq!(s.entries()[0].entry, "db.c0", "config order kept");
    }

    #[test]
    fn an_entry_removed_stays_while_its_window_shows_something() {
        let mut s = Series::default();
        s.sample(1, 1, false, &[("a.x".into(), t([0; 5]))]);
        s.sample(2, 1, false, &[("a.x".into(), t([4, 0, 0, 0, 0]))]);
        s.sample(3, 1, false, &[]);
        assert_eq!(s.entries().len(), 1);
        assert_eq!(s.entries()[0].buckets.len(), 3);
        for k in 4..(BUCKETS as u64 + 5) {
            s.sample(k, 1, false, &[]);
        }
        assert!(s.entries().is_empty(), "dropped once its window is empty");
    }

    #[test]
    fn a_counter_that_goes_back_counts_nothing_and_a_new_width_starts_afresh() {
        let mut s = Series::default();
        s.sample(1, 1, false, &[("a.x".into(), t([9; 5]))]);
        s.sample(2, 1, false, &[("a.x".into(), t([3; 5]))]);
        assert_eq!(s.entries()[0].buckets[1], [0; 5]);
        s.sample(3, 5, false, &[("a.x".into(), t([4; 5]))]);
        assert_eq!(s.ends().len(), 1);
        assert_eq!(
            s.entries()[0].buckets.iter().copied().collect::<Vec<_>>(),
            vec![[1; 5]]
        );
        assert_eq!(s.width_ms(), 5);
    }
}
