//! `layout`: with `per-core` every session runs on a session thread, one per core, and those
//! threads end with the proxy; `shared` (the default) starts none. Both relay for the
//! official driver.

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use bson::{doc, Document};
use futures::TryStreamExt;
use staleguard::config::{Config, Layout};
use support::mongos::FakeMongos;
use support::within;

/// This process's session threads: (thread id, time run so far in ns).
fn session_threads() -> Vec<(String, u64)> {
    let mut out = Vec::new();
    for task in std::fs::read_dir("/proc/self/task").expect("/proc/self/task") {
        let dir = task.expect("task").path();
        let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
        if !comm.starts_with("sg-session-") {
            continue;
        }
        // The first field of schedstat: time spent on a CPU, in nanoseconds.
        let ran = std::fs::read_to_string(dir.join("schedstat"))
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse().ok())
            .unwrap_or(0);
        out.push((comm.trim().to_string(), ran));
    }
    out.sort();
    out
}

fn ran(threads: &[(String, u64)]) -> u64 {
    threads.iter().map(|t| t.1).sum()
}

/// Starts a proxy with `layout` in front of `fake`, runs 200 finds through the driver, and
/// returns the proxy.
async fn relay_finds(fake: &FakeMongos, layout: Layout) -> staleguard::server::Running {
    let mut cfg = Config::for_upstreams("127.0.0.1:0", vec![fake.addr().to_string()]);
    cfg.layout = layout;
    let proxy = staleguard::server::start(Arc::new(cfg))
        .await
        .expect("proxy starts");
    let uri = format!(
        "mongodb://{}/?directConnection=true&serverSelectionTimeoutMS=5000",
        proxy.local_addr()
    );
    let client = mongodb::Client::with_uri_str(uri).await.expect("driver");
    let coll = client.database("t").collection::<Document>(layout.name());
    coll.insert_many((0..5).map(|i| doc! {"_id": i}))
        .await
        .expect("insert through the proxy");
    for _ in 0..200 {
        let docs: Vec<Document> = within("find", async {
            coll.find(doc! {}).await.expect("find").try_collect().await
        })
        .await
        .expect("cursor");
        assert_eq!(docs.len(), 5);
    }
    client.shutdown().await;
    proxy
}

/// One test for both layouts, so that no other proxy of this binary starts session threads
/// while it counts them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_core_sessions_live_on_session_threads_that_end_with_the_proxy() {
    assert!(session_threads().is_empty(), "{:?}", session_threads());
    let fake = FakeMongos::start().await;

    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let before = Instant::now();
    let proxy = relay_finds(&fake, Layout::PerCore).await;
    let threads = session_threads();
    let names: Vec<String> = (0..cores).map(|i| format!("sg-session-{i}")).collect();
    assert_eq!(
        threads.iter().map(|t| t.0.clone()).collect::<Vec<_>>(),
        names
    );
    // The relay's work happened there: 200 round trips of reading, classifying and writing
    // take tens of milliseconds of those threads' time in a debug build; run elsewhere, the
    // same finds leave them under one (the accept loop and the upstreams are elsewhere).
    assert!(
        ran(&threads) > 5_000_000,
        "session threads ran {} ns in {:?}",
        ran(&threads),
        before.elapsed()
    );
    proxy.shutdown().await;
    let deadline = Instant::now() + Duration::from_secs(5);
    while !session_threads().is_empty() {
        assert!(
            Instant::now() < deadline,
            "session threads outlived the proxy: {:?}",
            session_threads()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let proxy = relay_finds(&fake, Layout::Shared).await;
    assert!(session_threads().is_empty(), "{:?}", session_threads());
    proxy.shutdown().await;
}
