//! `spoold portal link --tenant T`: a link to the customer portal for one
//! tenant (`POST /v1/portal/sessions`), to hand to that customer.

use std::io::Write;

use reqwest::Method;
use serde_json::{Value, json};

use super::client::{OpsError, Target};
use crate::cli::term::Terminal;

/// What the link may do, and for how long.
pub struct PortalLink<'a> {
    pub tenant: &'a str,
    pub ttl_seconds: u64,
    /// `read`, `manage`, `publish`; empty: all three.
    pub capabilities: &'a [String],
    /// Queue-name globs; empty: every queue of the tenant.
    pub queues: &'a [String],
}

/// Prints the link (with `json`, the whole answer as one line).
pub async fn portal_link(
    target: &Target,
    link: PortalLink<'_>,
    json: bool,
    out: &mut Terminal<impl Write>,
) -> Result<(), OpsError> {
    let mut body = json!({"tenant": link.tenant, "ttlSeconds": link.ttl_seconds});
    if !link.capabilities.is_empty() {
        body["capabilities"] = json!(link.capabilities);
    }
    if !link.queues.is_empty() {
        body["queues"] = json!(link.queues);
    }
    let answer: Value = target
        .answer(
            target
                .request(Method::POST, "/v1/portal/sessions")
                .json(&body),
        )
        .await?;
    if json {
        writeln!(out, "{answer}")?;
    } else {
        writeln!(out, "{}", answer["url"].as_str().unwrap_or_default())?;
        writeln!(
            out,
            "# tenant {}, until {}",
            answer["tenant"].as_str().unwrap_or_default(),
            answer["expiresAt"].as_str().unwrap_or_default()
        )?;
    }
    Ok(())
}
