//! Push delivery against a real local HTTP sink (axum on 127.0.0.1:0): what
//! arrives, retries with a stable delivery id, Retry-After, permanent
//! failures, redirects, signatures, and the circuit breaker.

use crate::common;

use std::time::Duration;

use crate::common::server::Server;
use crate::common::sink::{Seen, Sink};
use crate::common::wait_until;
use axum::http::Method;
use serde_json::{Value, json};

/// Fast retries for tests: 50 ms, no growth, no jitter.
fn fast_backoff() -> Value {
    json!({"initialSeconds": 0.05, "multiplier": 1, "maxSeconds": 60, "jitter": 0})
}

fn h(seen: &Seen, name: &str) -> String {
    seen.headers
        .get(name)
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default()
}

#[tokio::test]
async fn forwarded_requests_arrive_as_sent_and_are_acked() {
    let (sink, sink_url) = Sink::start().await;
    let s = Server::temp("").await;
    s.queue(
        "hooks",
        json!({"destination": format!("{sink_url}/in"), "headers": {"X-Static": "queue", "X-Source": "spoold"}}),
    )
    .await;
    let r = s
        .client
        .put(format!("{}/v1/forward/hooks/a/b?x=1&y=%2F", s.base))
        .header("Authorization", "Bearer for-dest")
        .header("X-Static", "stored")
        .header("Content-Type", "application/json")
        .body("{\"n\":1}")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 202);
    let id = r.headers()["spooler-delivery-id"]
        .to_str()
        .unwrap()
        .to_string();
    let seen = sink.wait_for(1).await;
    let got = &seen[0];
    assert_eq!(got.method, Method::PUT);
    assert_eq!(got.uri, "/in/a/b?x=1&y=%2F");
    assert_eq!(h(got, "authorization"), "Bearer for-dest");
    assert_eq!(
        h(got, "x-static"),
        "queue",
        "static headers win over stored ones"
    );
    assert_eq!(h(got, "x-source"), "spoold");
    assert_eq!(h(got, "content-type"), "application/json");
    assert_eq!(h(got, "spooler-delivery-id"), id);
    assert_eq!(h(got, "spooler-retry-count"), "0");
    assert!(got.headers.get("spooler-api-key").is_none());
    assert_eq!(&got.body[..], b"{\"n\":1}");

    // A plain send to a push queue is POSTed to the destination itself.
    s.send("hooks", "plain").await;
    let seen = sink.wait_for(2).await;
    assert_eq!(seen[1].method, Method::POST);
    assert_eq!(seen[1].uri, "/in");
    assert_eq!(h(&seen[1], "content-type"), "text/plain");
    // A path that looks like another host stays below the destination.
    let r = s
        .api()
        .forward("hooks", "/evil.example.com/x", "escape?")
        .await;
    assert_eq!(r.status(), 202);
    let seen = sink.wait_for(3).await;
    assert_eq!(seen[2].uri, "/in/evil.example.com/x");
    assert_eq!(
        seen[2].headers["host"].to_str().unwrap(),
        sink_url.trim_start_matches("http://")
    );
    wait_until("both acked", async || {
        s.get_json("/v1/queues/hooks").await["stats"]["visible"] == 0
            && s.get_json("/v1/queues/hooks").await["stats"]["leased"] == 0
    })
    .await;
    let stats = s.get_json("/v1/queues/hooks").await["stats"].clone();
    assert_eq!(stats["deliveriesTotal"], 3);
    assert_eq!(stats["deliveryFailuresTotal"], 0);
    s.stop().await;
}

