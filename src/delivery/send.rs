//! One delivery attempt's request, as the queue's settings and the
//! stored message make it (docs/contract.md §3, §5: headers, signature,
//! delivery id), sent the direct way (`direct.rs`) or through reqwest's
//! pool (`client.rs`).

use std::time::{Duration, Instant};

use bytes::Bytes;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use reqwest::{Client, Method, Url};

use super::answer::{Answer, RESPONSE_KEPT_BYTES, SendError, refused, with_sources};
use super::shared::QueueShared;
use super::signing::signature_header;
use crate::engine::PushDelivery;
use crate::metrics::AttemptClass;

/// Connects refused by an origin that this node floods, tried again
/// within one attempt (`hosts.rs`), the first after
/// [`FLOOD_RETRY_FIRST`], each next after twice as long (jittered).
const FLOOD_RETRIES: u32 = 5;
const FLOOD_RETRY_FIRST: Duration = Duration::from_millis(25);

/// Sends the request of one delivery (`id`: its external id); a connect
/// its origin refused while this node floods it is tried again soon
/// (`hosts.rs`), at most [`FLOOD_RETRIES`] times and within the queue's
/// timeout, so that it neither waits out the backoff nor counts towards
/// the breaker. The origin hears of every answer.
pub(super) async fn send_through_flood(
    shared: &QueueShared,
    d: &PushDelivery,
    id: &str,
) -> Result<Answer, SendError> {
    let started = Instant::now();
    let timeout = Duration::from_millis(shared.settings.timeout_ms.max(1));
    let (mut pause, mut tried) = (FLOOD_RETRY_FIRST, 0);
    loop {
        let sent = send(shared, d, id).await;
        let flooded = match &sent {
            Ok(_) => {
                shared.origin.answered();
                false
            }
            Err(e) => e.refused && tried < FLOOD_RETRIES && shared.origin.flooded(),
        };
        if !flooded {
            return sent;
        }
        let jittered = pause.mul_f64(0.5 + rand::random::<f64>());
        if started.elapsed() + jittered >= timeout {
            return sent;
        }
        crate::metrics::record_flood_retry();
        tokio::time::sleep(jittered).await;
        (pause, tried) = (pause * 2, tried + 1);
    }
}

/// Sends the request of one delivery (`id`: its external id).
async fn send(shared: &QueueShared, d: &PushDelivery, id: &str) -> Result<Answer, SendError> {
    let settings = &shared.settings;
    let request = d.payload.request.as_ref();
    let url = shared
        .destination
        .as_ref()
        .map_err(Clone::clone)
        .and_then(|destination| destination.target(request))
        .map_err(|e| e.to_string())?;
    let method = match request {
        Some(r) => Method::from_bytes(r.method.as_bytes()).map_err(|e| format!("method: {e}"))?,
        None => Method::POST,
    };
    let mut headers = request_headers(shared, d);
    spooler_headers(&mut headers, shared, d, id);
    let now_ms = shared.engine_now_ms();
    if let Some(secrets) = settings.signing_secrets(now_ms) {
        let timestamp = now_ms.div_euclid(1000);
        let signature = signature_header(&secrets, id, timestamp, &d.payload.body)
            .map_err(|e| e.to_string())?;
        put(&mut headers, WEBHOOK_ID, id);
        headers.insert(WEBHOOK_TIMESTAMP, HeaderValue::from(timestamp));
        put(&mut headers, WEBHOOK_SIGNATURE, &signature);
    }
    let body = d.payload.body.clone();
    let timeout = Duration::from_millis(settings.timeout_ms.max(1));
    match &shared.direct {
        Some(direct) => direct.send(method, &url, headers, body, timeout).await,
        None => through_pool(&shared.client, method, url, headers, body, timeout).await,
    }
}

/// Room for spoold's own headers of one attempt (`spooler_headers`, the
/// signature's three and those `direct.rs` adds), so that a request's map
/// is allocated once.
const OWN_HEADERS: usize = 16;

/// The headers of the stored request (those that are valid), or else the
/// payload's content type; then the queue's static headers over them.
fn request_headers(shared: &QueueShared, d: &PushDelivery) -> HeaderMap {
    let request = d.payload.request.as_ref();
    let stored = request.map_or(1, |r| r.headers.len());
    let mut headers = HeaderMap::with_capacity(stored + shared.static_headers.len() + OWN_HEADERS);
    if let Some(r) = request {
        for (name, value) in &r.headers {
            if let (Ok(n), Ok(v)) = (
                HeaderName::from_bytes(name.as_bytes()),
                HeaderValue::from_str(value),
            ) {
                headers.append(n, v);
            }
        }
    } else if let Ok(v) = HeaderValue::from_str(&d.payload.content_type) {
        headers.insert(reqwest::header::CONTENT_TYPE, v);
    }
    for (name, value) in &shared.static_headers {
        headers.insert(name, value.clone());
    }
    headers
}

