//! Message routes: send, forward, receive (single and batch), ack, nack,
//! renew, peek, get, cancel, purge, tail.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use axum::Extension;
use axum::body::Body;
use axum::extract::{Path, RawPathParams, RawQuery, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures_util::{StreamExt, stream};
use serde_json::Value;
use tokio::sync::broadcast::error::RecvError;
use tracing::Instrument;

use super::auth::Presented;
use super::error::ApiError;
use super::filter::{BulkQuery, take_term};
use super::forward::{resolve_path, stored_headers};
use super::hops::incoming_hops;
use super::openapi::{
    BulkQueryParams, DeadLetterQuery, LeasePath, MessagePath, MessagesBody, PurgeBody, QueuePath,
    Refused, RenewBody, SearchQuery, StoredBody,
};
use super::stored::{ANSWER_BYTES_MAX, render_stored};
use super::view::MessageJson;
use super::{AppState, WAIT_SECONDS_MAX, query_pairs, read_body, seconds_param, view};
use crate::engine::{Delivery, Engine, MessageError, SendOutcome, SendRequest};
use crate::spool::search::Search;
use crate::spool::{DeadLetterFilter, MessageId, MessageView, Payload, StoredRequest};
use crate::time::format_rfc3339;

/// Longest `Spooler-Delay` accepted: one year.
const DELAY_SECONDS_MAX: f64 = 365.0 * 86_400.0;
/// Longest idempotency key accepted.
const IDEMPOTENCY_KEY_MAX_BYTES: usize = 256;
/// Default and largest `max` of a batch receive (docs/contract.md §4).
const BATCH_DEFAULT: usize = 10;
const BATCH_MAX: usize = 100;
/// Default and largest `limit` of a peek (docs/contract.md §4).
const PEEK_DEFAULT: usize = 50;
const PEEK_MAX: usize = 1000;
const DEFAULT_CONTENT_TYPE: &str = "application/octet-stream";

pub(super) fn header_str<'a>(
    headers: &'a HeaderMap,
    name: &str,
) -> Result<Option<&'a str>, ApiError> {
    match headers.get(name) {
        None => Ok(None),
        Some(v) => v
            .to_str()
            .map(Some)
            .map_err(|_| ApiError::bad_request(format!("header {name} is not valid text"))),
    }
}

fn delay_ms(headers: &HeaderMap) -> Result<u64, ApiError> {
    match header_str(headers, "spooler-delay")? {
        None => Ok(0),
        Some(v) => {
            Ok((seconds_param("Spooler-Delay", v, DELAY_SECONDS_MAX)? * 1000.0).round() as u64)
        }
    }
}

pub(super) fn idempotency_key(headers: &HeaderMap, name: &str) -> Result<Option<String>, ApiError> {
    match header_str(headers, name)? {
        None => Ok(None),
        Some(k) if k.is_empty() || k.len() > IDEMPOTENCY_KEY_MAX_BYTES => {
            Err(ApiError::bad_request(format!(
                "{name} must be 1 to {IDEMPOTENCY_KEY_MAX_BYTES} bytes"
            )))
        }
        Some(k) => Ok(Some(k.to_string())),
    }
}

/// The `Spooler-Ordering-Key` of a send, forward or raw event, checked.
pub(super) fn ordering_key(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    let key = header_str(headers, "spooler-ordering-key")?.map(str::to_owned);
    checked_ordering_key(key, "Spooler-Ordering-Key")
}

/// An ordering key as `name` gave it: 1 to 128 printable ASCII bytes.
pub(super) fn checked_ordering_key(
    key: Option<String>,
    name: &str,
) -> Result<Option<String>, ApiError> {
    match key {
        Some(k) => match crate::spool::state::ordering_key_problem(&k) {
            Some(problem) => Err(ApiError::bad_request(format!("{name}: {problem}"))),
            None => Ok(Some(k)),
        },
        None => Ok(None),
    }
}

pub(super) fn content_type(headers: &HeaderMap) -> String {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or(DEFAULT_CONTENT_TYPE)
        .to_string()
}

pub(super) fn parse_id(engine: &Engine, queue: &str, text: &str) -> Result<MessageId, ApiError> {
    engine.tokens().parse_id(text).ok_or_else(|| {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "message_not_found",
            format!("message {text} does not exist in queue {queue}"),
        )
    })
}

