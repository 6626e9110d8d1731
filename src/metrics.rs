//! Every metric name, label and bucket in one place (docs/contract.md §8).
//!
//! Per-queue message counters and gauges are not counted on the hot path:
//! the state machine already keeps them ([`crate::spool::state::Counters`],
//! counting since the process started), so a scrape copies them into the
//! registry ([`refresh`]). Only what the state machine does not see is
//! recorded as it happens: fsync and delivery durations, delivery outcomes,
//! and HTTP requests.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::OnceLock;
use std::time::Duration;

use ::metrics::{
    Counter, Histogram, Unit, counter, describe_counter, describe_gauge, describe_histogram, gauge,
    histogram,
};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

pub(crate) const MESSAGES_SENT: &str = "spoold_messages_sent_total";
pub(crate) const MESSAGES_ACKED: &str = "spoold_messages_acked_total";
pub(crate) const MESSAGES_RETRIED: &str = "spoold_messages_retried_total";
pub(crate) const MESSAGES_FAILED: &str = "spoold_messages_failed_total";
pub(crate) const MESSAGES_EXPIRED: &str = "spoold_messages_expired_total";
pub(crate) const MESSAGES_DEDUPLICATED: &str = "spoold_messages_deduplicated_total";
pub(crate) const QUEUE_MESSAGES: &str = "spoold_queue_messages";
pub(crate) const QUEUE_OLDEST_AGE: &str = "spoold_queue_oldest_message_age_seconds";
pub(crate) const QUEUE_RETRYING: &str = "spoold_queue_retrying_messages";
pub(crate) const QUEUE_OLDEST_RETRYING_AGE: &str = "spoold_queue_oldest_retrying_age_seconds";
pub(crate) const QUEUE_PAUSED: &str = "spoold_queue_paused";
pub(crate) const QUEUE_BREAKER_OPEN: &str = "spoold_queue_breaker_open";
pub(crate) const QUEUE_SIGNING_SECRETS: &str = "spoold_queue_signing_secrets";
pub(crate) const QUEUE_PREVIOUS_SECRET_EXPIRY: &str =
    "spoold_queue_previous_secret_expiry_timestamp_seconds";
pub(crate) const BUILD_INFO: &str = "spoold_build_info";
pub(crate) const DELIVERIES: &str = "spoold_deliveries_total";
pub(crate) const DELIVERY_DURATION: &str = "spoold_delivery_duration_seconds";
pub(crate) const FSYNC_DURATION: &str = "spoold_journal_fsync_duration_seconds";
pub(crate) const JOURNAL_BYTES: &str = "spoold_journal_bytes";
pub(crate) const JOURNAL_MAX_BYTES: &str = "spoold_journal_max_bytes";
pub(crate) const MEMORY_BYTES: &str = "spoold_memory_accounted_bytes";
pub(crate) const MEMORY_MAX_BYTES: &str = "spoold_memory_max_bytes";
pub(crate) const HTTP_REQUESTS: &str = "spoold_http_requests_total";
pub(crate) const HTTP_DURATION: &str = "spoold_http_request_duration_seconds";
pub(crate) const DELIVERY_LATENCY: &str = "spoold_delivery_latency_seconds";
pub(crate) const CLUSTER_ROLE: &str = "spoold_cluster_role";
pub(crate) const CLUSTER_TERM: &str = "spoold_cluster_term";
pub(crate) const CLUSTER_LEADER_CHANGES: &str = "spoold_cluster_leader_changes_total";
pub(crate) const CLUSTER_REPLICATION_LAG: &str = "spoold_cluster_replication_lag_records";
pub(crate) const CLUSTER_COMMIT_DURATION: &str = "spoold_cluster_commit_duration_seconds";
pub(crate) const CLUSTER_PEER_CONTACT_AGE: &str = "spoold_cluster_peer_contact_age_seconds";
pub(crate) const CLUSTER_MEMBERS: &str = "spoold_cluster_members";
pub(crate) const CLUSTER_APPLIED_INDEX: &str = "spoold_cluster_applied_index";
pub(crate) const CLUSTER_SNAPSHOT_RECEIVING: &str = "spoold_cluster_snapshot_receiving";
pub(crate) const CLUSTER_SNAPSHOT_BYTES: &str = "spoold_cluster_snapshot_received_bytes_total";
pub(crate) const CLUSTER_SNAPSHOTS_INSTALLED: &str = "spoold_cluster_snapshots_installed_total";
const EVENTS_TOTAL: &str = "spoold_events_total";
const EVENT_DELIVERIES_FILTERED: &str = "spoold_event_deliveries_filtered_total";
const OPERATIONAL_EVENTS: &str = "spoold_operational_events_total";
const SCOPE_REFUSALS: &str = "spoold_scope_refusals_total";
pub(crate) const EVENT_TYPES: &str = "spoold_event_types";
pub(crate) const PUSH_DISPATCHERS: &str = "spoold_push_dispatchers";
const HOST_SLOT_WAITS: &str = "spoold_delivery_host_slot_waits_total";
const FLOOD_RETRIES: &str = "spoold_delivery_flood_retries_total";
const SHARED_READS: &str = "spoold_shared_record_reads_total";
pub(crate) const LIMIT_REACHED: &str = "spoold_limit_reached_total";

