//! The proxy as the demo (crate `staleguard-demo`, `crates/demo`) sees it: [`InProcess`]
//! starts a proxy in this process from the text of a config file, and a [`Running`] proxy
//! tells the demo its addresses, its breakers, its write-stall signals and its orphan
//! estimate. The demo's crate defines what it needs; this is the only place it meets the
//! proxy.

use std::error::Error;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use staleguard_demo::{BreakerView, Launch, Proxy, SignalView, StallKind};

use crate::breaker::State;
use crate::config::Config;
use crate::server::{self, Running};
use crate::stall::SignalKind;

/// Starts proxies in this process (`staleguard demo`, tests/demo.rs).
pub struct InProcess;

impl Launch for InProcess {
    type Proxy = Running;
    const DEFAULT_MIN_WAIT: Duration = crate::policy::DEFAULT_MIN_WAIT;
    const DEFAULT_ADMIN_LISTEN: &'static str = crate::config::DEFAULT_ADMIN_LISTEN;

    async fn start(&self, config: &str, admin: bool) -> Result<Running, Box<dyn Error>> {
        let mut cfg = Config::parse(config, std::path::Path::new("<demo>"))
            .map_err(|e| format!("demo config: {e:?}"))?;
        if !admin {
            cfg.admin_listen = None;
        }
        // The default admin address may be taken (a staleguard already running here, another
        // demo): the demo's page then goes on a free port, which the demo prints.
        let default = Some(crate::config::DEFAULT_ADMIN_LISTEN);
        if cfg.admin_listen.as_deref() == default
            && std::net::TcpListener::bind(crate::config::DEFAULT_ADMIN_LISTEN).is_err()
        {
            cfg.admin_listen = Some("127.0.0.1:0".to_string());
        }
        Ok(server::start(Arc::new(cfg)).await?)
    }
}

impl Proxy for Running {
    fn local_addr(&self) -> SocketAddr {
        Running::local_addr(self)
    }

    fn admin_addr(&self) -> Option<SocketAddr> {
        Running::admin_addr(self)
    }

    fn breakers(&self) -> Vec<BreakerView> {
        let snapshots = self.shared().breakers.snapshot();
        snapshots
            .into_iter()
            .map(|s| BreakerView {
                ns: s.ns,
                open: s.state == State::Open,
                held: s.held,
                last_reason: s.last_reason,
            })
            .collect()
    }

    fn stall_signals(&self) -> Vec<SignalView> {
        let signals = self.shared().stall.signals();
        signals
            .into_iter()
            .map(|s| SignalView {
                kind: match s.kind {
                    SignalKind::Passive => StallKind::Passive,
                    SignalKind::Probe => StallKind::Probe,
                    SignalKind::Composite => StallKind::Composite,
                },
                target: s.target,
                place: s.place,
                raised: s.raised,
                since: s.since,
                summary: s.summary,
            })
            .collect()
    }

    fn orphans_estimated(&self, ns: &str) -> u64 {
        self.shared().metrics.ladder.orphans_of(ns)
    }

    async fn shutdown(self) {
        Running::shutdown(self).await
    }
}
