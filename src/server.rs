//! The accept loop: one session task per client connection (TLS handshake first when
//! `[tls]` is set), limits, graceful stop. `start` also starts the admin endpoint, the
//! upstream health checker, the write-stall watch and the config file watcher.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, SystemTime};

use arc_swap::ArcSwap;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::breaker::Breakers;
use crate::config::{Config, ConfigError};
use crate::metrics::Metrics;
use crate::reload::{self, ReloadStatus};
use crate::stall::StallWatch;
use crate::tls::Stream;
use crate::upstream::Upstreams;
use crate::{admin, health, session, stall};

/// How long a stop waits for sessions after killing them (they end at once; see
/// `session::relay`).
const KILL_WAIT: Duration = Duration::from_secs(1);

/// State every session shares: the live config, the breakers and the upstreams.
#[derive(Debug)]
pub struct Shared {
    pub config: ArcSwap<Config>,
    pub breakers: Breakers,
    pub upstreams: Upstreams,
    pub metrics: Metrics,
    /// The write-progress watch: its signals, and whether fallback breakers are held.
    pub stall: StallWatch,
    /// The address clients connect to, once bound.
    pub local_addr: OnceLock<SocketAddr>,
    /// When this proxy started (wall clock, for `/status`).
    pub started: SystemTime,
    /// The outcome of the last config load (start or reload).
    pub reload_status: Mutex<ReloadStatus>,
    /// Bumped after every config swap, so sessions re-read the config only when it changed
    /// (a relaxed load of a read-mostly word, instead of a shared refcount per request).
    config_generation: AtomicU64,
    next_conn: AtomicU64,
    next_request_id: AtomicI32,
}

impl Shared {
    pub fn new(config: Arc<Config>) -> Shared {
        Shared {
            upstreams: Upstreams::new(config.upstreams.clone()),
            config: ArcSwap::new(config),
            breakers: Breakers::default(),
            metrics: Metrics::new(),
            stall: StallWatch::new(),
            local_addr: OnceLock::new(),
            started: SystemTime::now(),
            reload_status: Mutex::new(ReloadStatus::started()),
            config_generation: AtomicU64::new(0),
            next_conn: AtomicU64::new(1),
            next_request_id: AtomicI32::new(1),
        }
    }

    /// Swaps in a new config; sessions pick it up from their next request.
    pub fn set_config(&self, config: Arc<Config>) {
        self.config.store(config);
        self.config_generation.fetch_add(1, Ordering::Release);
    }

    /// Changes whenever the config is swapped.
    pub fn config_generation(&self) -> u64 {
        self.config_generation.load(Ordering::Acquire)
    }

    /// A requestID for a message the proxy originates (error replies).
    pub fn request_id(&self) -> i32 {
        self.next_request_id.fetch_add(1, Ordering::Relaxed) & i32::MAX
    }

    /// The outcome of the last config load.
    pub fn reload_status(&self) -> ReloadStatus {
        self.reload_status
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

/// A running proxy.
pub struct Running {
    addr: SocketAddr,
    admin_addr: Option<SocketAddr>,
    shared: Arc<Shared>,
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

    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// Reloads the config file now (what SIGHUP does). On error nothing changes.
    pub fn reload(&self) -> Result<(), Vec<ConfigError>> {
        reload::reload(&self.shared, "api")
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
    let shared = Arc::new(Shared::new(config));
    let _ = shared.local_addr.set(addr);
    let stop = CancellationToken::new();
    tracing::info!(listen = %addr, tls = shared.config.load().tls.is_some(), upstreams = ?shared.upstreams.addrs(), "staleguard listening");
    tokio::spawn(health::run(shared.clone(), stop.clone()));
    stall::start(shared.clone(), stop.clone());
    if from_file {
        if let Err(e) = reload::watch(shared.clone(), stop.clone()) {
            tracing::warn!(error = %e, "config file changes will not be noticed; SIGHUP still reloads");
        }
    }
    // `stop` starts the drain; `done` ends the admin endpoint once every session is gone.
    let done = CancellationToken::new();
    let admin_join = admin_listener
        .map(|l| tokio::spawn(admin::serve(l, shared.clone(), stop.clone(), done.clone())));
    let join = tokio::spawn(accept_loop(listener, shared.clone(), stop.clone(), done));
    Ok(Running {
        addr,
        admin_addr,
        shared,
        stop,
        join,
        admin_join,
    })
}

async fn accept_loop(
    listener: TcpListener,
    shared: Arc<Shared>,
    stop: CancellationToken,
    done: CancellationToken,
) {
    let tracker = TaskTracker::new();
    // `stop` asks sessions to finish what is in flight; `kill` ends them outright.
    let kill = CancellationToken::new();
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok((socket, peer)) => {
                    let _ = socket.set_nodelay(true);
                    let id = shared.next_conn.fetch_add(1, Ordering::Relaxed);
                    let sess = session::Session::new(shared.clone(), peer, id, stop.clone(), kill.clone());
                    let (shared, kill) = (shared.clone(), kill.clone());
                    tracker.spawn(async move {
                        // The kill also ends a TLS handshake still under way.
                        let stream = tokio::select! {
                            s = handshake(&shared, socket, peer, id) => s,
                            _ = kill.cancelled() => None,
                        };
                        if let Some(stream) = stream {
                            sess.run(stream).await;
                        }
                    });
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

/// The client-facing TLS handshake when `[tls]` is set (bounded by `connect_timeout`).
async fn handshake(
    shared: &Shared,
    socket: tokio::net::TcpStream,
    peer: SocketAddr,
    id: u64,
) -> Option<Stream> {
    let config = shared.config.load_full();
    let Some(tls) = &config.tls else {
        return Some(Stream::Plain(socket));
    };
    let error =
        match tokio::time::timeout(config.connect_timeout, tls.acceptor.accept(socket)).await {
            Ok(Ok(s)) => return Some(Stream::Server(Box::new(s))),
            Ok(Err(e)) => e.to_string(),
            Err(_) => format!("timed out after {:?}", config.connect_timeout),
        };
    shared.metrics.tls_failure("client");
    tracing::warn!(client.addr = %peer, id, error = %error, "client TLS handshake failed, closing");
    None
}
