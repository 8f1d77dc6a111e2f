//! mongos's commands: dispatch, read options, the read commands (find, getMore,
//! killCursors, aggregate, count, distinct), explain, and a few catalogue commands.

use std::collections::VecDeque;
use std::time::Duration;

use bson::{doc, Bson, Document};
use tokio::time::Instant;

use super::model::{lock, Cursor};
use super::pipeline;
use super::query::{check_filter, get_path, project, sort, values_equal};
use super::read::{ReadPref, ReadSpec};
use super::request::Request;
use super::routing::{number, Target};
use super::{simcontrol, status, writes, Cluster, SimError};

/// Documents in a first batch when the client does not say (as the server).
const DEFAULT_BATCH: usize = 101;

/// Runs one mongos command (hello is answered by `front`).
pub async fn run(cluster: &Cluster, req: &Request) -> Result<Document, SimError> {
    let db = req.db()?.to_string();
    let body = &req.body;
    count_command(cluster, req.name());
    if body.contains_key("startTransaction") || body.contains_key("autocommit") {
        return Err(SimError::illegal("transactions are not simulated"));
    }
    match req.name() {
        "ping" | "endSessions" | "killAllSessions" | "refreshSessions" => Ok(doc! { "ok": 1.0 }),
        "buildInfo" | "buildinfo" => Ok(status::build_info()),
        "serverStatus" => Ok(status::mongos(cluster)),
        "simControl" if db == "admin" => simcontrol::run(cluster, body),
        "simControl" => Err(SimError::new(
            13,
            "Unauthorized",
            "simControl may only be run against the admin database",
        )),
        "find" => find(cluster, &db, body).await,
        "getMore" => get_more(cluster, &db, body),
        "killCursors" => kill_cursors(cluster, body),
        "aggregate" => aggregate(cluster, &db, body).await,
        "count" => count(cluster, &db, body).await,
        "distinct" => distinct(cluster, &db, body).await,
        "insert" => writes::insert(cluster, &db, req).await,
        "update" => writes::update(cluster, &db, req).await,
        "delete" => writes::delete(cluster, &db, req).await,
        "explain" => explain(cluster, &db, body),
        "listDatabases" => Ok(list_databases(cluster)),
        "listCollections" => Ok(list_collections(cluster, &db)),
        name => Err(SimError::new(
            59,
            "CommandNotFound",
            format!("no such command: '{name}'"),
        )),
    }
}

fn count_command(cluster: &Cluster, name: &str) {
    let mut st = lock(&cluster.state);
    let c = &mut st.mongos.counters;
    match name {
        "find" | "count" | "distinct" | "aggregate" => c.query += 1,
        "getMore" => c.getmore += 1,
        "insert" | "update" | "delete" => {}
        _ => c.command += 1,
    }
}

/// The collection a command names (its first value) as `db.coll`.
pub fn namespace(db: &str, body: &Document) -> Result<String, SimError> {
    match body.iter().next() {
        Some((_, Bson::String(coll))) if !coll.is_empty() => Ok(format!("{db}.{coll}")),
        Some((name, _)) => Err(SimError::invalid_namespace(format!(
            "collection name for {name} must be a non-empty string"
        ))),
        None => Err(SimError::failed_to_parse("empty command")),
    }
}

/// Read preference, read concern and deadline of a read command.
pub fn read_spec(ns: String, filter: Document, body: &Document) -> Result<ReadSpec, SimError> {
    check_filter(&filter)?;
    Ok(ReadSpec {
        ns,
        filter,
        pref: ReadPref::from_body(body)?,
        available: read_concern_available(body)?,
        deadline: deadline(body)?,
    })
}

/// Whether `readConcern.level` is `available`; refuses what the server refuses.
pub fn read_concern_available(body: &Document) -> Result<bool, SimError> {
    let Ok(rc) = body.get_document("readConcern") else {
        return Ok(false);
    };
    for key in rc.keys() {
        if !matches!(
            key.as_str(),
            "level" | "afterClusterTime" | "atClusterTime" | "provenance"
        ) {
            return Err(SimError::invalid_options(format!(
                "Unrecognized option in readConcern: {key}"
            )));
        }
    }
    let level = rc.get_str("level").unwrap_or("local");
    let after = rc.contains_key("afterClusterTime");
    if rc.contains_key("atClusterTime") {
        return Err(SimError::invalid_options(
            "atClusterTime is only valid with level snapshot, which the simulator does not model",
        ));
    }
    match level {
        "local" | "majority" => Ok(false),
        "available" if after => Err(SimError::invalid_options(
            "afterClusterTime field can be set only if level is equal to majority, local, or snapshot",
        )),
        "available" => Ok(true),
        "snapshot" | "linearizable" => Err(SimError::invalid_options(format!("readConcern level {level} is not simulated"))),
        other => Err(SimError::failed_to_parse(format!("{other} is not a valid read concern level"))),
    }
}

