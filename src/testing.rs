//! Internals that the crate's integration tests, benchmarks and fuzz
//! targets drive directly: the simulated file system, the journal's file
//! format and frame walker, the record codec, and pieces of the HTTP layer
//! that have properties of their own. Not a stable API: it moves with the
//! code it exposes.

pub use crate::api::LONG_POLLS_MAX;
pub use crate::api::forward::resolve_path;
pub use crate::api::server::HEADER_READ_TIMEOUT;
pub use crate::delivery::client::install_crypto_provider;
pub use crate::delivery::target::Destination;
pub use crate::engine::rebuild::repair;
pub use crate::engine::token::Tokens;
pub use crate::journal::format::{
    FILE_HEADER_BYTES, FRAME_FLAG_BATCH_END, FRAME_HEADER_BYTES, FileId, FrameHeader,
    SegmentHeader, SpoolIdentity, segment_file_name,
};
pub use crate::journal::frames::{Piece, walk};
pub use crate::journal::scan::scan_dir;
pub use crate::journal::sim::{SimStorage, Tear};
pub use crate::journal::storage::Storage;
pub use crate::journal::{JournalError, RecordLoc, load_identity};
pub use crate::spool::checkpoint::{DedupEntry, MessageEntry, QueueEntry, QueueState};
pub use crate::spool::command::IDS_PER_RECORD_MAX;
pub use crate::spool::command::Record;
pub use crate::spool::record::{decode_attempts, decode_payload, kind};
pub use crate::spool::state::FailInfo;
