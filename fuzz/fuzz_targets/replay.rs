//! Replay of arbitrary segment bytes: start-up (refusing and quarantining),
//! `journal verify` and the raw scanner each truncate, refuse or
//! quarantine; none may panic.
//!
//! How an input becomes segment 1 is in `fuzz/replay_input.rs`, which
//! `tests/engine/fuzz.rs` shares to replay the inputs that once crashed.
#![no_main]

#[path = "../replay_input.rs"]
mod replay_input;

use std::path::Path;
use std::sync::Arc;

use libfuzzer_sys::fuzz_target;
use replay_input::{SALT, segment};
use spoold::engine::{Engine, EngineOptions};
use spoold::testing::{SpoolIdentity, segment_file_name};
use spoold::testing::scan_dir;
use spoold::testing::SimStorage;
use spoold::testing::Storage;
use spoold::testing::Record;
use spoold::time::ManualClock;

fn open(sim: &SimStorage, quarantine: bool) {
    let options = EngineOptions {
        dir: "/spool".into(),
        segment_bytes: 1 << 20,
        fsync: true,
        storage: Arc::new(sim.clone()),
        clock: Arc::new(ManualClock::new(1_800_000_000_000)),
        lock: false,
        preallocate: false,
        max_bytes: u64::MAX,
        max_memory: u64::MAX,
        quarantine_corruption: quarantine,
        policy: Default::default(),
        replicated: None,
        identity: None,
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let _ = Engine::open(options).await;
    });
}

fuzz_target!(|data: &[u8]| {
    let dir = Path::new("/spool");
    let identity = SpoolIdentity {
        salt: SALT,
        token_key: [9; 32],
    };
    let bytes = segment(data);
    for quarantine in [false, true] {
        let sim = SimStorage::new();
        sim.set_file_bytes(&dir.join("spool.meta"), identity.encode().to_vec());
        sim.set_file_bytes(&dir.join(segment_file_name(1)), bytes.clone());
        let storage: Arc<dyn Storage> = Arc::new(sim.clone());
        if !quarantine {
            let _ = scan_dir(&storage, dir, SALT, 0, |rec| {
                let _ = Record::decode(rec.kind, rec.body);
                Ok(())
            });
            let _ = spoold::cli::journal::verify_with(storage, dir);
        }
        open(&sim, quarantine);
    }
});
