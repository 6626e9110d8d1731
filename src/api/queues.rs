//! Queue routes: list, get, create/update, delete, redrive, pause, resume.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::error::ApiError;
use super::settings::{SettingsBody, render, render_stats};
use super::{AppState, query_pairs, read_body};
use crate::engine::{Engine, Origin};

/// Most messages one redrive moves when `max` is not given.
const REDRIVE_DEFAULT: usize = 1000;

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

/// `POST /v1/queues/{q}/redrive?max=N&id=…&dryRun=true`
pub(crate) async fn redrive(
    State(state): State<Arc<AppState>>,
    Path(queue): Path<String>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let engine = state.engine()?;
    let mut max = REDRIVE_DEFAULT;
    let mut ids = Vec::new();
    let mut dry_run = false;
    for (k, v) in query_pairs(query.as_deref()) {
        match k.as_str() {
            "max" => {
                max = v.parse::<usize>().ok().filter(|m| *m >= 1).ok_or_else(|| {
                    ApiError::bad_request(format!("max = {v:?}: a positive number"))
                })?;
            }
            "id" => {
                ids.push(engine.tokens().parse_id(&v).ok_or_else(|| {
                    ApiError::bad_request(format!("id = {v:?} is not a message id"))
                })?)
            }
            "dryRun" => {
                dry_run = match v.as_str() {
                    "true" | "1" | "" => true,
                    "false" | "0" => false,
                    _ => {
                        return Err(ApiError::bad_request(format!(
                            "dryRun = {v:?}: true or false"
                        )));
                    }
                };
            }
            _ => {}
        }
    }
    let only = (!ids.is_empty()).then_some(ids.as_slice());
    let moved = engine.redrive(&queue, max, only, dry_run).await?;
    Ok(axum::Json(json!({ "moved": moved, "dryRun": dry_run })).into_response())
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
