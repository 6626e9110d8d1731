//! Spools that earlier builds of format 2 wrote (`tests/data`, each
//! described in `tests/data/README.md`) are read by today's build with
//! everything they hold, then written to, compacted and read again after a
//! restart. `v2-before-events` was written by the last build before
//! events; `v2-events-history` by the build that added delivery history
//! (events and their shared records, resends, a history drop, history and
//! event-key chunks). Each has a checkpoint, a pack and records after the
//! checkpoint, so replay reads every kind of file those builds left.
//!
//! A change that makes today's build misread what an earlier one wrote
//! fails here. Replicated mode's fixtures are restarted as clusters by
//! `tests/cluster/fixtures.rs`; the bytes of every record and chunk kind
//! are pinned by `src/spool/golden_tests/`.

use crate::common;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use spoold::engine::{Engine, EngineOptions, EventRequest, HistoryQuery, Publisher, SendRequest};
use spoold::spool::{DeadLetterFilter, FailReason, MessageId, OnExpire, QueueSettings};
use spoold::time::ManualClock;

/// A minute after `v2-before-events` was written: its retention and
/// dedup windows and its delays are as they were then, whatever today's
/// date.
pub(crate) const BEFORE_EVENTS_NOW_MS: i64 = 1_796_403_270_000;
/// A minute after `v2-events-history` was written.
pub(crate) const EVENTS_HISTORY_NOW_MS: i64 = 1_796_403_850_000;

fn options(dir: &Path, now_ms: i64) -> EngineOptions {
    let mut options = EngineOptions::new(dir);
    options.segment_bytes = 64 << 10;
    options.preallocate = false;
    options.clock = Arc::new(ManualClock::new(now_ms));
    options
}

/// Every message of the spool by queue (failure queues named as such)
/// and id: its retry count, state and body.
fn messages(engine: &Engine) -> Vec<(String, u64, u32, &'static str, String)> {
    let mut all: Vec<_> = engine
        .all_messages()
        .into_iter()
        .map(|(queue, id, message)| {
            let state = engine.get(&queue, id).unwrap().state.as_str();
            let body = engine.payload(&queue, id).unwrap().body;
            let body = String::from_utf8(body.to_vec()).unwrap();
            (queue, id.0, message.retry_count, state, body)
        })
        .collect();
    all.sort();
    all
}

fn row(
    queue: &str,
    id: u64,
    retry_count: u32,
    state: &'static str,
    body: &str,
) -> (String, u64, u32, &'static str, String) {
    (queue.into(), id, retry_count, state, body.into())
}

/// Queue names with their pause state.
fn queues(engine: &Engine) -> Vec<(String, bool)> {
    engine
        .state()
        .queues
        .into_iter()
        .map(|(name, q)| (name, q.queue.paused))
        .collect()
}

fn settings(engine: &Engine, queue: &str) -> QueueSettings {
    engine.queue_settings(queue).unwrap().0
}

/// The ids of `queue`'s history, newest first.
fn history(engine: &Engine, queue: &str) -> Vec<u64> {
    let query = HistoryQuery {
        limit: 100,
        ..HistoryQuery::default()
    };
    let page = engine.history(queue, &query, &mut |_, _| true).unwrap();
    page.items.iter().map(|item| item.id.0).collect()
}

/// Writes to an open fixture (`write` checks the answers), compacts it
/// (the fixture's pack and segment rewritten by today's build), and
/// checks that `journal verify` finds it clean and a restart finds the
/// very state the engine had.
async fn write_compact_and_restart(
    spool: &Path,
    now_ms: i64,
    engine: Engine,
    write: impl AsyncFnOnce(&Engine),
) -> Engine {
    write(&engine).await;
    let reports = engine.compact_all(true).await.unwrap();
    assert!(!reports.is_empty(), "the fixture's files had garbage");
    let before = engine.state();
    engine.close();
    drop(engine);
    let report = spoold::cli::journal::verify(spool).unwrap();
    assert!(report.is_clean(), "{}", report.render(spool));
    let (engine, _) = Engine::open(options(spool, now_ms)).await.unwrap();
    assert_eq!(
        engine.state().without_locations(),
        spoold::spool::SpoolState {
            epoch: before.epoch + 1,
            ..before.without_locations()
        }
    );
    engine
}

