//! Membership changes (`spoold cluster add` / `remove`, docs/operations.md):
//! run on the primary, through openraft's joint consensus, after spoold's
//! own checks of what openraft would accept but an operator would regret.
//!
//! - **Add** asks the replica at the address who it is (`net.rs` hello:
//!   refused if it cannot be reached or is another node), adds it as a
//!   learner under its incarnation, waits until it holds everything that
//!   was committed when it was added (a snapshot, then the log), and only
//!   then makes it a voter: a member that cannot acknowledge yet never
//!   joins a quorum.
//! - **Remove** takes one member at a time and refuses when the voters
//!   left would not hold a majority of members that answer the primary.
//!   It first retires the id (a record of the spool's state, so every
//!   replica and every checkpoint knows it): an add of a retired id is
//!   refused, since a new member under an old id would replay old
//!   memberships in which it voted.
//! - **Pinning**: the members of a bootstrap are known by address only;
//!   the primary writes each one's incarnation and API URL into the
//!   membership once it answered (signed, `client.rs`), so that a replica
//!   whose directory is wiped later is refused (`server.rs`) until it is
//!   removed and added back, and so that followers relay to the API URL
//!   Raft agreed on (`api/relay.rs`). A member whose API URL changed (its
//!   config did) is pinned again.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use openraft::ChangeMembers;
use openraft::ServerState;
use openraft::async_runtime::WatchReceiver;
use openraft::error::{ChangeMembershipError, ClientWriteError, RaftError};

use super::client::Network;
use super::types::{Peer, TypeConfig};
use super::{Cluster, ClusterStatus, Raft};

/// How often an add checks whether the new member caught up.
const CATCH_UP_POLL: Duration = Duration::from_millis(100);
/// How often the primary looks for members to pin: soon after an
/// election, since followers relay only once the primary's API URL is in
/// the membership.
const PIN_EVERY: Duration = Duration::from_millis(250);

/// Why a membership change was refused, or how it failed.
#[derive(Debug, thiserror::Error)]
pub enum MembershipError {
    #[error("{0}")]
    BadRequest(String),
    /// Not the primary, or a change is already in progress: try again.
    #[error("{0}")]
    Unavailable(String),
    #[error("node {0} is already a member: remove it first")]
    AlreadyMember(u64),
    #[error(
        "node id {0} was a member once: a replica that comes back (after a lost disk, say) \
         needs an id the cluster never had"
    )]
    Retired(u64),
    #[error("node {0} is not a member")]
    NotMember(u64),
    #[error("node {id} at {addr} cannot be reached: {reason}")]
    Unreachable {
        id: u64,
        addr: String,
        reason: String,
    },
    #[error(
        "node {id} did not catch up within {seconds} s (it stays a learner: add it again to \
         wait longer, or remove it)"
    )]
    Behind { id: u64, seconds: u64 },
    #[error("{0}")]
    QuorumAtRisk(String),
    /// Proposed, and then leadership was lost: it may or may not apply.
    #[error("{0}")]
    Unconfirmed(String),
}

impl From<RaftError<TypeConfig, ClientWriteError<TypeConfig>>> for MembershipError {
    fn from(e: RaftError<TypeConfig, ClientWriteError<TypeConfig>>) -> MembershipError {
        match e {
            RaftError::APIError(ClientWriteError::ForwardToLeader(f)) => {
                MembershipError::Unavailable(format!("not the primary any more: {f}"))
            }
            RaftError::APIError(ClientWriteError::ChangeMembershipError(
                ChangeMembershipError::InProgress(p),
            )) => MembershipError::Unavailable(format!(
                "another membership change is in progress, try again: {p}"
            )),
            RaftError::APIError(ClientWriteError::ChangeMembershipError(
                ChangeMembershipError::UncommittedLeaderLog(p),
            )) => MembershipError::Unavailable(format!(
                "the primary was elected a moment ago, try again: {p}"
            )),
            RaftError::APIError(ClientWriteError::ChangeMembershipError(c)) => {
                MembershipError::QuorumAtRisk(c.to_string())
            }
            RaftError::APIError(e) => MembershipError::Unconfirmed(e.to_string()),
            RaftError::Fatal(f) => MembershipError::Unconfirmed(f.to_string()),
        }
    }
}

