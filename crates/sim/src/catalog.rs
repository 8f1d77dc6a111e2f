//! Commands about the cluster rather than its documents: `explain` (which shards mongos
//! would target) and the catalogue (`listDatabases`, `listCollections`).

use bson::{doc, Bson, Document};

use super::commands::{doc_arg, namespace};
use super::model::lock;
use super::pipeline;
use super::query::{check_filter, matches};
use super::routing::Target;
use super::{status, views, Cluster, SimError};

/// `explain` of find, count, distinct, aggregate, update or delete: the shards mongos
/// would target (from its cached routing table), in 4.4's queryPlanner shape.
pub fn explain(cluster: &Cluster, db: &str, body: &Document) -> Result<Document, SimError> {
    let inner = body
        .get_document("explain")
        .map_err(|_| SimError::failed_to_parse("explain needs a command document"))?;
    let ns = namespace(db, inner)?;
    let filter = match inner.keys().next().map(String::as_str) {
        Some("find") => doc_arg(inner, "filter")?,
        Some("count" | "distinct") => doc_arg(inner, "query")?,
        Some("aggregate") => pipeline::leading_match(&pipeline::parse(
            inner
                .get_array("pipeline")
                .map_err(|_| SimError::failed_to_parse("pipeline must be an array"))?,
        )?),
        Some("update") => first_stmt_filter(inner, "updates"),
        Some("delete") => first_stmt_filter(inner, "deletes"),
        other => {
            return Err(SimError::illegal(format!(
                "explain of {other:?} is not simulated"
            )))
        }
    };
    check_filter(&filter)?;
    explain_targets(cluster, &ns, &filter)
}

fn first_stmt_filter(cmd: &Document, key: &str) -> Document {
    match cmd.get_array(key).ok().and_then(|a| a.first()) {
        Some(Bson::Document(s)) => s.get_document("q").cloned().unwrap_or_default(),
        _ => Document::new(),
    }
}

pub fn explain_targets(
    cluster: &Cluster,
    ns: &str,
    filter: &Document,
) -> Result<Document, SimError> {
    let (table, shards) = cluster.target(ns, filter);
    let by_id = matches!(Target::of_filter(filter), Target::Keys(_));
    let leaf = if by_id { "IDHACK" } else { "COLLSCAN" };
    let plans: Vec<Bson> = shards
        .iter()
        .map(|&s| {
            let plan = match table {
                Some(_) => doc! { "stage": "SHARDING_FILTER", "inputStage": { "stage": leaf } },
                None => doc! { "stage": leaf },
            };
            Bson::Document(doc! {
                "shardName": super::SHARDS[s],
                "connectionString": status::connection_string(cluster, s),
                "namespace": ns,
                "indexFilterSet": false,
                "parsedQuery": filter.clone(),
                "winningPlan": plan,
                "rejectedPlans": [],
            })
        })
        .collect();
    let stage = if shards.len() == 1 {
        "SINGLE_SHARD"
    } else {
        "SHARD_MERGE"
    };
    Ok(doc! {
        "queryPlanner": {
            "mongosPlannerVersion": 1,
            "winningPlan": { "stage": stage, "shards": plans },
        },
        "serverInfo": status::server_info(),
        "ok": 1.0,
    })
}

pub fn list_databases(cluster: &Cluster) -> Document {
    let names = collection_names(cluster);
    let mut dbs: Vec<String> = names
        .iter()
        .filter_map(|ns| ns.split('.').next().map(str::to_string))
        .collect();
    dbs.dedup();
    let list: Vec<Bson> = dbs
        .into_iter()
        .map(|name| Bson::Document(doc! { "name": name, "sizeOnDisk": 8192_i64, "empty": false }))
        .collect();
    doc! { "databases": list, "totalSize": 0_i64, "ok": 1.0 }
}

/// `listCollections` of `db`: its collections and views, the entries its `filter` matches
/// (`{name: ...}` as drivers and staleguard's confirming task send it), by name.
pub fn list_collections(
    cluster: &Cluster,
    db: &str,
    body: &Document,
) -> Result<Document, SimError> {
    let filter = doc_arg(body, "filter")?;
    check_filter(&filter)?;
    let prefix = format!("{db}.");
    let mut entries: Vec<(String, Document)> = collection_names(cluster)
        .into_iter()
        .filter_map(|ns| ns.strip_prefix(&prefix).map(str::to_string))
        .map(|name| {
            let d = doc! { "name": &name, "type": "collection", "options": {}, "info": { "readOnly": false } };
            (name, d)
        })
        .collect();
    entries.extend(views::catalog_entries(cluster, db));
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    let batch: Vec<Bson> = entries
        .into_iter()
        .filter(|(_, d)| matches(d, &filter))
        .map(|(_, d)| Bson::Document(d))
        .collect();
    Ok(
        doc! { "cursor": { "firstBatch": batch, "id": 0_i64, "ns": format!("{db}.$cmd.listCollections") }, "ok": 1.0 },
    )
}

/// Every namespace known to the config server or holding documents, sorted.
fn collection_names(cluster: &Cluster) -> Vec<String> {
    let st = lock(&cluster.state);
    let mut names: Vec<String> = st.config.keys().cloned().collect();
    for s in &st.shards {
        names.extend(
            s.data
                .iter()
                .filter(|(_, c)| !c.is_empty())
                .map(|(ns, _)| ns.clone()),
        );
    }
    names.sort();
    names.dedup();
    names
}
