//! pymongo from tests: a venv at `<target>/pyvenv`, made once by `tests/py/ensure_venv.py`
//! (a file lock serialises its creation across test binaries), and a script runner. A venv
//! that cannot be made fails the test; nothing is skipped.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

/// How long one script run may take.
pub const SCRIPT_DEADLINE: Duration = Duration::from_secs(60);

pub fn manifest_dir() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

pub fn target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) => manifest_dir().join(dir),
        None => manifest_dir().join("target"),
    }
}

/// The venv's python, made on first use.
pub fn venv_python() -> PathBuf {
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

/// Runs `tests/py/<script> MODE ARGS...` in the venv, off the async runtime; returns its
/// stdout. Fails the test on a non-zero exit, on a run past [`SCRIPT_DEADLINE`], or when the
/// output lacks `OK MODE`.
pub async fn run_check(script: &str, mode: &str, args: Vec<String>) -> String {
    let (script, mode) = (script.to_string(), mode.to_string());
    let job = tokio::task::spawn_blocking(move || {
        let python = venv_python();
        let mut cmd = Command::new(&python);
        cmd.arg(manifest_dir().join("tests/py").join(&script))
            .arg(&mode)
            .args(&args);
        let out = super::child::run(cmd, SCRIPT_DEADLINE)
            .unwrap_or_else(|e| panic!("{mode}: script {e}"));
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
