//! The read policy seen from pymongo: a Python script (`tests/py/policy_check.py`) runs
//! against staleguard started in-process in front of the fake mongos.
//!
//! The venv lives in `<target dir>/pyvenv` (`$CARGO_TARGET_DIR` or `./target`) and is made
//! once by `tests/py/ensure_venv.py` under a file lock, so parallel tests and test processes
//! share it. If it cannot be made (no python3, no registry), the tests fail with the reason:
//! they never skip silently.

mod policy_support;
mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use staleguard::breaker::State;

use policy_support::*;
use support::mongos::Hooked;

const INVENTORY: &str = "demo.store_inventory";
const ACCOUNTS: &str = "pay.accounts";
/// How long one script run may take.
const SCRIPT_DEADLINE: Duration = Duration::from_secs(60);

fn manifest_dir() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) => manifest_dir().join(dir),
        None => manifest_dir().join("target"),
    }
}

/// The venv's python, made on first use (once per process; a file lock across processes).
fn venv_python() -> PathBuf {
    static VENV: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let made = VENV.get_or_init(|| {
        let venv = target_dir().join("pyvenv");
        let script = manifest_dir().join("tests/py/ensure_venv.py");
        let out = Command::new("python3")
            .arg(&script)
            .arg(&venv)
            .output()
            .map_err(|e| format!("cannot run python3: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "{} failed ({}):\n{}{}",
                script.display(),
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        Ok(venv.join("bin/python"))
    });
    match made {
        Ok(p) => p.clone(),
        Err(e) => panic!("pymongo venv unavailable, cannot run the pymongo tests: {e}"),
    }
}

/// Runs `policy_check.py MODE URI`; returns its stdout, failing the test on a non-zero exit.
async fn run_script(mode: &str, uri: String) -> String {
    let mode = mode.to_string();
    let job = tokio::task::spawn_blocking(move || {
        let python = venv_python();
        let script = manifest_dir().join("tests/py/policy_check.py");
        let mut child = Command::new(&python)
            .arg(&script)
            .arg(&mode)
            .arg(&uri)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {}: {e}", python.display()));
        let deadline = Instant::now() + SCRIPT_DEADLINE;
        loop {
            match child.try_wait().expect("wait for the script") {
                Some(_) => break,
                None if Instant::now() > deadline => {
                    let _ = child.kill();
                    let _ = child.wait();
                    panic!("{mode}: script ran past {SCRIPT_DEADLINE:?}");
                }
                None => std::thread::sleep(Duration::from_millis(10)),
            }
        }
        let out = child.wait_with_output().expect("script output");
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        println!("{mode}: {}\n{stdout}{stderr}", out.status);
        assert!(
            out.status.success(),
            "{mode}: pymongo script failed ({})\n{stdout}{stderr}",
            out.status
        );
        assert!(stdout.contains(&format!("OK {mode}")), "{mode}: {stdout}");
        stdout
    });
    job.await
        .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()))
}

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
    run_script("fallback-retry", uri(&env)).await;
    assert_eq!(fault.hits(), 1);
    let sent = env.sent_by_driver("find", "store_inventory");
    assert_eq!(sent.len(), 1, "pymongo sent one find and saw no error");
    let up = env.upstream("find", "store_inventory");
    assert_eq!(up.len(), 2);
    assert_eq!(up[0], sent[0], "first attempt as pymongo sent it");
    let (original, resend) = (body(&up[0]), body(&up[1]));
    assert_eq!(
        original
            .get_document("$readPreference")
            .ok()
            .map(|d| d.to_owned()),
        Some(bson::rawdoc! { "mode": "secondary" })
    );
    assert_eq!(read_concern(&resend), Some(available()));
    let budget = max_time_ms(&resend).expect("maxTimeMS");
    assert!(budget > 0 && budget <= 5000 - 100, "budget {budget}");
    assert_eq!(
        without(&original, &["readConcern", "maxTimeMS"]),
        without(&resend, &["readConcern", "maxTimeMS"])
    );
    assert_eq!(env.state(INVENTORY), State::Closed);
    assert_eq!(env.errors(INVENTORY), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pymongo_strict_breaker_fails_fast() {
    let env = Env::start(BASE_NAMESPACES).await;
    env.fake.seed(ACCOUNTS, seed_docs(1));
    let _fault = stale_reads(&env.fake, "accounts", 13388, Duration::ZERO);
    let out = run_script("strict-fail-fast", uri(&env)).await;
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
async fn pymongo_socket_timeouts_open_the_breaker() {
    let env = Env::start(BASE_NAMESPACES).await;
    env.fake.seed(INVENTORY, seed_docs(5));
    let slow = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let s = slow.clone();
    env.fake.set_hook(move |b| {
        (s.load(std::sync::atomic::Ordering::SeqCst) && is_read_on(b, "store_inventory"))
            .then(|| Hooked::delay(Duration::from_millis(1000)))
    });
    run_script("socket-timeouts", uri(&env)).await;
    env.wait_state(INVENTORY, State::Open).await;
    assert_eq!(env.errors(INVENTORY), 3);
    slow.store(false, std::sync::atomic::Ordering::SeqCst);
    run_script("fallback-read", uri(&env)).await;
    let up = env.upstream_bodies("find", "store_inventory");
    assert_eq!(up.len(), 4, "three timed out, one rewritten");
    assert_eq!(
        level(up.last().expect("a find")).as_deref(),
        Some("available")
    );
}
