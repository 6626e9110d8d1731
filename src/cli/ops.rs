//! Operator subcommands that talk to a running server over its HTTP API:
//! `queues`, `tail`, `send`, `dlq list|redrive|purge`.
//!
//! Every failure is one readable line (`spoold: <kind>: <message>`) and a
//! non-zero exit; `main` prints it.

use std::fmt::Write as _;
use std::io::{BufRead, Write};

use futures_util::StreamExt;
use reqwest::{Client, Method, RequestBuilder, Response};
use serde_json::Value;

/// Where the server is and how to authenticate.
#[derive(Debug, Clone)]
pub struct Target {
    pub url: String,
    pub api_key: Option<String>,
}

/// A failure to show the operator.
#[derive(Debug, thiserror::Error)]
pub enum OpsError {
    /// The server answered with an error body.
    #[error("{kind}: {message}")]
    Server { kind: String, message: String },
    /// The server could not be reached, or answered something unreadable.
    #[error("cannot talk to {url}: {reason}")]
    Transport { url: String, reason: String },
    #[error("{0}")]
    Usage(String),
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

impl Target {
    fn client() -> Client {
        crate::delivery::client::install_crypto_provider();
        Client::new()
    }

    fn request(&self, method: Method, path: &str) -> RequestBuilder {
        let url = format!("{}{path}", self.url.trim_end_matches('/'));
        let b = Target::client().request(method, url);
        match &self.api_key {
            Some(key) => b.header("Spooler-Api-Key", key),
            None => b,
        }
    }

    async fn send(&self, request: RequestBuilder) -> Result<Response, OpsError> {
        let response = request.send().await.map_err(|e| OpsError::Transport {
            url: self.url.clone(),
            reason: e.without_url().to_string(),
        })?;
        if response.status().is_success() {
            return Ok(response);
        }
        let status = response.status();
        let body: Value = response.json().await.unwrap_or(Value::Null);
        Err(OpsError::Server {
            kind: body["kind"].as_str().unwrap_or("error").to_string(),
            message: body["message"]
                .as_str()
                .map_or_else(|| format!("HTTP {status}"), str::to_string),
        })
    }

    async fn json(&self, method: Method, path: &str) -> Result<Value, OpsError> {
        let response = self.send(self.request(method, path)).await?;
        response.json().await.map_err(|e| OpsError::Transport {
            url: self.url.clone(),
            reason: format!("unreadable answer: {e}"),
        })
    }
}

fn pad(out: &mut String, cells: &[String], widths: &[usize]) {
    let line: Vec<String> = cells
        .iter()
        .zip(widths)
        .map(|(c, w)| format!("{c:<w$}"))
        .collect();
    let _ = writeln!(out, "{}", line.join("  ").trim_end());
}

/// Renders rows as an aligned table with a header.
fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    pad(
        &mut out,
        &header.iter().map(|h| h.to_string()).collect::<Vec<_>>(),
        &widths,
    );
    for row in rows {
        pad(&mut out, row, &widths);
    }
    out
}

fn num(v: &Value) -> String {
    match v {
        Value::Number(n) => n.to_string(),
        Value::Bool(b) => b.to_string(),
        Value::String(s) => s.clone(),
        _ => "-".into(),
    }
}

/// `spoold queues`: every queue with its stats, as a table.
pub async fn queues(target: &Target) -> Result<String, OpsError> {
    let list = target.json(Method::GET, "/v1/queues").await?;
    let rows: Vec<Vec<String>> = list["queues"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .map(|q| {
            let st = &q["stats"];
            let kind = if q["settings"]["destination"].is_string() {
                "push"
            } else {
                "pull"
            };
            vec![
                num(&q["name"]),
                kind.to_string(),
                num(&st["visible"]),
                num(&st["leased"]),
                num(&st["delayed"]),
                format!(
                    "{:.0}s",
                    st["oldestVisibleAgeSeconds"].as_f64().unwrap_or(0.0)
                ),
                num(&st["paused"]),
            ]
        })
        .collect();
    Ok(table(
        &[
            "QUEUE", "TYPE", "VISIBLE", "LEASED", "DELAYED", "OLDEST", "PAUSED",
        ],
        &rows,
    ))
}

/// One message as a line for people.
fn message_line(m: &Value) -> String {
    let body = m["body"]
        .as_str()
        .map(|b| b.chars().take(80).collect::<String>().replace('\n', "\\n"))
        .unwrap_or_else(|| "<binary>".into());
    format!(
        "{} {} retry={} {}",
        num(&m["enqueuedAt"]),
        num(&m["id"]),
        num(&m["retryCount"]),
        body
    )
}

/// `spoold tail QUEUE`: follows new messages until interrupted (or the
/// server goes away), one line each, or the raw JSON lines with `json`.
pub async fn tail(
    target: &Target,
    queue: &str,
    json: bool,
    out: &mut impl Write,
) -> Result<(), OpsError> {
    let response = target
        .send(target.request(Method::GET, &format!("/v1/queues/{queue}/tail")))
        .await?;
    let mut stream = response.bytes_stream();
    let mut pending = Vec::new();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| OpsError::Transport {
            url: target.url.clone(),
            reason: e.to_string(),
        })?;
        pending.extend_from_slice(&chunk);
        while let Some(end) = pending.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = pending.drain(..=end).collect();
            let text = String::from_utf8_lossy(&line[..line.len() - 1]).into_owned();
            if json {
                writeln!(out, "{text}")?;
            } else {
                let m: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
                writeln!(out, "{}", message_line(&m))?;
            }
            out.flush()?;
        }
    }
    Ok(())
}