fn stored_response(status: StatusCode, id: &str, queue: &str) -> Response {
    (status, axum::Json(StoredBody { id, queue })).into_response()
}

fn id_response(engine: &Engine, status: StatusCode, queue: &str, out: SendOutcome) -> Response {
    let id = engine.tokens().format_id(out.id);
    let mut response = stored_response(status, &id, queue);
    let location = format!("/v1/queues/{queue}/messages/{id}");
    if let Ok(v) = HeaderValue::from_str(&location) {
        response.headers_mut().insert(header::LOCATION, v);
    }
    response
}

/// The `traceparent` a message stores (`src/telemetry.rs`).
pub(super) fn incoming_trace(headers: &HeaderMap) -> Option<String> {
    let incoming = headers.get("traceparent").and_then(|v| v.to_str().ok());
    crate::telemetry::to_store(incoming)
}

/// `POST /v1/queues/{q}/messages`
#[utoipa::path(
    post, path = "/v1/queues/{q}/messages", operation_id = "sendMessage", tag = "messages", params(QueuePath,
        ("Spooler-Delay" = Option<f64>, Header, description = "Seconds before the message becomes visible."),
        ("Idempotency-Key" = Option<String>, Header, description = "Dedup key (the queue needs a dedup window).")),
    description = "Store a message: answered only after the fsync that covers it.",
    request_body(content = Vec<u8>, content_type = "*/*", description = "The payload, stored as sent with its Content-Type."),
    responses(
        (status = 201, description = "stored (durable)", body = StoredBody, headers(("Location" = String))),
        (status = 200, description = "a duplicate within the dedup window: the first message's id", body = StoredBody, headers(("Spooler-Deduplicated" = String))),
        Refused)
)]
pub(crate) async fn send(
    State(state): State<Arc<AppState>>,
    Path(queue): Path<String>,
    request: Request,
) -> Result<Response, ApiError> {
    let engine = state.engine()?;
    // The headers are read in place: the `HeaderMap` extractor would clone
    // them.
    let (parts, body) = request.into_parts();
    let headers = &parts.headers;
    let request = SendRequest {
        delay_ms: delay_ms(headers)?,
        dedup_key: idempotency_key(headers, "idempotency-key")?,
        payload: Payload {
            content_type: content_type(headers),
            request: None,
            event: None,
            resent_from: None,
            trace: incoming_trace(headers),
            hops: incoming_hops(headers)?,
            ordering_key: ordering_key(headers)?,
            body: read_body(&state, headers, body).await?,
        },
    };
    // Header values are slices of the connection's read buffer: let them go
    // before the fsync wait, so that the buffer can be reused in place.
    drop(parts);
    let out = engine
        .send(&queue, request)
        .instrument(crate::telemetry::span(|| {
            tracing::info_span!("journal.fsync")
        }))
        .await?;
    if out.deduplicated {
        let mut response = id_response(engine, StatusCode::OK, &queue, out);
        response
            .headers_mut()
            .insert("spooler-deduplicated", HeaderValue::from_static("true"));
        return Ok(response);
    }
    Ok(id_response(engine, StatusCode::CREATED, &queue, out))
}

/// Where a forward goes after the destination: the URL's path and query
/// after `/v1/forward/{q}`, or `Spooler-Forward-Path` (`/v1/charges?x=1`)
/// for clients that cannot put slashes in a path parameter (generated ones
/// percent-encode them). Not both.
fn forwarded_target<'a>(
    headers: &'a axum::http::HeaderMap,
    in_url: &'a str,
    query: Option<&'a str>,
) -> Result<(&'a str, &'a str), ApiError> {
    let Some(given) = headers.get("spooler-forward-path") else {
        return Ok((in_url, query.unwrap_or_default()));
    };
    let given = given
        .to_str()
        .map_err(|_| ApiError::bad_request("Spooler-Forward-Path is not visible ASCII"))?;
    if !in_url.is_empty() || query.is_some() {
        return Err(ApiError::bad_request(
            "give the forwarded path in the URL or in Spooler-Forward-Path, not both",
        ));
    }
    if !given.starts_with('/') {
        return Err(ApiError::bad_request(format!(
            "Spooler-Forward-Path {given:?}: a path that starts with /"
        )));
    }
    Ok(given.split_once('?').unwrap_or((given, "")))
}

