//! The breaker's words as the policy reads them: why a namespace's reads failed (`Reason`,
//! which also picks the code of a fail-fast reply) and what the breaker admits for one
//! request (`Admission`, an input of `decide`).
//!
//! They are defined here, below `breaker`, so that `breaker` (the shared state) depends on
//! the policy's types and `decide` stays a pure function that imports no state.

use std::fmt;
use std::time::Duration;

/// Why a breaker counted an error (and, once open, which code a fail-fast reply carries).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// StaleConfig and its relatives: the shard could not confirm its routing table.
    StaleRouting,
    /// A time limit: MaxTimeMSExpired, ExceededTimeLimit, a client that gave up, a slow reply.
    TimeLimit,
    /// Held open by the write-stall watch before any read failed.
    WriteStall,
}

impl Reason {
    /// The reason a trigger code stands for.
    pub fn of_code(code: i32) -> Reason {
        match code {
            13388 | 63 | 150 | 249 => Reason::StaleRouting,
            _ => Reason::TimeLimit,
        }
    }

    /// The code a fail-fast reply carries: neither is in the drivers' retryable-reads list.
    pub fn reply_code(self) -> (i32, &'static str) {
        match self {
            // A secondary read during a write stall fails as stale routing would.
            Reason::StaleRouting | Reason::WriteStall => (13388, "StaleConfig"),
            Reason::TimeLimit => (50, "MaxTimeMSExpired"),
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Reason::StaleRouting => "stale routing metadata",
            Reason::TimeLimit => "time limits",
            Reason::WriteStall => "write stall suspected",
        })
    }
}

/// What the breaker lets a request do, decided as it arrives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Breaker closed: normal handling.
    Closed,
    /// Breaker open (its probe, if any, already out or not due): act as open.
    Open {
        reason: Reason,
        /// How long until a probe is let through.
        probe_in: Duration,
        errors: u32,
    },
    /// Breaker open and a probe is due: this read is it. Send it to the secondaries (as a
    /// closed read would go) and report its outcome as a sample.
    Probe,
    /// Breaker open on a strict namespace with `on_open = "bound"`: send the read with the
    /// short `open_time_limit`, and report its outcome as a sample; a trigger error is
    /// answered with the fail-fast error.
    Bounded { reason: Reason, errors: u32 },
}
