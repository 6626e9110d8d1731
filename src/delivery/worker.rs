//! Delivery for one push queue: a dispatcher leases messages while a slot
//! of `concurrency` is free and starts one task per delivery (send the
//! request, settle by the outcome; docs/contract.md §3, §5); and the circuit breaker.
//! An idle queue costs one waiting task, whatever its `concurrency`.

use std::num::NonZeroU32;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime};

use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use reqwest::{Client, Method};
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinSet;
use tracing::Instrument;

use super::backoff::{delay_ms, retry_after_ms};
use super::signing::signature_header;
use super::target::Destination;
use crate::engine::settle::{
    Outcome, PROBE_INTERVAL_FIRST, PROBE_INTERVAL_MAX, SettleWait, Settled,
};
use crate::engine::{Engine, LeaseError, PushDelivery};
use crate::metrics::{AttemptClass, DeliveryMetrics, DeliveryOutcome};
use crate::spool::QueueSettings;
use crate::spool::command::AttemptInfo;
use crate::spool::queue::static_header_refusal;
use crate::spool::state::BreakerTurn;

/// How much of a response body an attempt keeps.
const RESPONSE_KEPT_BYTES: usize = 1024;
/// How often a follower's dispatcher looks whether its replica became the
/// primary (replicated mode): a new primary delivers this soon after it
/// serves.
const NOT_PRIMARY_WAIT: Duration = Duration::from_millis(100);
/// How long the dispatcher's lease waits for a message before it asks to
/// sleep (it ends if its queue is empty). The engine wakes it when one
/// arrives or becomes visible, and a stop ends the wait.
const LEASE_WAIT: Duration = Duration::from_secs(5);
/// Most messages the dispatcher leases in one call.
const LEASE_BATCH_MAX: usize = 64;

/// What every worker of one queue shares.
pub(crate) struct QueueShared {
    pub engine: Engine,
    pub queue: String,
    pub settings: QueueSettings,
    /// `settings.destination`, parsed once.
    destination: Result<Destination, String>,
    pub client: Client,
    limiter: Option<DefaultDirectRateLimiter>,
    metrics: DeliveryMetrics,
    /// Whether this pool's probe task runs. The breaker itself (failures
    /// in a row, when it probes) is the engine's (`Engine::breaker`): the
    /// settle that fails once too often opens it, an operator closes it or
    /// asks for a probe now through the API, and a pool that replaces this
    /// one (settings changed) finds it open and probes with its own
    /// settings.
    probing: AtomicBool,
    /// The pool's stop: set when the queue's settings change or the
    /// server stops.
    stop: watch::Receiver<bool>,
    /// Header names whose values are secrets (lower case): the contract's
    /// (`Authorization`, `Cookie`, …) and `server.redact_headers`. Their
    /// values are scrubbed from what an attempt records.
    secret_headers: Arc<Vec<String>>,
}

/// Header names whose values never appear in what an attempt records.
const SECRET_HEADERS: &[&str] = &[
    "authorization",
    "proxy-authorization",
    "cookie",
    "spooler-api-key",
];

impl QueueShared {
    pub(crate) fn new(
        engine: Engine,
        queue: String,
        settings: QueueSettings,
        client: Client,
        redact_headers: Arc<Vec<String>>,
        stop: watch::Receiver<bool>,
    ) -> Arc<QueueShared> {
        let limiter = settings.rate_limit.and_then(|per_second| {
            // Whole requests per second, at least one; fractional rates
            // become one request per 1/rate seconds.
            let quota = if per_second >= 1.0 {
                Quota::per_second(NonZeroU32::new(per_second.round() as u32)?)
            } else {
                Quota::with_period(Duration::from_secs_f64(1.0 / per_second))?
            };
            Some(RateLimiter::direct(quota))
        });
        let destination = match &settings.destination {
            Some(d) => Destination::parse(d),
            None => Err("queue has no destination".to_string()),
        };
        Arc::new(QueueShared {
            engine,
            destination,
            metrics: DeliveryMetrics::new(&queue),
            queue,
            settings,
            client,
            limiter,
            probing: AtomicBool::new(false),
            stop,
            secret_headers: redact_headers,
        })
    }

