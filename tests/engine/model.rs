//! The model test: random sequences of every operation the engine offers —
//! sends (delayed, with dedup keys), events fanned out to the queues whose
//! patterns take their type (with idempotency keys), receives, acks, nacks, renews, cancels,
//! purges and redrives (in failure queues too), the event catalogue's
//! definitions and removals, queue creates, re-creates
//! with the same or changed settings (subscriptions too), deletes, pauses and resumes, clock
//! jumps, expiry, failed writes, full disks, compaction (forced or not, beside
//! an applier that holds durable records back, and cut off by a power loss
//! at any of its steps), clean restarts and crashes (unsynced bytes dropped,
//! cut short, or torn into pages with holes) — run against the real journal
//! and state machine on fault-injecting storage, and against a plain
//! in-memory model of what must be true.
//!
//! After every step the engine's whole state without leases (queues with
//! settings and pause state, every message with its queue, times, retry
//! count and failure details, the dedup keys in their window, the events'
//! keys with their deliveries, the event catalogue, the epoch and the next
//! message id) must
//! equal the model's. After a crash and replay it
//! must still: every acknowledged, unsettled message is there as it was, no
//! settled one came back, no id is ever answered twice. A send whose fsync
//! failed is "in doubt": it may or may not be there after the crash, and if
//! it is, it is adopted.
//!
//! Cases per run: `MODEL_CASES` (default 128, what CI runs; the figure of a
//! longer local run is in `docs/reliability.md`).

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::time::Duration;

use crate::common::*;
use proptest::prelude::*;
use spoold::engine::{
    BulkOutcome, CatalogueError, Engine, EventError, EventRequest, EventTypeDef, LeaseError,
    MessageError, Origin, Publisher, QueueError, SendError, SendRequest, SettleError, WriteError,
};
use spoold::spool::OnExpire;
use spoold::spool::{
    ContentFilter, DeadLetterFilter, FailReason, MessageId, Payload, QueueSettings, SpoolState,
    StatusMatch,
};
use spoold::spool::{Ordering, OrderingOnFailure};
use spoold::testing::FailInfo;
use spoold::testing::{EventKeyEntry, MessageEntry, QueueState};
use spoold::testing::{SimStorage, Tear};
use spoold::time::ManualClock;

const QUEUES: [&str; 3] = ["a", "b", "c"];
/// Event types the model publishes.
const TYPES: [&str; 5] = [
    "invoice.paid",
    "invoice.sent",
    "order.created",
    "order.eu.created",
    "user.seen",
];

/// Whether `pattern` takes `event_type`, written apart from spoold's own
/// matcher: `*` one segment, a last `>` one or more.
fn takes(pattern: &str, event_type: &str) -> bool {
    let p: Vec<&str> = pattern.split('.').collect();
    let t: Vec<&str> = event_type.split('.').collect();
    if p.last() == Some(&">") {
        let fixed = &p[..p.len() - 1];
        return t.len() > fixed.len() && fixed.iter().zip(&t).all(|(a, b)| *a == "*" || a == b);
    }
    p.len() == t.len() && p.iter().zip(&t).all(|(a, b)| *a == "*" || a == b)
}
const DAY_MS: u64 = 86_400_000;

/// The ordering key the model's `N` stands for.
fn ordering_key(n: u8) -> String {
    format!("ok-{n}")
}

/// Each queue's settings when (re-)created.
fn base_settings(queue: &str) -> QueueSettings {
    match queue {
        "a" => QueueSettings {
            lease_timeout_ms: 10_000,
            max_retries: 2,
            dedup_window_ms: 60_000,
            events: vec!["invoice.*".into()],
            history_retention_ms: 60_000,
            ..QueueSettings::default()
        },
        "b" => QueueSettings {
            lease_timeout_ms: 5_000,
            max_retries: 1,
            events: vec![">".into()],
            history_retention_ms: 20_000,
            ..QueueSettings::default()
        },
        _ => QueueSettings {
            lease_timeout_ms: 5_000,
            max_retries: 0,
            retention_ms: 20_000,
            on_expire: OnExpire::Fail,
            dedup_window_ms: 30_000,
            events: vec!["invoice.paid".into(), "order.*".into()],
            ..QueueSettings::default()
        },
    }
}

/// A settings change a `PUT` makes (or none: deploy tooling re-PUTs the
/// same settings on every rollout).
#[derive(Debug, Clone, Copy)]
enum Change {
    Same,
    LeaseTimeout,
    MaxRetries,
    DedupWindow,
    Retention,
    OnExpire,
    /// Subscribe to other events (or back).
    Events,
    /// Keep delivered messages (20 s), or stop keeping them.
    History,
    /// Take only events whose `x-region` header is `eu` (a content
    /// filter), or every event again.
    Filter,
    /// Unordered → ordered per key → the same holding a failed message's
    /// key → unordered.
    Ordering,
}

fn changed(mut s: QueueSettings, change: Change) -> QueueSettings {
    match change {
        Change::Same => {}
        Change::LeaseTimeout => {
            s.lease_timeout_ms = if s.lease_timeout_ms == 5_000 {
                12_000
            } else {
                5_000
            }
        }
        Change::MaxRetries => s.max_retries = (s.max_retries + 1) % 3,
        Change::DedupWindow => s.dedup_window_ms = if s.dedup_window_ms == 0 { 60_000 } else { 0 },
        Change::Retention => {
            s.retention_ms = if s.retention_ms == 20_000 {
                7 * DAY_MS
            } else {
                20_000
            }
        }
        Change::OnExpire => {
            s.on_expire = match s.on_expire {
                OnExpire::Fail => OnExpire::Discard,
                OnExpire::Discard => OnExpire::Fail,
            }
        }
        Change::History => {
            s.history_retention_ms = if s.history_retention_ms == 0 {
                20_000
            } else {
                0
            }
        }
        Change::Filter => {
            s.filter = match s.filter {
                Some(_) => None,
                None => Some(
                    ContentFilter::try_from(serde_json::json!({"headers": {"x-region": ["eu"]}}))
                        .expect("a valid filter"),
                ),
            }
        }
        Change::Ordering => {
            (s.ordering, s.ordering_on_failure) = match (s.ordering, s.ordering_on_failure) {
                (Ordering::None, _) => (Ordering::PerKey, OrderingOnFailure::Release),
                (_, OrderingOnFailure::Release) => (Ordering::PerKey, OrderingOnFailure::Hold),
                _ => (Ordering::None, OrderingOnFailure::Release),
            }
        }
        Change::Events => {
            s.events = if s.events == ["order.>"] {
                vec!["invoice.*".into()]
            } else {
                vec!["order.>".into()]
            }
        }
    }
    s
}

/// How a crash treats what was written after the last fsync.
#[derive(Debug, Clone, Copy)]
enum TearShape {
    Drop,
    Prefix(u64),
    Pages { page_bytes: u64, mask: u64 },
}

impl TearShape {
    fn tear(self) -> Tear {
        match self {
            TearShape::Drop => Tear::DropUnsynced,
            TearShape::Prefix(n) => Tear::KeepPrefix(n),
            TearShape::Pages { page_bytes, mask } => Tear::Pages { page_bytes, mask },
        }
    }
}

fn tear_shape() -> impl Strategy<Value = TearShape> {
    prop_oneof![
        Just(TearShape::Drop),
        (0..400u64).prop_map(TearShape::Prefix),
        (
            prop_oneof![Just(16u64), Just(64), Just(512)],
            proptest::num::u64::ANY
        )
            .prop_map(|(page_bytes, mask)| TearShape::Pages { page_bytes, mask }),
    ]
}

