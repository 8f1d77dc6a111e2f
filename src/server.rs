//! The accept loop: one session task per client connection (TLS handshake first when
//! `[tls]` is set), on a session thread of its own core with `layout = "per-core"`
//! (`cores`), limits, graceful stop. `start` also starts the admin endpoint, the
//! upstream health checker, the write-stall watch and the config file watcher.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use futures::future::{FutureExt, OptionFuture};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::{Config, ConfigError, Layout, Limits};
use crate::handles::Handles;
use crate::state::{ClientSlot, Refused};
use crate::tls::Stream;
use crate::{admin, health, reload, session, stall};

mod cores;
use cores::Cores;

/// Connections past `max_connections` being refused at once (each waits up to
/// `REFUSE_WAIT` for a first message to answer); past this many they are closed at once.
const REFUSING: usize = 64;
/// How long a refused connection is given to send its first message (to get an error reply
/// rather than a bare close).
const REFUSE_WAIT: Duration = Duration::from_secs(1);
/// The largest first message a refused connection is read for (a handshake is far smaller).
const REFUSE_READ: usize = 16 * 1024;
/// How long a stop waits for sessions after killing them (they end at once; see
/// `session::relay`).
const KILL_WAIT: Duration = Duration::from_secs(1);

/// A running proxy.
pub struct Running {
    addr: SocketAddr,
    admin_addr: Option<SocketAddr>,
    shared: Arc<Handles>,
    stop: CancellationToken,
    join: JoinHandle<()>,
    admin_join: Option<JoinHandle<()>>,
}

impl Running {
    /// The address clients connect to (useful with port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The address of the admin HTTP endpoint, when `[admin]` is on.
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin_addr
    }

    /// The handles this proxy's tasks share (config, breakers, upstreams, metrics, ...).
    pub fn shared(&self) -> &Arc<Handles> {
        &self.shared
    }

    /// Reloads the config file now (what SIGHUP does). On error nothing changes.
    pub fn reload(&self) -> Result<(), Vec<ConfigError>> {
        reload::reload(&self.shared.reload(), "api")
    }

    /// Stops accepting, lets requests in flight finish up to `shutdown_timeout`, then closes
    /// every connection. Returns when all sessions are gone.
    pub async fn shutdown(self) {
        self.stop.cancel();
        self.wait().await
    }

    /// Waits until the proxy stops (after `shutdown` from elsewhere, or never).
    pub async fn wait(self) {
        let _ = self.join.await;
        if let Some(admin) = self.admin_join {
            let _ = admin.await;
        }
    }

    /// A handle that stops the proxy when cancelled.
    pub fn stop_token(&self) -> CancellationToken {
        self.stop.clone()
    }
}

