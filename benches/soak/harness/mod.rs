//! The soak: the staleguard binary between a misbehaving fake mongos and a mix of verifying
//! and abusive clients, with its memory sampled. Used by `cargo bench --bench soak` (any
//! duration) and by `tests/soak.rs` (the CI minute).
//!
//! ```text
//! verifying clients ─┐                      ┌─ StaleConfig bursts, slow replies (faulty ns)
//! abusive clients  ──┼─▶ staleguard (child) ─▶ fake mongos (in process) ─┼─ resets, garbage (chaos ns)
//! RSS sampler ───────┘   /proc/PID/status    └─ counts what a hardened proxy never lets through
//!                             │ [fleet]
//!                             ▼
//!                        redis-server (child): 2M keys, odd names, 150 MB values, another
//!                        "instance"'s opening (`abuse30.rs`)
//! ```

mod abuse;
mod abuse21;
mod abuse21_admin;
mod abuse30;
mod clients;
mod fake;
mod measure;
#[path = "../../common/msgs.rs"]
mod msgs;
#[allow(dead_code)]
#[path = "../../e2e/procs.rs"]
mod procs;
mod report;
mod report21;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bson::RawDocument;
use staleguard::wire::{Header, OpCode, HEADER_LEN};

pub use report::Report;

/// The namespaces of the soak and what the config makes of them.
pub mod ns {
    pub const DEMO: &str = "demo";
    pub const PAY: &str = "pay";
    /// Fallback, with StaleConfig bursts and slow replies.
    pub const INVENTORY: &str = "inventory";
    /// Strict, with the same faults.
    pub const LEDGER: &str = "ledger";
    /// `demo.quiet` (fallback) and `pay.quiet` (strict): the upstream never fails them; only
    /// the abusive clients' own reads do.
    pub const QUIET: &str = "quiet";
    pub const PIPE: &str = "pipe";
    pub const FLOOD_PREFIX: &str = "flood_";
    pub const CHAOS_RESET: &str = "chaos_reset";
    pub const CHAOS_GARBAGE: &str = "chaos_garbage";
    /// `demo.big`: every find answered with a 16 MB batch (clients that never read it).
    pub const BIG: &str = "big";
    /// `demo.unwind`: faulty like `demo.inventory`; `$unwind` aggregates repeating `_id`.
    pub const UNWIND: &str = "unwind";
    /// Every read of this database not asking for `available` gets StaleConfig (under the
    /// catch-all `*` fallback pattern): its collection names forge log lines.
    pub const FORGE_DB: &str = "forge";

    pub fn is_faulty(db: &str, coll: &str) -> bool {
        matches!(
            (db, coll),
            (DEMO, INVENTORY) | (PAY, LEDGER) | (DEMO, UNWIND)
        )
    }

    pub fn is_strict_db(db: &str) -> bool {
        db == PAY
    }
}

/// How long and how hard.
#[derive(Debug, Clone)]
pub struct Opts {
    pub duration: Duration,
    /// Verifying clients per namespace class (four classes).
    pub verifiers: usize,
    /// Connections that declare 47 MB and trickle.
    pub trickle_conns: usize,
    /// Connections that send 47 MB − 1 bytes and stop.
    pub big_partials: usize,
    /// How long a 47 MB − 1 sender holds its connection before reopening.
    pub hold: Duration,
    pub bombers: usize,
    /// Issue 21: connections that send a 40 MB ping, then stay idle 5 s.
    pub big_pingers: usize,
    /// Issue 21: clients that never read a 16 MB reply, at once.
    pub non_readers: usize,
    /// Issue 21: tasks opening silent connections (four at a time each).
    pub silent: usize,
    /// End phase: idle pairs after a 40 MB ping, clients not reading a streamed 16 MB
    /// reply, and not reading a judged one (each asserted at most 8 MiB).
    pub end_idle_pairs: usize,
    pub end_non_readers: usize,
    pub end_tracked: usize,
    /// End phase: slow readers of a streamed and of a judged 16 MB reply (each asserted at
    /// most 8 MiB).
    pub end_slow_readers: usize,
    /// Assert the checks that need issue 11's and 21's hardening too.
    pub expect_hardening: bool,
    pub staleguard: std::path::PathBuf,
    pub log_level: String,
}

