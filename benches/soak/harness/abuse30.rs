//! The attackers of issue 30 (items 3, 5 and 6) and issue 29's fleet item, with their
//! figures and checks:
//!
//! - admin: clients that hold the admin cap with keep-alive connections sending `GET
//!   /healthz` every 4 s (the issue's case), beside a kubelet-style prober (a new connection
//!   every 500 ms, `/healthz` or `/readyz`, answered within 1 s or counted as failed);
//! - the fleet's Redis (the proxy runs with `[fleet]` against a `redis-server` of the soak's
//!   own): 2,000,000 unrelated keys, a key name that is not UTF-8, a 150 MB value in the
//!   openings index and one under the old key scheme, index fields that are not UTF-8 or
//!   hold no message, the index's version changed every 2 s (so the proxy reads it whole
//!   each time), and another "instance" (`soak-x`) holding an opening of the strict
//!   `pay.quiet` open, renewed, with a new identity every 20 s: the proxy's own samples
//!   (the namespace is healthy) contradict each one, and it must not apply it again;
//! - the config writer (in `abuse21_admin.rs`) touches the file in the pause of its slow
//!   in-place write.

use std::net::SocketAddr;
use std::process::Command;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::abuse21::{add, max, sleep_until_or};
use super::metric;
use super::report::{get, Check};

/// A kubelet probe's default `timeoutSeconds`.
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);
/// The fake instance whose opening the proxy's own samples contradict.
pub const OTHER: &str = "soak-x";
/// The strict namespace it holds open (healthy upstream).
const HELD_NS: &str = "pay.quiet";

#[derive(Default)]
pub struct Done30 {
    pub holders: AtomicU64,
    pub probes: AtomicU64,
    pub probes_failed: AtomicU64,
    pub probe_max_ms: AtomicU64,
    pub index_rewrites: AtomicU64,
    /// Distinct identities of `soak-x`'s opening put in the index.
    pub other_ids: AtomicU64,
    /// Redis's CPU seconds (user + system) at the abuse's start and end, in ms.
    pub redis_cpu_start_ms: AtomicU64,
    pub redis_cpu_end_ms: AtomicU64,
    pub redis_keys: AtomicU64,
}

/// The soak's own `redis-server` (no persistence, DEBUG allowed), stopped when dropped.
pub struct Redis {
    pub port: u16,
    _proc: super::procs::Proc,
}

impl Redis {
    pub fn start(dir: &std::path::Path) -> Result<Redis, String> {
        let port = super::procs::free_port()?;
        let mut cmd = Command::new("redis-server");
        cmd.args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .args(["--enable-debug-command", "yes"]);
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        let proc = super::procs::spawn_external("redis-server", cmd, addr, &dir.join("redis.log"))
            .map_err(|e| {
                format!("{e} (install Debian's redis-server: apt-get install redis-server)")
            })?;
        Ok(Redis { port, _proc: proc })
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    /// `redis-cli` with raw byte arguments; its output.
    pub fn cli(&self, args: &[&[u8]]) -> String {
        use std::os::unix::ffi::OsStrExt;
        Command::new("timeout")
            .args(["60", "redis-cli", "-p", &self.port.to_string()])
            .args(args.iter().map(|a| std::ffi::OsStr::from_bytes(a)))
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
    }

    /// Redis's own CPU seconds so far.
    pub fn cpu(&self) -> f64 {
        self.cli(&[b"INFO", b"cpu"])
            .lines()
            .filter(|l| l.starts_with("used_cpu_sys:") || l.starts_with("used_cpu_user:"))
            .filter_map(|l| l.split(':').nth(1)?.trim().parse::<f64>().ok())
            .sum()
    }

    /// Before the proxy starts: the crowded database, the odd names and the huge values.
    pub fn crowd(&self, done: &Done30) {
        self.cli(&[b"DEBUG", b"POPULATE", b"2000000", b"unrelated"]);
        self.cli(&[b"SET", b"\xff\xfe odd key", b"x"]);
        self.cli(&[b"SET", b"staleguard:open:\xff:pay.x", b"x"]);
        let big = b"redis.call('HSET', KEYS[1], ARGV[1], string.rep('x', 150 * 1024 * 1024)) \
                    redis.call('SETRANGE', KEYS[2], 150 * 1024 * 1024 - 1, 'x') return 1";
        self.cli(&[
            b"EVAL",
            big,
            b"2",
            b"staleguard:openings",
            b"staleguard:open:big:pay.big",
            b"big\x1fpay.big",
        ]);
        let keys: u64 = self.cli(&[b"DBSIZE"]).trim().parse().unwrap_or(0);
        done.redis_keys
            .store(keys, std::sync::atomic::Ordering::Relaxed);
    }

    /// Puts `soak-x`'s opening (or anything) under `field`, an hour from expiring, and
    /// changes the index's version.
    fn put(&self, field: &[u8], value: &[u8], version: u64) {
        self.cli(&[b"HSET", b"staleguard:openings", field, value]);
        let until = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() + 3_600_000)
            .to_string();
        self.cli(&[
            b"ZADD",
            b"staleguard:openings:until",
            until.as_bytes(),
            field,
        ]);
        let v = format!("soak-{version}");
        self.cli(&[b"SET", b"staleguard:openings:version", v.as_bytes()]);
    }
}

