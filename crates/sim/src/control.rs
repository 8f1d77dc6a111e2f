//! Faults and status: `Cluster` methods (stall/resume a primary, restart a node, migrate a
//! chunk, configure, status) and the `{simControl: ...}` command that exposes them on
//! mongos's `admin` database.

use std::time::Duration;

use bson::Bson;
use tokio_util::sync::CancellationToken;

use super::engine::{resume, submit, WriteOp};
use super::model::{lock, Settings};
use super::report::ClusterStatus;
use super::routing::{hash_value, Chunk, Version};
use super::{Cluster, SimError, SHARDS};

/// What a chunk migration did.
#[derive(Debug, Clone)]
pub struct MoveReport {
    pub ns: String,
    pub from: String,
    pub to: String,
    pub min: Bson,
    pub max: Bson,
    /// The new collection version.
    pub version: (u32, u32),
    /// Documents copied to the recipient (orphans on the donor until the range deleter runs).
    pub moved_docs: usize,
    pub delete_after: Duration,
}

fn pair(v: Version) -> (u32, u32) {
    (v.major, v.minor)
}

impl Cluster {
    /// The runtime-adjustable settings.
    pub fn settings(&self) -> Settings {
        lock(&self.settings).clone()
    }

    /// Replaces the runtime-adjustable settings.
    pub fn configure(&self, settings: Settings) {
        *lock(&self.settings) = settings;
    }

    fn shard_named(&self, shard: &str) -> Result<usize, SimError> {
        lock(&self.state).shard_id(shard).ok_or_else(|| {
            SimError::new(
                70,
                "ShardNotFound",
                format!("shard {shard} not found (shards: {})", SHARDS.join(", ")),
            )
        })
    }

    /// From now on no write completes on `shard`'s primary; it still answers hello and
    /// reads, and holds a write ticket per stuck write.
    pub fn stall_primary(&self, shard: &str) -> Result<(), SimError> {
        let id = self.shard_named(shard)?;
        lock(&self.state).shards[id].stalled = true;
        tracing::info!(shard, "sim: primary stalled");
        Ok(())
    }

    /// Ends the stall: waiting writes complete in arrival order. Returns how many.
    pub fn resume_primary(&self, shard: &str) -> Result<usize, SimError> {
        let id = self.shard_named(shard)?;
        let n = resume(&mut lock(&self.state), id);
        tracing::info!(shard, completed = n, "sim: primary resumed");
        Ok(n)
    }

    /// Restarts a node: every routing table it held is gone (UNKNOWN), its connections
    /// close, it gets a new processId. Returns the collections whose tables it lost.
    pub fn restart_node(&self, node: &str) -> Result<Vec<String>, SimError> {
        let mut st = lock(&self.state);
        let id = st
            .node_id(node)
            .ok_or_else(|| SimError::bad_value(format!("no node named {node}")))?;
        let shard = st.nodes[id].shard;
        if st.nodes[id].primary && st.shards[shard].stalled {
            return Err(SimError::illegal(format!(
                "restarting the stalled primary of {} would cause an election, which the simulator does not model; use resumePrimary",
                st.shards[shard].name
            )));
        }
        let n = &mut st.nodes[id];
        let mut lost: Vec<String> = n.tables.drain().map(|(ns, _)| ns).collect();
        lost.sort();
        n.incarnation.cancel();
        n.incarnation = self.stop.child_token();
        n.process_id = bson::oid::ObjectId::new();
        n.started = tokio::time::Instant::now();
        n.restarts += 1;
        n.counters = Default::default();
        tracing::info!(node, lost = ?lost, "sim: node restarted");
        Ok(lost)
    }

    /// Migrates the chunk holding `_id: id` to shard `to`: copies its documents, commits
    /// the new owner (major version bump), the two primaries load the new table, mongos
    /// refreshes; the donor deletes the orphans after `delete_after` (default from settings).
    /// Secondaries keep their tables and find them stale on their next versioned read.
    pub fn move_chunk(
        &self,
        ns: &str,
        id: &Bson,
        to: &str,
        delete_after: Option<Duration>,
    ) -> Result<MoveReport, SimError> {
        let runtime = tokio::runtime::Handle::try_current()
            .map_err(|_| SimError::illegal("move_chunk must run inside the tokio runtime"))?;
        let delay = delete_after.unwrap_or(self.settings().default_delete_after);
        let to_id = self.shard_named(to)?;
        let mut st = lock(&self.state);
        let table = st
            .config_table(ns)
            .ok_or_else(|| SimError::new(61, "ShardKeyNotFound", format!("{ns} is not sharded")))?;
        let hash = hash_value(id);
        let (next, old) = table
            .migrate(hash, to_id)
            .ok_or_else(|| SimError::bad_value("no chunk holds that _id"))?;
        if old.shard == to_id {
            return Err(SimError::illegal(format!(
                "the chunk is already on shard {to}"
            )));
        }
        if st.shards[old.shard].stalled || st.shards[to_id].stalled {
            return Err(SimError::illegal("a migration needs writes on both primaries and one of them is stalled; the simulator refuses instead of hanging"));
        }
        let next = std::sync::Arc::new(next);
        let moved = st.commit_migration(ns, &old, to_id, next.clone());
        drop(st);
        self.schedule_range_deletion(&runtime, ns, &old, delay);
        tracing::info!(ns, from = SHARDS[old.shard], to, moved, version = %next.version(), "sim: chunk migrated");
        Ok(MoveReport {
            ns: ns.to_string(),
            from: SHARDS[old.shard].to_string(),
            to: to.to_string(),
            min: Chunk::bound(old.min),
            max: Chunk::bound(old.max),
            version: pair(next.version()),
            moved_docs: moved,
            delete_after: delay,
        })
    }

    /// The donor's range deleter: after `delay`, one write on the donor's primary (so it
    /// waits if that primary is stalled by then).
    fn schedule_range_deletion(
        &self,
        rt: &tokio::runtime::Handle,
        ns: &str,
        old: &Chunk,
        delay: Duration,
    ) {
        let (state, stop): (_, CancellationToken) = (self.state.clone(), self.stop.clone());
        let op = WriteOp::RangeDelete {
            ns: ns.to_string(),
            min: old.min,
            max: old.max,
        };
        let donor = old.shard;
        let task = self.tasks.track_future(async move {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(delay) => {}
            }
            let submitted = submit(&mut lock(&state), donor, op);
            tokio::select! {
                _ = stop.cancelled() => {}
                o = submitted.outcome() => tracing::info!(donor = SHARDS[donor], deleted = o.map_or(0, |o| o.n), "sim: orphans deleted"),
            }
        });
        rt.spawn(task);
    }

    /// A snapshot of every node's tables, the shards' tickets and orphans, the chunks.
    pub fn status(&self) -> ClusterStatus {
        super::report::build(&lock(&self.state))
    }
}
