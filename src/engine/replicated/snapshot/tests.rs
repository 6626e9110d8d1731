//! Snapshots end to end: built on a primary, streamed, received and
//! installed on a replica, then read back after a crash.

use std::path::Path;
use std::time::Duration;

use tokio::sync::oneshot;

use super::SnapshotInfo;
use crate::engine::replicated::testing::{self, raft_of_one};
use crate::engine::replicated::{LogRecord, StreamError};
use crate::engine::{Engine, EngineOptions, Origin, Replica, SendRequest};
use crate::journal::scan::list_files;
use crate::journal::sim::{SimStorage, Tear};
use crate::spool::Spool;
use crate::spool::queue::QueueSettings;
use crate::testing::text_message;

fn options(sim: &SimStorage, apply_up_to: u64) -> EngineOptions {
    testing::options(sim, 16 << 10, apply_up_to)
}

async fn send(engine: &Engine, i: usize) {
    let request = SendRequest {
        dedup_key: i.is_multiple_of(3).then(|| format!("key {i}")),
        ..text_message(format!("message {i} {}", "x".repeat(i % 700)))
    };
    engine.send("q", request).await.unwrap();
}

/// A primary with 300 messages, 250 acked, snapshotted twice (the
/// second time after openraft purged the log behind the first).
async fn primary(sim: &SimStorage) -> (Replica, SnapshotInfo) {
    let a = testing::open(options(sim, 0)).await;
    raft_of_one(&a, 1);
    a.start_serving(1).await.unwrap();
    let settings = QueueSettings {
        dedup_window_ms: 3_600_000,
        ..QueueSettings::default()
    };
    a.upsert_queue("q", settings, Origin::Api).await.unwrap();
    for i in 0..300 {
        send(&a, i).await;
    }
    // Most of them acked: the early segments are mostly garbage.
    for _ in 0..5 {
        let leased = a.receive("q", 50, Duration::ZERO).await.unwrap();
        for d in &leased {
            a.ack("q", &d.token).await.unwrap();
        }
    }
    let first = a.raft_log().build_snapshot().unwrap();
    a.raft_log().purge(first.seq, first.term);
    let segments_before = segment_count(sim);
    let second = a.raft_log().build_snapshot().unwrap();
    assert_eq!(second, first, "nothing applied in between");
    for i in 300..320 {
        send(&a, i).await;
    }
    let second = a.raft_log().build_snapshot().unwrap();
    assert!(
        segment_count(sim) < segments_before,
        "the purged log's segments went ({segments_before} before)"
    );
    (a, second)
}

fn segment_count(sim: &SimStorage) -> usize {
    let listing = list_files(sim, Path::new("/spool")).unwrap();
    listing.segments.len()
}

/// Every message of `q` with its payload, in id order.
async fn payloads(engine: &Engine) -> Vec<(u64, Vec<u8>)> {
    let mut all = Vec::new();
    loop {
        let got = engine.receive("q", 100, Duration::ZERO).await.unwrap();
        if got.is_empty() {
            break;
        }
        all.extend(got.into_iter().map(|d| (d.id.0, d.payload.body.to_vec())));
    }
    all.sort();
    all
}

#[tokio::test]
async fn a_snapshot_sent_to_a_replica_that_fell_behind_is_the_same_state_after_a_crash() {
    let sim_a = SimStorage::new();
    let (a, info) = primary(&sim_a).await;
    let expected = a.state().without_locations();

    // The replica holds an old log of its own, all before the snapshot.
    let sim_b = SimStorage::new();
    let b = testing::open(options(&sim_b, 0)).await;
    let old: Vec<LogRecord> = (1..=3).map(|seq| a_blank(seq, 1)).collect();
    append(&b, old).await;

    let source = a.raft_log().snapshot_source(info.seq).unwrap();
    let staged = b
        .raft_log()
        .receive_snapshot(
            info.seq,
            info.term,
            source.map(|m| m.map_err(StreamError::from)),
        )
        .unwrap();
    b.raft_log().install_snapshot(staged).await.unwrap();
    assert_eq!(b.state().without_locations(), expected);
    assert_eq!(
        b.raft_log().bounds(),
        (info.seq + 1, info.seq, Some(info.term))
    );
    assert_eq!(b.raft_log().purged(), Some((info.seq, info.term)));
    let listing = list_files(&sim_b, Path::new("/spool")).unwrap();
    assert_eq!(listing.checkpoints, vec![info.seq]);
    assert!(listing.segments.is_empty(), "the old log is gone");

    // Power lost before the log went on: the checkpoint is the spool.
    sim_b.crash(Tear::DropUnsynced);
    drop(b);
    let b = testing::open(options(&sim_b, u64::MAX)).await;
    assert_eq!(b.state().without_locations(), expected);
    assert_eq!(b.raft_log().purged(), Some((info.seq, info.term)));

    // It becomes the primary: the log goes on after the snapshot, and
    // every payload is there.
    raft_of_one(&b, 2);
    b.start_serving(2).await.unwrap();
    send(&b, 1000).await;
    let mut on_a = payloads(&a).await;
    let on_b = payloads(&b).await;
    assert_eq!(on_b.len(), on_a.len() + 1);
    on_a.push(on_b.last().unwrap().clone());
    assert_eq!(on_b, on_a);

    // And once more after a crash.
    let state = b.state().without_locations();
    sim_b.crash(Tear::DropUnsynced);
    drop(b);
    let b = testing::open(options(&sim_b, u64::MAX)).await;
    assert_eq!(b.state().without_locations(), state);
    b.close();
    a.close();
}

