//! The HTTP API end to end: the real server (the library's `serve::start`)
//! on 127.0.0.1:0, spoken to with an HTTP client. Every route, every error
//! kind, auth on and off, long polls, lease expiry, failure queues, redrive,
//! dedup and leases across restarts.

use crate::common;

use std::time::{Duration, Instant};

use crate::common::server::Server;
use reqwest::{Method, Response, StatusCode};
use serde_json::{Value, json};
use spoold::config::Config;
use spoold::serve::start;

/// Sends one raw HTTP/1.1 request line (no body) and returns the status.
async fn raw_status(s: &Server, request_line: &str) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(s.addr()).await.unwrap();
    let key = s
        .key
        .as_ref()
        .map(|k| format!("Spooler-Api-Key: {k}\r\n"))
        .unwrap_or_default();
    let text = format!(
        "{request_line}\r\nHost: localhost\r\n{key}Content-Length: 0\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(text.as_bytes()).await.unwrap();
    let mut response = Vec::new();
    stream.read_to_end(&mut response).await.unwrap();
    let head = String::from_utf8_lossy(&response);
    head.split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// The probes answer without a key; `/metrics` on the API port does only
/// while no key is configured (it names every queue).
async fn assert_probes_open(s: &Server) {
    for path in ["/healthz", "/readyz"] {
        assert_eq!(
            s.bare(Method::GET, path).await.status(),
            StatusCode::OK,
            "{path}"
        );
    }
    let metrics = if s.key.is_some() {
        StatusCode::UNAUTHORIZED
    } else {
        StatusCode::OK
    };
    assert_eq!(s.bare(Method::GET, "/metrics").await.status(), metrics);
}

async fn json_of(r: Response) -> Value {
    r.json().await.unwrap()
}

async fn assert_error(r: Response, status: StatusCode, kind: &str) {
    assert_eq!(r.status(), status);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["kind"], kind, "{body}");
    assert!(
        body["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{body}"
    );
}

fn header(r: &Response, name: &str) -> String {
    r.headers()
        .get(name)
        .unwrap_or_else(|| panic!("no {name} header"))
        .to_str()
        .unwrap()
        .to_string()
}

#[tokio::test]
async fn send_receive_ack_with_spooler_headers_and_location() {
    let s = Server::temp("").await;
    assert_eq!(
        s.put_queue("orders", json!({})).await.status(),
        StatusCode::CREATED
    );
    assert_eq!(
        s.put_queue("orders", json!({})).await.status(),
        StatusCode::OK
    );

    let sent = s.send("orders", "hello").await;
    assert_eq!(sent.status(), StatusCode::CREATED);
    let location = header(&sent, "location");
    let body = json_of(sent).await;
    let id = body["id"].as_str().unwrap().to_string();
    assert_eq!(body["queue"], "orders");
    assert_eq!(location, format!("/v1/queues/orders/messages/{id}"));

    let peeked = json_of(s.call(Method::GET, &location).await).await;
    assert_eq!(peeked["state"], "visible");
    assert_eq!(peeked["body"], "hello");
    assert_eq!(peeked["retryCount"], 0);
    assert!(peeked["attempts"].is_array());

    let got = s.receive("orders", "").await;
    assert_eq!(got.status(), StatusCode::OK);
    assert_eq!(header(&got, "spooler-message-id"), id);
    assert_eq!(header(&got, "spooler-retry-count"), "0");
    assert_eq!(header(&got, "content-type"), "text/plain");
    assert!(header(&got, "spooler-lease-expires").ends_with('Z'));
    let token = header(&got, "spooler-lease-token");
    assert!(
        token
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    );
    assert_eq!(got.text().await.unwrap(), "hello");

    let renew = s.settle("orders", &token, "renew").await;
    assert_eq!(renew.status(), StatusCode::OK);
    assert!(json_of(renew).await["leaseExpiresAt"].is_string());
    let ack = s.settle("orders", &token, "ack").await;
    assert_eq!(ack.status(), StatusCode::NO_CONTENT);
    let again = s.settle("orders", &token, "ack").await;
    assert_error(again, StatusCode::CONFLICT, "stale_lease").await;
    let garbled = s
        .call(Method::POST, "/v1/queues/orders/leases/garbage/ack")
        .await;
    assert_error(garbled, StatusCode::BAD_REQUEST, "bad_request").await;
    assert_eq!(
        s.receive("orders", "").await.status(),
        StatusCode::NO_CONTENT
    );

    let stats = json_of(s.call(Method::GET, "/v1/queues/orders").await).await;
    assert_eq!(stats["name"], "orders");
    assert_eq!(stats["stats"]["sentTotal"], 1);
    assert_eq!(stats["stats"]["ackedTotal"], 1);
    assert_eq!(stats["settings"]["leaseTimeoutSeconds"], 30.0);
    s.stop().await;
}

#[tokio::test]
async fn a_long_poll_is_woken_by_a_send() {
    let s = Server::temp("").await;
    s.put_queue("q", json!({})).await;
    let started = Instant::now();
    let poll = s.receive("q", "?wait=20");
    let send = async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        s.send("q", "wake up").await
    };
    let (got, sent) = tokio::join!(poll, send);
    assert_eq!(sent.status(), StatusCode::CREATED);
    assert_eq!(got.status(), StatusCode::OK);
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "woken by the send, not the timeout"
    );
    assert_eq!(got.text().await.unwrap(), "wake up");

    let batch = s
        .call(Method::POST, "/v1/queues/q/receive-batch?max=5&wait=0.2")
        .await;
    assert_eq!(json_of(batch).await["messages"], json!([]));
    for bad in ["?wait=21", "?wait=-1", "?wait=soon"] {
        assert_error(
            s.receive("q", bad).await,
            StatusCode::BAD_REQUEST,
            "bad_request",
        )
        .await;
    }
    let bad_max = s
        .call(Method::POST, "/v1/queues/q/receive-batch?max=101")
        .await;
    assert_error(bad_max, StatusCode::BAD_REQUEST, "bad_request").await;
    s.stop().await;
}