pub(crate) const LABEL_QUEUE: &str = "queue";
pub(crate) const LABEL_STATE: &str = "state";
pub(crate) const LABEL_OUTCOME: &str = "outcome";
pub(crate) const LABEL_ROUTE: &str = "route";
pub(crate) const LABEL_STATUS: &str = "status";
pub(crate) const LABEL_ROLE: &str = "role";
pub(crate) const LABEL_PEER: &str = "peer";
pub(crate) const LABEL_VOTER: &str = "voter";
pub(crate) const LABEL_LIMIT: &str = "limit";

/// fsync takes ~50 µs on a fast NVMe disk and up to ~100 ms on a slow
/// network volume.
const FSYNC_BUCKETS_SECONDS: &[f64] = &[
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
];
/// A replicated write: a round trip and an fsync on a majority, from
/// ~1 ms on one machine to ~100 ms across zones with slow disks.
const COMMIT_BUCKETS_SECONDS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
];
/// A delivery takes from ~1 ms (a local sink) to the 30 s default timeout.
const DELIVERY_BUCKETS_SECONDS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// How a delivery attempt ended, as the `outcome` label says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DeliveryOutcome {
    Success,
    Retry,
    Failure,
}

impl DeliveryOutcome {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            DeliveryOutcome::Success => "success",
            DeliveryOutcome::Retry => "retry",
            DeliveryOutcome::Failure => "failure",
        }
    }
}

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// Installs the process-wide recorder (once) and returns its handle.
pub(crate) fn install() -> &'static PrometheusHandle {
    HANDLE.get_or_init(|| {
        let handle = PrometheusBuilder::new()
            .set_buckets_for_metric(Matcher::Full(FSYNC_DURATION.into()), FSYNC_BUCKETS_SECONDS)
            .and_then(|b| {
                b.set_buckets_for_metric(
                    Matcher::Full(DELIVERY_DURATION.into()),
                    DELIVERY_BUCKETS_SECONDS,
                )
            })
            .and_then(|b| {
                b.set_buckets_for_metric(
                    Matcher::Full(CLUSTER_COMMIT_DURATION.into()),
                    COMMIT_BUCKETS_SECONDS,
                )
            })
            .and_then(|b| {
                b.set_buckets_for_metric(Matcher::Full(HTTP_DURATION.into()), HTTP_BUCKETS_SECONDS)
            })
            .and_then(|b| {
                b.set_buckets_for_metric(
                    Matcher::Full(DELIVERY_LATENCY.into()),
                    LATENCY_BUCKETS_SECONDS,
                )
            })
            .expect("bug: bucket lists are not empty")
            .install_recorder()
            .expect("bug: a metrics recorder was installed elsewhere");
        describe();
        process_collector().describe();
        gauge!(BUILD_INFO, "version" => env!("CARGO_PKG_VERSION"), "allocator" => crate::ALLOCATOR)
            .set(1.0);
        from_the_start();
        handle
    })
}

