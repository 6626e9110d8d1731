//! The reading half of `scan_dir`, on its own thread: reads every file of
//! the directory, judges it (segment headers, where the live log starts,
//! packs, then log segments in id order) and hands each file with its
//! valid frames to the visiting thread. Everything but the visiting.

use std::path::Path;
use std::sync::Arc;
use std::sync::mpsc::{Receiver, SyncSender};

use crate::journal::error::JournalError;
use crate::journal::format::{
    FILE_HEADER_BYTES, FileId, HeaderProblem, PackHeader, SegmentHeader, pack_file_name,
    segment_file_name,
};
use crate::journal::storage::Storage;

use super::checked::{CheckedFile, hand_over};
use super::listing::{Listing, list_files, read_header, read_whole};
use super::walk::{SegmentPlace, check_pack, walk_segment};
use super::{Problem, ScanSummary, SegmentInfo};

/// The reading half of `scan_dir`: everything but the visiting.
pub(super) fn check_files(
    storage: &Arc<dyn Storage>,
    dir: &Path,
    salt: u64,
    checkpoint_seq: u64,
    out: SyncSender<CheckedFile>,
    spare: Receiver<Vec<u8>>,
) -> Result<ScanSummary, JournalError> {
    let listing = list_files(storage.as_ref(), dir)?;
    let mut check = Check {
        storage,
        dir,
        salt,
        checkpoint_seq,
        out,
        spare,
        summary: ScanSummary {
            checkpoint_seq,
            ..ScanSummary::default()
        },
    };
    let headers = check.segment_headers(&listing)?;
    if check.awaits_upgrade() {
        return Ok(check.summary);
    }
    let live_start = check.live_start(&headers);
    check.summary.last_seq = checkpoint_seq;
    if check.packs(&listing.packs)? {
        let last_id = listing.segments.last().copied();
        check.segments(&headers, live_start, last_id)?;
    }
    Ok(check.summary)
}

/// A directory being checked: where its files are, what they are checked
/// against, where checked files go, and what the check has found so far.
struct Check<'a> {
    storage: &'a Arc<dyn Storage>,
    dir: &'a Path,
    salt: u64,
    /// The newest checkpoint's sequence number (0: none).
    checkpoint_seq: u64,
    /// Checked files, to the visiting thread.
    out: SyncSender<CheckedFile>,
    /// Buffers the visiting thread is done with, for reuse.
    spare: Receiver<Vec<u8>>,
    summary: ScanSummary,
}