/// Binds `config.listen` (and `[admin] listen`) and starts accepting; starts the health
/// checker, and the file watcher when the config came from a file.
pub async fn start(config: Arc<Config>) -> std::io::Result<Running> {
    let side = |what: &str, addr: &str, e: std::io::Error| {
        std::io::Error::new(e.kind(), format!("{what} {addr}: {e}"))
    };
    let listener = TcpListener::bind(config.listen.as_str())
        .await
        .map_err(|e| side("listen", &config.listen, e))?;
    let addr = listener.local_addr()?;
    let admin_listener = match &config.admin_listen {
        Some(a) => match TcpListener::bind(a.as_str()).await {
            Ok(l) => Some(l),
            // The built-in default may be taken by another instance on this host: the proxy
            // matters more than its status page. An address chosen on purpose must work.
            Err(e)
                if a == crate::config::DEFAULT_ADMIN_LISTEN
                    && e.kind() == std::io::ErrorKind::AddrInUse =>
            {
                tracing::error!(admin = %a, error = %e, "admin endpoint not started: its default address is in use; set [admin] listen");
                None
            }
            Err(e) => return Err(side("admin listen", a, e)),
        },
        None => None,
    };
    let admin_addr = admin_listener.as_ref().and_then(|l| l.local_addr().ok());
    if let Some(t) = config
        .upstream_tls
        .as_ref()
        .filter(|t| t.insecure_skip_verify)
    {
        tracing::warn!(server_name = ?t.server_name, "upstream_tls.insecure_skip_verify = true: mongos certificates are NOT verified (labs only)");
    }
    let from_file = config.source.is_file();
    let cores = match config.layout {
        Layout::PerCore | Layout::Uring => Some(
            Cores::start(config.layout == Layout::Uring)
                .map_err(|e| std::io::Error::new(e.kind(), format!("session threads: {e}")))?,
        ),
        Layout::Shared => None,
    };
    let shared = Arc::new(Handles::new(config));
    shared.runtime.set_local_addr(addr);
    let stop = CancellationToken::new();
    tracing::info!(listen = %addr, tls = shared.config.load().tls.is_some(), upstreams = ?shared.upstreams.addrs(), layout = shared.config.load().layout.name(), "staleguard listening");
    let checker = health::Checker {
        config: shared.config.clone(),
        upstreams: shared.upstreams.clone(),
        metrics: shared.metrics.clone(),
        ids: shared.ids.clone(),
    };
    tokio::spawn(checker.run(stop.clone()));
    let watch = stall::Ctx {
        config: shared.config.clone(),
        stall: shared.stall.clone(),
        metrics: shared.metrics.clone(),
        breakers: shared.breakers.clone(),
    };
    stall::start(watch, stop.clone());
    if let Some((inbox, ctx)) = shared.confirming() {
        tokio::spawn(crate::confirm::run(inbox, ctx, stop.clone()));
    }
    if let (Some(fleet), Some(cfg)) = (&shared.fleet, &shared.config.load().fleet) {
        let ctx = crate::fleet::Ctx {
            config: shared.config.clone(),
            breakers: shared.breakers.clone(),
            metrics: shared.metrics.clone(),
            fleet: fleet.clone(),
            share: shared.upstreams.fleet_share.clone(),
            stall: shared.stall.clone(),
        };
        tracing::info!(redis = %cfg.shown, name = %cfg.name, "fleet: sharing breaker openings through Redis");
        crate::fleet::start(ctx, cfg.clone(), stop.clone());
    }
    if from_file {
        if let Err(e) = reload::watch(Arc::new(shared.reload()), stop.clone()) {
            tracing::warn!(error = %e, "config file changes will not be noticed; SIGHUP still reloads");
        }
    }
    // `stop` starts the drain; `done` ends the admin endpoint once every session is gone.
    let done = CancellationToken::new();
    let admin_join = admin_listener.map(|l| {
        tokio::spawn(admin::serve(
            l,
            Arc::new(shared.admin()),
            stop.clone(),
            done.clone(),
        ))
    });
    let join = tokio::spawn(accept_loop(
        listener,
        cores,
        shared.clone(),
        stop.clone(),
        done,
    ));
    Ok(Running {
        addr,
        admin_addr,
        shared,
        stop,
        join,
        admin_join,
    })
}

