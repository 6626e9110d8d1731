//! Loading a checkpoint into an empty state: its position, queues,
//! messages, dedup keys, history and event keys, then the indexes built
//! from them.

use super::Spool;
use super::plain::{DedupEntry, QueueEntry};
use super::types::{Delivered, EventSeen, Message};
use crate::journal::RecordLoc;
use crate::spool::command::FailInfo;
use crate::spool::command::MessageId;
use crate::time::Millis;

impl Spool {
    /// Restores the replica set from a checkpoint.
    pub(crate) fn restore_cluster_config(&mut self, config: Vec<u8>) {
        self.cluster_config = Some(config);
    }

    /// Restores a retired node id from a checkpoint.
    pub(crate) fn restore_retired_node(&mut self, id: u64) {
        self.retired_nodes.insert(id);
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
    pub(crate) fn restore_queue(&mut self, entry: QueueEntry) {
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
        let qid = *self.names.get(name).ok_or("queue not in the checkpoint")?;
        let q = self.queues.get_mut(&qid).expect("bug: name without queue");
        if q.contains(id) {
            return Err("a message repeated");
        }
        match failure {
            Some(f) => {
                q.insert(id, message);
                q.failures.insert(id, f);
            }
            // Kept as compactly as when its event was applied.
            None => q.insert_delivery(id, message, &mut self.fresh_events),
        }
        if let Some(a) = attempts {
            q.attempts.insert(id, a);
            self.count_bytes(a);
        }
        self.hold_record(message.loc, message.shared);
        Ok(())
    }

    /// Gives message `id` of `queue` (or of its failure queue), restored
    /// already, its ordering key: an ordinary message (not an untouched
    /// delivery), out of line until its key settles (`finish_restore`).
    pub(crate) fn restore_ordering_key(
        &mut self,
        queue: &str,
        id: MessageId,
        key: u64,
    ) -> Result<(), &'static str> {
        let qid = self.holder_id(queue, id).ok_or("no such message")?;
        self.promote(qid, id);
        let q = self.queues.get_mut(&qid).expect("found above");
        if q.key_of(id).is_some() {
            return Err("a key repeated");
        }
        q.join_key(id, key);
        if q.ordered() {
            let at = q.messages[&id].visible_at;
            q.ready.remove(&(at, id));
        }
        Ok(())
    }

    /// Remembers a dedup key from a checkpoint (in window-start order).
    pub(crate) fn restore_dedup(
        &mut self,
        queue: &str,
        entry: DedupEntry,
    ) -> Result<(), &'static str> {
        if entry.id.0 >= self.next_message_id {
            return Err("id at or above the next message id");
        }
        let q = self.queue_mut(queue).ok_or("queue not in the checkpoint")?;
        q.dedup.insert(entry.hash, (entry.first_at, entry.id));
        q.dedup_order.push_back((entry.first_at, entry.hash));
        Ok(())
    }

    /// Done restoring: dedup keys in window order, ordering keys settled.
    pub(crate) fn finish_restore(&mut self) {
        let mut keyed = Vec::new();
        for (&qid, q) in &mut self.queues {
            q.dedup_order.make_contiguous().sort_unstable();
            if !q.is_idle() {
                self.busy.insert(qid);
            }
            if q.keys.is_some() {
                keyed.push(qid);
            }
        }
        for qid in keyed {
            self.settle_keys(qid);
        }
        self.memory_bytes = self.queues.values().map(|q| q.memory_bytes()).sum();
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
        if q.history.contains_key(&id) || q.contains(id) {
            return Err("a history entry repeated");
        }
        q.remember(id, d);
        self.hold_record(d.loc, d.shared);
        if let Some(a) = d.attempts {
            self.count_bytes(a);
        }
        Ok(())
    }

    /// Remembers an event's key (applying its record, or from a
    /// checkpoint, oldest first).
    pub(crate) fn restore_event_key(&mut self, hash: u64, seen: EventSeen) {
        self.event_dedup_order.push_back((seen.first_at, hash));
        self.event_key_bytes += Spool::event_key_bytes(seen.deliveries.len());
        if let Some(old) = self.event_dedup.insert(hash, seen) {
            self.event_key_bytes -= Spool::event_key_bytes(old.deliveries.len());
        }
    }
}
