//! The API's edge against the binary, as an attacker on the pod or a web
//! page in the developer's browser would try it (docs/contract.md §4):
//! cross-site requests and DNS rebinding, secrets that must not follow a
//! moved destination, connection slots taken before authentication,
//! answers that grow with what senders stored, `/metrics` that names every
//! queue, unknown query parameters, and settings changed one at a time.
//!
//! `SPOOLD_TEST_BIN` runs these against another build (each failed on the
//! build before they were written).

use std::time::{Duration, Instant};

use crate::common::process::{Spoold, client, start_with};
use crate::common::raw::{connect, raw};
use crate::common::sink::Sink;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;

const KEY: &str = "edge-test-key-0123456789";

fn addr(spoold: &Spoold) -> String {
    spoold.base.trim_start_matches("http://").to_string()
}

async fn visible(spoold: &Spoold, queue: &str) -> u64 {
    spoold.api().get_json(&format!("/v1/queues/{queue}")).await["stats"]["visible"]
        .as_u64()
        .unwrap()
}

/// Finding 1: a web page can make the browser send requests to spoold
/// (no-cors `POST`, or a DNS name of its own that now resolves to
/// 127.0.0.1). Such requests are refused before they touch anything; the
/// probes still answer, and a same-origin caller (the console) passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cross_site_requests_and_foreign_hosts_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (_sink, sink_url) = Sink::start().await;
    let spoold = start_with(
        dir.path(),
        "",
        &format!("[queues.hooks]\ndestination = \"{sink_url}/in\"\n[queues.q]\n"),
    )
    .await;
    let to = addr(&spoold);
    let wait = Duration::from_secs(10);
    let forged = [
        // A no-cors form post from a page: the browser says cross-site.
        format!(
            "POST /v1/forward/hooks/x HTTP/1.1\r\nHost: {to}\r\nSec-Fetch-Site: cross-site\r\nOrigin: https://evil.example"
        ),
        // An older browser: only the foreign Origin says it.
        format!("POST /v1/forward/hooks/x HTTP/1.1\r\nHost: {to}\r\nOrigin: https://evil.example"),
        format!("POST /v1/queues/q/messages HTTP/1.1\r\nHost: {to}\r\nOrigin: null"),
        // Another site on the same host (another port) is another origin.
        format!("POST /v1/queues/q/messages HTTP/1.1\r\nHost: {to}\r\nSec-Fetch-Site: same-site"),
        // DNS rebinding: the attacker's name, now resolving to 127.0.0.1.
        "POST /v1/queues/q/messages HTTP/1.1\r\nHost: rebind.evil.example".to_string(),
    ];
    for head in &forged {
        let (status, body) = raw(&to, None, head, "forged", wait).await.unwrap();
        assert_eq!(status, 403, "{head}: {body}");
        assert!(body.contains("\"forbidden\""), "{body}");
    }
    // A rebound page reading: refused too.
    let read = "GET /v1/queues HTTP/1.1\r\nHost: rebind.evil.example:8787";
    assert_eq!(raw(&to, None, read, "", wait).await.unwrap().0, 403);
    let metrics = "GET /metrics HTTP/1.1\r\nHost: rebind.evil.example";
    assert_eq!(raw(&to, None, metrics, "", wait).await.unwrap().0, 403);
    assert_eq!(
        visible(&spoold, "hooks").await,
        0,
        "nothing forged was stored"
    );
    assert_eq!(visible(&spoold, "q").await, 0, "nothing forged was stored");

    // The probes answer whatever the name (a kubelet uses the pod's IP).
    for path in ["/healthz", "/readyz"] {
        let head = format!("GET {path} HTTP/1.1\r\nHost: 10.1.2.3:8787");
        assert_eq!(raw(&to, None, &head, "", wait).await.unwrap().0, 200);
    }
    // The console's own calls: same origin, loopback names.
    for host in [to.clone(), to.replace("127.0.0.1", "localhost")] {
        let head = format!(
            "POST /v1/queues/q/messages HTTP/1.1\r\nHost: {host}\r\nOrigin: http://{host}\r\nSec-Fetch-Site: same-origin"
        );
        let (status, body) = raw(&to, None, &head, "mine", wait).await.unwrap();
        assert_eq!(status, 201, "{host}: {body}");
    }
    assert_eq!(visible(&spoold, "q").await, 2);
}

