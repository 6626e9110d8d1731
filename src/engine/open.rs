//! Opening a spool: upgrade a format-1 journal, load the newest checkpoint,
//! delete what a finished compaction left behind, replay the records after
//! the checkpoint, repair (or refuse) damage, then start the journal and a
//! new epoch.
//!
//! Replay is the newest checkpoint plus every record after it, applied in
//! sequence order (`Spool::apply` asserts there is no gap). Records at or
//! before the checkpoint are still read and checked — a damaged byte
//! anywhere is found at start-up, not when a consumer asks for it — but
//! never applied: the checkpoint already holds their effect.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio::sync::{oneshot, watch};

use super::checkpoint::{decode_checkpoint, read_checkpoint};
use super::core::{CheckpointOnDisk, Core, FileMeta, Reply, Shared};
use super::replicated::Replication;
use super::sink::Sink;
use super::token::Tokens;
use super::write::Appender;
use super::{ARRIVALS_BUFFERED_MAX, Engine, EngineOptions, Inner, ReplayReport, rebuild};
use crate::journal::atomic::{remove_files, sync_parent};
use crate::journal::format::{FileId, SpoolIdentity};
use crate::journal::lock::DirLock;
use crate::journal::prealloc::sweep_temp_files;
use crate::journal::reader::SegmentReader;
use crate::journal::scan::{self, CheckpointInfo, ScanSummary, list_files, scan_dir};
use crate::journal::storage::Storage;
use crate::journal::{
    Journal, JournalError, RecordLoc, WriterOptions, load_identity_or, prepare_tail,
};
use crate::spool::{CheckpointMeta, Command, Record, Spool};

/// The state a directory replays to, and what was found on the way.
pub(super) struct Loaded {
    pub spool: Spool,
    pub meta: CheckpointMeta,
    pub checkpoint: Option<CheckpointInfo>,
    /// The replica set the checkpoint holds (replicated mode).
    pub checkpoint_cluster_config: Option<Vec<u8>>,
    pub summary: ScanSummary,
    /// Records applied after the checkpoint.
    pub applied: u64,
    /// Replicated mode: `(term, kind, location)` of every record of the
    /// live log, applied or not.
    pub live: Vec<(u64, u8, RecordLoc)>,
}

