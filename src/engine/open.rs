//! Opening a spool: upgrade a format-1 journal, load the newest checkpoint,
//! delete what a finished compaction left behind, replay the records after
//! the checkpoint (`replay.rs`), repair (or refuse) damage, then start the
//! journal and a new epoch.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{oneshot, watch};

use super::core::{CheckpointOnDisk, Core, FileMeta, Reply, Shared};
use super::replay::{Loaded, load};
use super::replicated::Replication;
use super::sink::{Entry, PlacedLog, Sink};
use super::token::Tokens;
use super::write::Appender;
use super::{ARRIVALS_BUFFERED_MAX, Engine, EngineOptions, Inner, ReplayReport, rebuild};
use crate::journal::atomic::sync_parent;
use crate::journal::format::{FileId, SpoolIdentity};
use crate::journal::lock::DirLock;
use crate::journal::prealloc::sweep_temp_files;
use crate::journal::reader::SegmentReader;
use crate::journal::scan::ScanSummary;
use crate::journal::storage::Storage;
use crate::journal::writer::WriterStart;
use crate::journal::{Journal, JournalError, WriterOptions, load_identity_or, prepare_tail};
use crate::spool::{Command, Record};

impl Engine {
    /// Opens (or creates) the spool in `options.dir`: upgrades an older
    /// format, replays the journal, truncates a torn tail, refuses (or
    /// quarantines) corruption, and starts a new epoch.
    pub async fn open(options: EngineOptions) -> Result<(Engine, ReplayReport), JournalError> {
        let started = Instant::now();
        let storage = options.storage.clone();
        let dir = options.dir.clone();
        let lock = claim_dir(&storage, &dir, options.lock)?;
        let identity = settle_identity(&storage, &dir, options.identity.as_ref())?;
        upgrade_format_1(&storage, &dir, &identity)?;
        let loaded = load_or_quarantine(&storage, &dir, &identity, &options)?;
        let tail = prepare_writer_start(&storage, &dir, &loaded)?;
        let replayed = Replayed::of(&loaded);
        let restored = restore(loaded, &options);
        let claimed = Claimed {
            storage,
            dir,
            identity,
            lock,
        };
        let engine = start_engine(options, claimed, restored, replayed.epoch, tail)?;
        let report = replayed.report(started.elapsed());
        if engine.is_replicated() {
            // No epoch record: only the primary writes, and its term is
            // the epoch (`replicated.rs`).
            return Ok((engine, report));
        }
        engine.write_epoch(report.epoch).await?;
        Ok((engine, report))
    }

    /// Writes this start's epoch record and waits until it is durable. The
    /// next start's epoch is one more than the highest on disk, so no two
    /// starts hand out lease tokens of the same epoch.
    async fn write_epoch(&self, epoch: u64) -> Result<(), JournalError> {
        let (tx, rx) = oneshot::channel();
        {
            let mut core = self.core();
            let at = self.now(&mut core);
            self.append_local(
                Record {
                    at,
                    command: Command::Epoch { epoch },
                },
                None,
                Reply::Done(tx),
            )?;
        }
        match rx.await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(JournalError::io(
                &self.inner.dir,
                std::io::Error::other(format!("writing the epoch record failed: {e}")),
            )),
            Err(_) => Err(JournalError::Closed),
        }
    }
}

/// Creates the directory, takes its lock (when asked to) and removes the
/// temp files an earlier run left. The lock is held until the engine
/// closes.
fn claim_dir(
    storage: &Arc<dyn Storage>,
    dir: &Path,
    lock: bool,
) -> Result<Option<DirLock>, JournalError> {
    storage
        .create_dir_all(dir)
        .map_err(|e| JournalError::io(dir, e))?;
    // The directory's own name must be durable before anything in it
    // is acknowledged.
    sync_parent(storage, dir)?;
    let lock = if lock {
        Some(DirLock::acquire(dir)?)
    } else {
        None
    };
    let swept = sweep_temp_files(storage.as_ref(), dir).map_err(|e| JournalError::io(dir, e))?;
    if swept > 0 {
        tracing::info!(files = swept, "removed temp files left by an earlier run");
    }
    Ok(lock)
}