/// Accepts until the stop, then drains and ends the sessions. With `cores` (the per-core
/// layout) each session runs on a session thread, else on the runtime running this loop;
/// the session threads end when this loop does (or is dropped).
async fn accept_loop(
    listener: TcpListener,
    mut cores: Option<Cores>,
    shared: Arc<Handles>,
    stop: CancellationToken,
    done: CancellationToken,
) {
    let tracker = TaskTracker::new();
    let refusing = Arc::new(Semaphore::new(REFUSING));
    // `stop` asks sessions to finish what is in flight; `kill` ends them outright.
    let kill = CancellationToken::new();
    if let Some(cores) = cores.as_mut() {
        cores.signals(&stop, &kill);
    }
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok((socket, peer)) => {
                    let _ = socket.set_nodelay(true);
                    let limits = shared.config.load().limits;
                    let acquired = shared.clients.acquire_from(peer.ip(), limits.max_connections, limits.max_connections_per_peer);
                    let slot = match acquired {
                        Ok(slot) => slot,
                        Err(why) => {
                            refuse(&shared, &refusing, socket, peer, why, &limits);
                            continue;
                        }
                    };
                    let id = shared.ids.next_conn();
                    let new = |signals: (CancellationToken, CancellationToken)| {
                        let (s, k) = signals;
                        let sess = Box::new(session::Session::new(shared.sessions.clone(), peer, id, s, k));
                        Client { shared: shared.clone(), kill: kill.clone(), slot, sess }
                    };
                    let Some(cores) = cores.as_mut() else {
                        // Child tokens: a session polls its own (each poll locks the
                        // token's node; sessions move between the runtime's workers), not
                        // one node every session shares.
                        let client = new((stop.child_token(), kill.child_token()));
                        tracker.spawn(client.serve(Socket::Here(socket)));
                        continue;
                    };
                    // The session thread's own children of the stop and the kill (`Core`).
                    let uring = cores.uring();
                    let core = cores.next();
                    let client = new((core.stop.clone(), core.kill.clone()));
                    // The socket leaves this runtime's reactor and joins the session thread's
                    // (or its io_uring).
                    let moved = if uring { Socket::Ring } else { Socket::Moved };
                    match socket.into_std() {
                        Ok(socket) => {
                            tracker.spawn_on(client.serve(moved(socket)), core.handle);
                        }
                        Err(e) => tracing::error!(client.addr = %peer, error = %e, "closing client: cannot hand it to a session thread"),
                    }
                }
                Err(e) => {
                    // EMFILE and friends: keep the loop alive, give the system a moment.
                    tracing::error!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
        }
    }
    drop(listener);
    tracker.close();
    let grace = shared.config.load().shutdown_timeout;
    tracing::info!(sessions = tracker.len(), grace = ?grace, "stopping: draining sessions");
    if tokio::time::timeout(grace, tracker.wait()).await.is_err() {
        tracing::warn!(
            sessions = tracker.len(),
            "shutdown deadline passed, closing remaining sessions"
        );
        kill.cancel();
        // Sessions end at the kill whatever their peers do (they never wait on a write);
        // this bound only keeps a stop finite should one not.
        if tokio::time::timeout(KILL_WAIT, tracker.wait())
            .await
            .is_err()
        {
            tracing::error!(
                sessions = tracker.len(),
                "sessions still running after the kill; stopping without them"
            );
        }
    }
    tracing::info!("stopped");
    done.cancel();
}

/// An accepted client, before its session task runs.
struct Client {
    shared: Arc<Handles>,
    kill: CancellationToken,
    /// The connection's place under `max_connections`, held until its session ends.
    slot: ClientSlot,
    sess: Box<session::Session>,
}

/// An accepted client's socket: registered with this runtime's reactor, or (the per-core
/// layout) to be registered with that of the session thread its task runs on, or (the uring
/// layout) to be put on that thread's io_uring unless `[tls]` is on.
enum Socket {
    Here(TcpStream),
    Moved(std::net::TcpStream),
    Ring(std::net::TcpStream),
}

impl Client {
    /// The session task: the TLS handshake when `[tls]` is set, then the session. Two
    /// stages, chained (`then`): what only the handshake needs is gone once the session
    /// runs, and the session's state is the task's for the connection's whole life (an
    /// `async fn` would also hold its arguments twice, `Session::run`).
    fn serve(self, socket: Socket) -> impl std::future::Future<Output = ()> {
        let Client {
            shared,
            kill,
            slot,
            sess,
        } = self;
        let (peer, id) = (sess.peer(), sess.id());
        let opened = async move {
            let socket = match socket {
                Socket::Here(s) => s,
                // `[tls]` on or off needs a restart: what the handshake would see.
                Socket::Ring(s) if shared.config.load().tls.is_none() => {
                    return match Stream::on_ring(s) {
                        Ok(s) => Some(s),
                        Err(e) => {
                            tracing::error!(client.addr = %peer, error = %e, "closing client: cannot put it on its session thread's io_uring");
                            None
                        }
                    };
                }
                Socket::Moved(s) | Socket::Ring(s) => match TcpStream::from_std(s) {
                    Ok(s) => s,
                    Err(e) => {
                        tracing::error!(client.addr = %peer, error = %e, "closing client: cannot register it on its session thread");
                        return None;
                    }
                },
            };
            // The kill also ends a TLS handshake still under way.
            tokio::select! {
                // Boxed: a TLS handshake's state is freed once it is done.
                s = Box::pin(handshake(&shared, socket, peer, id)) => s,
                _ = kill.cancelled() => None,
            }
        };
        opened
            .then(move |stream| OptionFuture::from(stream.map(|s| sess.run(s))))
            // The connection's place is given back once its session is over.
            .map(move |_| drop(slot))
    }
}

