//! Queue routes: list, get, create/update, delete, redrive, pause, resume.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::error::ApiError;
use super::settings::{SettingsBody, destination_host, host_allowed, render, render_stats};
use super::{AppState, query_pairs, read_body};
use crate::engine::Engine;
use crate::spool::queue::FAILED_SUFFIX;

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
pub async fn list(State(state): State<Arc<AppState>>) -> Result<Response, ApiError> {
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
pub async fn get_one(
    State(state): State<Arc<AppState>>,
    Path(queue): Path<String>,
) -> Result<Response, ApiError> {
    Ok(axum::Json(queue_json(state.engine()?, &queue)?).into_response())
}

fn refuse_failure_queue(queue: &str, what: &str) -> Result<(), ApiError> {
    if queue.ends_with(FAILED_SUFFIX) {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "failure_queue",
            format!("{queue} is a failure queue: it is {what} with its queue"),
        ));
    }
    Ok(())
}

fn refuse_managed(engine: &Engine, queue: &str) -> Result<(), ApiError> {
    if let Ok((_, true)) = engine.queue_settings(queue) {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "queue_managed_by_config",
            format!("{queue} is defined in the config file; change it there"),
        ));
    }
    Ok(())
}

/// `PUT /v1/queues/{q}`: the body replaces the whole settings object.
pub async fn put(
    State(state): State<Arc<AppState>>,
    Path(queue): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let engine = state.engine()?;
    refuse_failure_queue(&queue, "configured")?;
    refuse_managed(engine, &queue)?;
    let bytes = read_body(&state, &headers, body).await?;
    let parsed: SettingsBody = if bytes.iter().all(u8::is_ascii_whitespace) {
        SettingsBody::default()
    } else {
        serde_json::from_slice(&bytes)
            .map_err(|e| ApiError::bad_request(format!("invalid queue settings: {e}")))?
    };
    let previous_secret = engine
        .queue_settings(&queue)
        .ok()
        .and_then(|(s, _)| s.signing_secret);
    let settings = parsed
        .into_settings(previous_secret)
        .map_err(ApiError::bad_request)?;
    if let (Some(dest), Some(allowed)) = (&settings.destination, &state.config.allowed_destinations)
    {
        let host = destination_host(dest).map_err(ApiError::bad_request)?;
        if !host_allowed(&host, allowed) {
            return Err(ApiError::forbidden(format!(
                "destination host {host} is not in server.allowed_destinations"
            )));
        }
    }
    let created = engine.upsert_queue(&queue, settings, false).await?;
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, axum::Json(queue_json(engine, &queue)?)).into_response())
}

/// `DELETE /v1/queues/{q}`
pub async fn delete(
    State(state): State<Arc<AppState>>,
    Path(queue): Path<String>,
) -> Result<StatusCode, ApiError> {
    let engine = state.engine()?;
    refuse_failure_queue(&queue, "deleted")?;
    refuse_managed(engine, &queue)?;
    engine.delete_queue(&queue).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /v1/queues/{q}/redrive?max=N&id=…&dryRun=true`
pub async fn redrive(
    State(state): State<Arc<AppState>>,
    Path(queue): Path<String>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let engine = state.engine()?;
    refuse_failure_queue(&queue, "redriven into")?;
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
pub async fn pause(
    State(state): State<Arc<AppState>>,
    Path(queue): Path<String>,
) -> Result<StatusCode, ApiError> {
    state.engine()?.set_paused(&queue, true).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /v1/queues/{q}/resume`
pub async fn resume(
    State(state): State<Arc<AppState>>,
    Path(queue): Path<String>,
) -> Result<StatusCode, ApiError> {
    state.engine()?.set_paused(&queue, false).await?;
    Ok(StatusCode::NO_CONTENT)
}
