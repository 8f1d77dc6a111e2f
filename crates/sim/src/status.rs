//! What the processes say about themselves: hello (mongos and replica-set members),
//! buildInfo, serverStatus (mongos; a node's tickets, queue, counters, latencies, repl,
//! election and flow-control sections), replSetGetStatus.

use bson::{doc, Bson, Document, Timestamp};

use super::model::{lock, Counters, Node, NodeId, State, NODES_PER_SHARD};
use super::Cluster;

pub const VERSION: &str = "4.4.0-staleguard-sim";
/// 4.4; the official drivers refuse anything older than 9.
pub const MAX_WIRE_VERSION: i32 = 9;
/// 4.2's default for read tickets (reads never queue in the model).
const READ_TICKETS: i32 = 128;

pub fn build_info() -> Document {
    doc! {
        "version": VERSION,
        "gitVersion": "simulated",
        "versionArray": [4, 4, 0, 0],
        "bits": 64,
        "maxBsonObjectSize": 16_777_216,
        "ok": 1.0,
    }
}

pub fn server_info() -> Document {
    doc! { "host": "mongos", "port": 27017, "version": VERSION, "gitVersion": "simulated" }
}

/// The fields every hello reply carries, mongos or mongod.
pub fn hello_common(request: &Document, connection_id: i32, primary_flag: bool) -> Document {
    let mut d = Document::new();
    if request.keys().next().map(String::as_str) == Some("hello") {
        d.insert("isWritablePrimary", primary_flag);
    } else {
        d.insert("ismaster", primary_flag);
    }
    if request.contains_key("helloOk") {
        d.insert("helloOk", true);
    }
    d.insert("maxBsonObjectSize", 16_777_216);
    d.insert("maxMessageSizeBytes", 48_000_000);
    d.insert("maxWriteBatchSize", 100_000);
    d.insert("localTime", bson::DateTime::now());
    d.insert("logicalSessionTimeoutMinutes", 30);
    d.insert("connectionId", connection_id);
    d.insert("minWireVersion", 0);
    d.insert("maxWireVersion", MAX_WIRE_VERSION);
    let compression = negotiate(request);
    if !compression.is_empty() {
        d.insert("compression", compression);
    }
    d
}

/// The client's compressors the simulator also speaks, in the client's order.
fn negotiate(request: &Document) -> Vec<Bson> {
    request
        .get_array("compression")
        .map(|a| {
            a.iter()
                .filter(|c| matches!(c.as_str(), Some("snappy" | "zlib" | "zstd")))
                .cloned()
                .collect()
        })
        .unwrap_or_default()
}

pub fn mongos_hello(cluster: &Cluster, request: &Document, connection_id: i32) -> Document {
    let mut d = hello_common(request, connection_id, true);
    d.insert("msg", "isdbgrid");
    d.insert(
        "topologyVersion",
        doc! { "processId": cluster.process_id, "counter": 0_i64 },
    );
    d.insert("ok", 1.0);
    d
}

/// `host:port` of a node: its own address with node ports, else its name.
fn host(n: &Node) -> String {
    n.addr
        .map_or_else(|| format!("{}:27017", n.name), |a| a.to_string())
}

fn members(st: &State, shard: usize) -> impl Iterator<Item = &Node> {
    st.nodes.iter().filter(move |n| n.shard == shard)
}

pub fn connection_string(cluster: &Cluster, shard: usize) -> String {
    let st = lock(&cluster.state);
    let hosts: Vec<String> = members(&st, shard).map(host).collect();
    format!("{}/{}", st.shards[shard].name, hosts.join(","))
}

fn op_time(ts: Timestamp, term: i64) -> Document {
    doc! { "ts": ts, "t": term }
}

fn ts_date(ts: Timestamp) -> bson::DateTime {
    bson::DateTime::from_millis(i64::from(ts.time) * 1000)
}

/// A node's hello as a replica-set member (primary even while its writes are stalled).
pub fn node_hello(
    cluster: &Cluster,
    node: NodeId,
    request: &Document,
    connection_id: i32,
) -> Document {
    let st = lock(&cluster.state);
    let n = &st.nodes[node];
    let mut d = hello_common(request, connection_id, n.primary);
    d.extend(repl_fields(&st, node));
    d.insert(
        "topologyVersion",
        doc! { "processId": n.process_id, "counter": 0_i64 },
    );
    d.insert("readOnly", false);
    d.insert("ok", 1.0);
    d
}

/// The replica-set part of hello, also serverStatus's `repl`.
fn repl_fields(st: &State, node: NodeId) -> Document {
    let n = &st.nodes[node];
    let shard = &st.shards[n.shard];
    let hosts: Vec<String> = members(st, n.shard).map(host).collect();
    let primary = &st.nodes[n.shard * NODES_PER_SHARD];
    let mut d = doc! {
        "hosts": hosts,
        "setName": shard.name,
        "setVersion": 1,
        "secondary": !n.primary,
        "primary": host(primary),
        "me": host(n),
        "tags": { "node": &n.name },
    };
    if n.primary {
        d.insert("electionId", election_id(shard.term));
    }
    let op = op_time(shard.optime, shard.term);
    d.insert(
        "lastWrite",
        doc! {
            "opTime": op.clone(), "lastWriteDate": ts_date(shard.optime),
            "majorityOpTime": op, "majorityWriteDate": ts_date(shard.optime),
        },
    );
    d
}

fn election_id(term: i64) -> bson::oid::ObjectId {
    let mut b = [0u8; 12];
    b[..4].copy_from_slice(&0x7fff_ffffu32.to_be_bytes());
    b[4..].copy_from_slice(&term.to_be_bytes());
    bson::oid::ObjectId::from_bytes(b)
}

