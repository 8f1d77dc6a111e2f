//! Read preference: parsing `$readPreference` as mongos does, and choosing the node of a
//! shard that serves a read (randomly among the eligible ones, seeded).

use bson::{Bson, Document};
use tokio::time::Instant;

use super::model::{lock, NodeId, State};
use super::read::remaining;
use super::routing::ShardId;
use super::{Cluster, SimError};

/// `$readPreference.mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Primary,
    PrimaryPreferred,
    Secondary,
    SecondaryPreferred,
    Nearest,
}

#[derive(Debug, Clone)]
pub struct ReadPref {
    pub mode: Mode,
    /// Tag sets in order; empty = any node.
    pub tags: Vec<Document>,
}

impl ReadPref {
    pub fn primary() -> ReadPref {
        ReadPref {
            mode: Mode::Primary,
            tags: Vec::new(),
        }
    }

    /// From a command body's `$readPreference` (absent = primary, as drivers omit it).
    pub fn from_body(body: &Document) -> Result<ReadPref, SimError> {
        let Ok(rp) = body.get_document("$readPreference") else {
            return Ok(ReadPref::primary());
        };
        let mode = match rp.get_str("mode") {
            Ok("primary") => Mode::Primary,
            Ok("primaryPreferred") => Mode::PrimaryPreferred,
            Ok("secondary") => Mode::Secondary,
            Ok("secondaryPreferred") => Mode::SecondaryPreferred,
            Ok("nearest") => Mode::Nearest,
            other => {
                return Err(SimError::bad_value(format!(
                    "Could not parse $readPreference mode '{}'. Only the modes 'primary', 'primaryPreferred', 'secondary', 'secondaryPreferred', and 'nearest' are supported.",
                    other.unwrap_or_default()
                )))
            }
        };
        // Only `tags` is read, as mongos does; an unknown field such as `tagSets` is ignored.
        let tags = match rp.get_array("tags") {
            Ok(sets) => sets
                .iter()
                .map(|s| match s {
                    Bson::Document(d) => Ok(d.clone()),
                    _ => Err(SimError::failed_to_parse("tag sets must be documents")),
                })
                .collect::<Result<Vec<_>, _>>()?,
            Err(_) => Vec::new(),
        };
        // `[{}]` is the wildcard, the same as no tags.
        let tags = if tags.iter().all(Document::is_empty) {
            Vec::new()
        } else {
            tags
        };
        if mode == Mode::Primary && !tags.is_empty() {
            return Err(SimError::bad_value(
                "Only empty tags are allowed with primary read preference",
            ));
        }
        Ok(ReadPref { mode, tags })
    }
}

impl Cluster {
    /// Picks a node of `shard` for `pref`, randomly among the eligible ones. With none
    /// eligible, waits like mongos's host targeting and fails with 133.
    pub(crate) async fn select_node(
        &self,
        shard: ShardId,
        pref: &ReadPref,
        deadline: Option<Instant>,
    ) -> Result<NodeId, SimError> {
        {
            let mut st = lock(&self.state);
            let eligible = eligible_nodes(&st, shard, pref);
            if !eligible.is_empty() {
                let pick = st.rng.below(eligible.len());
                return Ok(eligible[pick]);
            }
        }
        let wait = self.settings().find_host_timeout;
        let cut = remaining(deadline).is_some_and(|r| r < wait);
        tokio::time::sleep(remaining(deadline).map_or(wait, |r| r.min(wait))).await;
        if cut {
            return Err(SimError::max_time());
        }
        let name = lock(&self.state).shards[shard].name;
        Err(SimError::new(
            133,
            "FailedToSatisfyReadPreference",
            format!("Could not find host matching read preference {{ mode: \"{:?}\", tags: {:?} }} for set {name}", pref.mode, pref.tags),
        ))
    }
}

/// Nodes of `shard` that `pref` allows, preferring the first tag set that matches any.
fn eligible_nodes(st: &State, shard: ShardId, pref: &ReadPref) -> Vec<NodeId> {
    let members: Vec<NodeId> = (0..st.nodes.len())
        .filter(|&i| st.nodes[i].shard == shard)
        .collect();
    let primary: Vec<NodeId> = members
        .iter()
        .copied()
        .filter(|&i| st.nodes[i].primary)
        .collect();
    let tagged = |pool: Vec<NodeId>| -> Vec<NodeId> {
        if pref.tags.is_empty() {
            return pool;
        }
        pref.tags
            .iter()
            .map(|set| {
                pool.iter()
                    .copied()
                    .filter(|&i| tags_match(&st.nodes[i].name, set))
                    .collect::<Vec<_>>()
            })
            .find(|m| !m.is_empty())
            .unwrap_or_default()
    };
    let secondaries = || {
        members
            .iter()
            .copied()
            .filter(|&i| !st.nodes[i].primary)
            .collect::<Vec<_>>()
    };
    match pref.mode {
        Mode::Primary | Mode::PrimaryPreferred => primary,
        Mode::Secondary => tagged(secondaries()),
        Mode::SecondaryPreferred => {
            let s = tagged(secondaries());
            if s.is_empty() {
                primary
            } else {
                s
            }
        }
        Mode::Nearest => tagged(members.clone()),
    }
}

/// A node is tagged `{node: "<name>"}`; a tag set matches when every pair matches.
fn tags_match(name: &str, set: &Document) -> bool {
    set.iter()
        .all(|(k, v)| k == "node" && v.as_str() == Some(name))
}