#[tokio::test]
async fn retries_keep_the_delivery_id_and_count_up() {
    let (sink, sink_url) = Sink::start().await;
    sink.script([(500, vec![]), (500, vec![])]);
    let s = Server::temp("").await;
    s.queue(
        "hooks",
        json!({"destination": sink_url, "backoff": fast_backoff()}),
    )
    .await;
    s.send("hooks", "x").await;
    let seen = sink.wait_for(3).await;
    let ids: Vec<String> = seen.iter().map(|r| h(r, "spooler-delivery-id")).collect();
    assert!(ids.iter().all(|i| *i == ids[0]), "{ids:?}");
    let counts: Vec<String> = seen.iter().map(|r| h(r, "spooler-retry-count")).collect();
    assert_eq!(counts, vec!["0", "1", "2"]);
    wait_until("acked", async || {
        s.get_json("/v1/queues/hooks").await["stats"]["deliveriesTotal"] == 3
    })
    .await;
    assert_eq!(
        s.get_json("/v1/queues/hooks").await["stats"]["deliveryFailuresTotal"],
        2
    );
    s.stop().await;
}

/// With traces off, the destination still gets the caller's
/// `traceparent` as it came (a send's, stored with its message), and none
/// when the caller sent none or one that does not parse.
#[tokio::test]
async fn the_callers_traceparent_reaches_the_destination() {
    let (sink, sink_url) = Sink::start().await;
    let s = Server::temp("").await;
    s.queue("hooks", json!({"destination": sink_url})).await;
    let traced = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    for value in [Some(traced), None, Some("00-zz-00f067aa0ba902b7-01")] {
        let mut r = s.req(Method::POST, "/v1/queues/hooks/messages").body("x");
        if let Some(v) = value {
            r = r.header("traceparent", v);
        }
        assert_eq!(r.send().await.unwrap().status(), 201);
    }
    let seen = sink.wait_for(3).await;
    let mut got: Vec<String> = seen.iter().map(|r| h(r, "traceparent")).collect();
    got.sort();
    assert_eq!(got, vec!["".to_string(), String::new(), traced.to_string()]);
    s.stop().await;
}

/// "Retry now" (the console's button): a message waiting an hour for its
/// next try is delivered at once, its retry count kept; one that does not
/// wait is refused with `message_not_delayed`.
#[tokio::test]
async fn retry_now_delivers_a_waiting_message_at_once() {
    let (sink, sink_url) = Sink::start().await;
    sink.script([(503, vec![])]);
    let s = Server::temp("").await;
    let hour = json!({"initialSeconds": 3600, "multiplier": 1, "maxSeconds": 3600, "jitter": 0});
    s.queue("hooks", json!({"destination": sink_url, "backoff": hour}))
        .await;
    let id = s.send_id("hooks", "x").await;
    sink.wait_for(1).await;
    let path = format!("/v1/queues/hooks/messages/{id}");
    wait_until("the retry waits", async || {
        s.get_json(&path).await["state"] == "delayed"
    })
    .await;
    let r = s.call(Method::POST, &format!("{path}/retry")).await;
    assert_eq!(r.status(), 204);
    let seen = sink.wait_for(2).await;
    assert_eq!(h(&seen[1], "spooler-retry-count"), "1", "the count is kept");
    assert_eq!(h(&seen[1], "spooler-delivery-id"), id);
    wait_until("delivered", async || {
        s.get_json("/v1/queues/hooks").await["stats"]["ackedTotal"] == 1
    })
    .await;
    // Gone now, and a visible message of a pull queue does not wait.
    assert_eq!(
        s.call(Method::POST, &format!("{path}/retry"))
            .await
            .status(),
        404
    );
    s.queue("jobs", json!({})).await;
    let other = s.send_id("jobs", "y").await;
    let r = s
        .call(
            Method::POST,
            &format!("/v1/queues/jobs/messages/{other}/retry"),
        )
        .await;
    assert_eq!(r.status(), 409);
    assert_eq!(
        r.json::<Value>().await.unwrap()["kind"],
        "message_not_delayed"
    );
    s.stop().await;
}

