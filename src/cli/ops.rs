//! Operator subcommands that talk to a running server over its HTTP API:
//! `queues`, `stats`, `queue set|pause|resume|probe|close-breaker`, `tail`,
//! `send`, `dlq list|show|redrive|purge`.
//!
//! Each writes what it has to say to `out` (a table for people, or with
//! `--json` one JSON object per line); every failure is one readable line
//! (`spoold: <kind>: <message>`, with the cause) and a non-zero exit;
//! `main` prints it. A dead-letter command accepts the queue's name or its
//! failure queue's (`hooks` or `hooks.failed`).

use std::fmt::Write as _;
use std::io::{BufRead, Write};

use futures_util::StreamExt;
use reqwest::{Client, Method, RequestBuilder, Response};
use serde_json::Value;

use crate::spool::queue::{failed_queue_name, origin_queue_name};
use crate::spool::{FailReason, StatusMatch};
use crate::time::{Millis, format_rfc3339, parse_rfc3339};

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
    /// The server could not be reached, or answered something unreadable;
    /// `reason` carries the whole chain of causes.
    #[error("cannot talk to {url}: {reason}")]
    Transport { url: String, reason: String },
    /// A flag's value is wrong: exit 2.
    #[error("{0}")]
    Usage(String),
    /// The operator did not confirm.
    #[error("{0}")]
    Declined(String),
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// An error and its causes, `: `-separated (reqwest's own message is only
/// "error sending request"; the cause says "connection refused").
fn with_causes(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        let more = cause.to_string();
        if !text.contains(&more) {
            let _ = write!(text, ": {more}");
        }
        source = cause.source();
    }
    text
}

impl Target {
    /// `url` may leave out the scheme (`127.0.0.1:8787`): HTTP is meant.
    pub fn new(url: &str, api_key: Option<String>) -> Target {
        let url = if url.contains("://") {
            url.to_owned()
        } else {
            format!("http://{url}")
        };
        Target { url, api_key }
    }

    fn client() -> Client {
        crate::tls::install_crypto_provider();
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

    fn transport(&self, e: reqwest::Error) -> OpsError {
        OpsError::Transport {
            url: self.url.clone(),
            reason: with_causes(&e.without_url()),
        }
    }

    async fn send(&self, request: RequestBuilder) -> Result<Response, OpsError> {
        let (client, request) = request.build_split();
        let request = request.map_err(|e| self.transport(e))?;
        let again = request.try_clone();
        let mut response = client
            .execute(request)
            .await
            .map_err(|e| self.transport(e))?;
        // A replica that does not relay names the primary: ask it instead
        // (once).
        if response.status() == reqwest::StatusCode::MISDIRECTED_REQUEST
            && let Some(primary) = response
                .headers()
                .get("spooler-primary")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| reqwest::Url::parse(v).ok())
            && let Some(mut again) = again
        {
            let url = again.url_mut();
            let _ = url.set_scheme(primary.scheme());
            let _ = url.set_host(primary.host_str());
            let _ = url.set_port(primary.port());
            response = client.execute(again).await.map_err(|e| self.transport(e))?;
        }
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
        self.json_of(self.request(method, path)).await
    }

