//! Checkpoints: the whole state without leases, as of one applied record.
//!
//! A checkpoint is what compaction works from (docs/contract.md §6): every queue with
//! its settings and pause state, every message with its times, counts,
//! failure details and the location of its payload (and of its newest
//! attempt record), every dedup key with its window start, the next message
//! id and the epoch. Replay is the newest checkpoint plus the records after
//! it, so whatever happened before the checkpoint — creates, settings
//! changes, pauses, failures, redrives — is in it, and no record older than
//! it is ever judged on its own.
//!
//! On disk a checkpoint is a list of *chunks* (at most [`CHUNK_BYTES_MAX`]
//! each), framed and checksummed by the journal (`journal::files`): one
//! `BEGIN`, the queues, the messages queue by queue, the dedup keys, one
//! `END` that repeats the counts. Each chunk is decoded on its own, so a
//! checkpoint can be streamed (replicated mode ships it to a replica that
//! fell behind) and loaded without holding its bytes whole. The byte layout
//! is in `docs/journal-format.md`.
//!
//! Nothing here reads the clock or does I/O.

use super::codec::DecodeError;
use super::codec::{Reader, put_uvarint};
use super::command::MessageId;
use super::state::MessageEntry;
use crate::journal::RecordLoc;

mod decode;
mod encode;

pub(crate) use decode::{CheckpointLoader, read_begin};

/// Chunk kinds (the frame's kind byte), apart from record kinds.
pub(crate) mod kind {
    pub(crate) const BEGIN: u8 = 64;
    pub(crate) const QUEUES: u8 = 65;
    pub(crate) const MESSAGES: u8 = 66;
    pub(crate) const DEDUP: u8 = 67;
    pub(crate) const END: u8 = 68;
    pub(crate) const CLUSTER: u8 = 69;
    pub(crate) const EVENT_KEYS: u8 = 70;
    pub(crate) const HISTORY: u8 = 71;
    /// Event keys with the fingerprint of what each event said: written
    /// instead of `EVENT_KEYS` once a key has one.
    pub(crate) const EVENT_KEYS_PRINTED: u8 = 72;
    /// A queue's messages that carry an ordering key (in it and in its
    /// failure queue), after its MESSAGES: only for a queue that has one.
    pub(crate) const ORDERING_KEYS: u8 = 73;
    /// The event catalogue: each type's name and definition.
    pub(crate) const EVENT_TYPES: u8 = 74;
}

/// Version of the chunk layouts inside a checkpoint.
pub(crate) const CHECKPOINT_FORMAT: u32 = 1;

/// A chunk is closed once its body passes this: small enough to decode
/// (and to ship) one at a time, large enough that framing costs nothing.
pub(crate) const CHUNK_BYTES_MAX: usize = 1 << 20;

/// What a checkpoint records besides the state: the spool it belongs to and
/// where the journal stood.
#[derive(Clone, PartialEq, Eq, Default)]
pub(crate) struct CheckpointMeta {
    /// The last record the state reflects.
    pub seq: u64,
    /// The log segment the next record goes to (or a later one): where the
    /// writer starts if no segment is left (an upgrade or repair rebuilt
    /// the journal).
    pub next_segment_id: u64,
    /// Packs get ids from here on.
    pub next_pack_id: u64,
    pub salt: u64,
    pub token_key: [u8; 32],
    /// Every file (record-location id) the checkpoint points into: what
    /// start-up must keep, known from the first chunk alone.
    pub files: Vec<u32>,
}

impl std::fmt::Debug for CheckpointMeta {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The token key is a secret: never print it.
        f.debug_struct("CheckpointMeta")
            .field("seq", &self.seq)
            .field("next_segment_id", &self.next_segment_id)
            .field("next_pack_id", &self.next_pack_id)
            .field("files", &self.files)
            .finish_non_exhaustive()
    }
}

/// A record location on its way into a checkpoint, with the message it
/// belongs to.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LocUse<'a> {
    /// The base queue (the message may sit in its failure queue).
    pub queue: &'a str,
    pub id: MessageId,
    /// The message's newest attempt record, not its enqueue record.
    pub attempts: bool,
    /// An untouched event delivery: its record moves with its event's
    /// (`Spool::relocate_fresh`), not on its own.
    pub fresh: bool,
    pub loc: RecordLoc,
}

