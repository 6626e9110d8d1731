//! `GET /v1/cluster` (docs/contract.md §9): this replica's view of its
//! cluster. Answered by any replica, never relayed; `404` on a single node.
//! `POST /v1/cluster/members` and `DELETE /v1/cluster/members/{id}`: add
//! and remove members, on the primary (relayed there like every `/v1`
//! call; `cluster/members.rs` decides).

use std::sync::Arc;

use axum::Json;
use axum::body::Body;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::AppState;
use super::error::ApiError;
use super::openapi::{ClockSkewView, ErrorBody};
use crate::cluster::{Cluster, ClusterStatus, MembershipError};

/// How long an add waits by default for the new member to catch up.
const CATCH_UP_DEFAULT_SECS: u64 = 300;
/// The longest wait an add may ask for.
const CATCH_UP_MAX_SECS: u64 = 3600;

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
    /// This replica catching up by snapshot.
    snapshot: SnapshotView,
    members: Vec<MemberView>,
    /// How far the host's wall clock has stepped from this replica's
    /// steady clock, in ms (0 when they agree within a second).
    clock_step_ms: i64,
    /// A clock skew with a peer past the replay window, found by refused
    /// replication in the last 10 s: elections cannot succeed across it.
    clock_skew: Option<ClockSkewView>,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct SnapshotView {
    /// A snapshot from the primary is arriving now.
    receiving: bool,
    /// Bytes of the snapshot arriving (or of the last one).
    received_bytes: u64,
    /// Snapshots received and installed since this replica started.
    installed: u64,
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
    /// Its API, as the membership names it (a follower names no primary
    /// before the membership names its URL).
    api_url: String,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct MemberView {
    node_id: u64,
    /// Its replication address.
    addr: String,
    /// The incarnation of its spool directory (16 hex digits) the
    /// membership pins: a replica whose directory was wiped has another
    /// and is refused until removed and added back. `null` until the
    /// primary pins it.
    incarnation: Option<String>,
    voter: bool,
    /// The last entry known to match the primary's log (the primary knows
    /// every member's; a follower only its own).
    match_index: Option<u64>,
    lag_records: Option<u64>,
    /// On the primary: milliseconds since the member last answered it.
    #[serde(skip_serializing_if = "Option::is_none")]
    last_contact_ms: Option<u64>,
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
            snapshot: SnapshotView {
                receiving: s.snapshot_receiving,
                received_bytes: s.snapshot_received_bytes,
                installed: s.snapshots_installed,
            },
            members: s
                .members
                .into_iter()
                .map(|m| MemberView {
                    node_id: m.node_id,
                    addr: m.addr,
                    incarnation: m.incarnation.map(|i| format!("{i:016x}")),
                    voter: m.voter,
                    match_index: m.match_index,
                    lag_records: m.lag_records,
                    last_contact_ms: m.last_contact.map(|d| d.as_millis() as u64),
                })
                .collect(),
            clock_step_ms: s.clock_step_ms,
            clock_skew: s.clock_skew.map(Into::into),
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
                let engine = engine.clone();
                let (applied_index, sha256) =
                    tokio::task::spawn_blocking(move || engine.state_digest())
                        .await
                        .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
                view.state_digest = Some(StateDigestView {
                    // The Raft index of the applied record.
                    applied_index: applied_index.saturating_sub(1),
                    sha256,
                });
            }
            Json(view).into_response()
        }
        None => single_node().into_response(),
    }
}

fn single_node() -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "not_found",
        "this spoold runs as a single node, not a cluster",
    )
}

fn cluster(state: &AppState) -> Result<&Cluster, ApiError> {
    state.cluster().ok_or_else(single_node)
}

/// A member to add.
#[derive(Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct AddMemberBody {
    /// A node id the cluster never had (a replica that lost its disk comes
    /// back under a new one).
    node_id: u64,
    /// Its `cluster.advertise` address (host:port of replication).
    addr: String,
    /// Seconds to wait for it to catch up before it becomes a voter
    /// (default 300, at most 3600).
    #[serde(default)]
    catch_up_timeout_secs: Option<u64>,
}