#[tokio::test]
async fn lease_expiry_redelivers_with_a_higher_retry_count_then_fails_and_redrives() {
    let s = Server::temp("").await;
    s.put_queue("q", json!({"leaseTimeoutSeconds": 0.3, "maxRetries": 1}))
        .await;
    let id = json_of(s.send("q", "job").await).await["id"]
        .as_str()
        .unwrap()
        .to_string();

    let first = s.receive("q", "").await;
    assert_eq!(header(&first, "spooler-retry-count"), "0");
    let second = s.receive("q", "?wait=5").await;
    assert_eq!(
        second.status(),
        StatusCode::OK,
        "redelivered after the lease expired"
    );
    assert_eq!(header(&second, "spooler-retry-count"), "1");
    let token = header(&second, "spooler-lease-token");
    let nack = s
        .call(Method::POST, &format!("/v1/queues/q/leases/{token}/nack"))
        .await;
    assert_eq!(nack.status(), StatusCode::NO_CONTENT);

    let failed = json_of(s.call(Method::GET, "/v1/queues/q.failed/messages").await).await;
    let entry = &failed["messages"][0];
    assert_eq!(entry["id"], id.as_str());
    assert_eq!(entry["originQueue"], "q");
    assert_eq!(entry["reason"], "retries_exhausted");
    assert_eq!(entry["retryCount"], 1);
    assert!(entry["failedAt"].is_string());

    let dry = json_of(
        s.call(Method::POST, "/v1/queues/q/redrive?dryRun=true")
            .await,
    )
    .await;
    assert_eq!(dry["moved"], 1);
    let moved = json_of(
        s.call(Method::POST, &format!("/v1/queues/q/redrive?id={id}"))
            .await,
    )
    .await;
    assert_eq!(moved["moved"], 1);
    let back = s.receive("q", "").await;
    assert_eq!(header(&back, "spooler-message-id"), id);
    assert_eq!(
        header(&back, "spooler-retry-count"),
        "0",
        "redrive resets the count"
    );
    s.stop().await;
}

