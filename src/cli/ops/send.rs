//! `spoold send QUEUE`: one message into a queue
//! (`POST /v1/queues/{q}/messages`).

use reqwest::Method;

use super::client::{OpsError, Target};
use super::message::Stored;

/// The keys a send or an event may carry.
#[derive(Debug, Clone, Copy, Default)]
pub struct Keys<'a> {
    /// `Idempotency-Key`.
    pub idempotency: Option<&'a str>,
    /// `Spooler-Ordering-Key` (docs/contract.md §2).
    pub ordering: Option<&'a str>,
}

impl Keys<'_> {
    /// `request` with a header for each key given.
    pub(super) fn on(self, mut request: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        if let Some(k) = self.idempotency {
            request = request.header("Idempotency-Key", k);
        }
        if let Some(k) = self.ordering {
            request = request.header("Spooler-Ordering-Key", k);
        }
        request
    }
}

/// `spoold send QUEUE`: sends `body`; returns the new message's id.
pub async fn send(
    target: &Target,
    queue: &str,
    body: Vec<u8>,
    content_type: &str,
    keys: Keys<'_>,
) -> Result<String, OpsError> {
    let request = target
        .request(Method::POST, &format!("/v1/queues/{queue}/messages"))
        .header("Content-Type", content_type)
        .body(body);
    let request = keys.on(request);
    let stored: Stored = target.answer(request).await?;
    Ok(stored.id)
}
