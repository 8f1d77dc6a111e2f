//! The integration tests, as one test binary (`[[test]] name = "it"` in Cargo.toml, with
//! `autotests = false`): each file of `tests/` is a module of this crate, so `cargo test`
//! compiles the shared helpers and links the proxy, the driver and the rest into one
//! executable rather than one per file (issue 32: fifty executables of about 45 MB each were
//! most of `target/`). Run one file's tests with a name filter: `cargo test --test it policy::`
//! (a substring of the test's path: `evidence::` runs `stall_evidence::` too).
//!
//! To add a test file `tests/foo.rs`:
//! - declare it below, `mod foo;`, in alphabetical order; behind `#[cfg(feature = "sim")]`
//!   when it uses `staleguard::sim` or `staleguard::demo` (directly or through a `#[path]`
//!   file), so that `cargo test --no-default-features` still builds;
//! - in the file, reach the shared helpers with `use crate::support;` (and
//!   `use crate::ops_support;`, `use crate::policy_support;`), not `mod support;`.
//!
//! Tests here run two at a time in one process (libtest's threads), next to tests of other
//! files. A file whose tests cannot is a test binary of its own (a `[[test]]` entry in
//! Cargo.toml; it keeps `mod support;`), run alone after this one:
//! - it changes what the whole process shares: installs a global tracing subscriber
//!   (`close_log.rs`), counts the process's own threads (`layout.rs`), sets resource limits
//!   or signal dispositions on itself;
//! - it is an incident in real time whose verdict compares timings of two paths (`demo.rs`:
//!   the ladder's p99 below direct's; `partial.rs`: failures through staleguard come faster
//!   than direct), or it keeps both cores busy for a minute (`soak.rs`): a neighbour would
//!   change its result, or have its own changed.
//!
//! Environment variables a test sets carry a name no other test reads. `test_files.rs` fails
//! when a file of `tests/` is built by nothing, or twice.

// Shared helpers.
mod ops_support;
mod policy_support;
mod support;

// The fuzz crate's properties and seeds for `fuzz_smoke.rs`, here because `seeds.rs` names
// `crate::msgs` and `crate::props`.
#[path = "../benches/common/msgs.rs"]
mod msgs;
#[path = "../crates/fuzz/src/props.rs"]
mod props;
#[path = "../crates/fuzz/src/seeds.rs"]
mod seeds;

mod admin;
mod admin_limits;
mod breaker_map;
mod check_config;
mod codec;
mod command;
mod config;
mod connections;
mod deploy;
mod dry_run;
mod evidence;
mod evidence_rule;
mod fake_mongos;
#[cfg(feature = "sim")]
mod fleet;
mod fuzz_smoke;
mod health;
mod integrity;
mod judged_pieces;
mod ladder;
#[cfg(feature = "sim")]
mod ladder_attack;
mod layers;
mod limits;
mod log_escape;
mod max_time;
mod memory;
mod metrics_format;
mod node_driver;
#[cfg(feature = "sim")]
mod page_history;
mod parse_once;
mod pending;
mod policy;
mod policy_pymongo;
#[cfg(feature = "sim")]
mod policy_sim;
#[cfg(feature = "sim")]
mod prometheus;
mod relay;
mod reload;
mod reused_request_id;
mod rewrite;
mod shutdown;
#[cfg(feature = "sim")]
mod sim;
#[cfg(feature = "sim")]
mod stall;
#[cfg(feature = "sim")]
mod stall_evidence;
mod test_files;
mod tls;