#[derive(Debug, Clone)]
enum Op {
    /// `okey`: an ordering key (`ok-N`).
    Send {
        queue: usize,
        delay_ms: u64,
        key: Option<u8>,
        okey: Option<u8>,
    },
    /// Publish an event of `TYPES[kind]` (with an `x-region: eu` header
    /// or `us`); with a key already seen and `retry`, what its first event
    /// said.
    Event {
        kind: usize,
        key: Option<u8>,
        retry: bool,
        eu: bool,
        okey: Option<u8>,
    },
    Receive {
        queue: usize,
        failed: bool,
        max: usize,
    },
    Ack(usize),
    /// Resend the delivered message at this place in the history.
    Resend(usize),
    Nack {
        lease: usize,
        delay_ms: u64,
    },
    Renew(usize),
    Cancel(usize),
    /// "Retry now" of the i-th message: a delayed one becomes visible.
    RetryNow(usize),
    /// Purge a queue, or the part of it `filter` selects, up to `max`.
    Purge {
        queue: usize,
        failed: bool,
        filter: Filter,
        max: Option<usize>,
    },
    /// `pick`: redrive the failure queue's oldest (None) or the messages
    /// at these places among all messages, those `filter` selects, up to
    /// `max`; named by the queue or (`by_failed_name`) its failure queue.
    Redrive {
        queue: usize,
        pick: Option<Vec<usize>>,
        filter: Filter,
        max: usize,
        by_failed_name: bool,
    },
    /// Peek of a failure queue with a filter: exactly the model's matches.
    PeekFailed {
        queue: usize,
        filter: Filter,
    },
    Upsert {
        queue: usize,
        change: Change,
    },
    Delete(usize),
    Pause {
        queue: usize,
        paused: bool,
    },
    /// Opens (a probe due later) or closes the queue's circuit breaker, as
    /// a push queue's workers and the operator's `breaker/close`,
    /// `breaker/probe` and `resume` do.
    Breaker {
        queue: usize,
        open: bool,
    },
    Advance(i64),
    Due,
    FailWrite,
    /// The disk fills up `room` bytes from now for one send.
    FullDisk {
        room: u64,
    },
    /// Compact: only what is worth it, or every file with garbage.
    Compact {
        force: bool,
    },
    /// Compact while `sends` more records are durable but held back from
    /// the state machine.
    CompactBesideApplier {
        sends: usize,
    },
    /// Cut the power after `cut` changes to the disk while compacting, then
    /// crash.
    CompactCut {
        cut: u64,
        tear: TearShape,
    },
    /// Crash: first `in_doubt` sends whose fsync fails (several may share a
    /// batch), then power loss.
    Crash {
        in_doubt: usize,
        tear: TearShape,
    },
    /// A clean stop and start.
    Restart,
    /// Defines (or redefines) an event type of the catalogue.
    DefineType {
        ty: usize,
        text: u8,
    },
    /// Removes an event type (none there: refused).
    RemoveType(usize),
}

fn change() -> impl Strategy<Value = Change> {
    prop_oneof![
        3 => Just(Change::Same),
        1 => Just(Change::LeaseTimeout),
        1 => Just(Change::MaxRetries),
        1 => Just(Change::DedupWindow),
        1 => Just(Change::Retention),
        1 => Just(Change::OnExpire),
        1 => Just(Change::Events),
        1 => Just(Change::History),
        1 => Just(Change::Filter),
        2 => Just(Change::Ordering),
    ]
}

/// The failure terms of a dead-letter filter, times relative to now.
#[derive(Debug, Clone, Copy, Default)]
struct Filter {
    reason: Option<FailReason>,
    /// A status filter: nothing in the model fails with a status, so it
    /// selects nothing.
    status: bool,
    since_ago: Option<i64>,
    until_ago: Option<i64>,
}

impl Filter {
    fn at(self, now: i64, ids: Option<&[MessageId]>) -> DeadLetterFilter {
        DeadLetterFilter {
            reason: self.reason,
            status: self.status.then_some(StatusMatch::Class(5)),
            since: self.since_ago.map(|a| now - a),
            until: self.until_ago.map(|a| now - a),
            ids: ids.map(|ids| ids.iter().copied().collect()),
        }
    }

    fn has_terms(self) -> bool {
        self.reason.is_some() || self.status || self.since_ago.is_some() || self.until_ago.is_some()
    }

    /// Whether the model's message matches the failure terms.
    fn matches(self, now: i64, m: &ModelMessage) -> bool {
        if !self.has_terms() {
            return true;
        }
        let Some((reason, at)) = m.failed else {
            return false;
        };
        !self.status
            && self.reason.is_none_or(|r| r == reason)
            && self.since_ago.is_none_or(|a| at >= now - a)
            && self.until_ago.is_none_or(|a| at < now - a)
    }
}

fn filter() -> impl Strategy<Value = Filter> {
    let ago = proptest::option::weighted(0.25, prop_oneof![Just(0i64), Just(5_000), Just(40_000)]);
    (
        proptest::option::weighted(
            0.3,
            prop_oneof![
                Just(FailReason::RetriesExhausted),
                Just(FailReason::Expired)
            ],
        ),
        proptest::bool::weighted(0.1),
        ago.clone(),
        ago,
    )
        .prop_map(|(reason, status, since_ago, until_ago)| Filter {
            reason,
            status,
            since_ago,
            until_ago,
        })
}

fn op() -> impl Strategy<Value = Op> {
    let queue = 0..QUEUES.len();
    prop_oneof![
        8 => (queue.clone(), prop_oneof![3 => Just(0u64), 1 => Just(1_000), 1 => Just(40_000)],
              proptest::option::weighted(0.3, 0..3u8), proptest::option::weighted(0.5, 0..3u8))
            .prop_map(|(queue, delay_ms, key, okey)| Op::Send { queue, delay_ms, key, okey }),
        4 => (0..TYPES.len(), proptest::option::weighted(0.3, 0..3u8), any::<bool>(), any::<bool>(),
              proptest::option::weighted(0.3, 0..3u8))
            .prop_map(|(kind, key, retry, eu, okey)| Op::Event { kind, key, retry, eu, okey }),
        5 => (queue.clone(), proptest::bool::weighted(0.25), 1..4usize)
            .prop_map(|(queue, failed, max)| Op::Receive { queue, failed, max }),
        3 => (0..8usize).prop_map(Op::Ack),
        2 => (0..6usize).prop_map(Op::Resend),
        3 => (0..8usize, prop_oneof![Just(0u64), Just(2_000u64)])
            .prop_map(|(lease, delay_ms)| Op::Nack { lease, delay_ms }),
        1 => (0..8usize).prop_map(Op::Renew),
        1 => (0..16usize).prop_map(Op::Cancel),
        1 => (0..16usize).prop_map(Op::RetryNow),
        1 => (queue.clone(), proptest::bool::weighted(0.6), filter(),
              proptest::option::weighted(0.3, 1..4usize))
            .prop_map(|(queue, failed, filter, max)| Op::Purge { queue, failed, filter, max }),
        2 => (queue.clone(), proptest::option::weighted(0.4, proptest::collection::vec(0..16usize, 1..4)),
              filter(), prop_oneof![Just(10usize), Just(1), Just(2)], proptest::bool::weighted(0.3))
            .prop_map(|(queue, pick, filter, max, by_failed_name)| Op::Redrive { queue, pick, filter, max, by_failed_name }),
        1 => (queue.clone(), filter()).prop_map(|(queue, filter)| Op::PeekFailed { queue, filter }),
        3 => (queue.clone(), change()).prop_map(|(queue, change)| Op::Upsert { queue, change }),
        1 => queue.clone().prop_map(Op::Delete),
        2 => (queue.clone(), proptest::bool::ANY)
            .prop_map(|(queue, paused)| Op::Pause { queue, paused }),
        1 => (0..QUEUES.len(), proptest::bool::ANY)
            .prop_map(|(queue, open)| Op::Breaker { queue, open }),
        3 => prop_oneof![Just(1i64), Just(3_000), Just(7_000), Just(30_000)].prop_map(Op::Advance),
        2 => Just(Op::Due),
        1 => Just(Op::FailWrite),
        1 => (0..300u64).prop_map(|room| Op::FullDisk { room }),
        2 => proptest::bool::ANY.prop_map(|force| Op::Compact { force }),
        1 => (1..6usize).prop_map(|sends| Op::CompactBesideApplier { sends }),
        1 => (0..24u64, tear_shape()).prop_map(|(cut, tear)| Op::CompactCut { cut, tear }),
        1 => (0..4usize, tear_shape()).prop_map(|(in_doubt, tear)| Op::Crash { in_doubt, tear }),
        1 => Just(Op::Restart),
        1 => (0..TYPES.len(), 0..3u8).prop_map(|(ty, text)| Op::DefineType { ty, text }),
        1 => (0..TYPES.len()).prop_map(Op::RemoveType),
    ]
}

