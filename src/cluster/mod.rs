//! Replicated mode (docs/contract.md §9): three or five replicas, each a
//! spoold with its own spool, agreeing through Raft (openraft, pinned in
//! `Cargo.toml`). The rest of spoold sees [`Cluster`]: open a replica,
//! learn who the primary is, serve `/v1/cluster`, and stop.
//!
//! - `types.rs`: openraft's type configuration (a record is an entry).
//! - `store.rs`: the journal as the Raft log, the spool as its state
//!   machine (the engine's side is `engine/replicated/`).
//! - `files.rs`: the replica's id, vote and commit pointer beside the
//!   journal.
//! - `auth.rs`: signed requests and answers between replicas.
//! - `server.rs`, `client.rs`, `stream.rs`: replication traffic on
//!   `cluster.listen` (optionally TLS: `src/tls.rs`); `listener.rs` binds
//!   that address and serves it within its bounds.
//! - `members.rs`: adding and removing members.
//! - `tasks.rs`: what runs beside Raft: the proposer, following
//!   leadership, and the engine's hooks into Raft.
//! - `status.rs`: what `GET /v1/cluster` says.
//!
//! This file opens a replica, one step after another ([`Cluster::open`]),
//! answers who the primary is, and stops it.
//!
//! A follower's `/v1` calls are relayed to the primary by the API
//! (`api/relay.rs`), to the API URL the membership names.

pub(crate) mod auth;
pub(crate) mod client;
pub(crate) mod files;
pub(crate) mod level;
mod listener;
pub(crate) mod members;
pub(crate) mod server;
mod status;
pub(crate) mod store;
pub(crate) mod stream;
mod tasks;
pub(crate) mod types;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use openraft::async_runtime::WatchReceiver;

use crate::config::{ClusterConfig, ClusterTlsConfig};
use crate::engine::{EngineOptions, ReplayReport, Replica};
use crate::journal::JournalError;
use crate::tls::{self, ClusterTls};
use auth::ClusterKey;
use files::RaftFiles;
pub use members::MembershipError;
pub use status::{ClockSkew, ClusterStatus, MemberStatus, PeerClocks, SnapshotProgress};
use store::{LogStore, StateMachine};
use types::{Peer, TypeConfig, Vote, seq_of};

pub(crate) type Raft = openraft::Raft<TypeConfig, StateMachine>;

/// Why a replica could not start.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error(transparent)]
    Journal(#[from] JournalError),
    #[error(transparent)]
    Directory(#[from] files::IdError),
    #[error("cannot listen for replication on {addr}: {reason}")]
    Listen { addr: String, reason: String },
    #[error("raft: {0}")]
    Raft(String),
    #[error(
        "{path} holds a vote for term {term}, which no election reaches (a forged vote, \
         stored by an earlier build): Raft cannot run on it. Repair: stop this replica and run \
         `spoold cluster repair-vote --dir {dir} --term T` with T above every term the \
         cluster used (the `term` of `spoold cluster status` on a healthy replica; if every \
         replica is affected, the highest last log term of them plus 1000), then start it"
    )]
    PoisonedVote {
        path: String,
        dir: String,
        term: u64,
    },
    #[error("{0}")]
    Tls(tls::TlsError),
}

/// One replica of a cluster.
#[derive(Clone)]
pub struct Cluster {
    inner: Arc<Inner>,
}

struct Inner {
    raft: Raft,
    node_id: u64,
    api_url: String,
    forward_to_primary: bool,
    /// The longest election timeout: how long a relayed call may wait for
    /// a primary that stopped answering (`api/relay.rs`).
    election_timeout: Duration,
    network: client::Network,
    /// The replica's engine: retired node ids are part of its state.
    engine: Replica,
    /// A voter silent this long is not counted on (`members.rs`).
    silence: Duration,
    /// When this replica last became the primary: the age of a peer it
    /// never heard from.
    leading_since: Arc<Mutex<Option<std::time::Instant>>>,
    progress: Arc<SnapshotProgress>,
    /// Clock skew with peers, as refusals found it.
    clocks: Arc<status::PeerClocks>,
    tasks: Mutex<Vec<tokio::task::JoinHandle<()>>>,
}

/// Who the primary is, as this replica knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Primary {
    pub node_id: u64,
    /// Where its API listens, as the membership names it.
    pub api_url: String,
}

