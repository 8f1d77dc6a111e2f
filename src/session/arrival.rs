//! What a reply answers, decided once at its head ([`Arrival`]), and the state of a large
//! reply passed on in pieces while it is judged ([`Pieces`]). Values the reply side
//! (`reply.rs`) makes and reads; no I/O here.

use tokio::time::Instant;

use super::followed::Followed;
use super::reads::{Step, ORPHAN_SCAN_CAP};
use crate::policy::{Evidence, Failure};
use crate::wire::dupids::DupCount;
use crate::wire::{ReplyStatus, StreamScan, WireError};

/// Replies to followed reads and writes up to this size are read whole and judged before
/// they go on (so an error can be replaced, or a read sent up its ladder); larger ones are
/// judged in pieces as they pass. What a client that does not read such a reply can make
/// the proxy hold.
pub(super) const JUDGE_WHOLE: usize = 1024 * 1024;

/// What a reply answers, from its `responseTo` and its place among the final replies
/// (mongos answers a connection's requests in order). A followed read travels beside it
/// (`(Arrival::Read, Some(read))`), taken out of the reads at the reply's head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Arrival {
    /// Nothing followed: the client's, as it came.
    Nothing,
    /// A followed write (the write-stall watch heard of it); the client's, as it came.
    Write,
    /// A request followed for the connection's proof: an authentication step mongos may
    /// accept, or a read it may answer.
    Proof(Step),
    /// A followed read: judged, then its next step (`Followed::settle`).
    Read,
    /// The late reply to a read staleguard answered itself (mongos was silent): dropped.
    Late,
}

/// A large reply under way to the client, and what its last piece is judged for.
#[derive(Debug)]
pub(super) struct Pieces {
    scan: StreamScan,
    /// The followed read it answers (taken out of the pending reads at its head).
    pub(super) read: Option<Followed>,
    /// It answers a followed write (whose progress was heard at its head; its outcome is
    /// counted at its last piece).
    pub(super) write: bool,
    /// Its pieces go nowhere (the late reply to a read staleguard answered itself).
    pub(super) discard: bool,
    /// When its head arrived: the read's time is that of its head, when mongos answered,
    /// so a client that takes the reply slowly never makes the read look slow.
    pub(super) at: Instant,
}

impl Pieces {
    /// A large reply whose head said it answers `arrival`; `None` when nothing of it needs
    /// judging.
    pub(super) fn start(arrival: Arrival, read: Option<Followed>, max: usize) -> Option<Pieces> {
        let (write, discard) = match arrival {
            Arrival::Nothing | Arrival::Proof(_) => return None,
            Arrival::Write => (true, false),
            Arrival::Read => (false, false),
            Arrival::Late => (false, true),
        };
        let orphans = read.as_ref().is_some_and(Followed::scans_orphans);
        Some(Pieces {
            scan: StreamScan::new(max, orphans.then_some(ORPHAN_SCAN_CAP)),
            read,
            write,
            discard,
            at: Instant::now(),
        })
    }

    pub(super) fn feed(&mut self, bytes: &[u8]) {
        if !self.discard {
            self.scan.feed(bytes);
        }
    }

    /// What the whole reply said, once its last piece passed.
    pub(super) fn finish(self) -> (Found, Option<Followed>, bool) {
        (self.scan.finish(), self.read, self.write)
    }
}

/// A reply's status, with the documents it returned twice when looked for.
pub(super) type Found = Result<(ReplyStatus, Option<DupCount>), WireError>;

/// A trigger error met by `f`, in the log.
pub(super) fn log_failure(f: &Followed, failure: &Failure<'_>, now: Instant) {
    let (ns, command) = (f.ns(), f.command());
    match &failure.evidence {
        Evidence::Code { code, code_name } => {
            let elapsed_ms = now.saturating_duration_since(f.started()).as_millis() as u64;
            crate::logs::sampled!(info, ns = %ns, command = %command, code, code_name = code_name.unwrap_or(""), elapsed_ms, "trigger error");
        }
        Evidence::Slow { elapsed, .. } => {
            crate::logs::sampled!(info, ns = %ns, command = %command, elapsed_ms = elapsed.as_millis() as u64, "slow read");
        }
        Evidence::Silent { waited } => {
            tracing::warn!(ns = %ns, command = %command, waited_ms = waited.as_millis() as u64, "mongos silent past the read's limit");
        }
    }
}
