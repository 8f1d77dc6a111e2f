//! What the fake answers: [`Request`] → [`Plan`], with an in-memory store of documents and
//! cursors. Only the subset the tests and the drivers' own traffic need.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use bson::raw::{cstr, CStr};
use bson::{rawdoc, RawArrayBuf, RawBsonRef, RawDocument, RawDocumentBuf};
use staleguard::wire::opmsg::EXHAUST_ALLOWED;
use staleguard::wire::reply::error_body;

use super::request::Request;
use super::{lock, State};

/// A reply batch stops growing past this many bytes (mongos keeps replies under 16 MiB).
const BATCH_BYTES: usize = 16 * 1024 * 1024;
/// The default size of a first batch.
const FIRST_BATCH: usize = 101;

/// What to send back for one request.
pub enum Plan {
    One(RawDocumentBuf),
    /// getMore with exhaustAllowed: every batch, all but the last with moreToCome.
    Exhaust(Vec<RawDocumentBuf>),
    /// Awaitable hello: answer after `first`; with `exhaust`, stream one every `every`.
    AwaitHello {
        first: Duration,
        every: Duration,
        exhaust: bool,
    },
}

struct Cursor {
    ns: String,
    docs: VecDeque<RawDocumentBuf>,
}

/// Collections (by `db.coll`) and open cursors.
#[derive(Default)]
pub struct Store {
    collections: HashMap<String, Vec<RawDocumentBuf>>,
    /// Views: namespace -> the collection (same database) it reads.
    views: HashMap<String, String>,
    cursors: HashMap<i64, Cursor>,
    cursor_ids: i64,
}

impl Store {
    pub fn documents(&self, ns: &str) -> Vec<RawDocumentBuf> {
        self.collections.get(ns).cloned().unwrap_or_default()
    }

    /// Makes `ns` a view on `source` (a collection of the same database).
    pub fn view(&mut self, ns: &str, source: &str) {
        self.views.insert(ns.to_string(), source.to_string());
    }

    pub fn seed(&mut self, ns: &str, docs: impl IntoIterator<Item = RawDocumentBuf>) {
        self.collections
            .entry(ns.to_string())
            .or_default()
            .extend(docs);
    }

