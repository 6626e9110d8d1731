//! A bounded soak on the real file system: senders, consumers, the expiry
//! timer and the background compactor run together on a small spool
//! (64 KiB segments, 1 MiB `max_bytes`) for `SPOOLD_SOAK_SECONDS` (default
//! 30). Disk usage must stay under `max_bytes` the whole time, and after a
//! restart every acknowledged, unacked message is there and no acked one is.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use spoold::engine::{Engine, EngineOptions, Origin, SendError};
use spoold::spool::{MessageId, QueueSettings};
use spoold::testing::text_message;

const SEGMENT_BYTES: u64 = 64 << 10;
const MAX_BYTES: u64 = 1 << 20;

fn options(dir: &Path) -> EngineOptions {
    let mut options = EngineOptions::new(dir);
    options.segment_bytes = SEGMENT_BYTES;
    options.max_bytes = MAX_BYTES;
    options
}

/// Opens the spool in `dir` with a queue `q`.
async fn open_with_queue(dir: &Path) -> Engine {
    let (engine, _) = Engine::open(options(dir)).await.unwrap();
    engine
        .upsert_queue("q", QueueSettings::default(), Origin::Api)
        .await
        .unwrap();
    engine
}

/// Bytes of every journal file in `dir` (segments, spares, temp files).
fn disk_usage(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            name.ends_with(".seg") || name.ends_with(".tmp")
        })
        .filter_map(|e| e.metadata().ok())
        .map(|m| m.len())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soak_sends_acks_and_compactions_stay_under_max_bytes_and_lose_nothing() {
    let seconds: u64 = std::env::var("SPOOLD_SOAK_SECONDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(30);
    let dir = tempfile::tempdir().unwrap();
    let engine = open_with_queue(dir.path()).await;
    let _timer = engine.spawn_timer();
    let _compactor = engine.spawn_compactor(Duration::from_millis(50));

    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(Mutex::new(BTreeSet::<MessageId>::new()));
    let acked = Arc::new(Mutex::new(BTreeSet::<MessageId>::new()));
    let refused = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for w in 0..4 {
        let (engine, stop, sent, refused) =
            (engine.clone(), stop.clone(), sent.clone(), refused.clone());
        tasks.push(tokio::spawn(async move {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                let request = text_message(format!("w{w} n{n} {:0>480}", 0));
                match engine.send("q", request).await {
                    Ok(out) => {
                        sent.lock().unwrap().insert(out.id);
                    }
                    Err(SendError::SpoolFull { .. }) => {
                        refused.fetch_add(1, Ordering::Relaxed);
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                    Err(e) => panic!("send failed: {e}"),
                }
            }
        }));
    }
    for _ in 0..2 {
        let (engine, stop, acked) = (engine.clone(), stop.clone(), acked.clone());
        tasks.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let got = engine
                    .receive("q", 50, Duration::from_millis(100))
                    .await
                    .unwrap();
                // Leave every tenth message unacked: it comes back after its
                // lease, and some stay in the spool at the end.
                for d in got.iter().filter(|d| d.id.0 % 10 != 0) {
                    if engine.ack("q", &d.token).await.is_ok() {
                        acked.lock().unwrap().insert(d.id);
                    }
                }
            }
        }));
    }

    let started = Instant::now();
    let mut max_seen = 0u64;
    while started.elapsed() < Duration::from_secs(seconds) {
        let usage = disk_usage(dir.path());
        max_seen = max_seen.max(usage);
        assert!(
            usage <= MAX_BYTES,
            "disk usage {usage} > max_bytes {MAX_BYTES}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.unwrap();
    }
    engine.close();
    drop(engine);

    let (engine, report) = Engine::open(options(dir.path())).await.unwrap();
    let present: BTreeSet<MessageId> = engine.all_messages().into_iter().map(|m| m.1).collect();
    let sent = sent.lock().unwrap();
    let acked = acked.lock().unwrap();
    let lost: Vec<_> = sent
        .difference(&acked)
        .filter(|id| !present.contains(id))
        .collect();
    let resurrected: Vec<_> = acked.intersection(&present).collect();
    assert!(
        lost.is_empty(),
        "lost {} messages: {:?}",
        lost.len(),
        &lost[..lost.len().min(10)]
    );
    assert!(
        resurrected.is_empty(),
        "acked messages came back: {resurrected:?}"
    );
    assert!(
        sent.len() > 1000,
        "the soak barely sent anything: {}",
        sent.len()
    );
    println!(
        "soak {seconds} s: {} sends, {} acks, {} refused while full, {} left, \
         disk peak {max_seen} of {MAX_BYTES} bytes, {} records replayed",
        sent.len(),
        acked.len(),
        refused.load(Ordering::Relaxed),
        present.len(),
        report.records
    );
}

/// `close` hands the directory over: a new engine may open it while a
/// handle of the old one (say, a compaction task finishing) still exists,
/// and the old one's compactor touches nothing afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_engine_releases_its_directory_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open_with_queue(dir.path()).await;
    let _compactor = engine.spawn_compactor(Duration::from_millis(1));
    let straggler = engine.clone();
    engine.close();
    let (reopened, report) = Engine::open(options(dir.path())).await.unwrap();
    assert_eq!(report.messages, 0);
    assert!(reopened.queue_names().contains(&"q".to_string()));
    assert_eq!(
        straggler.compact_once(true).unwrap(),
        None,
        "a closed engine compacts nothing"
    );
    drop(straggler);
}
