//! `spoold queues` (or `stats`), `spoold stats QUEUE` and
//! `spoold queue pause|resume|probe|close-breaker QUEUE`: queues as the API
//! shows them (`src/api/queues.rs`), and the operator's switches on one.
//! The queue as `stats QUEUE` prints it is shared with `queue set`.

use std::io::Write;

use reqwest::Method;
use serde::Deserialize;
use serde_json::{Map, Value};

use super::client::{OpsError, Target, encode};
use super::{json_lines, or_dash, table};
use crate::cli::term::Terminal;

/// `GET /v1/queues`: `T` is [`Queue`] for the table, `Value` for `--json`.
#[derive(Deserialize)]
struct QueueList<T> {
    queues: Vec<T>,
    /// More follow: the next page's `after`.
    #[serde(default)]
    next: Option<String>,
}

/// What `spoold queues` lists (`GET /v1/queues`'s filters).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct QueueFilter {
    /// Only queues whose name starts with this.
    #[arg(long)]
    pub prefix: Option<String>,
    /// Only the push queues of this tenant.
    #[arg(long)]
    pub tenant: Option<String>,
    /// Only queues whose events patterns take this event type.
    #[arg(long, value_name = "TYPE")]
    pub events: Option<String>,
    /// At most this many queues.
    #[arg(long)]
    pub limit: Option<usize>,
}

/// Queues a page asks for: the list is read a page at a time, so that a
/// server with many queues never answers in one piece.
const PAGE: usize = 500;

/// Every queue `filter` selects, a page at a time.
async fn list<T: serde::de::DeserializeOwned>(
    target: &Target,
    filter: &QueueFilter,
) -> Result<Vec<T>, OpsError> {
    let mut all = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let want = filter
            .limit
            .map_or(PAGE, |l| l.saturating_sub(all.len()).min(PAGE));
        if want == 0 {
            return Ok(all);
        }
        let mut pairs = vec![("limit", want.to_string())];
        let terms = [
            ("prefix", &filter.prefix),
            ("tenant", &filter.tenant),
            ("events", &filter.events),
            ("after", &after),
        ];
        pairs.extend(terms.into_iter().filter_map(|(k, v)| Some((k, v.clone()?))));
        let page: QueueList<T> = target
            .call(Method::GET, &format!("/v1/queues?{}", encode(&pairs)))
            .await?;
        all.extend(page.queues);
        match page.next {
            Some(next) => after = Some(next),
            None => return Ok(all),
        }
    }
}

/// A queue: its settings and its stats.
#[derive(Deserialize)]
struct Queue {
    name: String,
    /// What the change that answered with this queue dropped.
    #[serde(default)]
    warnings: Vec<String>,
    settings: Settings,
    stats: Stats,
}

/// A queue's settings as the API spells them. Kept as the map they are:
/// `stats QUEUE` lists every one (nested ones by dotted keys) without this
/// file naming each, and those are the names `queue set` takes back.
#[derive(Deserialize)]
#[serde(transparent)]
struct Settings(Map<String, Value>);

/// A queue's stats (docs/contract.md §4).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Stats {
    visible: u64,
    leased: u64,
    delayed: u64,
    /// Absent from servers before ordering keys.
    #[serde(default)]
    held: u64,
    sent_total: u64,
    acked_total: u64,
    nacked_total: u64,
    expired_total: u64,
    failed_total: u64,
    deduplicated_total: u64,
    oldest_visible_age_seconds: f64,
    retrying: u64,
    oldest_retrying_age_seconds: f64,
    paused: bool,
    breaker_open: bool,
    next_probe_at: Option<String>,
    /// Push queues only.
    deliveries_total: Option<u64>,
    /// Push queues only.
    delivery_failures_total: Option<u64>,
}

/// `spoold queues`: the queues `filter` selects with their stats, as a
/// table (or JSON lines).
pub async fn queues(
    target: &Target,
    filter: &QueueFilter,
    json: bool,
    out: &mut Terminal<impl Write>,
) -> Result<(), OpsError> {
    if json {
        let queues: Vec<Value> = list(target, filter).await?;
        return json_lines(out, &queues);
    }
    let queues: Vec<Queue> = list(target, filter).await?;
    let rows: Vec<Vec<String>> = queues.iter().map(Queue::row).collect();
    let header = [
        "QUEUE", "TYPE", "VISIBLE", "LEASED", "DELAYED", "OLDEST", "PAUSED",
    ];
    table::write(out, &header, &rows)
}

