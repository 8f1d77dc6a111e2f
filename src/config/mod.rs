//! Configuration: TOML text → validated `Config`. Every error names file, line and key.
//!
//! Parsing runs in two passes (`parse`). serde (`deny_unknown_fields`, values kept as
//! `toml::Spanned`) checks the shape, and `structure` takes out each offending entry and
//! reads the rest again, so every unknown key (with a "did you mean"), wrong type and
//! missing field is reported in one run. `validate` then checks every value and collects
//! all problems; `spans` turns byte offsets into the file:line:key each error names.
//!
//! Besides malformed values, settings that can never take effect are errors too:
//! - any breaker/rewrite setting on a `passthrough` entry;
//! - `causal` on a `strict` entry (strict never rewrites, so there is nothing to drop or skip);
//! - `slow_read` >= `max_time` (the read would have been cut before it counted as slow);
//! - `primary` in `read_preferences` (primary reads are never eligible);
//! - a trigger code <= 0 (server error codes are positive);
//! - `max_time` below 1ms (it would be sent as `maxTimeMS: 0`, which means "no limit");
//! - a database name holding a character MongoDB forbids in database names;
//! - `admin.listen` equal to `listen` (unless both use port 0);
//! - more than one of `[admin] token`, `token_file`, `token_env` (a token file that cannot be
//!   read, or a variable that is not set, is an error too);
//! - `health_timeout` longer than `health_interval`;
//! - `[upstream_tls] ca` together with `insecure_skip_verify = true`;
//! - `[stall_watch]` settings that cannot act (see `stall`);
//! - `[ladder_guard]` when no entry has a primary rung (`ladder = ["primary", ...]`).
//!
//! `[defaults]` and `[[namespaces]]` are checked in `namespaces` and become a
//! `policy::PolicyTable` (the policy types live in `policy`; they are re-exported here).
//! The operations sections (`[admin]`, `[tls]`, `[upstream_tls]`, health checks) live in
//! `ops`; TLS files are read while validating, so a missing file names its key and line.
//! The write-stall watch (`[stall_watch]`) lives in `stall`; `[fleet]` in `fleet`. `render` draws the effective
//! config for `staleguard check-config`.

use std::path::PathBuf;
use std::time::Duration;

use crate::tls::{ServerTls, UpstreamTls};

mod columns;
mod entry;
mod fleet;
mod namespaces;
mod ops;
mod overlap;
mod parse;
mod render;
mod scalars;
mod spans;
mod stall;
mod structure;
mod values;

pub use crate::policy::{Causal, Mode, NsPolicy, PolicyTable, DEFAULT_TRIGGER_CODES};
pub use fleet::{masked as masked_url, FleetConfig};
pub use ops::{
    ADMIN_HEALTH_LANE, DEFAULT_ADMIN_HEADER_READ_TIMEOUT, DEFAULT_ADMIN_LISTEN,
    DEFAULT_ADMIN_MAX_CONNECTIONS, DEFAULT_ADMIN_MAX_CONNECTIONS_PER_PEER,
    DEFAULT_ADMIN_REQUEST_TIMEOUT, DEFAULT_HEALTH_INTERVAL, DEFAULT_HEALTH_TIMEOUT,
    DEFAULT_HISTORY_INTERVAL,
};
pub use render::{explain, read_pref_names, render_table};
pub use scalars::MAX_DURATION;
pub use stall::{
    Credentials, ProbeConfig, Secret, ShardsConfig, StallAction, StallConfig, DEFAULT_STALL_AFTER,
};

/// Default `listen`.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:27018";
/// Default single entry of `upstreams`.
pub const DEFAULT_UPSTREAM: &str = "127.0.0.1:27017";
/// Smallest accepted `max_message_size` (bytes).
pub const MIN_MESSAGE_SIZE: usize = 16_384;
/// Largest accepted `max_message_size` (bytes): the wire length is an `i32`.
pub const MAX_MESSAGE_SIZE_LIMIT: usize = i32::MAX as usize;

