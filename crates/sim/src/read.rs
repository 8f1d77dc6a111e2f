//! The read path: mongos targets shards, picks one node per shard by read preference, sends
//! its cached shard version; the node checks it against its own routing table, refreshes when
//! it has none or an older one (a secondary only through a write on its primary), filters
//! orphans; mongos retries StaleConfig under the operation's deadline.

use std::sync::Arc;
use std::time::Duration;

use bson::{doc, Bson, Document, Timestamp};
use futures::future::join_all;
use tokio::time::Instant;

use super::engine::{submit, Submitted, WriteOp};
use super::model::{lock, NodeId, PRIMARY_SHARD};
use super::query::matches;
use super::routing::{ShardId, ShardVersion, Table, Target};
use super::select::ReadPref;
use super::{Cluster, SimError};

/// One read as mongos runs it.
#[derive(Debug, Clone)]
pub struct ReadSpec {
    pub ns: String,
    pub filter: Document,
    pub pref: ReadPref,
    /// `readConcern: available`: no shard version is sent, nothing is filtered.
    pub available: bool,
    pub deadline: Option<Instant>,
    /// The work each node's part of the read takes once its routing check passed: a view's
    /// pipeline, a `$where` that sleeps.
    pub cost: Duration,
}

/// What one shard returned.
#[derive(Debug, Clone)]
pub struct ShardDocs {
    pub shard: ShardId,
    pub node: NodeId,
    pub docs: Vec<Document>,
}

/// A node's refusal: mongos retries StaleConfig, returns anything else.
enum NodeError {
    Stale(SimError),
    Fatal(SimError),
}

pub(crate) fn remaining(deadline: Option<Instant>) -> Option<Duration> {
    deadline.map(|d| d.saturating_duration_since(Instant::now()))
}

fn expired(deadline: Option<Instant>) -> bool {
    deadline.is_some_and(|d| Instant::now() >= d)
}

/// Waits `d` inside the read's deadline; MaxTimeMSExpired when the deadline comes first.
async fn spend(d: Duration, deadline: Option<Instant>) -> Result<(), SimError> {
    if d.is_zero() {
        return Ok(());
    }
    match remaining(deadline) {
        Some(left) if left < d => {
            tokio::time::sleep(left).await;
            Err(SimError::max_time())
        }
        _ => {
            tokio::time::sleep(d).await;
            Ok(())
        }
    }
}

impl Cluster {
    /// Runs a read through mongos: the documents of every targeted shard, or the error the
    /// client would get.
    pub(crate) async fn read(&self, spec: &ReadSpec) -> Result<Vec<ShardDocs>, SimError> {
        let attempts = self.settings().stale_retries.saturating_add(1);
        let mut last = None;
        for _ in 0..attempts {
            if expired(spec.deadline) {
                return Err(SimError::max_time());
            }
            let (table, shards) = self.target(&spec.ns, &spec.filter);
            let reads = shards
                .iter()
                .map(|&shard| self.shard_read(shard, table.clone(), spec));
            let mut docs = Vec::new();
            let mut stale = None;
            for result in join_all(reads).await {
                match result {
                    Ok(d) => docs.push(d),
                    Err(NodeError::Fatal(e)) => return Err(e),
                    Err(NodeError::Stale(e)) => stale = Some(e),
                }
            }
            let Some(e) = stale else { return Ok(docs) };
            tracing::info!(ns = %spec.ns, error = %e.message, "mongos: StaleConfig (13388), refreshing and retrying");
            self.mongos_refresh(&spec.ns);
            last = Some(e);
        }
        Err(give_up(last, &spec.ns, attempts))
    }

    /// mongos's cached table (if sharded) and the shards the filter goes to.
    pub(crate) fn target(&self, ns: &str, filter: &Document) -> (Option<Arc<Table>>, Vec<ShardId>) {
        let mut st = lock(&self.state);
        let Some(config) = st.config_table(ns) else {
            return (None, vec![PRIMARY_SHARD]);
        };
        let table = st
            .mongos
            .cache
            .entry(ns.to_string())
            .or_insert(config)
            .clone();
        let shards = Target::of_filter(filter).shards(&table);
        (Some(table), shards)
    }

    /// mongos reloads its cached table from the config server.
    pub(crate) fn mongos_refresh(&self, ns: &str) {
        let mut st = lock(&self.state);
        st.mongos.stale_config_errors += 1;
        if let Some(t) = st.config_table(ns) {
            st.mongos.cache.insert(ns.to_string(), t);
            st.mongos.cache_refreshes += 1;
        }
    }

