//! A session's lifecycle: the stop (finish what is in flight, then close), the kill (the
//! stop's deadline: close whatever the peers do), and the deadlines the session keeps on
//! its client (`first_message_timeout`, `message_timeout`, `idle_timeout`, `write_timeout`),
//! looked at on a tick rather than per message.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::config::Limits;
use crate::wire::MessageCodec;

/// A session that never goes idle adds its batched metrics at least this often (messages).
const FLUSH_MSGS: u64 = 1024;

#[derive(Debug)]
pub(super) struct Life {
    pub(super) stop: CancellationToken,
    pub(super) kill: CancellationToken,
    /// The stop was asked: the session ends once what is in flight is answered and written.
    draining: bool,
    /// The flush timer runs: batched metrics reach the shared ones within `FLUSH_AFTER`
    /// even when the session goes quiet (armed once per batch, not per message).
    flush_armed: bool,
    /// Requests read so far, as the last tick saw them, and since when none came.
    msgs: u64,
    seen_msgs: u64,
    quiet_since: Instant,
}

/// Why a deadline ends a session: the limit's name (the `limit` label).
pub(super) type Limit = &'static str;

impl Life {
    pub(super) fn new(stop: CancellationToken, kill: CancellationToken) -> Life {
        Life {
            stop,
            kill,
            draining: false,
            flush_armed: true,
            msgs: 0,
            seen_msgs: 0,
            quiet_since: Instant::now(),
        }
    }

    pub(super) fn is_draining(&self) -> bool {
        self.draining
    }

    /// The stop was asked (the kill is waited on from now on).
    pub(super) fn drain(&mut self) {
        self.draining = true;
    }

    pub(super) fn flush_armed(&self) -> bool {
        self.flush_armed
    }

    /// The flush timer fired (the batch is flushed).
    pub(super) fn flushed(&mut self) {
        self.flush_armed = false;
    }

    /// True when the flush timer must be armed again: counts wait (`dirty`) and it is not
    /// running.
    pub(super) fn rearm_flush(&mut self, dirty: bool) -> bool {
        let rearm = dirty && !self.flush_armed;
        self.flush_armed |= rearm;
        rearm
    }

    /// The kill, as a busy session sees it: a load of the flag the server sets just before
    /// it cancels the kill token (polling the token would take its lock).
    pub(super) fn killed(flag: &AtomicBool) -> bool {
        flag.load(Ordering::Acquire)
    }

    /// A request was read; true when the batched metrics are due (a client that never
    /// pauses still reaches the shared metrics every `FLUSH_MSGS` messages).
    pub(super) fn request_read(&mut self) -> bool {
        self.msgs += 1;
        self.msgs % FLUSH_MSGS == 0
    }

    /// On the limits tick: how long the client has sent nothing (a tick that finds the
    /// request count unchanged extends the quiet).
    pub(super) fn quiet_for(&mut self, now: Instant) -> Duration {
        if self.msgs != self.seen_msgs {
            (self.seen_msgs, self.quiet_since) = (self.msgs, now);
        }
        now - self.quiet_since
    }
}

/// How often the message deadline, idle and write timeouts are looked at: a quarter of the
/// shortest, so each acts within 1.25 times its setting.
pub(super) fn limits_tick(l: &Limits) -> Duration {
    let shortest = l
        .idle_timeout
        .map_or(l.message_timeout, |i| i.min(l.message_timeout))
        .min(l.write_timeout);
    quarter(shortest)
}

/// The limit a client is past: a message started longer than `message_timeout` ago, or
/// nothing sent for `idle_timeout` (having been `quiet_for`) with nothing in flight
/// (`idle`).
pub(super) fn overdue(
    l: &Limits,
    codec: &MessageCodec,
    quiet_for: Duration,
    idle: bool,
) -> Option<Limit> {
    match codec.partial_since() {
        Some(since) if since.elapsed() >= l.message_timeout => Some("message_timeout"),
        Some(_) => None,
        None if idle && l.idle_timeout.is_some_and(|d| quiet_for >= d) => Some("idle_timeout"),
        None => None,
    }
}

/// A quarter of `d`, at least 10 ms: a limit looked at this often acts within 1.25 times
/// its setting.
pub(super) fn quarter(d: Duration) -> Duration {
    (d / 4).max(Duration::from_millis(10))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_flush_timer_is_armed_once_per_batch() {
        let mut life = Life::new(CancellationToken::new(), CancellationToken::new());
        assert!(life.flush_armed());
        // Armed already: nothing to do, dirty or not.
        assert!(!life.rearm_flush(true));
        life.flushed();
        assert!(!life.rearm_flush(false));
        assert!(life.rearm_flush(true) && life.flush_armed());
        assert!(!life.rearm_flush(true));
    }

    #[test]
    fn a_request_every_flush_msgs_is_due_to_flush() {
        let mut life = Life::new(CancellationToken::new(), CancellationToken::new());
        let due = (0..2 * FLUSH_MSGS).filter(|_| life.request_read()).count();
        assert_eq!(due, 2);
    }

    #[test]
    fn quiet_is_measured_from_the_last_tick_that_saw_a_request() {
        let mut life = Life::new(CancellationToken::new(), CancellationToken::new());
        let later = Instant::now() + Duration::from_secs(3);
        assert!(life.quiet_for(later) >= Duration::from_secs(3));
        life.request_read();
        // A request since the last tick: the quiet starts again.
        assert_eq!(life.quiet_for(later), Duration::ZERO);
        let end = later + Duration::from_secs(1);
        assert_eq!(life.quiet_for(end), Duration::from_secs(1));
    }

    #[test]
    fn deadlines_are_looked_at_four_times_per_shortest_limit() {
        let mut l = crate::config::Config::for_upstreams("127.0.0.1:0", vec![]).limits;
        l.message_timeout = Duration::from_secs(8);
        l.write_timeout = Duration::from_secs(4);
        l.idle_timeout = Some(Duration::from_secs(2));
        assert_eq!(limits_tick(&l), Duration::from_millis(500));
        l.idle_timeout = None;
        assert_eq!(limits_tick(&l), Duration::from_secs(1));
        assert_eq!(quarter(Duration::from_millis(1)), Duration::from_millis(10));
    }
}