/// The series the dashboard reads that nothing may have written yet: at
/// zero from start-up, so that a healthy server that has not received a
/// snapshot, changed leader or published an event shows 0, not "No data"
/// (`tests/cluster/dashboard.rs`).
fn from_the_start() {
    gauge!(CLUSTER_SNAPSHOT_RECEIVING).set(0.0);
    counter!(CLUSTER_SNAPSHOT_BYTES).increment(0);
    counter!(CLUSTER_SNAPSHOTS_INSTALLED).increment(0);
    counter!(CLUSTER_LEADER_CHANGES).increment(0);
    counter!(EVENT_DELIVERIES_FILTERED).increment(0);
    counter!(HOST_SLOT_WAITS).increment(0);
    counter!(FLOOD_RETRIES).increment(0);
    for result in ["hit", "miss"] {
        counter!(SHARED_READS, "result" => result).increment(0);
    }
    for outcome in EVENT_OUTCOMES {
        counter!(EVENTS_TOTAL, "outcome" => outcome).increment(0);
    }
    for kind in ["forbidden", "queue_not_found"] {
        counter!(SCOPE_REFUSALS, "kind" => kind).increment(0);
    }
}

/// What `spoold_events_total` counts an event as.
const EVENT_OUTCOMES: [&str; 3] = ["fanned_out", "no_subscribers", "deduplicated"];

/// Gives every metric its unit and help text, one area at a time.
fn describe() {
    describe_messages();
    describe_queues();
    describe_delivery();
    describe_storage();
    describe_server();
    describe_cluster();
    describe_events();
}

/// The message counters: sent, acked, retried, failed, expired, deduplicated.
fn describe_messages() {
    describe_counter!(
        MESSAGES_SENT,
        Unit::Count,
        "Messages stored by sends and forwards since start."
    );
    describe_counter!(
        MESSAGES_ACKED,
        Unit::Count,
        "Messages acked (removed for good) since start."
    );
    describe_counter!(
        MESSAGES_RETRIED,
        Unit::Count,
        "Nacks and lease expiries (each raises a retry count) since start."
    );
    describe_counter!(
        MESSAGES_FAILED,
        Unit::Count,
        "Messages moved to their failure queue since start."
    );
    describe_counter!(
        MESSAGES_EXPIRED,
        Unit::Count,
        "Messages discarded by retention since start."
    );
    describe_counter!(
        MESSAGES_DEDUPLICATED,
        Unit::Count,
        "Sends answered from the dedup window without storing anything, since start."
    );
}

/// The per-queue gauges: messages by state, ages, pause, breaker and
/// signing secrets.
fn describe_queues() {
    describe_gauge!(
        QUEUE_MESSAGES,
        Unit::Count,
        "Messages in a queue by state (visible, leased, delayed, held: behind an earlier message of their ordering key)."
    );
    describe_gauge!(
        QUEUE_OLDEST_AGE,
        Unit::Seconds,
        "How long the oldest visible message of a queue has waited."
    );
    describe_gauge!(
        QUEUE_RETRYING,
        Unit::Count,
        "Messages of a queue that failed at least once and wait for another try (any state)."
    );
    describe_gauge!(
        QUEUE_OLDEST_RETRYING_AGE,
        Unit::Seconds,
        "Since when the oldest message still retrying was sent (0 when none): a message stuck retrying."
    );
    describe_gauge!(
        QUEUE_PAUSED,
        "1 while an operator paused a queue (its circuit breaker is spoold_queue_breaker_open)."
    );
    describe_gauge!(
        QUEUE_BREAKER_OPEN,
        "1 while a push queue's circuit breaker is open: its destination kept failing, only a probe is sent."
    );
    describe_gauge!(
        QUEUE_SIGNING_SECRETS,
        "Secrets that sign a push queue's deliveries: 2 while the one a rotation replaced still signs."
    );
    describe_gauge!(
        QUEUE_PREVIOUS_SECRET_EXPIRY,
        "When the secret a rotation replaced stops signing (Unix seconds); 0 when none signs beside the new one."
    );
}

/// Push delivery: attempts by outcome, their durations and latency,
/// running dispatchers.
fn describe_delivery() {
    describe_counter!(
        DELIVERIES,
        Unit::Count,
        "Delivery attempts of push queues by outcome and status class (2xx, 3xx, 4xx, 5xx, timeout, connect, error)."
    );
    describe_histogram!(
        DELIVERY_LATENCY,
        Unit::Seconds,
        "From a message's send to its delivery (the attempt that succeeded), retries included."
    );
    describe_histogram!(
        DELIVERY_DURATION,
        Unit::Seconds,
        "Duration of delivery attempts."
    );
    describe_counter!(
        HOST_SLOT_WAITS,
        Unit::Count,
        "Times a push queue's dispatcher waited for a slot of its destination's origin: delivery.max_connections_per_host requests were in flight there."
    );
    describe_counter!(
        FLOOD_RETRIES,
        Unit::Count,
        "Connects an origin refused while this node had other requests in flight to it and it answered lately, tried again soon within the attempt (no backoff, no breaker count)."
    );
    describe_counter!(
        SHARED_READS,
        Unit::Count,
        "Reads of large event records (many deliveries, one payload): hit when the payload was among the last ones decoded (engine/shared_reads.rs), miss when it was read from disk."
    );
    describe_gauge!(
        PUSH_DISPATCHERS,
        "Push queues with a running dispatcher (those with messages); an idle push queue has none."
    );
}

