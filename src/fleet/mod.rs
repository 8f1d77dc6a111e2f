//! The fleet: instances that share incident state through Redis (`[fleet]`). Without the
//! section none of this runs.
//!
//! What is shared:
//! - **openings** (`index.rs`, `follow.rs`): when a breaker opens on this instance's own
//!   evidence, the fleet task puts it in the openings index, renewed while it stays open
//!   (so an instance that starts or reconnects later finds it); every other instance polls
//!   the index and opens that namespace's breaker, its reason naming the opener and its
//!   evidence. Each then closes on its own samples, or when the opener's close is in the
//!   index. The fleet carries evidence, not verdicts: an opening this instance's own
//!   answered samples closed is not applied again, and the opener's close does not close a
//!   breaker whose own last sample failed recently (`breaker::FleetClose`).
//! - **budgets** (`budget.rs`): `[ladder_guard] fleet_max_per_second` and
//!   `fleet_max_in_flight` across the fleet, on top of each instance's own guard.
//! - **one prober** (`leader.rs`): the write probe of each probe id and the `serverStatus`
//!   poll of each shard run on one instance under a lease; the others show its signals.
//!
//! Names: each instance holds its name in Redis while it is connected (`index.rs`,
//! `P:member:<name>`); one that finds its name held by another live instance (the default
//! name is `listen`, the same on every sidecar of one ConfigMap) joins under the name with a
//! random suffix and says so in a warning.
//!
//! Redis down, slow or cut off: every call has a timeout; the index is polled every
//! [`POLL`], so within `timeout` and a poll (under 1 s by default) the instance acts alone
//! (its own breakers, its local guard), logs it once and exports
//! `staleguard_fleet_connected 0`; it rejoins (republishing its own openings) when Redis
//! answers again. Nothing on a request's path waits for Redis.
//!
//! The breakers tell this task of their transitions through a hook (`Breakers::set_hook`)
//! that only queues (`try_send`); everything that talks to Redis runs here (`link.rs`).

mod budget;
mod conn;
mod follow;
mod index;
mod leader;
mod link;
mod message;

pub use message::{Kind, Message};

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::breaker::{closed_by_fleet, Breakers, Reason, State, Transition};
use crate::config::FleetConfig;
use crate::metrics::Metrics;
use crate::stall::StallWatch;
use crate::state::LiveConfig;
use crate::upstream::FleetShare;

/// Transitions waiting for the fleet task; past this many, one is dropped (counted nowhere
/// else: the breaker itself is unaffected, and the next renewal republishes).
const QUEUE: usize = 1024;

/// How often the openings index is polled (a version check; the index is read only when
/// it changed): an opening reaches the other instances within about this long.
pub const POLL: Duration = Duration::from_millis(100);

/// The fleet as the rest of the proxy sees it: this instance's name, and whether Redis is
/// reachable.
#[derive(Debug)]
pub struct Fleet {
    /// `[fleet] name`.
    configured: String,
    /// The name it holds in the fleet: `configured`, or that with a suffix when another
    /// live instance holds it.
    name: RwLock<String>,
    /// This process's own token in the name claims (never shown).
    token: String,
    connected: AtomicBool,
}

impl Fleet {
    pub fn new(config: &FleetConfig) -> Fleet {
        Fleet {
            configured: config.name.clone(),
            name: RwLock::new(config.name.clone()),
            token: message::new_id(),
            connected: AtomicBool::new(false),
        }
    }

