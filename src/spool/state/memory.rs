//! What the state costs in memory, accounted as it changes, so that the
//! engine can refuse a send before the process outgrows `spool.max_memory`
//! (a disk bound alone let 300 events to 10 000 queues take a pod's 512
//! MiB while the journal held 93).
//!
//! The account is a model, not the allocator's word: each kind of entry
//! costs a constant, the bytes one takes in its indexes with their usual
//! slack (a B-tree's nodes are about half full when keys arrive in order,
//! a hash map is at most seven eighths full), measured by `bench/run.sh`
//! (section `fanout`, which sets the account beside the process's RSS in
//! `docs/performance.md`).
//!
//! A queue's share is a function of its collections' lengths, O(1) to
//! compute: applying a record measures the queues it names before and
//! after, and a reservation that changes memory (a lease promoting an
//! untouched delivery) does the same for its queue.

use super::Spool;
use super::queue::{Queue, QueueId};
use crate::spool::Command;

/// A queue and its indexes, empty.
const QUEUE_BYTES: u64 = 1024;
/// An ordinary message: its entry in the queue's map (48 bytes and its id),
/// in the line and in the retention order (16 bytes each), each in a B-tree
/// about half full.
const MESSAGE_BYTES: u64 = 200;
/// A lease, a failure's details, an attempt record's location: a hash map
/// entry each.
const SIDE_ENTRY_BYTES: u64 = 48;
/// A dedup key: a hash map entry and its place in the window's order.
const DEDUP_KEY_BYTES: u64 = 56;
/// A delivered message kept in history: its entry and its place by time.
const HISTORY_ENTRY_BYTES: u64 = 150;
/// An event that untouched deliveries point at: its slot and its entry by
/// record location.
const FRESH_EVENT_BYTES: u64 = 80;
/// The largest an untouched delivery costs in its queue's line: 16 bytes,
/// in a line that may be twice as long as it holds.
const FRESH_DELIVERY_BYTES: u64 = 32;
/// A message's ordering key: its entry by id and in its key's line; and
/// a key's line (`keys.rs`).
const KEYED_MESSAGE_BYTES: u64 = 64;
const KEY_LINE_BYTES: u64 = 96;
/// A remembered event key, and each delivery it lists (a queue name of at
/// most 128 bytes in a `String`, and an id).
const EVENT_KEY_BYTES: u64 = 96;
const EVENT_KEY_DELIVERY_BYTES: u64 = 40;

/// What applying `command` adds to the account, at most: the engine
/// counts it from the moment the record is appended until it is applied
/// (or refused), so that requests in flight cannot pass the bound
/// together.
pub(crate) fn record_cost(command: &Command<'_>) -> u64 {
    match command {
        Command::Enqueue(meta) => {
            let keyed = meta.ordering_key.as_ref();
            MESSAGE_BYTES + keyed.map_or(0, |_| KEYED_MESSAGE_BYTES + KEY_LINE_BYTES)
        }
        Command::Resend { .. } => MESSAGE_BYTES,
        Command::Event(meta) => {
            let key = meta
                .dedup_hash
                .map_or(0, |_| Spool::event_key_bytes(meta.deliveries.len()));
            // A keyed delivery is an ordinary message with its key.
            let each = match meta.ordering_key {
                Some(_) => MESSAGE_BYTES + KEYED_MESSAGE_BYTES + KEY_LINE_BYTES,
                None => FRESH_DELIVERY_BYTES,
            };
            FRESH_EVENT_BYTES + meta.deliveries.len() as u64 * each + key
        }
        _ => 0,
    }
}

impl Queue {
    /// This queue's share of the account.
    pub(super) fn memory_bytes(&self) -> u64 {
        let n = |len: usize| len as u64;
        QUEUE_BYTES
            + n(self.messages.len()) * MESSAGE_BYTES
            + n(self.fresh.entries()) * FRESH_DELIVERY_BYTES
            + n(self.leases.len() + self.failures.len() + self.attempts.len()) * SIDE_ENTRY_BYTES
            + n(self.dedup.len()) * DEDUP_KEY_BYTES
            + n(self.history.len()) * HISTORY_ENTRY_BYTES
            + self.keys.as_ref().map_or(0, |k| {
                n(k.len()) * KEYED_MESSAGE_BYTES + n(k.lines()) * KEY_LINE_BYTES
            })
    }
}

impl Spool {
    /// The queues' share of the account, of those in `queues`.
    pub(super) fn memory_of(&self, queues: &[QueueId]) -> u64 {
        queues
            .iter()
            .filter_map(|qid| self.queues.get(qid))
            .map(|q| q.memory_bytes())
            .sum()
    }

    /// What the state holds in memory, as accounted.
    pub(crate) fn memory_bytes(&self) -> u64 {
        self.memory_bytes
            + self.fresh_events.len() as u64 * FRESH_EVENT_BYTES
            + self.event_key_bytes
    }

    /// What remembering an event's key with `deliveries` costs.
    pub(super) fn event_key_bytes(deliveries: usize) -> u64 {
        EVENT_KEY_BYTES + deliveries as u64 * EVENT_KEY_DELIVERY_BYTES
    }

    /// Runs `change` on queue `qid`, a reservation, keeping the account.
    pub(super) fn measured<T>(&mut self, qid: QueueId, change: impl FnOnce(&mut Spool) -> T) -> T {
        let before = self.memory_of(&[qid]);
        let out = change(self);
        self.memory_bytes = (self.memory_bytes + self.memory_of(&[qid])).saturating_sub(before);
        out
    }
}
