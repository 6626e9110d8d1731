//! Configuration: the only home of defaults and limits.
//!
//! The file is TOML (docs/contract.md §7). Durations are strings like `"30s"`, `"250ms"`,
//! `"10m"`, `"7d"`; sizes are strings like `"64MiB"` or plain byte counts.
//! Unknown keys and bad values are errors that name the key and the line.
//! With no file, spoold runs on [`Config::default`].
//!
//! A file goes through the rooms of this module in turn:
//!
//! - `shape`: the serde structs of its tables, and the defaults of every
//!   key it may leave out;
//! - `units`: durations and sizes, read and spelled in one grammar (the
//!   command line's durations too);
//! - `lines`: where each key is written, from the spans `toml` records as
//!   it parses, so that every error can name its line;
//! - `check`: the checks of the parsed tables (queue tables by the
//!   engine's own rules), and the exposure check `run` and `check-config`
//!   share;
//! - `cluster`: the `[cluster]` table and its checks;
//! - `effective`: the effective config as TOML, what `check-config`
//!   prints.

use std::path::{Path, PathBuf};

use serde::Deserialize;
use toml::de::DeTable;

mod check;
mod cluster;
mod effective;
mod keys;
mod lines;
mod portal;
mod reload;
mod shape;
#[cfg(test)]
mod tests;
mod units;

pub use check::ExposureError;
pub(crate) use check::is_loopback;
pub use cluster::{ClusterConfig, ClusterTlsConfig, SecretError};
pub use keys::{
    ApiKey, ApiKeyEntry, Role, ScopedKey, digest as key_digest, pattern_matches,
    pattern_problem as queue_pattern_problem,
};
pub use portal::{PortalConfig, THEME_KEYS};
pub use reload::{ReloadRefusal, reload_changes};
pub use shape::{
    BackoffConfig, Config, DeliveryConfig, EventsConfig, LogConfig, LogFormat,
    MAX_CONNECTIONS_PER_HOST_DEFAULT, OnCorruption, PlainHttpClient, QueueConfig, ServerConfig,
    SpoolConfig, TelemetryConfig,
};
pub(crate) use units::parse_duration_ms;
pub use units::{UnitError, parse_duration};

use lines::{KeyLines, at_line};

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {}: {reason}", path.display())]
    Read { path: PathBuf, reason: String },
    /// The TOML is malformed, a key is unknown or a value is out of range;
    /// `error` names the key and the line.
    #[error("{}: {error}", path.display())]
    Invalid { path: PathBuf, error: KeyError },
}

/// A mistake in a config file's text: what is wrong, in a message that
/// names the key as the file writes it (`spool.segment_bytes`,
/// `queues.orders.backoff.max`), and the line of that key when the file
/// writes it (a value left at its default has no line).
///
/// The key is part of the message rather than a field of its own because
/// each check words it where it reads best (`server.api_keys: key 2: …`,
/// `cluster.peers.2 = "b" is not host:port`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}{message}", at_line(*line))]
pub struct KeyError {
    pub line: Option<usize>,
    pub message: String,
}

/// Why a secret (an API key, the cluster or portal secret) cannot be one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SecretShape {
    /// Blank: a placeholder left in the file.
    #[error("is empty or only whitespace: it would protect nothing")]
    Blank,
    /// Whitespace at an end: a pasted line break, most often.
    #[error("begins or ends with whitespace (a pasted line break?)")]
    Padded,
    #[error("holds a control character")]
    Control,
}

impl Config {
    /// Reads and validates a config file.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = Config::read_text(path)?;
        Config::parse(&text).map_err(|error| ConfigError::Invalid {
            path: path.to_path_buf(),
            error,
        })
    }

    /// A config file's text.
    fn read_text(path: &Path) -> Result<String, ConfigError> {
        std::fs::read_to_string(path).map_err(|e| ConfigError::Read {
            path: path.to_path_buf(),
            reason: match e.kind() {
                std::io::ErrorKind::NotFound => "no such file".into(),
                std::io::ErrorKind::PermissionDenied => "permission denied".into(),
                _ => e.to_string(),
            },
        })
    }

    /// Parses and validates config text; the error names key and line.
    ///
    /// The text is parsed once, into `toml`'s document of spanned keys and
    /// values: the lines of its keys are taken from it (as far as it could
    /// be read, when it is malformed) before it becomes a [`Config`].
    pub fn parse(text: &str) -> Result<Config, KeyError> {
        let (document, errors) = DeTable::parse_recoverable(text);
        let keys = KeyLines::new(text, document.get_ref());
        if let Some(e) = errors.first() {
            return Err(keys.describe(e));
        }
        let mut config = Config::deserialize(toml::de::Deserializer::from(document))
            .map_err(|e| keys.describe(&e))?;
        config.validate(&keys)?;
        config.fill_history_defaults();
        config.listen_line = keys.line(&["server", "listen"]);
        Ok(config)
    }
}

/// A secret (an API key, the cluster secret) is not blank and has no
/// whitespace at either end: a pasted line break or a placeholder of
/// spaces is a mistake, never a key.
fn secret_shape(secret: &str) -> Result<(), SecretShape> {
    if secret.trim().is_empty() {
        return Err(SecretShape::Blank);
    }
    if secret.trim() != secret {
        return Err(SecretShape::Padded);
    }
    if secret.chars().any(char::is_control) {
        return Err(SecretShape::Control);
    }
    Ok(())
}
