//! The replication listener's setup: bound on `cluster.listen` when the
//! replica opens (an address it cannot take fails the start), routed by
//! `server.rs`, and served by the API's accept loop (`src/listen.rs`)
//! with the bounds of a port that only peers use.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use super::auth::ClusterKey;
use super::server::RefusalLog;
use super::server::{self, ServerConfig};
use super::status::{PeerClocks, SnapshotProgress};
use super::{ClusterError, Raft};
use crate::config::ClusterConfig;
use crate::engine::Replica;
use crate::tls::ClusterTls;

/// Most connections the replication listener serves at once: a cluster
/// has a few peers, each with a few connections; more wait in the
/// kernel's backlog and cost nothing here.
const CONNECTIONS_MAX: usize = 256;
/// Of those, from one peer (told by its signed sender id, not its
/// address): a peer whose link flaps leaves connections behind that hold
/// a slot until their body's timeout, and must not take the others'.
const PER_PEER_MAX: usize = 64;
/// How long a connection to the replication listener may take to send
/// its headers (peers send theirs at once).
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(5);
/// From a connection's first byte to its first request's whole head:
/// before it, it holds no slot, and past the open cap it is the first to
/// go (`src/listen.rs`).
const FIRST_REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
/// Longest a peer's connection waits for a slot: its request has timed
/// out at the sender long before (a heartbeat interval, `client.rs`).
const SLOT_WAIT_MAX: Duration = Duration::from_secs(2);
/// What an append may carry beyond its bodies (`store.rs` reads about
/// 4 MiB of them per append, and never less than one record).
const APPEND_SLACK_BYTES: usize = 5 << 20;

/// Takes the replication address.
pub(super) async fn bind(addr: &str) -> Result<TcpListener, ClusterError> {
    TcpListener::bind(addr)
        .await
        .map_err(|e| ClusterError::Listen {
            addr: addr.to_owned(),
            reason: e.to_string(),
        })
}

/// The replication listener's routes, and what they need to know of this
/// replica. `max_body_bytes`: the largest body the API takes (an append
/// carries at least one record).
pub(super) fn router(
    raft: &Raft,
    engine: &Replica,
    key: ClusterKey,
    config: &ClusterConfig,
    incarnation: u64,
    max_body_bytes: u64,
    (progress, clocks): (Arc<SnapshotProgress>, Arc<PeerClocks>),
) -> Router {
    server::router(
        raft.clone(),
        engine.raft_log(),
        key,
        ServerConfig {
            node_id: config.node_id,
            incarnation,
            api_url: config.api_url.clone(),
            election_timeout: Duration::from_millis(config.election_timeout_ms),
            append_bytes_max: APPEND_SLACK_BYTES
                + usize::try_from(max_body_bytes).unwrap_or(usize::MAX / 2),
            progress,
            clocks,
        },
    )
}

/// Serves `app` on `listener` until the task is aborted (at shutdown),
/// with TLS when the cluster has it. Only requests that `key` signed are
/// served (the first of each connection is checked before it may hold a
/// slot; each is checked in full by `server.rs`).
pub(super) fn serve(
    listener: TcpListener,
    app: Router,
    tls: Option<&ClusterTls>,
    key: ClusterKey,
) -> JoinHandle<()> {
    let refusals = Arc::new(RefusalLog::default());
    let admit: crate::listen::Admit = Arc::new(move |head: &[u8]| {
        key.sender_of(head).map_err(|e| {
            refusals.note(0, &e.to_string());
            format!("cluster authentication failed: {e}")
        })
    });
    let limits = crate::listen::Limits {
        connections_max: CONNECTIONS_MAX,
        per_client_max: PER_PEER_MAX,
        open_max: 4 * CONNECTIONS_MAX,
        open_per_client_max: 4 * CONNECTIONS_MAX,
        header_read_timeout: HEADER_READ_TIMEOUT,
        first_request_timeout: FIRST_REQUEST_TIMEOUT,
        tls: tls.map(ClusterTls::acceptor),
        probes: None,
        admit: Some(admit),
        slot_wait_max: Some(SLOT_WAIT_MAX),
        evict_pending: true,
    };
    tokio::spawn(crate::listen::serve(
        listener,
        app,
        std::future::pending(),
        Duration::ZERO,
        limits,
    ))
}
