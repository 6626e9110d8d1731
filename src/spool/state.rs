//! The state machine proper: every queue, message, lease and counter.
//!
//! Two kinds of methods:
//!
//! - [`Spool::apply`] takes a journal [`Record`] that is already durable and
//!   changes the state. It is deterministic and total: a record that refers
//!   to something no longer there is a no-op, so replay and the live process
//!   always end in the same state.
//! - Everything else reads the state or makes an in-memory *reservation*
//!   before a record is appended: a lease, a message marked `pending` while
//!   its removal is being written, a lease marked `settling` while its ack
//!   is. Reservations are never journaled; a restart drops them, as the contract
//!   says it drops leases.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::Arc;

use super::command::{Command, EnqueueMeta, EventMeta, FailReason, MessageId, Record};
use super::event::Subscriptions;
use super::filter::{DeadLetterFilter, Selection};
use super::queue::{OnExpire, QueueSettings, failed_queue_name};
use crate::journal::RecordLoc;
use crate::time::Millis;

/// One message, as memory keeps it: times, counts and where its record is.
/// Payload, content type and stored request stay on disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Message {
    pub enqueued_at: Millis,
    /// When it became (or becomes) visible; its place in line.
    pub visible_at: Millis,
    /// Retention runs from here.
    pub retention_from: Millis,
    pub loc: RecordLoc,
    pub retry_count: u32,
    /// A removal or move of this message is being written.
    pub pending: bool,
    /// Its record is an event's, which other messages (the event's other
    /// deliveries) point at too.
    pub shared: bool,
}

/// A delivered message kept in its queue's history (`history_retention`):
/// times, counts and where its records are. Payload and attempts stay on
/// disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Delivered {
    pub enqueued_at: Millis,
    pub delivered_at: Millis,
    pub retry_count: u32,
    pub loc: RecordLoc,
    pub shared: bool,
    pub attempts: Option<RecordLoc>,
}

impl Delivered {
    /// As a message view (`state` delivered, `visible_at` its delivery).
    pub fn view(&self, id: MessageId) -> MessageView {
        MessageView {
            id,
            state: MessageState::Delivered,
            message: Message {
                enqueued_at: self.enqueued_at,
                visible_at: self.delivered_at,
                retention_from: self.delivered_at,
                loc: self.loc,
                retry_count: self.retry_count,
                pending: false,
                shared: self.shared,
            },
            failure: None,
        }
    }

    /// Bytes of the records it keeps on disk.
    fn bytes(&self) -> u64 {
        u64::from(self.loc.len) + self.attempts.map_or(0, |a| u64::from(a.len))
    }
}

/// A consumer's (or push worker's) hold on a message. Memory only.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Lease {
    pub serial: u64,
    pub expires_at: Millis,
    /// An ack, nack or expiry of this lease is being written.
    pub settling: bool,
}

/// Why and when a message reached a failure queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FailInfo {
    pub reason: FailReason,
    pub last_status: Option<u16>,
    pub failed_at: Millis,
}

/// Monotonic per-queue counters (docs/contract.md §4 stats).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    pub sent: u64,
    pub acked: u64,
    pub nacked: u64,
    pub expired: u64,
    pub failed: u64,
    pub deduplicated: u64,
    /// Delivery attempts of a push queue, and the failed ones.
    pub deliveries: u64,
    pub delivery_failures: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct QueueId(u32);

/// A map by message id (or dedup hash): SipHash with fixed keys. Its keys
/// are counters and keyed hashes, nothing a client can aim at one bucket;
/// and without the random state each map is 16 bytes smaller, which every
/// one of 100 000 queues (and its failure queue) pays four times.
type IdMap<K, V> = HashMap<K, V, std::hash::BuildHasherDefault<std::hash::DefaultHasher>>;

#[derive(Debug)]
pub(crate) struct Queue {
    pub name: String,
    /// Shared: every failure queue whose queue has the same lease timeout
    /// and retention has the same settings, one copy of them.
    pub settings: Arc<QueueSettings>,
    pub managed_by_config: bool,
    pub paused: bool,
    /// The circuit breaker of a push queue is open, and when its next probe
    /// is due (memory only).
    pub breaker: Option<Millis>,
    /// For a failure queue: the queue it belongs to.
    parent: Option<QueueId>,
    /// For an ordinary queue: its failure queue.
    failed: Option<QueueId>,
    messages: BTreeMap<MessageId, Message>,
    /// Messages waiting for a lease (visible or delayed), in line order.
    ready: BTreeSet<(Millis, MessageId)>,
    /// Every message, by the start of its retention.
    retention: BTreeSet<(Millis, MessageId)>,
    leases: IdMap<MessageId, Lease>,
    lease_expiry: BTreeSet<(Millis, MessageId)>,
    /// Dedup key hash → (first send, message id).
    dedup: IdMap<u64, (Millis, MessageId)>,
    dedup_order: VecDeque<(Millis, u64)>,
    failures: IdMap<MessageId, FailInfo>,
    /// Messages with a retry count above 0 (not kept in a failure queue).
    retrying: BTreeSet<MessageId>,
    /// Where the latest delivery-attempt record of a message is (it carries
    /// the last ten attempts). Only messages a worker has tried have one.
    attempts: IdMap<MessageId, RecordLoc>,
    /// Delivered messages kept for `history_retention`, and the same by
    /// delivery time; the bytes of their records.
    history: BTreeMap<MessageId, Delivered>,
    history_order: BTreeSet<(Millis, MessageId)>,
    history_bytes: u64,
    pub counters: Counters,
}

impl Queue {
    fn new(name: String, settings: Arc<QueueSettings>, managed_by_config: bool) -> Queue {
        Queue {
            name,
            settings,
            managed_by_config,
            paused: false,
            breaker: None,
            parent: None,
            failed: None,
            messages: BTreeMap::new(),
            ready: BTreeSet::new(),
            retention: BTreeSet::new(),
            leases: IdMap::default(),
            lease_expiry: BTreeSet::new(),
            dedup: IdMap::default(),
            dedup_order: VecDeque::new(),
            failures: IdMap::default(),
            retrying: BTreeSet::new(),
            attempts: IdMap::default(),
            history: BTreeMap::new(),
            history_order: BTreeSet::new(),
            history_bytes: 0,
            counters: Counters::default(),
        }
    }

    pub(crate) fn is_failure_queue(&self) -> bool {
        self.parent.is_some()
    }

    pub(crate) fn len(&self) -> usize {
        self.messages.len()
    }

    /// Nothing here for the timer: no message, lease, dedup key or
    /// history entry.
    fn is_idle(&self) -> bool {
        self.messages.is_empty()
            && self.leases.is_empty()
            && self.dedup_order.is_empty()
            && self.history.is_empty()
    }

    fn insert(&mut self, id: MessageId, message: Message) {
        self.ready.insert((message.visible_at, id));
        self.retention.insert((message.retention_from, id));
        if message.retry_count > 0 && !self.is_failure_queue() {
            self.retrying.insert(id);
        }
        self.messages.insert(id, message);
    }

    /// Removes a message from every index (its attempts stay: the caller
    /// moves or forgets them).
    fn take(&mut self, id: MessageId) -> Option<(Message, Option<FailInfo>)> {
        let message = self.messages.remove(&id)?;
        self.ready.remove(&(message.visible_at, id));
        self.retention.remove(&(message.retention_from, id));
        self.retrying.remove(&id);
        if let Some(lease) = self.leases.remove(&id) {
            self.lease_expiry.remove(&(lease.expires_at, id));
        }
        Some((message, self.failures.remove(&id)))
    }

    /// The messages `filter` selects, oldest first: all of them counted,
    /// up to `max` of those `eligible` picked.
    fn select(
        &self,
        filter: &DeadLetterFilter,
        max: usize,
        eligible: impl Fn(MessageId, &Message) -> bool,
    ) -> Selection {
        let mut selection = Selection::default();
        let candidates: Box<dyn Iterator<Item = (MessageId, &Message)>> = match &filter.ids {
            Some(ids) => Box::new(
                ids.iter()
                    .filter_map(|id| self.messages.get(id).map(|m| (*id, m))),
            ),
            None => Box::new(self.messages.iter().map(|(&id, m)| (id, m))),
        };
        for (id, m) in candidates {
            if !filter.matches(id, self.failures.get(&id)) {
                continue;
            }
            selection.matched += 1;
            if selection.picked.len() < max && eligible(id, m) {
                selection.picked.push(id);
            }
        }
        selection
    }

