//! The HTTP error body: `{"kind": "<snake_case>", "message": "…"}` with the
//! spec's statuses. Every failure of every route goes through [`ApiError`],
//! so internals (paths, OS errors) never leak into an answer.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::engine::{ConflictKind, EngineError};

/// One error answer.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub kind: &'static str,
    pub message: String,
    /// Seconds for a `Retry-After` header.
    pub retry_after_secs: Option<u64>,
}

impl ApiError {
    pub fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            kind,
            message: message.into(),
            retry_after_secs: None,
        }
    }

    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "bad_request", message)
    }

    pub fn unauthorized() -> ApiError {
        ApiError::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "a valid API key is required (Authorization: Bearer <key> or Spooler-Api-Key)",
        )
    }

    pub fn forbidden(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::FORBIDDEN, "forbidden", message)
    }

    pub fn not_found() -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such route")
    }

    pub fn method_not_allowed() -> ApiError {
        ApiError::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
            "this route does not take that method",
        )
    }

    pub fn payload_too_large(limit: u64) -> ApiError {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
            format!("the body is larger than server.max_body_bytes ({limit} bytes)"),
        )
    }

    pub fn unavailable(message: impl Into<String>) -> ApiError {
        ApiError {
            retry_after_secs: Some(1),
            ..ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", message)
        }
    }
}

impl From<EngineError> for ApiError {
    fn from(e: EngineError) -> ApiError {
        let message = e.to_string();
        match e {
            EngineError::QueueNotFound { .. } => {
                ApiError::new(StatusCode::NOT_FOUND, "queue_not_found", message)
            }
            EngineError::MessageNotFound { .. } => {
                ApiError::new(StatusCode::NOT_FOUND, "message_not_found", message)
            }
            EngineError::StaleLease => ApiError::new(StatusCode::CONFLICT, "stale_lease", message),
            EngineError::BadToken | EngineError::BadRequest(_) => ApiError::bad_request(message),
            EngineError::Conflict { kind, .. } => {
                let kind = match kind {
                    ConflictKind::NotPullQueue => "not_pull_queue",
                    ConflictKind::NotPushQueue => "not_push_queue",
                    ConflictKind::ManagedByConfig => "queue_managed_by_config",
                    // Sends, PUT and DELETE on a failure queue: the spec
                    // gives them 409 but names no kind (see README).
                    ConflictKind::FailureQueue => "failure_queue",
                };
                ApiError::new(StatusCode::CONFLICT, kind, message)
            }
            EngineError::SpoolFull { .. } => ApiError {
                retry_after_secs: Some(5),
                ..ApiError::new(StatusCode::INSUFFICIENT_STORAGE, "spool_full", message)
            },
            EngineError::Unavailable { .. } => ApiError::unavailable(message),
            EngineError::Unconfirmed { .. } => ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "operation_unconfirmed",
                "the write was accepted but its durability is unknown (fsync failed); \
                 retry only with an idempotency key on a dedup queue",
            ),
            EngineError::Journal(inner) => {
                tracing::error!(error = %inner, "storage error while answering a request");
                ApiError::unavailable("storage error: the spool could not read a record")
            }
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({ "kind": self.kind, "message": self.message });
        let mut response = (self.status, axum::Json(body)).into_response();
        if let Some(secs) = self.retry_after_secs {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        response
    }
}
