//! The engine end to end on the fault-injecting storage: the promise
//! (nothing answered before its fsync), group commit, rollback and
//! poisoning, restarts and epochs, long polls, and cancelled callers.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use crate::common::*;
use spoold::engine::{MessageError, Origin, SendError, SendRequest, SettleError, WriteError};
use spoold::spool::{DeadLetterFilter, Payload, QueueSettings, StoredRequest};
use spoold::testing::{SimStorage, Tear};
use spoold::time::ManualClock;

#[tokio::test]
async fn send_receive_ack_reads_the_payload_back_from_disk() {
    let sim = SimStorage::new();
    let clock = ManualClock::new(START_MS);
    let engine = open(&sim, &clock).await.unwrap();
    make_queue(&engine, "q", QueueSettings::default()).await;
    let request = SendRequest {
        payload: Payload {
            content_type: "application/json".into(),
            request: Some(StoredRequest {
                method: "PUT".into(),
                path: "/a/b".into(),
                query: "x=1".into(),
                headers: vec![("X-Trace".into(), "t1".into())],
            }),
            event: None,
            resent_from: None,
            trace: None,
            hops: 0,
            ordering_key: Some("acct-1".into()),
            body: b"{\"n\":1}".to_vec().into(),
        },
        ..SendRequest::default()
    };
    let sent = engine.send("q", request.clone()).await.unwrap();
    assert!(!sent.deduplicated);
    let got = engine.receive("q", 10, Duration::ZERO).await.unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].id, sent.id);
    assert_eq!(got[0].payload, request.payload);
    assert_eq!(got[0].retry_count, 0);
    engine.ack("q", &got[0].token).await.unwrap();
    assert!(matches!(
        engine.ack("q", &got[0].token).await,
        Err(SettleError::StaleLease)
    ));
    assert!(matches!(
        engine.ack("q", "garbage").await,
        Err(SettleError::BadToken)
    ));
    let stats = engine.stats("q").unwrap();
    assert_eq!((stats.counters.sent, stats.counters.acked), (1, 1));
}

#[tokio::test]
async fn nothing_is_answered_before_its_fsync() {
    let sim = SimStorage::new();
    let clock = ManualClock::new(START_MS);
    let engine = open(&sim, &clock).await.unwrap();
    make_queue(&engine, "q", QueueSettings::default()).await;
    let syncs_before = sim.sync_count();
    engine.send("q", body("a")).await.unwrap();
    assert!(
        sim.sync_count() > syncs_before,
        "a 201 implies an fsync happened"
    );

    // A crash right after the answer keeps the message.
    drop(engine);
    sim.crash(Tear::DropUnsynced);
    let engine = open(&sim, &clock).await.unwrap();
    assert_eq!(engine.all_messages().len(), 1);
}