/// `spoold stats QUEUE`: one queue's stats and settings, a line each (or
/// the JSON of `GET /v1/queues/{q}`).
pub async fn queue_stats(
    target: &Target,
    queue: &str,
    json: bool,
    out: &mut Terminal<impl Write>,
) -> Result<(), OpsError> {
    let answer: Value = target
        .call(Method::GET, &format!("/v1/queues/{queue}"))
        .await?;
    show(target, answer, json, out)
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
    out: &mut Terminal<impl Write>,
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
    let now: Queue = target
        .call(Method::GET, &format!("/v1/queues/{queue}"))
        .await?;
    let said = if action == QueueAction::Probe && !now.stats.breaker_open {
        "the breaker is closed: nothing to probe"
    } else {
        said
    };
    writeln!(out, "{queue}: {said}")?;
    Ok(())
}

/// A queue answer (of `GET` or `PATCH /v1/queues/{q}`) as `key  value`
/// lines, or with `json` as one line of JSON.
pub(super) fn show(
    target: &Target,
    answer: Value,
    json: bool,
    out: &mut impl Write,
) -> Result<(), OpsError> {
    if json {
        return json_lines(out, &[answer]);
    }
    let queue: Queue = target.decode(answer)?;
    queue.write_lines(out)
}

impl Queue {
    /// The queue as a row of `spoold queues`.
    fn row(&self) -> Vec<String> {
        let st = &self.stats;
        vec![
            self.name.clone(),
            self.settings.kind().to_owned(),
            st.visible.to_string(),
            st.leased.to_string(),
            st.delayed.to_string(),
            format!("{:.0}s", st.oldest_visible_age_seconds),
            st.paused.to_string(),
        ]
    }

    /// The queue as `key  value` lines: its state first, then its
    /// counters and settings.
    fn write_lines(&self, out: &mut impl Write) -> Result<(), OpsError> {
        writeln!(out, "queue                {}", self.name)?;
        writeln!(out, "type                 {}", self.settings.kind())?;
        writeln!(out, "state                {}", self.stats.state())?;
        for warning in &self.warnings {
            writeln!(out, "warning              {warning}")?;
        }
        for (key, value) in self.stats.counters() {
            writeln!(out, "{key:<20} {value}")?;
        }
        for (key, value) in self.settings.lines() {
            writeln!(out, "{key:<20} {value}")?;
        }
        Ok(())
    }
}

impl Stats {
    /// Held by its breaker, paused by an operator, or running.
    fn state(&self) -> String {
        if self.breaker_open {
            format!(
                "breaker open (next probe {})",
                or_dash(self.next_probe_at.as_deref())
            )
        } else if self.paused {
            "paused by an operator".to_owned()
        } else {
            "running".to_owned()
        }
    }

    /// The counters, named as the API names them and in the order of
    /// their names; the delivery counts only for a push queue.
    fn counters(&self) -> Vec<(&'static str, String)> {
        let mut lines = vec![
            ("ackedTotal", self.acked_total.to_string()),
            ("deduplicatedTotal", self.deduplicated_total.to_string()),
            ("delayed", self.delayed.to_string()),
        ];
        if let Some(n) = self.deliveries_total {
            lines.push(("deliveriesTotal", n.to_string()));
        }
        if let Some(n) = self.delivery_failures_total {
            lines.push(("deliveryFailuresTotal", n.to_string()));
        }
        lines.extend([
            ("expiredTotal", self.expired_total.to_string()),
            ("failedTotal", self.failed_total.to_string()),
            ("held", self.held.to_string()),
            ("leased", self.leased.to_string()),
            ("nackedTotal", self.nacked_total.to_string()),
            (
                "oldestRetryingAgeSeconds",
                json_number(self.oldest_retrying_age_seconds),
            ),
            (
                "oldestVisibleAgeSeconds",
                json_number(self.oldest_visible_age_seconds),
            ),
            ("retrying", self.retrying.to_string()),
            ("sentTotal", self.sent_total.to_string()),
            ("visible", self.visible.to_string()),
        ]);
        lines
    }
}