/// `maxTimeMS` as a deadline (absent or 0: none).
pub fn deadline(body: &Document) -> Result<Option<Instant>, SimError> {
    match body.get("maxTimeMS") {
        None => Ok(None),
        Some(v) => match number(v) {
            Some(ms) if ms > 0.0 => Ok(Some(Instant::now() + Duration::from_millis(ms as u64))),
            Some(0.0) => Ok(None),
            _ => Err(SimError::bad_value(
                "maxTimeMS must be a non-negative number",
            )),
        },
    }
}

fn doc_arg(body: &Document, key: &str) -> Result<Document, SimError> {
    match body.get(key) {
        None | Some(Bson::Null) => Ok(Document::new()),
        Some(Bson::Document(d)) => Ok(d.clone()),
        Some(_) => Err(SimError::new(
            14,
            "TypeMismatch",
            format!("BSON field '{key}' is the wrong type, expected an object"),
        )),
    }
}

fn count_arg(body: &Document, key: &str) -> Result<Option<usize>, SimError> {
    match body.get(key) {
        None | Some(Bson::Null) => Ok(None),
        Some(v) => match number(v) {
            Some(n) if n >= 0.0 => Ok(Some(n as usize)),
            Some(n) if key == "limit" => Ok(Some((-n) as usize)),
            _ => Err(SimError::bad_value(format!(
                "{key} must be a non-negative number"
            ))),
        },
    }
}

async fn read_docs(cluster: &Cluster, spec: &ReadSpec) -> Result<Vec<Document>, SimError> {
    let per_shard = cluster.read(spec).await?;
    for s in &per_shard {
        tracing::trace!(ns = %spec.ns, shard = s.shard, node = s.node, docs = s.docs.len(), "shard answered");
    }
    Ok(per_shard.into_iter().flat_map(|s| s.docs).collect())
}

async fn find(cluster: &Cluster, db: &str, body: &Document) -> Result<Document, SimError> {
    let ns = namespace(db, body)?;
    let spec = read_spec(ns.clone(), doc_arg(body, "filter")?, body)?;
    let mut docs = read_docs(cluster, &spec).await?;
    let sort_spec = doc_arg(body, "sort")?;
    if !sort_spec.is_empty() {
        sort(&mut docs, &sort_spec);
    }
    let skip = count_arg(body, "skip")?.unwrap_or(0);
    let limit = count_arg(body, "limit")?.filter(|&n| n > 0);
    let projection = doc_arg(body, "projection")?;
    let docs: VecDeque<Document> = docs
        .into_iter()
        .skip(skip)
        .take(limit.unwrap_or(usize::MAX))
        .map(|d| {
            if projection.is_empty() {
                d
            } else {
                project(&d, &projection)
            }
        })
        .collect();
    let single = body.get_bool("singleBatch").unwrap_or(false);
    let batch = count_arg(body, "batchSize")?.unwrap_or(DEFAULT_BATCH);
    Ok(first_batch(cluster, ns, docs, batch, single))
}

/// `{cursor: {firstBatch, id, ns}, ok: 1}`, keeping the rest in a mongos cursor.
fn first_batch(
    cluster: &Cluster,
    ns: String,
    mut docs: VecDeque<Document>,
    batch: usize,
    single: bool,
) -> Document {
    let first: Vec<Bson> = docs
        .drain(..batch.min(docs.len()))
        .map(Bson::Document)
        .collect();
    let id = if single || docs.is_empty() {
        0
    } else {
        let mut st = lock(&cluster.state);
        let id = (st.rng.next() >> 2) as i64 | 1 << 40;
        st.mongos.cursors.insert(
            id,
            Cursor {
                ns: ns.clone(),
                docs,
            },
        );
        id
    };
    doc! { "cursor": { "firstBatch": first, "id": id, "ns": ns }, "ok": 1.0 }
}

fn get_more(cluster: &Cluster, db: &str, body: &Document) -> Result<Document, SimError> {
    let id = match body.get("getMore") {
        Some(Bson::Int64(id)) => *id,
        _ => {
            return Err(SimError::new(
                14,
                "TypeMismatch",
                "getMore's cursor id must be an Int64",
            ))
        }
    };
    let coll = body
        .get_str("collection")
        .map_err(|_| SimError::failed_to_parse("getMore needs a collection"))?;
    let batch = count_arg(body, "batchSize")?
        .filter(|&n| n > 0)
        .unwrap_or(usize::MAX);
    let mut st = lock(&cluster.state);
    let Some(cursor) = st.mongos.cursors.get_mut(&id) else {
        return Err(SimError::new(
            43,
            "CursorNotFound",
            format!("cursor id {id} not found"),
        ));
    };
    if cursor.ns != format!("{db}.{coll}") {
        return Err(SimError::new(13, "Unauthorized", format!("Requested getMore on namespace '{db}.{coll}', but cursor belongs to a different namespace {}", cursor.ns)));
    }
    let next: Vec<Bson> = cursor
        .docs
        .drain(..batch.min(cursor.docs.len()))
        .map(Bson::Document)
        .collect();
    let ns = cursor.ns.clone();
    let left = if cursor.docs.is_empty() {
        st.mongos.cursors.remove(&id);
        0
    } else {
        id
    };
    Ok(doc! { "cursor": { "nextBatch": next, "id": left, "ns": ns }, "ok": 1.0 })
}

