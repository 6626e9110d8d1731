//! Overload: thousands of connections at once are all served, thousands of
//! slow-loris connections do not starve others, and long-poll receivers
//! beyond the cap are refused clearly.

use crate::common;
use crate::common::server::Server;

use std::time::{Duration, Instant};

use reqwest::{Client, StatusCode};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

async fn server(dir: &std::path::Path) -> (Server, String) {
    let s = Server::start(dir, "[queues.q]").await;
    let base = s.base.clone();
    (s, base)
}

/// Connects, sends one message over a raw connection and returns the
/// status line of the answer.
async fn raw_send(addr: String, i: usize) -> String {
    let mut s = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let body = format!("burst {i}");
    let request = format!(
        "POST /v1/queues/q/messages HTTP/1.1\r\nHost: localhost\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    s.read_to_end(&mut answer).await.unwrap();
    let answer = String::from_utf8_lossy(&answer);
    answer.lines().next().unwrap_or_default().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_thousand_connections_at_once_are_all_served() {
    const BURST: usize = 3000;
    let dir = tempfile::tempdir().unwrap();
    let (running, base) = server(dir.path()).await;
    let addr = base.trim_start_matches("http://").to_string();
    let started = Instant::now();
    // Every connect is issued at once: more than tokio's default listen
    // backlog of 1 024 wait to be accepted together.
    let sends: Vec<_> = (0..BURST)
        .map(|i| tokio::spawn(raw_send(addr.clone(), i)))
        .collect();
    let mut created = 0;
    for s in sends {
        let status = s.await.unwrap();
        assert!(status.starts_with("HTTP/1.1 201"), "{status}");
        created += 1;
    }
    let took = started.elapsed();
    let q = running.get_json("/v1/queues/q").await;
    println!("{BURST} connections at once: {created} answered 201 in {took:?}");
    assert_eq!(q["stats"]["visible"], BURST, "{q}");
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_loris_connections_do_not_starve_other_clients() {
    let dir = tempfile::tempdir().unwrap();
    let (running, base) = server(dir.path()).await;
    let addr = base.trim_start_matches("http://").to_string();
    let mut slow = Vec::new();
    for _ in 0..2000 {
        let mut s = tokio::net::TcpStream::connect(&addr).await.unwrap();
        s.write_all(b"POST /v1/queues/q/messages HTTP/1.1\r\nHost: localhost\r\nX-Slow: ")
            .await
            .unwrap();
        slow.push(s);
    }
    let started = Instant::now();
    for i in 0..50 {
        let r = running.send("q", &format!("{i}")).await;
        assert_eq!(r.status(), StatusCode::CREATED);
    }
    let took = started.elapsed();
    println!("2000 slow-loris connections open: 50 sends took {took:?}");
    assert!(
        took < Duration::from_secs(5),
        "others were starved: {took:?}"
    );
    drop(slow);
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_polls_beyond_the_cap_are_refused_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let (running, base) = server(dir.path()).await;
    let client = Client::new();
    let mut polls = Vec::new();
    for _ in 0..spoold::testing::LONG_POLLS_MAX {
        let (client, base) = (client.clone(), base.clone());
        // All at once. A probe below may hold a slot for a moment while
        // they arrive; a poll refused then tries again.
        polls.push(tokio::spawn(async move {
            loop {
                let r = client
                    .post(format!("{base}/v1/queues/q/receive?wait=20"))
                    .send()
                    .await;
                match r {
                    Ok(r) if r.status() == StatusCode::SERVICE_UNAVAILABLE => {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                    r => return r,
                }
            }
        }));
    }
    // Wait until every poll holds its slot: then one more is refused.
    let refused = common::eventually(
        "the long-poll cap to apply",
        Duration::from_secs(20),
        async || {
            // A probe that got a slot would wait 20 s: give up on it quickly.
            let r = client
                .post(format!("{base}/v1/queues/q/receive?wait=20"))
                .timeout(Duration::from_millis(300))
                .send()
                .await
                .ok()?;
            (r.status() == StatusCode::SERVICE_UNAVAILABLE).then_some(r)
        },
    )
    .await;
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
    // Stopping does not wait for the clients of open long polls.
    running.running().stop();
    for p in polls {
        p.abort();
    }
    running.stop().await;
}
