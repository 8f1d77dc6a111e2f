//! Large replies judged in pieces. A reply of more than [`JUDGE_WHOLE`] bytes that answers a
//! tracked read or a followed write is not held whole to be judged: it goes on to the client
//! in pieces as it arrives, like a reply nothing follows (so a client that does not read it
//! leaves the rest in mongos's socket), and each piece passes a [`StreamScan`] on its way,
//! which keeps only the reply's top-level status and, for an `available` reply, the `_id`s of
//! its batch. The reply is judged when its last piece goes out:
//!
//! - what needs only mongos's answer happens at its head: the write-stall watch hears of a
//!   write's answer, a primary-rung slot is given back, a probe lets the next one go, so a
//!   client that takes the reply slowly holds nothing another client needs;
//! - its time is that of its head, when mongos answered: a client that takes the reply
//!   slowly never makes the read look slow;
//! - it cannot be replaced any more, so a verdict that would climb or fail fast leaves the
//!   reply as it came (mongos's error replies are small, and are held whole; a success is
//!   what a large reply is);
//! - a compressed one cannot be read in pieces: it is judged as unreadable (no evidence).
//!
//! The confirming read's reply (staleguard's own, never relayed) is still read whole: no
//! client can hold it.

use bytes::Bytes;
use tokio::time::Instant;

use super::reads::{Tracked, ORPHAN_SCAN_CAP};
use super::Handler;
use crate::policy::{Ending, Rung, SampleEnd};
use crate::wire::{Head, StreamScan};

/// Replies to tracked reads and followed writes up to this size are read whole and judged
/// before they go on (so an error can be replaced, or a read sent up its ladder); larger
/// ones are judged in pieces. What a client that does not read such a reply can make the
/// proxy hold.
pub(super) const JUDGE_WHOLE: usize = 1024 * 1024;

/// A large reply under way to the client, and what its last piece is judged for.
#[derive(Debug)]
pub(super) struct Judging {
    scan: StreamScan,
    /// The tracked read it answers (taken out of the pending reads at its head).
    read: Option<Tracked>,
    /// It answers a followed write (whose progress was heard at its head; its outcome is
    /// counted at its last piece).
    write: bool,
    /// When its head arrived.
    at: Instant,
}

impl Handler {
    /// The head of a large reply (its bookkeeping done: its place counted) that may answer
    /// something followed. What only needs to know that mongos answered happens now, so a
    /// client taking the reply slowly holds nothing shared: the write-stall watch hears of a
    /// write's answer and the turn passes; a tracked read gives its primary-rung slot back,
    /// and a probe of an open breaker lets the next one go. What needs the reply's status
    /// (a write's outcome, the read's judgement) waits for its last piece.
    pub(super) fn judge_in_pieces(&mut self, head: &Head, place: u64) {
        let at = Instant::now();
        let response_to = head.header.response_to;
        let mut write = false;
        if !self.reads.writes.is_empty() {
            let seen = (response_to, !head.more_to_come(), self.peers.finals_in());
            let watch = &self.shared.stall;
            write = self.reads.writes.replied(watch, seen, || None, at);
        }
        let mut read = match write {
            true => None,
            false => self.reads.answered(response_to, place),
        };
        self.confirm_passed();
        self.give_up_passed();
        if let Some(t) = read.as_mut() {
            t.permit = None;
            if t.attempt.sample && t.attempt.rung == Rung::First {
                // Its outcome still counts at the last piece.
                self.sampled(t, SampleEnd::Unknown);
            }
        }
        if !write && read.is_none() {
            return;
        }
        let orphans = read
            .as_ref()
            .is_some_and(|t| t.attempt.rung == Rung::Available && t.unique_ids);
        let max = self.config.max_message_size;
        let scan = StreamScan::new(max, orphans.then_some(ORPHAN_SCAN_CAP));
        self.judging = Some(Box::new(Judging {
            scan,
            read,
            write,
            at,
        }));
    }

    /// A piece of a large reply, on its way to the client.
    pub(super) fn piece(&mut self, bytes: Bytes) {
        if let Some(j) = self.judging.as_mut() {
            j.scan.feed(&bytes);
        }
        self.peers.piece(bytes);
    }

    /// The last piece: what the reply answers is judged, then the piece goes on.
    pub(super) fn last_piece(&mut self, bytes: Bytes, more_to_come: bool) {
        if let Some(mut j) = self.judging.take() {
            j.scan.feed(&bytes);
            self.judged(*j);
        }
        self.peers.reply(bytes, more_to_come);
    }

    fn judged(&mut self, j: Judging) {
        let Judging {
            scan,
            read,
            write,
            at,
        } = j;
        let found = scan.finish();
        if write {
            self.reads
                .writes
                .outcome(found.as_ref().is_ok_and(|(s, _)| s.ok));
        }
        let Some(t) = read else {
            return;
        };
        let status = found.map(|(status, dups)| {
            if let Some(n) = dups {
                self.count_orphans(&t.ns, n);
            }
            status
        });
        self.judge_status(t, status, at, true);
    }

    /// A session that ends with a large reply half passed on: the read it answers ends
    /// `ending` (a write it answers is abandoned with the others).
    pub(super) fn judging_gone(&mut self, ending: Ending<'_>, now: Instant) {
        let Some(j) = self.judging.take() else {
            return;
        };
        if let Some(t) = j.read {
            let verdict = self.verdict(&t, ending, now);
            self.apply_verdict(t, verdict, false, now);
        }
    }
}
