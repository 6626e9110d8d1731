//! What a reload may change, read from a file that may be mid-write.
//!
//! A ConfigMap update or an editor writes the file in steps, and a SIGHUP
//! that comes between them used to take what was there: a file cut after
//! a queue's `destination` dropped its `signing_secret` and its
//! `Authorization` header, and its next delivery went out unsigned. So a
//! reload reads the file until two reads [`SETTLE`] apart agree
//! ([`Config::load_settled`]), and refuses a file that drops a queue's
//! signing secret or one of its static headers unless that queue says
//! `unsigned = true` ([`reload_changes`]); every change to what a queue
//! sends, and where, is logged per queue (never a secret's value).

use std::path::Path;
use std::time::Duration;

use super::{Config, ConfigError};

/// How long the file must stay the same to be read.
pub(crate) const SETTLE: Duration = Duration::from_millis(200);
/// Reads before a file that keeps changing is refused.
const SETTLE_READS_MAX: usize = 25;

impl Config {
    /// Reads a config file once two reads [`SETTLE`] apart agree, and
    /// validates it. Blocking: it sleeps between reads.
    pub fn load_settled(path: &Path) -> Result<Config, ConfigError> {
        let read = || Config::read_text(path);
        let mut text = read()?;
        for _ in 0..SETTLE_READS_MAX {
            std::thread::sleep(SETTLE);
            let again = read()?;
            if again == text {
                return Config::parse(&text).map_err(|error| ConfigError::Invalid {
                    path: path.to_path_buf(),
                    error,
                });
            }
            text = again;
        }
        Err(ConfigError::Read {
            path: path.to_path_buf(),
            reason: format!(
                "it kept changing ({SETTLE_READS_MAX} reads {} ms apart): still being written?",
                SETTLE.as_millis()
            ),
        })
    }
}

/// Why a reload is refused: the new file would take away what a queue
/// sends with its deliveries, without the queue saying so.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReloadRefusal {
    /// The running file gives `queue` a signing secret; the new one not.
    #[error(
        "queues.{queue}: the new file has no signing_secret, which the running one has: its \
         deliveries would go out unsigned (a file cut short?). Say `unsigned = true` on the \
         queue to mean it"
    )]
    DropsSecret { queue: String },
    /// The new file leaves out static `headers` of `queue`.
    #[error(
        "queues.{queue}: the new file drops the static headers {headers:?}: its deliveries \
         would go out without them (a file cut short?). Say `unsigned = true` on the queue to \
         mean it"
    )]
    DropsHeaders { queue: String, headers: Vec<String> },
}

/// What reloading `new` over `running` changes in what the queues of the
/// file send and where, one line per change (for the log); `Err` when it
/// would drop a queue's signing secret or a static header without the
/// queue saying `unsigned = true`.
pub fn reload_changes(running: &Config, new: &Config) -> Result<Vec<String>, ReloadRefusal> {
    let mut changes = Vec::new();
    for (name, table) in &new.queues {
        let Some(old) = running.queues.get(name) else {
            continue;
        };
        let (was, now) = (old.settings(), table.settings());
        let unsigned = table.unsigned == Some(true);
        let dropped: Vec<&String> = was
            .headers
            .keys()
            .filter(|h| !now.headers.contains_key(*h))
            .collect();
        if !unsigned {
            if was.signing_secret.is_some() && now.signing_secret.is_none() {
                return Err(ReloadRefusal::DropsSecret {
                    queue: name.clone(),
                });
            }
            if !dropped.is_empty() {
                return Err(ReloadRefusal::DropsHeaders {
                    queue: name.clone(),
                    headers: dropped.into_iter().cloned().collect(),
                });
            }
        }
        match (&was.signing_secret, &now.signing_secret) {
            (Some(_), None) => changes.push(format!("queues.{name}: signing secret removed")),
            (None, Some(_)) => changes.push(format!("queues.{name}: signing secret added")),
            (Some(a), Some(b)) if a != b => {
                changes.push(format!("queues.{name}: signing secret changed"))
            }
            _ => {}
        }
        if !dropped.is_empty() {
            changes.push(format!(
                "queues.{name}: static headers removed: {dropped:?}"
            ));
        }
        let added: Vec<&String> = now
            .headers
            .keys()
            .filter(|h| !was.headers.contains_key(*h))
            .collect();
        if !added.is_empty() {
            changes.push(format!("queues.{name}: static headers added: {added:?}"));
        }
        let changed: Vec<&String> = now
            .headers
            .iter()
            .filter(|(h, v)| was.headers.get(*h).is_some_and(|old| old != *v))
            .map(|(h, _)| h)
            .collect();
        if !changed.is_empty() {
            changes.push(format!(
                "queues.{name}: static header values changed: {changed:?}"
            ));
        }
        if was.destination != now.destination {
            changes.push(format!(
                "queues.{name}: destination moved from {} to {}",
                was.destination.as_deref().unwrap_or("(none)"),
                now.destination.as_deref().unwrap_or("(none)")
            ));
        }
    }
    Ok(changes)
}
