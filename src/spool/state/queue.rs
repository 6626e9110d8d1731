//! One queue as memory keeps it: its messages by id and in line (event
//! deliveries nobody touched yet in a compact line of their own,
//! `fresh.rs`), its dedup keys and delivered history, and the rule that
//! sends an unsettled lease back in line or to the failure queue.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::Arc;

use super::fresh::{Fresh, FreshEvents};
use super::plain::MessageEntry;
use super::types::{Breaker, Counters, Delivered, Lease, Message};
use crate::journal::RecordLoc;
use crate::spool::command::FailInfo;
use crate::spool::command::{Command, FailReason, MessageId};
use crate::spool::filter::{DeadLetterFilter, Selection};
use crate::spool::queue::QueueSettings;
use crate::time::Millis;
use keys::Keys;
pub(in crate::spool::state) use keys::Leaving;

pub(super) mod keys;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(super) struct QueueId(pub(super) u32);

/// A map by message id (or dedup hash): SipHash with fixed keys. Its keys
/// are counters and keyed hashes, nothing a client can aim at one bucket;
/// and without the random state each map is 16 bytes smaller, which every
/// one of 100 000 queues (and its failure queue) pays four times.
pub(super) type IdMap<K, V> =
    HashMap<K, V, std::hash::BuildHasherDefault<std::hash::DefaultHasher>>;

#[derive(Debug)]
pub(crate) struct Queue {
    pub name: String,
    /// Shared: every failure queue whose queue has the same lease timeout
    /// and retention has the same settings, one copy of them.
    pub settings: Arc<QueueSettings>,
    pub managed_by_config: bool,
    pub paused: bool,
    /// The push queue's circuit breaker (memory only).
    pub breaker: Breaker,
    /// For a failure queue: the queue it belongs to.
    pub(super) parent: Option<QueueId>,
    /// For an ordinary queue: its failure queue.
    pub(super) failed: Option<QueueId>,
    /// Every message but the untouched event deliveries of `fresh`.
    pub(super) messages: BTreeMap<MessageId, Message>,
    /// Messages of `messages` waiting for a lease (visible or delayed), in
    /// line order.
    pub(super) ready: BTreeSet<(Millis, MessageId)>,
    /// Every message of `messages`, by the start of its retention.
    pub(super) retention: BTreeSet<(Millis, MessageId)>,
    /// Event deliveries nobody has touched: waiting, in line order (which
    /// is their order by id, and by the start of their retention) and by
    /// id, a few bytes each.
    pub(super) fresh: Fresh,
    pub(super) leases: IdMap<MessageId, Lease>,
    pub(super) lease_expiry: BTreeSet<(Millis, MessageId)>,
    /// Dedup key hash → (first send, message id).
    pub(super) dedup: IdMap<u64, (Millis, MessageId)>,
    pub(super) dedup_order: VecDeque<(Millis, u64)>,
    pub(super) failures: IdMap<MessageId, FailInfo>,
    /// Messages with a retry count above 0 (not kept in a failure queue).
    pub(super) retrying: BTreeSet<MessageId>,
    /// Where the latest delivery-attempt record of a message is (it carries
    /// the last ten attempts). Only messages a worker has tried have one.
    pub(super) attempts: IdMap<MessageId, RecordLoc>,
    /// Delivered messages kept for `history_retention`, and the same by
    /// delivery time; the bytes of their records.
    pub(super) history: BTreeMap<MessageId, Delivered>,
    pub(super) history_order: BTreeSet<(Millis, MessageId)>,
    pub(super) history_bytes: u64,
    /// The ordering keys of its messages (`keys.rs`), once one has one.
    pub(super) keys: Option<Box<Keys>>,
    pub counters: Counters,
}

impl Queue {
    pub(super) fn new(
        name: String,
        settings: Arc<QueueSettings>,
        managed_by_config: bool,
    ) -> Queue {
        Queue {
            name,
            settings,
            managed_by_config,
            paused: false,
            breaker: Breaker::default(),
            parent: None,
            failed: None,
            messages: BTreeMap::new(),
            ready: BTreeSet::new(),
            fresh: Fresh::default(),
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
            keys: None,
            counters: Counters::default(),
        }
    }

    pub(crate) fn is_failure_queue(&self) -> bool {
        self.parent.is_some()
    }

    pub(crate) fn len(&self) -> usize {
        self.messages.len() + self.fresh.len()
    }

    /// Nothing here for the timer: no message, lease, dedup key or
    /// history entry.
    pub(super) fn is_idle(&self) -> bool {
        self.messages.is_empty()
            && self.fresh.is_empty()
            && self.leases.is_empty()
            && self.dedup_order.is_empty()
            && self.history.is_empty()
            && self.settings.previous_secret.is_none()
    }

    /// A message joins the queue (its key, if any, joined first): in
    /// line, unless its key holds it.
    pub(super) fn insert(&mut self, id: MessageId, message: Message) {
        self.line_up(id, message.visible_at);
        self.retention.insert((message.retention_from, id));
        if message.retry_count > 0 && !self.is_failure_queue() {
            self.retrying.insert(id);
        }
        self.messages.insert(id, message);
    }

