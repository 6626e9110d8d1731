//! What the timer acts on: expired leases, delays that end, retention and
//! dedup windows that pass, and when the next of them is due.

use std::borrow::Cow;

use super::Spool;
use super::fresh::FreshEvents;
use super::queue::{Queue, QueueId, retry_or_fail};
use crate::spool::command::{Command, FailReason, MessageId};
use crate::spool::queue::OnExpire;
use crate::time::Millis;

impl Spool {
    /// Finds what is due at `now` (expired leases, messages past retention),
    /// reserves each and returns the records to append, at most `max`.
    /// Also forgets dedup keys that left their window.
    pub(crate) fn due(&mut self, now: Millis, max: usize) -> Vec<Command<'static>> {
        let mut out = Vec::new();
        let qids: Vec<QueueId> = self.busy.iter().copied().collect();
        for qid in qids {
            let Some(q) = self.queues.get_mut(&qid) else {
                // Deleted.
                self.busy.remove(&qid);
                continue;
            };
            q.prune_dedup(now);
            if q.is_idle() {
                self.busy.remove(&qid);
                continue;
            }
            // A rotated-out secret past its overlap: journaled once, the
            // timer waiting for its record before the next tick.
            if let Some(previous) = &q.settings.previous_secret
                && previous.expires_at <= now
            {
                out.push(Command::SecretExpire {
                    queue: Cow::Owned(q.name.clone()),
                    expires_at: previous.expires_at,
                });
            }
            expire_leases(q, now, max, &mut out);
            let past = past_retention(q, &self.fresh_events, now, max - out.len());
            if past.iter().any(|(_, id)| q.fresh.position(*id).is_some()) {
                for &(_, id) in &past {
                    self.promote(qid, id);
                }
            }
            let q = self.queues.get_mut(&qid).expect("busy above");
            expire_messages(q, past, &mut out);
            drop_history_past(q, now, max, &mut out);
            if out.len() >= max {
                break;
            }
        }
        out
    }

    /// The earliest moment at which [`Spool::due`] or a delayed message
    /// could have something new. Only deadlines that can be acted on count:
    /// a leased message past its retention waits for its lease to end, and
    /// one being removed or moved (pending) for its record.
    pub(crate) fn next_deadline(&self, now: Millis) -> Option<Millis> {
        self.busy
            .iter()
            .filter_map(|qid| self.queues.get(qid))
            .flat_map(|q| {
                let lease = q
                    .lease_expiry
                    .iter()
                    .find(|(_, id)| !q.leases[id].settling)
                    .map(|&(t, _)| t);
                let retention = q
                    .retention
                    .iter()
                    .find(|(_, id)| !q.messages[id].pending && !q.leases.contains_key(id))
                    .map(|&(t, _)| t)
                    .into_iter()
                    .chain(q.fresh_first(&self.fresh_events).map(|(t, _)| t))
                    .min()
                    .map(|t| t + q.settings.retention_ms as i64);
                let delayed = q
                    .ready
                    .range((now + 1, MessageId(0))..)
                    .next()
                    .map(|&(t, _)| t)
                    .into_iter()
                    .chain(q.fresh_delayed(now, &self.fresh_events).1)
                    .min();
                let history = q
                    .history_order
                    .first()
                    .map(|&(t, _)| t + q.settings.history_retention_ms as i64);
                let secret = (q.settings.previous_secret.as_ref()).map(|p| p.expires_at);
                [lease, retention, delayed, history, secret]
            })
            .flatten()
            .min()
    }

    /// The rotated-out secrets that stop signing after `now` and by
    /// `until`: their queue and end (`engine/operational.rs` warns of them).
    pub(crate) fn previous_secrets_ending(
        &self,
        now: Millis,
        until: Millis,
    ) -> Vec<(String, Millis)> {
        self.busy
            .iter()
            .filter_map(|qid| self.queues.get(qid))
            .filter_map(|q| {
                let end = q.settings.previous_secret.as_ref()?.expires_at;
                (now < end && end <= until).then(|| (q.name.clone(), end))
            })
            .collect()
    }

    /// When the next delayed message of `queue` becomes visible.
    pub(crate) fn next_visible_at(&self, queue: &str, now: Millis) -> Option<Millis> {
        let q = self.queue(queue)?;
        q.ready
            .range((now + 1, MessageId(0))..)
            .next()
            .map(|&(t, _)| t)
            .into_iter()
            .chain(q.fresh_delayed(now, &self.fresh_events).1)
            .min()
    }
}

