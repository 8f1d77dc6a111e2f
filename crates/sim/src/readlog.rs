//! The read log (off unless `SimConfig::read_log` is above zero): for each read command
//! (`find`, `aggregate`, `count`, `distinct`) that carries a string `comment`, what reached
//! mongos and what became of it: the read concern and read preference as sent, the members
//! that served it and the outcome. A test that tags its reads with comments sees, from the
//! cluster's side, what a proxy in front did with each of them (sent as is, rewritten to
//! `available`, climbed to the primary, sent twice). Bounded: the oldest records go first.

use std::collections::VecDeque;

use bson::{Bson, Document};
use tokio::time::Instant;

use super::model::{lock, NodeId};
use super::request::Request;
use super::{Cluster, SimError};

/// A member that answered its part of a read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub node: String,
    pub primary: bool,
}

/// One read as mongos received and answered it.
#[derive(Debug, Clone)]
pub struct ReadRecord {
    pub comment: String,
    pub command: String,
    /// `db.coll` as named (a view's own name).
    pub ns: String,
    /// `readConcern.level` as sent (`None`: absent, the server's default).
    pub read_concern: Option<String>,
    /// `$readPreference.mode` as sent (`primary` when absent).
    pub mode: String,
    /// Whether `$readPreference.tags` held a tag set other than `{}`.
    pub tags: bool,
    /// `maxTimeMS` as sent, if a number.
    pub max_time_ms: Option<f64>,
    /// The members whose answers made the reply (empty when it failed).
    pub members: Vec<Member>,
    /// The error code of the reply; `None` for `ok: 1`.
    pub code: Option<i32>,
    pub started: Instant,
    pub finished: Instant,
}

/// The log itself.
#[derive(Debug, Default)]
pub struct ReadLog {
    capacity: usize,
    records: VecDeque<ReadRecord>,
}

impl ReadLog {
    pub fn new(capacity: usize) -> ReadLog {
        ReadLog {
            capacity,
            records: VecDeque::new(),
        }
    }
}

impl Cluster {
    /// Records `req`, read on `db`, if it carries a string `comment` and the log is on.
    pub(crate) fn log_read(
        &self,
        req: &Request,
        db: &str,
        started: Instant,
        served: &[NodeId],
        result: &Result<Document, SimError>,
    ) {
        let Ok(comment) = req.body.get_str("comment") else {
            return;
        };
        if lock(&self.read_log).capacity == 0 {
            return;
        }
        let body = &req.body;
        let coll = match body.iter().next() {
            Some((_, Bson::String(c))) => c.clone(),
            _ => String::new(),
        };
        let pref = body.get_document("$readPreference").ok();
        let members = {
            let st = lock(&self.state);
            served
                .iter()
                .map(|&i| Member {
                    node: st.nodes[i].name.clone(),
                    primary: st.nodes[i].primary,
                })
                .collect()
        };
        let record = ReadRecord {
            comment: comment.to_string(),
            command: req.name().to_string(),
            ns: format!("{db}.{coll}"),
            read_concern: body
                .get_document("readConcern")
                .ok()
                .and_then(|rc| rc.get_str("level").ok())
                .map(str::to_string),
            mode: pref
                .and_then(|p| p.get_str("mode").ok())
                .unwrap_or("primary")
                .to_string(),
            tags: pref
                .and_then(|p| p.get_array("tags").ok())
                .is_some_and(|sets| {
                    sets.iter()
                        .any(|s| !matches!(s, Bson::Document(d) if d.is_empty()))
                }),
            max_time_ms: body.get("maxTimeMS").and_then(super::routing::number),
            members,
            code: result.as_ref().err().map(|e| e.code),
            started,
            finished: Instant::now(),
        };
        let mut log = lock(&self.read_log);
        if log.records.len() >= log.capacity {
            log.records.pop_front();
        }
        log.records.push_back(record);
    }

    /// Takes every record logged so far, oldest first.
    pub fn take_read_log(&self) -> Vec<ReadRecord> {
        lock(&self.read_log).records.drain(..).collect()
    }
}
