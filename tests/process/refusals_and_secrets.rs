//! Bad input refused at the door, and secrets kept out of answers and
//! requests: what an adversarial pass against the binary found (issue 15),
//! one test each: every one failed on the release before the engine owned
//! the rules (`SPOOLD_TEST_BIN=/path/to/spoold` runs them against another
//! build).

use crate::common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::common::process::{Spoold, bin, client, start_command, write_config};
use reqwest::{Client, StatusCode};
use serde_json::{Value, json};

async fn start(dir: &Path, server_keys: &str) -> Spoold {
    let config = write_config(dir, server_keys, "segment_bytes = \"1MiB\"", "");
    start_command(Command::new(bin()).args(["run", "--config"]).arg(&config)).await
}

async fn put(c: &Client, base: &str, queue: &str, settings: Value) -> (StatusCode, Value) {
    common::process::put(c, base, queue, &settings).await
}

/// `spoold run` on `toml` (with its spool in `dir`): Some(stderr) if it
/// exits (refuses) within 10 s, None if it serves.
fn run_refuses(dir: &Path, toml: &str) -> Option<String> {
    let config = dir.join("run.toml");
    std::fs::write(&config, toml).unwrap();
    common::process::run_refuses(&config).map(|ran| ran.stderr)
}

#[tokio::test]
async fn a_rate_limit_that_cannot_be_a_period_is_refused_at_the_door() {
    let dir = tempfile::tempdir().unwrap();
    let s = start(dir.path(), "").await;
    let c = client();
    let (status, body) = put(
        &c,
        &s.base,
        "hooks",
        json!({"destination": "http://127.0.0.1:9/in", "rateLimit": 1e-300}),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let message = body["message"].as_str().unwrap();
    assert!(
        message.contains("rateLimit") && message.contains("0.001"),
        "{message}"
    );
    // The server is whole: ready, and a sane push queue is accepted.
    let ready = c.get(format!("{}/readyz", s.base)).send().await.unwrap();
    assert_eq!(ready.status(), StatusCode::OK);
    let (status, _) = put(
        &c,
        &s.base,
        "hooks",
        json!({"destination": "http://127.0.0.1:9/in", "rateLimit": 0.5}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED);
}

#[tokio::test]
async fn an_empty_api_key_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let toml = format!(
        "[server]\nlisten = \"0.0.0.0:0\"\napi_keys = [\"\"]\n[spool]\ndir = \"{}\"\n",
        dir.path().join("spool").display()
    );
    let refused = run_refuses(dir.path(), &toml).expect("spoold served with an empty key");
    assert!(
        refused.contains("api_keys") && refused.contains("empty"),
        "{refused}"
    );
}

#[tokio::test]
async fn a_backslash_in_a_forwarded_path_is_refused() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let dir = tempfile::tempdir().unwrap();
    let s = start(dir.path(), "").await;
    let c = client();
    put(
        &c,
        &s.base,
        "p",
        json!({"destination": "http://127.0.0.1:9/hooks"}),
    )
    .await;
    // Raw bytes: an HTTP client library would turn `\` into `/` itself.
    for path in ["..\\x", "a\\b"] {
        let addr = s.base.trim_start_matches("http://");
        let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let request = format!(
            "POST /v1/forward/p/{path} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 1\r\nConnection: close\r\n\r\nx"
        );
        tcp.write_all(request.as_bytes()).await.unwrap();
        let mut answer = String::new();
        tcp.read_to_string(&mut answer).await.unwrap();
        assert!(answer.starts_with("HTTP/1.1 400"), "{path}: {answer}");
        assert!(
            answer.contains("\"kind\":\"bad_request\""),
            "{path}: {answer}"
        );
    }
    // Nothing was taken in.
    let q: Value = c
        .get(format!("{}/v1/queues/p", s.base))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(q["stats"]["sentTotal"], 0, "{q}");
}

