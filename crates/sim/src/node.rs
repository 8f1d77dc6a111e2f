//! Commands a node answers on its own port: ping, buildInfo, serverStatus,
//! replSetGetStatus, and direct (unversioned) reads and writes. A direct read carries no
//! shard version, so the node neither checks nor filters: orphans included, as on a real
//! shard. Writes go to the primary's write path (and hang on a stalled one).

use bson::{doc, Bson, Document};

use super::commands::{namespace, read_concern_available};
use super::model::{lock, NodeId};
use super::read::ReadSpec;
use super::request::Request;
use super::select::{Mode, ReadPref};
use super::{status, writes, Cluster, SimError};

pub async fn run(cluster: &Cluster, node: NodeId, req: &Request) -> Result<Document, SimError> {
    let db = req.db()?.to_string();
    let (primary, shard) = {
        let mut st = lock(&cluster.state);
        let n = &mut st.nodes[node];
        if !matches!(
            req.name(),
            "find" | "count" | "insert" | "update" | "delete"
        ) {
            n.counters.command += 1;
        }
        (n.primary, n.shard)
    };
    match req.name() {
        "ping" | "endSessions" => Ok(doc! { "ok": 1.0 }),
        "buildInfo" | "buildinfo" => Ok(status::build_info()),
        "serverStatus" => Ok(status::node(cluster, node)),
        "replSetGetStatus" => Ok(status::repl_set_get_status(cluster, node)),
        "find" | "count" => {
            if !primary && !secondary_ok(&req.body)? {
                return Err(SimError::new(
                    13435,
                    "NotPrimaryNoSecondaryOk",
                    "not master and slaveOk=false",
                ));
            }
            direct_read(cluster, node, &db, req)
        }
        "insert" | "update" | "delete" if !primary => {
            Err(SimError::new(10107, "NotWritablePrimary", "not master"))
        }
        "insert" | "update" | "delete" => writes::direct(cluster, shard, &db, req).await,
        name => Err(SimError::new(
            59,
            "CommandNotFound",
            format!("no such command: '{name}'"),
        )),
    }
}

/// A secondary serves reads only when the read preference allows secondaries.
fn secondary_ok(body: &Document) -> Result<bool, SimError> {
    Ok(ReadPref::from_body(body)?.mode != Mode::Primary)
}

fn direct_read(
    cluster: &Cluster,
    node: NodeId,
    db: &str,
    req: &Request,
) -> Result<Document, SimError> {
    let body = &req.body;
    let ns = namespace(db, body)?;
    read_concern_available(body)?;
    let key = if req.name() == "find" {
        "filter"
    } else {
        "query"
    };
    let filter = body.get_document(key).cloned().unwrap_or_default();
    super::query::check_filter(&filter)?;
    let spec = ReadSpec {
        ns: ns.clone(),
        filter,
        pref: ReadPref::primary(),
        available: true,
        deadline: None,
        cost: std::time::Duration::ZERO,
    };
    let docs = cluster.serve(node, &spec, None);
    if req.name() == "count" {
        return Ok(doc! { "n": docs.len() as i32, "ok": 1.0 });
    }
    let limit = body
        .get("limit")
        .and_then(super::routing::number)
        .filter(|n| *n > 0.0);
    let batch: Vec<Bson> = docs
        .into_iter()
        .take(limit.map_or(usize::MAX, |n| n as usize))
        .map(Bson::Document)
        .collect();
    Ok(doc! { "cursor": { "firstBatch": batch, "id": 0_i64, "ns": ns }, "ok": 1.0 })
}