    /// Whether message `id` is here, either way it is kept.
    pub(super) fn contains(&self, id: MessageId) -> bool {
        self.messages.contains_key(&id) || self.fresh.position(id).is_some()
    }

    /// Message `id`, either way it is kept.
    pub(super) fn message(&self, id: MessageId, events: &FreshEvents) -> Option<Message> {
        match self.messages.get(&id) {
            Some(m) => Some(*m),
            None => self.fresh.slot(id).map(|slot| events.get(slot).message()),
        }
    }

    /// A new event delivery (applied, or from a checkpoint): kept untouched
    /// when it can be (its event's times, after every delivery already in
    /// the line), else as an ordinary message.
    pub(super) fn insert_delivery(
        &mut self,
        id: MessageId,
        message: Message,
        events: &mut FreshEvents,
    ) {
        // A keyed delivery is an ordinary message: its key may hold it.
        let in_order = self.key_of(id).is_none()
            && self.fresh.last().is_none_or(|(last, slot)| {
                last < id && events.get(slot).visible_at <= message.visible_at
            });
        if in_order
            && !self.is_failure_queue()
            && !self.messages.contains_key(&id)
            && let Some(slot) = events.join(&message)
        {
            self.fresh.push(id, slot);
            return;
        }
        self.insert(id, message);
    }

    /// Turns untouched delivery `id` into an ordinary message, before
    /// anything changes it; `false` if it is not one.
    pub(super) fn promote(&mut self, id: MessageId, events: &mut FreshEvents) -> bool {
        let Some(i) = self.fresh.position(id) else {
            return false;
        };
        let slot = self.fresh.remove_at(i);
        let message = events.get(slot).message();
        events.leave(slot);
        self.insert(id, message);
        true
    }