#[tokio::test]
async fn dedup_holds_across_a_restart_and_old_leases_go_stale() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), "").await;
    s.put_queue("q", json!({"dedupWindowSeconds": 600})).await;
    let keyed = || {
        s.req(Method::POST, "/v1/queues/q/messages")
            .header("Idempotency-Key", "order-7")
            .body("once")
    };
    let first = keyed().send().await.unwrap();
    assert_eq!(first.status(), StatusCode::CREATED);
    let id = json_of(first).await["id"].clone();
    let got = s.receive("q", "").await;
    let token = header(&got, "spooler-lease-token");
    s.stop().await;

    let s = Server::start(dir.path(), "").await;
    let again = s
        .req(Method::POST, "/v1/queues/q/messages")
        .header("Idempotency-Key", "order-7")
        .body("twice")
        .send()
        .await
        .unwrap();
    assert_eq!(again.status(), StatusCode::OK);
    assert_eq!(header(&again, "spooler-deduplicated"), "true");
    assert_eq!(json_of(again).await["id"], id);
    let stale = s
        .call(Method::POST, &format!("/v1/queues/q/leases/{token}/ack"))
        .await;
    assert_error(stale, StatusCode::CONFLICT, "stale_lease").await;
    let redelivered = s.receive("q", "").await;
    assert_eq!(
        redelivered.status(),
        StatusCode::OK,
        "visible at once after the restart"
    );
    assert_eq!(header(&redelivered, "spooler-retry-count"), "0");

    s.put_queue("plain", json!({})).await;
    let refused = s
        .req(Method::POST, "/v1/queues/plain/messages")
        .header("Idempotency-Key", "k")
        .body("x")
        .send()
        .await
        .unwrap();
    assert_error(refused, StatusCode::BAD_REQUEST, "bad_request").await;
    s.stop().await;
}