    /// The secret values a delivery carries: those of the stored request's
    /// secret headers and every static header's (static headers are
    /// credentials more often than not). Short ones are left alone: hiding
    /// "1" would garble everything.
    fn secrets(&self, d: &PushDelivery) -> Vec<String> {
        const SECRET_BYTES_MIN: usize = 4;
        let secret_name = |name: &str| {
            let lower = name.to_ascii_lowercase();
            SECRET_HEADERS.contains(&lower.as_str()) || self.secret_headers.contains(&lower)
        };
        let stored = d
            .payload
            .request
            .iter()
            .flat_map(|r| r.headers.iter())
            .filter(|(name, _)| secret_name(name))
            .map(|(_, value)| value);
        stored
            .chain(self.settings.headers.values())
            .flat_map(|value| {
                // A bearer token is also echoed without its scheme.
                let bare = value.split_once(' ').map(|(_, v)| v.to_string());
                std::iter::once(value.clone()).chain(bare)
            })
            .filter(|v| v.len() >= SECRET_BYTES_MIN)
            .collect()
    }
}

/// `text` with every occurrence of a secret replaced by `<redacted>`.
fn scrub(mut text: String, secrets: &[String]) -> String {
    for secret in secrets {
        if text.contains(secret.as_str()) {
            text = text.replace(secret.as_str(), "<redacted>");
        }
    }
    text
}

/// The queue's dispatcher: until `stop`, lease messages whenever
/// `concurrency` slots are free (as many as are free, in one call) and
/// start a worker for each on a task of its own; with `drain`, keep going
/// after `stop` while messages are visible. Then wait for the workers.
///
/// A worker holds its slot while the queue has work: after each delivery
/// it leases the next message itself (without waiting), so a busy queue
/// runs `concurrency` leases in parallel; when nothing is visible it ends
/// and gives its slot back. Nothing waits per slot while the queue is idle.
pub(crate) async fn dispatch(
    shared: Arc<QueueShared>,
    mut stop: watch::Receiver<bool>,
    drain: bool,
) {
    let slots = Arc::new(Semaphore::new(shared.settings.concurrency.max(1) as usize));
    let mut in_flight = JoinSet::new();
    let signal = shared.engine.queue_signal(&shared.queue);
    loop {
        while in_flight.try_join_next().is_some() {}
        let stopping = *stop.borrow();
        if stopping && !drain {
            break;
        }
        if shared.engine.breaker(&shared.queue).is_some() {
            // Armed, then looked at again: a close that comes after the
            // second look wakes the wait below. (Armed only here: an armed
            // waiter takes its share of the queue's wake-ups, which the
            // lease below waits for.)
            let changed = signal.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if shared.engine.breaker(&shared.queue).is_none() {
                continue;
            }
            // The probe task owns the queue until the breaker closes. A
            // pool that finds it open (its settings changed while it was)
            // probes at once, with its own settings.
            if !shared.probing.swap(true, Ordering::AcqRel) {
                shared
                    .engine
                    .set_breaker(&shared.queue, Some(shared.engine_now_ms()));
                tokio::spawn(probe(shared.clone(), stop.clone()));
            }
            tokio::select! {
                _ = stop.changed(), if !stopping => {}
                () = changed => {}
            }
            continue;
        }
        // Wait for one free slot, then take every other free one.
        let first = tokio::select! {
            slot = slots.clone().acquire_owned() => slot.expect("bug: slots closed"),
            _ = stop.changed(), if !stopping => continue,
        };
        let mut free = vec![first];
        while free.len() < LEASE_BATCH_MAX {
            match slots.clone().try_acquire_owned() {
                Ok(slot) => free.push(slot),
                Err(_) => break,
            }
        }
        let mut max = free.len();
        if let Some(limiter) = &shared.limiter {
            // A rate-limited queue leases one at a time, each when due.
            limiter.until_ready().await;
            max = 1;
        }
        let wait = if stopping { Duration::ZERO } else { LEASE_WAIT };
        let leased = tokio::select! {
            leased = shared.engine.lease_for_delivery(&shared.queue, max, wait, false) => leased,
            _ = stop.changed(), if !stopping => continue,
        };
        match leased {
            // Draining and nothing left: done.
            Ok(deliveries) if deliveries.is_empty() && stopping => break,
            // Nothing to do and nothing in flight: the queue sleeps (no
            // task) until the engine names it again (`engine/awake.rs`).
            Ok(deliveries)
                if deliveries.is_empty()
                    && in_flight.is_empty()
                    && shared.engine.sleep_if_idle(&shared.queue) =>
            {
                break;
            }
            Ok(deliveries) => {
                // Each delivery holds a slot until it is settled; the slots
                // not used go back when `free` is dropped.
                for (d, slot) in deliveries.into_iter().zip(free.drain(..)) {
                    let (shared, stop) = (shared.clone(), stop.clone());
                    in_flight.spawn(async move {
                        work(&shared, d, &stop, drain).await;
                        drop(slot);
                    });
                }
            }
            Err(LeaseError::QueueNotFound { .. } | LeaseError::NotPushQueue { .. }) => break,
            // Replicated mode: only the primary delivers; a follower's
            // dispatcher waits until its replica serves.
            Err(LeaseError::NotPrimary) => {
                if stopping || (in_flight.is_empty() && shared.engine.sleep_if_idle(&shared.queue))
                {
                    break;
                }
                tokio::select! {
                    () = tokio::time::sleep(NOT_PRIMARY_WAIT) => {}
                    _ = stop.changed() => {}
                }
            }
            Err(e @ LeaseError::NotPullQueue { .. }) => {
                unreachable!("bug: a worker's lease refused as a pull consumer's: {e}")
            }
        }
    }
    while in_flight.join_next().await.is_some() {}
}

