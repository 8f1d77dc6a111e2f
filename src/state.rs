//! The small handles of state that several tasks share, defined low so that whoever needs
//! one is given it: the live config with its generation, the id counters, and the runtime
//! facts `/status` shows (start time, listening address, last config load), and the count
//! of client connections that `max_connections` bounds.

use std::net::{IpAddr, SocketAddr};

use dashmap::DashMap;
use std::sync::atomic::{AtomicI32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::SystemTime;

use arc_swap::{ArcSwap, Guard};

use crate::config::Config;
use crate::metrics::Metrics;

/// The config in force, swapped whole on reload. Readers take an `Arc` of it (or a
/// short-lived guard); a session keeps its own copy and re-reads only when the generation
/// moved.
#[derive(Debug)]
pub struct LiveConfig {
    config: ArcSwap<Config>,
    /// Bumped after every swap (a relaxed load of a read-mostly word, instead of a shared
    /// refcount per request).
    generation: AtomicU64,
}

impl LiveConfig {
    pub fn new(config: Arc<Config>) -> LiveConfig {
        LiveConfig {
            config: ArcSwap::new(config),
            generation: AtomicU64::new(0),
        }
    }

    /// A short-lived view of the config in force.
    pub fn load(&self) -> Guard<Arc<Config>> {
        self.config.load()
    }

    /// The config in force, to keep.
    pub fn load_full(&self) -> Arc<Config> {
        self.config.load_full()
    }

    /// Changes whenever the config is swapped.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Swaps in a new config; sessions pick it up from their next request.
    pub fn swap(&self, config: Arc<Config>) {
        self.config.store(config);
        self.generation.fetch_add(1, Ordering::Release);
    }
}

/// Ids the proxy hands out: connection ids (for logs) and requestIDs of the messages it
/// originates (error replies, health checks).
#[derive(Debug)]
pub struct Ids {
    next_conn: AtomicU64,
    next_request_id: AtomicI32,
}

impl Default for Ids {
    fn default() -> Self {
        Ids {
            next_conn: AtomicU64::new(1),
            next_request_id: AtomicI32::new(1),
        }
    }
}

impl Ids {
    /// The id of a new client connection.
    pub fn next_conn(&self) -> u64 {
        self.next_conn.fetch_add(1, Ordering::Relaxed)
    }

    /// A requestID for a message the proxy originates.
    pub fn request_id(&self) -> i32 {
        self.next_request_id.fetch_add(1, Ordering::Relaxed) & i32::MAX
    }
}

/// The outcome of the last config load, for `/status`.
#[derive(Debug, Clone)]
pub struct ReloadStatus {
    pub ok: bool,
    /// `start`, `signal`, `file`, `api`.
    pub trigger: String,
    pub at: SystemTime,
    /// Errors (`file:line: key: message`) when not ok; warnings when ok.
    pub messages: Vec<String>,
}

impl ReloadStatus {
    pub fn started() -> ReloadStatus {
        ReloadStatus {
            ok: true,
            trigger: "start".to_string(),
            at: SystemTime::now(),
            messages: Vec::new(),
        }
    }
}

/// Facts about this running proxy that the admin endpoint reports.
#[derive(Debug)]
pub struct Runtime {
    /// When this proxy started (wall clock).
    pub started: SystemTime,
    /// The address clients connect to, once bound.
    local_addr: OnceLock<SocketAddr>,
    reload_status: Mutex<ReloadStatus>,
}

impl Default for Runtime {
    fn default() -> Self {
        Runtime {
            started: SystemTime::now(),
            local_addr: OnceLock::new(),
            reload_status: Mutex::new(ReloadStatus::started()),
        }
    }
}

impl Runtime {
    /// The address clients connect to, once bound.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.local_addr.get().copied()
    }

    /// Records the bound address (once; later calls change nothing).
    pub fn set_local_addr(&self, addr: SocketAddr) {
        let _ = self.local_addr.set(addr);
    }

    /// The outcome of the last config load.
    pub fn reload_status(&self) -> ReloadStatus {
        self.reload_status
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub fn set_reload_status(&self, s: ReloadStatus) {
        *self.reload_status.lock().unwrap_or_else(|p| p.into_inner()) = s;
    }
}

/// Client connections open now, bounded by `max_connections` and, per peer address, by
/// `max_connections_per_peer`: a connection holds a [`ClientSlot`] for its whole life.
/// Peers are always counted (one map entry per address with a connection open, taken on
/// accept and close only), so turning the per-peer cap on by a reload counts the
/// connections already open.
#[derive(Debug, Default)]
pub struct ClientSlots {
    open: Arc<AtomicUsize>,
    per_peer: Arc<DashMap<IpAddr, usize>>,
}

/// One client connection's place; given back when dropped.
#[derive(Debug)]
pub struct ClientSlot {
    open: Arc<AtomicUsize>,
    peer: Option<(Arc<DashMap<IpAddr, usize>>, IpAddr)>,
}

/// Why no place was given: which limit acted (its `limit` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    MaxConnections,
    PerPeer,
}

