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

use std::collections::BTreeMap;

use super::codec::DecodeError;
use super::codec::{
    Reader, put_bytes32, put_i64, put_ivarint, put_str16, put_u32, put_u64, put_uvarint,
};
use super::command::{FailInfo, FailReason, MessageId};
use super::queue::{QueueSettings, failed_queue_name, valid_queue_name};
use super::state::{
    DedupEntry, Delivered, EventKeyEntry, Message, MessageEntry, QueueEntry, QueueState, Spool,
    SpoolState,
};
use crate::journal::RecordLoc;
use crate::time::Millis;

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
    pub loc: RecordLoc,
}

impl Spool {
    /// The state without leases, as plain data.
    pub(crate) fn state(&self) -> SpoolState {
        let mut state = SpoolState {
            epoch: self.epoch(),
            next_message_id: self.next_message_id(),
            queues: BTreeMap::new(),
            cluster_config: self.cluster_config().map(<[u8]>::to_vec),
            retired_nodes: self.retired_nodes().iter().copied().collect(),
            event_keys: self
                .event_keys()
                .map(|(hash, seen)| EventKeyEntry {
                    hash,
                    first_at: seen.first_at,
                    id: seen.id,
                    deliveries: seen.deliveries.clone(),
                })
                .collect(),
        };
        self.for_each_queue(|queue, messages, dedup| {
            let history = self
                .queue(&queue.name)
                .map(|q| q.history_entries().map(|(id, d)| (id, *d)).collect())
                .unwrap_or_default();
            state.queues.insert(
                queue.name.clone(),
                QueueState {
                    queue,
                    messages: messages.collect(),
                    dedup,
                    history,
                },
            );
        });
        state
    }

    /// SHA-256 of the replicated state: the checkpoint's chunks (a
    /// versioned encoding, not `Debug` text) with every record location
    /// zeroed and the BEGIN chunk left out. BEGIN holds what is local to a
    /// node: its journal position, keys, epoch and the next id it would
    /// hand out (a send refused after allocating one moves only that node's
    /// counter). Replicas at the same applied record compare these.
    pub(crate) fn state_digest(&self) -> [u8; 32] {
        use sha2::Digest;
        let zero = RecordLoc {
            file: 0,
            offset: 0,
            len: 0,
        };
        let chunks = self.encode_checkpoint(&CheckpointMeta::default(), &mut |_| zero);
        let mut hash = sha2::Sha256::new();
        for (kind, body) in chunks.iter().filter(|(k, _)| *k != kind::BEGIN) {
            hash.update([*kind]);
            hash.update((body.len() as u64).to_le_bytes());
            hash.update(body);
        }
        hash.finalize().into()
    }