#[derive(Debug, Clone, PartialEq)]
struct ModelMessage {
    /// The base queue.
    queue: String,
    failed: Option<(FailReason, i64)>,
    retry_count: u32,
    enqueued_at: i64,
    visible_at: i64,
    retention_from: i64,
    body: String,
    /// A delivery of an event: its record is shared.
    shared: bool,
    /// Its ordering key (`ok-N`).
    key: Option<u8>,
}

impl ModelMessage {
    fn queue_name(&self) -> String {
        match self.failed {
            Some(_) => format!("{}.failed", self.queue),
            None => self.queue.clone(),
        }
    }
}

/// A delivered message kept in its queue's history.
#[derive(Debug, Clone, PartialEq)]
struct ModelDelivered {
    queue: String,
    enqueued_at: i64,
    delivered_at: i64,
    retry_count: u32,
    body: String,
    shared: bool,
}

#[derive(Debug, Clone)]
struct ModelLease {
    queue: String,
    id: MessageId,
    token: String,
    expires_at: i64,
}

#[derive(Debug, Clone)]
struct ModelQueue {
    settings: QueueSettings,
    paused: bool,
    /// The circuit breaker is open: memory only, closed by a restart.
    breaker: bool,
}

/// An event's key as the model remembers it: the key, when it was first
/// seen, the event's id and deliveries, and what the event said (its type
/// and body, which a retry repeats and the engine fingerprints, and its
/// region header).
type EventKey = (
    u8,
    i64,
    MessageId,
    Vec<(String, MessageId)>,
    (String, String, bool, Option<u8>),
);

/// What the engine keeps of what an event said: the first eight bytes of
/// SHA-256 over its type's length, its type and its body (and, with an
/// ordering key, a separator and the key).
fn fingerprint(event_type: &str, body: &str, okey: Option<u8>) -> u64 {
    use sha2::Digest;
    let mut hash = sha2::Sha256::new();
    hash.update((event_type.len() as u64).to_le_bytes());
    hash.update(event_type.as_bytes());
    hash.update(body.as_bytes());
    if let Some(k) = okey {
        hash.update(b"\0ordering key\0");
        hash.update(ordering_key(k).as_bytes());
    }
    u64::from_le_bytes(hash.finalize()[..8].try_into().unwrap())
}

#[derive(Default)]
struct Model {
    queues: BTreeMap<String, ModelQueue>,
    messages: BTreeMap<MessageId, ModelMessage>,
    /// Held by the engine until settled, expired by `Due`, or a restart.
    leases: Vec<ModelLease>,
    /// Settled for good: must never come back (as a message).
    gone: BTreeSet<MessageId>,
    /// Delivered messages kept by queues with history.
    history: BTreeMap<MessageId, ModelDelivered>,
    /// (queue, key) → (first send time, id).
    keys: BTreeMap<(String, u8), (i64, MessageId)>,
    /// Bodies of sends whose fsync failed.
    in_doubt: BTreeSet<String>,
    /// Bodies of events whose fsync failed, and the queues each would
    /// reach: all of them or none after the crash.
    in_doubt_events: BTreeMap<String, (Vec<String>, Option<u8>)>,
    /// Events' keys, oldest first: key, first time, event id, deliveries.
    event_keys: Vec<EventKey>,
    /// The event catalogue: each type's stored definition.
    event_types: BTreeMap<String, Vec<u8>>,
    next_body: u64,
    /// The highest id ever answered: every new one must be above it.
    max_id: u64,
    epoch: u64,
}

impl Model {
    fn settings(&self, base: &str) -> Option<&QueueSettings> {
        self.queues.get(base).map(|q| &q.settings)
    }

    fn lease_of(&self, id: MessageId) -> Option<&ModelLease> {
        self.leases.iter().find(|l| l.id == id)
    }

    fn lease_ms(&self, queue: &str) -> i64 {
        let base = queue.trim_end_matches(".failed");
        self.settings(base).unwrap().lease_timeout_ms as i64
    }

    fn new_body(&mut self) -> String {
        self.next_body += 1;
        format!("m{}", self.next_body)
    }

    fn answered(&mut self, id: MessageId, label: &str) {
        assert!(id.0 > self.max_id, "{label}: id {} answered again", id.0);
        self.max_id = id.0;
    }

    /// A nack or an expired lease at `now`: visible again at `visible_at`
    /// with one more retry, or to the failure queue at once when that would
    /// pass `max_retries` (failure queues have no limit).
    fn retry(&mut self, id: MessageId, visible_at: i64, now: i64) {
        let max = self
            .settings(&self.messages[&id].queue)
            .unwrap()
            .max_retries;
        let m = self.messages.get_mut(&id).unwrap();
        if m.failed.is_none() && m.retry_count + 1 > max {
            m.failed = Some((FailReason::RetriesExhausted, now));
            m.visible_at = now;
            m.retention_from = now;
        } else {
            m.retry_count += 1;
            m.visible_at = visible_at;
        }
    }

    /// A message just sent (at `now`, visible at `visible_at`).
    fn sent(
        &mut self,
        id: MessageId,
        queue: impl Into<String>,
        now: i64,
        visible_at: i64,
        body: String,
    ) {
        self.messages.insert(
            id,
            ModelMessage {
                queue: queue.into(),
                failed: None,
                retry_count: 0,
                enqueued_at: now,
                visible_at,
                retention_from: visible_at,
                body,
                shared: false,
                key: None,
            },
        );
    }

    /// The queues an event of `event_type` reaches now, by name.
    /// The queues an event of `event_type` goes to: their patterns take
    /// its type and their filter (if any: `x-region` must be `eu`) passes.
    fn subscribers(&self, event_type: &str, eu: bool) -> Vec<String> {
        self.queues
            .iter()
            .filter(|(_, q)| q.settings.events.iter().any(|p| takes(p, event_type)))
            .filter(|(_, q)| q.settings.filter.is_none() || eu)
            .map(|(name, _)| name.clone())
            .collect()
    }

    fn remove(&mut self, id: MessageId) {
        self.messages.remove(&id);
        self.leases.retain(|l| l.id != id);
        self.gone.insert(id);
    }