impl Refused {
    /// The `limit` label of `limit_hits_total`.
    pub fn limit(self) -> &'static str {
        match self {
            Refused::MaxConnections => "max_connections",
            Refused::PerPeer => "max_connections_per_peer",
        }
    }
}

impl ClientSlots {
    /// A place for one more connection, if fewer than `max` are open (not counted per peer).
    pub fn acquire(&self, max: usize) -> Option<ClientSlot> {
        self.take(max).then(|| ClientSlot {
            open: self.open.clone(),
            peer: None,
        })
    }

    /// A place for one more client connection from `peer`: fewer than `max` open in all,
    /// and fewer than `per_peer` (when set) from that address.
    pub fn acquire_from(
        &self,
        peer: IpAddr,
        max: usize,
        per_peer: Option<usize>,
    ) -> Result<ClientSlot, Refused> {
        if !self.take(max) {
            return Err(Refused::MaxConnections);
        }
        let mut n = self.per_peer.entry(peer).or_insert(0);
        // A refused peer has at least `cap` (>= 1) open: its entry is never left at 0.
        if per_peer.is_some_and(|cap| *n >= cap) {
            drop(n);
            self.open.fetch_sub(1, Ordering::AcqRel);
            return Err(Refused::PerPeer);
        }
        *n += 1;
        drop(n);
        Ok(ClientSlot {
            open: self.open.clone(),
            peer: Some((self.per_peer.clone(), peer)),
        })
    }

    fn take(&self, max: usize) -> bool {
        self.open
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .is_ok()
    }

    pub fn open(&self) -> usize {
        self.open.load(Ordering::Acquire)
    }

    /// Connections open now from `peer`.
    pub fn open_from(&self, peer: IpAddr) -> usize {
        self.per_peer.get(&peer).map_or(0, |n| *n)
    }
}

impl ClientSlot {
    fn give_back_peer(&mut self) {
        let Some((map, peer)) = self.peer.take() else {
            return;
        };
        if let Some(mut n) = map.get_mut(&peer) {
            *n = n.saturating_sub(1);
        }
        // Checked again under the shard's lock: an accept in between keeps the entry.
        map.remove_if(&peer, |_, n| *n == 0);
    }
}

impl Drop for ClientSlot {
    fn drop(&mut self) {
        self.give_back_peer();
        self.open.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Shows the configured limits in `/metrics` (at start and after each reload).
pub fn publish_limits(metrics: &Metrics, config: &Config, max_breakers: usize) {
    let l = &config.limits;
    let m = &metrics.limits;
    m.set("max_connections", l.max_connections as f64);
    m.set(
        "max_connections_per_peer",
        l.max_connections_per_peer.map_or(0.0, |n| n as f64),
    );
    m.set("message_timeout", l.message_timeout.as_secs_f64());
    m.set(
        "first_message_timeout",
        l.first_message_timeout.as_secs_f64(),
    );
    m.set(
        "idle_timeout",
        l.idle_timeout.map_or(0.0, |d| d.as_secs_f64()),
    );
    m.set("write_timeout", l.write_timeout.as_secs_f64());
    // A mongos that takes nothing is given the clients' write_timeout.
    m.set("upstream_write_timeout", l.write_timeout.as_secs_f64());
    m.set("held_for_upstream", crate::config::HELD_FOR_UPSTREAM as f64);
    m.set("max_pending_reads", l.max_pending_reads as f64);
    m.set("max_breakers", max_breakers as f64);
    let a = &config.admin_limits;
    m.set("admin_max_connections", a.max_connections as f64);
    m.set(
        "admin_max_connections_per_peer",
        a.max_connections_per_peer as f64,
    );
    m.set("admin_health_lane", crate::config::ADMIN_HEALTH_LANE as f64);
    m.set(
        "admin_header_read_timeout",
        a.header_read_timeout.as_secs_f64(),
    );
    m.set("admin_request_timeout", a.request_timeout.as_secs_f64());
}
