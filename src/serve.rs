//! Running spoold: bind, serve, replay, reconcile the config's queues, and
//! stop cleanly. `main` calls [`start`]; tests call it too, on port 0.
//!
//! Order matters: the listener is bound first (so probes get answers and a
//! bad address fails fast), then the journal is replayed while `/readyz`
//! says "not ready", then the engine is handed to the routes.
//!
//! A running server takes a new config ([`Reloader::reload`], on SIGHUP in
//! `main`): its queues and API keys change in place; the rest needs a
//! restart and is reported as such.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;

use crate::api::{ApiConfig, AppState, probe_router, router};
use crate::config::{Config, OnCorruption};
use crate::engine::{Engine, EngineOptions, Origin, QueueError};
use crate::journal::JournalError;
use crate::listen as server;
use crate::spool::QueueSettings;

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// `server.listen` is not loopback and no API key is configured.
    #[error(
        "refusing to listen on {listen} without an API key: set server.api_keys or \
         SPOOLD_API_KEYS, listen on a loopback address, or set \
         server.allow_unauthenticated = true"
    )]
    Unauthenticated { listen: String },

    #[error("cannot listen on {listen}: {error}")]
    Bind {
        listen: String,
        error: std::io::Error,
    },

    /// The config breaks a rule (`Config::check_exposure`).
    #[error("{0}")]
    Config(String),

    #[error("opening spool {dir}: {error}")]
    Open { dir: String, error: JournalError },

    #[error("applying the config's queues: {0}")]
    Queue(#[from] QueueError),

    #[error("starting the replica: {0}")]
    Cluster(#[from] crate::cluster::ClusterError),
}

/// How a run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Stopped on request, after the grace period at most.
    Stopped,
    /// An fsync failed: the journal took no more writes; restart so that
    /// replay decides.
    Poisoned,
}

/// A running server.
pub struct Running {
    pub addr: SocketAddr,
    /// Where `server.metrics_listen` is bound, if set.
    pub metrics_addr: Option<SocketAddr>,
    stop: watch::Sender<bool>,
    reload: mpsc::Sender<Reload>,
    task: JoinHandle<Result<Outcome, ServeError>>,
}

/// A new config for a running server, and where its answer goes.
struct Reload {
    config: Config,
    env_api_keys: Option<String>,
    answer: oneshot::Sender<Result<Reloaded, String>>,
}

/// What a reload changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reloaded {
    /// How many API keys are accepted now.
    pub api_keys: usize,
    /// How many queues the file defines.
    pub queues: usize,
    /// Sections that differ from the running config but are read only at
    /// start (`server`, `spool`, …): they wait for a restart.
    pub restart_needed: Vec<String>,
}

/// Hands new configs to a running server (see [`Running::reloader`]).
#[derive(Clone)]
pub struct Reloader(mpsc::Sender<Reload>);

impl Reloader {
    /// Applies `config`'s queues and API keys, or refuses it with the
    /// reason and changes nothing. A server still replaying its journal
    /// applies it once it is ready.
    pub async fn reload(
        &self,
        config: Config,
        env_api_keys: Option<String>,
    ) -> Result<Reloaded, String> {
        let (answer, answered) = oneshot::channel();
        let request = Reload {
            config,
            env_api_keys,
            answer,
        };
        if self.0.send(request).await.is_err() {
            return Err("the server is stopping".into());
        }
        answered
            .await
            .unwrap_or_else(|_| Err("the server is stopping".into()))
    }
}

impl Running {
    /// Asks the server to stop (SIGTERM/SIGINT do this in `main`).
    pub fn stop(&self) {
        self.stop.send_replace(true);
    }

    /// A handle that stops the server from elsewhere (a signal task).
    pub fn stop_handle(&self) -> watch::Sender<bool> {
        self.stop.clone()
    }

    /// A handle that reloads the config from elsewhere (a signal task).
    pub fn reloader(&self) -> Reloader {
        Reloader(self.reload.clone())
    }

    /// Waits until the server has stopped.
    pub async fn wait(self) -> Result<Outcome, ServeError> {
        match self.task.await {
            Ok(result) => result,
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        }
    }
}

/// How many connections the kernel may queue before spoold accepts them.
/// tokio's default (1 024) overflows under a burst of connects; the kernel
/// caps this at `net.core.somaxconn` (4 096 on current kernels).
const LISTEN_BACKLOG: u32 = 8192;

