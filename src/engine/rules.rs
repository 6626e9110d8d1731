//! The rules a queue must follow beyond each setting's own bounds
//! ([`QueueSettings::validate`]): its name, the server's policy on
//! destinations, who may name files on the local disk, and which changes
//! the config file owns. The engine applies them to every change, whoever
//! asks ([`Engine::upsert_queue`]); the config loader applies the same
//! function at load time, so `spoold check-config` refuses exactly what
//! `spoold run` would.
//!
//! [`Engine::upsert_queue`]: super::Engine::upsert_queue

use std::path::Path;

use super::guard::{Guard, Refusal};
use crate::spool::queue::{
    Field, QueueSettings, SettingsError, destination_host, valid_queue_name,
};
use crate::tls::tls_file;

/// Who asks for a queue change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// The config file (at start-up): it owns the queues it names.
    Config,
    /// The HTTP API (an operator or an application).
    Api,
}

/// What the server's configuration allows any queue, and any event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// Which addresses a destination may reach (`server.allowed_destinations`,
    /// never this node itself; `guard.rs`).
    pub guard: Guard,
    /// Most queues one event may go to (`events.max_subscribers`): an event
    /// that more queues subscribe to is refused.
    pub max_event_subscribers: usize,
    /// How long an event's idempotency key is remembered
    /// (`events.dedup_window`).
    pub event_dedup_window_ms: u64,
    /// Most queues (failure queues not counted; `server.max_queues`): the
    /// API creates none past it.
    pub max_queues: usize,
    /// History for event endpoints that set none (`[events]
    /// history_retention`, `history_max_bytes`): the API fills it in.
    pub history_default: crate::spool::queue::HistoryDefault,
}

/// Defaults of the `[events]` table.
pub(crate) const MAX_EVENT_SUBSCRIBERS_DEFAULT: usize = 10_000;
pub(crate) const EVENT_DEDUP_WINDOW_MS_DEFAULT: u64 = 24 * 3_600_000;
/// Default of `server.max_queues`: far past 100 000 endpoints, which one
/// node holds (docs/performance.md), and short of what would fill its
/// memory with empty queues.
pub(crate) const MAX_QUEUES_DEFAULT: usize = 200_000;

impl Default for Policy {
    fn default() -> Policy {
        Policy {
            guard: Guard::default(),
            max_event_subscribers: MAX_EVENT_SUBSCRIBERS_DEFAULT,
            event_dedup_window_ms: EVENT_DEDUP_WINDOW_MS_DEFAULT,
            max_queues: MAX_QUEUES_DEFAULT,
            history_default: Default::default(),
        }
    }
}

/// Why a queue change is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QueueRuleError {
    #[error("invalid queue name {name:?}: use 1 to 128 of [A-Za-z0-9_-]")]
    Name { name: String },
    /// A setting out of its bounds.
    #[error(transparent)]
    Settings(#[from] SettingsError),
    /// A destination the guard refuses: spoold itself, a link-local or
    /// metadata address, or one `server.allowed_destinations` leaves out.
    #[error(transparent)]
    Destination(#[from] Refusal),
    /// Files on the local disk are named in the config file only: over
    /// the API a caller could make spoold read any path (a FIFO, a
    /// device) and learn from the answer whether it exists.
    #[error("{} can be set only in the config file", .field.json_name())]
    FileOverApi { field: Field },
    /// A TLS file that is not a readable regular file of at most
    /// [`TLS_FILE_BYTES_MAX`](crate::tls::TLS_FILE_BYTES_MAX).
    #[error("{}: {problem}", .field.toml_name())]
    File { field: Field, problem: String },
}

/// Checks a queue change against every rule.
pub(crate) fn check(
    name: &str,
    settings: &QueueSettings,
    origin: Origin,
    policy: &Policy,
) -> Result<(), QueueRuleError> {
    if !valid_queue_name(name) {
        return Err(QueueRuleError::Name {
            name: name.to_string(),
        });
    }
    settings.validate()?;
    if let Some(dest) = &settings.destination {
        let (host, port) = destination_host(dest).map_err(|problem| SettingsError {
            field: Field::Destination,
            problem: problem.to_string(),
        })?;
        policy.guard.check_destination(&host, port)?;
    }
    for (field, path) in [
        (Field::CaFile, &settings.ca_file),
        (Field::ClientCert, &settings.client_cert),
        (Field::ClientKey, &settings.client_key),
    ] {
        let Some(path) = path else { continue };
        match origin {
            Origin::Api => return Err(QueueRuleError::FileOverApi { field }),
            Origin::Config => tls_file(Path::new(path)).map_err(|e| QueueRuleError::File {
                field,
                problem: e.to_string(),
            })?,
        }
    }
    Ok(())
}
