//! The recent past as `/status` and the page show it: the events (most recent first) and
//! the plots' series, and the timer that samples the counters into the series.
//!
//! The sampler runs beside the admin endpoint, every `[admin] history_interval`: for each
//! fallback or strict `[[namespaces]]` entry, it adds up the counters of the namespaces that
//! entry governs (answered, rewritten to `available`, failed fast, sent to the primary,
//! trigger errors) and closes one bucket with their increase. Nothing is counted per
//! request for it beyond the counters `/metrics` already has.

use std::sync::Arc;
use std::time::SystemTime;

use serde::Serialize;
use tokio_util::sync::CancellationToken;

use crate::events::{self, EntrySeries, Event, BUCKETS, MEASURES};
use crate::handles::AdminHandles;
use crate::policy::{Mode, PolicyTable};

/// Samples the counters into the series every `history_interval` until `stop`, and into
/// the coarse series every [`events::COARSE`] of them.
pub async fn sample(shared: Arc<AdminHandles>, stop: CancellationToken) {
    let mut last_end = events::unix_ms(SystemTime::now());
    // Fine samples since the last coarse one, and whether a stall was raised in them.
    let (mut fine, mut coarse_stall) = (0u64, false);
    loop {
        let width = shared.config.load().admin_limits.history_interval;
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(width) => {}
        }
        let config = shared.config.load_full();
        let totals = entry_totals(&shared, &config.policy);
        let end = events::unix_ms(SystemTime::now());
        let recent = &shared.metrics.recent;
        let stall = shared.stall.suspected() || recent.events.stall_raised_between(last_end, end);
        let width_ms = u64::try_from(width.as_millis()).unwrap_or(u64::MAX);
        recent.series().sample(end, width_ms, stall, &totals);
        last_end = end;
        fine += 1;
        coarse_stall |= stall;
        if fine == events::COARSE {
            let coarse_width = width_ms.saturating_mul(events::COARSE);
            recent
                .coarse()
                .sample(end, coarse_width, coarse_stall, &totals);
            (fine, coarse_stall) = (0, false);
        }
    }
}

/// Each fallback or strict entry (config order) with the totals of the namespaces it
/// governs. Namespaces past the metrics' label bound share `other` and are in none.
fn entry_totals(
    shared: &AdminHandles,
    table: &PolicyTable,
) -> Vec<(String, events::series::Totals)> {
    let mut out: Vec<(String, events::series::Totals)> = table
        .entries()
        .iter()
        .filter(|p| p.mode != Mode::Passthrough)
        .map(|p| (p.pattern.clone(), [0; MEASURES.len()]))
        .collect();
    for ns in shared.metrics.labelled_namespaces() {
        let Some(p) = ns.split_once('.').and_then(|(db, c)| table.lookup(db, c)) else {
            continue;
        };
        let Some((_, sum)) = out.iter_mut().find(|(name, _)| *name == p.pattern) else {
            continue;
        };
        for (s, n) in sum.iter_mut().zip(shared.metrics.ns_totals(&ns)) {
            *s += n;
        }
    }
    out
}

/// One event, with its time in words and numbers.
#[derive(Debug, Serialize)]
pub struct EventView {
    /// RFC 3339, UTC.
    pub at: String,
    pub seconds_ago: u64,
    #[serde(flatten)]
    pub event: Event,
}

/// The events kept, most recent first.
pub fn events(shared: &AdminHandles) -> Vec<EventView> {
    let now = events::unix_ms(SystemTime::now());
    shared
        .metrics
        .recent
        .events
        .recent()
        .into_iter()
        .map(|event| EventView {
            at: super::text::rfc3339(
                SystemTime::UNIX_EPOCH + std::time::Duration::from_millis(event.at_unix_ms),
            ),
            seconds_ago: now.saturating_sub(event.at_unix_ms) / 1000,
            event,
        })
        .collect()
}

/// The plots' series: the fine ones (their fields at the top level, as before the coarse
/// ones existed) and the coarse ones.
#[derive(Debug, Serialize, Default)]
pub struct HistoryView {
    #[serde(flatten)]
    pub fine: SeriesView,
    /// The same, in buckets `events::COARSE` times wider (3 hours at the default width).
    pub coarse: SeriesView,
}

