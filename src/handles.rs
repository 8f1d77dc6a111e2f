//! The handles of one running proxy, gathered: what a session, the admin endpoint and a
//! reload are given. Each field is its own `Arc`, so the background tasks (`health`,
//! `stall`) are handed only the few they use.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use crate::breaker::{Breakers, DEFAULT_MAX_BREAKERS};
use crate::config::Config;
use crate::fleet::Fleet;
use crate::metrics::Metrics;
use crate::stall::StallWatch;
use crate::state::{ClientSlots, Ids, LiveConfig, Runtime};
use crate::upstream::{Denied, LadderPermit, ShareSaid, Upstreams};

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
    /// Set when the stop's deadline passes, just before the kill token is cancelled: a
    /// session looks at it once per message (a load of a line nothing else writes), where
    /// polling the token would take its lock.
    pub killed: AtomicBool,
    /// `[fleet]`: this instance's name and whether Redis answers (none without the section).
    pub fleet: Option<Arc<Fleet>>,
}

impl Handles {
    pub fn new(config: Arc<Config>) -> Handles {
        let metrics = Arc::new(Metrics::new());
        crate::state::publish_limits(&metrics, &config, DEFAULT_MAX_BREAKERS);
        let breakers = Breakers::with_metrics(DEFAULT_MAX_BREAKERS, metrics.clone());
        breakers.set_patterns(&config.policy, config.breaker_share);
        Handles {
            fleet: config.fleet.as_ref().map(|f| Arc::new(Fleet::new(f))),
            upstreams: Arc::new(Upstreams::new(config.upstreams.clone())),
            config: Arc::new(LiveConfig::new(config)),
            breakers: Arc::new(breakers),
            metrics,
            stall: Arc::new(StallWatch::new()),
            ids: Arc::default(),
            runtime: Arc::default(),
            clients: Arc::default(),
            killed: AtomicBool::new(false),
        }
    }
}

impl Handles {
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