/// `ANY /v1/forward/{q}/{path…}`, and `ANY /v1/forward/{q}` with
/// `Spooler-Forward-Path`.
pub(crate) async fn forward(
    State(state): State<Arc<AppState>>,
    params: RawPathParams,
    request: Request,
) -> Result<Response, ApiError> {
    let engine = state.engine()?;
    let (parts, body) = request.into_parts();
    let (method, headers, uri) = (&parts.method, &parts.headers, &parts.uri);
    let queue = params
        .iter()
        .find_map(|(name, value)| (name == "q").then(|| value.to_owned()))
        .unwrap_or_default();
    if !engine.is_push_queue(&queue)? {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "not_push_queue",
            format!("{queue} has no destination: forward needs a push queue"),
        ));
    }
    let prefix = format!("/v1/forward/{queue}");
    let in_url = uri.path().strip_prefix(&prefix).unwrap_or_default();
    let (raw_path, query) = forwarded_target(headers, in_url, uri.query())?;
    let path = resolve_path(raw_path).map_err(|e| ApiError::bad_request(e.to_string()))?;
    let request = SendRequest {
        delay_ms: delay_ms(headers)?,
        dedup_key: idempotency_key(headers, "spooler-idempotency-key")?,
        payload: Payload {
            content_type: headers
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_string(),
            request: Some(StoredRequest {
                method: method.as_str().to_string(),
                path,
                query: query.to_string(),
                headers: stored_headers(headers),
            }),
            event: None,
            resent_from: None,
            trace: incoming_trace(headers),
            hops: incoming_hops(headers)?,
            ordering_key: ordering_key(headers)?,
            body: read_body(&state, headers, body).await?,
        },
    };
    let out = engine
        .send(&queue, request)
        .instrument(crate::telemetry::span(|| {
            tracing::info_span!("journal.fsync")
        }))
        .await?;
    let id = engine.tokens().format_id(out.id);
    let status = if out.deduplicated {
        StatusCode::OK
    } else {
        StatusCode::ACCEPTED
    };
    let mut response = stored_response(status, &id, &queue);
    let h = response.headers_mut();
    if let Ok(v) = HeaderValue::from_str(&id) {
        h.insert("spooler-delivery-id", v);
    }
    if out.deduplicated {
        h.insert("spooler-deduplicated", HeaderValue::from_static("true"));
    }
    Ok(response)
}

struct ReceiveParams {
    wait: Duration,
    max: usize,
}

fn receive_params(query: Option<&str>, batch: bool) -> Result<ReceiveParams, ApiError> {
    let mut params = ReceiveParams {
        wait: Duration::ZERO,
        max: if batch { BATCH_DEFAULT } else { 1 },
    };
    for (k, v) in query_pairs(query) {
        match k.as_str() {
            "wait" => {
                params.wait = Duration::from_secs_f64(seconds_param("wait", &v, WAIT_SECONDS_MAX)?)
            }
            "max" if batch => {
                params.max = v
                    .parse::<usize>()
                    .ok()
                    .filter(|m| (1..=BATCH_MAX).contains(m))
                    .ok_or_else(|| {
                        ApiError::bad_request(format!("max = {v:?}: allowed 1 to {BATCH_MAX}"))
                    })?;
            }
            _ => {}
        }
    }
    Ok(params)
}

/// Leases, holding a long-poll permit while waiting; a long poll whose
/// key a reload removes ends unanswered (`401`) and leases nothing.
async fn lease(
    state: &Arc<AppState>,
    queue: &str,
    params: ReceiveParams,
    presented: Option<Extension<Presented>>,
) -> Result<Vec<Delivery>, ApiError> {
    let engine = state.engine()?;
    if params.wait.is_zero() {
        return Ok(engine.receive(queue, params.max, Duration::ZERO).await?);
    }
    let _permit = state.long_polls.clone().try_acquire_owned().map_err(|_| {
        ApiError::unavailable(format!(
            "too many receivers are long-polling (limit {}); retry, or poll with wait=0",
            super::LONG_POLLS_MAX
        ))
    })?;
    let revoked = state.revoked(presented.map(|p| p.0).unwrap_or_default());
    // The receive leases only in a poll that then returns at once, so
    // dropping it while it waits leaves no lease behind.
    tokio::select! {
        biased;
        () = revoked => Err(ApiError::unauthorized()),
        got = engine.receive(queue, params.max, params.wait) => Ok(got?),
    }
}

