//! Reading a checkpoint back, chunk by chunk: every field checked, every
//! count matched against END, into a state with its indexes rebuilt.

use super::{CHECKPOINT_FORMAT, CheckpointMeta, Counts, EMPTY_ENTRY, get_loc, kind};
use crate::spool::codec::DecodeError;
use crate::spool::codec::Reader;
use crate::spool::command::{FailInfo, FailReason, MessageId};
use crate::spool::queue::{QueueSettings, failed_queue_name, valid_queue_name};
use crate::spool::state::{DedupEntry, Delivered, Message, MessageEntry, QueueEntry, Spool};
use crate::time::Millis;

pub(super) fn decode_message(
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
        // From the queue's ORDERING_KEYS chunk, which follows.
        ordering_key: None,
    })
}

/// What a BEGIN chunk says.
pub(super) struct Begin {
    meta: CheckpointMeta,
    epoch: u64,
    next_message_id: u64,
    last_at: Millis,
}

pub(super) fn decode_begin(r: &mut Reader<'_>) -> Result<Begin, DecodeError> {
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

    pub(super) fn decode_chunk(&mut self, kind: u8, body: &[u8]) -> Result<(), DecodeError> {
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
            (kind::ORDERING_KEYS, Some(spool)) => {
                let queue = r.str16()?.to_owned();
                let n = r.u32()?;
                for _ in 0..n {
                    let id = r.id()?;
                    let key = r.u64()?;
                    spool
                        .restore_ordering_key(&queue, id, key)
                        .map_err(|e| DecodeError(format!("ordering key of {queue}: {e}")))?;
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
            (kind::EVENT_KEYS | kind::EVENT_KEYS_PRINTED, Some(spool)) => {
                let printed = kind == kind::EVENT_KEYS_PRINTED;
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
                    let fingerprint = if printed {
                        let has = r.u8()? != 0;
                        let fingerprint = r.u64()?;
                        has.then_some(fingerprint)
                    } else {
                        None
                    };
                    let seen = crate::spool::state::EventSeen {
                        first_at,
                        id,
                        fingerprint,
                        deliveries,
                    };
                    spool.restore_event_key(hash, seen);
                }
            }
            (kind::EVENT_TYPES, Some(spool)) => {
                for _ in 0..r.u32()? {
                    let name = r.str16()?;
                    let definition = r.bytes32()?;
                    if definition.is_empty() {
                        return Err(DecodeError(format!(
                            "event type {name:?} without a definition"
                        )));
                    }
                    spool.set_event_type(name, definition);
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
    pub(super) fn restored(seq: u64, epoch: u64, next_message_id: u64, last_at: Millis) -> Spool {
        let mut spool = Spool::new();
        spool.restore_position(seq, epoch, next_message_id, last_at);
        spool
    }

    pub(super) fn restore_message(
        &mut self,
        queue: &str,
        m: MessageEntry,
    ) -> Result<(), &'static str> {
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