    async fn json_of(&self, request: RequestBuilder) -> Result<Value, OpsError> {
        let response = self.send(request).await?;
        response.json().await.map_err(|e| OpsError::Transport {
            url: self.url.clone(),
            reason: format!("unreadable answer: {}", with_causes(&e)),
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

/// Writes one JSON object per line.
fn json_lines(out: &mut impl Write, items: &[Value]) -> Result<(), OpsError> {
    for item in items {
        writeln!(out, "{item}")?;
    }
    Ok(())
}

/// `spoold queues`: every queue with its stats, as a table (or JSON lines).
pub async fn queues(target: &Target, json: bool, out: &mut impl Write) -> Result<(), OpsError> {
    let list = target.json(Method::GET, "/v1/queues").await?;
    let queues = list["queues"].as_array().cloned().unwrap_or_default();
    if json {
        return json_lines(out, &queues);
    }
    let rows: Vec<Vec<String>> = queues
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
    write!(
        out,
        "{}",
        table(
            &[
                "QUEUE", "TYPE", "VISIBLE", "LEASED", "DELAYED", "OLDEST", "PAUSED"
            ],
            &rows,
        )
    )?;
    Ok(())
}

/// `spoold cluster status`: this replica's view of its cluster, as a
/// table of members (or the JSON of `GET /v1/cluster`).
pub async fn cluster_status(
    target: &Target,
    json: bool,
    out: &mut impl Write,
) -> Result<(), OpsError> {
    let status = target.json(Method::GET, "/v1/cluster").await?;
    print_cluster(&status, json, out)
}

/// `spoold cluster add ID ADDR`: adds a member through the primary and
/// waits until it is a voter (up to `catch_up` for it to catch up).
pub async fn cluster_add(
    target: &Target,
    (id, addr): (u64, &str),
    catch_up: Option<std::time::Duration>,
    json: bool,
    out: &mut impl Write,
) -> Result<(), OpsError> {
    let mut body = serde_json::json!({ "nodeId": id, "addr": addr });
    if let Some(wait) = catch_up {
        body["catchUpTimeoutSecs"] = wait.as_secs().max(1).into();
    }
    let status = target
        .json_of(
            target
                .request(Method::POST, "/v1/cluster/members")
                .json(&body),
        )
        .await?;
    print_cluster(&status, json, out)
}

/// `spoold cluster remove ID`: removes a member through the primary.
pub async fn cluster_remove(
    target: &Target,
    id: u64,
    json: bool,
    out: &mut impl Write,
) -> Result<(), OpsError> {
    let status = target
        .json(Method::DELETE, &format!("/v1/cluster/members/{id}"))
        .await?;
    print_cluster(&status, json, out)
}

/// The answer of `GET /v1/cluster` (or of a membership change) as a
/// table, or as one line of JSON.
fn print_cluster(status: &Value, json: bool, out: &mut impl Write) -> Result<(), OpsError> {
    if json {
        return json_lines(out, std::slice::from_ref(status));
    }
    let primary = match &status["primary"] {
        Value::Null => "none known".to_string(),
        p => format!(
            "node {} ({})",
            num(&p["nodeId"]),
            p["apiUrl"].as_str().unwrap_or("address not known yet")
        ),
    };
    writeln!(
        out,
        "node {}: {} in term {}; primary: {primary}; commit index {}",
        num(&status["nodeId"]),
        num(&status["role"]),
        num(&status["term"]),
        num(&status["commitIndex"]),
    )?;
    let rows: Vec<Vec<String>> = status["members"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|m| {
            vec![
                num(&m["nodeId"]),
                num(&m["addr"]),
                if m["voter"] == Value::Bool(true) {
                    "voter"
                } else {
                    "learner"
                }
                .to_string(),
                num(&m["matchIndex"]),
                num(&m["lagRecords"]),
            ]
        })
        .collect();
    write!(
        out,
        "{}",
        table(&["NODE", "ADDR", "ROLE", "MATCH", "LAG"], &rows)
    )?;
    Ok(())
}

/// One message as a line for people; a dead letter also says why it
/// failed.
fn message_line(m: &Value) -> String {
    let body = m["body"]
        .as_str()
        .map(|b| b.chars().take(80).collect::<String>().replace('\n', "\\n"))
        .unwrap_or_else(|| "<binary>".into());
    // A dead letter: when and why it failed comes first.
    let mut line = match m["reason"].as_str() {
        Some(reason) => {
            let mut line = format!(
                "{} {} failed reason={reason}",
                num(&m["failedAt"]),
                num(&m["id"])
            );
            if let Some(status) = m.get("lastStatus") {
                let _ = write!(line, " status={}", num(status));
            }
            if let Some(error) = m["lastError"].as_str().filter(|e| !e.is_empty()) {
                let error: String = error.chars().take(60).collect();
                let _ = write!(line, " error={error:?}");
            }
            let _ = write!(
                line,
                " retry={} enqueued={}",
                num(&m["retryCount"]),
                num(&m["enqueuedAt"])
            );
            line
        }
        None => format!(
            "{} {} retry={}",
            num(&m["enqueuedAt"]),
            num(&m["id"]),
            num(&m["retryCount"]),
        ),
    };
    let _ = write!(line, " {body}");
    line
}

/// How a `tail` ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TailEnd {
    /// The server ended the stream: it is stopping.
    ServerStopped,
}

/// `spoold tail QUEUE`: the `last` newest messages, then new ones as they
/// arrive, one line each (or the raw JSON lines), until interrupted or the
/// server stops.
pub async fn tail(
    target: &Target,
    queue: &str,
    last: usize,
    json: bool,
    out: &mut impl Write,
) -> Result<TailEnd, OpsError> {
    let response = target
        .send(target.request(Method::GET, &format!("/v1/queues/{queue}/tail?last={last}")))
        .await?;
    let mut stream = response.bytes_stream();
    let mut pending = Vec::new();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| OpsError::Transport {
            url: target.url.clone(),
            reason: format!("the stream broke off: {}", with_causes(&e.without_url())),
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
    Ok(TailEnd::ServerStopped)
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
                reason: format!("unreadable answer: {}", with_causes(&e)),
            })?;
    Ok(num(&answer["id"]))
}

/// An event as `spoold events send` publishes it.
pub struct Event<'a> {
    pub event_type: &'a str,
    pub tenant: Option<&'a str>,
    pub payload: Vec<u8>,
    pub content_type: &'a str,
    pub key: Option<&'a str>,
}

/// `spoold events send TYPE`: publishes `event` (its payload as is, with
/// its type and tenant in headers); prints the event's id, then each
/// delivery as `QUEUE ID` (with `json`, the answer as one line).
pub async fn events_send(
    target: &Target,
    event: Event<'_>,
    json: bool,
    out: &mut dyn Write,
) -> Result<(), OpsError> {
    let mut request = target
        .request(Method::POST, "/v1/events")
        .header("Spooler-Event-Type", event.event_type)
        .header("Content-Type", event.content_type)
        .body(event.payload);
    if let Some(tenant) = event.tenant {
        request = request.header("Spooler-Tenant", tenant);
    }
    if let Some(k) = event.key {
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
                reason: format!("unreadable answer: {}", with_causes(&e)),
            })?;
    if json {
        writeln!(out, "{answer}")?;
        return Ok(());
    }
    writeln!(out, "{}", num(&answer["id"]))?;
    for d in answer["deliveries"].as_array().into_iter().flatten() {
        writeln!(out, "{} {}", num(&d["queue"]), num(&d["id"]))?;
    }
    Ok(())
}

