//! The passive signal: writes relayed through each upstream, how long the ones mongos has
//! started have waited, and when a write last got a reply. Sessions keep their own list of
//! writes in flight ([`WriteTracker`]) and publish two numbers through atomics; the watch's
//! tick sums them per upstream. Nothing here runs for a request that is not a write.
//!
//! What counts is what the cluster does, never what a client does: a write waits from its
//! turn (mongos serves a connection's requests in order, so a write queued behind an
//! awaitable hello or a long getMore has not started), it is done when any reply to it
//! arrives (an error is progress too), a write whose reply the relay holds back because the
//! client does not read is not waiting on the server, and a session that ends takes its writes
//! with it. One connection is one client's word: the rule needs [`MIN_CONNECTIONS`], from at
//! least `min_client_addresses` client addresses (two by default: one client can open any
//! number of connections).
//!
//! A raised signal has hysteresis: clients that give up (their writes leave with their
//! sessions) end the evidence but are no progress, so it stays raised until a write is
//! answered, or until `clear_after` has passed without its rule holding.

use std::collections::HashSet;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::time::Instant;

use super::{lock, StallWatch};

/// Client connections that must each have a write waiting `stall_after` or longer: the
/// writes of one connection may be that client's own doing (a slow multi-update, a write
/// queued in a way the proxy cannot see), never the cluster's word alone.
pub const MIN_CONNECTIONS: u32 = 2;

/// Commands whose reply says a write finished (`moreToCome` writes get none and are not
/// counted). `findandmodify` is the legacy spelling drivers still accept.
pub fn is_write_command(name: &str) -> bool {
    is_write_key(name.as_bytes())
}

/// [`is_write_command`] on the name's bytes (`wire::Request::command_key`).
pub fn is_write_key(name: &[u8]) -> bool {
    matches!(
        name,
        b"insert" | b"update" | b"delete" | b"findAndModify" | b"findandmodify" | b"bulkWrite"
    )
}

/// What one session publishes: its writes waiting (started by mongos, reply not arrived,
/// the upstream being read) and when the oldest of them started.
#[derive(Debug, Default)]
pub struct SessionWrites {
    in_flight: AtomicU32,
    /// The watch's clock (ms since its epoch, plus one) of the oldest write; 0 = none.
    oldest: AtomicU64,
    /// The client's address as the rule counts it (see [`client_key`]); none when the
    /// session did not say (counted as one address shared by all such sessions).
    client: Option<IpAddr>,
}

/// Addresses the sampler tells apart at most: enough for any `min_client_addresses`.
const MAX_ADDRESSES: usize = 1000;

/// The address a client counts as: IPv4 as it is (an IPv4-mapped IPv6 address as its IPv4),
/// IPv6 by its /64 prefix (one host may use many addresses of its prefix).
pub fn client_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let s = v6.segments();
                IpAddr::V6(std::net::Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
            }
        },
    }
}

/// Everything relayed through one upstream.
#[derive(Debug)]
pub struct UpstreamWrites {
    pub addr: String,
    sessions: Mutex<Vec<Weak<SessionWrites>>>,
    completed: AtomicU64,
    failed: AtomicU64,
    abandoned: AtomicU64,
    /// The watch's clock of the last reply to a write (ok or not); 0 = never.
    last_reply: AtomicU64,
    /// Owned by the watch's tick.
    pub(super) eval: Mutex<PassiveEval>,
}

/// The tick's memory of one upstream.
#[derive(Debug, Default)]
pub(super) struct PassiveEval {
    pub raised: bool,
    /// The watch's clock when the rule last held (0: not since the signal last cleared).
    pub held_at: u64,
    /// Counter values already exported as metrics.
    pub exported: [u64; 3],
}

impl PassiveEval {
    /// Whether the signal is raised now, given whether its rule holds: it rises with the
    /// rule, and once raised it clears only when a write was answered after the rule last
    /// held (`last_reply` is the watch's clock of the last reply to a write) or when the
    /// rule has not held for `clear_after` (clients leaving end the evidence, but are no
    /// progress of the cluster).
    pub fn judge(&mut self, rule: bool, now: u64, last_reply: u64, clear_after: Duration) -> bool {
        let raised = if rule {
            self.held_at = now;
            true
        } else {
            let answered = last_reply > self.held_at;
            let lapsed = now.saturating_sub(self.held_at) >= clear_after.as_millis() as u64;
            self.raised && !answered && !lapsed
        };
        if !raised {
            self.held_at = 0;
        }
        self.raised = raised;
        raised
    }
}