impl Check<'_> {
    /// Decodes every segment's header, to know where the live log starts.
    /// A format-1 header is noted for the upgrade, not reported; an
    /// incomplete header on the last segment is a rotation cut short, which
    /// holds nothing acknowledged; any other bad header is a problem, and
    /// its segment is left out of the log.
    fn segment_headers(
        &mut self,
        listing: &Listing,
    ) -> Result<Vec<(u64, SegmentHeader)>, JournalError> {
        let mut headers = Vec::new();
        let last_id = listing.segments.last().copied();
        for &id in &listing.segments {
            let path = self.dir.join(segment_file_name(id));
            let (header, len) = read_header(self.storage.as_ref(), self.dir, id)?;
            match SegmentHeader::decode(&header, self.salt, id) {
                Ok(h) => headers.push((id, h)),
                Err(HeaderProblem::OldVersion(_)) => self.summary.old_format_segments.push(id),
                Err(_) if Some(id) == last_id && len <= FILE_HEADER_BYTES as u64 => {
                    // A rotation cut short: nothing in it was acknowledged.
                    self.summary.torn_last_header = Some(id);
                    self.summary.file_bytes += len;
                    self.summary.last_segment_len = len;
                }
                Err(problem) => self.summary.problems.push(Problem::BadHeader {
                    path,
                    reason: problem.to_string(),
                }),
            }
        }
        Ok(headers)
    }

    /// Format 1 and no checkpoint: nothing more to check here, the upgrade
    /// reads these files. (Format-1 segments beside a checkpoint are what an
    /// upgrade cut short left behind; the checkpoint's files are checked.)
    fn awaits_upgrade(&self) -> bool {
        !self.summary.old_format_segments.is_empty() && self.checkpoint_seq == 0
    }

    /// The index in `headers` of the segment the live log starts at: the
    /// last one whose first record is at or before the one after the
    /// checkpoint; every segment before it holds only records the
    /// checkpoint covers. When even that segment starts later, the records
    /// in between are gone: a [`Problem::SequenceGap`].
    fn live_start(&mut self, headers: &[(u64, SegmentHeader)]) -> usize {
        let live_start = headers
            .iter()
            .rposition(|(_, h)| h.first_seq <= self.checkpoint_seq + 1)
            .unwrap_or(0);
        if let Some((id, h)) = headers.get(live_start)
            && h.first_seq > self.checkpoint_seq + 1
        {
            self.summary.problems.push(Problem::SequenceGap {
                segment_id: *id,
                expected_seq: self.checkpoint_seq + 1,
                found_seq: h.first_seq,
            });
        }
        live_start
    }

    /// Reads, checks and hands over every pack: payload records the
    /// checkpoint points at, intact or corrupt. A pack whose header is bad
    /// is a problem and is not walked. False when the visiting thread has
    /// stopped (it found a problem of its own): the check ends there.
    fn packs(&mut self, ids: &[u64]) -> Result<bool, JournalError> {
        for &id in ids {
            let path = self.dir.join(pack_file_name(id));
            let buf = self.read(&path)?;
            self.summary.file_bytes += buf.len() as u64;
            if let Err(problem) = PackHeader::decode(&buf, self.salt, id) {
                self.summary.problems.push(Problem::BadHeader {
                    path,
                    reason: problem.to_string(),
                });
                continue;
            }
            self.summary.packs.push((id, buf.len() as u64));
            let frames = check_pack(&mut self.summary, &buf, id, self.salt, self.checkpoint_seq);
            if !hand_over(&self.out, FileId::Pack(id), buf, frames) {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Reads, checks and hands over every log segment with a valid header,
    /// in id order; `last_id` is the newest segment listed, the only one
    /// whose damage can be a torn tail. Stops early when the visiting
    /// thread has.
    fn segments(
        &mut self,
        headers: &[(u64, SegmentHeader)],
        live_start: usize,
        last_id: Option<u64>,
    ) -> Result<(), JournalError> {
        // The sequence number the previous segment's next record would carry.
        let mut expect: Option<u64> = None;
        for (i, &(id, h)) in headers.iter().enumerate() {
            let place = SegmentPlace {
                id,
                first_seq: h.first_seq,
                live: i >= live_start,
                is_last: Some(id) == last_id,
            };
            let path = self.dir.join(segment_file_name(id));
            let buf = self.read(&path)?;
            self.summary.file_bytes += buf.len() as u64;
            self.summary.segments.push(SegmentInfo {
                id,
                first_seq: h.first_seq,
                file_bytes: buf.len() as u64,
                payload_only: !place.live,
            });
            if place.live && i > live_start {
                self.check_follows(headers[i - 1].0, expect, place, &path);
            }
            let walked = walk_segment(
                &mut self.summary,
                &buf,
                place,
                self.salt,
                self.checkpoint_seq,
            );
            expect = Some(walked.next_seq);
            if place.is_last {
                self.summary.last_segment_end = walked.end as u64;
                self.summary.last_segment_len = buf.len() as u64;
                self.summary.last_segment_next_seq = walked.next_seq;
            }
            if !hand_over(&self.out, FileId::Segment(id), buf, walked.frames) {
                break;
            }
        }
        Ok(())
    }

    /// Checks that a segment of the live log (at `place`, in `path`) follows
    /// the one before it, `prev_id`, whose next record would have been
    /// `expect`: no segment ids missing in between, and its first record the
    /// expected one. A later first record means records are gone; an
    /// earlier one, a header that overlaps records already seen.
    fn check_follows(
        &mut self,
        prev_id: u64,
        expect: Option<u64>,
        place: SegmentPlace,
        path: &Path,
    ) {
        if prev_id + 1 != place.id {
            self.summary.problems.push(Problem::MissingSegments {
                first: prev_id + 1,
                last: place.id - 1,
            });
        }
        if let Some(expected) = expect
            && place.first_seq != expected
        {
            self.summary.problems.push(if place.first_seq > expected {
                Problem::SequenceGap {
                    segment_id: place.id,
                    expected_seq: expected,
                    found_seq: place.first_seq,
                }
            } else {
                Problem::BadHeader {
                    path: path.to_path_buf(),
                    reason: format!(
                        "first sequence {} overlaps records already seen (next expected {expected})",
                        place.first_seq
                    ),
                }
            });
        }
    }

    /// Reads the whole file at `path` into a buffer the visiting thread gave
    /// back, or a new one.
    fn read(&self, path: &Path) -> Result<Vec<u8>, JournalError> {
        let mut buf = self.spare.try_recv().unwrap_or_default();
        read_whole(self.storage.as_ref(), path, &mut buf)?;
        Ok(buf)
    }
}