/// Binds the first address `listen` resolves to that accepts a bind, with
/// [`LISTEN_BACKLOG`].
async fn bind(listen: &str) -> std::io::Result<TcpListener> {
    let mut last_error = None;
    for addr in tokio::net::lookup_host(listen).await? {
        let socket = match addr {
            std::net::SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
            std::net::SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
        };
        socket.set_reuseaddr(true)?;
        match socket
            .bind(addr)
            .and_then(|()| socket.listen(LISTEN_BACKLOG))
        {
            Ok(listener) => return Ok(listener),
            Err(error) => last_error = Some(error),
        }
    }
    Err(last_error.unwrap_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "the address resolves to nothing",
        )
    }))
}

/// Binds `server.listen` and starts serving; replay and the rest continue in
/// the background.
pub async fn start(config: Config, env_api_keys: Option<String>) -> Result<Running, ServeError> {
    crate::metrics::install();
    let api_config = ApiConfig::from_config(&config, env_api_keys.as_deref());
    let listen = config.server.listen.clone();
    let listener = bind(&listen).await.map_err(|error| ServeError::Bind {
        listen: listen.clone(),
        error,
    })?;
    let addr = listener.local_addr().map_err(|error| ServeError::Bind {
        listen: listen.clone(),
        error,
    })?;
    // The same rule `check-config` applies, then again on the address the
    // name resolved to.
    config
        .check_exposure(env_api_keys.as_deref())
        .map_err(ServeError::Config)?;
    if !addr.ip().is_loopback()
        && api_config.api_keys.is_empty()
        && !config.server.allow_unauthenticated
    {
        return Err(ServeError::Unauthenticated { listen });
    }
    if !config.spool.fsync {
        tracing::warn!("spool.fsync = false: acknowledged messages can be lost on a crash");
    }
    let (probes, metrics_addr) = match &config.server.metrics_listen {
        Some(listen) => {
            let bad = |error| ServeError::Bind {
                listen: listen.clone(),
                error,
            };
            let bound = bind(listen).await.map_err(bad)?;
            let addr = bound.local_addr().map_err(bad)?;
            (Some(bound), Some(addr))
        }
        None => (None, None),
    };
    let metrics = metrics_addr.map_or_else(|| "none".to_string(), |a| a.to_string());
    tracing::info!(%addr, %metrics, "listening");
    let state = AppState::new(api_config);
    let (stop, stop_rx) = watch::channel(false);
    let (reload, reloads) = mpsc::channel(4);
    let task = tokio::spawn(run(config, listener, probes, state, stop_rx, reloads));
    Ok(Running {
        addr,
        metrics_addr,
        stop,
        reload,
        task,
    })
}

