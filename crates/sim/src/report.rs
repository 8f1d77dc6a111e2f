//! The cluster's status, as a typed snapshot (tests, demo) and as the document
//! `simControl: status` returns.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use bson::{doc, Bson, Document};

use super::model::{Node, State};
use super::routing::{Chunk, Table, Version};
use super::SHARDS;

/// A node's routing table for one collection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TableState {
    /// Nothing in memory (never loaded, or lost by a restart).
    Unknown,
    /// Loaded at this collection version.
    Loaded { major: u32, minor: u32 },
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RefreshStatus {
    pub successes: u32,
    pub failures: u32,
    /// The last refresh's result, if there was one.
    pub last_ok: Option<bool>,
    pub last_error: Option<String>,
}

#[derive(Debug, Clone)]
pub struct TableStatus {
    pub ns: String,
    pub state: TableState,
    pub refresh: RefreshStatus,
}

#[derive(Debug, Clone)]
pub struct NodeStatus {
    pub name: String,
    pub shard: String,
    pub primary: bool,
    /// Primary of a shard whose writes are stalled.
    pub stalled: bool,
    pub restarts: u32,
    pub addr: Option<SocketAddr>,
    pub tables: Vec<TableStatus>,
}

impl NodeStatus {
    pub fn table(&self, ns: &str) -> Option<&TableStatus> {
        self.tables.iter().find(|t| t.ns == ns)
    }
}

#[derive(Debug, Clone)]
pub struct ShardStatus {
    pub name: String,
    pub primary: String,
    pub stalled: bool,
    pub tickets_total: u32,
    pub tickets_out: u32,
    pub queued_writers: u32,
    pub pending_writes: usize,
    pub term: i64,
    /// Documents physically held, per collection.
    pub docs: BTreeMap<String, usize>,
    /// Documents held whose chunk the config server gives to the other shard.
    pub orphans: BTreeMap<String, usize>,
}

#[derive(Debug, Clone)]
pub struct ChunkStatus {
    pub min: Bson,
    pub max: Bson,
    pub shard: String,
    pub version: (u32, u32),
}

#[derive(Debug, Clone)]
pub struct CollectionStatus {
    pub ns: String,
    pub epoch: String,
    pub version: (u32, u32),
    pub chunks: Vec<ChunkStatus>,
}

#[derive(Debug, Clone)]
pub struct MongosStatus {
    /// mongos's cached collection version per collection.
    pub cached: BTreeMap<String, (u32, u32)>,
    pub stale_config_errors: u64,
    pub cache_refreshes: u64,
    pub open_cursors: usize,
    pub connections: u64,
}

/// Everything `simControl: status` reports.
#[derive(Debug, Clone)]
pub struct ClusterStatus {
    pub nodes: Vec<NodeStatus>,
    pub shards: Vec<ShardStatus>,
    pub collections: Vec<CollectionStatus>,
    pub mongos: MongosStatus,
}

impl ClusterStatus {
    pub fn node(&self, name: &str) -> Option<&NodeStatus> {
        self.nodes.iter().find(|n| n.name == name)
    }

    pub fn shard(&self, name: &str) -> Option<&ShardStatus> {
        self.shards.iter().find(|s| s.name == name)
    }

    /// The status as the control command returns it.
    pub fn to_document(&self) -> Document {
        let m = &self.mongos;
        let cached: Document = m
            .cached
            .iter()
            .map(|(ns, v)| (ns.clone(), Bson::Document(version(*v))))
            .collect();
        doc! {
            "nodes": self.nodes.iter().map(node_doc).collect::<Vec<_>>(),
            "shards": self.shards.iter().map(shard_doc).collect::<Vec<_>>(),
            "collections": self.collections.iter().map(collection_doc).collect::<Vec<_>>(),
            "mongos": {
                "cachedVersions": cached,
                "staleConfigErrors": m.stale_config_errors as i64,
                "cacheRefreshes": m.cache_refreshes as i64,
                "openCursors": m.open_cursors as i64,
                "connections": m.connections as i64,
            },
        }
    }
}

fn pair(v: Version) -> (u32, u32) {
    (v.major, v.minor)
}

/// Builds the snapshot from the state (under the caller's lock).
pub fn build(st: &State) -> ClusterStatus {
    let sharded: Vec<&String> = st.config.keys().collect();
    let m = &st.mongos;
    ClusterStatus {
        nodes: st
            .nodes
            .iter()
            .map(|n| node_status(st, n, &sharded))
            .collect(),
        shards: (0..st.shards.len())
            .map(|i| shard_status(st, i, &sharded))
            .collect(),
        collections: st.config.values().map(|t| collection_status(t)).collect(),
        mongos: MongosStatus {
            cached: m
                .cache
                .iter()
                .map(|(ns, t)| (ns.clone(), pair(t.version())))
                .collect(),
            stale_config_errors: m.stale_config_errors,
            cache_refreshes: m.cache_refreshes,
            open_cursors: m.cursors.len(),
            connections: m.connections,
        },
    }
}

