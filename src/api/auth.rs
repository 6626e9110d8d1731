//! API keys: every `/v1` route needs one when keys are configured, checked
//! before anything else so that an unauthenticated caller never learns
//! whether a queue exists.
//!
//! `Authorization: Bearer <key>` and `Spooler-Api-Key: <key>` both count,
//! except on `/v1/forward`, where `Authorization` belongs to the destination:
//! there only `Spooler-Api-Key` counts (and it is never stored). Only each
//! key's SHA-256 is held, a presented key is looked up by its own, and no
//! key is ever logged. What a key may do once in is `scope.rs`'s.

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::Request;
use axum::http::header;

use super::error::ApiError;
use super::scope::Grant;
use super::session::{Sessions, TOKEN_PREFIX};
use crate::config::{ApiKey, key_digest};

/// The keys in force, by their SHA-256: the keys themselves are not kept.
/// A lookup by digest tells nothing of any key by its timing (finding a
/// digest does not find a key).
#[derive(Debug, Default)]
pub(crate) struct Keyring {
    grants: HashMap<[u8; 32], Arc<Grant>>,
}

impl Keyring {
    pub(crate) fn new(keys: &[ApiKey]) -> Keyring {
        Keyring {
            grants: keys
                .iter()
                .map(|k| (k.sha256, Arc::new(Grant::of_key(k))))
                .collect(),
        }
    }

    /// No key configured: every request is let in.
    pub(crate) fn is_open(&self) -> bool {
        self.grants.is_empty()
    }

    /// What the key with `digest` may do now (`None`: no such key).
    fn grant(&self, digest: Option<&[u8; 32]>) -> Option<Arc<Grant>> {
        if self.is_open() {
            return Some(Grant::shared_operator());
        }
        self.grants.get(digest?).cloned()
    }
}

/// The key a request presented, by digest, and what it was granted: a
/// stream or long poll it opened ends once a reload takes the key away or
/// narrows its grant (`AppState::revoked`).
#[derive(Debug, Clone)]
pub(crate) struct Presented {
    digest: Option<[u8; 32]>,
    pub(crate) grant: Arc<Grant>,
    /// A portal session: when it ends (seconds since the Unix epoch).
    pub(crate) session_ends: Option<u64>,
}

impl Default for Presented {
    /// What a request outside `/v1` carries: nothing to revoke.
    fn default() -> Presented {
        Presented {
            digest: None,
            grant: Grant::shared_operator(),
            session_ends: None,
        }
    }
}

impl Presented {
    /// Whether `keys` (the keys in force) still grant all it was granted.
    pub(crate) fn accepted_by(&self, keys: &Keyring) -> bool {
        if let Some(ends) = self.session_ends {
            return super::session::unix_now() < ends;
        }
        keys.grant(self.digest.as_ref())
            .is_some_and(|now| now.covers(&self.grant))
    }
}

/// The key `request` presents, if any.
fn presented_key(request: &Request) -> Option<&str> {
    let path = request.uri().path();
    let forward = path.starts_with("/v1/forward/") || path == "/v1/forward";
    let headers = request.headers();
    let api_key = headers.get("spooler-api-key").and_then(|v| v.to_str().ok());
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    if forward { api_key } else { api_key.or(bearer) }.map(str::trim)
}

/// Whether `request` may pass: anything outside `/v1` and `/metrics` (the
/// probes, the console's page) does, and so does everything when no keys
/// are configured. `/metrics` on the API port lists every queue; the
/// metrics listener (`server.metrics_listen`) serves it without a key.
/// What it presented, and its grant, for the scope check and the handler.
/// A portal session's token (`session.rs`) stands for its tenant whether
/// or not keys are configured, and is refused as a wrong key once it ended
/// or if it was altered.
pub(crate) fn check_key(
    keys: &Keyring,
    sessions: Option<&Sessions>,
    request: &Request,
) -> Result<Presented, ApiError> {
    let path = request.uri().path();
    let guarded = path == "/v1" || path.starts_with("/v1/") || path == "/metrics";
    if !guarded {
        return Ok(Presented::default());
    }
    let presented = presented_key(request);
    if let Some(token) = presented.filter(|k| k.starts_with(TOKEN_PREFIX)) {
        let claims = sessions
            .and_then(|s| s.verify(token, super::session::unix_now()))
            .ok_or_else(ApiError::unauthorized)?;
        return Ok(Presented {
            digest: None,
            grant: Arc::new(claims.grant()),
            session_ends: Some(claims.expires),
        });
    }
    let digest = presented.map(key_digest);
    match keys.grant(digest.as_ref()) {
        Some(grant) => Ok(Presented {
            digest,
            grant,
            session_ends: None,
        }),
        None => Err(ApiError::unauthorized()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ApiKeyEntry;

    fn keyring(keys: &[&str]) -> Keyring {
        let keys: Vec<ApiKey> = keys
            .iter()
            .map(|k| ApiKeyEntry::from(*k).resolve())
            .collect();
        Keyring::new(&keys)
    }

    #[test]
    fn keys_match_exactly() {
        let keys = keyring(&["alpha", "beta-key"]);
        let found = |k: &str| keys.grant(Some(&key_digest(k))).is_some();
        assert!(found("alpha"));
        assert!(found("beta-key"));
        assert!(!found("alph"));
        assert!(!found("alphaa"));
        assert!(!found(""));
        assert!(keys.grant(None).is_none());
        assert!(keyring(&[]).grant(None).is_some());
    }
}