/// What `v2-before-events` holds (2c52364: `tests/data/README.md`).
fn check_before_events(engine: &Engine) {
    assert_eq!(
        queues(engine),
        [
            ("brief".into(), false),
            ("churn".into(), false),
            ("fleeting".into(), false),
            ("hooks".into(), true),
            ("jobs".into(), false),
            ("orders".into(), false),
        ],
        "scratch was deleted; hooks paused after the checkpoint"
    );
    assert_eq!(
        messages(engine),
        [
            row("hooks", 11, 1, "delayed", "{\"n\":1}"),
            row("hooks.failed", 12, 0, "visible", "bye"),
            row("jobs", 9, 0, "visible", "job 2"),
            row("jobs", 10, 0, "visible", "job 3"),
            row("jobs.failed", 8, 0, "visible", "job 1"),
            row("orders", 3, 2, "visible", "nacked"),
            row("orders", 4, 0, "visible", "keyed"),
            row("orders", 5, 0, "delayed", "delayed"),
            row("orders", 6, 0, "visible", "{\"n\": 1}"),
            row("orders", 165, 0, "visible", "after the checkpoint"),
        ]
    );
    // The settings as each queue was last changed (orders after the
    // checkpoint, by a patch), fields the build did not know at their
    // defaults.
    assert_eq!(
        settings(engine, "orders"),
        QueueSettings {
            lease_timeout_ms: 45_000,
            max_retries: 2,
            dedup_window_ms: 3_600_000,
            ..QueueSettings::default()
        }
    );
    assert_eq!(
        settings(engine, "jobs"),
        QueueSettings {
            max_retries: 0,
            ..QueueSettings::default()
        }
    );
    let mut hooks = QueueSettings {
        destination: Some("http://127.0.0.1:45791/hooks".into()),
        concurrency: 1,
        max_retries: 3,
        timeout_ms: 5_000,
        headers: [("X-Source".to_owned(), "fixture".to_owned())].into(),
        signing_secret: Some("whsec_Zml4dHVyZS1zZWNyZXQ=".into()),
        ..QueueSettings::default()
    };
    hooks.backoff.initial_ms = 3_600_000;
    hooks.backoff.multiplier = 2.0;
    hooks.backoff.max_ms = 7_200_000;
    hooks.backoff.jitter = 0.0;
    assert_eq!(settings(engine, "hooks"), hooks);
    for (queue, on_expire) in [("brief", OnExpire::Fail), ("fleeting", OnExpire::Discard)] {
        assert_eq!(
            settings(engine, queue),
            QueueSettings {
                retention_ms: 1_000,
                on_expire,
                ..QueueSettings::default()
            }
        );
    }
    assert_eq!(settings(engine, "churn"), QueueSettings::default());

    // Failure details, stored requests and attempts (all in the pack).
    let failed = engine.get("jobs.failed", MessageId(8)).unwrap().failure;
    assert_eq!(
        failed.map(|f| (f.reason, f.last_status)),
        Some((FailReason::RetriesExhausted, None))
    );
    let gone = engine.get("hooks.failed", MessageId(12)).unwrap().failure;
    assert_eq!(
        gone.map(|f| (f.reason, f.last_status)),
        Some((FailReason::PermanentStatus, Some(410)))
    );
    let retrying = engine.payload("hooks", MessageId(11)).unwrap();
    assert_eq!(retrying.content_type, "application/json");
    let request = retrying.request.unwrap();
    assert_eq!(
        (
            request.method.as_str(),
            request.path.as_str(),
            request.query.as_str()
        ),
        ("POST", "/a/b", "x=1")
    );
    assert!(
        request.headers.contains(&("x-request".into(), "r1".into())),
        "{request:?}"
    );
    let request = engine
        .payload("hooks.failed", MessageId(12))
        .unwrap()
        .request
        .unwrap();
    assert_eq!(
        (request.method.as_str(), request.path.as_str()),
        ("PUT", "/gone/2")
    );
    let attempts = |queue: &str, id: u64| -> Vec<(Option<u16>, String)> {
        engine
            .attempts(queue, MessageId(id))
            .unwrap()
            .into_iter()
            .map(|a| (a.status, a.response))
            .collect()
    };
    assert_eq!(
        attempts("hooks", 11),
        [(Some(500), "busy, try later".into())]
    );
    assert_eq!(
        attempts("hooks.failed", 12),
        [(Some(410), "gone for good".into())]
    );
    assert!(attempts("orders", 3).is_empty());

    // One dedup key (message 4's), and ids up to 165 used.
    let state = engine.state();
    let dedup: Vec<u64> = state.queues["orders"]
        .dedup
        .iter()
        .map(|d| d.id.0)
        .collect();
    assert_eq!(dedup, [4]);
    assert_eq!(state.next_message_id, 166);
}