/// One set of series: the buckets' ends and write-stall bands, and one row per entry that
/// met something in the window (the quiet ones are named only).
#[derive(Debug, Serialize, Default)]
pub struct SeriesView {
    /// The width of a bucket (`[admin] history_interval`); 0 before the first sample.
    pub bucket_seconds: f64,
    /// Buckets kept at most.
    pub max_buckets: usize,
    /// Each bucket's end, unix ms, oldest first.
    pub bucket_ends_unix_ms: Vec<u64>,
    /// A write-stall signal was raised during the bucket.
    pub write_stall: Vec<bool>,
    pub entries: Vec<EntryView>,
    /// Entries with a series in which nothing happened in the window.
    pub quiet_entries: Vec<String>,
}

/// One entry's buckets, oldest first, and their sums over the window.
#[derive(Debug, Serialize)]
pub struct EntryView {
    /// An exact namespace or a pattern (its namespaces together).
    pub entry: String,
    pub answered: Vec<u32>,
    pub rewritten: Vec<u32>,
    pub failed_fast: Vec<u32>,
    pub primary: Vec<u32>,
    pub trigger_errors: Vec<u32>,
    /// Each measure added up over the window, in the order above.
    pub totals: [u64; MEASURES.len()],
}

impl EntryView {
    fn of(e: &EntrySeries) -> EntryView {
        let m = |i| e.measure(i).collect();
        EntryView {
            entry: e.entry.clone(),
            answered: m(0),
            rewritten: m(1),
            failed_fast: m(2),
            primary: m(3),
            trigger_errors: m(4),
            totals: std::array::from_fn(|i| e.sum(i)),
        }
    }

    /// Measure `i` (in `events::MEASURES` order).
    pub fn measure(&self, i: usize) -> &[u32] {
        match i {
            0 => &self.answered,
            1 => &self.rewritten,
            2 => &self.failed_fast,
            3 => &self.primary,
            _ => &self.trigger_errors,
        }
    }
}

pub fn history(shared: &AdminHandles) -> HistoryView {
    let width = shared.config.load().admin_limits.history_interval;
    let recent = &shared.metrics.recent;
    HistoryView {
        fine: SeriesView::of(&recent.series(), width.as_secs_f64()),
        coarse: SeriesView::of(
            &recent.coarse(),
            width.as_secs_f64() * events::COARSE as f64,
        ),
    }
}

impl SeriesView {
    /// `s` as the page reads it; `width` (seconds) before its first sample.
    fn of(s: &events::Series, width: f64) -> SeriesView {
        let (active, quiet): (Vec<&EntrySeries>, Vec<&EntrySeries>) =
            s.entries().iter().partition(|e| e.active());
        SeriesView {
            bucket_seconds: if s.width_ms() == 0 {
                width
            } else {
                s.width_ms() as f64 / 1000.0
            },
            max_buckets: BUCKETS,
            bucket_ends_unix_ms: s.ends().iter().copied().collect(),
            write_stall: s.stall().iter().copied().collect(),
            entries: active.into_iter().map(EntryView::of).collect(),
            quiet_entries: quiet.into_iter().map(|e| e.entry.clone()).collect(),
        }
    }

    /// The bucket ends as `(start, end)` unix ms, oldest first.
    pub fn spans(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        let w = (self.bucket_seconds * 1000.0) as u64;
        self.bucket_ends_unix_ms
            .iter()
            .map(move |&end| (end.saturating_sub(w), end))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::policy::NsPolicy;

    #[test]
    fn entries_add_up_their_namespaces_and_passthrough_has_none() {
        let table = PolicyTable::from_policies(vec![
            NsPolicy::with_defaults("demo.store_inventory", Mode::Fallback),
            NsPolicy::with_defaults("pay.*", Mode::Strict),
            NsPolicy::with_defaults("logs.*", Mode::Passthrough),
        ])
        .unwrap_or_else(|e| panic!("{e}"));
        let mut config = Config::for_upstreams("127.0.0.1:0", vec!["127.0.0.1:1".into()]);
        config.policy = table.clone();
        let shared = crate::handles::Handles::new(Arc::new(config)).admin();
        let m = &shared.metrics;
        for ns in ["pay.a", "pay.b"] {
            let hot = m.ns_hot(ns);
            hot.fail_fast.inc_by(2);
            hot.answered.inc();
            m.trigger_error(ns, "13388");
            m.ladder_attempt(ns, "primary", "answered");
            m.ladder_attempt(ns, "primary", "denied");
        }
        m.rewrite("demo.store_inventory", "retry");
        m.ns_hot("demo.store_inventory").preemptive.inc_by(4);
        m.ns_hot("logs.x").answered.inc();
        let totals = entry_totals(&shared, &table);
        assert_eq!(
            totals,
            vec![
                ("demo.store_inventory".to_string(), [0, 5, 0, 0, 0]),
                ("pay.*".to_string(), [2, 0, 4, 2, 2]),
            ]
        );
    }
}
