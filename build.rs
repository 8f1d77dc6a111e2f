//! Build script: stamps the git commit into the binary for `staleguard --version`.
//!
//! `STALEGUARD_GIT_COMMIT` in the environment wins (a container or tarball build has no
//! `.git`); otherwise `git rev-parse`, and `unknown` when neither is there. Rebuilds only
//! when HEAD or the branch it names moves, not on every edit.

use std::path::Path;
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let s = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (!s.is_empty()).then_some(s)
}

fn main() {
    println!("cargo:rerun-if-env-changed=STALEGUARD_GIT_COMMIT");
    let commit = match std::env::var("STALEGUARD_GIT_COMMIT") {
        Ok(c) if !c.trim().is_empty() => c.trim().to_string(),
        _ => from_git().unwrap_or_else(|| "unknown".to_string()),
    };
    println!("cargo:rustc-env=STALEGUARD_GIT_COMMIT={commit}");
}

fn from_git() -> Option<String> {
    let commit = git(&["rev-parse", "--short=12", "HEAD"])?;
    // HEAD (a file in the worktree's git dir) and the ref it points at (possibly in the
    // common dir, or only in packed-refs).
    let mut watch = vec![git(&["rev-parse", "--git-path", "HEAD"])];
    if let Some(r) = git(&["symbolic-ref", "-q", "HEAD"]) {
        watch.push(git(&["rev-parse", "--git-path", &r]));
    }
    watch.push(git(&["rev-parse", "--git-path", "packed-refs"]));
    for p in watch.into_iter().flatten() {
        if Path::new(&p).exists() {
            println!("cargo:rerun-if-changed={p}");
        }
    }
    Some(commit)
}
