//! `spoold history list|show|resend QUEUE`: delivered messages that a
//! queue keeps for its `historyRetentionSeconds` (`src/api/history.rs`),
//! newest first, with every attempt and what the destination answered;
//! and `spoold deliveries QUEUE`, the delivery log (`src/api/deliveries.rs`).

use std::io::Write;

use reqwest::Method;
use serde_json::Value;

use super::client::{OpsError, Target, path_segment};
use super::filters::HistoryArgs;
use super::message::{Message, Stored, every_page};
use super::{json_lines, now_ms, or_dash, table};
use crate::cli::term::Terminal;

/// `spoold history list QUEUE`: delivered messages, newest first (every
/// page, up to `limit`).
pub async fn history_list(
    target: &Target,
    queue: &str,
    args: &HistoryArgs,
    limit: Option<usize>,
    json: bool,
    out: &mut Terminal<impl Write>,
) -> Result<(), OpsError> {
    let terms = args.query(now_ms())?;
    let path = format!("/v1/queues/{queue}/history");
    if json {
        let all: Vec<Value> = every_page(target, &path, terms, "before", limit).await?;
        return json_lines(out, &all);
    }
    let all: Vec<Message> = every_page(target, &path, terms, "before", limit).await?;
    let rows: Vec<Vec<String>> = all
        .iter()
        .map(|m| {
            vec![
                m.id.clone(),
                or_dash(m.delivered_at.as_deref()),
                or_dash(m.event_type.as_deref()),
                or_dash(m.tenant.as_deref()),
                m.attempts.len().to_string(),
                or_dash(m.resent_from.as_deref()),
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
    table::write(out, &header, &rows)
}

/// `spoold deliveries QUEUE`: the delivery log, newest first (every page,
/// up to `limit`): pending, retrying, failed and delivered together.
pub async fn deliveries(
    target: &Target,
    queue: &str,
    args: &HistoryArgs,
    limit: Option<usize>,
    json: bool,
    out: &mut Terminal<impl Write>,
) -> Result<(), OpsError> {
    let terms = args.query(now_ms())?;
    let path = format!("/v1/queues/{queue}/deliveries");
    if json {
        let all: Vec<Value> = every_page(target, &path, terms, "before", limit).await?;
        return json_lines(out, &all);
    }
    let all: Vec<Message> = every_page(target, &path, terms, "before", limit).await?;
    let rows: Vec<Vec<String>> = all
        .iter()
        .map(|m| {
            vec![
                m.id.clone(),
                m.state.clone(),
                m.enqueued_at.clone(),
                or_dash(m.event_type.as_deref()),
                m.attempts.len().to_string(),
                or_dash(m.last_status),
                or_dash(m.reason.as_deref()),
            ]
        })
        .collect();
    let header = [
        "ID",
        "STATE",
        "SENT_AT",
        "TYPE",
        "ATTEMPTS",
        "LAST_STATUS",
        "REASON",
    ];
    table::write(out, &header, &rows)
}

/// `spoold history show QUEUE ID`: one delivered message with every
/// attempt and what the destination answered.
pub async fn history_show(
    target: &Target,
    queue: &str,
    id: &str,
    json: bool,
    out: &mut Terminal<impl Write>,
) -> Result<(), OpsError> {
    let path = format!("/v1/queues/{queue}/history/{}", path_segment(id));
    let answer: Value = target.call(Method::GET, &path).await?;
    if json {
        return json_lines(out, &[answer]);
    }
    let m: Message = target.decode(answer)?;
    writeln!(out, "id           {}", m.id)?;
    writeln!(out, "queue        {}", m.queue)?;
    writeln!(
        out,
        "event        {} {}",
        or_dash(m.event_type.as_deref()),
        or_dash(m.event_id.as_deref())
    )?;
    writeln!(out, "tenant       {}", or_dash(m.tenant.as_deref()))?;
    writeln!(out, "delivered at {}", or_dash(m.delivered_at.as_deref()))?;
    writeln!(out, "enqueued at  {}", m.enqueued_at)?;
    writeln!(out, "retries      {}", m.retry_count)?;
    writeln!(out, "resent from  {}", or_dash(m.resent_from.as_deref()))?;
    m.write_attempts_and_body(out)
}

/// `spoold history resend QUEUE ID`: sends a delivered message again;
/// prints the new message's id.
pub async fn history_resend(
    target: &Target,
    queue: &str,
    id: &str,
    out: &mut Terminal<impl Write>,
) -> Result<(), OpsError> {
    let path = format!("/v1/queues/{queue}/history/{}/resend", path_segment(id));
    let stored: Stored = target.call(Method::POST, &path).await?;
    writeln!(out, "{}", stored.id)?;
    Ok(())
}
