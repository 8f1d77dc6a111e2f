//! Connecting to mongos: round-robin over the configured routers, healthy ones first
//! (health is recorded here by the `health` checker), over TCP or TLS (`[upstream_tls]`).
//! Each router also guards its primary rung (`ladder`: reads sent to the primary); with
//! `[fleet]` budgets, this instance's share of the fleet's (`share`) is taken on top.

mod driver;
mod ladder;
mod share;

pub use driver::driver_client;
pub use ladder::{ConnLadder, Denied, LadderGuard, LadderPermit};
pub use share::{FleetShare, ShareSaid, Slots, Starts};

use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use arc_swap::ArcSwap;
use tokio::net::TcpStream;

use crate::config::{Config, Layout};
use crate::metrics::Metrics;
use crate::tls::{Stream, UpstreamTls};

#[derive(Debug, thiserror::Error)]
#[error("no upstream reachable: {}", .attempts.join("; "))]
pub struct NoUpstream {
    pub attempts: Vec<String>,
}

/// What the periodic `hello` says about an upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Health {
    /// Not checked yet: used like a healthy one.
    Unknown,
    Up,
    Down,
}

impl Health {
    pub fn as_str(self) -> &'static str {
        match self {
            Health::Unknown => "unknown",
            Health::Up => "up",
            Health::Down => "down",
        }
    }

    fn from_u8(v: u8) -> Health {
        match v {
            1 => Health::Up,
            2 => Health::Down,
            _ => Health::Unknown,
        }
    }
}

/// The last health check of one upstream.
#[derive(Debug, Clone)]
pub struct HealthInfo {
    pub health: Health,
    pub last_check: Option<SystemTime>,
    /// Round trip of the last answered `hello`.
    pub last_latency: Option<Duration>,
    /// Why the last failing check failed (kept until a check succeeds).
    pub last_error: Option<String>,
    /// When `health` last changed.
    pub since: SystemTime,
    /// Reads it left unanswered past their `maxTimeMS` and a grace (answered by
    /// staleguard instead), and when the last was: a router that still answers `hello`
    /// but has gone silent on reads.
    pub silent_reads: u64,
    pub last_silent: Option<SystemTime>,
}

/// One mongos router.
#[derive(Debug)]
pub struct Upstream {
    pub addr: String,
    /// Ladder reads through this router (`[ladder_guard]`).
    pub ladder: Arc<LadderGuard>,
    health: AtomicU8,
    info: Mutex<HealthInfo>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Upstream {
    fn new(addr: String) -> Upstream {
        Upstream {
            addr,
            ladder: Arc::default(),
            health: AtomicU8::new(0),
            info: Mutex::new(HealthInfo {
                health: Health::Unknown,
                last_check: None,
                last_latency: None,
                last_error: None,
                since: SystemTime::now(),
                silent_reads: 0,
                last_silent: None,
            }),
        }
    }

    pub fn health(&self) -> Health {
        Health::from_u8(self.health.load(Ordering::Relaxed))
    }

    pub fn info(&self) -> HealthInfo {
        lock(&self.info).clone()
    }

    /// Back to unknown (health checks turned off).
    pub fn forget(&self) {
        let mut info = lock(&self.info);
        info.health = Health::Unknown;
        info.since = SystemTime::now();
        self.health.store(0, Ordering::Relaxed);
    }

    /// A read through this router got no reply past its limit and a grace.
    pub fn silent(&self) {
        let mut info = lock(&self.info);
        info.silent_reads += 1;
        info.last_silent = Some(SystemTime::now());
    }

    /// Records a check; returns the previous health when it changed.
    pub fn record(&self, result: Result<Duration, String>) -> Option<Health> {
        let now = SystemTime::now();
        let mut info = lock(&self.info);
        let before = info.health;
        info.last_check = Some(now);
        info.health = match result {
            Ok(latency) => {
                info.last_latency = Some(latency);
                info.last_error = None;
                Health::Up
            }
            Err(e) => {
                info.last_error = Some(e);
                Health::Down
            }
        };
        self.health.store(
            match info.health {
                Health::Unknown => 0,
                Health::Up => 1,
                Health::Down => 2,
            },
            Ordering::Relaxed,
        );
        (before != info.health).then(|| {
            info.since = now;
            before
        })
    }
}

/// The mongos routers and the round-robin cursor over them. The list can be replaced on
/// reload; routers that stay keep their health.
#[derive(Debug)]
pub struct Upstreams {
    list: ArcSwap<Vec<Arc<Upstream>>>,
    next: AtomicUsize,
    /// This instance's share of the fleet's primary-rung budget (off without `[fleet]`).
    pub fleet_share: Arc<FleetShare>,
}

impl Upstreams {
    pub fn new(addrs: Vec<String>) -> Upstreams {
        let list = addrs.into_iter().map(|a| Arc::new(Upstream::new(a)));
        Upstreams {
            list: ArcSwap::from_pointee(list.collect()),
            next: AtomicUsize::new(0),
            fleet_share: Arc::default(),
        }
    }