fn node_status(st: &State, n: &Node, sharded: &[&String]) -> NodeStatus {
    let table = |ns: &str| TableStatus {
        ns: ns.to_string(),
        state: n.tables.get(ns).map_or(TableState::Unknown, |t| {
            let v = t.version();
            TableState::Loaded {
                major: v.major,
                minor: v.minor,
            }
        }),
        refresh: n
            .refresh
            .get(ns)
            .map(|r| RefreshStatus {
                successes: r.successes,
                failures: r.failures,
                last_ok: r.last_ok,
                last_error: r.last_error.clone(),
            })
            .unwrap_or_default(),
    };
    NodeStatus {
        name: n.name.clone(),
        shard: SHARDS[n.shard].to_string(),
        primary: n.primary,
        stalled: n.primary && st.shards[n.shard].stalled,
        restarts: n.restarts,
        addr: n.addr,
        tables: sharded.iter().map(|ns| table(ns)).collect(),
    }
}

fn shard_status(st: &State, i: usize, sharded: &[&String]) -> ShardStatus {
    let s = &st.shards[i];
    ShardStatus {
        name: s.name.to_string(),
        primary: st.nodes[s.primary(i)].name.clone(),
        stalled: s.stalled,
        tickets_total: s.tickets_total,
        tickets_out: s.tickets_out(),
        queued_writers: s.queued_writers(),
        pending_writes: s.pending.len(),
        term: s.term,
        docs: s.data.iter().map(|(ns, c)| (ns.clone(), c.len())).collect(),
        orphans: sharded
            .iter()
            .map(|ns| (ns.to_string(), st.orphans(i, ns)))
            .collect(),
    }
}

fn collection_status(t: &Table) -> CollectionStatus {
    CollectionStatus {
        ns: t.ns.clone(),
        epoch: t.epoch.to_hex(),
        version: pair(t.version()),
        chunks: t
            .chunks
            .iter()
            .map(|c| ChunkStatus {
                min: Chunk::bound(c.min),
                max: Chunk::bound(c.max),
                shard: SHARDS[c.shard].to_string(),
                version: pair(c.version),
            })
            .collect(),
    }
}

fn version(v: (u32, u32)) -> Document {
    doc! { "major": v.0 as i64, "minor": v.1 as i64 }
}

fn node_doc(n: &NodeStatus) -> Bson {
    let tables: Document = n
        .tables
        .iter()
        .map(|t| (t.ns.clone(), Bson::Document(table_doc(t))))
        .collect();
    Bson::Document(doc! {
        "name": &n.name, "shard": &n.shard,
        "role": if n.primary { "primary" } else { "secondary" },
        "stalled": n.stalled, "restarts": i64::from(n.restarts),
        "addr": n.addr.map(|a| a.to_string()),
        "tables": tables,
    })
}

fn table_doc(t: &TableStatus) -> Document {
    let mut d = match &t.state {
        TableState::Unknown => doc! { "state": "UNKNOWN" },
        TableState::Loaded { major, minor } => {
            doc! { "state": "loaded", "version": version((*major, *minor)) }
        }
    };
    d.insert("refreshSuccesses", i64::from(t.refresh.successes));
    d.insert("refreshFailures", i64::from(t.refresh.failures));
    if let Some(ok) = t.refresh.last_ok {
        d.insert("lastRefreshOk", ok);
    }
    if let Some(e) = &t.refresh.last_error {
        d.insert("lastRefreshError", e.as_str());
    }
    d
}

fn counts(m: &BTreeMap<String, usize>) -> Document {
    m.iter()
        .map(|(k, v)| (k.clone(), Bson::Int64(*v as i64)))
        .collect()
}

fn shard_doc(sh: &ShardStatus) -> Bson {
    Bson::Document(doc! {
        "name": &sh.name, "primary": &sh.primary, "stalled": sh.stalled,
        "tickets": {
            "totalTickets": i64::from(sh.tickets_total),
            "out": i64::from(sh.tickets_out),
            "available": i64::from(sh.tickets_total - sh.tickets_out),
        },
        "queuedWriters": i64::from(sh.queued_writers),
        "pendingWrites": sh.pending_writes as i64,
        "term": sh.term,
        "docs": counts(&sh.docs),
        "orphans": counts(&sh.orphans),
    })
}

fn collection_doc(c: &CollectionStatus) -> Bson {
    let chunks: Vec<Bson> = c
        .chunks
        .iter()
        .map(|ch| {
            Bson::Document(doc! {
                "min": { "_id": ch.min.clone() }, "max": { "_id": ch.max.clone() },
                "shard": &ch.shard, "version": version(ch.version),
            })
        })
        .collect();
    Bson::Document(doc! {
        "ns": &c.ns, "epoch": &c.epoch, "version": version(c.version),
        "shardKey": { "_id": "hashed" }, "chunks": chunks,
    })
}
