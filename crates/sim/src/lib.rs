//! A simulated sharded MongoDB cluster: one mongos speaking the wire protocol, a config
//! server's routing tables, and two shards of a primary and two secondaries each. It models
//! exactly what the incident in the shared `background.md` needs: per-node routing tables that are
//! lost on restart, the secondary refresh that needs a write on its primary, a primary that
//! stalls writes while answering heartbeats, chunk migrations that leave orphans, mongos's
//! internal StaleConfig retries under `maxTimeMS`, and `readConcern: available` skipping the
//! version check and the orphan filter.
//!
//! ```text
//! front       sockets: framing, compression, hello (mongos and, with node_ports, each node)
//!   ├─ commands     mongos's read commands; catalog (explain, list*); writes (insert/update/delete)
//!   │    ├─ read        targeting, shard version check, refresh through the primary, retries
//!   │    ├─ select      $readPreference parsing and node choice
//!   │    └─ engine      a primary's write path: tickets, stall, resume
//!   ├─ node         commands on a node's own port (serverStatus, replSetGetStatus, direct CRUD)
//!   ├─ simcontrol   {simControl: ...} → control (faults) and report (status)
//!   └─ status       hello, buildInfo, serverStatus, replSetGetStatus documents
//! model (the state) · routing (chunks, versions, hashed key) · store (a shard's documents)
//! request (message → command) · query / update / pipeline (the filter, update, agg subset)
//! ```
//!
//! It is a test bed, not a database: no persistence, simple filters only, and documents are
//! handled decoded (`bson::Document`) because clarity matters more than speed here.

mod auth;
mod catalog;
mod commands;
mod control;
mod engine;
mod front;
mod model;
mod node;
mod pipeline;
mod query;
mod read;
mod readlog;
mod report;
mod request;
mod routing;
pub mod scram;
mod select;
mod simcontrol;
mod status;
mod store;
mod update;
mod views;
mod writes;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bson::oid::ObjectId;
use bson::{doc, Document};
use tokio::net::TcpListener;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use control::MoveReport;
pub use model::{Settings, SHARDS};
pub use readlog::{Member, ReadRecord};
pub use report::{
    ChunkStatus, ClusterStatus, CollectionStatus, MongosStatus, NodeStatus, RefreshStatus,
    ShardStatus, TableState, TableStatus,
};

use model::{lock, State};

/// How to run the simulated cluster. Every time limit is configurable so tests finish in
/// seconds; the defaults are MongoDB 4.2's.
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// Where mongos listens. Default `127.0.0.1:27017`.
    pub listen: String,
    /// How long a secondary waits for its primary to persist a routing table refresh
    /// (`_flushRoutingTableCacheUpdates`) before the refresh fails. Default 30 s, as 4.2.
    pub refresh_timeout: Duration,
    /// How many times mongos retries a read after StaleConfig before returning it (4.2's
    /// `kMaxNumStaleVersionRetries`). Default 10.
    pub stale_retries: u32,
    /// Write tickets per shard primary (`wiredTigerConcurrentWriteTransactions`). Default 128.
    pub write_tickets: u32,
    /// Also listen on one port per node (hello as a replica-set member, serverStatus,
    /// replSetGetStatus, direct reads and writes). Default false.
    pub node_ports: bool,
    /// First node port (a0; then a1, a2, b0, ...); 0 = ephemeral ports. Default 0.
    pub node_base_port: u16,
    /// Seed for node choice among eligible nodes and for cursor ids. Default 42.
    pub seed: u64,
    /// How long a secondary's refresh through a healthy primary takes. Default 3 ms.
    pub flush_latency: Duration,
    /// How long mongos waits for a node that matches the read preference before
    /// FailedToSatisfyReadPreference (133). Default 1 s (4.2 waits up to 20 s).
    pub find_host_timeout: Duration,
    /// `moveChunk` without `deleteAfter`: when the donor deletes the orphans. Default 900 s
    /// (4.2's `orphanCleanupDelaySecs`).
    pub default_delete_after: Duration,
    /// Load `demo.store_inventory` (2000 documents) and `pay.transactions` (300). Default true.
    pub preload: bool,
    /// One network round trip between mongos and a shard node, paid by each node's part of
    /// every read attempt and counted against its `maxTimeMS` (so `maxTimeMS: 1` fails, as
    /// it does on a real cluster). Default 0: answers as fast as the process can.
    pub hop_latency: Duration,
    /// Keep the last this many read commands that carry a string `comment` in the read log
    /// (`Cluster::take_read_log`): what reached mongos and what became of it. Default 0: off.
    pub read_log: usize,
    /// Users (name, password) of the `admin` database. Any: auth is on, and every
    /// connection (mongos's and each node's) must authenticate (SCRAM-SHA-256) before it
    /// may run anything but the handshake, `ping`, `buildInfo` and the SASL commands; other
    /// commands get Unauthorized (13). Default none: auth off.
    pub users: Vec<(String, String)>,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            listen: "127.0.0.1:27017".to_string(),
            refresh_timeout: Duration::from_secs(30),
            stale_retries: 10,
            write_tickets: 128,
            node_ports: false,
            node_base_port: 0,
            seed: 42,
            flush_latency: Duration::from_millis(3),
            find_host_timeout: Duration::from_secs(1),
            default_delete_after: Duration::from_secs(900),
            preload: true,
            hop_latency: Duration::ZERO,
            read_log: 0,
            users: Vec::new(),
        }
    }
}