#[tokio::test]
async fn forward_stores_the_request_and_checks_the_path() {
    let s = Server::temp("redact_headers = [\"X-Secret\"]\n").await;
    s.put_queue(
        "hooks",
        json!({"destination": "https://hooks.example.com/in", "dedupWindowSeconds": 60}),
    )
    .await;
    s.put_queue("pull", json!({})).await;
    // The client would resolve dot segments itself: send those raw.
    let raw = raw_status(&s, "POST /v1/forward/hooks/a/./b/../c/ HTTP/1.1").await;
    assert_eq!(raw, 202);
    for escape in [
        "POST /v1/forward/hooks/a/../../etc HTTP/1.1",
        "POST /v1/forward/hooks/%2e%2e/x HTTP/1.1",
        "POST /v1/forward/hooks/.%2E/x HTTP/1.1",
    ] {
        assert_eq!(raw_status(&s, escape).await, 400, "{escape}");
    }
    let r = s
        .req(Method::PATCH, "/v1/forward/hooks/a/c?x=1&y=%2F")
        .header("Authorization", "Bearer for-the-destination")
        .header("X-Secret", "s3cret")
        .header("Spooler-Idempotency-Key", "not-forwarded")
        .header("Content-Type", "application/json")
        .body("{\"a\":1}")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::ACCEPTED);
    let delivery_id = header(&r, "spooler-delivery-id");
    assert_eq!(json_of(r).await["id"], delivery_id.as_str());

    let m = json_of(
        s.call(
            Method::GET,
            &format!("/v1/queues/hooks/messages/{delivery_id}"),
        )
        .await,
    )
    .await;
    assert_eq!(m["request"]["method"], "PATCH");
    assert_eq!(m["request"]["path"], "/a/c?x=1&y=%2F");
    assert_eq!(m["request"]["headers"]["authorization"], "<redacted>");
    assert_eq!(m["request"]["headers"]["x-secret"], "<redacted>");
    assert!(
        m["request"]["headers"]
            .get("spooler-idempotency-key")
            .is_none()
    );
    assert_eq!(m["body"], "{\"a\":1}");

    // The path in Spooler-Forward-Path (what generated clients can send):
    // stored as the URL's would be, checked the same way, never both.
    let by_header = |path: &'static str, extra: &'static str| {
        s.req(Method::POST, &format!("/v1/forward/hooks{extra}"))
            .header("Spooler-Forward-Path", path)
            .send()
    };
    let r = by_header("/v1/charges?x=1", "").await.unwrap();
    assert_eq!(r.status(), StatusCode::ACCEPTED);
    let id = header(&r, "spooler-delivery-id");
    let m = json_of(
        s.call(Method::GET, &format!("/v1/queues/hooks/messages/{id}"))
            .await,
    )
    .await;
    assert_eq!(m["request"]["path"], "/v1/charges?x=1");
    assert!(
        m["request"]["headers"]
            .get("spooler-forward-path")
            .is_none()
    );
    for (path, extra) in [
        ("/v1/charges", "/also/in/the/url"),
        ("/v1/charges", "?x=1"),
        ("v1/charges", ""),
        ("/a/../../etc", ""),
    ] {
        let r = by_header(path, extra).await.unwrap();
        assert_eq!(r.status(), StatusCode::BAD_REQUEST, "{path} {extra}");
    }

    let twice = s
        .req(Method::POST, "/v1/forward/hooks/a/c?x=1&y=%2F")
        .header("Spooler-Idempotency-Key", "not-forwarded")
        .send()
        .await
        .unwrap();
    assert_eq!(twice.status(), StatusCode::OK);
    assert_eq!(
        header(&twice, "spooler-delivery-id"),
        delivery_id,
        "deduplicated"
    );
    let to_pull = s.call(Method::POST, "/v1/forward/pull/x").await;
    assert_error(to_pull, StatusCode::CONFLICT, "not_push_queue").await;
    let receive_push = s.receive("hooks", "").await;
    assert_error(receive_push, StatusCode::CONFLICT, "not_pull_queue").await;
    s.stop().await;
}

