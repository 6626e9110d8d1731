//! The recovery table of `docs/journal-format.md`, row by row: what replay
//! and `verify` do with torn tails, flipped bits, damaged headers, missing
//! segments and a lost identity file.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::common::*;
use spoold::cli::journal::verify_with;
use spoold::engine::Engine;
use spoold::spool::QueueSettings;
use spoold::testing::JournalError;
use spoold::testing::Storage;
use spoold::testing::scan_dir;
use spoold::testing::{FILE_HEADER_BYTES, FileId, segment_file_name};
use spoold::testing::{SimStorage, Tear};
use spoold::testing::{SpoolIdentity, load_identity};
use spoold::time::ManualClock;

/// A stopped spool on simulated storage with `n` messages in queue `q`.
async fn spool_with(n: usize, segment_bytes: u64) -> (SimStorage, ManualClock) {
    let (sim, clock, engine) = sent(n, segment_bytes).await;
    drop(engine);
    sim.crash(Tear::DropUnsynced);
    (sim, clock)
}

fn segment_path(id: u64) -> PathBuf {
    sim_dir().join(segment_file_name(id))
}

/// Changes segment `seg`'s bytes in place.
fn edit_segment(sim: &SimStorage, seg: u64, edit: impl FnOnce(&mut Vec<u8>)) {
    let path = segment_path(seg);
    let mut bytes = sim.file_bytes(&path).unwrap();
    edit(&mut bytes);
    sim.set_file_bytes(&path, bytes);
}

/// Makes `records` (offset, length) of segment `seg` one group-commit
/// batch and zeroes the middle one: a hole in that batch. Its offset.
fn hole_in_a_batch(sim: &SimStorage, seg: u64, records: &[(u64, u64)]) -> u64 {
    let (hole, len) = records[1];
    edit_segment(sim, seg, |bytes| {
        rebatch(bytes, records, salt_of(sim));
        bytes[hole as usize..(hole + len) as usize].fill(0);
    });
    hole
}

/// (segment id, frame offset, frame length) of every record, in order.
fn records(sim: &SimStorage) -> Vec<(u64, u64, u64)> {
    let storage: Arc<dyn Storage> = Arc::new(sim.clone());
    let identity = load_identity(&storage, &sim_dir(), false).unwrap().unwrap();
    let mut out = Vec::new();
    scan_dir(&storage, &sim_dir(), identity.salt, 0, |r| {
        let FileId::Segment(id) = r.file else {
            panic!("a pack in a spool that was never compacted");
        };
        out.push((id, r.offset, r.frame_len));
        Ok(())
    })
    .unwrap();
    out
}

fn verify(sim: &SimStorage) -> spoold::cli::journal::VerifyReport {
    verify_with(Arc::new(sim.clone()), &sim_dir()).unwrap()
}

async fn open_err(sim: &SimStorage, clock: &ManualClock) -> JournalError {
    match open(sim, clock).await {
        Ok(_) => panic!("replay accepted a damaged journal"),
        Err(e) => e,
    }
}

#[tokio::test]
async fn a_torn_tail_at_every_offset_of_the_last_record_is_truncated() {
    let (sim, clock) = spool_with(3, 64 << 20).await;
    let all = records(&sim);
    let &(seg, last_off, last_len) = all.last().unwrap();
    let path = segment_path(seg);
    let whole = sim.file_bytes(&path).unwrap();
    assert_eq!(whole.len() as u64, last_off + last_len);
    for cut in last_off + 1..last_off + last_len {
        let torn = SimStorage::new();
        for name in sim.list(&sim_dir()).unwrap() {
            let p = sim_dir().join(&name);
            torn.set_file_bytes(&p, sim.file_bytes(&p).unwrap());
        }
        torn.set_file_bytes(&path, whole[..cut as usize].to_vec());
        let report = verify(&torn);
        assert!(
            report.is_clean(),
            "cut at {cut}: {}",
            report.render(&sim_dir())
        );
        assert_eq!(report.summary.torn_tail.unwrap().offset, last_off);

        // The torn record is gone, the two before it stay, and the spool
        // writes on from the cut.
        writes_on_after(&torn, &clock, 2, &format!("cut at {cut}")).await;
    }
}

