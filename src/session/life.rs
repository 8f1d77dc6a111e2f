//! A session's lifecycle: the stop (finish what is in flight, then close), the kill (the
//! stop's deadline: close whatever the peers do), and one timer for everything the session
//! does on a clock: the deadlines it keeps on its client (`first_message_timeout`,
//! `message_timeout`, `idle_timeout`, `write_timeout`) and on its upstream, looked at on a
//! tick rather than per message; the batched metrics, which reach the shared ones within
//! `FLUSH_AFTER`; and the buffers an idle connection lets go of.
//!
//! Whatever ends a wait (a token cancelled, the timer) rings the lifecycle's own `Bell`. The
//! relay polls [`Life::wake`] first in every turn, and that poll costs one load of the bell
//! until it rings: the tokens' locks and the timer are polled again only then, never per
//! message.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use tokio::time::{Instant, Sleep};
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

use super::bell::Bell;
use super::counters::FLUSH_AFTER;
use crate::config::Limits;

/// A session that never goes idle adds its batched metrics at least this often (messages).
const FLUSH_MSGS: u64 = 1024;

/// While reads are followed, their deadlines are looked at this often (a coarse tick, not a
/// timer per read): staleguard answers a read mongos left silent within this of its limit
/// and grace.
const READS_TICK: Duration = Duration::from_millis(100);

/// How often a session that carried messages looks again whether it went quiet: one that
/// carried nothing between two looks, with nothing in flight, lets go of its buffers, so
/// within `FLUSH_AFTER + 2 × TRIM_AFTER` of its last message.
const TRIM_AFTER: Duration = Duration::from_millis(500);

/// What ended a wait of the lifecycle, for the relay to hand on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Wake {
    /// The stop was asked: finish what is in flight, then close.
    Stop,
    /// The stop's deadline passed: close now.
    Kill,
    /// The timer: the deadlines kept on the client are due for a look (`tick`), the
    /// batched metrics for a flush (`flush`), the followed reads' deadlines for a look
    /// (`reads`), or several of them.
    Due {
        tick: bool,
        flush: bool,
        reads: bool,
    },
}

/// Why a deadline ends a session: the limit's name (the `limit` label).
pub(super) type Limit = &'static str;

pub(super) struct Life {
    bell: Arc<Bell>,
    /// The bell as a waker: what the tokens and the timer are polled with.
    bell_waker: Waker,
    stop: Pin<Box<WaitForCancellationFutureOwned>>,
    kill: Pin<Box<WaitForCancellationFutureOwned>>,
    /// Made at the first wait, on the runtime the session runs on (a session is made on
    /// the accept loop's runtime and may run on another's, `layout = "per-core"`).
    timer: Option<Pin<Box<Sleep>>>,
    /// The signals and the timer have been polled with the bell since it last rang (or the
    /// timer was last moved): until it rings, nothing of them needs polling.
    primed: bool,
    /// The stop was seen; it was handed on (`draining`).
    stop_seen: bool,
    draining: bool,
    /// The kill was seen.
    killed: bool,
    /// The timer went off and was not handed on yet.
    fired: bool,
    /// How often the deadlines are looked at, and when next.
    tick: Duration,
    next_tick: Instant,
    /// When the batched metrics are due, while some wait.
    flush_at: Option<Instant>,
    /// When the followed reads' deadlines are due for a look, while there are any.
    reads_at: Option<Instant>,
    /// Requests read so far, as the last tick saw them, and since when none came.
    msgs: u64,
    seen_msgs: u64,
    quiet_since: Instant,
    /// A message under way as the ticks saw it: the request count then, and since when.
    partial: Option<(u64, Instant)>,
    /// Messages both ways as the last flush timer saw them (what tells an idle session).
    seen_traffic: u64,
    traffic: u64,
    /// The buffers were let go of since the last message.
    trimmed: bool,
}

impl std::fmt::Debug for Life {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Life")
            .field("draining", &self.draining)
            .field("killed", &self.killed)
            .field("tick", &self.tick)
            .finish_non_exhaustive()
    }
}

impl Life {
    /// A session's lifecycle, whose deadlines are looked at every `tick` from now.
    pub(super) fn new(stop: CancellationToken, kill: CancellationToken, tick: Duration) -> Life {
        let (bell, bell_waker) = Bell::new();
        let now = Instant::now();
        Life {
            bell_waker,
            bell,
            stop: Box::pin(stop.cancelled_owned()),
            kill: Box::pin(kill.cancelled_owned()),
            timer: None,
            primed: false,
            stop_seen: false,
            draining: false,
            killed: false,
            fired: false,
            tick,
            next_tick: now + tick,
            flush_at: None,
            reads_at: None,
            msgs: 0,
            seen_msgs: 0,
            quiet_since: now,
            partial: None,
            seen_traffic: 0,
            traffic: 0,
            trimmed: false,
        }
    }

    /// The deadlines are looked at every `tick` from now on (the first message's wait
    /// uses a shorter one than the relay).
    pub(super) fn set_tick(&mut self, tick: Duration, now: Instant) {
        self.tick = tick;
        self.next_tick = now + tick;
        self.arm();
    }