impl Opts {
    /// The one-minute CI shape: every abuse present, small counts.
    pub fn ci(staleguard: &Path) -> Opts {
        Opts {
            duration: Duration::from_secs(60),
            verifiers: 2,
            trickle_conns: 20,
            big_partials: 2,
            hold: Duration::from_secs(4),
            bombers: 1,
            big_pingers: 1,
            non_readers: 2,
            silent: 1,
            end_idle_pairs: 12,
            end_non_readers: 8,
            end_tracked: 2,
            end_slow_readers: 0,
            expect_hardening: true,
            staleguard: staleguard.to_path_buf(),
            log_level: "warn".into(),
        }
    }
}

/// A legacy OP_QUERY (shared with the fuzz seeds' shape: flags, name, skip, return, query).
pub fn seeds_op_query(request_id: i32, ns: &str, query: &RawDocument) -> Vec<u8> {
    let q = query.as_bytes();
    let total = HEADER_LEN + 4 + ns.len() + 1 + 8 + q.len();
    let mut out = Vec::with_capacity(total);
    Header {
        length: total as i32,
        request_id,
        response_to: 0,
        op_code: OpCode::QUERY,
    }
    .put(&mut out);
    out.extend_from_slice(&0_i32.to_le_bytes());
    out.extend_from_slice(ns.as_bytes());
    out.push(0);
    out.extend_from_slice(&0_i32.to_le_bytes());
    out.extend_from_slice(&(-1_i32).to_le_bytes());
    out.extend_from_slice(q);
    out
}

/// Where the half-written config is cut: before it, `pay.*` falls to the `*` fallback.
pub const PAY_SECTION: &str = "[[namespaces]]\npattern = \"pay.*\"";

/// Issue 21's short limits, so that the soak sees them act.
pub const FIRST_MESSAGE_TIMEOUT: Duration = Duration::from_secs(2);
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(3);
pub const ADMIN_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(2);
pub const ADMIN_MAX_CONNECTIONS: usize = 32;

/// The config; `variant` 0 or 1 differ in `[defaults] cooldown` only (the config writer
/// alternates them). Both keep `pay.*` strict, in the last section.
fn config(listen: u16, upstream: SocketAddr, admin: u16, redis: &str, variant: u32) -> String {
    let (fmt, wt, hrt) = (
        FIRST_MESSAGE_TIMEOUT.as_secs(),
        WRITE_TIMEOUT.as_secs(),
        ADMIN_HEADER_READ_TIMEOUT.as_secs(),
    );
    format!(
        "listen = \"127.0.0.1:{listen}\"\nupstreams = [\"{upstream}\"]\n\
         first_message_timeout = \"{fmt}s\"\nwrite_timeout = \"{wt}s\"\n\n\
         [admin]\nlisten = \"127.0.0.1:{admin}\"\nheader_read_timeout = \"{hrt}s\"\n\
         max_connections = {ADMIN_MAX_CONNECTIONS}\n\n\
         [fleet]\nredis = \"{redis}\"\nname = \"soak\"\n\n\
         [defaults]\nthreshold = 3\nwindow = \"10s\"\ncooldown = \"{}s\"\n\n\
         [[namespaces]]\npattern = \"*\"\nmode = \"fallback\"\n\n\
         [[namespaces]]\npattern = \"demo.*\"\nmode = \"fallback\"\n\n\
         {PAY_SECTION}\nmode = \"strict\"\n",
        2 + variant
    )
}

/// Memory of the proxy over the run.
#[derive(Debug, Default, Clone, Copy)]
pub struct Mem {
    pub rss_start: u64,
    pub rss_end: u64,
    pub rss_max: u64,
    pub vm_start: u64,
    pub vm_max: u64,
}

fn status_kib(pid: u32, field: &str) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = s.lines().find(|l| l.starts_with(field))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// (VmRSS, VmSize) in bytes.
fn mem_now(pid: u32) -> (u64, u64) {
    (
        status_kib(pid, "VmRSS:").unwrap_or(0) * 1024,
        status_kib(pid, "VmSize:").unwrap_or(0) * 1024,
    )
}

/// The abusive clients of issues 11 and 21, and where they aim.
struct Abusers {
    proxy: SocketAddr,
    admin: SocketAddr,
    cfg: std::path::PathBuf,
    versions: [String; 2],
    bomb: Arc<Vec<u8>>,
    ping: Arc<Vec<u8>>,
    done: Arc<abuse::Done>,
    done21: Arc<abuse21::Done21>,
    done30: Arc<abuse30::Done30>,
    redis: Arc<abuse30::Redis>,
    until: Instant,
}