#[tokio::test]
async fn retry_after_is_honoured_and_redirects_are_not_followed() {
    let (sink, sink_url) = Sink::start().await;
    sink.script([
        (503, vec![("retry-after", "1".to_string())]),
        (301, vec![("location", "/elsewhere".to_string())]),
    ]);
    let s = Server::temp("").await;
    s.queue(
        "hooks",
        json!({"destination": format!("{sink_url}/in"), "backoff": fast_backoff()}),
    )
    .await;
    s.send("hooks", "x").await;
    let seen = sink.wait_for(3).await;
    let gap = seen[1].at - seen[0].at;
    assert!(
        gap >= Duration::from_millis(900),
        "Retry-After: 1 was not honoured ({gap:?})"
    );
    assert!(
        seen.iter().all(|r| r.uri == "/in"),
        "the redirect was not followed"
    );
    assert_eq!(h(&seen[2], "spooler-retry-count"), "2", "a 301 is retried");
    s.stop().await;
}

#[tokio::test]
async fn a_permanent_status_goes_to_the_failure_queue_at_once_with_its_attempt() {
    let (sink, sink_url) = Sink::start().await;
    sink.script([(404, vec![])]);
    let s = Server::temp("").await;
    s.queue("hooks", json!({"destination": sink_url})).await;
    s.send("hooks", "x").await;
    wait_until("failed", async || {
        s.get_json("/v1/queues/hooks.failed").await["stats"]["visible"] == 1
    })
    .await;
    let failed = s.get_json("/v1/queues/hooks.failed/messages").await;
    let m = &failed["messages"][0];
    assert_eq!(m["reason"], "permanent_status");
    assert_eq!(m["lastStatus"], 404);
    assert_eq!(
        m["retryCount"], 0,
        "a permanent status does not raise the count"
    );
    assert_eq!(m["originQueue"], "hooks");
    let attempts = m["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 1);
    assert_eq!(attempts[0]["status"], 404);
    assert_eq!(attempts[0]["response"], "sink says hi");
    assert_eq!(sink.seen().len(), 1);
    s.stop().await;
}

/// HMAC-SHA256 written out by hand (RFC 2104), independent of the `hmac`
/// crate spoold signs with.
#[tokio::test]
async fn signatures_verify_with_an_independent_implementation() {
    use base64::Engine as _;
    use base64::engine::general_purpose::STANDARD;
    let (sink, sink_url) = Sink::start().await;
    let s = Server::temp("").await;
    let key = b"a very secret key";
    let rotated = b"the rotated-in key";
    let secret = format!(
        "whsec_{} whsec_{}",
        STANDARD.encode(key),
        STANDARD.encode(rotated)
    );
    s.queue(
        "hooks",
        json!({"destination": sink_url, "signingSecret": secret}),
    )
    .await;
    let settings = s.get_json("/v1/queues/hooks").await;
    assert!(
        !settings.to_string().contains(&STANDARD.encode(rotated)),
        "write-only"
    );
    s.send("hooks", "signed body").await;
    let got = &sink.wait_for(1).await[0];
    let id = h(got, "webhook-id");
    assert_eq!(id, h(got, "spooler-delivery-id"));
    let ts = h(got, "webhook-timestamp");
    let signed = format!("{id}.{ts}.signed body");
    let expected: Vec<String> = [key.as_slice(), rotated.as_slice()]
        .iter()
        .map(|k| {
            format!(
                "v1,{}",
                STANDARD.encode(common::hmac_sha256(k, signed.as_bytes()))
            )
        })
        .collect();
    assert_eq!(h(got, "webhook-signature"), expected.join(" "));
    s.stop().await;
}

#[tokio::test]
async fn the_breaker_opens_probes_and_closes() {
    let (sink, sink_url) = Sink::start().await;
    sink.script([(500, vec![]), (500, vec![]), (500, vec![])]);
    let s = Server::temp("").await;
    s.queue(
        "hooks",
        json!({"destination": sink_url, "breakerFailures": 2, "concurrency": 1, "backoff": fast_backoff()}),
    )
    .await;
    for i in 0..3 {
        s.send("hooks", &format!("m{i}")).await;
    }
    wait_until("breaker open", async || {
        s.get_json("/v1/queues/hooks").await["stats"]["breakerOpen"] == true
    })
    .await;
    let before_probe = sink.seen().len();
    assert_eq!(before_probe, 2, "no more attempts while open");
    // The stats say when the next probe is due (about 5 s away).
    let stats = s.get_json("/v1/queues/hooks").await["stats"].clone();
    let next = stats["nextProbeAt"]
        .as_str()
        .unwrap_or_else(|| panic!("{stats}"));
    let due = spoold::time::parse_rfc3339(next).unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    assert!((0..=6_000).contains(&(due - now)), "{next}");
    // The probe (after 5 s) fails once, the next one (10 s later)… would be
    // slow; the third scripted 500 is the first probe, then the sink is
    // healthy and the second probe closes the breaker.
    wait_until("breaker closed", async || {
        s.get_json("/v1/queues/hooks").await["stats"]["breakerOpen"] == false
    })
    .await;
    let stats = s.get_json("/v1/queues/hooks").await["stats"].clone();
    assert_eq!(stats["nextProbeAt"], serde_json::Value::Null, "{stats}");
    wait_until("all delivered", async || {
        let st = s.get_json("/v1/queues/hooks").await["stats"].clone();
        st["visible"] == 0 && st["leased"] == 0 && st["delayed"] == 0
    })
    .await;
    let seen = sink.seen();
    let probe = &seen[2];
    assert!(
        probe.at - seen[1].at >= Duration::from_secs(4),
        "the probe waited"
    );
    // A failed probe does not raise the message's retry count.
    let first_ids: Vec<String> = seen.iter().map(|r| h(r, "spooler-delivery-id")).collect();
    let last_try_of_probed = seen
        .iter()
        .rev()
        .find(|r| h(r, "spooler-delivery-id") == first_ids[2])
        .unwrap();
    assert_eq!(
        h(probe, "spooler-retry-count"),
        h(last_try_of_probed, "spooler-retry-count")
    );
    s.stop().await;
}

/// An HTTPS sink with a self-signed certificate (made here with rcgen);
/// returns its URL, the certificate's PEM, and how many requests it served.
async fn https_sink() -> (
    String,
    String,
    std::sync::Arc<std::sync::atomic::AtomicUsize>,
) {
    use hyper_util::rt::TokioIo;
    use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    spoold::testing::install_crypto_provider();
    let certified = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let pem = certified.cert.pem();
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(
        certified.signing_key.serialize_der(),
    ));
    let config = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(vec![certified.cert.der().clone()], key)
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let served = Arc::new(AtomicUsize::new(0));
    let counter = served.clone();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let (acceptor, counter) = (acceptor.clone(), counter.clone());
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let service = hyper::service::service_fn(move |_req| {
                    counter.fetch_add(1, Ordering::SeqCst);
                    async {
                        Ok::<_, std::convert::Infallible>(hyper::Response::new(String::from(
                            "secure",
                        )))
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tls), service)
                    .await;
            });
        }
    });
    (format!("https://localhost:{port}/in"), pem, served)
}

