//! `POST /v1/queues/{q}/secret/rotate`: a new signing secret, the old one
//! signing beside it for an overlap (docs/contract.md §5, "Secret
//! rotation"), as Svix rotates an endpoint's secret.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, Request, State};
use serde::{Deserialize, Serialize};

use super::error::ApiError;
use super::openapi::{QueuePath, Refused};
use super::{AppState, read_body};
use crate::engine::Rotation;
use crate::time::format_rfc3339;

/// Longest overlap a rotation takes: the old secret signs at most this
/// long beside the new one.
pub(crate) const OVERLAP_SECONDS_MAX: f64 = 30.0 * 24.0 * 3600.0;
/// The overlap when none is asked for (Svix's).
pub(crate) const OVERLAP_SECONDS_DEFAULT: f64 = 24.0 * 3600.0;

/// What a rotation may say; an empty body takes every default.
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct RotateBody {
    /// The new secret (`whsec_` and the base64 of its key); spoold
    /// generates one (32 random bytes) when it is left out.
    secret: Option<String>,
    /// How long the secret it replaces keeps signing beside it: 0 drops
    /// it at once; default 86 400 (24 h), at most 30 days.
    overlap_seconds: Option<f64>,
}

/// The new secret, shown this once, and what signs now.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct RotatedView {
    /// The new secret: never shown again.
    secret: String,
    /// How many secrets sign each delivery now (the new one, and the one
    /// it replaced during the overlap).
    signing_secrets: usize,
    /// When the replaced secret stops signing; absent when none signs
    /// beside the new one.
    #[serde(skip_serializing_if = "Option::is_none")]
    previous_expires_at: Option<String>,
}

/// `POST /v1/queues/{q}/secret/rotate`
#[utoipa::path(
    post, path = "/v1/queues/{q}/secret/rotate", operation_id = "rotateSecret", tag = "queues", params(QueuePath),
    request_body(content = Option<RotateBody>, content_type = "application/json"),
    description = "Rotate a push queue's signing secret: the new one (generated unless given) signs every delivery from now on, and the one it replaces signs beside it until the overlap ends (default 24 h; a journaled timer then drops it). The answer is the only place the new secret is shown. A queue the config file defines is `409 queue_managed_by_config`: its file owns the secret; a pull queue is `409 not_push_queue`.",
    responses((status = 200, body = RotatedView), Refused)
)]
pub(crate) async fn rotate(
    State(state): State<Arc<AppState>>,
    Path(queue): Path<String>,
    request: Request,
) -> Result<Json<RotatedView>, ApiError> {
    let engine = state.engine()?;
    let (parts, body) = request.into_parts();
    let body = read_body(&state, &parts.headers, body).await?;
    let asked: RotateBody = if body.iter().all(u8::is_ascii_whitespace) {
        RotateBody::default()
    } else {
        serde_json::from_slice(&body).map_err(|e| {
            ApiError::bad_request(format!(
                "a rotation is {{\"secret\"?, \"overlapSeconds\"?}} (or no body): {e}"
            ))
        })?
    };
    let overlap = asked.overlap_seconds.unwrap_or(OVERLAP_SECONDS_DEFAULT);
    if !(0.0..=OVERLAP_SECONDS_MAX).contains(&overlap) {
        return Err(ApiError::bad_request(format!(
            "overlapSeconds = {overlap} is out of range: allowed 0 to {OVERLAP_SECONDS_MAX}"
        )));
    }
    let Rotation {
        secret,
        signing_secrets,
        previous_expires_at,
    } = (engine.rotate_secret(&queue, asked.secret, (overlap * 1000.0) as u64)).await?;
    Ok(Json(RotatedView {
        secret,
        signing_secrets,
        previous_expires_at: previous_expires_at.map(format_rfc3339),
    }))
}
