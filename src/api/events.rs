//! `POST /v1/events` (docs/contract.md §4 "Events"): an event with a
//! type, written once and enqueued to every queue that subscribes to it.

use std::sync::Arc;

use axum::extract::{Extension, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::auth::Presented;
use super::error::ApiError;
use super::messages::{
    checked_ordering_key, content_type, header_str, idempotency_key, ordering_key,
};
use super::openapi::Refused;
use super::scope::Grant;
use super::{AppState, read_body};
use crate::engine::{Engine, EventError, EventOutcome, EventRequest, Publisher};
use crate::spool::Payload;

/// A JSON event: `{"type", "tenant"?, "orderingKey"?, "payload"}`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct EventBody {
    /// Dot-separated segments of `[A-Za-z0-9_-]`, at most 255 bytes.
    #[serde(rename = "type")]
    event_type: String,
    /// Only queues without a tenant, or with this one, receive it.
    tenant: Option<String>,
    /// On a queue with `ordering = "per_key"`, its delivery goes after
    /// every earlier message of this key, one at a time (1 to 128
    /// printable ASCII bytes).
    #[serde(rename = "orderingKey")]
    ordering_key: Option<String>,
    /// Any JSON: what each delivery's body is (`application/json`).
    #[schema(value_type = Object)]
    payload: serde_json::Value,
}

/// `{"id", "deliveries": [{"queue", "id"}…], "matchedByType"}`.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct PublishedBody {
    /// The event's id (`Spooler-Event-Id` of its deliveries).
    id: String,
    /// One message per subscribing queue whose content filter (if any)
    /// kept it, queues in name order; empty when none does.
    deliveries: Vec<DeliveryBody>,
    /// Queues whose patterns (and tenant) took the event's type, before
    /// their content filters kept `deliveries` of them.
    matched_by_type: usize,
}

#[derive(Serialize, ToSchema)]
pub(crate) struct DeliveryBody {
    queue: String,
    /// The message id (its `Spooler-Delivery-Id` and `webhook-id`).
    id: String,
}

/// `POST /v1/events`
#[utoipa::path(
    post, path = "/v1/events", operation_id = "publishEvent", tag = "events", params(
        ("Spooler-Event-Type" = Option<String>, Header, description = "Set: the body is the payload as is (any content type), and this is its type."),
        ("Spooler-Tenant" = Option<String>, Header, description = "With Spooler-Event-Type: the event's tenant."),
        ("Idempotency-Key" = Option<String>, Header, description = "A repeat within events.dedup_window answers the first event (200, Spooler-Deduplicated).")),
    description = "Publish an event: one record, one fsync, a message in every queue whose `events` patterns take its type (and whose `tenant`, if set, is the event's). Answered only after the fsync.",
    request_body(content = EventBody, description = "The event as JSON, or (with Spooler-Event-Type) the raw payload."),
    responses(
        (status = 202, description = "stored (durable) and fanned out", body = PublishedBody),
        (status = 200, description = "a repeat of an Idempotency-Key: the first event's answer", body = PublishedBody, headers(("Spooler-Deduplicated" = String))),
        (status = 409, description = "the first event with this Idempotency-Key is still being written (`event_in_progress`)"),
        Refused)
)]
pub(crate) async fn publish(
    State(state): State<Arc<AppState>>,
    Extension(presented): Extension<Presented>,
    request: Request,
) -> Result<Response, ApiError> {
    let engine = state.engine()?;
    let (parts, body) = request.into_parts();
    let headers = &parts.headers;
    let dedup_key = idempotency_key(headers, "idempotency-key")?;
    let hops = super::hops::incoming_hops(headers)?;
    let body = read_body(&state, headers, body).await?;
    if header_str(headers, "spooler-event-type")?.is_some() {
        said_json(&content_type(headers), &body)?;
    }
    let mut request = match header_str(headers, "spooler-event-type")? {
        Some(event_type) => raw_event(headers, event_type, body, hops, dedup_key)?,
        None => json_event(headers, &body, hops, dedup_key)?,
    };
    drop(parts);
    let grant = &presented.grant;
    own_tenant(grant, &mut request.tenant)?;
    let outcome = engine.publish(request).await?;
    Ok(published(engine.tokens(), in_scope(engine, grant, outcome)))
}

/// A raw event: `body` as sent, of `event_type` (`Spooler-Event-Type`),
/// its tenant and ordering key in headers.
fn raw_event(
    headers: &HeaderMap,
    event_type: &str,
    body: Bytes,
    hops: u8,
    dedup_key: Option<String>,
) -> Result<EventRequest, ApiError> {
    Ok(EventRequest {
        event_type: event_type.to_owned(),
        tenant: header_str(headers, "spooler-tenant")?.map(str::to_owned),
        payload: Payload {
            content_type: content_type(headers),
            request: None,
            event: None,
            resent_from: None,
            trace: super::messages::incoming_trace(headers),
            hops,
            ordering_key: ordering_key(headers)?,
            body,
        },
        dedup_key,
        headers: filter_headers(headers),
        publisher: Publisher::Client,
    })
}

