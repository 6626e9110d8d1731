//! Replay of arbitrary segment bytes: start-up (refusing and quarantining),
//! `journal verify` and the raw scanner each truncate, refuse or
//! quarantine; none may panic.
//!
//! The first input byte picks how the rest becomes segment 1:
//! - 0: the whole file, header included;
//! - 1: a valid header, then the bytes as they are;
//! - 2: a valid header, then the bytes cut into records (kind, 2-byte
//!   length, body) sealed with valid checksums and sequence numbers, so the
//!   record decoder and the state machine see arbitrary bodies; whatever is
//!   left over becomes a torn tail.
#![no_main]

use std::path::Path;
use std::sync::Arc;

use libfuzzer_sys::fuzz_target;
use spoold::engine::{Engine, EngineOptions};
use spoold::journal::format::{
    FRAME_HEADER_BYTES, FrameHeader, SegmentHeader, SpoolIdentity, segment_file_name,
};
use spoold::journal::scan::scan_dir;
use spoold::journal::sim::SimStorage;
use spoold::journal::storage::Storage;
use spoold::spool::Record;
use spoold::time::ManualClock;

const SALT: u64 = 0x5eed_5eed_5eed_5eed;

fn segment(mode: u8, data: &[u8]) -> Vec<u8> {
    if mode % 3 == 0 {
        return data.to_vec();
    }
    let header = SegmentHeader {
        flags: 0,
        salt: SALT,
        segment_id: 1,
        first_seq: 1,
        compacted_through: 0,
        id_floor: 0,
        covers_from: 0,
    };
    let mut out = header.encode().to_vec();
    if mode % 3 == 1 {
        out.extend_from_slice(data);
        return out;
    }
    let mut rest = data;
    let mut seq = 1;
    while rest.len() >= 3 {
        let kind = rest[0];
        let len = usize::from(u16::from_le_bytes([rest[1], rest[2]]));
        if rest.len() < 3 + len {
            break;
        }
        let mut frame = vec![0u8; FRAME_HEADER_BYTES + len];
        frame[FRAME_HEADER_BYTES..].copy_from_slice(&rest[3..3 + len]);
        FrameHeader::seal(&mut frame, SALT, seq, kind);
        out.extend_from_slice(&frame);
        seq += 1;
        rest = &rest[3 + len..];
    }
    out.extend_from_slice(rest);
    out
}

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
        quarantine_corruption: quarantine,
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
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let dir = Path::new("/spool");
    let identity = SpoolIdentity {
        salt: SALT,
        token_key: [9; 32],
    };
    let bytes = segment(mode, rest);
    for quarantine in [false, true] {
        let sim = SimStorage::new();
        sim.set_file_bytes(&dir.join("spool.meta"), identity.encode().to_vec());
        sim.set_file_bytes(&dir.join(segment_file_name(1)), bytes.clone());
        let storage: Arc<dyn Storage> = Arc::new(sim.clone());
        if !quarantine {
            let _ = scan_dir(&storage, dir, SALT, |rec| {
                let _ = Record::decode(rec.kind, rec.body);
                Ok(())
            });
            let _ = spoold::cli::journal::verify_with(storage, dir);
        }
        open(&sim, quarantine);
    }
});
