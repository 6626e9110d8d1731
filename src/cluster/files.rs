//! The three small files of a replica beside its journal: `raft.id` (the
//! node id the directory belongs to and its incarnation, written once),
//! `raft.vote` (the vote, replaced atomically and fsynced: a replica must
//! never vote twice in a term) and `raft.commit` (the last entry known
//! committed, written in place without fsync: a stale or torn one only
//! means start-up applies less and Raft applies the rest). Layouts:
//! docs/journal-format.md.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use super::types::{LogId, Vote};
use crate::journal::JournalError;
use crate::journal::atomic::write_atomically;
use crate::journal::storage::{Storage, StorageFile};

const ID_FILE: &str = "raft.id";
const VOTE_FILE: &str = "raft.vote";
const COMMIT_FILE: &str = "raft.commit";
const ID_MAGIC: &[u8; 8] = b"SPOOLRID";
const ID_BYTES: usize = 28;
const VOTE_MAGIC: &[u8; 8] = b"SPOOLVOT";
const COMMIT_MAGIC: &[u8; 8] = b"SPOOLCMT";
const COMMIT_BYTES: usize = 32;

pub(crate) struct RaftFiles {
    storage: Arc<dyn Storage>,
    dir: PathBuf,
    commit: Mutex<Option<Arc<dyn StorageFile>>>,
    committed: Mutex<Option<LogId>>,
}

impl RaftFiles {
    /// Reads both files of `dir` (either may be missing: a new replica).
    pub(crate) fn open(
        storage: Arc<dyn Storage>,
        dir: &Path,
    ) -> Result<(RaftFiles, Option<Vote>), JournalError> {
        let vote = read_vote(storage.as_ref(), dir)?;
        let committed = read_committed(storage.as_ref(), dir);
        let files = RaftFiles {
            storage,
            dir: dir.to_path_buf(),
            commit: Mutex::new(None),
            committed: Mutex::new(committed),
        };
        Ok((files, vote))
    }

    pub(crate) fn committed(&self) -> Option<LogId> {
        *self.committed.lock().expect("bug: commit lock poisoned")
    }

    pub(crate) fn save_vote(&self, vote: &Vote) -> Result<(), JournalError> {
        let body = postcard::to_allocvec(vote)
            .map_err(|e| JournalError::io(self.dir.join(VOTE_FILE), std::io::Error::other(e)))?;
        let mut bytes = Vec::with_capacity(16 + body.len() + 4);
        bytes.extend_from_slice(VOTE_MAGIC);
        bytes.extend_from_slice(&(body.len() as u64).to_le_bytes());
        bytes.extend_from_slice(&body);
        let crc = crc32c::crc32c(&bytes);
        bytes.extend_from_slice(&crc.to_le_bytes());
        write_atomically(&self.storage, &self.dir, VOTE_FILE, |f| {
            f.write_all_at(&bytes, 0)
        })
        .map(|_| ())
        .map_err(|e| e.into_inner())
    }

    pub(crate) fn save_committed(&self, committed: Option<&LogId>) -> Result<(), JournalError> {
        let path = self.dir.join(COMMIT_FILE);
        let mut bytes = [0u8; COMMIT_BYTES];
        bytes[..8].copy_from_slice(COMMIT_MAGIC);
        if let Some(id) = committed {
            bytes[8..16].copy_from_slice(&id.committed_leader_id().term.to_le_bytes());
            bytes[16..24].copy_from_slice(&(id.index() + 1).to_le_bytes());
        }
        let crc = crc32c::crc32c(&bytes[..24]);
        bytes[24..28].copy_from_slice(&crc.to_le_bytes());
        let mut file = self.commit.lock().expect("bug: commit lock poisoned");
        if file.is_none() {
            let opened = match self.storage.open(&path) {
                Ok(f) => f,
                Err(_) => self
                    .storage
                    .create(&path)
                    .map_err(|e| JournalError::io(&path, e))?,
            };
            *file = Some(opened);
        }
        file.as_ref()
            .expect("opened above")
            .write_all_at(&bytes, 0)
            .map_err(|e| JournalError::io(&path, e))?;
        *self.committed.lock().expect("bug: commit lock poisoned") = committed.copied();
        Ok(())
    }
}

/// Replaces the vote of the replica in `dir` with one for `node_id` in
/// `term` (`spoold cluster repair-vote`, and tests).
pub(crate) fn write_vote(
    storage: Arc<dyn Storage>,
    dir: &Path,
    term: u64,
    node_id: u64,
) -> Result<(), JournalError> {
    let files = RaftFiles {
        storage,
        dir: dir.to_path_buf(),
        commit: Mutex::new(None),
        committed: Mutex::new(None),
    };
    files.save_vote(&Vote::new(term, node_id))
}

/// The term of the last entry of the log in `dir`, whose lock the caller
/// holds (0: an empty log): the spool is replayed as start-up replays it
/// (up to the entry known committed), read, and closed.
pub(crate) async fn last_log_term(
    storage: Arc<dyn Storage>,
    dir: &Path,
) -> Result<u64, JournalError> {
    let committed = read_committed(storage.as_ref(), dir);
    let mut options = crate::engine::EngineOptions::new(dir);
    options.storage = storage;
    options.lock = false;
    options.preallocate = false;
    let committed = committed.map_or(0, |c| super::types::seq_of(c.index()));
    let (engine, _) = crate::engine::Replica::open(options, committed).await?;
    // The last record's term, or the last purged one's when a snapshot
    // covers the whole log.
    let (_, _, term) = engine.raft_log().bounds();
    engine.close();
    Ok(term.unwrap_or(0))
}