/// The journal and memory: fsync durations, bytes on disk and in
/// memory, and their bounds.
fn describe_storage() {
    describe_histogram!(
        FSYNC_DURATION,
        Unit::Seconds,
        "Duration of journal fsyncs (one per group commit)."
    );
    describe_gauge!(
        JOURNAL_BYTES,
        Unit::Bytes,
        "Bytes of all journal segment files."
    );
    describe_gauge!(
        JOURNAL_MAX_BYTES,
        Unit::Bytes,
        "The configured spool.max_bytes."
    );
    describe_gauge!(
        MEMORY_BYTES,
        Unit::Bytes,
        "What the spool's state holds in memory, as accounted (messages, deliveries, keys, history); sends past spool.max_memory get 507."
    );
    describe_gauge!(
        MEMORY_MAX_BYTES,
        Unit::Bytes,
        "spool.max_memory: its configured value, or half the cgroup's memory limit."
    );
}

/// The server itself: which build runs, HTTP requests, scope refusals
/// and limits reached.
fn describe_server() {
    describe_gauge!(
        BUILD_INFO,
        "Always 1; the labels say which spoold runs (version, allocator)."
    );
    describe_counter!(
        HTTP_REQUESTS,
        Unit::Count,
        "HTTP requests by route template and status."
    );
    describe_histogram!(
        HTTP_DURATION,
        Unit::Seconds,
        "Duration of HTTP requests by route template, from routing to the answer's head."
    );
    describe_counter!(
        SCOPE_REFUSALS,
        Unit::Count,
        "Requests a scoped key or portal session may not make, by the answer's kind: forbidden (a verb it lacks, a route for operators) or queue_not_found (a queue outside its tenant or patterns)."
    );
    describe_counter!(
        LIMIT_REACHED,
        Unit::Count,
        "Requests refused, or pages cut short, by a bound the server enforces, by limit (docs/reliability.md lists them)."
    );
}

/// Replicated mode: role, term, replication, membership and snapshots.
fn describe_cluster() {
    describe_gauge!(
        CLUSTER_ROLE,
        "Replicated mode: 1 for this replica's role (primary, follower, candidate, learner), 0 for the others."
    );
    describe_gauge!(CLUSTER_TERM, "Replicated mode: the current Raft term.");
    describe_counter!(
        CLUSTER_LEADER_CHANGES,
        Unit::Count,
        "Replicated mode: changes of primary this replica saw since start."
    );
    describe_gauge!(
        CLUSTER_REPLICATION_LAG,
        "Replicated mode, on the primary: records each peer is behind the primary's log."
    );
    describe_histogram!(
        CLUSTER_COMMIT_DURATION,
        Unit::Seconds,
        "Replicated mode, on the primary: from proposing a record to its answer (committed on a majority and applied)."
    );
    describe_gauge!(
        CLUSTER_PEER_CONTACT_AGE,
        Unit::Seconds,
        "Replicated mode, on the primary: seconds since each peer last answered it (a replica down grows it)."
    );
    describe_gauge!(
        CLUSTER_MEMBERS,
        "Replicated mode: members of the cluster as this replica knows them, voters (voter=\"true\") and learners."
    );
    describe_gauge!(
        CLUSTER_APPLIED_INDEX,
        "Replicated mode: the last entry this replica applied."
    );
    describe_gauge!(
        CLUSTER_SNAPSHOT_RECEIVING,
        "Replicated mode: 1 while this replica is catching up by receiving a snapshot."
    );
    describe_counter!(
        CLUSTER_SNAPSHOT_BYTES,
        Unit::Bytes,
        "Replicated mode: bytes of snapshots this replica received (catch-up progress)."
    );
    describe_counter!(
        CLUSTER_SNAPSHOTS_INSTALLED,
        Unit::Count,
        "Replicated mode: snapshots this replica received and installed since start."
    );
}

