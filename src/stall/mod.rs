//! The write-progress watch: notices a primary that answers heartbeats but completes no
//! write (see `background.md` §1 in the shared docs folder, `../shared/docs/`), and
//! optionally acts before secondary reads fail.
//!
//! ```text
//! signals (each per target, raised or clear, with its evidence)
//!   passive    writes relayed per upstream (session → WriteTracker → atomics), judged
//!              every TICK: writes waiting > stall_after (from their turn at mongos) on
//!              two or more connections from min_client_addresses addresses, none
//!              answered; once raised, held until a write is answered or clear_after
//!   probe      [stall_watch.probe]: an upsert per upstream (and probe id) every interval
//!   composite  [stall_watch.shards]: serverStatus of each shard primary, the article's rule
//! tick         every TICK: judge the passive signal, then act (on_write_stall)
//! ```
//!
//! Acting (`open_fallback_breakers`) holds the breakers of fallback namespaces open while any
//! signal is raised: exact fallback patterns and fallback namespaces that have a breaker at
//! once, the namespaces of wildcard patterns as they are first read (the session asks
//! [`StallWatch::holding`], then `Breakers::hold_on_read`). When every signal clears, the
//! breakers are released, probe at their next read and close on a streak of answered
//! probes. Strict namespaces are never touched. The watch decides when; holding and releasing
//! are the breaker module's (`breaker::hold`).

mod composite;
mod passive;
mod probe;
mod tick;
mod watch;

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::breaker::Breakers;
use crate::metrics::Metrics;
use crate::state::LiveConfig;

pub use composite::{shard_target, Conditions, Rule, RuleState, ShardReading};
pub use passive::{
    client_key, is_write_command, is_write_key, stalled as passive_stalled, Needs, PassiveSample,
    SessionWrites, UpstreamWrites, WriteTracker,
};

pub use watch::{Evidence, Observation, Signal, SignalKind, StallWatch};

/// How often the passive signal is judged and the action applied.
pub const TICK: Duration = Duration::from_millis(250);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// What the watch's tasks are given: the live config, the watch's state, the metrics, and
/// the breakers its action holds.
#[derive(Debug, Clone)]
pub struct Ctx {
    pub config: Arc<LiveConfig>,
    pub stall: Arc<StallWatch>,
    pub metrics: Arc<Metrics>,
    pub breakers: Arc<Breakers>,
}

/// Starts the watch: the tick (passive signal, action), the probe and the serverStatus
/// poller. Each follows config reloads and ends with `stop`.
pub fn start(shared: Ctx, stop: CancellationToken) {
    tokio::spawn(probe::run(shared.clone(), stop.clone()));
    tokio::spawn(composite::run(shared.clone(), stop.clone()));
    tokio::spawn(tick::tick(shared, stop));
}
