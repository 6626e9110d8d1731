//! Replicated mode (docs/contract.md §9): three or five replicas, each a
//! spoold with its own spool, agreeing through Raft (openraft, pinned in
//! `Cargo.toml`). The rest of spoold sees [`Cluster`]: open a replica,
//! learn who the primary is, serve `/v1/cluster`, and stop.
//!
//! - `types.rs`: openraft's type configuration (a record is an entry).
//! - `store.rs`: the journal as the Raft log, the spool as its state
//!   machine (the engine's side is `engine/replicated.rs`).
//! - `files.rs`: the replica's id, vote and commit pointer beside the
//!   journal.
//! - `auth.rs`: signed requests and answers between replicas.
//! - `server.rs`, `client.rs`, `stream.rs`: replication traffic on
//!   `cluster.listen` (optionally TLS: `src/tls.rs`).
//! - `members.rs`: adding and removing members.
//!
//! A follower's `/v1` calls are relayed to the primary by the API
//! (`api/relay.rs`), to the API URL the membership names.

pub(crate) mod auth;
pub(crate) mod client;
pub(crate) mod files;
pub(crate) mod members;
pub(crate) mod server;
pub(crate) mod store;
pub(crate) mod stream;
pub(crate) mod types;

use crate::tls;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use openraft::ServerState;
use openraft::async_runtime::WatchReceiver;
use openraft::async_runtime::instant::Instant as _;
use openraft::impls::ProgressResponder;
use openraft::vote::leader_id_std::CommittedLeaderId;
use tokio::sync::mpsc;

use crate::config::{ClusterConfig, ClusterTlsConfig};
use crate::engine::replicated::Proposal;
use crate::engine::{Engine, EngineOptions, ReplayReport};
use crate::journal::JournalError;
use files::RaftFiles;
pub use members::MembershipError;
use store::{LogStore, StateMachine};
use types::{Peer, RecordData, TypeConfig, seq_of};

/// Most connections the replication listener serves at once: a cluster
/// has a few peers, each with a few connections; more wait in the
/// kernel's backlog and cost nothing here.
const CONNECTIONS_MAX: usize = 256;
/// How long a connection to the replication listener may take to send
/// its headers (peers send theirs at once).
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(5);
/// What an append may carry beyond its bodies (`store.rs` reads about
/// 4 MiB of them per append, and never less than one record).
const APPEND_SLACK_BYTES: usize = 5 << 20;

pub(crate) type Raft = openraft::Raft<TypeConfig, StateMachine>;

/// Longest a proposal waits for Raft before its outcome is called
/// unknown (`500 operation_unconfirmed`).
const PROPOSAL_TIMEOUT: Duration = Duration::from_secs(10);

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
    Tls(String),
}

/// One replica of a cluster.
#[derive(Clone)]
pub struct Cluster {
    inner: Arc<Inner>,
}

/// A replica catching up by snapshot (`server.rs` keeps it up to date).
#[derive(Debug, Default)]
pub struct SnapshotProgress {
    receiving: AtomicBool,
    /// Of the snapshot arriving, or the last one.
    received_bytes: AtomicU64,
    installed: AtomicU64,
}

/// While one lives, a snapshot is arriving.
pub(crate) struct Receiving<'a>(&'a SnapshotProgress);

impl SnapshotProgress {
    pub(crate) fn start(&self) -> Receiving<'_> {
        self.received_bytes.store(0, Ordering::Relaxed);
        self.receiving.store(true, Ordering::Relaxed);
        Receiving(self)
    }
}

impl Drop for Receiving<'_> {
    fn drop(&mut self) {
        self.0.receiving.store(false, Ordering::Relaxed);
    }
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
    engine: Engine,
    /// A voter silent this long is not counted on (`members.rs`).
    silence: Duration,
    /// When this replica last became the primary: the age of a peer it
    /// never heard from.
    leading_since: Arc<Mutex<Option<std::time::Instant>>>,
    progress: Arc<SnapshotProgress>,
    tasks: Mutex<Vec<tokio::task::JoinHandle<()>>>,
}

