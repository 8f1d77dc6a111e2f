//! The health lane: `/healthz` and `/readyz` answered to a connection that found no place
//! under `[admin] max_connections` or `max_connections_per_peer`, so that the admin cap can
//! never starve the kubelet's probes (a new connection each, a 1 s timeout by default).
//!
//! At most [`LANE`] such connections wait at once, each at most [`LANE_WAIT`] for its
//! request head (at most [`LANE_HEAD`] bytes) and its answer. A health request is answered by
//! the same router as on a served connection, with `connection: close`; anything else gets
//! the bare 503 the cap always gave. When the lane is full, the connection that has waited
//! longest gets its 503 and leaves, unless a whole health request already waits unread in
//! its socket (then it is answered): a probe sends its head as soon as it connects, so to push
//! it out before its head arrives an attacker would need [`LANE`] new connections within that
//! moment, and connections that send nothing can only ever take the lane for [`LANE_WAIT`].
//! A connection whose head is read gives its place up and is answered within what is left
//! of [`LANE_WAIT`] (at least [`GRACE`]).

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::Router;
use hyper::service::Service as _;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::metrics::Metrics;

/// Connections waiting in the lane at once.
pub const LANE: usize = crate::config::ADMIN_HEALTH_LANE;
/// How long one lane connection may take, from its accept to its answer written.
pub const LANE_WAIT: Duration = Duration::from_secs(1);
/// The longest request head read in the lane (a probe's is about 150 bytes).
pub const LANE_HEAD: usize = 4096;
/// The most of a health answer's body written (they are a few bytes).
const MAX_BODY: usize = 4096;

/// The least time a connection whose head is read has for its answer (a pushed-out probe
/// whose head was waiting, one whose head came at the end of [`LANE_WAIT`]).
const GRACE: Duration = Duration::from_millis(100);

/// The answer to a connection that is not a health request, written without waiting (a
/// fresh socket's buffer takes it) before the close.
pub const BUSY: &[u8] =
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\nconnection: close\r\n\r\n";

/// The lane's waiting connections, oldest first: each one's id and what ends it early.
#[derive(Debug, Default)]
pub(super) struct Lane {
    waiting: Arc<Mutex<VecDeque<(u64, CancellationToken)>>>,
    next: u64,
}

/// A lane connection's place; given back when dropped.
struct Place {
    waiting: Arc<Mutex<VecDeque<(u64, CancellationToken)>>>,
    id: u64,
}

impl Drop for Place {
    fn drop(&mut self) {
        let mut w = self.waiting.lock().unwrap_or_else(|p| p.into_inner());
        w.retain(|(id, _)| *id != self.id);
    }
}