/// Opens the spool, which holds `messages` messages, and writes on: a send
/// after the recovery survives a crash of its own.
async fn writes_on_after(sim: &SimStorage, clock: &ManualClock, messages: usize, case: &str) {
    let engine = open(sim, clock)
        .await
        .unwrap_or_else(|e| panic!("{case}: {e}"));
    assert_eq!(engine.all_messages().len(), messages, "{case}");
    engine.send("q", body("after")).await.unwrap();
    drop(engine);
    sim.crash(Tear::DropUnsynced);
    let reopened = open(sim, clock).await.unwrap();
    assert_eq!(reopened.all_messages().len(), messages + 1, "{case}");
}

#[tokio::test]
async fn a_torn_message_record_was_never_acknowledged_and_disappears() {
    let sim = SimStorage::new();
    let clock = ManualClock::new(START_MS);
    let engine = open(&sim, &clock).await.unwrap();
    make_queue(&engine, "q", QueueSettings::default()).await;
    engine.send("q", body("acknowledged")).await.unwrap();
    // The next write lands only partly before the "power cut".
    sim.set_sync_delay(Some(Duration::from_millis(200)));
    let pending =
        tokio::time::timeout(Duration::from_millis(50), engine.send("q", body("torn"))).await;
    assert!(pending.is_err(), "not answered before its fsync");
    sim.crash(Tear::KeepPrefix(25));
    drop(engine);
    let engine = open(&sim, &clock).await.unwrap();
    let bodies: Vec<Vec<u8>> = engine
        .receive("q", 10, Duration::ZERO)
        .await
        .unwrap()
        .into_iter()
        .map(|d| d.payload.body.to_vec())
        .collect();
    assert_eq!(bodies, vec![b"acknowledged".to_vec()]);
}

#[tokio::test]
async fn a_flipped_bit_before_good_records_refuses_start_naming_file_and_offset() {
    let (sim, clock) = spool_with(5, 64 << 20).await;
    let all = records(&sim);
    let (seg, off, _) = all[3];
    edit_segment(&sim, seg, |bytes| bytes[off as usize + 30] ^= 0x04);

    let err = open_err(&sim, &clock).await;
    let text = err.to_string();
    assert!(matches!(err, JournalError::Corrupt { .. }), "{text}");
    assert!(text.contains(&segment_file_name(seg)), "{text}");
    assert!(text.contains(&format!("offset {off}")), "{text}");

    let report = verify(&sim);
    assert!(!report.is_clean());
    assert_eq!(
        report.summary.problems.len(),
        1,
        "one bad span, then resync"
    );
    assert_eq!(report.summary.records as usize, all.len() - 1);
    assert!(report.render(&sim_dir()).contains(&format!("offset {off}")));
}

#[tokio::test]
async fn every_bad_span_is_reported() {
    let (sim, _clock) = spool_with(8, 64 << 20).await;
    let all = records(&sim);
    edit_segment(&sim, all[0].0, |bytes| {
        for i in [2, 5] {
            bytes[all[i].1 as usize + 10] ^= 0xff;
        }
    });
    let report = verify(&sim);
    assert_eq!(
        report.summary.problems.len(),
        2,
        "{}",
        report.render(&sim_dir())
    );
    assert_eq!(report.summary.records as usize, all.len() - 2);
}

#[tokio::test]
async fn a_truncated_header_of_the_last_segment_is_an_unfinished_rotation() {
    let (sim, clock) = spool_with(3, 64 << 20).await;
    let last = sim
        .list(&sim_dir())
        .unwrap()
        .into_iter()
        .filter(|n| n.ends_with(".seg"))
        .max()
        .unwrap();
    let next_id = u64::from_str_radix(last.trim_end_matches(".seg"), 16).unwrap() + 1;
    // A new segment whose header write was cut short.
    sim.set_file_bytes(&segment_path(next_id), vec![b'S', b'P', b'O', b'O']);
    assert!(verify(&sim).is_clean());
    let engine = open(&sim, &clock).await.unwrap();
    assert_eq!(engine.all_messages().len(), 3);
    engine.send("q", body("more")).await.unwrap();
}

#[tokio::test]
async fn a_truncated_header_of_an_earlier_segment_refuses_start() {
    let (sim, clock) = spool_with(40, 4096).await;
    let ids: Vec<u64> = {
        let mut v: Vec<u64> = records(&sim).iter().map(|r| r.0).collect();
        v.dedup();
        v
    };
    assert!(ids.len() >= 3, "need several segments, got {ids:?}");
    let victim = segment_path(ids[1]);
    let bytes = sim.file_bytes(&victim).unwrap();
    sim.set_file_bytes(&victim, bytes[..FILE_HEADER_BYTES / 2].to_vec());
    let text = open_err(&sim, &clock).await.to_string();
    assert!(text.contains(&segment_file_name(ids[1])), "{text}");
    assert!(!verify(&sim).is_clean());
}