impl Cluster {
    /// Opens this replica's spool (replaying only what is known
    /// committed), starts Raft and the replication listener, and
    /// bootstraps the cluster if this replica has never been part of one.
    /// `max_body_bytes`: the largest body the API takes (an append
    /// carries at least one record).
    pub async fn open(
        mut options: EngineOptions,
        config: &ClusterConfig,
        secret: &str,
        max_body_bytes: u64,
    ) -> Result<(Replica, ReplayReport, Cluster), ClusterError> {
        let local = LocalFiles::open(&options, config.node_id)?;
        let tls = load_tls(config)?;
        let committed = local.files.committed().map_or(0, |c| seq_of(c.index()));
        options.identity = Some(auth::cluster_identity(secret));
        let (engine, report) = Replica::open(options, committed).await?;

        let key = ClusterKey::new(secret);
        let network = network(tls.as_ref(), key.clone(), config.node_id);
        let raft = start_raft(config, &engine, &network, local.files, local.vote).await?;

        let socket = listener::bind(&config.listen).await?;
        let progress = Arc::new(SnapshotProgress::default());
        let clocks = network.clocks();
        let app = listener::router(
            &raft,
            &engine,
            key.clone(),
            config,
            local.incarnation,
            max_body_bytes,
            (progress.clone(), clocks.clone()),
        );
        engine.set_snapshot_trigger(tasks::snapshot_trigger(raft.clone()));
        let mut running = vec![listener::serve(socket, app, tls.as_ref(), key)];
        let leading_since = Arc::new(Mutex::new(None));
        running.extend(tasks::start(
            &raft,
            &engine,
            &network,
            config,
            local.incarnation,
            &leading_since,
        ));
        bootstrap(&raft, &network, config).await?;
        let cluster = Cluster {
            inner: Arc::new(Inner {
                raft,
                node_id: config.node_id,
                api_url: config.api_url.clone(),
                forward_to_primary: config.forward_to_primary,
                election_timeout: Duration::from_millis(config.election_timeout_ms),
                network,
                engine: engine.clone(),
                // Two and a half heartbeats: a live replica answers every
                // heartbeat interval.
                silence: Duration::from_millis(config.heartbeat_ms * 5 / 2),
                leading_since,
                progress,
                clocks,
                tasks: Mutex::new(running),
            }),
        };
        Ok((engine, report, cluster))
    }

    pub fn node_id(&self) -> u64 {
        self.inner.node_id
    }

    /// The primary as this replica knows it: the leader Raft agreed on,
    /// and the API URL its membership names for it. `None` while the
    /// membership names no URL for the leader (a new cluster's, until the
    /// primary pins its members): a primary that cannot be reached is
    /// none, for the relay and for `GET /v1/cluster` alike.
    pub fn primary(&self) -> Option<Primary> {
        let m = self.inner.raft.metrics();
        let m = m.borrow_watched();
        let leader = m.current_leader?;
        let api_url = if leader == self.inner.node_id {
            self.inner.api_url.clone()
        } else {
            m.membership_config
                .membership()
                .get_node(&leader)
                .map(|peer| peer.api_url.clone())
                .filter(|url| !url.is_empty())?
        };
        Some(Primary {
            node_id: leader,
            api_url,
        })
    }

    /// Resolves once this replica's view of the primary is no longer
    /// `primary` (another leader, or none known).
    pub(crate) async fn primary_changed(&self, primary: Option<u64>) {
        let mut metrics = self.inner.raft.metrics();
        while metrics.borrow_watched().current_leader == primary {
            if metrics.changed().await.is_err() {
                return std::future::pending().await;
            }
        }
    }

    pub(crate) fn forward_to_primary(&self) -> bool {
        self.inner.forward_to_primary
    }

    /// The longest election timeout (`cluster.election_timeout`).
    pub(crate) fn election_timeout(&self) -> Duration {
        self.inner.election_timeout
    }

    /// Stops Raft and the replication listener.
    pub async fn shutdown(&self) {
        let _ = self.inner.raft.shutdown().await;
        for task in self
            .inner
            .tasks
            .lock()
            .expect("bug: task lock poisoned")
            .drain(..)
        {
            task.abort();
        }
    }
}

/// This replica's own files beside the journal, read before its spool
/// opens.
struct LocalFiles {
    /// Of the spool directory (`files.rs`).
    incarnation: u64,
    files: RaftFiles,
    /// The vote the files hold (none on a new replica).
    vote: Option<Vote>,
}

impl LocalFiles {
    /// Creates the spool directory if need be and reads the files in it.
    /// Refuses a directory that belongs to another node id, and a vote no
    /// election reaches: Raft cannot run on it, and the error says how to
    /// repair it.
    fn open(options: &EngineOptions, node_id: u64) -> Result<LocalFiles, ClusterError> {
        options
            .storage
            .create_dir_all(&options.dir)
            .map_err(|e| JournalError::io(&options.dir, e))?;
        let incarnation = files::incarnation(&options.storage, &options.dir, node_id)?;
        let (files, vote) = RaftFiles::open(options.storage.clone(), &options.dir)?;
        if let Some(vote) = &vote
            && vote.leader_id().term >= server::TERM_CEILING
        {
            return Err(ClusterError::PoisonedVote {
                path: options.dir.join("raft.vote").display().to_string(),
                dir: options.dir.display().to_string(),
                term: vote.leader_id().term,
            });
        }
        Ok(LocalFiles {
            incarnation,
            files,
            vote,
        })
    }
}

