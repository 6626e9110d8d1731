//! The HTTP error body: `{"kind": "<snake_case>", "message": "…"}` with the
//! contract's statuses (docs/contract.md §4). Every failure of every route goes through [`ApiError`],
//! so internals (paths, OS errors) never leak into an answer.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use crate::engine::rules::QueueRuleError;
use crate::engine::{
    LeaseError, MessageError, QueueError, ReadError, SendError, SettleError, WriteError,
};
use crate::spool::queue::Naming;

/// Every `kind` an answer can carry (docs/contract.md §4), as the OpenAPI
/// document's enum lists them (`examples.rs`). A test below finds every
/// kind the code names and checks it is here.
pub(crate) const KINDS: &[&str] = &[
    "bad_request",
    "unauthorized",
    "forbidden",
    "not_found",
    "queue_not_found",
    "message_not_found",
    "member_not_found",
    "method_not_allowed",
    "not_push_queue",
    "not_pull_queue",
    "failure_queue",
    "stale_lease",
    "message_not_delayed",
    "event_in_progress",
    "idempotency_key_reused",
    "schema_mismatch",
    "event_type_not_found",
    "catalogue_full",
    "portal_disabled",
    "queue_managed_by_config",
    "queue_limit_reached",
    "secrets_would_move",
    "already_member",
    "member_behind",
    "member_unreachable",
    "node_id_retired",
    "quorum_at_risk",
    "payload_too_large",
    "too_many_searches",
    "loop_detected",
    "not_primary",
    "operation_unconfirmed",
    "unavailable",
    "spool_full",
];

/// One error answer.
#[derive(Debug)]
pub(crate) struct ApiError {
    pub status: StatusCode,
    pub kind: &'static str,
    pub message: String,
    /// Seconds for a `Retry-After` header.
    pub retry_after_secs: Option<u64>,
}

impl ApiError {
    pub(crate) fn new(
        status: StatusCode,
        kind: &'static str,
        message: impl Into<String>,
    ) -> ApiError {
        debug_assert!(KINDS.contains(&kind), "{kind} is missing from KINDS");
        ApiError {
            status,
            kind,
            message: message.into(),
            retry_after_secs: None,
        }
    }

    pub(crate) fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "bad_request", message)
    }

    pub(crate) fn unauthorized() -> ApiError {
        ApiError::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "a valid API key is required (Authorization: Bearer <key> or Spooler-Api-Key)",
        )
    }

    pub(crate) fn forbidden(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::FORBIDDEN, "forbidden", message)
    }

    pub(crate) fn not_found() -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such route")
    }

    pub(crate) fn method_not_allowed() -> ApiError {
        ApiError::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
            "this route does not take that method",
        )
    }

    pub(crate) fn payload_too_large(limit: u64) -> ApiError {
        crate::metrics::limit_reached(crate::metrics::Limit::Body);
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
            format!("the body is larger than server.max_body_bytes ({limit} bytes)"),
        )
    }

    pub(crate) fn unavailable(message: impl Into<String>) -> ApiError {
        ApiError {
            retry_after_secs: Some(1),
            ..ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", message)
        }
    }
}

// Every engine error, mapped to its kind and status (docs/contract.md §4, errors):
// the one place that knows the mapping.

impl From<WriteError> for ApiError {
    fn from(e: WriteError) -> ApiError {
        match e {
            WriteError::Unavailable { .. } | WriteError::NotPrimary { .. } => {
                ApiError::unavailable(e.to_string())
            }
            WriteError::LeadershipLost { .. } => ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "operation_unconfirmed",
                format!(
                    "{e}; it may or may not be applied: retry only with an idempotency key \
                     on a dedup queue"
                ),
            ),
            WriteError::MemoryFull { .. } => ApiError {
                retry_after_secs: Some(5),
                ..ApiError::new(
                    StatusCode::INSUFFICIENT_STORAGE,
                    "spool_full",
                    e.to_string(),
                )
            },
            WriteError::TooLarge { .. } => {
                crate::metrics::limit_reached(crate::metrics::Limit::Record);
                ApiError::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "payload_too_large",
                    e.to_string(),
                )
            }
            WriteError::Unconfirmed { .. } => ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "operation_unconfirmed",
                "the write was accepted but its durability is unknown (fsync failed); \
                 retry only with an idempotency key on a dedup queue",
            ),
        }
    }
}

impl From<ReadError> for ApiError {
    fn from(e: ReadError) -> ApiError {
        tracing::error!(error = %e, "storage error while answering a request");
        ApiError::unavailable("storage error: the spool could not read a record")
    }
}

fn queue_not_found(message: String) -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "queue_not_found", message)
}

