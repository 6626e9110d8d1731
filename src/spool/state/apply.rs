//! Applying a durable record: deterministic and total. A record that names
//! something no longer there is a no-op, so that replay and the live
//! process end in the same state.

use std::borrow::Cow;
use std::sync::Arc;

use super::Spool;
use super::queue::Leaving;
use super::queue::keys::key_hash;
use super::queue::{Queue, QueueId};
use super::types::{Applied, Delivered, EventSeen, Message};
use crate::journal::RecordLoc;
use crate::spool::command::FailInfo;
use crate::spool::command::{Command, EnqueueMeta, EventMeta, MessageId, Record};
use crate::spool::queue::{QueueSettings, failed_queue_name};
use crate::time::Millis;

/// The most queues' room the scratch list of [`Spool::apply`] keeps.
const NAMED_SCRATCH_KEPT: usize = 64;

impl Spool {
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
        // One list, kept between records: not allocated twice per record.
        let mut named = std::mem::take(&mut self.named_scratch);
        self.named_queues_into(&record.command, &mut named);
        let before = self.memory_of(&named);
        let applied = self.apply_command(record, loc);
        self.named_queues_into(&record.command, &mut named);
        for &qid in &named {
            self.settle_keys(qid);
        }
        self.memory_bytes = (self.memory_bytes + self.memory_of(&named)).saturating_sub(before);
        self.busy.extend(named.iter().copied());
        // An event to many queues leaves no large list behind.
        if named.capacity() <= NAMED_SCRATCH_KEPT {
            self.named_scratch = named;
        }
        applied
    }

    /// The queues `command` names (and their failure queues) join `busy`.
    pub(super) fn mark_busy(&mut self, command: &Command<'_>) {
        let named = self.named_queues(command);
        self.busy.extend(named);
    }

    /// The queues `command` names, with their failure queues: all that
    /// applying it can change.
    fn named_queues(&self, command: &Command<'_>) -> Vec<QueueId> {
        let mut out = Vec::new();
        self.named_queues_into(command, &mut out);
        out
    }

    /// [`Spool::named_queues`] into `out` (cleared first).
    fn named_queues_into(&self, command: &Command<'_>, out: &mut Vec<QueueId>) {
        out.clear();
        let mut mark = |name: &str| {
            let base = crate::spool::queue::origin_queue_name(name);
            if let Some(&qid) = self.names.get(base) {
                out.push(qid);
                out.extend(self.queues[&qid].failed);
            }
        };
        match command {
            Command::Enqueue(meta) => mark(&meta.queue),
            Command::Event(meta) => {
                for (queue, _) in &meta.deliveries {
                    mark(queue);
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
            | Command::HistoryDrop { queue, .. }
            | Command::SecretExpire { queue, .. }
            | Command::QueueDelete { name: queue } => mark(queue),
            Command::QueuePause { .. }
            | Command::Epoch { .. }
            | Command::RaftBlank
            | Command::RaftMembership { .. }
            | Command::RetireNode { .. }
            | Command::EventType { .. } => {}
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
        for qid in self.named_queues(&record.command) {
            self.settle_keys(qid);
        }
        self.mark_busy(&record.command);
        applied
    }

    /// The one dispatch from a command to the function that applies it
    /// (a queue's own changes through [`Spool::apply_queue_change`], the
    /// records that name no queue through [`Spool::apply_spool_wide`]).
    pub(super) fn apply_command(&mut self, record: &Record<'_>, loc: RecordLoc) -> Applied {
        let at = record.at;
        self.last_at = self.last_at.max(at);
        match &record.command {
            command @ (Command::QueueUpsert { .. }
            | Command::QueueDelete { .. }
            | Command::QueuePause { .. }
            | Command::SecretExpire { .. }) => self.apply_queue_change(command, at),
            Command::Enqueue(meta) => self.apply_enqueue(meta, at, loc),
            Command::Event(meta) => self.apply_event(meta, at, loc),
            Command::Resend {
                queue,
                id,
                visible_at,
                ..
            } => self.apply_resend(queue, *id, *visible_at, at, loc),
            Command::Ack { queue, id } => self.apply_ack(queue, *id, at),
            Command::HistoryDrop { queue, ids } => Applied::Count(self.drop_history(queue, ids)),
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
            command @ (Command::Epoch { .. }
            | Command::RaftBlank
            | Command::RaftMembership { .. }
            | Command::RetireNode { .. }
            | Command::EventType { .. }) => self.apply_spool_wide(command),
            Command::Attempt { queue, id, .. } => self.apply_attempt(queue, *id, loc),
            Command::DedupKey {
                queue,
                hash,
                first_at,
                id,
            } => self.apply_dedup_key(queue, *hash, *first_at, *id),
        }
    }

    /// Applies a record that changes a queue rather than its messages: an
    /// upsert, a delete, a pause, the end of a rotated-out secret.
    fn apply_queue_change(&mut self, command: &Command<'_>, at: Millis) -> Applied {
        match command {
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
            Command::SecretExpire { queue, expires_at } => {
                self.apply_secret_expire(queue, *expires_at)
            }
            _ => unreachable!("bug: apply_command routes only a queue's changes here"),
        }
    }

    /// Applies a record that names no queue: the epoch, the replicated
    /// log's blank entries, membership and retired nodes, and the event
    /// catalogue.
    fn apply_spool_wide(&mut self, command: &Command<'_>) -> Applied {
        match command {
            Command::Epoch { epoch } => self.epoch = self.epoch.max(*epoch),
            Command::RaftBlank => {}
            Command::RaftMembership { config } => self.cluster_config = Some(config.to_vec()),
            Command::RetireNode { id } => {
                self.retired_nodes.insert(*id);
            }
            Command::EventType { name, definition } => self.set_event_type(name, definition),
            _ => unreachable!("bug: apply_command routes only records that name no queue here"),
        }
        Applied::Done
    }

    /// A resend, applied as the enqueue of its copy: `id` on `queue`,
    /// visible at `visible_at`.
    fn apply_resend(
        &mut self,
        queue: &str,
        id: MessageId,
        visible_at: Millis,
        at: Millis,
        loc: RecordLoc,
    ) -> Applied {
        let meta = EnqueueMeta {
            id,
            queue: Cow::Borrowed(queue),
            visible_at,
            dedup_hash: None,
            ordering_key: None,
        };
        self.apply_enqueue(&meta, at, loc)
    }

    /// The rotated-out secret that ends at `expires_at` stops signing (one
    /// that a later rotation put there stays).
    fn apply_secret_expire(&mut self, name: &str, expires_at: Millis) -> Applied {
        let Some(q) = self.queue_mut(name) else {
            return Applied::Missing;
        };
        if (q.settings.previous_secret.as_ref()).is_some_and(|p| p.expires_at == expires_at) {
            let mut settings = (*q.settings).clone();
            settings.previous_secret = None;
            q.settings = settings.into();
        }
        Applied::Done
    }

    pub(super) fn apply_pause(&mut self, name: &str, paused: bool) -> Applied {
        match self.queue_mut(name) {
            Some(q) => {
                q.paused = paused;
                Applied::Done
            }
            None => Applied::Missing,
        }
    }

    /// A message back in line at `visible_at`, with its retry count.
    pub(super) fn apply_retry(
        &mut self,
        queue: &str,
        id: MessageId,
        visible_at: Millis,
        retry_count: u32,
    ) -> Applied {
        let Some((q, events)) = self.queue_and_events(queue) else {
            return Applied::Missing;
        };
        // Back in line, still its key's first: it holds the later ones.
        let Some((mut message, failure, _)) = q.take_as(id, events, Leaving::Returning) else {
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
    pub(super) fn apply_fail(
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
        let Some((mut message, _, key)) = q.take_as(id, &mut self.fresh_events, Leaving::Gone)
        else {
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
        if let Some(key) = key {
            fq.join_key(id, key);
        }
        fq.insert(id, message);
        if let Some(a) = attempts {
            fq.attempts.insert(id, a);
        }
        fq.failures.insert(id, info);
        Applied::Done
    }

    /// Messages of `queue` dropped, whatever their state.
    pub(super) fn apply_purge(&mut self, queue: &str, ids: &[MessageId]) -> Applied {
        let Some((q, events)) = self.queue_and_events(queue) else {
            return Applied::Missing;
        };
        let mut gone = Vec::new();
        let mut n = 0;
        for id in ids {
            if let Some((m, _)) = q.take(*id, events) {
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
    pub(super) fn apply_redrive(&mut self, queue: &str, ids: &[MessageId], at: Millis) -> Applied {
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
            if let Some((mut message, _, key)) =
                fq.take_as(id, &mut self.fresh_events, Leaving::Gone)
            {
                message.retry_count = 0;
                message.visible_at = at;
                message.retention_from = at;
                message.pending = false;
                moved.push((id, message, fq.attempts.remove(&id), key));
            }
        }
        let q = self.queues.get_mut(&qid).expect("bug: name without queue");
        let n = moved.len() as u64;
        for (id, message, attempts, key) in moved {
            if let Some(key) = key {
                q.join_key(id, key);
            }
            q.insert(id, message);
            if let Some(a) = attempts {
                q.attempts.insert(id, a);
            }
        }
        Applied::Count(n)
    }

    /// A message's attempts (the record at `loc`) replace its older ones.
    pub(super) fn apply_attempt(&mut self, queue: &str, id: MessageId, loc: RecordLoc) -> Applied {
        let base = crate::spool::queue::origin_queue_name(queue);
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
    pub(super) fn apply_dedup_key(
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

    /// Creates a queue, or replaces its settings at `at`. Dedup keys that
    /// left the old window by then are forgotten first, so that a wider
    /// window never brings back a key that the timer may or may not have
    /// forgotten already (replay and the live process agree).
    pub(super) fn upsert_queue(
        &mut self,
        name: &str,
        settings: &QueueSettings,
        managed_by_config: bool,
        at: Millis,
    ) {
        if let Some(&qid) = self.names.get(name) {
            let q = self.queues.get_mut(&qid).expect("bug: name without queue");
            q.prune_dedup(at);
            let reorder = (q.settings.ordering, q.settings.ordering_on_failure)
                != (settings.ordering, settings.ordering_on_failure);
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
            if reorder {
                self.reorder_keys(qid);
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

    pub(super) fn delete_queue(&mut self, name: &str) -> Applied {
        let Some(qid) = self.names.remove(name) else {
            return Applied::Missing;
        };
        let q = self.queues.remove(&qid).expect("bug: name without queue");
        self.subscriptions.remove(qid.0, &q.settings.events);
        let mut gone: Vec<(RecordLoc, bool)> =
            q.messages.values().map(|m| (m.loc, m.shared)).collect();
        for (_, slot) in q.fresh.iter() {
            gone.push((self.fresh_events.get(slot).loc, true));
            self.fresh_events.leave(slot);
        }
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

    pub(super) fn apply_enqueue(
        &mut self,
        meta: &EnqueueMeta<'_>,
        at: Millis,
        loc: RecordLoc,
    ) -> Applied {
        self.next_message_id = self.next_message_id.max(meta.id.0.saturating_add(1));
        let Some(&qid) = self.names.get(meta.queue.as_ref()) else {
            return Applied::Missing;
        };
        self.count_bytes(loc);
        let q = self.queues.get_mut(&qid).expect("bug: name without queue");
        if let Some(key) = &meta.ordering_key {
            q.join_key(meta.id, key_hash(key));
        }
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
    pub(super) fn apply_ack(&mut self, queue: &str, id: MessageId, at: Millis) -> Applied {
        let Some(&qid) = self.names.get(queue) else {
            return Applied::Missing;
        };
        let q = self.queues.get_mut(&qid).expect("bug: name without queue");
        if q.settings.history_retention_ms == 0 || q.is_failure_queue() {
            return self.remove(queue, id, |c| c.acked += 1);
        }
        let Some((message, _)) = q.take(id, &mut self.fresh_events) else {
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
    pub(super) fn drop_history(&mut self, queue: &str, ids: &[MessageId]) -> u64 {
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

    /// An event: a message in each queue of its deliveries that still
    /// exists, all pointing at the one record; its key remembered.
    pub(super) fn apply_event(
        &mut self,
        meta: &EventMeta<'_>,
        at: Millis,
        loc: RecordLoc,
    ) -> Applied {
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
        let key = meta.ordering_key.as_deref().map(key_hash);
        for (queue, id) in &meta.deliveries {
            let Some(&qid) = self.names.get(queue.as_ref()) else {
                continue;
            };
            self.hold_record(loc, true);
            let q = self.queues.get_mut(&qid).expect("bug: name without queue");
            if let Some(key) = key {
                q.join_key(*id, key);
            }
            q.insert_delivery(
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
                &mut self.fresh_events,
            );
            q.counters.sent += 1;
            n += 1;
        }
        if let Some(hash) = meta.dedup_hash {
            let seen = EventSeen {
                first_at: at,
                id: meta.id,
                fingerprint: meta.fingerprint,
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
}
