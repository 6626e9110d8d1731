//! A spool written by the last release of format 1 (`tests/data/v1-spool`,
//! described in `tests/data/README.md`) is upgraded at start-up, or by
//! `spoold journal upgrade`, with everything it held: queues with their
//! settings and pause state, messages with their retry counts, failure
//! details, stored requests and attempts, dedup keys and the id floor.

use crate::common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use spoold::engine::{Engine, EngineOptions, SendRequest};
use spoold::spool::MessageId;

/// A minute after the fixture was written: its delayed message is due
/// 1 000 hours after that, whatever today's date.
pub(crate) const FIXTURE_NOW_MS: i64 = 1_796_045_370_000;

fn options(dir: &Path) -> EngineOptions {
    let mut options = EngineOptions::new(dir);
    options.segment_bytes = 64 << 10;
    options.preallocate = false;
    options.clock = std::sync::Arc::new(spoold::time::ManualClock::new(FIXTURE_NOW_MS));
    options
}

/// Everything the fixture holds, checked through the engine.
async fn check_contents(engine: &Engine) {
    let by_queue = |queue: &str| -> Vec<(u64, u32)> {
        engine
            .all_messages()
            .into_iter()
            .filter(|m| m.0 == queue)
            .map(|m| (m.1.0, m.2.retry_count))
            .collect()
    };
    assert_eq!(
        by_queue("orders"),
        vec![(2, 1), (3, 0), (4, 0), (5, 0), (6, 0), (7, 0), (8, 0)]
    );
    assert_eq!(by_queue("jobs.failed"), vec![(9, 0), (10, 0)]);
    assert_eq!(by_queue("jobs"), vec![(11, 0)]);
    assert_eq!(by_queue("hooks"), vec![(12, 1)]);
    let failed = engine.get("jobs.failed", MessageId(9)).unwrap();
    assert_eq!(
        failed.failure.map(|f| f.reason.as_str()),
        Some("retries_exhausted")
    );
    let (orders, _) = engine.queue_settings("orders").unwrap();
    assert_eq!(orders.lease_timeout_ms, 45_000, "the last settings change");
    assert_eq!(orders.max_retries, 1);
    assert!(engine.stats("hooks").unwrap().paused, "still paused");
    let hook = engine.payload("hooks", MessageId(12)).unwrap();
    assert_eq!(hook.request.unwrap().path, "/a/b");
    assert_eq!(&hook.body[..], b"{\"n\":1}");
    let attempts = engine.attempts("hooks", MessageId(12)).unwrap();
    assert_eq!(attempts.len(), 1);
    assert_eq!(attempts[0].status, Some(500));
    assert_eq!(
        &engine.payload("orders", MessageId(7)).unwrap().body[..],
        b"delayed"
    );
    let delayed = engine.get("orders", MessageId(7)).unwrap();
    assert_eq!(delayed.state.as_str(), "delayed");
}

#[tokio::test]
async fn a_format_1_spool_is_upgraded_at_start_up_with_everything_it_held() {
    let dir = tempfile::tempdir().unwrap();
    let spool = dir.path().join("spool");
    common::copy_fixture("v1-spool", &spool);
    let (engine, _) = Engine::open(options(&spool)).await.unwrap();
    check_contents(&engine).await;
    // The dedup key is remembered, and no id is handed out again.
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
    assert_eq!(dup.id, MessageId(8));
    let new = engine.send("orders", common::body("new")).await.unwrap();
    assert!(new.id.0 > 52, "ids up to 52 were used: got {}", new.id.0);
    let got = engine.receive("orders", 10, Duration::ZERO).await.unwrap();
    assert_eq!(got.len(), 7, "six visible orders and the new one");
    engine.close();
    drop(engine);

    // Nothing of format 1 is left, and the upgraded spool replays the same.
    let names: Vec<String> = std::fs::read_dir(&spool)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(names.iter().any(|n| n.ends_with(".ckpt")), "{names:?}");
    let report = spoold::cli::journal::verify(&spool).unwrap();
    assert!(report.is_clean(), "{}", report.render(&spool));
    let (engine, _) = Engine::open(options(&spool)).await.unwrap();
    assert_eq!(engine.all_messages().len(), 12, "eleven and the new one");
    assert!(engine.get("orders", MessageId(7)).is_ok());
}

#[tokio::test]
async fn journal_upgrade_converts_a_stopped_spool_and_verify_says_what_it_is() {
    let dir = tempfile::tempdir().unwrap();
    let spool = dir.path().join("spool");
    common::copy_fixture("v1-spool", &spool);
    let bin = env!("CARGO_BIN_EXE_spoold");
    let verify = Command::new(bin)
        .args(["journal", "verify", "--dir"])
        .arg(&spool)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&verify.stdout);
    assert!(text.contains("format 1"), "{text}");
    let upgrade = Command::new(bin)
        .args(["journal", "upgrade", "--dir"])
        .arg(&spool)
        .output()
        .unwrap();
    assert!(upgrade.status.success(), "{upgrade:?}");
    let text = String::from_utf8_lossy(&upgrade.stdout);
    assert!(text.contains("11 message(s)"), "{text}");
    let again = Command::new(bin)
        .args(["journal", "upgrade", "--dir"])
        .arg(&spool)
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&again.stdout).contains("nothing to upgrade"));
    let verify = Command::new(bin)
        .args(["journal", "verify", "--dir"])
        .arg(&spool)
        .output()
        .unwrap();
    assert!(verify.status.success(), "{verify:?}");
    let (engine, _) = Engine::open(options(&spool)).await.unwrap();
    check_contents(&engine).await;
}

/// The upgrade cut off by a power loss after each of its changes to the
/// disk in turn: the next start finishes it, with everything there.
#[tokio::test]
async fn an_upgrade_cut_at_any_step_is_finished_by_the_next_start() {
    use spoold::testing::{SimStorage, Tear};
    use spoold::time::ManualClock;

    let from = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/v1-spool");
    for cut in 0.. {
        let sim = SimStorage::new();
        for entry in std::fs::read_dir(&from).unwrap() {
            let entry = entry.unwrap();
            sim.set_file_bytes(
                &common::sim_dir().join(entry.file_name()),
                std::fs::read(entry.path()).unwrap(),
            );
        }
        let clock = ManualClock::new(FIXTURE_NOW_MS);
        let options = common::sim_options(&sim, &clock);
        sim.cut_power_after(cut);
        let first = Engine::open(options.clone()).await;
        let finished = !sim.power_is_cut();
        if let Ok((engine, _)) = first {
            engine.close();
        }
        sim.crash(Tear::DropUnsynced);
        let (engine, _) = Engine::open(options)
            .await
            .unwrap_or_else(|e| panic!("cut after {cut} changes: {e}"));
        check_contents(&engine).await;
        if finished {
            assert!(cut > 3, "an upgrade takes several steps");
            return;
        }
    }
}
