//! Event deliveries nobody has touched yet, kept in a few bytes each.
//!
//! An event fanned out to N queues is one record and N messages. Until a
//! delivery is leased, moved or removed it is exactly its event: enqueued
//! and visible when the event was, retention from then, retry count 0,
//! the event's record. So it is kept as an id in its queue's [`Fresh`]
//! line pointing at the event's one [`FreshEvent`] slot, instead of as a
//! [`Message`] in three indexes (its map, the line and the retention
//! order), which cost about 175 bytes a delivery. Anything that changes a
//! delivery first promotes it to an ordinary message
//! (`Queue::promote`); reading one builds the [`Message`] it stands for,
//! so nothing outside the state machine can tell the two apart, and a
//! checkpoint or a replay gives the same state whichever way a delivery
//! was kept.
//!
//! A line holds its ids ascending, and (as a queue's line of waiting
//! messages orders them) by visibility then id: an entry that would break
//! that order (a clock that went back between two events) becomes an
//! ordinary message instead. A removed entry is marked in place and the
//! line is compacted once marks outnumber entries, so a removal costs a
//! binary search, not a shift.

use std::collections::{HashMap, VecDeque};

use super::types::Message;
use crate::journal::RecordLoc;
use crate::spool::command::MessageId;
use crate::time::Millis;

/// What every untouched delivery of one event shares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct FreshEvent {
    pub loc: RecordLoc,
    pub enqueued_at: Millis,
    pub visible_at: Millis,
    /// Deliveries in some line that point here; the slot is freed at 0.
    pub members: u32,
}

impl FreshEvent {
    /// The message an untouched delivery of this event is.
    pub(super) fn message(&self) -> Message {
        Message {
            enqueued_at: self.enqueued_at,
            visible_at: self.visible_at,
            retention_from: self.visible_at,
            loc: self.loc,
            retry_count: 0,
            pending: false,
            shared: true,
        }
    }
}

/// The events that untouched deliveries point at, by slot.
#[derive(Debug, Default)]
pub(crate) struct FreshEvents {
    slots: Vec<FreshEvent>,
    free: Vec<u32>,
    /// The slot of each event record, to find it from a delivery restored
    /// from a checkpoint, and when compaction moves the record.
    by_loc: HashMap<RecordLoc, u32>,
}

impl FreshEvents {
    pub(super) fn get(&self, slot: u32) -> &FreshEvent {
        &self.slots[slot as usize]
    }

    /// The slot of the event at `loc` (made if there is none) for one more
    /// delivery that is `message`; `None` if the record's slot stands for
    /// other times (then the delivery is kept as an ordinary message).
    pub(super) fn join(&mut self, message: &Message) -> Option<u32> {
        let fresh = FreshEvent {
            loc: message.loc,
            enqueued_at: message.enqueued_at,
            visible_at: message.visible_at,
            members: 0,
        };
        if !message.shared
            || message.retry_count != 0
            || message.pending
            || message.retention_from != message.visible_at
        {
            return None;
        }
        let slot = match self.by_loc.get(&message.loc) {
            Some(&slot) => slot,
            None => {
                let slot = match self.free.pop() {
                    Some(slot) => {
                        self.slots[slot as usize] = fresh;
                        slot
                    }
                    None => {
                        self.slots.push(fresh);
                        u32::try_from(self.slots.len() - 1).expect("bug: 2³² live events")
                    }
                };
                self.by_loc.insert(message.loc, slot);
                slot
            }
        };
        let event = &mut self.slots[slot as usize];
        if event.enqueued_at != fresh.enqueued_at || event.visible_at != fresh.visible_at {
            return None;
        }
        event.members += 1;
        Some(slot)
    }

    /// One delivery of the event in `slot` left its line.
    pub(super) fn leave(&mut self, slot: u32) {
        let event = &mut self.slots[slot as usize];
        event.members = event
            .members
            .checked_sub(1)
            .expect("bug: a fresh event left by more deliveries than it had");
        if event.members == 0 {
            self.leave_empty(slot);
        }
    }

    fn leave_empty(&mut self, slot: u32) {
        let loc = self.slots[slot as usize].loc;
        self.by_loc.remove(&loc);
        self.free.push(slot);
    }