/// A JSON event: type, tenant, ordering key and payload in `body`
/// ([`EventBody`]), which the headers may not name beside it.
fn json_event(
    headers: &HeaderMap,
    body: &[u8],
    hops: u8,
    dedup_key: Option<String>,
) -> Result<EventRequest, ApiError> {
    if header_str(headers, "spooler-tenant")?.is_some()
        || header_str(headers, "spooler-ordering-key")?.is_some()
    {
        return Err(ApiError::bad_request(
            "Spooler-Tenant and Spooler-Ordering-Key go with Spooler-Event-Type; a JSON \
             event names its tenant and orderingKey in the body",
        ));
    }
    let event: EventBody = serde_json::from_slice(body).map_err(|e| {
        ApiError::bad_request(format!(
            "an event is {{\"type\", \"tenant\"?, \"orderingKey\"?, \"payload\"}} (or a \
             raw body with Spooler-Event-Type): {e}"
        ))
    })?;
    let payload = serde_json::to_vec(&event.payload).expect("JSON values serialize");
    Ok(EventRequest {
        event_type: event.event_type,
        tenant: event.tenant,
        payload: Payload {
            content_type: "application/json".into(),
            request: None,
            event: None,
            resent_from: None,
            trace: super::messages::incoming_trace(headers),
            hops,
            ordering_key: checked_ordering_key(event.ordering_key, "orderingKey")?,
            body: payload.into(),
        },
        dedup_key,
        headers: filter_headers(headers),
        publisher: Publisher::Client,
    })
}

/// A raw event body that says JSON must be JSON: the one place it is
/// checked (a JSON event's payload was parsed as the event was read, and
/// the engine parses a payload again only for its type's schema).
fn said_json(content_type: &str, body: &[u8]) -> Result<(), ApiError> {
    let media = content_type.split(';').next().unwrap_or("").trim();
    let json = media.eq_ignore_ascii_case("application/json") || media.ends_with("+json");
    if json && !body.is_empty() {
        serde_json::from_slice::<serde::de::IgnoredAny>(body).map_err(|e| {
            ApiError::bad_request(format!(
                "payload: Content-Type says JSON, but it is not: {e}"
            ))
        })?;
    }
    Ok(())
}

/// A tenant's key publishes its tenant's events: one without a tenant is
/// the key's, another tenant's is `403`.
fn own_tenant(grant: &Grant, tenant: &mut Option<String>) -> Result<(), ApiError> {
    let Some(own) = grant.tenant() else {
        return Ok(());
    };
    match tenant {
        None => *tenant = Some(own.to_owned()),
        Some(t) if t == own => {}
        Some(t) => {
            return Err(ApiError::forbidden(format!(
                "tenant: this key publishes tenant {own:?}'s events, not {t:?}'s"
            )));
        }
    }
    Ok(())
}

/// What a scoped key is told of a publish: the deliveries to queues in its
/// scope, and only those counted (docs/contract.md §4).
fn in_scope(engine: &Engine, grant: &Grant, mut outcome: EventOutcome) -> EventOutcome {
    if grant.is_operator() {
        return outcome;
    }
    outcome.deliveries.retain(|(queue, _)| {
        // A queue gone since is left out: its owner is not known.
        engine
            .queue_owner(queue)
            .is_some_and(|owner| grant.reaches(queue, Some(&owner)))
    });
    outcome.matched = outcome.deliveries.len();
    outcome
}

/// The headers an event was published with, as content filters read
/// them: lower-case names, each value a string (several: a list);
/// credentials left out.
fn filter_headers(headers: &axum::http::HeaderMap) -> serde_json::Map<String, serde_json::Value> {
    use serde_json::Value;
    let mut map = serde_json::Map::new();
    for name in headers.keys() {
        if matches!(
            name.as_str(),
            "authorization" | "proxy-authorization" | "cookie"
        ) {
            continue;
        }
        let values: Vec<Value> = headers
            .get_all(name)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .map(|v| Value::String(v.to_owned()))
            .collect();
        let value = match <[Value; 1]>::try_from(values) {
            Ok([one]) => one,
            Err(many) => Value::Array(many),
        };
        map.insert(name.as_str().to_owned(), value);
    }
    map
}

fn published(tokens: &crate::engine::token::Tokens, outcome: EventOutcome) -> Response {
    let status = if outcome.deduplicated {
        StatusCode::OK
    } else {
        StatusCode::ACCEPTED
    };
    let body = PublishedBody {
        id: tokens.format_id(outcome.id),
        deliveries: outcome
            .deliveries
            .into_iter()
            .map(|(queue, id)| DeliveryBody {
                queue,
                id: tokens.format_id(id),
            })
            .collect(),
        matched_by_type: outcome.matched,
    };
    let mut response = (status, axum::Json(body)).into_response();
    if outcome.deduplicated {
        response
            .headers_mut()
            .insert("spooler-deduplicated", HeaderValue::from_static("true"));
    }
    response
}

impl From<EventError> for ApiError {
    fn from(e: EventError) -> ApiError {
        let message = e.to_string();
        match e {
            EventError::Invalid { .. } | EventError::TooManySubscribers { .. } => {
                ApiError::bad_request(message)
            }
            EventError::KeyInProgress => {
                let mut e = ApiError::new(StatusCode::CONFLICT, "event_in_progress", message);
                e.retry_after_secs = Some(1);
                e
            }
            EventError::KeyReused => {
                ApiError::new(StatusCode::CONFLICT, "idempotency_key_reused", message)
            }
            EventError::SchemaMismatch { .. } => {
                ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "schema_mismatch", message)
            }
            EventError::SpoolFull { .. } => ApiError {
                retry_after_secs: Some(5),
                ..ApiError::new(StatusCode::INSUFFICIENT_STORAGE, "spool_full", message)
            },
            EventError::Write(w) => w.into(),
        }
    }
}