/// The proxy's configuration. Reload (SIGHUP or file change) validates the whole file first
/// and keeps the old config on any error.
#[derive(Debug, Clone)]
pub struct Config {
    /// The file this was read from.
    pub source: PathBuf,
    /// `listen`: where applications connect, `host:port`. Default `127.0.0.1:27018`.
    /// Needs a restart.
    pub listen: String,
    /// `upstreams`: mongos routers, `host:port` each. Default `["127.0.0.1:27017"]`; not
    /// empty. Reloads: new client connections use the new list.
    pub upstreams: Vec<String>,
    /// `max_message_size`: largest wire message accepted, in bytes. Default 48000000;
    /// 16384..=2147483647. Reloads: applies to new connections.
    pub max_message_size: usize,
    /// `connect_timeout`: time allowed to connect to an upstream. Default 5s; not zero.
    /// Reloads: applies to the next connection attempt.
    pub connect_timeout: Duration,
    /// `shutdown_timeout`: how long a graceful stop waits for connections to finish.
    /// Default 10s; zero stops at once. Reloads.
    pub shutdown_timeout: Duration,
    /// `layout`: how client sessions are spread over threads (`per-core`, `shared`,
    /// `uring`). Default `per-core`. Needs a restart.
    pub layout: Layout,
    /// `[admin] listen`: address of the HTTP admin endpoint. Default `127.0.0.1:9187` in a
    /// file (`[admin] enabled = false` turns it off), none in [`Config::for_upstreams`].
    /// Needs a restart.
    pub admin_listen: Option<String>,
    /// `[admin] token`, or the content of `token_file`, or the value of the environment
    /// variable `token_env` (at most one of them): bearer token required for every admin
    /// route but `/healthz` and `/readyz`. Default none (no authentication). Reloads (the
    /// file and the variable are read again).
    pub admin_token: Option<String>,
    /// `[admin] header_read_timeout`, `request_timeout`, `max_connections`: what one admin
    /// HTTP client may hold. Reloads (new admin connections).
    pub admin_limits: AdminLimits,
    /// `health_interval`: time between two `hello` checks of each upstream; `"off"` (none)
    /// disables them. Default 5s in a file, off in [`Config::for_upstreams`]. Reloads (from
    /// the next check).
    pub health_interval: Option<Duration>,
    /// `health_timeout`: time a check (connect, TLS and `hello`) may take. Default 2s; at
    /// most `health_interval`. Reloads.
    pub health_timeout: Duration,
    /// `[tls]`: client-facing TLS (`cert`, `key`, optional `client_ca`). Default none
    /// (plain TCP). Turning it on or off needs a restart; new files (certificate rotation)
    /// reload and apply to new connections.
    pub tls: Option<ServerTls>,
    /// `[upstream_tls]`: TLS to mongos (`ca`, `server_name`, optional `cert`/`key`,
    /// `insecure_skip_verify`). Default none (plain TCP). Reloads: new upstream connections.
    pub upstream_tls: Option<UpstreamTls>,
    /// `[defaults]` and `[[namespaces]]`: per-namespace policies. Default none (every read
    /// passes through). Reloads.
    pub policy: PolicyTable,
    /// `[stall_watch]`: the write-progress watch and its action. Default in a file: the
    /// passive watch with `observe`; off in [`Config::for_upstreams`]. Reloads.
    pub stall: StallConfig,
    /// `[ladder_guard]`: how many primary-rung reads each upstream may carry. Reloads (the
    /// next ladder read is judged against the new limits).
    pub ladder_guard: LadderGuardConfig,
    /// `[confirm]`: the login staleguard's own connections use for confirming reads
    /// (`username` with `password` or `password_env`, optional `auth_source`). Default
    /// none: they read unauthenticated. Reloads (the clients are made again).
    pub confirm: ConfirmConfig,
    /// The resource limits (top-level keys `max_connections`, `max_connections_per_peer`,
    /// `message_timeout`, `first_message_timeout`, `idle_timeout`, `write_timeout`,
    /// `max_pending_reads`).
    pub limits: Limits,
    /// `breaker_share`: the largest share of the breaker map's wildcard pool (the slots
    /// exact patterns do not reserve) one wildcard pattern may hold. Default 0.5; above 0,
    /// at most 1. Reloads.
    pub breaker_share: f64,
    /// `[fleet]`: shared breaker openings and fleet budgets through Redis (see `fleet`).
    /// Default none: no Redis code runs. Needs a restart, but for
    /// `[ladder_guard] fleet_max_per_second` and `fleet_max_in_flight`, which reload.
    pub fleet: Option<FleetConfig>,
}

/// The admin endpoint's bounds on its HTTP clients.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AdminLimits {
    /// `header_read_timeout`: time a client has to send a request's whole head, from its
    /// connection or from the end of the previous response (so it also closes idle
    /// keep-alive connections). Default 5s; not zero.
    pub header_read_timeout: Duration,
    /// `request_timeout`: time from a request's head being read until its response is
    /// written; past it the connection is closed (an idle keep-alive connection too, once
    /// its last request is that old). Default 10s; not zero.
    pub request_timeout: Duration,
    /// `max_connections`: admin connections open at once; the next one goes to the health
    /// lane (`/healthz` and `/readyz` answered, anything else a bare `503 Service
    /// Unavailable`) and is closed. Default 64; 1..=65536.
    pub max_connections: usize,
    /// `max_connections_per_peer`: admin connections open at once from one IP address; the
    /// next one from that address is treated as past `max_connections`. Default 16;
    /// 1..=65536.
    pub max_connections_per_peer: usize,
    /// `history_interval`: the width of one bucket of the status page's plots (they keep
    /// `events::BUCKETS` of them: 30 minutes at the default). Default 10s; 1s..=60s.
    /// Reloads (a new width starts the plots afresh).
    pub history_interval: Duration,
}

