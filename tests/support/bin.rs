//! The `staleguard` binary as operators run it: `staleguard run --config FILE`, with its
//! stderr (the log) captured, its addresses read from its own log lines, and signals.

use std::io::Read;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub struct Binary {
    child: Child,
    log: Arc<Mutex<String>>,
    _dir: tempfile::TempDir,
    pub config: PathBuf,
}

impl Binary {
    /// Starts `staleguard [args] run --config FILE` with `config` as the file's text (which
    /// should listen on port 0: the addresses are read from the log).
    pub fn start(config: &str, args: &[&str]) -> Binary {
        Binary::start_under(&[], config, args)
    }

    /// [`Binary::start`] run by `wrapper` (e.g. `["prlimit", "--nofile=512", "--"]`).
    pub fn start_under(wrapper: &[&str], config: &str, args: &[&str]) -> Binary {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("staleguard.toml");
        std::fs::write(&path, config).expect("write config");
        let bin = env!("CARGO_BIN_EXE_staleguard");
        let mut command = match wrapper.split_first() {
            Some((first, rest)) => {
                let mut c = Command::new(first);
                c.args(rest).arg(bin);
                c
            }
            None => Command::new(bin),
        };
        let mut child = command
            .args(args)
            .args(["run", "--config"])
            .arg(&path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start staleguard");
        let log = Arc::new(Mutex::new(String::new()));
        let mut stderr = child.stderr.take().expect("stderr");
        let sink = log.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = stderr.read(&mut buf) {
                if n == 0 {
                    break;
                }
                let text = String::from_utf8_lossy(&buf[..n]).into_owned();
                sink.lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push_str(&text);
            }
        });
        Binary {
            child,
            log,
            _dir: dir,
            config: path,
        }
    }

    /// The process id (for `/proc/<pid>/status`).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Everything logged so far.
    pub fn log(&self) -> String {
        self.log.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Waits (up to 10 s) until the log holds `needle`.
    pub async fn wait_log(&self, needle: &str) {
        let deadline = Instant::now() + super::STEP;
        while !self.log().contains(needle) {
            assert!(
                Instant::now() < deadline,
                "the log never said {needle:?}:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The address a log field `key` (pretty `key=addr` or JSON `"key":"addr"`) names in the
    /// first line holding `message`.
    pub async fn addr(&self, message: &str, key: &str) -> SocketAddr {
        self.wait_log(message).await;
        let log = self.log();
        let line = log.lines().find(|l| l.contains(message)).expect("the line");
        let pretty = format!("{key}=");
        let json = format!("\"{key}\":\"");
        let at = line
            .find(&pretty)
            .map(|i| i + pretty.len())
            .or_else(|| line.find(&json).map(|i| i + json.len()))
            .unwrap_or_else(|| panic!("no {key} in {line}"));
        let rest = &line[at..];
        let end = rest
            .find(|c: char| c.is_whitespace() || c == '"' || c == ',')
            .unwrap_or(rest.len());
        rest[..end]
            .parse()
            .unwrap_or_else(|e| panic!("{key} in {line}: {e}"))
    }

    /// The proxy's listening address.
    pub async fn listen(&self) -> SocketAddr {
        self.addr("staleguard listening", "listen").await
    }

    /// The admin endpoint's address.
    pub async fn admin(&self) -> SocketAddr {
        self.addr("admin endpoint listening", "admin").await
    }

    /// Sends SIGTERM (what Kubernetes and systemd send to stop it).
    pub fn sigterm(&self) {
        let ok = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("kill runs")
            .success();
        assert!(ok, "SIGTERM delivered");
    }

    /// Waits up to `limit` for the process to exit; its exit status, or `None` if it still
    /// runs (then it is killed).
    pub fn wait_exit(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + limit;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            if Instant::now() >= deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Binary {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
