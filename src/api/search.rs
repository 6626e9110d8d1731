//! Search on peek and history: the terms of a query string (`type`,
//! `tenant`, `contains`, `match`; `spool/search.rs` judges them) and what
//! one search may cost the server.
//!
//! A search reads stored records, as many as a page needs to fill, so it
//! is the one request whose cost grows with what senders stored. Three
//! bounds, owned here, keep it from costing the other requests anything:
//!
//! - it runs on the blocking pool ([`off_runtime`]), never on the threads
//!   that answer everything else (`/healthz` included);
//! - at most [`searches_max`] run at once; past that the answer is `429
//!   too_many_searches` with `Retry-After`;
//! - a page ends early, with its cursor, once it has read
//!   [`PAGE_READ_BYTES_MAX`] bytes of records or run for [`PAGE_TIME_MAX`]
//!   (its [`Budget`]), besides `SEARCH_SCAN_MAX` records and the answer's
//!   own bound.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use serde_json::Value;

use super::AppState;
use super::error::ApiError;
use super::stored::{ANSWER_BYTES_MAX, render_stored};
use crate::engine::{Engine, MessageError};
use crate::metrics::{Limit, limit_reached};
use crate::spool::search::{CONTAINS_BYTES_MAX, SEARCH_SCAN_MAX, Search, Verdict};
use crate::spool::{DeadLetterFilter, MessageId};

/// The names [`term`] takes.
pub(crate) const TERMS: &[&str] = &["type", "tenant", "contains", "match"];

/// Bytes of records one page may read before it ends.
pub(crate) const PAGE_READ_BYTES_MAX: usize = 64 << 20;
/// How long one page may search before it ends.
pub(crate) const PAGE_TIME_MAX: Duration = Duration::from_millis(250);

/// How many searches may run at once: half the cores (at least two), so
/// that searches can never hold every core the runtime answers on.
pub(crate) fn searches_max() -> usize {
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    (cores / 2).max(2)
}

/// Adds the term `name=value` to `search`; any other name is ignored
/// (`params.rs` refused unknown ones already).
pub(crate) fn term(search: &mut Search, name: &str, value: String) -> Result<(), ApiError> {
    let bad = |what: String| ApiError::bad_request(format!("{name}: {what}"));
    match name {
        "type" => search.event_type = Some(value),
        "tenant" => search.tenant = Some(value),
        "contains" if value.is_empty() => return Err(bad("an empty text".into())),
        "contains" if value.len() > CONTAINS_BYTES_MAX => {
            return Err(bad(format!(
                "a text of {} bytes: at most {CONTAINS_BYTES_MAX}",
                value.len()
            )));
        }
        "contains" => search.contains = Some(value),
        "match" => {
            let parsed = Search::parse_match(&value).map_err(|e| bad(e.to_string()))?;
            search.json_path = Some(parsed);
        }
        _ => {}
    }
    Ok(())
}

/// What one page of a search may still spend.
#[derive(Debug)]
pub(crate) struct Budget {
    started: Instant,
    read_bytes: usize,
}

impl Budget {
    fn new() -> Budget {
        Budget {
            started: Instant::now(),
            read_bytes: 0,
        }
    }

    /// Counts a record of `bytes` read; `false` once the page must end.
    pub(crate) fn spend(&mut self, bytes: usize) -> bool {
        self.read_bytes += bytes;
        if self.read_bytes >= PAGE_READ_BYTES_MAX {
            limit_reached(Limit::SearchBytes);
            return false;
        }
        if self.started.elapsed() >= PAGE_TIME_MAX {
            limit_reached(Limit::SearchTime);
            return false;
        }
        true
    }
}

/// Runs `search` on the blocking pool with a fresh [`Budget`], in one of
/// the [`searches_max`] slots; `429 too_many_searches` when none is free.
pub(crate) async fn off_runtime<T: Send + 'static>(
    state: &Arc<AppState>,
    search: impl FnOnce(&AppState, &mut Budget) -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    let Ok(slot) = state.searches.clone().try_acquire_owned() else {
        limit_reached(Limit::Searches);
        return Err(ApiError {
            retry_after_secs: Some(1),
            ..ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "too_many_searches",
                format!(
                    "{} searches are running, as many as may run at once; retry shortly",
                    searches_max()
                ),
            )
        });
    };
    let state = state.clone();
    tokio::task::spawn_blocking(move || {
        let _slot = slot;
        search(&state, &mut Budget::new())
    })
    .await
    .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()))
}

/// A peek with search terms: the messages (oldest first, after `after`)
/// whose records hold every term, reading at most [`SEARCH_SCAN_MAX`] of
/// them within `budget`; `next` continues where the scan stopped,
/// `scanned` says how many were read, `unsearched` how many were too
/// large for a `match` term.
pub(crate) fn peek_search(
    state: &AppState,
    queue: &str,
    filter: &DeadLetterFilter,
    search: &Search,
    mut after: Option<MessageId>,
    limit: usize,
    budget: &mut Budget,
) -> Result<Value, ApiError> {
    const BATCH: usize = 1000;
    let engine: &Engine = state.engine()?;
    let mut found = Vec::new();
    let (mut scanned, mut unsearched, mut bytes) = (0usize, 0usize, 0usize);
    let mut more = true;
    'pages: while found.len() < limit && scanned < SEARCH_SCAN_MAX {
        let views = engine.peek(queue, filter, after, BATCH.min(SEARCH_SCAN_MAX - scanned))?;
        more = views.len() == BATCH.min(SEARCH_SCAN_MAX - scanned);
        for v in &views {
            scanned += 1;
            after = Some(v.id);
            let payload = match engine.payload(queue, v.id) {
                Ok(p) => p,
                // Settled between the peek and the read: no longer there.
                Err(MessageError::MessageNotFound { .. }) => continue,
                Err(e) => return Err(e.into()),
            };
            let read = payload.body.len();
            match search.judge(&payload) {
                Verdict::Match => {
                    let rendered = render_stored(state, engine, queue, v, Some(payload))?;
                    bytes += rendered.to_string().len();
                    found.push(rendered);
                }
                Verdict::TooLarge => unsearched += 1,
                Verdict::NoMatch => {}
            }
            if found.len() >= limit || bytes >= ANSWER_BYTES_MAX || !budget.spend(read) {
                more = true;
                break 'pages;
            }
        }
        if !more || views.is_empty() {
            more = false;
            break;
        }
    }
    let mut body = serde_json::json!({
        "messages": found,
        "scanned": scanned,
        "unsearched": unsearched,
    });
    if let Some(last) = after.filter(|_| more) {
        body["next"] = Value::String(engine.tokens().format_id(last));
    }
    Ok(body)
}
