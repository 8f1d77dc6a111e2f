//! Headless Chromium for the page tests (Debian's package, installed as `.ci/run` does when
//! missing and the tests run as root).

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Installs Debian's Chromium on a fresh machine, as `.ci/run` does, so that `cargo test`
/// alone works there too (as root, with the package mirror reachable).
fn install() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        eprintln!("installing Debian's chromium for the status page test (apt-get)");
        let ok = Command::new("sh")
            .args([
                "-c",
                "DEBIAN_FRONTEND=noninteractive apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium",
            ])
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        if !ok {
            eprintln!("apt-get install chromium failed");
        }
    });
}

/// Runs headless Chromium on `url` with `mode` (`--dump-dom` or `--screenshot=FILE`);
/// `window`: its size in pixels; returns stdout. Fails the test when Chromium is missing: the page must be seen.
pub fn run(url: &str, mode: &str, profile: &Path, window: (u32, u32)) -> String {
    let bin = std::env::var("CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".to_string());
    if !Path::new(&bin).exists() && bin == "/usr/bin/chromium" {
        install();
    }
    assert!(
        Path::new(&bin).exists(),
        "{bin} is missing and could not be installed: apt-get install -y chromium (as root), then run the tests again"
    );
    let mut child = Command::new(&bin)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
        ])
        .arg(format!("--window-size={},{}", window.0, window.1))
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg(mode)
        .arg(url)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {bin}: {e}"));
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match child.try_wait().expect("wait for chromium") {
            Some(_) => break,
            None if Instant::now() > deadline => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("chromium did not finish within 60 s");
            }
            None => std::thread::sleep(Duration::from_millis(20)),
        }
    }
    let out = child.wait_with_output().expect("chromium output");
    assert!(out.status.success(), "chromium failed: {}", out.status);
    String::from_utf8_lossy(&out.stdout).into_owned()
}