    /// Every message with an id at or above `start`, ascending, either way
    /// it is kept (`true`: an untouched delivery).
    pub(super) fn entries_from<'a>(
        &'a self,
        start: MessageId,
        events: &'a FreshEvents,
    ) -> impl Iterator<Item = (MessageId, Message, bool)> + 'a {
        let kept = self.messages.range(start..).map(|(&id, &m)| (id, m, false));
        let fresh = self
            .fresh
            .iter_from(start)
            .map(move |(id, slot)| (id, events.get(slot).message(), true));
        merge(kept, fresh, |a, b| a.0 <= b.0)
    }

    /// Messages with ids below `end`, newest first, either way they are
    /// kept.
    pub(super) fn entries_below<'a>(
        &'a self,
        end: MessageId,
        events: &'a FreshEvents,
    ) -> impl Iterator<Item = (MessageId, Message)> + 'a {
        let kept = self.messages.range(..end).rev().map(|(&id, &m)| (id, m));
        let fresh = self
            .fresh
            .iter_below(end)
            .rev()
            .map(move |(id, slot)| (id, events.get(slot).message()));
        merge(kept, fresh, |a, b| a.0 >= b.0)
    }

    /// Every message, newest (highest id) first, either way it is kept.
    pub(super) fn entries_newest_first<'a>(
        &'a self,
        events: &'a FreshEvents,
    ) -> impl Iterator<Item = (MessageId, Message)> + 'a {
        let kept = self.messages.iter().rev().map(|(&id, &m)| (id, m));
        let fresh = self
            .fresh
            .iter()
            .rev()
            .map(move |(id, slot)| (id, events.get(slot).message()));
        merge(kept, fresh, |a, b| a.0 >= b.0)
    }

    /// Untouched deliveries not yet visible at `now` (only a clock that
    /// went back between their event and now makes one): how many, and
    /// when the first of them becomes visible. The line is in visibility
    /// order, so this walks back from its end over them alone.
    pub(super) fn fresh_delayed(&self, now: Millis, events: &FreshEvents) -> (u64, Option<Millis>) {
        let mut count = 0;
        let mut first = None;
        for (_, slot) in self.fresh.iter().rev() {
            let at = events.get(slot).visible_at;
            if at <= now {
                break;
            }
            count += 1;
            first = Some(at);
        }
        (count, first)
    }

    /// The untouched delivery first in line (the oldest), with when it
    /// became visible.
    pub(super) fn fresh_first(&self, events: &FreshEvents) -> Option<(Millis, MessageId)> {
        self.fresh
            .first_from(MessageId(0))
            .map(|(id, slot)| (events.get(slot).visible_at, id))
    }

    /// Removes a message from every index (its attempts stay: the caller
    /// moves or forgets them), for good or to another queue.
    pub(super) fn take(
        &mut self,
        id: MessageId,
        events: &mut FreshEvents,
    ) -> Option<(Message, Option<FailInfo>)> {
        self.take_as(id, events, Leaving::Gone)
            .map(|(message, failure, _)| (message, failure))
    }

    /// [`Queue::take`], saying how it leaves its key; with its key.
    pub(super) fn take_as(
        &mut self,
        id: MessageId,
        events: &mut FreshEvents,
        leaving: Leaving,
    ) -> Option<(Message, Option<FailInfo>, Option<u64>)> {
        if let Some(slot) = self.fresh.remove(id) {
            let message = events.get(slot).message();
            events.leave(slot);
            return Some((message, None, None));
        }
        let message = self.messages.remove(&id)?;
        let key = self.leave_key(id, leaving);
        self.ready.remove(&(message.visible_at, id));
        self.retention.remove(&(message.retention_from, id));
        self.retrying.remove(&id);
        if let Some(lease) = self.leases.remove(&id) {
            self.lease_expiry.remove(&(lease.expires_at, id));
        }
        Some((message, self.failures.remove(&id), key))
    }

    /// The messages `filter` selects, oldest first: all of them counted,
    /// up to `max` of those `eligible` picked.
    pub(super) fn select(
        &self,
        filter: &DeadLetterFilter,
        max: usize,
        events: &FreshEvents,
        eligible: impl Fn(MessageId, &Message) -> bool,
    ) -> Selection {
        let mut selection = Selection::default();
        let candidates: Box<dyn Iterator<Item = (MessageId, Message)>> = match &filter.ids {
            Some(ids) => Box::new(
                ids.iter()
                    .filter_map(|&id| self.message(id, events).map(|m| (id, m))),
            ),
            None => Box::new(
                self.entries_from(MessageId(0), events)
                    .map(|(id, m, _)| (id, m)),
            ),
        };
        for (id, m) in candidates {
            if !filter.matches(id, self.failures.get(&id)) {
                continue;
            }
            selection.matched += 1;
            if selection.picked.len() < max && eligible(id, &m) {
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

    /// Every message as a checkpoint entry, ids ascending (`true`: an
    /// untouched event delivery, whose record moves with its event's).
    pub(crate) fn message_entries<'a>(
        &'a self,
        in_failure_queue: bool,
        events: &'a FreshEvents,
    ) -> impl Iterator<Item = (MessageEntry, bool)> + 'a {
        self.entries_from(MessageId(0), events)
            .map(move |(id, m, fresh)| {
                let entry = MessageEntry {
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
                    ordering_key: self.key_of(id),
                };
                (entry, fresh)
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
    pub(super) fn remember(&mut self, id: MessageId, d: Delivered) {
        self.history_bytes += d.bytes();
        self.history_order.insert((d.delivered_at, id));
        self.history.insert(id, d);
    }

    /// Removes a history entry; the caller releases its records.
    pub(super) fn forget(&mut self, id: MessageId) -> Option<Delivered> {
        let d = self.history.remove(&id)?;
        self.history_order.remove(&(d.delivered_at, id));
        self.history_bytes -= d.bytes();
        Some(d)
    }

    /// The oldest history entries beyond the queue's bounds: all of them
    /// when history is off, else the oldest while the bytes pass
    /// `history_max_bytes`.
    pub(super) fn history_over_bounds(&self) -> Vec<MessageId> {
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

    pub(super) fn prune_dedup(&mut self, now: Millis) {
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
pub(super) struct FailureSettings(pub(super) HashMap<(u64, u64), Arc<QueueSettings>>);

impl FailureSettings {
    pub(super) fn of(&mut self, parent: &QueueSettings) -> Arc<QueueSettings> {
        self.0
            .entry((parent.lease_timeout_ms, parent.retention_ms))
            .or_insert_with(|| Arc::new(failure_queue_settings(parent)))
            .clone()
    }
}

/// The settings a failure queue takes from its queue: an ordinary pull queue
/// with the parent's retention and lease timeout, and no retry limit.
pub(super) fn failure_queue_settings(parent: &QueueSettings) -> QueueSettings {
    QueueSettings {
        lease_timeout_ms: parent.lease_timeout_ms,
        retention_ms: parent.retention_ms,
        ..QueueSettings::default()
    }
}

/// The record for a lease that ends unsettled or is nacked: back in line at
/// `visible_at` with one more retry, or to the failure queue once that would
/// pass `max_retries`. Failure queues have no limit.
pub(super) fn retry_or_fail(
    q: &Queue,
    id: MessageId,
    visible_at: Millis,
    last_status: Option<u16>,
) -> Command<'static> {
    // A leased message: never an untouched delivery.
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

/// Two ordered streams as one, in order: `first(a, b)` says whether `a`
/// comes before `b`.
pub(super) fn merge<T>(
    a: impl Iterator<Item = T>,
    b: impl Iterator<Item = T>,
    first: impl Fn(&T, &T) -> bool,
) -> impl Iterator<Item = T> {
    let mut a = a.peekable();
    let mut b = b.peekable();
    std::iter::from_fn(move || match (a.peek(), b.peek()) {
        (Some(x), Some(y)) if first(x, y) => a.next(),
        (Some(_), Some(_)) => b.next(),
        (Some(_), None) => a.next(),
        (None, _) => b.next(),
    })
}
