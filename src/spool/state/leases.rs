//! Reservations made before a record is appended: leases handed out,
//! renewed, settled and returned, messages marked while their removal is
//! written, and dedup lookups. None is journaled; a restart drops them.

use super::Spool;
use super::fresh::FreshEvents;
use super::queue::{Queue, QueueId, retry_or_fail};
use super::types::{Lease, Leased, Message, SpoolError};
use crate::spool::command::{Command, MessageId};
use crate::time::Millis;

/// A lease batch ends once its messages' records pass this many bytes (at
/// least one message, however large): a receive of 100 messages of 1 MiB
/// held every payload and its JSON at once, 270 MiB of resident memory for
/// one request. The same bound as a peek page's answer.
pub(crate) const LEASE_BATCH_BYTES: u64 = 4 << 20;

impl Spool {
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

    /// Leases up to `max` visible messages of `queue` (fewer once their
    /// records pass [`LEASE_BATCH_BYTES`]), longest-waiting first, until
    /// `now + duration_ms`. A paused queue hands out nothing;
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
        // Leasing an untouched delivery makes it an ordinary message.
        Ok(self.measured(qid, |spool| {
            spool.lease_in(qid, now, duration_ms, max, probe)
        }))
    }

    /// [`Spool::lease`] in queue `qid`, measured by the caller.
    fn lease_in(
        &mut self,
        qid: QueueId,
        now: Millis,
        duration_ms: u64,
        max: usize,
        probe: bool,
    ) -> Vec<Leased> {
        let q = self.queues.get_mut(&qid).expect("bug: name without queue");
        let mut out = Vec::new();
        if q.paused || (q.breaker.next_probe.is_some() && !probe) {
            return out;
        }
        let retention_ms = q.settings.retention_ms as i64;
        let expires_at = now + duration_ms as i64;
        let mut skipped = Vec::new();
        // Untouched deliveries wait in a line of their own, merged with
        // the other by (visible at, id): the next one to look at, past any
        // skipped for their retention.
        let mut fresh_from = MessageId(0);
        let mut record_bytes = 0u64;
        while out.len() < max && record_bytes < LEASE_BATCH_BYTES {
            let events = &mut self.fresh_events;
            let promotions = &mut self.promotions;
            let next = take_next(
                q,
                events,
                promotions,
                qid,
                now,
                retention_ms,
                &mut fresh_from,
            );
            let Some((visible_at, id)) = next else {
                break;
            };
            let message = q.messages[&id];
            if message.retention_from + retention_ms <= now {
                // Past retention: the expiry timer takes it, nobody else.
                skipped.push((visible_at, id));
                continue;
            }
            self.next_lease_serial += 1;
            let leased = lease_one(q, id, message, self.next_lease_serial, expires_at);
            record_bytes += u64::from(message.loc.len);
            out.push(leased);
        }
        q.ready.extend(skipped);
        out
    }

    pub(super) fn valid_lease(
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
        let qid = *self.names.get(queue).ok_or(SpoolError::QueueNotFound)?;
        self.promote(qid, id);
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
        let Some(&qid) = self.names.get(queue) else {
            return;
        };
        let q = self.queues.get_mut(&qid).expect("bug: name without queue");
        let Some(message) = q.messages.get_mut(&id) else {
            return;
        };
        message.pending = false;
        let visible_at = message.visible_at;
        match q.leases.get_mut(&id) {
            Some(lease) => lease.settling = false,
            None => q.line_up(id, visible_at),
        }
        self.settle_keys(qid);
    }

    /// Ends a lease without a record and without counting it: the message
    /// is back in line at its old place, retry count unchanged. For a
    /// lease whose payload could not be read (the spool's fault, not the
    /// message's).
    pub(crate) fn return_lease(&mut self, queue: &str, id: MessageId, serial: u64) {
        let Some(&qid) = self.names.get(queue) else {
            return;
        };
        let q = self.queues.get_mut(&qid).expect("bug: name without queue");
        if q.leases
            .get(&id)
            .is_none_or(|l| l.serial != serial || l.settling)
        {
            return;
        }
        let lease = q.leases.remove(&id).expect("checked above");
        q.lease_expiry.remove(&(lease.expires_at, id));
        let message = q.messages[&id];
        q.line_up(id, message.visible_at);
        self.settle_keys(qid);
    }

    /// Drops every lease (a new epoch): their messages are visible at once,
    /// in their old place in line, retry counts unchanged.
    pub(crate) fn drop_leases(&mut self) {
        let mut keyed = Vec::new();
        for (&qid, q) in self.queues.iter_mut() {
            let ids: Vec<MessageId> = q.leases.drain().map(|(id, _)| id).collect();
            for id in ids {
                let message = q.messages[&id];
                q.line_up(id, message.visible_at);
            }
            q.lease_expiry.clear();
            if q.keys.is_some() {
                keyed.push(qid);
            }
        }
        for qid in keyed {
            self.settle_keys(qid);
        }
    }
}

/// Takes the next message to look at out of `q`'s two lines, the kept one
/// and the untouched deliveries' (from `fresh_from` on), merged by
/// (visible at, id): `None` once none is visible at `now`. An untouched
/// delivery past its retention is passed over (`fresh_from` moves past
/// it); one taken becomes an ordinary message (noted in `promotions`
/// while they are watched).
fn take_next(
    q: &mut Queue,
    events: &mut FreshEvents,
    promotions: &mut Option<Vec<(QueueId, MessageId)>>,
    qid: QueueId,
    now: Millis,
    retention_ms: i64,
    fresh_from: &mut MessageId,
) -> Option<(Millis, MessageId)> {
    loop {
        let kept = q.ready.first().copied();
        let fresh = q
            .fresh
            .first_from(*fresh_from)
            .map(|(id, slot)| (events.get(slot).visible_at, id));
        return match (kept, fresh) {
            (k, Some(f)) if k.is_none_or(|k| f < k) => {
                if f.0 > now {
                    return None;
                }
                // An untouched delivery's retention runs from when it
                // became visible.
                if f.0 + retention_ms <= now {
                    *fresh_from = MessageId(f.1.0 + 1);
                    continue;
                }
                q.promote(f.1, events);
                if let Some(promoted) = promotions {
                    promoted.push((qid, f.1));
                }
                q.ready.remove(&f);
                Some(f)
            }
            (Some(k), _) => {
                if k.0 > now {
                    return None;
                }
                q.ready.pop_first();
                Some(k)
            }
            (None, _) => None,
        };
    }
}

/// Leases `message`, `id` of `q`, with `serial` until `expires_at`.
fn lease_one(
    q: &mut Queue,
    id: MessageId,
    message: Message,
    serial: u64,
    expires_at: Millis,
) -> Leased {
    q.leases.insert(
        id,
        Lease {
            serial,
            expires_at,
            settling: false,
        },
    );
    q.lease_expiry.insert((expires_at, id));
    Leased {
        id,
        serial,
        expires_at,
        message,
        failure: q.failures.get(&id).copied(),
    }
}
