//! Replicas of different builds: which may replicate to which.
//!
//! A build reads the records and checkpoint chunks of its level and every
//! level before it (`journal::format::READS_LEVEL`), and writes those of its
//! own. A replica sent a chunk kind it does not know cannot install the
//! snapshot, and one sent a record flag it does not know applies the
//! record without what the flag says, and its state parts from the
//! others'. So a replica sends its level with every request and answer
//! (`spooler-cluster-level`), and refuses requests and answers of another
//! level: replicas of two levels behave as two sides of a partition.
//!
//! Upgrading one replica at a time keeps working: the first upgraded
//! replica stays apart while the others (a majority) go on; once a majority
//! runs the new build, they elect a primary among them and the rest wait,
//! each rejoining as it is upgraded (`docs/operations.md`, "Upgrades"). No
//! replica is ever sent what it cannot read.

use axum::http::HeaderMap;

/// The header every request and answer carries.
pub(crate) const LEVEL_HEADER: &str = "spooler-cluster-level";

/// The level this replica speaks: its build's, or under the `testing`
/// feature what `SPOOLD_TEST_READS_LEVEL` says (to run two levels side by
/// side in one test).
pub(crate) fn own() -> u64 {
    #[cfg(feature = "testing")]
    if let Some(level) = std::env::var("SPOOLD_TEST_READS_LEVEL")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        return level;
    }
    crate::journal::format::READS_LEVEL
}

/// Why a peer's request or answer is refused: its level is not ours
/// (`None`: it sent none, a build before levels).
pub(crate) fn mismatch(headers: &HeaderMap) -> Option<String> {
    let theirs = headers
        .get(LEVEL_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let ours = own();
    if theirs == Some(ours) {
        return None;
    }
    let theirs = theirs.map_or_else(
        || "a build before levels".to_owned(),
        |l| format!("level {l}"),
    );
    Some(format!(
        "the peer runs {theirs}, this replica level {ours}: replicas of different levels do not \
         replicate to each other; upgrade them all (docs/operations.md, \"Upgrades\")"
    ))
}
