//! Cluster state: the config server's routing tables, the shards (documents, oplog time,
//! write tickets, the stall), the nodes (their own routing tables, counters), mongos's cache
//! and cursors, the cluster clock. The write path is in `engine`.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bson::oid::ObjectId;
use bson::{doc, Bson, Document, Timestamp};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::engine::{Outcome, WriteOp};
use super::routing::{hash_value, Chunk, ShardId, Table};
use super::store::Collection;
use super::views::View;

/// Index of a node in the cluster (`a0 a1 a2 b0 b1 b2` = 0..6).
pub type NodeId = usize;

/// Shard names, in id order.
pub const SHARDS: [&str; 2] = ["shardA", "shardB"];
/// Nodes per shard; the first of each shard is its primary.
pub const NODES_PER_SHARD: usize = 3;
/// The shard that holds unsharded collections (every database's primary shard).
pub const PRIMARY_SHARD: ShardId = 0;

/// Settings that `simControl: configure` may change while running.
#[derive(Debug, Clone)]
pub struct Settings {
    pub refresh_timeout: Duration,
    pub stale_retries: u32,
    pub flush_latency: Duration,
    pub find_host_timeout: Duration,
    pub default_delete_after: Duration,
    /// One round trip between mongos and a shard node (each node's part of a read waits it
    /// once per attempt, inside the read's `maxTimeMS`).
    pub hop_latency: Duration,
}

/// serverStatus-style counters of one process.
#[derive(Debug, Clone, Default)]
pub struct Counters {
    pub insert: u64,
    pub query: u64,
    pub update: u64,
    pub delete: u64,
    pub getmore: u64,
    pub command: u64,
    pub write_ops: u64,
    pub write_micros: u64,
    pub read_ops: u64,
    pub read_micros: u64,
}

/// What a node remembers about its refreshes of one collection's routing table.
#[derive(Debug, Clone, Default)]
pub struct RefreshLog {
    pub successes: u32,
    pub failures: u32,
    pub last_ok: Option<bool>,
    pub last_error: Option<String>,
}

pub struct Node {
    pub name: String,
    pub shard: ShardId,
    pub primary: bool,
    /// The in-memory routing table per collection; absent = UNKNOWN.
    pub tables: HashMap<String, Arc<Table>>,
    pub refresh: BTreeMap<String, RefreshLog>,
    pub counters: Counters,
    pub process_id: ObjectId,
    pub started: Instant,
    pub restarts: u32,
    pub addr: Option<SocketAddr>,
    /// Cancelled when the node restarts: its connections close, as a process exit does.
    pub incarnation: CancellationToken,
}

/// A write waiting on a stalled primary.
pub struct Pending {
    pub op: WriteOp,
    pub done: watch::Sender<Option<Outcome>>,
    pub since: Instant,
}

pub struct Shard {
    pub name: &'static str,
    pub data: BTreeMap<String, Collection>,
    pub stalled: bool,
    pub tickets_total: u32,
    /// Writes submitted while stalled, in arrival order; the first `tickets_total` hold a
    /// ticket, the rest queue for one.
    pub pending: VecDeque<Pending>,
    /// The pending `_flushRoutingTableCacheUpdates` write per collection, shared by every
    /// secondary waiting on it.
    pub flushes: HashMap<String, watch::Receiver<Option<Outcome>>>,
    /// The primary's last applied optime; secondaries replicate instantly, so theirs is equal.
    pub optime: Timestamp,
    pub term: i64,
}

impl Shard {
    pub fn tickets_out(&self) -> u32 {
        self.pending.len().min(self.tickets_total as usize) as u32
    }

    pub fn queued_writers(&self) -> u32 {
        self.pending
            .len()
            .saturating_sub(self.tickets_total as usize) as u32
    }

    pub fn primary(&self, id: ShardId) -> NodeId {
        id * NODES_PER_SHARD
    }
}

/// A mongos cursor: the rest of a result, handed out by getMore.
pub struct Cursor {
    pub ns: String,
    pub docs: VecDeque<Document>,
}

#[derive(Default)]
pub struct Mongos {
    pub cache: HashMap<String, Arc<Table>>,
    pub cursors: HashMap<i64, Cursor>,
    pub counters: Counters,
    pub stale_config_errors: u64,
    pub cache_refreshes: u64,
    pub connections: u64,
    pub connections_created: u64,
}

/// The cluster clock (`$clusterTime`, `operationTime`, optimes).
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    last: Timestamp,
}

impl Clock {
    fn unix_now() -> u32 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as u32)
    }

    /// The current time without advancing it.
    pub fn now(&self) -> Timestamp {
        self.last
    }

    /// Advances for a write and returns the new time.
    pub fn tick(&mut self) -> Timestamp {
        let secs = Self::unix_now();
        self.last = if secs > self.last.time {
            Timestamp {
                time: secs,
                increment: 1,
            }
        } else {
            Timestamp {
                time: self.last.time,
                increment: self.last.increment + 1,
            }
        };
        self.last
    }
}

/// A tiny xorshift64* generator: node choice and cursor ids, reproducible from the seed.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x9e37_79b9_7f4a_7c15 | 1)
    }

    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

pub struct State {
    pub config: BTreeMap<String, Arc<Table>>,
    /// Views by namespace (`views.rs`).
    pub views: BTreeMap<String, View>,
    pub shards: Vec<Shard>,
    pub nodes: Vec<Node>,
    pub mongos: Mongos,
    pub clock: Clock,
    pub rng: Rng,
}

pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding the lock leaves consistent-enough simulator state; keep going.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl State {
    pub fn coll(&mut self, shard: ShardId, ns: &str) -> &mut Collection {
        self.shards[shard].data.entry(ns.to_string()).or_default()
    }

    /// The config server's table, if `ns` is sharded.
    pub fn config_table(&self, ns: &str) -> Option<Arc<Table>> {
        self.config.get(ns).cloned()
    }

    /// Documents on `shard` whose chunk the config server gives to another shard.
    pub fn orphans(&self, shard: ShardId, ns: &str) -> usize {
        let (Some(t), Some(coll)) = (self.config.get(ns), self.shards[shard].data.get(ns)) else {
            return 0;
        };
        coll.iter()
            .filter(|(h, _)| t.owner(*h) != Some(shard))
            .count()
    }
}

impl State {
    /// A migration's copy and commit: the chunk's documents go to `to` (the donor keeps
    /// them as orphans), the config server and mongos take the new table, and so do the two
    /// primaries. Returns how many documents were copied.
    pub fn commit_migration(
        &mut self,
        ns: &str,
        old: &Chunk,
        to: ShardId,
        next: Arc<Table>,
    ) -> usize {
        let docs = self.shards[old.shard]
            .data
            .get(ns)
            .map(|c| c.range(old.min, old.max))
            .unwrap_or_default();
        let moved = docs.len();
        let recipient = self.coll(to, ns);
        for d in docs {
            let _ = recipient.insert(d);
        }
        self.config.insert(ns.to_string(), next.clone());
        self.mongos.cache.insert(ns.to_string(), next.clone());
        for shard in [old.shard, to] {
            let primary = self.shards[shard].primary(shard);
            self.nodes[primary]
                .tables
                .insert(ns.to_string(), next.clone());
            self.shards[shard].optime = self.clock.tick();
        }
        moved
    }
}

// ---- construction ------------------------------------------------------------------------

impl State {
    pub fn new(seed: u64, write_tickets: u32, preload: bool) -> State {
        let now = Instant::now();
        let mut clock = Clock {
            last: Timestamp {
                time: Clock::unix_now(),
                increment: 0,
            },
        };
        let optime = clock.tick();
        let shards = SHARDS
            .iter()
            .map(|name| Shard {
                name,
                data: BTreeMap::new(),
                stalled: false,
                tickets_total: write_tickets.max(1),
                pending: VecDeque::new(),
                flushes: HashMap::new(),
                optime,
                term: 1,
            })
            .collect();
        let nodes = (0..SHARDS.len() * NODES_PER_SHARD)
            .map(|i| Node {
                name: format!(
                    "{}{}",
                    (b'a' + (i / NODES_PER_SHARD) as u8) as char,
                    i % NODES_PER_SHARD
                ),
                shard: i / NODES_PER_SHARD,
                primary: i % NODES_PER_SHARD == 0,
                tables: HashMap::new(),
                refresh: BTreeMap::new(),
                counters: Counters::default(),
                process_id: ObjectId::new(),
                started: now,
                restarts: 0,
                addr: None,
                incarnation: CancellationToken::new(),
            })
            .collect();
        let mut state = State {
            config: BTreeMap::new(),
            views: BTreeMap::new(),
            shards,
            nodes,
            mongos: Mongos::default(),
            clock,
            rng: Rng::new(seed),
        };
        state.shard_collection("demo.store_inventory");
        state.shard_collection("pay.transactions");
        if preload {
            state.preload();
        }
        state
    }

    /// Shards `ns` on hashed `_id` in 4 chunks, 2 per shard. Primaries load the table, as
    /// after `shardCollection`; secondaries and mongos start with nothing in memory.
    fn shard_collection(&mut self, ns: &str) {
        let table = Arc::new(Table::split_evenly(ns, 4, SHARDS.len()));
        self.config.insert(ns.to_string(), table.clone());
        self.mongos.cache.insert(ns.to_string(), table.clone());
        for node in self.nodes.iter_mut().filter(|n| n.primary) {
            node.tables.insert(ns.to_string(), table.clone());
        }
    }

    fn preload(&mut self) {
        let inventory = (1..=100).flat_map(|p| {
            (1..=20).map(move |s| doc! { "_id": {"productId": p, "storeId": s}, "qty": 10 })
        });
        self.load("demo.store_inventory", inventory);
        let statuses = ["settled", "settled", "pending"];
        let payments = (1..=300).map(|i: i32| {
            doc! {
                "_id": i,
                "amount": (i * 37) % 500 + 1,
                "status": statuses[i as usize % statuses.len()],
            }
        });
        self.load("pay.transactions", payments);
    }

    /// Puts documents on the shard that owns them, bypassing the write path.
    fn load(&mut self, ns: &str, docs: impl Iterator<Item = Document>) {
        let Some(table) = self.config.get(ns).cloned() else {
            return;
        };
        for d in docs {
            let hash = hash_value(d.get("_id").unwrap_or(&Bson::Null));
            let shard = table.owner(hash).unwrap_or(PRIMARY_SHARD);
            let _ = self.coll(shard, ns).insert(d);
        }
    }

    pub fn node_id(&self, name: &str) -> Option<NodeId> {
        self.nodes.iter().position(|n| n.name == name)
    }

    pub fn shard_id(&self, name: &str) -> Option<ShardId> {
        self.shards.iter().position(|s| s.name == name)
    }
}
