//! What the demo needs of a staleguard proxy: start one from a config file's text, its
//! addresses, what its breakers and write-stall signals say, its orphan estimate, and a
//! stop. The proxy's crate implements it (`staleguard::demo_proxy`), so this crate does not
//! depend on the proxy and the proxy's binary can run the demo.

use std::error::Error;
use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::time::Instant;

/// One namespace's breaker as the demo reports it.
#[derive(Debug, Clone)]
pub struct BreakerView {
    pub ns: String,
    pub open: bool,
    /// Held open by the write-stall watch.
    pub held: bool,
    /// Why it last changed, in words.
    pub last_reason: String,
}

/// Where a write-stall signal's evidence comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StallKind {
    /// The writes the proxy relays.
    Passive,
    /// The proxy's own write probe.
    Probe,
    /// A shard primary's `serverStatus`.
    Composite,
}

/// One write-stall signal as the demo reports it.
#[derive(Debug, Clone)]
pub struct SignalView {
    pub kind: StallKind,
    /// Stable key of the signal.
    pub target: String,
    /// In words: `upstream 127.0.0.1:27017`, `shard A (...)`.
    pub place: String,
    pub raised: bool,
    /// While raised: since when writes have not been completing.
    pub since: Option<Instant>,
    /// The evidence in one line.
    pub summary: String,
}

/// A running proxy.
pub trait Proxy: Send + Sync {
    /// The address clients connect to.
    fn local_addr(&self) -> SocketAddr;
    /// The admin endpoint's address, when it has one.
    fn admin_addr(&self) -> Option<SocketAddr>;
    fn breakers(&self) -> Vec<BreakerView>;
    fn stall_signals(&self) -> Vec<SignalView>;
    /// Documents the proxy saw twice in one `available` reply of `ns`.
    fn orphans_estimated(&self, ns: &str) -> u64;
    fn shutdown(self) -> impl Future<Output = ()>;
}

/// Starts proxies for the demo.
pub trait Launch {
    type Proxy: Proxy;
    /// The proxy's default `min_wait` (the demo lowers it to its payment time limit).
    const DEFAULT_MIN_WAIT: Duration;
    /// The proxy's default `[admin] listen`; when it is taken, `start` puts the page on a
    /// free port instead.
    const DEFAULT_ADMIN_LISTEN: &'static str;
    /// Starts a proxy from the text of a config file; without the admin endpoint unless
    /// `admin` (two proxies cannot both have the default admin address). With `admin`, the
    /// endpoint is on the default address, or on a free port when that one is taken.
    fn start(
        &self,
        config: &str,
        admin: bool,
    ) -> impl Future<Output = Result<Self::Proxy, Box<dyn Error>>>;
}