    /// Every remembered dedup key: (hash, first send, id).
    pub(crate) fn dedup_entries(&self) -> impl Iterator<Item = (u64, Millis, MessageId)> + '_ {
        self.dedup
            .iter()
            .map(|(&hash, &(first, id))| (hash, first, id))
    }

    /// Every message as a checkpoint entry, ids ascending.
    pub(crate) fn message_entries(
        &self,
        in_failure_queue: bool,
    ) -> impl Iterator<Item = super::checkpoint::MessageEntry> + '_ {
        self.messages
            .iter()
            .map(move |(&id, m)| super::checkpoint::MessageEntry {
                id,
                in_failure_queue,
                enqueued_at: m.enqueued_at,
                visible_at: m.visible_at,
                retention_from: m.retention_from,
                retry_count: m.retry_count,
                loc: m.loc,
                shared: m.shared,
                attempts: self.attempts.get(&id).copied(),
                failure: self.failures.get(&id).copied(),
            })
    }

    /// Every history entry, ids ascending.
    pub(crate) fn history_entries(&self) -> impl Iterator<Item = (MessageId, &Delivered)> + '_ {
        self.history.iter().map(|(&id, d)| (id, d))
    }

    /// One history entry.
    pub(crate) fn delivered(&self, id: MessageId) -> Option<&Delivered> {
        self.history.get(&id)
    }

    /// History entries delivered at or after `since` and before `until`,
    /// newest first, after the entry `before` (a cursor).
    pub(crate) fn history_newest_first(
        &self,
        since: Option<Millis>,
        until: Option<Millis>,
        before: Option<(Millis, MessageId)>,
    ) -> impl Iterator<Item = (MessageId, &Delivered)> + '_ {
        let hi = match (until, before) {
            (Some(u), Some(b)) => std::cmp::min((u, MessageId(0)), b),
            (Some(u), None) => (u, MessageId(0)),
            (None, Some(b)) => b,
            (None, None) => (Millis::MAX, MessageId(0)),
        };
        let lo = (since.unwrap_or(Millis::MIN), MessageId(0));
        let range = if lo < hi {
            Some(self.history_order.range(lo..hi))
        } else {
            None
        };
        range
            .into_iter()
            .flatten()
            .rev()
            .map(|&(_, id)| (id, &self.history[&id]))
    }

    /// Adds a history entry (a delivery, or from a checkpoint).
    fn remember(&mut self, id: MessageId, d: Delivered) {
        self.history_bytes += d.bytes();
        self.history_order.insert((d.delivered_at, id));
        self.history.insert(id, d);
    }

    /// Removes a history entry; the caller releases its records.
    fn forget(&mut self, id: MessageId) -> Option<Delivered> {
        let d = self.history.remove(&id)?;
        self.history_order.remove(&(d.delivered_at, id));
        self.history_bytes -= d.bytes();
        Some(d)
    }

    /// The oldest history entries beyond the queue's bounds: all of them
    /// when history is off, else the oldest while the bytes pass
    /// `history_max_bytes`.
    fn history_over_bounds(&self) -> Vec<MessageId> {
        if self.settings.history_retention_ms == 0 {
            return self.history.keys().copied().collect();
        }
        let mut bytes = self.history_bytes;
        let mut out = Vec::new();
        for &(_, id) in &self.history_order {
            if bytes <= self.settings.history_max_bytes {
                break;
            }
            bytes -= self.history[&id].bytes();
            out.push(id);
        }
        out
    }

    fn prune_dedup(&mut self, now: Millis) {
        let window = self.settings.dedup_window_ms as i64;
        while let Some(&(at, hash)) = self.dedup_order.front() {
            if at + window > now {
                break;
            }
            self.dedup_order.pop_front();
            if self.dedup.get(&hash).is_some_and(|&(first, _)| first == at) {
                self.dedup.remove(&hash);
            }
        }
    }
}

/// Failure queues' settings, one copy per (lease timeout, retention).
#[derive(Debug, Default)]
struct FailureSettings(HashMap<(u64, u64), Arc<QueueSettings>>);

impl FailureSettings {
    fn of(&mut self, parent: &QueueSettings) -> Arc<QueueSettings> {
        self.0
            .entry((parent.lease_timeout_ms, parent.retention_ms))
            .or_insert_with(|| Arc::new(failure_queue_settings(parent)))
            .clone()
    }
}

/// The settings a failure queue takes from its queue: an ordinary pull queue
/// with the parent's retention and lease timeout, and no retry limit.
fn failure_queue_settings(parent: &QueueSettings) -> QueueSettings {
    QueueSettings {
        lease_timeout_ms: parent.lease_timeout_ms,
        retention_ms: parent.retention_ms,
        ..QueueSettings::default()
    }
}

/// What applying a record did, for the engine's answer (in replicated
/// mode it travels back from Raft's state machine, hence serde).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) enum Applied {
    Done,
    /// The record referred to a queue or message that is gone.
    Missing,
    /// How many messages a purge removed or a redrive moved.
    Count(u64),
}

/// A message just leased.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Leased {
    pub id: MessageId,
    pub serial: u64,
    pub expires_at: Millis,
    pub message: Message,
    /// Why it is in a failure queue, if it is.
    pub failure: Option<FailInfo>,
}

/// What a peek shows of a message (besides what is read from disk).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MessageView {
    pub id: MessageId,
    pub state: MessageState,
    pub message: Message,
    pub failure: Option<FailInfo>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MessageState {
    Visible,
    Delayed,
    Leased,
    /// In the queue's history: delivered (acked).
    Delivered,
}

impl MessageState {
    pub fn as_str(self) -> &'static str {
        match self {
            MessageState::Visible => "visible",
            MessageState::Delayed => "delayed",
            MessageState::Leased => "leased",
            MessageState::Delivered => "delivered",
        }
    }
}

/// A queue's stats at `now` (docs/contract.md §4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueStats {
    pub visible: u64,
    pub leased: u64,
    pub delayed: u64,
    pub counters: Counters,
    pub oldest_visible_age_ms: Option<i64>,
    /// Messages tried and failed at least once, still in the queue (not in
    /// a failure queue's stats), and how long ago the oldest was sent: a
    /// message stuck retrying is delayed most of the time, so the oldest
    /// visible age does not show it.
    pub retrying: u64,
    pub oldest_retrying_age_ms: Option<i64>,
    /// Paused by an operator (`pause`); the breaker is [`Self::next_probe_at`].
    pub paused: bool,
    /// While the circuit breaker is open: when its next probe is due.
    pub next_probe_at: Option<Millis>,
}

/// An event remembered by its idempotency key: what a repeat answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct EventSeen {
    pub first_at: Millis,
    pub id: MessageId,
    pub deliveries: Vec<(String, MessageId)>,
}

/// Why a reservation was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum SpoolError {
    #[error("queue not found")]
    QueueNotFound,
    #[error("message not found")]
    MessageNotFound,
    /// The lease expired, was settled, or the message is gone or moving.
    #[error("lease is no longer valid")]
    StaleLease,
}

