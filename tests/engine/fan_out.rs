//! Fan-out in memory (issue 38, finding 4): an event's untouched
//! deliveries cost a few bytes each, through compaction and restarts, and
//! a delivery leased while compaction moves its event's record follows it;
//! the state's memory, as accounted, has a bound that refuses sends and
//! events, and settling frees it.

use std::time::Duration;

use crate::common::*;
use spoold::engine::{Engine, EventError, EventRequest, Publisher, SendError, WriteError};
use spoold::spool::{DeadLetterFilter, Payload, QueueSettings};
use spoold::testing::SimStorage;
use spoold::time::ManualClock;

const QUEUES: usize = 200;

fn event(n: usize) -> EventRequest {
    EventRequest {
        event_type: "order.created".into(),
        tenant: None,
        payload: Payload {
            content_type: "application/json".into(),
            request: None,
            event: None,
            resent_from: None,
            trace: None,
            hops: 0,
            ordering_key: None,
            body: format!("{{\"n\": {n}}}").into_bytes().into(),
        },
        dedup_key: None,
        headers: Default::default(),
        publisher: Publisher::Client,
    }
}

async fn subscribers(engine: &Engine) {
    for i in 0..QUEUES {
        let settings = QueueSettings {
            events: vec!["order.>".into()],
            ..QueueSettings::default()
        };
        make_queue(engine, &format!("q{i:03}"), settings).await;
    }
}

/// Bytes accounted per delivery beyond what the queues cost empty.
fn per_delivery(engine: &Engine, empty: u64, deliveries: usize) -> u64 {
    (engine.memory().0 - empty) / deliveries as u64
}

#[tokio::test]
async fn untouched_deliveries_cost_a_few_bytes_through_compaction_and_restarts() {
    let sim = SimStorage::new();
    let clock = ManualClock::new(START_MS);
    let mut options = sim_options(&sim, &clock);
    options.segment_bytes = 64 << 10;
    let (engine, _) = Engine::open(options.clone()).await.unwrap();
    subscribers(&engine).await;
    let empty = engine.memory().0;
    for n in 0..100 {
        engine.publish(event(n)).await.unwrap();
    }
    let deliveries = 100 * QUEUES;
    // An ordinary message is accounted at 200 bytes.
    let live = per_delivery(&engine, empty, deliveries);
    assert!(live <= 40, "{live} bytes a delivery");
    // A restart starts a new epoch: the queues are what must not change.
    let queues = |engine: &Engine| engine.state().without_locations().queues;
    let state = queues(&engine);

    engine.compact_all(true).await.unwrap();
    assert!(queues(&engine) == state, "compaction changed the state");
    assert!(per_delivery(&engine, empty, deliveries) <= 40);
    engine.close();
    drop(engine);

    // Restored from the checkpoint compaction wrote: as compact as before.
    let (engine, _) = Engine::open(options).await.unwrap();
    assert!(queues(&engine) == state, "a restart changed the state");
    let restored = per_delivery(&engine, empty, deliveries);
    assert!(
        restored <= 40,
        "{restored} bytes a delivery after a restart"
    );

    // Leased, a delivery is an ordinary message; acked, it is gone.
    let got = engine.receive("q000", 100, Duration::ZERO).await.unwrap();
    assert_eq!(got.len(), 100);
    for d in &got {
        engine.ack("q000", &d.token).await.unwrap();
    }
    assert_eq!(engine.stats("q000").unwrap().visible, 0);
    assert_eq!(engine.stats("q001").unwrap().visible, 100);
}

/// Compaction plans under the lock, writes without it, then swaps: a
/// delivery leased in between holds its event record's old place, which
/// the swap must move too (else it points into a deleted file).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_leased_while_compaction_moves_its_event_follows_the_record() {
    let sim = SimStorage::new();
    let clock = ManualClock::new(START_MS);
    let mut options = sim_options(&sim, &clock);
    options.segment_bytes = 64 << 10;
    let (engine, _) = Engine::open(options.clone()).await.unwrap();
    subscribers(&engine).await;
    for n in 0..20 {
        engine.publish(event(n)).await.unwrap();
    }
    // Fill segments past the events, then free some of them, so that the
    // events' segments hold garbage and are compacted.
    make_queue(&engine, "filler", QueueSettings::default()).await;
    for _ in 0..200 {
        engine
            .send("filler", body(&"f".repeat(1000)))
            .await
            .unwrap();
    }
    engine
        .purge("filler", &DeadLetterFilter::default(), usize::MAX, false)
        .await
        .unwrap();

    // Every fsync takes 300 ms: compaction's pack and checkpoint do too.
    sim.set_sync_delay(Some(Duration::from_millis(300)));
    let compacting = engine.compact_all(true);
    let leasing = async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        engine.receive("q007", 5, Duration::ZERO).await.unwrap()
    };
    let (reports, leased) = tokio::join!(compacting, leasing);
    sim.set_sync_delay(None);
    assert!(
        reports.unwrap().iter().any(|r| r.records_moved > 0),
        "compaction moved nothing"
    );
    assert_eq!(leased.len(), 5);
    // Nacked, read again: from the record's new place.
    for d in &leased {
        engine.nack("q007", &d.token, 0).await.unwrap();
    }
    let again = engine.receive("q007", 5, Duration::ZERO).await.unwrap();
    assert_eq!(again.len(), 5);
    for (a, b) in leased.iter().zip(&again) {
        assert_eq!(a.id, b.id);
        assert_eq!(a.payload, b.payload);
    }
    // And after a restart.
    let state = engine.state();
    engine.close();
    drop(engine);
    let (engine, _) = Engine::open(options).await.unwrap();
    let after = engine.state();
    for (name, q) in &state.queues {
        assert!(after.queues[name] == *q, "{name} changed across a restart");
    }
    assert_eq!(after.queues.len(), state.queues.len());
}