/// `POST /v1/queues/{q}/receive`
#[utoipa::path(
    post, path = "/v1/queues/{q}/receive", operation_id = "receive", tag = "leases", params(QueuePath,
        ("wait" = Option<f64>, Query, description = "Long-poll up to this many seconds (max 20).")),
    description = "Lease one message: the body is its payload, the lease is in the headers.",
    responses(
        (status = 200, description = "leased", content_type = "*/*", body = Vec<u8>, headers(
            ("Spooler-Message-Id" = String), ("Spooler-Lease-Token" = String),
            ("Spooler-Lease-Expires" = String, description = "RFC 3339"), ("Spooler-Retry-Count" = u32))),
        (status = 204, description = "nothing visible within `wait`"),
        Refused)
)]
pub(crate) async fn receive(
    State(state): State<Arc<AppState>>,
    Path(queue): Path<String>,
    RawQuery(query): RawQuery,
    presented: Option<Extension<Presented>>,
) -> Result<Response, ApiError> {
    let params = receive_params(query.as_deref(), false)?;
    let mut got = lease(&state, &queue, params, presented).await?;
    let Some(d) = got.pop() else {
        return Ok(StatusCode::NO_CONTENT.into_response());
    };
    let engine = state.engine()?;
    let mut response = (StatusCode::OK, d.payload.body).into_response();
    let h = response.headers_mut();
    let pairs = [
        ("spooler-message-id", engine.tokens().format_id(d.id)),
        ("spooler-lease-token", d.token),
        ("spooler-lease-expires", format_rfc3339(d.expires_at)),
        ("spooler-retry-count", d.retry_count.to_string()),
    ];
    for (name, value) in pairs {
        if let Ok(v) = HeaderValue::from_str(&value) {
            h.insert(name, v);
        }
    }
    if let Some(from) = d.payload.resent_from
        && let Ok(v) = HeaderValue::from_str(&engine.tokens().format_id(from))
    {
        h.insert("spooler-resent-from", v);
    }
    if let Some(v) = (d.payload.ordering_key.as_deref()).and_then(|k| HeaderValue::from_str(k).ok())
    {
        h.insert("spooler-ordering-key", v);
    }
    if let Some(event) = &d.payload.event {
        let event_id = engine.tokens().format_id(event.id);
        let tags = [
            ("spooler-event-type", Some(event.event_type.as_str())),
            ("spooler-event-id", Some(event_id.as_str())),
            ("spooler-tenant", event.tenant.as_deref()),
        ];
        for (name, value) in tags {
            if let Some(v) = value.and_then(|v| HeaderValue::from_str(v).ok()) {
                h.insert(name, v);
            }
        }
    }
    if let Ok(v) = HeaderValue::from_str(&d.payload.content_type) {
        h.insert(header::CONTENT_TYPE, v);
    }
    Ok(response)
}

/// `POST /v1/queues/{q}/receive-batch`
#[utoipa::path(
    post, path = "/v1/queues/{q}/receive-batch", operation_id = "receiveBatch", tag = "leases", params(QueuePath,
        ("max" = Option<u32>, Query, description = "At most this many (1 to 100, default 10)."),
        ("wait" = Option<f64>, Query, description = "Long-poll up to this many seconds (max 20).")),
    description = "Lease up to `max` messages; answers as soon as one is available, or empty after `wait`.",
    responses((status = 200, body = MessagesBody), Refused)
)]
pub(crate) async fn receive_batch(
    State(state): State<Arc<AppState>>,
    Path(queue): Path<String>,
    RawQuery(query): RawQuery,
    presented: Option<Extension<Presented>>,
) -> Result<Response, ApiError> {
    let params = receive_params(query.as_deref(), true)?;
    let got = lease(&state, &queue, params, presented).await?;
    let engine = state.engine()?;
    let messages: Vec<_> = got
        .iter()
        .map(|d| {
            let mut v = view::render(
                engine.tokens(),
                &queue,
                &d.view,
                &d.payload,
                &[],
                &state.config.redact_headers,
            );
            v.lease_token = Some(d.token.clone());
            v.lease_expires_at = Some(format_rfc3339(d.expires_at));
            v
        })
        .collect();
    Ok(axum::Json(Messages { messages }).into_response())
}