/// Finding 2: the static `Authorization` header and the signing secret
/// are write-only, kept by a `PUT` that sends `"<redacted>"` (or omits the
/// secret). Moving the destination to another origin must not carry the
/// header along, nor drop the secret in silence: the move is refused
/// while a secret would be left behind (issue 38, finding 12), and with
/// `keepSecrets=true` the signing secret goes with it, the header never.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_do_not_follow_a_destination_to_another_origin() {
    let dir = tempfile::tempdir().unwrap();
    let (_good, good_url) = Sink::start().await;
    let (evil, evil_url) = Sink::start().await;
    let spoold = start_with(dir.path(), "", "").await;
    let api = spoold.api();
    let secret = "whsec_c2VjcmV0LXNpZ25pbmcta2V5LWJ5dGVz";
    let token = "Bearer t0k3n-for-the-good-host";
    api.queue(
        "hooks",
        json!({"destination": format!("{good_url}/in"), "headers": {"Authorization": token}, "signingSecret": secret}),
    )
    .await;
    // Paused, so that nothing is delivered to the good host meanwhile.
    assert_eq!(
        api.status(Method::POST, "/v1/queues/hooks/pause").await,
        StatusCode::NO_CONTENT
    );
    let body = json!({"destination": format!("{evil_url}/in"), "headers": {"Authorization": "<redacted>"}});
    let refused = api.put_queue("hooks", body.clone()).await;
    assert_eq!(refused.status(), StatusCode::CONFLICT);
    let moved = api
        .req(Method::PUT, "/v1/queues/hooks?keepSecrets=true")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(moved.status(), StatusCode::OK);
    let moved: Value = moved.json().await.unwrap();
    let warnings = moved["warnings"].to_string();
    assert!(
        warnings.contains("headers.Authorization"),
        "the answer says what was dropped: {moved}"
    );
    assert_eq!(moved["settings"]["signingSecretSet"], true, "{moved}");
    api.send("hooks", "event").await;
    api.status(Method::POST, "/v1/queues/hooks/resume").await;
    let got = &evil.wait_for(1).await[0];
    assert!(
        !got.headers.contains_key("authorization"),
        "the credential reached the new host: {:?}",
        got.headers
    );
    assert!(
        got.headers.contains_key("webhook-signature"),
        "kept: signed"
    );
    // Within one origin, nothing is dropped.
    let same = api
        .put_queue(
            "hooks",
            json!({"destination": format!("{evil_url}/other"), "headers": {"X-Kept": "value-1"}, "signingSecret": secret}),
        )
        .await;
    assert_eq!(same.status(), StatusCode::OK);
    let again = api
        .put_queue(
            "hooks",
            json!({"destination": format!("{evil_url}/third"), "headers": {"X-Kept": "<redacted>"}}),
        )
        .await;
    let again: Value = again.json().await.unwrap();
    assert!(again.get("warnings").is_none(), "{again}");
    assert_eq!(again["settings"]["signingSecretSet"], true, "{again}");
    assert_eq!(again["settings"]["headers"]["X-Kept"], "<redacted>");
}

/// Finding 3: 4 200 idle connections took every slot before sending a
/// byte, and `/healthz` timed out. Idle connections take no slot now; one
/// address cannot take them all; a probe is answered even when they are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_and_slow_connections_do_not_starve_probes_or_other_clients() {
    // Room for two floods of 4 200 sockets in this process, and in the
    // server it starts.
    let _ = rlimit::increase_nofile_limit(20_000);
    let dir = tempfile::tempdir().unwrap();
    let spoold = start_with(dir.path(), "", "[queues.q]\n").await;
    let to = addr(&spoold);
    const FLOOD: usize = 4200;
    let mut idle = Vec::with_capacity(FLOOD);
    for _ in 0..FLOOD {
        match connect(&to, None).await {
            Ok(s) => idle.push(s),
            Err(e) => panic!("connect {}: {e}", idle.len()),
        }
    }
    // The probes, from the flooding address and from another (a kubelet).
    let probe = |from: Option<&'static str>| {
        let to = to.clone();
        async move {
            let head = "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1";
            raw(&to, from, head, "", Duration::from_secs(2)).await
        }
    };
    let mut answered = 0;
    for i in 0..10 {
        let from = if i % 2 == 0 { None } else { Some("127.0.0.2") };
        if probe(from).await.is_some_and(|(s, _)| s == 200) {
            answered += 1;
        }
    }
    assert_eq!(
        answered, 10,
        "probes answered under {FLOOD} idle connections"
    );
    let send = "POST /v1/queues/q/messages HTTP/1.1\r\nHost: 127.0.0.1";
    let sent = raw(
        &to,
        Some("127.0.0.2"),
        send,
        "other client",
        Duration::from_secs(5),
    )
    .await;
    assert_eq!(sent.map(|(s, _)| s), Some(201));
    drop(idle);

    // Slow clients: each sent a first byte and never finishes its headers.
    // One address holds at most half the slots; the others' stay free.
    let mut slow = Vec::with_capacity(FLOOD);
    for _ in 0..FLOOD {
        let mut s = connect(&to, None).await.unwrap();
        s.write_all(b"POST /v1/queues/q/messages HTTP/1.1\r\nX-Slow: ")
            .await
            .unwrap();
        slow.push(s);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let started = Instant::now();
    let sent = raw(
        &to,
        Some("127.0.0.3"),
        send,
        "third client",
        Duration::from_secs(5),
    )
    .await;
    assert_eq!(
        sent.map(|(s, _)| s),
        Some(201),
        "after {:?}",
        started.elapsed()
    );
    for from in [None, Some("127.0.0.4")] {
        assert_eq!(probe(from).await.map(|(s, _)| s), Some(200), "{from:?}");
    }
    drop(slow);
}

