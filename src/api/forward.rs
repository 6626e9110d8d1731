//! `ANY /v1/forward/{q}/{path…}`: what of the incoming request is stored,
//! and how the forwarded path is checked at accept time.

use axum::http::HeaderMap;

use crate::spool::queue::is_hop_by_hop;

/// Headers never stored for forwarding, besides the hop-by-hop ones
/// (`spool::queue::HOP_BY_HOP`, `Proxy-Authorization` among them:
/// credentials for a proxy, never for a third party): `Host` and
/// `Content-Length` (recomputed on delivery). `Spooler-*` headers and the
/// ones `Connection` names are dropped too.
const NOT_FORWARDED: &[&str] = &["host", "content-length"];

/// The headers to store with a forwarded request, in their order.
pub(crate) fn stored_headers(headers: &HeaderMap) -> Vec<(String, String)> {
    let named_by_connection: Vec<String> = headers
        .get_all("connection")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|s| s.trim().to_ascii_lowercase())
        .filter(|s| !s.is_empty())
        .collect();
    headers
        .iter()
        .filter(|(name, _)| {
            let n = name.as_str();
            !is_hop_by_hop(n)
                && !NOT_FORWARDED.contains(&n)
                && !n.starts_with("spooler-")
                && !named_by_connection.iter().any(|c| c == n)
        })
        .map(|(name, value)| {
            (
                name.as_str().to_string(),
                String::from_utf8_lossy(value.as_bytes()).into_owned(),
            )
        })
        .collect()
}

/// Why a forwarded path (`path`, as received) is refused (`400`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    /// URL parsers read a backslash as a slash in http(s) URLs.
    #[error("the forwarded path {path:?} holds a backslash: encode it as %5C")]
    Backslash { path: String },
    /// A `..` that would leave the destination's path prefix.
    #[error("the forwarded path {path:?} climbs above the destination's path")]
    Climbs { path: String },
}

/// Resolves dot segments of a raw (still percent-encoded) forwarded path.
///
/// `.` and `..` count in their plain and encoded forms (`%2e`, any case);
/// a `..` that would climb above the destination's prefix is an error. An
/// encoded slash (`%2F`) stays encoded and is not a separator. A trailing
/// `/` is kept; an empty path stays empty.
pub fn resolve_path(raw: &str) -> Result<String, PathError> {
    if raw.is_empty() {
        return Ok(String::new());
    }
    // URL parsers read a backslash as a slash in http(s) URLs, so `..\x`
    // would climb after all: refused (an encoded one, `%5C`, stays data).
    if raw.contains('\\') {
        return Err(PathError::Backslash {
            path: raw.to_owned(),
        });
    }
    // As in RFC 3986's remove_dot_segments, a path ending in a dot segment
    // names a directory: it keeps a trailing slash.
    let last = raw.rsplit('/').next().unwrap_or_default();
    let trailing = raw.ends_with('/') || decoded_dots(last).is_some();
    let mut out: Vec<&str> = Vec::with_capacity(raw.bytes().filter(|&b| b == b'/').count() + 1);
    for segment in raw.split('/').filter(|s| !s.is_empty()) {
        match decoded_dots(segment) {
            Some(1) => {}
            Some(2) => {
                if out.pop().is_none() {
                    return Err(PathError::Climbs {
                        path: raw.to_owned(),
                    });
                }
            }
            _ => out.push(segment),
        }
    }
    let mut path = String::with_capacity(raw.len() + 1);
    for s in &out {
        path.push('/');
        path.push_str(s);
    }
    if trailing {
        path.push('/');
    }
    Ok(path)
}

/// `Some(n)` if `segment` is n dots (1 or 2), plain or percent-encoded.
fn decoded_dots(segment: &str) -> Option<usize> {
    let mut rest = segment.as_bytes();
    let mut dots = 0;
    while !rest.is_empty() {
        if let Some(r) = rest.strip_prefix(b".") {
            rest = r;
        } else if rest.len() >= 3 && rest[..3].eq_ignore_ascii_case(b"%2e") {
            rest = &rest[3..];
        } else {
            return None;
        }
        dots += 1;
    }
    (1..=2).contains(&dots).then_some(dots)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dot_segments_resolve_inside_and_are_refused_above() {
        assert_eq!(resolve_path("").unwrap(), "");
        assert_eq!(resolve_path("/").unwrap(), "/");
        assert_eq!(resolve_path("/a/b").unwrap(), "/a/b");
        assert_eq!(resolve_path("/a/b/").unwrap(), "/a/b/");
        assert_eq!(resolve_path("/a/./b/../c").unwrap(), "/a/c");
        assert_eq!(resolve_path("/a/b/..").unwrap(), "/a/");
        assert_eq!(resolve_path("/a/..").unwrap(), "/");
        assert_eq!(resolve_path("/a/%2e%2E/c").unwrap(), "/c");
        assert_eq!(resolve_path("/a%2Fb/c").unwrap(), "/a%2Fb/c");
        assert!(resolve_path("/..").is_err());
        assert!(resolve_path("/a/../..").is_err());
        assert!(resolve_path("/%2e%2e/etc").is_err());
        assert!(resolve_path("/.%2e/x").is_err());
        assert_eq!(resolve_path("/...").unwrap(), "/...");
        assert!(resolve_path("/..\\x").is_err());
        assert!(resolve_path("/a\\b").is_err());
        assert_eq!(resolve_path("/a%5Cb").unwrap(), "/a%5Cb");
    }

    #[test]
    fn hop_by_hop_host_and_spooler_headers_are_not_stored() {
        let mut h = HeaderMap::new();
        h.insert("connection", "keep-alive, x-drop-me".parse().unwrap());
        h.insert("x-drop-me", "1".parse().unwrap());
        h.insert("host", "localhost".parse().unwrap());
        h.insert("content-length", "3".parse().unwrap());
        h.insert("spooler-api-key", "k".parse().unwrap());
        h.insert("spooler-idempotency-key", "i".parse().unwrap());
        h.insert("proxy-authorization", "Basic cHJveHk=".parse().unwrap());
        h.insert("authorization", "Bearer dest".parse().unwrap());
        h.insert("idempotency-key", "app".parse().unwrap());
        h.insert("content-type", "application/json".parse().unwrap());
        let stored = stored_headers(&h);
        let names: Vec<&str> = stored.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names.len(), 3, "{names:?}");
        assert!(names.contains(&"authorization"));
        assert!(names.contains(&"idempotency-key"));
        assert!(names.contains(&"content-type"));
    }
}