impl Cluster {
    /// Adds node `id`, reachable for replication at `addr`: a learner
    /// first, a voter once it caught up (within `catch_up`). Running it
    /// again for a learner it left behind resumes the wait.
    pub async fn add_member(
        &self,
        id: u64,
        addr: &str,
        catch_up: Duration,
    ) -> Result<ClusterStatus, MembershipError> {
        if id == 0 {
            return Err(MembershipError::BadRequest("node ids start at 1".into()));
        }
        if addr.trim().is_empty() || addr.contains('/') {
            return Err(MembershipError::BadRequest(format!(
                "addr must be the replica's cluster.advertise address as host:port, not {addr:?}"
            )));
        }
        let raft = &self.inner.raft;
        let known = {
            let m = raft.metrics().borrow_watched().clone();
            self.ensure_primary(&m)?;
            let membership = m.membership_config.membership();
            if membership.voter_ids().any(|v| v == id) {
                return Err(MembershipError::AlreadyMember(id));
            }
            if self.inner.engine.node_retired(id) {
                return Err(MembershipError::Retired(id));
            }
            membership.get_node(&id).cloned()
        };
        let peer = self.greet(id, addr).await?;
        match known {
            Some(learner) if learner == peer => {
                tracing::info!(
                    id,
                    addr,
                    "node is a learner already; waiting for it to catch up"
                );
            }
            Some(_) => return Err(MembershipError::AlreadyMember(id)),
            None => {
                raft.add_learner(id, peer, false).await?;
                tracing::info!(id, addr, "added a learner; waiting for it to catch up");
            }
        }
        self.wait_caught_up(id, catch_up).await?;
        raft.change_membership(ChangeMembers::AddVoterIds(BTreeSet::from([id])), false)
            .await?;
        tracing::info!(id, addr, "node is a voter now");
        Ok(self.status())
    }

    /// Asks the replica at `addr` who it is: it must answer as node `id`.
    /// Its answer is the peer to record, with its incarnation and API URL.
    async fn greet(&self, id: u64, addr: &str) -> Result<Peer, MembershipError> {
        let unreachable = |reason: String| MembershipError::Unreachable {
            id,
            addr: addr.to_owned(),
            reason,
        };
        let hello = self
            .inner
            .network
            .hello(id, addr)
            .await
            .map_err(|e| unreachable(e.to_string()))?;
        if hello.node_id != id {
            return Err(unreachable(format!(
                "the replica there is node {}",
                hello.node_id
            )));
        }
        Ok(Peer {
            raft_addr: addr.to_owned(),
            incarnation: hello.incarnation,
            api_url: hello.api_url,
        })
    }

    /// Waits until learner `id` holds everything committed when the wait
    /// began: it may not vote before. Gives up after `catch_up`, or as soon
    /// as this node is no longer the primary.
    async fn wait_caught_up(&self, id: u64, catch_up: Duration) -> Result<(), MembershipError> {
        let raft = &self.inner.raft;
        let target = raft
            .metrics()
            .borrow_watched()
            .cluster_committed
            .map_or(0, |c| c.index());
        let started = std::time::Instant::now();
        loop {
            let matched = {
                let m = raft.metrics().borrow_watched().clone();
                self.ensure_primary(&m)?;
                m.replication
                    .as_ref()
                    .and_then(|r| r.get(&id).cloned().flatten())
                    .map(|l| l.index())
            };
            if matched.is_some_and(|i| i >= target) {
                return Ok(());
            }
            if started.elapsed() >= catch_up {
                return Err(MembershipError::Behind {
                    id,
                    seconds: catch_up.as_secs(),
                });
            }
            tokio::time::sleep(CATCH_UP_POLL).await;
        }
    }