/// Who the primary is, as this replica knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Primary {
    pub node_id: u64,
    /// `None` until this replica has heard from it.
    pub api_url: Option<String>,
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
    ) -> Result<(Engine, ReplayReport, Cluster), ClusterError> {
        options
            .storage
            .create_dir_all(&options.dir)
            .map_err(|e| JournalError::io(&options.dir, e))?;
        let incarnation = files::incarnation(&options.storage, &options.dir, config.node_id)?;
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
        let tls = config
            .tls
            .as_ref()
            .map(ClusterTlsConfig::load)
            .transpose()
            .map_err(ClusterError::Tls)?;
        options.replicated = Some(files.committed().map_or(0, |c| seq_of(c.index())));
        options.identity = Some(auth::cluster_identity(secret));
        let (engine, report) = Engine::open(options).await?;

        let election = config.election_timeout_ms;
        let raft_config = openraft::Config {
            cluster_name: "spoold".into(),
            heartbeat_interval: config.heartbeat_ms,
            election_timeout_min: election / 2,
            election_timeout_max: election,
            // Snapshots are checkpoints: the compactor asks for one when it
            // would free space (`engine/snapshot.rs`), never a count.
            snapshot_policy: openraft::SnapshotPolicy::Never,
            enable_pre_vote: Some(true),
            // A restarted primary starts a new term (and proposes its
            // barrier) rather than resuming the old one.
            enable_leader_restore: Some(false),
            ..Default::default()
        };
        let raft_config = Arc::new(
            raft_config
                .validate()
                .map_err(|e| ClusterError::Raft(e.to_string()))?,
        );
        let key = auth::ClusterKey::new(secret);
        let http = match &tls {
            Some(tls) => tls.client(),
            None => tls::plain_client(),
        };
        let network = client::Network::new(http, tls.is_some(), key.clone(), config.node_id);
        let log = LogStore::new(engine.raft_log(), Arc::new(files), vote);
        let raft = Raft::new(
            config.node_id,
            raft_config,
            network.clone(),
            log,
            StateMachine::new(engine.raft_log()),
        )
        .await
        .map_err(|e| ClusterError::Raft(e.to_string()))?;

        let listener = tokio::net::TcpListener::bind(&config.listen)
            .await
            .map_err(|e| ClusterError::Listen {
                addr: config.listen.clone(),
                reason: e.to_string(),
            })?;
        let progress = Arc::new(SnapshotProgress::default());
        let app = server::router(
            raft.clone(),
            engine.raft_log(),
            key,
            server::ServerConfig {
                node_id: config.node_id,
                incarnation,
                api_url: config.api_url.clone(),
                election_timeout: Duration::from_millis(election),
                append_bytes_max: APPEND_SLACK_BYTES
                    + usize::try_from(max_body_bytes).unwrap_or(usize::MAX / 2),
                progress: progress.clone(),
            },
        );
        let trigger = raft.clone();
        engine.set_snapshot_trigger(Box::new(move || {
            let raft = trigger.clone();
            tokio::spawn(async move {
                if let Err(e) = raft.trigger().snapshot().await {
                    tracing::warn!(error = %e, "could not ask for a snapshot");
                }
            });
        }));
        let limits = crate::listen::Limits {
            connections_max: CONNECTIONS_MAX,
            per_client_max: CONNECTIONS_MAX,
            open_max: 4 * CONNECTIONS_MAX,
            open_per_client_max: 4 * CONNECTIONS_MAX,
            header_read_timeout: HEADER_READ_TIMEOUT,
            tls: tls.as_ref().map(tls::ClusterTls::acceptor),
            probes: None,
        };
        let mut tasks = vec![tokio::spawn(crate::listen::serve(
            listener,
            app,
            std::future::pending(),
            Duration::ZERO,
            limits,
        ))];

        let (tx, rx) = mpsc::channel(crate::engine::replicated::PROPOSALS_QUEUED_MAX);
        engine.attach_proposer(tx);
        // The leader lease: openraft lets no follower vote for another
        // candidate until `election_timeout_min` after it last heard from
        // this leader, so within that time no other primary exists.
        let lease = Duration::from_millis(election / 2);
        let metrics = raft.metrics();
        engine.set_quorum_check(Box::new(move || {
            let m = metrics.borrow_watched();
            let alone = m.membership_config.membership().voter_ids().count() == 1;
            alone
                || m.last_quorum_acked
                    .as_ref()
                    .is_some_and(|at| at.elapsed() < lease)
        }));
        tasks.push(tokio::spawn(propose(raft.clone(), engine.clone(), rx)));
        let leading_since = Arc::new(Mutex::new(None));
        tasks.push(tokio::spawn(lead(
            raft.clone(),
            engine.clone(),
            config.node_id,
            leading_since.clone(),
        )));
        tasks.push(tokio::spawn(members::pin(
            raft.clone(),
            network.clone(),
            (config.node_id, incarnation, config.api_url.clone()),
        )));

        if !raft
            .is_initialized()
            .await
            .map_err(|e| ClusterError::Raft(e.to_string()))?
        {
            bootstrap(&raft, &network, config).await;
        }
        let cluster = Cluster {
            inner: Arc::new(Inner {
                raft,
                node_id: config.node_id,
                api_url: config.api_url.clone(),
                forward_to_primary: config.forward_to_primary,
                election_timeout: Duration::from_millis(election),
                network,
                engine: engine.clone(),
                // Two and a half heartbeats: a live replica answers every
                // heartbeat interval.
                silence: Duration::from_millis(config.heartbeat_ms * 5 / 2),
                leading_since,
                progress,
                tasks: Mutex::new(tasks),
            }),
        };
        Ok((engine, report, cluster))
    }

    pub fn node_id(&self) -> u64 {
        self.inner.node_id
    }

    /// The primary as this replica knows it: the leader Raft agreed on,
    /// and the API URL its membership names for it.
    pub fn primary(&self) -> Option<Primary> {
        let m = self.inner.raft.metrics();
        let m = m.borrow_watched();
        let leader = m.current_leader?;
        let api_url = if leader == self.inner.node_id {
            Some(self.inner.api_url.clone())
        } else {
            m.membership_config
                .membership()
                .get_node(&leader)
                .map(|peer| peer.api_url.clone())
                .filter(|url| !url.is_empty())
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

    /// `GET /v1/cluster`.
    pub fn status(&self) -> ClusterStatus {
        let m = self.inner.raft.metrics().borrow_watched().clone();
        let role = match m.state {
            ServerState::Leader => "primary",
            ServerState::Candidate => "candidate",
            ServerState::Learner => "learner",
            ServerState::Follower | ServerState::Shutdown => "follower",
        };
        let membership = m.membership_config.membership();
        let voters: Vec<u64> = membership.voter_ids().collect();
        let last_index = m.last_log_index.unwrap_or(0);
        let leading_since = *self
            .inner
            .leading_since
            .lock()
            .expect("bug: leading_since lock poisoned");
        let members = membership
            .nodes()
            .map(|(id, peer)| {
                let matched = match &m.replication {
                    Some(r) => r.get(id).and_then(|l| l.as_ref()).map(|l| l.index()),
                    None if *id == m.id => m.last_log_index,
                    None => None,
                };
                // Only the primary hears from every member; one it never
                // heard from is as silent as its time as primary.
                let last_contact = m.heartbeat.as_ref().and_then(|_| {
                    heard_ago(&m, *id).or_else(|| leading_since.map(|since| since.elapsed()))
                });
                MemberStatus {
                    node_id: *id,
                    addr: peer.raft_addr.clone(),
                    incarnation: (peer.incarnation != 0).then_some(peer.incarnation),
                    voter: voters.contains(id),
                    match_index: matched,
                    lag_records: matched.map(|i| last_index.saturating_sub(i)),
                    last_contact,
                }
            })
            .collect();
        ClusterStatus {
            node_id: self.inner.node_id,
            role,
            term: m.current_term,
            primary: self.primary(),
            commit_index: m.cluster_committed.map(|c| c.index()),
            applied_index: m.last_applied.map(|c| c.index()),
            snapshot_index: m.snapshot.map(|c| c.index()),
            purged_index: m.purged.map(|c| c.index()),
            members,
            snapshot_receiving: self.inner.progress.receiving.load(Ordering::Relaxed),
            snapshot_received_bytes: self.inner.progress.received_bytes.load(Ordering::Relaxed),
            snapshots_installed: self.inner.progress.installed.load(Ordering::Relaxed),
        }
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

/// `GET /v1/cluster`, as data.
#[derive(Debug, Clone)]
pub struct ClusterStatus {
    pub node_id: u64,
    /// Catching up by snapshot: whether one is arriving, its bytes so far,
    /// and how many were installed since start.
    pub snapshot_receiving: bool,
    pub snapshot_received_bytes: u64,
    pub snapshots_installed: u64,
    pub role: &'static str,
    pub term: u64,
    pub primary: Option<Primary>,
    pub commit_index: Option<u64>,
    /// The last entry this replica applied.
    pub applied_index: Option<u64>,
    /// The last entry of its newest snapshot (its checkpoint).
    pub snapshot_index: Option<u64>,
    /// The last entry its log no longer holds.
    pub purged_index: Option<u64>,
    pub members: Vec<MemberStatus>,
}

#[derive(Debug, Clone)]
pub struct MemberStatus {
    pub node_id: u64,
    pub addr: String,
    /// The incarnation of its spool directory the membership pins (none
    /// yet for a member of the bootstrap that has not answered a primary).
    pub incarnation: Option<u64>,
    pub voter: bool,
    pub match_index: Option<u64>,
    pub lag_records: Option<u64>,
    /// On the primary: how long ago the member last answered it.
    pub last_contact: Option<Duration>,
}

/// On the primary: how long ago member `id` last acknowledged it (`None`
/// if never since it became primary, or on any other replica).
pub(crate) fn heard_ago(m: &openraft::RaftMetrics<types::TypeConfig>, id: u64) -> Option<Duration> {
    m.heartbeat
        .as_ref()
        .and_then(|h| h.get(&id).cloned().flatten())
        .map(|at| at.elapsed())
}

/// The first start of a replica that belongs to no cluster yet. If a peer
/// already belongs to one, this replica waits to be reached by its primary
/// (a replica of a cluster being formed) or added (`spoold cluster add`):
/// bootstrapping would give it a log of its own. Otherwise it proposes the
/// config's peers as the first membership; every new replica proposes the
/// same one (no incarnations: the primary pins them later, `members.rs`),
/// and openraft accepts it once, on whichever replica starts first.
async fn bootstrap(raft: &Raft, network: &client::Network, config: &ClusterConfig) {
    let peers = config.peer_ids();
    if !peers.contains_key(&config.node_id) {
        tracing::info!(
            node_id = config.node_id,
            "this replica is not one of cluster.peers: waiting to be added \
             (`spoold cluster add` on any replica of the cluster)"
        );
        return;
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
        return;
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
}

/// Hands the engine's proposals to Raft in the order they were decided,
/// each bound to the term it was decided in, and answers each once Raft
/// has: applied (its waiter learns the outcome), refused before it was
/// appended (`503`), or unknown (`500 operation_unconfirmed`).
async fn propose(raft: Raft, engine: Engine, mut rx: mpsc::Receiver<Proposal>) {
    while let Some(p) = rx.recv().await {
        let proposed = std::time::Instant::now();
        let (responder, done) = ProgressResponder::complete_only();
        let submitted = raft
            .write(RecordData {
                kind: p.kind,
                body: p.body,
            })
            .with_leader(CommittedLeaderId::new(p.term))
            .responder(responder)
            .await;
        if let Err(fatal) = submitted {
            engine.fail_proposal(p.ticket, fatal.to_string(), false);
            continue;
        }
        let engine = engine.clone();
        let ticket = p.ticket;
        tokio::spawn(async move {
            match tokio::time::timeout(PROPOSAL_TIMEOUT, done).await {
                Ok(Ok(Ok(response))) => {
                    let seq = seq_of(response.log_id.index());
                    engine.finish_proposal(ticket, seq, response.data);
                    crate::metrics::record_commit(proposed.elapsed());
                }
                Ok(Ok(Err(openraft::error::ClientWriteError::ForwardToLeader(f)))) => {
                    engine.fail_proposal(ticket, format!("not the primary: {f}"), false);
                }
                Ok(Ok(Err(e))) => engine.fail_proposal(ticket, e.to_string(), true),
                Ok(Err(_)) => {
                    engine.fail_proposal(ticket, "raft dropped the proposal".into(), true)
                }
                Err(_) => {
                    engine.fail_proposal(ticket, "no answer from the replicas in time".into(), true)
                }
            }
        });
    }
}

/// Follows leadership: serve as the primary while this replica leads
/// (once its barrier is applied), stop at once when it does not.
async fn lead(
    raft: Raft,
    engine: Engine,
    node_id: u64,
    leading_since: Arc<Mutex<Option<std::time::Instant>>>,
) {
    let mut metrics = raft.metrics();
    let mut acting = 0;
    let mut leader = None;
    loop {
        let want = {
            let m = metrics.borrow_and_update();
            if m.current_leader != leader {
                if m.current_leader.is_some() {
                    crate::metrics::record_leader_change();
                }
                leader = m.current_leader;
            }
            match (m.state, m.current_leader) {
                (ServerState::Leader, Some(leader)) if leader == node_id => m.current_term,
                _ => 0,
            }
        };
        if want != acting {
            if acting != 0 {
                engine.stop_serving();
            }
            acting = want;
            *leading_since
                .lock()
                .expect("bug: leading_since lock poisoned") =
                (want != 0).then(std::time::Instant::now);
            if want != 0 {
                let engine = engine.clone();
                let metrics = raft.metrics();
                tokio::spawn(async move {
                    // The barrier can fail while leadership settles; try
                    // again as long as this replica still leads in `want`.
                    while let Err(e) = engine.start_serving(want).await {
                        let still = {
                            let m = metrics.borrow_watched();
                            m.state == ServerState::Leader && m.current_term == want
                        };
                        if !still {
                            return;
                        }
                        tracing::warn!(term = want, error = %e, "could not start serving; retrying");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                });
            }
        }
        if metrics.changed().await.is_err() {
            return;
        }
    }
}