impl Settings {
    /// A push queue has a destination; a pull queue has none.
    /// `push` (`push, unsigned` without a signing secret: its deliveries
    /// carry no signature) or `pull`.
    fn kind(&self) -> &'static str {
        match (self.0.get("destination"), self.0.get("signingSecretSet")) {
            (Some(Value::String(_)), Some(Value::Bool(true))) => "push",
            (Some(Value::String(_)), _) => "push, unsigned",
            _ => "pull",
        }
    }

    /// Every setting as `key value`: nested objects by dotted keys, lists
    /// comma-separated, unset ones as `-`.
    fn lines(&self) -> Vec<(String, String)> {
        let mut lines = Vec::new();
        for (key, value) in &self.0 {
            flatten(key, value, &mut lines);
        }
        lines
    }
}

/// `key = value` pairs of a JSON value, nested objects by dotted keys.
fn flatten(key: &str, value: &Value, out: &mut Vec<(String, String)>) {
    // A content filter reads best as the JSON it was written as.
    if key == "filter" {
        out.push((key.to_owned(), value.to_string()));
        return;
    }
    match value {
        Value::Object(fields) => {
            for (name, inner) in fields {
                flatten(&format!("{key}.{name}"), inner, out);
            }
        }
        Value::Array(items) => out.push((
            key.to_owned(),
            items.iter().map(scalar).collect::<Vec<_>>().join(","),
        )),
        other => out.push((key.to_owned(), scalar(other))),
    }
}

/// A JSON value as one word: a string without its quotes, `-` for null
/// and for what is not one word.
fn scalar(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        Value::Bool(b) => b.to_string(),
        Value::Null | Value::Array(_) | Value::Object(_) => "-".to_owned(),
    }
}

/// A number as JSON writes it (`0.0`, `1.5`), so that a figure reads as
/// the API sent it.
fn json_number(x: f64) -> String {
    serde_json::Number::from_f64(x).map_or_else(|| "-".to_owned(), |n| n.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(key: &str, value: &str) -> String {
        format!("{key:<20} {value}\n")
    }

    #[test]
    fn stats_of_one_queue_list_state_counters_and_settings() {
        let queue: Queue = serde_json::from_value(serde_json::json!({
            "name": "hooks",
            "warnings": ["signingSecret dropped"],
            "managedByConfig": false,
            "settings": {
                "destination": "http://h/in",
                "backoff": {"maxSeconds": 60.0, "jitter": 0.2},
                "events": ["a.*", "b.>"],
                "filter": {"payload": {"amount": [{"numeric": [">", 0]}]}},
                "headers": {},
                "rateLimit": null,
                "signingSecretSet": true,
            },
            "stats": {
                "ackedTotal": 1, "deduplicatedTotal": 2, "delayed": 3,
                "deliveriesTotal": 4, "deliveryFailuresTotal": 5,
                "expiredTotal": 6, "failedTotal": 7, "leased": 8,
                "nackedTotal": 9, "oldestRetryingAgeSeconds": 0.0,
                "oldestVisibleAgeSeconds": 1.25, "retrying": 10,
                "sentTotal": 11, "visible": 12, "held": 13, "paused": true,
                "breakerOpen": false,
            },
        }))
        .unwrap();
        assert_eq!(
            queue.row(),
            ["hooks", "push", "12", "8", "3", "1s", "true"].map(String::from)
        );
        let mut shown: Vec<u8> = Vec::new();
        queue.write_lines(&mut shown).unwrap();
        let want: String = [
            ("queue", "hooks"),
            ("type", "push"),
            ("state", "paused by an operator"),
            ("warning", "signingSecret dropped"),
            ("ackedTotal", "1"),
            ("deduplicatedTotal", "2"),
            ("delayed", "3"),
            ("deliveriesTotal", "4"),
            ("deliveryFailuresTotal", "5"),
            ("expiredTotal", "6"),
            ("failedTotal", "7"),
            ("held", "13"),
            ("leased", "8"),
            ("nackedTotal", "9"),
            ("oldestRetryingAgeSeconds", "0.0"),
            ("oldestVisibleAgeSeconds", "1.25"),
            ("retrying", "10"),
            ("sentTotal", "11"),
            ("visible", "12"),
            ("backoff.jitter", "0.2"),
            ("backoff.maxSeconds", "60.0"),
            ("destination", "http://h/in"),
            ("events", "a.*,b.>"),
            ("filter", r#"{"payload":{"amount":[{"numeric":[">",0]}]}}"#),
            ("rateLimit", "-"),
            ("signingSecretSet", "true"),
        ]
        .iter()
        .map(|(k, v)| line(k, v))
        .collect();
        assert_eq!(String::from_utf8(shown).unwrap(), want);
    }
}