/// Every queue and message of the spool.
#[derive(Debug, Default)]
pub(crate) struct Spool {
    names: HashMap<String, QueueId>,
    /// By id: small integer keys, looked up for every record, where a
    /// B-tree beats hashing with SipHash. Boxed: a B-tree's nodes are often
    /// half empty, and a queue is large (100 000 endpoints' worth of half
    /// empty nodes was most of their memory).
    queues: BTreeMap<QueueId, Box<Queue>>,
    next_queue_id: u32,
    next_message_id: u64,
    next_lease_serial: u64,
    epoch: u64,
    /// Sequence number of the last record applied: the state reflects every
    /// record up to it and none after. Records apply in sequence order, one
    /// at a time, with no gaps.
    applied_seq: u64,
    /// The latest `at` of any record applied: the engine's clock never
    /// starts a new process behind it.
    last_at: Millis,
    /// Per file (a [`RecordLoc::file`]): bytes of the records that messages
    /// here point at (their enqueue record, their newest attempt record).
    /// What compaction would have to copy out of the file.
    live_bytes: BTreeMap<u32, u64>,
    /// How many messages point at each shared record (an event's, one per
    /// delivery still here): its bytes count once in `live_bytes`.
    shared_refs: HashMap<RecordLoc, u32>,
    /// Which queues subscribe to which event types.
    subscriptions: Subscriptions,
    failure_settings: FailureSettings,
    /// Queues that may hold something the timer acts on (messages, leases,
    /// dedup keys, history): every queue a record names joins, and
    /// [`Spool::due`] lets go of those it finds empty. The timer's work is
    /// theirs, not that of every queue (100 000 idle endpoints cost it
    /// nothing).
    busy: BTreeSet<QueueId>,
    /// Idempotency keys of events: hash → the event as first sent.
    event_dedup: HashMap<u64, EventSeen>,
    /// The same keys by when they were first seen, oldest first.
    event_dedup_order: VecDeque<(Millis, u64)>,
    /// Replicated mode: the replica set as last applied, in bytes only the
    /// cluster module reads (`src/cluster/store.rs`). A checkpoint keeps
    /// it, so that the log behind a checkpoint can go.
    cluster_config: Option<Vec<u8>>,
    /// Replicated mode: node ids that may never be members again.
    retired_nodes: BTreeSet<u64>,
}

impl Spool {
    pub(crate) fn new() -> Spool {
        Spool {
            next_message_id: 1,
            ..Spool::default()
        }
    }

    pub(crate) fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Sequence number of the last record applied.
    pub(crate) fn applied_seq(&self) -> u64 {
        self.applied_seq
    }

    /// Replicated mode: the replica set as last applied (opaque bytes).
    pub(crate) fn cluster_config(&self) -> Option<&[u8]> {
        self.cluster_config.as_deref()
    }

    /// Restores the replica set from a checkpoint.
    pub(crate) fn restore_cluster_config(&mut self, config: Vec<u8>) {
        self.cluster_config = Some(config);
    }

    /// Replicated mode: node ids that left and may never come back.
    pub(crate) fn retired_nodes(&self) -> &BTreeSet<u64> {
        &self.retired_nodes
    }

    /// Restores a retired node id from a checkpoint.
    pub(crate) fn restore_retired_node(&mut self, id: u64) {
        self.retired_nodes.insert(id);
    }

    /// The latest time any applied record carries.
    pub(crate) fn last_at(&self) -> Millis {
        self.last_at
    }

    /// A fresh message id (ids of records that never became durable are
    /// simply skipped).
    pub(crate) fn allocate_id(&mut self) -> MessageId {
        let id = MessageId(self.next_message_id);
        self.next_message_id += 1;
        id
    }

    pub(crate) fn queue(&self, name: &str) -> Option<&Queue> {
        self.names.get(name).map(|id| &*self.queues[id])
    }

    fn queue_mut(&mut self, name: &str) -> Option<&mut Queue> {
        let id = self.names.get(name)?;
        self.queues.get_mut(id).map(|q| &mut **q)
    }