#[tokio::test]
async fn static_headers_that_spoold_owns_are_refused_and_values_are_hidden() {
    let dir = tempfile::tempdir().unwrap();
    let s = start(dir.path(), "").await;
    let c = client();
    for name in [
        "Host",
        "Transfer-Encoding",
        "Connection",
        "Content-Length",
        "Spooler-Retry-Count",
    ] {
        let (status, body) = put(
            &c,
            &s.base,
            "p",
            json!({"destination": "http://127.0.0.1:9/", "headers": {name: "2"}}),
        )
        .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{name}: {body}");
    }
    let (status, body) = put(
        &c,
        &s.base,
        "p",
        json!({"destination": "http://127.0.0.1:9/", "headers": {"Authorization": "Bearer s3cr3t-value"}}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let text = c
        .get(format!("{}/v1/queues/p", s.base))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(!text.contains("s3cr3t-value"), "{text}");
    assert!(text.contains("Authorization"), "{text}");
}

#[tokio::test]
async fn tls_files_cannot_be_named_over_the_api_and_must_be_regular_files() {
    let dir = tempfile::tempdir().unwrap();
    let s = start(dir.path(), "").await;
    let c = client();
    for field in ["caFile", "clientCert", "clientKey"] {
        let (status, body) = put(
            &c,
            &s.base,
            "p",
            json!({"destination": "https://127.0.0.1:9/", field: "/dev/zero", "clientCert": "/etc/hostname", "clientKey": "/etc/hostname"}),
        )
        .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{field}: {body}");
    }
    // In the config file: a FIFO or a device is refused by name.
    let fifo = dir.path().join("fifo");
    assert!(
        Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success()
    );
    let toml = format!(
        "[spool]\ndir = \"{}\"\n[queues.p]\ndestination = \"https://127.0.0.1:9/\"\nca_file = \"{}\"\n",
        dir.path().join("spool2").display(),
        fifo.display()
    );
    let refused = run_refuses(dir.path(), &toml).expect("served with a FIFO as ca_file");
    assert!(
        refused.contains("ca_file") && refused.contains("regular file"),
        "{refused}"
    );
}

/// A destination that answers 500 with everything it was sent.
async fn echo_sink() -> String {
    let app = axum::Router::new().fallback(
        |uri: axum::http::Uri, headers: axum::http::HeaderMap| async move {
            let mut text = format!("{uri}\n");
            for (name, value) in &headers {
                text.push_str(&format!("{name}: {}\n", value.to_str().unwrap_or("?")));
            }
            (axum::http::StatusCode::INTERNAL_SERVER_ERROR, text)
        },
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}")
}

/// The first attempt of the one message of `queue`, once it is recorded.
async fn first_attempt(c: &Client, base: &str, queue: &str) -> (Value, Value) {
    common::eventually(
        "an attempt to be recorded",
        Duration::from_secs(20),
        async || {
            let messages = common::process::messages_in(c, base, queue).await;
            let m = messages.first()?;
            let a = m["attempts"].as_array()?.first()?;
            Some((m.clone(), a.clone()))
        },
    )
    .await
}

#[tokio::test]
async fn attempts_never_echo_secrets_back() {
    let dir = tempfile::tempdir().unwrap();
    let s = start(dir.path(), "redact_headers = [\"X-Api-Token\"]").await;
    let c = client();
    let sink = echo_sink().await;
    put(
        &c,
        &s.base,
        "p",
        json!({
            "destination": format!("{sink}/in"),
            "headers": {"X-Static-Secret": "static-53cr3t"},
            "backoff": {"initialSeconds": 3600},
        }),
    )
    .await;
    let r = c
        .post(format!(
            "{}/v1/forward/p/x?access_token=qu3ry-53cr3t",
            s.base
        ))
        .header("Authorization", "Bearer auth-53cr3t")
        .header("Cookie", "session=cookie-53cr3t")
        .header("X-Api-Token", "token-53cr3t")
        .body("x")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::ACCEPTED);
    let (message, attempt) = first_attempt(&c, &s.base, "p").await;
    let text = format!("{message}{attempt}");
    // The destination echoed what it got; what it echoed is scrubbed.
    assert_eq!(attempt["status"], 500, "{text}");
    assert!(text.contains("x-static-secret: <redacted>"), "{text}");
    for secret in [
        "auth-53cr3t",
        "cookie-53cr3t",
        "token-53cr3t",
        "static-53cr3t",
    ] {
        assert!(!text.contains(secret), "{secret} echoed back: {text}");
    }

    // A destination that cannot be reached: the error names no query.
    put(
        &c,
        &s.base,
        "dead",
        json!({"destination": "http://127.0.0.1:9/in", "backoff": {"initialSeconds": 3600}}),
    )
    .await;
    c.post(format!(
        "{}/v1/forward/dead/x?access_token=qu3ry-53cr3t",
        s.base
    ))
    .body("x")
    .send()
    .await
    .unwrap();
    let (message, attempt) = first_attempt(&c, &s.base, "dead").await;
    // The stored request keeps its query (it is what gets delivered); what
    // was said about the attempt names none.
    let said = format!("{}{attempt}", message["lastError"]);
    assert!(
        !said.contains("qu3ry-53cr3t"),
        "the query reached lastError: {said}"
    );
    let log = s.log();
    for secret in [
        "qu3ry-53cr3t",
        "auth-53cr3t",
        "cookie-53cr3t",
        "token-53cr3t",
        "static-53cr3t",
    ] {
        assert!(!log.contains(secret), "{secret} reached the log: {log}");
    }
}

#[tokio::test]
async fn idle_push_queues_cost_nothing_whatever_their_concurrency() {
    let dir = tempfile::tempdir().unwrap();
    let s = start(dir.path(), "").await;
    let c = client();
    for i in 0..200 {
        let (status, body) = put(
            &c,
            &s.base,
            &format!("idle{i}"),
            json!({"destination": "http://127.0.0.1:9/in", "concurrency": 1024}),
        )
        .await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
    }
    let pid = s.child.id();
    let cpu_ticks = || -> u64 {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        let fields: Vec<&str> = stat.rsplit_once(") ").unwrap().1.split(' ').collect();
        fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
    };
    // Creating 200 queues builds 200 HTTP clients; wait for that work to
    // end (a quiet second), then measure what idling costs.
    common::eventually(
        "spoold to go quiet with 200 idle queues",
        Duration::from_secs(60),
        async || {
            let before = cpu_ticks();
            tokio::time::sleep(Duration::from_secs(1)).await;
            (cpu_ticks() - before <= 10).then_some(())
        },
    )
    .await;
    let before = cpu_ticks();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let used = cpu_ticks() - before;
    // Clock ticks are 1/100 s: at most 6 % of a core over 3 s.
    assert!(used <= 18, "{used} ticks of CPU in 3 s while idle");
    let rss_kib: u64 = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .unwrap()
        .trim()
        .trim_end_matches(" kB")
        .parse()
        .unwrap();
    assert!(
        rss_kib < 96 << 10,
        "{rss_kib} KiB resident for 200 idle queues"
    );
}

#[tokio::test]
async fn a_path_that_is_not_utf8_gets_the_json_error() {
    let dir = tempfile::tempdir().unwrap();
    let s = start(dir.path(), "").await;
    let c = client();
    let r = c
        .get(format!("{}/v1/queues/%FF%FE", s.base))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    let body: Value = r.json().await.expect("a JSON body");
    assert_eq!(body["kind"], "bad_request");
}

#[tokio::test]
async fn proxy_credentials_are_never_forwarded() {
    let dir = tempfile::tempdir().unwrap();
    let s = start(dir.path(), "").await;
    let c = client();
    let (sink, url) = common::sink::Sink::start().await;
    put(
        &c,
        &s.base,
        "p",
        json!({"destination": format!("{url}/in")}),
    )
    .await;
    c.post(format!("{}/v1/forward/p/x", s.base))
        .header("Proxy-Authorization", "Basic cHJveHk6cHc=")
        .header("Authorization", "Bearer for-the-destination")
        .body("x")
        .send()
        .await
        .unwrap();
    let seen = sink.wait_for(1).await;
    assert!(seen[0].headers.get("proxy-authorization").is_none());
    assert_eq!(
        seen[0].headers["authorization"].to_str().unwrap(),
        "Bearer for-the-destination"
    );
}