impl Default for AdminLimits {
    fn default() -> Self {
        AdminLimits {
            header_read_timeout: DEFAULT_ADMIN_HEADER_READ_TIMEOUT,
            request_timeout: DEFAULT_ADMIN_REQUEST_TIMEOUT,
            max_connections: DEFAULT_ADMIN_MAX_CONNECTIONS,
            max_connections_per_peer: DEFAULT_ADMIN_MAX_CONNECTIONS_PER_PEER,
            history_interval: DEFAULT_HISTORY_INTERVAL,
        }
    }
}

/// `[ladder_guard]`: the per-upstream limits on reads sent to the primary rung; past
/// either, a read fails fast (strict) or goes `available` (fallback) as without a ladder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LadderGuardConfig {
    /// `max_in_flight`: primary-rung reads waiting for their reply at once, per upstream.
    /// Default 16; at least 1.
    pub max_in_flight: u32,
    /// `max_per_second`: primary-rung reads started per second, per upstream. Default 100;
    /// at least 1.
    pub max_per_second: u32,
    /// `per_connection`: primary-rung reads one client connection may have waiting at once
    /// (so that one client cannot take every slot of `max_in_flight`). Default 4; at least 1.
    /// A primary-rung read is only sent when nothing earlier waits on its connection, so a
    /// connection holds one slot at most in practice.
    pub per_connection: u32,
    /// `per_connection_per_second`: primary-rung reads one client connection may start per
    /// second (so that a few clients cannot spend all of `max_per_second`). Default a tenth
    /// of `max_per_second` (10), at least 1; 1..=`max_per_second`.
    pub per_connection_per_second: u32,
}

impl Default for LadderGuardConfig {
    fn default() -> Self {
        LadderGuardConfig {
            max_in_flight: 16,
            max_per_second: 100,
            per_connection: 4,
            per_connection_per_second: 10,
        }
    }
}

/// Default `breaker_share`: one wildcard pattern may hold at most half the breaker map's
/// pool.
pub const DEFAULT_BREAKER_SHARE: f64 = 0.5;
/// Default `max_connections`.
pub const DEFAULT_MAX_CONNECTIONS: usize = 10_000;
/// Default `message_timeout`.
pub const DEFAULT_MESSAGE_TIMEOUT: Duration = Duration::from_secs(30);
/// Default `write_timeout`.
pub const DEFAULT_WRITE_TIMEOUT: Duration = Duration::from_secs(30);
/// The bytes every session together may hold whole for mongos (large requests a policy may
/// need whole, read before they can be sent): past it a session reads no more of such a
/// request until room comes back (`session::upload`). Counted in units of
/// [`HELD_UNIT`] bytes.
pub const HELD_FOR_UPSTREAM: usize = 64 * 1024 * 1024;
/// See [`HELD_FOR_UPSTREAM`].
pub const HELD_UNIT: usize = 1024;
/// Default `max_pending_reads`.
pub const DEFAULT_MAX_PENDING_READS: usize = 1_000;
/// Default `first_message_timeout`: a driver sends its handshake at once.
pub const DEFAULT_FIRST_MESSAGE_TIMEOUT: Duration = Duration::from_secs(10);
/// Default `idle_timeout`: longer than any pause a pooled driver connection makes while it
/// is in use (see docs/configuration.md), so only connections left unused are
/// closed; drivers open a new one when they need it.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(30 * 60);

