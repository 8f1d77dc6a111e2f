//! What the session follows in flight: the reads waiting for their reply (each a
//! [`Followed`]), the reads waiting for the cluster's answer to a question about them, the
//! writes the write-stall watch follows, this connection's share of its upstream's ladder
//! guard, and whether the connection has proved itself to the cluster ([`Proof`]).
//! Bounded: at most `max_pending_reads` followed reads (waiting or asking).

use std::sync::Arc;

use bytes::Bytes;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::followed::{Followed, Spare};
use crate::config::LadderGuardConfig;
use crate::confirm::Answer;
use crate::stall::WriteTracker;
use crate::upstream::{ConnLadder, Denied, LadderGuard, LadderPermit};
use crate::wire::dupids::IdSet;

/// Documents of one `available` reply looked at for duplicate `_id`s (a sample: the
/// estimate is a lower bound; the scratch set holds at most 64 KiB per connection, 8,192
/// slots of 8 bytes, and only 4 KiB between replies).
pub(super) const ORPHAN_SCAN_CAP: usize = crate::wire::dupids::ORPHAN_SCAN_CAP;

/// A read waiting for the cluster's answer to a question its time limit raised, with the
/// reply that raised it (what the client gets if nothing follows).
#[derive(Debug)]
pub(super) struct Parked {
    pub(super) read: Followed,
    pub(super) reply: Bytes,
    /// The token its answer comes back with.
    pub(super) token: u64,
    /// When it was parked: an answer that never comes is given up after [`ANSWER_WAIT`]
    /// past the namespace's `confirm_time`.
    since: Instant,
}

/// How long past `confirm_time` a parked read waits for its answer before it is settled as
/// unanswered (the confirming task answers every question; this only bounds a lost one).
pub(super) const ANSWER_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// Whether a connection has proved itself to the cluster: only then does what its reads
/// meet count for a breaker (`breaker::Witness`). It has when mongos accepted its
/// authentication (a SCRAM or x509 conversation that ended with `ok: 1`, or speculative
/// authentication accepted in the handshake), or ran one of its reads: answered it
/// `ok: 1`, or failed it with an error only a read that runs can meet (stale routing, a
/// time limit, no member to run it on). mongos checks a command's authorization before it
/// runs it, so none of these reaches a client the cluster did not let read; Unauthorized
/// and other refusals prove nothing.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct Proof {
    proven: bool,
}

impl Proof {
    pub(super) fn proven(self) -> bool {
        self.proven
    }

    pub(super) fn prove(&mut self) {
        self.proven = true;
    }
}

#[derive(Debug, Default)]
pub(super) struct Reads {
    /// Followed reads waiting for their reply.
    pending: Vec<Followed>,
    /// The box of the last followed read that ended, for the next (let go of by `trim`).
    pub(super) spare: Option<Spare>,
    /// Followed reads waiting for the cluster's answer to a question.
    parked: Vec<Parked>,
    /// Where the answers come back, once a question was asked (made on first need). As
    /// many answers can wait as reads are parked, at most `max_pending_reads`.
    answers: Option<(
        mpsc::UnboundedSender<Answer>,
        mpsc::UnboundedReceiver<Answer>,
    )>,
    next_token: u64,
    /// Writes sent and not answered yet (write-stall watch).
    pub(super) writes: WriteTracker,
    /// Requests whose replies can prove the connection (followed only until it has proved
    /// itself): (requestID, place, what it is).
    proofs: Vec<(i32, u64, Step)>,
    pub(super) proof: Proof,
    /// The namespace of the last followed read, shared by the followed reads on it.
    last_ns: Option<Arc<str>>,
    /// Scratch space for the orphan estimate on `available` replies.
    ids: IdSet,
    /// The upstream's guard on primary-rung reads (`[ladder_guard]`), once paired.
    ladder: Option<Arc<LadderGuard>>,
    /// This connection's share of it (`per_connection_per_second`).
    ladder_share: ConnLadder,
}

/// At most this many requests are followed for the connection's proof at once (drivers
/// send one at a time).
const MAX_PROOFS_FOLLOWED: usize = 4;

/// A request whose reply can prove the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Step {
    /// An authentication step: proves it when mongos accepts it (`Reply::auth_accepted`).
    Auth,
    /// A read: proves it when answered `ok: 1`.
    Read,
}