/// The dead-letter filters of docs/contract.md §4 as the CLI takes them.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct DeadLetterArgs {
    /// Only dead letters that failed for this reason: retries_exhausted,
    /// permanent_status or expired.
    #[arg(long)]
    pub reason: Option<String>,
    /// Only those whose last HTTP status was this code (503) or in this
    /// class (5xx).
    #[arg(long)]
    pub status: Option<String>,
    /// Only those that failed at or after this time: RFC 3339
    /// (2026-11-30T10:00:00Z) or a duration ago (2h, 1d12h).
    #[arg(long)]
    pub since: Option<String>,
    /// Only those that failed before this time: RFC 3339 or a duration ago.
    #[arg(long)]
    pub until: Option<String>,
    /// Only this message id (repeat for several).
    #[arg(long = "id", value_name = "ID")]
    pub ids: Vec<String>,
}

impl DeadLetterArgs {
    /// The filter as query pairs, checked here so that a typo is a usage
    /// error before anything is sent; relative times count back from `now`.
    pub fn query(&self, now: Millis) -> Result<Vec<(&'static str, String)>, OpsError> {
        let mut pairs = Vec::new();
        if let Some(reason) = &self.reason {
            if FailReason::parse(reason).is_none() {
                let names: Vec<&str> = FailReason::ALL.iter().map(|r| r.as_str()).collect();
                return Err(OpsError::Usage(format!(
                    "--reason {reason:?}: one of {}",
                    names.join(", ")
                )));
            }
            pairs.push(("reason", reason.clone()));
        }
        if let Some(status) = &self.status {
            if StatusMatch::parse(status).is_none() {
                return Err(OpsError::Usage(format!(
                    "--status {status:?}: an HTTP status (500) or a class (5xx)"
                )));
            }
            pairs.push(("status", status.clone()));
        }
        for (name, value) in [("since", &self.since), ("until", &self.until)] {
            if let Some(text) = value {
                pairs.push((name, format_rfc3339(point_in_time(name, text, now)?)));
            }
        }
        for id in &self.ids {
            pairs.push(("id", id.clone()));
        }
        Ok(pairs)
    }

    /// The filter as people read it, for confirmations and reports.
    fn describe(&self) -> String {
        let mut terms = Vec::new();
        for (name, value) in [
            ("reason", &self.reason),
            ("status", &self.status),
            ("since", &self.since),
            ("until", &self.until),
        ] {
            if let Some(v) = value {
                terms.push(format!("{name} {v}"));
            }
        }
        if !self.ids.is_empty() {
            terms.push(format!("id {}", self.ids.join(", ")));
        }
        if terms.is_empty() {
            String::new()
        } else {
            format!(" matching {}", terms.join(", "))
        }
    }
}

