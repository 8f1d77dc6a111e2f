//! Node.js clients from tests: the official `mongodb` driver and `mongosh`, pinned by
//! `tests/js/package-lock.json` and installed once from the npm registry into
//! `<target>/jsdeps` (`npm ci`; an exclusive lock on `<target>/jsdeps.lock` serialises the
//! install across test binaries). A failed install fails the test with npm's output; nothing
//! is skipped.

use std::fs::{self, File};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use super::child::run;
use super::py::{manifest_dir, target_dir};

/// How long one script or mongosh run may take.
pub const SCRIPT_DEADLINE: Duration = Duration::from_secs(60);
/// How long `npm ci` may take (a cold cache downloads about 470 packages).
const INSTALL_DEADLINE: Duration = Duration::from_secs(600);
/// Written into the install once `npm ci` succeeded: a copy of the lock file it installed.
const STAMP: &str = "installed-package-lock.json";

fn js_dir() -> PathBuf {
    manifest_dir().join("tests/js")
}

/// `<target>/jsdeps` with the pinned packages installed, made on first use.
pub fn jsdeps() -> PathBuf {
    static DEPS: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    match DEPS.get_or_init(ensure_installed) {
        Ok(p) => p.clone(),
        Err(e) => panic!("Node.js packages unavailable, cannot run the Node.js tests: {e}"),
    }
}

fn ensure_installed() -> Result<PathBuf, String> {
    let target = target_dir();
    let deps = target.join("jsdeps");
    fs::create_dir_all(&target).map_err(|e| format!("create {}: {e}", target.display()))?;
    let lock_path = target.join("jsdeps.lock");
    let lock = File::create(&lock_path).map_err(|e| format!("{}: {e}", lock_path.display()))?;
    // SAFETY: flock on a descriptor we own; released when `lock` is closed.
    if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) } != 0 {
        let e = std::io::Error::last_os_error();
        return Err(format!("lock {}: {e}", lock_path.display()));
    }
    let wanted = fs::read(js_dir().join("package-lock.json"))
        .map_err(|e| format!("read tests/js/package-lock.json: {e}"))?;
    let installed = fs::read(deps.join(STAMP)).ok();
    if installed.as_deref() == Some(&wanted[..]) && mongosh_in(&deps).exists() {
        return Ok(deps);
    }
    if deps.exists() {
        // Half made by an interrupted run, or an older lock file.
        fs::remove_dir_all(&deps).map_err(|e| format!("remove {}: {e}", deps.display()))?;
    }
    fs::create_dir_all(&deps).map_err(|e| format!("create {}: {e}", deps.display()))?;
    for f in ["package.json", "package-lock.json"] {
        fs::copy(js_dir().join(f), deps.join(f)).map_err(|e| format!("copy {f}: {e}"))?;
    }
    let started = Instant::now();
    // No install scripts: the packages that have them only build optional native helpers
    // (machine id, glibc version, ssh), and npm versions differ on whether they run them.
    let mut npm = Command::new("npm");
    npm.args([
        "ci",
        "--ignore-scripts",
        "--no-audit",
        "--no-fund",
        "--prefer-offline",
        "--loglevel=error",
    ])
    .current_dir(&deps)
    .env("npm_config_update_notifier", "false");
    let out = run(npm, INSTALL_DEADLINE).map_err(|e| format!("npm ci: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "npm ci in {} failed ({}):\n{}{}",
            deps.display(),
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    if !mongosh_in(&deps).exists() {
        return Err(format!("npm ci left no {}", mongosh_in(&deps).display()));
    }
    fs::write(deps.join(STAMP), &wanted).map_err(|e| format!("write the stamp: {e}"))?;
    println!(
        "npm ci into {} took {:?}",
        deps.display(),
        started.elapsed()
    );
    Ok(deps)
}

fn mongosh_in(deps: &Path) -> PathBuf {
    deps.join("node_modules/.bin/mongosh")
}

/// What a finished run printed.
pub struct Ran {
    pub success: bool,
    pub stdout: String,
    pub stderr: String,
}

async fn run_blocking(what: String, make: impl FnOnce() -> Command + Send + 'static) -> Ran {
    let job = tokio::task::spawn_blocking(move || {
        let out = run(make(), SCRIPT_DEADLINE).unwrap_or_else(|e| panic!("{what}: {e}"));
        let ran = Ran {
            success: out.status.success(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        };
        println!("{what}: {}\n{}{}", out.status, ran.stdout, ran.stderr);
        ran
    });
    job.await
        .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()))
}

/// Runs `node tests/js/<script> MODE ARGS...` (the installed packages on `NODE_PATH`) off the
/// async runtime; returns its stdout. Fails the test on a non-zero exit, on a run past
/// [`SCRIPT_DEADLINE`], or when the output lacks `OK MODE`.
pub async fn run_check(script: &str, mode: &str, args: Vec<String>) -> String {
    let (script, m) = (js_dir().join(script), mode.to_string());
    let ran = run_blocking(mode.to_string(), move || {
        let mut node = Command::new("node");
        node.arg(script)
            .arg(m)
            .args(args)
            .env("NODE_PATH", jsdeps().join("node_modules"));
        node
    })
    .await;
    let all = format!("{}{}", ran.stdout, ran.stderr);
    assert!(ran.success, "{mode}: node script failed\n{all}");
    assert!(ran.stdout.contains(&format!("OK {mode}")), "{mode}: {all}");
    ran.stdout
}

/// Runs `mongosh --quiet --norc URI --eval CODE` (telemetry off, its home directory under
/// `<target>/jsdeps`), returning whatever it printed and whether it exited 0.
pub async fn mongosh(uri: &str, code: &str) -> Ran {
    let (uri, code) = (uri.to_string(), code.to_string());
    run_blocking(format!("mongosh --eval {code}"), move || {
        let deps = jsdeps();
        let home = deps.join("home");
        fs::create_dir_all(&home).expect("mongosh home");
        let mut sh = Command::new(mongosh_in(&deps));
        sh.args(["--quiet", "--norc", &uri, "--eval", &code])
            .env("HOME", home)
            .env("MONGOSH_FORCE_DISABLE_TELEMETRY_FOR_TESTING", "1");
        sh
    })
    .await
}