async fn run(
    config: Config,
    listener: TcpListener,
    probes: Option<TcpListener>,
    state: std::sync::Arc<AppState>,
    mut stop: watch::Receiver<bool>,
    mut reloads: mpsc::Receiver<Reload>,
) -> Result<Outcome, ServeError> {
    let grace = Duration::from_millis(config.server.shutdown_grace_ms);
    // The listeners stop on a stop request and on a poisoned journal alike.
    let (close_listener, listener_closed) = watch::channel(false);
    let closed = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let server = tokio::spawn(server::serve(
        listener,
        router(state.clone()),
        closed(listener_closed.clone()),
        grace,
        server::Limits::api(probe_router(state.clone())),
    ));
    let probe_server = probes.map(|l| {
        tokio::spawn(server::serve(
            l,
            probe_router(state.clone()),
            closed(listener_closed),
            grace,
            server::Limits::api(probe_router(state.clone())),
        ))
    });

    let mut options = EngineOptions::new(&config.spool.dir);
    options.segment_bytes = config.spool.segment_bytes;
    options.fsync = config.spool.fsync;
    options.max_bytes = config.spool.max_bytes;
    options.quarantine_corruption = config.spool.on_corruption == OnCorruption::Quarantine;
    options.policy = config.policy();
    let opened = match &config.cluster {
        None => Engine::open(options).await.map(|(e, r)| (e, r, None)),
        Some(cluster) => {
            let secret = cluster
                .secret(std::env::var("SPOOLD_CLUSTER_SECRET").ok().as_deref())
                .map_err(ServeError::Config);
            let secret = match secret {
                Ok(s) => s,
                Err(e) => {
                    close_listener.send_replace(true);
                    return Err(e);
                }
            };
            let max_body_bytes = config.server.max_body_bytes;
            match crate::cluster::Cluster::open(options, cluster, &secret, max_body_bytes).await {
                Ok((e, r, c)) => Ok((e, r, Some(c))),
                Err(crate::cluster::ClusterError::Journal(error)) => Err(error),
                // Raft cannot run on this replica until an operator repairs
                // its vote: it stays up and says so, rather than restart in
                // a loop (its supervisor would only start it again).
                Err(e @ crate::cluster::ClusterError::PoisonedVote { .. }) => {
                    let reason = e.to_string();
                    tracing::error!("{reason}");
                    state.block(reason);
                    let _ = stop.wait_for(|s| *s).await;
                    state.begin_shutdown();
                    close_listener.send_replace(true);
                    let _ = server.await;
                    return Ok(Outcome::Stopped);
                }
                Err(e) => {
                    close_listener.send_replace(true);
                    return Err(e.into());
                }
            }
        }
    };
    let (engine, report, cluster) = match opened {
        Ok(opened) => opened,
        Err(error) => {
            close_listener.send_replace(true);
            return Err(ServeError::Open {
                dir: config.spool.dir.display().to_string(),
                error,
            });
        }
    };
    if let Some(cluster) = &cluster {
        state.set_cluster(cluster.clone());
    }
    tracing::info!(
        dir = %config.spool.dir.display(),
        records = report.records,
        messages = report.messages,
        epoch = report.epoch,
        replay_ms = report.duration.as_millis() as u64,
        "spool open"
    );
    let queues = config_queues(&config);
    let (wanted, wanted_changes) = watch::channel(queues.clone());
    let _reconciler = match &cluster {
        None => {
            reconcile_config_queues(&engine, &queues).await?;
            None
        }
        // Only the primary writes: each replica reconciles whenever it
        // starts serving, and again when a reload changes the queues.
        Some(_) => Some(tokio::spawn(reconcile_when_serving(
            engine.clone(),
            wanted_changes,
            state.clone(),
        ))),
    };
    let _timer = engine.spawn_timer();
    let _rates = engine.spawn_rates();
    let _compactor =
        engine.spawn_compactor(Duration::from_millis(config.spool.compaction_interval_ms));
    let (stop_delivery, delivery_stop) = watch::channel(false);
    let delivery = tokio::spawn(crate::delivery::run(
        engine.clone(),
        delivery_stop,
        config.server.drain_on_shutdown,
        config
            .server
            .redact_headers
            .iter()
            .map(|h| h.to_ascii_lowercase())
            .collect(),
    ));
    state.set_engine(engine.clone());
    tracing::info!("ready");

    let mut poisoned = engine.poisoned();
    let mut running = config;
    let outcome = loop {
        // The watch guards are dropped at once: a reload below awaits.
        tokio::select! {
            _ = async { stop.wait_for(|s| *s).await.map(|_| ()) } => break Outcome::Stopped,
            _ = async { poisoned.wait_for(|p| *p).await.map(|_| ()) } => break Outcome::Poisoned,
            Some(request) = reloads.recv() => {
                let answer = reload(&running, &request, &engine, &wanted, &state).await;
                if answer.is_ok() {
                    running = request.config;
                }
                let _ = request.answer.send(answer);
            }
        }
    };
    state.begin_shutdown();
    match outcome {
        Outcome::Stopped => {
            tracing::info!(
                grace_ms = grace.as_millis() as u64,
                "stopping: no new connections, finishing requests"
            );
        }
        Outcome::Poisoned => {
            tracing::error!("journal poisoned by a failed fsync: stopping so that replay decides");
        }
    }
    close_listener.send_replace(true);
    stop_delivery.send_replace(true);
    // In-flight requests and deliveries get the grace period; what is still
    // in flight after it is dropped: its lease dies with the process, so the
    // message is redelivered after the restart without a retry increment.
    let mut delivery = delivery;
    if tokio::time::timeout(grace, &mut delivery).await.is_err() {
        delivery.abort();
        tracing::warn!("deliveries still in flight after the grace period: released");
    }

    let _ = server.await;
    if let Some(probes) = probe_server {
        let _ = probes.await;
    }
    if let Some(cluster) = &cluster {
        cluster.shutdown().await;
    }
    engine.close();
    Ok(outcome)
}

/// The queues a config file defines.
fn config_queues(config: &Config) -> BTreeMap<String, QueueSettings> {
    config
        .queues
        .iter()
        .map(|(name, q)| (name.clone(), q.settings()))
        .collect()
}

