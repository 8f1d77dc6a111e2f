//! One client connection: its own upstream connection, and the relay between the two.
//!
//! ```text
//! mod       the session's state, pairing with an upstream, why a session ends
//! relay     the loop: reads both ways, writes that never block it, stop and kill
//! outbox    what waits to be written to one peer
//! gate      the early gates: open once, pass, follow a write, refuse, or govern
//! request   the governed side: classify, decide, apply
//! reply     the reply side: judge tracked reads (policy::judge), apply verdicts
//! confirm   the cheap read that confirms a time limit before it counts
//! stream    large replies nothing inspects, passed on to the client in pieces
//! counters  per-session counts, batched into the shared metrics
//! writes    the write-stall watch's view: each write from its turn at mongos to its reply
//! ```
//!
//! Requests are classified and decided on as they arrive; replies are looked at only when
//! they answer a tracked read or write. A message that is not rewritten leaves as the very
//! `Bytes` that arrived. Writes (for the write-stall watch) cost a command-name read and a
//! small per-session list; other commands pay nothing more.

mod confirm;
mod counters;
mod gate;
mod outbox;
mod relay;
mod reply;
mod request;
mod stream;
mod writes;

use std::net::SocketAddr;
use std::sync::Arc;

use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::time::Instant;
use tokio_util::codec::FramedRead;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::config::Config;
use crate::handles::SessionHandles;
use crate::stall::WriteTracker;
use crate::tls::Stream;
use crate::wire::codec::FrameError;
use crate::wire::{MessageCodec, WireError};

use counters::Counters;
use outbox::Outbox;
use reply::Tracked;

/// Why a session ended, and which side caused it.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error("client sent a malformed message: {0}")]
    ClientProtocol(WireError),
    #[error("client i/o: {0}")]
    ClientIo(std::io::Error),
    #[error("upstream sent a malformed message: {0}")]
    UpstreamProtocol(WireError),
    #[error("upstream i/o: {0}")]
    UpstreamIo(std::io::Error),
    #[error(
        "client reused requestID {0} while a followed request with that id waits for its reply"
    )]
    ReusedRequestId(i32),
}

impl SessionError {
    /// The client just went away: a reset or a broken pipe (Node.js's `client.close()`
    /// resets its sockets), or a stream cut without a TLS close_notify between two messages
    /// (`at_message_boundary`: nothing of a next message had arrived). Such an end is logged
    /// like a clean close, not as a warning.
    pub fn is_client_close(&self, at_message_boundary: bool) -> bool {
        use std::io::ErrorKind;
        let SessionError::ClientIo(e) = self else {
            return false;
        };
        match e.kind() {
            ErrorKind::ConnectionReset | ErrorKind::ConnectionAborted | ErrorKind::BrokenPipe => {
                true
            }
            ErrorKind::UnexpectedEof => at_message_boundary,
            _ => false,
        }
    }
}

pub struct Session {
    shared: Arc<SessionHandles>,
    /// The config as of the current request (reloads apply from the next request on).
    config: Arc<Config>,
    config_generation: u64,
    peer: SocketAddr,
    id: u64,
    stop: CancellationToken,
    kill: CancellationToken,
    /// Tracked reads waiting for their reply.
    pending: Vec<Tracked>,
    /// The confirming read in flight, if any (at most one per connection).
    confirm: Option<confirm::Confirm>,
    /// Requests sent that still expect a final reply (for a graceful stop).
    outstanding: u32,
    /// The last reply relayed had moreToCome (an exhaust stream is running).
    streaming: bool,
    /// When the oldest request still waiting for its first reply was forwarded.
    waiting_since: Option<Instant>,
    /// Counts not yet added to the shared metrics.
    counters: Counters,
    /// Reused for the "db.coll" key of governed reads.
    ns_buf: String,
    /// Where rewritten requests are written; its allocation comes back once the last one
    /// is sent (`rewrite::rewrite_into`).
    rewrite_buf: bytes::BytesMut,
    /// The namespace of the last tracked read, shared by the tracked reads on it.
    last_tracked_ns: Option<Arc<str>>,
    /// The upstream this client is paired with (its configured address).
    upstream: String,
    /// That upstream's guard on primary-rung reads (`[ladder_guard]`).
    ladder: Option<Arc<crate::upstream::LadderGuard>>,
    /// This connection's share of it (`per_connection_per_second`).
    ladder_share: crate::upstream::ConnLadder,
    /// Scratch space for the orphan estimate on `available` replies.
    ids: crate::wire::dupids::IdSet,
    /// Writes sent and not answered yet (write-stall watch).
    writes: WriteTracker,
    /// Messages waiting to be written, per peer: the loop never waits on a write.
    to_upstream: Outbox,
    to_client: Outbox,
    /// Requests sent upstream that expect a final reply, and final replies received: mongos
    /// answers a connection's requests in order, so a tracked read whose turn has passed
    /// was answered with a wrong `responseTo` and is given up.
    sent_finals: u64,
    finals_in: u64,
}