    /// Compaction moved the record at `from` to `to`: the event there, if
    /// untouched deliveries point at it, now points at `to`. Returns how
    /// many deliveries moved with it.
    pub(super) fn relocate(&mut self, from: RecordLoc, to: RecordLoc) -> u32 {
        let Some(slot) = self.by_loc.remove(&from) else {
            return 0;
        };
        let event = &mut self.slots[slot as usize];
        event.loc = to;
        self.by_loc.insert(to, slot);
        event.members
    }

    /// Events with untouched deliveries.
    pub(super) fn len(&self) -> usize {
        self.by_loc.len()
    }
}

/// A removed entry of a line.
const GONE: u32 = u32::MAX;

/// One queue's untouched event deliveries: (id, event slot), ids
/// ascending.
#[derive(Debug, Default)]
pub(super) struct Fresh {
    line: VecDeque<(MessageId, u32)>,
    /// Entries not marked removed.
    live: usize,
}

impl Fresh {
    pub(super) fn len(&self) -> usize {
        self.live
    }

    pub(super) fn is_empty(&self) -> bool {
        self.live == 0
    }

    /// The last entry, if it is live (a line's back is never a mark).
    pub(super) fn last(&self) -> Option<(MessageId, u32)> {
        self.line.back().copied()
    }

    /// Adds a delivery at the end of the line; its id must be the largest.
    pub(super) fn push(&mut self, id: MessageId, slot: u32) {
        assert!(
            self.line.back().is_none_or(|&(last, _)| last < id),
            "bug: a fresh delivery out of id order"
        );
        self.line.push_back((id, slot));
        self.live += 1;
    }

    /// Where live entry `id` is.
    pub(super) fn position(&self, id: MessageId) -> Option<usize> {
        let i = self.line.binary_search_by_key(&id, |&(id, _)| id).ok()?;
        (self.line[i].1 != GONE).then_some(i)
    }

    /// The slot of live entry `id`.
    pub(super) fn slot(&self, id: MessageId) -> Option<u32> {
        self.position(id).map(|i| self.line[i].1)
    }

    /// Removes the live entry at `i`; its slot.
    pub(super) fn remove_at(&mut self, i: usize) -> u32 {
        let slot = std::mem::replace(&mut self.line[i].1, GONE);
        assert_ne!(slot, GONE, "bug: a fresh delivery removed twice");
        self.live -= 1;
        while self.line.front().is_some_and(|&(_, s)| s == GONE) {
            self.line.pop_front();
        }
        while self.line.back().is_some_and(|&(_, s)| s == GONE) {
            self.line.pop_back();
        }
        // Marks never outnumber entries by much: a removal stays O(log n)
        // amortised, and the line's memory follows what it holds.
        if self.line.len() > 2 * self.live + 32 {
            self.line.retain(|&(_, s)| s != GONE);
            self.line.shrink_to(2 * self.live + 32);
        }
        slot
    }

    /// Removes live entry `id`; its slot.
    pub(super) fn remove(&mut self, id: MessageId) -> Option<u32> {
        let i = self.position(id)?;
        Some(self.remove_at(i))
    }

    /// The first live entry with an id at or above `start`.
    pub(super) fn first_from(&self, start: MessageId) -> Option<(MessageId, u32)> {
        self.iter_from(start).next()
    }

    /// Live entries with ids at or above `start`, ascending.
    pub(super) fn iter_from(
        &self,
        start: MessageId,
    ) -> impl DoubleEndedIterator<Item = (MessageId, u32)> + '_ {
        let first = self.line.partition_point(|&(id, _)| id < start);
        self.line
            .range(first..)
            .copied()
            .filter(|&(_, s)| s != GONE)
    }

    /// Live entries with ids below `end`, ascending.
    pub(super) fn iter_below(
        &self,
        end: MessageId,
    ) -> impl DoubleEndedIterator<Item = (MessageId, u32)> + '_ {
        let last = self.line.partition_point(|&(id, _)| id < end);
        self.line.range(..last).copied().filter(|&(_, s)| s != GONE)
    }

    /// Every live entry, ascending.
    pub(super) fn iter(&self) -> impl DoubleEndedIterator<Item = (MessageId, u32)> + '_ {
        self.iter_from(MessageId(0))
    }

    /// Entries, live or marked: what the line's buffer holds (its
    /// capacity is at most twice this).
    pub(super) fn entries(&self) -> usize {
        self.line.len()
    }
}
