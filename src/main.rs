//! The `staleguard` command line: `run`, `check-config`, and with the `sim` feature `sim`,
//! `demo` and `incident`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, Subcommand, ValueEnum};

use staleguard::config::{self, Config};

/// `staleguard --version`: the package version and the commit it was built from.
const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("STALEGUARD_GIT_COMMIT"),
    ")"
);

/// The config file `run` and `check-config` read unless told otherwise (relative to the
/// current directory).
const DEFAULT_CONFIG: &str = "config/staleguard.toml";

#[derive(Parser)]
#[command(
    name = "staleguard",
    version = VERSION,
    about = "MongoDB wire-protocol proxy: keep secondary reads answering, or failing fast, when shard routing goes stale"
)]
struct Cli {
    /// Log level (overridden by RUST_LOG when set): error, warn, info, debug, trace.
    /// Default: info (error for `demo`, which prints its own timeline).
    #[arg(long, global = true)]
    log_level: Option<String>,
    /// Log format on stderr: `pretty` for people, `json` (one object per line) for collectors.
    #[arg(long, global = true, value_enum, default_value = "pretty")]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Pretty,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Run the proxy.
    Run {
        /// Config file.
        #[arg(long, default_value = DEFAULT_CONFIG)]
        config: PathBuf,
    },
    #[cfg(feature = "sim")]
    /// Run the simulated sharded cluster (a mongos front on ADDR) until interrupted.
    Sim {
        /// Address of the simulated mongos.
        #[arg(long, default_value = "127.0.0.1:27017")]
        listen: String,
        /// Secondary routing-table refresh limit (30s in MongoDB 4.2).
        #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
        refresh_timeout: std::time::Duration,
        /// Also listen on one port per node (for serverStatus on shard primaries).
        #[arg(long)]
        node_ports: bool,
        /// With --node-ports: the first node's port (a0; then a1, a2, b0, b1, b2); 0 picks
        /// free ports.
        #[arg(long, default_value_t = 27100)]
        node_base_port: u16,
    },
    #[cfg(feature = "sim")]
    /// Drive the incident by name against a running `staleguard sim --node-ports`, with a
    /// small paced load through a running `staleguard run` (see config/sim.toml).
    Incident {
        /// stall (shard A's primary stops completing writes), partial (then secondary a1
        /// restarts; a2 stays healthy) or full (a1 and a2 restart).
        #[arg(long, default_value = "partial", value_parser = ["stall", "partial", "full"])]
        scenario: String,
        /// The staleguard the load goes through.
        #[arg(long, default_value = "127.0.0.1:27018")]
        proxy: String,
        /// The simulated cluster's mongos, where the faults are injected.
        #[arg(long, default_value = "127.0.0.1:27017")]
        cluster: String,
        /// Length of each of the four phases (healthy, stalled, restarted, resumed).
        #[arg(long, default_value = "20s", value_parser = humantime::parse_duration)]
        phase: std::time::Duration,
        /// Requests per second of each workload (inventory reads, payment reads, order
        /// inserts).
        #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=1000))]
        rate: u32,
    },
    #[cfg(feature = "sim")]
    /// Tell the story: the incident against the simulated cluster, with and without staleguard.
    Demo {
        /// Length of each of the five phases.
        #[arg(long, default_value = "6s", value_parser = humantime::parse_duration)]
        phase: std::time::Duration,
    },
    /// Validate a config file and print the effective policy table.
    CheckConfig {
        /// Config file (or `--config FILE`, as for `run`).
        #[arg(default_value = DEFAULT_CONFIG)]
        file: PathBuf,
        /// Config file, the same as FILE.
        #[arg(long = "config", value_name = "FILE", conflicts_with = "file")]
        config: Option<PathBuf>,
        /// Show which entry governs this namespace (db.coll).
        #[arg(long)]
        explain: Option<String>,
    },
}

/// glibc raises its mmap threshold each time a mapped block is freed, up to 32 MiB, after
/// which the next such blocks come from the heap and freeing them does not give the memory
/// back: clients that make staleguard buffer a few large messages (up to
/// `max_message_size`) and go away left it holding ~150 MiB more resident memory for good
/// (measured by the soak: +148 MiB after the abuse; with the threshold fixed at 4 MiB,
/// +7.5 MiB). Fixing the threshold keeps such buffers mapped and returned on free, while
/// messages below 4 MiB stay on the heap.
fn fix_malloc_threshold() {
    /// Allocations of this size and larger are mapped on their own and returned to the
    /// system when freed (glibc's `M_MMAP_THRESHOLD`).
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    const MMAP_THRESHOLD: libc::c_int = 4 * 1024 * 1024;
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets an allocator parameter; it is called before any thread
    // exists, and an unknown parameter or value makes it return 0, never fault.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD);
    }
}