impl Engine {
    /// Opens (or creates) the spool in `options.dir`: upgrades an older
    /// format, replays the journal, truncates a torn tail, refuses (or
    /// quarantines) corruption, and starts a new epoch.
    pub async fn open(options: EngineOptions) -> Result<(Engine, ReplayReport), JournalError> {
        let started = Instant::now();
        let storage = options.storage.clone();
        let dir = options.dir.clone();
        storage
            .create_dir_all(&dir)
            .map_err(|e| JournalError::io(&dir, e))?;
        // The directory's own name must be durable before anything in it
        // is acknowledged.
        sync_parent(&storage, &dir)?;
        let lock = if options.lock {
            Some(DirLock::acquire(&dir)?)
        } else {
            None
        };
        let swept =
            sweep_temp_files(storage.as_ref(), &dir).map_err(|e| JournalError::io(&dir, e))?;
        if swept > 0 {
            tracing::info!(files = swept, "removed temp files left by an earlier run");
        }
        let wanted = options.identity.clone();
        let identity = load_identity_or(&storage, &dir, true, || {
            wanted.clone().unwrap_or_else(SpoolIdentity::generate)
        })?
        .expect("created when missing");
        if let Some(wanted) = &options.identity
            && wanted != &identity
        {
            return Err(JournalError::BadMeta {
                dir: dir.clone(),
                reason: "spool.meta belongs to another cluster (or cluster.secret changed): \
                         this replica's spool cannot join this cluster"
                    .into(),
            });
        }
        if rebuild::needs_upgrade(&storage, &dir, identity.salt)? {
            let report = rebuild::upgrade(&storage, &dir, &identity)?;
            tracing::warn!(
                records = report.records,
                messages = report.messages,
                "upgraded a format-1 spool to format 2 (checkpoints)"
            );
        }

        let up_to = options.replicated;
        let mut loaded = load(&storage, &dir, &identity, up_to);
        if options.quarantine_corruption
            && matches!(
                loaded,
                Err(JournalError::Corrupt { .. } | JournalError::BadRecord { .. })
            )
        {
            let report = rebuild::repair(&storage, &dir, &identity)?;
            for (file, bytes) in &report.quarantined {
                tracing::warn!(file = %file.display(), bytes, "moved damaged journal bytes aside");
            }
            for lost in &report.lost {
                tracing::error!(message = %lost, "lost to corruption");
            }
            loaded = load(&storage, &dir, &identity, up_to);
        }
        let Loaded {
            spool,
            meta,
            checkpoint,
            checkpoint_cluster_config,
            summary,
            applied,
            live,
        } = loaded?;
        let start = prepare_tail(&storage, &dir, &summary, meta.next_segment_id)?;
        if let Some(torn) = summary.torn_tail {
            tracing::warn!(
                segment = torn.segment_id,
                offset = torn.offset,
                bytes = torn.len_bytes,
                "truncated a torn final write (never acknowledged)"
            );
        }

        let epoch = spool.epoch() + 1;
        let messages = spool.message_count();
        let now = options.clock.now_ms().max(spool.last_at());
        let mut core = Core::new(spool, now, options.segment_bytes);
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
        let (poisoned, _) = watch::channel(false);
        let (arrivals, _) = tokio::sync::broadcast::channel(ARRIVALS_BUFFERED_MAX);
        let shared = Arc::new(Shared {
            core: Mutex::new(core),
            poisoned,
            arrivals,
        });
        let reader = SegmentReader::new(storage.clone(), &dir, identity.salt);
        let journal = Journal::start(
            storage.clone(),
            &dir,
            identity.salt,
            start,
            WriterOptions {
                segment_bytes: options.segment_bytes,
                fsync: options.fsync,
                preallocate: options.preallocate,
            },
            reader.clone(),
            Sink {
                shared: shared.clone(),
                replication: replication
                    .clone()
                    .map(|r| r as Arc<dyn super::sink::PlacedLog>),
            },
        )?;
        let engine = Engine {
            inner: Arc::new(Inner {
                shared,
                journal,
                appender: match replication {
                    Some(_) => Appender::Raft,
                    None => Appender::Journal,
                },
                replication,
                reader,
                storage,
                dir: dir.clone(),
                identity: identity.clone(),
                compacting: Mutex::new(()),
                max_bytes: options.max_bytes,
                segment_bytes: options.segment_bytes,
                clock: options.clock,
                tokens: Tokens::new(identity.token_key, identity.salt),
                epoch,
                policy: options.policy.clone(),
                rates: Default::default(),
                lock: Mutex::new(lock),
            }),
        };
        let report = ReplayReport {
            records: applied,
            segments: summary.segments.len(),
            messages,
            epoch,
            torn_tail_bytes: summary.torn_tail.map(|t| t.len_bytes),
            duration: started.elapsed(),
        };
        if engine.is_replicated() {
            // No epoch record: only the primary writes, and its term is
            // the epoch (`replicated.rs`).
            return Ok((engine, report));
        }
        let (tx, rx) = oneshot::channel();
        {
            let mut core = engine.core();
            let at = engine.now(&mut core);
            engine.append_local(
                Record {
                    at,
                    command: Command::Epoch { epoch },
                },
                None,
                Reply::Done(tx),
            )?;
        }
        match rx.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                return Err(JournalError::io(
                    &dir,
                    std::io::Error::other(format!("writing the epoch record failed: {e}")),
                ));
            }
            Err(_) => return Err(JournalError::Closed),
        }
        Ok((engine, report))
    }
}

