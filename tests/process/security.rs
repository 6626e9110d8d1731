//! Security review, as tests: keys stay out of logs and error bodies,
//! request smuggling and header injection are refused, header limits hold.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::Duration;

use crate::common::process::{BIN, Spoold, start_command, write_config};
const KEY: &str = "sekrit-key-4711-do-not-log";
const WRONG: &str = "wrong-key-0815-do-not-log";

/// Starts the binary with trace logs, an API key and a queue `q`.
async fn start(dir: &std::path::Path) -> Spoold {
    let config = write_config(
        dir,
        &format!("api_keys = [\"{KEY}\"]"),
        "segment_bytes = \"1MiB\"",
        "[queues.q]\n",
    );
    start_command(
        Command::new(BIN)
            .args(["run", "--config"])
            .arg(&config)
            .env("SPOOLD_LOG", "trace"),
    )
    .await
}

/// Sends raw bytes and returns the whole answer (the server closes).
fn raw(addr: &str, request: &[u8]) -> String {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(15)))
        .unwrap();
    stream.write_all(request).unwrap();
    let mut out = Vec::new();
    let _ = stream.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

fn status(answer: &str) -> u16 {
    answer
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

fn visible(addr: &str) -> u64 {
    let answer = raw(
        addr,
        format!("GET /v1/queues/q HTTP/1.1\r\nHost: x\r\nSpooler-Api-Key: {KEY}\r\nConnection: close\r\n\r\n").as_bytes(),
    );
    let body = answer.split("\r\n\r\n").nth(1).unwrap_or_default();
    let v: serde_json::Value = serde_json::from_str(body.trim()).unwrap_or_default();
    v["stats"]["visible"].as_u64().unwrap_or(u64::MAX)
}

#[tokio::test]
async fn keys_never_reach_logs_or_error_bodies_and_smuggling_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut spoold = start(dir.path()).await;
    let addr = spoold.base.trim_start_matches("http://").to_string();

    // Wrong key, in both header forms: 401, and the body does not echo it.
    for header in [
        format!("Authorization: Bearer {WRONG}"),
        format!("Spooler-Api-Key: {WRONG}"),
    ] {
        let answer = raw(
            &addr,
            format!("GET /v1/queues HTTP/1.1\r\nHost: x\r\n{header}\r\nConnection: close\r\n\r\n")
                .as_bytes(),
        );
        assert_eq!(status(&answer), 401, "{answer}");
        assert!(!answer.contains(WRONG), "{answer}");
    }
    let ok = raw(
        &addr,
        format!("POST /v1/queues/q/messages HTTP/1.1\r\nHost: x\r\nSpooler-Api-Key: {KEY}\r\nContent-Length: 2\r\nConnection: close\r\n\r\nhi").as_bytes(),
    );
    assert_eq!(status(&ok), 201, "{ok}");
    assert!(!ok.contains(KEY));
    let before = visible(&addr);

    // Two Content-Lengths that disagree: refused, nothing stored.
    let dup = raw(
        &addr,
        format!("POST /v1/queues/q/messages HTTP/1.1\r\nHost: x\r\nSpooler-Api-Key: {KEY}\r\nContent-Length: 2\r\nContent-Length: 40\r\n\r\nhi").as_bytes(),
    );
    assert_eq!(status(&dup), 400, "{dup}");
    // Transfer-Encoding and Content-Length together: hyper takes the chunked
    // body and never reads the smuggled second request as a request.
    let te = raw(
        &addr,
        format!(
            "POST /v1/queues/q/messages HTTP/1.1\r\nHost: x\r\nSpooler-Api-Key: {KEY}\r\nContent-Length: 4\r\n\
             Transfer-Encoding: chunked\r\n\r\n0\r\n\r\nPOST /v1/queues/q/messages HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nsmugl"
        )
        .as_bytes(),
    );
    let statuses: Vec<u16> = te
        .match_indices("HTTP/1.1 ")
        .map(|(i, _)| status(&te[i..]))
        .collect();
    // The smuggled request (which has no key) is never served as a request
    // of its own with a 201.
    let created = statuses.iter().filter(|s| **s == 201).count();
    assert!(created <= 1, "{te}");
    // A bare CR inside a header value (header injection): refused.
    let cr = raw(
        &addr,
        format!("POST /v1/forward/q/x HTTP/1.1\r\nHost: x\r\nSpooler-Api-Key: {KEY}\r\nX-Evil: a\rInjected: b\r\nContent-Length: 0\r\n\r\n").as_bytes(),
    );
    assert_eq!(status(&cr), 400, "{cr}");
    // Too many headers, or too large ones.
    let many: String = (0..150).map(|i| format!("X-H{i}: v\r\n")).collect();
    let too_many = raw(
        &addr,
        format!("GET /healthz HTTP/1.1\r\nHost: x\r\n{many}\r\n").as_bytes(),
    );
    assert!(matches!(status(&too_many), 400 | 431), "{too_many}");
    let huge = raw(
        &addr,
        format!(
            "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n",
            "a".repeat(100 << 10)
        )
        .as_bytes(),
    );
    assert!(
        matches!(status(&huge), 0 | 400 | 431),
        "{}",
        &huge[..huge.len().min(200)]
    );
    assert!(
        visible(&addr) <= before + 1,
        "at most the chunked body's message was stored"
    );

    spoold.stop();
    let logs = spoold.log();
    assert!(
        logs.contains("TRACE") || logs.contains("DEBUG") || logs.contains("INFO"),
        "logging ran"
    );
    assert!(!logs.contains(KEY), "the API key reached the logs");
    assert!(!logs.contains(WRONG), "a presented key reached the logs");
}
