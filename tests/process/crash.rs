//! `kill -9` with real processes: a child process sends and acks
//! concurrently on a real spool directory and prints every answer it got;
//! the parent kills it at a random moment, many rounds, and after each round
//! replays the spool and checks that every acknowledged send is there and no
//! acknowledged ack came back.
//!
//! The child is this same test binary, re-run with an environment variable
//! that makes the test act as the child.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use spoold::engine::{Engine, EngineOptions};
use spoold::spool::QueueSettings;
use spoold::testing::text_message;

const CHILD_ENV: &str = "SPOOLD_CRASH_TEST_CHILD_DIR";
/// The test's full name in the `process` test binary (its module, then the
/// function), which the child is started with (`--exact`).
const TEST_NAME: &str = "crash::kill_9_never_loses_an_acknowledged_send_nor_resurrects_an_ack";
const ROUNDS: usize = 12;
const WRITERS: usize = 16;

#[test]
fn kill_9_never_loses_an_acknowledged_send_nor_resurrects_an_ack() {
    if let Ok(dir) = std::env::var(CHILD_ENV) {
        child(Path::new(&dir));
    }
    let dir = tempfile::tempdir().unwrap();
    let mut sent: BTreeSet<String> = BTreeSet::new();
    let mut acked: BTreeSet<String> = BTreeSet::new();
    // Acks that were sent but whose answer the kill may have cut off: such a
    // message may be gone without an "acked" line.
    let mut acking: BTreeSet<String> = BTreeSet::new();
    let mut attempts = 0usize;
    for round in 0..ROUNDS {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([TEST_NAME, "--exact", "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, dir.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let lines = Arc::new(Mutex::new(Vec::<String>::new()));
        let reader = {
            let lines = lines.clone();
            let stdout = child.stdout.take().unwrap();
            std::thread::spawn(move || {
                let mut stdout = BufReader::new(stdout);
                let mut line = Vec::new();
                loop {
                    line.clear();
                    match stdout.read_until(b'\n', &mut line) {
                        // A line cut short by the kill has no newline: skip it.
                        Ok(n) if n > 0 && line.ends_with(b"\n") => {
                            let text = String::from_utf8_lossy(&line).trim_end().to_string();
                            lines.lock().unwrap().push(text);
                        }
                        _ => break,
                    }
                }
            })
        };
        let alive_ms = 150 + rand::random::<u64>() % 600;
        std::thread::sleep(Duration::from_millis(alive_ms));
        child.kill().expect("SIGKILL the child");
        child.wait().unwrap();
        reader.join().unwrap();
        for line in lines.lock().unwrap().iter() {
            // The child is this test binary: its first line of output shares
            // a line with libtest's "test <name> ... " banner.
            let line = line
                .rsplit_once(" ... ")
                .map_or(line.as_str(), |(_, rest)| rest);
            if let Some(id) = line.strip_prefix("sent ") {
                sent.insert(id.to_string());
            } else if let Some(id) = line.strip_prefix("acked ") {
                acked.insert(id.to_string());
            } else if let Some(id) = line.strip_prefix("acking ") {
                acking.insert(id.to_string());
            } else if line.starts_with("attempt") {
                attempts += 1;
            }
        }

        let present = replay_ids(dir.path());
        let lost: Vec<&String> = sent
            .difference(&present)
            .filter(|id| !acking.contains(*id))
            .collect();
        let resurrected: Vec<&String> = acked.intersection(&present).collect();
        assert!(
            lost.is_empty(),
            "round {round}: acknowledged sends lost: {lost:?}"
        );
        assert!(
            resurrected.is_empty(),
            "round {round}: acked messages came back: {resurrected:?}"
        );
        let unexpected = present.difference(&sent).count();
        println!(
            "round {round}: alive {alive_ms} ms, sends acknowledged so far {}, acks {}, in spool {}, \
             present but unanswered (allowed) {unexpected}",
            sent.len(),
            acked.len(),
            present.len()
        );
    }
    assert!(
        sent.len() > ROUNDS * 10,
        "the child barely sent anything: {}",
        sent.len()
    );
    assert!(!acked.is_empty(), "the consumer never acked");
    println!(
        "{ROUNDS} kills: {} sends and {} acks acknowledged, {attempts} sends attempted, 0 lost, 0 resurrected",
        sent.len(),
        acked.len()
    );
}

/// Small segments, so that the child rotates into preallocated spares often
/// and a kill lands in the middle of that too.
fn options(dir: &Path) -> EngineOptions {
    let mut options = EngineOptions::new(dir);
    options.segment_bytes = 256 << 10;
    options
}

/// Opens the spool as a new process would and lists its message ids.
fn replay_ids(dir: &Path) -> BTreeSet<String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let (engine, _) = Engine::open(options(dir))
            .await
            .expect("replay after kill -9");
        let ids = engine
            .all_messages()
            .into_iter()
            .map(|(_, id, _)| engine.tokens().format_id(id))
            .collect();
        engine.close();
        ids
    })
}

/// The child: writers and one consumer, until killed.
fn child(dir: &Path) -> ! {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let (engine, _) = Engine::open(options(dir)).await.unwrap();
        engine
            .upsert_queue("q", QueueSettings::default(), spoold::engine::Origin::Api)
            .await
            .unwrap();
        for w in 0..WRITERS {
            let engine = engine.clone();
            tokio::spawn(async move {
                for n in 0.. {
                    println!("attempt {w}-{n}");
                    let request = text_message(format!("writer {w} message {n} {:0>1000}", 0));
                    if let Ok(out) = engine.send("q", request).await {
                        println!("sent {}", engine.tokens().format_id(out.id));
                    }
                }
            });
        }
        loop {
            let got = engine
                .receive("q", 10, Duration::from_millis(100))
                .await
                .unwrap();
            for d in got {
                println!("acking {}", engine.tokens().format_id(d.id));
                if engine.ack("q", &d.token).await.is_ok() {
                    println!("acked {}", engine.tokens().format_id(d.id));
                }
            }
        }
    })
}
