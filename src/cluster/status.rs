//! What a replica says of itself and its cluster (`GET /v1/cluster`, and
//! the cluster's figures in the scrape): its role, the primary, each
//! member's progress as the primary sees it, and how far catching up by
//! snapshot got.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use openraft::ServerState;
use openraft::async_runtime::WatchReceiver;
use openraft::async_runtime::instant::Instant as _;

use super::types::TypeConfig;
use super::{Cluster, Primary};

/// How long a clock skew that refusals found is told of.
const SKEW_SHOWN_FOR: Duration = Duration::from_secs(10);

/// The last clock skew between this replica and a peer, as refusals found
/// it: a request refused here for its time (`server.rs`), or an answer of
/// a peer that refused one of ours for it (`client.rs`).
#[derive(Debug, Default)]
pub struct PeerClocks(std::sync::Mutex<Option<(u64, u64, std::time::Instant)>>);

/// A clock skew with a peer: which, and by how much.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClockSkew {
    pub node_id: u64,
    pub skew_ms: u64,
}

impl PeerClocks {
    pub(crate) fn skewed(&self, node_id: u64, skew_ms: u64) {
        *self.0.lock().expect("bug: clock skew lock poisoned") =
            Some((node_id, skew_ms, std::time::Instant::now()));
    }

    /// The skew found within the last [`SKEW_SHOWN_FOR`].
    pub fn recent(&self) -> Option<ClockSkew> {
        let last = *self.0.lock().expect("bug: clock skew lock poisoned");
        last.filter(|(_, _, at)| at.elapsed() < SKEW_SHOWN_FOR)
            .map(|(node_id, skew_ms, _)| ClockSkew { node_id, skew_ms })
    }
}

/// A replica catching up by snapshot (`server.rs` keeps it up to date).
#[derive(Debug, Default)]
pub struct SnapshotProgress {
    receiving: AtomicBool,
    /// Of the snapshot arriving, or the last one.
    pub(super) received_bytes: AtomicU64,
    pub(super) installed: AtomicU64,
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

impl Cluster {
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
            clock_step_ms: self.inner.engine.clock_step_ms(),
            clock_skew: self.inner.clocks.recent(),
        }
    }

    /// The last clock skew with a peer that refusals found, lately.
    pub fn clock_skew(&self) -> Option<ClockSkew> {
        self.inner.clocks.recent()
    }

    /// Why this replica serves no call now (it knows no primary, or is an
    /// elected one that does not serve yet): said by `/readyz` and by the
    /// calls it refuses.
    pub fn why_no_primary(&self) -> String {
        match self.inner.clocks.recent() {
            Some(skew) => format!(
                "no primary is known: replication between this replica and node {} is refused \
                 for clock skew ({} ms, more than the {} s window); set the replicas' clocks \
                 right (NTP)",
                skew.node_id,
                skew.skew_ms,
                super::auth::REPLAY_WINDOW.as_secs()
            ),
            None => "no primary is known yet (an election is under way)".to_owned(),
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
    /// How far the host's wall clock stepped from this replica's steady
    /// clock (`src/time.rs`); 0 when they agree.
    pub clock_step_ms: i64,
    /// The last clock skew with a peer that refusals found, lately.
    pub clock_skew: Option<ClockSkew>,
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
pub(crate) fn heard_ago(m: &openraft::RaftMetrics<TypeConfig>, id: u64) -> Option<Duration> {
    m.heartbeat
        .as_ref()
        .and_then(|h| h.get(&id).cloned().flatten())
        .map(|at| at.elapsed())
}