#[tokio::test]
async fn https_to_a_self_signed_sink_works_once_its_certificate_is_trusted() {
    use std::sync::atomic::Ordering;
    let (url, pem, served) = https_sink().await;
    let dir = tempfile::tempdir().unwrap();
    let ca_file = dir.path().join("sink-ca.pem");
    std::fs::write(&ca_file, pem).unwrap();
    // TLS files are named in the config file only.
    let s = Server::start(
        &dir.path().join("spool"),
        &format!(
            "[queues.trusted]\ndestination = \"{url}\"\nca_file = \"{}\"\n\
             backoff = {{ initial = \"50ms\", multiplier = 1, max = \"60s\", jitter = 0 }}\n",
            ca_file.display()
        ),
    )
    .await;
    // Not trusted: the handshake fails and the message is retried.
    s.queue(
        "untrusted",
        json!({"destination": url, "backoff": fast_backoff()}),
    )
    .await;
    s.send("untrusted", "x").await;
    // The failure counts as soon as it is decided; its attempt record is
    // readable once durable: wait for the record.
    let error = common::eventually(
        "a failed TLS attempt",
        Duration::from_secs(10),
        async || {
            let peek = s.get_json("/v1/queues/untrusted/messages").await;
            peek["messages"][0]["lastError"]
                .as_str()
                .filter(|e| !e.is_empty())
                .map(str::to_lowercase)
        },
    )
    .await;
    assert_eq!(served.load(Ordering::SeqCst), 0);
    assert!(
        error.contains("certificate") || error.contains("connect"),
        "{error}"
    );

    s.send("trusted", "y").await;
    wait_until("delivered over TLS", async || {
        served.load(Ordering::SeqCst) == 1
    })
    .await;
    wait_until("acked", async || {
        s.get_json("/v1/queues/trusted").await["stats"]["deliveriesTotal"] == 1
    })
    .await;
    s.stop().await;
}

