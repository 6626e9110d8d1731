//! The journal files of a directory: which there are, of each kind, and
//! which of them the newest checkpoint made obsolete; reading a whole file
//! or a segment's header. Reads only; changes nothing.

use std::path::Path;
use std::sync::Arc;

use crate::journal::error::JournalError;
use crate::journal::format::{
    FILE_HEADER_BYTES, FileId, HeaderProblem, SegmentHeader, checkpoint_file_name, pack_file_name,
    parse_checkpoint_file_name, parse_pack_file_name, parse_segment_file_name, segment_file_name,
};
use crate::journal::storage::Storage;

/// The journal files in a directory.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Listing {
    pub segments: Vec<u64>,
    pub packs: Vec<u64>,
    pub checkpoints: Vec<u64>,
}

impl Listing {
    pub(crate) fn is_empty(&self) -> bool {
        self.segments.is_empty() && self.packs.is_empty() && self.checkpoints.is_empty()
    }
}

/// Lists the journal files in `dir`, each kind ascending.
pub(crate) fn list_files(storage: &dyn Storage, dir: &Path) -> Result<Listing, JournalError> {
    let names = storage.list(dir).map_err(|e| JournalError::io(dir, e))?;
    let mut listing = Listing::default();
    for name in &names {
        if let Some(id) = parse_segment_file_name(name) {
            listing.segments.push(id);
        } else if let Some(id) = parse_pack_file_name(name) {
            listing.packs.push(id);
        } else if let Some(seq) = parse_checkpoint_file_name(name) {
            listing.checkpoints.push(seq);
        }
    }
    listing.segments.sort_unstable();
    listing.packs.sort_unstable();
    listing.checkpoints.sort_unstable();
    Ok(listing)
}

/// The first bytes of segment `id` (its header, or what there is of it) and
/// the file's length.
pub(crate) fn read_header(
    storage: &dyn Storage,
    dir: &Path,
    id: u64,
) -> Result<(Vec<u8>, u64), JournalError> {
    let path = dir.join(segment_file_name(id));
    let file = storage
        .open(&path)
        .map_err(|e| JournalError::io(&path, e))?;
    let len = file.size_bytes().map_err(|e| JournalError::io(&path, e))?;
    let mut header = vec![0u8; FILE_HEADER_BYTES];
    let got = file
        .read_at(&mut header, 0)
        .map_err(|e| JournalError::io(&path, e))?;
    header.truncate(got);
    Ok((header, len))
}

/// Reads the whole file at `path` into `buf`.
pub(crate) fn read_whole(
    storage: &dyn Storage,
    path: &Path,
    buf: &mut Vec<u8>,
) -> Result<(), JournalError> {
    storage
        .open(path)
        .and_then(|f| f.read_all(buf))
        .map_err(|e| JournalError::io(path, e))
}

/// Files that the checkpoint at `checkpoint_seq` made obsolete: older
/// checkpoints, packs it does not point into, log segments whose records
/// it covers and does not point into, and format-1 segments an upgrade
/// replaced. Reads only headers; changes nothing.
pub(crate) fn obsolete_files(
    storage: &Arc<dyn Storage>,
    dir: &Path,
    salt: u64,
    listing: &Listing,
    checkpoint_seq: u64,
    referenced: &dyn Fn(FileId) -> bool,
) -> Result<Vec<String>, JournalError> {
    let mut out = Vec::new();
    // Without a checkpoint nothing points into a pack: any pack is one
    // whose compaction never wrote its checkpoint.
    out.extend(
        listing
            .packs
            .iter()
            .filter(|&&id| !referenced(FileId::Pack(id)))
            .map(|&id| pack_file_name(id)),
    );
    let Some((_, stale)) = listing.checkpoints.split_last() else {
        return Ok(out);
    };
    out.extend(stale.iter().map(|&seq| checkpoint_file_name(seq)));
    let mut headers = Vec::new();
    for &id in &listing.segments {
        let (buf, _) = read_header(storage.as_ref(), dir, id)?;
        match SegmentHeader::decode(&buf, salt, id) {
            Ok(h) => headers.push(h),
            Err(HeaderProblem::OldVersion(_)) => out.push(segment_file_name(id)),
            // Damage is the scan's to report.
            Err(_) => {}
        }
    }
    if let Some(live_start) = headers
        .iter()
        .rposition(|h| h.first_seq <= checkpoint_seq + 1)
    {
        out.extend(
            headers[..live_start]
                .iter()
                .filter(|h| !referenced(FileId::Segment(h.segment_id)))
                .map(|h| segment_file_name(h.segment_id)),
        );
    }
    Ok(out)
}
