//! End-to-end benchmark: `cargo bench --bench e2e` (options: see `Opts::from_env`).
//!
//! ```text
//! main (orchestrator)          load generator (this process) ─┐
//!   ├─ --role upstream         fast fake mongos (own process) <┼─ direct
//!   ├─ --role forwarder        copy_bidirectional floor       <┼─ floor
//!   ├─ haproxy -f <tmp cfg>    tcp mode, nbthread = cores     <┼─ haproxy
//!   ├─ staleguard run          the release binary             <┼─ staleguard, -governed, -rewrite
//!   └─ staleguard run          a second one, layout = "uring" <┴─ staleguard-governed-uring
//! ```
//!
//! For each connection count, rounds of every target in turn (rotated each round); medians
//! of throughput, latency percentiles and proxy CPU per round trip; ratios to the floor;
//! the CPU per round trip against HAProxy's, the proxy's alone and with the load
//! generator's; then RSS per idle connection pair; then PASS/MISS against the targets of
//! issue 6.

mod callgrind;
mod counts;
mod forwarder;
mod guard;
mod load;
mod memory;
mod micro;
mod procs;
mod report;
mod upstream;
mod uring;

#[path = "../common/msgs.rs"]
mod msgs;
#[path = "../common/work.rs"]
mod work;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use procs::Proc;
use report::{Sample, Summary};

/// Every option has an environment variable; `--quick` shrinks them all for a smoke run.
struct Opts {
    warmup: Duration,
    measure: Duration,
    rounds: usize,
    conns: Vec<usize>,
    targets: Vec<String>,
    client_threads: usize,
    mem_pairs: usize,
    ns: (String, String),
    sg_log_level: String,
    /// `layout` written into staleguard's config; `None` leaves its default.
    sg_layout: Option<String>,
    /// The connection count the throughput/CPU/p99 targets are judged at.
    judge_conns: usize,
    micro: bool,
    latency: bool,
    memory: bool,
    /// Count the proxy's system calls and context switches in each window (`E2E_COUNT=1`).
    count: bool,
    /// staleguard runs under callgrind (`E2E_SG_WRAPPER`): count its instructions in each
    /// window (`E2E_CALLGRIND=1`).
    callgrind: bool,
    /// The staleguard binary to run (`E2E_SG_BIN`; default: the one this bench was built
    /// with), to compare builds with the same harness.
    sg_bin: std::path::PathBuf,
    /// The fake mongos answers each `find` with about this many bytes (`E2E_REPLY_BYTES`;
    /// 0: the 229-byte one-document reply).
    reply_bytes: usize,
    /// The fake mongos answers each `find` with this many small documents instead
    /// (`E2E_REPLY_DOCS`; 0: see `reply_bytes`).
    reply_docs: usize,
    /// HAProxy's `nbthread` (`E2E_HAPROXY_THREADS`; default: the machine's cores, the number
    /// of worker threads staleguard's runtime starts).
    haproxy_threads: usize,
    /// Offered load, round trips per second over all connections (`E2E_RATE`); unset: each
    /// connection sends as soon as its last reply arrived (closed loop).
    rate: Option<f64>,
    /// At most this many connections send (`E2E_ACTIVE`); the others stay open, idle.
    active: Option<usize>,
}

fn env_or<T: std::str::FromStr>(key: &str, default: T) -> T {
    match std::env::var(key) {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("{key}={v:?} cannot be parsed")),
        Err(_) => default,
    }
}

/// An environment variable set to something other than empty or `0`.
fn flag(key: &str) -> bool {
    std::env::var(key).is_ok_and(|v| !v.is_empty() && v != "0")
}

fn env_list(key: &str, default: &str) -> Vec<String> {
    std::env::var(key)
        .unwrap_or_else(|_| default.to_string())
        .split(',')
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect()
}