const EMPTY_ENTRY: MessageEntry = MessageEntry {
    id: MessageId(0),
    in_failure_queue: false,
    enqueued_at: 0,
    visible_at: 0,
    retention_from: 0,
    retry_count: 0,
    loc: RecordLoc {
        file: 0,
        offset: 0,
        len: 0,
    },
    shared: false,
    attempts: None,
    failure: None,
    ordering_key: None,
};

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Counts {
    queues: u64,
    messages: u64,
    dedup: u64,
}

fn put_loc(out: &mut Vec<u8>, loc: RecordLoc) {
    put_uvarint(out, u64::from(loc.file));
    put_uvarint(out, u64::from(loc.offset));
    put_uvarint(out, u64::from(loc.len));
}

fn get_loc(r: &mut Reader<'_>) -> Result<RecordLoc, DecodeError> {
    let mut u32_field = |what: &str| {
        let v = r.uvarint()?;
        u32::try_from(v).map_err(|_| DecodeError(format!("{what} {v} out of range")))
    };
    Ok(RecordLoc {
        file: u32_field("file id")?,
        offset: u32_field("offset")?,
        len: u32_field("length")?,
    })
}

#[cfg(test)]
mod tests {
    use std::borrow::Cow;

    use super::*;
    use crate::spool::command::{Command, EnqueueMeta, FailReason, Record};
    use crate::spool::queue::QueueSettings;
    use crate::spool::state::Spool;
    use crate::time::Millis;

    const LOC: RecordLoc = RecordLoc {
        file: 3,
        offset: 64,
        len: 100,
    };

    fn apply(spool: &mut Spool, at: Millis, command: Command<'static>) {
        let seq = spool.applied_seq() + 1;
        let loc = RecordLoc {
            offset: 64 + seq as u32 * 100,
            ..LOC
        };
        spool.apply(&Record { at, command }, seq, loc);
    }

    /// A spool with a bit of everything: two queues (one paused, one with
    /// a dedup window), delayed, retried, failed and redriven messages.
    fn busy_spool() -> Spool {
        let mut spool = Spool::new();
        for (name, window) in [("a", 60_000), ("b", 0)] {
            apply(
                &mut spool,
                1,
                Command::QueueUpsert {
                    name: Cow::Owned(name.into()),
                    settings: Box::new(QueueSettings {
                        dedup_window_ms: window,
                        max_retries: 0,
                        ..QueueSettings::default()
                    }),
                    managed_by_config: name == "b",
                },
            );
        }
        apply(
            &mut spool,
            2,
            Command::QueuePause {
                name: "b".into(),
                paused: true,
            },
        );
        for i in 0..2000u64 {
            let id = spool.allocate_id();
            apply(
                &mut spool,
                10 + i as i64,
                Command::Enqueue(EnqueueMeta {
                    ordering_key: None,
                    id,
                    queue: Cow::Owned(if i % 3 == 0 { "b" } else { "a" }.into()),
                    visible_at: 10 + i as i64 + (i as i64 % 7) * 1000,
                    dedup_hash: (i % 5 == 0 && i % 3 != 0).then_some(i * 31),
                }),
            );
        }
        for id in [2, 5, 8] {
            apply(
                &mut spool,
                5000,
                Command::Fail {
                    queue: "a".into(),
                    id: MessageId(id),
                    reason: FailReason::PermanentStatus,
                    last_status: Some(410),
                    retry_count: 1,
                },
            );
        }
        apply(
            &mut spool,
            6000,
            Command::Redrive {
                queue: "a".into(),
                ids: vec![MessageId(5)],
            },
        );
        apply(
            &mut spool,
            6001,
            Command::Retry {
                queue: "a".into(),
                id: MessageId(3),
                visible_at: 9000,
                retry_count: 4,
            },
        );
        // Replicated mode's part: a replica set and two retired ids.
        apply(
            &mut spool,
            6002,
            Command::RaftMembership {
                config: b"opaque replica set".to_vec().into(),
            },
        );
        for id in [7, 3] {
            apply(&mut spool, 6003, Command::RetireNode { id });
        }
        spool
    }