#[tokio::test]
async fn past_max_memory_sends_and_events_are_refused_and_settling_frees_it() {
    let sim = SimStorage::new();
    let clock = ManualClock::new(START_MS);
    let mut options = sim_options(&sim, &clock);
    options.max_memory = 4 << 20;
    let (engine, _) = Engine::open(options).await.unwrap();
    subscribers(&engine).await;
    let mut published = 0;
    let full = loop {
        match engine.publish(event(published)).await {
            Ok(_) => published += 1,
            Err(e) => break e,
        }
        assert!(published < 10_000, "never filled up");
    };
    assert!(
        matches!(full, EventError::Write(WriteError::MemoryFull { .. })),
        "{full:?}"
    );
    let (accounted, max) = engine.memory();
    assert!(accounted <= max, "{accounted} > {max}");
    make_queue(&engine, "plain", QueueSettings::default()).await;
    let refused = engine.send("plain", body("x")).await;
    assert!(
        matches!(
            refused,
            Err(SendError::Write(WriteError::MemoryFull { .. }))
        ),
        "{refused:?}"
    );
    // Settling frees memory: every delivery of one queue purged.
    for i in 0..QUEUES / 2 {
        engine
            .purge(
                &format!("q{i:03}"),
                &DeadLetterFilter::default(),
                usize::MAX,
                false,
            )
            .await
            .unwrap();
    }
    engine.send("plain", body("x")).await.unwrap();
    engine.publish(event(published)).await.unwrap();
}

/// A large event's record (many deliveries, or a large payload) is read
/// from disk once and its payload kept for the next deliveries
/// (`src/engine/shared_reads.rs`, issue 43): every delivery still gets its
/// own event's payload, before compaction moves the records and after,
/// when they are read from their new place.
#[tokio::test]
async fn every_delivery_of_a_large_event_gets_its_payload_through_compaction() {
    let sim = SimStorage::new();
    let clock = ManualClock::new(START_MS);
    let mut options = sim_options(&sim, &clock);
    options.segment_bytes = 64 << 10;
    let (engine, _) = Engine::open(options).await.unwrap();
    subscribers(&engine).await;
    make_queue(&engine, "filler", QueueSettings::default()).await;
    let large = |n: usize| {
        let mut e = event(n);
        e.payload.body = format!("{n}:{}", "x".repeat(20 << 10)).into_bytes().into();
        e
    };
    for n in 0..3 {
        engine.publish(large(n)).await.unwrap();
        // Garbage beside each event once the filler is purged: its
        // segment is compacted.
        for _ in 0..40 {
            engine
                .send("filler", body(&"f".repeat(1000)))
                .await
                .unwrap();
        }
    }
    let filter = DeadLetterFilter::default();
    engine
        .purge("filler", &filter, usize::MAX, false)
        .await
        .unwrap();
    let check = |leased: &[spoold::engine::Delivery]| {
        assert_eq!(leased.len(), 3);
        for (n, d) in leased.iter().enumerate() {
            assert_eq!(d.payload.body, large(n).payload.body, "delivery {n}");
        }
    };
    let mut all = Vec::new();
    for i in 0..QUEUES {
        let queue = format!("q{i:03}");
        let leased = engine.receive(&queue, 3, Duration::ZERO).await.unwrap();
        check(&leased);
        all.push((queue, leased));
    }
    for (queue, leased) in &all {
        for d in leased {
            engine.nack(queue, &d.token, 0).await.unwrap();
        }
    }
    let reports = engine.compact_all(true).await.unwrap();
    assert!(
        reports.iter().any(|r| r.records_moved > 0),
        "compaction moved nothing"
    );
    for (queue, _) in &all {
        check(&engine.receive(queue, 3, Duration::ZERO).await.unwrap());
    }
}
