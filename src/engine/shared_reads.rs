//! The payloads of the last large records read, kept decoded: an event's
//! record lists every delivery beside its one payload (kind 18,
//! docs/journal-format.md), so each of its N deliveries read and checked a
//! record that grows with N. With 10 000 subscribers that was 170 KB read
//! and decoded per delivery, and a delivery's cost grew with the number of
//! endpoints (issue 43). Now the first read of such a record decodes its
//! payload once, and the next deliveries of the event clone it (the body
//! is shared `Bytes`).
//!
//! Only records of at least [`LARGE_RECORD_BYTES`] are looked up, so the
//! path of an ordinary message is untouched. The bound is
//! [`KEPT_RECORDS`] payloads and [`KEPT_BYTES`] of their bodies: the
//! oldest goes first, and a body larger than that alone is not kept.
//!
//! A location names one record only while its file is the same file: the
//! entry holds a weak handle on the file it was read from, so that a file
//! deleted by compaction is closed as usual, and an entry matches only a
//! read through that same handle (its allocation cannot be reused while the
//! weak handle lives).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, Weak};

use crate::journal::RecordLoc;
use crate::journal::storage::StorageFile;
use crate::spool::Payload;

/// Records from this size up are looked up and kept.
pub(super) const LARGE_RECORD_BYTES: u32 = 16 << 10;

/// How many decoded payloads are kept.
pub(super) const KEPT_RECORDS: usize = 16;

/// How many bytes of bodies they may hold together.
pub(super) const KEPT_BYTES: usize = 32 << 20;

struct Kept {
    file: Weak<dyn StorageFile>,
    loc: RecordLoc,
    payload: Payload,
}

/// The last [`KEPT_RECORDS`] large records' payloads.
#[derive(Default)]
pub(super) struct SharedReads {
    kept: Mutex<VecDeque<Kept>>,
}

impl SharedReads {
    /// The payload of the record at `loc` in `file`, if kept.
    pub(super) fn get(&self, file: &Arc<dyn StorageFile>, loc: RecordLoc) -> Option<Payload> {
        let kept = self.kept.lock().expect("shared reads lock poisoned");
        let hit = kept
            .iter()
            .find(|k| k.loc == loc && std::ptr::addr_eq(k.file.as_ptr(), Arc::as_ptr(file)))
            .map(|k| k.payload.clone());
        crate::metrics::record_shared_read(hit.is_some());
        hit
    }

    /// Keeps the payload of the record at `loc` in `file`, the oldest kept
    /// going past the bounds.
    pub(super) fn keep(&self, file: &Arc<dyn StorageFile>, loc: RecordLoc, payload: &Payload) {
        if payload.body.len() > KEPT_BYTES {
            return;
        }
        let mut kept = self.kept.lock().expect("shared reads lock poisoned");
        let bytes =
            |kept: &VecDeque<Kept>| kept.iter().map(|k| k.payload.body.len()).sum::<usize>();
        while kept.len() >= KEPT_RECORDS || bytes(&kept) + payload.body.len() > KEPT_BYTES {
            kept.pop_front();
        }
        kept.push_back(Kept {
            file: Arc::downgrade(file),
            loc,
            payload: payload.clone(),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::journal::sim::SimStorage;
    use crate::journal::storage::Storage;

    fn payload(n: u8) -> Payload {
        crate::testing::text_message(format!("event {n}")).payload
    }

    #[test]
    fn kept_by_file_and_location_the_oldest_going_past_the_bound() {
        let storage = SimStorage::new();
        storage.create_dir_all(std::path::Path::new("/")).unwrap();
        let a = storage.create(std::path::Path::new("/a")).unwrap();
        let b = storage.create(std::path::Path::new("/b")).unwrap();
        let loc = |offset| RecordLoc {
            file: 1,
            offset,
            len: LARGE_RECORD_BYTES,
        };
        let reads = SharedReads::default();
        reads.keep(&a, loc(0), &payload(0));
        assert_eq!(reads.get(&a, loc(0)).unwrap().body, payload(0).body);
        assert!(reads.get(&b, loc(0)).is_none(), "another file's record");
        assert!(reads.get(&a, loc(64)).is_none(), "another location");
        for n in 1..=KEPT_RECORDS as u32 {
            reads.keep(&a, loc(n * 64), &payload(n as u8));
        }
        assert!(reads.get(&a, loc(0)).is_none(), "the oldest went first");
        let last = KEPT_RECORDS as u32 * 64;
        assert!(reads.get(&a, loc(last)).is_some());
        assert_eq!(
            reads.kept.lock().unwrap().len(),
            KEPT_RECORDS,
            "never past the bound"
        );
    }
}