/// The cluster port's TLS, when the config has it. Loaded before the
/// spool opens, so that a bad file fails the start before replay.
fn load_tls(config: &ClusterConfig) -> Result<Option<ClusterTls>, ClusterError> {
    config
        .tls
        .as_ref()
        .map(ClusterTlsConfig::load)
        .transpose()
        .map_err(ClusterError::Tls)
}

/// openraft's settings, from the `[cluster]` table.
fn raft_config(config: &ClusterConfig) -> Result<Arc<openraft::Config>, ClusterError> {
    let election = config.election_timeout_ms;
    let raft_config = openraft::Config {
        cluster_name: "spoold".into(),
        heartbeat_interval: config.heartbeat_ms,
        election_timeout_min: election / 2,
        election_timeout_max: election,
        // Snapshots are checkpoints: the compactor asks for one when it
        // would free space (`engine/replicated/snapshot/build.rs`), never
        // a count.
        snapshot_policy: openraft::SnapshotPolicy::Never,
        enable_pre_vote: Some(true),
        // A restarted primary starts a new term (and proposes its
        // barrier) rather than resuming the old one.
        enable_leader_restore: Some(false),
        ..Default::default()
    };
    let raft_config = raft_config
        .validate()
        .map_err(|e| ClusterError::Raft(e.to_string()))?;
    Ok(Arc::new(raft_config))
}

/// Starts Raft on the engine's log and state machine, with the Raft files
/// read at open.
async fn start_raft(
    config: &ClusterConfig,
    engine: &Replica,
    network: &client::Network,
    files: RaftFiles,
    vote: Option<Vote>,
) -> Result<Raft, ClusterError> {
    let raft_config = raft_config(config)?;
    let log = LogStore::new(engine.raft_log(), Arc::new(files), vote);
    Raft::new(
        config.node_id,
        raft_config,
        network.clone(),
        log,
        StateMachine::new(engine.raft_log()),
    )
    .await
    .map_err(|e| ClusterError::Raft(e.to_string()))
}

/// The replication client: requests signed with `key`, over the cluster's
/// TLS when it has it, plain HTTP/1 otherwise.
fn network(tls: Option<&ClusterTls>, key: ClusterKey, node_id: u64) -> client::Network {
    let http = match tls {
        Some(tls) => tls.client(),
        None => tls::plain_client(),
    };
    client::Network::new(http, tls.is_some(), key, node_id)
}

/// The first start of a replica that belongs to no cluster yet. If a peer
/// already belongs to one, this replica waits to be reached by its primary
/// (a replica of a cluster being formed) or added (`spoold cluster add`):
/// bootstrapping would give it a log of its own. Otherwise it proposes the
/// config's peers as the first membership; every new replica proposes the
/// same one (no incarnations: the primary pins them later, `members.rs`),
/// and openraft accepts it once, on whichever replica starts first. A
/// replica that belongs to a cluster already has nothing to do.
async fn bootstrap(
    raft: &Raft,
    network: &client::Network,
    config: &ClusterConfig,
) -> Result<(), ClusterError> {
    if raft
        .is_initialized()
        .await
        .map_err(|e| ClusterError::Raft(e.to_string()))?
    {
        return Ok(());
    }
    let peers = config.peer_ids();
    if !peers.contains_key(&config.node_id) {
        tracing::info!(
            node_id = config.node_id,
            "this replica is not one of cluster.peers: waiting to be added \
             (`spoold cluster add` on any replica of the cluster)"
        );
        return Ok(());
    }
    let asked = peers
        .iter()
        .filter(|(id, _)| **id != config.node_id)
        .map(|(id, addr)| network.hello(*id, addr));
    let answers = futures_util::future::join_all(asked).await;
    if answers.iter().flatten().any(|hello| hello.initialized) {
        tracing::info!(
            "a peer already belongs to a cluster: waiting for its primary to reach this replica \
             (or to be added with `spoold cluster add`)"
        );
        return Ok(());
    }
    let members: BTreeMap<u64, Peer> = peers
        .into_iter()
        .map(|(id, raft_addr)| {
            (
                id,
                Peer {
                    raft_addr,
                    ..Peer::default()
                },
            )
        })
        .collect();
    match raft.initialize(members).await {
        Ok(()) => tracing::info!("bootstrapped a new cluster"),
        Err(e) => tracing::info!(reason = %e, "joined an existing cluster"),
    }
    Ok(())
}