/// `POST /v1/queues/{q}/leases/{token}/ack`
#[utoipa::path(
    post, path = "/v1/queues/{q}/leases/{token}/ack", operation_id = "ack", tag = "leases", params(LeasePath),
    responses((status = 204, description = "removed (durable)"), Refused)
)]
pub(crate) async fn ack(
    State(state): State<Arc<AppState>>,
    Path((queue, token)): Path<(String, String)>,
) -> Result<StatusCode, ApiError> {
    state.engine()?.ack(&queue, &token).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /v1/queues/{q}/leases/{token}/nack?delay=10`
#[utoipa::path(
    post, path = "/v1/queues/{q}/leases/{token}/nack", operation_id = "nack", tag = "leases", params(LeasePath,
        ("delay" = Option<f64>, Query, description = "Seconds before it is visible again.")),
    description = "Give the message back: its retry count rises; past `maxRetries` it moves to the failure queue.",
    responses((status = 204, description = "released (durable)"), Refused)
)]
pub(crate) async fn nack(
    State(state): State<Arc<AppState>>,
    Path((queue, token)): Path<(String, String)>,
    RawQuery(query): RawQuery,
) -> Result<StatusCode, ApiError> {
    let mut delay_ms = 0;
    for (k, v) in query_pairs(query.as_deref()) {
        if k == "delay" {
            delay_ms = (seconds_param("delay", &v, DELAY_SECONDS_MAX)? * 1000.0).round() as u64;
        }
    }
    state.engine()?.nack(&queue, &token, delay_ms).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /v1/queues/{q}/leases/{token}/renew`
#[utoipa::path(
    post, path = "/v1/queues/{q}/leases/{token}/renew", operation_id = "renew", tag = "leases", params(LeasePath),
    responses((status = 200, body = RenewBody), Refused)
)]
pub(crate) async fn renew(
    State(state): State<Arc<AppState>>,
    Path((queue, token)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    let expires_at = state.engine()?.renew(&queue, &token)?;
    Ok(axum::Json(RenewBody {
        lease_expires_at: format_rfc3339(expires_at),
    })
    .into_response())
}

/// `{"messages": [...]}`: a batch receive or a peek.
#[derive(serde::Serialize)]
struct Messages<T> {
    messages: Vec<T>,
}

/// `GET /v1/queues/{q}/messages?limit=50&after=<id>`
#[utoipa::path(
    get, path = "/v1/queues/{q}/messages", operation_id = "peekMessages", tag = "messages", params(QueuePath,
        ("limit" = Option<u32>, Query, description = "At most this many (1 to 1000, default 50)."),
        ("after" = Option<String>, Query, description = "Page: messages after this id."),
        DeadLetterQuery, SearchQuery),
    description = "Messages without leasing them, oldest first (visible, delayed and leased). Dead-letter filters apply to failure queues.",
    responses((status = 200, body = MessagesBody), Refused)
)]
pub(crate) async fn peek(
    State(state): State<Arc<AppState>>,
    Path(queue): Path<String>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let engine = state.engine()?;
    let (limit, after, filter, search) = peek_params(engine, query.as_deref())?;
    if !search.is_empty() {
        let page = super::search::off_runtime(&state, move |state, budget| {
            super::search::peek_search(state, &queue, &filter, &search, after, limit, budget)
        })
        .await?;
        return Ok(axum::Json(page).into_response());
    }
    let views = engine.peek(&queue, &filter, after, limit)?;
    // Rendered one at a time into the answer, which ends at
    // ANSWER_BYTES_MAX; `next` says where the following page starts.
    let mut out = String::from("{\"messages\":[");
    let (mut shown, mut last, mut cut) = (0usize, None, false);
    for v in &views {
        if shown > 0 && out.len() >= ANSWER_BYTES_MAX {
            cut = true;
            break;
        }
        match render_stored(&state, engine, &queue, v, None) {
            Ok(rendered) => {
                if shown > 0 {
                    out.push(',');
                }
                out.push_str(&rendered.to_string());
                shown += 1;
            }
            // Settled between the peek and the read: no longer there.
            Err(MessageError::MessageNotFound { .. }) => {}
            Err(e) => return Err(e.into()),
        }
        last = Some(v.id);
    }
    out.push(']');
    if let Some(last) = last.filter(|_| cut || views.len() == limit) {
        out.push_str(&format!(
            ",\"next\":{}",
            Value::String(engine.tokens().format_id(last))
        ));
    }
    out.push('}');
    Ok(([(header::CONTENT_TYPE, "application/json")], out).into_response())
}