#[tokio::test]
async fn a_missing_middle_segment_refuses_start() {
    let (sim, clock) = spool_with(40, 4096).await;
    let mut ids: Vec<u64> = records(&sim).iter().map(|r| r.0).collect();
    ids.dedup();
    sim.remove(&segment_path(ids[1])).unwrap();
    let text = open_err(&sim, &clock).await.to_string();
    assert!(text.contains("missing"), "{text}");
    assert!(!verify(&sim).is_clean());
}

#[tokio::test]
async fn a_sealed_segment_that_lost_its_end_refuses_start() {
    let (sim, clock) = spool_with(40, 4096).await;
    let all = records(&sim);
    let first_seg = all[0].0;
    let last_of_first = all.iter().rfind(|r| r.0 == first_seg).unwrap();
    let path = segment_path(first_seg);
    let bytes = sim.file_bytes(&path).unwrap();
    // Cut exactly at a record boundary: no torn frame, but records are gone.
    sim.set_file_bytes(&path, bytes[..last_of_first.1 as usize].to_vec());
    let text = open_err(&sim, &clock).await.to_string();
    assert!(text.contains("missing"), "{text}");
}

#[tokio::test]
async fn a_segment_of_another_spool_never_replays() {
    let (sim, clock) = spool_with(2, 64 << 20).await;
    let (other, _) = spool_with(2, 64 << 20).await;
    let path = segment_path(1);
    sim.set_file_bytes(&path, other.file_bytes(&path).unwrap());
    let text = open_err(&sim, &clock).await.to_string();
    assert!(text.contains("another spool"), "{text}");
}

#[tokio::test]
async fn a_lost_identity_file_refuses_start() {
    let (sim, clock) = spool_with(1, 64 << 20).await;
    sim.remove(&sim_dir().join("spool.meta")).unwrap();
    sim.sync_dir(&sim_dir()).unwrap();
    let err = open_err(&sim, &clock).await;
    assert!(matches!(err, JournalError::BadMeta { .. }), "{err}");
}

#[tokio::test]
async fn an_empty_or_missing_spool_verifies_clean() {
    let sim = SimStorage::new();
    assert!(verify(&sim).is_clean());
    let dir = tempfile::tempdir().unwrap();
    let report = spoold::cli::journal::verify(dir.path()).unwrap();
    assert!(report.is_clean());
    let _ = SpoolIdentity::generate();
}

/// An open spool with queue `q` holding `n` messages of 158 bytes.
async fn sent(n: usize, segment_bytes: u64) -> (SimStorage, ManualClock, Engine) {
    let sim = SimStorage::new();
    let clock = ManualClock::new(START_MS);
    let mut options = sim_options(&sim, &clock);
    options.segment_bytes = segment_bytes;
    let (engine, _) = Engine::open(options).await.unwrap();
    make_queue(&engine, "q", QueueSettings::default()).await;
    for i in 0..n {
        engine
            .send("q", body(&format!("message {i:0>150}")))
            .await
            .unwrap();
    }
    (sim, clock, engine)
}

/// A stopped spool of `n` messages on tiny segments, with every other
/// message acked (so compaction has garbage), and the ids still there.
async fn spool_with_garbage(n: usize) -> (SimStorage, ManualClock, Vec<spoold::spool::MessageId>) {
    let (sim, clock, engine) = sent(n, 2048).await;
    let got = engine.receive("q", 100, Duration::ZERO).await.unwrap();
    for d in got.iter().step_by(2) {
        engine.ack("q", &d.token).await.unwrap();
    }
    for d in got.iter().skip(1).step_by(2) {
        engine.nack("q", &d.token, 0).await.unwrap();
    }
    let mut ids: Vec<_> = engine.all_messages().into_iter().map(|m| m.1).collect();
    ids.sort();
    drop(engine);
    sim.crash(Tear::DropUnsynced);
    (sim, clock, ids)
}

async fn assert_messages(
    sim: &SimStorage,
    clock: &ManualClock,
    expected: &[spoold::spool::MessageId],
) {
    let engine = open(sim, clock).await.unwrap();
    let mut ids: Vec<_> = engine.all_messages().into_iter().map(|m| m.1).collect();
    ids.sort();
    assert_eq!(ids, expected, "every message once, none twice");
    let got = engine.receive("q", 100, Duration::ZERO).await.unwrap();
    assert_eq!(got.len(), expected.len(), "every payload still reads back");
}

