//! Queues: create, change, hand over, delete, pause; purge and redrive;
//! what they hold. Every rule is checked here, whoever asks (the config
//! loader at start-up, the API): `rules.rs` for the settings, the conflicts
//! (a failure queue, a queue the config file owns) below.

use std::borrow::Cow;

use super::Engine;
use super::core::Core;
use super::error::QueueError;
use super::rules::{self, Origin};
use crate::spool::command::IDS_PER_RECORD_MAX;
use crate::spool::queue::{FAILED_SUFFIX, failed_queue_name, origin_queue_name};
use crate::spool::{Command, DeadLetterFilter, MessageId, QueueSettings, QueueStats, Selection};

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
                // The file's queues are never refused here: `check-config`
                // holds the file to the bound, and a start must not fail
                // on queues the API made.
                None if origin == Origin::Api
                    && core.spool.queue_count() >= self.inner.policy.max_queues =>
                {
                    crate::metrics::limit_reached(crate::metrics::Limit::Queues);
                    return Err(QueueError::LimitReached {
                        max: self.inner.policy.max_queues,
                    });
                }
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
                settings: Box::new((*q.settings).clone()),
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

    /// Removes up to `max` of the messages of `queue` that `filter`
    /// selects, oldest first (every message with the default filter).
    /// Failure terms (reason, status, time) need a failure queue. With
    /// `dry_run`, only counts them (`done` is what would go).
    pub async fn purge(
        &self,
        queue: &str,
        filter: &DeadLetterFilter,
        max: usize,
        dry_run: bool,
    ) -> Result<BulkOutcome, QueueError> {
        if filter.has_failure_terms() && !queue.ends_with(FAILED_SUFFIX) {
            return Err(QueueError::NotAFailureQueue {
                queue: queue.to_owned(),
            });
        }
        let make = |ids| Command::Purge {
            queue: Cow::Owned(queue.to_owned()),
            ids,
        };
        self.write_selected(dry_run, make, |core: &mut Core| {
            core.spool
                .purge_candidates(queue, filter, max)
                .map_err(|_| not_found(queue))
        })
        .await
    }

    /// Moves up to `max` of the messages of `queue.failed` that `filter`
    /// selects back to `queue`, oldest first, retry counts reset; `queue`
    /// may also be named by its failure queue. With `dry_run`, only counts
    /// them (`done` is what would move).
    pub async fn redrive(
        &self,
        queue: &str,
        filter: &DeadLetterFilter,
        max: usize,
        dry_run: bool,
    ) -> Result<BulkOutcome, QueueError> {
        let queue = origin_queue_name(queue);
        let make = |ids| Command::Redrive {
            queue: Cow::Owned(queue.to_owned()),
            ids,
        };
        self.write_selected(dry_run, make, |core: &mut Core| {
            core.spool
                .redrive_candidates(queue, filter, max, !dry_run)
                .map_err(|_| not_found(queue))
        })
        .await
    }

    /// A purge or redrive: `select` picks the messages under the core
    /// lock (reserving them unless `dry_run`); their ids go out in records
    /// that `make` builds, at most [`IDS_PER_RECORD_MAX`] each, in one
    /// batch.
    async fn write_selected(
        &self,
        dry_run: bool,
        make: impl Fn(Vec<MessageId>) -> Command<'static>,
        select: impl FnOnce(&mut Core) -> Result<Selection, QueueError>,
    ) -> Result<BulkOutcome, QueueError> {
        if dry_run {
            let selected = select(&mut self.core())?;
            return Ok(BulkOutcome::of(selected.picked.len() as u64, &selected));
        }
        let mut selected = Selection::default();
        let done = self
            .write_counts(|core, _| -> Result<_, QueueError> {
                selected = select(core)?;
                Ok(split_ids(selected.picked.clone()).map(&make).collect())
            })
            .await?;
        Ok(BulkOutcome::of(done, &selected))
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
        Ok(((*q.settings).clone(), q.managed_by_config))
    }

    /// Messages in a queue and its failure queue.
    pub fn message_count(&self, queue: &str) -> usize {
        let core = self.core();
        let count = |name: &str| core.spool.queue(name).map_or(0, |q| q.len());
        count(queue) + count(&failed_queue_name(queue))
    }

    /// Who `queue` belongs to, for a scoped key (docs/contract.md §4): its
    /// own queue's kind, tenant and origin (`q.failed` is `q`'s). `None`:
    /// no such queue.
    pub fn queue_owner(&self, queue: &str) -> Option<QueueOwner> {
        let core = self.core();
        let q = core.spool.queue(origin_queue_name(queue))?;
        if queue != origin_queue_name(queue) && core.spool.queue(queue).is_none() {
            return None;
        }
        Some(QueueOwner {
            push: q.settings.is_push(),
            tenant: q.settings.tenant.clone(),
            managed_by_config: q.managed_by_config,
        })
    }

    /// Up to `limit` queue names past `after`, in order, of those under
    /// `prefix` that `keep` keeps, and whether more are kept past them.
    /// `keep` is shown each queue's name, its own queue's settings
    /// (`q.failed`'s are `q`'s) and whether the config manages it; it runs
    /// under the state's lock, so it only looks.
    pub fn queue_page(
        &self,
        after: Option<&str>,
        prefix: &str,
        limit: usize,
        keep: impl Fn(&str, &QueueSettings, bool) -> bool,
    ) -> (Vec<String>, bool) {
        let core = self.core();
        let mut names: Vec<&str> = core
            .spool
            .queue_name_refs()
            .filter(|n| n.starts_with(prefix) && after.is_none_or(|a| *n > a))
            .collect();
        names.sort_unstable();
        let mut page = Vec::new();
        for name in names {
            let Some(q) = core.spool.queue(origin_queue_name(name)) else {
                continue;
            };
            if !keep(name, &q.settings, q.managed_by_config) {
                continue;
            }
            if page.len() == limit {
                return (page, true);
            }
            page.push(name.to_owned());
        }
        (page, false)
    }

    /// Every queue's name (failure queues included), sorted.
    pub fn queue_names(&self) -> Vec<String> {
        self.core().spool.queue_names()
    }
}

/// Who a queue belongs to ([`Engine::queue_owner`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueOwner {
    pub push: bool,
    pub tenant: Option<String>,
    pub managed_by_config: bool,
}

/// What a purge or redrive did (docs/contract.md §4): `done` messages
/// purged or moved of `matched` that the filter selected; `remaining` still
/// match after the limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BulkOutcome {
    pub done: u64,
    pub matched: u64,
    pub remaining: u64,
}

impl BulkOutcome {
    fn of(done: u64, selected: &Selection) -> BulkOutcome {
        BulkOutcome {
            done,
            matched: selected.matched,
            remaining: selected.remaining(),
        }
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