/// The parameters of a peek: its `limit`, the id it starts `after`, its
/// dead-letter filter and its search.
fn peek_params(
    engine: &Engine,
    query: Option<&str>,
) -> Result<(usize, Option<MessageId>, DeadLetterFilter, Search), ApiError> {
    let mut limit = PEEK_DEFAULT;
    let mut after = None;
    let mut filter = DeadLetterFilter::default();
    let mut search = Search::default();
    for (k, v) in query_pairs(query) {
        if take_term(engine, &mut filter, &k, &v)? {
            continue;
        }
        if super::search::TERMS.contains(&k.as_str()) {
            super::search::term(&mut search, &k, v)?;
            continue;
        }
        match k.as_str() {
            "limit" => {
                limit = v
                    .parse::<usize>()
                    .ok()
                    .filter(|l| (1..=PEEK_MAX).contains(l))
                    .ok_or_else(|| {
                        ApiError::bad_request(format!("limit = {v:?}: allowed 1 to {PEEK_MAX}"))
                    })?;
            }
            "after" => {
                after = Some(engine.tokens().parse_id(&v).ok_or_else(|| {
                    ApiError::bad_request(format!("after = {v:?} is not a message id"))
                })?);
            }
            _ => {}
        }
    }
    Ok((limit, after, filter, search))
}