/// Where the holders connect from (as an attacker's pod would, beside the scraper's and the
/// kubelet's addresses).
const HOLDERS_FROM: [u8; 4] = [127, 0, 0, 2];
/// Where the kubelet probes from (the node's address).
const KUBELET_FROM: [u8; 4] = [127, 0, 0, 3];

/// A connection to `addr` from the loopback address `from`.
async fn connect_from(from: [u8; 4], addr: SocketAddr) -> Option<tokio::net::TcpStream> {
    let socket = tokio::net::TcpSocket::new_v4().ok()?;
    socket.bind(SocketAddr::from((from, 0))).ok()?;
    let s = socket.connect(addr).await.ok()?;
    let _ = s.set_nodelay(true);
    Some(s)
}

/// The issue's case: a keep-alive connection sending `GET /healthz` every 4 s, reconnecting
/// when it is closed.
pub async fn health_holder(admin: SocketAddr, done: Arc<Done30>, until: Instant) {
    let mut buf = [0u8; 1024];
    while Instant::now() < until {
        let Some(mut s) = connect_from(HOLDERS_FROM, admin).await else {
            sleep_until_or(Duration::from_millis(200), until).await;
            continue;
        };
        add(&done.holders);
        loop {
            if s.write_all(b"GET /healthz HTTP/1.1\r\nHost: soak\r\n\r\n")
                .await
                .is_err()
            {
                break;
            }
            match tokio::time::timeout(Duration::from_secs(3), s.read(&mut buf)).await {
                Ok(Ok(n)) if n > 0 => {}
                _ => break,
            }
            if Instant::now() >= until {
                return;
            }
            sleep_until_or(Duration::from_secs(4), until).await;
        }
        sleep_until_or(Duration::from_millis(50), until).await;
    }
}

/// A kubelet: a new connection every 500 ms, `/healthz` and `/readyz` in turn, answered
/// 200 within 1 s or counted as failed.
pub async fn kubelet(admin: SocketAddr, done: Arc<Done30>, until: Instant) {
    let mut i = 0u64;
    while Instant::now() < until {
        i += 1;
        let path = if i % 2 == 0 { "/readyz" } else { "/healthz" };
        let started = Instant::now();
        let ask = async {
            let mut s = connect_from(KUBELET_FROM, admin).await?;
            let req = format!(
                "GET {path} HTTP/1.1\r\nHost: {admin}\r\nUser-Agent: kube-probe/1.31\r\nAccept: */*\r\nConnection: close\r\n\r\n"
            );
            s.write_all(req.as_bytes()).await.ok()?;
            let mut out = Vec::new();
            s.read_to_end(&mut out).await.ok()?;
            Some(out.starts_with(b"HTTP/1.1 200"))
        };
        let ok = tokio::time::timeout(PROBE_TIMEOUT, ask)
            .await
            .ok()
            .flatten()
            == Some(true);
        add(&done.probes);
        if ok {
            max(&done.probe_max_ms, started.elapsed().as_millis() as u64);
        } else {
            add(&done.probes_failed);
        }
        sleep_until_or(Duration::from_millis(500), until).await;
    }
}

/// Keeps the index odd (fields that are not UTF-8 or hold no message) and changing (a new
/// version every 2 s), and `soak-x`'s opening of `pay.quiet` standing, with a new identity
/// every 20 s.
pub async fn redis_abuse(redis: Arc<Redis>, done: Arc<Done30>, until: Instant) {
    let field = format!("{OTHER}\u{1f}{HELD_NS}");
    let started = Instant::now();
    let mut version = 0u64;
    let mut id = u64::MAX;
    while Instant::now() < until {
        version += 1;
        let now_id = started.elapsed().as_secs() / 20;
        if now_id != id {
            id = now_id;
            add(&done.other_ids);
        }
        let value = format!(
            r#"{{"kind":"open","ns":"{HELD_NS}","opener":"{OTHER}","id":"soak-{id}","cause":"stale_routing","evidence":"3 trigger errors (renewal {version})"}}"#
        );
        let r = redis.clone();
        let field = field.clone();
        let _ = tokio::task::spawn_blocking(move || {
            r.put(b"\xff\xfe\x1fpay.odd", b"{}", version);
            r.put(b"x\x1fpay.bad", b"not a message", version);
            r.put(field.as_bytes(), value.as_bytes(), version);
        })
        .await;
        add(&done.index_rewrites);
        sleep_until_or(Duration::from_secs(2), until).await;
    }
}