    /// Encodes the state as checkpoint chunks, each record location passed
    /// through `relocate` (compaction points the checkpoint at the pack it
    /// is about to write).
    pub(crate) fn encode_checkpoint(
        &self,
        meta: &CheckpointMeta,
        relocate: &mut dyn FnMut(LocUse<'_>) -> RecordLoc,
    ) -> Vec<(u8, Vec<u8>)> {
        let mut out = ChunkWriter::default();
        let mut counts = Counts::default();
        // Every file the relocated locations name, for the BEGIN chunk.
        let mut files = std::collections::BTreeSet::new();
        let mut relocate = |u: LocUse<'_>| {
            let loc = relocate(u);
            files.insert(loc.file);
            loc
        };

        let mut queues = Vec::new();
        self.for_each_queue(|queue, _, _| queues.push(queue));
        out.start(kind::QUEUES, Vec::new());
        for q in &queues {
            let mut e = Vec::new();
            put_str16(&mut e, &q.name);
            e.push(u8::from(q.managed_by_config));
            e.push(u8::from(q.paused));
            let json = serde_json::to_vec(&q.settings).expect("bug: settings always serialise");
            put_bytes32(&mut e, &json);
            out.entry(&e);
            counts.queues += 1;
        }
        out.finish();

        self.for_each_queue(|queue, messages, dedup| {
            let mut prefix = Vec::new();
            put_str16(&mut prefix, &queue.name);
            out.start(kind::MESSAGES, prefix.clone());
            let mut previous = EMPTY_ENTRY;
            let mut e = Vec::new();
            for m in messages {
                let m = MessageEntry {
                    loc: relocate(LocUse {
                        queue: &queue.name,
                        id: m.id,
                        attempts: false,
                        loc: m.loc,
                    }),
                    attempts: m.attempts.map(|loc| {
                        relocate(LocUse {
                            queue: &queue.name,
                            id: m.id,
                            attempts: true,
                            loc,
                        })
                    }),
                    ..m
                };
                if out.is_fresh() {
                    previous = EMPTY_ENTRY;
                }
                e.clear();
                encode_message(&mut e, &m, &previous);
                out.entry(&e);
                previous = m;
                counts.messages += 1;
            }
            out.finish();
            out.start(kind::DEDUP, prefix.clone());
            for d in dedup {
                e.clear();
                put_u64(&mut e, d.hash);
                put_i64(&mut e, d.first_at);
                put_u64(&mut e, d.id.0);
                out.entry(&e);
                counts.dedup += 1;
            }
            out.finish();
            let q = self.queue(&queue.name).expect("listed");
            if q.history_entries().next().is_some() {
                out.start(kind::HISTORY, prefix);
                for (id, d) in q.history_entries() {
                    let loc = relocate(LocUse {
                        queue: &queue.name,
                        id,
                        attempts: false,
                        loc: d.loc,
                    });
                    let attempts = d.attempts.map(|loc| {
                        relocate(LocUse {
                            queue: &queue.name,
                            id,
                            attempts: true,
                            loc,
                        })
                    });
                    e.clear();
                    put_u64(&mut e, id.0);
                    put_i64(&mut e, d.enqueued_at);
                    put_i64(&mut e, d.delivered_at);
                    put_uvarint(&mut e, u64::from(d.retry_count));
                    e.push(u8::from(d.shared) | (u8::from(attempts.is_some()) << 1));
                    put_loc(&mut e, loc);
                    if let Some(a) = attempts {
                        put_loc(&mut e, a);
                    }
                    out.entry(&e);
                }
                out.finish();
            }
        });

        let mut begin = Vec::new();
        put_u32(&mut begin, CHECKPOINT_FORMAT);
        put_u64(&mut begin, meta.seq);
        put_u64(&mut begin, self.epoch());
        put_u64(&mut begin, self.next_message_id());
        put_i64(&mut begin, self.last_at());
        put_u64(&mut begin, meta.next_segment_id);
        put_u64(&mut begin, meta.next_pack_id);
        put_u64(&mut begin, meta.salt);
        begin.extend_from_slice(&meta.token_key);
        put_u32(&mut begin, files.len() as u32);
        for f in &files {
            put_u32(&mut begin, *f);
        }
        out.chunks.insert(0, (kind::BEGIN, begin));
        let mut keys = self.event_keys().peekable();
        if keys.peek().is_some() {
            out.start(kind::EVENT_KEYS, Vec::new());
            let mut e = Vec::new();
            for (hash, seen) in keys {
                e.clear();
                put_u64(&mut e, hash);
                put_i64(&mut e, seen.first_at);
                put_u64(&mut e, seen.id.0);
                put_u32(&mut e, seen.deliveries.len() as u32);
                for (queue, id) in &seen.deliveries {
                    put_str16(&mut e, queue);
                    put_u64(&mut e, id.0);
                }
                out.entry(&e);
            }
            out.finish();
        }
        if let Some(config) = self.cluster_config() {
            let mut body = Vec::new();
            put_bytes32(&mut body, config);
            put_u32(&mut body, self.retired_nodes().len() as u32);
            for id in self.retired_nodes() {
                put_u64(&mut body, *id);
            }
            out.chunks.push((kind::CLUSTER, body));
        }

        let mut end = Vec::new();
        put_u64(&mut end, out.chunks.len() as u64);
        put_u64(&mut end, counts.queues);
        put_u64(&mut end, counts.messages);
        put_u64(&mut end, counts.dedup);
        out.chunks.push((kind::END, end));
        out.chunks
    }

