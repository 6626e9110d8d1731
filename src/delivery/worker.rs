//! Delivery for one push queue: a dispatcher leases messages while a slot
//! of `concurrency` is free and starts one task per delivery (send the
//! request, settle by the outcome; docs/contract.md §3, §5); and the circuit breaker.
//! An idle queue costs one waiting task, whatever its `concurrency`.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::futures::Notified;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, watch};
use tokio::task::JoinSet;
use tracing::Instrument;

use super::answer::{Answer, SendError};
use super::backoff::{delay_ms, retry_after_ms};
use super::send::send_through_flood;
use super::shared::QueueShared;
use crate::engine::settle::{
    Outcome, PROBE_INTERVAL_FIRST, PROBE_INTERVAL_MAX, SettleWait, Settled,
};
use crate::engine::{LeaseError, PushDelivery};
use crate::metrics::{AttemptClass, DeliveryOutcome};
use crate::spool::QueueSettings;
use crate::spool::command::AttemptInfo;
use crate::spool::state::BreakerTurn;

/// How often a follower's dispatcher looks whether its replica became the
/// primary (replicated mode): a new primary delivers this soon after it
/// serves.
const NOT_PRIMARY_WAIT: Duration = Duration::from_millis(100);
/// How long the dispatcher waits for work before it asks to sleep (it ends
/// if its queue is empty). The engine wakes it when a message arrives or
/// becomes visible, and a stop ends the wait.
const LEASE_WAIT: Duration = Duration::from_secs(5);
/// Most messages the dispatcher leases in one call.
const LEASE_BATCH_MAX: usize = 64;

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
    // The last wait for work ran out with nothing leased since.
    let mut waited_out = false;
    loop {
        while in_flight.try_join_next().is_some() {}
        let stopping = *stop.borrow();
        if stopping && !drain {
            break;
        }
        if shared.engine.breaker(&shared.queue).is_some() {
            while_breaker_open(&shared, &signal, &mut stop, stopping).await;
            continue;
        }
        let Some(free) = free_slots(&slots, &mut stop, stopping).await else {
            continue;
        };
        let max = lease_size(&shared, free.len()).await;
        // The origin's slots are taken only to lease at once, never held
        // while the queue waits for work: ten thousand idle queues of one
        // gateway would hold them all (`hosts.rs`).
        let Some(hosts) = host_slots(&shared, max, &mut stop, stopping).await else {
            continue;
        };
        // As many as both gave; the queue's other slots go back.
        let mut free: Vec<Slots> = free.into_iter().zip(hosts).collect();
        // Armed before the lease looks: a wake-up between the two is kept.
        let woken = signal.notified();
        tokio::pin!(woken);
        woken.as_mut().enable();
        let leased = shared
            .engine
            .lease_for_delivery(&shared.queue, free.len(), Duration::ZERO, false)
            .await;
        match leased {
            Ok(deliveries) if deliveries.is_empty() => {
                drop(free);
                // Draining and nothing left, or nothing to do for a whole
                // wait and nothing in flight: done. A queue that sleeps has
                // no task until the engine names it again
                // (`engine/awake.rs`).
                if stopping
                    || (waited_out
                        && in_flight.is_empty()
                        && shared.engine.sleep_if_idle(&shared.queue))
                {
                    break;
                }
                waited_out = !wait_for_work(&shared, woken, &mut stop).await;
            }
            Ok(deliveries) => {
                waited_out = false;
                spawn_workers(&shared, deliveries, &mut free, &mut in_flight, &stop, drain);
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

/// The dispatcher while the queue's breaker is open: starts its probe
/// (unless one runs) and waits until the breaker changes or `stop` does;
/// returns at once if the breaker closed meanwhile.
async fn while_breaker_open(
    shared: &Arc<QueueShared>,
    signal: &Notify,
    stop: &mut watch::Receiver<bool>,
    stopping: bool,
) {
    // Armed, then looked at again: a close that comes after the
    // second look wakes the wait below.
    let changed = signal.notified();
    tokio::pin!(changed);
    changed.as_mut().enable();
    if shared.engine.breaker(&shared.queue).is_none() {
        return;
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
}

/// Waits for one free slot, then takes every other free one, at most
/// [`LEASE_BATCH_MAX`]: `None` when `stop` changes first.
async fn free_slots(
    slots: &Arc<Semaphore>,
    stop: &mut watch::Receiver<bool>,
    stopping: bool,
) -> Option<Vec<OwnedSemaphorePermit>> {
    let first = tokio::select! {
        slot = slots.clone().acquire_owned() => slot.expect("bug: slots closed"),
        _ = stop.changed(), if !stopping => return None,
    };
    Some(and_every_free_one(slots, first, LEASE_BATCH_MAX))
}

/// `first`, and every other slot of `slots` free now, at most `max` in
/// all.
fn and_every_free_one(
    slots: &Arc<Semaphore>,
    first: OwnedSemaphorePermit,
    max: usize,
) -> Vec<OwnedSemaphorePermit> {
    let mut got = vec![first];
    while got.len() < max {
        match slots.clone().try_acquire_owned() {
            Ok(slot) => got.push(slot),
            Err(_) => break,
        }
    }
    got
}

/// Waits for one slot of the destination's origin (`hosts.rs`), counting
/// the wait, then takes every other free one, at most `want`: `None` when
/// `stop` changes first.
async fn host_slots(
    shared: &QueueShared,
    want: usize,
    stop: &mut watch::Receiver<bool>,
    stopping: bool,
) -> Option<Vec<OwnedSemaphorePermit>> {
    let slots = &shared.origin.slots;
    let first = match slots.clone().try_acquire_owned() {
        Ok(slot) => slot,
        Err(_) => {
            crate::metrics::record_host_slot_wait();
            tokio::select! {
                slot = slots.clone().acquire_owned() => slot.expect("bug: host slots closed"),
                _ = stop.changed(), if !stopping => return None,
            }
        }
    };
    Some(and_every_free_one(slots, first, want))
}

/// A worker's two slots: its queue's (`concurrency`) and its
/// destination origin's (`delivery.max_connections_per_host`).
type Slots = (OwnedSemaphorePermit, OwnedSemaphorePermit);

/// How many to lease with `free` slots: a rate-limited queue leases one
/// at a time, each when due.
async fn lease_size(shared: &QueueShared, free: usize) -> usize {
    match &shared.limiter {
        Some(limiter) => {
            limiter.until_ready().await;
            1
        }
        None => free,
    }
}

/// Waits, holding no slot, until the queue may have work (`woken`: the
/// engine's wake-up for it; or its next message's visibility), at most
/// [`LEASE_WAIT`]: whether it woke before that (a change of `stop` too).
async fn wait_for_work(
    shared: &QueueShared,
    woken: Pin<&mut Notified<'_>>,
    stop: &mut watch::Receiver<bool>,
) -> bool {
    let until = shared
        .engine
        .next_visible_in(&shared.queue)
        .map_or(LEASE_WAIT, |due| due.min(LEASE_WAIT));
    tokio::select! {
        () = woken => true,
        () = tokio::time::sleep(until) => until < LEASE_WAIT,
        _ = stop.changed() => true,
    }
}

/// Starts a worker for each delivery, on a task of its own in `in_flight`.
fn spawn_workers(
    shared: &Arc<QueueShared>,
    deliveries: Vec<PushDelivery>,
    free: &mut Vec<Slots>,
    in_flight: &mut JoinSet<()>,
    stop: &watch::Receiver<bool>,
    drain: bool,
) {
    // Each delivery holds its queue's slot until it is settled, and its
    // origin's while it delivers; the slots not used go back when `free`
    // is dropped.
    for (d, (slot, host)) in deliveries.into_iter().zip(free.drain(..)) {
        let (shared, stop) = (shared.clone(), stop.clone());
        in_flight.spawn(async move {
            work(&shared, d, host, &stop, drain).await;
            drop(slot);
        });
    }
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
    host: OwnedSemaphorePermit,
    stop: &watch::Receiver<bool>,
    drain: bool,
) {
    let mut next = Some(first);
    let mut host = Some(host);
    let mut settling: Option<SettleWait> = None;
    while let Some(d) = next.take() {
        let attempted = deliver(shared, d, false).await;
        if let Some(before) = std::mem::replace(&mut settling, attempted.settling) {
            durable(shared, before).await;
        }
        if (*stop.borrow() && !drain) || attempted.breaker_open {
            break;
        }
        // The origin's slot goes back after each delivery: to a dispatcher
        // that waits for one first (the semaphore is fair), so this worker
        // goes on only if it gets one again at once (`hosts.rs`).
        drop(host.take());
        if let Some(limiter) = &shared.limiter {
            limiter.until_ready().await;
        }
        match shared.origin.slots.clone().try_acquire_owned() {
            Ok(slot) => host = Some(slot),
            Err(_) => break,
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
    // A span of its own, a child of the send's or the event's
    // (`src/telemetry.rs`), with OpenTelemetry's HTTP client attributes.
    let span = crate::telemetry::span(|| {
        let url = shared.destination.as_ref().ok().map(|d| d.url());
        tracing::info_span!("delivery.attempt", otel.kind = "client", queue = %shared.queue,
            retry = d.retry_count, "spoold.delivery.id" = %id,
            "http.request.method" = d.payload.request.as_ref().map_or("POST", |r| r.method.as_str()),
            "server.address" = url.and_then(|u| u.host_str()).unwrap_or_default(),
            "server.port" = url.and_then(|u| u.port_or_known_default()).unwrap_or_default(),
            "http.response.status_code" = tracing::field::Empty,
            "error.type" = tracing::field::Empty)
    });
    crate::telemetry::continue_trace(&span, d.payload.trace.as_deref());
    let sent = tokio::select! {
        sent = send_through_flood(shared, &d, &id).instrument(span.clone()) => sent,
        () = shared.engine.until_stepped_down() => {
            tracing::info!(queue = %shared.queue, delivery_id = %id,
                "no longer the primary: abandoned the delivery attempt in flight");
            return Attempted { delivered: false, breaker_open: false, settling: None };
        }
    };
    match &sent {
        Ok(answer) => {
            span.record("http.response.status_code", answer.status);
            if answer.status >= 400 {
                span.record("error.type", answer.status.to_string());
            }
        }
        Err(e) => {
            span.record("error.type", e.class.as_str());
        }
    }
    drop(span);
    let duration_ms = started.elapsed().as_millis().min(u128::from(u32::MAX)) as u32;
    // An empty answer has nothing to scrub: the secrets are not gathered.
    let sent = match &sent {
        Ok(answer) if answer.body.is_empty() => sent,
        _ => scrubbed(sent, &shared.secrets(&d)),
    };
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
            refused: false,
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
