//! The read policy seen from pymongo: a Python script (`tests/py/policy_check.py`) runs
//! against staleguard started in-process in front of the fake mongos.
//!
//! The venv lives in `<target dir>/pyvenv` (`$CARGO_TARGET_DIR` or `./target`) and is made
//! once by `tests/py/ensure_venv.py` under a file lock, so parallel tests and test processes
//! share it. If it cannot be made (no python3, no registry), the tests fail with the reason:
//! they never skip silently.

use crate::policy_support;
use crate::support;

use std::time::Duration;

use staleguard::breaker::State;

use policy_support::*;
use support::mongos::Hooked;
use support::py::run_check;

const INVENTORY: &str = "demo.store_inventory";
const ACCOUNTS: &str = "pay.accounts";

fn uri(env: &Env) -> String {
    format!("mongodb://{}/?directConnection=false", env.addr())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pymongo_fallback_stale_config_is_hidden_by_a_retry() {
    let env = Env::start(BASE_NAMESPACES).await;
    env.fake.seed(INVENTORY, seed_docs(5));
    let fault = stale_reads(
        &env.fake,
        "store_inventory",
        13388,
        Duration::from_millis(100),
    );
    run_check("policy_check.py", "fallback-retry", vec![uri(&env)]).await;
    assert_eq!(fault.hits(), 1);
    let sent = env.sent_by_driver("find", "store_inventory");
    assert_eq!(sent.len(), 1, "pymongo sent one find and saw no error");
    let up = env.upstream("find", "store_inventory");
    assert_eq!(up.len(), 2);
    assert_eq!(up[0], sent[0], "first attempt as pymongo sent it");
    let (original, resend) = (body(&up[0]), body(&up[1]));
    assert_available_resend(&original, &resend);
    assert_eq!(env.state(INVENTORY), State::Closed);
    assert_eq!(env.errors(INVENTORY), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pymongo_strict_breaker_fails_fast() {
    let env = Env::start(BASE_NAMESPACES).await;
    env.fake.seed(ACCOUNTS, seed_docs(1));
    let _fault = stale_reads(&env.fake, "accounts", 13388, Duration::ZERO);
    let out = run_check("policy_check.py", "strict-fail-fast", vec![uri(&env)]).await;
    assert!(out.contains("staleguard:"), "{out}");
    assert_eq!(env.state(ACCOUNTS), State::Open);
    assert_eq!(
        env.upstream("find", "accounts").len(),
        3,
        "the fail-fast read was not sent"
    );
    assert_eq!(
        env.sent_by_driver("find", "accounts").len(),
        4,
        "pymongo did not retry the fail-fast reply"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pymongo_socket_timeouts_never_open_the_breaker() {
    let env = Env::start(BASE_NAMESPACES).await;
    env.fake.seed(INVENTORY, seed_docs(5));
    let slow = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let s = slow.clone();
    env.fake.set_hook(move |b| {
        (s.load(std::sync::atomic::Ordering::SeqCst) && is_read_on(b, "store_inventory"))
            .then(|| Hooked::delay(Duration::from_millis(1000)))
    });
    run_check("policy_check.py", "socket-timeouts", vec![uri(&env)]).await;
    // A client that gives up is never evidence (its own timeout; nothing left to confirm on).
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(env.state(INVENTORY), State::Closed);
    assert_eq!(env.errors(INVENTORY), 0);
    slow.store(false, std::sync::atomic::Ordering::SeqCst);
    run_check("policy_check.py", "fallback-read", vec![uri(&env)]).await;
    let up = env.upstream_bodies("find", "store_inventory");
    assert_eq!(up.len(), 4, "three timed out, one plain");
    assert_eq!(level(up.last().expect("a find")).as_deref(), None);
}

/// `on_open = "bound"` (the default) through pymongo: an open strict breaker fails only the
/// reads that meet a stale secondary on both of their bounded attempts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pymongo_open_strict_breaker_fails_only_what_fails() {
    let ns = BASE_NAMESPACES.replace("on_open = \"refuse\"\n", "");
    let env = Env::start(&ns).await;
    env.fake.seed(ACCOUNTS, seed_docs(1));
    env.fake.set_hook(|b| {
        let stale = b
            .get_document("filter")
            .ok()
            .is_some_and(|f| f.get("stale").ok().flatten().is_some());
        (stale && is_read_on(b, "accounts"))
            .then(|| Hooked::error(13388, "StaleConfig", "scripted StaleConfig"))
    });
    let out = run_check("policy_check.py", "strict-bounded", vec![uri(&env)]).await;
    assert!(out.contains("answered_while_open"), "{out}");
    assert_eq!(env.state(ACCOUNTS), State::Open);
    let up = env.upstream_bodies("find", "accounts");
    // The read that meets a stale secondary goes twice (a second attempt under the same
    // bound: mongos may pick another member), the answered one once.
    assert_eq!(up.len(), 6, "every read was sent, the failing one twice");
    for (i, b) in up.iter().enumerate().skip(3) {
        assert_eq!(
            max_time_ms(b),
            Some(200),
            "read {i} sent bounded while open"
        );
    }
}
