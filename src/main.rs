//! The `spoold` binary: parse the command line, load the config, set up
//! logging, and hand over to the library.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Parser, Subcommand};

use spoold::config::{Config, LogFormat};
use spoold::serve::Outcome;

#[derive(Parser)]
#[command(
    name = "spoold",
    version,
    about = "A durable local spool for outbound work"
)]
struct Cli {
    /// The running server, for the operator commands.
    #[arg(
        long,
        global = true,
        env = "SPOOLD_URL",
        default_value = "http://127.0.0.1:8787"
    )]
    url: String,
    /// API key for the operator commands (never logged).
    #[arg(long, global = true, env = "SPOOLD_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Serve (the default command).
    Run {
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// Validate a config file and print the effective config.
    CheckConfig {
        #[arg(long)]
        config: PathBuf,
    },
    /// Offline journal tools (the spool must not be running).
    Journal {
        #[command(subcommand)]
        command: JournalCommand,
    },
    /// List queues with their stats.
    Queues,
    /// Follow new messages of a queue, like `tail -f`.
    Tail {
        queue: String,
        /// Print the raw JSON lines.
        #[arg(long)]
        json: bool,
    },
    /// Send one message (the body from --data, else standard input).
    Send {
        queue: String,
        #[arg(long)]
        data: Option<String>,
        #[arg(long, default_value = "application/octet-stream")]
        content_type: String,
        /// Idempotency key (the queue needs a dedup window).
        #[arg(long)]
        key: Option<String>,
    },
    /// Dead letters: the failure queue of QUEUE.
    Dlq {
        #[command(subcommand)]
        command: DlqCommand,
    },
}

#[derive(Subcommand)]
enum DlqCommand {
    /// Failed messages with reason, last status, attempts and time.
    List { queue: String },
    /// Move failed messages back into QUEUE (retry counts reset).
    Redrive {
        queue: String,
        #[arg(long)]
        max: Option<u64>,
        #[arg(long)]
        dry_run: bool,
    },
    /// Delete every failed message (asks first unless --yes).
    Purge {
        queue: String,
        #[arg(long)]
        yes: bool,
    },
}

#[derive(Subcommand)]
enum JournalCommand {
    /// Report every damaged span; exit 1 if any.
    Verify {
        #[arg(long)]
        dir: PathBuf,
    },
    /// Move every damaged span to a quarantine file and keep every good
    /// record.
    Repair {
        #[arg(long)]
        dir: PathBuf,
    },
    /// Compact every file that holds garbage now.
    Compact {
        #[arg(long)]
        dir: PathBuf,
    },
    /// Convert a spool written by an older spoold (format 1) to this
    /// format; start-up does it too.
    Upgrade {
        #[arg(long)]
        dir: PathBuf,
    },
}

fn main() -> ExitCode {
    crash_on_panic();
    let cli = Cli::parse();
    let target = spoold::cli::ops::Target {
        url: cli.url.clone(),
        api_key: cli.api_key.clone(),
    };
    let result = match cli.command.unwrap_or(Command::Run { config: None }) {
        Command::Queues => ops(|| async { spoold::cli::ops::queues(&target).await }),
        Command::Tail { queue, json } => ops(|| async {
            spoold::cli::ops::tail(&target, &queue, json, &mut std::io::stdout()).await?;
            Ok(String::new())
        }),
        Command::Send {
            queue,
            data,
            content_type,
            key,
        } => ops(|| async {
            let body = match data {
                Some(d) => d.into_bytes(),
                None => {
                    let mut buf = Vec::new();
                    std::io::Read::read_to_end(&mut std::io::stdin(), &mut buf)?;
                    buf
                }
            };
            let id = spoold::cli::ops::send(&target, &queue, body, &content_type, key.as_deref())
                .await?;
            Ok(format!("{id}\n"))
        }),
        Command::Dlq { command } => match command {
            DlqCommand::List { queue } => {
                ops(|| async { spoold::cli::ops::dlq_list(&target, &queue).await })
            }
            DlqCommand::Redrive {
                queue,
                max,
                dry_run,
            } => ops(|| async {
                Ok(spoold::cli::ops::dlq_redrive(&target, &queue, max, dry_run).await? + "\n")
            }),
            DlqCommand::Purge { queue, yes } => ops(|| async {
                let stdin = std::io::stdin();
                let line = spoold::cli::ops::dlq_purge(
                    &target,
                    &queue,
                    yes,
                    &mut stdin.lock(),
                    &mut std::io::stderr(),
                )
                .await?;
                Ok(line + "\n")
            }),
        },
        Command::Run { config } => run(config),
        Command::CheckConfig { config } => check_config(config),
        Command::Journal { command } => match command {
            JournalCommand::Verify { dir } => verify(dir),
            JournalCommand::Repair { dir } => repair(dir),
            JournalCommand::Compact { dir } => compact(dir),
            JournalCommand::Upgrade { dir } => upgrade(dir),
        },
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("spoold: {e:#}");
            ExitCode::from(1)
        }
    }
}

