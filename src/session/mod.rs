//! One client connection: its own upstream connection, and the relay between the two.
//!
//! ```text
//! mod       Session (the task: pairing, then the loop) and Handler (what it owns and
//!           hands each message to); why a session ends
//! relay     the loop: select, turn the wake-up into an event, hand it to its owner
//! life      the lifecycle: stop, kill, the deadlines kept on the client
//! peers     the pair of peers: their outboxes (outbox) and the turn order with mongos
//! request   what happens to a request: the gates (gate), then governed reads decided on
//!           (policy::decide) and carried out; a followed one becomes a Followed
//! followed  one followed read from its request to its last reply: its attempt, slot,
//!           timing and policy; its next step (settle → Next)
//! reply     what happens to a reply, in its phases: head (what it answers: arrival), whole
//!           or pieces, the end of a followed read (judged, heard through the one evidence
//!           gate, settled, carried out)
//! arrival   what a reply answers (Arrival), a large reply judged in pieces (Pieces)
//! reads     what is followed in flight: followed reads (waiting, or waiting for the
//!           cluster's answer), writes, authentication steps (Proof), the ladder share
//! witness   the one evidence gate, as this connection's: its word to the breaker, or a
//!           question to the cluster first
//! gate      the early gates (request + config → Gate); off-worker decompression
//! counters  Meter: every count the session makes, one way; per-request counts batched
//! outbox    what waits to be written to one peer
//! ```
//!
//! Requests are classified and decided on as they arrive; replies are looked at only when
//! they answer a tracked read or write. A message that is not rewritten leaves as the very
//! `Bytes` that arrived. Writes (for the write-stall watch) cost a command-name read and a
//! small per-session list; other commands pay nothing more.

mod arrival;
mod bell;
mod counters;
mod followed;
mod gate;
mod life;
mod outbox;
mod peers;
mod reads;
mod relay;
mod reply;
mod request;
mod upload;
mod witness;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::BytesMut;
use futures::StreamExt;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::time::Instant;
use tokio_util::codec::FramedRead;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::handles::SessionHandles;
use crate::tls::Stream;
use crate::wire::codec::FrameError;
use crate::wire::{Incoming, StreamCodec, WireError};

use counters::Meter;
use life::{Life, Wake};
use peers::Peers;
use reads::Reads;

/// What a session reads a peer through (a client's or an upstream's read side, on any
/// transport): the one bound every stage of the session puts on it.
pub trait Inbound: AsyncRead + Unpin {}
impl<T: AsyncRead + Unpin + ?Sized> Inbound for T {}

/// What a session writes a peer through.
pub trait Outbound: AsyncWrite + Unpin {}
impl<T: AsyncWrite + Unpin + ?Sized> Outbound for T {}

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

/// One client connection's task: pairs the client with an upstream, then relays
/// (`relay.rs`) until either side ends or the proxy stops (`life`).
pub struct Session {
    peer: SocketAddr,
    life: Life,
    /// Its share of the bytes held for mongos (`upload`).
    held: upload::Held,
    h: Handler,
}

/// The client's stream as the session task holds it.
enum Halves {
    Plain(tokio::net::TcpStream),
    #[cfg(target_os = "linux")]
    Ring(staleguard_ring::RingStream),
    Split(tokio::io::ReadHalf<Stream>, tokio::io::WriteHalf<Stream>),
}

/// The upstream's stream when it is on the session thread's io_uring (`layout = "uring"`).
#[cfg(target_os = "linux")]
fn ring(s: &mut Stream) -> Option<&mut staleguard_ring::RingStream> {
    match s {
        Stream::Ring(r) => Some(r),
        _ => None,
    }
}

/// (No io_uring off Linux: never.)
#[cfg(not(target_os = "linux"))]
fn ring(_: &mut Stream) -> Option<&mut tokio::net::TcpStream> {
    None
}

/// What the session owns and hands each message to: a request (`request.rs`), a reply
/// (`reply.rs`).
struct Handler {
    shared: Arc<SessionHandles>,
    /// The config as of the current request (reloads apply from the next request on).
    config: Arc<Config>,
    config_generation: u64,
    /// The connection's id (the breakers count a connection's errors once).
    id: u64,
    /// The upstream this client is paired with (its configured address; a `Box<str>`: the
    /// session keeps 8 bytes less than with a `String`).
    upstream: Box<str>,
    peers: Peers,
    reads: Reads,
    meter: Meter,
    /// Reused for the "db.coll" key of governed reads.
    ns_buf: String,
    /// Where rewritten requests are written; its allocation comes back once the last one
    /// is sent (`rewrite::rewrite_into`).
    rewrite_buf: BytesMut,
    /// A large reply to a followed read or write, judged as it passes in pieces.
    pieces: Option<Box<arrival::Pieces>>,
}

