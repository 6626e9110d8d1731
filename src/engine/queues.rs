//! Queues: create, change, hand over, delete, pause; purge and redrive;
//! what they hold. Every rule is checked here, whoever asks (the config
//! loader at start-up, the API): `rules.rs` for the settings, the conflicts
//! (a failure queue, a queue the config file owns) below.

use std::borrow::Cow;

use super::Engine;
use super::error::QueueError;
use super::rules::{self, Origin};
use crate::spool::command::IDS_PER_RECORD_MAX;
use crate::spool::queue::{FAILED_SUFFIX, failed_queue_name};
use crate::spool::{Command, MessageId, QueueSettings, QueueStats};

impl Engine {
    /// Creates or replaces a queue's settings on behalf of `origin`.
    /// Returns true if it was created. A queue created by the config file
    /// is managed by it: the API cannot change or delete it.
    pub async fn upsert_queue(
        &self,
        name: &str,
        settings: QueueSettings,
        origin: Origin,
    ) -> Result<bool, QueueError> {
        refuse_failure_queue(name, "configured")?;
        rules::check(name, &settings, origin, &self.inner.policy)?;
        let mut created = false;
        self.write_done(|core, _| {
            match core.spool.queue(name) {
                Some(q) if origin == Origin::Api && q.managed_by_config => {
                    return Err(QueueError::ManagedByConfig {
                        queue: name.to_owned(),
                    });
                }
                Some(_) => {}
                None => created = true,
            }
            Ok(Command::QueueUpsert {
                name: Cow::Owned(name.to_owned()),
                settings: Box::new(settings),
                managed_by_config: origin == Origin::Config,
            })
        })
        .await?;
        Ok(created)
    }

    /// A queue the config file no longer defines but that still holds
    /// messages: from now on the API manages it, settings unchanged.
    pub async fn hand_over_to_api(&self, name: &str) -> Result<(), QueueError> {
        self.write_done(|core, _| {
            let q = core.spool.queue(name).ok_or_else(|| not_found(name))?;
            Ok(Command::QueueUpsert {
                name: Cow::Owned(name.to_owned()),
                settings: Box::new(q.settings.clone()),
                managed_by_config: false,
            })
        })
        .await
    }

    /// Deletes a queue, its failure queue and their messages, on behalf of
    /// `origin`.
    pub async fn delete_queue(&self, name: &str, origin: Origin) -> Result<(), QueueError> {
        refuse_failure_queue(name, "deleted")?;
        self.write_done(|core, _| {
            let q = core.spool.queue(name).ok_or_else(|| not_found(name))?;
            if origin == Origin::Api && q.managed_by_config {
                return Err(QueueError::ManagedByConfig {
                    queue: name.to_owned(),
                });
            }
            Ok(Command::QueueDelete {
                name: Cow::Owned(name.to_owned()),
            })
        })
        .await
    }

    /// Stops or restarts handing out leases of a queue.
    pub async fn set_paused(&self, name: &str, paused: bool) -> Result<(), QueueError> {
        self.write_done(|core, _| {
            core.spool.queue(name).ok_or_else(|| not_found(name))?;
            Ok(Command::QueuePause {
                name: Cow::Owned(name.to_owned()),
                paused,
            })
        })
        .await
    }

    /// Removes every message of a queue; returns how many.
    pub async fn purge(&self, queue: &str) -> Result<u64, QueueError> {
        self.write_counts(|core, _| {
            let ids = core
                .spool
                .message_ids(queue)
                .ok_or_else(|| not_found(queue))?;
            Ok(split_ids(ids)
                .map(|ids| Command::Purge {
                    queue: Cow::Owned(queue.to_owned()),
                    ids,
                })
                .collect())
        })
        .await
    }

    /// Moves up to `max` messages (or just `ids`) from `queue.failed` back to
    /// `queue`, retry counts reset. With `dry_run`, only counts them.
    pub async fn redrive(
        &self,
        queue: &str,
        max: usize,
        ids: Option<&[MessageId]>,
        dry_run: bool,
    ) -> Result<u64, QueueError> {
        refuse_failure_queue(queue, "redriven into")?;
        if dry_run {
            let mut core = self.core();
            return core
                .spool
                .redrive_candidates(queue, max, ids, false)
                .map(|v| v.len() as u64)
                .map_err(|_| not_found(queue));
        }
        self.write_counts(|core, _| {
            let picked = core
                .spool
                .redrive_candidates(queue, max, ids, true)
                .map_err(|_| not_found(queue))?;
            Ok(split_ids(picked)
                .map(|ids| Command::Redrive {
                    queue: Cow::Owned(queue.to_owned()),
                    ids,
                })
                .collect())
        })
        .await
    }

    pub fn stats(&self, queue: &str) -> Result<QueueStats, QueueError> {
        let mut core = self.core();
        let now = self.now(&mut core);
        core.spool.stats(queue, now).ok_or_else(|| not_found(queue))
    }

    /// Whether `queue` has a destination (without copying its settings).
    pub fn is_push_queue(&self, queue: &str) -> Result<bool, QueueError> {
        let core = self.core();
        let q = core.spool.queue(queue).ok_or_else(|| not_found(queue))?;
        Ok(q.settings.is_push())
    }

    /// A queue's settings and whether the config file manages it.
    pub fn queue_settings(&self, queue: &str) -> Result<(QueueSettings, bool), QueueError> {
        let core = self.core();
        let q = core.spool.queue(queue).ok_or_else(|| not_found(queue))?;
        Ok((q.settings.clone(), q.managed_by_config))
    }

    /// Messages in a queue and its failure queue.
    pub fn message_count(&self, queue: &str) -> usize {
        let core = self.core();
        let count = |name: &str| core.spool.queue(name).map_or(0, |q| q.len());
        count(queue) + count(&failed_queue_name(queue))
    }

    /// Every queue's name (failure queues included), sorted.
    pub fn queue_names(&self) -> Vec<String> {
        self.core().spool.queue_names()
    }
}

fn not_found(queue: &str) -> QueueError {
    QueueError::NotFound {
        queue: queue.to_owned(),
    }
}

/// A failure queue (`q.failed`) is made, changed and deleted with its queue.
fn refuse_failure_queue(name: &str, what: &'static str) -> Result<(), QueueError> {
    if name.ends_with(FAILED_SUFFIX) {
        return Err(QueueError::FailureQueue {
            queue: name.to_owned(),
            what,
        });
    }
    Ok(())
}

/// Ids in records of at most [`IDS_PER_RECORD_MAX`] (none: one empty
/// record, so that the operation still answers through the journal).
fn split_ids(ids: Vec<MessageId>) -> impl Iterator<Item = Vec<MessageId>> {
    let n = ids.len().div_ceil(IDS_PER_RECORD_MAX).max(1);
    let mut ids = ids.into_iter();
    (0..n).map(move |_| ids.by_ref().take(IDS_PER_RECORD_MAX).collect())
}