/// Finding 4: a peek rendered its whole page in memory; 1 000 bodies of
/// NUL bytes (six bytes each in JSON) made one answer of gigabytes. An
/// answer is bounded by bytes now, and `next` continues it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peek_is_bounded_by_bytes_and_pages_on() {
    const BODIES: usize = 24;
    const BODY: usize = 1 << 20;
    let dir = tempfile::tempdir().unwrap();
    let spoold = start_with(dir.path(), "max_body_bytes = \"2MiB\"", "[queues.q]\n").await;
    let c = client();
    let mut ids = std::collections::BTreeSet::new();
    for _ in 0..BODIES {
        let r = c
            .post(format!("{}/v1/queues/q/messages", spoold.base))
            .body(vec![0u8; BODY])
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::CREATED);
        ids.insert(
            r.json::<Value>().await.unwrap()["id"]
                .as_str()
                .unwrap()
                .to_string(),
        );
    }
    let mut seen = std::collections::BTreeSet::new();
    let mut after = String::new();
    let mut pages = 0;
    loop {
        let url = format!("{}/v1/queues/q/messages?limit=1000{after}", spoold.base);
        let text = c.get(url).send().await.unwrap().text().await.unwrap();
        pages += 1;
        // A page ends past 4 MiB, with one whole message at most beyond.
        assert!(
            text.len() < (4 << 20) + 8 * BODY,
            "one answer of {} bytes",
            text.len()
        );
        let page: Value = serde_json::from_str(&text).unwrap();
        for m in page["messages"].as_array().unwrap() {
            assert!(
                seen.insert(m["id"].as_str().unwrap().to_string()),
                "shown twice"
            );
        }
        match page["next"].as_str() {
            Some(next) => after = format!("&after={next}"),
            None => break,
        }
        assert!(pages <= BODIES + 1, "the pages never end");
    }
    assert_eq!(seen, ids, "every message, once, over {pages} pages");
    assert!(pages > 1);
}

/// Finding 6: with keys set, `/metrics` on the API port named every queue
/// to anyone; with many queues one scrape grew without bound. The key is
/// needed there now (the metrics listener stays open for Prometheus), and
/// queues past the first thousand share one series.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_need_the_key_on_the_api_port_and_stay_bounded() {
    const QUEUES: usize = 1100;
    let dir = tempfile::tempdir().unwrap();
    let metrics_port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let tables: String = (0..QUEUES).map(|i| format!("[queues.q{i:04}]\n")).collect();
    let spoold = start_with(
        dir.path(),
        &format!("api_keys = [\"{KEY}\"]\nmetrics_listen = \"127.0.0.1:{metrics_port}\""),
        &tables,
    )
    .await;
    let c = client();
    let anonymous = c
        .get(format!("{}/metrics", spoold.base))
        .send()
        .await
        .unwrap();
    assert_eq!(anonymous.status(), StatusCode::UNAUTHORIZED);
    let with_key = c
        .get(format!("{}/metrics", spoold.base))
        .bearer_auth(KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(with_key.status(), StatusCode::OK);
    let text = with_key.text().await.unwrap();
    let open = c
        .get(format!("http://127.0.0.1:{metrics_port}/metrics"))
        .send()
        .await
        .unwrap();
    assert_eq!(
        open.status(),
        StatusCode::OK,
        "the metrics listener needs no key"
    );
    let labels: std::collections::BTreeSet<&str> = text
        .lines()
        .filter(|l| l.starts_with("spoold_queue_messages{"))
        .filter_map(|l| l.split("queue=\"").nth(1)?.split('"').next())
        .collect();
    assert!(
        labels.len() <= 1001,
        "{} queue labels in one scrape",
        labels.len()
    );
    assert!(labels.contains("(other)"), "the rest are summed");
    println!("{QUEUES} queues: one scrape is {} bytes", text.len());
}

