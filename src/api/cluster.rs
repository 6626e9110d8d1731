//! `GET /v1/cluster` (docs/contract.md §9): this replica's view of its
//! cluster. Answered by any replica, never relayed; `404` on a single node.

use std::sync::Arc;

use axum::Json;
use axum::extract::{RawQuery, State};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use utoipa::ToSchema;

use super::AppState;
use super::error::ApiError;
use super::openapi::ErrorBody;
use crate::cluster::ClusterStatus;

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ClusterView {
    node_id: u64,
    /// `primary`, `follower`, `candidate` or `learner`.
    role: &'static str,
    term: u64,
    primary: Option<PrimaryView>,
    commit_index: Option<u64>,
    /// The last entry this replica applied.
    applied_index: Option<u64>,
    /// The last entry of this replica's newest snapshot (its checkpoint).
    snapshot_index: Option<u64>,
    /// The last entry this replica's log no longer holds (a snapshot
    /// covers it): a replica that needs older ones gets the snapshot.
    purged_index: Option<u64>,
    /// With `?digest=true`: SHA-256 of this replica's state without leases
    /// and record locations, with the applied index it is of. Two replicas
    /// at the same applied index with the same digest hold the same state.
    #[serde(skip_serializing_if = "Option::is_none")]
    state_digest: Option<StateDigestView>,
    members: Vec<MemberView>,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct StateDigestView {
    applied_index: u64,
    sha256: String,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct PrimaryView {
    node_id: u64,
    /// `null` until this replica has heard from the primary.
    api_url: Option<String>,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct MemberView {
    node_id: u64,
    /// Its replication address.
    addr: String,
    voter: bool,
    /// The last entry known to match the primary's log (the primary knows
    /// every member's; a follower only its own).
    match_index: Option<u64>,
    lag_records: Option<u64>,
}

impl From<ClusterStatus> for ClusterView {
    fn from(s: ClusterStatus) -> ClusterView {
        ClusterView {
            node_id: s.node_id,
            role: s.role,
            term: s.term,
            primary: s.primary.map(|p| PrimaryView {
                node_id: p.node_id,
                api_url: p.api_url,
            }),
            commit_index: s.commit_index,
            applied_index: s.applied_index,
            snapshot_index: s.snapshot_index,
            purged_index: s.purged_index,
            state_digest: None,
            members: s
                .members
                .into_iter()
                .map(|m| MemberView {
                    node_id: m.node_id,
                    addr: m.addr,
                    voter: m.voter,
                    match_index: m.match_index,
                    lag_records: m.lag_records,
                })
                .collect(),
        }
    }
}

/// This replica's view of its cluster.
#[utoipa::path(
    get, path = "/v1/cluster", operation_id = "clusterStatus", tag = "operations",
    params(("digest" = Option<bool>, Query, description = "add `stateDigest` (reads the whole state)")),
    responses(
        (status = 200, description = "role, term, primary, commit index and members", body = ClusterView),
        (status = 404, description = "a single node, not a cluster", body = ErrorBody),
    )
)]
pub(crate) async fn status(
    State(state): State<Arc<AppState>>,
    RawQuery(query): RawQuery,
) -> Response {
    let digest = query
        .as_deref()
        .is_some_and(|q| q.split('&').any(|kv| kv == "digest=true" || kv == "digest"));
    match state.cluster() {
        Some(cluster) => {
            let mut view = ClusterView::from(cluster.status());
            if digest && let Ok(engine) = state.engine() {
                let (applied_index, sha256) = engine.state_digest();
                view.state_digest = Some(StateDigestView {
                    // The Raft index of the applied record.
                    applied_index: applied_index.saturating_sub(1),
                    sha256,
                });
            }
            Json(view).into_response()
        }
        None => ApiError::new(
            axum::http::StatusCode::NOT_FOUND,
            "not_found",
            "this spoold runs as a single node, not a cluster",
        )
        .into_response(),
    }
}
