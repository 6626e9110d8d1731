//! Which dead letters an operation picks: the filters of
//! `docs/contract.md` §4 (reason, last status, failure time, ids), combined
//! with AND. Peek of a failure queue, redrive and purge take the same
//! filter, so the console, the CLI and the API select the same messages.

use std::collections::BTreeSet;

use super::command::{FailInfo, FailReason, MessageId};
use crate::time::Millis;

/// A last HTTP status to match: one code (`503`) or a class (`5xx`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatusMatch {
    Code(u16),
    /// The hundreds digit: `Class(5)` is `5xx`.
    Class(u16),
}

impl StatusMatch {
    /// `"503"` or `"5xx"` (`"5XX"`); anything else is `None`.
    pub fn parse(text: &str) -> Option<StatusMatch> {
        let lower = text.to_ascii_lowercase();
        if let Some(class) = lower.strip_suffix("xx") {
            return match class.parse::<u16>() {
                Ok(c @ 1..=5) if class.len() == 1 => Some(StatusMatch::Class(c)),
                _ => None,
            };
        }
        match lower.parse::<u16>() {
            Ok(code @ 100..=599) if lower.len() == 3 => Some(StatusMatch::Code(code)),
            _ => None,
        }
    }

    fn matches(self, status: u16) -> bool {
        match self {
            StatusMatch::Code(code) => status == code,
            StatusMatch::Class(class) => status / 100 == class,
        }
    }
}

/// Dead letters to pick. The default picks every one.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeadLetterFilter {
    pub reason: Option<FailReason>,
    /// The last HTTP status; a message that failed without one (expired, a
    /// connection error) never matches.
    pub status: Option<StatusMatch>,
    /// Failed at or after.
    pub since: Option<Millis>,
    /// Failed before.
    pub until: Option<Millis>,
    /// Only these (each once, however often named).
    pub ids: Option<BTreeSet<MessageId>>,
}

impl DeadLetterFilter {
    /// Whether the filter narrows anything beyond ids: such a filter only
    /// makes sense on a failure queue.
    pub fn has_failure_terms(&self) -> bool {
        self.reason.is_some()
            || self.status.is_some()
            || self.since.is_some()
            || self.until.is_some()
    }

    /// Whether message `id`, which failed as `failure` says (`None` for a
    /// message that never failed), is picked.
    pub fn matches(&self, id: MessageId, failure: Option<&FailInfo>) -> bool {
        if let Some(ids) = &self.ids
            && !ids.contains(&id)
        {
            return false;
        }
        if !self.has_failure_terms() {
            return true;
        }
        let Some(f) = failure else { return false };
        self.reason.is_none_or(|r| r == f.reason)
            && self
                .status
                .is_none_or(|s| f.last_status.is_some_and(|code| s.matches(code)))
            && self.since.is_none_or(|t| f.failed_at >= t)
            && self.until.is_none_or(|t| f.failed_at < t)
    }
}

/// What a filtered operation selected: the ids it acts on (at most its
/// limit) and how many matched in all.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selection {
    pub picked: Vec<MessageId>,
    pub matched: u64,
}

impl Selection {
    /// Matched but left alone because of the limit.
    pub fn remaining(&self) -> u64 {
        self.matched - self.picked.len() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failed(reason: FailReason, status: Option<u16>, at: Millis) -> FailInfo {
        FailInfo {
            reason,
            last_status: status,
            failed_at: at,
        }
    }

    #[test]
    fn statuses_parse_as_codes_or_classes() {
        assert_eq!(StatusMatch::parse("503"), Some(StatusMatch::Code(503)));
        assert_eq!(StatusMatch::parse("5xx"), Some(StatusMatch::Class(5)));
        assert_eq!(StatusMatch::parse("4XX"), Some(StatusMatch::Class(4)));
        for bad in [
            "", "5", "50x", "6xx", "0xx", "1000", "099", "abc", "5xxx", "+503",
        ] {
            assert_eq!(StatusMatch::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn terms_combine_with_and() {
        let f = DeadLetterFilter {
            reason: Some(FailReason::RetriesExhausted),
            status: Some(StatusMatch::Class(5)),
            since: Some(1_000),
            until: Some(2_000),
            ids: None,
        };
        let id = MessageId(7);
        assert!(f.matches(
            id,
            Some(&failed(FailReason::RetriesExhausted, Some(503), 1_000))
        ));
        assert!(!f.matches(id, Some(&failed(FailReason::Expired, Some(503), 1_000))));
        assert!(!f.matches(
            id,
            Some(&failed(FailReason::RetriesExhausted, Some(404), 1_000))
        ));
        assert!(!f.matches(id, Some(&failed(FailReason::RetriesExhausted, None, 1_000))));
        assert!(!f.matches(
            id,
            Some(&failed(FailReason::RetriesExhausted, Some(500), 999))
        ));
        assert!(!f.matches(
            id,
            Some(&failed(FailReason::RetriesExhausted, Some(500), 2_000))
        ));
        assert!(!f.matches(id, None));
    }

    #[test]
    fn ids_alone_pick_messages_that_never_failed() {
        let f = DeadLetterFilter {
            ids: Some([MessageId(1)].into()),
            ..DeadLetterFilter::default()
        };
        assert!(f.matches(MessageId(1), None));
        assert!(!f.matches(MessageId(2), None));
        assert!(DeadLetterFilter::default().matches(MessageId(2), None));
    }
}
