//! The attackers of issue 21 that are not on the proxy port: slow and flooding admin
//! clients, with a well-behaved scraper timing its longest wait for an answer, and a config
//! file rewritten in place in two pieces.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::abuse21::{add, connect, max, sleep_until_or, Done21};

/// `GET path` on the admin endpoint; the status code, if a response came within 5 s.
pub async fn http_get(admin: SocketAddr, path: &str) -> Option<(u16, String)> {
    let get = async {
        let mut s = connect(admin).await?;
        // HTTP/1.0: the response is not chunked, and ends with the connection.
        let req = format!("GET {path} HTTP/1.0\r\nHost: soak\r\n\r\n");
        s.write_all(req.as_bytes()).await.ok()?;
        let mut out = Vec::new();
        s.read_to_end(&mut out).await.ok()?;
        let text = String::from_utf8_lossy(&out).into_owned();
        let code = text.split_whitespace().nth(1)?.parse().ok()?;
        Some((code, text))
    };
    tokio::time::timeout(Duration::from_secs(5), get)
        .await
        .ok()?
}

/// A well-behaved scraper: `/metrics` every second, again after 200 ms when it got no
/// answer; records the longest time without one.
pub async fn scraper(admin: SocketAddr, done: Arc<Done21>, until: Instant) {
    let mut last = Instant::now();
    while Instant::now() < until {
        match http_get(admin, "/metrics").await {
            Some((200, _)) => {
                add(&done.scrapes_ok);
                max(&done.scrape_max_gap_ms, last.elapsed().as_millis() as u64);
                last = Instant::now();
                sleep_until_or(Duration::from_secs(1), until).await;
            }
            _ => {
                add(&done.scrapes_failed);
                sleep_until_or(Duration::from_millis(200), until).await;
            }
        }
    }
    max(&done.scrape_max_gap_ms, last.elapsed().as_millis() as u64);
}

/// A request head that never ends: one header line a second, until the proxy cuts it.
pub async fn slow_headers(admin: SocketAddr, done: Arc<Done21>, until: Instant) {
    while Instant::now() < until {
        let Some(mut s) = connect(admin).await else {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        add(&done.slow_headers);
        let opened = Instant::now();
        let mut cut = s.write_all(b"GET /metrics HTTP/1.1\r\n").await.is_err();
        let mut b = [0u8; 256];
        while !cut && Instant::now() < until {
            tokio::select! {
                _ = s.read(&mut b) => cut = true,
                _ = tokio::time::sleep(Duration::from_secs(1)) => {
                    cut = s.write_all(b"X-Slow: 1\r\n").await.is_err();
                }
            }
        }
        if cut {
            add(&done.slow_headers_cut);
            max(
                &done.slow_headers_max_ms,
                opened.elapsed().as_millis() as u64,
            );
        }
        sleep_until_or(Duration::from_millis(200), until).await;
    }
}

/// Every 10 s, `n` admin connections at once (past the cap), each with half a request head,
/// held until the proxy answers 503 or closes them.
pub async fn admin_flood(admin: SocketAddr, n: usize, done: Arc<Done21>, until: Instant) {
    while Instant::now() < until {
        let mut conns = tokio::task::JoinSet::new();
        for _ in 0..n {
            let Some(mut s) = connect(admin).await else {
                continue;
            };
            add(&done.admin_flood);
            let done = done.clone();
            conns.spawn(async move {
                let _ = s.write_all(b"GET /metrics HTTP/1.1\r\n").await;
                let mut out = Vec::new();
                let read = s.read_to_end(&mut out);
                let _ = tokio::time::timeout(Duration::from_secs(15), read).await;
                if out.starts_with(b"HTTP/1.1 503") {
                    add(&done.admin_503);
                }
            });
        }
        while conns.join_next().await.is_some() {}
        sleep_until_or(Duration::from_secs(10), until).await;
    }
}

/// Rewrites the config file in place in two pieces (the first piece a valid config in which
/// `pay.*` falls to the `*` fallback pattern), 1.2 s apart, with a `touch` of the file (an
/// open for writing and its close, issue 30) in the pause, alternating two whole versions in
/// which `pay.*` is strict; each write is left `reload::WRITE_QUIET` and 1.5 s to apply.
pub async fn config_writer(
    path: PathBuf,
    versions: [String; 2],
    done: Arc<Done21>,
    until: Instant,
) {
    use std::io::Write;
    let mut i = 0;
    while Instant::now() < until {
        let text = &versions[i % 2];
        i += 1;
        let split = text.find(super::PAY_SECTION).unwrap_or(text.len() / 2);
        let Ok(mut f) = std::fs::OpenOptions::new()
            .write(true)
            .truncate(true)
            .open(&path)
        else {
            return;
        };
        let _ = f.write_all(&text.as_bytes()[..split]);
        let _ = f.flush();
        tokio::time::sleep(Duration::from_millis(600)).await;
        // Another program touches the file: opened for writing, closed.
        drop(std::fs::OpenOptions::new().append(true).open(&path));
        tokio::time::sleep(Duration::from_millis(600)).await;
        let _ = f.write_all(&text.as_bytes()[split..]);
        drop(f);
        add(&done.config_writes);
        let settle = staleguard::reload::WRITE_QUIET + Duration::from_millis(1500);
        sleep_until_or(settle, until).await;
    }
}
