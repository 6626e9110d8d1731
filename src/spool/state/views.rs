//! Reading the state for answers: queue stats, message views and pages,
//! history, events by key, subscribers and the ids a purge or redrive
//! would take.

use super::Spool;
use super::queue::{Queue, QueueId};
use super::types::{EventSeen, Message, MessageState, MessageView, QueueStats, SpoolError};
use crate::spool::command::MessageId;
use crate::spool::filter::{DeadLetterFilter, Selection};
use crate::time::Millis;

impl Spool {
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
            if self.event_dedup.get(&h).is_some_and(|e| e.first_at == at)
                && let Some(gone) = self.event_dedup.remove(&h)
            {
                self.event_key_bytes -= Spool::event_key_bytes(gone.deliveries.len());
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

    /// The queues an event of `event_type` (and `tenant`) goes to, in name
    /// order: those whose patterns take the type and whose tenant, if set,
    /// is the event's (before their content filters).
    pub(crate) fn subscribing(&self, event_type: &str, tenant: Option<&str>) -> Vec<&Queue> {
        let mut queues: Vec<&Queue> = self
            .subscriptions
            .matching(event_type)
            .into_iter()
            .filter_map(|qid| self.queues.get(&QueueId(qid)).map(|q| &**q))
            .filter(|q| match &q.settings.tenant {
                None => true,
                Some(t) => Some(t.as_str()) == tenant,
            })
            .collect();
        queues.sort_unstable_by(|a, b| a.name.cmp(&b.name));
        queues
    }

    /// The names of [`Spool::subscribing`]'s queues.
    pub(crate) fn subscribers(&self, event_type: &str, tenant: Option<&str>) -> Vec<String> {
        self.subscribing(event_type, tenant)
            .into_iter()
            .map(|q| q.name.clone())
            .collect()
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
        let selection = fq.select(filter, max, &self.fresh_events, |id, m| {
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
        Ok(q.select(filter, max, &self.fresh_events, |_, m| !m.pending))
    }

    pub(crate) fn stats(&self, queue: &str, now: Millis) -> Option<QueueStats> {
        let q = self.queue(queue)?;
        let kept_delayed = q.ready.range((now + 1, MessageId(0))..).count() as u64;
        let (fresh_delayed, _) = q.fresh_delayed(now, &self.fresh_events);
        let oldest = q
            .ready
            .first()
            .copied()
            .into_iter()
            .chain(q.fresh_first(&self.fresh_events))
            .min()
            .filter(|&(t, _)| t <= now)
            .map(|(t, _)| now - t);
        let waiting = (q.ready.len() + q.fresh.len()) as u64;
        let delayed = kept_delayed + fresh_delayed;
        Some(QueueStats {
            held: q.held_count(),
            visible: waiting - delayed,
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
            next_probe_at: q.breaker.next_probe,
            signing_secrets: q.settings.signing_secret_count(now) as u64,
            previous_secret_expires_at: (q.settings.live_previous_secret(now))
                .map(|p| p.expires_at),
        })
    }

    pub(super) fn view(q: &Queue, id: MessageId, message: &Message, now: Millis) -> MessageView {
        let state = if q.leases.contains_key(&id) {
            MessageState::Leased
        } else if q.is_held(id) {
            MessageState::Held
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
        Ok(q.entries_from(start, &self.fresh_events)
            .filter(|(id, _, _)| filter.matches(*id, q.failures.get(id)))
            .take(limit)
            .map(|(id, m, _)| Spool::view(q, id, &m, now))
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
            .entries_newest_first(&self.fresh_events)
            .take(n)
            .map(|(id, m)| Spool::view(q, id, &m, now))
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
        let m = q
            .message(id, &self.fresh_events)
            .ok_or(SpoolError::MessageNotFound)?;
        Ok(Spool::view(q, id, &m, now))
    }

    /// Every message of every queue, for checks in tests and tools.
    pub(crate) fn all_messages(&self) -> Vec<(String, MessageId, Message)> {
        let mut out: Vec<_> = self
            .queues
            .values()
            .flat_map(|q| {
                q.entries_from(MessageId(0), &self.fresh_events)
                    .map(|(id, m, _)| (q.name.clone(), id, m))
            })
            .collect();
        out.sort_by_key(|(_, id, _)| *id);
        out
    }
}