    async fn shard_read(
        &self,
        shard: ShardId,
        table: Option<Arc<Table>>,
        spec: &ReadSpec,
    ) -> Result<ShardDocs, NodeError> {
        let node = self
            .select_node(shard, &spec.pref, spec.deadline)
            .await
            .map_err(NodeError::Fatal)?;
        spend(self.settings().hop_latency, spec.deadline)
            .await
            .map_err(NodeError::Fatal)?;
        let sent = match (&table, spec.available) {
            (Some(t), false) => Some(t.shard_version(shard)),
            _ => None,
        };
        let docs = self.node_read(node, spec, sent).await?;
        Ok(ShardDocs { shard, node, docs })
    }

    /// One node's part of a read: version check (unless unversioned), refresh if needed,
    /// then its documents matching the filter, orphans filtered when versioned.
    async fn node_read(
        &self,
        node: NodeId,
        spec: &ReadSpec,
        sent: Option<ShardVersion>,
    ) -> Result<Vec<Document>, NodeError> {
        let Some(sent) = sent else {
            spend(spec.cost, spec.deadline)
                .await
                .map_err(NodeError::Fatal)?;
            return Ok(self.serve(node, spec, None));
        };
        let (have, name, shard) = {
            let st = lock(&self.state);
            let n = &st.nodes[node];
            (n.tables.get(&spec.ns).cloned(), n.name.clone(), n.shard)
        };
        match have {
            Some(t) if t.shard_version(shard).compatible(&sent) => {
                spend(spec.cost, spec.deadline)
                    .await
                    .map_err(NodeError::Fatal)?;
                Ok(self.serve(node, spec, Some(&t)))
            }
            Some(t)
                if t.epoch == sent.epoch
                    && t.shard_version(shard).version.major > sent.version.major =>
            {
                Err(NodeError::Stale(stale(
                    &spec.ns,
                    shard,
                    &name,
                    &sent,
                    Some(t.shard_version(shard)),
                    "version mismatch detected: mongos's routing table is older than this shard's",
                )))
            }
            have => Err(self.refresh_for(node, spec, &sent, have.is_some()).await),
        }
    }

    /// A node whose table is UNKNOWN or older than mongos's refreshes it, then answers
    /// StaleConfig either way (mongos retries; after a successful refresh the retry passes).
    async fn refresh_for(
        &self,
        node: NodeId,
        spec: &ReadSpec,
        sent: &ShardVersion,
        had_table: bool,
    ) -> NodeError {
        let (name, shard) = {
            let st = lock(&self.state);
            (st.nodes[node].name.clone(), st.nodes[node].shard)
        };
        let ns = &spec.ns;
        let (wanted, what) = match self.refresh(node, ns, spec.deadline).await {
            Err(RefreshError::Deadline) => return NodeError::Fatal(SimError::max_time()),
            Ok(wanted) => (
                Some(wanted),
                "shard version not ok: this node's routing table was behind and has just been refreshed".to_string(),
            ),
            Err(RefreshError::Failed(why)) if had_table => (
                None,
                format!("version mismatch detected for {ns}: this node's routing table is older and its refresh failed: {why}"),
            ),
            Err(RefreshError::Failed(why)) => (
                None,
                format!("sharding status of collection {ns} is not currently available for filtering and needs to be recovered from the config server: {why}"),
            ),
        };
        NodeError::Stale(stale(ns, shard, &name, sent, wanted, &what))
    }

    /// The node's documents for the read (orphans dropped when `table` is given).
    pub(crate) fn serve(
        &self,
        node: NodeId,
        spec: &ReadSpec,
        table: Option<&Table>,
    ) -> Vec<Document> {
        let mut st = lock(&self.state);
        let shard = st.nodes[node].shard;
        let docs = st.shards[shard]
            .data
            .get(&spec.ns)
            .map(|c| {
                c.iter()
                    .filter(|(h, _)| table.is_none_or(|t| t.owner(*h) == Some(shard)))
                    .filter(|(_, d)| matches(d, &spec.filter))
                    .map(|(_, d)| d.clone())
                    .collect()
            })
            .unwrap_or_default();
        let c = &mut st.nodes[node].counters;
        c.query += 1;
        c.read_ops += 1;
        c.read_micros += 50;
        docs
    }