/// An RFC 3339 time, or a duration (`2h`) before `now`.
fn point_in_time(flag: &str, text: &str, now: Millis) -> Result<Millis, OpsError> {
    if let Some(at) = parse_rfc3339(text) {
        return Ok(at);
    }
    match crate::config::parse_duration_ms(text) {
        Ok(ago) => Ok(now - ago as Millis),
        Err(_) => Err(OpsError::Usage(format!(
            "--{flag} {text:?}: an RFC 3339 time (2026-11-30T10:00:00Z) or a duration ago (2h)"
        ))),
    }
}

fn encode(pairs: &[(&str, String)]) -> String {
    let mut q = url::form_urlencoded::Serializer::new(String::new());
    for (k, v) in pairs {
        q.append_pair(k, v);
    }
    q.finish()
}

fn now_ms() -> Millis {
    crate::time::Clock::now_ms(&crate::time::SystemClock)
}

/// `spoold dlq list QUEUE`: the dead letters the filter selects (all by
/// default, at most `limit`), with why they failed.
pub async fn dlq_list(
    target: &Target,
    queue: &str,
    filter: &DeadLetterArgs,
    search: &SearchArgs,
    limit: Option<usize>,
    json: bool,
    out: &mut impl Write,
) -> Result<(), OpsError> {
    let failed = failed_queue_name(origin_queue_name(queue));
    let mut terms = filter.query(now_ms())?;
    terms.extend(search.pairs());
    let path = format!("/v1/queues/{failed}/messages");
    let all = every_page(target, &path, terms, "after", limit).await?;
    if json {
        return json_lines(out, &all);
    }
    let rows: Vec<Vec<String>> = all
        .iter()
        .map(|m| {
            vec![
                num(&m["id"]),
                num(&m["reason"]),
                m.get("lastStatus").map_or_else(|| "-".into(), num),
                m["attempts"].as_array().map_or(0, Vec::len).to_string(),
                num(&m["failedAt"]),
                m["lastError"]
                    .as_str()
                    .map_or_else(|| "-".into(), |e| e.chars().take(60).collect()),
            ]
        })
        .collect();
    write!(
        out,
        "{}",
        table(
            &[
                "ID",
                "REASON",
                "LAST_STATUS",
                "ATTEMPTS",
                "FAILED_AT",
                "LAST_ERROR"
            ],
            &rows
        )
    )?;
    Ok(())
}

/// `spoold dlq show QUEUE ID`: one dead letter with every attempt, what the
/// destination answered, and the stored request.
pub async fn dlq_show(
    target: &Target,
    queue: &str,
    id: &str,
    json: bool,
    out: &mut impl Write,
) -> Result<(), OpsError> {
    let failed = failed_queue_name(origin_queue_name(queue));
    let path = format!(
        "/v1/queues/{failed}/messages/{}",
        url::form_urlencoded::byte_serialize(id.as_bytes()).collect::<String>()
    );
    let m = target.json(Method::GET, &path).await?;
    if json {
        return json_lines(out, &[m]);
    }
    let field = |name: &str| m.get(name).map_or_else(|| "-".into(), num);
    writeln!(out, "id           {}", field("id"))?;
    writeln!(
        out,
        "queue        {} (from {})",
        field("queue"),
        field("originQueue")
    )?;
    writeln!(out, "reason       {}", field("reason"))?;
    writeln!(out, "last status  {}", field("lastStatus"))?;
    writeln!(out, "last error   {}", field("lastError"))?;
    writeln!(out, "failed at    {}", field("failedAt"))?;
    writeln!(out, "enqueued at  {}", field("enqueuedAt"))?;
    writeln!(out, "retries      {}", field("retryCount"))?;
    if let Some(req) = m.get("request") {
        writeln!(
            out,
            "request      {} {}",
            num(&req["method"]),
            num(&req["path"])
        )?;
        if let Some(headers) = req["headers"].as_object() {
            for (name, value) in headers {
                writeln!(out, "  {name}: {}", num(value))?;
            }
        }
    }
    attempts_and_body(&m, out)
}

/// The attempts (each with what the destination answered) and the body of
/// a message as `dlq show` and `history show` print them.
fn attempts_and_body(m: &Value, out: &mut impl Write) -> Result<(), OpsError> {
    let attempts = m["attempts"].as_array().cloned().unwrap_or_default();
    writeln!(out, "attempts     {}", attempts.len())?;
    for (i, a) in attempts.iter().enumerate() {
        let outcome = a
            .get("status")
            .map_or_else(|| num(&a["error"]), |s| format!("HTTP {}", num(s)));
        writeln!(
            out,
            "  {:>3}. {}  {}  {:.3}s",
            i + 1,
            num(&a["at"]),
            outcome,
            a["durationSeconds"].as_f64().unwrap_or(0.0)
        )?;
        if let Some(response) = a["response"].as_str() {
            writeln!(out, "       response: {}", response.replace('\n', "\\n"))?;
        }
    }
    match (m["body"].as_str(), m["bodyBase64"].as_str()) {
        (Some(body), _) => writeln!(out, "body\n{body}")?,
        (None, Some(b64)) => writeln!(out, "body (base64)\n{b64}")?,
        _ => {}
    }
    Ok(())
}

