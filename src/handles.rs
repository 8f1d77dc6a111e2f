//! The handles of one running proxy, gathered: what a session, the admin endpoint and a
//! reload are given. Each field is its own `Arc`, so the background tasks (`health`,
//! `stall`) are handed only the few they use.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use crate::breaker::{Breakers, DEFAULT_MAX_BREAKERS};
use crate::config::Config;
use crate::metrics::Metrics;
use crate::stall::StallWatch;
use crate::state::{ClientSlots, Ids, LiveConfig, Runtime};
use crate::upstream::Upstreams;

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
}

impl Handles {
    pub fn new(config: Arc<Config>) -> Handles {
        let metrics = Arc::new(Metrics::new());
        crate::state::publish_limits(&metrics, &config, DEFAULT_MAX_BREAKERS);
        let breakers = Breakers::with_metrics(DEFAULT_MAX_BREAKERS, metrics.clone());
        breakers.set_patterns(&config.policy, config.breaker_share);
        Handles {
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
