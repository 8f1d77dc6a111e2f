//! Test support shared by the integration tests: an in-process fake mongos, a raw wire
//! client, a recording TCP tap, and runners for real clients (pymongo, Node.js). Each test
//! file uses only part of it.
#![allow(dead_code)]

pub mod bin;
pub mod child;
pub mod js;
pub mod mongos;
pub mod py;
pub mod raw;
pub mod tap;

use std::future::IntoFuture;
use std::time::Duration;

/// How long any single network step in a test may take before the test fails.
pub const STEP: Duration = Duration::from_secs(10);

/// Awaits `fut`, failing the test with `what` if it takes longer than [`STEP`].
pub async fn within<T>(what: &str, fut: impl IntoFuture<Output = T>) -> T {
    match tokio::time::timeout(STEP, fut.into_future()).await {
        Ok(v) => v,
        Err(_) => panic!("timed out after {STEP:?}: {what}"),
    }
}