/// `spoold send QUEUE`: sends `body`; returns the new message's id.
pub async fn send(
    target: &Target,
    queue: &str,
    body: Vec<u8>,
    content_type: &str,
    key: Option<&str>,
) -> Result<String, OpsError> {
    let mut request = target
        .request(Method::POST, &format!("/v1/queues/{queue}/messages"))
        .header("Content-Type", content_type)
        .body(body);
    if let Some(k) = key {
        request = request.header("Idempotency-Key", k);
    }
    let answer: Value =
        target
            .send(request)
            .await?
            .json()
            .await
            .map_err(|e| OpsError::Transport {
                url: target.url.clone(),
                reason: format!("unreadable answer: {e}"),
            })?;
    Ok(num(&answer["id"]))
}

/// `spoold dlq list QUEUE`: the failure queue's messages with why they
/// failed.
pub async fn dlq_list(target: &Target, queue: &str) -> Result<String, OpsError> {
    let mut rows = Vec::new();
    let mut after = String::new();
    loop {
        let page = target
            .json(
                Method::GET,
                &format!("/v1/queues/{queue}.failed/messages?limit=1000{after}"),
            )
            .await?;
        let messages = page["messages"].as_array().cloned().unwrap_or_default();
        let Some(last) = messages.last() else { break };
        after = format!("&after={}", num(&last["id"]));
        for m in &messages {
            rows.push(vec![
                num(&m["id"]),
                num(&m["reason"]),
                m.get("lastStatus").map_or_else(|| "-".into(), num),
                m["attempts"].as_array().map_or(0, Vec::len).to_string(),
                num(&m["retryCount"]),
                num(&m["failedAt"]),
            ]);
        }
    }
    Ok(table(
        &[
            "ID",
            "REASON",
            "LAST_STATUS",
            "ATTEMPTS",
            "RETRIES",
            "FAILED_AT",
        ],
        &rows,
    ))
}

/// `spoold dlq redrive QUEUE`: moves failed messages back; returns a line
/// saying how many.
pub async fn dlq_redrive(
    target: &Target,
    queue: &str,
    max: Option<u64>,
    dry_run: bool,
) -> Result<String, OpsError> {
    let mut path = format!("/v1/queues/{queue}/redrive?dryRun={dry_run}");
    if let Some(max) = max {
        let _ = write!(path, "&max={max}");
    }
    let answer = target.json(Method::POST, &path).await?;
    let moved = num(&answer["moved"]);
    Ok(if dry_run {
        format!("would move {moved} message(s) from {queue}.failed back to {queue}")
    } else {
        format!("moved {moved} message(s) from {queue}.failed back to {queue}")
    })
}

/// `spoold dlq purge QUEUE`: deletes every failed message, after asking on
/// `input` unless `yes`.
pub async fn dlq_purge(
    target: &Target,
    queue: &str,
    yes: bool,
    input: &mut impl BufRead,
    prompt: &mut impl Write,
) -> Result<String, OpsError> {
    if !yes {
        write!(
            prompt,
            "Delete every message in {queue}.failed? Type the queue name to confirm: "
        )?;
        prompt.flush()?;
        let mut answer = String::new();
        input.read_line(&mut answer)?;
        if answer.trim() != queue {
            return Err(OpsError::Usage("not confirmed; nothing was purged".into()));
        }
    }
    let answer = target
        .json(
            Method::DELETE,
            &format!("/v1/queues/{queue}.failed/messages"),
        )
        .await?;
    Ok(format!(
        "purged {} message(s) from {}",
        num(&answer["purged"]),
        crate::spool::queue::failed_queue_name(queue)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_align_columns() {
        let t = table(
            &["A", "LONGER"],
            &[
                vec!["xxxx".into(), "1".into()],
                vec!["y".into(), "22".into()],
            ],
        );
        assert_eq!(t, "A     LONGER\nxxxx  1\ny     22\n");
    }
}