    pub fn addrs(&self) -> Vec<String> {
        self.list.load().iter().map(|u| u.addr.clone()).collect()
    }

    pub fn list(&self) -> Arc<Vec<Arc<Upstream>>> {
        self.list.load_full()
    }

    /// The ladder guard of the router at `addr` (as `connect` returned it); `None` once a
    /// reload removed it (its sessions then fail fast rather than climb).
    pub fn ladder_guard(&self, addr: &str) -> Option<Arc<LadderGuard>> {
        self.list
            .load()
            .iter()
            .find(|u| u.addr == addr)
            .map(|u| u.ladder.clone())
    }

    /// A read through the router at `addr` got no reply past its limit and a grace.
    pub fn silent(&self, addr: &str) {
        if let Some(u) = self.list.load().iter().find(|u| u.addr == addr) {
            u.silent();
        }
    }

    /// Ready to serve: at least one upstream answered its last check (with checks off, at
    /// least one upstream is configured).
    pub fn any_up(&self, checks_on: bool) -> bool {
        let list = self.list.load();
        if !checks_on {
            return !list.is_empty();
        }
        list.iter().any(|u| u.health() == Health::Up)
    }

    /// Replaces the list; returns the addresses that were removed.
    pub fn set(&self, addrs: &[String]) -> Vec<String> {
        let old = self.list.load_full();
        let new: Vec<Arc<Upstream>> = addrs
            .iter()
            .map(|a| match old.iter().find(|u| &u.addr == a) {
                Some(u) => u.clone(),
                None => Arc::new(Upstream::new(a.clone())),
            })
            .collect();
        self.list.store(Arc::new(new));
        old.iter()
            .filter(|u| !addrs.contains(&u.addr))
            .map(|u| u.addr.clone())
            .collect()
    }

    /// Connects to the next upstream in turn, healthy (or not yet checked) ones first; one
    /// that fails is logged and skipped. Upstreams marked down are tried last: when all are
    /// down, trying them beats refusing the client.
    pub async fn connect(
        &self,
        config: &Config,
        metrics: &Metrics,
    ) -> Result<(Stream, Arc<Upstream>), NoUpstream> {
        let list = self.list.load_full();
        let n = list.len();
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        let in_turn = (0..n).map(|i| &list[(start + i) % n]);
        let (usable, down): (Vec<_>, Vec<_>) = in_turn.partition(|u| u.health() != Health::Down);
        if usable.is_empty() && n > 0 {
            tracing::debug!("every upstream is marked down; trying them anyway");
        }
        let mut attempts = Vec::new();
        for u in usable.into_iter().chain(down) {
            match dial(
                &u.addr,
                config.connect_timeout,
                config.upstream_tls.as_ref(),
            )
            .await
            {
                // `layout = "uring"`: a plain socket goes onto the session thread's ring.
                Ok(s) if config.layout == Layout::Uring => match s.onto_ring() {
                    Ok(s) => return Ok((s, Arc::clone(u))),
                    Err(e) => {
                        tracing::error!(upstream = %u.addr, error = %e, "cannot put the upstream connection on io_uring, skipped");
                        attempts.push(format!("{}: io_uring: {e}", u.addr));
                    }
                },
                Ok(s) => return Ok((s, Arc::clone(u))),
                Err(e) => {
                    if matches!(e, DialError::Tls(_)) {
                        metrics.tls_failure("upstream");
                    }
                    tracing::error!(upstream = %u.addr, error = %e, "upstream unreachable, skipped");
                    attempts.push(format!("{}: {e}", u.addr));
                }
            }
        }
        Err(NoUpstream { attempts })
    }
}

/// Why a connection to an upstream could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum DialError {
    #[error("connect: {0}")]
    Connect(std::io::Error),
    #[error("tls handshake: {0}")]
    Tls(std::io::Error),
    #[error("timed out after {0:?}")]
    Timeout(Duration),
}

/// Opens one connection to `addr`: TCP, then TLS when configured, all within `timeout`.
pub async fn dial(
    addr: &str,
    timeout: Duration,
    tls: Option<&UpstreamTls>,
) -> Result<Stream, DialError> {
    let attempt = async {
        let tcp = TcpStream::connect(addr).await.map_err(DialError::Connect)?;
        let _ = tcp.set_nodelay(true);
        match tls {
            Some(t) => t.connect(tcp, addr).await.map_err(DialError::Tls),
            None => Ok(Stream::Plain(tcp)),
        }
    };
    match tokio::time::timeout(timeout, attempt).await {
        Ok(r) => r,
        Err(_) => Err(DialError::Timeout(timeout)),
    }
}