#[tokio::test]
async fn the_last_spool_before_events_is_read_written_and_read_again() {
    let dir = tempfile::tempdir().unwrap();
    let spool = dir.path().join("spool");
    common::copy_fixture("v2-before-events", &spool);
    let (engine, report) = Engine::open(options(&spool, BEFORE_EVENTS_NOW_MS))
        .await
        .unwrap();
    assert_eq!(report.epoch, 2, "the fixture's process started once");
    assert_eq!(report.records, 5, "records after the checkpoint");
    check_before_events(&engine);

    let engine = write_compact_and_restart(&spool, BEFORE_EVENTS_NOW_MS, engine, async |engine| {
        let dup = engine
            .send(
                "orders",
                SendRequest {
                    dedup_key: Some("key-1".into()),
                    ..common::body("again")
                },
            )
            .await
            .unwrap();
        assert!(dup.deduplicated);
        assert_eq!(dup.id, MessageId(4), "the key the fixture remembered");
        let new = engine.send("orders", common::body("new")).await.unwrap();
        assert_eq!(new.id, MessageId(166), "above the fixture's id floor");
        let got = engine.receive("orders", 1, Duration::ZERO).await.unwrap();
        assert_eq!(got[0].id, MessageId(4), "the longest waiting");
        engine.ack("orders", &got[0].token).await.unwrap();
        let all = DeadLetterFilter::default();
        assert_eq!(
            engine.redrive("jobs", &all, 10, false).await.unwrap().done,
            1
        );
        engine.set_paused("hooks", false).await.unwrap();
    })
    .await;
    let held: Vec<(String, u64)> = messages(&engine).into_iter().map(|m| (m.0, m.1)).collect();
    assert_eq!(
        held,
        [
            ("hooks".into(), 11),
            ("hooks.failed".into(), 12),
            ("jobs".into(), 8),
            ("jobs".into(), 9),
            ("jobs".into(), 10),
            ("orders".into(), 3),
            ("orders".into(), 5),
            ("orders".into(), 6),
            ("orders".into(), 165),
            ("orders".into(), 166),
        ]
    );
    assert!(!engine.stats("hooks").unwrap().paused);
    assert_eq!(engine.attempts("hooks", MessageId(11)).unwrap().len(), 1);
}

