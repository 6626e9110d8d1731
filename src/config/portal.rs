//! The `[portal]` table (docs/contract.md §4, "The portal"): the secret
//! portal sessions are signed with, the URL links point at, the sites
//! that may frame the page, the longest session, and the page's theme.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::lines::KeyLines;
use super::units::de_duration;
use super::{KeyError, secret_shape};

/// The CSS variables a theme may set (`--accent`, …).
pub const THEME_KEYS: [&str; 6] = ["accent", "background", "surface", "text", "radius", "font"];

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PortalConfig {
    /// Signs portal sessions; `SPOOLD_PORTAL_SECRET` overrides it. Unset
    /// (and no variable): no portal sessions.
    pub secret: Option<String>,
    /// The portal's public base URL (`https://hooks.example.com`), for
    /// links; unset: the `Host` the session was asked on.
    pub url: Option<String>,
    /// Origins that may show the page in an iframe (CSP
    /// `frame-ancestors`); empty: none, the page opens from a link only.
    pub frame_ancestors: Vec<String>,
    /// The longest session a link may carry.
    #[serde(rename = "session_ttl_max", deserialize_with = "de_duration")]
    pub session_ttl_max_ms: u64,
    /// CSS variables of the page ([`THEME_KEYS`]).
    pub theme: BTreeMap<String, String>,
}

impl Default for PortalConfig {
    fn default() -> PortalConfig {
        PortalConfig {
            secret: None,
            url: None,
            frame_ancestors: Vec::new(),
            session_ttl_max_ms: 24 * 3_600_000,
            theme: BTreeMap::new(),
        }
    }
}

/// Shortest portal secret: a session signed with less could be guessed.
const SECRET_MIN_BYTES: usize = 16;

impl PortalConfig {
    /// The secret in force: `SPOOLD_PORTAL_SECRET` if set, else the file's.
    pub fn secret_in_force(&self, env: Option<&str>) -> Option<String> {
        env.filter(|s| !s.is_empty())
            .map(str::to_owned)
            .or_else(|| self.secret.clone())
    }

    pub(super) fn validate(&self, keys: &KeyLines) -> Result<(), KeyError> {
        let at = |key: &str, message: String| keys.error(&["portal", key], message);
        if let Some(secret) = &self.secret {
            let why = match secret_shape(secret) {
                Err(shape) => Some(shape.to_string()),
                Ok(()) if secret.len() < SECRET_MIN_BYTES => Some(format!(
                    "shorter than {SECRET_MIN_BYTES} bytes: too easy to guess"
                )),
                Ok(()) => None,
            };
            if let Some(why) = why {
                return Err(at("secret", format!("portal.secret: {why}")));
            }
        }
        if let Some(url) = &self.url
            && !(url.starts_with("https://") || url.starts_with("http://"))
        {
            return Err(at("url", format!("portal.url = {url:?}: an http(s) URL")));
        }
        if let Some(bad) = self.frame_ancestors.iter().find(|o| !origin_ok(o)) {
            return Err(at(
                "frame_ancestors",
                format!(
                    "portal.frame_ancestors: {bad:?} is not an origin (https://app.example.com)"
                ),
            ));
        }
        if self.session_ttl_max_ms < 60_000 || self.session_ttl_max_ms > 30 * 86_400_000 {
            return Err(at(
                "session_ttl_max",
                "portal.session_ttl_max is out of range: allowed 1m to 30d".into(),
            ));
        }
        for (key, value) in &self.theme {
            if !THEME_KEYS.contains(&key.as_str()) {
                return Err(at(
                    "theme",
                    format!(
                        "portal.theme.{key}: not a theme variable ({})",
                        THEME_KEYS.join(", ")
                    ),
                ));
            }
            if !css_value_ok(value) {
                return Err(at(
                    "theme",
                    format!(
                        "portal.theme.{key} = {value:?}: a CSS value of letters, digits, \
                         spaces and #%.,()- only"
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// `https://host[:port]` (or `http://`), nothing after: what CSP's
/// `frame-ancestors` takes as a source.
fn origin_ok(origin: &str) -> bool {
    let Some(rest) = origin
        .strip_prefix("https://")
        .or_else(|| origin.strip_prefix("http://"))
    else {
        return false;
    };
    !rest.is_empty()
        && rest
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-.:*[]".contains(&b))
}

/// A value that cannot end its declaration or open another: no `;`,
/// braces, quotes, slashes or `url(`.
fn css_value_ok(value: &str) -> bool {
    !value.is_empty()
        && value.len() <= 100
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b" #%.,()-".contains(&b))
        && !value.to_ascii_lowercase().contains("url")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origins_and_css_values_are_checked() {
        assert!(origin_ok("https://app.example.com"));
        assert!(origin_ok("http://localhost:3000"));
        assert!(!origin_ok("https://app.example.com/path"));
        assert!(!origin_ok("app.example.com"));
        assert!(!origin_ok("https://a.example; script-src *"));
        assert!(css_value_ok("#2857d6"));
        assert!(css_value_ok("rgb(10, 20, 30)"));
        assert!(!css_value_ok("red; } body { display: none"));
        assert!(!css_value_ok("url(https)"));
        assert!(!css_value_ok(""));
    }
}
