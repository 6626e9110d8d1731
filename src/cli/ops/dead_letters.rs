//! `spoold dlq list|show|redrive|purge QUEUE`: the dead letters in a
//! queue's failure queue, selected by the filters of `filters.rs`. Each
//! accepts the queue's name or its failure queue's (`hooks` or
//! `hooks.failed`); a purge asks first, showing how many it would delete.

use std::io::{BufRead, Write};

use reqwest::Method;
use serde::Deserialize;
use serde_json::Value;

use super::client::{OpsError, Target, encode, path_segment};
use super::filters::{DeadLetterArgs, SearchArgs};
use super::message::{ERROR_SHOWN_CHARS, Message, every_page, shortened};
use super::{json_lines, now_ms, or_dash, table};
use crate::cli::term::Terminal;
use crate::spool::queue::{failed_queue_name, origin_queue_name};

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

/// What a redrive did (with `dryRun`, would do).
#[derive(Deserialize)]
struct Redrive {
    moved: u64,
    /// Dead letters the filter selected.
    matched: u64,
    /// Still matching afterwards: leased, or beyond `max`.
    remaining: u64,
}

/// What a purge did (with `dryRun`, would do).
#[derive(Deserialize)]
struct Purge {
    purged: u64,
    matched: u64,
    remaining: u64,
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
    out: &mut Terminal<impl Write>,
) -> Result<(), OpsError> {
    let failed = failed_queue_name(origin_queue_name(queue));
    let mut terms = filter.query(now_ms())?;
    terms.extend(search.pairs());
    let path = format!("/v1/queues/{failed}/messages");
    if json {
        let all: Vec<Value> = every_page(target, &path, terms, "after", limit).await?;
        return json_lines(out, &all);
    }
    let all: Vec<Message> = every_page(target, &path, terms, "after", limit).await?;
    let rows: Vec<Vec<String>> = all
        .iter()
        .map(|m| {
            vec![
                m.id.clone(),
                or_dash(m.reason.as_deref()),
                or_dash(m.last_status),
                m.attempts.len().to_string(),
                or_dash(m.failed_at.as_deref()),
                or_dash(
                    m.last_error
                        .as_deref()
                        .map(|e| shortened(e, ERROR_SHOWN_CHARS)),
                ),
            ]
        })
        .collect();
    let header = [
        "ID",
        "REASON",
        "LAST_STATUS",
        "ATTEMPTS",
        "FAILED_AT",
        "LAST_ERROR",
    ];
    table::write(out, &header, &rows)
}

/// `spoold dlq show QUEUE ID`: one dead letter with every attempt, what the
/// destination answered, and the stored request.
pub async fn dlq_show(
    target: &Target,
    queue: &str,
    id: &str,
    json: bool,
    out: &mut Terminal<impl Write>,
) -> Result<(), OpsError> {
    let failed = failed_queue_name(origin_queue_name(queue));
    let path = format!("/v1/queues/{failed}/messages/{}", path_segment(id));
    let answer: Value = target.call(Method::GET, &path).await?;
    if json {
        return json_lines(out, &[answer]);
    }
    let m: Message = target.decode(answer)?;
    writeln!(out, "id           {}", m.id)?;
    writeln!(
        out,
        "queue        {} (from {})",
        m.queue,
        or_dash(m.origin_queue.as_deref())
    )?;
    writeln!(out, "reason       {}", or_dash(m.reason.as_deref()))?;
    writeln!(out, "last status  {}", or_dash(m.last_status))?;
    writeln!(out, "last error   {}", or_dash(m.last_error.as_deref()))?;
    writeln!(out, "failed at    {}", or_dash(m.failed_at.as_deref()))?;
    writeln!(out, "enqueued at  {}", m.enqueued_at)?;
    writeln!(out, "retries      {}", m.retry_count)?;
    if let Some(request) = &m.request {
        writeln!(out, "request      {} {}", request.method, request.path)?;
        for (name, value) in &request.headers {
            writeln!(out, "  {name}: {value}")?;
        }
    }
    m.write_attempts_and_body(out)
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
    out: &mut Terminal<impl Write>,
) -> Result<(), OpsError> {
    let base = origin_queue_name(queue);
    let mut pairs = filter.query(now_ms())?;
    pairs.push(("dryRun", dry_run.to_string()));
    if let Some(max) = max {
        pairs.push(("max", max.to_string()));
    }
    let path = format!("/v1/queues/{base}/redrive?{}", encode(&pairs));
    let answer: Value = target.call(Method::POST, &path).await?;
    if json {
        return json_lines(out, &[answer]);
    }
    let done: Redrive = target.decode(answer)?;
    let verb = if dry_run { "would move" } else { "moved" };
    writeln!(
        out,
        "{verb} {} of {} dead letter(s){} from {} back to {base}{}",
        done.moved,
        done.matched,
        filter.describe(),
        failed_queue_name(base),
        more_remain(done.remaining)
    )?;
    Ok(())
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
    out: &mut Terminal<impl Write>,
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
        let answer: Value = target.call(Method::DELETE, &path(true)).await?;
        if json {
            return json_lines(out, &[answer]);
        }
        let would: Purge = target.decode(answer)?;
        writeln!(
            out,
            "would purge {} of {} dead letter(s){} from {failed}{}",
            would.purged,
            would.matched,
            filter.describe(),
            more_remain(would.remaining)
        )?;
        return Ok(());
    }
    if !bulk.yes {
        let count: Purge = target.call(Method::DELETE, &path(true)).await?;
        let question = format!(
            "Delete {} dead letter(s) of {failed}{}? Type the queue name ({base}) to confirm: ",
            count.purged,
            filter.describe()
        );
        confirm(&question, &[base, failed.as_str()], input, prompt)?;
    }
    let answer: Value = target.call(Method::DELETE, &path(false)).await?;
    if json {
        return json_lines(out, &[answer]);
    }
    let done: Purge = target.decode(answer)?;
    writeln!(
        out,
        "purged {} dead letter(s){} from {failed}{}",
        done.purged,
        filter.describe(),
        more_remain(done.remaining)
    )?;
    Ok(())
}

/// Asks `question` on `prompt`; goes on only if the answer read from
/// `input` is one of `names`.
fn confirm(
    question: &str,
    names: &[&str],
    input: &mut impl BufRead,
    prompt: &mut impl Write,
) -> Result<(), OpsError> {
    write!(prompt, "{question}")?;
    prompt.flush()?;
    let mut answer = String::new();
    input.read_line(&mut answer)?;
    if names.contains(&answer.trim()) {
        Ok(())
    } else {
        Err(OpsError::Declined(
            "not confirmed; nothing was purged".into(),
        ))
    }
}

/// "; N more match …" when a limit (or a lease) left some, else nothing.
fn more_remain(remaining: u64) -> String {
    if remaining == 0 {
        return String::new();
    }
    format!("; {remaining} more match (leased, or beyond --max): run again to continue")
}
