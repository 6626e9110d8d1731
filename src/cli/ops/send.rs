//! `spoold send QUEUE`: one message into a queue
//! (`POST /v1/queues/{q}/messages`).

use reqwest::Method;

use super::client::{OpsError, Target};
use super::message::Stored;

/// `spoold send QUEUE`: sends `body`; returns the new message's id.
pub async fn send(
    target: &Target,
    queue: &str,
    body: Vec<u8>,
    content_type: &str,
    key: Option<&str>,
) -> Result<String, OpsError> {
    let mut request = target
        .request(Method::POST, &format!("/v1/queues/{queue}/messages"))
        .header("Content-Type", content_type)
        .body(body);
    if let Some(k) = key {
        request = request.header("Idempotency-Key", k);
    }
    let stored: Stored = target.answer(request).await?;
    Ok(stored.id)
}
