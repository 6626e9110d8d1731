//! The state digest (`GET /v1/cluster?digest=true`, issue 38 finding 9):
//! it hashes the whole state under the engine's lock, and four clients
//! asking in a loop kept sends waiting 0.9 to 1.4 s each (4 ms without
//! them). It is computed at most once a second now (an ask in between gets
//! the last one, with the record it is of): sends under the same load
//! take about what they take without it. And it leaves out keys whose
//! window has passed, which each replica forgets in its own time.

use std::time::{Duration, Instant};

use reqwest::Method;

use crate::common;
use crate::common::cluster::TestCluster;

const QUEUES: usize = 50;

/// The median of `n` sends' latencies to `api`.
async fn median_send(api: &common::api::Api, n: usize) -> Duration {
    let mut took = Vec::new();
    for i in 0..n {
        let asked = Instant::now();
        let r = api
            .req(Method::POST, "/v1/queues/q00/messages")
            .body(format!("timed {i}"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 201);
        took.push(asked.elapsed());
    }
    took.sort();
    took[n / 2]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn digests_asked_in_a_loop_do_not_hold_sends() {
    let mut cluster = TestCluster::new(3, "", "");
    cluster.start_all().await;
    let primary = cluster.primary(Duration::from_secs(30)).await;
    let base = cluster.replicas[primary].base();
    let api = common::api::Api::new(base.clone(), None);
    for i in 0..QUEUES {
        let made = api
            .put_queue(&format!("q{i:02}"), serde_json::json!({"events": ["t.>"]}))
            .await;
        assert_eq!(made.status(), 201);
    }
    // A state worth hashing: 400 events to 50 queues.
    for n in 0..400 {
        let r = api
            .req(Method::POST, "/v1/events")
            .json(&serde_json::json!({"type": "t.x", "payload": {"n": n}}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 202);
    }
    let quiet = median_send(&api, 30).await;

    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let askers: Vec<_> = (0..4)
        .map(|_| {
            let (url, stop) = (format!("{base}/v1/cluster?digest=true"), stop.clone());
            tokio::spawn(async move {
                let client = reqwest::Client::new();
                let mut asked = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let r = client.get(&url).send().await.unwrap();
                    let view: serde_json::Value = r.json().await.unwrap();
                    assert!(view["stateDigest"]["sha256"].is_string(), "{view}");
                    asked += 1;
                }
                asked
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let loaded = median_send(&api, 30).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut asked = 0;
    for a in askers {
        asked += a.await.unwrap();
    }
    eprintln!("median send: {quiet:?} quiet, {loaded:?} with {asked} digests asked meanwhile");
    assert!(asked > 20, "the digest was asked for in a loop");
    assert!(
        loaded < quiet * 5 + Duration::from_millis(20),
        "sends took {loaded:?} with digests asked in a loop, {quiet:?} without"
    );
}
