//! Arbitrary-input harnesses (the fallback the reliability issue allows
//! where `cargo fuzz` cannot run): random bytes and random mutations of real
//! journals, configs, lease tokens, forward paths. None may panic; replay
//! must truncate, refuse or quarantine, never crash.

#[path = "../../fuzz/replay_input.rs"]
mod replay_input;

use std::sync::Arc;

use crate::common::*;
use proptest::prelude::*;
use spoold::config::Config;
use spoold::spool::QueueSettings;
use spoold::testing::Record;
use spoold::testing::Storage;
use spoold::testing::Tokens;
use spoold::testing::scan_dir;
use spoold::testing::{SimStorage, Tear};
use spoold::testing::{SpoolIdentity, segment_file_name};
use spoold::time::ManualClock;

/// A small real journal to mutate: its segment bytes and identity file.
fn real_journal() -> (Vec<u8>, Vec<u8>) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let sim = SimStorage::new();
        let clock = ManualClock::new(START_MS);
        let engine = open(&sim, &clock).await.unwrap();
        make_queue(&engine, "q", QueueSettings::default()).await;
        for i in 0..8 {
            engine.send("q", body(&format!("m{i}"))).await.unwrap();
        }
        let got = engine
            .receive("q", 2, std::time::Duration::ZERO)
            .await
            .unwrap();
        engine.ack("q", &got[0].token).await.unwrap();
        engine.nack("q", &got[1].token, 0).await.unwrap();
        drop(engine);
        sim.crash(Tear::DropUnsynced);
        let seg = sim
            .file_bytes(&sim_dir().join(segment_file_name(1)))
            .unwrap();
        let meta = sim.file_bytes(&sim_dir().join("spool.meta")).unwrap();
        (seg, meta)
    })
}

/// Replays `segment` (with `meta`) the way start-up and verify do; any
/// outcome but a panic is fine.
fn replay_bytes(segment: Vec<u8>, meta: Vec<u8>) {
    let sim = SimStorage::new();
    sim.set_file_bytes(&sim_dir().join("spool.meta"), meta);
    sim.set_file_bytes(&sim_dir().join(segment_file_name(1)), segment);
    let storage: Arc<dyn Storage> = Arc::new(sim.clone());
    if let Some(identity) = spoold::testing::load_identity(&storage, &sim_dir(), false)
        .ok()
        .flatten()
    {
        let _ = scan_dir(&storage, &sim_dir(), identity.salt, 0, |rec| {
            let _ = Record::decode(rec.kind, rec.body);
            Ok(())
        });
    }
    let _ = spoold::cli::journal::verify_with(storage.clone(), &sim_dir());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let clock = ManualClock::new(START_MS);
        let _ = open(&sim, &clock).await;
        let mut options = sim_options(&sim, &clock);
        options.quarantine_corruption = true;
        let _ = spoold::engine::Engine::open(options).await;
    });
}

/// Every input `cargo fuzz` ever found a crash with (kept in
/// `fuzz/regressions/replay/`) replays without a panic.
#[test]
fn replay_fuzz_regressions_never_panic() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/regressions/replay");
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let data = std::fs::read(entry.unwrap().path()).unwrap();
        let meta = SpoolIdentity {
            salt: replay_input::SALT,
            token_key: [9; 32],
        };
        replay_bytes(replay_input::segment(&data), meta.encode().to_vec());
        n += 1;
    }
    assert!(
        n >= 1,
        "the regression inputs are missing from {}",
        dir.display()
    );
}

/// The first crash `cargo fuzz` found: an epoch record carrying the last
/// u64, whose successor overflowed at start-up. Such a record is now
/// refused as one that does not decode, naming file and offset.
#[tokio::test]
async fn an_epoch_with_no_successor_is_refused_naming_the_offset() {
    // A record body is its time (i64), then the command's fields.
    let mut body = START_MS.to_le_bytes().to_vec();
    body.extend_from_slice(&u64::MAX.to_le_bytes());
    let mut input = vec![2u8, spoold::testing::kind::EPOCH, 16, 0];
    input.extend_from_slice(&body);
    let sim = SimStorage::new();
    let meta = SpoolIdentity {
        salt: replay_input::SALT,
        token_key: [9; 32],
    };
    sim.set_file_bytes(&sim_dir().join("spool.meta"), meta.encode().to_vec());
    sim.set_file_bytes(
        &sim_dir().join(segment_file_name(1)),
        replay_input::segment(&input),
    );
    let clock = ManualClock::new(START_MS);
    let Err(err) = open(&sim, &clock).await else {
        panic!("an epoch with no successor was replayed");
    };
    let err = err.to_string();
    assert!(err.contains("0000000000000001.seg at offset 64"), "{err}");
    assert!(err.contains("epoch out of range"), "{err}");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn replay_of_mutated_journals_never_panics(
        flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
        cut in any::<prop::sample::Index>(),
        do_cut in any::<bool>(),
    ) {
        let (mut seg, meta) = real_journal();
        for (i, byte) in flips {
            let at = i.index(seg.len());
            seg[at] ^= byte | 1;
        }
        if do_cut {
            seg.truncate(cut.index(seg.len() + 1));
        }
        replay_bytes(seg, meta);
    }

    #[test]
    fn replay_of_random_bytes_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
        let (_, meta) = real_journal();
        let mut seg = bytes.clone();
        replay_bytes(seg.clone(), meta.clone());
        // Random bytes behind a valid header exercise the record scanner.
        let (real, _) = real_journal();
        seg.splice(0..0, real[..64].iter().copied());
        replay_bytes(seg, meta);
        let _ = SpoolIdentity::decode(&bytes);
    }

    #[test]
    fn record_bodies_never_panic_the_decoder(kind in any::<u8>(), body in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = Record::decode(kind, &body);
        let _ = spoold::testing::decode_payload(&body);
        let _ = spoold::testing::decode_attempts(&body);
    }

    #[test]
    fn configs_never_panic_the_parser(text in "(\\[[a-z.]{0,12}\\]\\n)?([a-z_]{1,16} = (\"[ -~]{0,12}\"|[0-9]{1,6}|true|\\[\\])\\n){0,6}") {
        let _ = Config::parse(&text);
    }

    #[test]
    fn lease_tokens_and_ids_never_panic_the_parser(text in "[ -~]{0,80}") {
        let tokens = Tokens::new([3; 32], 7);
        prop_assert!(tokens.decode(&text).is_none() || text.len() <= 64);
        let _ = tokens.parse_id(&text);
    }

    #[test]
    fn forward_paths_never_escape_or_panic(segments in proptest::collection::vec("(\\.|\\.\\.|%2[eE]|%2[eE]%2[eE]|\\.%2e|[a-z]{1,3}|%2F|)", 0..8)) {
        let raw = format!("/{}", segments.join("/"));
        if let Ok(path) = spoold::testing::resolve_path(&raw) {
            let destination = spoold::testing::Destination::parse("https://h.example.com/base").unwrap();
            let target = destination.target(
                Some(&spoold::spool::StoredRequest { method: "POST".into(), path, query: String::new(), headers: vec![] }),
            );
            let url = target.expect("a resolved path always stays below the destination");
            prop_assert_eq!(url.host_str(), Some("h.example.com"));
            prop_assert!(url.path().starts_with("/base"));
        }
    }
}