/// Reads the spool's identity, or gives a new spool `wanted` (a random one
/// without it). An existing spool must already have `wanted`: a replica
/// whose spool belongs to another cluster must not join this one.
fn settle_identity(
    storage: &Arc<dyn Storage>,
    dir: &Path,
    wanted: Option<&SpoolIdentity>,
) -> Result<SpoolIdentity, JournalError> {
    let identity = load_identity_or(storage, dir, true, || {
        wanted.cloned().unwrap_or_else(SpoolIdentity::generate)
    })?
    .expect("created when missing");
    if let Some(wanted) = wanted
        && wanted != &identity
    {
        return Err(JournalError::BadMeta {
            dir: dir.to_path_buf(),
            reason: "spool.meta belongs to another cluster (or cluster.secret changed): \
                     this replica's spool cannot join this cluster"
                .into(),
        });
    }
    Ok(identity)
}

/// Rewrites a format-1 journal as format 2 (checkpoints), before replay
/// reads it.
fn upgrade_format_1(
    storage: &Arc<dyn Storage>,
    dir: &Path,
    identity: &SpoolIdentity,
) -> Result<(), JournalError> {
    if !rebuild::needs_upgrade(storage, dir, identity.salt)? {
        return Ok(());
    }
    let report = rebuild::upgrade(storage, dir, identity)?;
    tracing::warn!(
        records = report.records,
        messages = report.messages,
        "upgraded a format-1 spool to format 2 (checkpoints)"
    );
    Ok(())
}

/// Replays the directory. Damage (`Corrupt`, `BadRecord`) is the answer
/// unless `quarantine_corruption` is set: then a repair moves the damaged
/// bytes aside, says what was lost, and the repaired directory is replayed.
fn load_or_quarantine(
    storage: &Arc<dyn Storage>,
    dir: &Path,
    identity: &SpoolIdentity,
    options: &EngineOptions,
) -> Result<Loaded, JournalError> {
    let up_to = options.replicated;
    let loaded = load(storage, dir, identity, up_to);
    let damaged = matches!(
        loaded,
        Err(JournalError::Corrupt { .. } | JournalError::BadRecord { .. })
    );
    if !options.quarantine_corruption || !damaged {
        return loaded;
    }
    let report = rebuild::repair(storage, dir, identity)?;
    for (file, bytes) in &report.quarantined {
        tracing::warn!(file = %file.display(), bytes, "moved damaged journal bytes aside");
    }
    for lost in &report.lost {
        tracing::error!(message = %lost, "lost to corruption");
    }
    load(storage, dir, identity, up_to)
}

/// Makes the end of the journal writable (`prepare_tail`: a torn final
/// write cleared, a segment whose creation never finished removed) and
/// says where the writer starts.
fn prepare_writer_start(
    storage: &Arc<dyn Storage>,
    dir: &Path,
    loaded: &Loaded,
) -> Result<WriterStart, JournalError> {
    let summary = &loaded.summary;
    let start = prepare_tail(storage, dir, summary, loaded.meta.next_segment_id)?;
    if let Some(torn) = summary.torn_tail {
        tracing::warn!(
            segment = torn.segment_id,
            offset = torn.offset,
            bytes = torn.len_bytes,
            "truncated a torn final write (never acknowledged)"
        );
    }
    Ok(start)
}

/// What the report says of replay, taken before the spool goes into the
/// core.
struct Replayed {
    records: u64,
    segments: usize,
    messages: usize,
    /// This start's epoch: one more than the last start's.
    epoch: u64,
    torn_tail_bytes: Option<u64>,
}

impl Replayed {
    fn of(loaded: &Loaded) -> Replayed {
        Replayed {
            records: loaded.applied,
            segments: loaded.summary.segments.len(),
            messages: loaded.spool.message_count(),
            epoch: loaded.spool.epoch() + 1,
            torn_tail_bytes: loaded.summary.torn_tail.map(|t| t.len_bytes),
        }
    }

    /// The report, once start-up took `duration`.
    fn report(self, duration: Duration) -> ReplayReport {
        ReplayReport {
            records: self.records,
            segments: self.segments,
            messages: self.messages,
            epoch: self.epoch,
            torn_tail_bytes: self.torn_tail_bytes,
            duration,
        }
    }
}

/// The state start-up restored, ready to go into the engine.
struct Restored {
    /// The replayed spool, the files on disk and the checkpoint.
    core: Core,
    /// Replicated mode: the Raft log's index.
    replication: Option<Arc<Replication>>,
}

