//! The admin HTTP endpoint (axum): `/healthz`, `/readyz`, `/metrics`, `/status` (JSON) and
//! `/` (the HTML status page). With `[admin] token` set, everything but `/healthz` and
//! `/readyz` needs `Authorization: Bearer TOKEN` (or `?token=TOKEN`, for a browser). Its
//! connections (`conn`) are bounded: a cap, a header-read timeout, a request timeout, and a
//! stop that waits for no peer.

mod conn;
mod dry_run;
pub mod history;
mod incident;
mod lane;
mod ns_rows;
mod page;
mod plots;
mod screen;
mod sections;
mod stall_status;
pub mod status;
mod summary;
mod tables;
mod text;

use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::handles::AdminHandles;
use crate::metrics::Format;

#[derive(Clone)]
struct AdminState {
    shared: Arc<AdminHandles>,
    /// Cancelled when the proxy starts stopping: not ready any more.
    stopping: CancellationToken,
}

/// The admin routes over `shared`.
pub fn router(shared: Arc<AdminHandles>, stopping: CancellationToken) -> Router {
    Router::new()
        .route("/", get(page))
        .route("/status", get(status_json))
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(AdminState { shared, stopping })
}

pub use conn::CLOSE_WAIT;

/// Serves until `done` (the proxy has stopped), then closes every admin connection within
/// [`CLOSE_WAIT`]; `stopping` turns `/readyz` to 503.
pub async fn serve(
    listener: TcpListener,
    shared: Arc<AdminHandles>,
    stopping: CancellationToken,
    done: CancellationToken,
) {
    let addr = listener
        .local_addr()
        .map_or_else(|e| format!("unknown ({e})"), |a| a.to_string());
    let loopback = listener.local_addr().is_ok_and(|a| a.ip().is_loopback());
    let config = shared.config.load_full();
    if !loopback && config.admin_token.is_none() {
        tracing::warn!(admin = %addr, "admin endpoint reachable beyond loopback without [admin] token");
    }
    tracing::info!(admin = %addr, auth = config.admin_token.is_some(), "admin endpoint listening");
    tokio::spawn(history::sample(shared.clone(), done.clone()));
    let app = router(shared.clone(), stopping);
    conn::accept(listener, app, shared, done).await;
}

async fn healthz() -> &'static str {
    "ok\n"
}

async fn readyz(State(st): State<AdminState>) -> Response {
    if st.stopping.is_cancelled() {
        return (StatusCode::SERVICE_UNAVAILABLE, "stopping\n").into_response();
    }
    if status::ready(&st.shared) {
        (StatusCode::OK, "ready\n").into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "no upstream answered its last health check\n",
        )
            .into_response()
    }
}

async fn metrics(State(st): State<AdminState>, headers: HeaderMap, uri: Uri) -> Response {
    if !authorized(&st, &headers, &uri) {
        return unauthorized();
    }
    // Several Accept headers are one list (RFC 9110).
    let accept: Vec<&str> = headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .collect();
    let format = Format::negotiate((!accept.is_empty()).then(|| accept.join(",")).as_deref());
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static(format.content_type()),
        )],
        st.shared.metrics.render_as(format),
    )
        .into_response()
}

async fn status_json(State(st): State<AdminState>, headers: HeaderMap, uri: Uri) -> Response {
    if !authorized(&st, &headers, &uri) {
        return unauthorized();
    }
    let s = status::collect(&st.shared, !st.stopping.is_cancelled());
    match serde_json::to_string_pretty(&s) {
        Ok(body) => (
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            )],
            body,
        )
            .into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, format!("status: {e}\n")).into_response(),
    }
}

async fn page(State(st): State<AdminState>, headers: HeaderMap, uri: Uri) -> Response {
    if !authorized(&st, &headers, &uri) {
        return unauthorized();
    }
    let s = status::collect(&st.shared, !st.stopping.is_cancelled());
    (
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/html; charset=utf-8"),
            ),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-store")),
        ],
        page::render(&s, &page::Asked::from_query(uri.query())),
    )
        .into_response()
}

/// The bearer token (header, or `token` query parameter) matches, or none is configured.
fn authorized(st: &AdminState, headers: &HeaderMap, uri: &Uri) -> bool {
    let config = st.shared.config.load();
    let Some(expected) = config.admin_token.as_deref() else {
        return true;
    };
    let from_header = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(|t| t.trim().to_string());
    let from_query = uri.query().and_then(|q| {
        q.split('&')
            .filter_map(|kv| kv.split_once('='))
            .find(|(k, _)| *k == "token")
            .map(|(_, v)| percent_decode(v))
    });
    from_header
        .into_iter()
        .chain(from_query)
        .any(|t| same(t.as_bytes(), expected.as_bytes()))
}

fn unauthorized() -> Response {
    (
        StatusCode::UNAUTHORIZED,
        [(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"))],
        "admin token required: Authorization: Bearer TOKEN\n",
    )
        .into_response()
}

/// Compares in time that does not depend on where the first difference is.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        match b[i] {
            b'%' if i + 2 < b.len() => match (hex(b[i + 1]), hex(b[i + 2])) {
                (Some(h), Some(l)) => {
                    out.push((h * 16 + l) as u8);
                    i += 3;
                    continue;
                }
                _ => out.push(b'%'),
            },
            b'+' => out.push(b' '),
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::{percent_decode, same};

    #[test]
    fn query_tokens_decode() {
        assert_eq!(percent_decode("a%2Fb%25c"), "a/b%c");
        assert_eq!(percent_decode("abc%"), "abc%");
        assert_eq!(percent_decode("abc%4"), "abc%4");
        assert_eq!(percent_decode("%41"), "A");
    }

    #[test]
    fn token_compare() {
        assert!(same(b"secret", b"secret"));
        assert!(!same(b"secret", b"secreT"));
        assert!(!same(b"secret", b"secret2"));
    }
}
