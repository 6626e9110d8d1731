//! The event catalogue's routes (docs/contract.md §4, "Event types"):
//! `GET /v1/event-types`, and `GET`, `PUT` and `DELETE` of one. Any key
//! reads it; only an operator's key changes it (`scope.rs`).

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use utoipa::ToSchema;

use super::error::ApiError;
use super::openapi::Refused;
use super::{AppState, read_body};
use crate::engine::{CatalogueError, EventTypeDef};

/// An entry of the catalogue, with its name.
#[derive(Serialize, ToSchema)]
pub(crate) struct EventTypeView {
    name: String,
    description: String,
    /// The JSON Schema its payloads must match, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<serde_json::Value>)]
    schema: Option<serde_json::Value>,
    /// A payload of the type.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<serde_json::Value>)]
    example: Option<serde_json::Value>,
}

impl EventTypeView {
    fn new(name: String, definition: EventTypeDef) -> EventTypeView {
        EventTypeView {
            name,
            description: definition.description,
            schema: definition.schema,
            example: definition.example,
        }
    }
}

/// `{"eventTypes": […]}`, by name.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct EventTypeList {
    event_types: Vec<EventTypeView>,
}

/// `{name}` of an event type.
#[derive(serde::Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Path)]
pub(crate) struct EventTypePath {
    /// The type, as events name it (`invoice.paid`).
    #[allow(dead_code)]
    name: String,
}

impl From<CatalogueError> for ApiError {
    fn from(e: CatalogueError) -> ApiError {
        let message = e.to_string();
        match e {
            CatalogueError::Invalid(_) => ApiError::bad_request(message),
            CatalogueError::Full => ApiError::new(StatusCode::CONFLICT, "catalogue_full", message),
            CatalogueError::NotFound(_) => {
                ApiError::new(StatusCode::NOT_FOUND, "event_type_not_found", message)
            }
            CatalogueError::Write(w) => w.into(),
        }
    }
}

/// `GET /v1/event-types`
#[utoipa::path(
    get, path = "/v1/event-types", operation_id = "listEventTypes", tag = "events",
    description = "The event catalogue: each type's description, example and JSON Schema, by name.",
    responses((status = 200, body = EventTypeList), Refused)
)]
pub(crate) async fn list(State(state): State<Arc<AppState>>) -> Result<Response, ApiError> {
    let event_types = state
        .engine()?
        .event_types()
        .into_iter()
        .map(|(name, definition)| EventTypeView::new(name, definition))
        .collect();
    Ok(axum::Json(EventTypeList { event_types }).into_response())
}

/// `GET /v1/event-types/{name}`
#[utoipa::path(
    get, path = "/v1/event-types/{name}", operation_id = "getEventType", tag = "events",
    params(EventTypePath),
    responses((status = 200, body = EventTypeView), Refused)
)]
pub(crate) async fn get_one(
    State(state): State<Arc<AppState>>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    let definition = state
        .engine()?
        .event_type(&name)
        .ok_or_else(|| ApiError::from(CatalogueError::NotFound(name.clone())))?;
    Ok(axum::Json(EventTypeView::new(name, definition)).into_response())
}

/// `PUT /v1/event-types/{name}`
#[utoipa::path(
    put, path = "/v1/event-types/{name}", operation_id = "putEventType", tag = "events",
    params(EventTypePath),
    description = "Define an event type (an operator's key): a description, an example, and a JSON Schema that every published payload of the type must then match (else `422 schema_mismatch`, naming where). At most 1000 types of 64 KiB each; a schema may not refer outside itself.",
    request_body(content = EventTypeDef, content_type = "application/json"),
    responses((status = 201, description = "defined", body = EventTypeView), (status = 200, description = "replaced", body = EventTypeView), Refused)
)]
pub(crate) async fn put(
    State(state): State<Arc<AppState>>,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let engine = state.engine()?;
    let bytes = read_body(&state, &headers, body).await?;
    let definition: EventTypeDef = serde_json::from_slice(&bytes).map_err(|e| {
        ApiError::bad_request(format!(
            "an event type is {{\"description\", \"schema\"?, \"example\"?}}: {e}"
        ))
    })?;
    let created = engine.put_event_type(&name, &definition).await?;
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, axum::Json(EventTypeView::new(name, definition))).into_response())
}

/// `DELETE /v1/event-types/{name}`
#[utoipa::path(
    delete, path = "/v1/event-types/{name}", operation_id = "deleteEventType", tag = "events",
    params(EventTypePath),
    responses((status = 204, description = "removed (durable)"), Refused)
)]
pub(crate) async fn delete(
    State(state): State<Arc<AppState>>,
    Path(name): Path<String>,
) -> Result<StatusCode, ApiError> {
    state.engine()?.delete_event_type(&name).await?;
    Ok(StatusCode::NO_CONTENT)
}