fn main() -> ExitCode {
    fix_malloc_threshold();
    let cli = Cli::parse();
    let default_level = match cli.command {
        #[cfg(feature = "sim")]
        Command::Demo { .. } => "error",
        #[cfg(feature = "sim")]
        Command::Incident { .. } => "warn",
        _ => "info",
    };
    init_logs(
        cli.log_level.as_deref().unwrap_or(default_level),
        cli.log_format,
    );
    match cli.command {
        Command::Run { config } => run(config),
        Command::CheckConfig {
            file,
            config,
            explain,
        } => check_config(config.unwrap_or(file), explain),
        #[cfg(feature = "sim")]
        Command::Sim {
            listen,
            refresh_timeout,
            node_ports,
            node_base_port,
        } => sim(
            listen,
            refresh_timeout,
            node_ports.then_some(node_base_port),
        ),
        #[cfg(feature = "sim")]
        Command::Incident {
            scenario,
            proxy,
            cluster,
            phase,
            rate,
        } => incident(&scenario, proxy, cluster, phase, rate),
        #[cfg(feature = "sim")]
        Command::Demo { phase } => demo(phase),
    }
}

fn init_logs(level: &str, format: LogFormat) {
    use std::io::IsTerminal;
    use tracing_subscriber::filter::{EnvFilter, LevelFilter, Targets};
    use tracing_subscriber::layer::{Layer, SubscriberExt};
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::Registry;
    // RUST_LOG, when set, is read as an EnvFilter (span-field directives and all). Otherwise
    // the level is a static per-target filter: it keeps no per-span state, where EnvFilter
    // takes a process-wide lock each time a span is entered or left, that is on every poll
    // of every session's task.
    // The static filter needs no span entered to decide: sessions' spans are then entered
    // only when something is logged (`logs::ConnScoped`).
    let mut note_spans = true;
    let filter: Box<dyn Layer<Registry> + Send + Sync> = match EnvFilter::try_from_default_env() {
        Ok(f) => {
            note_spans = false;
            f.boxed()
        }
        Err(_) => match level.parse::<Targets>() {
            Ok(t) => t.boxed(),
            Err(e) => {
                eprintln!("warning: log level {level:?}: {e}; logging at info");
                Targets::new().with_default(LevelFilter::INFO).boxed()
            }
        },
    };
    let logs = tracing_subscriber::fmt::layer()
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    let registry = tracing_subscriber::registry().with(filter);
    use staleguard::logs::ConnScoped;
    match format {
        // Client-supplied strings (namespaces, command names) reach field values: escaped,
        // so none can forge a line.
        LogFormat::Pretty => {
            ConnScoped(registry.with(logs.fmt_fields(staleguard::logs::EscapedFields))).init()
        }
        // The connection span (client address, id) rides along on every event.
        LogFormat::Json => {
            ConnScoped(registry.with(logs.json().with_current_span(true).with_span_list(false)))
                .init()
        }
    }
    if note_spans {
        staleguard::logs::note_spans();
    }
}

fn load(path: &std::path::Path) -> Option<Config> {
    match Config::load(path) {
        Ok(c) => Some(c),
        Err(errors) => {
            for e in errors {
                eprintln!("error: {e}");
            }
            if !path.exists() {
                missing_hint(path);
            }
            None
        }
    }
}

/// Where the file was looked for, and how to name another.
fn missing_hint(path: &std::path::Path) {
    let cwd = std::env::current_dir().map_or_else(|_| "?".to_string(), |d| d.display().to_string());
    if path == std::path::Path::new(DEFAULT_CONFIG) {
        eprintln!(
            "hint: staleguard looked for its default config file, {DEFAULT_CONFIG}, relative to the current directory ({cwd}), and found none."
        );
    } else {
        eprintln!(
            "hint: there is no file at {} (current directory: {cwd}).",
            path.display()
        );
    }
    eprintln!(
        "hint: name the config file with --config FILE, e.g. `staleguard run --config /etc/staleguard/staleguard.toml` (check-config takes --config FILE too, or FILE alone)."
    );
}

fn check_config(file: PathBuf, explain: Option<String>) -> ExitCode {
    let Some(cfg) = load(&file) else {
        return ExitCode::from(2);
    };
    // Valid, but worth a second look: printed, exit 0.
    for w in cfg.warnings() {
        eprintln!("warning: {w}");
    }
    print!("{}", config::render_table(&cfg));
    if let Some(ns) = explain {
        println!();
        print!("{}", config::explain(&cfg, &ns));
    }
    ExitCode::SUCCESS
}

