//! `spoold events send TYPE`: one event (`POST /v1/events`), written once
//! and enqueued to every queue that subscribes to its type.

use std::io::Write;

use reqwest::Method;
use serde::Deserialize;
use serde_json::Value;

use super::client::{OpsError, Target};
use super::json_lines;
use crate::cli::term::Terminal;

/// An event as `spoold events send` publishes it.
pub struct Event<'a> {
    pub event_type: &'a str,
    pub tenant: Option<&'a str>,
    pub payload: Vec<u8>,
    pub content_type: &'a str,
    pub keys: super::Keys<'a>,
}

/// The answer: the event's id and one message per subscribing queue.
#[derive(Deserialize)]
struct Published {
    id: String,
    deliveries: Vec<Delivery>,
}

#[derive(Deserialize)]
struct Delivery {
    queue: String,
    /// The message's id in `queue`.
    id: String,
}

/// `spoold events send TYPE`: publishes `event` (its payload as is, with
/// its type and tenant in headers); prints the event's id, then each
/// delivery as `QUEUE ID` (with `json`, the answer as one line).
pub async fn events_send(
    target: &Target,
    event: Event<'_>,
    json: bool,
    out: &mut Terminal<impl Write>,
) -> Result<(), OpsError> {
    let mut request = target
        .request(Method::POST, "/v1/events")
        .header("Spooler-Event-Type", event.event_type)
        .header("Content-Type", event.content_type)
        .body(event.payload);
    if let Some(tenant) = event.tenant {
        request = request.header("Spooler-Tenant", tenant);
    }
    let request = event.keys.on(request);
    let answer: Value = target.answer(request).await?;
    if json {
        return json_lines(out, &[answer]);
    }
    let published: Published = target.decode(answer)?;
    writeln!(out, "{}", published.id)?;
    for d in &published.deliveries {
        writeln!(out, "{} {}", d.queue, d.id)?;
    }
    Ok(())
}
