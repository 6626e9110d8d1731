//! `spoold run` (and `spoold` without a command): the process around a
//! server ([`crate::serve`]). It reads the config, sets up logging (and
//! traces), logs the allocator, starts the runtime, and turns signals into
//! requests: SIGTERM and SIGINT stop the server, SIGHUP reloads its config.
//!
//! These log lines are the binary's own: they keep the target they had in
//! `main.rs` ([`LOG_TARGET`]), so that a `SPOOLD_LOG` filter or a search
//! of the log that names it still finds them.

use std::io::IsTerminal as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context as _;
use tokio::sync::watch;

use super::env_api_keys;
use crate::config::{Config, ConfigError, LogFormat};
use crate::serve::{Outcome, Reloader};
use crate::telemetry::Telemetry;

/// The target of the log lines of this file: the binary's name.
const LOG_TARGET: &str = "spoold";

/// Where the served config comes from: read at start, and again on each
/// SIGHUP.
#[derive(Clone)]
struct ConfigSource {
    /// `--config`; without one, the embedded defaults.
    path: Option<PathBuf>,
    /// `--listen`, over the file's `server.listen`.
    listen: Option<String>,
}

impl ConfigSource {
    /// The config `run` serves: the file (or the defaults), `--listen` over
    /// it.
    fn load(&self) -> anyhow::Result<Config> {
        self.load_with(Config::load)
    }

    /// As [`ConfigSource::load`], the file read once two reads agree
    /// (`Config::load_settled`): what a reload takes.
    fn load_settled(&self) -> anyhow::Result<Config> {
        self.load_with(Config::load_settled)
    }

    fn load_with(&self, read: fn(&Path) -> Result<Config, ConfigError>) -> anyhow::Result<Config> {
        let mut config = match &self.path {
            Some(path) => read(path)?,
            None => Config::default(),
        };
        if let Some(listen) = &self.listen {
            config.server.listen.clone_from(listen);
            config.listen_line = None;
        }
        Ok(config)
    }
}

/// Serves `config` (`--config`, else the defaults) with `listen`
/// (`--listen`) over its address, until a signal stops it: exit 0, or 1
/// when the journal was poisoned. Logging starts once the config is read,
/// so that its `[log]` table applies; traces still in the exporter are
/// sent after the runtime has stopped.
pub fn run(config: Option<PathBuf>, listen: Option<String>) -> anyhow::Result<ExitCode> {
    let source = ConfigSource {
        path: config,
        listen,
    };
    let config = source.load()?;
    let telemetry = init_tracing(&config)?;
    log_allocator();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let served = runtime.block_on(serve(config, source));
    drop(runtime);
    if let Some(telemetry) = telemetry {
        telemetry.shutdown();
    }
    served
}

/// Logs to stderr (text or JSON), and, with `[telemetry] otlp_endpoint`,
/// spans to an OTLP collector (`src/telemetry.rs`): the returned handle
/// sends the last ones at exit.
fn init_tracing(config: &Config) -> anyhow::Result<Option<Telemetry>> {
    use tracing_subscriber::prelude::*;
    let filter = log_filter(config);
    // Colour only for a person at a terminal: not in files or journald.
    let colour = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    let fmt = tracing_subscriber::fmt::layer()
        .with_ansi(colour)
        .with_writer(std::io::stderr);
    let fmt = match config.log.format {
        LogFormat::Json => fmt.json().boxed(),
        LogFormat::Text => fmt.boxed(),
    };
    let (telemetry, tracer) = match Telemetry::start(&config.telemetry)? {
        Some((telemetry, tracer)) => (Some(telemetry), Some(tracer)),
        None => (None, None),
    };
    tracing_subscriber::registry()
        .with(fmt)
        .with(filter)
        .with(tracer.map(|t| tracing_opentelemetry::layer().with_tracer(t)))
        .init();
    Ok(telemetry)
}

