//! What the session follows in flight: the tracked reads waiting for their reply (each on
//! an attempt of its ladder, `policy::Attempt`), the confirming read, the writes the
//! write-stall watch follows, and this connection's share of its upstream's ladder guard.
//! Bounded: at most `max_pending_reads` tracked reads, one confirming read.

use std::borrow::Cow;
use std::sync::Arc;

use tokio::time::Instant;

use super::confirm::Confirm;
use crate::command::ReadPrefMode;
use crate::config::LadderGuardConfig;
use crate::policy::{self, Attempt, NsPolicy, Rung};
use crate::stall::WriteTracker;
use crate::upstream::{ConnLadder, Denied, LadderGuard, LadderPermit};
use crate::wire::dupids::IdSet;
use crate::wire::Request;

/// Documents of one `available` reply looked at for duplicate `_id`s (a sample: the
/// estimate is a lower bound; the scratch set stays below 64 KiB per connection).
pub(super) const ORPHAN_SCAN_CAP: usize = 4096;

/// A read whose reply the session inspects.
#[derive(Debug)]
pub(super) struct Tracked {
    pub(super) request_id: i32,
    /// Shared with the session's last tracked namespace: no allocation per read.
    pub(super) ns: Arc<str>,
    /// Borrowed from the metrics' command list when there (every read command is).
    pub(super) command: Cow<'static, str>,
    pub(super) policy: Arc<NsPolicy>,
    /// The client's request as opened on arrival (a retry is rewritten from it, with no
    /// second header read or decompression).
    pub(super) original: Request,
    /// When mongos could start its first attempt: the read's budget runs from here.
    pub(super) started: Instant,
    /// When mongos could start it (nothing sent before it was still waiting); `None`: not
    /// yet.
    pub(super) began: Option<Instant>,
    /// The attempt in flight: its rung, the rungs ahead, its budget (`policy::Attempt`).
    pub(super) attempt: Attempt,
    /// The read lists tag sets.
    pub(super) tagged: bool,
    /// Its read preference mode (a confirming read uses the same, without tags).
    pub(super) pref: Option<ReadPrefMode>,
    /// The upstream's ladder slot, held while the primary rung is in flight.
    pub(super) permit: Option<LadderPermit>,
    /// Its place among the requests sent upstream that expect a final reply (`Peers`).
    pub(super) seq: u64,
    /// A repeated `_id` in its result can only be an orphan (`CommandInfo::unique_ids`).
    pub(super) unique_ids: bool,
    /// A dry run's read: a rung it would climb is counted, not climbed.
    pub(super) dry: bool,
}

impl Tracked {
    /// The read as `policy::judge` sees it.
    pub(super) fn read(&self) -> policy::Read<'_> {
        self.attempt
            .read(&self.policy, self.started, self.began, self.tagged)
    }
}

#[derive(Debug, Default)]
pub(super) struct Reads {
    /// Tracked reads waiting for their reply.
    pending: Vec<Tracked>,
    /// The confirming read in flight, if any (at most one per connection).
    pub(super) confirm: Option<Confirm>,
    /// Writes sent and not answered yet (write-stall watch).
    pub(super) writes: WriteTracker,
    /// The namespace of the last tracked read, shared by the tracked reads on it.
    last_ns: Option<Arc<str>>,
    /// Scratch space for the orphan estimate on `available` replies.
    ids: IdSet,
    /// The upstream's guard on primary-rung reads (`[ladder_guard]`), once paired.
    ladder: Option<Arc<LadderGuard>>,
    /// This connection's share of it (`per_connection_per_second`).
    ladder_share: ConnLadder,
}

impl Reads {
    /// The session is paired with an upstream whose ladder guard is `guard`.
    pub(super) fn paired(&mut self, guard: Arc<LadderGuard>) {
        self.ladder = Some(guard);
    }

    /// Nothing is followed: a reply is the client's, as it came.
    pub(super) fn none(&self) -> bool {
        self.pending.is_empty() && self.writes.is_empty() && self.confirm.is_none()
    }

    pub(super) fn no_tracked(&self) -> bool {
        self.pending.is_empty()
    }

    /// `request_id` is that of a followed read or write still waiting for its reply.
    /// Scans only while something is followed.
    pub(super) fn reuses(&self, request_id: i32) -> bool {
        (!self.pending.is_empty() && self.pending.iter().any(|t| t.request_id == request_id))
            || (!self.writes.is_empty() && self.writes.contains(request_id))
    }