    /// An ack at `now`: gone, or kept in the queue's history.
    fn acked(&mut self, id: MessageId, now: i64) {
        let m = self.messages[&id].clone();
        let keeps = m.failed.is_none()
            && self
                .settings(&m.queue)
                .is_some_and(|s| s.history_retention_ms > 0);
        self.remove(id);
        if keeps {
            self.history.insert(
                id,
                ModelDelivered {
                    queue: m.queue,
                    enqueued_at: m.enqueued_at,
                    delivered_at: now,
                    retry_count: m.retry_count,
                    body: m.body,
                    shared: m.shared,
                },
            );
        }
    }

    /// Messages of `queue` (a full name) that a receive could lease at
    /// `now`, longest-waiting first.
    fn line(&self, queue: &str, now: i64) -> Vec<MessageId> {
        let base = queue.trim_end_matches(".failed");
        let Some(q) = self.queues.get(base) else {
            return Vec::new();
        };
        // A pause (or an open breaker) stops the queue, not its failure
        // queue.
        if (q.paused || q.breaker) && base == queue {
            return Vec::new();
        }
        let retention = q.settings.retention_ms as i64;
        let ordered = q.settings.ordering == Ordering::PerKey && base == queue;
        let hold = q.settings.ordering_on_failure == OrderingOnFailure::Hold;
        let mut line: Vec<(i64, MessageId)> = self
            .messages
            .iter()
            .filter(|(id, m)| {
                m.queue_name() == queue
                    && m.visible_at <= now
                    && m.retention_from + retention > now
                    && self.lease_of(**id).is_none()
                    && !(ordered && self.held(base, **id, m.key, hold))
            })
            .map(|(id, m)| (m.visible_at, *id))
            .collect();
        line.sort();
        line.into_iter().map(|(_, id)| id).collect()
    }

    /// Whether message `id` (of `key`, in queue `base`, ordered per key)
    /// waits behind another of its key: it is not the lowest id of its
    /// key in the queue, or another of its key is leased, or (`hold`) one
    /// of its key waits in the failure queue.
    fn held(&self, base: &str, id: MessageId, key: Option<u8>, hold: bool) -> bool {
        let Some(key) = key else {
            return false;
        };
        self.messages.iter().any(|(&other, m)| {
            m.queue == base
                && m.key == Some(key)
                && match m.failed {
                    Some(_) => hold,
                    None => other < id || (other != id && self.lease_of(other).is_some()),
                }
        })
    }

    /// The state the engine must show.
    fn expected(&self, engine: &Engine, now: i64) -> SpoolState {
        let mut queues = BTreeMap::new();
        for (name, q) in &self.queues {
            let messages = self
                .messages
                .iter()
                .filter(|(_, m)| &m.queue == name)
                .map(|(&id, m)| MessageEntry {
                    id,
                    in_failure_queue: m.failed.is_some(),
                    enqueued_at: m.enqueued_at,
                    visible_at: m.visible_at,
                    retention_from: m.retention_from,
                    retry_count: m.retry_count,
                    loc: ZERO_LOC,
                    shared: m.shared,
                    attempts: None,
                    failure: m.failed.map(|(reason, failed_at)| FailInfo {
                        reason,
                        last_status: None,
                        failed_at,
                    }),
                    ordering_key: m
                        .key
                        .map(|k| spoold::testing::ordering_key_hash(&ordering_key(k))),
                })
                .collect();
            let window = q.settings.dedup_window_ms as i64;
            let mut dedup: Vec<_> = self
                .keys
                .iter()
                .filter(|((queue, _), (first, _))| queue == name && first + window > now)
                .map(
                    |((queue, key), &(first_at, id))| spoold::testing::DedupEntry {
                        first_at,
                        hash: engine.tokens().dedup_hash(queue, &format!("key-{key}")),
                        id,
                    },
                )
                .collect();
            dedup.sort();
            queues.insert(
                name.clone(),
                QueueState {
                    queue: spoold::testing::QueueEntry {
                        name: name.clone(),
                        settings: q.settings.clone(),
                        managed_by_config: false,
                        paused: q.paused,
                    },
                    messages,
                    dedup,
                    history: self
                        .history
                        .iter()
                        .filter(|(_, d)| &d.queue == name)
                        .map(|(&id, d)| {
                            let delivered = spoold::spool::Delivered {
                                enqueued_at: d.enqueued_at,
                                delivered_at: d.delivered_at,
                                retry_count: d.retry_count,
                                loc: ZERO_LOC,
                                shared: d.shared,
                                attempts: None,
                            };
                            (id, delivered)
                        })
                        .collect(),
                },
            );
        }
        SpoolState {
            epoch: self.epoch,
            next_message_id: 0,
            queues,
            cluster_config: None,
            retired_nodes: Vec::new(),
            event_types: self.event_types.clone(),
            event_keys: self
                .event_keys
                .iter()
                .filter(|(_, first_at, _, _, _)| first_at + EVENT_WINDOW_MS > now)
                .map(
                    |(key, first_at, id, deliveries, (event_type, body, _, okey))| EventKeyEntry {
                        hash: engine.tokens().dedup_hash("\0events", &format!("ev-{key}")),
                        first_at: *first_at,
                        id: *id,
                        fingerprint: Some(fingerprint(event_type, body, *okey)),
                        deliveries: deliveries.clone(),
                    },
                )
                .collect(),
        }
    }
}

/// `events.dedup_window`'s default.
const EVENT_WINDOW_MS: i64 = 24 * 3_600_000;

const ZERO_LOC: spoold::testing::RecordLoc = spoold::testing::RecordLoc {
    file: 0,
    offset: 0,
    len: 0,
};

/// The engine's state as the model sees it: no locations, dedup keys only
/// inside their window, the next id checked apart.
fn actual(engine: &Engine, now: i64, model: &Model, label: &str) -> SpoolState {
    let mut state = engine.state().without_locations();
    assert!(
        state.next_message_id > model.max_id,
        "{label}: next id {} would reuse an answered id (up to {})",
        state.next_message_id,
        model.max_id
    );
    state.next_message_id = 0;
    state
        .event_keys
        .retain(|k| k.first_at + EVENT_WINDOW_MS > now);
    for q in state.queues.values_mut() {
        let window = q.queue.settings.dedup_window_ms as i64;
        q.dedup.retain(|d| d.first_at + window > now);
        for m in &mut q.messages {
            // Attempts come only from push delivery, which the model does
            // not drive.
            assert!(m.attempts.is_none(), "{label}");
        }
    }
    state
}

fn check_state(engine: &Engine, model: &Model, now: i64, label: &str) {
    let actual = actual(engine, now, model, label);
    let expected = model.expected(engine, now);
    if actual != expected {
        panic!(
            "{label}: state differs\n{}",
            diff(&format!("{expected:#?}"), &format!("{actual:#?}"))
        );
    }
    for id in &model.gone {
        assert!(
            !engine.all_messages().iter().any(|m| m.1 == *id),
            "{label}: settled {id:?} came back"
        );
    }
}

/// The lines where two debug dumps differ (expected, then actual).
fn diff(expected: &str, actual: &str) -> String {
    let e: Vec<&str> = expected.lines().collect();
    let a: Vec<&str> = actual.lines().collect();
    let mut out = String::new();
    for i in 0..e.len().max(a.len()) {
        let (x, y) = (e.get(i).copied(), a.get(i).copied());
        if x != y {
            out.push_str(&format!(
                "line {i}: expected {:?}\n        actual   {:?}\n",
                x.unwrap_or(""),
                y.unwrap_or("")
            ));
            if out.len() > 4000 {
                break;
            }
        }
    }
    out
}