/// Which log lines are written: `SPOOLD_LOG` if set, else `log.level` (and
/// `log.level` too when `SPOOLD_LOG` does not parse). openraft logs every
/// election step at `info`, each a page long; it is kept to warnings
/// unless the filter names it.
fn log_filter(config: &Config) -> tracing_subscriber::EnvFilter {
    let spec = std::env::var("SPOOLD_LOG")
        .ok()
        .filter(|s| !s.trim().is_empty())
        .unwrap_or_else(|| config.log.level.clone());
    let spec = if spec.contains("openraft") {
        spec
    } else {
        format!("{spec},openraft=warn")
    };
    tracing_subscriber::EnvFilter::try_new(&spec)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(&config.log.level))
}

/// Logs the allocator the binary was built with and the settings it reads
/// from the environment, once, at start-up (tikv-jemallocator's jemalloc
/// has prefixed symbols): how a deployment tuned it shows in the log.
fn log_allocator() {
    let prefix = match crate::ALLOCATOR {
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
    tracing::info!(target: LOG_TARGET, allocator = crate::ALLOCATOR, %settings, "allocator");
}

/// Starts the server, with a task that stops it on SIGTERM or SIGINT and
/// one that reloads its config on SIGHUP, and waits until it has stopped.
/// A poisoned journal exits 1, so that the supervisor restarts spoold and
/// replay decides.
async fn serve(config: Config, source: ConfigSource) -> anyhow::Result<ExitCode> {
    let running = crate::serve::start(config, env_api_keys()).await?;
    let reloader = tokio::spawn(reload_on_hangup(running.reloader(), source));
    let stopper = tokio::spawn(stop_on_signal(running.stop_handle()));
    let outcome = running.wait().await?;
    stopper.abort();
    reloader.abort();
    Ok(match outcome {
        Outcome::Stopped => ExitCode::SUCCESS,
        Outcome::Poisoned => ExitCode::from(1),
    })
}

/// Asks the server to stop at the first SIGTERM or SIGINT.
async fn stop_on_signal(stop: watch::Sender<bool>) {
    wait_for_signal().await;
    tracing::info!(target: LOG_TARGET, "signal received");
    stop.send_replace(true);
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

/// SIGHUP: reads the config file again and hands it to the server
/// ([`reload`]). This is how a Kubernetes ConfigMap update reaches a
/// running spoold.
async fn reload_on_hangup(reloader: Reloader, source: ConfigSource) {
    use tokio::signal::unix::{SignalKind, signal};
    let Ok(mut hangups) = signal(SignalKind::hangup()) else {
        tracing::warn!(
            target: LOG_TARGET,
            "cannot listen for SIGHUP: the config is read only at start"
        );
        return;
    };
    while hangups.recv().await.is_some() {
        reload(&reloader, &source).await;
    }
}

/// One reload: the server applies the file's queues and API keys or
/// refuses it (a file that does not parse is refused here); either way the
/// log says what happened, and a refused file changes nothing.
async fn reload(reloader: &Reloader, source: &ConfigSource) {
    let Some(path) = &source.path else {
        tracing::warn!(
            target: LOG_TARGET,
            "SIGHUP: no --config file to read again; nothing changed"
        );
        return;
    };
    // Read once it stopped changing: a file caught mid-write is not taken.
    let settled = {
        let source = source.clone();
        tokio::task::spawn_blocking(move || source.load_settled())
            .await
            .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()))
    };
    let config = match settled {
        Ok(config) => config,
        Err(e) => {
            tracing::error!(
                target: LOG_TARGET,
                error = %format!("{e:#}"),
                "SIGHUP: config refused; nothing changed"
            );
            return;
        }
    };
    match reloader.reload(config, env_api_keys()).await {
        Ok(done) => tracing::info!(
            target: LOG_TARGET,
            config = %path.display(),
            queues = done.queues,
            api_keys = done.api_keys,
            restart_needed = %done.restart_needed.join(","),
            "SIGHUP: config reloaded"
        ),
        Err(e) => tracing::error!(
            target: LOG_TARGET,
            error = %e,
            config = %path.display(),
            "SIGHUP: config refused; nothing changed"
        ),
    }
}
