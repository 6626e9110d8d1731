//! Operator subcommands that talk to a running server over its HTTP API:
//! `queues`, `stats`, `queue set|pause|resume|probe|close-breaker`, `tail`,
//! `send`, `events send`, `history list|show|resend`,
//! `dlq list|show|redrive|purge` and `cluster status|add|remove`.
//!
//! Each writes what it has to say to a
//! [`Terminal`](crate::cli::term::Terminal), which escapes whatever a
//! sender or a destination stored: a table or lines for people, or with
//! `--json` one JSON object per line. Every failure is one readable line
//! (`spoold: <kind>: <message>`, with the cause) and a non-zero exit;
//! `main` prints it. A dead-letter command accepts the queue's name or its
//! failure queue's (`hooks` or `hooks.failed`).
//!
//! The rooms, each using only those listed before it:
//!
//! - `client`: the HTTP side. The API key, the one retry at the primary a
//!   replica names, and every failure as an [`OpsError`].
//! - `table`: columns for people, laid out by comfy-table.
//! - `filters`: the flags that select messages, checked before anything is
//!   sent.
//! - `message`: the message answer that `tail`, `history` and `dlq` share,
//!   fetched page by page.
//! - one file per command group: `queues` (with the queue answer that
//!   `settings` prints too), `settings`, `tail`, `send`, `events`,
//!   `history`, `dead_letters`, `cluster`.
//!
//! An answer is read into a struct of the fields the command shows, so
//! what people read is built from named, typed fields. `--json` prints the
//! server's JSON instead: scripts get every field, including those this
//! CLI does not know yet.

mod client;
mod cluster;
mod dead_letters;
mod events;
mod filters;
mod history;
mod message;
mod portal;
mod queues;
mod secrets;
mod send;
mod settings;
mod table;
mod tail;

use std::fmt::Display;
use std::io::Write;

use serde_json::Value;

pub use client::{OpsError, Target};
pub use cluster::{cluster_add, cluster_remove, cluster_status};
pub use dead_letters::{Bulk, dlq_list, dlq_purge, dlq_redrive, dlq_show};
pub use events::{Event, events_send};
pub use filters::{DeadLetterArgs, HistoryArgs, SearchArgs};
pub use history::{deliveries, history_list, history_resend, history_show};
pub use portal::{PortalLink, portal_link};
pub use queues::{QueueAction, QueueFilter, queue_action, queue_stats, queues};
pub use secrets::rotate_secret;
pub use send::{Keys, send};
pub use settings::{queue_set, settings_patch};
pub use tail::{TailEnd, tail};

use crate::time::Millis;

/// Writes one JSON object per line (`--json`).
fn json_lines(out: &mut impl Write, items: &[Value]) -> Result<(), OpsError> {
    for item in items {
        writeln!(out, "{item}")?;
    }
    Ok(())
}

/// A field an answer may leave out, as `-` when it does.
fn or_dash(value: Option<impl Display>) -> String {
    value.map_or_else(|| "-".to_owned(), |v| v.to_string())
}

/// Now, for the relative times of the filters (`--since 2h`).
fn now_ms() -> Millis {
    crate::time::Clock::now_ms(&crate::time::SystemClock)
}