struct World {
    sim: SimStorage,
    clock: ManualClock,
    options: spoold::engine::EngineOptions,
    engine: Engine,
    model: Model,
}

impl World {
    fn now(&self) -> i64 {
        use spoold::time::Clock;
        self.clock.now_ms()
    }

    /// Power loss. The old engine's threads are stopped first (nothing is
    /// pending: every operation was awaited), as a dead process's would be,
    /// so that none of them touches the disk after it.
    async fn crash(&mut self, tear: Tear, label: &str) {
        self.engine.close();
        self.sim.crash(tear);
        self.reopen(label).await;
    }

    async fn reopen(&mut self, label: &str) {
        self.engine = Engine::open(self.options.clone())
            .await
            .unwrap_or_else(|e| panic!("{label}: replay failed: {e}"))
            .0;
        self.model.epoch += 1;
        self.model.leases.clear();
        for q in self.model.queues.values_mut() {
            q.breaker = false;
        }
        self.adopt_in_doubt(label);
    }

    /// A send or event whose fsync failed may have reached the disk after
    /// all; if replay found it, the model takes it in (once; an event with
    /// every one of its deliveries or none).
    fn adopt_in_doubt(&mut self, label: &str) {
        let state = self.engine.state();
        let mut events: BTreeMap<String, Vec<(String, MessageId)>> = BTreeMap::new();
        for q in state.queues.values() {
            for m in &q.messages {
                if self.model.messages.contains_key(&m.id) {
                    continue;
                }
                let queue = if m.in_failure_queue {
                    format!("{}.failed", q.queue.name)
                } else {
                    q.queue.name.clone()
                };
                let payload = self.engine.payload(&queue, m.id).unwrap();
                let text = String::from_utf8(payload.body.to_vec()).unwrap();
                assert!(!self.model.gone.contains(&m.id), "{label}");
                assert!(m.failure.is_none() && m.retry_count == 0, "{label}");
                if let Some(tag) = &payload.event {
                    assert!(
                        self.model.in_doubt_events.contains_key(&text),
                        "{label}: unexpected event delivery {text} in {queue}"
                    );
                    assert!(m.shared, "{label}");
                    events
                        .entry(text.clone())
                        .or_default()
                        .push((q.queue.name.clone(), m.id));
                    self.model.max_id = self.model.max_id.max(tag.id.0);
                } else {
                    assert!(
                        self.model.in_doubt.remove(&text),
                        "{label}: unexpected message {text} in {queue}"
                    );
                }
                self.model.max_id = self.model.max_id.max(m.id.0);
                self.model.messages.insert(
                    m.id,
                    ModelMessage {
                        queue: q.queue.name.clone(),
                        failed: None,
                        retry_count: 0,
                        enqueued_at: m.enqueued_at,
                        visible_at: m.visible_at,
                        retention_from: m.retention_from,
                        shared: payload.event.is_some(),
                        body: text,
                        // In-doubt sends and events carry no ordering key.
                        key: None,
                    },
                );
            }
        }
        for (text, mut found) in events {
            let (queues, key) = self.model.in_doubt_events.remove(&text).unwrap();
            found.sort();
            let reached: Vec<&String> = found.iter().map(|(q, _)| q).collect();
            assert_eq!(
                reached,
                queues.iter().collect::<Vec<_>>(),
                "{label}: event {text} came back with only some of its deliveries"
            );
            if let Some(key) = key {
                let (queue, id) = &found[0];
                let tag = self.engine.payload(queue, *id).unwrap().event.unwrap();
                let at = self.model.messages[id].enqueued_at;
                let said = (tag.event_type.clone(), text.clone(), false, None);
                self.model.event_keys.push((key, at, tag.id, found, said));
            }
        }
        // What replay did not find is gone for good.
        self.model.in_doubt.clear();
        self.model.in_doubt_events.clear();
    }

    /// An event of `event_type` (the body new), with the model's
    /// bookkeeping; with `retry`, a key already seen comes with what its
    /// first event said, as a retry does (else a new body: the key is
    /// reused for another event and refused).
    async fn event(
        &mut self,
        event_type: &str,
        key: Option<u8>,
        retry: bool,
        (eu, okey): (bool, Option<u8>),
        label: &str,
    ) {
        let now = self.now();
        let first = key.and_then(|k| {
            self.model
                .event_keys
                .iter()
                .find(|(key, at, _, _, _)| *key == k && at + EVENT_WINDOW_MS > now)
                .cloned()
        });
        let (event_type, text, eu, okey) = match &first {
            Some((_, _, _, _, said)) if retry => said.clone(),
            _ => (event_type.to_owned(), self.model.new_body(), eu, okey),
        };
        let region = if eu { "eu" } else { "us" };
        let request = EventRequest {
            event_type: event_type.clone(),
            tenant: None,
            payload: Payload {
                ordering_key: okey.map(ordering_key),
                ..body(&text).payload
            },
            dedup_key: key.map(|k| format!("ev-{k}")),
            headers: [("x-region".to_owned(), serde_json::json!(region))]
                .into_iter()
                .collect(),
            publisher: Publisher::Client,
        };
        let out = self.engine.publish(request).await;
        if let Some((_, _, id, deliveries, _)) = &first {
            if !retry {
                assert!(
                    matches!(out, Err(EventError::KeyReused)),
                    "{label}: a key reused for another event: {out:?}"
                );
                return;
            }
            let out = out.unwrap_or_else(|e| panic!("{label}: {e}"));
            assert!(out.deduplicated, "{label}: key inside its window");
            assert_eq!((&out.id, &out.deliveries), (id, deliveries), "{label}");
            return;
        }
        let out = out.unwrap_or_else(|e| panic!("{label}: {e}"));
        assert!(!out.deduplicated, "{label}");
        let queues: Vec<&String> = out.deliveries.iter().map(|(q, _)| q).collect();
        let expected = self.model.subscribers(&event_type, eu);
        assert_eq!(queues, expected.iter().collect::<Vec<_>>(), "{label}");
        self.model.answered(out.id, label);
        for (queue, id) in &out.deliveries {
            self.model.answered(*id, label);
            self.model.sent(*id, queue.clone(), now, now, text.clone());
            let m = self.model.messages.get_mut(id).unwrap();
            m.shared = true;
            m.key = okey;
        }
        if let Some(k) = key {
            self.model.event_keys.push((
                k,
                now,
                out.id,
                out.deliveries,
                (event_type, text, eu, okey),
            ));
        }
    }

    /// A send to `queue`, with the model's bookkeeping.
    async fn send(
        &mut self,
        queue: &str,
        delay_ms: u64,
        key: Option<u8>,
        okey: Option<u8>,
        label: &str,
    ) {
        let now = self.now();
        let text = self.model.new_body();
        let mut request = SendRequest {
            delay_ms,
            dedup_key: key.map(|k| format!("key-{k}")),
            ..body(&text)
        };
        request.payload.ordering_key = okey.map(ordering_key);
        let out = self.engine.send(queue, request).await;
        let Some(settings) = self.model.settings(queue).cloned() else {
            assert!(
                matches!(out, Err(SendError::QueueNotFound { .. })),
                "{label}: {out:?}"
            );
            return;
        };
        let window = settings.dedup_window_ms as i64;
        if key.is_some() && window == 0 {
            assert!(
                matches!(out, Err(SendError::KeyWithoutWindow { .. })),
                "{label}: a key without a window: {out:?}"
            );
            return;
        }
        let out = out.unwrap_or_else(|e| panic!("{label}: {e}"));
        let live_key = key.and_then(|k| {
            self.model
                .keys
                .get(&(queue.to_string(), k))
                .filter(|(first, _)| first + window > now)
                .map(|&(_, id)| id)
        });
        match live_key {
            Some(first) => {
                assert!(out.deduplicated, "{label}: key inside its window");
                assert_eq!(out.id, first, "{label}");
            }
            None => {
                assert!(!out.deduplicated, "{label}");
                self.model.answered(out.id, label);
                if let Some(k) = key {
                    self.model
                        .keys
                        .insert((queue.to_string(), k), (now, out.id));
                }
                let visible_at = now + delay_ms as i64;
                self.model
                    .sent(out.id, queue.to_string(), now, visible_at, text);
                self.model.messages.get_mut(&out.id).unwrap().key = okey;
            }
        }
    }