/// `GET /v1/queues/{q}/messages/{id}`
#[utoipa::path(
    get, path = "/v1/queues/{q}/messages/{id}", operation_id = "getMessage", tag = "messages", params(MessagePath),
    responses((status = 200, body = MessageJson), Refused)
)]
pub(crate) async fn get_one(
    State(state): State<Arc<AppState>>,
    Path((queue, id)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    let engine = state.engine()?;
    let id = parse_id(engine, &queue, &id)?;
    let v = engine.get(&queue, id)?;
    Ok(axum::Json(render_stored(&state, engine, &queue, &v, None)?).into_response())
}

/// `DELETE /v1/queues/{q}/messages/{id}`
#[utoipa::path(
    delete, path = "/v1/queues/{q}/messages/{id}", operation_id = "cancelMessage", tag = "messages", params(MessagePath),
    description = "Cancel one message; a live lease on it becomes stale.",
    responses((status = 204, description = "cancelled (durable)"), Refused)
)]
pub(crate) async fn cancel(
    State(state): State<Arc<AppState>>,
    Path((queue, id)): Path<(String, String)>,
) -> Result<StatusCode, ApiError> {
    let engine = state.engine()?;
    let id = parse_id(engine, &queue, &id)?;
    engine.cancel(&queue, id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /v1/queues/{q}/messages/{id}/retry`
#[utoipa::path(
    post, path = "/v1/queues/{q}/messages/{id}/retry", operation_id = "retryMessage", tag = "messages", params(MessagePath),
    description = "Retry now: a delayed message (waiting for its first try or its next retry) becomes visible at once, its retry count kept. `409 message_not_delayed` for one that does not wait (visible, leased, a dead letter: redrive those).",
    responses((status = 204, description = "visible now (durable)"), Refused)
)]
pub(crate) async fn retry_now(
    State(state): State<Arc<AppState>>,
    Path((queue, id)): Path<(String, String)>,
) -> Result<StatusCode, ApiError> {
    let engine = state.engine()?;
    let id = parse_id(engine, &queue, &id)?;
    engine.retry_now(&queue, id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `DELETE /v1/queues/{q}/messages?max=N&dryRun=true`: every message; with
/// the dead-letter filters, those selected; at most `max`.
#[utoipa::path(
    delete, path = "/v1/queues/{q}/messages", operation_id = "purgeMessages", tag = "messages", params(QueuePath, DeadLetterQuery, BulkQueryParams),
    description = "Remove every message, or (on a failure queue) those the filters select; at most `max`.",
    responses((status = 200, body = PurgeBody), Refused)
)]
pub(crate) async fn purge(
    State(state): State<Arc<AppState>>,
    Path(queue): Path<String>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let engine = state.engine()?;
    let q = BulkQuery::parse(engine, query.as_deref())?;
    let max = q.max.unwrap_or(usize::MAX);
    let done = engine.purge(&queue, &q.filter, max, q.dry_run).await?;
    Ok(axum::Json(PurgeBody {
        purged: done.done,
        matched: done.matched,
        remaining: done.remaining,
        dry_run: q.dry_run,
    })
    .into_response())
}

/// `GET /v1/queues/{q}/tail?last=N`: the `N` newest messages (oldest of
/// them first), then one JSON line per message as it arrives, until the
/// client leaves or the server stops (the stream then ends cleanly). A
/// line per arrival that is still there when the stream reads it; a
/// subscriber that falls far behind skips ahead.
#[utoipa::path(
    get, path = "/v1/queues/{q}/tail", operation_id = "tailMessages", tag = "messages", params(QueuePath,
        ("last" = Option<u32>, Query, description = "First the N newest messages (0 to 1000).")),
    description = "Newline-delimited JSON of each message as it arrives, until the client leaves or the server stops.",
    responses((status = 200, description = "a stream of messages, one JSON object per line", content_type = "application/x-ndjson", body = MessageJson), Refused)
)]
pub(crate) async fn tail(
    State(state): State<Arc<AppState>>,
    Path(queue): Path<String>,
    RawQuery(query): RawQuery,
    presented: Option<Extension<Presented>>,
) -> Result<Response, ApiError> {
    let engine = state.engine()?.clone();
    let last = tail_last(query.as_deref())?;
    // Subscribe before reading the newest, so that nothing falls between.
    let arrivals = engine.arrivals();
    let newest = engine.newest(&queue, last)?;
    let shown: HashSet<MessageId> = newest.iter().map(|v| v.id).collect();
    let backlog = tail_backlog(&state, &engine, &queue, &newest);
    let stop = state.shutdown_signal();
    // The stream ends when the server stops, or when a reload no longer
    // accepts the key it was opened with.
    let revoked = Box::pin(state.revoked(presented.map(|p| p.0).unwrap_or_default()));
    let follow = stream::unfold(
        (arrivals, (stop, revoked), shown, engine, state, queue),
        |(mut rx, (mut stop, mut revoked), mut shown, engine, state, queue)| async move {
            loop {
                let arrival = tokio::select! {
                    biased;
                    _ = stop.wait_for(|stopping| *stopping) => return None,
                    () = &mut revoked => return None,
                    a = rx.recv() => a,
                };
                match arrival {
                    Ok(a) if a.queue == queue && !shown.remove(&a.id) => {
                        let Ok(v) = engine.get(&queue, a.id) else {
                            continue;
                        };
                        let Ok(rendered) = render_stored(&state, &engine, &queue, &v, None) else {
                            continue;
                        };
                        return Some((
                            format!("{rendered}\n"),
                            (rx, (stop, revoked), shown, engine, state, queue),
                        ));
                    }
                    Ok(_) | Err(RecvError::Lagged(_)) => continue,
                    Err(RecvError::Closed) => return None,
                }
            }
        },
    );
    let lines = stream::iter(backlog)
        .chain(follow)
        .map(Ok::<_, std::convert::Infallible>);
    let mut response = Response::new(Body::from_stream(lines));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/x-ndjson"),
    );
    Ok(response)
}

/// The `last` of a tail: how many of the newest messages come first.
fn tail_last(query: Option<&str>) -> Result<usize, ApiError> {
    let mut last = 0;
    for (k, v) in query_pairs(query) {
        if k == "last" {
            last = v
                .parse::<usize>()
                .ok()
                .filter(|n| *n <= PEEK_MAX)
                .ok_or_else(|| {
                    ApiError::bad_request(format!("last = {v:?}: allowed 0 to {PEEK_MAX}"))
                })?;
        }
    }
    Ok(last)
}

/// The lines a tail starts with: of the `newest`, those that fit in
/// ANSWER_BYTES_MAX (at least one), oldest first.
fn tail_backlog(
    state: &AppState,
    engine: &Engine,
    queue: &str,
    newest: &[MessageView],
) -> Vec<String> {
    let mut backlog: Vec<String> = Vec::with_capacity(newest.len());
    let mut bytes = 0;
    for v in newest.iter().rev() {
        if bytes >= ANSWER_BYTES_MAX {
            break;
        }
        if let Ok(rendered) = render_stored(state, engine, queue, v, None) {
            let line = format!("{rendered}\n");
            bytes += line.len();
            backlog.push(line);
        }
    }
    backlog.reverse();
    backlog
}
