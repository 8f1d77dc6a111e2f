//! staleguard: a MongoDB wire-protocol proxy that keeps secondary reads answering (or failing
//! fast) when a shard's routing metadata cannot be refreshed.
//!
//! The path of one message:
//!
//! ```text
//! server   accept loop, one session task per client connection, graceful stop
//!   └─ session   pairs the client with its own upstream connection (upstream) and relays
//!        │       frames both ways (wire::codec: whole messages as Bytes, never copied;
//!        │       large replies nothing inspects passed on in pieces, wire::replies);
//!        │       each request opened once (wire::Request), each reply's header read once
//!        │       (wire::Reply); writes queued per peer, never awaited in the way of the
//!        │       other direction or a stop
//!        ├─ command    one pass over the body, from the opened request: command,
//!        │             namespaces, read preference, ...
//!        ├─ policy     patterns + breaker state → Decision (decide, pure); how a tracked
//!        │             read ended → Verdict (judge, pure): success, fail, or the next
//!        │             rung of the ladder (primary, then available)
//!        ├─ rewrite    readConcern/maxTimeMS/$readPreference splice, lengths and checksum fixed
//!        └─ breaker    per-namespace sliding window, closed/open; samples while open, closes on a streak
//! ```
//!
//! The layers, top to bottom. A module imports only modules of the layers below its own
//! (`tests/layers.rs` checks it); shared state is defined low, as narrow handles, and handed
//! down by whoever starts the task that uses it:
//!
//! ```text
//! demo_proxy        (beside the proxy) what the demo (crates/demo) reads of a running proxy
//! server            accept loop; builds the Handles, starts the tasks, hands each its handles
//! admin   reload    HTTP (/metrics, /status, the page, /healthz, /readyz) · config reload
//! session           the relay: request policy, reply judgement, the ladder's rungs, the
//!                   orphan estimate
//! handles           Handles: one Arc of each handle (the server's); the narrow views it
//!                   hands out: SessionHandles, AdminHandles, ReloadHandles
//! fleet             with `[fleet]`: breaker openings, budgets and probe leadership shared
//!                   through Redis
//! health  stall     tasks: periodic hello per upstream · the write-progress watch (its
//! confirm           signals and the write counters sessions feed) · questions to the
//!                   cluster before a time limit counts (staleguard's own connections);
//!                   each gets a few handles
//! state   breaker   live config + generation, ids, runtime facts · the breakers (they log
//! upstream          and count their own transitions, and hold open for the stall watch) ·
//!                   choosing and dialing mongos, their health, their ladder guards
//! config            TOML → validated Config
//! policy            the pattern table; decide, judge and the ladder (pure); what a decision means
//! metrics tls rewrite logs   every metric name · rustls · splicing (at the places
//!                   classification found) · the pretty log's field formatter (client
//!                   strings escaped)
//! command           classification: one pass over the body, from the opened request
//! events            the recent past, bounded: the ring of events, the plots' series
//! wire    sim       the crates below the proxy (protocol; the simulated cluster)
//! demo              the crate beside it: the incident told with numbers, against sim
//! ```
//!
//! `config` turns TOML into the validated `Config` that all of the above read; `reload`
//! swaps in a new one (SIGHUP, file change) without dropping connections: sessions notice
//! the generation of `state::LiveConfig` move and re-read it.
//!
//! Around the relay: `tls` (rustls acceptor and connector, and the `Stream` either leg
//! runs on), `upstream` (choosing and dialing mongos) with `health` (periodic `hello`),
//! `metrics` (every metric name) and `admin` (HTTP: `/metrics`, `/status`, the status page,
//! `/healthz`, `/readyz`).
//!
//! `stall` watches write progress (the writes sessions relay, an optional write probe, an
//! optional `serverStatus` rule per shard primary) and, when configured, holds the breakers
//! of fallback namespaces open while writes are not completing, before reads fail.
//!
//! Below everything: `wire` (crate `staleguard-wire`): framing, message views and builders,
//! the BSON element scanner, request bodies and reply status; and, with `layout = "uring"`
//! (Linux), crate `staleguard-ring`: plain TCP sockets driven by one io_uring per session
//! thread, as tokio streams (`tls::Stream::Ring`), set up by `server`'s session threads. It
//! holds the workspace's unsafe code; this crate forbids it.
//!
//! Beside the proxy, with the `sim` feature (on by default): `sim` (crate `staleguard-sim`) is
//! a model of a sharded cluster (a mongos front, shards of a primary and two secondaries,
//! per-node routing tables, stalled primaries, migrations and orphans) that the tests and
//! `demo` run against; `demo` (crate `staleguard-demo`) tells the incident with numbers,
//! through proxies that `demo_proxy` starts.

#![forbid(unsafe_code)]

pub mod admin;
pub mod breaker;
pub mod command;
pub mod config;
pub mod confirm;
#[cfg(feature = "sim")]
pub mod demo_proxy;
pub mod events;
pub mod fleet;
pub mod handles;
pub mod health;
pub mod logs;
pub mod metrics;
pub mod policy;
pub mod reload;
pub mod rewrite;
pub mod server;
pub mod session;
/// `staleguard demo` (crate `staleguard-demo`, `crates/demo`), with the `sim` feature; it
/// starts its proxies through [`demo_proxy::InProcess`].
#[cfg(feature = "sim")]
pub use staleguard_demo as demo;
/// The simulated sharded cluster (crate `staleguard-sim`, `crates/sim`), with the `sim` feature.
#[cfg(feature = "sim")]
pub use staleguard_sim as sim;
pub mod stall;
pub mod state;
pub mod tls;
pub mod upstream;
/// The wire protocol (crate `staleguard-wire`, `crates/wire`): framing, message views and
/// builders, the BSON element scanner, request bodies and reply status.
pub use staleguard_wire as wire;