/// Events: those published, spoold's own operational events, the
/// catalogue and filtered deliveries.
fn describe_events() {
    describe_counter!(
        EVENTS_TOTAL,
        Unit::Count,
        "Events published (POST /v1/events) by outcome: fanned_out, no_subscribers (no queue subscribes to the type), deduplicated."
    );
    describe_counter!(
        OPERATIONAL_EVENTS,
        Unit::Count,
        "spoold's own operational events (spoold.*), by kind and outcome: published, no_subscribers, failed, dropped (the publisher was 1024 behind), past_hop_bound."
    );
    describe_gauge!(
        EVENT_TYPES,
        "Entries of the event catalogue (at most 1000)."
    );
    describe_counter!(
        EVENT_DELIVERIES_FILTERED,
        Unit::Count,
        "Deliveries of events that a queue's content filter kept out (the queue's patterns took the type)."
    );
}

/// A bound the server enforces against what clients and peers send, as
/// the `limit` label of `spoold_limit_reached_total` names it. Each is
/// checked by one owner (`docs/reliability.md` has the table); this is
/// only how its refusals are counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Limit {
    /// A request body past `server.max_body_bytes` (413).
    Body,
    /// A record past the journal's record bound (413).
    Record,
    /// A search past the number that may run at once (429).
    Searches,
    /// A search page ended early by its time budget.
    SearchTime,
    /// A search page ended early by its byte budget.
    SearchBytes,
    /// A send or event past `spool.max_memory` (507).
    Memory,
    /// A request that came through more spoold deliveries than allowed
    /// (508).
    Hops,
    /// A connection that waited for a slot (every one taken, or its
    /// client's share).
    Connections,
    /// A connection closed before its first request's head arrived.
    FirstRequest,
    /// The cluster port: a first request not signed with the cluster's
    /// secret, answered `401` without a slot.
    Unsigned,
    /// The cluster port: a connection that held no slot yet, closed to
    /// make room for a new one past the open cap.
    Evicted,
    /// A connection that waited for a slot longer than its listener lets
    /// one wait (the cluster port's), closed.
    SlotWait,
    /// A queue past `server.max_queues` (409).
    Queues,
    /// A receive or a worker's lease batch ended early by its records'
    /// bytes (`spool::state::leases::LEASE_BATCH_BYTES`).
    LeaseBytes,
}

impl Limit {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Limit::Body => "body",
            Limit::Record => "record",
            Limit::Searches => "searches",
            Limit::SearchTime => "search_time",
            Limit::SearchBytes => "search_bytes",
            Limit::Memory => "memory",
            Limit::Hops => "hops",
            Limit::Connections => "connections",
            Limit::FirstRequest => "first_request",
            Limit::Unsigned => "unsigned",
            Limit::Evicted => "evicted",
            Limit::SlotWait => "slot_wait",
            Limit::Queues => "queues",
            Limit::LeaseBytes => "lease_bytes",
        }
    }
}

/// A request or a peer met `limit`.
pub(crate) fn limit_reached(limit: Limit) {
    counter!(LIMIT_REACHED, LABEL_LIMIT => limit.as_str()).increment(1);
}

/// Replicated mode: `spoold_cluster_snapshot_receiving` is 1 while one of
/// these lives.
pub(crate) struct SnapshotReceiving(());

impl SnapshotReceiving {
    pub(crate) fn start() -> SnapshotReceiving {
        gauge!(CLUSTER_SNAPSHOT_RECEIVING).set(1.0);
        SnapshotReceiving(())
    }
}

impl Drop for SnapshotReceiving {
    fn drop(&mut self) {
        gauge!(CLUSTER_SNAPSHOT_RECEIVING).set(0.0);
    }
}

/// Replicated mode: `bytes` more of a snapshot arrived.
pub(crate) fn record_snapshot_bytes(bytes: u64) {
    counter!(CLUSTER_SNAPSHOT_BYTES).increment(bytes);
}

/// One event published, by `outcome`.
pub(crate) fn count_event(outcome: &'static str) {
    debug_assert!(
        EVENT_OUTCOMES.contains(&outcome),
        "bug: {outcome} is not in EVENT_OUTCOMES"
    );
    counter!(EVENTS_TOTAL, "outcome" => outcome).increment(1);
}