// spoold's own headers (docs/contract.md §3), made once: a name from a
// `&str` would be parsed, and a custom one copied, on every attempt.
const DELIVERY_ID: HeaderName = HeaderName::from_static("spooler-delivery-id");
const RETRY_COUNT: HeaderName = HeaderName::from_static("spooler-retry-count");
const HOPS: HeaderName = HeaderName::from_static("spooler-hops");
const TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");
const RESENT_FROM: HeaderName = HeaderName::from_static("spooler-resent-from");
const ORDERING_KEY: HeaderName = HeaderName::from_static("spooler-ordering-key");
const EVENT_TYPE: HeaderName = HeaderName::from_static("spooler-event-type");
const EVENT_ID: HeaderName = HeaderName::from_static("spooler-event-id");
const TENANT: HeaderName = HeaderName::from_static("spooler-tenant");
const WEBHOOK_ID: HeaderName = HeaderName::from_static("webhook-id");
const WEBHOOK_TIMESTAMP: HeaderName = HeaderName::from_static("webhook-timestamp");
const WEBHOOK_SIGNATURE: HeaderName = HeaderName::from_static("webhook-signature");

/// Adds spoold's own headers (docs/contract.md §3): the delivery id
/// (`id`), its retry count and hops, the trace, and what the message is
/// (a resend, its ordering key, an event's type, id and tenant).
fn spooler_headers(headers: &mut HeaderMap, shared: &QueueShared, d: &PushDelivery, id: &str) {
    put(headers, DELIVERY_ID, id);
    headers.insert(RETRY_COUNT, small_number(d.retry_count));
    // One spoold delivery more than the message came through: a spoold
    // that receives it counts on (`api/hops.rs`).
    headers.insert(
        HOPS,
        small_number(u32::from(d.payload.hops.saturating_add(1))),
    );
    if let Some(trace) = crate::telemetry::outgoing(d.payload.trace.as_deref()) {
        put(headers, TRACEPARENT, &trace);
    }
    if let Some(from) = d.payload.resent_from {
        let from = shared.engine.tokens().format_id(from);
        put(headers, RESENT_FROM, &from);
    }
    if let Some(key) = &d.payload.ordering_key {
        put(headers, ORDERING_KEY, key);
    }
    if let Some(event) = &d.payload.event {
        put(headers, EVENT_TYPE, &event.event_type);
        let event_id = shared.engine.tokens().format_id(event.id);
        put(headers, EVENT_ID, &event_id);
        if let Some(tenant) = &event.tenant {
            put(headers, TENANT, tenant);
        }
    }
}

/// `n` as a header value: those under ten (almost every retry count and
/// hop count) from a table, without allocating.
fn small_number(n: u32) -> HeaderValue {
    const DIGITS: [&str; 10] = ["0", "1", "2", "3", "4", "5", "6", "7", "8", "9"];
    match DIGITS.get(n as usize) {
        Some(digit) => HeaderValue::from_static(digit),
        None => HeaderValue::from(n),
    }
}

/// Sets header `name` to `value`, unless `value` is not a valid one.
fn put(headers: &mut HeaderMap, name: HeaderName, value: &str) {
    if let Ok(v) = HeaderValue::from_str(value) {
        headers.insert(name, v);
    }
}

/// Sends a request through reqwest's pooled client (`client.rs`).
async fn through_pool(
    client: &Client,
    method: Method,
    url: Url,
    headers: HeaderMap,
    body: Bytes,
    timeout: Duration,
) -> Result<Answer, SendError> {
    let response = client
        .request(method, url)
        .timeout(timeout)
        .headers(headers)
        .body(body)
        .send()
        .await
        .map_err(describe)?;
    let status = response.status().as_u16();
    let retry_after = response
        .headers()
        .get(reqwest::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let mut body = Vec::new();
    let mut response = response;
    while body.len() < RESPONSE_KEPT_BYTES {
        match response.chunk().await {
            Ok(Some(chunk)) => body.extend_from_slice(&chunk),
            _ => break,
        }
    }
    body.truncate(RESPONSE_KEPT_BYTES);
    Ok(Answer {
        status,
        retry_after,
        body: String::from_utf8_lossy(&body).into_owned(),
    })
}

/// A transport error as one line: timeout, connect, DNS, TLS, …. Without
/// the URL: its query string may carry a credential (`?access_token=…`).
fn describe(e: reqwest::Error) -> SendError {
    let e = e.without_url();
    let (class, kind) = if e.is_timeout() {
        (AttemptClass::Timeout, "timeout")
    } else if e.is_connect() {
        (AttemptClass::Connect, "connect error")
    } else if e.is_request() {
        (AttemptClass::Error, "request error")
    } else {
        (AttemptClass::Error, "error")
    };
    let text = format!("{kind}: {}", with_sources(&e));
    let refused = e.is_connect() && refused(&e);
    SendError {
        class,
        text,
        refused,
    }
}
