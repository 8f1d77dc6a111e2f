//! A shard primary's write path, which is where a stall bites: applying writes (insert,
//! update, delete, the routing-table flush, the range deleter), write tickets, the stall
//! itself and the resume that completes what waited.

use bson::{Bson, Document};
use tokio::sync::watch;
use tokio::time::Instant;

use super::model::{Pending, State};
use super::query::{check_filter, matches};
use super::routing::ShardId;
use super::store::DuplicateKey;
use super::update::{apply as apply_update, check_update, upsert_document};
use super::SimError;

/// What a write costs on a healthy primary, for `opLatencies` (the model has no disk).
const HEALTHY_WRITE_MICROS: u64 = 150;

#[derive(Debug, Clone)]
pub struct UpdateStmt {
    pub q: Document,
    pub u: Document,
    pub upsert: bool,
    pub multi: bool,
}

#[derive(Debug, Clone)]
pub struct DeleteStmt {
    pub q: Document,
    /// 0 = every match, 1 = the first.
    pub limit: usize,
}

/// One shard's part of a write, or an internal write.
#[derive(Debug, Clone)]
pub enum WriteOp {
    Insert {
        ns: String,
        docs: Vec<(usize, Document)>,
        ordered: bool,
    },
    Update {
        ns: String,
        stmts: Vec<(usize, UpdateStmt)>,
        ordered: bool,
    },
    Delete {
        ns: String,
        stmts: Vec<(usize, DeleteStmt)>,
        ordered: bool,
    },
    /// `_flushRoutingTableCacheUpdates`: the primary persists its table to `config.cache.*`.
    Flush { ns: String },
    /// The range deleter removing a migrated chunk's orphans from the donor.
    RangeDelete { ns: String, min: i128, max: i128 },
}

impl WriteOp {
    fn is_client(&self) -> bool {
        !matches!(self, WriteOp::Flush { .. } | WriteOp::RangeDelete { .. })
    }
}

#[derive(Debug, Clone, Default)]
pub struct Outcome {
    pub n: i64,
    pub modified: i64,
    pub upserted: Vec<(usize, Bson)>,
    pub errors: Vec<StmtError>,
}

#[derive(Debug, Clone)]
pub struct StmtError {
    pub index: usize,
    pub code: i32,
    pub message: String,
}

impl State {
    /// Applies a write on `shard`'s primary now, counting it with `micros` of latency.
    pub fn apply(&mut self, shard: ShardId, op: &WriteOp, micros: u64) -> Outcome {
        let out = match op {
            WriteOp::Insert { ns, docs, ordered } => self.insert(shard, ns, docs, *ordered),
            WriteOp::Update { ns, stmts, ordered } => self.update(shard, ns, stmts, *ordered),
            WriteOp::Delete { ns, stmts, ordered } => self.delete(shard, ns, stmts, *ordered),
            WriteOp::Flush { .. } => Outcome::default(),
            WriteOp::RangeDelete { ns, min, max } => self.range_delete(shard, ns, *min, *max),
        };
        let optime = self.clock.tick();
        self.shards[shard].optime = optime;
        let primary = self.shards[shard].primary(shard);
        let c = &mut self.nodes[primary].counters;
        match op {
            WriteOp::Insert { .. } => c.insert += out.n as u64,
            WriteOp::Update { stmts, .. } => c.update += stmts.len() as u64,
            WriteOp::Delete { stmts, .. } => c.delete += stmts.len() as u64,
            _ => {}
        }
        if op.is_client() {
            c.write_ops += 1;
            c.write_micros += micros;
        }
        out
    }

    fn insert(
        &mut self,
        shard: ShardId,
        ns: &str,
        docs: &[(usize, Document)],
        ordered: bool,
    ) -> Outcome {
        let mut out = Outcome::default();
        let coll = self.coll(shard, ns);
        for (index, doc) in docs {
            match coll.insert(doc.clone()) {
                Ok(()) => out.n += 1,
                Err(DuplicateKey(id)) => {
                    out.errors.push(StmtError {
                        index: *index,
                        code: 11000,
                        message: format!(
                            "E11000 duplicate key error collection: {ns} index: _id_ dup key: {{ _id: {id} }}"
                        ),
                    });
                    if ordered {
                        break;
                    }
                }
            }
        }
        out
    }

    fn update(
        &mut self,
        shard: ShardId,
        ns: &str,
        stmts: &[(usize, UpdateStmt)],
        ordered: bool,
    ) -> Outcome {
        let mut out = Outcome::default();
        for (index, s) in stmts {
            if let Err(e) = self.update_one_stmt(shard, ns, *index, s, &mut out) {
                out.errors.push(StmtError {
                    index: *index,
                    code: e.code,
                    message: e.message,
                });
                if ordered {
                    break;
                }
            }
        }
        out
    }

