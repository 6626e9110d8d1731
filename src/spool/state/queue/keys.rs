//! Ordering keys (docs/contract.md §1, "Ordered delivery per key"): which
//! messages of a queue carry which key and, on a queue whose `ordering` is
//! `per_key`, which one message of each key is *out*: the only one of its
//! key in line, leased, or being settled. The others are *held*: kept, but
//! out of line, until it leaves.
//!
//! The rule, which the model test states on its own
//! (`tests/engine/model.rs`): a key's out is its lowest id in the queue,
//! unless a message of the key is in flight (leased or being settled: that
//! one stays out) or, with `ordering_on_failure = "hold"`, a message of the
//! key waits in the failure queue (then none is out). A message that is
//! retrying stays the lowest of its key, so it holds the later ones back.
//!
//! Every change marks its key *dirty*; [`Spool::settle_keys`] then makes
//! each dirty key's line obey the rule, O(log n) a key, so a hot key with
//! 100 000 held messages costs a lease no more than a cold one.
//!
//! Keys are kept for every message that has one, ordered queue or not, so
//! that turning `ordering` on later orders what is already there.

use std::collections::BTreeSet;

use super::super::Spool;
use super::{IdMap, Queue, QueueId};
use crate::spool::command::MessageId;
use crate::spool::queue::{Ordering, OrderingOnFailure};

/// Longest ordering key accepted (SQS's message group id is as long).
pub(crate) const ORDERING_KEY_MAX_BYTES: usize = 128;

/// Why an ordering key was refused, for the client.
pub(crate) fn ordering_key_problem(key: &str) -> Option<String> {
    if key.is_empty() || key.len() > ORDERING_KEY_MAX_BYTES {
        return Some(format!(
            "an ordering key is 1 to {ORDERING_KEY_MAX_BYTES} bytes, not {}",
            key.len()
        ));
    }
    if !key.bytes().all(|b| b.is_ascii_graphic()) {
        return Some("an ordering key is printable ASCII without spaces".into());
    }
    None
}

/// A key as memory keeps it: the first eight bytes of its SHA-256. Stable
/// across builds (checkpoints keep it); two keys that collide share one
/// order, which costs them parallelism, never order.
pub(crate) fn key_hash(key: &str) -> u64 {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(key.as_bytes());
    u64::from_le_bytes(digest[..8].try_into().expect("eight bytes"))
}

/// One queue's keyed messages.
#[derive(Debug, Default)]
pub(in crate::spool::state) struct Keys {
    /// The key of each message here that has one.
    of: IdMap<MessageId, u64>,
    /// Each key's messages here, and its out.
    lines: IdMap<u64, KeyLine>,
    /// Keys changed since they were last settled.
    dirty: Vec<u64>,
}

#[derive(Debug, Default)]
struct KeyLine {
    /// Ids ascending: journal order.
    members: BTreeSet<MessageId>,
    /// The message let out, if any (always a member).
    out: Option<MessageId>,
    /// More than one member may be in flight: ordering was turned on
    /// while several were leased. Until at most one is, settling looks
    /// for them among all members.
    crowded: bool,
}

impl Keys {
    pub(in crate::spool::state) fn len(&self) -> usize {
        self.of.len()
    }

    pub(in crate::spool::state) fn lines(&self) -> usize {
        self.lines.len()
    }

    fn mark(&mut self, key: u64) {
        if self.dirty.last() != Some(&key) {
            self.dirty.push(key);
        }
    }
}

/// What a message leaving its queue does to its key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::spool::state) enum Leaving {
    /// For good, or to another queue (its key goes with it).
    Gone,
    /// Back in line at once (a retry): it stays its key's out.
    Returning,
}

impl Queue {
    /// Whether this queue hands out one message of a key at a time.
    pub(in crate::spool::state) fn ordered(&self) -> bool {
        self.settings.ordering == Ordering::PerKey && !self.is_failure_queue()
    }

    pub(crate) fn key_of(&self, id: MessageId) -> Option<u64> {
        self.keys.as_ref()?.of.get(&id).copied()
    }

    /// Message `id` (not yet inserted) carries `key`.
    pub(in crate::spool::state) fn join_key(&mut self, id: MessageId, key: u64) {
        let keys = self.keys.get_or_insert_with(Box::default);
        keys.of.insert(id, key);
        keys.lines.entry(key).or_default().members.insert(id);
        keys.mark(key);
    }

    /// Message `id` leaves (`take`): its key forgets it, unless it is
    /// `Returning`. Its key, for a message that moves on with it.
    pub(in crate::spool::state) fn leave_key(
        &mut self,
        id: MessageId,
        leaving: Leaving,
    ) -> Option<u64> {
        let keys = self.keys.as_mut()?;
        let key = *keys.of.get(&id)?;
        keys.mark(key);
        if leaving == Leaving::Returning {
            return Some(key);
        }
        keys.of.remove(&id);
        let line = keys
            .lines
            .get_mut(&key)
            .expect("bug: a key without its line");
        line.members.remove(&id);
        if line.out == Some(id) {
            line.out = None;
        }
        if line.members.is_empty() {
            keys.lines.remove(&key);
        }
        Some(key)
    }

    /// Whether message `id` waits behind another of its key (and so stays
    /// out of line).
    pub(in crate::spool::state) fn is_held(&self, id: MessageId) -> bool {
        if !self.ordered() {
            return false;
        }
        let Some(keys) = &self.keys else {
            return false;
        };
        match keys.of.get(&id) {
            Some(key) => keys.lines[key].out != Some(id),
            None => false,
        }
    }

