//! The checkpoint file as the engine reads it: read and check its frames,
//! match it to the spool's identity, decode it into a state. Start-up,
//! repair and a replica's snapshot install all load checkpoints this way.

use std::path::Path;
use std::sync::Arc;

use crate::journal::JournalError;
use crate::journal::format::{SpoolIdentity, checkpoint_file_name};
use crate::journal::scan::{self, CheckpointInfo};
use crate::journal::storage::Storage;
use crate::spool::{CheckpointLoader, CheckpointMeta, Spool};

/// Reads the checkpoint at `seq`, checks every chunk's frame, and decodes
/// its first chunk (what the journal looked like).
pub(super) fn read_checkpoint(
    storage: &Arc<dyn Storage>,
    dir: &Path,
    identity: &SpoolIdentity,
    seq: u64,
) -> Result<(scan::CheckpointBytes, CheckpointMeta), JournalError> {
    let bytes = scan::read_checkpoint(storage, dir, identity.salt, seq)?
        .map_err(|problem| problem.into_error(dir))?;
    let bad = |reason: String| JournalError::BadRecord {
        file: dir.join(checkpoint_file_name(seq)),
        offset: 0,
        reason,
    };
    let (kind, body) = bytes
        .chunks()
        .next()
        .ok_or_else(|| bad("checkpoint without chunks".into()))?;
    if kind != crate::spool::checkpoint::kind::BEGIN {
        return Err(bad("checkpoint does not start with BEGIN".into()));
    }
    let meta =
        crate::spool::checkpoint::read_begin(body).map_err(|e| bad(format!("checkpoint: {e}")))?;
    if meta.seq != seq || meta.salt != identity.salt || meta.token_key != identity.token_key {
        return Err(bad(
            "checkpoint does not match its name or the spool's identity".into(),
        ));
    }
    Ok((bytes, meta))
}

/// Decodes a checked checkpoint into the state it holds.
pub(super) fn decode_checkpoint(
    dir: &Path,
    identity: &SpoolIdentity,
    bytes: &scan::CheckpointBytes,
) -> Result<Spool, JournalError> {
    let seq = bytes.info.seq;
    let mut loader = CheckpointLoader::new();
    let decoded = bytes
        .chunks()
        .try_for_each(|(kind, body)| loader.chunk(kind, body))
        .and_then(|()| loader.finish());
    let bad = |reason: String| JournalError::BadRecord {
        file: dir.join(checkpoint_file_name(seq)),
        offset: 0,
        reason: format!("checkpoint: {reason}"),
    };
    let (spool, meta) = decoded.map_err(|e| bad(e.to_string()))?;
    if meta.salt != identity.salt || meta.token_key != identity.token_key {
        return Err(bad("it belongs to another spool".into()));
    }
    Ok(spool)
}

/// Reads and decodes the checkpoint at `seq`.
pub(super) fn load_checkpoint(
    storage: &Arc<dyn Storage>,
    dir: &Path,
    identity: &SpoolIdentity,
    seq: u64,
) -> Result<(Spool, CheckpointMeta, CheckpointInfo), JournalError> {
    let (bytes, meta) = read_checkpoint(storage, dir, identity, seq)?;
    let spool = decode_checkpoint(dir, identity, &bytes)?;
    Ok((spool, meta, bytes.info))
}