    fn matching(&self, ns: &str, filter: Option<&RawDocument>) -> VecDeque<RawDocumentBuf> {
        self.collections
            .get(ns)
            .map(|docs| {
                docs.iter()
                    .filter(|d| matches(d, filter))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Opens a cursor over `docs` unless they are used up; returns its id (0 = none).
    fn open_cursor(&mut self, ns: &str, docs: VecDeque<RawDocumentBuf>) -> i64 {
        if docs.is_empty() {
            return 0;
        }
        // Large ids, so anything that squeezes them into an Int32 shows.
        self.cursor_ids += 1;
        let id = (1 << 40) + self.cursor_ids;
        let ns = ns.to_string();
        self.cursors.insert(id, Cursor { ns, docs });
        id
    }
}

/// Decides the answer to `req` on connection `conn_id`, doing any writes it implies.
pub fn plan(state: &State, req: &Request, conn_id: i32) -> Plan {
    let name = req.command_name();
    if matches!(name, "hello" | "isMaster" | "ismaster") {
        return hello(state, req, conn_id);
    }
    if req.legacy {
        let msg = format!("Unsupported OP_QUERY command: {name}");
        return Plan::One(error_body(352, "UnsupportedOpQueryCommand", &msg));
    }
    let store = &mut lock(&state.store);
    let body = match name {
        "ping" | "endSessions" => ok(),
        "buildInfo" | "buildinfo" => rawdoc! {
            "version": "7.0.0",
            "versionArray": [7, 0, 0, 0],
            "maxBsonObjectSize": 16_777_216,
            "ok": 1.0,
        },
        "insert" => insert(store, req),
        "update" => update(store, req),
        "delete" => delete(store, req),
        "find" => find(store, req),
        "getMore" if req.flags & EXHAUST_ALLOWED != 0 => return get_more_exhaust(store, req),
        "getMore" => get_more(store, req),
        "killCursors" => kill_cursors(store, req),
        "count" => count(store, req),
        "aggregate" => aggregate(store, req),
        "listCollections" => list_collections(store, req),
        "drop" => {
            store.collections.remove(&namespace(req));
            rawdoc! { "ns": namespace(req), "nIndexesWas": 1, "ok": 1.0 }
        }
        _ => error_body(59, "CommandNotFound", &format!("no such command: '{name}'")),
    };
    Plan::One(body)
}

fn ok() -> RawDocumentBuf {
    rawdoc! { "ok": 1.0 }
}

// ---- handshake and monitoring ---------------------------------------------------------

fn hello(state: &State, req: &Request, conn_id: i32) -> Plan {
    let body = &req.body;
    let awaited = body.get_document("topologyVersion").ok().zip(
        body.get("maxAwaitTimeMS")
            .ok()
            .flatten()
            .and_then(number)
            .filter(|&ms| ms >= 0.0),
    );
    let Some((client_tv, max_await_ms)) = awaited else {
        return Plan::One(hello_body(state, body, conn_id));
    };
    let mut every = Duration::from_millis(max_await_ms as u64);
    if let Some(cap) = state.await_cap() {
        every = every.min(cap);
    }
    // A client that knows an older topology is answered at once.
    let current = client_tv.get_object_id("processId").ok() == Some(state.process_id);
    Plan::AwaitHello {
        first: if current { every } else { Duration::ZERO },
        every,
        exhaust: req.flags & EXHAUST_ALLOWED != 0,
    }
}

/// A mongos hello / isMaster reply to `request` on connection `conn_id`.
pub fn hello_body(state: &State, request: &RawDocument, conn_id: i32) -> RawDocumentBuf {
    let mut out = RawDocumentBuf::new();
    if super::request::command_name(request) == "hello" {
        out.append(cstr!("isWritablePrimary"), true);
    } else {
        out.append(cstr!("ismaster"), true);
    }
    out.append(cstr!("msg"), "isdbgrid");
    out.append(
        cstr!("topologyVersion"),
        rawdoc! { "processId": state.process_id, "counter": 0_i64 },
    );
    if request.get("helloOk").ok().flatten().is_some() {
        out.append(cstr!("helloOk"), true);
    }
    out.append(cstr!("maxBsonObjectSize"), 16_777_216);
    out.append(cstr!("maxMessageSizeBytes"), 48_000_000);
    out.append(cstr!("maxWriteBatchSize"), 100_000);
    out.append(cstr!("localTime"), bson::DateTime::now());
    out.append(cstr!("logicalSessionTimeoutMinutes"), 30);
    out.append(cstr!("connectionId"), conn_id);
    out.append(cstr!("minWireVersion"), 0);
    out.append(cstr!("maxWireVersion"), 21);
    let compression = negotiate(request);
    if !compression.is_empty() {
        out.append(cstr!("compression"), compression);
    }
    out.append(cstr!("ok"), 1.0);
    out
}

/// The client's compressors that the fake supports, in the client's order.
fn negotiate(request: &RawDocument) -> RawArrayBuf {
    let Ok(asked) = request.get_array("compression") else {
        return RawArrayBuf::new();
    };
    asked
        .into_iter()
        .filter_map(|v| v.ok()?.as_str())
        .filter(|name| matches!(*name, "zstd" | "zlib" | "snappy"))
        .collect()
}

// ---- writes --------------------------------------------------------------------------

fn insert(store: &mut Store, req: &Request) -> RawDocumentBuf {
    let docs = req.documents("documents");
    let n = docs.len() as i32;
    store.seed(&namespace(req), docs);
    rawdoc! { "n": n, "ok": 1.0 }
}

fn update(store: &mut Store, req: &Request) -> RawDocumentBuf {
    let ns = namespace(req);
    let (mut n, mut modified) = (0, 0);
    let mut upserted = RawArrayBuf::new();
    for (index, op) in req.documents("updates").iter().enumerate() {
        let filter = op.get_document("q").ok();
        let Ok(change) = op.get_document("u") else {
            continue; // pipeline updates are not simulated
        };
        let multi = op.get_bool("multi").unwrap_or(false);
        let docs = store.collections.entry(ns.clone()).or_default();
        let mut hit = 0;
        for doc in docs.iter_mut().filter(|d| matches(d, filter)) {
            *doc = apply_update(doc, change);
            hit += 1;
            if !multi {
                break;
            }
        }
        if hit == 0 && op.get_bool("upsert").unwrap_or(false) {
            let seed = filter.map(equalities).unwrap_or_default();
            let mut doc = apply_update(&seed, change);
            if doc.get("_id").ok().flatten().is_none() {
                doc = prepend_id(&doc);
            }
            if let Ok(Some(id)) = doc.get("_id") {
                upserted.push(rawdoc! { "index": index as i32, "_id": id });
            }
            docs.push(doc);
            n += 1;
        }
        n += hit;
        modified += hit;
    }
    let mut out = rawdoc! { "n": n, "nModified": modified };
    if !upserted.is_empty() {
        out.append(cstr!("upserted"), upserted);
    }
    out.append(cstr!("ok"), 1.0);
    out
}

fn delete(store: &mut Store, req: &Request) -> RawDocumentBuf {
    let docs = store.collections.entry(namespace(req)).or_default();
    let mut n = 0;
    for op in req.documents("deletes") {
        let filter = op.get_document("q").ok();
        let limit = op
            .get("limit")
            .ok()
            .flatten()
            .and_then(number)
            .unwrap_or(0.0);
        let mut left = if limit >= 1.0 { 1 } else { usize::MAX };
        docs.retain(|d| {
            let drop = left > 0 && matches(d, filter);
            if drop {
                left -= 1;
                n += 1;
            }
            !drop
        });
    }
    rawdoc! { "n": n, "ok": 1.0 }
}

/// `doc` changed by `change`: `$set` fields, or a replacement keeping `_id`. Other update
/// operators are ignored.
fn apply_update(doc: &RawDocument, change: &RawDocument) -> RawDocumentBuf {
    let first = super::request::command_name(change);
    if !first.starts_with('$') {
        let mut out = RawDocumentBuf::new();
        if let Ok(Some(id)) = doc.get("_id") {
            out.append(cstr!("_id"), id);
        }
        for (k, v) in change.iter().flatten() {
            if k.as_str() != "_id" || out.is_empty() {
                out.append(k, v);
            }
        }
        return out;
    }
    let Ok(set) = change.get_document("$set") else {
        return doc.to_owned();
    };
    let mut out = RawDocumentBuf::new();
    for (k, v) in doc.iter().flatten() {
        match set.get(k.as_str()) {
            Ok(Some(new)) => out.append(k, new),
            _ => out.append(k, v),
        }
    }
    for (k, v) in set.iter().flatten() {
        if doc.get(k.as_str()).ok().flatten().is_none() {
            out.append(k, v);
        }
    }
    out
}

fn prepend_id(doc: &RawDocument) -> RawDocumentBuf {
    let mut out = rawdoc! { "_id": bson::oid::ObjectId::new() };
    for (k, v) in doc.iter().flatten() {
        out.append(k, v);
    }
    out
}

/// The plain `field: value` pairs of a filter (what an upsert starts from).
fn equalities(filter: &RawDocument) -> RawDocumentBuf {
    let mut out = RawDocumentBuf::new();
    for (k, v) in filter.iter().flatten() {
        if !k.as_str().starts_with('$') {
            out.append(k, v);
        }
    }
    out
}

// ---- reads and cursors ---------------------------------------------------------------

fn find(store: &mut Store, req: &Request) -> RawDocumentBuf {
    let ns = namespace(req);
    let body = &req.body;
    let mut docs = store.matching(&ns, body.get_document("filter").ok());
    let skip = int_arg(body, "skip").unwrap_or(0) as usize;
    docs.drain(..skip.min(docs.len()));
    if let Some(limit) = int_arg(body, "limit")
        .map(i64::unsigned_abs)
        .filter(|&l| l > 0)
    {
        docs.truncate(limit as usize);
    }
    let first = take_batch(&mut docs, batch_size(body).or(Some(FIRST_BATCH)));
    let single = body.get_bool("singleBatch").unwrap_or(false);
    let id = if single {
        0
    } else {
        store.open_cursor(&ns, docs)
    };
    cursor_reply(id, &ns, cstr!("firstBatch"), first)
}

/// `listCollections` with a `{name: ...}` filter (what staleguard's view lookup sends): the
/// view or collection of that name, if any.
fn list_collections(store: &Store, req: &Request) -> RawDocumentBuf {
    let db = req.db();
    let name = (req.body.get_document("filter").ok())
        .and_then(|f| f.get_str("name").ok())
        .unwrap_or("");
    let ns = format!("{db}.{name}");
    let mut batch = bson::RawArrayBuf::new();
    if let Some(source) = store.views.get(&ns) {
        batch.push(rawdoc! {"name": name, "type": "view", "options": {"viewOn": source.as_str(), "pipeline": []}});
    } else if store.collections.contains_key(&ns) {
        batch.push(rawdoc! {"name": name, "type": "collection", "options": {}});
    }
    rawdoc! {
        "cursor": {"id": 0_i64, "ns": format!("{db}.$cmd.listCollections"), "firstBatch": batch},
        "ok": 1.0,
    }
}

fn get_more(store: &mut Store, req: &Request) -> RawDocumentBuf {
    let Some(id) = int_arg(&req.body, "getMore") else {
        return error_body(14, "TypeMismatch", "getMore needs a cursor id");
    };
    let Some(cursor) = store.cursors.get_mut(&id) else {
        return error_body(43, "CursorNotFound", &format!("cursor id {id} not found"));
    };
    let batch = take_batch(&mut cursor.docs, batch_size(&req.body));
    let ns = cursor.ns.clone();
    let id = if cursor.docs.is_empty() {
        store.cursors.remove(&id);
        0
    } else {
        id
    };
    cursor_reply(id, &ns, cstr!("nextBatch"), batch)
}

/// getMore with exhaustAllowed: every remaining batch at once, the last one closing the cursor.
fn get_more_exhaust(store: &mut Store, req: &Request) -> Plan {
    let mut bodies = Vec::new();
    loop {
        let body = get_more(store, req);
        let done = match body.get_document("cursor") {
            Ok(cursor) => cursor.get_i64("id").unwrap_or(0) == 0,
            Err(_) => true, // an error ends the stream
        };
        bodies.push(body);
        if done {
            return Plan::Exhaust(bodies);
        }
    }
}

fn kill_cursors(store: &mut Store, req: &Request) -> RawDocumentBuf {
    let (mut killed, mut not_found) = (RawArrayBuf::new(), RawArrayBuf::new());
    if let Ok(ids) = req.body.get_array("cursors") {
        for id in ids.into_iter().flatten().filter_map(|v| v.as_i64()) {
            match store.cursors.remove(&id) {
                Some(_) => killed.push(id),
                None => not_found.push(id),
            }
        }
    }
    rawdoc! {
        "cursorsKilled": killed,
        "cursorsNotFound": not_found,
        "cursorsAlive": [],
        "cursorsUnknown": [],
        "ok": 1.0,
    }
}

fn count(store: &mut Store, req: &Request) -> RawDocumentBuf {
    let body = &req.body;
    let n = store
        .matching(&namespace(req), body.get_document("query").ok())
        .len() as i64;
    let n = (n - int_arg(body, "skip").unwrap_or(0)).max(0);
    let n = match int_arg(body, "limit").map(i64::abs).filter(|&l| l > 0) {
        Some(limit) => n.min(limit),
        None => n,
    };
    rawdoc! { "n": n as i32, "ok": 1.0 }
}

/// Stages: `$match` (equality), `$skip`, `$limit`, `$count`, and `$group` with a constant
/// `_id` and `{$sum: 1}` fields (what `count_documents` sends).
fn aggregate(store: &mut Store, req: &Request) -> RawDocumentBuf {
    let ns = namespace(req);
    let mut docs = store.matching(&ns, None);
    let stages = req.body.get_array("pipeline").ok();
    for stage in stages.into_iter().flatten().flatten() {
        let Some(stage) = stage.as_document() else {
            return error_body(14, "TypeMismatch", "pipeline stages must be documents");
        };
        let name = super::request::command_name(stage);
        let arg = stage.get(name).ok().flatten();
        match (name, arg) {
            ("$match", Some(RawBsonRef::Document(f))) => docs.retain(|d| matches(d, Some(f))),
            ("$skip", Some(v)) => {
                let n = number(v).unwrap_or(0.0) as usize;
                docs.drain(..n.min(docs.len()));
            }
            ("$limit", Some(v)) => docs.truncate(number(v).unwrap_or(0.0) as usize),
            ("$count", Some(RawBsonRef::String(field))) => {
                let n = docs.len() as i32;
                docs.clear();
                if n > 0 {
                    let mut out = RawDocumentBuf::new();
                    out.append(key(field), n);
                    docs.push_back(out);
                }
            }
            ("$group", Some(RawBsonRef::Document(spec))) => docs = group(spec, docs),
            _ => {
                let msg = format!("Unrecognized pipeline stage name: '{name}'");
                return error_body(40324, "Location40324", &msg);
            }
        }
    }
    let size = req
        .body
        .get_document("cursor")
        .ok()
        .and_then(batch_size)
        .or(Some(FIRST_BATCH));
    let first = take_batch(&mut docs, size);
    let id = store.open_cursor(&ns, docs);
    cursor_reply(id, &ns, cstr!("firstBatch"), first)
}

fn group(spec: &RawDocument, docs: VecDeque<RawDocumentBuf>) -> VecDeque<RawDocumentBuf> {
    if docs.is_empty() {
        return docs;
    }
    let mut out = RawDocumentBuf::new();
    for (k, v) in spec.iter().flatten() {
        match k.as_str() {
            "_id" => out.append(k, v),
            _ => out.append(k, docs.len() as i32),
        }
    }
    VecDeque::from([out])
}

fn cursor_reply(id: i64, ns: &str, batch_key: &CStr, batch: RawArrayBuf) -> RawDocumentBuf {
    let mut cursor = RawDocumentBuf::new();
    cursor.append(batch_key, batch);
    cursor.append(cstr!("id"), id);
    cursor.append(cstr!("ns"), ns);
    rawdoc! { "cursor": cursor, "ok": 1.0 }
}

/// Takes up to `size` documents (all if `None`), stopping before the batch would pass
/// [`BATCH_BYTES`] (but always at least one).
fn take_batch(docs: &mut VecDeque<RawDocumentBuf>, size: Option<usize>) -> RawArrayBuf {
    let mut batch = RawArrayBuf::new();
    let (mut count, mut bytes) = (0, 0);
    while count < size.unwrap_or(usize::MAX) {
        let Some(next) = docs.front() else { break };
        let len = next.as_bytes().len();
        if count > 0 && bytes + len > BATCH_BYTES {
            break;
        }
        batch.push(next);
        docs.pop_front();
        count += 1;
        bytes += len;
    }
    batch
}

// ---- small helpers -------------------------------------------------------------------

/// `db.coll` from `$db` and the collection named by the command's first value.
fn namespace(req: &Request) -> String {
    let coll = match req.body.iter().next() {
        Some(Ok((_, RawBsonRef::String(coll)))) => coll,
        _ => "",
    };
    format!("{}.{}", req.db(), coll)
}

/// Top-level equality on every filter field; numbers compare by value across types.
fn matches(doc: &RawDocument, filter: Option<&RawDocument>) -> bool {
    let Some(filter) = filter else { return true };
    filter.iter().all(|field| match field {
        Ok((k, want)) => match doc.get(k.as_str()) {
            Ok(Some(have)) => match (number(have), number(want)) {
                (Some(a), Some(b)) => a == b,
                _ => have == want,
            },
            _ => false,
        },
        Err(_) => false,
    })
}

fn number(v: RawBsonRef<'_>) -> Option<f64> {
    match v {
        RawBsonRef::Int32(n) => Some(n as f64),
        RawBsonRef::Int64(n) => Some(n as f64),
        RawBsonRef::Double(n) => Some(n),
        _ => None,
    }
}

fn int_arg(body: &RawDocument, name: &str) -> Option<i64> {
    match body.get(name).ok().flatten()? {
        RawBsonRef::Int32(n) => Some(n as i64),
        RawBsonRef::Int64(n) => Some(n),
        RawBsonRef::Double(n) => Some(n as i64),
        _ => None,
    }
}

fn batch_size(body: &RawDocument) -> Option<usize> {
    int_arg(body, "batchSize").map(|n| n.max(0) as usize)
}

fn key(s: &str) -> &CStr {
    s.try_into().unwrap_or(cstr!("count"))
}
