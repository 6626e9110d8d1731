//! A queue's delivery log (docs/contract.md §4, "Delivery log"): pending,
//! retrying, failed and delivered messages together, newest first,
//! searched by the same terms as the history.

use super::Engine;
use super::error::MessageError;
use super::lease::PinnedFile;
use crate::spool::command::AttemptInfo;
use crate::spool::search::{SEARCH_SCAN_MAX, Search, Verdict};
use crate::spool::state::log::LogEntry;
use crate::spool::{MessageId, Payload};
use crate::time::Millis;

/// What a delivery log listing selects.
#[derive(Debug, Clone, Default)]
pub struct LogQuery {
    /// Sent at or after, and before.
    pub since: Option<Millis>,
    pub until: Option<Millis>,
    /// Type, tenant, body terms (each entry's record is read for them).
    pub search: Search,
    /// Go on below this id (a page's `next`).
    pub before: Option<MessageId>,
    pub limit: usize,
}

/// One entry with what it carried and its last attempts.
#[derive(Debug, Clone)]
pub struct LogItem {
    pub entry: LogEntry,
    pub payload: Payload,
    pub attempts: Vec<AttemptInfo>,
}

/// A page of the log, newest first; `next` continues it.
#[derive(Debug, Clone, Default)]
pub struct LogPage {
    pub items: Vec<LogItem>,
    pub next: Option<MessageId>,
    pub scanned: usize,
    pub unsearched: usize,
}

impl Engine {
    /// A page of `queue`'s delivery log that `query` selects; at most
    /// [`SEARCH_SCAN_MAX`] entries are read for it, and the page ends early
    /// once `go_on` (told the bytes of each record read and whether the
    /// page keeps it) says so. Blocking file reads: call it off the
    /// runtime.
    pub fn delivery_log(
        &self,
        queue: &str,
        query: &LogQuery,
        go_on: &mut dyn FnMut(usize, bool) -> bool,
    ) -> Result<LogPage, MessageError> {
        type Pinned = (LogEntry, PinnedFile, Option<PinnedFile>);
        let candidates: Vec<Pinned> = {
            let mut core = self.core();
            let now = self.now(&mut core);
            let log = (core.spool)
                .delivery_log(queue, query.before, (query.since, query.until), now)
                .map_err(|_| MessageError::QueueNotFound {
                    queue: queue.to_owned(),
                })?;
            log.take(SEARCH_SCAN_MAX)
                .map(|e| {
                    let attempts = e.attempts.map(|a| self.inner.reader.file(a.file));
                    (e, self.inner.reader.file(e.view.message.loc.file), attempts)
                })
                .collect()
        };
        let limit = query.limit.max(1);
        let mut page = LogPage::default();
        let mut cut = false;
        for (entry, file, attempts_file) in candidates {
            page.scanned += 1;
            page.next = Some(entry.view.id);
            let payload = self.read_pinned(file, entry.view.message.loc)?;
            let verdict = query.search.judge(&payload);
            let read = payload.body.len();
            let kept = verdict == Verdict::Match;
            if kept {
                let attempts = self.read_attempts(attempts_file, entry.attempts)?;
                page.items.push(LogItem {
                    entry,
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
        if page.items.len() < limit && page.scanned < SEARCH_SCAN_MAX && !cut {
            page.next = None;
        }
        Ok(page)
    }
}
