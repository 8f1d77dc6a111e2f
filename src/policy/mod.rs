//! Policy, in one place: the per-namespace settings and their pattern table, which namespace
//! governs a command, what to do with it, and what that decision means for the request.
//!
//! ```text
//! table     Mode, Causal, NsPolicy; patterns and "most specific wins" lookup
//! reason    Reason, Admission: the breaker's state as decide's input
//! decide    resolve (command + table → Target), decide (Target + Admission → Decision)
//! budget    a read's time budget split between its first attempt and the next rung
//! outcome   Decision → rewrite spec, dry_run, fail-fast / refusal error replies
//! attempt   one attempt of a followed read (Rung, Attempt) and the read as judged (Read)
//! evidence  the one evidence rule: what a read's ending says about the cluster (Word),
//!           what a confirming read's reply says (Confirmation)
//! judge     the reply side: how a followed read ended (+ the time) → Verdict (word, then)
//! ladder    the read's moves: the next rung, the question before one, what the primary's
//!           guard refusing it leads to
//! legacy    OP_QUERY on databases with governed namespaces → refusal (OP_REPLY)
//! ```
//!
//! Everything here is a pure function over values: no I/O, no shared state, the clock passed
//! in. `config` builds the table from the file; `breaker` keeps the state behind `Admission`;
//! the session applies what these functions return.

mod attempt;
mod budget;
mod decide;
mod evidence;
mod judge;
mod ladder;
mod legacy;
mod outcome;
mod reason;
mod table;

pub use attempt::{Attempt, Members, Read, Rung};
pub use budget::{
    attempt_budget, next_rung_ms, primary_rung_ms, rung_share, AttemptBudget, Remaining,
    PRIMARY_RUNG_CEILING_MS,
};
pub use decide::{
    capped_max_time, decide, resolve, AfterPrimary, Bounded, Decision, ReadKind, Refusal, Target,
};
pub use evidence::{
    confirmation, own_limit_cut, word, Confirmation, Ending, Evidence, Failure, SetAside, Word,
};
pub use judge::{judge, Verdict};
pub use ladder::{after_confirm, Then};
pub use legacy::{judge_op_query, LegacyRefusal, ALLOWED_OP_QUERY_COMMANDS};
pub use outcome::{
    apply_dry_run, bounded_fail_reply, dry_verdict, fail_fast_reply, legacy_refusal_reply,
    refusal_reply, rewrite_spec, silent_reply, ErrorReply, HeldBack,
};
pub use reason::{Admission, Reason};
pub use table::{
    Causal, Mode, NsPolicy, OnOpen, PolicyTable, DEFAULT_ATTEMPT_LIMIT, DEFAULT_ATTEMPT_SHARE,
    DEFAULT_CLOSE_AFTER, DEFAULT_CONFIRM_TIME, DEFAULT_COOLDOWN, DEFAULT_MIN_CONNECTIONS,
    DEFAULT_MIN_COOLDOWN, DEFAULT_MIN_WAIT, DEFAULT_OPEN_TIME_LIMIT, DEFAULT_PER_CONNECTION,
    DEFAULT_TRIGGER_CODES, MAX_MIN_CONNECTIONS, MAX_PER_CONNECTION,
};

pub(crate) use table::{Pattern, DB_FORBIDDEN};