/// Search terms on what messages carry (`history list`, `dlq list`).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct SearchArgs {
    /// Only deliveries of events of this type.
    #[arg(long = "type", value_name = "TYPE")]
    pub event_type: Option<String>,
    /// Only deliveries of events of this tenant.
    #[arg(long)]
    pub tenant: Option<String>,
    /// Only bodies that contain this text.
    #[arg(long)]
    pub contains: Option<String>,
    /// Only JSON bodies with this value at this path: '$.customer.id=42'.
    #[arg(long = "match", value_name = "PATH=VALUE")]
    pub json_match: Option<String>,
}

impl SearchArgs {
    fn pairs(&self) -> Vec<(&'static str, String)> {
        let mut pairs = Vec::new();
        pairs.extend(self.event_type.clone().map(|t| ("type", t)));
        pairs.extend(self.tenant.clone().map(|t| ("tenant", t)));
        pairs.extend(self.contains.clone().map(|t| ("contains", t)));
        pairs.extend(self.json_match.clone().map(|t| ("match", t)));
        pairs
    }
}

/// The messages of every page of `path` (peek or history) with `terms`,
/// up to `limit`: each page's `next` is the next one's `cursor` parameter
/// (a search page may hold nothing and still say where to go on).
async fn every_page(
    target: &Target,
    path: &str,
    terms: Vec<(&'static str, String)>,
    cursor: &'static str,
    limit: Option<usize>,
) -> Result<Vec<Value>, OpsError> {
    let limit = limit.unwrap_or(usize::MAX);
    let mut all = Vec::new();
    let mut next: Option<String> = None;
    while all.len() < limit {
        let mut pairs = terms.clone();
        pairs.push(("limit", (limit - all.len()).min(1000).to_string()));
        if let Some(n) = &next {
            pairs.push((cursor, n.clone()));
        }
        let page = target
            .json(Method::GET, &format!("{path}?{}", encode(&pairs)))
            .await?;
        all.extend(page["messages"].as_array().cloned().unwrap_or_default());
        match page["next"].as_str() {
            Some(n) => next = Some(n.to_owned()),
            None => break,
        }
    }
    Ok(all)
}

/// What `spoold history list` selects.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct HistoryArgs {
    #[command(flatten)]
    pub search: SearchArgs,
    /// Delivered at or after: RFC 3339 or a duration ago (2h).
    #[arg(long)]
    pub since: Option<String>,
    /// Delivered before: RFC 3339 or a duration ago.
    #[arg(long)]
    pub until: Option<String>,
}

/// `spoold history list QUEUE`: delivered messages, newest first (every
/// page, up to `limit`).
pub async fn history_list(
    target: &Target,
    queue: &str,
    args: &HistoryArgs,
    limit: Option<usize>,
    json: bool,
    out: &mut impl Write,
) -> Result<(), OpsError> {
    let now = now_ms();
    let mut terms: Vec<(&str, String)> = Vec::new();
    for (name, value) in [("since", &args.since), ("until", &args.until)] {
        if let Some(text) = value {
            terms.push((name, format_rfc3339(point_in_time(name, text, now)?)));
        }
    }
    terms.extend(args.search.pairs());
    let path = format!("/v1/queues/{queue}/history");
    let all = every_page(target, &path, terms, "before", limit).await?;
    if json {
        return json_lines(out, &all);
    }
    let rows: Vec<Vec<String>> = all
        .iter()
        .map(|m| {
            vec![
                num(&m["id"]),
                num(&m["deliveredAt"]),
                m.get("eventType").map_or_else(|| "-".into(), num),
                m.get("tenant").map_or_else(|| "-".into(), num),
                m["attempts"].as_array().map_or(0, Vec::len).to_string(),
                m.get("resentFrom").map_or_else(|| "-".into(), num),
            ]
        })
        .collect();
    let header = [
        "ID",
        "DELIVERED_AT",
        "TYPE",
        "TENANT",
        "ATTEMPTS",
        "RESENT_FROM",
    ];
    write!(out, "{}", table(&header, &rows))?;
    Ok(())
}