/// A MongoDB error as the simulator replies it: `{ok: 0, errmsg, code, codeName, ...}`.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{code_name} ({code}): {message}")]
pub struct SimError {
    pub code: i32,
    pub code_name: &'static str,
    pub message: String,
    /// Extra reply fields (StaleConfig's `ns`, `shardId`, ...).
    pub extra: Option<Box<Document>>,
}

impl SimError {
    pub fn new(code: i32, code_name: &'static str, message: impl Into<String>) -> SimError {
        SimError {
            code,
            code_name,
            message: message.into(),
            extra: None,
        }
    }

    pub fn bad_value(message: impl Into<String>) -> SimError {
        SimError::new(2, "BadValue", message)
    }

    pub fn failed_to_parse(message: impl Into<String>) -> SimError {
        SimError::new(9, "FailedToParse", message)
    }

    pub fn illegal(message: impl Into<String>) -> SimError {
        SimError::new(20, "IllegalOperation", message)
    }

    pub fn max_time() -> SimError {
        SimError::new(50, "MaxTimeMSExpired", "operation exceeded time limit")
    }

    pub fn invalid_namespace(message: impl Into<String>) -> SimError {
        SimError::new(73, "InvalidNamespace", message)
    }

    pub fn invalid_options(message: impl Into<String>) -> SimError {
        SimError::new(72, "InvalidOptions", message)
    }

    /// The reply body.
    pub fn to_document(&self) -> Document {
        let mut d = doc! {
            "ok": 0.0,
            "errmsg": &self.message,
            "code": self.code,
            "codeName": self.code_name,
        };
        if let Some(extra) = &self.extra {
            d.extend(extra.as_ref().clone());
        }
        d
    }
}

/// The simulated cluster's shared state; every fault and status method lives here.
pub struct Cluster {
    state: Arc<Mutex<State>>,
    settings: Mutex<Settings>,
    read_log: Mutex<readlog::ReadLog>,
    users: auth::Users,
    /// mongos's `topologyVersion.processId`.
    process_id: ObjectId,
    started: Instant,
    stop: CancellationToken,
    tasks: TaskTracker,
    next_request_id: AtomicI32,
    next_connection_id: AtomicI32,
}

impl Cluster {
    fn new(cfg: &SimConfig) -> Cluster {
        let stop = CancellationToken::new();
        let mut state = State::new(cfg.seed, cfg.write_tickets, cfg.preload);
        for n in &mut state.nodes {
            n.incarnation = stop.child_token();
        }
        Cluster {
            state: Arc::new(Mutex::new(state)),
            settings: Mutex::new(Settings {
                refresh_timeout: cfg.refresh_timeout,
                stale_retries: cfg.stale_retries,
                flush_latency: cfg.flush_latency,
                find_host_timeout: cfg.find_host_timeout,
                default_delete_after: cfg.default_delete_after,
                hop_latency: cfg.hop_latency,
            }),
            read_log: Mutex::new(readlog::ReadLog::new(cfg.read_log)),
            users: auth::Users::new(&cfg.users),
            process_id: ObjectId::new(),
            started: Instant::now(),
            stop,
            tasks: TaskTracker::new(),
            next_request_id: AtomicI32::new(1),
            next_connection_id: AtomicI32::new(1),
        }
    }

    fn request_id(&self) -> i32 {
        self.next_request_id.fetch_add(1, Ordering::Relaxed) & i32::MAX
    }

    fn connection_id(&self) -> i32 {
        self.next_connection_id.fetch_add(1, Ordering::Relaxed) & i32::MAX
    }
}

/// A running simulated cluster.
pub struct SimHandle {
    addr: SocketAddr,
    cluster: Arc<Cluster>,
}

/// Binds mongos (and, with `node_ports`, every node) and starts serving.
pub async fn start(cfg: SimConfig) -> std::io::Result<SimHandle> {
    let listener = TcpListener::bind(&cfg.listen).await?;
    let addr = listener.local_addr()?;
    let cluster = Arc::new(Cluster::new(&cfg));
    let mut node_listeners = Vec::new();
    if cfg.node_ports {
        let count = lock(&cluster.state).nodes.len();
        for i in 0..count {
            let port = match cfg.node_base_port {
                0 => 0,
                base => base.saturating_add(i as u16),
            };
            let l = TcpListener::bind(SocketAddr::new(addr.ip(), port)).await?;
            lock(&cluster.state).nodes[i].addr = Some(l.local_addr()?);
            node_listeners.push((i, l));
        }
    }
    cluster.tasks.spawn(front::accept_loop(
        cluster.clone(),
        listener,
        front::Role::Mongos,
    ));
    for (i, l) in node_listeners {
        cluster
            .tasks
            .spawn(front::accept_loop(cluster.clone(), l, front::Role::Node(i)));
    }
    tracing::info!(%addr, node_ports = cfg.node_ports, "sim cluster listening");
    Ok(SimHandle { addr, cluster })
}

impl SimHandle {
    /// mongos's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// A node's own address (`"a1"`), when `node_ports` is on.
    pub fn node_addr(&self, node: &str) -> Option<SocketAddr> {
        let st = lock(&self.cluster.state);
        st.nodes.iter().find(|n| n.name == node)?.addr
    }

    /// Direct access to the cluster (faults, status).
    pub fn cluster(&self) -> Arc<Cluster> {
        self.cluster.clone()
    }

    /// Stops listening, closes every connection and background task, and waits for them.
    pub async fn shutdown(self) {
        self.cluster.stop.cancel();
        self.cluster.tasks.close();
        self.cluster.tasks.wait().await;
    }
}

impl Drop for SimHandle {
    fn drop(&mut self) {
        self.cluster.stop.cancel();
    }
}