/// Puts the replayed spool behind the core lock, with what compaction must
/// know (the files on disk, the checkpoint), and in replicated mode indexes
/// the Raft log. The spool's `now` starts at the clock, but never before
/// the last record's time.
fn restore(loaded: Loaded, options: &EngineOptions) -> Restored {
    let Loaded {
        spool,
        meta,
        checkpoint,
        checkpoint_cluster_config,
        summary,
        live,
        ..
    } = loaded;
    // The clock runs on from the last record's time, should that be ahead
    // of it (written by a clock that was): not frozen until it catches up.
    options.clock.not_before(spool.last_at());
    let now = options.clock.now_ms().max(spool.last_at());
    let mut core = Core::new(spool, now, options.segment_bytes);
    note_files(&mut core, &summary);
    core.checkpoint = checkpoint.map(|c| CheckpointOnDisk {
        seq: c.seq,
        term: c.term,
        bytes: c.file_bytes,
        cluster_config: checkpoint_cluster_config,
    });
    core.next_pack_id = summary
        .packs
        .last()
        .map_or(1, |&(id, _)| id + 1)
        .max(meta.next_pack_id);
    // The Raft log starts after the checkpoint: a restart purges
    // whatever openraft kept behind its last snapshot.
    let replication = options.replicated.map(|_| {
        let purged = checkpoint.map_or((0, 0), |c| (c.seq, c.term));
        Arc::new(Replication::new(purged, live))
    });
    Restored { core, replication }
}

/// Tells compaction of every segment and pack replay found, with its
/// length.
fn note_files(core: &mut Core, summary: &ScanSummary) {
    for s in &summary.segments {
        let file = FileId::Segment(s.id).to_loc();
        core.files.insert(
            file,
            FileMeta {
                bytes: s.file_bytes,
            },
        );
    }
    for &(id, bytes) in &summary.packs {
        core.files
            .insert(FileId::Pack(id).to_loc(), FileMeta { bytes });
    }
}

/// The directory this start holds: created, locked, its identity settled.
struct Claimed {
    storage: Arc<dyn Storage>,
    dir: PathBuf,
    identity: SpoolIdentity,
    /// Held until the engine closes.
    lock: Option<DirLock>,
}

/// Builds the engine around the restored core: the state the journal's
/// sink and every handler share, a reader of the files, and the journal's
/// writer started at `tail`.
fn start_engine(
    options: EngineOptions,
    claimed: Claimed,
    restored: Restored,
    epoch: u64,
    tail: WriterStart,
) -> Result<Engine, JournalError> {
    let Restored { core, replication } = restored;
    let (poisoned, _) = watch::channel(false);
    let (arrivals, _) = tokio::sync::broadcast::channel(ARRIVALS_BUFFERED_MAX);
    let shared = Arc::new(Shared {
        core: Mutex::new(core),
        poisoned,
        arrivals,
        in_flight_memory: Default::default(),
        notes: Default::default(),
    });
    let reader = SegmentReader::new(claimed.storage.clone(), &claimed.dir, claimed.identity.salt);
    let journal = start_journal(
        &claimed,
        tail,
        &options,
        &reader,
        &shared,
        replication.as_ref(),
    )?;
    let Claimed {
        storage,
        dir,
        identity,
        lock,
    } = claimed;
    let tokens = Tokens::new(identity.token_key, identity.salt);
    Ok(Engine {
        inner: Arc::new(Inner {
            shared,
            journal,
            appender: match &replication {
                Some(r) => Appender::Raft(r.clone()),
                None => Appender::Journal,
            },
            replication,
            reader,
            shared_reads: Default::default(),
            storage,
            dir,
            identity,
            compacting: Mutex::new(()),
            max_bytes: options.max_bytes,
            max_memory: options.max_memory,
            digest: Mutex::new(None),
            segment_bytes: options.segment_bytes,
            clock: options.clock,
            tokens,
            epoch,
            policy: options.policy,
            rates: Default::default(),
            lock: Mutex::new(lock),
        }),
    })
}

/// Starts the journal's writer at `tail`. What it makes durable goes to
/// the sink, which applies it to the shared core; in replicated mode the
/// sink notes where each entry landed for the Raft log's index, and an
/// entry is applied once Raft commits it.
fn start_journal(
    claimed: &Claimed,
    tail: WriterStart,
    options: &EngineOptions,
    reader: &SegmentReader,
    shared: &Arc<Shared>,
    replication: Option<&Arc<Replication>>,
) -> Result<Journal<Entry>, JournalError> {
    Journal::start(
        claimed.storage.clone(),
        &claimed.dir,
        claimed.identity.salt,
        tail,
        WriterOptions {
            segment_bytes: options.segment_bytes,
            fsync: options.fsync,
            preallocate: options.preallocate,
        },
        reader.clone(),
        Sink {
            shared: shared.clone(),
            replication: replication.cloned().map(|r| r as Arc<dyn PlacedLog>),
        },
    )
}