    /// The first queue that exists, for faults that need a send.
    fn some_queue(&self) -> Option<String> {
        self.model.queues.keys().next().cloned()
    }
}

async fn run(ops: Vec<Op>, small_preallocated_segments: bool) {
    let sim = SimStorage::new();
    let clock = ManualClock::new(START_MS);
    let mut options = sim_options(&sim, &clock);
    if small_preallocated_segments {
        options.segment_bytes = 512;
        options.preallocate = true;
    } else {
        options.segment_bytes = 4096;
    }
    let engine = Engine::open(options.clone()).await.unwrap().0;
    let mut w = World {
        sim,
        clock,
        options,
        engine,
        model: Model {
            epoch: 1,
            ..Model::default()
        },
    };
    for q in QUEUES {
        make_queue(&w.engine, q, base_settings(q)).await;
        w.model.queues.insert(
            q.to_string(),
            ModelQueue {
                settings: base_settings(q),
                paused: false,
                breaker: false,
            },
        );
    }

    for (step, op) in ops.into_iter().enumerate() {
        let now = w.now();
        let label = format!("step {step}: {op:?}");
        match op {
            Op::Send {
                queue,
                delay_ms,
                key,
                okey,
            } => w.send(QUEUES[queue], delay_ms, key, okey, &label).await,
            Op::Event {
                kind,
                key,
                retry,
                eu,
                okey,
            } => w.event(TYPES[kind], key, retry, (eu, okey), &label).await,
            Op::Receive { queue, failed, max } => {
                let queue = if failed {
                    format!("{}.failed", QUEUES[queue])
                } else {
                    QUEUES[queue].to_string()
                };
                let base = queue.trim_end_matches(".failed").to_string();
                let got = w.engine.receive(&queue, max, Duration::ZERO).await;
                if !w.model.queues.contains_key(&base) {
                    assert!(
                        matches!(got, Err(LeaseError::QueueNotFound { .. })),
                        "{label}"
                    );
                    continue;
                }
                let got = got.unwrap();
                let expected: Vec<MessageId> =
                    w.model.line(&queue, now).into_iter().take(max).collect();
                let ids: Vec<MessageId> = got.iter().map(|d| d.id).collect();
                assert_eq!(ids, expected, "{label}");
                for d in got {
                    let m = &w.model.messages[&d.id];
                    assert_eq!(d.retry_count, m.retry_count, "{label}");
                    assert_eq!(d.payload.body, m.body.as_bytes(), "{label}");
                    let expires_at = now + w.model.lease_ms(&queue);
                    w.model.leases.push(ModelLease {
                        queue: queue.clone(),
                        id: d.id,
                        token: d.token,
                        expires_at,
                    });
                }
            }
            Op::Ack(i) | Op::Nack { lease: i, .. } | Op::Renew(i) if i >= w.model.leases.len() => {}
            Op::Ack(i) => {
                let lease = w.model.leases[i].clone();
                let valid = now < lease.expires_at;
                let result = w.engine.ack(&lease.queue, &lease.token).await;
                assert_eq!(result.is_ok(), valid, "{label}: {result:?}");
                if valid {
                    w.model.acked(lease.id, now);
                } else {
                    assert!(matches!(result, Err(SettleError::StaleLease)), "{label}");
                }
            }
            Op::Resend(i) => {
                if w.model.history.is_empty() {
                    continue;
                }
                let n = w.model.history.len();
                let (&id, d) = w.model.history.iter().nth(i % n).expect("i % n < n");
                let (queue, body) = (d.queue.clone(), d.body.clone());
                let new_id = w
                    .engine
                    .resend(&queue, id)
                    .await
                    .unwrap_or_else(|e| panic!("{label}: {e}"));
                w.model.answered(new_id, &label);
                w.model.sent(new_id, queue.clone(), now, now, body);
                let payload = w.engine.payload(&queue, new_id).unwrap();
                assert_eq!(payload.resent_from, Some(id), "{label}");
            }
            Op::Nack { lease: i, delay_ms } => {
                let lease = w.model.leases[i].clone();
                let valid = now < lease.expires_at;
                let result = w.engine.nack(&lease.queue, &lease.token, delay_ms).await;
                assert_eq!(result.is_ok(), valid, "{label}: {result:?}");
                if valid {
                    w.model.leases.remove(i);
                    w.model.retry(lease.id, now + delay_ms as i64, now);
                }
            }
            Op::Renew(i) => {
                let lease_ms = w.model.lease_ms(&w.model.leases[i].queue);
                let lease = &mut w.model.leases[i];
                let valid = now < lease.expires_at;
                let result = w.engine.renew(&lease.queue, &lease.token);
                assert_eq!(result.is_ok(), valid, "{label}: {result:?}");
                if let Ok(expires_at) = result {
                    lease.expires_at = now + lease_ms;
                    assert_eq!(expires_at, lease.expires_at, "{label}");
                }
            }
            Op::Cancel(i) => {
                let Some((&id, m)) = w.model.messages.iter().nth(i) else {
                    continue;
                };
                let queue = m.queue_name();
                w.engine.cancel(&queue, id).await.unwrap();
                w.model.remove(id);
            }
            Op::RetryNow(i) => {
                let Some((&id, m)) = w.model.messages.iter().nth(i) else {
                    continue;
                };
                let queue = m.queue_name();
                let lease = w.model.leases.iter().find(|l| l.id == id);
                if lease.is_some_and(|l| now >= l.expires_at) {
                    // Expired, not yet taken back by the timer: either
                    // answer is right; the timer's turn is modelled by Due.
                    continue;
                }
                let delayed = lease.is_none() && m.failed.is_none() && m.visible_at > now;
                let answer = w.engine.retry_now(&queue, id).await;
                if delayed {
                    answer.unwrap_or_else(|e| panic!("{label}: {e}"));
                    w.model.messages.get_mut(&id).unwrap().visible_at = now;
                } else {
                    assert!(
                        matches!(answer, Err(MessageError::NotDelayed { .. })),
                        "{label}: {answer:?}"
                    );
                }
            }
            Op::Purge {
                queue,
                failed,
                filter,
                max,
            } => {
                let base = QUEUES[queue];
                let name = if failed {
                    format!("{base}.failed")
                } else {
                    base.to_string()
                };
                let f = filter.at(now, None);
                let limit = max.unwrap_or(usize::MAX);
                let dry = w.engine.purge(&name, &f, limit, true).await;
                let purged = w.engine.purge(&name, &f, limit, false).await;
                if filter.has_terms() && !failed {
                    for answer in [dry, purged] {
                        assert!(
                            matches!(answer, Err(QueueError::NotAFailureQueue { .. })),
                            "{label}: {answer:?}"
                        );
                    }
                    continue;
                }
                if !w.model.queues.contains_key(base) {
                    for answer in [dry, purged] {
                        assert!(
                            matches!(answer, Err(QueueError::NotFound { .. })),
                            "{label}"
                        );
                    }
                    continue;
                }
                let matched: Vec<MessageId> = w
                    .model
                    .messages
                    .iter()
                    .filter(|(_, m)| m.queue_name() == name && filter.matches(now, m))
                    .map(|(id, _)| *id)
                    .collect();
                let picked: Vec<MessageId> = matched
                    .iter()
                    .copied()
                    .take(max.unwrap_or(usize::MAX))
                    .collect();
                let expected = BulkOutcome {
                    done: picked.len() as u64,
                    matched: matched.len() as u64,
                    remaining: (matched.len() - picked.len()) as u64,
                };
                assert_eq!(dry.unwrap(), expected, "{label}: dry run");
                assert_eq!(purged.unwrap(), expected, "{label}");
                for id in picked {
                    w.model.remove(id);
                }
            }
            Op::Redrive {
                queue,
                pick,
                filter,
                max,
                by_failed_name,
            } => {
                let base = QUEUES[queue];
                let failed = format!("{base}.failed");
                let named = if by_failed_name {
                    failed.as_str()
                } else {
                    base
                };
                let ids: Option<Vec<MessageId>> = pick.map(|places| {
                    places
                        .iter()
                        .filter_map(|&i| w.model.messages.keys().nth(i).copied())
                        .collect()
                });
                let f = filter.at(now, ids.as_deref());
                let dry = w.engine.redrive(named, &f, max, true).await;
                if !w.model.queues.contains_key(base) {
                    assert!(matches!(dry, Err(QueueError::NotFound { .. })), "{label}");
                    continue;
                }
                // Each named id once; matched counts leased ones too, only
                // unleased ones move.
                let ids_once: Option<BTreeSet<MessageId>> =
                    ids.as_ref().map(|ids| ids.iter().copied().collect());
                let matched: Vec<MessageId> = w
                    .model
                    .messages
                    .iter()
                    .filter(|(id, m)| {
                        m.queue_name() == failed
                            && filter.matches(now, m)
                            && ids_once.as_ref().is_none_or(|only| only.contains(id))
                    })
                    .map(|(id, _)| *id)
                    .collect();
                let expected: Vec<MessageId> = matched
                    .iter()
                    .copied()
                    .filter(|id| w.model.lease_of(*id).is_none())
                    .take(max)
                    .collect();
                let outcome = |done: usize| BulkOutcome {
                    done: done as u64,
                    matched: matched.len() as u64,
                    remaining: (matched.len() - done) as u64,
                };
                assert_eq!(dry.unwrap(), outcome(expected.len()), "{label}: dry run");
                let moved = w.engine.redrive(named, &f, max, false).await;
                assert_eq!(moved.unwrap(), outcome(expected.len()), "{label}");
                for id in expected {
                    let m = w.model.messages.get_mut(&id).unwrap();
                    m.failed = None;
                    m.retry_count = 0;
                    m.visible_at = now;
                    m.retention_from = now;
                }
            }
            Op::PeekFailed { queue, filter } => {
                let base = QUEUES[queue];
                let failed = format!("{base}.failed");
                let peeked = w.engine.peek(&failed, &filter.at(now, None), None, 1_000);
                if !w.model.queues.contains_key(base) {
                    assert!(peeked.is_err(), "{label}");
                    continue;
                }
                let got: Vec<MessageId> = peeked.unwrap().iter().map(|v| v.id).collect();
                let expected: Vec<MessageId> = w
                    .model
                    .messages
                    .iter()
                    .filter(|(_, m)| m.queue_name() == failed && filter.matches(now, m))
                    .map(|(id, _)| *id)
                    .collect();
                assert_eq!(got, expected, "{label}");
            }
            Op::Upsert { queue, change } => {
                let name = QUEUES[queue];
                let current = w
                    .model
                    .settings(name)
                    .cloned()
                    .unwrap_or_else(|| base_settings(name));
                let settings = changed(current.clone(), change);
                // Keys that left the old window are forgotten by the change.
                let old_window = current.dedup_window_ms as i64;
                w.model
                    .keys
                    .retain(|(q, _), (first, _)| q != name || *first + old_window > now);
                let created = w
                    .engine
                    .upsert_queue(name, settings.clone(), Origin::Api)
                    .await
                    .unwrap();
                assert_eq!(created, !w.model.queues.contains_key(name), "{label}");
                let q = w
                    .model
                    .queues
                    .entry(name.to_string())
                    .or_insert(ModelQueue {
                        settings: settings.clone(),
                        paused: false,
                        breaker: false,
                    });
                q.settings = settings;
                if q.settings.history_retention_ms == 0 {
                    w.model.history.retain(|_, d| d.queue != name);
                }
            }
            Op::Delete(queue) => {
                let name = QUEUES[queue];
                let deleted = w.engine.delete_queue(name, Origin::Api).await;
                if w.model.queues.remove(name).is_none() {
                    assert!(
                        matches!(deleted, Err(QueueError::NotFound { .. })),
                        "{label}"
                    );
                    continue;
                }
                deleted.unwrap();
                let ids: Vec<MessageId> = w
                    .model
                    .messages
                    .iter()
                    .filter(|(_, m)| m.queue == name)
                    .map(|(id, _)| *id)
                    .collect();
                for id in ids {
                    w.model.remove(id);
                }
                w.model.keys.retain(|(q, _), _| q != name);
                w.model.history.retain(|_, d| d.queue != name);
            }
            Op::Pause { queue, paused } => {
                let name = QUEUES[queue];
                let result = w.engine.set_paused(name, paused).await;
                match w.model.queues.get_mut(name) {
                    Some(q) => {
                        result.unwrap();
                        q.paused = paused;
                    }
                    None => assert!(
                        matches!(result, Err(QueueError::NotFound { .. })),
                        "{label}"
                    ),
                }
            }
            Op::DefineType { ty, text } => {
                let definition = EventTypeDef {
                    description: format!("type {ty}, text {text}"),
                    ..EventTypeDef::default()
                };
                w.engine
                    .put_event_type(TYPES[ty], &definition)
                    .await
                    .unwrap();
                let stored = serde_json::to_vec(&definition).unwrap();
                w.model.event_types.insert(TYPES[ty].to_owned(), stored);
            }
            Op::RemoveType(ty) => {
                let result = w.engine.delete_event_type(TYPES[ty]).await;
                match w.model.event_types.remove(TYPES[ty]) {
                    Some(_) => result.unwrap(),
                    None => assert!(
                        matches!(result, Err(CatalogueError::NotFound(_))),
                        "{label}: {result:?}"
                    ),
                }
            }
            Op::Breaker { queue, open } => {
                let name = QUEUES[queue];
                w.engine.set_breaker(name, open.then_some(now + 5_000));
                if let Some(q) = w.model.queues.get_mut(name) {
                    q.breaker = open;
                }
            }
            Op::Advance(ms) => w.clock.advance_ms(ms),
            Op::Due => {
                let expected = due(&mut w.model, now);
                let written = w.engine.run_due().await;
                assert_eq!(written, expected, "{label}");
            }
            Op::FailWrite => {
                let Some(queue) = w.some_queue() else {
                    continue;
                };
                w.sim.fail_write(0, io::ErrorKind::StorageFull);
                let err = w
                    .engine
                    .send(&queue, body("never stored"))
                    .await
                    .unwrap_err();
                assert!(
                    matches!(err, SendError::Write(WriteError::Unavailable { .. })),
                    "{label}: {err:?}"
                );
            }
            Op::FullDisk { room } => {
                let Some(queue) = w.some_queue() else {
                    continue;
                };
                let text = w.model.new_body();
                w.sim.set_capacity(Some(w.sim.total_bytes() + room));
                let sent = w.engine.send(&queue, body(&text)).await;
                w.sim.set_capacity(None);
                match sent {
                    Ok(out) => {
                        w.model.answered(out.id, &label);
                        w.model.sent(out.id, queue, now, now, text);
                    }
                    // Rolled back: not stored.
                    Err(SendError::Write(WriteError::Unavailable { .. })) => {}
                    Err(other) => panic!("{label}: {other:?}"),
                }
            }
            Op::Compact { force } => {
                w.engine
                    .compact_all(force)
                    .await
                    .unwrap_or_else(|e| panic!("{label}: {e}"));
            }
            Op::CompactBesideApplier { sends } => {
                let Some(queue) = w.some_queue() else {
                    continue;
                };
                let records = w.engine.journal_stats().records;
                w.engine.hold_apply(true);
                let mut tasks = Vec::new();
                let mut bodies = Vec::new();
                for _ in 0..sends {
                    let text = w.model.new_body();
                    let engine = w.engine.clone();
                    let q = queue.clone();
                    let t = text.clone();
                    bodies.push(text);
                    tasks.push(tokio::spawn(async move { engine.send(&q, body(&t)).await }));
                    // One batch each, so that segments rotate while the
                    // applier is held.
                    while w.engine.journal_stats().records < records + tasks.len() as u64 {
                        tokio::task::yield_now().await;
                        std::thread::sleep(Duration::from_micros(200));
                    }
                }
                let compacted = w.engine.compact_all(true).await;
                w.engine.hold_apply(false);
                compacted.unwrap_or_else(|e| panic!("{label}: {e}"));
                for (task, text) in tasks.into_iter().zip(bodies) {
                    let out = task
                        .await
                        .unwrap()
                        .unwrap_or_else(|e| panic!("{label}: {e}"));
                    w.model.answered(out.id, &label);
                    w.model.sent(out.id, queue.clone(), now, now, text);
                }
            }
            Op::CompactCut { cut, tear } => {
                w.sim.cut_power_after(cut);
                let _ = w.engine.compact_all(true).await;
                if w.sim.power_is_cut() || w.engine.is_poisoned() {
                    w.crash(tear.tear(), &label).await;
                } else {
                    w.sim.heal();
                }
            }
            Op::Crash { in_doubt, tear } => {
                if in_doubt > 0
                    && let Some(queue) = w.some_queue()
                {
                    // Slow fsyncs, so that several sends share the batch
                    // whose fsync fails.
                    w.sim.set_sync_delay(Some(Duration::from_millis(2)));
                    w.sim.fail_sync(1);
                    let mut tasks = Vec::new();
                    for _ in 0..in_doubt + 1 {
                        let text = w.model.new_body();
                        let engine = w.engine.clone();
                        let q = queue.clone();
                        let t = text.clone();
                        tasks.push((
                            text,
                            tokio::spawn(async move { engine.send(&q, body(&t)).await }),
                        ));
                    }
                    // And an event, whose deliveries come back all or none.
                    let text = w.model.new_body();
                    // No region header: no filtered queue takes it.
                    let subscribers = w.model.subscribers("invoice.paid", false);
                    let engine = w.engine.clone();
                    let request = EventRequest {
                        event_type: "invoice.paid".into(),
                        tenant: None,
                        payload: body(&text).payload,
                        dedup_key: None,
                        headers: Default::default(),
                        publisher: Publisher::Client,
                    };
                    let event = tokio::spawn(async move { engine.publish(request).await });
                    for (text, task) in tasks {
                        match task.await.unwrap() {
                            Ok(out) => {
                                w.model.answered(out.id, &label);
                                w.model.sent(out.id, queue.clone(), now, now, text);
                            }
                            // The record's fsync failed, or it came after
                            // the failure: it may be there.
                            Err(SendError::Write(
                                WriteError::Unconfirmed { .. } | WriteError::Unavailable { .. },
                            )) => {
                                w.model.in_doubt.insert(text);
                            }
                            Err(other) => panic!("{label}: {other:?}"),
                        }
                    }
                    match event.await.unwrap() {
                        Ok(out) => {
                            w.model.answered(out.id, &label);
                            for (q, id) in &out.deliveries {
                                w.model.answered(*id, &label);
                                w.model.sent(*id, q.clone(), now, now, text.clone());
                                w.model.messages.get_mut(id).unwrap().shared = true;
                            }
                        }
                        Err(EventError::Write(
                            WriteError::Unconfirmed { .. } | WriteError::Unavailable { .. },
                        )) => {
                            w.model.in_doubt_events.insert(text, (subscribers, None));
                        }
                        Err(other) => panic!("{label}: {other:?}"),
                    }
                }
                w.crash(tear.tear(), &label).await;
            }
            Op::Restart => {
                w.engine.close();
                w.reopen(&label).await;
            }
        }
        check_state(&w.engine, &w.model, w.now(), &label);
    }
}

