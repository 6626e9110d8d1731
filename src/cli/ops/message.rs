//! A message as the API answers it (`src/api/view.rs`): in a tail, a
//! peek page, a queue's history or a failure queue. Holds the fields the
//! commands show, how a listing is fetched page by page, and the parts of
//! a message that `tail`, `dlq show` and `history show` print alike.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Write;

use reqwest::Method;
use serde::Deserialize;
use serde::de::DeserializeOwned;

use super::client::{OpsError, Target, encode};
use super::or_dash;

/// The most messages one page may hold (the API's own bound).
const PAGE_MAX: usize = 1000;
/// How much of a body a `tail` line shows: enough to tell messages apart.
const BODY_SHOWN_CHARS: usize = 80;
/// How much of an attempt's error a line or a table row shows.
pub(super) const ERROR_SHOWN_CHARS: usize = 60;

/// One message. The fields that only some messages have are options: a
/// dead letter says why it failed, a delivered one when, an event's
/// delivery of which event.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Message {
    pub(super) id: String,
    pub(super) queue: String,
    /// `visible`, `leased`, …; in a delivery log `pending`, `retrying`,
    /// `failed` or `delivered`.
    pub(super) state: String,
    pub(super) retry_count: u32,
    pub(super) enqueued_at: String,
    /// A body that is UTF-8, as text.
    pub(super) body: Option<String>,
    /// Any other body, in base64.
    pub(super) body_base64: Option<String>,
    /// A forwarded request as stored (secret header values redacted).
    pub(super) request: Option<StoredRequest>,
    pub(super) event_type: Option<String>,
    pub(super) event_id: Option<String>,
    pub(super) tenant: Option<String>,
    /// A resend: the delivered message it repeats.
    pub(super) resent_from: Option<String>,
    pub(super) delivered_at: Option<String>,
    /// The last ten delivery attempts, oldest first.
    pub(super) attempts: Vec<Attempt>,
    pub(super) last_status: Option<u16>,
    pub(super) last_error: Option<String>,
    /// A dead letter: the queue it failed in, when and why.
    pub(super) origin_queue: Option<String>,
    pub(super) failed_at: Option<String>,
    pub(super) reason: Option<String>,
}

/// A forwarded request as stored.
#[derive(Deserialize)]
pub(super) struct StoredRequest {
    pub(super) method: String,
    pub(super) path: String,
    pub(super) headers: BTreeMap<String, String>,
}

/// One delivery attempt and what the destination answered.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Attempt {
    at: String,
    status: Option<u16>,
    /// Why no status came back (a refused connection, a timeout).
    error: Option<String>,
    duration_seconds: f64,
    /// The start of the destination's answer.
    response: Option<String>,
}

/// The answer to a send or a resend: the new message's id.
#[derive(Deserialize)]
pub(super) struct Stored {
    pub(super) id: String,
}

/// One page of a listing: `next` is where the next one starts.
#[derive(Deserialize)]
struct Page<T> {
    /// A delivery log calls them `deliveries`.
    #[serde(alias = "deliveries")]
    messages: Vec<T>,
    next: Option<String>,
}

impl Message {
    /// The message as one line (`tail`): when it was sent, its id and
    /// retries, then the start of its body; a dead letter says when and
    /// why it failed first.
    pub(super) fn line(&self) -> String {
        let mut line = match &self.reason {
            Some(reason) => self.failure(reason),
            None => format!(
                "{} {} retry={}",
                self.enqueued_at, self.id, self.retry_count
            ),
        };
        let body = match &self.body {
            Some(body) => shortened(body, BODY_SHOWN_CHARS).replace('\n', "\\n"),
            None => "<binary>".to_owned(),
        };
        let _ = write!(line, " {body}");
        line
    }

    /// A dead letter's line up to its body.
    fn failure(&self, reason: &str) -> String {
        let mut line = format!(
            "{} {} failed reason={reason}",
            or_dash(self.failed_at.as_deref()),
            self.id
        );
        if let Some(status) = self.last_status {
            let _ = write!(line, " status={status}");
        }
        if let Some(error) = self.last_error.as_deref().filter(|e| !e.is_empty()) {
            let _ = write!(line, " error={:?}", shortened(error, ERROR_SHOWN_CHARS));
        }
        let _ = write!(
            line,
            " retry={} enqueued={}",
            self.retry_count, self.enqueued_at
        );
        line
    }

