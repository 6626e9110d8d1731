//! Portal sessions (docs/contract.md §4, "The portal"): a short-lived token
//! that a portal link carries, standing for one tenant's customer.
//!
//! A token is `spt_` + the claims (JSON, base64url) + `.` + their
//! HMAC-SHA256 under a key derived from `portal.secret`. Nothing is
//! stored: every replica that holds the secret accepts the token, and a
//! restart keeps it. A token that is altered, signed with another secret
//! or past its end is refused as no key at all (`401`).

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, KeyInit, Mac};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::scope::{Grant, Verb};

/// How every session token begins: a key never does (keys are checked by
/// digest, tokens by signature).
pub(crate) const TOKEN_PREFIX: &str = "spt_";

/// What a session may do, as the portal offers it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Capability {
    /// See endpoints, deliveries and the catalogue.
    Read,
    /// Add, change, pause, delete endpoints; rotate secrets; resend.
    Manage,
    /// Send test events.
    Publish,
}

impl Capability {
    pub(crate) const ALL: [Capability; 3] =
        [Capability::Read, Capability::Manage, Capability::Publish];

    fn verb(self) -> Verb {
        match self {
            Capability::Read => Verb::Read,
            Capability::Manage => Verb::Manage,
            Capability::Publish => Verb::Publish,
        }
    }
}

/// What a token says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Claims {
    #[serde(rename = "t")]
    pub tenant: String,
    #[serde(rename = "c")]
    pub capabilities: Vec<Capability>,
    /// Queue-name globs; empty: every queue of the tenant.
    #[serde(rename = "q", default, skip_serializing_if = "Vec::is_empty")]
    pub queues: Vec<String>,
    /// When it ends, in seconds since the Unix epoch.
    #[serde(rename = "e")]
    pub expires: u64,
    /// Makes two sessions asked for at once two tokens.
    #[serde(rename = "n")]
    pub nonce: u64,
}

impl Claims {
    /// What the session may do: its capabilities, on its tenant's queues.
    pub(crate) fn grant(&self) -> Grant {
        let verbs: Vec<Verb> = self.capabilities.iter().map(|c| c.verb()).collect();
        Grant::of(&verbs, Some(self.tenant.clone()), self.queues.clone())
    }
}

/// Signs and checks tokens with one secret.
pub(crate) struct Sessions {
    key: Hmac<Sha256>,
}

impl std::fmt::Debug for Sessions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Sessions(..)")
    }
}

impl Sessions {
    pub(crate) fn new(secret: &str) -> Sessions {
        // A key of its own, so that the secret signs nothing else.
        let derived = Sha256::new()
            .chain_update(b"spoold portal session v1\0")
            .chain_update(secret.as_bytes())
            .finalize();
        Sessions {
            key: Hmac::<Sha256>::new_from_slice(&derived).expect("HMAC takes any key"),
        }
    }

    pub(crate) fn sign(&self, claims: &Claims) -> String {
        let body = URL_SAFE_NO_PAD.encode(serde_json::to_vec(claims).expect("claims serialize"));
        let mut mac = self.key.clone();
        mac.update(body.as_bytes());
        let tag = URL_SAFE_NO_PAD.encode(mac.finalize().into_bytes());
        format!("{TOKEN_PREFIX}{body}.{tag}")
    }

    /// The claims of `token` if this secret signed it and it has not
    /// ended at `now` (seconds since the Unix epoch).
    pub(crate) fn verify(&self, token: &str, now: u64) -> Option<Claims> {
        let (body, tag) = token.strip_prefix(TOKEN_PREFIX)?.split_once('.')?;
        let tag = URL_SAFE_NO_PAD.decode(tag).ok()?;
        let mut mac = self.key.clone();
        mac.update(body.as_bytes());
        mac.verify_slice(&tag).ok()?;
        let claims: Claims = serde_json::from_slice(&URL_SAFE_NO_PAD.decode(body).ok()?).ok()?;
        (claims.expires > now).then_some(claims)
    }
}

/// Seconds since the Unix epoch, by the system clock.
pub(crate) fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claims() -> Claims {
        Claims {
            tenant: "cus_42".into(),
            capabilities: Capability::ALL.to_vec(),
            queues: vec!["cus_42-*".into()],
            expires: 1_000,
            nonce: 7,
        }
    }

    #[test]
    fn tokens_verify_until_they_end_and_not_when_altered() {
        let sessions = Sessions::new("portal-secret-0123456789");
        let token = sessions.sign(&claims());
        assert_eq!(sessions.verify(&token, 999), Some(claims()));
        assert_eq!(sessions.verify(&token, 1_000), None);
        let other = Sessions::new("another-secret-0123456789");
        assert_eq!(other.verify(&token, 0), None);
        // Any changed character of the claims or the tag is refused.
        for i in TOKEN_PREFIX.len()..token.len() {
            let mut bytes = token.clone().into_bytes();
            bytes[i] = if bytes[i] == b'A' { b'B' } else { b'A' };
            let altered = String::from_utf8(bytes).unwrap();
            if altered != token {
                assert_eq!(sessions.verify(&altered, 0), None, "{altered}");
            }
        }
        assert_eq!(sessions.verify("spt_nonsense", 0), None);
    }
}