/// A worker: delivers `first`, then the queue's next visible messages one
/// after the other, until none is visible, the breaker opens, or `stop`
/// (unless draining).
///
/// An attempt's settle records go to disk while the next attempt's request
/// is out: until they are durable the message stays reserved, and the
/// worker waits for them before it takes another message after that.
async fn work(
    shared: &Arc<QueueShared>,
    first: PushDelivery,
    stop: &watch::Receiver<bool>,
    drain: bool,
) {
    let mut next = Some(first);
    let mut settling: Option<SettleWait> = None;
    while let Some(d) = next.take() {
        let attempted = deliver(shared, d, false).await;
        if let Some(before) = std::mem::replace(&mut settling, attempted.settling) {
            durable(shared, before).await;
        }
        if (*stop.borrow() && !drain) || attempted.breaker_open {
            break;
        }
        if let Some(limiter) = &shared.limiter {
            limiter.until_ready().await;
        }
        next = match shared
            .engine
            .lease_for_delivery(&shared.queue, 1, Duration::ZERO, false)
            .await
        {
            Ok(mut one) => one.pop(),
            Err(_) => None,
        };
    }
    if let Some(last) = settling {
        durable(shared, last).await;
    }
}

/// Waits for a settle's records; a failure is the engine's to undo (the
/// reservation is released) and only logged here.
async fn durable(shared: &QueueShared, settling: SettleWait) {
    if let Err(e) = settling.durable().await {
        tracing::warn!(queue = %shared.queue, error = %e, "could not settle a delivery");
    }
}

/// How an attempt ended.
struct Attempted {
    delivered: bool,
    /// The queue's breaker is open after it: the worker stops.
    breaker_open: bool,
    /// Its settle, appended (`None` when it could not be, or the attempt
    /// was abandoned).
    settling: Option<SettleWait>,
}

/// Sends one delivery and settles it by the answer.
async fn deliver(shared: &Arc<QueueShared>, d: PushDelivery, probe: bool) -> Attempted {
    let started_at = shared.engine_now_ms();
    let started = Instant::now();
    let id = shared.engine.tokens().format_id(d.lease.id);
    // A replica that stops being the primary abandons the attempt at once
    // (the request is dropped mid-flight): its lease is gone, and the new
    // primary delivers the message again without raising its retry count.
    // A span of its own, a child of the send's (`src/telemetry.rs`).
    let span = crate::telemetry::span(|| {
        tracing::info_span!("delivery.attempt", otel.kind = "client", queue = %shared.queue,
            retry = d.retry_count)
    });
    crate::telemetry::continue_trace(&span, d.payload.trace.as_deref());
    let sent = tokio::select! {
        sent = send(shared, &d, &id).instrument(span) => sent,
        () = shared.engine.until_stepped_down() => {
            tracing::info!(queue = %shared.queue, delivery_id = %id,
                "no longer the primary: abandoned the delivery attempt in flight");
            return Attempted { delivered: false, breaker_open: false, settling: None };
        }
    };
    let duration_ms = started.elapsed().as_millis().min(u128::from(u32::MAX)) as u32;
    let sent = scrubbed(sent, &shared.secrets(&d));
    let (outcome, class) = classify(
        &sent,
        &shared.settings,
        d.retry_count,
        shared.engine_now(),
        rand::random::<f64>(),
    );
    let attempt = attempt_info(sent, started_at, duration_ms);
    settle(shared, &d, &id, attempt, outcome, class, probe)
}