/// Reserves the leases of `q` that expired by `now`, as many as `out` has
/// room for below `max`, and adds the nack (or fail) of each to `out`.
fn expire_leases(q: &mut Queue, now: Millis, max: usize, out: &mut Vec<Command<'static>>) {
    let expired: Vec<MessageId> = q
        .lease_expiry
        .range(..=(now, MessageId(u64::MAX)))
        .map(|&(_, id)| id)
        .filter(|id| !q.leases[id].settling)
        .take(max - out.len())
        .collect();
    for id in expired {
        q.leases.get_mut(&id).expect("listed above").settling = true;
        out.push(retry_or_fail(q, id, now, None));
    }
}

/// The messages of `q` past its retention at `now` that may go (neither
/// pending nor leased), oldest first, at most `room` of them.
fn past_retention(
    q: &Queue,
    events: &FreshEvents,
    now: Millis,
    room: usize,
) -> Vec<(Millis, MessageId)> {
    let retention_ms = q.settings.retention_ms as i64;
    let cut = (
        now.saturating_sub(retention_ms).saturating_add(1),
        MessageId(0),
    );
    let kept = q
        .retention
        .range(..cut)
        .copied()
        .filter(|(_, id)| !q.messages[id].pending && !q.leases.contains_key(id));
    // Untouched deliveries are never pending nor leased, and their
    // line is in retention order too.
    let fresh = q
        .fresh
        .iter()
        .map(|(id, slot)| (events.get(slot).visible_at, id))
        .take_while(|&key| key < cut);
    let mut past: Vec<(Millis, MessageId)> = kept.chain(fresh).collect();
    past.sort_unstable();
    past.truncate(room);
    past
}

/// Reserves each message of `past` (all promoted out of `q`'s fresh line)
/// and adds its record to `out`: to the failure queue if the queue says so
/// and has one, else an expire.
fn expire_messages(q: &mut Queue, past: Vec<(Millis, MessageId)>, out: &mut Vec<Command<'static>>) {
    for (_, id) in past {
        let message = q.messages.get_mut(&id).expect("listed above");
        message.pending = true;
        q.ready.remove(&(message.visible_at, id));
        let queue = Cow::Owned(q.name.clone());
        out.push(
            if q.settings.on_expire == OnExpire::Fail && q.failed.is_some() {
                Command::Fail {
                    queue,
                    id,
                    reason: FailReason::Expired,
                    last_status: None,
                    retry_count: message.retry_count,
                }
            } else {
                Command::Expire { queue, id }
            },
        );
    }
}

/// Adds to `out` the drop of `q`'s delivered messages whose history ended
/// by `now`, at most a record's worth, while `out` has room below `max`.
fn drop_history_past(q: &Queue, now: Millis, max: usize, out: &mut Vec<Command<'static>>) {
    let keep_ms = q.settings.history_retention_ms as i64;
    if keep_ms > 0 && out.len() < max {
        let old: Vec<MessageId> = q
            .history_order
            .range(..(now.saturating_sub(keep_ms).saturating_add(1), MessageId(0)))
            .map(|&(_, id)| id)
            .take(crate::spool::command::IDS_PER_RECORD_MAX)
            .collect();
        if !old.is_empty() {
            out.push(Command::HistoryDrop {
                queue: Cow::Owned(q.name.clone()),
                ids: old,
            });
        }
    }
}
