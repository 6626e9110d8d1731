//! Named fail points, in the manner of raft-engine's `fail_point!`: the
//! places where a crash test stops the process on purpose, at a moment
//! that timing or `strace` could only hope to hit.
//!
//! A point is armed through the environment of a binary built with the
//! `testing` feature (every test build is):
//!
//! ```text
//! SPOOLD_FAIL_POINTS=compact.before_swap=exit,raft.before_apply=exit@300
//! ```
//!
//! `exit` ends the process the first time it reaches the point, `exit@N`
//! the N-th time (every replica applies the same records in the same
//! order, so `raft.before_apply=exit@N` stops each at the same record).
//! It ends at once with [`EXIT_CODE`], as `kill -9` would
//! at that point: no destructor runs, nothing more is written or fsynced,
//! and what the page cache holds stays (as after a crash of the process,
//! not of the machine). Without the `testing` feature [`hit`] is an empty
//! inline function and the variable is never read.

/// Compaction wrote its pack (step 2 of `engine/compact.rs`) and not yet
/// the checkpoint that points at it.
pub const COMPACT_BEFORE_CHECKPOINT: &str = "compact.before_checkpoint";
/// Compaction's checkpoint is renamed into place (the point of no
/// return) and memory not yet swapped to the new files, nor the old ones
/// deleted.
pub const COMPACT_BEFORE_SWAP: &str = "compact.before_swap";
/// A received snapshot's checkpoint is renamed into place and the log not
/// yet restarted after it (`engine/replicated/snapshot/install.rs`).
pub const SNAPSHOT_BEFORE_RESTART: &str = "snapshot.before_restart";
/// A committed record is durable on this replica and not yet applied
/// (`engine/replicated/log.rs`, `apply_committed`).
pub const RAFT_BEFORE_APPLY: &str = "raft.before_apply";
/// The timer's history drops are durable and applied, and no checkpoint
/// covers them yet (`engine/timer.rs`).
pub const HISTORY_DROPPED: &str = "history.dropped";

/// The environment variable that arms fail points.
#[cfg(any(test, feature = "testing"))]
pub const ENV: &str = "SPOOLD_FAIL_POINTS";

/// The exit status of a process a fail point ended.
#[cfg(any(test, feature = "testing"))]
pub const EXIT_CODE: i32 = 86;

/// Ends the process if fail point `name` is armed.
#[cfg(any(test, feature = "testing"))]
pub(crate) fn hit(name: &str) {
    use std::sync::atomic::Ordering;
    static ARMED: std::sync::OnceLock<Vec<Armed>> = std::sync::OnceLock::new();
    let armed = ARMED.get_or_init(|| armed(std::env::var(ENV).ok().as_deref()));
    for a in armed.iter().filter(|a| a.name == name) {
        if a.reached.fetch_add(1, Ordering::Relaxed) + 1 == a.exit_at {
            eprintln!("spoold: fail point {name}: exiting with {EXIT_CODE}");
            std::process::exit(EXIT_CODE);
        }
    }
}

/// A point a test armed: the process exits the `exit_at`-th time it is
/// reached.
#[cfg(any(test, feature = "testing"))]
#[derive(Debug)]
struct Armed {
    name: String,
    exit_at: u64,
    reached: std::sync::atomic::AtomicU64,
}

/// Without the `testing` feature no point can be armed.
#[cfg(not(any(test, feature = "testing")))]
#[inline(always)]
pub(crate) fn hit(_name: &str) {}

/// The points `spec` arms: `name=exit` or `name=exit@N` entries,
/// comma-separated. An entry with another action, or none, is a mistake in
/// a test: it panics, so the test does not pass by never reaching its
/// crash.
#[cfg(any(test, feature = "testing"))]
fn armed(spec: Option<&str>) -> Vec<Armed> {
    let known = [
        COMPACT_BEFORE_CHECKPOINT,
        COMPACT_BEFORE_SWAP,
        SNAPSHOT_BEFORE_RESTART,
        RAFT_BEFORE_APPLY,
        HISTORY_DROPPED,
    ];
    spec.unwrap_or_default()
        .split(',')
        .map(str::trim)
        .filter(|entry| !entry.is_empty())
        .map(|entry| {
            let (name, action) = entry.split_once('=').unwrap_or((entry, ""));
            let exit_at = match action.split_once('@') {
                None if action == "exit" => Some(1),
                Some(("exit", n)) => n.parse().ok().filter(|&n| n > 0),
                _ => None,
            };
            match exit_at {
                Some(exit_at) if known.contains(&name) => Armed {
                    name: name.to_owned(),
                    exit_at,
                    reached: Default::default(),
                },
                _ => panic!("{ENV}: {entry:?} is not a known point's name=exit[@N]"),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn points_are_armed_by_name() {
        assert!(armed(None).is_empty());
        let points: Vec<(String, u64)> =
            armed(Some("compact.before_swap=exit, raft.before_apply=exit@300"))
                .into_iter()
                .map(|a| (a.name, a.exit_at))
                .collect();
        assert_eq!(
            points,
            [
                (COMPACT_BEFORE_SWAP.to_owned(), 1),
                (RAFT_BEFORE_APPLY.to_owned(), 300)
            ]
        );
    }

    #[test]
    #[should_panic(expected = "is not a known point")]
    fn a_misspelt_point_is_refused() {
        armed(Some("compact.before_swop=exit"));
    }

    #[test]
    #[should_panic(expected = "is not a known point")]
    fn an_exit_at_zero_is_refused() {
        armed(Some("raft.before_apply=exit@0"));
    }
}