fn conflict(kind: &'static str, message: String) -> ApiError {
    ApiError::new(StatusCode::CONFLICT, kind, message)
}

impl From<SendError> for ApiError {
    fn from(e: SendError) -> ApiError {
        let message = e.to_string();
        match e {
            SendError::QueueNotFound { .. } => queue_not_found(message),
            // The contract gives sends to a failure queue 409 but names no
            // kind (see README).
            SendError::FailureQueue { .. } => conflict("failure_queue", message),
            SendError::KeyWithoutWindow { .. } => ApiError::bad_request(message),
            SendError::SpoolFull { .. } => ApiError {
                retry_after_secs: Some(5),
                ..ApiError::new(StatusCode::INSUFFICIENT_STORAGE, "spool_full", message)
            },
            SendError::Write(w) => w.into(),
        }
    }
}

impl From<LeaseError> for ApiError {
    fn from(e: LeaseError) -> ApiError {
        let message = e.to_string();
        match e {
            LeaseError::QueueNotFound { .. } => queue_not_found(message),
            LeaseError::NotPullQueue { .. } => conflict("not_pull_queue", message),
            LeaseError::NotPushQueue { .. } => conflict("not_push_queue", message),
            LeaseError::NotPrimary => ApiError::unavailable(message),
        }
    }
}

impl From<SettleError> for ApiError {
    fn from(e: SettleError) -> ApiError {
        let message = e.to_string();
        match e {
            SettleError::BadToken => ApiError::bad_request(message),
            SettleError::StaleLease => conflict("stale_lease", message),
            SettleError::QueueNotFound { .. } => queue_not_found(message),
            SettleError::Read(r) => r.into(),
            SettleError::Write(w) => w.into(),
        }
    }
}

impl From<MessageError> for ApiError {
    fn from(e: MessageError) -> ApiError {
        let message = e.to_string();
        match e {
            MessageError::QueueNotFound { .. } => queue_not_found(message),
            MessageError::MessageNotFound { .. } => {
                ApiError::new(StatusCode::NOT_FOUND, "message_not_found", message)
            }
            MessageError::NotAFailureQueue { .. } => ApiError::bad_request(message),
            MessageError::NotDelayed { .. } => conflict("message_not_delayed", message),
            MessageError::Read(r) => r.into(),
            MessageError::Write(w) => w.into(),
        }
    }
}

impl From<QueueError> for ApiError {
    fn from(e: QueueError) -> ApiError {
        let message = e.to_string();
        match e {
            QueueError::NotFound { .. } => queue_not_found(message),
            QueueError::Rule(QueueRuleError::Destination(_)) => ApiError::forbidden(message),
            QueueError::Rule(QueueRuleError::Settings(s)) => {
                ApiError::bad_request(s.describe(Naming::Json))
            }
            QueueError::Rule(rule) => ApiError::bad_request(rule.to_string()),
            QueueError::ManagedByConfig { .. } => conflict("queue_managed_by_config", message),
            QueueError::LimitReached { .. } => conflict("queue_limit_reached", message),
            QueueError::FailureQueue { .. } => conflict("failure_queue", message),
            QueueError::NotAFailureQueue { .. } => ApiError::bad_request(message),
            QueueError::NotPushQueue { .. } => conflict("not_push_queue", message),
            QueueError::Write(w) => w.into(),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = super::openapi::ErrorBody {
            kind: self.kind,
            message: &self.message,
        };
        let mut response = (self.status, axum::Json(body)).into_response();
        if let Some(secs) = self.retry_after_secs {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::KINDS;

    /// The first string literal after each `call` in `text`.
    fn literals_after<'a>(text: &'a str, call: &str) -> Vec<&'a str> {
        text.match_indices(call)
            .filter_map(|(at, _)| {
                let rest = &text[at + call.len()..];
                let open = rest.find('"')?;
                // A literal among the call's first arguments, not a later one.
                (open < 120).then_some(())?;
                let rest = &rest[open + 1..];
                Some(&rest[..rest.find('"')?])
            })
            .filter(|l| !l.is_empty() && l.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'))
            .collect()
    }

    /// Every kind the API code names is listed in `KINDS`, so that the
    /// OpenAPI document's enum is whole.
    #[test]
    fn every_kind_is_listed() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/src/api");
        let mut named = Vec::new();
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path).unwrap();
                named.extend(
                    literals_after(&text, "ApiError::new(")
                        .into_iter()
                        .chain(literals_after(&text, "conflict("))
                        .map(str::to_string),
                );
            }
        }
        assert!(named.len() > 20, "{named:?}");
        for kind in &named {
            assert!(
                KINDS.contains(&kind.as_str()),
                "{kind} is missing from KINDS"
            );
        }
    }
}