/// What `v2-events-history` holds (55cac08: `tests/data/README.md`).
fn check_events_history(engine: &Engine) {
    assert_eq!(
        queues(engine),
        [
            ("alerts".into(), false),
            ("audit".into(), false),
            ("billing".into(), false),
            ("brief-history".into(), false),
            ("churn".into(), false),
            ("notify".into(), false),
            ("orders".into(), false),
            ("receipts".into(), true),
        ]
    );
    assert_eq!(
        messages(engine),
        [
            row("alerts", 9, 1, "delayed", "{\"user\":\"ann\"}"),
            row("audit", 2, 1, "visible", "{\"invoice\":7}"),
            row("audit", 6, 0, "visible", "created 8"),
            row("audit", 10, 0, "visible", "{\"user\":\"ann\"}"),
            row("audit", 166, 0, "visible", "{\"invoice\":9}"),
            row("billing", 11, 0, "visible", "{\"invoice\":7}"),
            row("billing", 167, 0, "visible", "{\"invoice\":9}"),
            row("billing", 168, 0, "visible", "created 8"),
            row("orders", 14, 0, "visible", "keyed"),
            row("orders", 170, 0, "visible", "after the checkpoint"),
            row("receipts", 13, 0, "visible", "{\"total\":12}"),
        ]
    );
    let notify = settings(engine, "notify");
    assert_eq!(notify.events, ["invoice.paid"]);
    assert_eq!(notify.tenant.as_deref(), Some("cus_42"));
    assert_eq!(notify.history_retention_ms, 86_400_000);
    assert_eq!(
        settings(engine, "audit").events,
        ["invoice.>", "user.created"]
    );
    assert_eq!(settings(engine, "billing").events, ["invoice.*"]);
    assert_eq!(
        settings(engine, "brief-history").history_retention_ms,
        1_000
    );

    // Every delivery of an event points at the event's one record, the
    // deliveries kept in histories too.
    let state = engine.state();
    let loc_of = |queue: &str, id: u64| {
        let q = &state.queues[queue];
        match q.messages.iter().find(|m| m.id.0 == id) {
            Some(m) => (m.loc, m.shared),
            None => {
                let (_, d) = q.history.iter().find(|(h, _)| h.0 == id).unwrap();
                (d.loc, d.shared)
            }
        }
    };
    for event in [
        [("audit", 2), ("billing", 3), ("notify", 4)].as_slice(),
        &[("audit", 6), ("billing", 7)],
        &[("alerts", 9), ("audit", 10)],
        &[("audit", 166), ("billing", 167)],
    ] {
        let (loc, shared) = loc_of(event[0].0, event[0].1);
        assert!(shared, "{event:?}");
        for (queue, id) in event {
            assert_eq!(loc_of(queue, *id), (loc, true), "{event:?}");
        }
    }
    let tag = |queue: &str, id: u64| {
        let event = engine.payload(queue, MessageId(id)).unwrap().event.unwrap();
        (event.id.0, event.event_type, event.tenant)
    };
    assert_eq!(
        tag("audit", 2),
        (1, "invoice.paid".into(), Some("cus_42".into()))
    );
    assert_eq!(tag("audit", 6), (5, "invoice.created".into(), None));
    assert_eq!(tag("alerts", 9), (8, "user.created".into(), None));
    assert_eq!(
        tag("billing", 167),
        (165, "invoice.voided".into(), Some("cus_7".into()))
    );
    assert_eq!(
        engine.payload("audit", MessageId(6)).unwrap().content_type,
        "text/plain"
    );

    // Resends: the payload copied with its event tag or stored request.
    let resent = engine.payload("billing", MessageId(11)).unwrap();
    assert_eq!(resent.resent_from, Some(MessageId(3)));
    assert_eq!(
        tag("billing", 11),
        (1, "invoice.paid".into(), Some("cus_42".into()))
    );
    assert_eq!(
        engine
            .payload("billing", MessageId(168))
            .unwrap()
            .resent_from,
        Some(MessageId(7))
    );
    assert_eq!(tag("billing", 168), (5, "invoice.created".into(), None));
    let resent = engine.payload("receipts", MessageId(13)).unwrap();
    assert_eq!(resent.resent_from, Some(MessageId(12)));
    let request = resent.request.unwrap();
    assert_eq!(
        (
            request.method.as_str(),
            request.path.as_str(),
            request.query.as_str()
        ),
        ("POST", "/r/1", "y=2")
    );

    // Histories, newest first; brief-history's entry was dropped.
    assert_eq!(history(engine, "billing"), [7, 3]);
    assert_eq!(history(engine, "notify"), [4]);
    assert_eq!(history(engine, "receipts"), [12]);
    assert!(history(engine, "brief-history").is_empty());
    let delivered = engine.delivered("notify", MessageId(4)).unwrap();
    assert_eq!(delivered.attempts.len(), 1);
    assert_eq!(delivered.attempts[0].status, Some(200));
    assert_eq!(delivered.payload.event.unwrap().id, MessageId(1));
    let delivered = engine.delivered("receipts", MessageId(12)).unwrap();
    assert_eq!(delivered.payload.request.unwrap().path, "/r/1");
    assert_eq!(delivered.attempts[0].response, "thanks");
    let alert = engine.attempts("alerts", MessageId(9)).unwrap();
    assert_eq!(
        alert.iter().map(|a| a.status).collect::<Vec<_>>(),
        [Some(500)]
    );

    // Event keys (E1's and E4's), a dedup key, and ids up to 170 used.
    let keys: Vec<(u64, Vec<(String, u64)>)> = state
        .event_keys
        .iter()
        .map(|k| {
            (
                k.id.0,
                k.deliveries
                    .iter()
                    .map(|(q, id)| (q.clone(), id.0))
                    .collect(),
            )
        })
        .collect();
    assert_eq!(
        keys,
        [
            (
                1,
                vec![
                    ("audit".into(), 2),
                    ("billing".into(), 3),
                    ("notify".into(), 4)
                ]
            ),
            (165, vec![("audit".into(), 166), ("billing".into(), 167)]),
        ]
    );
    let dedup: Vec<u64> = state.queues["orders"]
        .dedup
        .iter()
        .map(|d| d.id.0)
        .collect();
    assert_eq!(dedup, [14]);
    assert_eq!(state.next_message_id, 171);
}