/// Applies a new config's queues and API keys, or refuses it with the
/// reason and changes nothing. The file itself was validated when it was
/// read (`Config::load`); what is checked here is what the running server
/// adds: its exposure, and that a reload does not remove the last key.
async fn reload(
    running: &Config,
    request: &Reload,
    engine: &Engine,
    wanted: &watch::Sender<BTreeMap<String, QueueSettings>>,
    state: &AppState,
) -> Result<Reloaded, String> {
    let config = &request.config;
    let env_keys = request.env_api_keys.as_deref();
    config.check_exposure(env_keys)?;
    let keys = config.api_keys(env_keys)?;
    if keys.is_empty() && !state.api_keys().is_empty() {
        return Err(
            "the new config has no API key; removing the last one opens the API \
             and needs a restart"
                .into(),
        );
    }
    let queues = config_queues(config);
    if engine.serving_changes().is_none() {
        // A single node reconciles here, so that an error is the answer.
        reconcile_config_queues(engine, &queues)
            .await
            .map_err(|e| format!("applying the queues: {e}"))?;
    }
    let reloaded = Reloaded {
        api_keys: keys.len(),
        queues: queues.len(),
        restart_needed: restart_needed(running, config),
    };
    // Replicated mode: the primary reconciles (`reconcile_when_serving`).
    wanted.send_replace(queues);
    state.set_api_keys(keys);
    Ok(reloaded)
}

/// The sections of `new` that differ from `running` other than the queues
/// and the API keys: a reload leaves them to the next start.
fn restart_needed(running: &Config, new: &Config) -> Vec<String> {
    let mut running = running.clone();
    running.server.api_keys.clone_from(&new.server.api_keys);
    let mut sections = Vec::new();
    let mut differs = |name: &str, same: bool| {
        if !same {
            sections.push(name.to_string());
        }
    };
    differs("server", running.server == new.server);
    differs("spool", running.spool == new.spool);
    differs("log", running.log == new.log);
    differs("events", running.events == new.events);
    differs("telemetry", running.telemetry == new.telemetry);
    differs("cluster", running.cluster == new.cluster);
    sections
}

/// Replicated mode: reconciles the config's queues each time this replica
/// starts serving as the primary (retrying while leadership settles),
/// then opens the API: no call sees the queues before they are in place.
/// A reload that changes the queues reconciles them again.
async fn reconcile_when_serving(
    engine: Engine,
    mut wanted: watch::Receiver<BTreeMap<String, QueueSettings>>,
    state: std::sync::Arc<AppState>,
) {
    let Some(mut serving) = engine.serving_changes() else {
        return;
    };
    loop {
        let term = *serving.borrow_and_update();
        // Retried while this replica still serves in `term`.
        while term != 0 && *serving.borrow() == term {
            let queues = wanted.borrow_and_update().clone();
            match reconcile_config_queues(&engine, &queues).await {
                Ok(()) => {
                    state.open_in(term);
                    break;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "reconciling the config's queues; retrying");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
        tokio::select! {
            changed = serving.changed() => if changed.is_err() { return },
            changed = wanted.changed() => if changed.is_err() { return },
        }
    }
}

/// Makes the spool's config-managed queues match the config file: creates
/// or updates every queue it defines; a queue it no longer defines is
/// deleted if empty, and otherwise becomes API-managed (nothing is dropped
/// silently).
pub(crate) async fn reconcile_config_queues(
    engine: &Engine,
    wanted: &BTreeMap<String, QueueSettings>,
) -> Result<(), QueueError> {
    for (name, settings) in wanted {
        let current = engine.queue_settings(name).ok();
        if current.as_ref() != Some(&(settings.clone(), true)) {
            engine
                .upsert_queue(name, settings.clone(), Origin::Config)
                .await?;
        }
    }
    for name in engine.queue_names() {
        let Ok((_, true)) = engine.queue_settings(&name) else {
            continue;
        };
        if wanted.contains_key(&name) {
            continue;
        }
        if engine.message_count(&name) == 0 {
            tracing::info!(queue = %name, "queue left the config file and was empty: deleted");
            engine.delete_queue(&name, Origin::Config).await?;
        } else {
            tracing::warn!(
                queue = %name,
                "queue left the config file but still holds messages: it is now managed over the API"
            );
            engine.hand_over_to_api(&name).await?;
        }
    }
    Ok(())
}