#[tokio::test]
async fn concurrent_sends_share_fsyncs() {
    let sim = SimStorage::new();
    let clock = ManualClock::new(START_MS);
    let engine = open(&sim, &clock).await.unwrap();
    make_queue(&engine, "q", QueueSettings::default()).await;
    // Slow fsyncs so that sends pile up behind the one being written.
    sim.set_sync_delay(Some(Duration::from_millis(5)));
    let before = sim.sync_count();
    let mut tasks = Vec::new();
    for i in 0..64 {
        let engine = engine.clone();
        tasks.push(tokio::spawn(async move {
            engine.send("q", body(&format!("m{i}"))).await.unwrap()
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let syncs = sim.sync_count() - before;
    assert!(syncs <= 16, "64 sends took {syncs} fsyncs: no group commit");
    assert_eq!(engine.all_messages().len(), 64);
}

#[tokio::test]
async fn a_failed_write_is_rolled_back_and_the_journal_goes_on() {
    let sim = SimStorage::new();
    let clock = ManualClock::new(START_MS);
    let engine = open(&sim, &clock).await.unwrap();
    make_queue(&engine, "q", QueueSettings::default()).await;
    sim.fail_write(0, io::ErrorKind::StorageFull);
    let err = engine.send("q", body("lost")).await.unwrap_err();
    assert!(
        matches!(err, SendError::Write(WriteError::Unavailable { .. })),
        "{err:?}"
    );
    let kept = engine.send("q", body("kept")).await.unwrap();
    assert_eq!(engine.all_messages().len(), 1);

    drop(engine);
    sim.crash(Tear::DropUnsynced);
    let engine = open(&sim, &clock)
        .await
        .expect("no half-written record left behind");
    let ids: Vec<_> = engine.all_messages().into_iter().map(|m| m.1).collect();
    assert_eq!(ids, vec![kept.id]);
}

#[tokio::test]
async fn a_failed_fsync_poisons_the_journal() {
    let sim = SimStorage::new();
    let clock = ManualClock::new(START_MS);
    let engine = open(&sim, &clock).await.unwrap();
    make_queue(&engine, "q", QueueSettings::default()).await;
    engine.send("q", body("before")).await.unwrap();
    let mut poisoned = engine.poisoned();
    sim.fail_sync(0);
    let err = engine.send("q", body("in doubt")).await.unwrap_err();
    assert!(
        matches!(err, SendError::Write(WriteError::Unconfirmed { .. })),
        "{err:?}"
    );
    tokio::time::timeout(Duration::from_secs(5), poisoned.wait_for(|p| *p))
        .await
        .expect("poison signal")
        .unwrap();
    let err = engine.send("q", body("after")).await.unwrap_err();
    assert!(
        matches!(err, SendError::Write(WriteError::Unavailable { .. })),
        "{err:?}"
    );
    assert!(engine.is_poisoned());
    assert_eq!(
        engine.all_messages().len(),
        1,
        "the unconfirmed write was not applied"
    );

    drop(engine);
    sim.crash(Tear::DropUnsynced);
    let engine = open(&sim, &clock).await.unwrap();
    assert_eq!(engine.all_messages().len(), 1);
    engine.send("q", body("works again")).await.unwrap();
}

#[tokio::test]
async fn a_restart_starts_a_new_epoch_and_drops_leases_without_retry() {
    let sim = SimStorage::new();
    let clock = ManualClock::new(START_MS);
    let engine = open(&sim, &clock).await.unwrap();
    let epoch = engine.epoch();
    make_queue(&engine, "q", QueueSettings::default()).await;
    engine.send("q", body("a")).await.unwrap();
    let first = engine.receive("q", 1, Duration::ZERO).await.unwrap();
    engine.nack("q", &first[0].token, 0).await.unwrap();
    let leased = engine.receive("q", 1, Duration::ZERO).await.unwrap();
    assert_eq!(leased[0].retry_count, 1);
    drop(engine);
    sim.crash(Tear::DropUnsynced);

    let engine = open(&sim, &clock).await.unwrap();
    assert_eq!(engine.epoch(), epoch + 1);
    assert!(matches!(
        engine.ack("q", &leased[0].token).await,
        Err(SettleError::StaleLease)
    ));
    let again = engine.receive("q", 1, Duration::ZERO).await.unwrap();
    assert_eq!(again.len(), 1, "visible at once after the restart");
    assert_eq!(
        again[0].retry_count, 1,
        "a restart does not count as a retry"
    );
}

#[tokio::test]
async fn lease_expiry_is_an_auto_nack() {
    let sim = SimStorage::new();
    let clock = ManualClock::new(START_MS);
    let engine = open(&sim, &clock).await.unwrap();
    let settings = QueueSettings {
        lease_timeout_ms: 1_000,
        max_retries: 1,
        ..QueueSettings::default()
    };
    make_queue(&engine, "q", settings).await;
    engine.send("q", body("a")).await.unwrap();
    let l = engine.receive("q", 1, Duration::ZERO).await.unwrap();
    clock.advance_ms(999);
    assert_eq!(
        engine.renew("q", &l[0].token).unwrap(),
        START_MS + 999 + 1_000
    );
    clock.advance_ms(1_000);
    assert!(matches!(
        engine.renew("q", &l[0].token),
        Err(SettleError::StaleLease)
    ));
    assert_eq!(engine.run_due().await, 1);
    assert_eq!(engine.stats("q").unwrap().visible, 1);
    let l = engine.receive("q", 1, Duration::ZERO).await.unwrap();
    assert_eq!(l[0].retry_count, 1);
    clock.advance_ms(1_000);
    engine.run_due().await;
    assert_eq!(engine.stats("q.failed").unwrap().visible, 1);
    let failed = engine
        .peek("q.failed", &DeadLetterFilter::default(), None, 10)
        .unwrap();
    assert_eq!(
        failed[0].failure.unwrap().reason.as_str(),
        "retries_exhausted"
    );
}

#[tokio::test]
async fn a_long_poll_is_woken_by_a_send() {
    let sim = SimStorage::new();
    let clock = ManualClock::new(START_MS);
    let engine = open(&sim, &clock).await.unwrap();
    make_queue(&engine, "q", QueueSettings::default()).await;
    let receiver = {
        let engine = engine.clone();
        tokio::spawn(async move { engine.receive("q", 1, Duration::from_secs(20)).await })
    };
    wait_until("the receive waits", async || {
        engine.receivers_waiting("q") == 1
    })
    .await;
    let sent = engine.send("q", body("wake")).await.unwrap();
    let got = tokio::time::timeout(Duration::from_secs(10), receiver)
        .await
        .expect("the receive returned before its 20 s wait ran out")
        .unwrap()
        .unwrap();
    assert_eq!(got[0].id, sent.id);
}

#[tokio::test]
async fn a_caller_that_goes_away_still_gets_its_record_applied() {
    let sim = SimStorage::new();
    let clock = ManualClock::new(START_MS);
    let engine = open(&sim, &clock).await.unwrap();
    make_queue(&engine, "q", QueueSettings::default()).await;
    // Poll the send once (it appends), then drop it, as a hung-up client's
    // handler would be dropped. The slow fsync keeps it from finishing first.
    sim.set_sync_delay(Some(Duration::from_millis(300)));
    let abandoned = tokio::time::timeout(Duration::ZERO, engine.send("q", body("orphan"))).await;
    assert!(
        abandoned.is_err(),
        "the send was still waiting for its fsync"
    );
    let got = engine
        .receive("q", 1, Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(got.len(), 1, "receivable without a restart");
    assert_eq!(got[0].payload.body, &b"orphan"[..]);
}

#[tokio::test]
async fn dedup_keys_hold_across_concurrent_sends_and_restarts() {
    let sim = SimStorage::new();
    let clock = ManualClock::new(START_MS);
    let engine = open(&sim, &clock).await.unwrap();
    let settings = QueueSettings {
        dedup_window_ms: 60_000,
        ..QueueSettings::default()
    };
    make_queue(&engine, "q", settings).await;
    let keyed = |text: &str| SendRequest {
        dedup_key: Some("k1".into()),
        ..body(text)
    };
    let (a, b) = tokio::join!(
        engine.send("q", keyed("one")),
        engine.send("q", keyed("two"))
    );
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!(a.id, b.id);
    assert!(a.deduplicated != b.deduplicated, "exactly one stored");
    assert_eq!(engine.all_messages().len(), 1);
    drop(engine);
    sim.crash(Tear::DropUnsynced);

    let engine = open(&sim, &clock).await.unwrap();
    let again = engine.send("q", keyed("three")).await.unwrap();
    assert!(again.deduplicated);
    assert_eq!(again.id, a.id);
    assert_eq!(engine.stats("q").unwrap().counters.deduplicated, 1);
    clock.advance_ms(60_000);
    engine.run_due().await;
    let fresh = engine.send("q", keyed("four")).await.unwrap();
    assert!(!fresh.deduplicated, "the window ran out");

    let err = engine.send("q.failed", body("x")).await.unwrap_err();
    assert!(matches!(err, SendError::FailureQueue { .. }));
}

#[tokio::test]
async fn a_key_on_a_queue_without_a_window_is_refused() {
    let sim = SimStorage::new();
    let clock = ManualClock::new(START_MS);
    let engine = open(&sim, &clock).await.unwrap();
    make_queue(&engine, "q", QueueSettings::default()).await;
    let request = SendRequest {
        dedup_key: Some("k".into()),
        ..body("x")
    };
    assert!(matches!(
        engine.send("q", request).await,
        Err(SendError::KeyWithoutWindow { .. })
    ));
    assert!(engine.all_messages().is_empty());
}

#[tokio::test]
async fn cancel_purge_redrive_and_queue_changes_survive_restarts() {
    let sim = SimStorage::new();
    let clock = ManualClock::new(START_MS);
    let engine = open(&sim, &clock).await.unwrap();
    let settings = QueueSettings {
        max_retries: 0,
        ..QueueSettings::default()
    };
    make_queue(&engine, "q", settings).await;
    make_queue(&engine, "gone", QueueSettings::default()).await;
    let a = engine.send("q", body("a")).await.unwrap().id;
    let b = engine.send("q", body("b")).await.unwrap().id;
    let c = engine.send("q", body("c")).await.unwrap().id;
    engine.cancel("q", a).await.unwrap();
    assert!(matches!(
        engine.cancel("q", a).await,
        Err(MessageError::MessageNotFound { .. })
    ));
    let l = engine.receive("q", 2, Duration::ZERO).await.unwrap();
    for d in &l {
        engine.nack("q", &d.token, 0).await.unwrap();
    }
    assert_eq!(engine.stats("q.failed").unwrap().visible, 2);
    let only_c = DeadLetterFilter {
        ids: Some([c].into()),
        ..DeadLetterFilter::default()
    };
    assert_eq!(
        engine.redrive("q", &only_c, 10, true).await.unwrap().done,
        1
    );
    assert_eq!(
        engine.redrive("q", &only_c, 10, false).await.unwrap().done,
        1
    );
    engine.set_paused("q", true).await.unwrap();
    engine.delete_queue("gone", Origin::Api).await.unwrap();
    drop(engine);
    sim.crash(Tear::DropUnsynced);

    let engine = open(&sim, &clock).await.unwrap();
    assert!(engine.stats("q").unwrap().paused);
    assert!(engine.stats("gone").is_err());
    let in_q: Vec<_> = engine
        .peek("q", &DeadLetterFilter::default(), None, 10)
        .unwrap()
        .iter()
        .map(|v| v.id)
        .collect();
    assert_eq!(in_q, vec![c]);
    let in_failed: Vec<_> = engine
        .peek("q.failed", &DeadLetterFilter::default(), None, 10)
        .unwrap()
        .iter()
        .map(|v| v.id)
        .collect();
    assert_eq!(in_failed, vec![b]);
    assert!(
        engine
            .receive("q", 1, Duration::ZERO)
            .await
            .unwrap()
            .is_empty(),
        "paused"
    );
    let purged = engine
        .purge("q.failed", &DeadLetterFilter::default(), usize::MAX, false)
        .await
        .unwrap();
    assert_eq!(purged.done, 1);
}

#[tokio::test]
async fn segments_rotate_and_replay_across_them() {
    let sim = SimStorage::new();
    let clock = ManualClock::new(START_MS);
    let mut options = sim_options(&sim, &clock);
    options.segment_bytes = 4096;
    let (engine, _) = spoold::engine::Engine::open(options.clone()).await.unwrap();
    make_queue(&engine, "q", QueueSettings::default()).await;
    for i in 0..100 {
        engine.send("q", body(&format!("{i:0>200}"))).await.unwrap();
    }
    drop(engine);
    sim.crash(Tear::DropUnsynced);
    let (engine, report) = spoold::engine::Engine::open(options).await.unwrap();
    assert!(report.segments > 4, "{report:?}");
    assert_eq!(report.messages, 100);
    let got = engine.receive("q", 100, Duration::ZERO).await.unwrap();
    assert_eq!(got.len(), 100);
    assert_eq!(got[99].payload.body, format!("{:0>200}", 99).as_bytes());
}

#[tokio::test]
async fn a_second_process_on_the_same_dir_fails_fast() {
    let dir = tempfile::tempdir().unwrap();
    let (_first, _) = spoold::engine::Engine::open(spoold::engine::EngineOptions::new(dir.path()))
        .await
        .unwrap();
    let err =
        match spoold::engine::Engine::open(spoold::engine::EngineOptions::new(dir.path())).await {
            Ok(_) => panic!("second open succeeded"),
            Err(e) => e,
        };
    assert!(
        err.to_string().contains("in use by another spoold process"),
        "{err}"
    );
}

#[tokio::test]
async fn the_real_file_system_keeps_messages_across_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let mut options = spoold::engine::EngineOptions::new(dir.path());
    options.segment_bytes = 1 << 20;
    let (engine, _) = spoold::engine::Engine::open(options.clone()).await.unwrap();
    make_queue(&engine, "q", QueueSettings::default()).await;
    let id = engine.send("q", body("on disk")).await.unwrap().id;
    engine.close();
    drop(engine);
    let (engine, report) = spoold::engine::Engine::open(options).await.unwrap();
    assert_eq!(report.messages, 1);
    let got = engine.receive("q", 1, Duration::ZERO).await.unwrap();
    assert_eq!((got[0].id, &got[0].payload.body[..]), (id, &b"on disk"[..]));
    let _ = Arc::new(());
}

#[tokio::test]
async fn a_full_spool_refuses_sends_but_takes_acks_and_compaction_frees_it() {
    let sim = SimStorage::new();
    let clock = ManualClock::new(START_MS);
    let mut options = sim_options(&sim, &clock);
    options.segment_bytes = 4096;
    options.max_bytes = 4 * 4096;
    let (engine, _) = spoold::engine::Engine::open(options).await.unwrap();
    make_queue(&engine, "q", QueueSettings::default()).await;
    let mut sent = 0;
    let full = loop {
        match engine.send("q", body(&"x".repeat(300))).await {
            Ok(_) => sent += 1,
            Err(e) => break e,
        }
        assert!(sent < 1000, "never filled up");
    };
    assert!(matches!(full, SendError::SpoolFull { .. }), "{full:?}");
    assert!(engine.is_full());
    let stored = engine.all_messages().len();
    assert_eq!(stored, sent, "a refused send stores nothing");

    // Acks still fit, and compaction makes room again.
    let got = engine.receive("q", 100, Duration::ZERO).await.unwrap();
    for d in &got {
        engine.ack("q", &d.token).await.unwrap();
    }
    engine.compact_all(true).await.unwrap();
    assert!(!engine.is_full(), "{} bytes", engine.journal_bytes());
    engine.send("q", body("room again")).await.unwrap();
}

#[tokio::test]
async fn the_spool_directory_and_its_files_are_private() {
    use std::os::unix::fs::PermissionsExt;
    let parent = tempfile::tempdir().unwrap();
    let dir = parent.path().join("spool");
    let mut options = spoold::engine::EngineOptions::new(&dir);
    options.segment_bytes = 1 << 20;
    let (engine, _) = spoold::engine::Engine::open(options).await.unwrap();
    make_queue(&engine, "q", QueueSettings::default()).await;
    engine.send("q", body("secret")).await.unwrap();
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&dir), 0o700);
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        assert_eq!(mode(&path), 0o600, "{}", path.display());
    }
}

/// A record past the journal's record bound (issue 38, finding 1) is
/// refused with a typed error before anything of it is written, and the
/// journal goes on: the next send is acknowledged, and a restart shows
/// only it.
#[tokio::test]
async fn a_record_past_the_record_bound_is_refused_and_the_journal_goes_on() {
    let sim = SimStorage::new();
    let clock = ManualClock::new(START_MS);
    let engine = open(&sim, &clock).await.unwrap();
    make_queue(&engine, "q", QueueSettings::default()).await;
    let mut huge = body("");
    huge.payload.body = vec![7u8; 256 << 20].into();
    let refused = engine.send("q", huge).await;
    assert!(
        matches!(
            refused,
            Err(SendError::Write(WriteError::TooLarge(ref e))) if e.limit_bytes == 256 << 20
        ),
        "{refused:?}"
    );
    let kept = engine.send("q", body("after")).await.unwrap();
    drop(engine);
    sim.crash(Tear::DropUnsynced);
    let engine = open(&sim, &clock).await.unwrap();
    let ids: Vec<_> = engine.all_messages().into_iter().map(|m| m.1).collect();
    assert_eq!(ids, vec![kept.id]);
}

/// Secret rotation (docs/contract.md §5): the replaced secret signs until
/// its overlap ends, survives compaction and a restart meanwhile, and the
/// timer's journaled end drops it, as a restart reads it; a later
/// rotation's secret is not dropped by an earlier one's end.
#[tokio::test]
async fn a_rotated_out_secret_signs_until_its_overlap_ends_through_compaction_and_restart() {
    const FIRST: &str = "whsec_Zmlyc3Qtc2VjcmV0LWtleS1ieXRlcw==";
    const SECOND: &str = "whsec_c2Vjb25kLXNlY3JldC1rZXktYnl0ZXM=";
    let sim = SimStorage::new();
    let clock = ManualClock::new(START_MS);
    let engine = open(&sim, &clock).await.unwrap();
    let settings = QueueSettings {
        destination: Some("http://127.0.0.1:9/".into()),
        signing_secret: Some(FIRST.into()),
        ..QueueSettings::default()
    };
    make_queue(&engine, "hooks", settings).await;
    let rotation = engine
        .rotate_secret("hooks", Some(SECOND.into()), 60_000)
        .await
        .unwrap();
    assert_eq!(rotation.signing_secrets, 2);
    assert_eq!(rotation.previous_expires_at, Some(START_MS + 60_000));
    let signing = |engine: &spoold::engine::Engine, now: i64| {
        let (s, _) = engine.queue_settings("hooks").unwrap();
        s.signing_secrets(now).map(|s| s.into_owned())
    };
    assert_eq!(
        signing(&engine, START_MS).as_deref(),
        Some(format!("{SECOND} {FIRST}").as_str())
    );
    engine.compact_all(true).await.unwrap();
    drop(engine);
    let engine = open(&sim, &clock).await.unwrap();
    assert_eq!(engine.stats("hooks").unwrap().signing_secrets, 2);

    // Its end: not before it is due, then once, journaled.
    clock.advance_ms(59_999);
    assert_eq!(engine.run_due().await, 0);
    clock.advance_ms(1);
    assert_eq!(engine.stats("hooks").unwrap().signing_secrets, 1);
    assert_eq!(engine.run_due().await, 1);
    assert_eq!(engine.run_due().await, 0);
    let (settings, _) = engine.queue_settings("hooks").unwrap();
    assert_eq!(settings.previous_secret, None);
    drop(engine);
    let engine = open(&sim, &clock).await.unwrap();
    assert_eq!(signing(&engine, START_MS + 60_000).as_deref(), Some(SECOND));
    assert_eq!(
        engine.stats("hooks").unwrap().previous_secret_expires_at,
        None
    );

    // A rotation with no overlap drops the old secret at once; one that
    // a second rotation replaced is dropped by that rotation, not by the
    // first one's end.
    let third = engine.rotate_secret("hooks", None, 0).await.unwrap();
    assert!(third.secret.starts_with("whsec_"));
    assert_eq!(
        (third.signing_secrets, third.previous_expires_at),
        (1, None)
    );
    engine.rotate_secret("hooks", None, 10_000).await.unwrap();
    clock.advance_ms(5_000);
    let last = engine.rotate_secret("hooks", None, 10_000).await.unwrap();
    clock.advance_ms(5_000);
    assert_eq!(
        engine.run_due().await,
        0,
        "the first overlap's secret already went"
    );
    assert_eq!(engine.stats("hooks").unwrap().signing_secrets, 2);
    assert_eq!(
        engine.stats("hooks").unwrap().previous_secret_expires_at,
        last.previous_expires_at
    );
}
