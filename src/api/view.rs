//! A message as the API shows it (peek, get, tail, receive-batch).

use std::collections::BTreeMap;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde::Serialize;

use crate::engine::token::Tokens;
use crate::spool::command::AttemptInfo;
use crate::spool::queue::origin_queue_name;
use crate::spool::{MessageView, Payload, StoredRequest};
use crate::time::format_rfc3339;

/// Header names whose stored values are never shown (they are still
/// delivered).
const ALWAYS_REDACTED: &[&str] = &[
    "authorization",
    "proxy-authorization",
    "cookie",
    "spooler-api-key",
];
pub(crate) const REDACTED: &str = "<redacted>";

/// One message as JSON: field names and order as the API shows them.
/// Serialized straight from borrowed parts: a batch of 100 messages is not
/// first copied into a tree of `serde_json::Value`s.
/// A message as peeked, tailed, fetched or received in a batch; fields that
/// do not apply are left out.
#[derive(Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(as = Message)]
pub(crate) struct MessageJson<'a> {
    id: String,
    queue: &'a str,
    /// `visible`, `delayed`, `leased`, `held` or `delivered`; in a
    /// delivery log `pending`, `retrying`, `failed` or `delivered`.
    pub state: &'static str,
    /// In a delivery log: what `state` is elsewhere.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message_state: Option<&'static str>,
    retry_count: u32,
    enqueued_at: String,
    visible_at: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    content_type: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    body: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    body_base64: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    request: Option<RequestJson<'a>>,
    /// A delivery of an event: its type, id and tenant.
    #[serde(skip_serializing_if = "Option::is_none")]
    event_type: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    event_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tenant: Option<&'a str>,
    /// Its ordering key (docs/contract.md §2).
    #[serde(skip_serializing_if = "Option::is_none")]
    ordering_key: Option<&'a str>,
    /// A resend: the id of the delivered message it repeats.
    #[serde(skip_serializing_if = "Option::is_none")]
    resent_from: Option<String>,
    /// In a queue's history: when it was delivered.
    #[serde(skip_serializing_if = "Option::is_none")]
    delivered_at: Option<String>,
    attempts: Vec<AttemptJson<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    last_status: Option<u16>,
    #[serde(skip_serializing_if = "Option::is_none")]
    last_error: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    origin_queue: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    failed_at: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<&'static str>,
    /// Set by receive-batch only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lease_token: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lease_expires_at: Option<String>,
}

/// A forwarded request as stored (secret header values `<redacted>`).
#[derive(Serialize, utoipa::ToSchema)]
#[schema(as = StoredRequest)]
pub(crate) struct RequestJson<'a> {
    method: &'a str,
    path: String,
    headers: BTreeMap<&'a str, &'a str>,
}

/// One delivery attempt (the last ten are kept).
#[derive(Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(as = Attempt)]
pub(crate) struct AttemptJson<'a> {
    at: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    status: Option<u16>,
    #[serde(skip_serializing_if = "str::is_empty")]
    error: &'a str,
    duration_seconds: f64,
    #[serde(skip_serializing_if = "str::is_empty")]
    response: &'a str,
}

/// Renders one message. `extra_redacted` are `server.redact_headers`,
/// lower-cased.
pub(crate) fn render<'a>(
    tokens: &Tokens,
    queue: &'a str,
    view: &MessageView,
    payload: &'a Payload,
    attempts: &'a [AttemptInfo],
    extra_redacted: &[String],
) -> MessageJson<'a> {
    let m = &view.message;
    let (body, body_base64) = match std::str::from_utf8(&payload.body) {
        Ok(text) => (Some(text), None),
        Err(_) => (None, Some(STANDARD.encode(&payload.body))),
    };
    let request = (payload.request.as_ref()).map(|req| RequestJson::of(req, extra_redacted));
    let last = attempts.last();
    let failure = view.failure.as_ref();
    MessageJson {
        id: tokens.format_id(view.id),
        queue,
        state: view.state.as_str(),
        message_state: None,
        retry_count: m.retry_count,
        enqueued_at: format_rfc3339(m.enqueued_at),
        visible_at: format_rfc3339(m.visible_at),
        content_type: Some(payload.content_type.as_str()).filter(|t| !t.is_empty()),
        body,
        body_base64,
        request,
        event_type: payload.event.as_ref().map(|e| e.event_type.as_str()),
        event_id: payload.event.as_ref().map(|e| tokens.format_id(e.id)),
        tenant: payload.event.as_ref().and_then(|e| e.tenant.as_deref()),
        ordering_key: payload.ordering_key.as_deref(),
        resent_from: payload.resent_from.map(|id| tokens.format_id(id)),
        delivered_at: (view.state == crate::spool::MessageState::Delivered)
            .then(|| format_rfc3339(m.visible_at)),
        attempts: attempts.iter().map(AttemptJson::of).collect(),
        // A failure's own status wins over the last attempt's.
        last_status: failure
            .and_then(|f| f.last_status)
            .or(last.and_then(|a| a.status)),
        last_error: last.map(|a| a.error.as_str()).filter(|e| !e.is_empty()),
        origin_queue: failure.map(|_| origin_queue_name(queue)),
        failed_at: failure.map(|f| format_rfc3339(f.failed_at)),
        reason: failure.map(|f| f.reason.as_str()),
        lease_token: None,
        lease_expires_at: None,
    }
}

impl<'a> RequestJson<'a> {
    /// A stored request as shown: its path with its query, its secret
    /// header values (and `extra_redacted` ones) `<redacted>`.
    fn of(req: &'a StoredRequest, extra_redacted: &[String]) -> RequestJson<'a> {
        let headers = req
            .headers
            .iter()
            .map(|(name, value)| {
                let lower = name.to_ascii_lowercase();
                let hidden =
                    ALWAYS_REDACTED.contains(&lower.as_str()) || extra_redacted.contains(&lower);
                (
                    name.as_str(),
                    if hidden { REDACTED } else { value.as_str() },
                )
            })
            .collect();
        let path = if req.query.is_empty() {
            req.path.clone()
        } else {
            format!("{}?{}", req.path, req.query)
        };
        RequestJson {
            method: &req.method,
            path,
            headers,
        }
    }
}

impl<'a> AttemptJson<'a> {
    /// An attempt as shown: its duration in seconds.
    fn of(a: &'a AttemptInfo) -> AttemptJson<'a> {
        AttemptJson {
            at: format_rfc3339(a.at),
            status: a.status,
            error: &a.error,
            duration_seconds: f64::from(a.duration_ms) / 1000.0,
            response: &a.response,
        }
    }
}
