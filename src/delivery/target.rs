//! Where a message goes: the queue's destination, with the forwarded path
//! appended below the destination's own path and the forwarded query.
//!
//! The destination's scheme, host, port and path prefix can never be
//! escaped: the stored path was resolved at accept time, and the final URL
//! is checked again here (so `//host`, `@host` or a dot segment that slipped
//! through fail the attempt permanently instead of reaching another host).

use reqwest::Url;

use crate::engine::guard::Refusal;
use crate::spool::StoredRequest;

/// Why a delivery has no URL to go to.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DestinationError {
    /// The queue's settings name no destination.
    #[error("queue has no destination")]
    Missing,
    /// The destination is not a URL (the engine checks it when set: a
    /// stored one predates a rule).
    #[error("destination {destination:?}: {error}")]
    Unparsable {
        destination: String,
        error: url::ParseError,
    },
    /// The guard refuses the destination's host: checked when it is set,
    /// and again when its workers start, for a rule or an address of this
    /// node that came later.
    #[error("{0}")]
    Refused(Refusal),
    /// The forwarded path would climb out of the destination's path.
    #[error("target {target} escapes destination {destination}")]
    Escapes { target: String, destination: String },
}

/// A push queue's destination, parsed once.
#[derive(Debug, Clone)]
pub struct Destination {
    url: Url,
}

impl Destination {
    pub fn parse(destination: &str) -> Result<Destination, DestinationError> {
        let url = Url::parse(destination).map_err(|error| DestinationError::Unparsable {
            destination: destination.to_owned(),
            error,
        })?;
        Ok(Destination { url })
    }

    /// The destination as configured.
    pub fn url(&self) -> &Url {
        &self.url
    }

    /// The URL of one delivery: the destination's with the forwarded path
    /// appended to its path and the forwarded query; the destination
    /// itself for a plain message.
    pub fn target(&self, request: Option<&StoredRequest>) -> Result<Url, DestinationError> {
        let mut url = self.url.clone();
        let Some(req) = request else {
            return Ok(url);
        };
        // Only the path and query change: the scheme, host and port are
        // the destination's by construction.
        let prefix = self.url.path().trim_end_matches('/');
        if !req.path.is_empty() {
            let mut path = String::with_capacity(prefix.len() + req.path.len());
            path.push_str(prefix);
            path.push_str(&req.path);
            url.set_path(&path);
        }
        url.set_query((!req.query.is_empty()).then_some(req.query.as_str()));
        // Dot segments (plain or encoded) were resolved by `set_path`: the
        // result must still be below the destination's path.
        let under_prefix = match url.path().strip_prefix(prefix) {
            Some(rest) => rest.is_empty() || rest.starts_with('/'),
            None => false,
        };
        if !under_prefix {
            return Err(DestinationError::Escapes {
                target: url.to_string(),
                destination: self.url.to_string(),
            });
        }
        Ok(url)
    }
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

    fn target_url(
        destination: &str,
        request: Option<&StoredRequest>,
    ) -> Result<Url, DestinationError> {
        Destination::parse(destination)?.target(request)
    }

    #[test]
    fn paths_append_below_the_destination() {
        let cases = [
            // (destination, path, query, target)
            (
                "https://h.example.com/hooks",
                "/a/b",
                "x=1",
                "https://h.example.com/hooks/a/b?x=1",
            ),
            (
                "https://h.example.com/hooks/",
                "/a/",
                "",
                "https://h.example.com/hooks/a/",
            ),
            (
                "https://h.example.com/hooks",
                "",
                "",
                "https://h.example.com/hooks",
            ),
            (
                "https://h.example.com",
                "/a%2Fb",
                "",
                "https://h.example.com/a%2Fb",
            ),
        ];
        for (dest, path, query, want) in cases {
            let got = target_url(dest, Some(&req(path, query))).unwrap();
            assert_eq!(got.to_string(), want, "{dest} + {path}?{query}");
        }
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
        for (dest, path) in [
            ("https://h.example.com", "//evil.com/x"),
            ("https://h.example.com/hooks", "//evil.com"),
        ] {
            let url = t(dest, path).unwrap();
            assert_eq!(url.host_str(), Some("h.example.com"), "{path}");
        }
        assert!(t("https://h.example.com/hooks", "/../admin").is_err());
        assert!(t("https://h.example.com/hooks", "/%2e%2e/admin").is_err());
        assert!(t("https://h.example.com/hooks", "@evil.com/x").is_err());
    }
}