#[tokio::test]
async fn only_the_last_ten_attempts_are_kept() {
    let (sink, sink_url) = Sink::start().await;
    sink.script((0..100).map(|_| (503, vec![])));
    let s = Server::temp("").await;
    s.queue(
        "hooks",
        json!({"destination": sink_url, "maxRetries": 50, "breakerFailures": 100, "backoff": fast_backoff()}),
    )
    .await;
    s.send("hooks", "x").await;
    sink.wait_for(13).await;
    let peek = s.get_json("/v1/queues/hooks/messages").await;
    let m = &peek["messages"][0];
    let attempts = m["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 10, "{m}");
    assert!(
        attempts
            .iter()
            .all(|a| a["status"] == 503 && a["durationSeconds"].is_number())
    );
    assert!(m["retryCount"].as_u64().unwrap() >= 12);
    assert_eq!(m["lastStatus"], 503);
    s.stop().await;
}

/// A destination that misbehaves at the TCP level: the first connections
/// are reset, answered with garbage, or left hanging; later ones get a
/// proper 200.
async fn chaotic_sink() -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let served = Arc::new(AtomicUsize::new(0));
    let ok = served.clone();
    tokio::spawn(async move {
        let mut n = 0usize;
        loop {
            let Ok((mut sock, _)) = listener.accept().await else {
                return;
            };
            n += 1;
            let ok = ok.clone();
            let kind = n % 4;
            tokio::spawn(async move {
                let mut buf = vec![0u8; 65536];
                let _ = sock.read(&mut buf).await;
                match kind {
                    // Reset: close without answering.
                    1 => drop(sock),
                    // Garbage instead of HTTP.
                    2 => {
                        let _ = sock.write_all(b"\x00\x01garbage\r\n\r\n").await;
                    }
                    // Hang past the attempt timeout.
                    3 => tokio::time::sleep(Duration::from_secs(5)).await,
                    _ => {
                        ok.fetch_add(1, Ordering::SeqCst);
                        let _ = sock
                            .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok")
                            .await;
                    }
                }
            });
        }
    });
    (format!("http://{addr}/in"), served)
}

#[tokio::test]
async fn a_chaotic_destination_still_gets_everything_at_least_once() {
    use std::sync::atomic::Ordering;
    let (url, served) = chaotic_sink().await;
    let s = Server::temp("").await;
    s.queue(
        "hooks",
        json!({"destination": url, "timeoutSeconds": 0.5, "backoff": fast_backoff(), "breakerFailures": 1000, "maxRetries": 100}),
    )
    .await;
    for i in 0..12 {
        s.send("hooks", &format!("m{i}")).await;
    }
    wait_until("all delivered", async || {
        let st = s.get_json("/v1/queues/hooks").await["stats"].clone();
        st["visible"] == 0 && st["leased"] == 0 && st["delayed"] == 0
    })
    .await;
    assert!(
        served.load(Ordering::SeqCst) >= 12,
        "every message reached a healthy answer"
    );
    let stats = s.get_json("/v1/queues/hooks").await["stats"].clone();
    assert!(
        stats["deliveryFailuresTotal"].as_u64().unwrap() > 0,
        "the chaos was felt: {stats}"
    );
    assert_eq!(
        s.get_json("/v1/queues/hooks.failed").await["stats"]["visible"],
        0
    );
    s.stop().await;
}
