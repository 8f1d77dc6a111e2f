//! Cluster state: the config server's routing tables, the shards (documents, oplog time,
//! write tickets, the stall), the nodes (their own routing tables, counters), mongos's cache
//! and cursors, the cluster clock; and the write path, which is where a stall bites.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bson::oid::ObjectId;
use bson::{doc, Bson, Document, Timestamp};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::query::{check_filter, matches};
use super::routing::{hash_value, ShardId, Table};
use super::store::{Collection, DuplicateKey};
use super::update::{apply as apply_update, check_update, upsert_document};

/// Index of a node in the cluster (`a0 a1 a2 b0 b1 b2` = 0..6).
pub type NodeId = usize;

/// Shard names, in id order.
pub const SHARDS: [&str; 2] = ["shardA", "shardB"];
/// Nodes per shard; the first of each shard is its primary.
pub const NODES_PER_SHARD: usize = 3;
/// The shard that holds unsharded collections (every database's primary shard).
pub const PRIMARY_SHARD: ShardId = 0;
/// What a write costs on a healthy primary, for `opLatencies` (the model has no disk).
const HEALTHY_WRITE_MICROS: u64 = 150;

/// Settings that `simControl: configure` may change while running.
#[derive(Debug, Clone)]
pub struct Settings {
    pub refresh_timeout: Duration,
    pub stale_retries: u32,
    pub flush_latency: Duration,
    pub find_host_timeout: Duration,
    pub default_delete_after: Duration,
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

// ---- writes --------------------------------------------------------------------------

#[derive(Debug, Clone)]
pub struct UpdateStmt {
    pub q: Document,
    pub u: Document,
    pub upsert: bool,
    pub multi: bool,
}

#[derive(Debug, Clone)]
pub struct DeleteStmt {
    pub q: Document,
    /// 0 = every match, 1 = the first.
    pub limit: usize,
}

/// One shard's part of a write, or an internal write.
#[derive(Debug, Clone)]
pub enum WriteOp {
    Insert {
        ns: String,
        docs: Vec<(usize, Document)>,
        ordered: bool,
    },
    Update {
        ns: String,
        stmts: Vec<(usize, UpdateStmt)>,
        ordered: bool,
    },
    Delete {
        ns: String,
        stmts: Vec<(usize, DeleteStmt)>,
        ordered: bool,
    },
    /// `_flushRoutingTableCacheUpdates`: the primary persists its table to `config.cache.*`.
    Flush { ns: String },
    /// The range deleter removing a migrated chunk's orphans from the donor.
    RangeDelete { ns: String, min: i128, max: i128 },
}

impl WriteOp {
    fn is_client(&self) -> bool {
        !matches!(self, WriteOp::Flush { .. } | WriteOp::RangeDelete { .. })
    }
}

#[derive(Debug, Clone, Default)]
pub struct Outcome {
    pub n: i64,
    pub modified: i64,
    pub upserted: Vec<(usize, Bson)>,
    pub errors: Vec<StmtError>,
}

#[derive(Debug, Clone)]
pub struct StmtError {
    pub index: usize,
    pub code: i32,
    pub message: String,
}

impl State {
    /// Applies a write on `shard`'s primary now, counting it with `micros` of latency.
    pub fn apply(&mut self, shard: ShardId, op: &WriteOp, micros: u64) -> Outcome {
        let out = match op {
            WriteOp::Insert { ns, docs, ordered } => self.insert(shard, ns, docs, *ordered),
            WriteOp::Update { ns, stmts, ordered } => self.update(shard, ns, stmts, *ordered),
            WriteOp::Delete { ns, stmts, ordered } => self.delete(shard, ns, stmts, *ordered),
            WriteOp::Flush { .. } => Outcome::default(),
            WriteOp::RangeDelete { ns, min, max } => self.range_delete(shard, ns, *min, *max),
        };
        let optime = self.clock.tick();
        self.shards[shard].optime = optime;
        let primary = self.shards[shard].primary(shard);
        let c = &mut self.nodes[primary].counters;
        match op {
            WriteOp::Insert { .. } => c.insert += out.n as u64,
            WriteOp::Update { stmts, .. } => c.update += stmts.len() as u64,
            WriteOp::Delete { stmts, .. } => c.delete += stmts.len() as u64,
            _ => {}
        }
        if op.is_client() {
            c.write_ops += 1;
            c.write_micros += micros;
        }
        out
    }

    fn coll(&mut self, shard: ShardId, ns: &str) -> &mut Collection {
        self.shards[shard].data.entry(ns.to_string()).or_default()
    }

    fn insert(
        &mut self,
        shard: ShardId,
        ns: &str,
        docs: &[(usize, Document)],
        ordered: bool,
    ) -> Outcome {
        let mut out = Outcome::default();
        let coll = self.coll(shard, ns);
        for (index, doc) in docs {
            match coll.insert(doc.clone()) {
                Ok(()) => out.n += 1,
                Err(DuplicateKey(id)) => {
                    out.errors.push(StmtError {
                        index: *index,
                        code: 11000,
                        message: format!(
                            "E11000 duplicate key error collection: {ns} index: _id_ dup key: {{ _id: {id} }}"
                        ),
                    });
                    if ordered {
                        break;
                    }
                }
            }
        }
        out
    }

