//! A queue's delivery log (docs/contract.md §4, "Delivery log"): its
//! messages, its failure queue's and its history, together, newest first
//! (by id, which is the order they were sent in), each with what became
//! of it.

use super::Spool;
use super::queue::{Queue, merge};
use super::types::{MessageView, SpoolError};
use crate::journal::RecordLoc;
use crate::spool::command::MessageId;
use crate::time::Millis;

/// What became of a delivery, as the log says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogState {
    /// Waiting, leased or held, never tried (or only by a probe).
    Pending,
    /// Tried and failed at least once; it will be tried again.
    Retrying,
    /// In the failure queue.
    Failed,
    /// Delivered, and kept in the history.
    Delivered,
}

impl LogState {
    pub fn as_str(self) -> &'static str {
        match self {
            LogState::Pending => "pending",
            LogState::Retrying => "retrying",
            LogState::Failed => "failed",
            LogState::Delivered => "delivered",
        }
    }
}

/// One entry of the log: the message as a peek (or the history) shows
/// it, and where its record and attempts are.
#[derive(Debug, Clone, Copy)]
pub struct LogEntry {
    pub state: LogState,
    pub view: MessageView,
    /// Whether it is in the failure queue (its view is that queue's).
    pub in_failure_queue: bool,
    pub attempts: Option<RecordLoc>,
}

impl Spool {
    /// The log of `queue` (not a failure queue), newest first, below id
    /// `before`, of what was sent at or after `since` and before `until`.
    pub(crate) fn delivery_log(
        &self,
        queue: &str,
        before: Option<MessageId>,
        (since, until): (Option<Millis>, Option<Millis>),
        now: Millis,
    ) -> Result<impl Iterator<Item = LogEntry> + '_, SpoolError> {
        let q = (self.queue(queue))
            .filter(|q| !q.is_failure_queue())
            .ok_or(SpoolError::QueueNotFound)?;
        let end = before.unwrap_or(MessageId(u64::MAX));
        let live = self.live_below(q, end, now, false);
        let failed = (q.failed.and_then(|f| self.queues.get(&f)))
            .map(|f| self.live_below(f, end, now, true))
            .into_iter()
            .flatten();
        let delivered = q.history.range(..end).rev().map(|(&id, d)| LogEntry {
            state: LogState::Delivered,
            view: d.view(id),
            in_failure_queue: false,
            attempts: d.attempts,
        });
        let newer = |a: &LogEntry, b: &LogEntry| a.view.id >= b.view.id;
        let all = merge(merge(live, failed, newer), delivered, newer);
        Ok(all.filter(move |e| {
            let sent = e.view.message.enqueued_at;
            since.is_none_or(|s| sent >= s) && until.is_none_or(|u| sent < u)
        }))
    }

    /// The messages of `q` below id `end`, newest first, as log entries.
    fn live_below<'a>(
        &'a self,
        q: &'a Queue,
        end: MessageId,
        now: Millis,
        failure_queue: bool,
    ) -> impl Iterator<Item = LogEntry> + 'a {
        q.entries_below(end, &self.fresh_events)
            .map(move |(id, m)| {
                let state = if failure_queue {
                    LogState::Failed
                } else if m.retry_count > 0 {
                    LogState::Retrying
                } else {
                    LogState::Pending
                };
                LogEntry {
                    state,
                    view: Spool::view(q, id, &m, now),
                    in_failure_queue: failure_queue,
                    attempts: q.attempts.get(&id).copied(),
                }
            })
    }
}