/// One upstream's writes right now, as the rule sees them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PassiveSample {
    /// Writes waiting: started by mongos, no reply yet, over live sessions.
    pub in_flight: u32,
    /// Client connections with a write waiting `stall_after` or longer.
    pub connections: u32,
    /// Client addresses (see [`client_key`]) among those connections, at most
    /// `MAX_ADDRESSES`.
    pub addresses: u32,
    pub oldest_age: Option<Duration>,
    /// Time since the last reply to a write (an error included); none when none ever came.
    pub since_reply: Option<Duration>,
    /// The watch's clock of the last reply to a write; 0: never.
    pub last_reply_at: u64,
    pub completed: u64,
    pub failed: u64,
    pub abandoned: u64,
}

/// What the rule asks for, beside `stall_after`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Needs {
    /// Writes waiting in all.
    pub min_in_flight: u32,
    /// Client addresses with a write waiting `stall_after`.
    pub min_addresses: u32,
}

/// The rule: at least `min_in_flight` writes waiting, on at least [`MIN_CONNECTIONS`]
/// connections from at least `min_addresses` client addresses that each have one waiting
/// `stall_after` or longer, and no write answered (ok or not) within `stall_after`. No
/// writes waiting is never a stall.
pub fn stalled(s: &PassiveSample, stall_after: Duration, needs: Needs) -> bool {
    s.in_flight > 0
        && s.in_flight >= needs.min_in_flight
        && s.connections >= MIN_CONNECTIONS
        && s.addresses >= needs.min_addresses
        && s.oldest_age.is_some_and(|a| a >= stall_after)
        && s.since_reply.is_none_or(|c| c >= stall_after)
}

impl UpstreamWrites {
    pub(super) fn new(addr: &str) -> UpstreamWrites {
        UpstreamWrites {
            addr: addr.to_string(),
            sessions: Mutex::new(Vec::new()),
            completed: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            abandoned: AtomicU64::new(0),
            last_reply: AtomicU64::new(0),
            eval: Mutex::new(PassiveEval::default()),
        }
    }

    fn register(&self, client: Option<IpAddr>) -> Arc<SessionWrites> {
        let slot = Arc::new(SessionWrites {
            client: client.map(client_key),
            ..SessionWrites::default()
        });
        let mut sessions = lock(&self.sessions);
        sessions.retain(|w| w.strong_count() > 0);
        sessions.push(Arc::downgrade(&slot));
        slot
    }

    /// Sums the live sessions (and forgets the ended ones); `stall_after` decides which
    /// connections count as having a write waiting that long.
    pub(super) fn sample(&self, now_ms: u64, stall_after: Duration) -> PassiveSample {
        let long_ago = now_ms.saturating_sub(stall_after.as_millis() as u64);
        let (mut in_flight, mut connections, mut oldest) = (0u32, 0u32, u64::MAX);
        let mut addresses: HashSet<Option<IpAddr>> = HashSet::new();
        lock(&self.sessions).retain(|w| match w.upgrade() {
            Some(s) => {
                in_flight = in_flight.saturating_add(s.in_flight.load(Ordering::Relaxed));
                match s.oldest.load(Ordering::Relaxed) {
                    0 => {}
                    o => {
                        oldest = oldest.min(o);
                        if o <= long_ago {
                            connections += 1;
                            if addresses.len() < MAX_ADDRESSES {
                                addresses.insert(s.client);
                            }
                        }
                    }
                }
                true
            }
            None => false,
        });
        let age = |at: u64| Duration::from_millis(now_ms.saturating_sub(at));
        let last = self.last_reply.load(Ordering::Relaxed);
        PassiveSample {
            in_flight,
            connections,
            addresses: addresses.len() as u32,
            oldest_age: (oldest != u64::MAX).then(|| age(oldest)),
            since_reply: (last != 0).then(|| age(last)),
            last_reply_at: last,
            completed: self.completed.load(Ordering::Relaxed),
            failed: self.failed.load(Ordering::Relaxed),
            abandoned: self.abandoned.load(Ordering::Relaxed),
        }
    }
}

/// One write sent and not answered yet.
#[derive(Debug, Clone, Copy)]
struct Write {
    request_id: i32,
    /// Its place among the requests of this connection that expect a final reply.
    seq: u64,
    /// The watch's clock when mongos could start it (every request before it answered);
    /// 0 while its turn has not come.
    started: u64,
}