/// What one client may hold of the proxy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// `max_connections`: client connections open at once; the next one is refused (an
    /// error reply to its first message when it sends one within a second, else a close).
    /// Default 10000; 1..=1000000. Reloads: applies to the next accept.
    pub max_connections: usize,
    /// `message_timeout`: time a client has to finish a message once its first byte
    /// arrived; past it the client is closed. Default 30s; not zero. Reloads: applies to
    /// each connection's next message.
    pub message_timeout: Duration,
    /// `first_message_timeout`: time a new client has, from its accept (after the TLS
    /// handshake), to send its whole first message; past it the client is closed. Default
    /// 10s; not zero. Reloads: applies to new connections.
    pub first_message_timeout: Duration,
    /// `idle_timeout`: a client that sends nothing for this long, with nothing in flight,
    /// is closed. Default 30m; `"off"` turns it off. Reloads: applies to each connection's
    /// next check.
    pub idle_timeout: Option<Duration>,
    /// `max_connections_per_peer`: client connections one peer address (IP) may have open
    /// at once; the next one is refused like one past `max_connections`. Default off
    /// (none); 1..=1000000. Reloads: applies to the next accept.
    pub max_connections_per_peer: Option<usize>,
    /// `write_timeout`: a client that takes none of the bytes waiting for it (replies it
    /// does not read) for this long is closed. Default 30s; not zero. Reloads: applies to
    /// each connection's next message.
    pub write_timeout: Duration,
    /// `max_pending_reads`: tracked reads one connection may have waiting for replies;
    /// past it reads are forwarded untracked (no retry, no evidence). Default 1000;
    /// 1..=100000. Reloads: applies to each connection's next message.
    pub max_pending_reads: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: DEFAULT_MAX_CONNECTIONS,
            message_timeout: DEFAULT_MESSAGE_TIMEOUT,
            first_message_timeout: DEFAULT_FIRST_MESSAGE_TIMEOUT,
            idle_timeout: Some(DEFAULT_IDLE_TIMEOUT),
            max_connections_per_peer: None,
            write_timeout: DEFAULT_WRITE_TIMEOUT,
            max_pending_reads: DEFAULT_MAX_PENDING_READS,
        }
    }
}

/// `layout`: where a client connection's session (the client socket, its upstream socket
/// and the relay between them) runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Layout {
    /// One single-threaded runtime per core; each accepted connection is handed to the next
    /// one in turn and stays there, its wake-ups never crossing threads. What HAProxy and
    /// Envoy do with their threads (the default: no worker wakes another for a message).
    #[default]
    PerCore,
    /// Every session on the one multi-threaded runtime, moved between its workers by work
    /// stealing.
    Shared,
    /// `PerCore`, with each session thread's plain TCP sockets (clients and upstreams; TLS
    /// ones stay on epoll) driven by one io_uring per thread (crate `staleguard-ring`).
    /// Linux only; the proxy does not start when the ring cannot be set up.
    Uring,
}

impl Layout {
    /// The value as written in the file.
    pub fn name(self) -> &'static str {
        match self {
            Layout::PerCore => "per-core",
            Layout::Shared => "shared",
            Layout::Uring => "uring",
        }
    }
}

/// A configuration problem, located.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}:{line}: {key}: {message}")]
pub struct ConfigError {
    pub file: String,
    /// 1-based; 0 when the problem is the file itself (unreadable).
    pub line: usize,
    /// Dotted path such as `namespaces[2].window` (entries counted from 0); `syntax` for a
    /// TOML syntax error, `file` for an unreadable file.
    pub key: String,
    pub message: String,
}

impl Config {
    /// All defaults, no `[[namespaces]]`: a pure relay from `listen` to `upstreams`.
    /// (Tests and embedders use this; the binary always reads a file.)
    pub fn for_upstreams(listen: &str, upstreams: Vec<String>) -> Config {
        Config {
            source: PathBuf::from("<built-in>"),
            listen: listen.to_string(),
            upstreams,
            max_message_size: crate::wire::DEFAULT_MAX_MESSAGE_SIZE,
            connect_timeout: Duration::from_secs(5),
            shutdown_timeout: Duration::from_secs(10),
            layout: Layout::default(),
            admin_listen: None,
            admin_token: None,
            admin_limits: AdminLimits::default(),
            health_interval: None,
            health_timeout: DEFAULT_HEALTH_TIMEOUT,
            tls: None,
            upstream_tls: None,
            policy: PolicyTable::default(),
            stall: StallConfig::off(),
            ladder_guard: LadderGuardConfig::default(),
            limits: Limits::default(),
            breaker_share: DEFAULT_BREAKER_SHARE,
            fleet: None,
            confirm: ConfirmConfig::default(),
        }
    }
}

/// `[confirm]`: how staleguard's own connections for confirming reads log in, and whether
/// open breakers ask their own question (`breaker::own`).
#[derive(Debug, Clone, PartialEq)]
pub struct ConfirmConfig {
    /// Default none (unauthenticated: on a cluster that requires authentication, every
    /// confirming read is refused and time limits never count).
    pub credentials: Option<Credentials>,
    /// `own_questions`: while a breaker is open and read, staleguard asks the cluster twelve
    /// cheap reads of its own every `min_cooldown`, and two answered in a row close it.
    /// Default true; false leaves closing to the streak of samples and its question.
    pub own_questions: bool,
}

impl Default for ConfirmConfig {
    fn default() -> Self {
        ConfirmConfig {
            credentials: None,
            own_questions: true,
        }
    }
}
