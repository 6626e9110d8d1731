//! Standard Webhooks signing: `webhook-id`, `webhook-timestamp` and
//! `webhook-signature: v1,<base64 HMAC-SHA256 of "id.timestamp.body">`.
//!
//! A `whsec_` secret is the base64 of the key bytes; any other secret is
//! used as its UTF-8 bytes. `signing_secret` may hold several secrets
//! separated by spaces (rotation): each gives a signature, space-separated.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

/// A `whsec_` secret that is not base64 after its prefix: the engine
/// refuses one when it is set, so a stored one predates that rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a whsec_ secret must be base64 after the prefix: {0}")]
pub(crate) struct SigningError(base64::DecodeError);

/// The key bytes of one secret.
pub(crate) fn key_bytes(secret: &str) -> Result<Vec<u8>, SigningError> {
    match secret.strip_prefix("whsec_") {
        Some(b64) => STANDARD.decode(b64).map_err(SigningError),
        None => Ok(secret.as_bytes().to_vec()),
    }
}

/// `v1,<signature>` for one key.
fn sign_with(key: &[u8], id: &str, timestamp: i64, body: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes any key");
    mac.update(id.as_bytes());
    mac.update(b".");
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    format!("v1,{}", STANDARD.encode(mac.finalize().into_bytes()))
}

/// The `webhook-signature` header value for every secret in `secrets`.
pub(crate) fn signature_header(
    secrets: &str,
    id: &str,
    timestamp: i64,
    body: &[u8],
) -> Result<String, SigningError> {
    let mut out = Vec::new();
    for secret in secrets.split_whitespace() {
        out.push(sign_with(&key_bytes(secret)?, id, timestamp, body));
    }
    Ok(out.join(" "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_standard_webhooks_test_vector() {
        let header = signature_header(
            "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
            "msg_p5jXN8AQM9LWM0D4loKWxJek",
            1_614_265_330,
            br#"{"test": 2432232314}"#,
        )
        .unwrap();
        assert_eq!(header, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=");
    }

    #[test]
    fn rotation_signs_with_every_secret_and_plain_secrets_are_bytes() {
        let header = signature_header(
            "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw plain",
            "id",
            1,
            b"x",
        )
        .unwrap();
        let parts: Vec<&str> = header.split(' ').collect();
        assert_eq!(parts.len(), 2);
        assert!(parts.iter().all(|p| p.starts_with("v1,")));
        assert_eq!(parts[1], sign_with(b"plain", "id", 1, b"x"));
        assert!(signature_header("whsec_!!!", "id", 1, b"x").is_err());
    }
}
