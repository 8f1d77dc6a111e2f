//! The fleet: instances that share incident state through Redis (`[fleet]`). Without the
//! section none of this runs.
//!
//! What is shared:
//! - **openings**: when a breaker opens on this instance's own evidence, the fleet task
//!   publishes it (a pub/sub message, and a key with a TTL renewed while it stays open, so
//!   an instance that starts or reconnects later finds it); every other instance opens that
//!   namespace's breaker at once, its reason naming the opener and its evidence. Each then
//!   closes on its own samples, or when the opener publishes its close. The evidence rules
//!   stay per instance (`policy::judge`, `breaker`); a fleet opening only ever comes from
//!   Redis.
//! - **budgets** (`budget.rs`): `[ladder_guard] fleet_max_per_second` and
//!   `fleet_max_in_flight` across the fleet, on top of each instance's own guard.
//! - **one prober** (`leader.rs`): the write probe of each probe id and the `serverStatus`
//!   poll of each shard run on one instance under a lease; the others show its signals.
//!
//! Redis down, slow or cut off: every call has a timeout; the link is checked every
//! `timeout`, so within about two of them (1 s by default) the instance acts alone (its
//! own breakers, its local guard), logs it once and exports `staleguard_fleet_connected 0`;
//! it rejoins (republishing its own openings) when Redis answers again. The only call on
//! a request's path is the budget's, on the ladder's primary rung, bounded by
//! `budget_timeout`.
//!
//! The breakers tell this task of their transitions through a hook (`Breakers::set_hook`)
//! that only queues (`try_send`); everything that talks to Redis runs here (`link.rs`).

mod budget;
mod leader;
mod link;
mod message;

pub use message::{Kind, Message};

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::breaker::{Breakers, Reason, State, Transition};
use crate::config::{FleetConfig, Mode};
use crate::metrics::Metrics;
use crate::stall::StallWatch;
use crate::state::LiveConfig;
use crate::upstream::FleetShare;

/// Transitions waiting for the fleet task; past this many, an opening is dropped (counted
/// nowhere else: the breaker itself is unaffected, and the next renewal republishes).
const QUEUE: usize = 1024;

/// The fleet as the rest of the proxy sees it: this instance's name, and whether Redis is
/// reachable.
#[derive(Debug)]
pub struct Fleet {
    pub name: String,
    connected: AtomicBool,
}

impl Fleet {
    pub fn new(config: &FleetConfig) -> Fleet {
        Fleet {
            name: config.name.clone(),
            connected: AtomicBool::new(false),
        }
    }

    /// Redis answered the last check.
    pub fn connected(&self) -> bool {
        self.connected.load(Ordering::Acquire)
    }
}

/// What the fleet task is handed.
pub struct Ctx {
    pub config: Arc<LiveConfig>,
    pub breakers: Arc<Breakers>,
    pub metrics: Arc<Metrics>,
    pub fleet: Arc<Fleet>,
    /// Where the budget task puts this instance's share of the fleet budget.
    pub share: Arc<FleetShare>,
    /// The write-stall watch: which probes and polls this instance leads, and the signals.
    pub stall: Arc<StallWatch>,
}

/// One of this instance's own transitions, as the hook queued it.
#[derive(Debug)]
struct Own {
    ns: String,
    to: State,
    cause: Reason,
    reason: String,
}

/// Registers the fleet's metrics, hooks the breakers and starts the task.
pub fn start(ctx: Ctx, fleet: FleetConfig, stop: CancellationToken) {
    ctx.metrics.register_fleet();
    let (tx, rx) = mpsc::channel(QUEUE);
    let hooked = ctx.breakers.set_hook(move |ns, t: &Transition| {
        // Only this instance's own evidence is published: not an opening from the fleet,
        // not a hold of the write-stall watch (each instance has its own signals).
        if t.opener.is_some() || (t.to == State::Open && t.cause == Reason::WriteStall) {
            return;
        }
        let _ = tx.try_send(Own {
            ns: ns.to_string(),
            to: t.to,
            cause: t.cause,
            reason: t.reason.clone(),
        });
    });
    if !hooked {
        tracing::error!("fleet: the breakers' hook is taken; openings will not be published");
    }
    tokio::spawn(budget::run(
        ctx.config.clone(),
        ctx.share.clone(),
        fleet.clone(),
        ctx.fleet.name.clone(),
        stop.clone(),
    ));
    let leading = leader::Leading {
        config: ctx.config.clone(),
        stall: ctx.stall.clone(),
        metrics: ctx.metrics.clone(),
        fleet: fleet.clone(),
        name: ctx.fleet.name.clone(),
    };
    tokio::spawn(leader::run(leading, stop.clone()));
    tokio::spawn(link::run(ctx, fleet, rx, stop));
}

