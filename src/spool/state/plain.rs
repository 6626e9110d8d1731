//! The state without leases, as plain data: what a checkpoint holds, and
//! what tests compare after every crash and replay.

use std::collections::BTreeMap;

use super::types::Delivered;
use crate::journal::RecordLoc;
use crate::spool::command::FailInfo;
use crate::spool::command::MessageId;
use crate::spool::queue::QueueSettings;
use crate::time::Millis;

/// A queue as a checkpoint holds it (its failure queue is implied).
#[derive(Debug, Clone, PartialEq)]
pub struct QueueEntry {
    pub name: String,
    pub settings: QueueSettings,
    pub managed_by_config: bool,
    pub paused: bool,
}

/// A message as a checkpoint holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MessageEntry {
    pub id: MessageId,
    /// In the base queue's failure queue.
    pub in_failure_queue: bool,
    pub enqueued_at: Millis,
    pub visible_at: Millis,
    pub retention_from: Millis,
    pub retry_count: u32,
    pub loc: RecordLoc,
    /// `loc` is an event's record, shared with its other deliveries.
    pub shared: bool,
    pub attempts: Option<RecordLoc>,
    pub failure: Option<FailInfo>,
    /// Its ordering key's hash (`state/queue/keys.rs`).
    pub ordering_key: Option<u64>,
}

/// A remembered dedup key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct DedupEntry {
    pub first_at: Millis,
    pub hash: u64,
    pub id: MessageId,
}

/// The state without leases, as plain data: what a checkpoint holds, and
/// what tests compare after every crash and replay.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SpoolState {
    pub epoch: u64,
    pub next_message_id: u64,
    /// By name: the queue and its messages (ids ascending, base queue and
    /// failure queue together) and dedup keys (by window start).
    pub queues: BTreeMap<String, QueueState>,
    /// Replicated mode: the replica set as last applied (opaque bytes).
    pub cluster_config: Option<Vec<u8>>,
    /// Replicated mode: node ids that may never be members again.
    pub retired_nodes: Vec<u64>,
    /// Events' idempotency keys, oldest first.
    pub event_keys: Vec<EventKeyEntry>,
    /// The event catalogue: each type's definition (JSON).
    pub event_types: BTreeMap<String, Vec<u8>>,
}

/// A remembered event key: the event and its deliveries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventKeyEntry {
    pub hash: u64,
    pub first_at: Millis,
    pub id: MessageId,
    pub fingerprint: Option<u64>,
    pub deliveries: Vec<(String, MessageId)>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct QueueState {
    pub queue: QueueEntry,
    pub messages: Vec<MessageEntry>,
    pub dedup: Vec<DedupEntry>,
    /// Delivered messages kept (`history_retention`), ids ascending.
    pub history: Vec<(MessageId, Delivered)>,
}

impl SpoolState {
    /// The same state with every record location zeroed: locations change
    /// with compaction, nothing else does.
    pub fn without_locations(mut self) -> SpoolState {
        let zero = RecordLoc {
            file: 0,
            offset: 0,
            len: 0,
        };
        for q in self.queues.values_mut() {
            for m in &mut q.messages {
                m.loc = zero;
                m.attempts = m.attempts.map(|_| zero);
            }
            for (_, d) in &mut q.history {
                d.loc = zero;
                d.attempts = d.attempts.map(|_| zero);
            }
        }
        self
    }
}