    /// Names of every queue (failure queues included), sorted.
    pub(crate) fn queue_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.names.keys().cloned().collect();
        names.sort();
        names
    }

    /// Total messages in every queue.
    pub(crate) fn message_count(&self) -> usize {
        self.queues.values().map(|q| q.len()).sum()
    }

    /// Applies a durable record: `seq` is its sequence number and `loc`
    /// where it lies in the journal. Records come one at a time, in
    /// sequence order, with no gaps: anything else is a bug that would make
    /// replay disagree with the live process.
    pub(crate) fn apply(&mut self, record: &Record<'_>, seq: u64, loc: RecordLoc) -> Applied {
        assert_eq!(
            seq,
            self.applied_seq + 1,
            "bug: record {seq} applied after record {}",
            self.applied_seq
        );
        self.applied_seq = seq;
        let applied = self.apply_command(record, loc);
        self.mark_busy(&record.command);
        applied
    }

    /// The queues `command` names (and their failure queues) join `busy`.
    fn mark_busy(&mut self, command: &Command<'_>) {
        let mark = |spool: &mut Spool, name: &str| {
            let base = super::queue::origin_queue_name(name);
            if let Some(&qid) = spool.names.get(base) {
                spool.busy.insert(qid);
                if let Some(fid) = spool.queues[&qid].failed {
                    spool.busy.insert(fid);
                }
            }
        };
        match command {
            Command::Enqueue(meta) => mark(self, &meta.queue),
            Command::Event(meta) => {
                for (queue, _) in &meta.deliveries {
                    mark(self, queue);
                }
            }
            Command::QueueUpsert { name: queue, .. }
            | Command::Resend { queue, .. }
            | Command::Ack { queue, .. }
            | Command::Retry { queue, .. }
            | Command::Fail { queue, .. }
            | Command::Expire { queue, .. }
            | Command::Cancel { queue, .. }
            | Command::Purge { queue, .. }
            | Command::Redrive { queue, .. }
            | Command::Attempt { queue, .. }
            | Command::DedupKey { queue, .. }
            | Command::HistoryDrop { queue, .. } => mark(self, queue),
            Command::QueueDelete { .. }
            | Command::QueuePause { .. }
            | Command::Epoch { .. }
            | Command::RaftBlank
            | Command::RaftMembership { .. }
            | Command::RetireNode { .. } => {}
        }
    }

    /// Applies a record of a format-1 journal (whose compacted segments
    /// skip sequence numbers), while upgrading it.
    pub(crate) fn apply_upgrading(
        &mut self,
        record: &Record<'_>,
        seq: u64,
        loc: RecordLoc,
    ) -> Applied {
        assert!(seq > self.applied_seq, "bug: format-1 records out of order");
        self.applied_seq = seq;
        let applied = self.apply_command(record, loc);
        self.mark_busy(&record.command);
        applied
    }

    /// The one dispatch from a command to the function that applies it.
    fn apply_command(&mut self, record: &Record<'_>, loc: RecordLoc) -> Applied {
        let at = record.at;
        self.last_at = self.last_at.max(at);
        match &record.command {
            Command::QueueUpsert {
                name,
                settings,
                managed_by_config,
            } => {
                self.upsert_queue(name, settings, *managed_by_config, at);
                Applied::Done
            }
            Command::QueueDelete { name } => self.delete_queue(name),
            Command::QueuePause { name, paused } => self.apply_pause(name, *paused),
            Command::Enqueue(meta) => self.apply_enqueue(meta, at, loc),
            Command::Event(meta) => self.apply_event(meta, at, loc),
            Command::Resend {
                queue,
                id,
                visible_at,
                ..
            } => {
                let meta = EnqueueMeta {
                    id: *id,
                    queue: Cow::Borrowed(queue.as_ref()),
                    visible_at: *visible_at,
                    dedup_hash: None,
                };
                self.apply_enqueue(&meta, at, loc)
            }
            Command::Ack { queue, id } => self.apply_ack(queue, *id, at),
            Command::HistoryDrop { queue, ids } => {
                let n = self.drop_history(queue, ids);
                Applied::Count(n)
            }
            Command::Expire { queue, id } => self.remove(queue, *id, |c| c.expired += 1),
            Command::Cancel { queue, id } => self.remove(queue, *id, |_| {}),
            Command::Retry {
                queue,
                id,
                visible_at,
                retry_count,
            } => self.apply_retry(queue, *id, *visible_at, *retry_count),
            Command::Fail {
                queue,
                id,
                reason,
                last_status,
                retry_count,
            } => {
                let info = FailInfo {
                    reason: *reason,
                    last_status: *last_status,
                    failed_at: at,
                };
                self.apply_fail(queue, *id, info, *retry_count)
            }
            Command::Purge { queue, ids } => self.apply_purge(queue, ids),
            Command::Redrive { queue, ids } => self.apply_redrive(queue, ids, at),
            Command::Epoch { epoch } => {
                self.epoch = self.epoch.max(*epoch);
                Applied::Done
            }
            Command::RaftBlank => Applied::Done,
            Command::RaftMembership { config } => {
                self.cluster_config = Some(config.to_vec());
                Applied::Done
            }
            Command::RetireNode { id } => {
                self.retired_nodes.insert(*id);
                Applied::Done
            }
            Command::Attempt { queue, id, .. } => self.apply_attempt(queue, *id, loc),
            Command::DedupKey {
                queue,
                hash,
                first_at,
                id,
            } => self.apply_dedup_key(queue, *hash, *first_at, *id),
        }
    }

    fn apply_pause(&mut self, name: &str, paused: bool) -> Applied {
        match self.queue_mut(name) {
            Some(q) => {
                q.paused = paused;
                Applied::Done
            }
            None => Applied::Missing,
        }
    }

    /// A message back in line at `visible_at`, with its retry count.
    fn apply_retry(
        &mut self,
        queue: &str,
        id: MessageId,
        visible_at: Millis,
        retry_count: u32,
    ) -> Applied {
        let Some(q) = self.queue_mut(queue) else {
            return Applied::Missing;
        };
        let Some((mut message, failure)) = q.take(id) else {
            return Applied::Missing;
        };
        message.visible_at = visible_at;
        message.retry_count = retry_count;
        message.pending = false;
        q.insert(id, message);
        if let Some(failure) = failure {
            q.failures.insert(id, failure);
        }
        q.counters.nacked += 1;
        Applied::Done
    }

    /// A message moves to its queue's failure queue, with its attempts.
    fn apply_fail(
        &mut self,
        queue: &str,
        id: MessageId,
        info: FailInfo,
        retry_count: u32,
    ) -> Applied {
        let Some(&qid) = self.names.get(queue) else {
            return Applied::Missing;
        };
        let q = self.queues.get_mut(&qid).expect("bug: name without queue");
        let Some(failed_qid) = q.failed else {
            return Applied::Missing;
        };
        let Some((mut message, _)) = q.take(id) else {
            return Applied::Missing;
        };
        let attempts = q.attempts.remove(&id);
        q.counters.failed += 1;
        message.visible_at = info.failed_at;
        message.retention_from = info.failed_at;
        message.retry_count = retry_count;
        message.pending = false;
        let fq = self
            .queues
            .get_mut(&failed_qid)
            .expect("bug: failure queue missing");
        fq.insert(id, message);
        if let Some(a) = attempts {
            fq.attempts.insert(id, a);
        }
        fq.failures.insert(id, info);
        Applied::Done
    }

    /// Messages of `queue` dropped, whatever their state.
    fn apply_purge(&mut self, queue: &str, ids: &[MessageId]) -> Applied {
        let Some(q) = self.queue_mut(queue) else {
            return Applied::Missing;
        };
        let mut gone = Vec::new();
        let mut n = 0;
        for id in ids {
            if let Some((m, _)) = q.take(*id) {
                n += 1;
                gone.push((m.loc, m.shared));
                gone.extend(q.attempts.remove(id).map(|a| (a, false)));
            }
        }
        for (loc, shared) in gone {
            self.release_record(loc, shared);
        }
        Applied::Count(n)
    }

    /// Messages of `queue`'s failure queue back in `queue`, as new.
    fn apply_redrive(&mut self, queue: &str, ids: &[MessageId], at: Millis) -> Applied {
        let Some(&qid) = self.names.get(queue) else {
            return Applied::Missing;
        };
        let Some(failed_qid) = self.queues[&qid].failed else {
            return Applied::Missing;
        };
        let mut moved = Vec::with_capacity(ids.len());
        let fq = self
            .queues
            .get_mut(&failed_qid)
            .expect("bug: failure queue missing");
        for &id in ids {
            if let Some((mut message, _)) = fq.take(id) {
                message.retry_count = 0;
                message.visible_at = at;
                message.retention_from = at;
                message.pending = false;
                moved.push((id, message, fq.attempts.remove(&id)));
            }
        }
        let q = self.queues.get_mut(&qid).expect("bug: name without queue");
        let n = moved.len() as u64;
        for (id, message, attempts) in moved {
            q.insert(id, message);
            if let Some(a) = attempts {
                q.attempts.insert(id, a);
            }
        }
        Applied::Count(n)
    }

    /// A message's attempts (the record at `loc`) replace its older ones.
    fn apply_attempt(&mut self, queue: &str, id: MessageId, loc: RecordLoc) -> Applied {
        let base = super::queue::origin_queue_name(queue);
        let Some(q) = self.holder_mut(base, id) else {
            return Applied::Missing;
        };
        if let Some(old) = q.attempts.insert(id, loc) {
            self.forget_bytes(old);
        }
        self.count_bytes(loc);
        Applied::Done
    }

    /// A dedup key kept beyond its message (the message was settled).
    fn apply_dedup_key(
        &mut self,
        queue: &str,
        hash: u64,
        first_at: Millis,
        id: MessageId,
    ) -> Applied {
        self.next_message_id = self.next_message_id.max(id.0.saturating_add(1));
        let Some(q) = self.queue_mut(queue) else {
            return Applied::Missing;
        };
        q.dedup.insert(hash, (first_at, id));
        q.dedup_order.push_back((first_at, hash));
        Applied::Done
    }

    /// Sets what a checkpoint's BEGIN chunk says (restoring a spool).
    pub(crate) fn restore_position(
        &mut self,
        seq: u64,
        epoch: u64,
        next_message_id: u64,
        last_at: Millis,
    ) {
        self.applied_seq = seq;
        self.last_at = last_at;
        self.epoch = epoch;
        self.next_message_id = next_message_id.max(1);
    }

    /// Creates a queue from a checkpoint.
    pub(crate) fn restore_queue(&mut self, entry: super::checkpoint::QueueEntry) {
        assert!(
            self.queue(&entry.name).is_none(),
            "bug: queue restored twice"
        );
        self.upsert_queue(&entry.name, &entry.settings, entry.managed_by_config, 0);
        self.queue_mut(&entry.name).expect("just created").paused = entry.paused;
    }

    /// Puts a message from a checkpoint into queue `name`.
    pub(crate) fn restore_into(
        &mut self,
        name: &str,
        id: MessageId,
        message: Message,
        failure: Option<FailInfo>,
        attempts: Option<RecordLoc>,
    ) -> Result<(), &'static str> {
        if id.0 >= self.next_message_id {
            return Err("id at or above the next message id");
        }
        let q = self.queue_mut(name).ok_or("queue not in the checkpoint")?;
        q.insert(id, message);
        if let Some(f) = failure {
            q.failures.insert(id, f);
        }
        if let Some(a) = attempts {
            q.attempts.insert(id, a);
            self.count_bytes(a);
        }
        self.hold_record(message.loc, message.shared);
        Ok(())
    }

    /// Remembers a dedup key from a checkpoint (in window-start order).
    pub(crate) fn restore_dedup(
        &mut self,
        queue: &str,
        entry: super::checkpoint::DedupEntry,
    ) -> Result<(), &'static str> {
        if entry.id.0 >= self.next_message_id {
            return Err("id at or above the next message id");
        }
        let q = self.queue_mut(queue).ok_or("queue not in the checkpoint")?;
        q.dedup.insert(entry.hash, (entry.first_at, entry.id));
        q.dedup_order.push_back((entry.first_at, entry.hash));
        Ok(())
    }

    /// Done restoring: dedup keys in window order.
    pub(crate) fn finish_restore(&mut self) {
        for (&qid, q) in &mut self.queues {
            q.dedup_order.make_contiguous().sort_unstable();
            if !q.is_idle() {
                self.busy.insert(qid);
            }
        }
    }

    /// Where the latest attempt record of a message is, if a worker tried
    /// it.
    pub(crate) fn attempts_loc(&self, queue: &str, id: MessageId) -> Option<RecordLoc> {
        self.queue(queue)?.attempts.get(&id).copied()
    }

    /// Points a message's attempts at their record's new place after
    /// compaction; a no-op if a newer record took over.
    pub(crate) fn relocate_attempts(
        &mut self,
        base_queue: &str,
        id: MessageId,
        from: RecordLoc,
        to: RecordLoc,
    ) {
        let in_history = self
            .queue_mut(base_queue)
            .and_then(|q| q.history.get_mut(&id))
            .and_then(|d| d.attempts.as_mut());
        let moved = match in_history {
            Some(loc) if *loc == from => {
                *loc = to;
                true
            }
            Some(_) => false,
            None => match self.holder_mut(base_queue, id) {
                Some(q) => match q.attempts.get_mut(&id) {
                    Some(loc) if *loc == from => {
                        *loc = to;
                        true
                    }
                    _ => false,
                },
                None => false,
            },
        };
        if moved {
            self.forget_bytes(from);
            self.count_bytes(to);
        }
    }

    /// Counts a delivery attempt of a push queue (memory only).
    pub(crate) fn count_delivery(&mut self, queue: &str, ok: bool) {
        if let Some(q) = self.queue_mut(queue) {
            q.counters.deliveries += 1;
            if !ok {
                q.counters.delivery_failures += 1;
            }
        }
    }

    /// Opens a queue's circuit breaker until a probe due at `next_probe`
    /// closes it, or closes it (`None`); memory only. While open, workers
    /// get no leases except an explicit probe.
    pub(crate) fn set_breaker(&mut self, queue: &str, next_probe: Option<Millis>) {
        if let Some(q) = self.queue_mut(queue) {
            q.breaker = next_probe;
        }
    }

    /// Declares every record up to `seq` applied (an upgrade or repair
    /// that read a journal with gaps).
    pub(crate) fn raise_applied_seq(&mut self, seq: u64) {
        self.applied_seq = self.applied_seq.max(seq);
    }

    /// Forgets a message without a record: repair, for one whose payload
    /// record is damaged.
    pub(crate) fn drop_message(&mut self, base_queue: &str, id: MessageId) {
        let Some(q) = self.holder_mut(base_queue, id) else {
            return;
        };
        let Some((message, _)) = q.take(id) else {
            return;
        };
        let attempts = q.attempts.remove(&id);
        self.release_record(message.loc, message.shared);
        if let Some(a) = attempts {
            self.forget_bytes(a);
        }
    }

    /// Forgets a message's attempt history: repair, for a damaged record.
    pub(crate) fn forget_attempts(&mut self, base_queue: &str, id: MessageId) {
        let gone = self
            .holder_mut(base_queue, id)
            .and_then(|q| q.attempts.remove(&id));
        if let Some(a) = gone {
            self.forget_bytes(a);
        }
    }

    /// Message ids below this were used (they may be gone); start-up raises
    /// it from compacted segments' headers, so no id is ever reused.
    pub(crate) fn raise_next_message_id(&mut self, floor: u64) {
        self.next_message_id = self.next_message_id.max(floor);
    }

    pub(crate) fn next_message_id(&self) -> u64 {
        self.next_message_id
    }

    /// Creates a queue, or replaces its settings at `at`. Dedup keys that
    /// left the old window by then are forgotten first, so that a wider
    /// window never brings back a key that the timer may or may not have
    /// forgotten already (replay and the live process agree).
    fn upsert_queue(
        &mut self,
        name: &str,
        settings: &QueueSettings,
        managed_by_config: bool,
        at: Millis,
    ) {
        if let Some(&qid) = self.names.get(name) {
            let q = self.queues.get_mut(&qid).expect("bug: name without queue");
            q.prune_dedup(at);
            if q.settings.events != settings.events {
                self.subscriptions.remove(qid.0, &q.settings.events);
                self.subscriptions.add(qid.0, &settings.events);
            }
            q.settings = Arc::new(settings.clone());
            q.managed_by_config = managed_by_config;
            let over = q.history_over_bounds();
            self.drop_history(name, &over);
            let q = self.queues.get_mut(&qid).expect("bug: name without queue");
            if let Some(fid) = q.failed {
                let fq = self
                    .queues
                    .get_mut(&fid)
                    .expect("bug: failure queue missing");
                fq.settings = self.failure_settings.of(settings);
            }
            return;
        }
        let qid = QueueId(self.next_queue_id);
        let fid = QueueId(self.next_queue_id + 1);
        self.next_queue_id += 2;
        let mut q = Queue::new(
            name.to_owned(),
            Arc::new(settings.clone()),
            managed_by_config,
        );
        q.failed = Some(fid);
        let fname = failed_queue_name(name);
        let mut fq = Queue::new(fname.clone(), self.failure_settings.of(settings), false);
        fq.parent = Some(qid);
        self.names.insert(name.to_owned(), qid);
        self.names.insert(fname, fid);
        self.queues.insert(qid, Box::new(q));
        self.queues.insert(fid, Box::new(fq));
        self.subscriptions.add(qid.0, &settings.events);
    }

    fn delete_queue(&mut self, name: &str) -> Applied {
        let Some(qid) = self.names.remove(name) else {
            return Applied::Missing;
        };
        let q = self.queues.remove(&qid).expect("bug: name without queue");
        self.subscriptions.remove(qid.0, &q.settings.events);
        let mut gone: Vec<(RecordLoc, bool)> =
            q.messages.values().map(|m| (m.loc, m.shared)).collect();
        gone.extend(q.attempts.values().map(|&a| (a, false)));
        for d in q.history.values() {
            gone.push((d.loc, d.shared));
            gone.extend(d.attempts.map(|a| (a, false)));
        }
        if let Some(fid) = q.failed
            && let Some(fq) = self.queues.remove(&fid)
        {
            self.names.remove(&fq.name);
            gone.extend(fq.messages.values().map(|m| (m.loc, m.shared)));
            gone.extend(fq.attempts.values().map(|&a| (a, false)));
        }
        for (loc, shared) in gone {
            self.release_record(loc, shared);
        }
        Applied::Done
    }

    fn apply_enqueue(&mut self, meta: &EnqueueMeta<'_>, at: Millis, loc: RecordLoc) -> Applied {
        self.next_message_id = self.next_message_id.max(meta.id.0.saturating_add(1));
        let Some(&qid) = self.names.get(meta.queue.as_ref()) else {
            return Applied::Missing;
        };
        self.count_bytes(loc);
        let q = self.queues.get_mut(&qid).expect("bug: name without queue");
        q.insert(
            meta.id,
            Message {
                enqueued_at: at,
                visible_at: meta.visible_at,
                retention_from: meta.visible_at,
                loc,
                retry_count: 0,
                pending: false,
                shared: false,
            },
        );
        q.counters.sent += 1;
        if let Some(hash) = meta.dedup_hash {
            q.dedup.insert(hash, (at, meta.id));
            q.dedup_order.push_back((at, hash));
        }
        Applied::Done
    }

    /// An ack: the message is gone, or (a queue that keeps history) kept
    /// as delivered at `at`, the oldest entries going past the byte bound.
    fn apply_ack(&mut self, queue: &str, id: MessageId, at: Millis) -> Applied {
        let Some(&qid) = self.names.get(queue) else {
            return Applied::Missing;
        };
        let q = self.queues.get_mut(&qid).expect("bug: name without queue");
        if q.settings.history_retention_ms == 0 || q.is_failure_queue() {
            return self.remove(queue, id, |c| c.acked += 1);
        }
        let Some((message, _)) = q.take(id) else {
            return Applied::Missing;
        };
        q.counters.acked += 1;
        let attempts = q.attempts.remove(&id);
        q.remember(
            id,
            Delivered {
                enqueued_at: message.enqueued_at,
                delivered_at: at,
                retry_count: message.retry_count,
                loc: message.loc,
                shared: message.shared,
                attempts,
            },
        );
        let over = q.history_over_bounds();
        self.drop_history(queue, &over);
        Applied::Done
    }

    /// Forgets the listed history entries of `queue` (and their records);
    /// how many there were.
    fn drop_history(&mut self, queue: &str, ids: &[MessageId]) -> u64 {
        let Some(q) = self.queue_mut(queue) else {
            return 0;
        };
        let gone: Vec<Delivered> = ids.iter().filter_map(|id| q.forget(*id)).collect();
        let n = gone.len() as u64;
        for d in gone {
            self.release_record(d.loc, d.shared);
            if let Some(a) = d.attempts {
                self.forget_bytes(a);
            }
        }
        n
    }

    /// Puts a history entry from a checkpoint into queue `name`.
    pub(crate) fn restore_history(
        &mut self,
        name: &str,
        id: MessageId,
        d: Delivered,
    ) -> Result<(), &'static str> {
        if id.0 >= self.next_message_id {
            return Err("id at or above the next message id");
        }
        let q = self.queue_mut(name).ok_or("queue not in the checkpoint")?;
        if q.history.contains_key(&id) || q.messages.contains_key(&id) {
            return Err("a history entry repeated");
        }
        q.remember(id, d);
        self.hold_record(d.loc, d.shared);
        if let Some(a) = d.attempts {
            self.count_bytes(a);
        }
        Ok(())
    }

    /// An event: a message in each queue of its deliveries that still
    /// exists, all pointing at the one record; its key remembered.
    fn apply_event(&mut self, meta: &EventMeta<'_>, at: Millis, loc: RecordLoc) -> Applied {
        let top = meta
            .deliveries
            .iter()
            .map(|(_, id)| id.0)
            .max()
            .unwrap_or(0);
        self.next_message_id = self
            .next_message_id
            .max(meta.id.0.max(top).saturating_add(1));
        let mut n = 0;
        for (queue, id) in &meta.deliveries {
            let Some(&qid) = self.names.get(queue.as_ref()) else {
                continue;
            };
            self.hold_record(loc, true);
            let q = self.queues.get_mut(&qid).expect("bug: name without queue");
            q.insert(
                *id,
                Message {
                    enqueued_at: at,
                    visible_at: meta.visible_at,
                    retention_from: meta.visible_at,
                    loc,
                    retry_count: 0,
                    pending: false,
                    shared: true,
                },
            );
            q.counters.sent += 1;
            n += 1;
        }
        if let Some(hash) = meta.dedup_hash {
            let seen = EventSeen {
                first_at: at,
                id: meta.id,
                deliveries: meta
                    .deliveries
                    .iter()
                    .map(|(q, id)| (q.to_string(), *id))
                    .collect(),
            };
            self.restore_event_key(hash, seen);
        }
        Applied::Count(n)
    }

    /// Remembers an event's key (applying its record, or from a
    /// checkpoint, oldest first).
    pub(crate) fn restore_event_key(&mut self, hash: u64, seen: EventSeen) {
        self.event_dedup_order.push_back((seen.first_at, hash));
        self.event_dedup.insert(hash, seen);
    }

    /// The event first sent with key `hash`, if that was less than
    /// `window_ms` before `now`; keys older than that are forgotten.
    pub(crate) fn event_by_key(
        &mut self,
        hash: u64,
        now: Millis,
        window_ms: u64,
    ) -> Option<&EventSeen> {
        let window = window_ms as i64;
        while let Some(&(at, h)) = self.event_dedup_order.front() {
            if at + window > now {
                break;
            }
            self.event_dedup_order.pop_front();
            if self.event_dedup.get(&h).is_some_and(|e| e.first_at == at) {
                self.event_dedup.remove(&h);
            }
        }
        self.event_dedup
            .get(&hash)
            .filter(|e| e.first_at + window > now)
    }

    /// Every remembered event key, oldest first (for a checkpoint).
    pub(crate) fn event_keys(&self) -> impl Iterator<Item = (u64, &EventSeen)> + '_ {
        self.event_dedup_order.iter().filter_map(|&(at, h)| {
            let seen = self.event_dedup.get(&h)?;
            (seen.first_at == at).then_some((h, seen))
        })
    }

    /// The queues an event of `event_type` (and `tenant`) goes to, by name:
    /// those whose patterns take the type and whose tenant, if set, is the
    /// event's.
    pub(crate) fn subscribers(&self, event_type: &str, tenant: Option<&str>) -> Vec<String> {
        let mut names: Vec<String> = self
            .subscriptions
            .matching(event_type)
            .into_iter()
            .filter_map(|qid| self.queues.get(&QueueId(qid)))
            .filter(|q| match &q.settings.tenant {
                None => true,
                Some(t) => Some(t.as_str()) == tenant,
            })
            .map(|q| q.name.clone())
            .collect();
        names.sort_unstable();
        names
    }

    fn remove(&mut self, queue: &str, id: MessageId, count: impl FnOnce(&mut Counters)) -> Applied {
        let Some(&qid) = self.names.get(queue) else {
            return Applied::Missing;
        };
        let q = self.queues.get_mut(&qid).expect("bug: name without queue");
        match q.take(id) {
            Some((message, _)) => {
                count(&mut q.counters);
                let attempts = q.attempts.remove(&id);
                self.release_record(message.loc, message.shared);
                if let Some(a) = attempts {
                    self.forget_bytes(a);
                }
                Applied::Done
            }
            None => Applied::Missing,
        }
    }

    /// A message's hold on its record: a shared record's bytes count once,
    /// however many messages point at it.
    fn hold_record(&mut self, loc: RecordLoc, shared: bool) {
        if shared {
            let refs = self.shared_refs.entry(loc).or_default();
            *refs += 1;
            if *refs > 1 {
                return;
            }
        }
        self.count_bytes(loc);
    }

    /// Undoes [`Self::hold_record`].
    fn release_record(&mut self, loc: RecordLoc, shared: bool) {
        if shared {
            let refs = self
                .shared_refs
                .get_mut(&loc)
                .expect("bug: a shared record without holders");
            *refs -= 1;
            if *refs > 0 {
                return;
            }
            self.shared_refs.remove(&loc);
        }
        self.forget_bytes(loc);
    }

    fn count_bytes(&mut self, loc: RecordLoc) {
        *self.live_bytes.entry(loc.file).or_default() += u64::from(loc.len);
    }

    fn forget_bytes(&mut self, loc: RecordLoc) {
        let live = self
            .live_bytes
            .get_mut(&loc.file)
            .expect("bug: a live record in a file without live bytes");
        *live = live
            .checked_sub(u64::from(loc.len))
            .expect("bug: live bytes below zero");
        if *live == 0 {
            self.live_bytes.remove(&loc.file);
        }
    }

    /// The files (record-location ids) that messages here point into.
    pub(crate) fn referenced_files(&self) -> impl Iterator<Item = u32> + '_ {
        self.live_bytes.keys().copied()
    }

    /// Bytes of records in file `file` that messages here point at: what
    /// compaction would have to copy out of it.
    pub(crate) fn live_bytes(&self, file: u32) -> u64 {
        self.live_bytes.get(&file).copied().unwrap_or(0)
    }

    /// Finds a message by its base queue (it may sit in the failure queue).
    pub(crate) fn find(&self, base_queue: &str, id: MessageId) -> Option<(&Queue, &Message)> {
        let q = self.queue(base_queue)?;
        if let Some(m) = q.messages.get(&id) {
            return Some((q, m));
        }
        let fq: &Queue = &self.queues[&q.failed?];
        fq.messages.get(&id).map(|m| (fq, m))
    }

    /// Points a message at its record's new place after compaction moved
    /// it; a no-op if the message is gone or already elsewhere.
    pub(crate) fn relocate(
        &mut self,
        base_queue: &str,
        id: MessageId,
        from: RecordLoc,
        to: RecordLoc,
    ) {
        let Some(q) = self.queue_mut(base_queue) else {
            return;
        };
        if let Some(d) = q.history.get_mut(&id) {
            if d.loc == from {
                d.loc = to;
                let shared = d.shared;
                self.release_record(from, shared);
                self.hold_record(to, shared);
            }
            return;
        }
        let Some(m) = self
            .holder_mut(base_queue, id)
            .and_then(|q| q.messages.get_mut(&id))
        else {
            return;
        };
        if m.loc != from {
            return;
        }
        m.loc = to;
        let shared = m.shared;
        self.release_record(from, shared);
        self.hold_record(to, shared);
    }

    /// The queue (a base queue or its failure queue) that holds message `id`.
    fn holder_mut(&mut self, base_queue: &str, id: MessageId) -> Option<&mut Queue> {
        let qid = *self.names.get(base_queue)?;
        let q = &self.queues[&qid];
        let holder = if q.messages.contains_key(&id) {
            qid
        } else {
            q.failed?
        };
        self.queues
            .get_mut(&holder)
            .map(|q| &mut **q)
            .filter(|q| q.messages.contains_key(&id))
    }

    /// The message a dedup key hash points at, if the key is still inside
    /// the queue's window at `now`.
    pub(crate) fn dedup_lookup(&self, queue: &str, hash: u64, now: Millis) -> Option<MessageId> {
        let q = self.queue(queue)?;
        let window = q.settings.dedup_window_ms as i64;
        q.dedup
            .get(&hash)
            .filter(|&&(first, _)| first + window > now)
            .map(|&(_, id)| id)
    }

    /// Counts a send answered from the dedup window (memory only, like every
    /// counter that no record carries).
    pub(crate) fn count_deduplicated(&mut self, queue: &str) {
        if let Some(q) = self.queue_mut(queue) {
            q.counters.deduplicated += 1;
        }
    }

    /// Leases up to `max` visible messages of `queue`, longest-waiting
    /// first, until `now + duration_ms`. A paused queue hands out nothing;
    /// one whose breaker is open only a `probe`.
    pub(crate) fn lease(
        &mut self,
        queue: &str,
        now: Millis,
        duration_ms: u64,
        max: usize,
        probe: bool,
    ) -> Result<Vec<Leased>, SpoolError> {
        let qid = *self.names.get(queue).ok_or(SpoolError::QueueNotFound)?;
        let q = self.queues.get_mut(&qid).expect("bug: name without queue");
        let mut out = Vec::new();
        if q.paused || (q.breaker.is_some() && !probe) {
            return Ok(out);
        }
        let retention_ms = q.settings.retention_ms as i64;
        let expires_at = now + duration_ms as i64;
        let mut skipped = Vec::new();
        while out.len() < max {
            let Some(&(visible_at, id)) = q.ready.first() else {
                break;
            };
            if visible_at > now {
                break;
            }
            q.ready.pop_first();
            let message = q.messages[&id];
            if message.retention_from + retention_ms <= now {
                // Past retention: the expiry timer takes it, nobody else.
                skipped.push((visible_at, id));
                continue;
            }
            self.next_lease_serial += 1;
            let serial = self.next_lease_serial;
            q.leases.insert(
                id,
                Lease {
                    serial,
                    expires_at,
                    settling: false,
                },
            );
            q.lease_expiry.insert((expires_at, id));
            out.push(Leased {
                id,
                serial,
                expires_at,
                message,
                failure: q.failures.get(&id).copied(),
            });
        }
        q.ready.extend(skipped);
        Ok(out)
    }

    fn valid_lease(
        &mut self,
        queue: &str,
        id: MessageId,
        serial: u64,
        now: Millis,
    ) -> Result<&mut Queue, SpoolError> {
        let q = self.queue_mut(queue).ok_or(SpoolError::QueueNotFound)?;
        match q.leases.get(&id) {
            Some(lease) if lease.serial == serial && !lease.settling && now < lease.expires_at => {
                Ok(q)
            }
            _ => Err(SpoolError::StaleLease),
        }
    }

    /// Checks a lease and marks it settling: the caller appends the ack (or
    /// nack) record next. Undo with [`Spool::release`].
    pub(crate) fn reserve_settle(
        &mut self,
        queue: &str,
        id: MessageId,
        serial: u64,
        now: Millis,
    ) -> Result<(), SpoolError> {
        let q = self.valid_lease(queue, id, serial, now)?;
        q.leases.get_mut(&id).expect("checked above").settling = true;
        Ok(())
    }

    /// Reserves a nack of a valid lease and returns the record to append:
    /// a retry after `delay_ms`, or a move to the failure queue once the
    /// retry count would pass `max_retries`, remembering `last_status` (the
    /// HTTP status of a push worker's last attempt).
    pub(crate) fn reserve_nack(
        &mut self,
        queue: &str,
        id: MessageId,
        serial: u64,
        now: Millis,
        delay_ms: u64,
        last_status: Option<u16>,
    ) -> Result<Command<'static>, SpoolError> {
        self.reserve_settle(queue, id, serial, now)?;
        let q = self.queue(queue).expect("reserved above");
        Ok(retry_or_fail(q, id, now + delay_ms as i64, last_status))
    }

    /// Extends a valid lease to `now` + the queue's current lease timeout.
    pub(crate) fn renew(
        &mut self,
        queue: &str,
        id: MessageId,
        serial: u64,
        now: Millis,
    ) -> Result<Millis, SpoolError> {
        let q = self.valid_lease(queue, id, serial, now)?;
        let expires_at = now + q.settings.lease_timeout_ms as i64;
        let lease = q.leases.get_mut(&id).expect("checked above");
        q.lease_expiry.remove(&(lease.expires_at, id));
        lease.expires_at = expires_at;
        q.lease_expiry.insert((expires_at, id));
        Ok(expires_at)
    }

    /// Marks a message pending (out of line, its lease stale) while a record
    /// that removes or moves it is written.
    pub(crate) fn reserve_message(&mut self, queue: &str, id: MessageId) -> Result<(), SpoolError> {
        let q = self.queue_mut(queue).ok_or(SpoolError::QueueNotFound)?;
        let message = q.messages.get_mut(&id).ok_or(SpoolError::MessageNotFound)?;
        if message.pending {
            return Err(SpoolError::MessageNotFound);
        }
        message.pending = true;
        q.ready.remove(&(message.visible_at, id));
        if let Some(lease) = q.leases.get_mut(&id) {
            lease.settling = true;
        }
        Ok(())
    }

    /// Undoes a reservation whose record could not be written.
    pub(crate) fn release(&mut self, queue: &str, id: MessageId) {
        let Some(q) = self.queue_mut(queue) else {
            return;
        };
        let Some(message) = q.messages.get_mut(&id) else {
            return;
        };
        message.pending = false;
        match q.leases.get_mut(&id) {
            Some(lease) => lease.settling = false,
            None => {
                q.ready.insert((message.visible_at, id));
            }
        }
    }

    /// Ends a lease without a record and without counting it: the message
    /// is back in line at its old place, retry count unchanged. For a
    /// lease whose payload could not be read (the spool's fault, not the
    /// message's).
    pub(crate) fn return_lease(&mut self, queue: &str, id: MessageId, serial: u64) {
        let Some(q) = self.queue_mut(queue) else {
            return;
        };
        if q.leases
            .get(&id)
            .is_none_or(|l| l.serial != serial || l.settling)
        {
            return;
        }
        let lease = q.leases.remove(&id).expect("checked above");
        q.lease_expiry.remove(&(lease.expires_at, id));
        let message = q.messages[&id];
        q.ready.insert((message.visible_at, id));
    }

    /// Drops every lease (a new epoch): their messages are visible at once,
    /// in their old place in line, retry counts unchanged.
    pub(crate) fn drop_leases(&mut self) {
        for q in self.queues.values_mut() {
            for (id, _) in q.leases.drain() {
                let message = q.messages[&id];
                q.ready.insert((message.visible_at, id));
            }
            q.lease_expiry.clear();
        }
    }

    /// Picks up to `max` messages of `queue`'s failure queue that `filter`
    /// selects, to redrive (oldest first), skipping leased and pending ones.
    /// With `reserve`, marks them pending.
    pub(crate) fn redrive_candidates(
        &mut self,
        queue: &str,
        filter: &DeadLetterFilter,
        max: usize,
        reserve: bool,
    ) -> Result<Selection, SpoolError> {
        let q = self.queue(queue).ok_or(SpoolError::QueueNotFound)?;
        let fid = q.failed.ok_or(SpoolError::QueueNotFound)?;
        let fq = self
            .queues
            .get_mut(&fid)
            .expect("bug: failure queue missing");
        let selection = fq.select(filter, max, |id, m| {
            !m.pending && !fq.leases.contains_key(&id)
        });
        if reserve {
            for id in &selection.picked {
                let message = fq.messages.get_mut(id).expect("picked above");
                message.pending = true;
                fq.ready.remove(&(message.visible_at, *id));
            }
        }
        Ok(selection)
    }

    /// Picks up to `max` messages of `queue` that `filter` selects, to
    /// purge (oldest first), whatever their state but pending.
    pub(crate) fn purge_candidates(
        &self,
        queue: &str,
        filter: &DeadLetterFilter,
        max: usize,
    ) -> Result<Selection, SpoolError> {
        let q = self.queue(queue).ok_or(SpoolError::QueueNotFound)?;
        Ok(q.select(filter, max, |_, m| !m.pending))
    }

    /// Finds what is due at `now` (expired leases, messages past retention),
    /// reserves each and returns the records to append, at most `max`.
    /// Also forgets dedup keys that left their window.
    pub(crate) fn due(&mut self, now: Millis, max: usize) -> Vec<Command<'static>> {
        let mut out = Vec::new();
        let qids: Vec<QueueId> = self.busy.iter().copied().collect();
        for qid in qids {
            let Some(q) = self.queues.get_mut(&qid) else {
                // Deleted.
                self.busy.remove(&qid);
                continue;
            };
            q.prune_dedup(now);
            if q.is_idle() {
                self.busy.remove(&qid);
                continue;
            }
            let expired: Vec<MessageId> = q
                .lease_expiry
                .range(..=(now, MessageId(u64::MAX)))
                .map(|&(_, id)| id)
                .filter(|id| !q.leases[id].settling)
                .take(max - out.len())
                .collect();
            for id in expired {
                q.leases.get_mut(&id).expect("listed above").settling = true;
                out.push(retry_or_fail(q, id, now, None));
            }
            let retention_ms = q.settings.retention_ms as i64;
            let past: Vec<MessageId> = q
                .retention
                .range(
                    ..(
                        now.saturating_sub(retention_ms).saturating_add(1),
                        MessageId(0),
                    ),
                )
                .map(|&(_, id)| id)
                .filter(|id| !q.messages[id].pending && !q.leases.contains_key(id))
                .take(max - out.len())
                .collect();
            for id in past {
                let message = q.messages.get_mut(&id).expect("listed above");
                message.pending = true;
                q.ready.remove(&(message.visible_at, id));
                let queue = Cow::Owned(q.name.clone());
                out.push(
                    if q.settings.on_expire == OnExpire::Fail && q.failed.is_some() {
                        Command::Fail {
                            queue,
                            id,
                            reason: FailReason::Expired,
                            last_status: None,
                            retry_count: message.retry_count,
                        }
                    } else {
                        Command::Expire { queue, id }
                    },
                );
            }
            let keep_ms = q.settings.history_retention_ms as i64;
            if keep_ms > 0 && out.len() < max {
                let old: Vec<MessageId> = q
                    .history_order
                    .range(..(now.saturating_sub(keep_ms).saturating_add(1), MessageId(0)))
                    .map(|&(_, id)| id)
                    .take(super::command::IDS_PER_RECORD_MAX)
                    .collect();
                if !old.is_empty() {
                    out.push(Command::HistoryDrop {
                        queue: Cow::Owned(q.name.clone()),
                        ids: old,
                    });
                }
            }
            if out.len() >= max {
                break;
            }
        }
        out
    }

    /// The earliest moment at which [`Spool::due`] or a delayed message
    /// could have something new. Only deadlines that can be acted on count:
    /// a leased message past its retention waits for its lease to end, and
    /// one being removed or moved (pending) for its record.
    pub(crate) fn next_deadline(&self, now: Millis) -> Option<Millis> {
        self.busy
            .iter()
            .filter_map(|qid| self.queues.get(qid))
            .flat_map(|q| {
                let lease = q
                    .lease_expiry
                    .iter()
                    .find(|(_, id)| !q.leases[id].settling)
                    .map(|&(t, _)| t);
                let retention = q
                    .retention
                    .iter()
                    .find(|(_, id)| !q.messages[id].pending && !q.leases.contains_key(id))
                    .map(|&(t, _)| t + q.settings.retention_ms as i64);
                let delayed = q
                    .ready
                    .range((now + 1, MessageId(0))..)
                    .next()
                    .map(|&(t, _)| t);
                let history = q
                    .history_order
                    .first()
                    .map(|&(t, _)| t + q.settings.history_retention_ms as i64);
                [lease, retention, delayed, history]
            })
            .flatten()
            .min()
    }

    /// When the next delayed message of `queue` becomes visible.
    pub(crate) fn next_visible_at(&self, queue: &str, now: Millis) -> Option<Millis> {
        let q = self.queue(queue)?;
        q.ready
            .range((now + 1, MessageId(0))..)
            .next()
            .map(|&(t, _)| t)
    }

    pub(crate) fn stats(&self, queue: &str, now: Millis) -> Option<QueueStats> {
        let q = self.queue(queue)?;
        let delayed = q.ready.range((now + 1, MessageId(0))..).count() as u64;
        let oldest = q
            .ready
            .first()
            .filter(|&&(t, _)| t <= now)
            .map(|&(t, _)| now - t);
        Some(QueueStats {
            visible: q.ready.len() as u64 - delayed,
            leased: q.leases.len() as u64,
            delayed,
            counters: q.counters,
            oldest_visible_age_ms: oldest,
            retrying: q.retrying.len() as u64,
            oldest_retrying_age_ms: q
                .retrying
                .first()
                .map(|id| now - q.messages[id].enqueued_at),
            paused: q.paused,
            next_probe_at: q.breaker,
        })
    }

    fn view(q: &Queue, id: MessageId, message: &Message, now: Millis) -> MessageView {
        let state = if q.leases.contains_key(&id) {
            MessageState::Leased
        } else if message.visible_at > now {
            MessageState::Delayed
        } else {
            MessageState::Visible
        };
        MessageView {
            id,
            state,
            message: *message,
            failure: q.failures.get(&id).copied(),
        }
    }

    /// Up to `limit` messages after `after`, oldest first, without leasing.
    pub(crate) fn peek(
        &self,
        queue: &str,
        filter: &DeadLetterFilter,
        after: Option<MessageId>,
        limit: usize,
        now: Millis,
    ) -> Result<Vec<MessageView>, SpoolError> {
        let q = self.queue(queue).ok_or(SpoolError::QueueNotFound)?;
        let Some(start) = after.map_or(Some(MessageId(0)), |a| a.0.checked_add(1).map(MessageId))
        else {
            return Ok(Vec::new());
        };
        Ok(q.messages
            .range(start..)
            .filter(|&(id, _)| filter.matches(*id, q.failures.get(id)))
            .take(limit)
            .map(|(&id, m)| Spool::view(q, id, m, now))
            .collect())
    }

    /// The `n` newest messages, oldest of them first.
    pub(crate) fn newest(
        &self,
        queue: &str,
        n: usize,
        now: Millis,
    ) -> Result<Vec<MessageView>, SpoolError> {
        let q = self.queue(queue).ok_or(SpoolError::QueueNotFound)?;
        let mut views: Vec<MessageView> = q
            .messages
            .iter()
            .rev()
            .take(n)
            .map(|(&id, m)| Spool::view(q, id, m, now))
            .collect();
        views.reverse();
        Ok(views)
    }

    pub(crate) fn get(
        &self,
        queue: &str,
        id: MessageId,
        now: Millis,
    ) -> Result<MessageView, SpoolError> {
        let q = self.queue(queue).ok_or(SpoolError::QueueNotFound)?;
        let m = q.messages.get(&id).ok_or(SpoolError::MessageNotFound)?;
        Ok(Spool::view(q, id, m, now))
    }

    /// Every message of every queue, for checks in tests and tools.
    pub(crate) fn all_messages(&self) -> Vec<(String, MessageId, Message)> {
        let mut out: Vec<_> = self
            .queues
            .values()
            .flat_map(|q| q.messages.iter().map(|(&id, &m)| (q.name.clone(), id, m)))
            .collect();
        out.sort_by_key(|(_, id, _)| *id);
        out
    }
}

/// The record for a lease that ends unsettled or is nacked: back in line at
/// `visible_at` with one more retry, or to the failure queue once that would
/// pass `max_retries`. Failure queues have no limit.
fn retry_or_fail(
    q: &Queue,
    id: MessageId,
    visible_at: Millis,
    last_status: Option<u16>,
) -> Command<'static> {
    let retries = q.messages[&id].retry_count;
    let queue = Cow::Owned(q.name.clone());
    if q.failed.is_some() && retries.saturating_add(1) > q.settings.max_retries {
        Command::Fail {
            queue,
            id,
            reason: FailReason::RetriesExhausted,
            last_status,
            retry_count: retries,
        }
    } else {
        Command::Retry {
            queue,
            id,
            visible_at,
            retry_count: retries.saturating_add(1),
        }
    }
}