    /// The next thing the lifecycle has to say, waiting for it. Cancel-safe: what was seen
    /// stays until it is handed on.
    pub(super) fn wake(&mut self) -> impl Future<Output = Wake> + '_ {
        std::future::poll_fn(move |cx| self.poll_wake(cx))
    }

    /// Resolves once the kill has come (for the waits outside the relay's turns: dialing,
    /// a decompression set aside, the close). What else rings meanwhile is kept for the
    /// relay.
    pub(super) fn killed(&mut self) -> impl Future<Output = ()> + '_ {
        std::future::poll_fn(move |cx| {
            self.listen(cx);
            if self.killed {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        })
    }

    fn poll_wake(&mut self, cx: &mut Context<'_>) -> Poll<Wake> {
        self.listen(cx);
        if self.killed {
            return Poll::Ready(Wake::Kill);
        }
        if self.stop_seen && !self.draining {
            self.draining = true;
            return Poll::Ready(Wake::Stop);
        }
        if self.fired {
            self.fired = false;
            let now = Instant::now();
            let tick = now >= self.next_tick;
            let flush = self.flush_at.is_some_and(|at| now >= at);
            let reads = self.reads_at.is_some_and(|at| now >= at);
            if tick {
                self.next_tick = now + self.tick;
            }
            if flush {
                self.flush_at = None;
            }
            if reads {
                self.reads_at = None;
            }
            self.arm();
            return Poll::Ready(Wake::Due { tick, flush, reads });
        }
        Poll::Pending
    }

    /// Polls the signals and the timer with the bell when it rang (or was never primed);
    /// otherwise one load. Leaves the task's waker with the bell.
    fn listen(&mut self, cx: &mut Context<'_>) {
        if self.primed && !self.bell.rang() {
            return;
        }
        // Taken before the polls: whatever goes off after them rings again.
        self.bell.answer(cx);
        let mut bcx = Context::from_waker(&self.bell_waker);
        if !self.stop_seen && self.stop.as_mut().poll(&mut bcx).is_ready() {
            self.stop_seen = true;
        }
        if !self.killed && self.kill.as_mut().poll(&mut bcx).is_ready() {
            self.killed = true;
        }
        let next = self.next_due();
        let timer = self
            .timer
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(next)));
        if !self.fired && timer.as_mut().poll(&mut bcx).is_ready() {
            self.fired = true;
        }
        self.primed = true;
    }

    /// Sets the timer to the next thing due.
    fn arm(&mut self) {
        let at = self.next_due();
        if let Some(timer) = self.timer.as_mut().filter(|t| t.deadline() != at) {
            timer.as_mut().reset(at);
        }
        // Polled again with the bell at the next turn (a timer that went off holds no
        // waker any more).
        self.primed = false;
    }

    /// When the timer is due: the next tick, or the flush or the reads' look when sooner.
    fn next_due(&self) -> Instant {
        [self.flush_at, self.reads_at]
            .into_iter()
            .flatten()
            .fold(self.next_tick, Instant::min)
    }

    /// The stop was asked and handed on: the session ends once what is in flight is
    /// answered and written.
    pub(super) fn is_draining(&self) -> bool {
        self.draining
    }

    /// Counts wait in the meter (`dirty`): they are due within `FLUSH_AFTER`. A clock read
    /// and a timer move once per batch, not per message.
    pub(super) fn counted(&mut self, dirty: bool) {
        if dirty && self.flush_at.is_none() {
            self.flush_at = Some(Instant::now() + FLUSH_AFTER);
            self.arm();
        }
    }

    /// Reads are followed (`watching`): their deadlines are due for a look within
    /// `READS_TICK`. A clock read and a timer move once per look, not per message.
    pub(super) fn watch_reads(&mut self, watching: bool) {
        if watching && self.reads_at.is_none() {
            self.reads_at = Some(Instant::now() + READS_TICK);
            self.arm();
        }
    }

    /// A request was read; true when the batched metrics are due (a client that never
    /// pauses still reaches the shared metrics every `FLUSH_MSGS` messages).
    pub(super) fn request_read(&mut self) -> bool {
        self.msgs += 1;
        self.traffic += 1;
        self.trimmed = false;
        self.msgs % FLUSH_MSGS == 0
    }

    /// A message (or a piece of one) came from the upstream, or a piece of a request from
    /// the client.
    pub(super) fn carried(&mut self) {
        self.traffic += 1;
        self.trimmed = false;
    }

    /// On the flush timer: true when the session carried nothing since the previous look
    /// and has not let go of its buffers yet (the caller does, when nothing is in flight).
    /// Until then the timer keeps looking every `TRIM_AFTER`.
    pub(super) fn went_quiet(&mut self) -> bool {
        let quiet = self.traffic == self.seen_traffic;
        self.seen_traffic = self.traffic;
        if !quiet && !self.trimmed && self.flush_at.is_none() {
            self.flush_at = Some(Instant::now() + TRIM_AFTER);
            self.arm();
        }
        quiet && !self.trimmed
    }

    /// The buffers were let go of (until the next message).
    pub(super) fn trimmed(&mut self) {
        self.trimmed = true;
    }

    /// On the limits tick: how long the message under way (`partial`) has been arriving, as
    /// the ticks saw it (from the first tick that found it, so a deadline acts within one
    /// tick more than its setting); `None` between messages.
    pub(super) fn partial_for(&mut self, now: Instant, partial: bool) -> Option<Duration> {
        if !partial {
            self.partial = None;
            return None;
        }
        match self.partial {
            Some((msgs, since)) if msgs == self.msgs => Some(now - since),
            _ => {
                self.partial = Some((self.msgs, now));
                Some(Duration::ZERO)
            }
        }
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

/// The limit a client is past: a message that has been arriving for `message_timeout`
/// (`partial_for`, `None` between messages), or nothing sent for `idle_timeout` (having been
/// `quiet_for`) with nothing in flight (`idle`).
pub(super) fn overdue(
    l: &Limits,
    partial_for: Option<Duration>,
    quiet_for: Duration,
    idle: bool,
) -> Option<Limit> {
    match partial_for {
        Some(d) if d >= l.message_timeout => Some("message_timeout"),
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
mod tests;