impl Session {
    pub fn new(
        shared: Arc<SessionHandles>,
        peer: SocketAddr,
        id: u64,
        stop: CancellationToken,
        kill: CancellationToken,
    ) -> Session {
        let config_generation = shared.config.generation();
        let config = shared.config.load_full();
        Session {
            shared,
            config,
            config_generation,
            peer,
            id,
            stop,
            kill,
            pending: Vec::new(),
            confirm: None,
            outstanding: 0,
            streaming: false,
            waiting_since: None,
            counters: Counters::default(),
            ns_buf: String::new(),
            rewrite_buf: bytes::BytesMut::new(),
            last_tracked_ns: None,
            upstream: String::new(),
            ladder: None,
            ladder_share: Default::default(),
            ids: Default::default(),
            writes: WriteTracker::default(),
            to_upstream: Outbox::default(),
            to_client: Outbox::default(),
            sent_finals: 0,
            finals_in: 0,
        }
    }

    /// Relays `client` until either side ends. The session is on the heap (boxed by the
    /// caller): every stage below moves a pointer, not the session, so an idle connection's
    /// task does not hold several copies of it.
    pub async fn run(self: Box<Self>, client: Stream) {
        let span = tracing::info_span!("conn", client.addr = %self.peer, id = self.id);
        self.relay(client).instrument(span).await
    }

    async fn relay(self: Box<Self>, client: Stream) {
        match client {
            // Plain TCP keeps its lock-free owned halves.
            Stream::Plain(c) => {
                let (cr, cw) = c.into_split();
                self.open(cr, cw).await
            }
            c => {
                let (cr, cw) = tokio::io::split(c);
                self.open(cr, cw).await
            }
        }
    }

    /// Waits for the client's first message, then dials its upstream (a client that never
    /// sends one costs no upstream connection) and relays.
    async fn open<CR, CW>(self: Box<Self>, cr: CR, cw: CW)
    where
        CR: AsyncRead + Unpin,
        CW: AsyncWrite + Unpin,
    {
        let max = self.config.max_message_size;
        let mut cr = FramedRead::with_capacity(cr, MessageCodec::new(max), relay::READ_BUFFER);
        let Some(first) = self.first_message(&mut cr).await else {
            return;
        };
        // A stop past its deadline also ends a session still dialing its upstream.
        // Boxed: dialing (TCP, maybe TLS) happens once, and its state need not be part
        // of the session's task for the connection's whole life.
        let connected = tokio::select! {
            c = Box::pin(self.shared.upstreams.connect(&self.config, &self.shared.metrics)) => c,
            _ = self.kill.cancelled() => {
                tracing::debug!("shutdown deadline passed while connecting upstream");
                return;
            }
        };
        let (upstream, router) = match connected {
            Ok(pair) => pair,
            Err(e) => {
                tracing::error!(error = %e, "closing client: no upstream reachable");
                return;
            }
        };
        let upstream_addr = router.addr.clone();
        tracing::debug!(upstream = %upstream_addr, "paired");
        let m = &self.shared.metrics;
        m.client_connections.inc();
        m.client_connections_total.inc();
        let latency = m
            .upstream_latency
            .get_or_create(&crate::metrics::UpstreamLabel {
                upstream: upstream_addr.to_string(),
            })
            .clone();
        let shared = self.shared.clone();
        let mut this = self;
        this.counters.set_latency(latency);
        this.upstream = upstream_addr;
        this.ladder = Some(router.ladder.clone());
        let max = this.config.max_message_size;
        match upstream {
            Stream::Plain(u) => {
                let (ur, uw) = u.into_split();
                let ur = FramedRead::with_capacity(ur, relay::reply_codec(max), relay::READ_BUFFER);
                this.relay_framed(cr, cw, ur, uw, Some(first)).await;
            }
            u => {
                let (ur, uw) = tokio::io::split(u);
                let ur = FramedRead::with_capacity(ur, relay::reply_codec(max), relay::READ_BUFFER);
                this.relay_framed(cr, cw, ur, uw, Some(first)).await;
            }
        }
        shared.metrics.client_connections.dec();
    }

