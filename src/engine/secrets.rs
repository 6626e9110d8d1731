//! Signing-secret rotation (docs/contract.md §5, "Secret rotation"): a new
//! secret signs from now on, and the one it replaced signs beside it until
//! its overlap ends; the timer then journals its end
//! (`spool/state/timers.rs`, `Command::SecretExpire`).

use std::borrow::Cow;

use super::Engine;
use super::error::QueueError;
use super::rules::{self, Origin};
use crate::spool::queue::FAILED_SUFFIX;
use crate::spool::{Command, PreviousSecret};
use crate::time::Millis;

/// What a rotation did: the new secret (shown once), how many secrets
/// sign now, and when the replaced one stops.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rotation {
    pub secret: String,
    pub signing_secrets: usize,
    pub previous_expires_at: Option<Millis>,
}

/// A new Standard Webhooks secret: `whsec_` and the base64 of 32 random
/// bytes (what Svix generates).
pub(crate) fn new_secret() -> String {
    use base64::Engine as _;
    let key: [u8; 32] = rand::random();
    format!(
        "whsec_{}",
        base64::engine::general_purpose::STANDARD.encode(key)
    )
}

impl Engine {
    /// Rotates the signing secret of push queue `name`: `secret` (or a
    /// new one) signs from now on; the secret it replaces (if any) signs
    /// beside it for `overlap_ms` (0: it goes at once). A secret an
    /// earlier rotation left signing goes at once: at most two sign.
    pub async fn rotate_secret(
        &self,
        name: &str,
        secret: Option<String>,
        overlap_ms: u64,
    ) -> Result<Rotation, QueueError> {
        let secret = secret.unwrap_or_else(new_secret);
        let mut rotation = None;
        self.write_done(|core, now| {
            let q = core
                .spool
                .queue(name)
                .filter(|_| !name.ends_with(FAILED_SUFFIX));
            let q = q.ok_or_else(|| QueueError::NotFound {
                queue: name.to_owned(),
            })?;
            if q.managed_by_config {
                return Err(QueueError::ManagedByConfig {
                    queue: name.to_owned(),
                });
            }
            if !q.settings.is_push() {
                return Err(QueueError::NotPushQueue {
                    queue: name.to_owned(),
                });
            }
            let mut settings = (*q.settings).clone();
            let replaced = settings.signing_secret.replace(secret.clone());
            settings.previous_secret =
                replaced
                    .filter(|_| overlap_ms > 0)
                    .map(|previous| PreviousSecret {
                        secret: previous,
                        expires_at: now.saturating_add(overlap_ms as i64),
                    });
            rules::check(name, &settings, Origin::Api, &self.inner.policy)?;
            rotation = Some(Rotation {
                secret: secret.clone(),
                signing_secrets: settings.signing_secret_count(now),
                previous_expires_at: settings.previous_secret.as_ref().map(|p| p.expires_at),
            });
            Ok(Command::QueueUpsert {
                name: Cow::Owned(name.to_owned()),
                settings: Box::new(settings),
                managed_by_config: false,
            })
        })
        .await?;
        Ok(rotation.expect("set by the write"))
    }
}