    /// Reloads a node's routing table for `ns`. A primary asks the config server (its write
    /// of `config.cache.*` is asynchronous, so a stalled primary refreshes too). A secondary
    /// asks its primary to flush the table (a write) and waits for that write to replicate:
    /// fast on a healthy primary, never on a stalled one, so it gives up after
    /// `refresh_timeout` or at the operation's deadline.
    async fn refresh(
        &self,
        node: NodeId,
        ns: &str,
        deadline: Option<Instant>,
    ) -> Result<ShardVersion, RefreshError> {
        let settings = self.settings();
        let (primary, shard, submitted) = {
            let mut st = lock(&self.state);
            let (primary, shard) = (st.nodes[node].primary, st.nodes[node].shard);
            let submitted = match (primary, st.shards[shard].stalled) {
                (false, true) => Some(submit(
                    &mut st,
                    shard,
                    WriteOp::Flush { ns: ns.to_string() },
                )),
                _ => None,
            };
            (primary, shard, submitted)
        };
        let limit = remaining(deadline).map_or(settings.refresh_timeout, |r| {
            r.min(settings.refresh_timeout)
        });
        let by_deadline = remaining(deadline).is_some_and(|r| r <= settings.refresh_timeout);
        let flushed = match submitted {
            _ if primary => true,
            None => {
                tokio::time::sleep(settings.flush_latency.min(limit)).await;
                settings.flush_latency <= limit
            }
            Some(Submitted::Done(_)) => true,
            Some(Submitted::Waiting(mut rx)) => {
                tokio::time::timeout(limit, rx.wait_for(Option::is_some))
                    .await
                    .is_ok_and(|r| r.is_ok())
            }
        };
        let why = format!(
            "Failed to refresh metadata for collection {ns} :: caused by :: MaxTimeMSExpired: \
             _flushRoutingTableCacheUpdates (forceRoutingTableRefresh) on the primary of {} did not complete within {} ms: \
             the primary has not written config.cache.chunks.{ns}",
            super::SHARDS[shard],
            limit.as_millis()
        );
        self.record_refresh(node, ns, flushed.then_some(()).ok_or(why.clone()))
            .ok_or(if by_deadline {
                RefreshError::Deadline
            } else {
                RefreshError::Failed(why)
            })
    }

    /// Installs the config server's table on success; logs the attempt either way.
    fn record_refresh(
        &self,
        node: NodeId,
        ns: &str,
        result: Result<(), String>,
    ) -> Option<ShardVersion> {
        let mut st = lock(&self.state);
        let table = st.config_table(ns);
        let n = &mut st.nodes[node];
        let log = n.refresh.entry(ns.to_string()).or_default();
        match (result, table) {
            (Ok(()), Some(t)) => {
                log.successes += 1;
                log.last_ok = Some(true);
                log.last_error = None;
                let v = t.shard_version(n.shard);
                n.tables.insert(ns.to_string(), t);
                Some(v)
            }
            (Err(why), _) => {
                tracing::info!(node = %n.name, ns, error = %why, "routing table refresh failed");
                log.failures += 1;
                log.last_ok = Some(false);
                log.last_error = Some(why);
                None
            }
            (Ok(()), None) => None,
        }
    }
}

enum RefreshError {
    /// The operation's own deadline passed first (mongos answers MaxTimeMSExpired).
    Deadline,
    /// The refresh failed (StaleConfig to mongos).
    Failed(String),
}

fn version_doc(v: &ShardVersion) -> Bson {
    Bson::Array(vec![
        Bson::Timestamp(Timestamp {
            time: v.version.major,
            increment: v.version.minor,
        }),
        Bson::ObjectId(v.epoch),
    ])
}

/// A StaleConfig (13388) as a shard sends it, with `StaleConfigInfo`'s fields.
fn stale(
    ns: &str,
    shard: ShardId,
    node: &str,
    received: &ShardVersion,
    wanted: Option<ShardVersion>,
    what: &str,
) -> SimError {
    let mut extra = doc! {
        "ns": ns,
        "vReceived": version_doc(received),
        "shardId": super::SHARDS[shard],
        "node": node,
    };
    if let Some(w) = wanted {
        extra.insert("vWanted", version_doc(&w));
    }
    SimError {
        code: 13388,
        code_name: "StaleConfig",
        message: format!(
            "stale config on {} ({node}) for {ns}, shard version received {received}: {what}",
            super::SHARDS[shard]
        ),
        extra: Some(Box::new(extra)),
    }
}

/// The error once retries are used up: the last StaleConfig, saying so.
fn give_up(last: Option<SimError>, ns: &str, attempts: u32) -> SimError {
    let mut e = last
        .unwrap_or_else(|| SimError::new(13388, "StaleConfig", format!("stale config for {ns}")));
    e.message = format!("{} (mongos gave up after {attempts} attempts)", e.message);
    e
}