    /// The client's whole first message, within `first_message_timeout` of the session's
    /// start (and `message_timeout` once it starts, `idle_timeout` if shorter); `None` when
    /// the client leaves, misbehaves, is too slow or the proxy stops first.
    async fn first_message<CR: AsyncRead + Unpin>(
        &self,
        cr: &mut FramedRead<CR, MessageCodec>,
    ) -> Option<Bytes> {
        let started = Instant::now();
        let first = self.config.limits.first_message_timeout;
        let tick = self.limits_tick().min(quarter(first));
        loop {
            tokio::select! {
                _ = self.kill.cancelled() => return None,
                _ = self.stop.cancelled() => return None,
                m = cr.next() => return match m {
                    Some(Ok(m)) => Some(m),
                    Some(Err(e)) => {
                        tracing::warn!(error = %client_err(e), "closing client");
                        None
                    }
                    None => None,
                },
                _ = tokio::time::sleep(tick) => {
                    let waited = started.elapsed();
                    let limit = if waited >= first {
                        Some("first_message_timeout")
                    } else {
                        self.overdue(cr.decoder(), waited)
                    };
                    if let Some(limit) = limit {
                        self.limit_hit(limit);
                        return None;
                    }
                }
            }
        }
    }

    /// How often the message deadline, idle and write timeouts are looked at: a quarter of
    /// the shortest, so each acts within 1.25 times its setting.
    fn limits_tick(&self) -> Duration {
        let l = &self.config.limits;
        let shortest = l
            .idle_timeout
            .map_or(l.message_timeout, |i| i.min(l.message_timeout))
            .min(l.write_timeout);
        quarter(shortest)
    }

    /// The limit a client is past: a message started longer than `message_timeout` ago,
    /// or nothing sent for `idle_timeout` (having been `quiet_for`) with nothing in flight.
    fn overdue(&self, codec: &MessageCodec, quiet_for: Duration) -> Option<&'static str> {
        let l = &self.config.limits;
        match codec.partial_since() {
            Some(since) if since.elapsed() >= l.message_timeout => Some("message_timeout"),
            Some(_) => None,
            None if self.outstanding == 0 && l.idle_timeout.is_some_and(|d| quiet_for >= d) => {
                Some("idle_timeout")
            }
            None => None,
        }
    }

    fn limit_hit(&self, limit: &'static str) {
        self.shared.metrics.limits.hit(limit);
        tracing::info!(limit, "closing client: past a limit");
    }

    /// `ns` as the tracked reads keep it: the previous read's `Arc` when it was on the same
    /// namespace (the common case), a new one otherwise.
    fn tracked_ns(&mut self, ns: &str) -> Arc<str> {
        match &self.last_tracked_ns {
            Some(last) if **last == *ns => last.clone(),
            _ => {
                let fresh: Arc<str> = Arc::from(ns);
                self.last_tracked_ns = Some(fresh.clone());
                fresh
            }
        }
    }

    /// Picks up a reloaded config, from the next request on.
    fn refresh_config(&mut self) {
        let generation = self.shared.config.generation();
        if generation != self.config_generation {
            self.config = self.shared.config.load_full();
            self.config_generation = generation;
        }
    }

    fn policy_active(&self) -> bool {
        !self.config.policy.is_passthrough_only()
    }
}

/// A quarter of `d`, at least 10 ms: a limit looked at this often acts within 1.25 times
/// its setting.
fn quarter(d: Duration) -> Duration {
    (d / 4).max(Duration::from_millis(10))
}

/// A tracked read's command name without an allocation when the metrics know it (every read
/// command the policy tracks does).
fn tracked_command(name: &str) -> std::borrow::Cow<'static, str> {
    let known = crate::metrics::Metrics::command_label(name);
    if known == name {
        std::borrow::Cow::Borrowed(known)
    } else {
        std::borrow::Cow::Owned(name.to_string())
    }
}

fn client_err(e: FrameError) -> SessionError {
    match e {
        FrameError::Wire(w) => SessionError::ClientProtocol(w),
        FrameError::Io(io) => SessionError::ClientIo(io),
    }
}

fn upstream_err(e: FrameError) -> SessionError {
    match e {
        FrameError::Wire(w) => SessionError::UpstreamProtocol(w),
        FrameError::Io(io) => SessionError::UpstreamIo(io),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::WireError;
    use std::io::{Error, ErrorKind};

    #[test]
    fn a_client_going_away_is_a_normal_close() {
        let client = |kind| SessionError::ClientIo(Error::new(kind, "x"));
        for kind in [
            ErrorKind::ConnectionReset,
            ErrorKind::ConnectionAborted,
            ErrorKind::BrokenPipe,
        ] {
            assert!(client(kind).is_client_close(false), "{kind:?}");
        }
        assert!(client(ErrorKind::UnexpectedEof).is_client_close(true));
        // Cut in the middle of a message, or any other failure: worth a warning.
        assert!(!client(ErrorKind::UnexpectedEof).is_client_close(false));
        assert!(!client(ErrorKind::Other).is_client_close(true));
        assert!(!SessionError::ClientProtocol(WireError::Truncated("x")).is_client_close(true));
        let upstream = SessionError::UpstreamIo(Error::new(ErrorKind::ConnectionReset, "x"));
        assert!(!upstream.is_client_close(true));
    }
}