    /// The attempts (each with what the destination answered) and the
    /// body, as `dlq show` and `history show` end.
    pub(super) fn write_attempts_and_body(&self, out: &mut impl Write) -> Result<(), OpsError> {
        writeln!(out, "attempts     {}", self.attempts.len())?;
        for (i, a) in self.attempts.iter().enumerate() {
            let outcome = match a.status {
                Some(status) => format!("HTTP {status}"),
                None => or_dash(a.error.as_deref()),
            };
            writeln!(
                out,
                "  {:>3}. {}  {}  {:.3}s",
                i + 1,
                a.at,
                outcome,
                a.duration_seconds
            )?;
            if let Some(response) = &a.response {
                writeln!(out, "       response: {}", response.replace('\n', "\\n"))?;
            }
        }
        match (&self.body, &self.body_base64) {
            (Some(body), _) => writeln!(out, "body\n{body}")?,
            (None, Some(b64)) => writeln!(out, "body (base64)\n{b64}")?,
            _ => {}
        }
        Ok(())
    }
}

/// The first `n` characters of `text`.
pub(super) fn shortened(text: &str, n: usize) -> String {
    text.chars().take(n).collect()
}

/// The messages of every page of `path` (a peek or a history) with
/// `terms`, up to `limit`: each page's `next` is the next one's `cursor`
/// parameter (a search page may hold nothing and still say where to go
/// on). `T` is [`Message`] for people, `Value` for `--json`.
pub(super) async fn every_page<T: DeserializeOwned>(
    target: &Target,
    path: &str,
    terms: Vec<(&'static str, String)>,
    cursor: &'static str,
    limit: Option<usize>,
) -> Result<Vec<T>, OpsError> {
    let limit = limit.unwrap_or(usize::MAX);
    let mut all = Vec::new();
    let mut next: Option<String> = None;
    while all.len() < limit {
        let mut pairs = terms.clone();
        pairs.push(("limit", (limit - all.len()).min(PAGE_MAX).to_string()));
        if let Some(n) = &next {
            pairs.push((cursor, n.clone()));
        }
        let page: Page<T> = target
            .call(Method::GET, &format!("{path}?{}", encode(&pairs)))
            .await?;
        all.extend(page.messages);
        match page.next {
            Some(n) => next = Some(n),
            None => break,
        }
    }
    Ok(all)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(json: serde_json::Value) -> Message {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn a_line_says_when_and_why_a_dead_letter_failed_first() {
        let sent = message(serde_json::json!({
            "id": "m1", "queue": "q", "state": "visible", "retryCount": 2,
            "enqueuedAt": "2026-01-01T00:00:00Z", "visibleAt": "2026-01-01T00:00:00Z",
            "body": "hello\nworld", "attempts": [],
        }));
        assert_eq!(sent.line(), "2026-01-01T00:00:00Z m1 retry=2 hello\\nworld");
        let failed = message(serde_json::json!({
            "id": "d1", "queue": "q.failed", "state": "visible", "retryCount": 3,
            "enqueuedAt": "E", "visibleAt": "V", "bodyBase64": "AAE=",
            "attempts": [{"at": "A", "status": 503, "durationSeconds": 0.25, "response": "no\nway"}],
            "lastStatus": 503, "lastError": "boom", "originQueue": "q",
            "failedAt": "F", "reason": "retries_exhausted",
        }));
        assert_eq!(
            failed.line(),
            "F d1 failed reason=retries_exhausted status=503 error=\"boom\" retry=3 enqueued=E <binary>"
        );
        let mut shown: Vec<u8> = Vec::new();
        failed.write_attempts_and_body(&mut shown).unwrap();
        assert_eq!(
            String::from_utf8(shown).unwrap(),
            "attempts     1\n    1. A  HTTP 503  0.250s\n       response: no\\nway\nbody (base64)\nAAE=\n"
        );
    }
}