    /// The name this instance holds in the fleet (its `[fleet] name`, or that with a suffix
    /// when another instance holds it).
    pub fn name(&self) -> String {
        self.name.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn set_name(&self, name: &str) {
        *self.name.write().unwrap_or_else(|p| p.into_inner()) = name.to_string();
    }

    /// Redis answered the last poll.
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

/// A transition the hook queued for the fleet task.
#[derive(Debug)]
enum Heard {
    /// One of this instance's own (opened on its own evidence, or closed).
    Own {
        ns: String,
        to: State,
        cause: Reason,
        reason: String,
    },
    /// A breaker the fleet opened here closed on this instance's own samples: that opening
    /// is contradicted here.
    Contradicted { ns: String, opener: String },
}

/// Registers the fleet's metrics, hooks the breakers and starts the tasks.
pub fn start(ctx: Ctx, fleet: FleetConfig, stop: CancellationToken) {
    ctx.metrics.register_fleet();
    let (tx, rx) = mpsc::channel(QUEUE);
    let hooked = ctx.breakers.set_hook(move |ns, t: &Transition| {
        let heard = match (&t.opener, t.to) {
            // Not published: a hold of the write-stall watch (each instance has its own
            // signals).
            (None, State::Open) if t.cause == Reason::WriteStall => return,
            (None, to) => Heard::Own {
                ns: ns.to_string(),
                to,
                cause: t.cause,
                reason: t.reason.clone(),
            },
            (Some(opener), State::Closed) if !closed_by_fleet(t) => Heard::Contradicted {
                ns: ns.to_string(),
                opener: opener.to_string(),
            },
            // The fleet's own doing (an opening applied, a close applied).
            (Some(_), _) => return,
        };
        let _ = tx.try_send(heard);
    });
    if !hooked {
        tracing::error!("fleet: the breakers' hook is taken; openings will not be published");
    }
    tokio::spawn(budget::run(
        ctx.config.clone(),
        ctx.share.clone(),
        fleet.clone(),
        ctx.fleet.clone(),
        stop.clone(),
    ));
    let leading = leader::Leading {
        config: ctx.config.clone(),
        stall: ctx.stall.clone(),
        metrics: ctx.metrics.clone(),
        fleet: fleet.clone(),
        me: ctx.fleet.clone(),
    };
    tokio::spawn(leader::run(leading, stop.clone()));
    tokio::spawn(link::run(ctx, fleet, rx, stop));
}

impl Ctx {
    fn set_connected(&self, up: bool) {
        let was = self.fleet.connected.swap(up, Ordering::AcqRel);
        self.metrics.fleet.connected.set(i64::from(up));
        if was != up {
            let e = crate::events::Event::fleet(up, &self.fleet.name());
            self.metrics.recent.events.record(e);
        }
    }
}

/// This instance's own openings (by namespace), and the closes not yet in the index.
#[derive(Debug, Default)]
struct Mine {
    open: HashMap<String, Message>,
    unsent_closes: HashMap<String, Message>,
}

impl Mine {
    /// One of its ids (an opening it made, or the close of one).
    fn has_id(&self, id: &str) -> bool {
        self.open.values().any(|m| m.id == id) || self.unsent_closes.values().any(|m| m.id == id)
    }

    /// Its messages under `name` (after it took another name): same ids, same evidence.
    fn rename(&mut self, name: &str) {
        for m in self
            .open
            .values_mut()
            .chain(self.unsent_closes.values_mut())
        {
            m.opener = name.to_string();
        }
    }

    /// Openings whose breaker is no longer open here without a transition being reported
    /// (a reload dropped it, the map evicted it, a queued transition was dropped): closes
    /// to publish, so their fields stop being renewed.
    fn prune(&mut self, breakers: &Breakers) -> Vec<Message> {
        let gone: Vec<String> = self
            .open
            .keys()
            .filter(|ns| breakers.state(ns) != State::Open)
            .cloned()
            .collect();
        gone.into_iter()
            .filter_map(|ns| {
                let opened = self.open.remove(&ns)?;
                let why = "its breaker is no longer open here";
                Some(self.closed(opened, why))
            })
            .collect()
    }

    /// The close of `opened`, kept until it is in the index.
    fn closed(&mut self, opened: Message, why: &str) -> Message {
        let ids = (opened.opener.as_str(), opened.id.as_str());
        let m = Message::new(Kind::Close, &opened.ns, ids, opened.cause(), why);
        self.unsent_closes.insert(m.ns.clone(), m.clone());
        m
    }

    /// Notes one of this instance's transitions; returns the message to publish.
    fn note(
        &mut self,
        ns: String,
        to: State,
        cause: Reason,
        reason: &str,
        name: &str,
    ) -> Option<Message> {
        match to {
            State::Open => {
                let id = message::new_id();
                let m = Message::new(Kind::Open, &ns, (name, &id), cause, reason);
                self.unsent_closes.remove(&ns);
                self.open.insert(ns, m.clone());
                Some(m)
            }
            State::Closed => {
                let opened = self.open.remove(&ns)?;
                Some(self.closed(opened, reason))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_openings_are_published_once_and_closed_when_gone() {
        let mut mine = Mine::default();
        let m = mine
            .note(
                "pay.tx".into(),
                State::Open,
                Reason::TimeLimit,
                "3 errors",
                "sg-1",
            )
            .expect("open");
        assert_eq!((m.kind, m.opener.as_str()), (Kind::Open, "sg-1"));
        assert_eq!(m.cause(), Reason::TimeLimit);
        assert!(mine.has_id(&m.id));
        // A close of something never published is not published.
        let never = mine.note(
            "pay.other".into(),
            State::Closed,
            Reason::TimeLimit,
            "x",
            "sg-1",
        );
        assert!(never.is_none());
        // The breaker is not open here (never created in this map): pruned as a close of
        // the same opening.
        let breakers = Breakers::default();
        let closes = mine.prune(&breakers);
        assert_eq!(closes.len(), 1);
        assert_eq!(
            (closes[0].kind, closes[0].ns.as_str(), closes[0].id.as_str()),
            (Kind::Close, "pay.tx", m.id.as_str())
        );
        assert!(mine.open.is_empty());
        assert!(mine.unsent_closes.contains_key("pay.tx"));
        mine.rename("sg-1-ab12");
        assert_eq!(mine.unsent_closes["pay.tx"].opener, "sg-1-ab12");
        // Opened again: a new identity.
        let again = mine
            .note(
                "pay.tx".into(),
                State::Open,
                Reason::TimeLimit,
                "3 errors",
                "sg-1",
            )
            .expect("open");
        assert_ne!(again.id, m.id);
    }
}