/// An answer or error with every secret value the delivery carried
/// replaced (what an attempt records is shown to operators).
fn scrubbed(sent: Result<Answer, SendError>, secrets: &[String]) -> Result<Answer, SendError> {
    sent.map(|answer| Answer {
        body: scrub(answer.body, secrets),
        ..answer
    })
    .map_err(|error| SendError {
        text: scrub(error.text, secrets),
        ..error
    })
}

/// What an attempt's answer means for its message (docs/contract.md §3,
/// §5), and its class for the metrics: 2xx delivered; a permanent status
/// to the failure queue; anything else retried after the backoff of
/// `retry_count` (with `jitter` in 0..1) or the destination's
/// `Retry-After` as of `now`.
fn classify(
    sent: &Result<Answer, SendError>,
    settings: &QueueSettings,
    retry_count: u32,
    now: SystemTime,
    jitter: f64,
) -> (Outcome, AttemptClass) {
    let backoff = delay_ms(&settings.backoff, retry_count, jitter);
    match sent {
        Ok(answer) => {
            let status = answer.status;
            let outcome = if (200..300).contains(&status) {
                Outcome::Delivered
            } else if settings.permanent_failure_statuses.contains(&status) {
                Outcome::Permanent { status }
            } else {
                let delay = answer
                    .retry_after
                    .as_deref()
                    .and_then(|v| retry_after_ms(v, now, settings.backoff.max_ms))
                    .unwrap_or(backoff);
                Outcome::Retry { delay_ms: delay }
            };
            (outcome, AttemptClass::Status(status))
        }
        Err(error) => (Outcome::Retry { delay_ms: backoff }, error.class),
    }
}

/// The attempt as its record keeps it.
fn attempt_info(sent: Result<Answer, SendError>, at: i64, duration_ms: u32) -> AttemptInfo {
    match sent {
        Ok(answer) => AttemptInfo {
            at,
            status: Some(answer.status),
            error: String::new(),
            duration_ms,
            response: answer.body,
        },
        Err(error) => AttemptInfo {
            at,
            status: None,
            error: error.text,
            duration_ms,
            response: String::new(),
        },
    }
}

/// Settles an attempt in the engine, then counts it: its metrics, and the
/// failures in a row that open the breaker.
fn settle(
    shared: &Arc<QueueShared>,
    d: &PushDelivery,
    id: &str,
    attempt: AttemptInfo,
    outcome: Outcome,
    class: AttemptClass,
    probe: bool,
) -> Attempted {
    let delivered = outcome == Outcome::Delivered;
    let mut labelled = match outcome {
        Outcome::Delivered => DeliveryOutcome::Success,
        Outcome::Permanent { .. } => DeliveryOutcome::Failure,
        _ => DeliveryOutcome::Retry,
    };
    let duration = Duration::from_millis(u64::from(attempt.duration_ms));
    if delivered {
        tracing::debug!(queue = %shared.queue, delivery_id = %id, status = attempt.status,
            duration_ms = attempt.duration_ms, retry = d.retry_count, outcome = labelled.as_str(), "delivery");
    } else {
        tracing::info!(queue = %shared.queue, delivery_id = %id, status = attempt.status,
            error = %attempt.error, duration_ms = attempt.duration_ms, retry = d.retry_count,
            outcome = labelled.as_str(), "delivery");
    }
    let outcome = match outcome {
        // A failed probe does not raise the message's retry count.
        Outcome::Retry { .. } if probe => Outcome::ProbeFailed { delay_ms: 0 },
        other => other,
    };
    let settling = match shared
        .engine
        .settle_delivery(&shared.queue, d.lease, attempt, outcome)
    {
        Ok(settling) => {
            // The label says what happened: the last retry moved the
            // message to the failure queue.
            if settling.settled == Settled::Failed {
                labelled = DeliveryOutcome::Failure;
            }
            Some(settling)
        }
        Err(e) => {
            tracing::warn!(queue = %shared.queue, error = %e, "could not settle a delivery");
            None
        }
    };
    let latency = delivered.then(|| {
        let ms = shared.engine_now_ms().saturating_sub(d.enqueued_at).max(0);
        Duration::from_millis(ms as u64)
    });
    shared.metrics.record(labelled, class, duration, latency);
    let breaker_open = match settling.as_ref().map(|s| s.breaker) {
        Some(BreakerTurn::Opened) => {
            breaker_opened(shared);
            true
        }
        Some(BreakerTurn::Unchanged { open }) => open,
        None => false,
    };
    Attempted {
        delivered,
        breaker_open,
        settling,
    }
}