    /// Puts message `id` back in line at `visible_at`, or, if its key holds
    /// it, marks the key to settle (a lease that ended, a reservation
    /// undone).
    pub(in crate::spool::state) fn line_up(
        &mut self,
        id: MessageId,
        visible_at: crate::time::Millis,
    ) {
        if self.is_held(id) {
            let key = self.key_of(id).expect("held: keyed");
            self.keys.as_mut().expect("keyed").mark(key);
        } else {
            self.ready.insert((visible_at, id));
        }
    }

    /// Messages held behind another of their key.
    pub(crate) fn held_count(&self) -> u64 {
        match &self.keys {
            Some(keys) if self.ordered() => keys
                .lines
                .values()
                .map(|line| line.members.len() - usize::from(line.out.is_some()))
                .sum::<usize>() as u64,
            _ => 0,
        }
    }

    /// Whether message `id` is in flight: leased, or being removed or moved.
    fn in_flight(&self, id: MessageId) -> bool {
        self.leases.contains_key(&id) || self.messages.get(&id).is_some_and(|m| m.pending)
    }

    /// Makes `key`'s line obey the rule (`blocked`: a message of the key
    /// waits in the failure queue and the queue holds keys for it).
    fn settle_key(&mut self, key: u64, blocked: bool) {
        let Some(line) = self.keys.as_ref().and_then(|k| k.lines.get(&key)) else {
            return;
        };
        let current = line.out;
        let first = line.members.first().copied();
        let empty = line.members.is_empty();
        let (crowded, elsewhere) = if line.crowded {
            let mut flying = line.members.iter().filter(|&&id| self.in_flight(id));
            let found = flying.next().copied();
            (flying.next().is_some(), found)
        } else {
            (false, None)
        };
        let next = match current {
            Some(id) if self.in_flight(id) => Some(id),
            // Another is still in flight (a crowded line): it is out.
            _ if elsewhere.is_some() => elsewhere,
            _ if blocked => None,
            _ => first,
        };
        if current != next {
            if let Some(id) = current {
                let at = self.messages[&id].visible_at;
                self.ready.remove(&(at, id));
            }
            if let Some(id) = next
                && !self.in_flight(id)
            {
                let at = self.messages[&id].visible_at;
                self.ready.insert((at, id));
            }
        }
        let keys = self.keys.as_mut().expect("seen above");
        if empty {
            keys.lines.remove(&key);
        } else {
            let line = keys.lines.get_mut(&key).expect("seen above");
            line.out = next;
            line.crowded = crowded;
        }
    }

    /// Lets every keyed message of an unordered queue into line (ordering
    /// was turned off): each that is not in flight.
    fn unhold_all(&mut self) {
        let Some(keys) = self.keys.as_mut() else {
            return;
        };
        keys.dirty.clear();
        let ids: Vec<MessageId> = keys.of.keys().copied().collect();
        for line in keys.lines.values_mut() {
            line.out = None;
        }
        for id in ids {
            if !self.in_flight(id) {
                let at = self.messages[&id].visible_at;
                self.ready.insert((at, id));
            }
        }
    }
}

impl Spool {
    /// Settles the dirty keys of queue `qid` and of its failure queue (a
    /// change there may block or free a key here).
    pub(in crate::spool::state) fn settle_keys(&mut self, qid: QueueId) {
        let Some(q) = self.queues.get(&qid) else {
            return;
        };
        let (base, failed) = match q.parent {
            Some(parent) => (parent, Some(qid)),
            None => (qid, q.failed),
        };
        let mut dirty: Vec<u64> = Vec::new();
        for id in [Some(base), failed].into_iter().flatten() {
            if let Some(keys) = self.queues.get_mut(&id).and_then(|q| q.keys.as_mut()) {
                dirty.append(&mut keys.dirty);
            }
        }
        if dirty.is_empty() {
            return;
        }
        dirty.sort_unstable();
        dirty.dedup();
        let Some(q) = self.queues.get(&base) else {
            return;
        };
        if !q.ordered() {
            return;
        }
        let hold = q.settings.ordering_on_failure == OrderingOnFailure::Hold;
        let in_failed: Vec<bool> = dirty
            .iter()
            .map(|key| {
                hold && failed
                    .and_then(|f| self.queues.get(&f))
                    .and_then(|fq| fq.keys.as_ref())
                    .is_some_and(|k| k.lines.contains_key(key))
            })
            .collect();
        let q = self.queues.get_mut(&base).expect("seen above");
        for (key, blocked) in dirty.into_iter().zip(in_failed) {
            q.settle_key(key, blocked);
        }
    }

    /// After a change of `ordering` or `ordering_on_failure`: every key of
    /// queue `qid` settled anew (or, unordered now, every keyed message in
    /// line).
    pub(in crate::spool::state) fn reorder_keys(&mut self, qid: QueueId) {
        let Some(q) = self.queues.get_mut(&qid) else {
            return;
        };
        if !q.ordered() {
            q.unhold_all();
            return;
        }
        if let Some(keys) = q.keys.as_mut() {
            let all: Vec<u64> = keys.lines.keys().copied().collect();
            keys.dirty = all;
            // Ordered now: nothing keyed is in line until its key settles.
            for &id in keys.of.keys() {
                if let Some(m) = q.messages.get(&id) {
                    q.ready.remove(&(m.visible_at, id));
                }
            }
            for line in keys.lines.values_mut() {
                let mut flying = line
                    .members
                    .iter()
                    .filter(|&&id| q.leases.contains_key(&id) || q.messages[&id].pending);
                line.out = flying.next().copied();
                line.crowded = flying.next().is_some();
            }
        }
        self.settle_keys(qid);
    }
}

#[cfg(test)]
mod tests;
