//! Push delivery with the real binary: `kill -9` while delivering to a slow
//! sink loses nothing accepted, and SIGTERM gives deliveries in flight the
//! grace period (or, with `drain_on_shutdown`, the whole backlog).

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::common::otlp::{attribute, hex, otlp_receiver};
use crate::common::process::{client, queue_json, start_with};
use crate::common::sink::Sink;
use reqwest::{Client, StatusCode};

fn hooks_queue(sink_url: &str, extra: &str) -> String {
    format!("[queues.hooks]\ndestination = \"{sink_url}/in\"\n{extra}\n")
}

async fn forward(client: &Client, base: &str, n: usize) -> String {
    let r = client
        .post(format!("{base}/v1/forward/hooks/item/{n}"))
        .body(format!("message {n}"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::ACCEPTED);
    r.headers()["spooler-delivery-id"]
        .to_str()
        .unwrap()
        .to_string()
}

fn delivered_ids(sink: &Sink) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for r in sink.seen() {
        let id = r.headers["spooler-delivery-id"]
            .to_str()
            .unwrap()
            .to_string();
        *counts.entry(id).or_insert(0) += 1;
    }
    counts
}

async fn wait_delivered(sink: &Sink, ids: &BTreeSet<String>, within: Duration) {
    common::eventually(
        &format!("all {} accepted messages to reach the sink", ids.len()),
        within,
        async || {
            let seen = delivered_ids(sink);
            ids.iter().all(|id| seen.contains_key(id)).then_some(())
        },
    )
    .await
}

