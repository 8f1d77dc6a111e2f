//! Connecting to mongos: round-robin over the configured routers, skipping unreachable ones.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::net::TcpStream;

#[derive(Debug, thiserror::Error)]
#[error("no upstream reachable: {}", .attempts.join("; "))]
pub struct NoUpstream {
    pub attempts: Vec<String>,
}

/// The mongos routers and the round-robin cursor over them.
#[derive(Debug)]
pub struct Upstreams {
    addrs: Vec<String>,
    next: AtomicUsize,
}

impl Upstreams {
    pub fn new(addrs: Vec<String>) -> Upstreams {
        Upstreams {
            addrs,
            next: AtomicUsize::new(0),
        }
    }

    pub fn addrs(&self) -> &[String] {
        &self.addrs
    }

    /// Connects to the next upstream in turn; an unreachable one is logged and skipped.
    pub async fn connect(&self, timeout: Duration) -> Result<(TcpStream, &str), NoUpstream> {
        let n = self.addrs.len();
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        let mut attempts = Vec::new();
        for i in 0..n {
            let addr = &self.addrs[(start + i) % n];
            match tokio::time::timeout(timeout, TcpStream::connect(addr.as_str())).await {
                Ok(Ok(s)) => {
                    let _ = s.set_nodelay(true);
                    return Ok((s, addr));
                }
                Ok(Err(e)) => {
                    tracing::error!(upstream = %addr, error = %e, "upstream unreachable, skipped");
                    attempts.push(format!("{addr}: {e}"));
                }
                Err(_) => {
                    tracing::error!(upstream = %addr, timeout = ?timeout, "upstream connect timed out, skipped");
                    attempts.push(format!("{addr}: connect timed out after {timeout:?}"));
                }
            }
        }
        Err(NoUpstream { attempts })
    }
}