#[tokio::test]
async fn queues_can_be_listed_changed_paused_peeked_cancelled_purged_and_deleted() {
    let s = Server::temp("[queues.fromconfig]\nmax_retries = 2\n").await;
    s.put_queue("q", json!({"maxRetries": 3})).await;
    let list = json_of(s.call(Method::GET, "/v1/queues").await).await;
    let names: Vec<&str> = list["queues"]
        .as_array()
        .unwrap()
        .iter()
        .map(|q| q["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        vec!["fromconfig", "fromconfig.failed", "q", "q.failed"]
    );

    assert_error(
        s.put_queue("fromconfig", json!({})).await,
        StatusCode::CONFLICT,
        "queue_managed_by_config",
    )
    .await;
    let del = s.call(Method::DELETE, "/v1/queues/fromconfig").await;
    assert_error(del, StatusCode::CONFLICT, "queue_managed_by_config").await;
    assert_error(
        s.put_queue("q.failed", json!({})).await,
        StatusCode::CONFLICT,
        "failure_queue",
    )
    .await;
    let send_failed = s.send("q.failed", "x").await;
    assert_eq!(send_failed.status(), StatusCode::CONFLICT);
    assert_error(
        s.put_queue("q", json!({"maxRetrys": 1})).await,
        StatusCode::BAD_REQUEST,
        "bad_request",
    )
    .await;
    assert_error(
        s.put_queue("bad name", json!({})).await,
        StatusCode::BAD_REQUEST,
        "bad_request",
    )
    .await;
    let bad_json = s
        .req(Method::PUT, "/v1/queues/q")
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_error(bad_json, StatusCode::BAD_REQUEST, "bad_request").await;

    let mut ids = Vec::new();
    for i in 0..5 {
        ids.push(
            json_of(s.send("q", &format!("m{i}")).await).await["id"]
                .as_str()
                .unwrap()
                .to_string(),
        );
    }
    let page = json_of(s.call(Method::GET, "/v1/queues/q/messages?limit=2").await).await;
    let page_ids: Vec<&str> = page["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(page_ids, vec![ids[0].as_str(), ids[1].as_str()]);
    let next = json_of(
        s.call(
            Method::GET,
            &format!("/v1/queues/q/messages?limit=2&after={}", ids[1]),
        )
        .await,
    )
    .await;
    assert_eq!(next["messages"][0]["id"], ids[2].as_str());
    let too_many = s
        .call(Method::GET, "/v1/queues/q/messages?limit=1001")
        .await;
    assert_error(too_many, StatusCode::BAD_REQUEST, "bad_request").await;

    let cancel = s
        .call(Method::DELETE, &format!("/v1/queues/q/messages/{}", ids[0]))
        .await;
    assert_eq!(cancel.status(), StatusCode::NO_CONTENT);
    let gone = s
        .call(Method::GET, &format!("/v1/queues/q/messages/{}", ids[0]))
        .await;
    assert_error(gone, StatusCode::NOT_FOUND, "message_not_found").await;

    assert_eq!(
        s.call(Method::POST, "/v1/queues/q/pause").await.status(),
        StatusCode::NO_CONTENT
    );
    assert_eq!(
        s.receive("q", "").await.status(),
        StatusCode::NO_CONTENT,
        "paused"
    );
    let stats = json_of(s.call(Method::GET, "/v1/queues/q").await).await;
    assert_eq!(stats["stats"]["paused"], true);
    assert_eq!(
        s.call(Method::POST, "/v1/queues/q/resume").await.status(),
        StatusCode::NO_CONTENT
    );
    assert_eq!(s.receive("q", "").await.status(), StatusCode::OK);

    let purged = json_of(s.call(Method::DELETE, "/v1/queues/q/messages").await).await;
    assert_eq!(purged["purged"], 4);
    assert_eq!(
        s.call(Method::DELETE, "/v1/queues/q").await.status(),
        StatusCode::NO_CONTENT
    );
    let missing = s.call(Method::GET, "/v1/queues/q").await;
    assert_error(missing, StatusCode::NOT_FOUND, "queue_not_found").await;
    assert_error(
        s.send("nope", "x").await,
        StatusCode::NOT_FOUND,
        "queue_not_found",
    )
    .await;
    s.stop().await;
}

#[tokio::test]
async fn tail_streams_new_messages_as_lines() {
    let s = Server::temp("").await;
    s.put_queue("q", json!({})).await;
    let mut tail = s.call(Method::GET, "/v1/queues/q/tail").await;
    assert_eq!(tail.status(), StatusCode::OK);
    assert_eq!(header(&tail, "content-type"), "application/x-ndjson");
    s.send("q", "first").await;
    s.send("q", "second").await;
    let mut text = String::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while text.lines().count() < 2 {
        let chunk = tokio::time::timeout_at(deadline.into(), tail.chunk())
            .await
            .expect("lines arrive")
            .unwrap();
        text.push_str(std::str::from_utf8(&chunk.unwrap()).unwrap());
    }
    let bodies: Vec<String> = text
        .lines()
        .map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["body"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(bodies, vec!["first", "second"]);
    drop(tail);
    s.stop().await;
}

#[tokio::test]
async fn errors_have_kinds_for_routes_methods_sizes_and_space() {
    let s = Server::temp(
        "max_body_bytes = 1000\n[spool]\nsegment_bytes = \"64KiB\"\nmax_bytes = \"256KiB\"\n",
    )
    .await;
    s.put_queue("q", json!({})).await;
    assert_error(
        s.call(Method::GET, "/v1/nothing").await,
        StatusCode::NOT_FOUND,
        "not_found",
    )
    .await;
    assert_error(
        s.call(Method::GET, "/elsewhere").await,
        StatusCode::NOT_FOUND,
        "not_found",
    )
    .await;
    let wrong = s.call(Method::PATCH, "/v1/queues/q/messages").await;
    assert_error(wrong, StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed").await;
    assert_error(
        s.send("q", &"x".repeat(1001)).await,
        StatusCode::PAYLOAD_TOO_LARGE,
        "payload_too_large",
    )
    .await;
    let bad_delay = s
        .req(Method::POST, "/v1/queues/q/messages")
        .header("Spooler-Delay", "soon")
        .body("x")
        .send()
        .await
        .unwrap();
    assert_error(bad_delay, StatusCode::BAD_REQUEST, "bad_request").await;

    let full = loop {
        let r = s.send("q", &"y".repeat(900)).await;
        if r.status() != StatusCode::CREATED {
            break r;
        }
    };
    assert!(full.headers().contains_key("retry-after"));
    assert_error(full, StatusCode::INSUFFICIENT_STORAGE, "spool_full").await;

    assert_probes_open(&s).await;
    let metrics = s.text("/metrics").await;
    // The registry is process-wide and other tests' servers share it: check
    // the shape here; values are checked where one server runs alone.
    assert!(
        metrics.contains("# TYPE spoold_journal_max_bytes gauge"),
        "{metrics}"
    );
    assert!(
        metrics.contains(
            r#"spoold_http_requests_total{route="/v1/queues/{q}/messages",status="201"}"#
        ),
        "{metrics}"
    );
    s.stop().await;
}

/// Every `/v1` route, with a method it takes.
const ROUTES: &[(&str, &str)] = &[
    ("GET", "/v1/queues"),
    ("GET", "/v1/queues/q"),
    ("PUT", "/v1/queues/q"),
    ("DELETE", "/v1/queues/q"),
    ("POST", "/v1/queues/q/messages"),
    ("GET", "/v1/queues/q/messages"),
    ("DELETE", "/v1/queues/q/messages"),
    (
        "GET",
        "/v1/queues/q/messages/000000000000000100000000000000ff",
    ),
    (
        "DELETE",
        "/v1/queues/q/messages/000000000000000100000000000000ff",
    ),
    ("POST", "/v1/queues/q/receive"),
    ("POST", "/v1/queues/q/receive-batch"),
    ("POST", "/v1/queues/q/leases/token/ack"),
    ("POST", "/v1/queues/q/leases/token/nack"),
    ("POST", "/v1/queues/q/leases/token/renew"),
    ("GET", "/v1/queues/q/tail"),
    ("POST", "/v1/queues/q/redrive"),
    ("POST", "/v1/queues/q/pause"),
    ("POST", "/v1/queues/q/resume"),
    ("POST", "/v1/forward/q/x"),
    ("GET", "/v1/forward/q"),
    ("GET", "/v1/no-such-route"),
];

#[tokio::test]
async fn with_keys_configured_no_v1_route_answers_without_one() {
    let s = Server::temp("api_keys = [\"k1\", \"second-key\"]\n").await;
    for (method, path) in ROUTES {
        let method = Method::from_bytes(method.as_bytes()).unwrap();
        let url = format!("{}{path}", s.base);
        let none = s.client.request(method.clone(), &url).send().await.unwrap();
        assert_eq!(
            none.status(),
            StatusCode::UNAUTHORIZED,
            "{method} {path} without a key"
        );
        assert_eq!(json_of(none).await["kind"], "unauthorized");
        let wrong = s
            .client
            .request(method.clone(), &url)
            .header("Spooler-Api-Key", "k2")
            .send()
            .await
            .unwrap();
        assert_eq!(
            wrong.status(),
            StatusCode::UNAUTHORIZED,
            "{method} {path} with a wrong key"
        );
        if path.starts_with("/v1/forward/") {
            let bearer = s
                .client
                .request(method.clone(), &url)
                .bearer_auth("k1")
                .send()
                .await
                .unwrap();
            assert_eq!(
                bearer.status(),
                StatusCode::UNAUTHORIZED,
                "forward ignores Authorization"
            );
        } else if *path != "/v1/queues/q/tail" {
            let bearer = s
                .client
                .request(method.clone(), &url)
                .bearer_auth("second-key")
                .send()
                .await
                .unwrap();
            assert_ne!(
                bearer.status(),
                StatusCode::UNAUTHORIZED,
                "{method} {path} with a bearer key"
            );
        }
    }
    // Probes stay open.
    assert_probes_open(&s).await;
    // Unauthenticated callers never learn whether a queue exists.
    let unknown = s.bare(Method::GET, "/v1/queues/nope").await;
    assert_eq!(unknown.status(), StatusCode::UNAUTHORIZED);

    s.put_queue("hooks", json!({"destination": "https://h.example.com"}))
        .await;
    let forwarded = s
        .client
        .post(format!("{}/v1/forward/hooks/x", s.base))
        .header("Spooler-Api-Key", "k1")
        .header("Authorization", "Bearer dest-token")
        .send()
        .await
        .unwrap();
    assert_eq!(forwarded.status(), StatusCode::ACCEPTED);
    let id = header(&forwarded, "spooler-delivery-id");
    let m = json_of(
        s.call(Method::GET, &format!("/v1/queues/hooks/messages/{id}"))
            .await,
    )
    .await;
    let headers = m["request"]["headers"].as_object().unwrap();
    assert!(
        headers.contains_key("authorization"),
        "Authorization is forwarded"
    );
    assert!(
        !headers.contains_key("spooler-api-key"),
        "the key is stripped"
    );
    s.stop().await;
}

#[tokio::test]
async fn destinations_outside_allowed_destinations_are_forbidden() {
    let s = Server::temp("allowed_destinations = [\"*.example.com\", \"127.0.0.1\"]\n").await;
    let ok = s
        .put_queue("a", json!({"destination": "https://hooks.example.com/in"}))
        .await;
    assert_eq!(ok.status(), StatusCode::CREATED);
    let local = s
        .put_queue("b", json!({"destination": "http://127.0.0.1:9/in"}))
        .await;
    assert_eq!(local.status(), StatusCode::CREATED);
    assert_error(
        s.put_queue("c", json!({"destination": "https://evil.example.org/in"}))
            .await,
        StatusCode::FORBIDDEN,
        "forbidden",
    )
    .await;
    assert_error(
        s.put_queue(
            "d",
            json!({"destination": "https://hooks.example.com/in?x=1"}),
        )
        .await,
        StatusCode::BAD_REQUEST,
        "bad_request",
    )
    .await;
    s.stop().await;

    // A config queue outside the list is refused with the file, before
    // anything starts: its key and line.
    let err = Config::parse(
        "[server]\nlisten = \"127.0.0.1:0\"\nallowed_destinations = [\"*.example.com\"]\n\
         [queues.bad]\ndestination = \"https://elsewhere.org/\"\n",
    )
    .expect_err("a config queue outside allowed_destinations")
    .to_string();
    assert!(
        err.contains("allowed_destinations") && err.contains("queues.bad.destination"),
        "{err}"
    );
    assert!(err.contains("line 5"), "{err}");
}

#[tokio::test]
async fn listening_beyond_loopback_without_a_key_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = Config::parse("[server]\nlisten = \"0.0.0.0:0\"\n").unwrap();
    config.spool.dir = dir.path().to_path_buf();
    let err = match start(config.clone(), None).await {
        Ok(_) => panic!("started without a key on 0.0.0.0"),
        Err(e) => e.to_string(),
    };
    assert!(err.contains("without an API key"), "{err}");
    let running = start(config, Some("env-key".into()))
        .await
        .expect("a key from SPOOLD_API_KEYS is enough");
    running.stop();
    running.wait().await.unwrap();
}

#[tokio::test]
async fn a_client_that_never_finishes_its_headers_is_cut_off() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let s = Server::temp("").await;
    let addr = s.base.trim_start_matches("http://").to_string();
    let mut slow = tokio::net::TcpStream::connect(&addr).await.unwrap();
    slow.write_all(b"POST /v1/queues/q/messages HTTP/1.1\r\nHost: localhost\r\n")
        .await
        .unwrap();
    let started = Instant::now();
    let mut rest = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(20), slow.read_to_end(&mut rest)).await;
    assert!(read.is_ok(), "the server closed the connection");
    let waited = started.elapsed();
    // A first request's head has FIRST_REQUEST_TIMEOUT, and holds no
    // slot meanwhile.
    assert!(
        waited >= spoold::testing::FIRST_REQUEST_TIMEOUT - Duration::from_secs(1),
        "cut off after {waited:?}"
    );
    // Others were served meanwhile.
    assert_eq!(
        s.bare(Method::GET, "/healthz").await.status(),
        StatusCode::OK
    );
    s.stop().await;
}

/// The dashboard's counts: what was enqueued, delivered, retried and
/// failed lands in the seconds and the minute it happened, per queue and
/// in total; what a restart replays is not counted again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rates_count_each_second_per_queue_and_in_total() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), "[queues.jobs]\nmax_retries = 0\n").await;
    for i in 0..3 {
        s.send("jobs", &format!("m{i}")).await;
    }
    let token = s.lease("jobs").await;
    assert_eq!(s.settle("jobs", &token, "ack").await.status(), 204);
    let token = s.lease("jobs").await;
    assert_eq!(s.settle("jobs", &token, "nack").await.status(), 204);
    let sum = |body: &Value, part: &str| -> Vec<u64> {
        let mut total = vec![0; 4];
        for bucket in body[part]["counts"].as_array().unwrap() {
            for (t, n) in total.iter_mut().zip(bucket.as_array().unwrap()) {
                *t += n.as_u64().unwrap();
            }
        }
        total
    };
    // Enqueued 3, delivered 1; the nack past max_retries = 0 failed one.
    let body = common::eventually("a second's counts", Duration::from_secs(10), async || {
        let body = s.get_json("/v1/queues/jobs/rates").await;
        (sum(&body, "seconds") == [3, 1, 0, 1]).then_some(body)
    })
    .await;
    assert_eq!(
        body["series"],
        json!(["enqueued", "delivered", "retried", "failed"])
    );
    assert_eq!(body["seconds"]["counts"].as_array().unwrap().len(), 300);
    assert_eq!(body["minutes"]["counts"].as_array().unwrap().len(), 60);
    assert_eq!(sum(&body, "minutes"), [3, 1, 0, 1]);
    let total = s.get_json("/v1/rates").await;
    assert_eq!(sum(&total, "seconds")[..2], [3, 1]);
    assert!(total.get("queue").is_none());
    assert_eq!(
        s.call(Method::GET, "/v1/queues/nope/rates").await.status(),
        404
    );
    // After a restart the replayed records are no rate: the hour holds
    // the one new send alone.
    s.stop().await;
    let s = Server::start(dir.path(), "[queues.jobs]\nmax_retries = 0\n").await;
    s.send("jobs", "after").await;
    common::eventually("the new send", Duration::from_secs(10), async || {
        let body = s.get_json("/v1/queues/jobs/rates").await;
        (sum(&body, "seconds") == [1, 0, 0, 0]).then_some(())
    })
    .await;
    assert_eq!(sum(&s.get_json("/v1/rates").await, "minutes"), [1, 0, 0, 0]);
    s.stop().await;
}

/// More headers than the listener takes (100), or more bytes of them
/// (64 KiB), are refused `431` before any handler runs.
#[tokio::test]
async fn requests_past_the_header_bounds_are_refused() {
    let s = Server::temp("").await;
    let many: String = (0..101).map(|i| format!("X-H{i}: v\r\n")).collect();
    let long = format!("X-Long: {}\r\n", "v".repeat(65 << 10));
    for extra in [many, long] {
        let line = format!("GET /healthz HTTP/1.1\r\n{}", extra.trim_end());
        assert_eq!(raw_status(&s, &line).await, 431);
    }
    assert_eq!(raw_status(&s, "GET /healthz HTTP/1.1").await, 200);
    s.stop().await;
}