fn sigterm(pid: u32) {
    let status = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_while_delivering_loses_no_accepted_message() {
    let (sink, sink_url) = Sink::start_slow(Duration::from_millis(40)).await;
    let dir = tempfile::tempdir().unwrap();
    let client = client();
    let queue = hooks_queue(&sink_url, "concurrency = 4");
    let mut spoold = start_with(dir.path(), "", &queue).await;
    let mut accepted = BTreeSet::new();
    for n in 0..150 {
        accepted.insert(forward(&client, &spoold.base, n).await);
    }
    // Some are delivered, some in flight, most still queued.
    common::wait_until("the first deliveries", async || {
        delivered_ids(&sink).len() >= 8
    })
    .await;
    spoold.child.kill().unwrap();
    spoold.child.wait().unwrap();
    let before_restart = delivered_ids(&sink).len();

    let _spoold = start_with(dir.path(), "", &queue).await;
    wait_delivered(&sink, &accepted, Duration::from_secs(60)).await;
    let counts = delivered_ids(&sink);
    let duplicates: usize = counts.values().map(|c| c - 1).sum();
    println!(
        "kill -9 while delivering: {} accepted (202), {before_restart} delivered before the kill, \
         all {} delivered after restart, {duplicates} duplicate deliveries (at least once)",
        accepted.len(),
        counts.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_gives_a_delivery_in_flight_its_grace_period() {
    let (sink, sink_url) = Sink::start_slow(Duration::from_millis(1500)).await;
    let dir = tempfile::tempdir().unwrap();
    let client = client();
    let queue = hooks_queue(&sink_url, "timeout = \"10s\"");
    let mut spoold = start_with(dir.path(), "shutdown_grace = \"5s\"", &queue).await;
    let id = forward(&client, &spoold.base, 1).await;
    // Wait until the request is at the sink (in flight).
    common::eventually(
        "the request at the sink",
        Duration::from_secs(10),
        async || (!sink.seen().is_empty()).then_some(()),
    )
    .await;
    let stopping = Instant::now();
    sigterm(spoold.child.id());
    let status = spoold.child.wait().unwrap();
    let took = stopping.elapsed();
    assert_eq!(status.code(), Some(0));
    assert!(
        took < Duration::from_secs(5),
        "stopped within the grace period ({took:?})"
    );
    // The delivery finished and was acked before the exit.
    let spoold = start_with(dir.path(), "", &queue).await;
    // Replay is done before the API answers: nothing visible, leased or
    // delayed means nothing is left to deliver again (no waiting to see).
    let stats = queue_json(&client, &spoold.base, "hooks").await;
    for state in ["visible", "leased", "delayed"] {
        assert_eq!(stats["stats"][state], 0, "acked before exit: {stats}");
    }
    assert_eq!(delivered_ids(&sink)[&id], 1, "delivered once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_grace_period_a_delivery_is_released_without_a_retry() {
    let (sink, sink_url) = Sink::start_slow(Duration::from_secs(8)).await;
    let dir = tempfile::tempdir().unwrap();
    let client = client();
    let queue = hooks_queue(&sink_url, "timeout = \"20s\"");
    let mut spoold = start_with(dir.path(), "shutdown_grace = \"500ms\"", &queue).await;
    forward(&client, &spoold.base, 1).await;
    common::eventually(
        "the request at the sink",
        Duration::from_secs(10),
        async || (!sink.seen().is_empty()).then_some(()),
    )
    .await;
    let stopping = Instant::now();
    sigterm(spoold.child.id());
    assert_eq!(spoold.child.wait().unwrap().code(), Some(0));
    assert!(
        stopping.elapsed() < Duration::from_secs(4),
        "did not wait for the slow sink"
    );
    let _spoold = start_with(dir.path(), "", &queue).await;
    common::eventually("a redelivery", Duration::from_secs(20), async || {
        (sink.seen().len() >= 2).then_some(())
    })
    .await;
    let retry = sink.seen()[1].headers["spooler-retry-count"]
        .to_str()
        .unwrap()
        .to_string();
    assert_eq!(retry, "0", "a shutdown is not the consumer's failure");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_on_shutdown_delivers_the_backlog_first() {
    let (sink, sink_url) = Sink::start_slow(Duration::from_millis(30)).await;
    let dir = tempfile::tempdir().unwrap();
    let client = client();
    let queue = hooks_queue(&sink_url, "concurrency = 1");
    let mut spoold = start_with(
        dir.path(),
        "shutdown_grace = \"30s\"\ndrain_on_shutdown = true",
        &queue,
    )
    .await;
    let mut accepted = BTreeSet::new();
    for n in 0..30 {
        accepted.insert(forward(&client, &spoold.base, n).await);
    }
    sigterm(spoold.child.id());
    assert_eq!(spoold.child.wait().unwrap().code(), Some(0));
    let seen = delivered_ids(&sink);
    let missing = accepted.iter().filter(|id| !seen.contains_key(*id)).count();
    assert_eq!(missing, 0, "the backlog was delivered before the exit");
}

/// Issue 26, finding 8: the breaker's probe kept the queue's old settings,
/// so after the destination was fixed it went on probing the old URL,
/// `resume` answered 204 and did nothing, and only a restart delivered.
/// Now a settings change reaches the probe, `resume` closes an open
/// breaker, "probe now" and "close" act at once, and stats and metrics
/// tell the breaker from an operator's pause. The log says statuses as
/// numbers (`status=500`, never `Some(500)`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_breaker_heals_when_the_destination_is_fixed_and_obeys_the_operator() {
    use reqwest::Method;
    use serde_json::{Value, json};
    let dir = tempfile::tempdir().unwrap();
    let (broken, broken_url) = Sink::start().await;
    broken.script(std::iter::repeat_n((500, vec![]), 1000));
    let (fixed, fixed_url) = Sink::start().await;
    let spoold = start_with(dir.path(), "", "").await;
    let api = spoold.api();
    let settings = |url: &str| {
        json!({"destination": format!("{url}/in"), "breakerFailures": 2, "concurrency": 1,
               "backoff": {"initialSeconds": 0.05, "multiplier": 1, "maxSeconds": 1, "jitter": 0}})
    };
    let stats = async || api.get_json("/v1/queues/hooks").await["stats"].clone();
    let open = |st: &Value| {
        st["breakerOpen"] == true || (st["paused"] == true && st["nextProbeAt"].is_string())
    };
    api.queue("hooks", settings(&broken_url)).await;
    for i in 0..3 {
        api.send("hooks", &format!("m{i}")).await;
    }
    common::wait_until("the breaker opens", async || open(&stats().await)).await;

    // Fixed by a PUT: the probe uses the new destination, long before the
    // old probe would have given up.
    let r = api.put_queue("hooks", settings(&fixed_url)).await;
    assert_eq!(r.status(), StatusCode::OK);
    fixed.wait_for(3).await;
    common::wait_until("the breaker closes", async || !open(&stats().await)).await;

    // `resume` on an open breaker closes it and delivers at once: before
    // the probe that was due.
    let (flaky, flaky_url) = Sink::start().await;
    flaky.script([(500, vec![]), (500, vec![])]);
    api.put_queue("hooks", settings(&flaky_url)).await;
    // The change is told to the dispatchers before the `PUT` answers, and
    // ahead of the sends' wake-ups (`Core::queue_changed`): the messages
    // below go to the new destination without a wait.
    for i in 0..3 {
        api.send("hooks", &format!("r{i}")).await;
    }
    common::wait_until("the breaker opens again", async || open(&stats().await)).await;
    let due = stats().await["nextProbeAt"].as_str().unwrap().to_string();
    let due = spoold::time::parse_rfc3339(&due).unwrap();
    assert_eq!(
        api.status(Method::POST, "/v1/queues/hooks/resume").await,
        StatusCode::NO_CONTENT
    );
    let seen = flaky.wait_for(5).await;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    assert!(
        now < due,
        "delivered by resume, not by the probe due at {due}"
    );
    assert_eq!(seen.len(), 5);

    // "Probe now" and "close", from the API.
    let (third, third_url) = Sink::start().await;
    third.script([(500, vec![]), (500, vec![])]);
    api.put_queue("hooks", settings(&third_url)).await;
    for i in 0..2 {
        api.send("hooks", &format!("p{i}")).await;
    }
    common::wait_until("opened by the third", async || open(&stats().await)).await;
    let before = third.seen().len();
    let r = api
        .call(Method::POST, "/v1/queues/hooks/breaker/probe")
        .await;
    assert_eq!(r.status(), StatusCode::OK);
    third.wait_for(before + 1).await;
    common::wait_until("closed by the probe", async || !open(&stats().await)).await;
    third.script([(500, vec![]), (500, vec![])]);
    api.send("hooks", "c0").await;
    api.send("hooks", "c1").await;
    common::wait_until("opened once more", async || open(&stats().await)).await;
    let r = api
        .call(Method::POST, "/v1/queues/hooks/breaker/close")
        .await;
    assert_eq!(r.status(), StatusCode::OK);
    let q: Value = r.json().await.unwrap();
    assert_eq!(q["stats"]["breakerOpen"], false, "{q}");

    // An operator's pause is not the breaker's.
    api.status(Method::POST, "/v1/queues/hooks/pause").await;
    let st = stats().await;
    assert_eq!(
        (st["paused"].clone(), st["breakerOpen"].clone()),
        (json!(true), json!(false))
    );
    let metrics = api.text("/metrics").await;
    assert!(
        metrics.contains("spoold_queue_paused{queue=\"hooks\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("spoold_queue_breaker_open{queue=\"hooks\"} 0"),
        "{metrics}"
    );

    let log = spoold.log();
    assert!(log.contains("status=500"), "{log}");
    assert!(
        !log.contains("Some("),
        "a Rust debug value in the log: {log}"
    );
}

/// Traces across the hop, exported to a real OTLP receiver: the API call
/// continues the caller's trace, its fsync wait is its child, the delivery
/// attempt is the call's child, and the destination gets the attempt's
/// own `traceparent`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_send_and_its_delivery_are_spans_of_the_callers_trace() {
    let (spans, collector) = otlp_receiver().await;
    let (sink, sink_url) = Sink::start().await;
    let dir = tempfile::tempdir().unwrap();
    let tables = format!(
        "[telemetry]\notlp_endpoint = \"{collector}\"\nservice_name = \"spoold-test\"\n{}",
        hooks_queue(&sink_url, "")
    );
    let spoold = start_with(dir.path(), "", &tables).await;
    let trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let caller = "00f067aa0ba902b7";
    let r = client()
        .post(format!("{}/v1/queues/hooks/messages", spoold.base))
        .header("traceparent", format!("00-{trace}-{caller}-01"))
        .body("traced")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    let seen = sink.wait_for(1).await;
    let sent = seen[0].headers["traceparent"].to_str().unwrap().to_owned();
    let parts: Vec<&str> = sent.split('-').collect();
    assert_eq!(
        parts[1], trace,
        "the destination continues the trace: {sent}"
    );

    let find = |name: &str| {
        spans
            .lock()
            .unwrap()
            .iter()
            .find(|(_, s)| s.name == name)
            .cloned()
    };
    let names = [
        "POST /v1/queues/{q}/messages",
        "journal.fsync",
        "delivery.attempt",
    ];
    common::eventually(
        "the spans at the collector",
        Duration::from_secs(20),
        async || names.iter().all(|n| find(n).is_some()).then_some(()),
    )
    .await;
    let (service, request) = find(names[0]).unwrap();
    let (_, fsync) = find(names[1]).unwrap();
    let (_, attempt) = find(names[2]).unwrap();
    assert!(service.contains("spoold-test"), "{service}");
    for s in [&request, &fsync, &attempt] {
        assert_eq!(hex(&s.trace_id), trace, "{}", s.name);
    }
    assert_eq!(
        hex(&request.parent_span_id),
        caller,
        "the call is the caller's child"
    );
    assert_eq!(
        fsync.parent_span_id, request.span_id,
        "the fsync wait is the call's"
    );
    assert_eq!(
        attempt.parent_span_id, request.span_id,
        "the attempt is the call's"
    );
    assert_eq!(
        parts[2],
        hex(&attempt.span_id),
        "the destination's parent is the attempt"
    );
}

/// Traces across the event hop: a `traceparent` sent with `POST
/// /v1/events` is the parent of the call, and the call of every
/// delivery's attempt, each carrying its delivery id, the HTTP status and
/// the destination's address (OpenTelemetry's HTTP client attributes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_events_deliveries_are_spans_of_the_publishers_trace() {
    let (spans, collector) = otlp_receiver().await;
    let (sink, sink_url) = Sink::start().await;
    let dir = tempfile::tempdir().unwrap();
    let tables = format!(
        "[telemetry]\notlp_endpoint = \"{collector}\"\nservice_name = \"spoold-test\"\n\
         [queues.a]\ndestination = \"{sink_url}/a\"\nevents = [\"order.*\"]\n\
         [queues.b]\ndestination = \"{sink_url}/b\"\nevents = [\"order.*\"]\n"
    );
    let spoold = start_with(dir.path(), "", &tables).await;
    let trace = "0af7651916cd43dd8448eb211c80319c";
    let caller = "b7ad6b7169203331";
    let r = client()
        .post(format!("{}/v1/events", spoold.base))
        .header("traceparent", format!("00-{trace}-{caller}-01"))
        .json(&serde_json::json!({"type": "order.created", "payload": {"n": 1}}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::ACCEPTED);
    let answer: serde_json::Value = r.json().await.unwrap();
    let ids: BTreeSet<String> = answer["deliveries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(ids.len(), 2, "{answer}");
    for seen in sink.wait_for(2).await {
        let sent = seen.headers["traceparent"].to_str().unwrap().to_owned();
        assert_eq!(sent.split('-').nth(1), Some(trace), "{sent}");
    }
    let all = || spans.lock().unwrap().clone();
    let (request, attempts) = common::eventually(
        "the spans at the collector",
        Duration::from_secs(20),
        async || {
            let all = all();
            let request = all.iter().find(|(_, s)| s.name == "POST /v1/events")?;
            let attempts: Vec<_> = all
                .iter()
                .filter(|(_, s)| s.name == "delivery.attempt")
                .map(|(_, s)| s.clone())
                .collect();
            (attempts.len() == 2).then(|| (request.1.clone(), attempts))
        },
    )
    .await;
    assert_eq!(hex(&request.trace_id), trace);
    assert_eq!(
        hex(&request.parent_span_id),
        caller,
        "the call is the publisher's child"
    );
    let mut attempt_ids = BTreeSet::new();
    for attempt in &attempts {
        assert_eq!(hex(&attempt.trace_id), trace, "one trace");
        assert_eq!(
            attempt.parent_span_id, request.span_id,
            "each attempt is the publishing call's child"
        );
        assert_eq!(
            attribute(attempt, "http.response.status_code").as_deref(),
            Some("200")
        );
        assert_eq!(
            attribute(attempt, "server.address").as_deref(),
            Some("127.0.0.1")
        );
        assert_eq!(
            attribute(attempt, "http.request.method").as_deref(),
            Some("POST")
        );
        attempt_ids.insert(attribute(attempt, "spoold.delivery.id").unwrap());
    }
    assert_eq!(attempt_ids, ids, "each attempt names its delivery");
}

/// Issue 42: a proxy from the environment (`http_proxy`, as curl and
/// reqwest read it) carries every plain-HTTP delivery, whichever
/// `delivery.plain_http_client` says: the direct way steps aside for it
/// (`src/delivery/direct.rs`, `origin`), and reqwest sends the request in
/// absolute form to the proxy. The destination's name is never resolved
/// here: only the proxy could reach it.
#[tokio::test]
async fn a_proxy_from_the_environment_carries_plain_http_deliveries_both_ways() {
    use crate::common::process::{run_command, start_command, write_config};
    for client in ["direct", "pooled"] {
        let (proxy, proxy_url) = Sink::start().await;
        let dir = tempfile::tempdir().unwrap();
        let config = write_config(
            dir.path(),
            "",
            "segment_bytes = \"1MiB\"",
            &format!(
                "[delivery]\nplain_http_client = \"{client}\"\n\
                 [queues.hooks]\ndestination = \"http://hooks.example.test/in\"\n"
            ),
        );
        let spoold = start_command(
            run_command(&config)
                .env("http_proxy", &proxy_url)
                .env_remove("no_proxy")
                .env_remove("NO_PROXY"),
        )
        .await;
        spoold.api().send("hooks", "through the proxy").await;
        let seen = proxy.wait_for(1).await;
        assert_eq!(seen[0].uri, "http://hooks.example.test/in", "{client}");
        assert_eq!(&seen[0].body[..], b"through the proxy", "{client}");
    }
}