    /// Calls `f` for every base queue (by name) with its messages (base
    /// queue and failure queue merged, ids ascending) and dedup keys (by
    /// window start).
    fn for_each_queue(
        &self,
        mut f: impl FnMut(QueueEntry, &mut dyn Iterator<Item = MessageEntry>, Vec<DedupEntry>),
    ) {
        for name in self.queue_names() {
            let q = self.queue(&name).expect("listed above");
            if q.is_failure_queue() {
                continue;
            }
            let fq = self
                .queue(&failed_queue_name(&name))
                .expect("bug: a queue without its failure queue");
            let entry = QueueEntry {
                name: name.clone(),
                settings: (*q.settings).clone(),
                managed_by_config: q.managed_by_config,
                paused: q.paused,
            };
            let mut dedup: Vec<DedupEntry> = q
                .dedup_entries()
                .map(|(hash, first_at, id)| DedupEntry { first_at, hash, id })
                .collect();
            dedup.sort_unstable();
            let mut messages = merge_by_id(q.message_entries(false), fq.message_entries(true));
            f(entry, &mut messages, dedup);
        }
    }
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
};

/// Two id-ordered streams merged by id.
fn merge_by_id<'a>(
    a: impl Iterator<Item = MessageEntry> + 'a,
    b: impl Iterator<Item = MessageEntry> + 'a,
) -> impl Iterator<Item = MessageEntry> + 'a {
    let mut a = a.peekable();
    let mut b = b.peekable();
    std::iter::from_fn(move || match (a.peek(), b.peek()) {
        (Some(x), Some(y)) if x.id <= y.id => a.next(),
        (Some(_), Some(_)) => b.next(),
        (Some(_), None) => a.next(),
        (None, _) => b.next(),
    })
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Counts {
    queues: u64,
    messages: u64,
    dedup: u64,
}

/// Builds chunks of one kind, each opening with the same prefix and a
/// count of its entries, closed once past [`CHUNK_BYTES_MAX`].
#[derive(Default)]
struct ChunkWriter {
    chunks: Vec<(u8, Vec<u8>)>,
    kind: u8,
    prefix: Vec<u8>,
    body: Vec<u8>,
    entries: u32,
}

impl ChunkWriter {
    fn start(&mut self, kind: u8, prefix: Vec<u8>) {
        self.kind = kind;
        self.prefix = prefix;
        self.open();
    }

    fn open(&mut self) {
        self.body = self.prefix.clone();
        self.body.extend_from_slice(&[0; 4]);
        self.entries = 0;
    }

    /// No entry in the open chunk yet (delta encodings restart here).
    fn is_fresh(&self) -> bool {
        self.entries == 0
    }

    fn entry(&mut self, bytes: &[u8]) {
        self.body.extend_from_slice(bytes);
        self.entries += 1;
        if self.body.len() >= CHUNK_BYTES_MAX {
            self.close();
            self.open();
        }
    }

    fn close(&mut self) {
        let at = self.prefix.len();
        self.body[at..at + 4].copy_from_slice(&self.entries.to_le_bytes());
        self.chunks
            .push((self.kind, std::mem::take(&mut self.body)));
    }

    /// Closes the open chunk unless it is empty.
    fn finish(&mut self) {
        if self.entries > 0 {
            self.close();
        }
        self.body.clear();
    }
}

