//! `spoold tail QUEUE`: a queue's newest messages, then each new one as it
//! arrives (`GET /v1/queues/{q}/tail`, one JSON message a line), until
//! interrupted or the server stops.

use std::io::Write;

use futures_util::StreamExt;
use reqwest::Method;

use super::client::{OpsError, Target};
use super::message::Message;
use crate::cli::term::Terminal;

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
    out: &mut Terminal<impl Write>,
) -> Result<TailEnd, OpsError> {
    let response = target
        .send(target.request(Method::GET, &format!("/v1/queues/{queue}/tail?last={last}")))
        .await?;
    let mut stream = response.bytes_stream();
    let mut pending = Vec::new();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| target.broken_stream(e))?;
        pending.extend_from_slice(&chunk);
        while let Some(end) = pending.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = pending.drain(..=end).collect();
            let text = String::from_utf8_lossy(&line[..line.len() - 1]);
            print_line(&text, json, out)?;
        }
    }
    Ok(TailEnd::ServerStopped)
}

/// One line of the stream: as it came with `json`, else the message as
/// people read it (and a line that is no message as it came).
fn print_line(text: &str, json: bool, out: &mut impl Write) -> Result<(), OpsError> {
    let message = if json {
        None
    } else {
        serde_json::from_str::<Message>(text).ok()
    };
    match message {
        Some(m) => writeln!(out, "{}", m.line())?,
        None => writeln!(out, "{text}")?,
    }
    out.flush()?;
    Ok(())
}