impl Abusers {
    /// Starts every abuser that begins after the warm-up (the `$unwind` and forging readers
    /// start with the verifying clients).
    fn spawn(&self, opts: &Opts, tasks: &mut tokio::task::JoinSet<()>) {
        let (proxy, admin, until) = (self.proxy, self.admin, self.until);
        let (d, d21) = (&self.done, &self.done21);
        tasks.spawn(abuse::poison(proxy, d.clone(), until));
        tasks.spawn(abuse::policy_abuse(proxy, d.clone(), until));
        tasks.spawn(abuse::pipeline(proxy, d.clone(), until));
        tasks.spawn(abuse::flood(proxy, d.clone(), until));
        tasks.spawn(abuse::chaos(proxy, d.clone(), until));
        for _ in 0..opts.trickle_conns {
            tasks.spawn(abuse::trickle(proxy, d.clone(), until));
        }
        for _ in 0..opts.big_partials {
            tasks.spawn(abuse::big_partial(proxy, opts.hold, d.clone(), until));
        }
        for _ in 0..opts.bombers {
            tasks.spawn(abuse::bombs(proxy, self.bomb.clone(), d.clone(), until));
        }
        for _ in 0..opts.big_pingers {
            tasks.spawn(abuse21::big_pinger(
                proxy,
                self.ping.clone(),
                d21.clone(),
                until,
            ));
        }
        for _ in 0..opts.non_readers {
            tasks.spawn(abuse21::non_reader(
                proxy,
                WRITE_TIMEOUT,
                d21.clone(),
                until,
            ));
        }
        for _ in 0..opts.silent {
            tasks.spawn(abuse21::silent(
                proxy,
                FIRST_MESSAGE_TIMEOUT,
                d21.clone(),
                until,
            ));
        }
        for _ in 0..8 {
            tasks.spawn(abuse21_admin::slow_headers(admin, d21.clone(), until));
        }
        tasks.spawn(abuse21_admin::admin_flood(
            admin,
            ADMIN_MAX_CONNECTIONS + 16,
            d21.clone(),
            until,
        ));
        tasks.spawn(abuse21_admin::scraper(admin, d21.clone(), until));
        tasks.spawn(abuse21_admin::config_writer(
            self.cfg.clone(),
            self.versions.clone(),
            d21.clone(),
            until,
        ));
        tasks.spawn(abuse21::bad_max_time(proxy, d21.clone(), until));
        let d30 = &self.done30;
        for _ in 0..ADMIN_MAX_CONNECTIONS {
            tasks.spawn(abuse30::health_holder(admin, d30.clone(), until));
        }
        tasks.spawn(abuse30::kubelet(admin, d30.clone(), until));
        tasks.spawn(abuse30::redis_abuse(self.redis.clone(), d30.clone(), until));
    }
}

/// What the proxy's `/metrics` said at the end, read once the clients are done.
pub fn metric(text: &str, line_start: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(line_start))
        .and_then(|v| v.trim().parse().ok())
}

