//! Honest readers through pymongo (`tests/chaos/py_reader.py`, in the venv at
//! `<target>/pyvenv` that `tests/py/ensure_venv.py` makes once): a second official driver,
//! with its own handshake (speculative SCRAM-SHA-256), pool and error handling, on the same
//! schedule on both paths. A venv that cannot be made fails the run.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::honest::{Outcome, Read, Reader};

fn manifest_dir() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The venv's python, made if needed (pip, once per target directory).
pub async fn python() -> PathBuf {
    let made = tokio::task::spawn_blocking(|| {
        let target = match std::env::var_os("CARGO_TARGET_DIR") {
            Some(dir) => manifest_dir().join(dir),
            None => manifest_dir().join("target"),
        };
        let venv = target.join("pyvenv");
        let out = Command::new("python3")
            .arg(manifest_dir().join("tests/py/ensure_venv.py"))
            .arg(&venv)
            .output()
            .map_err(|e| format!("cannot run python3: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "ensure_venv.py failed: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        Ok(venv.join("bin/python"))
    })
    .await;
    match made {
        Ok(Ok(p)) => p,
        Ok(Err(e)) => panic!("the pymongo readers need the venv: {e}"),
        Err(e) => panic!("the venv task failed: {e}"),
    }
}

fn outcome(text: &str) -> Outcome {
    let code = |s: &str| s.trim().parse::<i32>().unwrap_or(-1);
    match text {
        "ok" => Outcome::Ok,
        "network" => Outcome::Network,
        "gave up" => Outcome::GaveUp,
        t => match (t.strip_prefix("staleguard "), t.strip_prefix("code ")) {
            (Some(c), _) => Outcome::Staleguard(code(c)),
            (_, Some(c)) => Outcome::Code(code(c)),
            _ => Outcome::Network,
        },
    }
}

/// Runs `r` through pymongo against `uri` until `stop_unix_ms`, recording every read.
pub async fn run(
    python: PathBuf,
    uri: String,
    r: Reader,
    t0_unix_ms: u64,
    stop_unix_ms: u64,
    out: Arc<Mutex<Vec<Read>>>,
) {
    let via = match r.via {
        super::honest::Via::Direct => "d",
        super::honest::Via::Staleguard => "s",
    };
    let prefix = format!("h/{}/{via}/{}", r.kind.name(), r.index);
    let max_time = r.kind.max_time().unwrap_or(Duration::from_secs(1));
    let mut cmd = Command::new(python);
    cmd.arg(manifest_dir().join("tests/chaos/py_reader.py"))
        .arg(uri)
        .arg(r.kind.ns())
        .arg("secondaryPreferred")
        .arg("[]")
        .arg(max_time.as_millis().to_string())
        .arg(r.every.as_millis().to_string())
        .arg((t0_unix_ms + r.offset.as_millis() as u64).to_string())
        .arg(stop_unix_ms.to_string())
        .arg(prefix)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    let kind = r.kind;
    let via = r.via;
    let job = tokio::task::spawn_blocking(move || {
        let Ok(mut child) = cmd.spawn() else {
            println!("chaos: cannot start the pymongo reader");
            return;
        };
        if let Some(stdout) = child.stdout.take() {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) else {
                    continue;
                };
                let sent = v["sent_unix_ms"].as_f64().unwrap_or(0.0);
                let read = Read {
                    kind,
                    via,
                    comment: v["comment"].as_str().unwrap_or("").to_string(),
                    sent: Duration::from_secs_f64((sent - t0_unix_ms as f64).max(0.0) / 1000.0),
                    took: Duration::from_secs_f64(v["took_ms"].as_f64().unwrap_or(0.0) / 1000.0),
                    outcome: outcome(v["outcome"].as_str().unwrap_or("")),
                };
                out.lock().expect("reads").push(read);
            }
        }
        let _ = child.wait();
    });
    let _ = job.await;
}
