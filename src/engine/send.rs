//! Sending a message: dedup, an id, the enqueue record, the answer after
//! the fsync.

use std::borrow::Cow;

use tokio::sync::oneshot;

use super::core::{Core, Reply, SendOutcome, SendReply};
use super::error::SendError;
use super::error::closed;
use super::{Engine, SendRequest};
use crate::spool::{Command, EnqueueMeta, Record};
use crate::time::Millis;

impl Engine {
    /// Sends a message: `Ok` only after the fsync that covers it.
    pub async fn send(&self, queue: &str, request: SendRequest) -> Result<SendOutcome, SendError> {
        let (tx, rx) = oneshot::channel();
        let submitted = self.submit_send(queue, &request, tx)?;
        // The body is in the journal's buffer now: free the caller's copy
        // (often a slice of the connection's read buffer, which can then be
        // reused for the next request) before waiting for the fsync.
        drop(request);
        match submitted {
            Some(done) => Ok(done),
            None => rx.await.map_err(|_| closed())?,
        }
    }

    /// The locked part of a send. `Some` when the dedup window answers at
    /// once; `None` when the answer will arrive on `tx`.
    fn submit_send(
        &self,
        queue: &str,
        request: &SendRequest,
        tx: SendReply,
    ) -> Result<Option<SendOutcome>, SendError> {
        if self.is_full_for(request.payload.stored_bytes()) {
            return Err(SendError::SpoolFull {
                journal_bytes: self.journal_bytes(),
                max_bytes: self.inner.max_bytes,
            });
        }
        let mut core = self.core();
        let now = self.now(&mut core);
        let window_ms = send_window(&core, queue)?;
        let dedup = match &request.dedup_key {
            None => None,
            Some(_) if window_ms == 0 => {
                return Err(SendError::KeyWithoutWindow {
                    queue: queue.to_owned(),
                });
            }
            Some(key) => {
                let hash = self.inner.tokens.dedup_hash(queue, key);
                if let Some(id) = core.spool.dedup_lookup(queue, hash, now) {
                    core.spool.count_deduplicated(queue);
                    return Ok(Some(SendOutcome {
                        id,
                        deduplicated: true,
                    }));
                }
                let pending_key = (queue.to_owned(), hash);
                if let Some(waiters) = core.pending_dedup.get_mut(&pending_key) {
                    // The first send with this key is still being written:
                    // answer as it does.
                    waiters.push(tx);
                    return Ok(None);
                }
                core.pending_dedup.insert(pending_key.clone(), Vec::new());
                Some((pending_key, hash))
            }
        };
        self.append_enqueue(&mut core, queue, request, now, dedup, tx)
    }

    /// Appends the enqueue of a new message under the lock, its answer to
    /// come on `tx`; if the append is refused, its dedup key (`dedup`: the
    /// pending key and its hash) no longer waits.
    fn append_enqueue(
        &self,
        core: &mut Core,
        queue: &str,
        request: &SendRequest,
        now: Millis,
        dedup: Option<((String, u64), u64)>,
        tx: SendReply,
    ) -> Result<Option<SendOutcome>, SendError> {
        let id = core.spool.allocate_id();
        let record = Record {
            at: now,
            command: Command::Enqueue(EnqueueMeta {
                id,
                queue: Cow::Owned(queue.to_owned()),
                visible_at: now + request.delay_ms as i64,
                dedup_hash: dedup.as_ref().map(|d| d.1),
                ordering_key: request.payload.ordering_key.clone().map(Cow::Owned),
            }),
        };
        let reply = Reply::Send {
            tx,
            dedup: dedup.as_ref().map(|d| d.0.clone()),
        };
        let appended = self
            .check_memory(core, &record)
            .and_then(|()| self.append(core, record, Some(&request.payload), reply));
        if let Err(e) = appended {
            if let Some((key, _)) = dedup {
                core.pending_dedup.remove(&key);
            }
            return Err(e.into());
        }
        Ok(None)
    }
}

/// The dedup window of `queue`, if a send may go to it: refused when it
/// does not exist or is a failure queue.
fn send_window(core: &Core, queue: &str) -> Result<u64, SendError> {
    let q = core
        .spool
        .queue(queue)
        .ok_or_else(|| SendError::QueueNotFound {
            queue: queue.to_owned(),
        })?;
    if q.is_failure_queue() {
        return Err(SendError::FailureQueue {
            queue: queue.to_owned(),
        });
    }
    Ok(q.settings.dedup_window_ms)
}