/// Loads the newest checkpoint, deletes files it made obsolete, and replays
/// the records after it (in replicated mode, only up to `up_to`: the
/// last record known committed). Corruption is an error (`Corrupt` or
/// `BadRecord`).
pub(super) fn load(
    storage: &Arc<dyn Storage>,
    dir: &Path,
    identity: &SpoolIdentity,
    up_to: Option<u64>,
) -> Result<Loaded, JournalError> {
    let salt = identity.salt;
    let listing = list_files(storage.as_ref(), dir)?;
    let bytes = match listing.checkpoints.last() {
        Some(&seq) => Some(read_checkpoint(storage, dir, identity, seq)?),
        None => None,
    };
    let meta = match &bytes {
        Some((_, meta)) => meta.clone(),
        None => CheckpointMeta {
            seq: 0,
            next_segment_id: 1,
            next_pack_id: 1,
            salt,
            token_key: identity.token_key,
            files: Vec::new(),
        },
    };
    let checkpoint_seq = meta.seq;

    // What a compaction (or upgrade, or repair) that finished its
    // checkpoint but not its deletions left behind: gone before the scan,
    // so that nothing obsolete is read, let alone judged. The checkpoint's
    // first chunk says what it points into.
    let obsolete = scan::obsolete_files(storage, dir, salt, &listing, checkpoint_seq, &|f| {
        meta.files.binary_search(&f.to_loc()).is_ok()
    })?;
    if !obsolete.is_empty() {
        tracing::info!(files = ?obsolete, "removing files an earlier compaction replaced");
        remove_files(storage, dir, &obsolete)?;
    }

    // The checkpoint is decoded on a thread of its own while the scan
    // reads and checks the files it points into (their records are not
    // applied); the first record to apply waits for it.
    let mut applied = 0u64;
    let mut live = Vec::new();
    let mut checkpoint_cluster_config = None;
    // The last live record seen: in replicated mode records after `up_to`
    // are indexed but not applied, so the next one's number comes from here.
    let mut last_seen = None;
    // After damage the scan goes on (to report every problem), but nothing
    // past a missing record may be applied: the scan's problem is the
    // answer then.
    let mut gap_at = None;
    let (summary, spool) = std::thread::scope(|scope| {
        let decoding = bytes.as_ref().map(|(bytes, _)| {
            std::thread::Builder::new()
                .name("checkpoint-load".into())
                .spawn_scoped(scope, || decode_checkpoint(dir, identity, bytes))
                .map_err(|e| JournalError::io(dir, e))
        });
        let mut decoding = decoding.transpose()?;
        let mut spool = None;
        let mut ready = |spool: &mut Option<Spool>| -> Result<(), JournalError> {
            if spool.is_none() {
                let decoded = match decoding.take() {
                    Some(thread) => thread.join().expect("checkpoint-load thread panicked")?,
                    None => Spool::new(),
                };
                checkpoint_cluster_config = decoded.cluster_config().map(<[u8]>::to_vec);
                *spool = Some(decoded);
            }
            Ok(())
        };
        let summary = scan_dir(storage, dir, salt, checkpoint_seq, |rec| {
            if !rec.applies || gap_at.is_some() {
                return Ok(());
            }
            ready(&mut spool)?;
            let spool = spool.as_mut().expect("made ready");
            let expected = last_seen.map_or(spool.applied_seq(), |s| s) + 1;
            last_seen = Some(rec.seq);
            if up_to.is_some() {
                let loc = RecordLoc {
                    file: rec.file.to_loc(),
                    offset: u32::try_from(rec.offset).expect("bug: offset beyond a segment"),
                    len: rec.frame_len as u32,
                };
                live.push((rec.term, rec.kind, loc));
            }
            if rec.seq != expected {
                gap_at = Some((rec.file, rec.offset, expected, rec.seq));
                return Ok(());
            }
            if up_to.is_some_and(|last| rec.seq > last) {
                return Ok(());
            }
            let record =
                Record::decode(rec.kind, rec.body).map_err(|e| JournalError::BadRecord {
                    file: dir.join(rec.file.file_name()),
                    offset: rec.offset,
                    reason: e.to_string(),
                })?;
            let loc = RecordLoc {
                file: rec.file.to_loc(),
                offset: u32::try_from(rec.offset).expect("bug: offset beyond a segment"),
                len: rec.frame_len as u32,
            };
            spool.apply(&record, rec.seq, loc);
            applied += 1;
            Ok(())
        });
        ready(&mut spool)?;
        Ok::<_, JournalError>((summary?, spool.expect("made ready")))
    })?;
    let checkpoint = bytes.map(|(bytes, _)| bytes.info);
    if let Some(problem) = summary.problems.first() {
        return Err(problem.clone().into_error(dir));
    }
    if let Some((file, offset, expected, found)) = gap_at {
        return Err(JournalError::Corrupt {
            dir: dir.to_path_buf(),
            file: dir.join(file.file_name()),
            offset,
            reason: format!("records {expected} to {} are missing", found - 1),
        });
    }
    if !summary.old_format_segments.is_empty() && checkpoint.is_none() {
        return Err(JournalError::Corrupt {
            dir: dir.to_path_buf(),
            file: dir.join(FileId::Segment(summary.old_format_segments[0]).file_name()),
            offset: 0,
            reason: "format-1 segments beside format-2 ones; run `spoold journal upgrade`".into(),
        });
    }
    // Every file the checkpoint points into must be there.
    let present: BTreeSet<u32> = summary
        .segments
        .iter()
        .map(|s| FileId::Segment(s.id).to_loc())
        .chain(
            summary
                .packs
                .iter()
                .map(|&(id, _)| FileId::Pack(id).to_loc()),
        )
        .collect();
    if let Some(&missing) = spool
        .referenced_files()
        .find(|f| !present.contains(f))
        .as_ref()
    {
        return Err(JournalError::Corrupt {
            dir: dir.to_path_buf(),
            file: dir.join(FileId::from_loc(missing).file_name()),
            offset: 0,
            reason: "the checkpoint points at records in this file, which is missing".into(),
        });
    }
    if summary.last_seq < checkpoint_seq {
        return Err(JournalError::Corrupt {
            dir: dir.to_path_buf(),
            file: dir.to_path_buf(),
            offset: 0,
            reason: format!(
                "the checkpoint reflects record {checkpoint_seq} but the log ends at {}",
                summary.last_seq
            ),
        });
    }
    Ok(Loaded {
        spool,
        meta,
        checkpoint,
        checkpoint_cluster_config,
        summary,
        applied,
        live,
    })
}
