//! API keys: every `/v1` route needs one when keys are configured, checked
//! before anything else so that an unauthenticated caller never learns
//! whether a queue exists.
//!
//! `Authorization: Bearer <key>` and `Spooler-Api-Key: <key>` both count,
//! except on `/v1/forward`, where `Authorization` belongs to the destination:
//! there only `Spooler-Api-Key` counts (and it is never stored). Keys are
//! compared in constant time and never logged.

use std::sync::Arc;

use axum::extract::Request;
use axum::http::header;
use subtle::ConstantTimeEq;

use super::error::ApiError;

/// True if `presented` is one of `keys`. Every key is compared, so the time
/// taken does not tell which one matched.
pub(crate) fn key_matches(keys: &[String], presented: &str) -> bool {
    keys.iter()
        .fold(subtle::Choice::from(0), |found, k| {
            found | k.as_bytes().ct_eq(presented.as_bytes())
        })
        .into()
}

/// The key a request presented (`None`: none), kept with it: a stream or
/// long poll it opened ends once a reload no longer accepts it
/// (`AppState::revoked`).
#[derive(Debug, Clone, Default)]
pub(crate) struct Presented(pub(crate) Option<Arc<str>>);

impl Presented {
    /// Whether `keys` (the keys in force) still let it in.
    pub(crate) fn accepted_by(&self, keys: &[String]) -> bool {
        keys.is_empty() || self.0.as_deref().is_some_and(|k| key_matches(keys, k))
    }
}

/// Whether `request` may pass: anything outside `/v1` and `/metrics` (the
/// probes, the console's page) does, and so does everything when no keys
/// are configured. `/metrics` on the API port lists every queue; the
/// metrics listener (`server.metrics_listen`) serves it without a key.
/// What it presented, for the handler.
pub(crate) fn check_key(keys: &[String], request: &Request) -> Result<Presented, ApiError> {
    let path = request.uri().path();
    let guarded = path == "/v1" || path.starts_with("/v1/") || path == "/metrics";
    if !guarded {
        return Ok(Presented::default());
    }
    let forward = path.starts_with("/v1/forward/") || path == "/v1/forward";
    let headers = request.headers();
    let api_key = headers.get("spooler-api-key").and_then(|v| v.to_str().ok());
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let presented = if forward { api_key } else { api_key.or(bearer) };
    let presented = Presented(presented.map(|k| Arc::from(k.trim())));
    if presented.accepted_by(keys) {
        Ok(presented)
    } else {
        Err(ApiError::unauthorized())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_match_exactly() {
        let keys = vec!["alpha".to_string(), "beta-key".to_string()];
        assert!(key_matches(&keys, "alpha"));
        assert!(key_matches(&keys, "beta-key"));
        assert!(!key_matches(&keys, "alph"));
        assert!(!key_matches(&keys, "alphaa"));
        assert!(!key_matches(&keys, ""));
        assert!(!key_matches(&[], "alpha"));
    }
}