/// One message, its numbers relative to the entry before it in the chunk
/// (ids ascend; times are close together), so that a typical message
/// takes about fifteen bytes.
fn encode_message(out: &mut Vec<u8>, m: &MessageEntry, previous: &MessageEntry) {
    put_uvarint(out, m.id.0 - previous.id.0);
    let mut flags = 0u8;
    if m.in_failure_queue {
        flags |= 1;
    }
    if m.attempts.is_some() {
        flags |= 2;
    }
    if m.failure.is_some() {
        flags |= 4;
    }
    if m.shared {
        flags |= 8;
    }
    out.push(flags);
    put_ivarint(out, m.enqueued_at.wrapping_sub(previous.enqueued_at));
    put_ivarint(out, m.visible_at.wrapping_sub(m.enqueued_at));
    put_ivarint(out, m.retention_from.wrapping_sub(m.visible_at));
    put_uvarint(out, u64::from(m.retry_count));
    put_loc(out, m.loc);
    if let Some(a) = m.attempts {
        put_loc(out, a);
    }
    if let Some(f) = m.failure {
        out.push(f.reason.code());
        out.extend_from_slice(&f.last_status.unwrap_or(0).to_le_bytes());
        put_ivarint(out, f.failed_at.wrapping_sub(m.enqueued_at));
    }
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

fn decode_message(
    r: &mut Reader<'_>,
    previous: &MessageEntry,
) -> Result<MessageEntry, DecodeError> {
    let delta = r.uvarint()?;
    let id = previous
        .id
        .0
        .checked_add(delta)
        .filter(|&id| delta > 0 && id >> 63 == 0)
        .ok_or_else(|| DecodeError(format!("message id delta {delta} out of range")))?;
    let flags = r.u8()?;
    let enqueued_at = previous.enqueued_at.wrapping_add(r.ivarint()?);
    let visible_at = enqueued_at.wrapping_add(r.ivarint()?);
    let retention_from = visible_at.wrapping_add(r.ivarint()?);
    let retry_count =
        u32::try_from(r.uvarint()?).map_err(|_| DecodeError("retry count out of range".into()))?;
    let loc = get_loc(r)?;
    let attempts = if flags & 2 != 0 {
        Some(get_loc(r)?)
    } else {
        None
    };
    let failure = if flags & 4 != 0 {
        let code = r.u8()?;
        let reason = FailReason::from_code(code)
            .ok_or_else(|| DecodeError(format!("unknown fail reason {code}")))?;
        let status = r.u16()?;
        Some(FailInfo {
            reason,
            last_status: (status != 0).then_some(status),
            failed_at: enqueued_at.wrapping_add(r.ivarint()?),
        })
    } else {
        None
    };
    Ok(MessageEntry {
        id: MessageId(id),
        in_failure_queue: flags & 1 != 0,
        enqueued_at,
        visible_at,
        retention_from,
        retry_count,
        loc,
        shared: flags & 8 != 0,
        attempts,
        failure,
    })
}

/// What a BEGIN chunk says.
struct Begin {
    meta: CheckpointMeta,
    epoch: u64,
    next_message_id: u64,
    last_at: Millis,
}

fn decode_begin(r: &mut Reader<'_>) -> Result<Begin, DecodeError> {
    let format = r.u32()?;
    if format != CHECKPOINT_FORMAT {
        return Err(DecodeError(format!("unknown checkpoint format {format}")));
    }
    let seq = r.u64()?;
    let epoch = r.u64()?;
    let next_message_id = r.u64()?;
    let last_at = r.i64()?;
    let next_segment_id = r.u64()?;
    let next_pack_id = r.u64()?;
    let salt = r.u64()?;
    let mut token_key = [0u8; 32];
    token_key.copy_from_slice(r.take(32)?);
    if epoch == u64::MAX || next_message_id >> 63 != 0 {
        return Err(DecodeError("epoch or message id out of range".into()));
    }
    let n = r.u32()? as usize;
    let mut files = Vec::with_capacity(n.min(r.buf.len() / 4));
    for _ in 0..n {
        files.push(r.u32()?);
    }
    if !files.is_sorted_by(|a, b| a < b) {
        return Err(DecodeError(
            "the BEGIN chunk's files are not in order".into(),
        ));
    }
    Ok(Begin {
        meta: CheckpointMeta {
            seq,
            next_segment_id,
            next_pack_id,
            salt,
            token_key,
            files,
        },
        epoch,
        next_message_id,
        last_at,
    })
}

/// What a checkpoint's first (BEGIN) chunk says of the journal: enough to
/// know which files to keep before the rest is decoded.
pub(crate) fn read_begin(body: &[u8]) -> Result<CheckpointMeta, DecodeError> {
    let mut r = Reader::new(body);
    let begin = decode_begin(&mut r)?;
    if !r.is_empty() {
        return Err(DecodeError("bytes left over in the BEGIN chunk".into()));
    }
    Ok(begin.meta)
}

/// Rebuilds a [`Spool`] from checkpoint chunks handed over one at a time,
/// in order.
#[derive(Default)]
pub(crate) struct CheckpointLoader {
    spool: Option<Spool>,
    meta: Option<CheckpointMeta>,
    chunks: u64,
    counts: Counts,
    ended: bool,
    /// Repair: keep going past chunks that do not decode (and entries that
    /// do not fit), noting why.
    lenient: Option<Vec<String>>,
    /// The queue of the last message restored and its id: a queue's ids
    /// ascend across its chunks, so no id can repeat.
    last: Option<(String, MessageId)>,
}

impl CheckpointLoader {
    pub(crate) fn new() -> CheckpointLoader {
        CheckpointLoader::default()
    }

    /// A loader for what is left of a damaged checkpoint: chunks may be
    /// missing, and whatever does not decode is skipped (see
    /// [`CheckpointLoader::finish_lenient`]).
    pub(crate) fn lenient() -> CheckpointLoader {
        CheckpointLoader {
            lenient: Some(Vec::new()),
            ..CheckpointLoader::default()
        }
    }

    /// What a lenient loader made of a damaged checkpoint: the spool (empty
    /// if its first chunk was lost), its meta if known, and what it
    /// skipped.
    pub(crate) fn finish_lenient(mut self) -> (Spool, Option<CheckpointMeta>, Vec<String>) {
        let skipped = self.lenient.take().unwrap_or_default();
        let mut spool = self.spool.unwrap_or_default();
        spool.finish_restore();
        (spool, self.meta, skipped)
    }

    pub(crate) fn chunk(&mut self, kind: u8, body: &[u8]) -> Result<(), DecodeError> {
        let decoded = self.decode_chunk(kind, body);
        match (&decoded, self.lenient.as_mut()) {
            (Err(e), Some(skipped)) => {
                skipped.push(format!("chunk {} (kind {kind}): {e}", self.chunks));
                self.chunks += 1;
                Ok(())
            }
            _ => decoded,
        }
    }

    fn decode_chunk(&mut self, kind: u8, body: &[u8]) -> Result<(), DecodeError> {
        if self.ended {
            return Err(DecodeError("chunk after the end of the checkpoint".into()));
        }
        let mut r = Reader::new(body);
        match (kind, self.spool.as_mut()) {
            (kind::BEGIN, None) => {
                let begin = decode_begin(&mut r)?;
                self.spool = Some(Spool::restored(
                    begin.meta.seq,
                    begin.epoch,
                    begin.next_message_id,
                    begin.last_at,
                ));
                self.meta = Some(begin.meta);
            }
            (kind::BEGIN, Some(_)) => return Err(DecodeError("a second BEGIN chunk".into())),
            (_, None) => return Err(DecodeError("checkpoint does not start with BEGIN".into())),
            (kind::QUEUES, Some(spool)) => {
                let n = r.u32()?;
                for _ in 0..n {
                    let name = r.str16()?;
                    if !valid_queue_name(name) || spool.queue(name).is_some() {
                        return Err(DecodeError(format!("bad or repeated queue name {name:?}")));
                    }
                    let managed_by_config = r.u8()? != 0;
                    let paused = r.u8()? != 0;
                    let settings: QueueSettings = serde_json::from_slice(r.bytes32()?)
                        .map_err(|e| DecodeError(format!("queue settings: {e}")))?;
                    spool.restore_queue(QueueEntry {
                        name: name.to_owned(),
                        settings,
                        managed_by_config,
                        paused,
                    });
                    self.counts.queues += 1;
                }
            }
            (kind::MESSAGES, Some(spool)) => {
                let queue = r.str16()?.to_owned();
                let n = r.u32()?;
                let mut previous = EMPTY_ENTRY;
                for _ in 0..n {
                    let m = decode_message(&mut r, &previous)?;
                    let ascending = match &self.last {
                        Some((q, id)) if *q == queue => m.id > *id,
                        _ => true,
                    };
                    let restored = if ascending {
                        spool.restore_message(&queue, m)
                    } else {
                        Err("ids out of order")
                    };
                    match restored {
                        Ok(()) => self.counts.messages += 1,
                        Err(e) => {
                            let e = format!("message {} of {queue}: {e}", m.id.0);
                            match self.lenient.as_mut() {
                                Some(skipped) => skipped.push(e),
                                None => return Err(DecodeError(e)),
                            }
                        }
                    }
                    previous = m;
                    match &mut self.last {
                        Some((q, id)) if *q == queue => *id = m.id,
                        last => *last = Some((queue.clone(), m.id)),
                    }
                }
            }
            (kind::DEDUP, Some(spool)) => {
                let queue = r.str16()?.to_owned();
                let n = r.u32()?;
                for _ in 0..n {
                    let hash = r.u64()?;
                    let first_at = r.i64()?;
                    let id = r.id()?;
                    spool
                        .restore_dedup(&queue, DedupEntry { first_at, hash, id })
                        .map_err(|e| DecodeError(format!("dedup key of {queue}: {e}")))?;
                    self.counts.dedup += 1;
                }
            }
            (kind::HISTORY, Some(spool)) => {
                let queue = r.str16()?.to_owned();
                let n = r.u32()?;
                for _ in 0..n {
                    let id = r.id()?;
                    let enqueued_at = r.i64()?;
                    let delivered_at = r.i64()?;
                    let retry_count = u32::try_from(r.uvarint()?)
                        .map_err(|_| DecodeError("retry count out of range".into()))?;
                    let flags = r.u8()?;
                    let loc = get_loc(&mut r)?;
                    let attempts = if flags & 2 != 0 {
                        Some(get_loc(&mut r)?)
                    } else {
                        None
                    };
                    let d = Delivered {
                        enqueued_at,
                        delivered_at,
                        retry_count,
                        loc,
                        shared: flags & 1 != 0,
                        attempts,
                    };
                    spool
                        .restore_history(&queue, id, d)
                        .map_err(|e| DecodeError(format!("history of {queue}: {e}")))?;
                }
            }
            (kind::EVENT_KEYS, Some(spool)) => {
                let n = r.u32()?;
                for _ in 0..n {
                    let hash = r.u64()?;
                    let first_at = r.i64()?;
                    let id = r.id()?;
                    let count = r.u32()? as usize;
                    let mut deliveries = Vec::with_capacity(count.min(r.buf.len() / 10));
                    for _ in 0..count {
                        deliveries.push((r.str16()?.to_owned(), r.id()?));
                    }
                    let seen = super::state::EventSeen {
                        first_at,
                        id,
                        deliveries,
                    };
                    spool.restore_event_key(hash, seen);
                }
            }
            (kind::CLUSTER, Some(spool)) => {
                if spool.cluster_config().is_some() {
                    return Err(DecodeError("a second CLUSTER chunk".into()));
                }
                spool.restore_cluster_config(r.bytes32()?.to_vec());
                for _ in 0..r.u32()? {
                    spool.restore_retired_node(r.u64()?);
                }
            }
            (kind::END, Some(_)) => {
                let chunks = r.u64()?;
                let counts = Counts {
                    queues: r.u64()?,
                    messages: r.u64()?,
                    dedup: r.u64()?,
                };
                if chunks != self.chunks || counts != self.counts {
                    return Err(DecodeError(format!(
                        "END says {chunks} chunks and {counts:?}, found {} and {:?}",
                        self.chunks, self.counts
                    )));
                }
                self.ended = true;
            }
            (other, Some(_)) => {
                return Err(DecodeError(format!(
                    "unknown checkpoint chunk kind {other}"
                )));
            }
        }
        if !r.is_empty() {
            return Err(DecodeError(format!(
                "{} bytes left over in a chunk of kind {kind}",
                r.buf.len() - r.pos
            )));
        }
        self.chunks += 1;
        Ok(())
    }

    /// The spool and what the checkpoint said of the journal; an error if
    /// the END chunk never came.
    pub(crate) fn finish(self) -> Result<(Spool, CheckpointMeta), DecodeError> {
        match (self.spool, self.meta, self.ended) {
            (Some(mut spool), Some(meta), true) => {
                spool.finish_restore();
                if !spool.referenced_files().eq(meta.files.iter().copied()) {
                    return Err(DecodeError(
                        "the files the messages point into are not those the BEGIN chunk lists"
                            .into(),
                    ));
                }
                Ok((spool, meta))
            }
            _ => Err(DecodeError("checkpoint ends without its END chunk".into())),
        }
    }
}

impl Spool {
    fn restored(seq: u64, epoch: u64, next_message_id: u64, last_at: Millis) -> Spool {
        let mut spool = Spool::new();
        spool.restore_position(seq, epoch, next_message_id, last_at);
        spool
    }

    fn restore_message(&mut self, queue: &str, m: MessageEntry) -> Result<(), &'static str> {
        let name = if m.in_failure_queue {
            failed_queue_name(queue)
        } else {
            queue.to_owned()
        };
        if m.failure.is_some() != m.in_failure_queue {
            return Err("failure details on a message outside a failure queue, or none inside");
        }
        let message = Message {
            enqueued_at: m.enqueued_at,
            visible_at: m.visible_at,
            retention_from: m.retention_from,
            loc: m.loc,
            retry_count: m.retry_count,
            pending: false,
            shared: m.shared,
        };
        self.restore_into(&name, m.id, message, m.failure, m.attempts)
    }
}

#[cfg(test)]
mod tests {
    use std::borrow::Cow;

    use super::*;
    use crate::spool::command::{Command, EnqueueMeta, Record};

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