    fn meta() -> CheckpointMeta {
        CheckpointMeta {
            seq: 0,
            next_segment_id: 9,
            next_pack_id: 4,
            salt: 77,
            token_key: [5; 32],
            files: Vec::new(),
        }
    }

    fn load(chunks: &[(u8, Vec<u8>)]) -> Result<(Spool, CheckpointMeta), DecodeError> {
        let mut loader = CheckpointLoader::new();
        for (kind, body) in chunks {
            loader.chunk(*kind, body)?;
        }
        loader.finish()
    }

    #[test]
    fn a_checkpoint_round_trips_the_whole_state() {
        let spool = busy_spool();
        let meta = CheckpointMeta {
            seq: spool.applied_seq(),
            ..meta()
        };
        let chunks = spool.encode_checkpoint(&meta, &mut |u| u.loc);
        let (back, back_meta) = load(&chunks).unwrap();
        assert_eq!(back.state(), spool.state());
        assert_eq!(back.state().retired_nodes, vec![3, 7]);
        assert_eq!(back.applied_seq(), spool.applied_seq());
        assert_eq!(back.last_at(), spool.last_at());
        assert_eq!(back_meta.files, vec![LOC.file]);
        assert_eq!((back_meta.next_segment_id, back_meta.next_pack_id), (9, 4));
        assert_eq!(back.live_bytes(LOC.file), spool.live_bytes(LOC.file));
    }

    #[test]
    fn locations_are_relocated_and_the_files_listed() {
        let spool = busy_spool();
        let chunks = spool.encode_checkpoint(&meta(), &mut |u| RecordLoc {
            file: if u.id.0 % 2 == 0 { 7 } else { u.loc.file },
            ..u.loc
        });
        let (back, meta) = load(&chunks).unwrap();
        assert_eq!(meta.files, vec![3, 7]);
        assert_eq!(
            back.state().without_locations(),
            spool.state().without_locations()
        );
    }

    #[test]
    fn a_large_state_spans_many_chunks() {
        let mut spool = busy_spool();
        for i in 0..120_000 {
            let id = spool.allocate_id();
            apply(
                &mut spool,
                9000 + i,
                Command::Enqueue(EnqueueMeta {
                    ordering_key: None,
                    id,
                    queue: "a".into(),
                    visible_at: 9000 + i,
                    dedup_hash: None,
                }),
            );
        }
        let chunks = spool.encode_checkpoint(&meta(), &mut |u| u.loc);
        assert!(chunks.len() > 3, "{} chunks", chunks.len());
        assert!(chunks.iter().all(|(_, b)| b.len() <= CHUNK_BYTES_MAX + 64));
        let (back, _) = load(&chunks).unwrap();
        assert_eq!(back.state(), spool.state());
    }

    #[test]
    fn a_damaged_or_incomplete_checkpoint_is_refused() {
        let spool = busy_spool();
        let chunks = spool.encode_checkpoint(&meta(), &mut |u| u.loc);
        assert!(load(&chunks[..chunks.len() - 1]).is_err(), "no END");
        assert!(load(&chunks[1..]).is_err(), "no BEGIN");
        let mut missing = chunks.clone();
        missing.remove(2);
        assert!(load(&missing).is_err(), "a chunk missing");
        let mut twice = chunks.clone();
        twice.insert(2, chunks[2].clone());
        assert!(load(&twice).is_err(), "a chunk twice");
        for cut in [1, 7, 30] {
            let mut short = chunks.clone();
            let body = &mut short[2].1;
            body.truncate(body.len().saturating_sub(cut));
            assert!(load(&short).is_err(), "a chunk cut by {cut}");
        }
        // What repair makes of it: the chunks that decode.
        let mut lenient = CheckpointLoader::lenient();
        for (kind, body) in &missing {
            lenient.chunk(*kind, body).unwrap();
        }
        let (partial, meta, skipped) = lenient.finish_lenient();
        assert!(meta.is_some());
        assert!(partial.message_count() < spool.message_count());
        assert!(skipped.is_empty() || skipped.iter().all(|s| s.contains("chunk")));
    }
}