fn opcounters(c: &Counters) -> Document {
    doc! {
        "insert": c.insert as i64, "query": c.query as i64, "update": c.update as i64,
        "delete": c.delete as i64, "getmore": c.getmore as i64, "command": c.command as i64,
    }
}

fn uptime(started: tokio::time::Instant) -> Document {
    let ms = started.elapsed().as_millis() as i64;
    doc! { "uptime": ms as f64 / 1000.0, "uptimeMillis": ms, "uptimeEstimate": ms / 1000 }
}

pub fn mongos(cluster: &Cluster) -> Document {
    let st = lock(&cluster.state);
    let m = &st.mongos;
    let mut d = doc! { "host": "mongos", "version": VERSION, "process": "mongos", "pid": i64::from(std::process::id()) };
    d.extend(uptime(cluster.started));
    d.insert("localTime", bson::DateTime::now());
    d.insert(
        "connections",
        doc! { "current": m.connections as i32, "available": 1_000_000, "totalCreated": m.connections_created as i64 },
    );
    d.insert("opcounters", opcounters(&m.counters));
    d.insert(
        "shardingStatistics",
        doc! { "catalogCache": {
            "numDatabaseEntries": 2_i64,
            "numCollectionEntries": m.cache.len() as i64,
            "countStaleConfigErrors": m.stale_config_errors as i64,
            "countFullRefreshesStarted": m.cache_refreshes as i64,
            "countFailedRefreshes": 0_i64,
        }},
    );
    d.insert("ok", 1.0);
    d
}

/// A node's serverStatus: the article's stall signals live here.
pub fn node(cluster: &Cluster, node: NodeId) -> Document {
    let st = lock(&cluster.state);
    let n = &st.nodes[node];
    let shard = &st.shards[n.shard];
    let (out, queued, total) = if n.primary {
        (
            shard.tickets_out(),
            shard.queued_writers(),
            shard.tickets_total,
        )
    } else {
        (0, 0, shard.tickets_total)
    };
    let mut d = doc! { "host": host(n), "version": VERSION, "process": "mongod", "pid": i64::from(std::process::id()) };
    d.extend(uptime(n.started));
    d.insert("localTime", bson::DateTime::now());
    d.insert(
        "globalLock",
        doc! {
            "totalTime": n.started.elapsed().as_micros() as i64,
            "currentQueue": { "total": queued as i32, "readers": 0, "writers": queued as i32 },
            "activeClients": { "total": out as i32, "readers": 0, "writers": out as i32 },
        },
    );
    d.insert("opcounters", opcounters(&n.counters));
    d.insert("opLatencies", op_latencies(&n.counters));
    d.insert("wiredTiger", doc! { "concurrentTransactions": {
        "write": { "out": out as i32, "available": (total - out) as i32, "totalTickets": total as i32 },
        "read": { "out": 0, "available": READ_TICKETS, "totalTickets": READ_TICKETS },
    }});
    let mut repl = repl_fields(&st, node);
    repl.insert("ismaster", n.primary);
    repl.insert("rbid", 1);
    d.insert("repl", repl);
    d.insert("electionMetrics", election_metrics());
    d.insert("flowControl", flow_control());
    d.insert("ok", 1.0);
    d
}

fn op_latencies(c: &Counters) -> Document {
    doc! {
        "reads": { "latency": c.read_micros as i64, "ops": c.read_ops as i64 },
        "writes": { "latency": c.write_micros as i64, "ops": c.write_ops as i64 },
        "commands": { "latency": 0_i64, "ops": c.command as i64 },
        "transactions": { "latency": 0_i64, "ops": 0_i64 },
    }
}

/// No election ever happens in the model: a stalled primary still answers heartbeats.
fn election_metrics() -> Document {
    let zero = || doc! { "called": 0_i64, "successful": 0_i64 };
    doc! {
        "stepUpCmd": zero(), "priorityTakeover": zero(), "catchUpTakeover": zero(),
        "electionTimeout": zero(), "freezeTimeout": zero(),
        "numStepDownsCausedByHigherTerm": 0_i64, "numCatchUps": 0_i64,
    }
}

/// Flow control sees no lag: nothing is applied, so secondaries are never behind.
fn flow_control() -> Document {
    doc! {
        "enabled": true, "targetRateLimit": 1_000_000_000, "timeAcquiringMicros": 0_i64,
        "locksPerKiloOp": 0.0, "sustainerRate": 0, "isLagged": false,
        "isLaggedCount": 0, "isLaggedTimeMicros": 0_i64,
    }
}

pub fn repl_set_get_status(cluster: &Cluster, node: NodeId) -> Document {
    let st = lock(&cluster.state);
    let me = &st.nodes[node];
    let shard = &st.shards[me.shard];
    let op = op_time(shard.optime, shard.term);
    let members: Vec<Bson> = members(&st, me.shard)
        .enumerate()
        .map(|(i, n)| {
            Bson::Document(doc! {
                "_id": i as i32, "name": host(n), "health": 1.0,
                "state": if n.primary { 1 } else { 2 },
                "stateStr": if n.primary { "PRIMARY" } else { "SECONDARY" },
                "uptime": n.started.elapsed().as_secs() as i64,
                "optime": op.clone(), "optimeDate": ts_date(shard.optime),
                "self": n.name == me.name,
            })
        })
        .collect();
    doc! {
        "set": shard.name, "date": bson::DateTime::now(),
        "myState": if me.primary { 1 } else { 2 },
        "term": shard.term, "heartbeatIntervalMillis": 2000_i64,
        "optimes": { "lastCommittedOpTime": op.clone(), "appliedOpTime": op.clone(), "durableOpTime": op },
        "members": members, "ok": 1.0,
    }
}
