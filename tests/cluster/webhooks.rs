//! The webhook parts of issue 40 on three replicas: a signing-secret
//! rotation, operational events, ordering keys, the delivery log and the
//! event's trace (at a real OTLP receiver), each decided on one primary and holding on the next
//! after a failover (content filters: `filters.rs`; ordering under the
//! nemesis: `nemesis.rs`).

use std::collections::BTreeMap;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::common::cluster::TestCluster;
use crate::common::eventually;
use crate::common::otlp::{attribute, hex, otlp_receiver};
use crate::common::process::client;
use crate::common::sink::Sink;

/// Each event's trace id: this, then its number in 8 hex digits.
const TRACE: &str = "0af7651916cd43dd8448eb21";
const FIRST: &str = "whsec_Y2x1c3Rlci1maXJzdC1zZWNyZXQtYnl0ZXM=";

/// `method path` at `base` (retried across an election): status and JSON.
async fn call(
    method: reqwest::Method,
    base: &str,
    path: &str,
    body: Option<Value>,
) -> (StatusCode, Value) {
    for _ in 0..100 {
        let mut request = client()
            .request(method.clone(), format!("{base}{path}"))
            .timeout(Duration::from_secs(5));
        if let Some(body) = &body {
            request = request.json(body);
        }
        if let Ok(r) = request.send().await {
            let status = r.status();
            if status != StatusCode::SERVICE_UNAVAILABLE
                && status != StatusCode::MISDIRECTED_REQUEST
            {
                return (status, r.json().await.unwrap_or(Value::Null));
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("no answer to {method} {path} from {base}");
}

/// The operational events in pull queue `ops` at `base`: type → count.
async fn told(base: &str) -> BTreeMap<String, usize> {
    let (_, page) = call(
        reqwest::Method::GET,
        base,
        "/v1/queues/ops/messages?limit=1000",
        None,
    )
    .await;
    let mut out = BTreeMap::new();
    for m in page["messages"].as_array().into_iter().flatten() {
        *out.entry(m["eventType"].as_str().unwrap_or_default().to_owned())
            .or_default() += 1;
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotation_operational_events_ordering_and_the_log_hold_across_a_failover() {
    let (sink, sink_url) = Sink::start().await;
    // The first delivery fails (to the failure queue: max 0 retries).
    sink.script([(500, Vec::new())]);
    let (spans, collector) = otlp_receiver().await;
    let tables = format!(
        "[telemetry]\notlp_endpoint = \"{collector}\"\n[events]\nhistory_retention = \"1h\"\n\
         [queues.ops]\nevents = [\"spoold.>\"]\n"
    );
    let tables = tables.as_str();
    let mut cluster = TestCluster::new(3, "", tables);
    cluster.start_all().await;
    let primary = cluster.primary(Duration::from_secs(10)).await;
    let base = cluster.replicas[primary].base();
    let hooks = json!({"destination": sink_url, "events": ["invoice.*"], "signingSecret": FIRST,
                       "maxRetries": 0, "ordering": "per_key"});
    let (status, answer) = call(reqwest::Method::PUT, &base, "/v1/queues/hooks", Some(hooks)).await;
    assert_eq!(status, StatusCode::CREATED, "{answer}");
    assert_eq!(
        answer["settings"]["historyRetentionSeconds"], 3600.0,
        "{answer}"
    );
    let (status, rotated) = call(
        reqwest::Method::POST,
        &base,
        "/v1/queues/hooks/secret/rotate",
        Some(json!({"overlapSeconds": 1800})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{rotated}");
    let publish = |base: String, n: u32| async move {
        let event = json!({"type": "invoice.paid", "orderingKey": "acct-1", "payload": {"n": n}});
        let r = client()
            .post(format!("{base}/v1/events"))
            .header(
                "traceparent",
                format!("00-{TRACE}{n:08x}-b7ad6b7169203331-01"),
            )
            .json(&event)
            .timeout(Duration::from_secs(5))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::ACCEPTED);
    };
    publish(base.clone(), 1).await;
    sink.wait_for(1).await;
    let got = eventually(
        "the first primary's events",
        Duration::from_secs(30),
        async || {
            let got = told(&base).await;
            (got.contains_key("spoold.message.failed")
                && got.contains_key("spoold.endpoint.secret_expiring"))
            .then_some(got)
        },
    )
    .await;
    assert_eq!(got["spoold.message.failed"], 1, "{got:?}");

    // A failover: the next primary signs with both secrets, delivers the
    // key's events in order, and tells of the next failure.
    cluster.kill(primary);
    let next = cluster.primary(Duration::from_secs(15)).await;
    let base = cluster.replicas[next].base();
    for n in 2..=3 {
        publish(base.clone(), n).await;
    }
    let seen = sink.wait_for(3).await;
    let bodies: Vec<String> = seen[1..]
        .iter()
        .map(|s| String::from_utf8_lossy(&s.body).into_owned())
        .collect();
    assert_eq!(bodies, [r#"{"n":2}"#, r#"{"n":3}"#], "one key, in order");
    for s in &seen[1..] {
        let signatures = s.headers["webhook-signature"].to_str().unwrap();
        assert_eq!(
            signatures.split(' ').count(),
            2,
            "both secrets sign: {signatures}"
        );
        assert_eq!(s.headers["spooler-ordering-key"], "acct-1");
    }

    // The next primary's attempts continue each event's trace, children
    // of the call that published it.
    for n in 2..=3u32 {
        let trace = format!("{TRACE}{n:08x}");
        let (call_span, attempt) = eventually(
            "the spans at the collector",
            Duration::from_secs(20),
            async || {
                let all = spans.lock().unwrap().clone();
                let of_trace = |name: &str| {
                    all.iter()
                        .map(|(_, s)| s)
                        .find(|s| s.name == name && hex(&s.trace_id) == trace)
                        .cloned()
                };
                Some((of_trace("POST /v1/events")?, of_trace("delivery.attempt")?))
            },
        )
        .await;
        assert_eq!(attempt.parent_span_id, call_span.span_id, "event {n}");
        assert_eq!(
            attribute(&attempt, "http.response.status_code").as_deref(),
            Some("200")
        );
    }

    // The log on the next primary: two delivered, the first failed.
    let log = eventually(
        "the log on the next primary",
        Duration::from_secs(10),
        async || {
            let (_, page) = call(
                reqwest::Method::GET,
                &base,
                "/v1/queues/hooks/deliveries",
                None,
            )
            .await;
            let states: Vec<String> = page["deliveries"]
                .as_array()?
                .iter()
                .map(|d| d["state"].as_str().unwrap().to_owned())
                .collect();
            (states == ["delivered", "delivered", "failed"]).then_some(page)
        },
    )
    .await;
    assert_eq!(log["deliveries"][2]["lastStatus"], 500, "{log}");
    // Every replica's state holds the same message.failed the first
    // primary published, once.
    cluster.start(primary);
    for i in 0..3 {
        crate::common::process::wait_ready(cluster.replicas[i].process.as_ref().unwrap()).await;
    }
    let got = told(&base).await;
    assert_eq!(got.get("spoold.message.failed"), Some(&1), "{got:?}");
}