impl QueueShared {
    /// Now, by the engine's clock (never the system's directly, so that a
    /// test's clock governs delivery too).
    fn engine_now_ms(&self) -> i64 {
        self.engine.clock_ms()
    }

    fn engine_now(&self) -> SystemTime {
        let ms = u64::try_from(self.engine_now_ms()).unwrap_or(0);
        SystemTime::UNIX_EPOCH + Duration::from_millis(ms)
    }
}

/// This pool's failures opened the breaker (in the engine, where its
/// state lives): start its probe, once.
fn breaker_opened(shared: &Arc<QueueShared>) {
    if shared.probing.swap(true, Ordering::AcqRel) {
        return;
    }
    tracing::warn!(
        queue = %shared.queue,
        failures = shared.settings.breaker_failures,
        "circuit breaker open: delivery paused, probing"
    );
    // The pool's stop: a probe of a pool whose settings were replaced
    // ends, and the new pool's probes.
    let stop = shared.stop.clone();
    tokio::spawn(probe(shared.clone(), stop));
}

/// The breaker's probe: when the probe due (in the engine, where "probe
/// now" moves it) comes, delivers one message; on success closes the
/// breaker, else waits twice as long (up to [`PROBE_INTERVAL_MAX`]). Ends
/// when the breaker is closed (here or by an operator) or the pool stops.
/// It waits on the engine's word of a change, not on a timer's look.
async fn probe(shared: Arc<QueueShared>, mut stop: watch::Receiver<bool>) {
    let signal = shared.engine.queue_signal(&shared.queue);
    let mut interval = PROBE_INTERVAL_FIRST;
    loop {
        if *stop.borrow() || shared.engine.is_poisoned() {
            break;
        }
        let Some(due) = shared.engine.breaker(&shared.queue) else {
            break;
        };
        let now = shared.engine_now_ms();
        if now < due {
            // Armed, then looked at again: a move of the probe (or a
            // close) after the second look wakes the wait.
            let changed = signal.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if shared.engine.breaker(&shared.queue) != Some(due) {
                continue;
            }
            let wait = Duration::from_millis((due - now) as u64);
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                () = changed => {}
                _ = stop.changed() => {}
            }
            continue;
        }
        let leased = shared
            .engine
            .lease_for_delivery(&shared.queue, 1, Duration::ZERO, true)
            .await
            .map(|mut one| one.pop());
        let closed = match leased {
            Ok(Some(d)) => {
                let attempted = deliver(&shared, d, true).await;
                if let Some(settling) = attempted.settling {
                    durable(&shared, settling).await;
                }
                attempted.delivered
            }
            // Nothing to probe with: resume and let the next failures
            // decide.
            Ok(None) => true,
            // The queue is gone or changed: this task is done.
            Err(_) => break,
        };
        if closed {
            shared.engine.set_breaker(&shared.queue, None);
            tracing::info!(queue = %shared.queue, "circuit breaker closed: delivery resumed");
            break;
        }
        interval = (interval * 2).min(PROBE_INTERVAL_MAX);
        let next = shared.engine_now_ms() + interval.as_millis() as i64;
        shared.engine.set_breaker(&shared.queue, Some(next));
    }
    shared.probing.store(false, Ordering::Release);
}

/// What came back from a destination that answered.
struct Answer {
    status: u16,
    retry_after: Option<String>,
    body: String,
}

/// Why an attempt got no answer.
struct SendError {
    class: AttemptClass,
    text: String,
}

impl From<String> for SendError {
    fn from(text: String) -> SendError {
        SendError {
            class: AttemptClass::Error,
            text,
        }
    }
}

