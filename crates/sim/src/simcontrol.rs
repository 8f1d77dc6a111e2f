//! `{simControl: "<action>", ...}` on mongos's `admin` database, and the BSON shape of
//! [`ClusterStatus`].

use std::time::Duration;

use bson::{doc, Document};

use super::routing::number;
use super::{Cluster, SimError};

const ACTIONS: &str =
    "stallPrimary, resumePrimary, restartNode, moveChunk, status, configure, createView";

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
            let mut d = cluster.status().to_document();
            d.insert("ok", 1.0);
            Ok(d)
        }
        "configure" => configure(cluster, body),
        "createView" => super::views::control(cluster, body),
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
    if let Some(d) = millis(body, "hopLatencyMS")? {
        s.hop_latency = d;
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
            "hopLatencyMS": ms(s.hop_latency),
        },
        "ok": 1.0,
    })
}
