//! Every spool in `tests/data` by the format version and the level of
//! format 2 that it holds, as redb's `backward_compatibility.rs` keeps one
//! database per earlier release: today's build must open each of them,
//! and a build whose format version or level (`spoold::testing`) has no
//! spool here fails, so that a new format or level lands with a spool
//! written by its own first build (a script like
//! `tests/data/write-v2-level5.sh`), a row in [`FIXTURES`] and an entry in
//! `tests/data/README.md`. What each spool holds is checked by its own
//! test (`upgrade.rs`, `fixtures.rs`, `tests/process/fixtures.rs`,
//! `tests/cluster/fixtures.rs`); this table only keeps the set complete.

use crate::common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use spoold::engine::{Engine, EngineOptions};
use spoold::testing::{FORMAT_VERSION, READS_LEVEL};
use spoold::time::ManualClock;

/// How a fixture is opened.
enum Open {
    /// A single node's spool: `Engine::open` on a copy (which upgrades
    /// format 1), on the clock its own test runs on, a minute after it
    /// was written.
    Engine { now_ms: i64 },
    /// `replica-1` to `replica-3` of a cluster: each read whole by `journal
    /// verify` (`tests/cluster/fixtures.rs` restarts them as a cluster).
    Replicas,
}

struct Fixture {
    format: u32,
    /// The level of format 2 that it holds (`docs/journal-format.md`); 0
    /// in format 1, which has none.
    level: u64,
    /// Its directory under `tests/data`.
    dir: &'static str,
    open: Open,
}

/// Levels 3 and 4 have no spool of their own (they were released before
/// this table): `v2-level5` holds what they added (fingerprinted event
/// keys, ordering keys, a secret-expire record).
const FIXTURES: &[Fixture] = &[
    Fixture {
        format: 1,
        level: 0,
        dir: "v1-spool",
        open: Open::Engine {
            now_ms: super::upgrade::FIXTURE_NOW_MS,
        },
    },
    Fixture {
        format: 2,
        level: 1,
        dir: "v2-before-events",
        open: Open::Engine {
            now_ms: super::fixtures::BEFORE_EVENTS_NOW_MS,
        },
    },
    Fixture {
        format: 2,
        level: 1,
        dir: "v2-cluster-membership-v1",
        open: Open::Replicas,
    },
    Fixture {
        format: 2,
        level: 1,
        dir: "v2-cluster-membership-v2",
        open: Open::Replicas,
    },
    Fixture {
        format: 2,
        level: 2,
        dir: "v2-events-history",
        open: Open::Engine {
            now_ms: super::fixtures::EVENTS_HISTORY_NOW_MS,
        },
    },
    Fixture {
        format: 2,
        level: 5,
        dir: "v2-level5",
        open: Open::Engine {
            now_ms: common::V2_LEVEL5_NOW_MS,
        },
    },
];

fn data_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data")
}

#[test]
fn this_build_s_format_and_level_have_a_fixture() {
    assert!(
        FIXTURES
            .iter()
            .any(|f| (f.format, f.level) == (FORMAT_VERSION, READS_LEVEL)),
        "this build writes format {FORMAT_VERSION} at level {READS_LEVEL}, and no spool in \
         tests/data holds it: write one with this build (as tests/data/write-v2-level5.sh \
         did), describe it in tests/data/README.md and add it to FIXTURES"
    );
    for f in FIXTURES {
        assert!(
            (f.format, f.level) <= (FORMAT_VERSION, READS_LEVEL),
            "{} is of format {} level {}, newer than this build reads",
            f.dir,
            f.format,
            f.level
        );
    }
}

/// A spool added to `tests/data` without a row (or a row whose spool is
/// gone) fails: the table is the list of what every build must open.
#[test]
fn every_spool_in_tests_data_has_a_row() {
    let mut on_disk: Vec<String> = std::fs::read_dir(data_dir())
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.file_type().unwrap().is_dir())
        .map(|e| e.file_name().into_string().unwrap())
        .filter(|name| name != "golden")
        .collect();
    on_disk.sort();
    let mut rows: Vec<&str> = FIXTURES.iter().map(|f| f.dir).collect();
    rows.sort();
    assert_eq!(on_disk, rows);
}

async fn open_engine(spool: &Path, format: u32, now_ms: i64) {
    let report = spoold::cli::journal::verify(spool).unwrap();
    assert_eq!(report.old_format, format == 1, "{}", report.render(spool));
    assert!(report.is_clean(), "{}", report.render(spool));
    let mut options = EngineOptions::new(spool);
    options.segment_bytes = 64 << 10;
    options.preallocate = false;
    options.clock = Arc::new(ManualClock::new(now_ms));
    let (engine, _) = Engine::open(options)
        .await
        .unwrap_or_else(|e| panic!("{}: {e}", spool.display()));
    assert!(!engine.state().queues.is_empty(), "{}", spool.display());
    engine.close();
}

fn verify_replicas(dir: &Path) {
    for n in 1..=3 {
        let replica = dir.join(format!("replica-{n}"));
        let report = spoold::cli::journal::verify(&replica).unwrap();
        assert!(report.is_clean(), "{}", report.render(&replica));
        assert!(!report.old_format, "{}", replica.display());
    }
}

#[tokio::test]
async fn every_fixture_opens() {
    for f in FIXTURES {
        let dir = tempfile::tempdir().unwrap();
        let copy = dir.path().join(f.dir);
        common::copy_fixture(f.dir, &copy);
        match f.open {
            Open::Engine { now_ms } => open_engine(&copy, f.format, now_ms).await,
            Open::Replicas => verify_replicas(&copy),
        }
    }
}
