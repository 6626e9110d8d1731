//! Scanning a directory on two threads: a helper thread reads and checks
//! each file (`check`) while the calling thread hands its records to the
//! visitor, so the copy out of the page cache and the checksums overlap
//! with applying.

use std::path::Path;
use std::sync::Arc;

use crate::journal::error::JournalError;
use crate::journal::format::FRAME_HEADER_BYTES;
use crate::journal::storage::Storage;

use super::check::check_files;
use super::checked::CheckedFile;
use super::{ScanSummary, ScannedRecord};

/// Scans every pack and log segment of `dir`, handing each valid record to
/// `visit`; records after `checkpoint_seq` (the newest checkpoint's, 0 for
/// none) are flagged to be applied. A visitor error stops the scan and is
/// returned as is.
pub fn scan_dir(
    storage: &Arc<dyn Storage>,
    dir: &Path,
    salt: u64,
    checkpoint_seq: u64,
    mut visit: impl FnMut(ScannedRecord<'_>) -> Result<(), JournalError>,
) -> Result<ScanSummary, JournalError> {
    // A helper thread reads and checks file N+1 (the copy out of the page
    // cache and the checksums are half the work) while this one hands file
    // N's records to `visit`. At most two buffers exist: the one being
    // visited and the one being filled; buffers go back for reuse.
    let (files_tx, files_rx) = std::sync::mpsc::sync_channel::<CheckedFile>(0);
    let (spare_tx, spare_rx) = std::sync::mpsc::channel::<Vec<u8>>();
    std::thread::scope(|scope| {
        let reader = std::thread::Builder::new()
            .name("journal-scan".into())
            .spawn_scoped(scope, || {
                check_files(storage, dir, salt, checkpoint_seq, files_tx, spare_rx)
            })
            .map_err(|e| JournalError::io(dir, e))?;
        let visited = files_rx.iter().try_for_each(|file| {
            for (i, frame) in file.frames.iter().enumerate() {
                if let Some(ahead) = file.frames.get(i + PREFETCH_FRAMES_AHEAD) {
                    prefetch(&file.buf[ahead.offset..ahead.end]);
                }
                let body = &file.buf[frame.offset + FRAME_HEADER_BYTES..frame.end];
                visit(ScannedRecord {
                    file: file.id,
                    offset: frame.offset as u64,
                    seq: frame.seq,
                    term: frame.term,
                    kind: frame.kind,
                    body,
                    applies: frame.applies,
                    frame_len: (frame.end - frame.offset) as u64,
                })?;
            }
            let _ = spare_tx.send(file.buf);
            Ok(())
        });
        // On a visitor's error the reader finds the channel closed and stops.
        drop(files_rx);
        let checked = reader.join().expect("journal-scan thread panicked");
        visited.and(checked)
    })
}

/// The buffer was filled on another core and is larger than the caches:
/// without a hint, the first read of each record waits for memory.
const PREFETCH_FRAMES_AHEAD: usize = 4;

/// Asks the CPU to load the first two cache lines of `frame` (its header and
/// the start of its body, where the fields a visitor decodes are).
#[inline]
#[allow(unsafe_code)]
fn prefetch(frame: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    for line in frame.chunks(64).take(2) {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        // SAFETY:
        // - a prefetch is only a hint: it never faults, reads nothing into
        //   the program and writes nothing;
        // - the pointer is inside `frame` all the same.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(line.as_ptr().cast()) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = frame;
}