/// `spoold history show QUEUE ID`: one delivered message with every
/// attempt and what the destination answered.
pub async fn history_show(
    target: &Target,
    queue: &str,
    id: &str,
    json: bool,
    out: &mut impl Write,
) -> Result<(), OpsError> {
    let path = format!(
        "/v1/queues/{queue}/history/{}",
        url::form_urlencoded::byte_serialize(id.as_bytes()).collect::<String>()
    );
    let m = target.json(Method::GET, &path).await?;
    if json {
        return json_lines(out, &[m]);
    }
    let field = |name: &str| m.get(name).map_or_else(|| "-".into(), num);
    writeln!(out, "id           {}", field("id"))?;
    writeln!(out, "queue        {}", field("queue"))?;
    writeln!(
        out,
        "event        {} {}",
        field("eventType"),
        field("eventId")
    )?;
    writeln!(out, "tenant       {}", field("tenant"))?;
    writeln!(out, "delivered at {}", field("deliveredAt"))?;
    writeln!(out, "enqueued at  {}", field("enqueuedAt"))?;
    writeln!(out, "retries      {}", field("retryCount"))?;
    writeln!(out, "resent from  {}", field("resentFrom"))?;
    attempts_and_body(&m, out)
}

/// `spoold history resend QUEUE ID`: sends a delivered message again;
/// prints the new message's id.
pub async fn history_resend(
    target: &Target,
    queue: &str,
    id: &str,
    out: &mut impl Write,
) -> Result<(), OpsError> {
    let path = format!(
        "/v1/queues/{queue}/history/{}/resend",
        url::form_urlencoded::byte_serialize(id.as_bytes()).collect::<String>()
    );
    let answer = target.json(Method::POST, &path).await?;
    writeln!(out, "{}", num(&answer["id"]))?;
    Ok(())
}

/// `spoold dlq redrive QUEUE`: moves the dead letters the filter selects
/// back (at most `max`), or with `dry_run` says how many would move; says
/// how many more match when `max` stopped it.
pub async fn dlq_redrive(
    target: &Target,
    queue: &str,
    filter: &DeadLetterArgs,
    max: Option<u64>,
    dry_run: bool,
    json: bool,
    out: &mut impl Write,
) -> Result<(), OpsError> {
    let base = origin_queue_name(queue);
    let mut pairs = filter.query(now_ms())?;
    pairs.push(("dryRun", dry_run.to_string()));
    if let Some(max) = max {
        pairs.push(("max", max.to_string()));
    }
    let answer = target
        .json(
            Method::POST,
            &format!("/v1/queues/{base}/redrive?{}", encode(&pairs)),
        )
        .await?;
    if json {
        return json_lines(out, &[answer]);
    }
    let verb = if dry_run { "would move" } else { "moved" };
    writeln!(
        out,
        "{verb} {} of {} dead letter(s){} from {} back to {base}{}",
        num(&answer["moved"]),
        num(&answer["matched"]),
        filter.describe(),
        failed_queue_name(base),
        more_remain(&answer, "--max")
    )?;
    Ok(())
}

/// "; N more match …" when a limit left some, else nothing.
fn more_remain(answer: &Value, limit_flag: &str) -> String {
    match answer["remaining"].as_u64() {
        Some(n) if n > 0 => {
            format!("; {n} more match (leased, or beyond {limit_flag}): run again to continue")
        }
        _ => String::new(),
    }
}