/// The state as compaction must leave it: everything but record locations
/// (which compaction changes) and the epoch (which every start raises).
fn comparable(engine: &Engine) -> spoold::spool::SpoolState {
    spoold::spool::SpoolState {
        epoch: 0,
        ..engine.state().without_locations()
    }
}

/// Compaction cut off by a power loss after each of its changes to the
/// disk in turn (the pack's temp file, its fsync, its rename, the
/// directory fsync, the checkpoint's, the deletions), with the unsynced
/// bytes dropped or torn into pages: every restart shows exactly the state
/// before compaction, every payload reads back, and the next compaction
/// finishes the job.
#[tokio::test]
async fn compaction_cut_at_every_step_loses_and_resurrects_nothing() {
    let mut cut = 0;
    loop {
        for tear in [
            Tear::DropUnsynced,
            Tear::Pages {
                page_bytes: 512,
                mask: 0x5555_5555_5555_5555,
            },
        ] {
            let (sim, clock, ids) = spool_with_garbage(30).await;
            let mut options = sim_options(&sim, &clock);
            options.segment_bytes = 2048;
            let (engine, _) = Engine::open(options.clone()).await.unwrap();
            let before = comparable(&engine);
            sim.cut_power_after(cut);
            let outcome = engine.compact_all(true).await;
            let finished = !sim.power_is_cut();
            drop(engine);
            sim.crash(tear);
            let (engine, _) = Engine::open(options.clone())
                .await
                .unwrap_or_else(|e| panic!("cut after {cut} changes: {e}"));
            assert_eq!(comparable(&engine), before, "cut after {cut} changes");
            drop(engine);
            assert_messages(&sim, &clock, &ids).await;
            let (engine, _) = Engine::open(options).await.unwrap();
            engine.compact_all(true).await.unwrap();
            assert_eq!(
                comparable(&engine),
                before,
                "compacted after a cut at {cut}"
            );
            drop(engine);
            sim.crash(Tear::DropUnsynced);
            assert_messages(&sim, &clock, &ids).await;
            if finished {
                outcome.unwrap();
                assert!(cut > 5, "a compaction takes several steps");
                return;
            }
        }
        cut += 1;
    }
}

#[tokio::test]
async fn compaction_really_drops_garbage_and_keeps_counts() {
    let (sim, clock, ids) = spool_with_garbage(30).await;
    let mut options = sim_options(&sim, &clock);
    options.segment_bytes = 2048;
    let (engine, _) = Engine::open(options.clone()).await.unwrap();
    let before = engine.journal_bytes();
    let reports = engine.compact_all(true).await.unwrap();
    assert!(!reports.is_empty());
    assert!(
        engine.journal_bytes() < before,
        "{} !< {before}",
        engine.journal_bytes()
    );
    drop(engine);
    sim.crash(Tear::DropUnsynced);
    assert_messages(&sim, &clock, &ids).await;
    let engine = open(&sim, &clock).await.unwrap();
    let retried: Vec<u32> = engine
        .all_messages()
        .iter()
        .map(|m| m.2.retry_count)
        .collect();
    assert!(
        retried.iter().all(|&r| r == 1),
        "retry counts survive compaction: {retried:?}"
    );
}

#[tokio::test]
async fn repair_quarantines_the_bad_span_and_keeps_every_good_record() {
    let (sim, clock) = spool_with(20, 64 << 20).await;
    let all = records(&sim);
    let (seg, off, len) = all[7];
    let mut bad = Vec::new();
    edit_segment(&sim, seg, |bytes| {
        bytes[off as usize + 40] ^= 0x20;
        bad = bytes[off as usize..(off + len) as usize].to_vec();
    });
    assert!(open(&sim, &clock).await.is_err(), "refuses by default");

    let storage: Arc<dyn Storage> = Arc::new(sim.clone());
    let identity = load_identity(&storage, &sim_dir(), false).unwrap().unwrap();
    let report = spoold::testing::repair(&storage, &sim_dir(), &identity).unwrap();
    assert_eq!(report.quarantined.len(), 1, "{report:?}");
    let (qfile, qlen) = &report.quarantined[0];
    assert_eq!(*qlen, len);
    assert_eq!(
        sim.file_bytes(qfile).unwrap(),
        bad,
        "the bad bytes are kept aside"
    );
    assert!(verify(&sim).is_clean());
    let engine = open(&sim, &clock).await.unwrap();
    // Records 0..=1 set up the queue and epoch; record 7 was message 5.
    assert_eq!(engine.all_messages().len(), 19);
    let identity_after = load_identity(&storage, &sim_dir(), false).unwrap();
    assert!(identity_after.is_some(), "identity survives repair");
}

