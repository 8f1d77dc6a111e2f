//! The accept loop: one session task per client connection, limits, graceful stop.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::breaker::Breakers;
use crate::config::Config;
use crate::session;
use crate::upstream::Upstreams;

/// State every session shares: the live config, the breakers and the upstreams.
#[derive(Debug)]
pub struct Shared {
    pub config: ArcSwap<Config>,
    pub breakers: Breakers,
    pub upstreams: Upstreams,
    next_conn: AtomicU64,
    next_request_id: AtomicI32,
}

impl Shared {
    pub fn new(config: Arc<Config>) -> Shared {
        Shared {
            upstreams: Upstreams::new(config.upstreams.clone()),
            config: ArcSwap::new(config),
            breakers: Breakers::default(),
            next_conn: AtomicU64::new(1),
            next_request_id: AtomicI32::new(1),
        }
    }

    /// A requestID for a message the proxy originates (error replies).
    pub fn request_id(&self) -> i32 {
        self.next_request_id.fetch_add(1, Ordering::Relaxed) & i32::MAX
    }
}

/// A running proxy.
pub struct Running {
    addr: SocketAddr,
    shared: Arc<Shared>,
    stop: CancellationToken,
    join: JoinHandle<()>,
}

impl Running {
    /// The address clients connect to (useful with port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// Stops accepting, lets requests in flight finish up to `shutdown_timeout`, then closes
    /// every connection. Returns when all sessions are gone.
    pub async fn shutdown(self) {
        self.stop.cancel();
        let _ = self.join.await;
    }

    /// Waits until the proxy stops (after `shutdown` from elsewhere, or never).
    pub async fn wait(self) {
        let _ = self.join.await;
    }

    /// A handle that stops the proxy when cancelled.
    pub fn stop_token(&self) -> CancellationToken {
        self.stop.clone()
    }
}

/// Binds `config.listen` and starts accepting.
pub async fn start(config: Arc<Config>) -> std::io::Result<Running> {
    let listener = TcpListener::bind(config.listen.as_str()).await?;
    let addr = listener.local_addr()?;
    let shared = Arc::new(Shared::new(config));
    let stop = CancellationToken::new();
    tracing::info!(listen = %addr, upstreams = ?shared.upstreams.addrs(), "staleguard listening");
    let join = tokio::spawn(accept_loop(listener, shared.clone(), stop.clone()));
    Ok(Running {
        addr,
        shared,
        stop,
        join,
    })
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>, stop: CancellationToken) {
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
                    tracker.spawn(sess.run(socket));
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
        tracker.wait().await;
    }
    tracing::info!("stopped");
}