#[tokio::test]
async fn a_spool_with_events_and_history_is_read_written_and_read_again() {
    let dir = tempfile::tempdir().unwrap();
    let spool = dir.path().join("spool");
    common::copy_fixture("v2-events-history", &spool);
    let (engine, report) = Engine::open(options(&spool, EVENTS_HISTORY_NOW_MS))
        .await
        .unwrap();
    assert_eq!(report.epoch, 2, "the fixture's process started once");
    assert_eq!(report.records, 7, "records after the checkpoint");
    check_events_history(&engine);

    let engine = write_compact_and_restart(&spool, EVENTS_HISTORY_NOW_MS, engine, async |engine| {
        let event = |dedup_key: &str| EventRequest {
            event_type: "invoice.paid".into(),
            tenant: Some("cus_42".into()),
            payload: common::body("paid again").payload,
            dedup_key: Some(dedup_key.into()),
            headers: Default::default(),
            publisher: Publisher::Client,
        };
        // Keys belong to their tenant since issue 38: the fixture's key,
        // hashed without its tenant, is not this tenant's (a repeat inside
        // the window across the upgrade publishes once more, a duplicate
        // rather than another tenant's event swallowed).
        let first = engine.publish(event("evt-1")).await.unwrap();
        assert!(!first.deduplicated, "a tenant's key, hashed before tenants");
        assert_eq!(first.id, MessageId(171), "above the fixture's id floor");
        let dup = engine.publish(event("evt-1")).await.unwrap();
        assert!(dup.deduplicated, "the key as this build hashes it");
        assert_eq!(dup.id, first.id);
        let new = engine.publish(event("evt-3")).await.unwrap();
        assert_eq!(new.id, MessageId(175));
        let to: Vec<&str> = new.deliveries.iter().map(|(q, _)| q.as_str()).collect();
        assert_eq!(to, ["audit", "billing", "notify"]);
        // Acked into billing's history, beside the fixture's entries.
        let got = engine.receive("billing", 1, Duration::ZERO).await.unwrap();
        assert_eq!(got[0].id, MessageId(11), "the longest waiting");
        engine.ack("billing", &got[0].token).await.unwrap();
        let again = engine.resend("billing", MessageId(7)).await.unwrap();
        assert_eq!(again, MessageId(179));
        // E2's delivery to audit, whose record billing's history still
        // holds; and a message of the pack's that nothing holds after.
        for (queue, id) in [("audit", 6), ("orders", 14)] {
            let got = engine.receive(queue, 1, Duration::ZERO).await.unwrap();
            assert_eq!(got[0].id, MessageId(id), "the longest waiting");
            engine.ack(queue, &got[0].token).await.unwrap();
        }
    })
    .await;
    assert_eq!(history(&engine, "billing"), [11, 7, 3]);
    let resent = engine.payload("billing", MessageId(179)).unwrap();
    assert_eq!(resent.resent_from, Some(MessageId(7)));
    assert_eq!(resent.event.unwrap().event_type, "invoice.created");
    assert_eq!(
        engine
            .delivered("billing", MessageId(3))
            .unwrap()
            .payload
            .body,
        "{\"invoice\":7}"
    );
    assert!(engine.get("audit", MessageId(6)).is_err(), "acked");
    assert!(engine.get("orders", MessageId(14)).is_err(), "acked");
    assert_eq!(
        engine.get("notify", MessageId(174)).unwrap().state.as_str(),
        "visible"
    );
}