/// Deliveries of one event that content filters kept out.
pub(crate) fn count_filtered(deliveries: usize) {
    counter!(EVENT_DELIVERIES_FILTERED).increment(deliveries as u64);
}

/// An operational event of `kind` (after `spoold.`) and what became of it.
pub(crate) fn count_operational(kind: &'static str, outcome: &'static str) {
    counter!(OPERATIONAL_EVENTS, "kind" => kind, LABEL_OUTCOME => outcome).increment(1);
}

/// A dispatcher waited for a slot of its destination's origin
/// (`delivery/hosts.rs`).
pub(crate) fn record_host_slot_wait() {
    counter!(HOST_SLOT_WAITS).increment(1);
}

/// A large event record's payload read: kept decoded (`hit`) or read
/// from disk (`engine/shared_reads.rs`).
pub(crate) fn record_shared_read(hit: bool) {
    let result = if hit { "hit" } else { "miss" };
    counter!(SHARED_READS, "result" => result).increment(1);
}

/// A refused connect tried again soon: this node's own flood of its
/// origin (`delivery/hosts.rs`).
pub(crate) fn record_flood_retry() {
    counter!(FLOOD_RETRIES).increment(1);
}

/// A request refused by its key's scope (`api/scope.rs`), by the kind of
/// the answer.
pub(crate) fn record_scope_refusal(kind: &'static str) {
    counter!(SCOPE_REFUSALS, "kind" => kind).increment(1);
}

/// Replicated mode: a received snapshot was installed.
pub(crate) fn record_snapshot_installed() {
    counter!(CLUSTER_SNAPSHOTS_INSTALLED).increment(1);
}

/// Replicated mode: the primary changed (as this replica saw it).
pub(crate) fn record_leader_change() {
    counter!(CLUSTER_LEADER_CHANGES).increment(1);
}

/// Replicated mode: one proposal answered after `duration`.
pub(crate) fn record_commit(duration: Duration) {
    histogram!(CLUSTER_COMMIT_DURATION).record(duration.as_secs_f64());
}

/// One fsync (one group commit).
pub(crate) fn record_fsync(duration: Duration) {
    histogram!(FSYNC_DURATION).record(duration.as_secs_f64());
}

/// An HTTP request takes from ~50 µs (a peek) to a long poll's 20 s.
const HTTP_BUCKETS_SECONDS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0, 20.0,
];
/// From a send to its delivery: milliseconds when all is well, hours when
/// a destination was down and the message waited through its retries.
const LATENCY_BUCKETS_SECONDS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0, 30.0, 120.0, 600.0, 3600.0,
    21600.0, 86400.0,
];

/// The delivery metrics of one push queue, looked up once (by its workers'
/// shared state) rather than on every attempt. An attempt counter is made
/// when first used, so that a queue's scrape shows only the outcomes and
/// status classes it had.
pub(crate) struct DeliveryMetrics {
    queue: String,
    attempts: [[OnceLock<Counter>; AttemptClass::ALL.len()]; 3],
    duration: Histogram,
    latency: Histogram,
}

/// What a delivery attempt got back, as the `status` label of
/// `spoold_deliveries_total` says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AttemptClass {
    /// An answer, by its status's hundreds.
    Status(u16),
    /// No answer within the queue's timeout.
    Timeout,
    /// The destination could not be reached (refused, DNS, TLS handshake).
    Connect,
    /// Anything else: a destination the settings cannot make a request of,
    /// a connection broken mid-answer.
    Error,
}

impl AttemptClass {
    const ALL: [&'static str; 7] = ["2xx", "3xx", "4xx", "5xx", "timeout", "connect", "error"];

    fn index(self) -> usize {
        match self {
            AttemptClass::Status(s) if (200..300).contains(&s) => 0,
            AttemptClass::Status(s) if (300..400).contains(&s) => 1,
            AttemptClass::Status(s) if (400..500).contains(&s) => 2,
            AttemptClass::Status(_) => 3,
            AttemptClass::Timeout => 4,
            AttemptClass::Connect => 5,
            AttemptClass::Error => 6,
        }
    }

    pub(crate) fn as_str(self) -> &'static str {
        Self::ALL[self.index()]
    }
}