/// A session's writes waiting for their reply (owned by the session; not shared).
#[derive(Debug, Default)]
pub struct WriteTracker {
    /// In the order they were sent.
    writes: Vec<Write>,
    /// The relay is not reading the upstream (the client's outbox is full, or the session
    /// waits on a decompression of the client's): replies that may have arrived are held
    /// back by the client, so nothing here counts as waiting.
    paused: bool,
    /// The client's address, for the rule's count of addresses.
    client: Option<IpAddr>,
    slot: Option<(Arc<SessionWrites>, Arc<UpstreamWrites>)>,
}

impl WriteTracker {
    pub fn is_empty(&self) -> bool {
        self.writes.is_empty()
    }

    /// A write with `request_id` is waiting for its reply.
    pub fn contains(&self, request_id: i32) -> bool {
        self.writes.iter().any(|w| w.request_id == request_id)
    }

    /// Lets go of the room a burst of writes left, once none waits.
    pub fn shrink_idle(&mut self) {
        if self.writes.is_empty() && self.writes.capacity() > 16 {
            self.writes = Vec::new();
        }
    }

    /// Lets go of all the list's room, once none waits (a session gone quiet).
    pub fn trim(&mut self) {
        if self.writes.is_empty() {
            self.writes = Vec::new();
        }
    }

    /// The session's client connected from `ip` (said once, before its first write).
    pub fn client(&mut self, ip: IpAddr) {
        self.client = Some(ip);
    }

    pub fn is_paused(&self) -> bool {
        self.paused
    }

    /// A write with `request_id` went to `upstream`, the `seq`-th request of this connection
    /// that expects a final reply, when `finals_in` final replies had come back: mongos
    /// starts it once the `seq - 1` before it are answered, so it waits from now only if
    /// they are.
    pub fn sent(
        &mut self,
        watch: &StallWatch,
        upstream: &str,
        (request_id, seq, finals_in): (i32, u64, u64),
        now: Instant,
    ) {
        if self.slot.is_none() {
            let up = watch.upstream(upstream);
            self.slot = Some((up.register(self.client), up));
        }
        let started = if finals_in.saturating_add(1) >= seq {
            watch.clock(now)
        } else {
            0
        };
        self.writes.push(Write {
            request_id,
            seq,
            started,
        });
        self.publish();
    }

    /// A reply arrived from the upstream, answering `response_to`; `finals_in` counts the
    /// final replies (no moreToCome) so far, this one included when `is_final`. It answers
    /// a followed write when it is final and both the write's id and its place match
    /// (mongos answers in order: the `finals_in`-th final reply answers request number
    /// `finals_in`; a reply to another request with the same id, staleguard's own included,
    /// never stands for it). Then `ok` is asked whether the write completed (an ok reply,
    /// write errors included) or failed; either way it is progress of the server. `None`:
    /// not known yet (the head of a reply passed on in pieces), given later to
    /// [`WriteTracker::outcome`]. A final reply also passes the turn to the next write in
    /// line. Returns whether it answered a followed write.
    pub fn replied(
        &mut self,
        watch: &StallWatch,
        (response_to, is_final, finals_in): (i32, bool, u64),
        ok: impl FnOnce() -> Option<bool>,
        now: Instant,
    ) -> bool {
        let at = watch.clock(now);
        let answers = |w: &Write| is_final && w.seq == finals_in && w.request_id == response_to;
        let answered = match self.writes.iter().position(answers) {
            Some(i) => {
                self.writes.remove(i);
                self.progress(ok(), at);
                true
            }
            None => false,
        };
        if is_final {
            // A write whose turn for a reply has passed was answered under another
            // responseTo (mongos answers in order; only a misbehaving upstream does this):
            // done, counted as failed.
            while self.writes.first().is_some_and(|w| w.seq <= finals_in) {
                self.writes.remove(0);
                self.progress(Some(false), at);
            }
            for w in self.writes.iter_mut() {
                if w.started == 0 && w.seq <= finals_in.saturating_add(1) {
                    w.started = at;
                }
            }
        }
        self.publish();
        answered
    }

