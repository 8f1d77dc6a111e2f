//! mongos's write commands: insert, update, delete. Each is split into one batch per
//! target shard; the batches go to the shards' primaries at once, and mongos answers when
//! every batch is done, which on a stalled primary means after `resumePrimary`.
//!
//! Writes are targeted with the config server's current table: on a real cluster a stale
//! mongos would get StaleConfig from the primary, refresh (primaries refresh from the config
//! server even when stalled) and retry; the outcome is the same, so the model shortcuts it.
//! Like 4.2, a broadcast multi-update or multi-delete also touches orphans.

use std::collections::BTreeMap;

use bson::oid::ObjectId;
use bson::{doc, Bson, Document};
use futures::future::join_all;

use super::commands::namespace;
use super::engine::{submit, DeleteStmt, Outcome, StmtError, UpdateStmt, WriteOp};
use super::model::{lock, PRIMARY_SHARD};
use super::request::Request;
use super::routing::{hash_value, ShardId, Table, Target};
use super::{Cluster, SimError};

/// Per shard: the statements (with their index in the command) it must run.
type Batches<T> = BTreeMap<ShardId, Vec<(usize, T)>>;

pub async fn insert(cluster: &Cluster, db: &str, req: &Request) -> Result<Document, SimError> {
    let ns = namespace(db, &req.body)?;
    let ordered = req.body.get_bool("ordered").unwrap_or(true);
    let mut batches: Batches<Document> = BTreeMap::new();
    let table = routing_for_write(cluster, &ns);
    for (i, d) in req
        .documents("documents")?
        .into_iter()
        .map(with_id)
        .enumerate()
    {
        let shard = owner_of(table.as_deref(), d.get("_id"));
        batches.entry(shard).or_default().push((i, d));
    }
    let total: usize = batches.values().map(Vec::len).sum();
    lock(&cluster.state).mongos.counters.insert += total as u64;
    let outcome = run_batches(cluster, batches, |docs| WriteOp::Insert {
        ns: ns.clone(),
        docs,
        ordered,
    })
    .await?;
    Ok(reply(outcome, Vec::new(), false))
}

pub async fn update(cluster: &Cluster, db: &str, req: &Request) -> Result<Document, SimError> {
    let ns = namespace(db, &req.body)?;
    let ordered = req.body.get_bool("ordered").unwrap_or(true);
    let table = routing_for_write(cluster, &ns);
    let mut batches: Batches<UpdateStmt> = BTreeMap::new();
    let mut refused = Vec::new();
    let stmts = req.documents("updates")?;
    lock(&cluster.state).mongos.counters.update += stmts.len() as u64;
    for (i, s) in stmts.iter().enumerate() {
        let stmt = parse_update(s)?;
        match targets(table.as_deref(), &stmt.q, stmt.multi && !stmt.upsert) {
            Some(shards) => shards
                .into_iter()
                .for_each(|sh| batches.entry(sh).or_default().push((i, stmt.clone()))),
            None => refused.push(no_shard_key(i, "update", &stmt.q)),
        }
    }
    let outcome = run_batches(cluster, batches, |stmts| WriteOp::Update {
        ns: ns.clone(),
        stmts,
        ordered,
    })
    .await?;
    Ok(reply(outcome, refused, true))
}

pub async fn delete(cluster: &Cluster, db: &str, req: &Request) -> Result<Document, SimError> {
    let ns = namespace(db, &req.body)?;
    let ordered = req.body.get_bool("ordered").unwrap_or(true);
    let table = routing_for_write(cluster, &ns);
    let mut batches: Batches<DeleteStmt> = BTreeMap::new();
    let mut refused = Vec::new();
    let stmts = req.documents("deletes")?;
    lock(&cluster.state).mongos.counters.delete += stmts.len() as u64;
    for (i, s) in stmts.iter().enumerate() {
        let stmt = parse_delete(s)?;
        match targets(table.as_deref(), &stmt.q, stmt.limit == 0) {
            Some(shards) => shards
                .into_iter()
                .for_each(|sh| batches.entry(sh).or_default().push((i, stmt.clone()))),
            None => refused.push(no_shard_key(i, "delete", &stmt.q)),
        }
    }
    let outcome = run_batches(cluster, batches, |stmts| WriteOp::Delete {
        ns: ns.clone(),
        stmts,
        ordered,
    })
    .await?;
    Ok(reply(outcome, refused, false))
}

/// The config server's table for a write; the targeted primaries and mongos install it too
/// (what the StaleConfig round trip would have done).
fn routing_for_write(cluster: &Cluster, ns: &str) -> Option<std::sync::Arc<Table>> {
    let mut st = lock(&cluster.state);
    let table = st.config_table(ns)?;
    st.mongos.cache.insert(ns.to_string(), table.clone());
    for n in st.nodes.iter_mut().filter(|n| n.primary) {
        n.tables.insert(ns.to_string(), table.clone());
    }
    Some(table)
}

fn owner_of(table: Option<&Table>, id: Option<&Bson>) -> ShardId {
    match (table, id) {
        (Some(t), Some(id)) => t.owner(hash_value(id)).unwrap_or(PRIMARY_SHARD),
        _ => PRIMARY_SHARD,
    }
}

/// The shards a statement goes to; `None` when a single-document statement on a sharded
/// collection lacks an exact `_id` (4.2 refuses those).
fn targets(table: Option<&Table>, q: &Document, broadcast_ok: bool) -> Option<Vec<ShardId>> {
    let Some(t) = table else {
        return Some(vec![PRIMARY_SHARD]);
    };
    match Target::of_filter(q) {
        Target::Keys(keys) if keys.len() == 1 => Some(Target::Keys(keys).shards(t)),
        _ if broadcast_ok => Some(t.shards()),
        _ => None,
    }
}

