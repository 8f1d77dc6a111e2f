//! The `staleguard` command line: `run`, `check-config`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, Subcommand, ValueEnum};

use staleguard::config::{self, Config};

#[derive(Parser)]
#[command(
    name = "staleguard",
    version,
    about = "MongoDB wire-protocol proxy: keep secondary reads answering, or failing fast, when shard routing goes stale"
)]
struct Cli {
    /// Log level (overridden by RUST_LOG when set): error, warn, info, debug, trace.
    #[arg(long, global = true, default_value = "info")]
    log_level: String,
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
        #[arg(long, default_value = "config/staleguard.toml")]
        config: PathBuf,
    },
    /// Validate a config file and print the effective policy table.
    CheckConfig {
        /// Config file.
        #[arg(default_value = "config/staleguard.toml")]
        file: PathBuf,
        /// Show which entry governs this namespace (db.coll).
        #[arg(long)]
        explain: Option<String>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logs(&cli.log_level, cli.log_format);
    match cli.command {
        Command::Run { config } => run(config),
        Command::CheckConfig { file, explain } => check_config(file, explain),
    }
}

fn init_logs(level: &str, format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Pretty => logs.init(),
        // The connection span (client address, id) rides along on every event.
        LogFormat::Json => logs
            .json()
            .with_current_span(true)
            .with_span_list(false)
            .init(),
    }
}

fn load(path: &std::path::Path) -> Option<Config> {
    match Config::load(path) {
        Ok(c) => Some(c),
        Err(errors) => {
            for e in errors {
                eprintln!("error: {e}");
            }
            None
        }
    }
}

fn check_config(file: PathBuf, explain: Option<String>) -> ExitCode {
    let Some(cfg) = load(&file) else {
        return ExitCode::from(2);
    };
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
    rt.block_on(async move {
        let running = match staleguard::server::start(Arc::new(cfg)).await {
            Ok(r) => r,
            Err(e) => {
                tracing::error!(error = %e, "cannot listen");
                return ExitCode::FAILURE;
            }
        };
        let stop = running.stop_token();
        tokio::spawn(async move {
            wait_for_signal().await;
            tracing::info!("signal received, stopping");
            stop.cancel();
        });
        let shared = running.shared().clone();
        tokio::spawn(reload_on_hangup(shared));
        running.wait().await;
        ExitCode::SUCCESS
    })
}

/// SIGHUP reloads the config file (errors are logged and shown in `/status`).
async fn reload_on_hangup(shared: Arc<staleguard::server::Shared>) {
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