#[tokio::test]
async fn on_corruption_quarantine_starts_anyway_and_repairs_gaps() {
    let (sim, clock) = spool_with(40, 4096).await;
    let mut ids: Vec<u64> = records(&sim).iter().map(|r| r.0).collect();
    ids.dedup();
    // A flipped bit in one message record and a whole segment missing.
    let all = records(&sim);
    let in_missing = all.iter().filter(|r| r.0 == ids[2] && r.2 > 150).count();
    let (seg, off, _) = all[3];
    edit_segment(&sim, seg, |bytes| bytes[off as usize + 30] ^= 1);
    sim.remove(&segment_path(ids[2])).unwrap();
    sim.sync_dir(&sim_dir()).unwrap();
    assert!(open(&sim, &clock).await.is_err());

    let mut options = sim_options(&sim, &clock);
    options.quarantine_corruption = true;
    let (engine, _) = Engine::open(options).await.expect("starts with quarantine");
    let n = engine.all_messages().len();
    assert_eq!(
        n,
        40 - 1 - in_missing,
        "lost only the damaged record and the missing segment"
    );
    drop(engine);
    sim.crash(Tear::DropUnsynced);
    assert!(
        verify(&sim).is_clean(),
        "{}",
        verify(&sim).render(&sim_dir())
    );
    assert_eq!(open(&sim, &clock).await.unwrap().all_messages().len(), n);
}

/// Re-seals the frames at `places` of `bytes` as one group-commit batch
/// (indexes 0, 1, …, the last flagged), as the writer frames a batch of
/// several records.
fn rebatch(bytes: &mut [u8], places: &[(u64, u64)], salt: u64) {
    use spoold::testing::{FRAME_FLAG_BATCH_END, FrameHeader};
    for (i, &(off, len)) in places.iter().enumerate() {
        let frame = &mut bytes[off as usize..(off + len) as usize];
        let h = FrameHeader::peek(frame);
        FrameHeader::seal(
            frame,
            salt,
            FrameHeader {
                flags: if i + 1 == places.len() {
                    FRAME_FLAG_BATCH_END
                } else {
                    0
                },
                batch_index: i as u32,
                ..h
            },
        );
    }
}

fn salt_of(sim: &SimStorage) -> u64 {
    let storage: Arc<dyn Storage> = Arc::new(sim.clone());
    load_identity(&storage, &sim_dir(), false)
        .unwrap()
        .unwrap()
        .salt
}

/// A power loss while the last group commit was being written can leave
/// any subset of its pages: here its middle record is lost while its last
/// one reached the disk. That batch was never acknowledged (its fsync never
/// returned): a torn tail, cleared from the hole on.
#[tokio::test]
async fn a_hole_in_the_last_batch_is_a_torn_tail() {
    let (sim, clock) = spool_with(6, 64 << 20).await;
    let all = records(&sim);
    let last3: Vec<(u64, u64)> = all[all.len() - 3..].iter().map(|r| (r.1, r.2)).collect();
    let hole = hole_in_a_batch(&sim, all[0].0, &last3);

    let report = verify(&sim);
    assert!(report.is_clean(), "{}", report.render(&sim_dir()));
    assert_eq!(report.summary.torn_tail.unwrap().offset, hole);
    // Six messages; the batch's first record stays, the other two go.
    writes_on_after(&sim, &clock, 4, "a hole in the last batch").await;
}

/// The same hole in a batch that a later, complete batch follows is
/// corruption: that batch's fsync had returned before the next was written.
#[tokio::test]
async fn a_hole_in_an_earlier_batch_is_corruption() {
    let (sim, clock) = spool_with(6, 64 << 20).await;
    let all = records(&sim);
    let n = all.len();
    let earlier: Vec<(u64, u64)> = all[n - 4..n - 1].iter().map(|r| (r.1, r.2)).collect();
    let hole = hole_in_a_batch(&sim, all[0].0, &earlier);

    let report = verify(&sim);
    assert!(!report.is_clean());
    let text = open_err(&sim, &clock).await.to_string();
    assert!(text.contains(&format!("offset {hole}")), "{text}");
}
