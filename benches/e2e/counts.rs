//! System calls and context switches of one process over the measured window, for
//! `E2E_COUNT=1`: counts that do not depend on how busy the machine is, unlike times.
//!
//! System calls come from `perf stat` attached to the process (kernel tracepoints, counting
//! mode: the process is not slowed the way `strace` slows it); context switches from
//! `voluntary_ctxt_switches` / `nonvoluntary_ctxt_switches` of every thread in
//! `/proc/PID/task/*/status`.

use std::collections::BTreeMap;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// The calls counted by name; everything else is in the total only.
pub const CALLS: [&str; 14] = [
    "recvfrom",
    "sendto",
    "read",
    "write",
    "readv",
    "writev",
    "recvmsg",
    "sendmsg",
    "epoll_wait",
    "epoll_pwait",
    "epoll_ctl",
    "futex",
    "sched_yield",
    "io_uring_enter",
];

/// What one process did in the window.
#[derive(Debug, Clone, Default)]
pub struct Counts {
    pub syscalls: u64,
    pub by_call: BTreeMap<String, u64>,
    pub voluntary: u64,
    pub nonvoluntary: u64,
}

/// A counting run in progress: `perf stat` attached for the window, and the context
/// switches at its start.
pub struct Window {
    pid: u32,
    perf: Option<Child>,
    out: tempfile::NamedTempFile,
    ctx: (u64, u64),
}

/// Starts counting `pid` for `secs`.
pub fn start(pid: u32, secs: Duration) -> Result<Window, String> {
    let out = tempfile::NamedTempFile::new().map_err(|e| e.to_string())?;
    let mut cmd = Command::new("perf");
    cmd.arg("stat")
        .arg("-x,")
        .arg("-o")
        .arg(out.path())
        .arg("-e")
        .arg("raw_syscalls:sys_enter");
    for c in CALLS {
        cmd.arg("-e").arg(format!("syscalls:sys_enter_{c}"));
    }
    cmd.arg("-p")
        .arg(pid.to_string())
        .arg("--")
        .arg("sleep")
        .arg(format!("{:.3}", secs.as_secs_f64()))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let perf = cmd.spawn().map_err(|e| format!("perf: {e}"))?;
    Ok(Window {
        pid,
        perf: Some(perf),
        out,
        ctx: ctx_switches(pid),
    })
}

impl Window {
    /// Ends the window (waits for `perf` to finish its `sleep`) and reads the counts.
    pub fn finish(mut self) -> Result<Counts, String> {
        let ctx = ctx_switches(self.pid);
        let status = self
            .perf
            .take()
            .map(|mut p| p.wait())
            .transpose()
            .map_err(|e| format!("perf: {e}"))?;
        if !status.is_some_and(|s| s.success()) {
            return Err(format!("perf stat failed: {status:?}"));
        }
        let text = std::fs::read_to_string(self.out.path()).map_err(|e| e.to_string())?;
        let mut c = Counts {
            voluntary: ctx.0.saturating_sub(self.ctx.0),
            nonvoluntary: ctx.1.saturating_sub(self.ctx.1),
            ..Counts::default()
        };
        // CSV lines: value,unit,event,...
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let f: Vec<&str> = line.split(',').collect();
            let (Some(v), Some(ev)) = (f.first(), f.get(2)) else {
                continue;
            };
            let Ok(v) = v.parse::<u64>() else { continue };
            if *ev == "raw_syscalls:sys_enter" {
                c.syscalls = v;
            } else if let Some(name) = ev.strip_prefix("syscalls:sys_enter_") {
                c.by_call.insert(name.to_string(), v);
            }
        }
        Ok(c)
    }
}

impl Drop for Window {
    fn drop(&mut self) {
        if let Some(mut p) = self.perf.take() {
            let _ = p.kill();
            let _ = p.wait();
        }
    }
}

/// (voluntary, nonvoluntary) context switches summed over the threads alive now.
pub fn ctx_switches(pid: u32) -> (u64, u64) {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return (0, 0);
    };
    let mut sum = (0, 0);
    for task in dir.flatten() {
        let Ok(s) = std::fs::read_to_string(task.path().join("status")) else {
            continue;
        };
        for l in s.lines() {
            let num = |l: &str| {
                l.split_whitespace()
                    .nth(1)
                    .and_then(|v| v.parse::<u64>().ok())
                    .unwrap_or(0)
            };
            if l.starts_with("voluntary_ctxt_switches:") {
                sum.0 += num(l);
            } else if l.starts_with("nonvoluntary_ctxt_switches:") {
                sum.1 += num(l);
            }
        }
    }
    sum
}
