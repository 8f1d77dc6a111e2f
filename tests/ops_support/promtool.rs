//! `promtool check metrics` (Debian's `prometheus` package; installed with apt-get when
//! missing and running as root, as `.ci/run` does). A missing `promtool` fails the test, it
//! never skips it.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

fn find_in_path(name: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// The `promtool` program; the test fails when it cannot be found or installed.
pub fn promtool() -> PathBuf {
    if find_in_path("promtool").is_none() {
        eprintln!("installing Debian's prometheus package for promtool (apt-get)");
        let _ = Command::new("sh")
            .arg("-c")
            .arg("DEBIAN_FRONTEND=noninteractive apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus >/dev/null")
            .status();
    }
    find_in_path("promtool").unwrap_or_else(|| {
        panic!("`promtool` not found: install Debian's `prometheus` package (apt-get install prometheus; .ci/run does)")
    })
}

/// `promtool check metrics` on `body`: (exit status success, its output).
pub fn check_metrics(body: &str) -> (bool, String) {
    let mut child = Command::new(promtool())
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run promtool");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(body.as_bytes())
        .expect("write to promtool");
    let out = child.wait_with_output().expect("promtool output");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}
