//! Helpers shared by the integration tests.
#![allow(dead_code)]

pub mod process;
pub mod sink;

use std::path::PathBuf;
use std::sync::Arc;

use spoold::engine::{Engine, EngineOptions, SendRequest};
use spoold::journal::JournalError;
use spoold::journal::sim::SimStorage;
use spoold::spool::{Payload, QueueSettings};
use spoold::time::ManualClock;

pub const START_MS: i64 = 1_800_000_000_000;

pub fn sim_dir() -> PathBuf {
    PathBuf::from("/spool")
}

pub fn sim_options(sim: &SimStorage, clock: &ManualClock) -> EngineOptions {
    EngineOptions {
        dir: sim_dir(),
        segment_bytes: 64 << 20,
        fsync: true,
        storage: Arc::new(sim.clone()),
        clock: Arc::new(clock.clone()),
        lock: false,
        // Most tests keep files small; the ones about preallocation turn it
        // on with small segments.
        preallocate: false,
        max_bytes: u64::MAX,
        quarantine_corruption: false,
    }
}

pub async fn open(sim: &SimStorage, clock: &ManualClock) -> Result<Engine, JournalError> {
    Engine::open(sim_options(sim, clock)).await.map(|(e, _)| e)
}

pub fn body(text: &str) -> SendRequest {
    SendRequest {
        payload: Payload {
            content_type: "text/plain".into(),
            request: None,
            body: text.as_bytes().to_vec().into(),
        },
        ..SendRequest::default()
    }
}

pub async fn make_queue(engine: &Engine, name: &str, settings: QueueSettings) {
    engine
        .upsert_queue(name, settings, false)
        .await
        .expect("create queue");
}

/// Starts the server in this process on 127.0.0.1:0 with its spool in
/// `dir`; `toml` follows the `listen` line (more `[server]` keys, then
/// tables). Returns once `/readyz` answers 200.
pub async fn serve_in_process(
    dir: &std::path::Path,
    toml: &str,
) -> (spoold::serve::Running, String) {
    let text = format!("[server]\nlisten = \"127.0.0.1:0\"\n{toml}\n");
    let mut config = spoold::config::Config::parse(&text).unwrap();
    config.spool.dir = dir.to_path_buf();
    config.spool.segment_bytes = 1 << 20;
    let running = spoold::serve::start(config, None).await.unwrap();
    let base = format!("http://{}", running.addr);
    spoold::delivery::client::install_crypto_provider();
    let client = reqwest::Client::new();
    while !client
        .get(format!("{base}/readyz"))
        .send()
        .await
        .is_ok_and(|r| r.status() == 200)
    {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    (running, base)
}