/// Sends the request of one delivery (`id`: its external id).
async fn send(shared: &QueueShared, d: &PushDelivery, id: &str) -> Result<Answer, SendError> {
    let settings = &shared.settings;
    let request = d.payload.request.as_ref();
    let url = shared
        .destination
        .as_ref()
        .map_err(Clone::clone)?
        .target(request)?;
    let method = match request {
        Some(r) => Method::from_bytes(r.method.as_bytes()).map_err(|e| format!("method: {e}"))?,
        None => Method::POST,
    };
    let mut headers = HeaderMap::new();
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
    for (name, value) in &settings.headers {
        // Refused when the settings are made; skipped here too, for
        // settings journaled before that rule.
        if static_header_refusal(name).is_some() {
            continue;
        }
        if let (Ok(n), Ok(v)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_str(value),
        ) {
            headers.insert(n, v);
        }
    }
    let put = |headers: &mut HeaderMap, name: &'static str, value: &str| {
        if let Ok(v) = HeaderValue::from_str(value) {
            headers.insert(name, v);
        }
    };
    put(&mut headers, "spooler-delivery-id", id);
    put(
        &mut headers,
        "spooler-retry-count",
        &d.retry_count.to_string(),
    );
    if let Some(trace) = crate::telemetry::outgoing(d.payload.trace.as_deref()) {
        put(&mut headers, "traceparent", &trace);
    }
    if let Some(from) = d.payload.resent_from {
        let from = shared.engine.tokens().format_id(from);
        put(&mut headers, "spooler-resent-from", &from);
    }
    if let Some(event) = &d.payload.event {
        put(&mut headers, "spooler-event-type", &event.event_type);
        let event_id = shared.engine.tokens().format_id(event.id);
        put(&mut headers, "spooler-event-id", &event_id);
        if let Some(tenant) = &event.tenant {
            put(&mut headers, "spooler-tenant", tenant);
        }
    }
    if let Some(secrets) = &settings.signing_secret {
        let timestamp = shared.engine_now_ms().div_euclid(1000);
        let signature = signature_header(secrets, id, timestamp, &d.payload.body)?;
        put(&mut headers, "webhook-id", id);
        put(&mut headers, "webhook-timestamp", &timestamp.to_string());
        put(&mut headers, "webhook-signature", &signature);
    }
    let response = shared
        .client
        .request(method, url)
        .timeout(Duration::from_millis(settings.timeout_ms.max(1)))
        .headers(headers)
        .body(d.payload.body.clone())
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
    let mut text = format!("{kind}: {e}");
    let mut source = std::error::Error::source(&e);
    while let Some(s) = source {
        text.push_str(&format!(": {s}"));
        source = s.source();
    }
    SendError { class, text }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spool::queue::Backoff;

    fn answer(status: u16, retry_after: Option<&str>) -> Result<Answer, SendError> {
        Ok(Answer {
            status,
            retry_after: retry_after.map(str::to_owned),
            body: String::new(),
        })
    }

    #[test]
    fn an_answer_is_classified_by_status_retry_after_and_backoff() {
        let settings = QueueSettings {
            backoff: Backoff {
                initial_ms: 1_000,
                multiplier: 2.0,
                max_ms: 60_000,
                jitter: 0.0,
            },
            ..QueueSettings::default()
        };
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let classify =
            |sent: &Result<Answer, SendError>, retry| classify(sent, &settings, retry, now, 0.5);
        assert_eq!(
            classify(&answer(204, None), 0),
            (Outcome::Delivered, AttemptClass::Status(204))
        );
        assert_eq!(
            classify(&answer(404, None), 3),
            (
                Outcome::Permanent { status: 404 },
                AttemptClass::Status(404)
            )
        );
        // Backoff by the retry count, unless the destination says when.
        assert_eq!(
            classify(&answer(503, None), 2).0,
            Outcome::Retry { delay_ms: 4_000 }
        );
        assert_eq!(
            classify(&answer(503, Some("7")), 2).0,
            Outcome::Retry { delay_ms: 7_000 }
        );
        assert_eq!(
            classify(&answer(429, Some("86400")), 0).0,
            Outcome::Retry { delay_ms: 60_000 },
            "never past the backoff's maximum"
        );
        let timeout = Err(SendError {
            class: AttemptClass::Timeout,
            text: "timeout".into(),
        });
        assert_eq!(
            classify(&timeout, 1),
            (Outcome::Retry { delay_ms: 2_000 }, AttemptClass::Timeout)
        );
    }

    #[test]
    fn secrets_are_scrubbed_from_answers_and_errors() {
        let secrets = vec!["s3cret-token".to_owned()];
        let sent = scrubbed(
            Ok(Answer {
                status: 401,
                retry_after: None,
                body: "bad key s3cret-token".into(),
            }),
            &secrets,
        );
        assert_eq!(sent.ok().unwrap().body, "bad key <redacted>");
        let sent = scrubbed(
            Err(SendError::from("tls: s3cret-token".to_owned())),
            &secrets,
        );
        assert_eq!(sent.err().unwrap().text, "tls: <redacted>");
    }
}
