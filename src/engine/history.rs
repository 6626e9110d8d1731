//! A queue's delivery history (`history_retention`): delivered messages
//! listed newest first (by time, event type, tenant), one shown with its
//! payload and attempts, and resent as a new message.

use std::borrow::Cow;

use tokio::sync::oneshot;

use super::Engine;
use super::core::Reply;
use super::error::MessageError;
use super::error::closed;
use super::lease::PinnedFile;
use crate::journal::RecordLoc;
use crate::spool::command::AttemptInfo;
use crate::spool::record::decode_attempts;
use crate::spool::state::Delivered;
use crate::spool::{Command, MessageId, Payload, Record, SpoolError};
use crate::time::Millis;

pub use crate::spool::search::SEARCH_SCAN_MAX as HISTORY_SCAN_MAX;
use crate::spool::search::{Search, Verdict};

/// What a history listing selects.
#[derive(Debug, Clone, Default)]
pub struct HistoryQuery {
    pub since: Option<Millis>,
    pub until: Option<Millis>,
    /// Type, tenant, body terms (each entry's record is read for them).
    pub search: Search,
    /// Go on below this cursor (a page's `next`).
    pub before: Option<(Millis, MessageId)>,
    pub limit: usize,
}

/// One delivered message with what it carried.
#[derive(Debug, Clone)]
pub struct HistoryItem {
    pub id: MessageId,
    pub delivered: Delivered,
    pub payload: Payload,
    pub attempts: Vec<AttemptInfo>,
}

/// A page of history, newest first; `next` continues it.
#[derive(Debug, Clone, Default)]
pub struct HistoryPage {
    pub items: Vec<HistoryItem>,
    pub next: Option<(Millis, MessageId)>,
    /// Entries looked at (their records read when a filter needs them).
    pub scanned: usize,
    /// Entries whose body is too large for a `match` term to parse.
    pub unsearched: usize,
}

impl Engine {
    /// A page of `queue`'s history (newest first) that `query` selects;
    /// at most [`HISTORY_SCAN_MAX`] entries are read for it, and the page
    /// ends early once `go_on`, told the bytes of each record read and
    /// whether the page keeps it, says so. Blocking file reads: call it
    /// off the runtime.
    pub fn history(
        &self,
        queue: &str,
        query: &HistoryQuery,
        go_on: &mut dyn FnMut(usize, bool) -> bool,
    ) -> Result<HistoryPage, MessageError> {
        let candidates: Vec<(MessageId, Delivered, PinnedFile, Option<PinnedFile>)> = {
            let core = self.core();
            let q = core
                .spool
                .queue(queue)
                .filter(|q| !q.is_failure_queue())
                .ok_or_else(|| MessageError::QueueNotFound {
                    queue: queue.to_owned(),
                })?;
            q.history_newest_first(query.since, query.until, query.before)
                .take(HISTORY_SCAN_MAX)
                .map(|(id, d)| {
                    let attempts = d.attempts.map(|a| self.inner.reader.file(a.file));
                    (id, *d, self.inner.reader.file(d.loc.file), attempts)
                })
                .collect()
        };
        let limit = query.limit.max(1);
        let mut page = HistoryPage::default();
        let mut cut = false;
        for (id, delivered, file, attempts_file) in candidates {
            page.scanned += 1;
            page.next = Some((delivered.delivered_at, id));
            let payload = self.read_pinned(file, delivered.loc)?;
            let verdict = query.search.judge(&payload);
            let read = payload.body.len();
            let kept = verdict == Verdict::Match;
            if kept {
                let attempts = self.read_attempts(attempts_file, delivered.attempts)?;
                page.items.push(HistoryItem {
                    id,
                    delivered,
                    payload,
                    attempts,
                });
            } else if verdict == Verdict::TooLarge {
                page.unsearched += 1;
            }
            if page.items.len() >= limit {
                break;
            }
            if !go_on(read, kept) {
                cut = true;
                break;
            }
        }
        // A page that ended with the entries (not at its limit, scan bound
        // or budget) has no next.
        if page.items.len() < limit && page.scanned < HISTORY_SCAN_MAX && !cut {
            page.next = None;
        }
        Ok(page)
    }

    /// One delivered message of `queue`'s history.
    pub fn delivered(&self, queue: &str, id: MessageId) -> Result<HistoryItem, MessageError> {
        let (delivered, file, attempts_file) = {
            let core = self.core();
            let q = core
                .spool
                .queue(queue)
                .ok_or_else(|| self.history_error(queue, id, SpoolError::QueueNotFound))?;
            let d = *q
                .delivered(id)
                .ok_or_else(|| self.history_error(queue, id, SpoolError::MessageNotFound))?;
            let attempts = d.attempts.map(|a| self.inner.reader.file(a.file));
            (d, self.inner.reader.file(d.loc.file), attempts)
        };
        Ok(HistoryItem {
            id,
            delivered,
            payload: self.read_pinned(file, delivered.loc)?,
            attempts: self.read_attempts(attempts_file, delivered.attempts)?,
        })
    }

    /// Sends a delivered message of `queue` again: a new message with a
    /// new id and the same payload (its deliveries say
    /// `Spooler-Resent-From`). `Ok` after the fsync.
    pub async fn resend(&self, queue: &str, id: MessageId) -> Result<MessageId, MessageError> {
        let item = self.delivered(queue, id)?;
        let (tx, rx) = oneshot::channel();
        let new_id = {
            let mut core = self.core();
            let now = self.now(&mut core);
            if core.spool.queue(queue).is_none() {
                return Err(self.history_error(queue, id, SpoolError::QueueNotFound));
            }
            let new_id = core.spool.allocate_id();
            let record = Record {
                at: now,
                command: Command::Resend {
                    queue: Cow::Owned(queue.to_owned()),
                    id: new_id,
                    from: id,
                    visible_at: now,
                },
            };
            self.check_memory(&core, &record)?;
            self.append(&core, record, Some(&item.payload), Reply::Done(tx))?;
            new_id
        };
        rx.await.map_err(|_| closed())??;
        Ok(new_id)
    }

    pub(super) fn read_attempts(
        &self,
        file: Option<PinnedFile>,
        loc: Option<RecordLoc>,
    ) -> Result<Vec<AttemptInfo>, MessageError> {
        match (file, loc) {
            (Some(file), Some(loc)) => {
                Ok(self.read_decoded(file, loc, "attempt record", |_, b| decode_attempts(b))?)
            }
            _ => Ok(Vec::new()),
        }
    }

    fn history_error(&self, queue: &str, id: MessageId, e: SpoolError) -> MessageError {
        match e {
            SpoolError::QueueNotFound => MessageError::QueueNotFound {
                queue: queue.to_owned(),
            },
            _ => MessageError::MessageNotFound {
                queue: queue.to_owned(),
                id: self.inner.tokens.format_id(id),
            },
        }
    }
}
