//! One attempt of a followed read, and the read as the judge sees it: the rung it is on
//! ([`Rung`]), the rungs still ahead and its budget ([`Attempt`], the state the session keeps
//! between transitions), and [`Read`] (an attempt with its timing and what the client asked
//! of the members, the input of `judge` and `evidence`).
//!
//! Below `judge`, `evidence` and `ladder`, which all read these values; pure data.

use tokio::time::Instant;

use super::decide::Bounded;
use super::table::NsPolicy;
use crate::rewrite::RewriteSpec;

/// One attempt of a read: the ladder's rungs, in the order a read climbs them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rung {
    /// The read as the client sent it (its `maxTimeMS` perhaps lowered to a share), or sent
    /// again unchanged after staleguard's own limit cut it and the cluster answered the
    /// question that raised.
    First,
    /// Sent with `$readPreference: {mode: "primary"}`, read concern untouched.
    Primary,
    /// Sent with `readConcern: {level: "available"}`.
    Available,
    /// A strict read sent under an open breaker's bound, sent once more under the same bound
    /// after its first attempt failed (mongos may pick another member: in a partial incident
    /// the healthy secondary answers it).
    Again,
}

impl Rung {
    /// The `rung` label of the ladder metric.
    pub fn as_str(self) -> &'static str {
        match self {
            Rung::First => "first",
            Rung::Primary => "primary",
            Rung::Available => "available",
            Rung::Again => "again",
        }
    }
}

/// The attempt a followed read is on: the state the session keeps between transitions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attempt {
    pub rung: Rung,
    /// The primary rung is still ahead.
    pub primary: bool,
    /// The `available` rung is still ahead.
    pub retry: bool,
    /// A sample of an open breaker (`bounded`: under its time bound).
    pub sample: bool,
    pub bounded: Option<Bounded>,
    /// Sent with a `maxTimeMS` staleguard wrote.
    pub limit_ours: bool,
    /// The read's whole budget (the next rung spends what this attempt leaves); `None`: no
    /// limit.
    pub budget_ms: Option<i64>,
    /// The cluster was asked already whether this read's time limit was its doing (the
    /// attempt is the unchanged resend that followed an answer): it is not asked twice.
    pub asked: bool,
}

impl Attempt {
    /// An attempt on `rung` with nothing ahead of it.
    pub(super) fn last(rung: Rung, budget_ms: Option<i64>, limit_ours: bool) -> Attempt {
        Attempt {
            rung,
            primary: false,
            retry: false,
            sample: false,
            bounded: None,
            limit_ours,
            budget_ms,
            asked: false,
        }
    }

    /// The read as the judge sees this attempt of it: `started` and `began` as the session
    /// timed them, `members` from its read preference.
    pub fn read(
        self,
        policy: &NsPolicy,
        started: Instant,
        began: Option<Instant>,
        members: Members,
    ) -> Read<'_> {
        Read {
            policy,
            started,
            began,
            max_time_ms: self.budget_ms,
            limit_ours: self.limit_ours,
            members,
            sample: self.sample,
            bounded: self.bounded,
            primary: self.primary,
            retry: self.retry,
            rung: self.rung,
            asked: self.asked,
        }
    }

    /// The same attempt sent as the bytes that arrived (its edit could not be made).
    pub fn unedited(self) -> Attempt {
        Attempt {
            limit_ours: false,
            ..self
        }
    }

    /// The attempt a resend to rung `to`, edited by `spec`, is followed as: the rungs up to
    /// `to` are behind it; `available` is still ahead only of a primary rung that had it
    /// ahead; a resend is never a sample, never bounded (but for the second attempt under
    /// the bound); the budget is the read's. A resend on the first rung (unchanged, after
    /// the cluster answered) keeps the rungs ahead and is not asked about again.
    pub fn climbed(self, to: Rung, spec: &RewriteSpec) -> Attempt {
        let first = to == Rung::First;
        Attempt {
            rung: to,
            primary: first && self.primary,
            retry: self.retry && (first || to == Rung::Primary),
            sample: false,
            bounded: if to == Rung::Again {
                self.bounded
            } else {
                None
            },
            limit_ours: spec.max_time_ms.is_some() && !first,
            budget_ms: self.budget_ms,
            asked: self.asked || first,
        }
    }
}

/// Which members may answer a read, from its read preference: what its success can say
/// about the secondaries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Members {
    /// Its `$readPreference` lists tag sets that pin it to some members.
    pub tagged: bool,
    /// Only a secondary can have answered it, or the primary only because no secondary was
    /// selectable at all: `secondary` (with or without tags), `secondaryPreferred` or
    /// `nearest` without tags or `maxStalenessSeconds`. False for `primaryPreferred`, and
    /// for a tag set or `maxStalenessSeconds` that can send a `secondaryPreferred` or
    /// `nearest` read to the primary while secondaries are up.
    pub secondary_answers: bool,
}

/// A followed read as the judge sees it.
#[derive(Debug, Clone, Copy)]
pub struct Read<'t> {
    pub policy: &'t NsPolicy,
    /// When mongos could start its first attempt (sent, or the earlier request on its
    /// connection answered): its budget runs from here, as a `maxTimeMS` runs from when the
    /// server starts the read.
    pub started: Instant,
    /// When mongos could start this attempt (no earlier request on its connection was
    /// waiting); `None`: not yet.
    pub began: Option<Instant>,
    /// The read's whole budget (the client's `maxTimeMS`, capped by `max_time`); the next
    /// rung spends what this attempt left of it. `None`: no limit.
    pub max_time_ms: Option<i64>,
    /// This attempt went out with a `maxTimeMS` staleguard wrote (a cap, the first
    /// attempt's share, an open breaker's bound).
    pub limit_ours: bool,
    pub members: Members,
    /// Admitted while the breaker was open: a sample (`bounded`: sent under the open
    /// breaker's time bound).
    pub sample: bool,
    pub bounded: Option<Bounded>,
    /// The primary rung is still ahead: a trigger error sends the read to the primary.
    pub primary: bool,
    /// The `available` rung is still ahead (fallback).
    pub retry: bool,
    /// Which attempt this is.
    pub rung: Rung,
    /// The cluster was asked already (see [`Attempt::asked`]).
    pub asked: bool,
}
