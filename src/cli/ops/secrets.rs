//! `spoold queue rotate-secret QUEUE`: a new signing secret, the old one
//! signing beside it for an overlap (`POST /v1/queues/{q}/secret/rotate`).

use std::io::Write;

use reqwest::Method;
use serde::Deserialize;
use serde_json::{Value, json};

use super::client::{OpsError, Target};
use super::json_lines;
use crate::cli::term::Terminal;

/// The answer: the new secret, shown this once.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Rotated {
    secret: String,
    signing_secrets: u64,
    previous_expires_at: Option<String>,
}

/// Rotates `queue`'s secret to `secret` (or one the server generates),
/// the old one signing for `overlap_seconds` (the server's default
/// without it); prints the new secret on the first line, then what signs.
pub async fn rotate_secret(
    target: &Target,
    queue: &str,
    (secret, overlap_seconds): (Option<&str>, Option<f64>),
    json: bool,
    out: &mut Terminal<impl Write>,
) -> Result<(), OpsError> {
    let mut body = serde_json::Map::new();
    if let Some(secret) = secret {
        body.insert("secret".into(), json!(secret));
    }
    if let Some(seconds) = overlap_seconds {
        body.insert("overlapSeconds".into(), json!(seconds));
    }
    let request = target
        .request(Method::POST, &format!("/v1/queues/{queue}/secret/rotate"))
        .json(&body);
    let answer: Value = target.answer(request).await?;
    if json {
        return json_lines(out, &[answer]);
    }
    let rotated: Rotated = target.decode(answer)?;
    writeln!(out, "{}", rotated.secret)?;
    let previous = match &rotated.previous_expires_at {
        Some(at) => format!("; the previous one signs until {at}"),
        None => String::new(),
    };
    writeln!(
        out,
        "{queue}: {} secret(s) sign{previous} (the new secret is shown this once)",
        rotated.signing_secrets
    )?;
    Ok(())
}