/// What `Engine::run_due` does at `now`, in the model; returns how many
/// records it writes. Leases that ended are retried (or failed); then
/// unleased messages past retention are discarded or failed. A message
/// whose lease ended in this pass is not also expired in it.
fn due(model: &mut Model, now: i64) -> usize {
    let expired: Vec<ModelLease> = model
        .leases
        .iter()
        .filter(|l| l.expires_at <= now)
        .cloned()
        .collect();
    let mut written = expired.len();
    let expired_ids: BTreeSet<MessageId> = expired.iter().map(|l| l.id).collect();
    let mut past = Vec::new();
    for (id, m) in &model.messages {
        let settings = model.settings(&m.queue).unwrap();
        if m.retention_from + settings.retention_ms as i64 <= now
            && model.lease_of(*id).is_none()
            && !expired_ids.contains(id)
        {
            let fail = m.failed.is_none() && settings.on_expire == OnExpire::Fail;
            past.push((*id, fail));
        }
    }
    model.leases.retain(|l| l.expires_at > now);
    for l in expired {
        model.retry(l.id, now, now);
    }
    // Per queue, one record forgets its history past retention.
    let mut dropped = BTreeSet::new();
    model.history.retain(|_, d| {
        let keep_ms = model.queues[&d.queue].settings.history_retention_ms as i64;
        let expired = d.delivered_at + keep_ms <= now;
        if expired {
            dropped.insert(d.queue.clone());
        }
        !expired
    });
    written += dropped.len();
    written += past.len();
    for (id, fail) in past {
        if fail {
            let m = model.messages.get_mut(&id).unwrap();
            m.failed = Some((FailReason::Expired, now));
            m.visible_at = now;
            m.retention_from = now;
        } else {
            model.remove(id);
        }
    }
    written
}

fn cases() -> u32 {
    std::env::var("MODEL_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(128)
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: cases(),
        failure_persistence: Some(Box::new(
            proptest::test_runner::FileFailurePersistence::Direct("proptest-regressions/model.txt"),
        )),
        ..ProptestConfig::default()
    })]

    #[test]
    fn journal_and_state_machine_match_the_model(
        ops in proptest::collection::vec(op(), 1..150),
        small_preallocated_segments in proptest::bool::ANY,
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(run(ops, small_preallocated_segments));
    }
}