impl Lane {
    /// Takes `socket` into the lane (pushing out the longest waiting one when it is full)
    /// and answers it on a task of `tracker`.
    pub(super) fn admit(
        &mut self,
        socket: TcpStream,
        peer: SocketAddr,
        app: &Router,
        metrics: &Arc<Metrics>,
        tracker: &TaskTracker,
        closing: &CancellationToken,
    ) {
        let leave = CancellationToken::new();
        self.next += 1;
        let id = self.next;
        {
            let mut w = self.waiting.lock().unwrap_or_else(|p| p.into_inner());
            if w.len() >= LANE {
                if let Some((_, oldest)) = w.pop_front() {
                    oldest.cancel();
                    metrics.limits.hit("admin_health_lane");
                }
            }
            w.push_back((id, leave.clone()));
        }
        let place = Place {
            waiting: self.waiting.clone(),
            id,
        };
        let app = app.clone();
        let closing = closing.clone();
        tracker.spawn(async move {
            let mut socket = socket;
            let started = tokio::time::Instant::now();
            let head = tokio::select! {
                h = tokio::time::timeout(LANE_WAIT, read_head(&mut socket)) => h.map_err(|_| Answer::TimedOut),
                _ = leave.cancelled() => Err(Answer::PushedOut),
                // The proxy stopped: a lane connection is dropped at once.
                _ = closing.cancelled() => Err(Answer::Stopped),
            };
            // Pushed out while its head was not read yet. A whole health request may already
            // wait in the socket: a probe's head that arrived while this task had not read it
            // (a loaded machine, a flood of new connections). It is answered; a connection
            // that sent nothing, or part of a head, leaves with its 503.
            let head = match head {
                Err(Answer::PushedOut) if health_head_waiting(&socket) => {
                    tokio::time::timeout(GRACE, read_head(&mut socket))
                        .await
                        .map_err(|_| Answer::PushedOut)
                }
                other => other,
            };
            // Its head is read (or it leaves): its place is free for the next one, and the
            // answer below is bounded by time (a health answer is local and small).
            drop(place);
            let answered = match head {
                Err(how) => how,
                Ok(head) => {
                    let left = LANE_WAIT.saturating_sub(started.elapsed()).max(GRACE);
                    tokio::select! {
                        a = tokio::time::timeout(left, answer(&mut socket, head.as_deref(), &app)) => a.unwrap_or(Answer::TimedOut),
                        _ = closing.cancelled() => Answer::Stopped,
                    }
                }
            };
            if matches!(answered, Answer::TimedOut | Answer::PushedOut) {
                let _ = socket.try_write(BUSY);
            }
            let status = match answered {
                Answer::Health(code) => code,
                Answer::Stopped => 0,
                Answer::Busy | Answer::TimedOut | Answer::PushedOut => 503,
            };
            tracing::debug!(peer = %peer, status, how = ?answered, "admin connection past the cap: health lane");
        });
    }
}

/// How a lane connection ended (for the log).
#[derive(Debug)]
enum Answer {
    Health(u16),
    Busy,
    TimedOut,
    PushedOut,
    Stopped,
}

/// Answers a connection whose request `head` was read (none: too long, or the peer closed
/// first): a health request through `app`, anything else with [`BUSY`].
async fn answer(socket: &mut TcpStream, head: Option<&[u8]>, app: &Router) -> Answer {
    let _ = socket.set_nodelay(true);
    let Some(request) = head.and_then(health_request) else {
        let _ = socket.write_all(BUSY).await;
        let _ = socket.shutdown().await;
        return Answer::Busy;
    };
    let svc = TowerToHyperService::new(app.clone());
    let response = match svc.call(request).await {
        Ok(r) => r,
        Err(never) => match never {},
    };
    let (parts, body) = response.into_parts();
    let body = axum::body::to_bytes(body, MAX_BODY)
        .await
        .unwrap_or_default();
    let content_type = parts
        .headers
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("text/plain; charset=utf-8");
    let status = parts.status;
    let head = format!(
        "HTTP/1.1 {} {}\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        status.as_u16(),
        status.canonical_reason().unwrap_or(""),
        body.len()
    );
    let mut out = head.into_bytes();
    out.extend_from_slice(&body);
    let _ = socket.write_all(&out).await;
    let _ = socket.shutdown().await;
    Answer::Health(status.as_u16())
}

/// The request head, up to its blank line; none when it is longer than [`LANE_HEAD`] or the
/// peer closes first. Read whole so that closing after the answer does not reset it.
async fn read_head(socket: &mut TcpStream) -> Option<Vec<u8>> {
    let mut head = Vec::with_capacity(512);
    let mut buf = [0u8; 1024];
    loop {
        let n = socket.read(&mut buf).await.ok()?;
        if n == 0 {
            return None;
        }
        head.extend_from_slice(&buf[..n]);
        if let Some(end) = find(&head, b"\r\n\r\n") {
            head.truncate(end);
            return Some(head);
        }
        if head.len() > LANE_HEAD {
            return None;
        }
    }
}

