//! A queue's delivery history (docs/contract.md §4 "History"): delivered
//! messages, newest first, one with its attempts, and resend.

use std::sync::Arc;

use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use serde_json::Value;
use utoipa::ToSchema;

use super::error::ApiError;
use super::messages::parse_id;
use super::openapi::{MessagePath, QueuePath, Refused, SearchQuery};
use super::stored::ANSWER_BYTES_MAX;
use super::view::MessageJson;
use super::{AppState, query_pairs, view};
use crate::engine::{Engine, HistoryItem, HistoryQuery};
use crate::spool::MessageId;
use crate::time::{Millis, parse_rfc3339};

/// Most entries one page of history holds.
const HISTORY_LIMIT_MAX: usize = 1000;

/// `{"messages": […], "next", "scanned"}`.
#[derive(Serialize, ToSchema)]
pub(crate) struct HistoryBody {
    /// Newest first; each `state: "delivered"` with `deliveredAt`.
    #[schema(value_type = Vec<MessageJson>)]
    messages: Vec<Value>,
    /// Present when there may be more: the `before` of the next page.
    #[serde(skip_serializing_if = "Option::is_none")]
    next: Option<String>,
    /// Entries looked at (a `type` or `tenant` filter reads each one's
    /// record; at most 10 000 a page).
    scanned: usize,
    /// Entries whose body is too large for a `match` term to parse (1 MiB).
    unsearched: usize,
}

/// `{"id", "queue", "resentFrom"}`.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ResentBody {
    /// The new message's id.
    id: String,
    queue: String,
    resent_from: String,
}

fn cursor(engine: &Engine, (at, id): (Millis, MessageId)) -> String {
    format!("{at}.{}", engine.tokens().format_id(id))
}

fn parse_cursor(engine: &Engine, text: &str) -> Option<(Millis, MessageId)> {
    let (at, id) = text.split_once('.')?;
    Some((at.parse().ok()?, engine.tokens().parse_id(id)?))
}

fn query(engine: &Engine, raw: Option<&str>) -> Result<HistoryQuery, ApiError> {
    let mut q = HistoryQuery {
        limit: 50,
        ..HistoryQuery::default()
    };
    for (name, value) in query_pairs(raw) {
        let bad = |what: &str| ApiError::bad_request(format!("{name}: {what}"));
        match name.as_str() {
            "limit" => {
                q.limit = value
                    .parse()
                    .ok()
                    .filter(|n| (1..=HISTORY_LIMIT_MAX).contains(n))
                    .ok_or_else(|| bad("1 to 1000"))?;
            }
            "before" => {
                q.before = Some(parse_cursor(engine, &value).ok_or_else(|| bad("a page's next"))?);
            }
            "since" => {
                q.since = Some(parse_rfc3339(&value).ok_or_else(|| bad("an RFC 3339 time"))?)
            }
            "until" => {
                q.until = Some(parse_rfc3339(&value).ok_or_else(|| bad("an RFC 3339 time"))?)
            }
            _ => super::search::term(&mut q.search, &name, value)?,
        }
    }
    Ok(q)
}

fn render(state: &AppState, engine: &Engine, queue: &str, item: &HistoryItem) -> Value {
    let view = item.delivered.view(item.id);
    let rendered = view::render(
        engine.tokens(),
        queue,
        &view,
        &item.payload,
        &item.attempts,
        &state.config.redact_headers,
    );
    serde_json::to_value(rendered).expect("bug: a message does not render as JSON")
}

/// `GET /v1/queues/{q}/history`
#[utoipa::path(
    get, path = "/v1/queues/{q}/history", operation_id = "listHistory", tag = "history", params(QueuePath,
        ("limit" = Option<u32>, Query, description = "At most this many (1 to 1000, default 50)."),
        ("before" = Option<String>, Query, description = "Page: the `next` of the page before."),
        ("since" = Option<String>, Query, description = "Delivered at or after (RFC 3339)."),
        ("until" = Option<String>, Query, description = "Delivered before (RFC 3339)."),
        SearchQuery),
    description = "Delivered messages kept for the queue's `historyRetentionSeconds`, newest first, with their attempts.",
    responses((status = 200, body = HistoryBody), Refused)
)]
pub(crate) async fn list(
    State(state): State<Arc<AppState>>,
    Path(queue): Path<String>,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    let q = query(state.engine()?, raw.as_deref())?;
    // Every entry's record is read (and searched): off the runtime, within
    // a search's budget, and the answer within its bound.
    let body = super::search::off_runtime(&state, move |state, budget| {
        let engine = state.engine()?;
        let mut answer_bytes = 0usize;
        let page = engine.history(&queue, &q, &mut |read, kept| {
            if kept {
                answer_bytes += read;
            }
            answer_bytes < ANSWER_BYTES_MAX && budget.spend(read)
        })?;
        Ok(HistoryBody {
            messages: page
                .items
                .iter()
                .map(|item| render(state, engine, &queue, item))
                .collect(),
            next: page.next.map(|c| cursor(engine, c)),
            scanned: page.scanned,
            unsearched: page.unsearched,
        })
    })
    .await?;
    Ok(axum::Json(body).into_response())
}

/// `GET /v1/queues/{q}/history/{id}`
#[utoipa::path(
    get, path = "/v1/queues/{q}/history/{id}", operation_id = "getDelivered", tag = "history", params(MessagePath),
    description = "One delivered message with its payload and attempts (\"we never got it\").",
    responses((status = 200, body = MessageJson), Refused)
)]
pub(crate) async fn get_one(
    State(state): State<Arc<AppState>>,
    Path((queue, id)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    let engine = state.engine()?;
    let id = parse_id(engine, &queue, &id)?;
    let item = engine.delivered(&queue, id)?;
    Ok(axum::Json(render(&state, engine, &queue, &item)).into_response())
}

/// `POST /v1/queues/{q}/history/{id}/resend`
#[utoipa::path(
    post, path = "/v1/queues/{q}/history/{id}/resend", operation_id = "resendDelivered", tag = "history", params(MessagePath),
    description = "Send a delivered message again: a new message (new id, so a new `webhook-id`) with the same payload; its deliveries carry `Spooler-Resent-From`.",
    responses((status = 202, description = "stored (durable)", body = ResentBody), Refused)
)]
pub(crate) async fn resend(
    State(state): State<Arc<AppState>>,
    Path((queue, id)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    let engine = state.engine()?;
    let from = parse_id(engine, &queue, &id)?;
    let new_id = engine.resend(&queue, from).await?;
    let body = ResentBody {
        id: engine.tokens().format_id(new_id),
        queue,
        resent_from: engine.tokens().format_id(from),
    };
    Ok((StatusCode::ACCEPTED, axum::Json(body)).into_response())
}
