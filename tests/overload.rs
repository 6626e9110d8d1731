//! Overload: thousands of slow-loris connections do not starve others, and
//! long-poll receivers beyond the cap are refused clearly.

mod common;

use std::time::{Duration, Instant};

use reqwest::{Client, StatusCode};
use tokio::io::AsyncWriteExt;

async fn server(dir: &std::path::Path) -> (spoold::serve::Running, String) {
    common::serve_in_process(dir, "[queues.q]").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_loris_connections_do_not_starve_other_clients() {
    let dir = tempfile::tempdir().unwrap();
    let (running, base) = server(dir.path()).await;
    let addr = base.trim_start_matches("http://").to_string();
    let mut slow = Vec::new();
    for _ in 0..2000 {
        let mut s = tokio::net::TcpStream::connect(&addr).await.unwrap();
        s.write_all(b"POST /v1/queues/q/messages HTTP/1.1\r\nHost: x\r\nX-Slow: ")
            .await
            .unwrap();
        slow.push(s);
    }
    let client = Client::new();
    let started = Instant::now();
    for i in 0..50 {
        let r = client
            .post(format!("{base}/v1/queues/q/messages"))
            .body(format!("{i}"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::CREATED);
    }
    let took = started.elapsed();
    println!("2000 slow-loris connections open: 50 sends took {took:?}");
    assert!(
        took < Duration::from_secs(5),
        "others were starved: {took:?}"
    );
    drop(slow);
    running.stop();
    running.wait().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_polls_beyond_the_cap_are_refused_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let (running, base) = server(dir.path()).await;
    let client = Client::new();
    let mut polls = Vec::new();
    for i in 0..spoold::api::LONG_POLLS_MAX {
        let (client, base) = (client.clone(), base.clone());
        polls.push(tokio::spawn(async move {
            client
                .post(format!("{base}/v1/queues/q/receive?wait=20"))
                .send()
                .await
        }));
        // Open them gradually: a thousand connects at once overflow the
        // listen backlog of the test machine, not spoold.
        if i % 64 == 63 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    // Wait until every poll holds its slot: then one more is refused.
    let deadline = Instant::now() + Duration::from_secs(20);
    let refused = loop {
        // A probe that got a slot would wait 20 s: give up on it quickly.
        let probe = client
            .post(format!("{base}/v1/queues/q/receive?wait=20"))
            .timeout(Duration::from_millis(300))
            .send()
            .await;
        if let Ok(r) = probe
            && r.status() == StatusCode::SERVICE_UNAVAILABLE
        {
            break r;
        }
        if Instant::now() >= deadline {
            let done = polls.iter().filter(|p| p.is_finished()).count();
            panic!("the long-poll cap never applied ({done} polls finished)");
        }
    };
    assert!(refused.headers().contains_key("retry-after"));
    let body: serde_json::Value = refused.json().await.unwrap();
    assert_eq!(body["kind"], "unavailable");
    assert!(
        body["message"].as_str().unwrap().contains("long-polling"),
        "{body}"
    );
    // A poll without waiting still works, and a send wakes a waiting one.
    let r = client
        .post(format!("{base}/v1/queues/q/receive"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    let r = client
        .post(format!("{base}/v1/queues/q/messages"))
        .body("wake")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    running.stop();
    for p in polls {
        p.abort();
    }
    running.wait().await.unwrap();
}
