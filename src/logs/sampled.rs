//! Lines that repeat with traffic, sampled: each call site of [`sampled!`] writes at most
//! [`BURST`] lines per [`WINDOW`], and the first line it writes after leaving some out
//! carries `suppressed=N` (the lines of that site left out since its last one). So the log
//! grows with what happens, not with how many reads it happens to: a breaker closing on a
//! streak of probes, or a flood of trigger errors, writes a few lines per site every ten
//! seconds however many reads per second there are. Every event is still counted in
//! `/metrics`; transitions (a breaker opening or closing, a stall raised) are never sampled.
//!
//! Nothing here runs on a request that logs nothing: a site's atomics are touched only
//! when its line is due and its level is enabled.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The span over which a site writes at most [`BURST`] lines.
pub const WINDOW: Duration = Duration::from_secs(10);

/// Lines one site writes per [`WINDOW`] at most.
pub const BURST: u32 = 5;

/// One call site's count (a `static` that [`sampled!`] declares at each site).
#[derive(Debug)]
pub struct Site {
    /// The window the count is of (ms since the process's log epoch / WINDOW).
    window: AtomicU64,
    /// Lines asked for in that window.
    count: AtomicU32,
    /// Lines left out since the last one written.
    suppressed: AtomicU64,
}

impl Default for Site {
    fn default() -> Self {
        Site::new()
    }
}

impl Site {
    pub const fn new() -> Site {
        Site {
            window: AtomicU64::new(0),
            count: AtomicU32::new(0),
            suppressed: AtomicU64::new(0),
        }
    }

    /// Whether a line may be written now: `Some(n)` with the lines left out since the last
    /// one written, or `None` (left out, counted).
    pub fn admit(&self) -> Option<u64> {
        static EPOCH: OnceLock<Instant> = OnceLock::new();
        let ms = EPOCH.get_or_init(Instant::now).elapsed().as_millis() as u64;
        self.admit_at(ms)
    }

    /// [`Site::admit`] at `now_ms` (ms since any fixed moment).
    pub fn admit_at(&self, now_ms: u64) -> Option<u64> {
        // Windows are numbered from 1, so that the first call opens one.
        let w = now_ms / WINDOW.as_millis() as u64 + 1;
        let seen = self.window.load(Ordering::Relaxed);
        if w > seen
            && self
                .window
                .compare_exchange(seen, w, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            self.count.store(0, Ordering::Relaxed);
        }
        if self.count.fetch_add(1, Ordering::Relaxed) < BURST {
            Some(self.suppressed.swap(0, Ordering::Relaxed))
        } else {
            self.suppressed.fetch_add(1, Ordering::Relaxed);
            None
        }
    }
}

/// A `tracing` event (`info` or `warn`, then the event's fields and message as for
/// `tracing::info!`) sampled at its call site: see the module docs.
macro_rules! sampled {
    (info, $($arg:tt)+) => {
        $crate::logs::sampled!(@level ::tracing::Level::INFO, info, $($arg)+)
    };
    (warn, $($arg:tt)+) => {
        $crate::logs::sampled!(@level ::tracing::Level::WARN, warn, $($arg)+)
    };
    (@level $level:expr, $event:ident, $($arg:tt)+) => {{
        static SITE: $crate::logs::Site = $crate::logs::Site::new();
        if ::tracing::enabled!($level) {
            match SITE.admit() {
                Some(0) => ::tracing::$event!($($arg)+),
                Some(suppressed) => ::tracing::$event!(suppressed, $($arg)+),
                None => {}
            }
        }
    }};
}
pub(crate) use sampled;

#[cfg(test)]
mod tests {
    use super::*;

    const W: u64 = 10_000;

    #[test]
    fn a_site_writes_a_burst_per_window_then_says_how_many_it_left_out() {
        let s = Site::new();
        // 1,000 calls in the first window: BURST written, the rest counted.
        let written: Vec<u64> = (0..1000).filter_map(|i| s.admit_at(i)).collect();
        assert_eq!(written, vec![0; BURST as usize]);
        // The next window: the first line says how many were left out, then a burst again.
        assert_eq!(s.admit_at(W + 1), Some(1000 - u64::from(BURST)));
        assert_eq!(s.admit_at(W + 2), Some(0));
        // A quiet site writes every line.
        let quiet = Site::new();
        assert_eq!(quiet.admit_at(5), Some(0));
        assert_eq!(quiet.admit_at(3 * W), Some(0));
    }

    #[test]
    fn tenfold_calls_write_as_many_lines() {
        let lines = |per_window: u64| {
            let s = Site::new();
            (0..6 * per_window)
                .filter(|i| s.admit_at(i * W / per_window).is_some())
                .count()
        };
        assert_eq!(lines(25), lines(250));
        assert_eq!(lines(250), 6 * BURST as usize);
    }
}
