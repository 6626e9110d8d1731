//! Where a message goes: the queue's destination, with the forwarded path
//! appended below the destination's own path and the forwarded query.
//!
//! The destination's scheme, host, port and path prefix can never be
//! escaped: the stored path was resolved at accept time, and the final URL
//! is checked again here (so `//host`, `@host` or a dot segment that slipped
//! through fail the attempt permanently instead of reaching another host).

use reqwest::Url;

use crate::spool::StoredRequest;

/// The URL of one delivery.
pub fn target_url(destination: &str, request: Option<&StoredRequest>) -> Result<Url, String> {
    let dest = Url::parse(destination).map_err(|e| format!("destination {destination:?}: {e}"))?;
    let Some(req) = request else {
        return Ok(dest);
    };
    let base = destination.trim_end_matches('/');
    let mut text = String::with_capacity(base.len() + req.path.len() + req.query.len() + 2);
    text.push_str(base);
    if req.path.is_empty() {
        if destination.ends_with('/') {
            text.push('/');
        }
    } else {
        text.push_str(&req.path);
    }
    if !req.query.is_empty() {
        text.push('?');
        text.push_str(&req.query);
    }
    let url = Url::parse(&text).map_err(|e| format!("target {text:?}: {e}"))?;
    let prefix = dest.path().trim_end_matches('/');
    let same_origin = url.scheme() == dest.scheme()
        && url.host_str() == dest.host_str()
        && url.port_or_known_default() == dest.port_or_known_default()
        && url.username().is_empty()
        && url.password().is_none();
    let under_prefix = url.path() == prefix
        || url.path().starts_with(&format!("{prefix}/"))
        || (prefix.is_empty() && url.path().starts_with('/'));
    if !same_origin || !under_prefix {
        return Err(format!("target {url} escapes destination {destination}"));
    }
    Ok(url)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(path: &str, query: &str) -> StoredRequest {
        StoredRequest {
            method: "POST".into(),
            path: path.into(),
            query: query.into(),
            headers: Vec::new(),
        }
    }

    #[test]
    fn paths_append_below_the_destination() {
        let t = |d: &str, p: &str, q: &str| target_url(d, Some(&req(p, q))).map(|u| u.to_string());
        assert_eq!(
            t("https://h.example.com/hooks", "/a/b", "x=1").unwrap(),
            "https://h.example.com/hooks/a/b?x=1"
        );
        assert_eq!(
            t("https://h.example.com/hooks/", "/a/", "").unwrap(),
            "https://h.example.com/hooks/a/"
        );
        assert_eq!(
            t("https://h.example.com/hooks", "", "").unwrap(),
            "https://h.example.com/hooks"
        );
        assert_eq!(
            t("https://h.example.com", "/a%2Fb", "").unwrap(),
            "https://h.example.com/a%2Fb"
        );
        assert_eq!(
            target_url("http://127.0.0.1:9/x", None)
                .unwrap()
                .to_string(),
            "http://127.0.0.1:9/x"
        );
    }

    #[test]
    fn nothing_escapes_the_destination() {
        let t = |d: &str, p: &str| target_url(d, Some(&req(p, "")));
        // Stays on the destination's host even when the path looks like one.
        assert_eq!(
            t("https://h.example.com", "//evil.com/x")
                .unwrap()
                .host_str(),
            Some("h.example.com")
        );
        assert_eq!(
            t("https://h.example.com/hooks", "//evil.com")
                .unwrap()
                .host_str(),
            Some("h.example.com")
        );
        assert!(t("https://h.example.com/hooks", "/../admin").is_err());
        assert!(t("https://h.example.com/hooks", "/%2e%2e/admin").is_err());
        assert!(t("https://h.example.com/hooks", "@evil.com/x").is_err());
    }
}
