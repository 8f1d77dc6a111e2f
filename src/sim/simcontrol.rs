//! `{simControl: "<action>", ...}` on mongos's `admin` database, and the BSON shape of
//! [`ClusterStatus`].

use std::time::Duration;

use bson::{doc, Bson, Document};

use super::control::{ClusterStatus, TableState};
use super::routing::number;
use super::{Cluster, SimError};

const ACTIONS: &str = "stallPrimary, resumePrimary, restartNode, moveChunk, status, configure";

/// Runs one control action.
pub fn run(cluster: &Cluster, body: &Document) -> Result<Document, SimError> {
    let action = body
        .get_str("simControl")
        .map_err(|_| SimError::bad_value(format!("simControl takes an action name: {ACTIONS}")))?;
    let text = |key: &str| {
        body.get_str(key)
            .map_err(|_| SimError::bad_value(format!("simControl {action} needs a string '{key}'")))
    };
    match action {
        "stallPrimary" => {
            let shard = text("shard")?;
            cluster.stall_primary(shard)?;
            Ok(doc! { "shard": shard, "stalled": true, "ok": 1.0 })
        }
        "resumePrimary" => {
            let shard = text("shard")?;
            let n = cluster.resume_primary(shard)?;
            Ok(doc! { "shard": shard, "stalled": false, "completedWrites": n as i64, "ok": 1.0 })
        }
        "restartNode" => {
            let node = text("node")?;
            let lost = cluster.restart_node(node)?;
            Ok(doc! { "node": node, "lostTables": lost, "ok": 1.0 })
        }
        "moveChunk" => move_chunk(cluster, body),
        "status" => {
            let mut d = status_document(&cluster.status());
            d.insert("ok", 1.0);
            Ok(d)
        }
        "configure" => configure(cluster, body),
        other => Err(SimError::bad_value(format!(
            "unknown simControl action '{other}' (known: {ACTIONS})"
        ))),
    }
}

fn millis(body: &Document, key: &str) -> Result<Option<Duration>, SimError> {
    match body.get(key) {
        None => Ok(None),
        Some(v) => match number(v) {
            Some(ms) if ms >= 0.0 => Ok(Some(Duration::from_millis(ms as u64))),
            _ => Err(SimError::bad_value(format!(
                "{key} must be a non-negative number of milliseconds"
            ))),
        },
    }
}

fn move_chunk(cluster: &Cluster, body: &Document) -> Result<Document, SimError> {
    let ns = body
        .get_str("ns")
        .map_err(|_| SimError::bad_value("moveChunk needs ns"))?;
    let to = body
        .get_str("to")
        .map_err(|_| SimError::bad_value("moveChunk needs to"))?;
    let id = body
        .get_document("find")
        .ok()
        .and_then(|f| f.get("_id"))
        .ok_or_else(|| SimError::bad_value("moveChunk needs find: {_id: <value>}"))?;
    let r = cluster.move_chunk(ns, id, to, millis(body, "deleteAfter")?)?;
    Ok(doc! {
        "ns": r.ns, "from": r.from, "to": r.to, "min": r.min, "max": r.max,
        "version": { "major": r.version.0 as i64, "minor": r.version.1 as i64 },
        "movedDocs": r.moved_docs as i64,
        "deleteAfterMS": r.delete_after.as_millis() as i64,
        "ok": 1.0,
    })
}

fn configure(cluster: &Cluster, body: &Document) -> Result<Document, SimError> {
    let mut s = cluster.settings();
    if let Some(d) = millis(body, "refreshTimeoutMS")? {
        s.refresh_timeout = d;
    }
    if let Some(d) = millis(body, "flushLatencyMS")? {
        s.flush_latency = d;
    }
    if let Some(d) = millis(body, "findHostTimeoutMS")? {
        s.find_host_timeout = d;
    }
    if let Some(d) = millis(body, "defaultDeleteAfterMS")? {
        s.default_delete_after = d;
    }
    if let Some(v) = body.get("staleRetries") {
        s.stale_retries = number(v)
            .filter(|n| *n >= 0.0)
            .map(|n| n as u32)
            .ok_or_else(|| SimError::bad_value("staleRetries must be a non-negative number"))?;
    }
    cluster.configure(s.clone());
    let ms = |d: Duration| d.as_millis() as i64;
    Ok(doc! {
        "settings": {
            "refreshTimeoutMS": ms(s.refresh_timeout),
            "staleRetries": i64::from(s.stale_retries),
            "flushLatencyMS": ms(s.flush_latency),
            "findHostTimeoutMS": ms(s.find_host_timeout),
            "defaultDeleteAfterMS": ms(s.default_delete_after),
        },
        "ok": 1.0,
    })
}

fn version(v: (u32, u32)) -> Document {
    doc! { "major": v.0 as i64, "minor": v.1 as i64 }
}

/// The status as the control command returns it.
pub fn status_document(s: &ClusterStatus) -> Document {
    let nodes: Vec<Bson> = s
        .nodes
        .iter()
        .map(|n| {
            let tables: Document = n
                .tables
                .iter()
                .map(|t| {
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
                    (t.ns.clone(), Bson::Document(d))
                })
                .collect();
            Bson::Document(doc! {
                "name": &n.name, "shard": &n.shard,
                "role": if n.primary { "primary" } else { "secondary" },
                "stalled": n.stalled, "restarts": i64::from(n.restarts),
                "addr": n.addr.map(|a| a.to_string()),
                "tables": tables,
            })
        })
        .collect();
    let shards: Vec<Bson> = s
        .shards
        .iter()
        .map(|sh| {
            let counts = |m: &std::collections::BTreeMap<String, usize>| -> Document {
                m.iter()
                    .map(|(k, v)| (k.clone(), Bson::Int64(*v as i64)))
                    .collect()
            };
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
        })
        .collect();
    let collections: Vec<Bson> = s
        .collections
        .iter()
        .map(|c| {
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
        })
        .collect();
    let m = &s.mongos;
    let cached: Document = m
        .cached
        .iter()
        .map(|(ns, v)| (ns.clone(), Bson::Document(version(*v))))
        .collect();
    doc! {
        "nodes": nodes, "shards": shards, "collections": collections,
        "mongos": {
            "cachedVersions": cached,
            "staleConfigErrors": m.stale_config_errors as i64,
            "cacheRefreshes": m.cache_refreshes as i64,
            "openCursors": m.open_cursors as i64,
            "connections": m.connections as i64,
        },
    }
}
