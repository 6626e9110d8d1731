//! The search terms of a query string (`type`, `tenant`, `contains`,
//! `match`), for peek and history (`spool/search.rs`).

use super::error::ApiError;
use crate::spool::search::Search;

/// The names [`term`] takes.
pub(crate) const TERMS: &[&str] = &["type", "tenant", "contains", "match"];

/// Adds the term `name=value` to `search`; any other name is ignored
/// (`params.rs` refused unknown ones already).
pub(crate) fn term(search: &mut Search, name: &str, value: String) -> Result<(), ApiError> {
    let bad = |what: String| ApiError::bad_request(format!("{name}: {what}"));
    match name {
        "type" => search.event_type = Some(value),
        "tenant" => search.tenant = Some(value),
        "contains" if value.is_empty() => return Err(bad("an empty text".into())),
        "contains" => search.contains = Some(value),
        "match" => search.json_path = Some(Search::parse_match(&value).map_err(bad)?),
        _ => {}
    }
    Ok(())
}