/// The client-facing TLS handshake when `[tls]` is set (bounded by `connect_timeout`).
async fn handshake(
    shared: &Handles,
    socket: tokio::net::TcpStream,
    peer: SocketAddr,
    id: u64,
) -> Option<Stream> {
    let config = shared.config.load_full();
    let Some(tls) = &config.tls else {
        return Some(Stream::Plain(socket));
    };
    let (error, quiet) =
        match tokio::time::timeout(config.connect_timeout, tls.acceptor.accept(socket)).await {
            Ok(Ok(s)) => return Some(Stream::Server(Box::new(s))),
            // A peer that connects and leaves (a TCP health check, a port scan) is no TLS
            // failure worth a warning.
            Ok(Err(e)) => (e.to_string(), left_early(&e)),
            Err(_) => (
                format!("timed out after {:?}", config.connect_timeout),
                false,
            ),
        };
    shared.metrics.tls_failure("client");
    if quiet {
        tracing::debug!(client.addr = %peer, id, error = %error, "client left during the TLS handshake");
    } else {
        tracing::warn!(client.addr = %peer, id, error = %error, "client TLS handshake failed, closing");
    }
    None
}

/// The client closed or reset the connection before the handshake ended.
fn left_early(e: &std::io::Error) -> bool {
    use std::io::ErrorKind;
    matches!(
        e.kind(),
        ErrorKind::ConnectionReset | ErrorKind::UnexpectedEof | ErrorKind::BrokenPipe
    )
}

/// A connection past `max_connections` or `max_connections_per_peer`: answered with an
/// error reply when its first message (a driver's handshake) arrives within `REFUSE_WAIT`,
/// closed otherwise. Existing clients are not touched.
fn refuse(
    shared: &Arc<Handles>,
    refusing: &Arc<Semaphore>,
    socket: TcpStream,
    peer: SocketAddr,
    why: Refused,
    limits: &Limits,
) {
    let limit = why.limit();
    shared.metrics.limits.hit(limit);
    let max = match why {
        Refused::MaxConnections => limits.max_connections,
        Refused::PerPeer => limits.max_connections_per_peer.unwrap_or(0),
    };
    tracing::warn!(client.addr = %peer, limit, max, "refusing client: connection limit reached");
    let Ok(permit) = refusing.clone().try_acquire_owned() else {
        return;
    };
    let errmsg = match why {
        Refused::MaxConnections => {
            format!("staleguard: too many connections (max_connections = {max}); try again later")
        }
        Refused::PerPeer => format!(
            "staleguard: too many connections from {} (max_connections_per_peer = {max}); try again later",
            peer.ip()
        ),
    };
    let request_id = shared.ids.request_id();
    tokio::spawn(async move {
        let _permit = permit;
        let mut socket = socket;
        let reply =
            tokio::time::timeout(REFUSE_WAIT, refusal(&mut socket, request_id, &errmsg)).await;
        if let Ok(Some(reply)) = reply {
            let _ = tokio::time::timeout(REFUSE_WAIT, socket.write_all(&reply)).await;
        }
        let _ = socket.shutdown().await;
    });
}

/// The error reply to a refused connection's first message: OP_MSG for OP_MSG, OP_REPLY for
/// a legacy OP_QUERY handshake; `None` for anything else or a message too large to wait for.
async fn refusal(socket: &mut TcpStream, request_id: i32, errmsg: &str) -> Option<bytes::Bytes> {
    use crate::wire::{reply, Header, OpCode, HEADER_LEN};
    let mut head = [0u8; HEADER_LEN];
    socket.read_exact(&mut head).await.ok()?;
    let h = Header::parse(&head)?;
    if h.length < HEADER_LEN as i32 || h.length as usize > REFUSE_READ {
        return None;
    }
    let mut rest = vec![0u8; h.length as usize - HEADER_LEN];
    socket.read_exact(&mut rest).await.ok()?;
    // HostUnreachable: a driver marks this server unknown and tries again later.
    let body = reply::error_body(6, "HostUnreachable", errmsg);
    match h.op_code {
        OpCode::MSG => Some(reply::op_msg(request_id, h.request_id, 0, &body)),
        OpCode::QUERY => Some(reply::op_reply(request_id, h.request_id, &body)),
        _ => None,
    }
}
