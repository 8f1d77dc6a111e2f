//! mongos's commands: dispatch, read options, the read commands (find, getMore,
//! killCursors, aggregate, count, distinct). `explain` and the catalogue are in `catalog`.

use std::collections::VecDeque;
use std::time::Duration;

use bson::{doc, Bson, Document};
use tokio::time::Instant;

use super::model::{lock, Cursor};
use super::pipeline;
use super::query::{check_filter, get_path, project, sort, values_equal, where_cost};
use super::read::ReadSpec;
use super::request::Request;
use super::routing::number;
use super::select::ReadPref;
use super::{catalog, simcontrol, status, views, writes, Cluster, SimError};

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
        "find" | "aggregate" | "count" | "distinct" => read(cluster, &db, req).await,
        "getMore" => get_more(cluster, &db, body),
        "killCursors" => kill_cursors(cluster, body),
        "create" => views::create(cluster, &db, body),
        "insert" => writes::insert(cluster, &db, req).await,
        "update" => writes::update(cluster, &db, req).await,
        "delete" => writes::delete(cluster, &db, req).await,
        "explain" => catalog::explain(cluster, &db, body),
        "listDatabases" => Ok(catalog::list_databases(cluster)),
        "listCollections" => catalog::list_collections(cluster, &db, body),
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
        cost: where_cost(&filter),
        filter,
        pref: ReadPref::from_body(body)?,
        available: read_concern_available(body)?,
        deadline: deadline(body)?,
    })
}

/// One read command, logged in the read log when it carries a comment.
async fn read(cluster: &Cluster, db: &str, req: &Request) -> Result<Document, SimError> {
    let started = Instant::now();
    let mut served = Vec::new();
    let body = &req.body;
    let result = match req.name() {
        "find" => find(cluster, db, body, &mut served).await,
        "aggregate" => aggregate(cluster, db, body, &mut served).await,
        "count" => count(cluster, db, body, &mut served).await,
        _ => distinct(cluster, db, body, &mut served).await,
    };
    cluster.log_read(req, db, started, &served, &result);
    result
}

/// The documents of `ns` (a collection or a view) that `filter` selects; `served` gets the
/// nodes that answered.
async fn select(
    cluster: &Cluster,
    ns: &str,
    filter: Document,
    body: &Document,
    served: &mut Vec<usize>,
) -> Result<Vec<Document>, SimError> {
    match cluster.view(ns) {
        Some(v) => views::read(cluster, &v, &filter, body, served).await,
        None => read_docs(cluster, &read_spec(ns.to_string(), filter, body)?, served).await,
    }
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
            // A limit too far away to represent is no limit.
            Some(ms) if ms > 0.0 => {
                Ok(Instant::now().checked_add(Duration::from_millis(ms as u64)))
            }
            Some(0.0) => Ok(None),
            _ => Err(SimError::bad_value(
                "maxTimeMS must be a non-negative number",
            )),
        },
    }
}

pub fn doc_arg(body: &Document, key: &str) -> Result<Document, SimError> {
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

pub(crate) async fn read_docs(
    cluster: &Cluster,
    spec: &ReadSpec,
    served: &mut Vec<usize>,
) -> Result<Vec<Document>, SimError> {
    let per_shard = cluster.read(spec).await?;
    for s in &per_shard {
        tracing::trace!(ns = %spec.ns, shard = s.shard, node = s.node, docs = s.docs.len(), "shard answered");
        served.push(s.node);
    }
    Ok(per_shard.into_iter().flat_map(|s| s.docs).collect())
}

async fn find(
    cluster: &Cluster,
    db: &str,
    body: &Document,
    served: &mut Vec<usize>,
) -> Result<Document, SimError> {
    let ns = namespace(db, body)?;
    let mut docs = select(cluster, &ns, doc_arg(body, "filter")?, body, served).await?;
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
    // A negative limit is the legacy spelling of "limit, in a single batch".
    let negative_limit = body.get("limit").and_then(number).is_some_and(|n| n < 0.0);
    let single = body.get_bool("singleBatch").unwrap_or(false) || negative_limit;
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

async fn aggregate(
    cluster: &Cluster,
    db: &str,
    body: &Document,
    served: &mut Vec<usize>,
) -> Result<Document, SimError> {
    let ns = namespace(db, body)
        .map_err(|_| SimError::illegal("collection-less aggregate is not simulated"))?;
    let stages = pipeline::parse(body.get_array("pipeline").map_err(|_| {
        SimError::failed_to_parse("'pipeline' option must be specified as an array")
    })?)?;
    if body.get_bool("explain").unwrap_or(false) {
        return catalog::explain_targets(cluster, &ns, &pipeline::leading_match(&stages));
    }
    let docs = match cluster.view(&ns) {
        Some(v) => views::read(cluster, &v, &Document::new(), body, served).await?,
        None => {
            let spec = read_spec(ns.clone(), pipeline::leading_match(&stages), body)?;
            read_docs(cluster, &spec, served).await?
        }
    };
    let docs = pipeline::run(&stages, docs);
    let cursor = doc_arg(body, "cursor")?;
    let batch = count_arg(&cursor, "batchSize")?.unwrap_or(DEFAULT_BATCH);
    Ok(first_batch(cluster, ns, docs.into(), batch, false))
}

async fn count(
    cluster: &Cluster,
    db: &str,
    body: &Document,
    served: &mut Vec<usize>,
) -> Result<Document, SimError> {
    let ns = namespace(db, body)?;
    let n = select(cluster, &ns, doc_arg(body, "query")?, body, served)
        .await?
        .len();
    let n = n.saturating_sub(count_arg(body, "skip")?.unwrap_or(0));
    let n = count_arg(body, "limit")?
        .filter(|&l| l > 0)
        .map_or(n, |l| n.min(l));
    Ok(doc! { "n": n as i32, "ok": 1.0 })
}

async fn distinct(
    cluster: &Cluster,
    db: &str,
    body: &Document,
    served: &mut Vec<usize>,
) -> Result<Document, SimError> {
    let key = body
        .get_str("key")
        .map_err(|_| SimError::failed_to_parse("distinct needs a string key"))?
        .to_string();
    let ns = namespace(db, body)?;
    let mut values: Vec<Bson> = Vec::new();
    for d in select(cluster, &ns, doc_arg(body, "query")?, body, served).await? {
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