/// `spoold dlq purge QUEUE`: deletes the dead letters the filter selects
/// (all by default), after showing how many and asking on `input`, unless
/// `yes`.
#[allow(clippy::too_many_arguments)]
pub async fn dlq_purge(
    target: &Target,
    queue: &str,
    filter: &DeadLetterArgs,
    bulk: Bulk,
    json: bool,
    input: &mut impl BufRead,
    prompt: &mut impl Write,
    out: &mut impl Write,
) -> Result<(), OpsError> {
    let base = origin_queue_name(queue);
    let failed = failed_queue_name(base);
    let mut pairs = filter.query(now_ms())?;
    if let Some(max) = bulk.max {
        pairs.push(("max", max.to_string()));
    }
    let path = |dry_run: bool| {
        let mut p = pairs.clone();
        p.push(("dryRun", dry_run.to_string()));
        format!("/v1/queues/{failed}/messages?{}", encode(&p))
    };
    if bulk.dry_run {
        let answer = target.json(Method::DELETE, &path(true)).await?;
        if json {
            return json_lines(out, &[answer]);
        }
        writeln!(
            out,
            "would purge {} of {} dead letter(s){} from {failed}{}",
            num(&answer["purged"]),
            num(&answer["matched"]),
            filter.describe(),
            more_remain(&answer, "--max")
        )?;
        return Ok(());
    }
    if !bulk.yes {
        let count = target.json(Method::DELETE, &path(true)).await?;
        write!(
            prompt,
            "Delete {} dead letter(s) of {failed}{}? Type the queue name ({base}) to confirm: ",
            num(&count["purged"]),
            filter.describe()
        )?;
        prompt.flush()?;
        let mut answer = String::new();
        input.read_line(&mut answer)?;
        if answer.trim() != base && answer.trim() != failed {
            return Err(OpsError::Declined(
                "not confirmed; nothing was purged".into(),
            ));
        }
    }
    let answer = target.json(Method::DELETE, &path(false)).await?;
    if json {
        return json_lines(out, &[answer]);
    }
    writeln!(
        out,
        "purged {} dead letter(s){} from {failed}{}",
        num(&answer["purged"]),
        filter.describe(),
        more_remain(&answer, "--max")
    )?;
    Ok(())
}

/// How much a bulk command may do.
#[derive(Debug, Clone, Copy, Default)]
pub struct Bulk {
    /// At most this many (oldest first).
    pub max: Option<u64>,
    /// Only count; change nothing.
    pub dry_run: bool,
    /// Do not ask first.
    pub yes: bool,
}

/// `spoold stats QUEUE`: one queue's stats and settings, a line each (or
/// the JSON of `GET /v1/queues/{q}`).
pub async fn queue_stats(
    target: &Target,
    queue: &str,
    json: bool,
    out: &mut impl Write,
) -> Result<(), OpsError> {
    let q = target
        .json(Method::GET, &format!("/v1/queues/{queue}"))
        .await?;
    if json {
        return json_lines(out, &[q]);
    }
    print_queue(&q, out)
}

/// A queue as `key  value` lines: its state first, then its counters and
/// settings.
fn print_queue(q: &Value, out: &mut impl Write) -> Result<(), OpsError> {
    let st = &q["stats"];
    let settings = &q["settings"];
    let push = settings["destination"].is_string();
    let state = if st["breakerOpen"].as_bool() == Some(true) {
        format!("breaker open (next probe {})", num(&st["nextProbeAt"]))
    } else if st["paused"].as_bool() == Some(true) {
        "paused by an operator".to_string()
    } else {
        "running".to_string()
    };
    writeln!(out, "queue                {}", num(&q["name"]))?;
    writeln!(
        out,
        "type                 {}",
        if push { "push" } else { "pull" }
    )?;
    writeln!(out, "state                {state}")?;
    for warning in q["warnings"].as_array().into_iter().flatten() {
        writeln!(out, "warning              {}", num(warning))?;
    }
    if let Some(stats) = st.as_object() {
        for (key, value) in stats {
            if !matches!(key.as_str(), "paused" | "breakerOpen" | "nextProbeAt") {
                writeln!(out, "{:<20} {}", key, num(value))?;
            }
        }
    }
    let mut flat = Vec::new();
    flatten("", settings, &mut flat);
    for (key, value) in flat {
        writeln!(out, "{key:<20} {value}")?;
    }
    Ok(())
}

/// `a.b = value` pairs of a JSON object, nested objects by dotted keys.
fn flatten(prefix: &str, v: &Value, out: &mut Vec<(String, String)>) {
    match v {
        Value::Object(fields) => {
            for (key, value) in fields {
                let key = if prefix.is_empty() {
                    key.clone()
                } else {
                    format!("{prefix}.{key}")
                };
                flatten(&key, value, out);
            }
        }
        Value::Array(items) => out.push((
            prefix.to_string(),
            items.iter().map(num).collect::<Vec<_>>().join(","),
        )),
        Value::Null => out.push((prefix.to_string(), "-".into())),
        other => out.push((prefix.to_string(), num(other))),
    }
}

