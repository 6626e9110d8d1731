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

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::Arc;

use super::command::MessageId;
use super::event::Subscriptions;
use crate::journal::RecordLoc;
use crate::time::Millis;

mod apply;
pub(crate) mod fresh;
pub(crate) mod leases;
pub(crate) mod log;
pub(crate) mod memory;
mod plain;
mod queue;
mod restore;
mod timers;
mod types;
mod views;

pub use plain::{DedupEntry, EventKeyEntry, MessageEntry, QueueEntry, QueueState, SpoolState};
pub(crate) use queue::Queue;
#[cfg(feature = "testing")]
pub(crate) use queue::keys::key_hash;
pub(crate) use queue::keys::ordering_key_problem;
use queue::{FailureSettings, QueueId};
pub(crate) use types::{Applied, AttemptEffect, BreakerTurn, EventSeen, Leased, SpoolError};
pub(crate) use types::{Counters, Message};
pub use types::{Delivered, MessageState, MessageView, QueueStats};

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
    /// The events that untouched deliveries (`Queue::fresh`) stand for.
    fresh_events: fresh::FreshEvents,
    /// While compaction is between its plan and its swap: the deliveries
    /// promoted meanwhile, which its plan moved with their event's record
    /// and which now hold a location of their own (`compact.rs`).
    promotions: Option<Vec<(QueueId, MessageId)>>,
    /// The queues' share of what the state holds in memory, as accounted
    /// (`memory.rs`), and the event keys'.
    memory_bytes: u64,
    event_key_bytes: u64,
    /// Which queues subscribe to which event types.
    subscriptions: Subscriptions,
    failure_settings: FailureSettings,
    /// Queues that may hold something the timer acts on (messages, leases,
    /// dedup keys, history): every queue a record names joins, and
    /// [`Spool::due`] lets go of those it finds empty. The timer's work is
    /// theirs, not that of every queue (100 000 idle endpoints cost it
    /// nothing).
    busy: BTreeSet<QueueId>,
    /// Scratch for the queues each applied record names (`apply.rs`).
    named_scratch: Vec<QueueId>,
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
    /// The event catalogue: each type's definition as JSON
    /// (`engine/catalogue.rs` reads it).
    event_types: BTreeMap<String, Arc<[u8]>>,
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

    /// Replicated mode: node ids that left and may never come back.
    pub(crate) fn retired_nodes(&self) -> &BTreeSet<u64> {
        &self.retired_nodes
    }

    /// The event catalogue, by type.
    pub(crate) fn event_types(&self) -> &BTreeMap<String, Arc<[u8]>> {
        &self.event_types
    }

    /// Sets (or, with an empty `definition`, removes) a catalogue entry:
    /// a record's or a checkpoint's.
    pub(crate) fn set_event_type(&mut self, name: &str, definition: &[u8]) {
        if definition.is_empty() {
            self.event_types.remove(name);
        } else {
            self.event_types
                .insert(name.to_owned(), Arc::from(definition));
        }
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

    /// Queue `name` with the events its untouched deliveries stand for,
    /// for what takes a message out of it.
    fn queue_and_events(&mut self, name: &str) -> Option<(&mut Queue, &mut fresh::FreshEvents)> {
        let id = self.names.get(name)?;
        let q = self.queues.get_mut(id).map(|q| &mut **q)?;
        Some((q, &mut self.fresh_events))
    }

    fn queue_mut(&mut self, name: &str) -> Option<&mut Queue> {
        let id = self.names.get(name)?;
        self.queues.get_mut(id).map(|q| &mut **q)
    }

    /// How many queues there are, failure queues not counted.
    pub(crate) fn queue_count(&self) -> usize {
        // Every queue has its failure queue, made and deleted with it.
        self.names.len() / 2
    }

    /// Names of every queue (failure queues included), sorted.
    /// Every queue's name, in no order.
    pub(crate) fn queue_name_refs(&self) -> impl Iterator<Item = &str> {
        self.names.keys().map(String::as_str)
    }

    pub(crate) fn queue_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.names.keys().cloned().collect();
        names.sort();
        names
    }

    /// The events untouched deliveries stand for.
    pub(crate) fn fresh_events(&self) -> &fresh::FreshEvents {
        &self.fresh_events
    }

    /// Total messages in every queue.
    pub(crate) fn message_count(&self) -> usize {
        self.queues.values().map(|q| q.len()).sum()
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
    /// closes it (or moves its probe), or closes it (`None`), counting
    /// failures afresh; memory only. While open, workers get no leases
    /// except an explicit probe.
    pub(crate) fn set_breaker(&mut self, queue: &str, next_probe: Option<Millis>) {
        if let Some(q) = self.queue_mut(queue) {
            q.breaker.next_probe = next_probe;
            if next_probe.is_none() {
                q.breaker.failures = 0;
            }
        }
    }

    /// Counts a settled attempt in its queue's breaker: a delivery ends a
    /// run of failures; a retryable failure adds to it, and the
    /// `breaker_failures`-th in a row opens the breaker with its first
    /// probe at `first_probe` (a probe's own failure only counts: the
    /// breaker is open already). A permanent status says nothing about the
    /// destination's health.
    pub(crate) fn count_attempt(
        &mut self,
        queue: &str,
        attempt: AttemptEffect,
        first_probe: Millis,
    ) -> BreakerTurn {
        let Some(q) = self.queue_mut(queue) else {
            return BreakerTurn::Unchanged { open: false };
        };
        let threshold = q.settings.breaker_failures.max(1);
        let b = &mut q.breaker;
        match attempt {
            AttemptEffect::Delivered => b.failures = 0,
            AttemptEffect::Permanent => {}
            AttemptEffect::Retryable { probe } => {
                b.failures = b.failures.saturating_add(1);
                if !probe && b.next_probe.is_none() && b.failures >= threshold {
                    b.next_probe = Some(first_probe);
                    return BreakerTurn::Opened;
                }
            }
        }
        BreakerTurn::Unchanged {
            open: b.next_probe.is_some(),
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
        let Some(qid) = self.holder_id(base_queue, id) else {
            return;
        };
        let q = self.queues.get_mut(&qid).expect("found above");
        let Some((message, _)) = q.take(id, &mut self.fresh_events) else {
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

    fn remove(&mut self, queue: &str, id: MessageId, count: impl FnOnce(&mut Counters)) -> Applied {
        let Some(&qid) = self.names.get(queue) else {
            return Applied::Missing;
        };
        let q = self.queues.get_mut(&qid).expect("bug: name without queue");
        match q.take(id, &mut self.fresh_events) {
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
    pub(crate) fn find(&self, base_queue: &str, id: MessageId) -> Option<(&Queue, Message)> {
        let q = self.queue(base_queue)?;
        if let Some(m) = q.message(id, &self.fresh_events) {
            return Some((q, m));
        }
        let fq: &Queue = &self.queues[&q.failed?];
        fq.message(id, &self.fresh_events).map(|m| (fq, m))
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
        // An untouched delivery moves with its event's record
        // (`relocate_fresh`); compaction moves it no other way.
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

    /// The id of the queue (a base queue or its failure queue) that holds
    /// message `id`.
    fn holder_id(&self, base_queue: &str, id: MessageId) -> Option<QueueId> {
        let qid = *self.names.get(base_queue)?;
        let q = &self.queues[&qid];
        if q.contains(id) {
            return Some(qid);
        }
        q.failed.filter(|f| self.queues[f].contains(id))
    }

    /// Compaction moved the record at `from` to `to`: every untouched
    /// delivery of the event there moves with it, as one.
    pub(crate) fn relocate_fresh(&mut self, from: RecordLoc, to: RecordLoc) {
        for _ in 0..self.fresh_events.relocate(from, to) {
            self.release_record(from, true);
            self.hold_record(to, true);
        }
    }

    /// Compaction planned: from now until [`Spool::take_promotions`], note
    /// every delivery promoted from its event (it takes its own copy of the
    /// record's location, which the plan moves with the event's).
    pub(crate) fn watch_promotions(&mut self) {
        self.promotions = Some(Vec::new());
    }

    /// The deliveries promoted since [`Spool::watch_promotions`], as (base
    /// queue, id); the watch ends.
    pub(crate) fn take_promotions(&mut self) -> Vec<(String, MessageId)> {
        let ids = self.promotions.take().unwrap_or_default();
        ids.into_iter()
            .filter_map(|(qid, id)| {
                let q = self.queues.get(&qid)?;
                let base = match q.parent {
                    Some(parent) => &self.queues.get(&parent)?.name,
                    None => &q.name,
                };
                Some((base.clone(), id))
            })
            .collect()
    }

    /// Turns untouched delivery `id` of queue `qid` into an ordinary
    /// message, before anything changes it.
    fn promote(&mut self, qid: QueueId, id: MessageId) {
        self.measured(qid, |spool| {
            let q = spool
                .queues
                .get_mut(&qid)
                .expect("bug: promoting in a queue that is gone");
            if q.promote(id, &mut spool.fresh_events)
                && let Some(promoted) = &mut spool.promotions
            {
                promoted.push((qid, id));
            }
        });
    }

    /// The queue (a base queue or its failure queue) that holds message `id`.
    fn holder_mut(&mut self, base_queue: &str, id: MessageId) -> Option<&mut Queue> {
        let qid = *self.names.get(base_queue)?;
        let q = &self.queues[&qid];
        let holder = if q.contains(id) { qid } else { q.failed? };
        self.queues
            .get_mut(&holder)
            .map(|q| &mut **q)
            .filter(|q| q.contains(id))
    }
}