/// Runs the soak and reports; an error only when it could not run at all.
pub fn run(opts: &Opts) -> Result<Report, String> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let tmp = tempfile::tempdir().map_err(|e| e.to_string())?;
    let fake = rt.block_on(fake::start()).map_err(|e| e.to_string())?;
    let port = procs::free_port()?;
    let admin_port = procs::free_port()?;
    let cfg = tmp.path().join("soak.toml");
    let done30 = Arc::new(abuse30::Done30::default());
    let redis = Arc::new(abuse30::Redis::start(tmp.path())?);
    redis.crowd(&done30);
    let versions = [0, 1].map(|v| config(port, fake.addr, admin_port, &redis.url(), v));
    std::fs::write(&cfg, &versions[0]).map_err(|e| e.to_string())?;
    let mut cmd = std::process::Command::new(&opts.staleguard);
    cmd.arg("--log-level")
        .arg(&opts.log_level)
        .arg("run")
        .arg("--config")
        .arg(&cfg)
        .env_remove("RUST_LOG");
    let proxy: SocketAddr = ([127, 0, 0, 1], port).into();
    let admin: SocketAddr = ([127, 0, 0, 1], admin_port).into();
    let log = tmp.path().join("staleguard.log");
    let mut sg = procs::spawn_external("staleguard", cmd, proxy, &log)?;
    let pid = sg.pid();
    let bomb = Arc::new(abuse::zstd_bomb());
    let ping = Arc::new(abuse21::big_ping());

    let started = Instant::now();
    let warmup = Duration::from_secs(2);
    // The abusers stop before the end so that the last samples show what stays, and the end
    // phase measures idle pairs and non-readers on a quiet proxy.
    let settle = settle(opts.duration);
    let end = started + warmup + opts.duration;
    let abuse_end = end - settle;
    let tallies: Vec<(&'static str, &'static str, Arc<clients::Tally>)> = [
        (ns::DEMO, ns::INVENTORY),
        (ns::PAY, ns::LEDGER),
        (ns::DEMO, ns::QUIET),
        (ns::PAY, ns::QUIET),
    ]
    .into_iter()
    .map(|(d, c)| (d, c, Arc::new(clients::Tally::default())))
    .collect();
    let done = Arc::new(abuse::Done::default());
    let done21 = Arc::new(abuse21::Done21::default());

    let (mem, end_figures) = rt.block_on(async {
        let mut tasks = tokio::task::JoinSet::new();
        let mut id = 0;
        for (db, coll, t) in &tallies {
            for _ in 0..opts.verifiers {
                id += 1;
                tasks.spawn(clients::verify(proxy, id, db, coll, t.clone(), end));
            }
        }
        // Started with the verifying clients, before the flood of new names takes the
        // metrics' namespace labels: `demo.unwind` keeps a label of its own.
        let d21 = &done21;
        for _ in 0..3 {
            tasks.spawn(abuse21::unwind(proxy, d21.clone(), abuse_end));
            tasks.spawn(abuse21::forger(proxy, d21.clone(), abuse_end));
        }
        tokio::time::sleep(warmup).await;
        let (rss_start, vm_start) = mem_now(pid);
        let abusers = Abusers {
            proxy,
            admin,
            cfg: cfg.clone(),
            versions: versions.clone(),
            bomb: bomb.clone(),
            ping: ping.clone(),
            done: done.clone(),
            done21: done21.clone(),
            done30: done30.clone(),
            redis: redis.clone(),
            until: abuse_end,
        };
        set_ms(&done30.redis_cpu_start_ms, redis.cpu());
        abusers.spawn(opts, &mut tasks);
        // The end phase: a few seconds after the abuse, on a quiet proxy.
        let plan = measure::Plan {
            proxy,
            pid,
            idle_pairs: opts.end_idle_pairs,
            non_readers: opts.end_non_readers,
            tracked: opts.end_tracked,
            slow_readers: opts.end_slow_readers,
            write_timeout: WRITE_TIMEOUT,
            ping: ping.clone(),
            hold_until: end,
        };
        let end_phase = tokio::spawn(async move {
            tokio::time::sleep_until((abuse_end + Duration::from_secs(5)).into()).await;
            measure::end_phase(plan).await
        });
        let mut mem = Mem {
            rss_start,
            vm_start,
            rss_max: rss_start,
            vm_max: vm_start,
            ..Mem::default()
        };
        let mut last = Instant::now();
        while Instant::now() < end || !end_phase.is_finished() {
            tokio::time::sleep(Duration::from_millis(500)).await;
            let (rss, vm) = mem_now(pid);
            mem.rss_max = mem.rss_max.max(rss);
            mem.vm_max = mem.vm_max.max(vm);
            mem.rss_end = rss;
            if last.elapsed() >= Duration::from_secs(60) {
                last = Instant::now();
                eprintln!(
                    "soak: {:.0} s, RSS {:.1} MiB",
                    started.elapsed().as_secs_f64(),
                    rss as f64 / 1048576.0
                );
            }
        }
        let figures = end_phase.await.unwrap_or_default();
        set_ms(&done30.redis_cpu_end_ms, redis.cpu());
        let joining = Instant::now();
        while tasks.join_next().await.is_some() {}
        eprintln!(
            "soak: end phase done {:.1} s after the end; the clients stopped {:.1} s later",
            Instant::now().saturating_duration_since(end).as_secs_f64(),
            joining.elapsed().as_secs_f64()
        );
        (mem, figures)
    });
    let metrics = rt
        .block_on(abuse21_admin::http_get(admin, "/metrics"))
        .map(|(_, text)| text)
        .unwrap_or_default();
    let alive = sg.check_alive();
    let log_text = std::fs::read_to_string(&log).unwrap_or_default();
    Ok(report::build(
        opts,
        started.elapsed(),
        &tallies,
        &fake.seen,
        &done,
        &done21,
        &done30,
        mem,
        &end_figures,
        &metrics,
        alive,
        &log_text,
    ))
}

fn set_ms(a: &std::sync::atomic::AtomicU64, seconds: f64) {
    a.store(
        (seconds * 1000.0) as u64,
        std::sync::atomic::Ordering::Relaxed,
    );
}

/// How long before the end the abuse stops: the end phase needs about 30 s.
pub fn settle(duration: Duration) -> Duration {
    (duration / 10).clamp(Duration::from_secs(30), Duration::from_secs(60))
}