/// Runs an operator command on a small runtime and prints what it returns.
fn ops<F, Fut>(command: F) -> anyhow::Result<ExitCode>
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = Result<String, spoold::cli::ops::OpsError>>,
{
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let text = runtime.block_on(command())?;
    print!("{text}");
    Ok(ExitCode::SUCCESS)
}

fn load_config(path: Option<&PathBuf>) -> anyhow::Result<Config> {
    match path {
        Some(p) => Ok(Config::load(p)?),
        None => Ok(Config::default()),
    }
}

fn init_tracing(config: &Config) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("SPOOLD_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(&config.log.level));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match config.log.format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.init(),
    }
}

/// The same checks `run` makes before it serves: the file, then the
/// exposure (a key when listening beyond loopback, `SPOOLD_API_KEYS`
/// included).
fn check_config(path: PathBuf) -> anyhow::Result<ExitCode> {
    let config = load_config(Some(&path))?;
    config
        .check_exposure(std::env::var("SPOOLD_API_KEYS").ok().as_deref())
        .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    println!("{:#?}", config.redacted());
    Ok(ExitCode::SUCCESS)
}

fn verify(dir: PathBuf) -> anyhow::Result<ExitCode> {
    let report = spoold::cli::journal::verify(&dir)?;
    print!("{}", report.render(&dir));
    Ok(if report.is_clean() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

fn repair(dir: PathBuf) -> anyhow::Result<ExitCode> {
    let report = spoold::cli::journal::repair(&dir)?;
    print!("{}", report.render(&dir));
    Ok(ExitCode::SUCCESS)
}

fn upgrade(dir: PathBuf) -> anyhow::Result<ExitCode> {
    let report = spoold::cli::journal::upgrade(&dir)?;
    print!("{}", report.render(&dir));
    Ok(ExitCode::SUCCESS)
}

/// A panic anywhere — a request handler, a background task, the journal's
/// threads — is a bug, and a half-working server is worse than none: log
/// it and abort, so the supervisor restarts the process and replay decides
/// (TigerBeetle's rule). Release builds also set `panic = "abort"`; this
/// covers debug builds and says why in the log.
fn crash_on_panic() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        default(info);
        tracing::error!(panic = %info, "a bug: aborting (the supervisor restarts spoold; replay decides)");
        std::process::abort();
    }));
}

fn compact(dir: PathBuf) -> anyhow::Result<ExitCode> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let text = runtime.block_on(spoold::cli::journal::compact(&dir))?;
    print!("{text}");
    Ok(ExitCode::SUCCESS)
}

fn run(config_path: Option<PathBuf>) -> anyhow::Result<ExitCode> {
    let config = load_config(config_path.as_ref())?;
    init_tracing(&config);
    log_allocator();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(serve(config))
}

/// The allocator is chosen when the binary is built: jemalloc (the default
/// feature), mimalloc (feature `mimalloc`), or the system's
/// (`--no-default-features`); `docs/performance.md` has the comparison that
/// chose jemalloc. Its settings, if any, come from how the binary is
/// deployed; both are logged at start-up.
#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[cfg(all(feature = "jemalloc", not(feature = "mimalloc")))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

const ALLOCATOR_NAME: &str = if cfg!(feature = "mimalloc") {
    "mimalloc"
} else if cfg!(feature = "jemalloc") {
    "jemalloc"
} else {
    "system"
};

fn log_allocator() {
    // Each allocator reads its settings from the environment, once, at
    // start-up (tikv-jemallocator's jemalloc has prefixed symbols).
    let prefix = match ALLOCATOR_NAME {
        "mimalloc" => "MIMALLOC_",
        "jemalloc" => "_RJEM_MALLOC_CONF",
        _ => "GLIBC_TUNABLES",
    };
    let settings: Vec<String> = std::env::vars()
        .filter(|(name, _)| name.starts_with(prefix))
        .map(|(name, value)| format!("{name}={value}"))
        .collect();
    let settings = if settings.is_empty() {
        format!("defaults (no {prefix}* set)")
    } else {
        settings.join(" ")
    };
    tracing::info!(allocator = ALLOCATOR_NAME, %settings, "allocator");
}

async fn serve(config: Config) -> anyhow::Result<ExitCode> {
    let running = spoold::serve::start(config, std::env::var("SPOOLD_API_KEYS").ok()).await?;
    let stopper = tokio::spawn({
        let stop = running.stop_handle();
        async move {
            wait_for_signal().await;
            tracing::info!("signal received");
            stop.send_replace(true);
        }
    });
    let outcome = running.wait().await?;
    stopper.abort();
    Ok(match outcome {
        Outcome::Stopped => ExitCode::SUCCESS,
        Outcome::Poisoned => ExitCode::from(1),
    })
}

/// SIGTERM (what Kubernetes sends) or SIGINT (Ctrl-C).
async fn wait_for_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
