//! Replicas whose wall clocks step (issue 39, findings 3, 4 and 7): a
//! step on every replica moves no timer, on the primary or on the one
//! elected after it; a replica whose clock is skewed says so on `/readyz`,
//! `GET /v1/cluster` and in its refusals, and the refusals are logged once
//! per peer per interval; the replay-nonce set forgets by monotonic age.
//!
//! Each replica's wall clock is stepped with the `testing` feature's clock
//! offset (`SPOOLD_TEST_CLOCK_FILE`, `src/time.rs`), which leaves its
//! monotonic clock alone, as a host's step does.

use std::time::{Duration, Instant};

use crate::common::cluster::{SECRET, TestCluster};
use crate::common::process::{client, receive_id, send_delayed};
use reqwest::StatusCode;

const HOUR_MS: i64 = 3_600_000;

/// Starts every replica with its wall clock read through its clock file
/// (offset 0; `TestCluster::with_clock_files`): every replica's index.
async fn start_stepped(cluster: &mut TestCluster, env: &[(&str, &str)]) -> Vec<usize> {
    cluster.with_clock_files();
    let all: Vec<usize> = (0..cluster.replicas.len()).collect();
    for &i in &all {
        cluster.start_with_env(i, env);
    }
    for &i in &all {
        crate::common::process::wait_ready(cluster.replicas[i].process.as_ref().unwrap()).await;
    }
    all
}

async fn send(base: &str) -> String {
    send_delayed(base, "jobs", 0).await
}

async fn receive(base: &str, within: Duration) -> Option<String> {
    receive_id(base, "jobs", within).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_on_every_replica_moves_no_timer_on_the_next_primary() {
    let mut cluster = TestCluster::new(3, "", "[queues.jobs]\nlease_timeout = \"2s\"\n");
    let all = start_stepped(&mut cluster, &[]).await;
    let primary = cluster.primary(Duration::from_secs(10)).await;
    let base = cluster.replicas[primary].base();

    // Every clock an hour ahead for 0.3 s, with writes in it.
    cluster.step_clocks(&all, HOUR_MS);
    let id = send(&base).await;
    assert_eq!(receive(&base, Duration::from_secs(2)).await, Some(id));
    tokio::time::sleep(Duration::from_millis(200)).await;
    cluster.step_clocks(&all, 0);

    cluster.kill(primary);
    let next = cluster.primary(Duration::from_secs(10)).await;
    let base = cluster.replicas[next].base();
    // The lease died with its primary: the message is visible again.
    receive(&base, Duration::from_secs(2)).await.unwrap();
    let id = send(&base).await;
    let mut leased = None;
    while leased.is_none() {
        let got = receive(&base, Duration::from_secs(2)).await.unwrap();
        if got == id {
            leased = Some(Instant::now());
        }
    }
    let again = receive(&base, Duration::from_secs(4)).await;
    let took = leased.unwrap().elapsed();
    assert!(
        again.is_some(),
        "a 2 s lease on the next primary never ended"
    );
    assert!(
        took <= Duration::from_secs(3),
        "a 2 s lease ended after {took:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_skewed_replica_says_why_and_its_refusals_are_logged_once_per_interval() {
    let mut cluster = TestCluster::new(3, "", "[queues.jobs]\n");
    let all = start_stepped(&mut cluster, &[]).await;
    let primary = cluster.primary(Duration::from_secs(10)).await;
    let skewed = (primary + 1) % 3;
    let skewed_id = cluster.replicas[skewed].id;
    cluster.step_clocks(&[skewed], 40_000);

    let base = cluster.replicas[skewed].base();
    // Ready or not (it may still relay to the primary it knew), it
    // names the skew.
    let said = crate::common::eventually("the skew named", Duration::from_secs(15), async || {
        let r = client().get(format!("{base}/readyz")).send().await.ok()?;
        let text = r.text().await.ok()?;
        (text.contains("clock skew") || text.contains("clockSkew\":{")).then_some(text)
    })
    .await;
    assert!(said.contains("40"), "{said}");
    let status = cluster.status(skewed).await.unwrap();
    let skew = status["clockSkew"]["skewMs"].as_u64().unwrap_or(0);
    assert!((35_000..45_000).contains(&skew), "{status}");
    let sent = client()
        .post(format!("{base}/v1/queues/jobs/messages"))
        .body("x")
        .send()
        .await
        .unwrap();
    if sent.status() != StatusCode::CREATED {
        assert_eq!(sent.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(sent.text().await.unwrap().contains("clock skew"));
    }
    // The primary names it too.
    let s = cluster.status(primary).await.unwrap();
    assert_eq!(s["clockSkew"]["nodeId"], skewed_id, "{s}");

    // Ten seconds of refusals: a line per peer and interval, not per
    // request.
    let log = |i: usize| cluster.replicas[i].process.as_ref().unwrap().log();
    let count = |text: &str| text.matches("refused replication").count();
    let before: Vec<usize> = (0..3).map(|i| count(&log(i))).collect();
    tokio::time::sleep(Duration::from_secs(10)).await;
    for (i, before) in before.iter().enumerate() {
        let lines = count(&log(i)) - before;
        let all = log(i);
        let refusals: Vec<&str> = all
            .lines()
            .filter(|l| l.contains("refused replication"))
            .collect();
        assert!(
            lines <= 6,
            "replica {i} logged {lines} refusal lines in 10 s: {:#?}",
            &refusals[refusals.len().saturating_sub(30)..]
        );
    }

    // Set right, it rejoins.
    cluster.step_clocks(&all, 0);
    let ready =
        crate::common::eventually("the replica rejoins", Duration::from_secs(15), async || {
            let r = client().get(format!("{base}/readyz")).send().await.ok()?;
            (r.status() == StatusCode::OK).then_some(())
        })
        .await;
    let _: () = ready;
}

/// A signed `hello` to node `target` on `port`, as node 2 whose wall clock
/// says `ms`: its status.
async fn hello_at(port: u16, target: u64, ms: u64) -> StatusCode {
    let body: Vec<u8> = Vec::new();
    let headers = spoold::testing::sign_cluster_request_at(
        SECRET,
        (2, target),
        ("POST", "/raft/hello"),
        Some(&body),
        ms,
    );
    let mut request = client()
        .post(format!("http://127.0.0.1:{port}/raft/hello"))
        .timeout(Duration::from_secs(5))
        .body(body);
    for (name, value) in headers {
        request = request.header(name, value);
    }
    request.send().await.unwrap().status()
}

fn wall_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// The nonce set forgets a nonce twice the replay window (60 s) after it
/// came, by the monotonic clock: after a step back of 10 minutes, the
/// nonces from before the step are gone a minute later. The build before
/// kept every one of them for the step's length plus a minute (the oldest
/// held the rest), and refused every request once the set was full.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nonces_are_forgotten_by_age_after_the_clock_steps_back() {
    let mut cluster = TestCluster::new(1, "", "");
    let all = start_stepped(&mut cluster, &[("SPOOLD_TEST_NONCES_MAX", "300")]).await;
    let (port, target) = (cluster.replicas[0].raft_port, cluster.replicas[0].id);
    for _ in 0..200 {
        assert_eq!(hello_at(port, target, wall_ms()).await, StatusCode::OK);
    }
    cluster.step_clocks(&all, -600_000);
    tokio::time::sleep(Duration::from_secs(62)).await;
    for i in 0..200 {
        let status = hello_at(port, target, wall_ms() - 600_000).await;
        assert_eq!(status, StatusCode::OK, "request {i} after the step");
    }
}
