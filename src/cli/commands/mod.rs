//! What each command of the `spoold` binary does as a process. `main.rs`
//! holds the command line (clap's definitions) and calls one function here
//! per command: the server's life around [`crate::serve`] (`run.rs`), the
//! commands that need no server (`offline.rs`), and what the operator
//! commands over HTTP need beyond a call of [`crate::cli::ops`] (a body
//! from standard input, the end of a tail).
//!
//! This is the binary's edge, so errors are `anyhow` here as in `main.rs`:
//! each becomes one line on standard error and an exit code
//! ([`exit_code`]).

mod offline;
mod run;

pub use offline::{
    check_config, compact_journal, openapi, repair_journal, repair_vote, upgrade_journal,
    verify_journal,
};
pub use run::run;

use std::io::Write;
use std::process::ExitCode;

use anyhow::Context as _;

use crate::cli::ops::{self, OpsError, Target};
use crate::cli::term::{Terminal, escape_controls};

/// Runs an operator command (calls to the running server) on a small
/// runtime of its own: one thread is plenty for a few requests.
pub fn on_server(
    command: impl std::future::Future<Output = Result<(), OpsError>>,
) -> anyhow::Result<ExitCode> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(command)?;
    Ok(ExitCode::SUCCESS)
}

/// `spoold tail`: follows the queue until the server ends the stream (it
/// is stopping), then says so on standard error, where it does not mix
/// with the messages.
pub async fn tail(
    target: &Target,
    queue: &str,
    lines: usize,
    json: bool,
    out: &mut Terminal<impl Write>,
) -> Result<(), OpsError> {
    let ops::TailEnd::ServerStopped = ops::tail(target, queue, lines, json, out).await?;
    eprintln!("spoold: the server stopped; tail ends");
    Ok(())
}

/// `spoold send`: sends the body (`--data`, else standard input) and
/// prints the new message's id.
pub async fn send(
    target: &Target,
    queue: &str,
    data: Option<String>,
    content_type: &str,
    keys: ops::Keys<'_>,
    out: &mut impl Write,
) -> Result<(), OpsError> {
    let body = body(data)?;
    let id = ops::send(target, queue, body, content_type, keys).await?;
    writeln!(out, "{id}")?;
    Ok(())
}

/// A message's body or an event's payload: `--data` as given, else all of
/// standard input (so that a file or a pipe can be sent as it is).
pub fn body(data: Option<String>) -> std::io::Result<Vec<u8>> {
    match data {
        Some(d) => Ok(d.into_bytes()),
        None => {
            let mut buf = Vec::new();
            std::io::Read::read_to_end(&mut std::io::stdin(), &mut buf)?;
            Ok(buf)
        }
    }
}

/// How a command's end becomes the process's: its own exit code, or its
/// error as one line on standard error (control characters escaped unless
/// `raw`) and exit 2 for a wrong flag value, 1 for anything else. A reader
/// of our output that went away (`spoold dlq list q | head`) is a quiet
/// success: nothing is wrong and nobody is left to tell.
pub fn exit_code(result: anyhow::Result<ExitCode>, raw: bool) -> ExitCode {
    match result {
        Ok(code) => code,
        Err(e) if is_broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            let text = format!("{e:#}");
            let text = if raw {
                text.into()
            } else {
                escape_controls(&text)
            };
            eprintln!("spoold: {text}");
            match e.downcast_ref::<OpsError>() {
                Some(OpsError::Usage(_)) => ExitCode::from(2),
                _ => ExitCode::from(1),
            }
        }
    }
}

fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|cause| {
        let io = cause.downcast_ref::<std::io::Error>().or_else(|| {
            match cause.downcast_ref::<OpsError>() {
                Some(OpsError::Io(io)) => Some(io),
                _ => None,
            }
        });
        io.is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

/// Prints `text` to `out` (a closed pipe surfaces as an error that
/// [`exit_code`] treats as a quiet end).
fn print_out(out: &mut impl Write, text: &str) -> anyhow::Result<()> {
    out.write_all(text.as_bytes())?;
    out.flush()?;
    Ok(())
}

/// The API keys from the environment (`SPOOLD_API_KEYS`), which count as
/// the config's own for `run` and `check-config` alike.
fn env_api_keys() -> Option<String> {
    std::env::var("SPOOLD_API_KEYS").ok()
}
