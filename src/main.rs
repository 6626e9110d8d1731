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
    /// Compact every sealed segment now.
    Compact {
        #[arg(long)]
        dir: PathBuf,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command.unwrap_or(Command::Run { config: None }) {
        Command::Run { config } => run(config),
        Command::CheckConfig { config } => check_config(config),
        Command::Journal { command } => match command {
            JournalCommand::Verify { dir } => verify(dir),
            JournalCommand::Repair { dir } => repair(dir),
            JournalCommand::Compact { dir } => compact(dir),
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

fn check_config(path: PathBuf) -> anyhow::Result<ExitCode> {
    let config = load_config(Some(&path))?;
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
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(serve(config))
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
