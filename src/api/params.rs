//! The query parameters each route takes (docs/contract.md §4). Any other
//! is refused with `400` naming it: `?q=cus_3` on a list must not quietly
//! list everything, and a misspelt `?dryrun=true` must not purge for real.
//!
//! `/v1/forward` is not checked: its query string belongs to the
//! destination.

use axum::http::Method;

use super::error::ApiError;
use super::query_pairs;

/// The dead-letter filter's terms (`filter.rs`).
const FILTER: &[&str] = &["reason", "status", "since", "until", "id"];

/// The parameters `method` on `route` (a route template) takes, beyond
/// [`FILTER`] where `filtered`.
fn allowed(method: &Method, route: &str) -> (&'static [&'static str], bool) {
    match (method.as_str(), route) {
        ("POST", "/v1/queues/{q}/receive") => (&["wait"], false),
        ("POST", "/v1/queues/{q}/receive-batch") => (&["max", "wait"], false),
        ("POST", "/v1/queues/{q}/leases/{token}/nack") => (&["delay"], false),
        ("GET", "/v1/queues/{q}/messages") => (
            &["limit", "after", "type", "tenant", "contains", "match"],
            true,
        ),
        ("DELETE", "/v1/queues/{q}/messages") => (&["max", "dryRun"], true),
        ("POST", "/v1/queues/{q}/redrive") => (&["max", "dryRun"], true),
        ("GET", "/v1/queues/{q}/tail") => (&["last"], false),
        ("GET", "/v1/cluster") => (&["digest"], false),
        ("GET", "/v1/queues") => (&["prefix", "tenant", "events", "limit", "after"], false),
        ("PUT" | "PATCH", "/v1/queues/{q}") => (&["keepSecrets"], false),
        ("GET", "/v1/queues/{q}/history" | "/v1/queues/{q}/deliveries") => (
            &[
                "limit", "before", "since", "until", "type", "tenant", "contains", "match",
            ],
            false,
        ),
        _ => (&[], false),
    }
}

/// Refuses a parameter `route` does not take.
pub(crate) fn check(method: &Method, route: &str, query: Option<&str>) -> Result<(), ApiError> {
    if query.is_none_or(str::is_empty) || route.starts_with("/v1/forward/") {
        return Ok(());
    }
    let (names, filtered) = allowed(method, route);
    for (name, _) in query_pairs(query) {
        let known = names.contains(&name.as_str()) || (filtered && FILTER.contains(&name.as_str()));
        if !known {
            let takes = names
                .iter()
                .chain(if filtered { FILTER } else { &[] })
                .copied()
                .collect::<Vec<_>>();
            let takes = if takes.is_empty() {
                "it takes none".to_string()
            } else {
                format!("it takes {}", takes.join(", "))
            };
            return Err(ApiError::bad_request(format!(
                "unknown query parameter {name:?} for {method} {route}: {takes}"
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_parameters_are_named() {
        let peek = "/v1/queues/{q}/messages";
        assert!(check(&Method::GET, peek, Some("limit=5&reason=expired")).is_ok());
        let e = check(&Method::GET, "/v1/queues", Some("q=cus_3")).unwrap_err();
        assert!(check(&Method::GET, "/v1/queues", Some("prefix=cus_3&limit=5")).is_ok());
        assert!(e.message.contains("\"q\""), "{}", e.message);
        assert!(check(&Method::DELETE, peek, Some("dryrun=true")).is_err());
        assert!(check(&Method::DELETE, peek, Some("dryRun=true&max=3")).is_ok());
        assert!(check(&Method::GET, peek, Some("dryRun=true")).is_err());
        assert!(check(&Method::POST, "/v1/forward/{q}/{*path}", Some("anything=1")).is_ok());
        assert!(check(&Method::GET, "/v1/queues", None).is_ok());
    }
}