/// The incarnation of `dir`, a random number drawn the first time a
/// replica runs in it: a directory that was wiped (or a new replica given
/// an old one's id) has a new incarnation, and the members know the old
/// one (`types.rs` `Peer`). Refuses a directory that belongs to another
/// node id.
pub(crate) fn incarnation(
    storage: &Arc<dyn Storage>,
    dir: &Path,
    node_id: u64,
) -> Result<u64, IdError> {
    match read_id(storage.as_ref(), dir) {
        Ok(Some((owner, _))) if owner != node_id => Err(IdError::OtherNode {
            dir: dir.to_path_buf(),
            owner,
            node_id,
        }),
        Ok(Some((_, incarnation))) => Ok(incarnation),
        Err(e) => Err(e.into()),
        Ok(None) => {
            // Never 0: 0 is a member not pinned yet.
            let incarnation = rand::random::<u64>() | 1;
            let mut bytes = [0u8; ID_BYTES];
            bytes[..8].copy_from_slice(ID_MAGIC);
            bytes[8..16].copy_from_slice(&node_id.to_le_bytes());
            bytes[16..24].copy_from_slice(&incarnation.to_le_bytes());
            let crc = crc32c::crc32c(&bytes[..24]);
            bytes[24..28].copy_from_slice(&crc.to_le_bytes());
            write_atomically(storage, dir, ID_FILE, |f| f.write_all_at(&bytes, 0))
                .map_err(|e| e.into_inner())?;
            Ok(incarnation)
        }
    }
}

/// The node id `dir` belongs to and its incarnation (`None`: a directory
/// no replica ran in yet).
pub(crate) fn read_id(
    storage: &dyn Storage,
    dir: &Path,
) -> Result<Option<(u64, u64)>, JournalError> {
    let path = dir.join(ID_FILE);
    let file = match storage.open(&path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(JournalError::io(&path, e)),
    };
    let mut bytes = [0u8; ID_BYTES];
    file.read_exact_at(&mut bytes, 0)
        .map_err(|e| JournalError::io(&path, e))?;
    let crc = u32::from_le_bytes(bytes[24..28].try_into().expect("4 bytes"));
    if &bytes[..8] != ID_MAGIC || crc32c::crc32c(&bytes[..24]) != crc {
        return Err(JournalError::Corrupt {
            dir: dir.to_path_buf(),
            file: path,
            offset: 0,
            reason: "not a replica id file, or damaged".into(),
        });
    }
    let owner = u64::from_le_bytes(bytes[8..16].try_into().expect("8 bytes"));
    let incarnation = u64::from_le_bytes(bytes[16..24].try_into().expect("8 bytes"));
    Ok(Some((owner, incarnation)))
}

/// Why a replica's directory cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum IdError {
    #[error(transparent)]
    Journal(#[from] JournalError),
    #[error(
        "{dir} is the spool directory of node {owner}, not of node {node_id} \
         (cluster.node_id): give each replica its own directory"
    )]
    OtherNode {
        dir: PathBuf,
        owner: u64,
        node_id: u64,
    },
}

fn read_vote(storage: &dyn Storage, dir: &Path) -> Result<Option<Vote>, JournalError> {
    let path = dir.join(VOTE_FILE);
    let file = match storage.open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(JournalError::io(&path, e)),
    };
    let mut bytes = Vec::new();
    file.read_all(&mut bytes)
        .map_err(|e| JournalError::io(&path, e))?;
    let bad = |reason: &str| JournalError::Corrupt {
        dir: dir.to_path_buf(),
        file: path.clone(),
        offset: 0,
        reason: reason.to_owned(),
    };
    if bytes.len() < 20 || &bytes[..8] != VOTE_MAGIC {
        return Err(bad("not a vote file"));
    }
    let len = u64::from_le_bytes(bytes[8..16].try_into().expect("8 bytes")) as usize;
    if bytes.len() != 16 + len + 4 {
        return Err(bad("vote file has the wrong length"));
    }
    let crc = u32::from_le_bytes(bytes[16 + len..].try_into().expect("4 bytes"));
    if crc32c::crc32c(&bytes[..16 + len]) != crc {
        return Err(bad("vote file fails its checksum"));
    }
    postcard::from_bytes(&bytes[16..16 + len])
        .map(Some)
        .map_err(|_| bad("vote does not decode"))
}

/// The commit pointer, or `None` when it is missing, torn or damaged
/// (start-up then applies nothing beyond the checkpoint and Raft applies
/// the rest once a primary tells it what is committed).
fn read_committed(storage: &dyn Storage, dir: &Path) -> Option<LogId> {
    let file = storage.open(&dir.join(COMMIT_FILE)).ok()?;
    let mut bytes = [0u8; COMMIT_BYTES];
    file.read_exact_at(&mut bytes, 0).ok()?;
    let crc = u32::from_le_bytes(bytes[24..28].try_into().expect("4 bytes"));
    if &bytes[..8] != COMMIT_MAGIC || crc32c::crc32c(&bytes[..24]) != crc {
        return None;
    }
    let term = u64::from_le_bytes(bytes[8..16].try_into().expect("8 bytes"));
    let index = u64::from_le_bytes(bytes[16..24].try_into().expect("8 bytes"));
    (index > 0).then(|| LogId::new_term_index(term, index - 1))
}