fn run(path: PathBuf) -> ExitCode {
    let Some(cfg) = load(&path) else {
        return ExitCode::from(2);
    };
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let code = rt.block_on(async move {
        for w in cfg.warnings() {
            tracing::warn!(file = %w.file, line = w.line, key = %w.key, "{}", w.message);
        }
        let running = match staleguard::server::start(Arc::new(cfg)).await {
            Ok(r) => r,
            Err(e) => {
                tracing::error!(error = %e, "cannot start");
                return ExitCode::FAILURE;
            }
        };
        let stop = running.stop_token();
        tokio::spawn(async move {
            wait_for_signal().await;
            tracing::info!("signal received, stopping");
            stop.cancel();
        });
        tokio::spawn(reload_on_hangup(running.shared().reload()));
        running.wait().await;
        ExitCode::SUCCESS
    });
    // Every session and admin connection is gone by now; what is left (background tasks,
    // a decompression on the blocking pool) must not hold the exit.
    rt.shutdown_timeout(RUNTIME_EXIT);
    code
}

/// How long the runtime's leftovers may delay the exit after the stop.
const RUNTIME_EXIT: std::time::Duration = std::time::Duration::from_millis(300);

/// SIGHUP reloads the config file (errors are logged and shown in `/status`).
async fn reload_on_hangup(shared: staleguard::handles::ReloadHandles) {
    use tokio::signal::unix::{signal, SignalKind};
    let mut hup = match signal(SignalKind::hangup()) {
        Ok(h) => h,
        Err(e) => {
            tracing::warn!(error = %e, "cannot listen for SIGHUP; reload by editing the file");
            return;
        }
    };
    while hup.recv().await.is_some() {
        tracing::info!("SIGHUP: reloading the config");
        let _ = staleguard::reload::reload(&shared, "signal");
    }
}

#[cfg(feature = "sim")]
fn runtime() -> Option<tokio::runtime::Runtime> {
    match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => Some(rt),
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            None
        }
    }
}

/// `node_ports`: the first node's port, when the nodes listen too.
#[cfg(feature = "sim")]
fn sim(listen: String, refresh_timeout: std::time::Duration, node_ports: Option<u16>) -> ExitCode {
    let Some(rt) = runtime() else {
        return ExitCode::FAILURE;
    };
    rt.block_on(async move {
        let cfg = staleguard::sim::SimConfig {
            listen,
            refresh_timeout,
            node_ports: node_ports.is_some(),
            node_base_port: node_ports.unwrap_or(0),
            ..Default::default()
        };
        let handle = match staleguard::sim::start(cfg).await {
            Ok(h) => h,
            Err(e) => {
                eprintln!("error: cannot start the simulated cluster: {e}");
                return ExitCode::FAILURE;
            }
        };
        println!("simulated mongos listening on {}", handle.addr());
        for node in ["a0", "a1", "a2", "b0", "b1", "b2"] {
            if let Some(a) = handle.node_addr(node) {
                println!("  node {node} on {a}");
            }
        }
        println!("faults: run {{simControl: \"status\"}} on the admin database (see docs/demo.md), or `staleguard incident --scenario partial|full|stall`");
        wait_for_signal().await;
        handle.shutdown().await;
        ExitCode::SUCCESS
    })
}

#[cfg(feature = "sim")]
fn incident(
    scenario: &str,
    proxy: String,
    cluster: String,
    phase: std::time::Duration,
    rate: u32,
) -> ExitCode {
    use staleguard::demo::{IncidentOptions, Scenario};
    let Some(scenario) = Scenario::parse(scenario) else {
        eprintln!("error: unknown scenario {scenario:?}: stall, partial or full");
        return ExitCode::from(2);
    };
    let Some(rt) = runtime() else {
        return ExitCode::FAILURE;
    };
    let opts = IncidentOptions {
        scenario,
        proxy,
        cluster,
        phase,
        rate,
        ..IncidentOptions::default()
    };
    rt.block_on(async move {
        match staleguard::demo::drive_incident(opts).await {
            Ok(_) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::FAILURE
            }
        }
    })
}

#[cfg(feature = "sim")]
fn demo(phase: std::time::Duration) -> ExitCode {
    let Some(rt) = runtime() else {
        return ExitCode::FAILURE;
    };
    let opts = staleguard::demo::DemoOptions {
        phase,
        ..Default::default()
    };
    rt.block_on(async move {
        match staleguard::demo::run(&staleguard::demo_proxy::InProcess, opts, true).await {
            Ok(report) => {
                println!();
                print!("{}", staleguard::demo::summary(&report));
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: demo failed: {e}");
                ExitCode::FAILURE
            }
        }
    })
}

async fn wait_for_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let term = signal(SignalKind::terminate());
    let int = signal(SignalKind::interrupt());
    match (term, int) {
        (Ok(mut term), Ok(mut int)) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        }
        _ => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
