//! The admin endpoint's connections: accepted under `[admin] max_connections` and
//! `max_connections_per_peer`, each served by hyper (HTTP/1.1) with `header_read_timeout` (a
//! request's head, and the wait for the next one on a keep-alive connection) and
//! `request_timeout` (from a head read to its response handed whole to the socket), and all
//! of them gone within [`CLOSE_WAIT`] of the proxy's stop, whatever the peers do (a
//! half-sent request holds nothing). A connection past either cap goes to the health lane
//! (`lane.rs`): `/healthz` and `/readyz` are answered there whatever holds the cap, anything
//! else gets a bare 503.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use hyper::body::Incoming;
use hyper::service::Service as _;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::lane::Lane;
use crate::config::AdminLimits;
use crate::handles::AdminHandles;
use crate::metrics::Metrics;
use crate::state::{ClientSlot, ClientSlots, Refused};

/// How long admin connections get, once the proxy has stopped, to finish the response they
/// are writing; then they are dropped.
pub const CLOSE_WAIT: Duration = Duration::from_millis(500);

/// The most hyper buffers per admin connection (a request head must fit).
const READ_BUFFER: usize = 16 * 1024;

/// Accepts until `done`, then closes every connection within [`CLOSE_WAIT`].
pub(super) async fn accept(
    listener: TcpListener,
    app: Router,
    shared: Arc<AdminHandles>,
    done: CancellationToken,
) {
    let slots = ClientSlots::default();
    let tracker = TaskTracker::new();
    let closing = CancellationToken::new();
    let mut lane = Lane::default();
    loop {
        let (socket, peer) = tokio::select! {
            _ = done.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // EMFILE and friends: keep the endpoint alive, give the system a moment.
                    tracing::error!(error = %e, "admin accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let limits = shared.config.load().admin_limits;
        let per_peer = Some(limits.max_connections_per_peer);
        let slot = match slots.acquire_from(peer.ip(), limits.max_connections, per_peer) {
            Ok(slot) => slot,
            Err(refused) => {
                let limit = match refused {
                    Refused::MaxConnections => "admin_max_connections",
                    Refused::PerPeer => "admin_max_connections_per_peer",
                };
                shared.metrics.limits.hit(limit);
                tracing::debug!(peer = %peer, limit, "admin connection past its cap: health lane");
                lane.admit(socket, peer, &app, &shared.metrics, &tracker, &closing);
                continue;
            }
        };
        let _ = socket.set_nodelay(true);
        let conn = Conn {
            app: app.clone(),
            limits,
            metrics: shared.metrics.clone(),
            closing: closing.child_token(),
            _slot: slot,
        };
        tracker.spawn(conn.serve(socket));
    }
    drop(listener);
    closing.cancel();
    tracker.close();
    // Each connection ends by itself within CLOSE_WAIT of `closing`; this bound only keeps
    // the stop finite should one not.
    if tokio::time::timeout(CLOSE_WAIT * 2, tracker.wait())
        .await
        .is_err()
    {
        tracing::warn!(
            connections = tracker.len(),
            "admin connections still open after the stop; leaving them"
        );
    }
}

/// One admin connection.
struct Conn {
    app: Router,
    limits: AdminLimits,
    metrics: Arc<Metrics>,
    closing: CancellationToken,
    /// Its place under `max_connections`, given back when the connection ends.
    _slot: ClientSlot,
}

/// What one connection's parts tell each other: bytes read, where the last request
/// started, whether its response has been handed to the socket whole.
#[derive(Default)]
struct Progress {
    read: AtomicU64,
    /// `read` when the last request's head was in.
    at_request: AtomicU64,
    requests: AtomicU64,
    /// hyper let go of the last response's body: all of it is in hyper's write buffer.
    body_done: AtomicBool,
    /// ... and that buffer has been written to the socket: the request is over.
    written: AtomicBool,
}

impl Conn {
    async fn serve(self, socket: TcpStream) {
        let progress = Arc::new(Progress::default());
        let (deadline_tx, mut deadline_rx) = watch::channel::<Option<Instant>>(None);
        let svc = TowerToHyperService::new(self.app);
        let request_timeout = self.limits.request_timeout;
        let p = progress.clone();
        let service = hyper::service::service_fn(move |req: hyper::Request<Incoming>| {
            p.at_request
                .store(p.read.load(Ordering::Relaxed), Ordering::Relaxed);
            p.requests.fetch_add(1, Ordering::Relaxed);
            p.body_done.store(false, Ordering::Relaxed);
            p.written.store(false, Ordering::Relaxed);
            let _ = deadline_tx.send(Some(Instant::now() + request_timeout));
            let answered = svc.call(req);
            let p = p.clone();
            async move {
                let response = answered.await?;
                Ok::<_, std::convert::Infallible>(response.map(|inner| Watched { inner, p }))
            }
        });
        let io = TokioIo::new(Counted {
            inner: socket,
            p: progress.clone(),
        });
        let conn = hyper::server::conn::http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(self.limits.header_read_timeout)
            // A request's head is a few hundred bytes; hyper's default buffer (~400 KiB)
            // times max_connections would be memory a client makes us hold for nothing.
            .max_buf_size(READ_BUFFER)
            .serve_connection(io, service);
        tokio::pin!(conn);
        let mut deadline: Option<Instant> = None;
        let mut watching = true;
        loop {
            let expired = async {
                match deadline {
                    Some(d) => tokio::time::sleep_until(d).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                served = conn.as_mut() => {
                    let Err(e) = served else { return };
                    // A header timeout with nothing read since the last request is an idle
                    // keep-alive connection ending, not a client too slow to send a head.
                    let p = &progress;
                    let idle = p.requests.load(Ordering::Relaxed) > 0
                        && p.read.load(Ordering::Relaxed) == p.at_request.load(Ordering::Relaxed);
                    if e.is_timeout() && !idle {
                        self.metrics.limits.hit("admin_header_read_timeout");
                        tracing::debug!("admin connection closed: header_read_timeout");
                    } else if !e.is_timeout() {
                        tracing::debug!(error = %e, "admin connection ended");
                    }
                    return;
                }
                changed = deadline_rx.changed(), if watching => match changed {
                    Ok(()) => deadline = *deadline_rx.borrow_and_update(),
                    // The service is gone with the connection, which the arm above sees.
                    Err(_) => watching = false,
                },
                _ = expired => {
                    if progress.written.load(Ordering::Relaxed) {
                        // Answered in time; the connection waits for its next request.
                        deadline = None;
                        continue;
                    }
                    self.metrics.limits.hit("admin_request_timeout");
                    tracing::debug!("admin connection closed: request_timeout");
                    return;
                }
                _ = self.closing.cancelled() => break,
            }
        }
        // The proxy has stopped: a response being written may finish, nothing else waits.
        conn.as_mut().graceful_shutdown();
        let _ = tokio::time::timeout(CLOSE_WAIT, conn).await;
    }
}

/// A response body that says when hyper lets go of it (it has taken every frame).
struct Watched {
    inner: axum::body::Body,
    p: Arc<Progress>,
}

impl hyper::body::Body for Watched {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for Watched {
    fn drop(&mut self) {
        self.p.body_done.store(true, Ordering::Relaxed);
    }
}

/// The socket, counting the bytes read from it.
/// hyper flushes the socket only once its own write buffer is empty: a flush after the
/// body was let go of means the whole response is in the socket.
struct Counted {
    inner: TcpStream,
    p: Arc<Progress>,
}

impl AsyncRead for Counted {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = polled {
            let n = (buf.filled().len() - before) as u64;
            self.p.read.fetch_add(n, Ordering::Relaxed);
        }
        polled
    }
}

impl AsyncWrite for Counted {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let flushed = Pin::new(&mut self.inner).poll_flush(cx);
        if matches!(flushed, Poll::Ready(Ok(()))) && self.p.body_done.load(Ordering::Relaxed) {
            self.p.written.store(true, Ordering::Relaxed);
        }
        flushed
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