    /// Removes node `id`: a learner at once; a voter only if the voters
    /// left hold a majority that answers the primary.
    pub async fn remove_member(&self, id: u64) -> Result<ClusterStatus, MembershipError> {
        let raft = &self.inner.raft;
        let change = {
            let m = raft.metrics().borrow_watched().clone();
            self.ensure_primary(&m)?;
            if m.membership_config.log_id() != m.committed_membership_config.log_id()
                || m.membership_config.membership().get_joint_config().len() > 1
            {
                return Err(MembershipError::Unavailable(
                    "another membership change is in progress, try again".into(),
                ));
            }
            let membership = m.membership_config.membership();
            if membership.get_node(&id).is_none() {
                return Err(MembershipError::NotMember(id));
            }
            let voters: BTreeSet<u64> = membership.voter_ids().collect();
            if !voters.contains(&id) {
                ChangeMembers::RemoveNodes(BTreeSet::from([id]))
            } else {
                let left: BTreeSet<u64> = voters.iter().copied().filter(|v| *v != id).collect();
                if left.is_empty() {
                    return Err(MembershipError::QuorumAtRisk(format!(
                        "node {id} is the last voter"
                    )));
                }
                let silent: Vec<u64> = left
                    .iter()
                    .copied()
                    .filter(|v| !self.answers(&m, *v))
                    .collect();
                let need = left.len() / 2 + 1;
                if left.len() - silent.len() < need {
                    return Err(MembershipError::QuorumAtRisk(format!(
                        "removing node {id} would leave {} voters of which {} answer the \
                         primary (nodes {silent:?} do not), fewer than the {need} a quorum \
                         needs: bring them back, or remove a node that is down",
                        left.len(),
                        left.len() - silent.len()
                    )));
                }
                ChangeMembers::RemoveVoters(BTreeSet::from([id]))
            }
        };
        // Retired first: if the removal then fails, the id is only barred
        // from coming back, which it is anyway.
        self.inner
            .engine
            .retire_node(id)
            .await
            .map_err(|e| match e {
                crate::engine::WriteError::Unavailable { .. }
                | crate::engine::WriteError::NotPrimary { .. }
                | crate::engine::WriteError::TooLarge(_)
                | crate::engine::WriteError::MemoryFull { .. } => {
                    MembershipError::Unavailable(e.to_string())
                }
                crate::engine::WriteError::Unconfirmed { .. }
                | crate::engine::WriteError::LeadershipLost { .. } => {
                    MembershipError::Unconfirmed(e.to_string())
                }
            })?;
        raft.change_membership(change, false).await?;
        tracing::info!(id, "removed a member");
        Ok(self.status())
    }

    fn ensure_primary(&self, m: &openraft::RaftMetrics<TypeConfig>) -> Result<(), MembershipError> {
        if m.state == ServerState::Leader && m.current_leader == Some(self.inner.node_id) {
            Ok(())
        } else {
            Err(MembershipError::Unavailable(
                "this replica is not the primary".into(),
            ))
        }
    }

    /// Whether voter `id` answered the primary within two and a half
    /// heartbeats (`Inner::silence`).
    fn answers(&self, m: &openraft::RaftMetrics<TypeConfig>, id: u64) -> bool {
        id == self.inner.node_id
            || super::status::heard_ago(m, id).is_some_and(|ago| ago < self.inner.silence)
    }
}

/// On every replica: keeps the network's view of the pinned incarnations
/// up to date with the membership. On the primary: writes into the
/// membership the incarnation and API URL of every member not pinned yet
/// (or whose API URL changed under the same incarnation), once it
/// answered, and its own.
pub(super) async fn pin(raft: Raft, network: Network, me: (u64, u64, String)) {
    let (node_id, incarnation, api_url) = me;
    loop {
        tokio::time::sleep(PIN_EVERY).await;
        let nodes = {
            let m = raft.metrics().borrow_watched().clone();
            network.set_pinned(
                m.membership_config
                    .membership()
                    .nodes()
                    .filter(|(_, peer)| peer.incarnation != 0)
                    .map(|(id, peer)| (*id, peer.incarnation))
                    .collect(),
            );
            let settled = m.membership_config.log_id() == m.committed_membership_config.log_id();
            if m.state != ServerState::Leader || !settled {
                continue;
            }
            let pinned: BTreeMap<u64, Peer> = m
                .membership_config
                .membership()
                .nodes()
                .filter_map(|(id, peer)| {
                    let (learned_incarnation, learned_url) = if *id == node_id {
                        (incarnation, api_url.clone())
                    } else {
                        let l = network.learned(*id)?;
                        (l.incarnation, l.api_url)
                    };
                    // A pinned incarnation is never replaced: a new one is
                    // a wiped replica, which must be removed and added.
                    let same = peer.incarnation == 0 || peer.incarnation == learned_incarnation;
                    let stale = peer.incarnation == 0 || peer.api_url != learned_url;
                    (same && stale && !learned_url.is_empty()).then(|| {
                        let peer = Peer {
                            raft_addr: peer.raft_addr.clone(),
                            incarnation: learned_incarnation,
                            api_url: learned_url,
                        };
                        (*id, peer)
                    })
                })
                .collect();
            pinned
        };
        if nodes.is_empty() {
            continue;
        }
        let ids: Vec<u64> = nodes.keys().copied().collect();
        let pinned: BTreeMap<u64, u64> = nodes.iter().map(|(id, p)| (*id, p.incarnation)).collect();
        match raft
            .change_membership(ChangeMembers::SetNodes(nodes), true)
            .await
        {
            Ok(_) => {
                let mut all = network.pinned();
                all.extend(pinned);
                network.set_pinned(all);
                tracing::info!(nodes = ?ids, "pinned the incarnations and API URLs of members");
            }
            Err(e) => tracing::debug!(error = %e, "could not pin members yet"),
        }
    }
}