    /// The tracked reads that are samples of an open breaker.
    pub(super) fn samples(&self) -> impl Iterator<Item = &Tracked> {
        self.pending.iter().filter(|t| t.attempt.sample)
    }

    /// `max` reads are tracked already (`max_pending_reads`).
    pub(super) fn full(&self, max: usize) -> bool {
        self.pending.len() >= max
    }

    pub(super) fn track(&mut self, t: Tracked) {
        self.pending.push(t);
    }

    /// `ns` as the tracked reads keep it: the previous read's `Arc` when it was on the same
    /// namespace (the common case), a new one otherwise.
    pub(super) fn ns(&mut self, ns: &str) -> Arc<str> {
        match &self.last_ns {
            Some(last) if **last == *ns => last.clone(),
            _ => {
                let fresh: Arc<str> = Arc::from(ns);
                self.last_ns = Some(fresh.clone());
                fresh
            }
        }
    }

    /// A tracked read answered by `response_to` at place `seq` (both must match: a reply to
    /// another request that reused its id never stands for it).
    pub(super) fn answered(&mut self, response_to: i32, seq: u64) -> Option<Tracked> {
        let i = self
            .pending
            .iter()
            .position(|t| t.request_id == response_to && t.seq == seq)?;
        Some(self.pending.swap_remove(i))
    }

    /// A reply to `response_to` may answer a tracked read.
    pub(super) fn may_answer(&self, response_to: i32) -> bool {
        self.pending.iter().any(|t| t.request_id == response_to)
    }

    /// Request `next` may start now at mongos: a tracked read waiting for that turn begins
    /// (a first attempt's budget, like its `maxTimeMS`, runs from then).
    pub(super) fn began(&mut self, next: u64) {
        let now = Instant::now();
        for t in self.pending.iter_mut().filter(|t| t.began.is_none()) {
            if t.seq == next {
                t.began = Some(now);
                if t.attempt.rung == Rung::First {
                    t.started = now;
                }
            }
        }
    }

    /// The tracked reads whose turn for a reply has passed (`finals_in` final replies came,
    /// under other `responseTo`s): taken out, since nothing can be judged of them.
    pub(super) fn passed(&mut self, finals_in: u64) -> Vec<Tracked> {
        if self.pending.iter().all(|t| t.seq > finals_in) {
            return Vec::new();
        }
        let (gone, kept) = std::mem::take(&mut self.pending)
            .into_iter()
            .partition(|t| t.seq <= finals_in);
        self.pending = kept;
        gone
    }

    /// Every tracked read, taken out (the session ends).
    pub(super) fn take_all(&mut self) -> Vec<Tracked> {
        std::mem::take(&mut self.pending)
    }

    /// A slot of the upstream's guard for one primary-rung read about to be sent, within
    /// this connection's share (`upstream::ConnLadder`: only when mongos starts it at once,
    /// `queued` false). `None`: not paired; `Some(Err)`: refused, with the connection's
    /// slots held.
    pub(super) fn claim_ladder(
        &mut self,
        limits: LadderGuardConfig,
        queued: bool,
    ) -> Option<Result<LadderPermit, (Denied, usize)>> {
        let guard = self.ladder.as_ref()?;
        let held = self.pending.iter().filter(|t| t.permit.is_some()).count();
        let claimed = self
            .ladder_share
            .try_acquire(guard, limits, held, queued, Instant::now());
        Some(claimed.map_err(|denied| (denied, held)))
    }

    /// Runs the orphan scan `f` over the session's scratch set, which is let go of after an
    /// unusually large reply.
    pub(super) fn scan<R>(&mut self, f: impl FnOnce(&mut IdSet) -> R) -> R {
        let r = f(&mut self.ids);
        if self.ids.capacity() > ORPHAN_SCAN_CAP {
            self.ids = IdSet::default();
        }
        r
    }

    /// Lets go of the room a burst of pipelined reads or writes left once they are empty
    /// (looked at on the limits tick, not per message).
    pub(super) fn shrink_idle(&mut self) {
        if self.pending.is_empty() && self.pending.capacity() > 16 {
            self.pending = Vec::new();
        }
        self.writes.shrink_idle();
    }
}