fn check(name: &'static str, value: String, pass: bool) -> Check {
    Check {
        name,
        value,
        pass,
        needs_hardening: true,
    }
}

fn m(metrics: &str, name_and_labels: &str) -> u64 {
    metric(metrics, &format!("staleguard_{name_and_labels} ")).unwrap_or(0.0) as u64
}

pub(super) fn issue30_text(d: &Done30, metrics: &str) -> String {
    let skipped = |why: &str| m(metrics, &format!("fleet_skipped_total{{why=\"{why}\"}}"));
    let events = |dir: &str, kind: &str| {
        m(
            metrics,
            &format!("fleet_events_total{{direction=\"{dir}\",kind=\"{kind}\"}}"),
        )
    };
    format!(
        "issue 30: admin: {} keep-alive /healthz holders, {} kubelet-style probes ({} failed, \
         slowest answered {} ms), lane hits {}; fleet: Redis with {} keys, {} index rewrites, \
         Redis CPU {:.2} s, connected {}, skipped too_large {} not_utf8 {} malformed {}, \
         published open {} close {}, applied open {} close {}, contradicted {}, declined {} \
         ({} identities of {OTHER}'s opening)\n\n",
        get(&d.holders),
        get(&d.probes),
        get(&d.probes_failed),
        get(&d.probe_max_ms),
        m(metrics, "limit_hits_total{limit=\"admin_health_lane\"}"),
        get(&d.redis_keys),
        get(&d.index_rewrites),
        redis_cpu(d),
        m(metrics, "fleet_connected"),
        skipped("too_large"),
        skipped("not_utf8"),
        skipped("malformed"),
        events("published", "open"),
        events("published", "close"),
        events("applied", "open"),
        events("applied", "close"),
        events("contradicted", "open"),
        events("declined", "close"),
        get(&d.other_ids),
    )
}

fn redis_cpu(d: &Done30) -> f64 {
    get(&d.redis_cpu_end_ms).saturating_sub(get(&d.redis_cpu_start_ms)) as f64 / 1000.0
}

pub(super) fn issue30_checks(d: &Done30, metrics: &str, log: &str, abuse: Duration) -> Vec<Check> {
    // A loaded machine may let a poll pass `timeout` now and then; the odd names alone used
    // to keep every instance out of the fleet.
    let lost = log.matches("fleet: lost Redis").count();
    let skipped = |why: &str| m(metrics, &format!("fleet_skipped_total{{why=\"{why}\"}}"));
    let applied = m(
        metrics,
        "fleet_events_total{direction=\"applied\",kind=\"open\"}",
    );
    let contradicted = m(
        metrics,
        "fleet_events_total{direction=\"contradicted\",kind=\"open\"}",
    );
    let cpu = redis_cpu(d);
    vec![
        check(
            "admin: kubelet-style probes answered 200 within 1 s while the cap is held",
            format!(
                "{} probes, {} failed, cap hits {}",
                get(&d.probes),
                get(&d.probes_failed),
                m(metrics, "limit_hits_total{limit=\"admin_max_connections\"}")
            ),
            get(&d.probes) > 0
                && get(&d.probes_failed) == 0
                && m(metrics, "limit_hits_total{limit=\"admin_max_connections\"}") > 0,
        ),
        check(
            "fleet: stays connected (<= 3 lost polls) through odd names, 150 MB, 2M keys",
            format!(
                "lost {lost}, connected {}, too_large {}, not_utf8 {}",
                m(metrics, "fleet_connected"),
                skipped("too_large"),
                skipped("not_utf8")
            ),
            lost <= 3
                && m(metrics, "fleet_connected") == 1
                && skipped("too_large") > 0
                && skipped("not_utf8") > 0
                && skipped("malformed") > 0
                && m(
                    metrics,
                    "fleet_events_total{direction=\"published\",kind=\"open\"}",
                ) > 0,
        ),
        check(
            "fleet: Redis's CPU stays idle with 2M keys (under 10 % of the abuse)",
            format!("{cpu:.2} s in {:.0} s", abuse.as_secs_f64()),
            cpu < 0.1 * abuse.as_secs_f64(),
        ),
        check(
            "fleet: an opening its own samples contradict is not applied again",
            format!(
                "{applied} applied, {contradicted} contradicted, {} identities",
                get(&d.other_ids)
            ),
            contradicted > 0 && applied <= get(&d.other_ids),
        ),
    ]
}