fn no_shard_key(index: usize, what: &str, q: &Document) -> StmtError {
    StmtError {
        index,
        code: 61,
        message: format!(
            "A single {what} on a sharded collection must contain an exact match on _id (and have the collection default collation) or contain the shard key (and have the simple collation). {what} query: {q}, shard key pattern: {{ _id: \"hashed\" }}"
        ),
    }
}

/// The document with an `_id` first (a fresh ObjectId if it had none), as drivers send it.
fn with_id(d: Document) -> Document {
    if d.contains_key("_id") {
        return d;
    }
    let mut out = doc! { "_id": ObjectId::new() };
    out.extend(d);
    out
}

fn parse_delete(s: &Document) -> Result<DeleteStmt, SimError> {
    let q = s
        .get_document("q")
        .cloned()
        .map_err(|_| SimError::failed_to_parse("delete statements need q"))?;
    let limit = match s.get("limit").and_then(super::routing::number) {
        Some(0.0) => 0,
        Some(1.0) => 1,
        _ => return Err(SimError::failed_to_parse("delete limit must be 0 or 1")),
    };
    Ok(DeleteStmt { q, limit })
}

fn shutting_down() -> SimError {
    SimError::new(
        91,
        "ShutdownInProgress",
        "the simulated cluster is shutting down",
    )
}

fn parse_update(s: &Document) -> Result<UpdateStmt, SimError> {
    let q = s
        .get_document("q")
        .cloned()
        .map_err(|_| SimError::failed_to_parse("update statements need q"))?;
    let u = match s.get("u") {
        Some(Bson::Document(u)) => u.clone(),
        Some(Bson::Array(_)) => {
            return Err(SimError::illegal(
                "pipeline-style updates are not simulated",
            ))
        }
        _ => return Err(SimError::failed_to_parse("update statements need u")),
    };
    Ok(UpdateStmt {
        q,
        u,
        upsert: s.get_bool("upsert").unwrap_or(false),
        multi: s.get_bool("multi").unwrap_or(false),
    })
}

/// Sends every shard its batch at once and merges the outcomes.
async fn run_batches<T>(
    cluster: &Cluster,
    batches: Batches<T>,
    op: impl Fn(Vec<(usize, T)>) -> WriteOp,
) -> Result<Outcome, SimError> {
    let submitted: Vec<_> = {
        let mut st = lock(&cluster.state);
        batches
            .into_iter()
            .map(|(shard, b)| submit(&mut st, shard, op(b)))
            .collect()
    };
    let mut total = Outcome::default();
    for o in join_all(submitted.into_iter().map(|s| s.outcome())).await {
        let o = o.ok_or_else(shutting_down)?;
        total.n += o.n;
        total.modified += o.modified;
        total.upserted.extend(o.upserted);
        total.errors.extend(o.errors);
    }
    Ok(total)
}

fn reply(mut o: Outcome, refused: Vec<StmtError>, is_update: bool) -> Document {
    let mut d = doc! { "n": o.n as i32 };
    if is_update {
        d.insert("nModified", o.modified as i32);
        if !o.upserted.is_empty() {
            o.upserted.sort_by_key(|(i, _)| *i);
            let up: Vec<Bson> = o
                .upserted
                .into_iter()
                .map(|(i, id)| Bson::Document(doc! { "index": i as i32, "_id": id }))
                .collect();
            d.insert("upserted", up);
        }
    }
    o.errors.extend(refused);
    if !o.errors.is_empty() {
        o.errors.sort_by_key(|e| e.index);
        let errs: Vec<Bson> = o
            .errors
            .into_iter()
            .map(|e| {
                Bson::Document(
                    doc! { "index": e.index as i32, "code": e.code, "errmsg": e.message },
                )
            })
            .collect();
        d.insert("writeErrors", errs);
    }
    d.insert("ok", 1.0);
    d
}

/// A write sent straight to a shard primary's port: no routing, every statement runs there.
pub async fn direct(
    cluster: &Cluster,
    shard: ShardId,
    db: &str,
    req: &Request,
) -> Result<Document, SimError> {
    let ns = namespace(db, &req.body)?;
    let ordered = req.body.get_bool("ordered").unwrap_or(true);
    let op = match req.name() {
        "insert" => WriteOp::Insert {
            ns,
            docs: req
                .documents("documents")?
                .into_iter()
                .map(with_id)
                .enumerate()
                .collect(),
            ordered,
        },
        "update" => WriteOp::Update {
            ns,
            stmts: req
                .documents("updates")?
                .iter()
                .map(parse_update)
                .collect::<Result<Vec<_>, _>>()?
                .into_iter()
                .enumerate()
                .collect(),
            ordered,
        },
        _ => WriteOp::Delete {
            ns,
            stmts: req
                .documents("deletes")?
                .iter()
                .map(parse_delete)
                .collect::<Result<Vec<_>, _>>()?
                .into_iter()
                .enumerate()
                .collect(),
            ordered,
        },
    };
    let is_update = matches!(op, WriteOp::Update { .. });
    let submitted = submit(&mut lock(&cluster.state), shard, op);
    let outcome = submitted.outcome().await.ok_or_else(shutting_down)?;
    Ok(reply(outcome, Vec::new(), is_update))
}