    /// The relay stopped (`true`) or resumed reading the upstream. While stopped, nothing
    /// counts as waiting; on resuming, the writes already started wait from then (the
    /// pause was the client's doing, and their replies may be in the socket).
    pub fn set_paused(&mut self, paused: bool, watch: &StallWatch, now: Instant) {
        if self.paused == paused {
            return;
        }
        self.paused = paused;
        if !paused {
            let at = watch.clock(now);
            for w in self.writes.iter_mut().filter(|w| w.started != 0) {
                w.started = at;
            }
        }
        self.publish();
    }

    /// The session ended with writes unanswered: they stop counting at once. Not progress,
    /// only noted.
    pub fn abandon(&mut self) {
        if let Some((_, up)) = &self.slot {
            up.abandoned
                .fetch_add(self.writes.len() as u64, Ordering::Relaxed);
        }
        self.writes.clear();
        self.publish();
    }

    fn progress(&self, ok: Option<bool>, at: u64) {
        let Some((_, up)) = &self.slot else {
            return;
        };
        if let Some(ok) = ok {
            self.outcome(ok);
        }
        up.last_reply.fetch_max(at, Ordering::Relaxed);
    }

    /// The outcome of a write whose reply was heard of (`replied`) before it was known:
    /// completed (an ok reply, write errors included) or failed.
    pub fn outcome(&self, ok: bool) {
        let Some((_, up)) = &self.slot else {
            return;
        };
        let counter = if ok { &up.completed } else { &up.failed };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Stores the writes waiting (started, upstream read) and the oldest start.
    fn publish(&self) {
        let Some((slot, _)) = &self.slot else {
            return;
        };
        let (mut n, mut oldest) = (0u32, 0u64);
        if !self.paused {
            for w in self.writes.iter().filter(|w| w.started != 0) {
                n += 1;
                oldest = if oldest == 0 {
                    w.started
                } else {
                    oldest.min(w.started)
                };
            }
        }
        slot.in_flight.store(n, Ordering::Relaxed);
        slot.oldest.store(oldest, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const AFTER: Duration = Duration::from_secs(5);

    /// `in_flight` writes waiting on `connections` connections (that long, from as many
    /// addresses), the oldest for `oldest` ms, the last reply `since_reply` ms ago.
    fn sample(
        in_flight: u32,
        connections: u32,
        oldest: u64,
        since_reply: Option<u64>,
    ) -> PassiveSample {
        PassiveSample {
            in_flight,
            connections,
            addresses: connections,
            last_reply_at: 0,
            oldest_age: (in_flight > 0).then(|| Duration::from_millis(oldest)),
            since_reply: since_reply.map(Duration::from_millis),
            completed: 0,
            failed: 0,
            abandoned: 0,
        }
    }

    #[test]
    fn the_rule() {
        // (sample, min_in_flight, stalled)
        let table = [
            // No traffic is never a stall.
            (sample(0, 0, 0, None), 1, false),
            (sample(0, 0, 0, Some(60_000)), 1, false),
            // Two connections waiting long enough, no reply for as long.
            (sample(2, 2, 5_000, Some(5_000)), 1, true),
            (sample(3, 2, 9_000, None), 1, true),
            (sample(9, 5, 9_000, Some(9_000)), 1, true),
            // One connection is one client's word, however many writes it has waiting.
            (sample(1, 1, 9_000, None), 1, false),
            (sample(50, 1, 9_000, None), 1, false),
            // Any reply within the window (an error too): the server is making progress.
            (sample(3, 2, 9_000, Some(4_999)), 1, false),
            // Not waiting long enough yet.
            (sample(3, 2, 4_999, Some(9_000)), 1, false),
            // Fewer waiting than required.
            (sample(2, 2, 9_000, None), 3, false),
            (sample(3, 2, 9_000, None), 3, true),
        ];
        for (i, (s, min, want)) in table.into_iter().enumerate() {
            let needs = Needs {
                min_in_flight: min,
                min_addresses: 2,
            };
            assert_eq!(stalled(&s, AFTER, needs), want, "row {i}: {s:?} min {min}");
        }
        // Two connections from one client address are one client's word.
        let one_client = PassiveSample {
            addresses: 1,
            ..sample(2, 2, 9_000, None)
        };
        assert!(!stalled(&one_client, AFTER, NEEDS));
        let alone = Needs {
            min_addresses: 1,
            ..NEEDS
        };
        assert!(
            stalled(&one_client, AFTER, alone),
            "min_client_addresses = 1"
        );
    }

    const NEEDS: Needs = Needs {
        min_in_flight: 1,
        min_addresses: 2,
    };

    #[test]
    fn addresses_count_once_and_ipv6_by_its_prefix() {
        let watch = StallWatch::new();
        let t0 = Instant::now();
        let up = watch.upstream("m:1");
        let ip = |s: &str| s.parse::<IpAddr>().unwrap_or_else(|e| panic!("{s}: {e}"));
        let clients = [
            "10.0.0.1",
            "10.0.0.1",
            "::ffff:10.0.0.1",
            "2001:db8::1",
            "2001:db8::2",
        ];
        let mut trackers: Vec<WriteTracker> = clients
            .iter()
            .map(|c| {
                let mut w = WriteTracker::default();
                w.client(ip(c));
                w.sent(&watch, "m:1", (1, 1, 0), t0);
                w
            })
            .collect();
        let s = up.sample(watch.clock(at(t0, 9_000)), AFTER);
        assert_eq!((s.connections, s.addresses), (5, 2), "{s:?}");
        assert!(stalled(&s, AFTER, NEEDS));
        trackers.truncate(3);
        let s = up.sample(watch.clock(at(t0, 9_000)), AFTER);
        assert_eq!((s.connections, s.addresses), (3, 1), "one IPv4 client");
        assert!(!stalled(&s, AFTER, NEEDS));
    }

    #[test]
    fn a_raised_signal_outlives_clients_giving_up_but_not_an_answer() {
        let clear_after = Duration::from_secs(15);
        let mut e = PassiveEval::default();
        // Rises with the rule at 5 s.
        assert!(!e.judge(false, 1_000, 0, clear_after));
        assert!(e.judge(true, 5_000, 0, clear_after));
        // The clients' sockets time out at 10 s: the rule stops holding, no write answered.
        assert!(e.judge(false, 10_000, 0, clear_after));
        // New writes wait again and the rule holds again at 15 s: still the same raise.
        assert!(e.judge(false, 14_750, 0, clear_after));
        assert!(e.judge(true, 15_000, 0, clear_after));
        // A write answered after that: progress, cleared at once.
        assert!(!e.judge(false, 16_000, 15_500, clear_after));
        // Raised again, then no evidence for clear_after: cleared (zero traffic is no stall).
        assert!(e.judge(true, 20_000, 15_500, clear_after));
        assert!(e.judge(false, 34_999, 15_500, clear_after));
        assert!(!e.judge(false, 35_000, 15_500, clear_after));
        // Never raised: nothing to hold.
        let mut quiet = PassiveEval::default();
        assert!(!quiet.judge(false, 1_000_000, 0, clear_after));
    }

    fn at(t0: Instant, ms: u64) -> Instant {
        t0 + Duration::from_millis(ms)
    }

    #[test]
    fn a_write_waits_from_its_turn_and_is_done_at_any_reply() {
        let watch = StallWatch::new();
        let t0 = Instant::now();
        let up = watch.upstream("m:1");
        let mut a = WriteTracker::default();
        let mut b = WriteTracker::default();
        // a: an awaitable hello (seq 1) then an insert (seq 2): not started until the hello
        // is answered.
        a.sent(&watch, "m:1", (7, 2, 0), t0);
        // b: an insert with nothing before it: started at once.
        b.sent(&watch, "m:1", (1, 1, 0), at(t0, 1_000));
        let now = watch.clock(at(t0, 3_000));
        let s = up.sample(now, Duration::from_secs(2));
        assert_eq!((s.in_flight, s.connections), (1, 1));
        assert_eq!(s.oldest_age, Some(Duration::from_secs(2)));
        // The hello's reply (a final one, answering no write) gives the insert its turn.
        assert!(!a.replied(&watch, (6, true, 1), || Some(true), at(t0, 3_000)));
        let s = up.sample(watch.clock(at(t0, 5_000)), Duration::from_secs(2));
        assert_eq!((s.in_flight, s.connections), (2, 2));
        assert_eq!(s.oldest_age, Some(Duration::from_secs(4)));
        assert_eq!(
            s.since_reply, None,
            "a reply to a read is no write progress"
        );
        // An error reply is progress too.
        assert!(b.replied(&watch, (1, true, 1), || Some(false), at(t0, 5_000)));
        let s = up.sample(watch.clock(at(t0, 5_000)), Duration::from_secs(2));
        assert_eq!((s.in_flight, s.completed, s.failed), (1, 0, 1));
        assert_eq!(s.since_reply, Some(Duration::ZERO));
        assert!(a.replied(&watch, (7, true, 2), || Some(true), at(t0, 6_000)));
        let s = up.sample(watch.clock(at(t0, 6_000)), Duration::from_secs(2));
        assert_eq!((s.in_flight, s.completed, s.oldest_age), (0, 1, None));
    }

    #[test]
    fn pipelined_writes_start_one_after_another() {
        let watch = StallWatch::new();
        let t0 = Instant::now();
        let up = watch.upstream("m:1");
        let mut a = WriteTracker::default();
        for seq in 1..=3 {
            a.sent(&watch, "m:1", (seq as i32, seq, 0), t0);
        }
        let s = up.sample(watch.clock(at(t0, 100)), AFTER);
        assert_eq!(s.in_flight, 1, "only the first has its turn");
        // The second's reply arrives under a wrong responseTo: in order, it was answered.
        assert!(a.replied(&watch, (1, true, 1), || Some(true), at(t0, 100)));
        assert!(!a.replied(&watch, (99, true, 2), || Some(true), at(t0, 200)));
        assert!(a.contains(3) && !a.contains(2));
        let s = up.sample(watch.clock(at(t0, 300)), AFTER);
        assert_eq!((s.in_flight, s.completed, s.failed), (1, 1, 1));
        assert_eq!(s.oldest_age, Some(Duration::from_millis(100)));
        // A reply with a waiting write's id, in another place (answering another request
        // that reused the id), does not answer it; as a final reply it passes the turn.
        let mut c = WriteTracker::default();
        c.sent(&watch, "m:1", (3, 2, 0), t0);
        assert!(!c.replied(&watch, (3, true, 1), || Some(true), at(t0, 100)));
        assert!(c.contains(3));
        assert!(c.replied(&watch, (3, true, 2), || Some(true), at(t0, 200)));
        // A moreToCome reply passes no turn.
        let mut b = WriteTracker::default();
        b.sent(&watch, "m:1", (10, 2, 0), t0);
        assert!(!b.replied(&watch, (5, false, 0), || Some(true), t0));
        assert_eq!(up.sample(watch.clock(t0), AFTER).in_flight, 1);
    }

    #[test]
    fn backpressure_and_leaving_stop_the_count() {
        let watch = StallWatch::new();
        let t0 = Instant::now();
        let up = watch.upstream("m:1");
        let mut a = WriteTracker::default();
        a.sent(&watch, "m:1", (1, 1, 0), t0);
        a.set_paused(true, &watch, at(t0, 1_000));
        let s = up.sample(watch.clock(at(t0, 9_000)), AFTER);
        assert_eq!((s.in_flight, s.connections, s.oldest_age), (0, 0, None));
        // Reading again: the write waits from now, not from its start.
        a.set_paused(false, &watch, at(t0, 9_000));
        let s = up.sample(watch.clock(at(t0, 10_000)), AFTER);
        assert_eq!(
            (s.in_flight, s.oldest_age),
            (1, Some(Duration::from_secs(1)))
        );
        a.abandon();
        let s = up.sample(watch.clock(at(t0, 10_000)), AFTER);
        assert_eq!((s.in_flight, s.abandoned, s.oldest_age), (0, 1, None));
        assert_eq!(s.since_reply, None, "a client leaving is no progress");
        drop(a);
        let _ = up.sample(0, AFTER);
        assert!(
            lock(&up.sessions).is_empty(),
            "ended sessions are forgotten"
        );
    }

    #[test]
    fn connections_count_only_with_a_write_waiting_that_long() {
        let watch = StallWatch::new();
        let t0 = Instant::now();
        let up = watch.upstream("m:1");
        let mut a = WriteTracker::default();
        let mut b = WriteTracker::default();
        a.client(IpAddr::from([10, 0, 0, 1]));
        b.client(IpAddr::from([10, 0, 0, 2]));
        a.sent(&watch, "m:1", (1, 1, 0), t0);
        b.sent(&watch, "m:1", (1, 1, 0), at(t0, 4_000));
        let s = up.sample(watch.clock(at(t0, 6_000)), AFTER);
        assert_eq!((s.in_flight, s.connections), (2, 1));
        assert!(!stalled(&s, AFTER, NEEDS));
        let s = up.sample(watch.clock(at(t0, 9_000)), AFTER);
        assert_eq!((s.in_flight, s.connections), (2, 2));
        assert!(stalled(&s, AFTER, NEEDS));
    }
}