impl Opts {
    fn from_env(args: &[String]) -> Opts {
        let has = |flag: &str| args.iter().any(|a| a == flag);
        let quick = has("--quick");
        // The CI guard (`guard.rs`): a short side-by-side at 64 connections.
        let guard = has("--guard");
        let secs = |key: &str, full: f64, q: f64| {
            Duration::from_secs_f64(env_or(key, if quick || guard { q } else { full }))
        };
        let conns_default = match (quick, guard) {
            (_, true) => "64",
            (true, _) => "1,16",
            _ => "1,16,64,256",
        };
        let conns = env_list("E2E_CONNS", conns_default)
            .iter()
            .map(|c| c.parse().expect("E2E_CONNS: numbers"))
            .collect();
        let ns = env_or("E2E_NS", format!("{}.{}", msgs::PASS_DB, msgs::PASS_COLL));
        let ns = ns
            .split_once('.')
            .map(|(d, c)| (d.to_string(), c.to_string()))
            .expect("E2E_NS: db.coll");
        let memory_only = has("--memory-only");
        // The guard's comparison is fixed: the forwarder, HAProxy, governed reads.
        let targets = if guard {
            ["floor", "haproxy", "staleguard-governed"]
                .map(String::from)
                .to_vec()
        } else {
            env_list(
                "E2E_TARGETS",
                "direct,floor,haproxy,staleguard,staleguard-governed,staleguard-rewrite",
            )
        };
        Opts {
            warmup: secs("E2E_WARMUP", 0.5, if guard { 0.3 } else { 0.2 }),
            measure: secs("E2E_SECS", 3.0, if guard { 1.0 } else { 0.5 }),
            rounds: env_or(
                "E2E_ROUNDS",
                match (quick, guard) {
                    (_, true) => 11,
                    (true, _) => 1,
                    _ => 3,
                },
            ),
            conns,
            targets,
            client_threads: env_or("E2E_CLIENT_THREADS", 2),
            mem_pairs: env_or("E2E_MEM_PAIRS", if quick { 500 } else { 10_000 }),
            ns,
            sg_log_level: env_or("E2E_SG_LOG_LEVEL", "info".to_string()),
            sg_layout: std::env::var("E2E_SG_LAYOUT")
                .ok()
                .filter(|v| !v.is_empty()),
            judge_conns: env_or("E2E_JUDGE_CONNS", if quick { 16 } else { 64 }),
            micro: !has("--no-micro") && !memory_only,
            latency: !has("--no-latency") && !memory_only,
            memory: !has("--no-memory"),
            count: flag("E2E_COUNT"),
            callgrind: flag("E2E_CALLGRIND"),
            sg_bin: std::env::var_os("E2E_SG_BIN")
                .filter(|v| !v.is_empty())
                .map_or_else(|| env!("CARGO_BIN_EXE_staleguard").into(), Into::into),
            reply_bytes: env_or("E2E_REPLY_BYTES", 0),
            reply_docs: env_or("E2E_REPLY_DOCS", 0),
            haproxy_threads: env_or(
                "E2E_HAPROXY_THREADS",
                std::thread::available_parallelism().map_or(1, |n| n.get()),
            ),
            rate: std::env::var("E2E_RATE")
                .ok()
                .filter(|v| !v.is_empty())
                .map(|v| v.parse().expect("E2E_RATE: round trips per second")),
            active: std::env::var("E2E_ACTIVE")
                .ok()
                .filter(|v| !v.is_empty())
                .map(|v| v.parse().expect("E2E_ACTIVE: a number of connections")),
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--role") {
        procs::exit_with_parent();
        let rest = &args[2.min(args.len())..];
        match args.get(1).map(String::as_str) {
            Some("upstream") => upstream::run(rest),
            Some("forwarder") => forwarder::run(rest),
            Some("forwarder-uring") => uring::run(rest),
            other => panic!("unknown role {other:?}"),
        }
        return;
    }
    let opts = Opts::from_env(&args);
    if args.iter().any(|a| a == "--guard") {
        procs::raise_nofile(65_536);
        match guard::run(&opts) {
            Ok(true) => return,
            Ok(false) => std::process::exit(1),
            Err(e) => {
                eprintln!("e2e guard: {e}");
                std::process::exit(2);
            }
        }
    }
    if let Err(e) = orchestrate(&opts) {
        eprintln!("e2e: {e}");
        std::process::exit(1);
    }
}

/// The processes under test, started once and shared by all rounds.
struct Fleet {
    upstream: Proc,
    floor: Option<Proc>,
    floor_uring: Option<Proc>,
    floor_percore: Option<Proc>,
    haproxy: Option<Proc>,
    staleguard: Option<Proc>,
    staleguard_uring: Option<Proc>,
    tmp: tempfile::TempDir,
    notes: Vec<String>,
}

fn orchestrate(opts: &Opts) -> Result<(), String> {
    let nofile = procs::raise_nofile((opts.mem_pairs as u64 * 2 + 4096).max(65_536));
    // The proxy holds two descriptors per pair; the hard limit may be out of our reach.
    let fit = (nofile as usize).saturating_sub(200) / 2;
    let mut notes = Vec::new();
    let mem_pairs = if opts.memory && opts.mem_pairs > fit {
        let note = format!(
            "memory run uses {fit} pairs, not {}: RLIMIT_NOFILE is {nofile} here and cannot be \
             raised, and the proxy needs two descriptors per pair",
            opts.mem_pairs
        );
        eprintln!("{note}");
        notes.push(note);
        fit
    } else {
        opts.mem_pairs
    };
    println!("{}", report::machine());
    println!(
        "settings: warm-up {:?}, window {:?}, rounds {}, connections {:?}, client threads {}, \
         load {}, HAProxy nbthread {}, staleguard log level {}, staleguard layout {}, \
         RLIMIT_NOFILE {nofile}\n",
        opts.warmup,
        opts.measure,
        opts.rounds,
        opts.conns,
        opts.client_threads,
        opts.rate.map_or("closed loop".to_string(), |r| format!(
            "{r} round trips/s offered"
        )),
        opts.haproxy_threads,
        opts.sg_log_level,
        opts.sg_layout.as_deref().unwrap_or("its default")
    );
    let micro = opts.micro.then(|| {
        eprintln!("micro: timing decode+classify and rewrite in process ...");
        micro::run()
    });
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(opts.client_threads.max(1))
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let mut fleet = start_fleet(opts)?;
    let reply_len = reply_len(opts);
    let mut summary = Summary::new(opts.judge_conns, reply_len);
    if opts.latency {
        if fleet.staleguard.is_some() && opts.targets.iter().any(|t| t == "staleguard-rewrite") {
            let sg = fleet
                .staleguard
                .as_ref()
                .map(|p| p.addr)
                .expect("staleguard");
            rt.block_on(open_breaker(sg, fleet.upstream.addr))?;
        }
        summary.rows = rt.block_on(latency_runs(opts, &mut fleet))?;
    }
    if opts.memory {
        summary.memory = memory_runs(opts, mem_pairs, &rt, &mut fleet);
    }
    summary.micro = micro;
    notes.append(&mut fleet.notes);
    summary.notes = notes;
    if fleet.staleguard.is_some() {
        let log = fleet.tmp.path().join("staleguard.log");
        summary.notes.push(log_summary(&log));
    }
    println!("{}", summary.render());
    println!("{}", report::load_average("at the end"));
    Ok(())
}

fn start_fleet(opts: &Opts) -> Result<Fleet, String> {
    let tmp = tempfile::tempdir().map_err(|e| e.to_string())?;
    let stale_ns = format!("{}.{}", msgs::FALLBACK_DB, msgs::FALLBACK_COLL);
    let upstream = procs::spawn_role(
        "upstream",
        &[
            "--stale-ns".into(),
            stale_ns,
            "--stale-first".into(),
            "3".into(),
            "--reply-bytes".into(),
            opts.reply_bytes.to_string(),
            "--reply-docs".into(),
            opts.reply_docs.to_string(),
        ],
        "E2E_UPSTREAM_WRAPPER",
    )?;
    let wants = |t: &str| opts.targets.iter().any(|x| x == t);
    let mut notes = Vec::new();
    let floor = if wants("floor") {
        Some(start_floor(upstream.addr)?)
    } else {
        None
    };
    // The two other floors (other layouts of a relay that parses nothing): their own
    // processes, skipped with a note when they cannot start here.
    let mut other_floor = |name: &str, role: &str, extra: &[&str]| {
        if !wants(name) {
            return None;
        }
        let mut args = vec!["--upstream".to_string(), upstream.addr.to_string()];
        args.extend(extra.iter().map(|a| a.to_string()));
        match procs::spawn_role(role, &args, "E2E_FLOOR_WRAPPER") {
            Ok(mut p) => {
                p.name = name.into();
                Some(p)
            }
            Err(e) => {
                let note = format!("{name} skipped: {e}");
                eprintln!("{note}");
                notes.push(note);
                None
            }
        }
    };
    let floor_percore = other_floor("floor-percore", "forwarder", &["--per-core"]);
    let floor_uring = other_floor("floor-uring", "forwarder-uring", &[]);
    let haproxy = if wants("haproxy") {
        // Room for the largest connection count (HAProxy refuses past maxconn).
        let maxconn = opts.conns.iter().copied().max().unwrap_or(0).max(4086) + 10;
        match start_haproxy(
            tmp.path(),
            upstream.addr,
            maxconn,
            opts.haproxy_threads,
            "haproxy",
        ) {
            Ok(p) => Some(p),
            Err(e) => {
                let note = format!("haproxy skipped: {e}");
                eprintln!("{note}");
                notes.push(note);
                None
            }
        }
    } else {
        None
    };
    let staleguard = if ["staleguard", "staleguard-governed", "staleguard-rewrite"]
        .iter()
        .any(|t| wants(t))
    {
        Some(start_staleguard(
            tmp.path(),
            upstream.addr,
            opts,
            "staleguard",
            opts.sg_layout.as_deref(),
        )?)
    } else {
        None
    };
    // Governed reads through a second staleguard with `layout = "uring"`, measured in the
    // same rounds as the first (whatever `E2E_SG_LAYOUT` gives it): the two layouts side by
    // side, under the same load.
    let staleguard_uring = if wants("staleguard-governed-uring") {
        Some(start_staleguard(
            tmp.path(),
            upstream.addr,
            opts,
            "staleguard-uring",
            Some("uring"),
        )?)
    } else {
        None
    };
    Ok(Fleet {
        upstream,
        floor,
        floor_uring,
        floor_percore,
        haproxy,
        staleguard,
        staleguard_uring,
        tmp,
        notes,
    })
}

fn start_floor(upstream: SocketAddr) -> Result<Proc, String> {
    let args = ["--upstream".to_string(), upstream.to_string()];
    let mut p = procs::spawn_role("forwarder", &args, "E2E_FLOOR_WRAPPER")?;
    p.name = "floor".into();
    Ok(p)
}

fn start_haproxy(
    dir: &Path,
    upstream: SocketAddr,
    maxconn: usize,
    threads: usize,
    name: &str,
) -> Result<Proc, String> {
    let bin = procs::find_or_install_haproxy()?;
    let port = procs::free_port()?;
    let cfg = format!(
        "global\n  nbthread {threads}\n  maxconn {maxconn}\n\n\
         defaults\n  mode tcp\n  timeout connect 5s\n  timeout client 1h\n  timeout server 1h\n\n\
         frontend fe\n  bind 127.0.0.1:{port}\n  maxconn {maxconn}\n  default_backend be\n\n\
         backend be\n  server mongos {upstream}\n"
    );
    let path = dir.join(format!("{name}.cfg"));
    std::fs::write(&path, cfg).map_err(|e| e.to_string())?;
    let mut cmd = Command::new(bin);
    cmd.arg("-db").arg("-f").arg(&path);
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    procs::spawn_external(name, cmd, addr, &dir.join(format!("{name}.log")))
}

fn start_staleguard(
    dir: &Path,
    upstream: SocketAddr,
    opts: &Opts,
    name: &str,
    layout: Option<&str>,
) -> Result<Proc, String> {
    let port = procs::free_port()?;
    let layout = layout.map_or(String::new(), |l| format!("layout = \"{l}\"\n"));
    // Passthrough traffic goes to an unlisted namespace; the rewrite run to the fallback one,
    // whose breaker stays open for the whole benchmark once opened; the governed run to a
    // second fallback namespace that never fails (breaker closed: every read tracked).
    // `min_connections = 1`, `per_connection = 10`: the harness opens the breaker from one
    // connection; `min_cooldown` as long as `cooldown`, or the first probe closes it again.
    // Without the rewrite target those settings are left out, so that older builds
    // (`E2E_SG_BIN`, which may not know them) read the same config.
    let rewrite = opts.targets.iter().any(|t| t == "staleguard-rewrite");
    let (defaults, opener) = if rewrite {
        (
            "[defaults]\ncooldown = \"10h\"\nmin_cooldown = \"10h\"\n\n",
            "min_connections = 1\nper_connection = 10\n",
        )
    } else {
        ("", "")
    };
    let toml = format!(
        "listen = \"127.0.0.1:{port}\"\nupstreams = [\"{upstream}\"]\n{layout}\n{defaults}\
         [[namespaces]]\npattern = \"{}.{}\"\nmode = \"fallback\"\n{opener}\n\
         [[namespaces]]\npattern = \"{}.{}\"\nmode = \"fallback\"\n\n\
         [[namespaces]]\npattern = \"pay.*\"\nmode = \"strict\"\n",
        msgs::FALLBACK_DB,
        msgs::FALLBACK_COLL,
        msgs::GOVERNED_DB,
        msgs::GOVERNED_COLL,
    );
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(&path, toml).map_err(|e| e.to_string())?;
    let mut cmd = procs::wrapped(&opts.sg_bin, "E2E_SG_WRAPPER");
    cmd.arg("--log-level")
        .arg(&opts.sg_log_level)
        .arg("run")
        .arg("--config")
        .arg(&path)
        .env_remove("RUST_LOG");
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    procs::spawn_external(name, cmd, addr, &dir.join(format!("{name}.log")))
}

/// Opens the fallback namespace's breaker: the fake mongos answers StaleConfig to the first
/// three finds without `available`; staleguard retries each with `available` and opens the
/// breaker on the third. Then checks that a plain find now reaches mongos rewritten.
async fn open_breaker(staleguard: SocketAddr, upstream: SocketAddr) -> Result<(), String> {
    let mut c = load::Client::connect(staleguard)
        .await
        .map_err(|e| e.to_string())?;
    let mut req = msgs::op_msg(
        0,
        &msgs::find_body(msgs::FALLBACK_DB, msgs::FALLBACK_COLL),
        false,
    );
    for _ in 0..10 {
        if load::upstream_stats(upstream).await?.stale_sent >= 3 {
            break;
        }
        c.round_trip(&mut req).await.map_err(|e| e.to_string())?;
    }
    let before = load::upstream_stats(upstream).await?;
    if before.stale_sent < 3 {
        return Err("the fake mongos never sent StaleConfig".into());
    }
    c.round_trip(&mut req).await.map_err(|e| e.to_string())?;
    let after = load::upstream_stats(upstream).await?;
    let finds = after.stale_ns_finds - before.stale_ns_finds;
    let available = after.stale_ns_available - before.stale_ns_available;
    if finds != 1 || available != 1 {
        return Err(format!(
            "breaker did not open: after three StaleConfig, a find reached mongos {} rewritten",
            if available == 0 {
                "not"
            } else {
                "more than once"
            }
        ));
    }
    eprintln!(
        "breaker open on {}.{}: finds arrive rewritten",
        msgs::FALLBACK_DB,
        msgs::FALLBACK_COLL
    );
    Ok(())
}

/// The length of the fake mongos's `find` reply (see `msgs::find_reply_for`).
fn reply_len(opts: &Opts) -> usize {
    let body = msgs::find_reply_for(opts.reply_bytes, opts.reply_docs);
    staleguard::wire::reply::op_msg(0, 0, 0, &body).len()
}

/// Where a target's traffic goes and which process pays for it.
struct Target {
    name: String,
    addr: SocketAddr,
    cpu_pid: Option<u32>,
    request: Vec<u8>,
    rewrite: bool,
}

fn targets(opts: &Opts, fleet: &Fleet) -> Vec<Target> {
    let pass = msgs::op_msg(0, &msgs::find_body(&opts.ns.0, &opts.ns.1), false);
    let fallback = msgs::op_msg(
        0,
        &msgs::find_body(msgs::FALLBACK_DB, msgs::FALLBACK_COLL),
        false,
    );
    let governed = msgs::op_msg(
        0,
        &msgs::find_body(msgs::GOVERNED_DB, msgs::GOVERNED_COLL),
        false,
    );
    let mut out = Vec::new();
    for name in &opts.targets {
        let (proc, rewrite) = match name.as_str() {
            "direct" => (None, false),
            "floor" => (fleet.floor.as_ref(), false),
            "floor-uring" => (fleet.floor_uring.as_ref(), false),
            "floor-percore" => (fleet.floor_percore.as_ref(), false),
            "haproxy" => (fleet.haproxy.as_ref(), false),
            "staleguard" | "staleguard-governed" => (fleet.staleguard.as_ref(), false),
            "staleguard-rewrite" => (fleet.staleguard.as_ref(), true),
            "staleguard-governed-uring" => (fleet.staleguard_uring.as_ref(), false),
            other => panic!("unknown target {other} (E2E_TARGETS)"),
        };
        if name != "direct" && proc.is_none() {
            continue;
        }
        out.push(Target {
            name: name.clone(),
            addr: proc.map_or(fleet.upstream.addr, |p| p.addr),
            cpu_pid: proc.map(|p| p.pid()),
            request: if rewrite {
                fallback.clone()
            } else if name.starts_with("staleguard-governed") {
                governed.clone()
            } else {
                pass.clone()
            },
            rewrite,
        });
    }
    out
}

async fn latency_runs(
    opts: &Opts,
    fleet: &mut Fleet,
) -> Result<BTreeMap<(usize, String), Vec<Sample>>, String> {
    let targets = targets(opts, fleet);
    let reply_len = reply_len(opts);
    let mut rows: BTreeMap<(usize, String), Vec<Sample>> = BTreeMap::new();
    for &n in &opts.conns {
        for round in 0..opts.rounds {
            for k in 0..targets.len() {
                let t = &targets[(k + round) % targets.len()];
                let before = load::upstream_stats(fleet.upstream.addr).await?;
                let spec = load::Spec {
                    addr: t.addr,
                    conns: n,
                    warmup: opts.warmup,
                    measure: opts.measure,
                    request: t.request.clone(),
                    reply_len,
                    cpu_pid: t.cpu_pid,
                    upstream_pid: Some(fleet.upstream.pid()),
                    count: opts.count,
                    rate: opts.rate,
                    callgrind: opts.callgrind && t.name.starts_with("staleguard"),
                    active: opts.active,
                };
                let out = load::run(&spec)
                    .await
                    .map_err(|e| format!("{} with {n} connections: {e}", t.name))?;
                let mut sample = Sample::of(&out);
                if t.rewrite {
                    let after = load::upstream_stats(fleet.upstream.addr).await?;
                    let finds = after.stale_ns_finds - before.stale_ns_finds;
                    let available = after.stale_ns_available - before.stale_ns_available;
                    sample.rewritten = Some((available, finds));
                }
                eprintln!(
                    "[{n:>3} conns, round {}/{}] {:<18} {}",
                    round + 1,
                    opts.rounds,
                    t.name,
                    sample.line()
                );
                rows.entry((n, t.name.clone())).or_default().push(sample);
                // Let the proxy tear the sessions down before the next target starts.
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
        for p in [
            &mut fleet.floor,
            &mut fleet.floor_uring,
            &mut fleet.floor_percore,
            &mut fleet.haproxy,
            &mut fleet.staleguard,
        ]
        .into_iter()
        .flatten()
        {
            p.check_alive()?;
        }
    }
    Ok(rows)
}

fn memory_runs(
    opts: &Opts,
    pairs: usize,
    rt: &tokio::runtime::Runtime,
    fleet: &mut Fleet,
) -> Vec<memory::MemResult> {
    let request = msgs::op_msg(0, &msgs::find_body(&opts.ns.0, &opts.ns.1), false);
    let up = fleet.upstream.addr;
    let dir = fleet.tmp.path().to_path_buf();
    let wants = |t: &str| opts.targets.iter().any(|x| x == t);
    let mut out = Vec::new();
    // Each proxy freshly started (nothing from the latency runs counted), measured, stopped.
    type Starter<'a> = Box<dyn Fn() -> Result<Proc, String> + 'a>;
    let starters: Vec<(&str, Starter)> = vec![
        (
            "staleguard",
            Box::new(|| {
                start_staleguard(&dir, up, opts, "staleguard-mem", opts.sg_layout.as_deref())
            }),
        ),
        ("floor", Box::new(|| start_floor(up))),
        // maxconn leaves HAProxy inside the descriptor limit (two per pair).
        (
            "haproxy",
            Box::new(|| start_haproxy(&dir, up, pairs + 10, opts.haproxy_threads, "haproxy-mem")),
        ),
    ];
    for (name, start) in starters {
        let wanted = wants(name)
            || (name == "staleguard"
                && (wants("staleguard-rewrite") || wants("staleguard-governed")));
        if !wanted || (name == "haproxy" && fleet.haproxy.is_none()) {
            continue;
        }
        let measured = start().and_then(|p| {
            eprintln!("memory: {} with {pairs} idle connection pairs ...", p.name);
            rt.block_on(memory::measure(&p, pairs, &request, up))
        });
        match measured {
            Ok(m) => out.push(m),
            Err(e) => {
                let note = format!("memory run of {name} failed: {e}");
                eprintln!("{note}");
                fleet.notes.push(note);
            }
        }
    }
    out
}

/// How many lines staleguard logged, and its warnings and errors (the breaker opening is
/// one, expected).
fn log_summary(path: &Path) -> String {
    use std::io::BufRead;
    let Ok(f) = std::fs::File::open(path) else {
        return format!("staleguard log {} unreadable", path.display());
    };
    let (mut lines, mut bytes) = (0usize, 0usize);
    let mut bad = Vec::new();
    for l in std::io::BufReader::new(f).lines().map_while(Result::ok) {
        lines += 1;
        bytes += l.len() + 1;
        if l.contains("WARN") || l.contains("ERROR") {
            bad.push(strip_ansi(&l));
        }
    }
    let mut out = format!(
        "staleguard log: {lines} lines ({:.1} MiB), {} at WARN or ERROR",
        bytes as f64 / 1048576.0,
        bad.len()
    );
    for l in bad.iter().take(5) {
        out.push_str("\n  - `");
        out.push_str(l);
        out.push('`');
    }
    out
}

/// Drops terminal colour sequences (`ESC [ ... m`).
fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            for d in chars.by_ref() {
                if d.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}
