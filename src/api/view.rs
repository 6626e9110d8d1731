//! A message as the API shows it (peek, get, tail, receive-batch).

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Map, Value, json};

use crate::engine::token::Tokens;
use crate::spool::command::AttemptInfo;
use crate::spool::queue::FAILED_SUFFIX;
use crate::spool::{MessageView, Payload};
use crate::time::format_rfc3339;

/// Header names whose stored values are never shown (they are still
/// delivered).
const ALWAYS_REDACTED: &[&str] = &[
    "authorization",
    "proxy-authorization",
    "cookie",
    "spooler-api-key",
];
pub const REDACTED: &str = "<redacted>";

/// Renders one message. `extra_redacted` are `server.redact_headers`,
/// lower-cased.
pub fn render(
    tokens: &Tokens,
    queue: &str,
    view: &MessageView,
    payload: &Payload,
    attempts: &[AttemptInfo],
    extra_redacted: &[String],
) -> Value {
    let m = &view.message;
    let mut v = Map::new();
    v.insert("id".into(), json!(tokens.format_id(view.id)));
    v.insert("queue".into(), json!(queue));
    v.insert("state".into(), json!(view.state.as_str()));
    v.insert("retryCount".into(), json!(m.retry_count));
    v.insert("enqueuedAt".into(), json!(format_rfc3339(m.enqueued_at)));
    v.insert("visibleAt".into(), json!(format_rfc3339(m.visible_at)));
    if !payload.content_type.is_empty() {
        v.insert("contentType".into(), json!(payload.content_type));
    }
    match std::str::from_utf8(&payload.body) {
        Ok(text) => v.insert("body".into(), json!(text)),
        Err(_) => v.insert("bodyBase64".into(), json!(STANDARD.encode(&payload.body))),
    };
    if let Some(req) = &payload.request {
        let headers: Map<String, Value> = req
            .headers
            .iter()
            .map(|(name, value)| {
                let lower = name.to_ascii_lowercase();
                let hidden =
                    ALWAYS_REDACTED.contains(&lower.as_str()) || extra_redacted.contains(&lower);
                (
                    name.clone(),
                    json!(if hidden { REDACTED } else { value.as_str() }),
                )
            })
            .collect();
        let path = if req.query.is_empty() {
            req.path.clone()
        } else {
            format!("{}?{}", req.path, req.query)
        };
        v.insert(
            "request".into(),
            json!({ "method": req.method, "path": path, "headers": headers }),
        );
    }
    let rendered: Vec<Value> = attempts
        .iter()
        .map(|a| {
            let mut o = Map::new();
            o.insert("at".into(), json!(format_rfc3339(a.at)));
            if let Some(s) = a.status {
                o.insert("status".into(), json!(s));
            }
            if !a.error.is_empty() {
                o.insert("error".into(), json!(a.error));
            }
            o.insert(
                "durationSeconds".into(),
                json!(f64::from(a.duration_ms) / 1000.0),
            );
            if !a.response.is_empty() {
                o.insert("response".into(), json!(a.response));
            }
            Value::Object(o)
        })
        .collect();
    v.insert("attempts".into(), Value::Array(rendered));
    if let Some(last) = attempts.last() {
        if let Some(s) = last.status {
            v.insert("lastStatus".into(), json!(s));
        }
        if !last.error.is_empty() {
            v.insert("lastError".into(), json!(last.error));
        }
    }
    if let Some(f) = &view.failure {
        let origin = queue.strip_suffix(FAILED_SUFFIX).unwrap_or(queue);
        v.insert("originQueue".into(), json!(origin));
        v.insert("failedAt".into(), json!(format_rfc3339(f.failed_at)));
        v.insert("reason".into(), json!(f.reason.as_str()));
        if let Some(status) = f.last_status {
            v.insert("lastStatus".into(), json!(status));
        }
    }
    Value::Object(v)
}
