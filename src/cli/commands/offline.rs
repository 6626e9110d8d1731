//! The commands that need no server: `check-config`, `openapi`, the
//! journal tools and `cluster repair-vote`. Each prints what it found to
//! `out`; only `journal verify` says something with its exit code.

use std::io::Write;
use std::path::Path;
use std::process::ExitCode;

use anyhow::Context as _;

use super::{env_api_keys, print_out};
use crate::cli::journal;
use crate::config::Config;

/// `spoold check-config`: the same checks `run` makes before it serves:
/// the file, then the exposure (a key when listening beyond loopback,
/// `SPOOLD_API_KEYS` included), then a replica's secret. Prints the
/// effective config.
pub fn check_config(path: &Path, out: &mut impl Write) -> anyhow::Result<ExitCode> {
    let config = Config::load(path)?;
    config
        .check_exposure(env_api_keys().as_deref())
        .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    // What `run` asks before it serves: a replica needs its secret.
    if let Some(cluster) = &config.cluster {
        cluster
            .secret(std::env::var("SPOOLD_CLUSTER_SECRET").ok().as_deref())
            .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    }
    print_out(out, &config.effective_toml())?;
    Ok(ExitCode::SUCCESS)
}

/// `spoold openapi`: the document `/v1/openapi.json` serves.
pub fn openapi(out: &mut impl Write) -> anyhow::Result<ExitCode> {
    print_out(out, &(crate::openapi_document() + "\n"))?;
    Ok(ExitCode::SUCCESS)
}

/// `spoold journal verify`: every damaged span; exit 1 if there is one, so
/// that a script can tell.
pub fn verify_journal(dir: &Path, out: &mut impl Write) -> anyhow::Result<ExitCode> {
    let report = journal::verify(dir)?;
    print_out(out, &report.render(dir))?;
    Ok(if report.is_clean() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// `spoold journal repair`.
pub fn repair_journal(dir: &Path, out: &mut impl Write) -> anyhow::Result<ExitCode> {
    let report = journal::repair(dir)?;
    print_out(out, &report.render(dir))?;
    Ok(ExitCode::SUCCESS)
}

/// `spoold journal upgrade`.
pub fn upgrade_journal(dir: &Path, out: &mut impl Write) -> anyhow::Result<ExitCode> {
    let report = journal::upgrade(dir)?;
    print_out(out, &report.render(dir))?;
    Ok(ExitCode::SUCCESS)
}

/// `spoold journal compact`: compaction is the engine's, which runs on a
/// runtime; one thread is enough offline.
pub fn compact_journal(dir: &Path, out: &mut impl Write) -> anyhow::Result<ExitCode> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let text = runtime.block_on(journal::compact(dir))?;
    print_out(out, &text)?;
    Ok(ExitCode::SUCCESS)
}

/// `spoold cluster repair-vote`: offline, on a stopped replica's spool.
/// It replays the log to learn its last term: on a runtime, as compaction.
pub fn repair_vote(dir: &Path, term: u64, out: &mut impl Write) -> anyhow::Result<ExitCode> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let said = runtime.block_on(journal::repair_vote(dir, term))?;
    print_out(out, &said)?;
    Ok(ExitCode::SUCCESS)
}
