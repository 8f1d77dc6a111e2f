//! Helper processes: the harness's own roles (re-executions of this binary), staleguard,
//! HAProxy; ports, readiness, and CPU time and RSS read from `/proc`.

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

/// A child process that is killed (by its own pid) when dropped.
pub struct Proc {
    pub name: String,
    pub addr: SocketAddr,
    child: Child,
    /// Held open: our roles exit when it closes (the harness died).
    _stdin: Option<ChildStdin>,
}

impl Proc {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// VmRSS in bytes.
    pub fn rss_bytes(&self) -> u64 {
        rss_bytes(self.pid()).unwrap_or(0)
    }

    /// Fails if the process has already exited (it crashed or could not start).
    pub fn check_alive(&mut self) -> Result<(), String> {
        match self.child.try_wait() {
            Ok(None) => Ok(()),
            Ok(Some(status)) => Err(format!("{} exited: {status}", self.name)),
            Err(e) => Err(format!("{}: {e}", self.name)),
        }
    }
}

impl Drop for Proc {
    /// SIGTERM first (staleguard stops gracefully, and a profiler wrapping it writes its
    /// output), SIGKILL after 20 s; always by this child's own pid.
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = Command::new("kill")
                .arg("-TERM")
                .arg(self.pid().to_string())
                .status();
            let deadline = Instant::now() + Duration::from_secs(20);
            while matches!(self.child.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `program`, run under the command line in the environment variable `wrapper_env` when it
/// is set (say `valgrind --tool=callgrind --callgrind-out-file=/tmp/x.callgrind`, or
/// `strace -f -c -o /tmp/x.strace`), for profiling one process of the benchmark.
pub fn wrapped(program: &Path, wrapper_env: &str) -> Command {
    let wrapper = std::env::var(wrapper_env).unwrap_or_default();
    let mut words = wrapper.split_whitespace();
    match words.next() {
        Some(w) => {
            let mut c = Command::new(w);
            c.args(words).arg(program);
            c
        }
        None => Command::new(program),
    }
}

/// Starts this executable in `role` with `args` (under the wrapper in `wrapper_env`, if
/// set); the role prints `LISTEN <addr>` when ready.
pub fn spawn_role(role: &str, args: &[String], wrapper_env: &str) -> Result<Proc, String> {
    let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
    let mut child = wrapped(&exe, wrapper_env)
        .arg("--role")
        .arg(role)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| format!("spawn {role}: {e}"))?;
    let stdin = child.stdin.take();
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let mut line = String::new();
    BufReader::new(stdout)
        .read_line(&mut line)
        .map_err(|e| format!("{role}: {e}"))?;
    let addr = line
        .trim()
        .strip_prefix("LISTEN ")
        .and_then(|a| a.parse().ok())
        .ok_or_else(|| format!("{role} did not report its address (said {line:?})"))?;
    Ok(Proc {
        name: role.to_string(),
        addr,
        child,
        _stdin: stdin,
    })
}

/// In a role: exit when the harness goes away (our stdin closes).
pub fn exit_with_parent() {
    std::thread::spawn(|| {
        let mut sink = [0u8; 64];
        let mut stdin = std::io::stdin();
        while let Ok(n) = std::io::Read::read(&mut stdin, &mut sink) {
            if n == 0 {
                break;
            }
        }
        std::process::exit(0);
    });
}

/// In a role: tell the harness where we listen.
pub fn announce(addr: SocketAddr) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "LISTEN {addr}");
    let _ = out.flush();
}

/// A loopback port that was free a moment ago (for programs that need one in their config).
pub fn free_port() -> Result<u16, String> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(|e| format!("bind: {e}"))?;
    Ok(l.local_addr().map_err(|e| e.to_string())?.port())
}

/// Starts an external program that will listen on `addr`, and waits until it accepts.
pub fn spawn_external(
    name: &str,
    mut cmd: Command,
    addr: SocketAddr,
    log: &Path,
) -> Result<Proc, String> {
    let log_file = std::fs::File::create(log).map_err(|e| format!("{}: {e}", log.display()))?;
    let err_file = log_file.try_clone().map_err(|e| e.to_string())?;
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::from(log_file))
        .stderr(Stdio::from(err_file))
        .spawn()
        .map_err(|e| format!("spawn {name}: {e}"))?;
    let mut p = Proc {
        name: name.to_string(),
        addr,
        child,
        _stdin: None,
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
            return Ok(p);
        }
        p.check_alive().map_err(|e| {
            let tail = std::fs::read_to_string(log).unwrap_or_default();
            format!("{e}; its output:\n{tail}")
        })?;
        if Instant::now() > deadline {
            return Err(format!("{name} did not listen on {addr} within 60 s"));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn clock_ticks() -> f64 {
    static TICKS: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *TICKS.get_or_init(|| {
        Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(100.0)
    })
}

/// (utime, stime) from `/proc/PID/stat` (fields 14 and 15) in seconds, all threads.
pub fn cpu_seconds(pid: u32) -> Option<(f64, f64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces; fields are counted after its ')'.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime / clock_ticks(), stime / clock_ticks()))
}

/// VmRSS from `/proc/PID/status`, in bytes.
pub fn rss_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Raises RLIMIT_NOFILE (inherited by every child) to at least `want`; returns the soft
/// limit in force afterwards.
pub fn raise_nofile(want: u64) -> u64 {
    use rlimit::Resource;
    let (soft, hard) = Resource::NOFILE.get().unwrap_or((1024, 1024));
    if soft >= want {
        return soft;
    }
    // Root may raise the hard limit too; otherwise settle for the hard limit.
    if Resource::NOFILE.set(want, want.max(hard)).is_ok() {
        return want;
    }
    let _ = Resource::NOFILE.set(hard, hard);
    Resource::NOFILE.get().map(|(s, _)| s).unwrap_or(soft)
}

/// HAProxy's path, installing the Debian package when it is missing (and we may).
pub fn find_or_install_haproxy() -> Result<String, String> {
    let works = || {
        Command::new("haproxy")
            .arg("-v")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if works() {
        return Ok("haproxy".into());
    }
    if std::env::var_os("E2E_NO_INSTALL").is_some() {
        return Err("haproxy is not installed and E2E_NO_INSTALL is set".into());
    }
    eprintln!("haproxy missing: trying apt-get install -y haproxy");
    let install = || {
        Command::new("apt-get")
            .args(["install", "-y", "-qq", "haproxy"])
            .env("DEBIAN_FRONTEND", "noninteractive")
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if !install() {
        let _ = Command::new("apt-get")
            .args(["update", "-qq"])
            .stdout(Stdio::null())
            .status();
        if !install() {
            return Err("apt-get install -y haproxy failed".into());
        }
    }
    if works() {
        Ok("haproxy".into())
    } else {
        Err("haproxy installed but `haproxy -v` fails".into())
    }
}
