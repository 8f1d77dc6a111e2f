//! The handles of one running proxy, and the narrow views each component is given: a
//! session gets [`SessionHandles`], the admin endpoint [`AdminHandles`], a reload
//! [`ReloadHandles`], each with only the handles it uses. Every handle is its own `Arc`, so
//! the background tasks (`health`, `stall`) are handed only the few they use too.

use std::sync::Arc;

use tokio::sync::Semaphore;

use crate::breaker::{Breakers, DEFAULT_MAX_BREAKERS};
use crate::config::Config;
use crate::confirm::{Confirmer, Inbox};
use crate::fleet::Fleet;
use crate::metrics::Metrics;
use crate::stall::StallWatch;
use crate::state::{ClientSlots, Ids, LiveConfig, Runtime};
use crate::upstream::{Denied, LadderPermit, ShareSaid, Upstreams};

/// Everything the server starts its tasks with (and what `Running::shared` shows tests).
#[derive(Debug)]
pub struct Handles {
    /// The config in force, and its generation.
    pub config: Arc<LiveConfig>,
    /// The per-namespace breakers (they log and count their own transitions).
    pub breakers: Arc<Breakers>,
    /// The mongos routers and their health.
    pub upstreams: Arc<Upstreams>,
    pub metrics: Arc<Metrics>,
    /// The write-progress watch: its signals, and whether fallback breakers are held.
    pub stall: Arc<StallWatch>,
    /// Connection ids and the requestIDs of messages the proxy originates.
    pub ids: Arc<Ids>,
    /// Start time, listening address, last config load (for `/status`).
    pub runtime: Arc<Runtime>,
    /// Client connections open now (`max_connections`).
    pub clients: Arc<ClientSlots>,
    /// What every session is given (the server sets its kill flag).
    pub sessions: Arc<SessionHandles>,
    /// `[fleet]`: this instance's name and whether Redis answers (none without the section).
    pub fleet: Option<Arc<Fleet>>,
    /// The confirming task's side of the question queue, taken by the server when it starts
    /// the task.
    pub confirm_inbox: std::sync::Mutex<Option<Inbox>>,
}

/// What a session uses.
#[derive(Debug)]
pub struct SessionHandles {
    pub config: Arc<LiveConfig>,
    pub breakers: Arc<Breakers>,
    pub upstreams: Arc<Upstreams>,
    pub metrics: Arc<Metrics>,
    pub stall: Arc<StallWatch>,
    pub ids: Arc<Ids>,
    /// Large compressed requests decompressed off the runtime's workers at once: half the
    /// cores the process may use (at least one), so that a flood of them cannot take every
    /// core from the relays (`session::gate`).
    pub inflate_slots: Semaphore,
    /// The bytes every session together may hold whole for mongos
    /// (`config::HELD_FOR_UPSTREAM`, in units of `config::HELD_UNIT`; `session::upload`):
    /// past it a session reads no more of such a request until room comes back.
    pub held_for_upstream: Arc<Semaphore>,
    /// Where questions to the cluster go (`confirm`): a time limit before it counts, a read
    /// staleguard's own limit cut before it climbs.
    pub confirmer: Confirmer,
}

/// What the admin endpoint uses: what `/status`, `/readyz` and `/metrics` show, and its
/// own limits.
#[derive(Debug, Clone)]
pub struct AdminHandles {
    pub config: Arc<LiveConfig>,
    pub breakers: Arc<Breakers>,
    pub upstreams: Arc<Upstreams>,
    pub metrics: Arc<Metrics>,
    pub stall: Arc<StallWatch>,
    pub runtime: Arc<Runtime>,
    /// `[fleet]`: this instance's name and whether Redis answers (none without the section).
    pub fleet: Option<Arc<Fleet>>,
}

/// What a reload uses: the config it swaps, and what a new config changes.
#[derive(Debug, Clone)]
pub struct ReloadHandles {
    pub config: Arc<LiveConfig>,
    pub breakers: Arc<Breakers>,
    pub upstreams: Arc<Upstreams>,
    pub metrics: Arc<Metrics>,
    pub runtime: Arc<Runtime>,
}

/// Decompressions off the workers at once: half the cores the process may use (at least
/// one).
fn inflate_slots() -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    (cores / 2).max(1)
}

impl Handles {
    pub fn new(config: Arc<Config>) -> Handles {
        let metrics = Arc::new(Metrics::new());
        crate::state::publish_limits(&metrics, &config, DEFAULT_MAX_BREAKERS);
        let breakers = Breakers::with_metrics(DEFAULT_MAX_BREAKERS, metrics.clone());
        breakers.set_patterns(&config.policy, config.breaker_share);
        let upstreams = Arc::new(Upstreams::new(config.upstreams.clone()));
        let fleet = config.fleet.as_ref().map(|f| Arc::new(Fleet::new(f)));
        let config = Arc::new(LiveConfig::new(config));
        let breakers = Arc::new(breakers);
        let stall = Arc::new(StallWatch::new());
        let ids: Arc<Ids> = Arc::default();
        let (confirmer, inbox) = Confirmer::new();
        let sessions = Arc::new(SessionHandles {
            config: config.clone(),
            breakers: breakers.clone(),
            upstreams: upstreams.clone(),
            metrics: metrics.clone(),
            stall: stall.clone(),
            ids: ids.clone(),
            inflate_slots: Semaphore::new(inflate_slots()),
            held_for_upstream: Arc::new(Semaphore::new(
                crate::config::HELD_FOR_UPSTREAM / crate::config::HELD_UNIT,
            )),
            confirmer,
        });
        Handles {
            upstreams,
            config,
            breakers,
            metrics,
            stall,
            ids,
            runtime: Arc::default(),
            clients: Arc::default(),
            sessions,
            fleet,
            confirm_inbox: std::sync::Mutex::new(Some(inbox)),
        }
    }

    /// What the confirming task uses, and its queue (once: `None` after the first call).
    pub fn confirming(&self) -> Option<(Inbox, crate::confirm::Ctx)> {
        let inbox = self
            .confirm_inbox
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()?;
        let ctx = crate::confirm::Ctx {
            config: self.config.clone(),
            breakers: self.breakers.clone(),
            metrics: self.metrics.clone(),
        };
        Some((inbox, ctx))
    }

    /// The admin endpoint's view.
    pub fn admin(&self) -> AdminHandles {
        AdminHandles {
            config: self.config.clone(),
            breakers: self.breakers.clone(),
            upstreams: self.upstreams.clone(),
            metrics: self.metrics.clone(),
            stall: self.stall.clone(),
            runtime: self.runtime.clone(),
            fleet: self.fleet.clone(),
        }
    }

    /// A reload's view.
    pub fn reload(&self) -> ReloadHandles {
        ReloadHandles {
            config: self.config.clone(),
            breakers: self.breakers.clone(),
            upstreams: self.upstreams.clone(),
            metrics: self.metrics.clone(),
            runtime: self.runtime.clone(),
        }
    }
}

impl SessionHandles {
    /// A primary-rung read the local guard let through, judged by this instance's share of
    /// the fleet budget (`[fleet]`; without a budget it passes untouched).
    pub fn fleet_budget(
        &self,
        permit: LadderPermit,
        now: tokio::time::Instant,
    ) -> Result<LadderPermit, Denied> {
        let (r, said) = self.upstreams.fleet_share.take(permit, now);
        let result = match said {
            ShareSaid::Off => return r,
            ShareSaid::Allowed => "allowed",
            ShareSaid::Denied => "denied",
            ShareSaid::Unanswered => "unanswered",
        };
        self.metrics.fleet.budget(result);
        r
    }
}