impl Handler {
    /// A session gone quiet (nothing in flight) lets go of what it keeps for the next
    /// request: the rewrite buffer, the namespace key, the followed reads' lists.
    fn trim(&mut self) {
        self.rewrite_buf = BytesMut::new();
        self.ns_buf = String::new();
        self.reads.trim();
    }
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
        let meter = Meter::new(shared.metrics.clone());
        // Until the first message, the deadlines are those of a new client.
        let limits = &config.limits;
        let tick = life::limits_tick(limits).min(life::quarter(limits.first_message_timeout));
        Session {
            peer,
            life: Life::new(stop, kill, tick),
            held: upload::Held::default(),
            h: Handler {
                shared,
                config,
                config_generation,
                id,
                upstream: Box::default(),
                peers: Peers::default(),
                reads: Reads::default(),
                meter,
                ns_buf: String::new(),
                rewrite_buf: BytesMut::new(),
                pieces: None,
            },
        }
    }

    /// The client's address.
    pub fn peer(&self) -> SocketAddr {
        self.peer
    }

    /// The connection's id.
    pub fn id(&self) -> u64 {
        self.h.id
    }

    /// Relays `client` until either side ends. The session is on the heap (boxed by the
    /// caller), and every stage below borrows it: an idle connection's task holds no copy
    /// of it.
    ///
    /// None of the stages is an `async fn`: an `async fn` keeps its arguments twice in its
    /// state (as given, and as the locals its body uses), and whatever a session's task
    /// holds while it waits, every idle connection holds for its whole life.
    pub fn run(mut self: Box<Self>, client: Stream) -> impl Future<Output = ()> {
        // Plain TCP is split into lock-free halves borrowed from the stream, which the task
        // holds (owned halves would share it through an allocation); TLS into halves that
        // share it.
        let mut client = match client {
            Stream::Plain(c) => Halves::Plain(c),
            #[cfg(target_os = "linux")]
            Stream::Ring(c) => Halves::Ring(c),
            tls => {
                let (r, w) = tokio::io::split(tls);
                Halves::Split(r, w)
            }
        };
        async move {
            // On every line the session logs (`logs::ConnSpan`: noted for each poll, entered
            // when something is logged).
            let span = tracing::info_span!("conn", client.addr = %self.peer, id = self.h.id);
            let conn = crate::logs::ConnSpan::new(span);
            // The stages below borrow the session and the client's halves.
            let relay = async {
                match &mut client {
                    Halves::Plain(c) => {
                        let (cr, cw) = c.split();
                        self.open(cr, cw).await
                    }
                    #[cfg(target_os = "linux")]
                    Halves::Ring(c) => {
                        let (cr, cw) = c.split();
                        self.open(cr, cw).await
                    }
                    Halves::Split(cr, cw) => self.open(cr, cw).await,
                }
            };
            let mut relay = std::pin::pin!(relay);
            // The span moves into the closure: the task holds it once, beside the relay.
            std::future::poll_fn(move |cx| {
                relay::count_poll();
                let _conn = conn.enter();
                relay.as_mut().poll(cx)
            })
            .await
        }
    }

    /// Waits for the client's first message, then dials its upstream (a client that never
    /// sends one costs no upstream connection) and relays.
    // Not an `async fn` (see `Session::run`).
    #[allow(clippy::manual_async_fn)]
    fn open<'a, CR, CW>(&'a mut self, cr: CR, mut cw: CW) -> impl Future<Output = ()> + 'a
    where
        CR: Inbound + 'a,
        CW: Outbound + 'a,
    {
        async move {
            let max = self.h.config.max_message_size;
            let mut cr =
                FramedRead::with_capacity(cr, relay::request_codec(max), relay::READ_BUFFER);
            let Some(first) = self.first_message(&mut cr).await else {
                return;
            };
            // Boxed: dialing (TCP, maybe TLS) happens once, and its state need not be part
            // of the session's task for the connection's whole life.
            let Some(mut upstream) = Box::pin(self.dial()).await else {
                return;
            };
            // Each branch waits once (`Session::relay_with`): a local kept across one wait
            // shares its room in the task with the other branch's.
            if let Stream::Plain(u) = &mut upstream {
                let (ur, uw) = u.split();
                self.relay_with(first, &mut cr, &mut cw, ur, uw).await
            } else if let Some(u) = ring(&mut upstream) {
                let (ur, uw) = u.split();
                self.relay_with(first, &mut cr, &mut cw, ur, uw).await
            } else {
                let (ur, uw) = tokio::io::split(upstream);
                self.relay_with(first, &mut cr, &mut cw, ur, uw).await
            }
            self.h.meter.disconnected();
        }
    }

    /// The relay with the upstream's halves, starting with `first` (`start`).
    // Not an `async fn` (see `Session::run`).
    #[allow(clippy::manual_async_fn)]
    pub(super) fn relay_with<'a, CR, CW, UR, UW>(
        &'a mut self,
        first: Incoming,
        cr: &'a mut FramedRead<CR, StreamCodec>,
        cw: &'a mut CW,
        ur: UR,
        mut uw: UW,
    ) -> impl Future<Output = ()> + 'a
    where
        CR: Inbound + 'a,
        CW: Outbound + 'a,
        UR: Inbound + 'a,
        UW: Outbound + 'a,
    {
        async move {
            if self.start(first, cr, cw, &mut uw).await {
                let max = self.h.config.max_message_size;
                let mut ur =
                    FramedRead::with_capacity(ur, relay::reply_codec(max), relay::READ_BUFFER);
                self.relay_framed(cr, cw, &mut ur, &mut uw).await;
            }
        }
    }

    /// The relay starts with `first`, a request (or the head of a large one) read before
    /// the upstream was dialed; false when that ended the session.
    pub(super) async fn start<CR, CW, UW>(
        &mut self,
        first: Incoming,
        cr: &mut FramedRead<CR, StreamCodec>,
        cw: &mut CW,
        uw: &mut UW,
    ) -> bool
    where
        CR: Inbound,
        CW: Outbound,
        UW: Outbound,
    {
        self.set_tick();
        let handled = match self.on_client_item(first, cr) {
            Ok(Some(aside)) => Box::pin(self.aside(aside)).await,
            done => done.map(|_| ()),
        };
        let Err(e) = handled else {
            return true;
        };
        self.finish(Err(e), true);
        Box::pin(self.close(cw, uw)).await;
        false
    }

    /// Dials the client's upstream; `None` when none is reachable, or when the stop's
    /// deadline passes first (it also ends a session still dialing).
    async fn dial(&mut self) -> Option<Stream> {
        let Session { life, h, .. } = self;
        let connected = tokio::select! {
            c = h.shared.upstreams.connect(&h.config, &h.shared.metrics) => c,
            _ = life.killed() => {
                tracing::debug!("shutdown deadline passed while connecting upstream");
                return None;
            }
        };
        let (upstream, router) = match connected {
            Ok(pair) => pair,
            Err(e) => {
                tracing::error!(error = %e, "closing client: no upstream reachable");
                return None;
            }
        };
        tracing::debug!(upstream = %router.addr, "paired");
        self.h.meter.connected(&router.addr);
        self.h.reads.paired(router.ladder.clone());
        self.h.reads.writes.client(self.peer.ip());
        self.h.upstream = router.addr.as_str().into();
        Some(upstream)
    }

    /// The client's whole first message (or the head of a large one, which waits for the
    /// relay's answer), within `first_message_timeout` of the session's start (and
    /// `message_timeout` once it starts, `idle_timeout` if shorter); `None` when the client
    /// leaves, misbehaves, is too slow or the proxy stops first.
    async fn first_message<CR: Inbound>(
        &mut self,
        cr: &mut FramedRead<CR, StreamCodec>,
    ) -> Option<Incoming> {
        let started = Instant::now();
        loop {
            let wake = tokio::select! {
                biased;
                w = self.life.wake() => w,
                m = cr.next() => return match m {
                    Some(Ok(m)) => Some(m),
                    Some(Err(e)) => {
                        tracing::warn!(error = %client_err(e), "closing client");
                        None
                    }
                    None => None,
                },
            };
            match wake {
                Wake::Due { tick: true, .. } => {}
                Wake::Due { .. } => continue,
                // A client that has sent nothing yet is owed nothing by a stop.
                Wake::Stop | Wake::Kill => return None,
            }
            let now = Instant::now();
            let waited = now - started;
            let partial = !cr.read_buffer().is_empty() || cr.decoder().in_large();
            let partial_for = self.life.partial_for(now, partial);
            let limits = &self.h.config.limits;
            let limit = if waited >= limits.first_message_timeout {
                Some("first_message_timeout")
            } else {
                life::overdue(limits, partial_for, waited, true)
            };
            if let Some(limit) = limit {
                self.limit_hit(limit);
                return None;
            }
        }
    }

    /// A deadline ends the session.
    fn limit_hit(&self, limit: life::Limit) {
        self.h.meter.limit(limit);
        tracing::info!(limit, "closing client: past a limit");
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

    /// What an idle connection pair holds for its session: the session (boxed) and its
    /// task's state, which is as large as the largest state the task may wait in. Before
    /// issue 31 they were 1,488 and 1,976 bytes here (an `async fn` at each stage held its
    /// arguments twice, the writes waited on held a gather list each).
    #[tokio::test]
    async fn an_idle_session_is_small() {
        use crate::config::Config;
        use crate::handles::Handles;
        let config = Config::for_upstreams("127.0.0.1:0", vec!["127.0.0.1:1".into()]);
        let shared = Arc::new(Handles::new(Arc::new(config)));
        let l = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let c = tokio::net::TcpStream::connect(l.local_addr().expect("addr"))
            .await
            .expect("connect");
        let (stop, kill) = (CancellationToken::new(), CancellationToken::new());
        let peer = "127.0.0.1:9".parse().expect("addr");
        let s = Box::new(Session::new(shared.sessions.clone(), peer, 1, stop, kill));
        let task = s.run(Stream::Plain(c));
        let (session, task) = (size_of::<Session>(), size_of_val(&task));
        eprintln!("session {session} bytes, its task's state {task} bytes");
        assert!(session <= 1024, "the session is {session} bytes");
        assert!(task <= 1024, "the session's task state is {task} bytes");
    }
}
