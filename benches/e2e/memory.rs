//! Memory per idle connection pair: a proxy's VmRSS idle, then with N client connections
//! (each with its upstream connection) that did one round trip each and went quiet, read
//! [`QUIET`] later (staleguard lets an idle pair's buffers go within 1.5 s of its last
//! message).

use std::net::SocketAddr;
use std::time::Duration;

use crate::load::{connect_many, upstream_stats, Client};
use crate::procs::Proc;

/// How long the pairs are quiet before the proxy's VmRSS is read.
const QUIET: Duration = Duration::from_secs(3);

pub struct MemResult {
    pub name: String,
    pub idle: u64,
    pub loaded: u64,
    pub pairs: usize,
    /// Upstream connections the fake mongos saw open while the clients were held.
    pub upstream_conns: Option<i64>,
}

impl MemResult {
    pub fn per_pair_kib(&self) -> f64 {
        (self.loaded.saturating_sub(self.idle)) as f64 / self.pairs.max(1) as f64 / 1024.0
    }
}

/// Measures `proxy` (freshly started, no connection yet) with `pairs` idle pairs.
pub async fn measure(
    proxy: &Proc,
    pairs: usize,
    request: &[u8],
    upstream: SocketAddr,
) -> Result<MemResult, String> {
    tokio::time::sleep(Duration::from_millis(300)).await;
    let idle = proxy.rss_bytes();
    let mut clients: Vec<Client> = connect_many(proxy.addr, pairs).await?;
    // One request each, so every session has read, relayed and written once.
    for chunk in clients.chunks_mut(256) {
        let joins = chunk.iter_mut().map(|c| {
            let mut req = request.to_vec();
            async move { c.round_trip(&mut req).await }
        });
        for r in futures::future::join_all(joins).await {
            r.map_err(|e| format!("{}: round trip: {e}", proxy.name))?;
        }
    }
    tokio::time::sleep(QUIET).await;
    let loaded = proxy.rss_bytes();
    let up = upstream_stats(upstream).await.ok().map(|s| s.connections);
    drop(clients);
    tokio::time::sleep(Duration::from_millis(500)).await;
    Ok(MemResult {
        name: proxy.name.clone(),
        idle,
        loaded,
        pairs,
        upstream_conns: up,
    })
}