/// The merge patch that `key=value` arguments mean: dotted keys nest
/// (`backoff.maxSeconds=60`, `headers.X-Token=t`), snake_case keys are
/// taken as the config file spells them (`breaker_failures`), `null`
/// resets, and a value is JSON when it parses as a number, a boolean or
/// a list (`permanentFailureStatuses=[400,410]`), else a string. Header
/// values and the signing secret are always strings.
pub fn settings_patch(pairs: &[String]) -> Result<Value, OpsError> {
    let mut patch = serde_json::Map::new();
    for pair in pairs {
        let Some((key, value)) = pair.split_once('=') else {
            return Err(OpsError::Usage(format!(
                "{pair:?} is not key=value (e.g. breakerFailures=1000)"
            )));
        };
        let path: Vec<String> = match key.split_once('.') {
            Some(("headers", name)) => vec!["headers".into(), name.to_string()],
            _ => key.split('.').map(camel_case).collect(),
        };
        if path.iter().any(String::is_empty) {
            return Err(OpsError::Usage(format!("{key:?} is not a setting")));
        }
        let textual = path[0] == "headers" || path[0] == "signingSecret";
        let value = match value {
            "null" => Value::Null,
            v if textual => Value::String(v.to_string()),
            v => match serde_json::from_str::<Value>(v) {
                Ok(parsed @ (Value::Number(_) | Value::Bool(_) | Value::Array(_))) => parsed,
                _ => Value::String(v.to_string()),
            },
        };
        let mut at = &mut patch;
        for step in &path[..path.len() - 1] {
            let next = at
                .entry(step.clone())
                .or_insert_with(|| Value::Object(Default::default()));
            at = next
                .as_object_mut()
                .ok_or_else(|| OpsError::Usage(format!("{key:?} sets a value twice")))?;
        }
        at.insert(path[path.len() - 1].clone(), value);
    }
    Ok(Value::Object(patch))
}

/// `breaker_failures` → `breakerFailures`; camelCase stays.
fn camel_case(key: &str) -> String {
    let mut out = String::new();
    let mut upper = false;
    for c in key.chars() {
        match c {
            '_' => upper = true,
            c if upper => {
                out.extend(c.to_uppercase());
                upper = false;
            }
            c => out.push(c),
        }
    }
    out
}

/// `spoold queue set QUEUE key=value…`: changes only those settings (a
/// merge patch) and prints the queue as it is now.
pub async fn queue_set(
    target: &Target,
    queue: &str,
    pairs: &[String],
    json: bool,
    out: &mut impl Write,
) -> Result<(), OpsError> {
    let patch = settings_patch(pairs)?;
    let request = target
        .request(Method::PATCH, &format!("/v1/queues/{queue}"))
        .header("Content-Type", "application/merge-patch+json")
        .body(patch.to_string());
    let q = target.json_of(request).await?;
    if json {
        return json_lines(out, &[q]);
    }
    print_queue(&q, out)
}

/// What `spoold queue` can ask of a queue beyond its settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QueueAction {
    Pause,
    Resume,
    /// Send the open breaker's probe now.
    Probe,
    /// Close the breaker without a probe.
    CloseBreaker,
}

/// `spoold queue pause|resume|probe|close-breaker QUEUE`.
pub async fn queue_action(
    target: &Target,
    queue: &str,
    action: QueueAction,
    out: &mut impl Write,
) -> Result<(), OpsError> {
    let (path, said) = match action {
        QueueAction::Pause => ("pause", "paused"),
        QueueAction::Resume => ("resume", "resumed (an open breaker is closed too)"),
        QueueAction::Probe => ("breaker/probe", "probing now"),
        QueueAction::CloseBreaker => ("breaker/close", "breaker closed"),
    };
    target
        .send(target.request(Method::POST, &format!("/v1/queues/{queue}/{path}")))
        .await?;
    let q = target
        .json(Method::GET, &format!("/v1/queues/{queue}"))
        .await?;
    let open = q["stats"]["breakerOpen"].as_bool() == Some(true);
    let said = if action == QueueAction::Probe && !open {
        "the breaker is closed: nothing to probe"
    } else {
        said
    };
    writeln!(out, "{queue}: {said}")?;
    Ok(())
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

    #[test]
    fn key_value_pairs_become_a_merge_patch() {
        let pairs: Vec<String> = [
            "breaker_failures=1000",
            "backoff.maxSeconds=60",
            "destination=https://h.example.com/x",
            "headers.X-Token=123",
            "rateLimit=null",
            "permanentFailureStatuses=[400,410]",
        ]
        .map(String::from)
        .to_vec();
        let patch = settings_patch(&pairs).unwrap();
        assert_eq!(
            patch,
            serde_json::json!({
                "breakerFailures": 1000,
                "backoff": {"maxSeconds": 60},
                "destination": "https://h.example.com/x",
                "headers": {"X-Token": "123"},
                "rateLimit": null,
                "permanentFailureStatuses": [400, 410],
            })
        );
        assert!(settings_patch(&["nothing".to_string()]).is_err());
    }
}