impl Reads {
    /// The session is paired with an upstream whose ladder guard is `guard`.
    pub(super) fn paired(&mut self, guard: Arc<LadderGuard>) {
        self.ladder = Some(guard);
    }

    /// Nothing is followed: a reply is the client's, as it came.
    pub(super) fn none(&self) -> bool {
        self.pending.is_empty() && self.writes.is_empty() && self.proofs.is_empty()
    }

    pub(super) fn no_pending(&self) -> bool {
        self.pending.is_empty()
    }

    /// `request_id` is that of a followed read or write still waiting for its reply.
    /// Scans only while something is followed.
    pub(super) fn reuses(&self, request_id: i32) -> bool {
        let read = |f: &Followed| f.request_id() == request_id && !f.expired();
        (!self.pending.is_empty() && self.pending.iter().any(read))
            || self
                .parked
                .iter()
                .any(|p| p.read.request_id() == request_id)
            || (!self.writes.is_empty() && self.writes.contains(request_id))
    }

    /// `max` reads are followed already (`max_pending_reads`).
    pub(super) fn full(&self, max: usize) -> bool {
        self.pending.len() + self.parked.len() >= max
    }

    pub(super) fn follow(&mut self, f: Followed) {
        // Room for one at first (a driver sends one request at a time on a connection),
        // not the four a first `push` makes: a `Followed` is large, and what a quiet
        // session lets go of (`trim`) is a hole in the heap that only a smaller allocation
        // can use again. A pipelining client grows the list once per busy spell.
        if self.pending.capacity() == 0 {
            self.pending.reserve_exact(1);
        }
        self.pending.push(f);
    }

    /// `ns` as the followed reads keep it: the previous read's `Arc` when it was on the same
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

    /// The followed read answered by `response_to` at place `seq`.
    pub(super) fn answered(&mut self, response_to: i32, seq: u64) -> Option<Followed> {
        let i = self
            .pending
            .iter()
            .position(|f| f.answered_by(response_to, seq))?;
        Some(self.pending.swap_remove(i))
    }

    /// A reply to `response_to` may answer something followed: a read with that id, or
    /// whatever writes or authentication steps are followed (matched by place).
    pub(super) fn may_answer_any(&self, response_to: i32) -> bool {
        self.pending.iter().any(|f| f.request_id() == response_to)
            || !self.writes.is_empty()
            || !self.proofs.is_empty()
    }

    /// Request `next` may start `now` at mongos: a followed read waiting for that turn
    /// begins.
    pub(super) fn began(&mut self, next: u64, now: Instant) {
        if self.pending.is_empty() {
            return;
        }
        for f in &mut self.pending {
            f.begins(next, now);
        }
    }

    /// The followed reads whose turn for a reply has passed (`finals_in` final replies came,
    /// under other `responseTo`s): taken out, since nothing can be judged of them.
    pub(super) fn passed(&mut self, finals_in: u64) -> Vec<Followed> {
        if self.pending.iter().all(|f| !f.passed(finals_in)) {
            return Vec::new();
        }
        let (gone, kept) = std::mem::take(&mut self.pending)
            .into_iter()
            .partition(|f| f.passed(finals_in));
        self.pending = kept;
        gone
    }

    /// The followed reads whose attempt mongos left unanswered past its limit at `now`.
    pub(super) fn silent(&mut self, now: Instant) -> Vec<Followed> {
        let due = |f: &Followed| f.deadline().is_some_and(|d| d <= now);
        if !self.pending.iter().any(due) {
            return Vec::new();
        }
        let (gone, kept) = std::mem::take(&mut self.pending).into_iter().partition(due);
        self.pending = kept;
        gone
    }

    /// Every followed read, taken out (the session ends).
    pub(super) fn take_all(&mut self) -> Vec<Followed> {
        let parked = std::mem::take(&mut self.parked).into_iter().map(|p| p.read);
        let mut all = std::mem::take(&mut self.pending);
        all.extend(parked);
        all
    }

    /// Parks `read` (its reply `reply` held back) until the answer to the question asked
    /// with the returned token comes back through the returned sender.
    pub(super) fn park(
        &mut self,
        read: Followed,
        reply: Bytes,
    ) -> (u64, mpsc::UnboundedSender<Answer>) {
        let (tx, _) = self.answers.get_or_insert_with(mpsc::unbounded_channel);
        let tx = tx.clone();
        self.next_token += 1;
        let token = self.next_token;
        let since = Instant::now();
        self.parked.push(Parked {
            read,
            reply,
            token,
            since,
        });
        (token, tx)
    }