#[tokio::test]
async fn a_replica_whose_log_goes_on_past_the_snapshot_keeps_that_log() {
    let sim_a = SimStorage::new();
    let (a, info) = primary(&sim_a).await;
    let expected = a.state().without_locations();
    for i in 400..410 {
        send(&a, i).await;
    }
    // The replica has the primary's records up to the end of the log,
    // but has applied none of them.
    let sim_b = SimStorage::new();
    let b = testing::open(options(&sim_b, 0)).await;
    let (first, last, _) = a.raft_log().bounds();
    assert!(first <= info.seq && info.seq < last);
    let blanks: Vec<LogRecord> = (1..first).map(|seq| a_blank(seq, 1)).collect();
    append(&b, blanks).await;
    let records: Vec<LogRecord> = (first..=last)
        .map(|seq| a.raft_log().read(seq).unwrap().unwrap())
        .collect();
    append(&b, records).await;

    let source = a.raft_log().snapshot_source(info.seq).unwrap();
    let staged = b
        .raft_log()
        .receive_snapshot(
            info.seq,
            info.term,
            source.map(|m| m.map_err(StreamError::from)),
        )
        .unwrap();
    b.raft_log().install_snapshot(staged).await.unwrap();
    assert_eq!(b.state().without_locations(), expected);
    assert_eq!(b.raft_log().bounds().0, info.seq + 1);
    assert_eq!(b.raft_log().bounds().1, last);
    for seq in info.seq + 1..=last {
        assert_eq!(
            b.raft_log().read(seq).unwrap(),
            a.raft_log().read(seq).unwrap()
        );
    }
    sim_b.crash(Tear::DropUnsynced);
    drop(b);
    let b = testing::open(options(&sim_b, last)).await;
    assert_eq!(b.state().without_locations(), a.state().without_locations());
    b.close();
    a.close();
}

#[tokio::test]
async fn a_snapshot_cut_short_or_damaged_changes_nothing() {
    let sim_a = SimStorage::new();
    let (a, info) = primary(&sim_a).await;
    let sim_b = SimStorage::new();
    let b = testing::open(options(&sim_b, 0)).await;
    let all: Vec<_> = a.raft_log().snapshot_source(info.seq).unwrap().collect();
    let n = all.len();
    for cut in [1, n / 2, n - 1] {
        let part = all[..cut].iter().map(|m| Ok(m.as_ref().unwrap().clone()));
        assert!(
            b.raft_log()
                .receive_snapshot(info.seq, info.term, part)
                .is_err(),
            "cut at {cut}"
        );
    }
    let mut damaged: Vec<_> = all.iter().map(|m| m.as_ref().unwrap().clone()).collect();
    damaged[0][5] ^= 1;
    assert!(
        b.raft_log()
            .receive_snapshot(info.seq, info.term, damaged.into_iter().map(Ok))
            .is_err()
    );
    let wrong = all.iter().map(|m| Ok(m.as_ref().unwrap().clone()));
    assert!(
        b.raft_log()
            .receive_snapshot(info.seq + 1, info.term, wrong)
            .is_err()
    );
    // Nothing staged is left behind.
    let listing = list_files(&sim_b, Path::new("/spool")).unwrap();
    assert!(listing.packs.is_empty() && listing.checkpoints.is_empty());
    assert_eq!(b.state(), Spool::new().state());
    b.close();
    a.close();
}

fn a_blank(seq: u64, term: u64) -> LogRecord {
    let mut body = Vec::new();
    crate::spool::Record {
        at: 0,
        command: crate::spool::Command::RaftBlank,
    }
    .encode(None, &mut body);
    LogRecord {
        seq,
        term,
        kind: crate::spool::record::kind::RAFT_BLANK,
        body,
    }
}

async fn append(engine: &Replica, records: Vec<LogRecord>) {
    let (tx, rx) = oneshot::channel();
    let done = Box::new(move |r: std::io::Result<()>| {
        let _ = tx.send(r.is_ok());
    });
    engine.raft_log().append(records, done).unwrap();
    assert!(rx.await.unwrap());
}