/// Whether a whole health request head is waiting, unread, in `socket` (looked at with
/// `MSG_PEEK`, so nothing is taken from it; never waits).
fn health_head_waiting(socket: &TcpStream) -> bool {
    use std::os::fd::AsFd;
    // A second descriptor of the same socket (it shares the non-blocking flag), for std's
    // `peek`; closed when it goes out of scope.
    let Ok(fd) = socket.as_fd().try_clone_to_owned() else {
        return false;
    };
    let mut buf = [0u8; LANE_HEAD + 4];
    let Ok(n) = std::net::TcpStream::from(fd).peek(&mut buf) else {
        return false;
    };
    find(&buf[..n], b"\r\n\r\n").is_some_and(|end| health_request(&buf[..end]).is_some())
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// A `GET` or `HEAD` of `/healthz` or `/readyz` (any query), as a request for the router;
/// none for anything else. Only the request line is read: the health routes use no header.
fn health_request(head: &[u8]) -> Option<axum::http::Request<Body>> {
    let line = head.split(|&b| b == b'\r').next()?;
    let line = std::str::from_utf8(line).ok()?;
    let mut parts = line.split(' ');
    let (method, target, version) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() || !version.starts_with("HTTP/1.") {
        return None;
    }
    let method = match method {
        "GET" => axum::http::Method::GET,
        "HEAD" => axum::http::Method::HEAD,
        _ => return None,
    };
    let path = target.split('?').next()?;
    if path != "/healthz" && path != "/readyz" {
        return None;
    }
    axum::http::Request::builder()
        .method(method)
        .uri(path)
        .body(Body::empty())
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_health_requests_are_answered_in_the_lane() {
        let ok = |h: &str| health_request(h.as_bytes()).map(|r| r.uri().path().to_string());
        assert_eq!(
            ok("GET /healthz HTTP/1.1\r\nHost: 10.0.0.1:9187\r\nUser-Agent: kube-probe/1.31"),
            Some("/healthz".into())
        );
        assert_eq!(ok("GET /readyz?x=1 HTTP/1.0"), Some("/readyz".into()));
        assert_eq!(ok("HEAD /healthz HTTP/1.1"), Some("/healthz".into()));
        for bad in [
            "GET /metrics HTTP/1.1",
            "GET /status HTTP/1.1",
            "POST /healthz HTTP/1.1",
            "GET /healthz",
            "GET /healthz HTTP/2 extra",
            "GET /healthzz HTTP/1.1",
            "GET http://x/healthz HTTP/1.1",
            "",
        ] {
            assert_eq!(ok(bad), None, "{bad}");
        }
        assert_eq!(find(b"a\r\n\r\nb", b"\r\n\r\n"), Some(1));
    }

    /// A pushed-out connection is answered only when a whole health request waits in its
    /// socket, and looking does not take it from there.
    #[tokio::test]
    async fn a_waiting_health_head_is_seen_without_being_taken() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let mut client = TcpStream::connect(listener.local_addr().expect("addr"))
            .await
            .expect("connect");
        let (mut server, _) = listener.accept().await.expect("accept");
        let settle = || tokio::time::sleep(Duration::from_millis(50));
        assert!(!health_head_waiting(&server), "nothing sent");
        client
            .write_all(b"GET /healthz HTTP/1.1\r\nHost: x")
            .await
            .expect("write");
        settle().await;
        assert!(!health_head_waiting(&server), "part of a head");
        client.write_all(b"\r\n\r\n").await.expect("write");
        settle().await;
        assert!(health_head_waiting(&server), "a whole head");
        assert!(health_head_waiting(&server), "still there");
        let head = read_head(&mut server).await.expect("head");
        assert!(health_request(&head).is_some());

        let mut other = TcpStream::connect(listener.local_addr().expect("addr"))
            .await
            .expect("connect");
        let (server, _) = listener.accept().await.expect("accept");
        other
            .write_all(b"GET /metrics HTTP/1.1\r\n\r\n")
            .await
            .expect("write");
        settle().await;
        assert!(!health_head_waiting(&server), "not a health request");
    }
}
