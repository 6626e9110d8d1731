//! Queue routes: list, get, create/update, delete, redrive, pause, resume.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::error::ApiError;
use super::filter::BulkQuery;
use super::settings::{SettingsBody, render, render_stats};
use super::{AppState, BULK_DEFAULT, read_body};
use crate::engine::{Engine, Origin};

fn queue_json(engine: &Engine, name: &str) -> Result<Value, ApiError> {
    let (settings, managed) = engine.queue_settings(name)?;
    let stats = engine.stats(name)?;
    Ok(json!({
        "name": name,
        "managedByConfig": managed,
        "settings": render(&settings),
        "stats": render_stats(&stats, settings.is_push()),
    }))
}

/// `GET /v1/queues`
pub(crate) async fn list(State(state): State<Arc<AppState>>) -> Result<Response, ApiError> {
    let engine = state.engine()?;
    let queues: Vec<Value> = engine
        .queue_names()
        .iter()
        // A queue deleted between the list and the lookup is skipped.
        .filter_map(|name| queue_json(engine, name).ok())
        .collect();
    Ok(axum::Json(json!({ "queues": queues })).into_response())
}

/// `GET /v1/queues/{q}`
pub(crate) async fn get_one(
    State(state): State<Arc<AppState>>,
    Path(queue): Path<String>,
) -> Result<Response, ApiError> {
    Ok(axum::Json(queue_json(state.engine()?, &queue)?).into_response())
}

/// `PUT /v1/queues/{q}`: the body replaces the whole settings object.
pub(crate) async fn put(
    State(state): State<Arc<AppState>>,
    Path(queue): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let engine = state.engine()?;
    let bytes = read_body(&state, &headers, body).await?;
    let parsed: SettingsBody = if bytes.iter().all(u8::is_ascii_whitespace) {
        SettingsBody::default()
    } else {
        serde_json::from_slice(&bytes)
            .map_err(|e| ApiError::bad_request(format!("invalid queue settings: {e}")))?
    };
    let previous = engine.queue_settings(&queue).ok().map(|(s, _)| s);
    let settings = parsed
        .into_settings(previous.as_ref())
        .map_err(ApiError::bad_request)?;
    // Every rule (bounds, destinations, who owns the queue) is the engine's.
    let created = engine.upsert_queue(&queue, settings, Origin::Api).await?;
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, axum::Json(queue_json(engine, &queue)?)).into_response())
}

/// `DELETE /v1/queues/{q}`
pub(crate) async fn delete(
    State(state): State<Arc<AppState>>,
    Path(queue): Path<String>,
) -> Result<StatusCode, ApiError> {
    state.engine()?.delete_queue(&queue, Origin::Api).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /v1/queues/{q}/redrive?max=N&dryRun=true` and the dead-letter
/// filters; `{q}` may name the failure queue too.
pub(crate) async fn redrive(
    State(state): State<Arc<AppState>>,
    Path(queue): Path<String>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let engine = state.engine()?;
    let q = BulkQuery::parse(engine, query.as_deref())?;
    let max = q.max.unwrap_or(BULK_DEFAULT);
    let done = engine.redrive(&queue, &q.filter, max, q.dry_run).await?;
    Ok(axum::Json(json!({
        "moved": done.done,
        "matched": done.matched,
        "remaining": done.remaining,
        "dryRun": q.dry_run,
    }))
    .into_response())
}

/// `POST /v1/queues/{q}/pause`
pub(crate) async fn pause(
    State(state): State<Arc<AppState>>,
    Path(queue): Path<String>,
) -> Result<StatusCode, ApiError> {
    state.engine()?.set_paused(&queue, true).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /v1/queues/{q}/resume`
pub(crate) async fn resume(
    State(state): State<Arc<AppState>>,
    Path(queue): Path<String>,
) -> Result<StatusCode, ApiError> {
    state.engine()?.set_paused(&queue, false).await?;
    Ok(StatusCode::NO_CONTENT)
}
