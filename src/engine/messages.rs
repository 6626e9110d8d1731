//! One message at a time: peek, get, its payload, cancel.

use std::borrow::Cow;

use super::Engine;
use super::error::MessageError;
use crate::spool::queue::{FAILED_SUFFIX, origin_queue_name};
use crate::spool::{
    Command, DeadLetterFilter, MessageId, MessageState, MessageView, Payload, SpoolError,
};

impl Engine {
    /// Up to `limit` messages of `queue` after `after` that `filter`
    /// selects, oldest first, without leasing.
    pub fn peek(
        &self,
        queue: &str,
        filter: &DeadLetterFilter,
        after: Option<MessageId>,
        limit: usize,
    ) -> Result<Vec<MessageView>, MessageError> {
        if filter.has_failure_terms() && !queue.ends_with(FAILED_SUFFIX) {
            return Err(MessageError::NotAFailureQueue {
                queue: queue.to_owned(),
            });
        }
        let mut core = self.core();
        let now = self.now(&mut core);
        core.spool
            .peek(queue, filter, after, limit, now)
            .map_err(|e| self.message_error(queue, MessageId(0), e))
    }

    /// The `n` newest messages of `queue`, oldest of them first.
    pub fn newest(&self, queue: &str, n: usize) -> Result<Vec<MessageView>, MessageError> {
        let mut core = self.core();
        let now = self.now(&mut core);
        core.spool
            .newest(queue, n, now)
            .map_err(|e| self.message_error(queue, MessageId(0), e))
    }

    pub fn get(&self, queue: &str, id: MessageId) -> Result<MessageView, MessageError> {
        let mut core = self.core();
        let now = self.now(&mut core);
        core.spool
            .get(queue, id, now)
            .map_err(|e| self.message_error(queue, id, e))
    }

    /// Reads the stored payload of a message that is here now.
    pub fn payload(&self, queue: &str, id: MessageId) -> Result<Payload, MessageError> {
        let (file, loc) = {
            let core = self.core();
            let base = origin_queue_name(queue);
            let (_, m) = core
                .spool
                .find(base, id)
                .ok_or_else(|| self.message_error(queue, id, SpoolError::MessageNotFound))?;
            (self.inner.reader.file(m.loc.file), m.loc)
        };
        Ok(self.read_pinned(file, loc)?)
    }

    /// Cancels one message; a live lease on it becomes stale.
    pub async fn cancel(&self, queue: &str, id: MessageId) -> Result<(), MessageError> {
        self.write_done(|core, _| {
            core.spool
                .reserve_message(queue, id)
                .map_err(|e| self.message_error(queue, id, e))?;
            Ok(Command::Cancel {
                queue: Cow::Owned(queue.to_owned()),
                id,
            })
        })
        .await
    }

    /// Makes a delayed message (waiting for its first try or its next
    /// retry) visible now, keeping its retry count; its push queue's
    /// workers, or the next receive, take it at once. A message that does
    /// not wait is refused: a leased one is its consumer's or delivery's.
    pub async fn retry_now(&self, queue: &str, id: MessageId) -> Result<(), MessageError> {
        self.write_done(|core, now| {
            let view = core
                .spool
                .get(queue, id, now)
                .map_err(|e| self.message_error(queue, id, e))?;
            // A held message may wait for its delay too: retrying it
            // ends the delay, and its key still lets it go in turn.
            let delayed = match view.state {
                MessageState::Delayed => true,
                MessageState::Held => view.message.visible_at > now,
                _ => false,
            };
            if !delayed || queue.ends_with(FAILED_SUFFIX) {
                return Err(MessageError::NotDelayed {
                    queue: queue.to_owned(),
                    id: self.inner.tokens.format_id(id),
                    state: view.state.as_str(),
                });
            }
            core.spool
                .reserve_message(queue, id)
                .map_err(|e| self.message_error(queue, id, e))?;
            Ok(Command::Retry {
                queue: Cow::Owned(queue.to_owned()),
                id,
                visible_at: now,
                retry_count: view.message.retry_count,
            })
        })
        .await
    }

    fn message_error(&self, queue: &str, id: MessageId, e: SpoolError) -> MessageError {
        match e {
            SpoolError::QueueNotFound => MessageError::QueueNotFound {
                queue: queue.to_owned(),
            },
            SpoolError::MessageNotFound | SpoolError::StaleLease => MessageError::MessageNotFound {
                queue: queue.to_owned(),
                id: self.inner.tokens.format_id(id),
            },
        }
    }
}