impl DeliveryMetrics {
    pub(crate) fn new(queue: &str) -> DeliveryMetrics {
        let queue = queue_label(queue);
        DeliveryMetrics {
            attempts: Default::default(),
            duration: histogram!(DELIVERY_DURATION, LABEL_QUEUE => queue.clone()),
            latency: histogram!(DELIVERY_LATENCY, LABEL_QUEUE => queue.clone()),
            queue,
        }
    }

    /// One delivery attempt; `latency` is from the message's send, for the
    /// attempt that delivered it.
    pub(crate) fn record(
        &self,
        outcome: DeliveryOutcome,
        class: AttemptClass,
        duration: Duration,
        latency: Option<Duration>,
    ) {
        let row = match outcome {
            DeliveryOutcome::Success => 0,
            DeliveryOutcome::Retry => 1,
            DeliveryOutcome::Failure => 2,
        };
        self.attempts[row][class.index()]
            .get_or_init(|| {
                counter!(DELIVERIES, LABEL_QUEUE => self.queue.clone(),
                    LABEL_OUTCOME => outcome.as_str(), LABEL_STATUS => class.as_str())
            })
            .increment(1);
        self.duration.record(duration.as_secs_f64());
        if let Some(latency) = latency {
            self.latency.record(latency.as_secs_f64());
        }
    }
}

thread_local! {
    /// Handles of `spoold_http_requests_total` by route template and status,
    /// so that a request costs two map lookups instead of building a key
    /// and searching the registry. Bounded: routes are templates.
    static HTTP_COUNTERS: RefCell<HashMap<String, HttpRoute>> = RefCell::default();
}

/// One route template's handles.
struct HttpRoute {
    duration: Histogram,
    statuses: HashMap<u16, Counter>,
}

/// One HTTP request, by the route template it matched, answered after
/// `duration`.
pub(crate) fn record_http(route: &str, status: u16, duration: Duration) {
    let new = || counter!(HTTP_REQUESTS, LABEL_ROUTE => route.to_string(), LABEL_STATUS => status.to_string());
    if HANDLE.get().is_none() {
        // No recorder yet: a handle taken now would stay a no-op.
        histogram!(HTTP_DURATION, LABEL_ROUTE => route.to_string()).record(duration.as_secs_f64());
        return new().increment(1);
    }
    HTTP_COUNTERS.with_borrow_mut(|routes| {
        let handles = match routes.get_mut(route) {
            Some(handles) => handles,
            None => routes
                .entry(route.to_string())
                .or_insert_with(|| HttpRoute {
                    duration: histogram!(HTTP_DURATION, LABEL_ROUTE => route.to_string()),
                    statuses: HashMap::new(),
                }),
        };
        handles.duration.record(duration.as_secs_f64());
        handles
            .statuses
            .entry(status)
            .or_insert_with(new)
            .increment(1);
    });
}

/// The `process_*` metrics (CPU seconds, resident memory, open file
/// descriptors, threads, start time), as the Go client names them.
pub(crate) fn process_collector() -> &'static metrics_process::Collector {
    static COLLECTOR: OnceLock<metrics_process::Collector> = OnceLock::new();
    COLLECTOR.get_or_init(metrics_process::Collector::default)
}

/// Most queues with series of their own; the others' numbers are summed
/// under [`OTHER_QUEUES`], so that a scrape's size and cost stay bounded
/// however many queues there are (docs/contract.md §8).
pub(crate) const QUEUE_SERIES_MAX: usize = 1000;
/// The `queue` label of every queue past [`QUEUE_SERIES_MAX`] (no queue
/// can be named so).
pub(crate) const OTHER_QUEUES: &str = "(other)";

/// The queues that have series of their own: the first
/// [`QUEUE_SERIES_MAX`] this process labelled, so that a queue keeps its
/// series while it lives.
static LABELLED: std::sync::Mutex<std::collections::BTreeSet<String>> =
    std::sync::Mutex::new(std::collections::BTreeSet::new());

/// The `queue` label of `queue`: its name, or [`OTHER_QUEUES`] once
/// [`QUEUE_SERIES_MAX`] other queues have one.
pub(crate) fn queue_label(queue: &str) -> String {
    let mut labelled = LABELLED.lock().expect("metric labels poisoned");
    if labelled.contains(queue) {
        return queue.to_owned();
    }
    if labelled.len() < QUEUE_SERIES_MAX {
        labelled.insert(queue.to_owned());
        return queue.to_owned();
    }
    OTHER_QUEUES.to_owned()
}