/// The node id of a member, in the path.
#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Path)]
pub(crate) struct MemberPath {
    /// The member's node id.
    #[allow(dead_code)] // read through `Path<u64>`; here for the document
    id: u64,
}

impl From<MembershipError> for ApiError {
    fn from(e: MembershipError) -> ApiError {
        let message = e.to_string();
        match e {
            MembershipError::BadRequest(_) => ApiError::bad_request(message),
            MembershipError::Unavailable(_) => ApiError::unavailable(message),
            MembershipError::AlreadyMember(_) => {
                ApiError::new(StatusCode::CONFLICT, "already_member", message)
            }
            MembershipError::Retired(_) => {
                ApiError::new(StatusCode::CONFLICT, "node_id_retired", message)
            }
            MembershipError::NotMember(_) => {
                ApiError::new(StatusCode::NOT_FOUND, "member_not_found", message)
            }
            MembershipError::Unreachable { .. } => {
                ApiError::new(StatusCode::CONFLICT, "member_unreachable", message)
            }
            MembershipError::Behind { .. } => {
                ApiError::new(StatusCode::CONFLICT, "member_behind", message)
            }
            MembershipError::QuorumAtRisk(_) => {
                ApiError::new(StatusCode::CONFLICT, "quorum_at_risk", message)
            }
            MembershipError::Unconfirmed(_) => ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "operation_unconfirmed",
                message,
            ),
        }
    }
}

/// Adds a member: a learner first, a voter once it caught up.
#[utoipa::path(
    post, path = "/v1/cluster/members", operation_id = "addMember", tag = "operations",
    request_body(content = AddMemberBody, content_type = "application/json"),
    responses(
        (status = 200, description = "a voter now; the cluster as the primary sees it", body = ClusterView),
        (status = 400, description = "a malformed body", body = ErrorBody),
        (status = 404, description = "a single node, not a cluster", body = ErrorBody),
        (status = 409, description = "`already_member`, `node_id_retired` (a member once: a returning replica needs a new id), `member_unreachable` (no answer, or another node answers there), `member_behind` (not caught up in time: it stays a learner)", body = ErrorBody),
        (status = 503, description = "no primary, or another membership change in progress", body = ErrorBody),
    )
)]
pub(crate) async fn add_member(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let cluster = cluster(&state)?;
    let bytes = super::read_body(&state, &headers, body).await?;
    let add: AddMemberBody = serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::bad_request(format!("invalid member: {e}")))?;
    let wait = add.catch_up_timeout_secs.unwrap_or(CATCH_UP_DEFAULT_SECS);
    if wait > CATCH_UP_MAX_SECS {
        return Err(ApiError::bad_request(format!(
            "catchUpTimeoutSecs = {wait}: at most {CATCH_UP_MAX_SECS}"
        )));
    }
    let status = cluster
        .add_member(add.node_id, &add.addr, std::time::Duration::from_secs(wait))
        .await?;
    Ok(Json(ClusterView::from(status)).into_response())
}

/// Removes a member (one at a time; refused if the voters left would not
/// hold a majority that answers the primary).
#[utoipa::path(
    delete, path = "/v1/cluster/members/{id}", operation_id = "removeMember", tag = "operations",
    params(MemberPath),
    responses(
        (status = 200, description = "removed; the cluster as the primary sees it", body = ClusterView),
        (status = 404, description = "`member_not_found`, or a single node", body = ErrorBody),
        (status = 409, description = "`quorum_at_risk`: the voters left would not hold an answering majority, or it is the last voter", body = ErrorBody),
        (status = 503, description = "no primary, or another membership change in progress", body = ErrorBody),
    )
)]
pub(crate) async fn remove_member(
    State(state): State<Arc<AppState>>,
    Path(id): Path<u64>,
) -> Result<Response, ApiError> {
    let status = cluster(&state)?.remove_member(id).await?;
    Ok(Json(ClusterView::from(status)).into_response())
}
