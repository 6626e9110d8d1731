//! A queue's delivery log (docs/contract.md §4, "Delivery log"): one list
//! of its pending, retrying, failed and delivered messages, newest first,
//! each with its state, attempts and last status.

use std::sync::Arc;

use axum::extract::{Path, RawQuery, State};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use serde_json::Value;
use utoipa::ToSchema;

use super::error::ApiError;
use super::openapi::{QueuePath, Refused, SearchQuery};
use super::stored::ANSWER_BYTES_MAX;
use super::view::MessageJson;
use super::{AppState, query_pairs, view};
use crate::engine::{Engine, LogItem, LogQuery};
use crate::spool::queue::failed_queue_name;
use crate::time::parse_rfc3339;

/// Most entries one page holds.
const LOG_LIMIT_MAX: usize = 1000;

/// `{"deliveries": […], "next", "scanned", "unsearched"}`.
#[derive(Serialize, ToSchema)]
pub(crate) struct DeliveriesBody {
    /// Newest first (by when they were sent); each a message with `state`
    /// `pending`, `retrying`, `failed` or `delivered`, and `messageState`
    /// (`visible`, `delayed`, `leased`, `held`, `delivered`).
    #[schema(value_type = Vec<MessageJson>)]
    deliveries: Vec<Value>,
    /// Present when there may be more: the `before` of the next page.
    #[serde(skip_serializing_if = "Option::is_none")]
    next: Option<String>,
    /// Entries looked at (at most 10 000 a page).
    scanned: usize,
    /// Entries whose body is too large for a `match` term to parse (1 MiB).
    unsearched: usize,
}

fn query(engine: &Engine, raw: Option<&str>) -> Result<LogQuery, ApiError> {
    let mut q = LogQuery {
        limit: 50,
        ..LogQuery::default()
    };
    for (name, value) in query_pairs(raw) {
        let bad = |what: &str| ApiError::bad_request(format!("{name}: {what}"));
        match name.as_str() {
            "limit" => {
                q.limit = (value.parse().ok())
                    .filter(|n| (1..=LOG_LIMIT_MAX).contains(n))
                    .ok_or_else(|| bad("1 to 1000"))?;
            }
            "before" => {
                q.before =
                    Some((engine.tokens().parse_id(&value)).ok_or_else(|| bad("a page's next"))?);
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

fn render(state: &AppState, engine: &Engine, queue: &str, item: &LogItem) -> Value {
    let in_queue = match item.entry.in_failure_queue {
        true => failed_queue_name(queue),
        false => queue.to_owned(),
    };
    let mut rendered = view::render(
        engine.tokens(),
        &in_queue,
        &item.entry.view,
        &item.payload,
        &item.attempts,
        &state.config.redact_headers,
    );
    rendered.message_state = Some(rendered.state);
    rendered.state = item.entry.state.as_str();
    serde_json::to_value(rendered).expect("bug: a message does not render as JSON")
}

/// `GET /v1/queues/{q}/deliveries`
#[utoipa::path(
    get, path = "/v1/queues/{q}/deliveries", operation_id = "listDeliveries", tag = "history", params(QueuePath,
        ("limit" = Option<u32>, Query, description = "At most this many (1 to 1000, default 50)."),
        ("before" = Option<String>, Query, description = "Page: the `next` of the page before."),
        ("since" = Option<String>, Query, description = "Sent at or after (RFC 3339)."),
        ("until" = Option<String>, Query, description = "Sent before (RFC 3339)."),
        SearchQuery),
    description = "The queue's delivery log: its pending, retrying, failed (in `q.failed`) and delivered (kept in its history) messages together, newest first, each with its state, attempts and last status.",
    responses((status = 200, body = DeliveriesBody), Refused)
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
        let page = engine.delivery_log(&queue, &q, &mut |read, kept| {
            if kept {
                answer_bytes += read;
            }
            answer_bytes < ANSWER_BYTES_MAX && budget.spend(read)
        })?;
        Ok(DeliveriesBody {
            deliveries: (page.items.iter())
                .map(|item| render(state, engine, &queue, item))
                .collect(),
            next: page.next.map(|id| engine.tokens().format_id(id)),
            scanned: page.scanned,
            unsearched: page.unsearched,
        })
    })
    .await?;
    Ok(axum::Json(body).into_response())
}
