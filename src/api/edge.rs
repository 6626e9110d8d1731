//! Who may call at all, before the API key is looked at: requests a web
//! page made the browser send (cross-site request forgery), and requests
//! that reached a loopback-only server under a foreign name (DNS
//! rebinding), are refused with `403 forbidden` (docs/contract.md §4).
//!
//! - `Sec-Fetch-Site: cross-site` or `same-site`: a page of another origin
//!   made the request (a browser sets the header; a page cannot).
//! - `Origin` present and not this server's own (the `Host` after
//!   `http://` or `https://`), or `null`: the same, from browsers without
//!   `Sec-Fetch-Site`.
//! - With no API key on a loopback listener, a `Host` that is not a
//!   loopback name or address: a name of the attacker's that now resolves
//!   to 127.0.0.1. (A listener beyond loopback without a key, which
//!   `server.allow_unauthenticated` allows, is reached by other names.)
//!
//! The probes (`/healthz`, `/readyz`) are exempt: a kubelet calls them by
//! the pod's address and they carry nothing. So are `GET`s of the
//! portal's page and files (`portal.rs`), which another site may link to
//! or frame: they carry no data, and the host check still holds. The console is served from
//! this origin, so its calls are `same-origin` and pass.

use axum::extract::Request;
use axum::http::{HeaderMap, header};

use super::error::ApiError;

/// What the edge checks depend on.
#[derive(Debug, Clone, Copy)]
pub(crate) struct EdgePolicy {
    /// No API key on a loopback listener: the server trusts being on
    /// loopback, so the `Host` must say loopback too.
    pub loopback_only: bool,
}

/// Whether `request` may go on to the key check and the handler.
pub(crate) fn check(policy: EdgePolicy, request: &Request) -> Result<(), ApiError> {
    let path = request.uri().path();
    if path == "/healthz" || path == "/readyz" {
        return Ok(());
    }
    // The portal's page may be opened from another site: a link, or an
    // iframe (`portal.rs`). Only its static files; its API calls are
    // same-origin and checked as any.
    let portal_page = (path == "/portal" || path.starts_with("/portal/"))
        && matches!(
            *request.method(),
            axum::http::Method::GET | axum::http::Method::HEAD
        );
    if portal_page {
        return check_host(policy, request.headers());
    }
    check_headers(policy, request.headers())
}

fn check_headers(policy: EdgePolicy, headers: &HeaderMap) -> Result<(), ApiError> {
    let text = |name: &str| headers.get(name).map(|v| v.to_str().unwrap_or("\u{fffd}"));
    let host = text(header::HOST.as_str());
    if let Some(site) = text("sec-fetch-site")
        && (site.eq_ignore_ascii_case("cross-site") || site.eq_ignore_ascii_case("same-site"))
    {
        return Err(ApiError::forbidden(format!(
            "a {site} request from a web page is refused (Sec-Fetch-Site)"
        )));
    }
    if let Some(origin) = text(header::ORIGIN.as_str()) {
        let own = host.is_some_and(|host| same_origin(origin, host));
        if !own {
            return Err(ApiError::forbidden(format!(
                "a request from the web origin {origin:?} is refused: only this server's own origin may call"
            )));
        }
    }
    check_host(policy, headers)
}

/// A loopback-only server answers only to loopback names (DNS rebinding).
fn check_host(policy: EdgePolicy, headers: &HeaderMap) -> Result<(), ApiError> {
    let host = headers
        .get(header::HOST)
        .map(|v| v.to_str().unwrap_or("\u{fffd}"));
    if policy.loopback_only
        && let Some(host) = host
        && !loopback_host(host)
    {
        return Err(ApiError::forbidden(format!(
            "Host {host:?} is not a loopback name or address: without an API key this server \
             answers only to 127.0.0.1, [::1] or localhost"
        )));
    }
    Ok(())
}

/// `origin` (`scheme://host[:port]`) names `host` (the `Host` header),
/// without case: `http://`, or `https://` behind a proxy that ends TLS.
fn same_origin(origin: &str, host: &str) -> bool {
    origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"))
        .is_some_and(|authority| authority.eq_ignore_ascii_case(host))
}

/// `host` (a `Host` header: `name[:port]`, `[v6][:port]`) names loopback:
/// `localhost` (or a name under `.localhost`, RFC 6761), `127.0.0.0/8` or
/// `::1`.
fn loopback_host(host: &str) -> bool {
    let name = match host.strip_prefix('[') {
        Some(rest) => match rest.split_once(']') {
            Some((v6, port)) if port.is_empty() || port.starts_with(':') => v6,
            _ => return false,
        },
        None => host.rsplit_once(':').map_or(host, |(name, _)| name),
    };
    let name = name.trim_end_matches('.').to_ascii_lowercase();
    name == "localhost"
        || name.ends_with(".localhost")
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        pairs
            .iter()
            .map(|(k, v)| (axum::http::HeaderName::from_static(k), v.parse().unwrap()))
            .collect()
    }

    #[test]
    fn hosts_name_loopback_or_not() {
        for host in [
            "127.0.0.1:8787",
            "127.9.9.9",
            "[::1]:80",
            "[::1]",
            "localhost:1",
            "LOCALHOST.",
            "app.localhost:3",
        ] {
            assert!(loopback_host(host), "{host}");
        }
        for host in [
            "evil.example",
            "evil.example:8787",
            "10.0.0.1:8787",
            "[::2]:80",
            "[::1]x",
            "localhost.evil.example",
            "127.0.0.1.nip.io",
        ] {
            assert!(!loopback_host(host), "{host}");
        }
    }

    #[test]
    fn cross_site_requests_and_foreign_hosts_are_refused() {
        let strict = EdgePolicy {
            loopback_only: true,
        };
        let open = EdgePolicy {
            loopback_only: false,
        };
        let ok = |p, h: &[(&'static str, &str)]| check_headers(p, &headers(h)).is_ok();
        assert!(ok(strict, &[("host", "127.0.0.1:8787")]));
        assert!(ok(
            strict,
            &[
                ("host", "127.0.0.1:8787"),
                ("origin", "http://127.0.0.1:8787"),
                ("sec-fetch-site", "same-origin")
            ]
        ));
        assert!(ok(
            strict,
            &[("host", "localhost:8787"), ("sec-fetch-site", "none")]
        ));
        assert!(!ok(
            strict,
            &[("host", "127.0.0.1:8787"), ("sec-fetch-site", "cross-site")]
        ));
        assert!(!ok(
            strict,
            &[("host", "127.0.0.1:8787"), ("sec-fetch-site", "same-site")]
        ));
        assert!(!ok(
            strict,
            &[
                ("host", "127.0.0.1:8787"),
                ("origin", "http://evil.example")
            ]
        ));
        assert!(!ok(
            strict,
            &[("host", "127.0.0.1:8787"), ("origin", "null")]
        ));
        assert!(!ok(
            strict,
            &[
                ("host", "127.0.0.1:8787"),
                ("origin", "http://127.0.0.1:3000")
            ]
        ));
        assert!(!ok(strict, &[("host", "evil.example:8787")]));
        // With a key, any name may reach the server; browsers still may not.
        assert!(ok(open, &[("host", "spoold.internal:8787")]));
        assert!(!ok(
            open,
            &[
                ("host", "spoold.internal:8787"),
                ("origin", "https://evil.example")
            ]
        ));
    }
}