    /// The parked reads whose answer is overdue at `now` (their tokens).
    pub(super) fn overdue_answers(&self, now: Instant) -> Vec<u64> {
        let overdue = |p: &&Parked| now >= p.since + p.read.policy().confirm_time + ANSWER_WAIT;
        self.parked
            .iter()
            .filter(overdue)
            .map(|p| p.token)
            .collect()
    }

    /// Reads are followed (or wait for an answer): their deadlines are looked at.
    pub(super) fn watching(&self) -> bool {
        !self.pending.is_empty() || !self.parked.is_empty()
    }

    /// Reads wait for answers: the relay listens for them.
    pub(super) fn asking(&self) -> bool {
        !self.parked.is_empty()
    }

    /// The next answer to a parked read's question (pending forever when none can come).
    pub(super) fn next_answer(&mut self) -> impl std::future::Future<Output = Option<Answer>> + '_ {
        std::future::poll_fn(move |cx| match self.answers.as_mut() {
            Some((_, rx)) => rx.poll_recv(cx),
            None => std::task::Poll::Pending,
        })
    }

    /// The parked read an answer with `token` is for.
    pub(super) fn unpark(&mut self, token: u64) -> Option<Parked> {
        let i = self.parked.iter().position(|p| p.token == token)?;
        Some(self.parked.swap_remove(i))
    }

    /// Follows the reply to `request_id` sent at place `seq` (a `step` that can prove the
    /// connection), while the connection has not proved itself.
    pub(super) fn follow_proof(&mut self, request_id: i32, seq: u64, step: Step) {
        if !self.proof.proven() && self.proofs.len() < MAX_PROOFS_FOLLOWED {
            self.proofs.push((request_id, seq, step));
        }
    }

    /// The step the reply `response_to` at place `seq` answers, if it is one followed for
    /// the proof; the steps whose turn passed are let go of.
    pub(super) fn proof_replied(&mut self, response_to: i32, seq: u64) -> Option<Step> {
        if self.proofs.is_empty() {
            return None;
        }
        let found = (self.proofs.iter())
            .find(|&&(id, s, _)| id == response_to && s == seq)
            .map(|&(_, _, step)| step);
        self.proofs.retain(|&(_, s, _)| s > seq);
        found
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
        let held = self.pending.iter().filter(|f| f.holds_slot()).count();
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

    /// A session gone quiet lets go of all the room its lists and its scratch set keep
    /// (what stays empty costs nothing; the next read makes room again, once).
    pub(super) fn trim(&mut self) {
        self.shrink_idle();
        if self.pending.is_empty() {
            self.pending = Vec::new();
        }
        self.spare = None;
        if self.parked.is_empty() {
            self.parked = Vec::new();
        }
        if self.proofs.is_empty() {
            self.proofs = Vec::new();
        }
        self.writes.trim();
        self.ids = IdSet::default();
        self.last_ns = None;
    }

    /// Lets go of the room a burst of pipelined reads or writes left once they are empty
    /// (looked at on the limits tick, not per message).
    pub(super) fn shrink_idle(&mut self) {
        if self.pending.is_empty() && self.pending.capacity() > 16 {
            self.pending = Vec::new();
        }
        if self.parked.is_empty() && self.answers.is_some() {
            self.answers = None;
        }
        self.writes.shrink_idle();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What is followed for the proof: by id and place, let go of once its turn passed,
    /// nothing once the connection proved itself.
    #[test]
    fn proof_steps_are_matched_by_id_and_place() {
        let mut r = Reads::default();
        r.follow_proof(7, 1, Step::Auth);
        r.follow_proof(8, 2, Step::Read);
        assert!(!r.none());
        // Another request's reply at place 1: not the step; its turn passed, let go of.
        assert_eq!(r.proof_replied(9, 1), None);
        assert_eq!(r.proof_replied(8, 2), Some(Step::Read));
        assert!(r.none(), "nothing followed any more");
        r.proof.prove();
        r.follow_proof(10, 3, Step::Auth);
        assert!(
            r.none(),
            "a proven connection follows nothing for the proof"
        );
        // A bounded list.
        let mut r = Reads::default();
        for i in 0..10 {
            r.follow_proof(i, i as u64 + 1, Step::Read);
        }
        assert_eq!(r.proofs.len(), MAX_PROOFS_FOLLOWED);
    }
}