    fn update_one_stmt(
        &mut self,
        shard: ShardId,
        ns: &str,
        index: usize,
        s: &UpdateStmt,
        out: &mut Outcome,
    ) -> Result<(), SimError> {
        check_filter(&s.q)?;
        check_update(&s.u)?;
        let coll = self.coll(shard, ns);
        let (mut hit, mut changed, mut failed) = (0, 0, None);
        coll.for_each_mut(|_, d| {
            if !matches(d, &s.q) {
                return true;
            }
            let before = d.clone();
            if let Err(e) = apply_update(d, &s.u, false) {
                failed = Some(e);
                return false;
            }
            hit += 1;
            changed += i64::from(*d != before);
            s.multi
        });
        if let Some(e) = failed {
            return Err(e);
        }
        if hit == 0 && s.upsert {
            let doc = upsert_document(&s.q, &s.u)?;
            let id = doc.get("_id").cloned().unwrap_or(Bson::Null);
            coll.insert(doc).map_err(|DuplicateKey(id)| {
                SimError::new(11000, "DuplicateKey", format!("E11000 duplicate key error collection: {ns} index: _id_ dup key: {{ _id: {id} }}"))
            })?;
            out.upserted.push((index, id));
            out.n += 1;
        }
        out.n += hit;
        out.modified += changed;
        Ok(())
    }

    fn delete(
        &mut self,
        shard: ShardId,
        ns: &str,
        stmts: &[(usize, DeleteStmt)],
        ordered: bool,
    ) -> Outcome {
        let mut out = Outcome::default();
        let coll = self.coll(shard, ns);
        for (index, s) in stmts {
            if let Err(e) = check_filter(&s.q) {
                out.errors.push(StmtError {
                    index: *index,
                    code: e.code,
                    message: e.message,
                });
                if ordered {
                    break;
                }
                continue;
            }
            out.n += coll.remove_where(s.limit, |d| matches(d, &s.q)) as i64;
        }
        out
    }

    /// Deletes `[min, max)` unless the shard owns that range again (migrated back).
    fn range_delete(&mut self, shard: ShardId, ns: &str, min: i128, max: i128) -> Outcome {
        let owns_again = self.config.get(ns).is_some_and(|t| {
            t.chunks
                .iter()
                .any(|c| c.shard == shard && c.min < max && min < c.max)
        });
        if owns_again {
            return Outcome::default();
        }
        let n = self.coll(shard, ns).remove_range(min, max) as i64;
        Outcome {
            n,
            ..Outcome::default()
        }
    }
}

/// What submitting a write gave: done at once, or waiting on a stalled primary.
pub enum Submitted {
    Done(Outcome),
    Waiting(watch::Receiver<Option<Outcome>>),
}

impl Submitted {
    /// The outcome, once there is one; `None` if the cluster shut down first.
    pub async fn outcome(self) -> Option<Outcome> {
        match self {
            Submitted::Done(o) => Some(o),
            Submitted::Waiting(mut rx) => {
                let done = rx.wait_for(Option::is_some).await.ok()?;
                done.clone()
            }
        }
    }
}

/// Submits a write to `shard`'s primary: applied now if it is healthy; otherwise it takes a
/// ticket (or queues for one) and waits for `resumePrimary`. `maxTimeMS` cannot cut it
/// short: an operation stuck in the storage engine does not check for interrupts.
pub fn submit(state: &mut State, shard: ShardId, op: WriteOp) -> Submitted {
    if !state.shards[shard].stalled {
        return Submitted::Done(state.apply(shard, &op, HEALTHY_WRITE_MICROS));
    }
    let s = &mut state.shards[shard];
    if let WriteOp::Flush { ns } = &op {
        if let Some(rx) = s.flushes.get(ns) {
            return Submitted::Waiting(rx.clone());
        }
    }
    let (done, rx) = watch::channel(None);
    if let WriteOp::Flush { ns } = &op {
        s.flushes.insert(ns.clone(), rx.clone());
    }
    s.pending.push_back(Pending {
        op,
        done,
        since: Instant::now(),
    });
    Submitted::Waiting(rx)
}

/// Ends a stall: every waiting write completes, in arrival order. Returns how many.
pub fn resume(state: &mut State, shard: ShardId) -> usize {
    state.shards[shard].stalled = false;
    state.shards[shard].flushes.clear();
    let pending = std::mem::take(&mut state.shards[shard].pending);
    let n = pending.len();
    for p in pending {
        let micros = p.since.elapsed().as_micros() as u64;
        let out = state.apply(shard, &p.op, micros);
        p.done.send_replace(Some(out));
    }
    n
}