/// Finding 10: a parameter a route does not take was ignored: `?q=cus_3`
/// listed everything, a misspelt `?dryrun=true` purged for real.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_query_parameters_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let spoold = start_with(dir.path(), "", "[queues.q]\n").await;
    let api = spoold.api();
    api.send("q", "keep me").await;
    for (method, path, name) in [
        (Method::GET, "/v1/queues?q=cus_3", "q"),
        (
            Method::DELETE,
            "/v1/queues/q/messages?dryrun=true",
            "dryrun",
        ),
        (Method::GET, "/v1/queues/q/messages?limt=5", "limt"),
        (Method::POST, "/v1/queues/q/receive?wiat=5", "wiat"),
    ] {
        let r = api.call(method.clone(), path).await;
        assert_eq!(r.status(), StatusCode::BAD_REQUEST, "{method} {path}");
        let body: Value = r.json().await.unwrap();
        assert_eq!(body["kind"], "bad_request");
        assert!(
            body["message"]
                .as_str()
                .unwrap()
                .contains(&format!("\"{name}\"")),
            "{body}"
        );
    }
    assert_eq!(visible(&spoold, "q").await, 1, "nothing was purged");
    // What a route takes still works.
    let r = api
        .call(Method::DELETE, "/v1/queues/q/messages?dryRun=true")
        .await;
    assert_eq!(r.status(), StatusCode::OK);
}

/// Finding 9: `PUT` replaces every setting, so changing the destination
/// alone reset `breakerFailures` and the backoff. `PATCH` (RFC 7396)
/// changes what it names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn patch_changes_only_the_settings_it_names() {
    let dir = tempfile::tempdir().unwrap();
    let spoold = start_with(dir.path(), "", "").await;
    let api = spoold.api();
    api.queue(
        "hooks",
        json!({"destination": "http://127.0.0.1:9/a", "breakerFailures": 1000,
               "backoff": {"initialSeconds": 2, "maxSeconds": 600}, "headers": {"X-Token": "t0k3n"},
               "signingSecret": "whsec_c2VjcmV0LXNpZ25pbmcta2V5LWJ5dGVz"}),
    )
    .await;
    let patch = |body: Value| {
        api.req(Method::PATCH, "/v1/queues/hooks")
            .header("Content-Type", "application/merge-patch+json")
            .body(body.to_string())
            .send()
    };
    let r = patch(json!({"destination": "http://127.0.0.1:9/b", "backoff": {"maxSeconds": 60}}))
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let q: Value = r.json().await.unwrap();
    let s = &q["settings"];
    assert_eq!(s["destination"], "http://127.0.0.1:9/b");
    assert_eq!(s["breakerFailures"], 1000, "{q}");
    assert_eq!(s["backoff"]["initialSeconds"], 2.0, "{q}");
    assert_eq!(s["backoff"]["maxSeconds"], 60.0, "{q}");
    assert_eq!(s["headers"]["X-Token"], "<redacted>", "{q}");
    assert_eq!(s["signingSecretSet"], true, "{q}");
    // `null` resets; the secret is cleared by name.
    let q: Value = patch(json!({"breakerFailures": null, "signingSecret": null}))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(q["settings"]["breakerFailures"], 10, "{q}");
    assert_eq!(q["settings"]["signingSecretSet"], false, "{q}");
    // A typo is refused, naming the field; nothing changes.
    let r = patch(json!({"breakerFailurs": 5})).await.unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    assert!(r.text().await.unwrap().contains("breakerFailurs"));
    // A queue that does not exist is not created by a patch.
    let r = api
        .req(Method::PATCH, "/v1/queues/nope")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
}
