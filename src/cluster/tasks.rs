//! What ties the engine to Raft once both are open, for as long as the
//! replica runs: the proposer (the engine's records into Raft, in the
//! order they were decided), the leadership task (serving while this
//! replica leads), pinning members, and the two hooks the engine calls
//! back through (the leader lease and the snapshot trigger).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use openraft::ServerState;
use openraft::async_runtime::WatchReceiver;
use openraft::async_runtime::instant::Instant as _;
use openraft::impls::ProgressResponder;
use openraft::vote::leader_id_std::CommittedLeaderId;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::Raft;
use super::client::Network;
use super::members;
use super::types::{RecordData, seq_of};
use crate::config::ClusterConfig;
use crate::engine::Replica;
use crate::engine::replicated::Proposal;

/// Longest a proposal waits for Raft before its outcome is called
/// unknown (`500 operation_unconfirmed`).
const PROPOSAL_TIMEOUT: Duration = Duration::from_secs(10);

/// How the compactor asks openraft for a snapshot (openraft then calls
/// the builder); asking never blocks the compactor.
pub(super) fn snapshot_trigger(raft: Raft) -> Box<dyn Fn() + Send + Sync> {
    Box::new(move || {
        let raft = raft.clone();
        tokio::spawn(async move {
            if let Err(e) = raft.trigger().snapshot().await {
                tracing::warn!(error = %e, "could not ask for a snapshot");
            }
        });
    })
}

/// Hands the engine its proposer and its leader lease, and starts the
/// proposer, the leadership task and the pinning of members. The
/// handles are the replica's to abort at shutdown.
pub(super) fn start(
    raft: &Raft,
    engine: &Replica,
    network: &Network,
    config: &ClusterConfig,
    incarnation: u64,
    leading_since: &Arc<Mutex<Option<std::time::Instant>>>,
) -> Vec<JoinHandle<()>> {
    let (tx, rx) = mpsc::channel(crate::engine::replicated::PROPOSALS_QUEUED_MAX);
    engine.attach_proposer(tx);
    engine.set_quorum_check(leader_lease(raft, config.election_timeout_ms));
    vec![
        tokio::spawn(propose(raft.clone(), engine.clone(), rx)),
        tokio::spawn(lead(
            raft.clone(),
            engine.clone(),
            config.node_id,
            leading_since.clone(),
        )),
        tokio::spawn(members::pin(
            raft.clone(),
            network.clone(),
            (config.node_id, incarnation, config.api_url.clone()),
        )),
        tokio::spawn(own_members(raft.clone(), engine.clone())),
    ]
}

/// Keeps every member's API URL and cluster address among what a push
/// destination may never be (`engine/guard.rs`): a delivery to a peer's
/// API is relayed back to the primary, a loop like one to this node's.
async fn own_members(raft: Raft, engine: Replica) {
    let mut metrics = raft.metrics();
    let mut known = None;
    loop {
        let membership = metrics.borrow_watched().membership_config.clone();
        if known.as_ref() != Some(&membership) {
            let own = &engine.guard().own;
            own.remove_prefixed("member ");
            for (id, peer) in membership.membership().nodes() {
                own.add_url(&peer.api_url, &format!("member {id}'s API"));
                own.add_addr(&peer.raft_addr, &format!("member {id}'s cluster port"));
            }
            known = Some(membership);
        }
        if metrics.changed().await.is_err() {
            return;
        }
    }
}

/// The leader lease: openraft lets no follower vote for another
/// candidate until `election_timeout_min` (half the longest election
/// timeout) after it last heard from this leader, so within that time no
/// other primary exists. A replica alone in the membership needs no one.
fn leader_lease(raft: &Raft, election_timeout_ms: u64) -> Box<dyn Fn() -> bool + Send + Sync> {
    let lease = Duration::from_millis(election_timeout_ms / 2);
    let metrics = raft.metrics();
    Box::new(move || {
        let m = metrics.borrow_watched();
        let alone = m.membership_config.membership().voter_ids().count() == 1;
        alone
            || m.last_quorum_acked
                .as_ref()
                .is_some_and(|at| at.elapsed() < lease)
    })
}

/// Hands the engine's proposals to Raft in the order they were decided,
/// each bound to the term it was decided in, and answers each once Raft
/// has: applied (its waiter learns the outcome), refused before it was
/// appended (`503`), or unknown (`500 operation_unconfirmed`).
async fn propose(raft: Raft, engine: Replica, mut rx: mpsc::Receiver<Proposal>) {
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
    engine: Replica,
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