    fn update(
        &mut self,
        shard: ShardId,
        ns: &str,
        stmts: &[(usize, UpdateStmt)],
        ordered: bool,
    ) -> Outcome {
        let mut out = Outcome::default();
        for (index, s) in stmts {
            if let Err(e) = self.update_one_stmt(shard, ns, *index, s, &mut out) {
                out.errors.push(StmtError {
                    index: *index,
                    code: e.code,
                    message: e.message,
                });
                if ordered {
                    break;
                }
            }
        }
        out
    }

    fn update_one_stmt(
        &mut self,
        shard: ShardId,
        ns: &str,
        index: usize,
        s: &UpdateStmt,
        out: &mut Outcome,
    ) -> Result<(), super::SimError> {
        check_filter(&s.q)?;
        check_update(&s.u)?;
        let coll = self.coll(shard, ns);
        let (mut hit, mut changed, mut failed) = (0, 0, None);
        coll.for_each_mut(|_, d| {
            if !matches(d, &s.q) {
                return true;
            }
            let before = d.clone();
            if let Err(e) = apply_update(d, &s.u, false) {
                failed = Some(e);
                return false;
            }
            hit += 1;
            changed += i64::from(*d != before);
            s.multi
        });
        if let Some(e) = failed {
            return Err(e);
        }
        if hit == 0 && s.upsert {
            let doc = upsert_document(&s.q, &s.u)?;
            let id = doc.get("_id").cloned().unwrap_or(Bson::Null);
            coll.insert(doc).map_err(|DuplicateKey(id)| {
                super::SimError::new(11000, "DuplicateKey", format!("E11000 duplicate key error collection: {ns} index: _id_ dup key: {{ _id: {id} }}"))
            })?;
            out.upserted.push((index, id));
            out.n += 1;
        }
        out.n += hit;
        out.modified += changed;
        Ok(())
    }

    fn delete(
        &mut self,
        shard: ShardId,
        ns: &str,
        stmts: &[(usize, DeleteStmt)],
        ordered: bool,
    ) -> Outcome {
        let mut out = Outcome::default();
        let coll = self.coll(shard, ns);
        for (index, s) in stmts {
            if let Err(e) = check_filter(&s.q) {
                out.errors.push(StmtError {
                    index: *index,
                    code: e.code,
                    message: e.message,
                });
                if ordered {
                    break;
                }
                continue;
            }
            out.n += coll.remove_where(s.limit, |d| matches(d, &s.q)) as i64;
        }
        out
    }

    /// Deletes `[min, max)` unless the shard owns that range again (migrated back).
    fn range_delete(&mut self, shard: ShardId, ns: &str, min: i128, max: i128) -> Outcome {
        let owns_again = self.config.get(ns).is_some_and(|t| {
            t.chunks
                .iter()
                .any(|c| c.shard == shard && c.min < max && min < c.max)
        });
        if owns_again {
            return Outcome::default();
        }
        let n = self.coll(shard, ns).remove_range(min, max) as i64;
        Outcome {
            n,
            ..Outcome::default()
        }
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

/// What submitting a write gave: done at once, or waiting on a stalled primary.
pub enum Submitted {
    Done(Outcome),
    Waiting(watch::Receiver<Option<Outcome>>),
}

impl Submitted {
    /// The outcome, once there is one; `None` if the cluster shut down first.
    pub async fn outcome(self) -> Option<Outcome> {
        match self {
            Submitted::Done(o) => Some(o),
            Submitted::Waiting(mut rx) => {
                let done = rx.wait_for(Option::is_some).await.ok()?;
                done.clone()
            }
        }
    }
}

/// Submits a write to `shard`'s primary: applied now if it is healthy; otherwise it takes a
/// ticket (or queues for one) and waits for `resumePrimary`. `maxTimeMS` cannot cut it
/// short: an operation stuck in the storage engine does not check for interrupts.
pub fn submit(state: &mut State, shard: ShardId, op: WriteOp) -> Submitted {
    if !state.shards[shard].stalled {
        return Submitted::Done(state.apply(shard, &op, HEALTHY_WRITE_MICROS));
    }
    let s = &mut state.shards[shard];
    if let WriteOp::Flush { ns } = &op {
        if let Some(rx) = s.flushes.get(ns) {
            return Submitted::Waiting(rx.clone());
        }
    }
    let (done, rx) = watch::channel(None);
    if let WriteOp::Flush { ns } = &op {
        s.flushes.insert(ns.clone(), rx.clone());
    }
    s.pending.push_back(Pending {
        op,
        done,
        since: Instant::now(),
    });
    Submitted::Waiting(rx)
}

/// Ends a stall: every waiting write completes, in arrival order. Returns how many.
pub fn resume(state: &mut State, shard: ShardId) -> usize {
    state.shards[shard].stalled = false;
    state.shards[shard].flushes.clear();
    let pending = std::mem::take(&mut state.shards[shard].pending);
    let n = pending.len();
    for p in pending {
        let micros = p.since.elapsed().as_micros() as u64;
        let out = state.apply(shard, &p.op, micros);
        p.done.send_replace(Some(out));
    }
    n
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
