//! The flags that select messages: the dead-letter filters of
//! docs/contract.md §4, the search terms on what messages carry, and
//! history's time range. Each is checked here, so that a typo is a usage
//! error (exit 2) before anything is sent.

use super::client::OpsError;
use crate::spool::{FailReason, StatusMatch};
use crate::time::{Millis, format_rfc3339, parse_rfc3339};

/// The dead-letter filters of docs/contract.md §4 as the CLI takes them.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct DeadLetterArgs {
    /// Only dead letters that failed for this reason: retries_exhausted,
    /// permanent_status or expired.
    #[arg(long)]
    pub reason: Option<String>,
    /// Only those whose last HTTP status was this code (503) or in this
    /// class (5xx).
    #[arg(long)]
    pub status: Option<String>,
    /// Only those that failed at or after this time: RFC 3339
    /// (2026-11-30T10:00:00Z) or a duration ago (2h, 1d12h).
    #[arg(long)]
    pub since: Option<String>,
    /// Only those that failed before this time: RFC 3339 or a duration ago.
    #[arg(long)]
    pub until: Option<String>,
    /// Only this message id (repeat for several).
    #[arg(long = "id", value_name = "ID")]
    pub ids: Vec<String>,
}

impl DeadLetterArgs {
    /// The filter as query pairs, checked here so that a typo is a usage
    /// error before anything is sent; relative times count back from `now`.
    pub fn query(&self, now: Millis) -> Result<Vec<(&'static str, String)>, OpsError> {
        let mut pairs = Vec::new();
        if let Some(reason) = &self.reason {
            if FailReason::parse(reason).is_none() {
                let names: Vec<&str> = FailReason::ALL.iter().map(|r| r.as_str()).collect();
                return Err(OpsError::Usage(format!(
                    "--reason {reason:?}: one of {}",
                    names.join(", ")
                )));
            }
            pairs.push(("reason", reason.clone()));
        }
        if let Some(status) = &self.status {
            if StatusMatch::parse(status).is_none() {
                return Err(OpsError::Usage(format!(
                    "--status {status:?}: an HTTP status (500) or a class (5xx)"
                )));
            }
            pairs.push(("status", status.clone()));
        }
        time_range(
            self.since.as_deref(),
            self.until.as_deref(),
            now,
            &mut pairs,
        )?;
        for id in &self.ids {
            pairs.push(("id", id.clone()));
        }
        Ok(pairs)
    }

    /// The filter as people read it, for confirmations and reports.
    pub(super) fn describe(&self) -> String {
        let mut terms = Vec::new();
        for (name, value) in [
            ("reason", &self.reason),
            ("status", &self.status),
            ("since", &self.since),
            ("until", &self.until),
        ] {
            if let Some(v) = value {
                terms.push(format!("{name} {v}"));
            }
        }
        if !self.ids.is_empty() {
            terms.push(format!("id {}", self.ids.join(", ")));
        }
        if terms.is_empty() {
            String::new()
        } else {
            format!(" matching {}", terms.join(", "))
        }
    }
}

/// Search terms on what messages carry (`history list`, `dlq list`).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct SearchArgs {
    /// Only deliveries of events of this type.
    #[arg(long = "type", value_name = "TYPE")]
    pub event_type: Option<String>,
    /// Only deliveries of events of this tenant.
    #[arg(long)]
    pub tenant: Option<String>,
    /// Only bodies that contain this text.
    #[arg(long)]
    pub contains: Option<String>,
    /// Only JSON bodies with this value at this path: '$.customer.id=42'.
    #[arg(long = "match", value_name = "PATH=VALUE")]
    pub json_match: Option<String>,
}

impl SearchArgs {
    /// The terms as query pairs (the server checks them).
    pub(super) fn pairs(&self) -> Vec<(&'static str, String)> {
        let mut pairs = Vec::new();
        pairs.extend(self.event_type.clone().map(|t| ("type", t)));
        pairs.extend(self.tenant.clone().map(|t| ("tenant", t)));
        pairs.extend(self.contains.clone().map(|t| ("contains", t)));
        pairs.extend(self.json_match.clone().map(|t| ("match", t)));
        pairs
    }
}

/// What `spoold history list` selects.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct HistoryArgs {
    #[command(flatten)]
    pub search: SearchArgs,
    /// At or after (history: delivered; deliveries: sent): RFC 3339 or a
    /// duration ago (2h).
    #[arg(long)]
    pub since: Option<String>,
    /// Before (history: delivered; deliveries: sent): RFC 3339 or a
    /// duration ago.
    #[arg(long)]
    pub until: Option<String>,
}

impl HistoryArgs {
    /// The selection as query pairs: the time range (relative times count
    /// back from `now`), then the search terms.
    pub(super) fn query(&self, now: Millis) -> Result<Vec<(&'static str, String)>, OpsError> {
        let mut pairs = Vec::new();
        time_range(
            self.since.as_deref(),
            self.until.as_deref(),
            now,
            &mut pairs,
        )?;
        pairs.extend(self.search.pairs());
        Ok(pairs)
    }
}

/// `since` and `until`, when given, as RFC 3339 query pairs.
fn time_range(
    since: Option<&str>,
    until: Option<&str>,
    now: Millis,
    pairs: &mut Vec<(&'static str, String)>,
) -> Result<(), OpsError> {
    for (name, value) in [("since", since), ("until", until)] {
        if let Some(text) = value {
            pairs.push((name, format_rfc3339(point_in_time(name, text, now)?)));
        }
    }
    Ok(())
}

/// An RFC 3339 time, or a duration (`2h`) before `now`.
fn point_in_time(flag: &str, text: &str, now: Millis) -> Result<Millis, OpsError> {
    if let Some(at) = parse_rfc3339(text) {
        return Ok(at);
    }
    match crate::config::parse_duration_ms(text) {
        Ok(ago) => Ok(now - ago as Millis),
        Err(_) => Err(OpsError::Usage(format!(
            "--{flag} {text:?}: an RFC 3339 time (2026-11-30T10:00:00Z) or a duration ago (2h)"
        ))),
    }
}
