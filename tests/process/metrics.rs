//! `/metrics` of the real binary (its own process, so its registry holds
//! only its own numbers): every name of docs/contract.md §8 with HELP text, values that
//! follow what happened, and `promtool check metrics` on the scrape (ignored
//! without promtool; `.ci/run` installs it and runs it).

use crate::common;

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::common::process::start_with;
use crate::common::sink::Sink;

const NAMES: &[&str] = &[
    "spoold_messages_sent_total",
    "spoold_messages_acked_total",
    "spoold_messages_retried_total",
    "spoold_messages_failed_total",
    "spoold_messages_expired_total",
    "spoold_messages_deduplicated_total",
    "spoold_queue_messages",
    "spoold_queue_oldest_message_age_seconds",
    "spoold_deliveries_total",
    "spoold_delivery_duration_seconds",
    "spoold_queue_paused",
    "spoold_queue_breaker_open",
    "spoold_journal_fsync_duration_seconds",
    "spoold_journal_bytes",
    "spoold_journal_max_bytes",
    "spoold_http_requests_total",
    "spoold_http_request_duration_seconds",
    "spoold_delivery_latency_seconds",
    "process_cpu_seconds_total",
    "process_resident_memory_bytes",
    "process_open_fds",
    "process_start_time_seconds",
];

/// The value of the first sample line starting with `series`.
fn value(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(series))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// A scrape after every kind of activity: sends, an ack, a nack into the
/// failure queue, a push delivery answered 503 and then 200, one to a
/// closed port.
async fn scrape_after_activity() -> String {
    let (sink, sink_url) = Sink::start().await;
    let dir = tempfile::tempdir().unwrap();
    let tables = format!(
        "[queues.orders]\nmax_retries = 0\n\
         [queues.hooks]\ndestination = \"{sink_url}/in\"\n\
         backoff = {{ initial = \"10ms\", max = \"10ms\" }}\n\
         [queues.nowhere]\ndestination = \"http://127.0.0.1:1/in\"\n\
         backoff = {{ initial = \"1h\" }}\n"
    );
    sink.script([(503, Vec::new())]);
    let spoold = start_with(dir.path(), "", &tables).await;
    let api = spoold.api();
    for i in 0..3 {
        api.send_id("orders", &format!("o{i}")).await;
    }
    let token = api.lease("orders").await;
    api.settle("orders", &token, "ack").await;
    let token = api.lease("orders").await;
    api.settle("orders", &token, "nack").await;
    api.forward("hooks", "x", "push").await;
    api.forward("nowhere", "y", "push").await;
    let wanted = [
        "spoold_deliveries_total{queue=\"hooks\",outcome=\"retry\",status=\"5xx\"} 1",
        "spoold_deliveries_total{queue=\"hooks\",outcome=\"success\",status=\"2xx\"} 1",
        "spoold_deliveries_total{queue=\"nowhere\",outcome=\"retry\",status=\"connect\"} 1",
    ];
    common::eventually(
        "the push deliveries in /metrics",
        Duration::from_secs(30),
        async || {
            let text = api.text("/metrics").await;
            wanted.iter().all(|w| text.contains(w)).then_some(text)
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_cover_the_spec() {
    let text = scrape_after_activity().await;
    for name in NAMES {
        assert!(
            text.contains(&format!("# HELP {name} ")),
            "no HELP for {name}:\n{text}"
        );
    }
    assert_eq!(
        value(&text, "spoold_messages_sent_total{queue=\"orders\"}"),
        Some(3.0)
    );
    assert_eq!(
        value(&text, "spoold_messages_acked_total{queue=\"orders\"}"),
        Some(1.0)
    );
    assert_eq!(
        value(&text, "spoold_messages_failed_total{queue=\"orders\"}"),
        Some(1.0),
        "max_retries = 0"
    );
    assert_eq!(
        value(
            &text,
            "spoold_queue_messages{queue=\"orders\",state=\"visible\"}"
        ),
        Some(1.0)
    );
    assert_eq!(
        value(
            &text,
            "spoold_queue_messages{queue=\"orders.failed\",state=\"visible\"}"
        ),
        Some(1.0)
    );
    // Each request counted once, by its route template.
    assert_eq!(
        value(
            &text,
            "spoold_http_requests_total{route=\"/v1/queues/{q}/messages\",status=\"201\"}"
        ),
        Some(3.0)
    );
    assert_eq!(
        value(
            &text,
            "spoold_http_requests_total{route=\"/v1/queues/{q}/leases/{token}/ack\",status=\"204\"}"
        ),
        Some(1.0)
    );
    // Timed by route template too.
    assert_eq!(
        value(
            &text,
            "spoold_http_request_duration_seconds_count{route=\"/v1/queues/{q}/messages\"}"
        ),
        Some(3.0)
    );
    // From the forward to the attempt that delivered it: one sample, at
    // least the 10 ms backoff after the 503.
    assert_eq!(
        value(
            &text,
            "spoold_delivery_latency_seconds_count{queue=\"hooks\"}"
        ),
        Some(1.0)
    );
    assert_eq!(
        value(
            &text,
            "spoold_delivery_latency_seconds_bucket{queue=\"hooks\",le=\"0.005\"}"
        ),
        Some(0.0)
    );
    assert!(value(&text, "process_resident_memory_bytes").unwrap() > 1e6);
    assert!(value(&text, "process_open_fds").unwrap() > 0.0);
    assert!(value(&text, "spoold_journal_fsync_duration_seconds_count").unwrap() > 0.0);
    assert!(
        text.contains("spoold_journal_fsync_duration_seconds_bucket{le=\"0.00005\"}"),
        "fsync buckets"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs promtool (Debian's prometheus package; .ci/run installs it)"]
async fn the_scrape_passes_promtool_check_metrics() {
    let text = scrape_after_activity().await;
    let mut check = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool: install Debian's prometheus package (see .ci/run)");
    check
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = check.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
