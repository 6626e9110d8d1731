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
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;

use crate::api::{ApiConfig, AppState, probe_router, router};
use crate::cluster::{Cluster, ClusterError};
use crate::config::{Config, ExposureError, OnCorruption, ReloadRefusal, SecretError};
use crate::engine::{Engine, EngineOptions, Origin, QueueError, ReplayReport};
use crate::journal::JournalError;
use crate::listen;
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

    /// The config's API keys cannot guard what it listens on
    /// (`Config::check_exposure`).
    #[error("{0}")]
    Exposure(ExposureError),

    /// A replica's secret cannot be used (`ClusterConfig::secret`).
    #[error("{0}")]
    ClusterSecret(SecretError),

    #[error("opening spool {dir}: {error}")]
    Open { dir: String, error: JournalError },

    #[error("applying the config's queues: {0}")]
    Queue(#[from] QueueError),

    #[error("starting the replica: {0}")]
    Cluster(#[from] ClusterError),
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
    answer: oneshot::Sender<Result<Reloaded, ReloadError>>,
}

/// Why a running server refused a new config; it changed nothing.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    /// The server stopped before it could answer.
    #[error("the server is stopping")]
    Stopping,
    #[error("{0}")]
    Exposure(ExposureError),
    /// The file takes away a queue's signing secret or static headers.
    #[error("{0}")]
    Refused(ReloadRefusal),
    /// The running server has API keys and the new config none: opening
    /// the API takes a restart, never a reload.
    #[error(
        "the new config has no API key; removing the last one opens the API and needs a \
         restart"
    )]
    LastKey,
    /// A single node could not apply the config's queues.
    #[error("applying the queues: {0}")]
    Queues(QueueError),
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
    ) -> Result<Reloaded, ReloadError> {
        let (answer, answered) = oneshot::channel();
        let request = Reload {
            config,
            env_api_keys,
            answer,
        };
        if self.0.send(request).await.is_err() {
            return Err(ReloadError::Stopping);
        }
        answered.await.unwrap_or(Err(ReloadError::Stopping))
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
/// the background (`run`).
pub async fn start(config: Config, env_api_keys: Option<String>) -> Result<Running, ServeError> {
    crate::metrics::install();
    let api_config = ApiConfig::from_config(&config, env_api_keys.as_deref());
    let (listener, addr) = bind_named(&config.server.listen).await?;
    check_exposure(&config, env_api_keys.as_deref(), &api_config, addr)?;
    // Only digests from here on: the keys themselves are not kept.
    let config = config.with_keys_hashed();
    if !config.spool.fsync {
        tracing::warn!("spool.fsync = false: acknowledged messages can be lost on a crash");
    }
    let (probes, metrics_addr) = match &config.server.metrics_listen {
        Some(listen) => {
            let (bound, addr) = bind_named(listen).await?;
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

/// Binds `listen` (the API's address or the metrics one) and says where it
/// is bound: a name such as `localhost:0` becomes an address and a port.
/// Either failure is a [`ServeError::Bind`] naming `listen` as written.
async fn bind_named(listen: &str) -> Result<(TcpListener, SocketAddr), ServeError> {
    let bad = |error| ServeError::Bind {
        listen: listen.to_string(),
        error,
    };
    let listener = bind(listen).await.map_err(bad)?;
    let addr = listener.local_addr().map_err(bad)?;
    Ok((listener, addr))
}

/// Refuses to serve an API that anyone who can reach it could use: the
/// same rule `check-config` applies (`Config::check_exposure`), then again
/// on the address the name resolved to, which only binding tells.
fn check_exposure(
    config: &Config,
    env_api_keys: Option<&str>,
    api_config: &ApiConfig,
    addr: SocketAddr,
) -> Result<(), ServeError> {
    config
        .check_exposure(env_api_keys)
        .map_err(ServeError::Exposure)?;
    if !addr.ip().is_loopback()
        && api_config.api_keys.is_empty()
        && !config.server.allow_unauthenticated
    {
        return Err(ServeError::Unauthenticated {
            listen: config.server.listen.clone(),
        });
    }
    Ok(())
}

/// The server's life once [`start`] has bound its listeners: serve them
/// (probes answer "not ready" meanwhile), open the spool, put the config's
/// queues in place, start the background tasks, say ready, serve until a
/// stop request or a poisoned journal, then stop in the order that loses
/// nothing.
async fn run(
    config: Config,
    listener: TcpListener,
    probes: Option<TcpListener>,
    state: Arc<AppState>,
    mut stop: watch::Receiver<bool>,
    mut reloads: mpsc::Receiver<Reload>,
) -> Result<Outcome, ServeError> {
    let grace = Duration::from_millis(config.server.shutdown_grace_ms);
    // Where this node answers, as bound (a port 0 becomes a port): never a
    // push destination (`engine/guard.rs`).
    let bound: Vec<(SocketAddr, &str)> = [
        (listener.local_addr().ok(), "this node's API"),
        (
            probes.as_ref().and_then(|p| p.local_addr().ok()),
            "this node's metrics listener",
        ),
    ]
    .into_iter()
    .filter_map(|(addr, what)| Some((addr?, what)))
    .collect();
    let mut listeners = Listeners::serve(listener, probes, &state, grace);
    let (engine, report, cluster) = match open_spool(&config, &bound).await {
        Ok(Opened::Spool {
            engine,
            report,
            cluster,
        }) => (engine, report, cluster),
        Ok(Opened::VoteNeedsRepair(reason)) => {
            return Ok(serve_blocked(reason, &state, &mut stop, listeners).await);
        }
        Err(error) => {
            listeners.close();
            return Err(error);
        }
    };
    if let Some(cluster) = &cluster {
        state.set_cluster(cluster.clone());
    }
    log_spool_open(&config, &report);
    let (wanted, _reconciler) =
        reconcile_at_start(&config, &engine, cluster.is_some(), &state).await?;
    let mut background = Background::start(&config, &engine);
    state.set_engine(engine.clone());
    tracing::info!("ready");
    let outcome =
        serve_until_stopped(config, &engine, &wanted, &state, &mut stop, &mut reloads).await;
    stop_serving(outcome, grace, &state, &listeners, &mut background).await;
    listeners.wait().await;
    if let Some(cluster) = &cluster {
        cluster.shutdown().await;
    }
    engine.close();
    Ok(outcome)
}

/// The API's listener and, with `server.metrics_listen`, the probes' one,
/// each served by a task of its own until [`Listeners::close`]. They close
/// on a stop request and on a poisoned journal alike.
struct Listeners {
    close: watch::Sender<bool>,
    api: JoinHandle<()>,
    probes: Option<JoinHandle<()>>,
}

impl Listeners {
    /// Starts serving: the API's routes on `listener`, only the probes on
    /// `probes`. Either answers the probes itself when no connection slot
    /// is free, so that a busy server is not restarted as a dead one.
    fn serve(
        listener: TcpListener,
        probes: Option<TcpListener>,
        state: &Arc<AppState>,
        grace: Duration,
    ) -> Listeners {
        let (close, closed) = watch::channel(false);
        let api = tokio::spawn(listen::serve(
            listener,
            router(state.clone()),
            until_closed(closed.clone()),
            grace,
            listen::Limits::api(probe_router(state.clone())),
        ));
        let probes = probes.map(|l| {
            tokio::spawn(listen::serve(
                l,
                probe_router(state.clone()),
                until_closed(closed),
                grace,
                listen::Limits::api(probe_router(state.clone())),
            ))
        });
        Listeners { close, api, probes }
    }

    /// Stops accepting connections; requests in flight get the grace
    /// period.
    fn close(&self) {
        self.close.send_replace(true);
    }

    /// Waits until both listeners have finished their last requests.
    async fn wait(&mut self) {
        let _ = (&mut self.api).await;
        if let Some(probes) = &mut self.probes {
            let _ = probes.await;
        }
    }
}

/// Resolves once the listeners are told to close.
async fn until_closed(mut closed: watch::Receiver<bool>) {
    let _ = closed.wait_for(|s| *s).await;
}

/// What opening the spool came to, when it did not fail.
enum Opened {
    /// The journal is replayed (and, in replicated mode, the replica runs).
    Spool {
        engine: Engine,
        report: ReplayReport,
        cluster: Option<Cluster>,
    },
    /// Raft cannot run on this replica until an operator repairs its stored
    /// vote; the reason says so.
    VoteNeedsRepair(String),
}

/// Opens the spool: replays the journal, and in replicated mode starts the
/// replica around it, which needs the cluster's secret first. Every failure
/// ends the start, but a vote that needs repair: that replica stays up to
/// say so ([`serve_blocked`]).
async fn open_spool(config: &Config, bound: &[(SocketAddr, &str)]) -> Result<Opened, ServeError> {
    let options = engine_options(config);
    for (addr, what) in bound {
        options
            .policy
            .guard
            .own
            .add(&addr.ip().to_string(), addr.port(), what);
    }
    let opened = match &config.cluster {
        None => Engine::open(options)
            .await
            .map(|(engine, report)| (engine, report, None)),
        Some(cluster) => {
            let secret = cluster
                .secret(std::env::var("SPOOLD_CLUSTER_SECRET").ok().as_deref())
                .map_err(ServeError::ClusterSecret)?;
            let max_body_bytes = config.server.max_body_bytes;
            match Cluster::open(options, cluster, &secret, max_body_bytes).await {
                Ok((replica, report, cluster)) => {
                    Ok((Engine::clone(&replica), report, Some(cluster)))
                }
                Err(ClusterError::Journal(error)) => Err(error),
                Err(e @ ClusterError::PoisonedVote { .. }) => {
                    return Ok(Opened::VoteNeedsRepair(e.to_string()));
                }
                Err(e) => return Err(e.into()),
            }
        }
    };
    let (engine, report, cluster) = opened.map_err(|error| ServeError::Open {
        dir: config.spool.dir.display().to_string(),
        error,
    })?;
    Ok(Opened::Spool {
        engine,
        report,
        cluster,
    })
}

/// The engine's options, all from the `[spool]` table but the server's
/// policy (allowed destinations).
fn engine_options(config: &Config) -> EngineOptions {
    let mut options = EngineOptions::new(&config.spool.dir);
    options.segment_bytes = config.spool.segment_bytes;
    options.fsync = config.spool.fsync;
    options.max_bytes = config.spool.max_bytes;
    options.max_memory = config.spool.max_memory.unwrap_or_else(default_max_memory);
    options.quarantine_corruption = config.spool.on_corruption == OnCorruption::Quarantine;
    options.policy = config.policy();
    options
}

/// `spool.max_memory` when the config leaves it unset: half the memory
/// limit of the process's cgroup (v2 `memory.max`, or v1's
/// `memory.limit_in_bytes`), so that a pod is refused sends with `507`
/// long before its container is killed; without a limit, half the
/// machine's memory. What the state holds is only part of the process
/// (request bodies, compaction and the allocator take the rest).
fn default_max_memory() -> u64 {
    let read = |path: &str| std::fs::read_to_string(path).ok();
    let cgroup = read("/sys/fs/cgroup/memory.max")
        .or_else(|| read("/sys/fs/cgroup/memory/memory.limit_in_bytes"))
        .and_then(|text| text.trim().parse::<u64>().ok())
        // cgroup v1 says "no limit" with a number near 2⁶³.
        .filter(|&bytes| bytes < 1 << 60);
    let machine = || {
        read("/proc/meminfo").and_then(|text| {
            let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
            let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
            Some(kib * 1024)
        })
    };
    cgroup.or_else(machine).map_or(u64::MAX, |bytes| bytes / 2)
}

/// A replica whose vote needs repair stays up and says why (the log, and
/// every API call is answered `503` with the reason) rather than restart in
/// a loop: its supervisor would only start it again. It stays so until
/// asked to stop.
async fn serve_blocked(
    reason: String,
    state: &AppState,
    stop: &mut watch::Receiver<bool>,
    listeners: Listeners,
) -> Outcome {
    tracing::error!("{reason}");
    state.block(reason);
    let _ = stop.wait_for(|s| *s).await;
    state.begin_shutdown();
    listeners.close();
    let _ = listeners.api.await;
    Outcome::Stopped
}

/// The log line of what replay found.
fn log_spool_open(config: &Config, report: &ReplayReport) {
    tracing::info!(
        dir = %config.spool.dir.display(),
        records = report.records,
        messages = report.messages,
        epoch = report.epoch,
        replay_ms = report.duration.as_millis() as u64,
        "spool open"
    );
}

/// The queues the running config wants; a reload sends its own.
type Wanted = watch::Sender<BTreeMap<String, QueueSettings>>;

/// Puts the config's queues in place at start. A single node does it before
/// it says ready, and a failure ends the start. Only a primary writes, so
/// each replica reconciles in a task of its own whenever it starts serving,
/// and again when a reload changes the queues ([`reconcile_when_serving`]).
async fn reconcile_at_start(
    config: &Config,
    engine: &Engine,
    replicated: bool,
    state: &Arc<AppState>,
) -> Result<(Wanted, Option<JoinHandle<()>>), QueueError> {
    let queues = config_queues(config);
    let (wanted, wanted_changes) = watch::channel(queues.clone());
    if !replicated {
        reconcile_config_queues(engine, &queues).await?;
        return Ok((wanted, None));
    }
    let reconciler = tokio::spawn(reconcile_when_serving(
        engine.clone(),
        wanted_changes,
        state.clone(),
    ));
    Ok((wanted, Some(reconciler)))
}

/// The tasks that run beside the API while the spool is open: expiry,
/// the rate counters, compaction and push delivery. Only delivery is
/// stopped by hand ([`stop_serving`]); the others end with the engine.
struct Background {
    _timer: JoinHandle<()>,
    /// spoold's own events (`engine/operational.rs`).
    _operational: Option<JoinHandle<()>>,
    _rates: JoinHandle<()>,
    _compactor: JoinHandle<()>,
    stop_delivery: watch::Sender<bool>,
    delivery: JoinHandle<()>,
}

impl Background {
    fn start(config: &Config, engine: &Engine) -> Background {
        let (stop_delivery, delivery_stop) = watch::channel(false);
        Background {
            _timer: engine.spawn_timer(),
            _operational: engine.spawn_operational(),
            _rates: engine.spawn_rates(),
            _compactor: engine
                .spawn_compactor(Duration::from_millis(config.spool.compaction_interval_ms)),
            stop_delivery,
            delivery: tokio::spawn(crate::delivery::run(
                engine.clone(),
                delivery_stop,
                crate::delivery::DeliveryOptions {
                    drain: config.server.drain_on_shutdown,
                    redact_headers: config.server.redacted_header_names(),
                    delivery: config.delivery.clone(),
                },
            )),
        }
    }
}

/// Serves until a stop request or a poisoned journal, applying each reload
/// meanwhile: `running` is the config the server runs, the base a reload
/// compares with to say what needs a restart.
async fn serve_until_stopped(
    mut running: Config,
    engine: &Engine,
    wanted: &Wanted,
    state: &AppState,
    stop: &mut watch::Receiver<bool>,
    reloads: &mut mpsc::Receiver<Reload>,
) -> Outcome {
    let mut poisoned = engine.poisoned();
    loop {
        // The watch guards are dropped at once: a reload below awaits.
        tokio::select! {
            _ = async { stop.wait_for(|s| *s).await.map(|_| ()) } => return Outcome::Stopped,
            _ = async { poisoned.wait_for(|p| *p).await.map(|_| ()) } => return Outcome::Poisoned,
            Some(request) = reloads.recv() => {
                let answer = reload(&running, &request, engine, wanted, state).await;
                if answer.is_ok() {
                    running = request.config.with_keys_hashed();
                }
                let _ = request.answer.send(answer);
            }
        }
    }
}

/// Stops taking work: probes say "not ready", the listeners close, and
/// push delivery stops. In-flight requests and deliveries get the grace
/// period; what is still in flight after it is dropped: its lease dies with
/// the process, so the message is redelivered after the restart without a
/// retry increment.
async fn stop_serving(
    outcome: Outcome,
    grace: Duration,
    state: &AppState,
    listeners: &Listeners,
    background: &mut Background,
) {
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
    listeners.close();
    background.stop_delivery.send_replace(true);
    if tokio::time::timeout(grace, &mut background.delivery)
        .await
        .is_err()
    {
        background.delivery.abort();
        tracing::warn!("deliveries still in flight after the grace period: released");
    }
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
    wanted: &Wanted,
    state: &AppState,
) -> Result<Reloaded, ReloadError> {
    let config = &request.config;
    let env_keys = request.env_api_keys.as_deref();
    config
        .check_exposure(env_keys)
        .map_err(ReloadError::Exposure)?;
    let changes = crate::config::reload_changes(running, config).map_err(ReloadError::Refused)?;
    let keys = config.api_keys(env_keys).map_err(ReloadError::Exposure)?;
    if keys.is_empty() && !state.api_keys().is_open() {
        return Err(ReloadError::LastKey);
    }
    let queues = config_queues(config);
    if engine.serving_changes().is_none() {
        // A single node reconciles here, so that an error is the answer.
        reconcile_config_queues(engine, &queues)
            .await
            .map_err(ReloadError::Queues)?;
    }
    let reloaded = Reloaded {
        api_keys: keys.len(),
        queues: queues.len(),
        restart_needed: restart_needed(running, config),
    };
    // Replicated mode: the primary reconciles (`reconcile_when_serving`).
    wanted.send_replace(queues);
    state.set_api_keys(&keys);
    for change in changes {
        tracing::info!(change = %change, "reload");
    }
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
    differs("delivery", running.delivery == new.delivery);
    differs("telemetry", running.telemetry == new.telemetry);
    differs("portal", running.portal == new.portal);
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
    state: Arc<AppState>,
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
