//! The dead-letter filter of a query string (docs/contract.md §4):
//! `reason=`, `status=`, `since=`, `until=` (RFC 3339, on `failedAt`) and
//! `id=` (repeatable), shared by peek, redrive and purge.

use super::error::ApiError;
use super::{bool_param, max_param, query_pairs};
use crate::engine::Engine;
use crate::spool::{DeadLetterFilter, FailReason, StatusMatch};
use crate::time::parse_rfc3339;

/// If `key` is a filter term, adds it to `filter` and answers true; a
/// value that does not parse is a `400` naming the term.
pub(crate) fn take_term(
    engine: &Engine,
    filter: &mut DeadLetterFilter,
    key: &str,
    value: &str,
) -> Result<bool, ApiError> {
    let bad = |expected: &str| ApiError::bad_request(format!("{key} = {value:?}: {expected}"));
    match key {
        "reason" => {
            let names: Vec<&str> = FailReason::ALL.iter().map(|r| r.as_str()).collect();
            filter.reason = Some(
                FailReason::parse(value)
                    .ok_or_else(|| bad(&format!("one of {}", names.join(", "))))?,
            );
        }
        "status" => {
            filter.status = Some(
                StatusMatch::parse(value)
                    .ok_or_else(|| bad("an HTTP status (500) or a class (5xx)"))?,
            );
        }
        "since" => {
            filter.since = Some(parse_rfc3339(value).ok_or_else(|| bad("an RFC 3339 time"))?)
        }
        "until" => {
            filter.until = Some(parse_rfc3339(value).ok_or_else(|| bad("an RFC 3339 time"))?)
        }
        "id" => {
            let id = engine
                .tokens()
                .parse_id(value)
                .ok_or_else(|| bad("a message id"))?;
            filter.ids.get_or_insert_default().insert(id);
        }
        _ => return Ok(false),
    }
    Ok(true)
}

/// The query of a purge or redrive: the filter, `max` and `dryRun`.
pub(crate) struct BulkQuery {
    pub filter: DeadLetterFilter,
    pub max: Option<usize>,
    pub dry_run: bool,
}

impl BulkQuery {
    pub(crate) fn parse(engine: &Engine, query: Option<&str>) -> Result<BulkQuery, ApiError> {
        let mut bulk = BulkQuery {
            filter: DeadLetterFilter::default(),
            max: None,
            dry_run: false,
        };
        for (k, v) in query_pairs(query) {
            if take_term(engine, &mut bulk.filter, &k, &v)? {
                continue;
            }
            match k.as_str() {
                "max" => bulk.max = Some(max_param(&v)?),
                "dryRun" => bulk.dry_run = bool_param("dryRun", &v)?,
                _ => {}
            }
        }
        Ok(bulk)
    }
}