fn kill_cursors(cluster: &Cluster, body: &Document) -> Result<Document, SimError> {
    let ids = body
        .get_array("cursors")
        .map_err(|_| SimError::failed_to_parse("killCursors needs cursors"))?;
    let mut st = lock(&cluster.state);
    let (mut killed, mut missing) = (Vec::new(), Vec::new());
    for id in ids {
        let Bson::Int64(n) = id else { continue };
        match st.mongos.cursors.remove(n) {
            Some(_) => killed.push(id.clone()),
            None => missing.push(id.clone()),
        }
    }
    Ok(doc! {
        "cursorsKilled": killed, "cursorsNotFound": missing,
        "cursorsAlive": [], "cursorsUnknown": [], "ok": 1.0,
    })
}

async fn aggregate(cluster: &Cluster, db: &str, body: &Document) -> Result<Document, SimError> {
    let ns = namespace(db, body)
        .map_err(|_| SimError::illegal("collection-less aggregate is not simulated"))?;
    let stages = pipeline::parse(body.get_array("pipeline").map_err(|_| {
        SimError::failed_to_parse("'pipeline' option must be specified as an array")
    })?)?;
    if body.get_bool("explain").unwrap_or(false) {
        return explain_targets(cluster, &ns, &pipeline::leading_match(&stages));
    }
    let spec = read_spec(ns.clone(), pipeline::leading_match(&stages), body)?;
    let docs = pipeline::run(&stages, read_docs(cluster, &spec).await?);
    let cursor = doc_arg(body, "cursor")?;
    let batch = count_arg(&cursor, "batchSize")?.unwrap_or(DEFAULT_BATCH);
    Ok(first_batch(cluster, ns, docs.into(), batch, false))
}

async fn count(cluster: &Cluster, db: &str, body: &Document) -> Result<Document, SimError> {
    let spec = read_spec(namespace(db, body)?, doc_arg(body, "query")?, body)?;
    let n = read_docs(cluster, &spec).await?.len();
    let n = n.saturating_sub(count_arg(body, "skip")?.unwrap_or(0));
    let n = count_arg(body, "limit")?
        .filter(|&l| l > 0)
        .map_or(n, |l| n.min(l));
    Ok(doc! { "n": n as i32, "ok": 1.0 })
}

async fn distinct(cluster: &Cluster, db: &str, body: &Document) -> Result<Document, SimError> {
    let key = body
        .get_str("key")
        .map_err(|_| SimError::failed_to_parse("distinct needs a string key"))?
        .to_string();
    let spec = read_spec(namespace(db, body)?, doc_arg(body, "query")?, body)?;
    let mut values: Vec<Bson> = Vec::new();
    for d in read_docs(cluster, &spec).await? {
        let items = match get_path(&d, &key) {
            Some(Bson::Array(a)) => a.clone(),
            Some(v) => vec![v.clone()],
            None => Vec::new(),
        };
        for v in items {
            if !values.iter().any(|x| values_equal(x, &v)) {
                values.push(v);
            }
        }
    }
    Ok(doc! { "values": values, "ok": 1.0 })
}

/// `explain` of find, count, distinct, aggregate, update or delete: the shards mongos
/// would target (from its cached routing table), in 4.4's queryPlanner shape.
fn explain(cluster: &Cluster, db: &str, body: &Document) -> Result<Document, SimError> {
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

fn explain_targets(cluster: &Cluster, ns: &str, filter: &Document) -> Result<Document, SimError> {
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

fn list_databases(cluster: &Cluster) -> Document {
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

fn list_collections(cluster: &Cluster, db: &str) -> Document {
    let prefix = format!("{db}.");
    let batch: Vec<Bson> = collection_names(cluster)
        .into_iter()
        .filter_map(|ns| ns.strip_prefix(&prefix).map(str::to_string))
        .map(|name| Bson::Document(doc! { "name": name, "type": "collection", "options": {}, "info": { "readOnly": false } }))
        .collect();
    doc! { "cursor": { "firstBatch": batch, "id": 0_i64, "ns": format!("{db}.$cmd.listCollections") }, "ok": 1.0 }
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