/// This instance's own openings and the closes not yet published.
#[derive(Debug, Default)]
struct Mine {
    open: HashMap<String, Message>,
    unsent_closes: HashSet<String>,
}

impl Ctx {
    fn set_connected(&self, up: bool) {
        let was = self.fleet.connected.swap(up, Ordering::AcqRel);
        self.metrics.fleet.connected.set(i64::from(up));
        if was != up {
            let e = crate::events::Event::fleet(up, &self.fleet.name);
            self.metrics.recent.events.record(e);
        }
    }

    /// Applies another instance's message to the breakers; says whether it changed one.
    fn apply(&self, m: &Message) -> bool {
        if m.opener == self.fleet.name {
            return false;
        }
        let now = Instant::now();
        let changed = match m.kind {
            Kind::Open => {
                let config = self.config.load();
                let (db, coll) = m.db_coll();
                let Some(policy) = config.policy.lookup(db, coll) else {
                    return false;
                };
                if policy.mode == Mode::Passthrough {
                    return false;
                }
                let b = &self.breakers;
                b.open_from_fleet(&m.ns, policy, m.cause(), &m.opener, &m.evidence, now)
                    .is_some()
            }
            Kind::Close => self
                .breakers
                .close_from_fleet(&m.ns, &m.opener, &m.evidence, now)
                .is_some(),
        };
        if changed {
            self.metrics.fleet.event("applied", m.kind.as_str());
        }
        changed
    }
}

impl Mine {
    /// Openings whose breaker is no longer open here without a transition being reported
    /// (a reload dropped it, the map evicted it, a queued transition was dropped): closes
    /// to publish, so their keys stop being renewed.
    fn prune(&mut self, breakers: &Breakers, name: &str) -> Vec<Message> {
        let gone: Vec<String> = self
            .open
            .keys()
            .filter(|ns| breakers.state(ns) != State::Open)
            .cloned()
            .collect();
        gone.into_iter()
            .filter_map(|ns| {
                let opened = self.open.remove(&ns)?;
                self.unsent_closes.insert(ns.clone());
                let why = "its breaker is no longer open here";
                Some(Message::new(Kind::Close, &ns, name, opened.cause(), why))
            })
            .collect()
    }

    /// Notes one of this instance's transitions; returns the message to publish.
    fn note(&mut self, own: Own, name: &str) -> Option<Message> {
        match own.to {
            State::Open => {
                let m = Message::new(Kind::Open, &own.ns, name, own.cause, &own.reason);
                self.unsent_closes.remove(&own.ns);
                self.open.insert(own.ns, m.clone());
                Some(m)
            }
            State::Closed => {
                let opened = self.open.remove(&own.ns)?;
                self.unsent_closes.insert(own.ns.clone());
                Some(Message::new(
                    Kind::Close,
                    &own.ns,
                    name,
                    opened.cause(),
                    &own.reason,
                ))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn own(ns: &str, to: State) -> Own {
        Own {
            ns: ns.to_string(),
            to,
            cause: Reason::TimeLimit,
            reason: "3 trigger errors".to_string(),
        }
    }

    #[test]
    fn own_openings_are_published_once_and_closed_when_gone() {
        let mut mine = Mine::default();
        let m = mine.note(own("pay.tx", State::Open), "sg-1").expect("open");
        assert_eq!((m.kind, m.opener.as_str()), (Kind::Open, "sg-1"));
        assert_eq!(m.cause(), Reason::TimeLimit);
        // A close of something never published is not published.
        assert!(mine.note(own("pay.other", State::Closed), "sg-1").is_none());
        // The breaker is not open here (never created in this map): pruned as a close.
        let breakers = Breakers::default();
        let closes = mine.prune(&breakers, "sg-1");
        assert_eq!(closes.len(), 1);
        assert_eq!(
            (closes[0].kind, closes[0].ns.as_str()),
            (Kind::Close, "pay.tx")
        );
        assert!(mine.open.is_empty());
        assert!(mine.unsent_closes.contains("pay.tx"));
    }
}
