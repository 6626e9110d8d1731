//! The connections push delivery keeps to a plain-HTTP destination
//! (`src/delivery/direct.rs`): reused while the queue has work, replaced
//! without a failed attempt when the destination closed one while it was
//! idle, given up after an answer too long to read; and the request on
//! the wire is what reqwest's would be (origin-form target, `Host`,
//! `User-Agent`, `Accept`, `Content-Length`).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;

use crate::common::server::Server;
use crate::common::{eventually, wait_until};

/// How a [`raw_sink`] treats a connection after each answer.
#[derive(Clone, Copy)]
pub(super) enum After {
    /// Waits for the next request (keep-alive).
    KeepOpen,
    /// Closes it once it has been idle this long (a keep-alive timeout).
    CloseIdle(Duration),
}

/// A destination spoken to at the socket level: every request's head
/// (request line and headers, as sent) and the connections it accepted.
#[derive(Default, Clone)]
pub(super) struct Seen {
    pub heads: Vec<String>,
    pub connections: usize,
    /// Connections it closed for being idle too long.
    pub closed: usize,
}

/// A plain HTTP/1.1 destination answering `200` with `body`.
pub(super) async fn raw_sink(after: After, body: &'static [u8]) -> (String, Arc<Mutex<Seen>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/in", listener.local_addr().unwrap());
    let seen: Arc<Mutex<Seen>> = Arc::default();
    let recorded = seen.clone();
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            recorded.lock().unwrap().connections += 1;
            tokio::spawn(serve(stream, after, body, recorded.clone()));
        }
    });
    (url, seen)
}

async fn serve(
    stream: tokio::net::TcpStream,
    after: After,
    body: &'static [u8],
    seen: Arc<Mutex<Seen>>,
) {
    let mut stream = BufReader::new(stream);
    loop {
        let mut first = String::new();
        let read = match after {
            After::KeepOpen => stream.read_line(&mut first).await,
            After::CloseIdle(idle) => {
                match tokio::time::timeout(idle, stream.read_line(&mut first)).await {
                    Ok(read) => read,
                    Err(_) => {
                        seen.lock().unwrap().closed += 1;
                        return;
                    }
                }
            }
        };
        if !matches!(read, Ok(n) if n > 0) {
            return;
        }
        let mut head = first;
        let mut length = 0;
        loop {
            let mut line = String::new();
            stream.read_line(&mut line).await.unwrap();
            if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                length = v.trim().parse().unwrap();
            }
            head.push_str(&line);
            if line == "\r\n" {
                break;
            }
        }
        let mut request_body = vec![0; length];
        stream.read_exact(&mut request_body).await.unwrap();
        seen.lock().unwrap().heads.push(head);
        let answer = format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n", body.len());
        let stream = stream.get_mut();
        stream.write_all(answer.as_bytes()).await.unwrap();
        stream.write_all(body).await.unwrap();
    }
}

/// Waits until `queue` has delivered all it holds and the sink has seen
/// `n` requests; returns what the sink saw.
pub(super) async fn delivered(s: &Server, queue: &str, seen: &Arc<Mutex<Seen>>, n: usize) -> Seen {
    delivered_all(s, queue).await;
    wait_until("the sink to see them", async || {
        seen.lock().unwrap().heads.len() >= n
    })
    .await;
    seen.lock().unwrap().clone()
}

pub(super) async fn delivered_all(s: &Server, queue: &str) {
    wait_until("all delivered", async || {
        let st = s.get_json(&format!("/v1/queues/{queue}")).await["stats"].clone();
        st["visible"] == 0 && st["leased"] == 0 && st["delayed"] == 0
    })
    .await;
}

pub(super) async fn failures(s: &Server, queue: &str) -> u64 {
    s.get_json(&format!("/v1/queues/{queue}")).await["stats"]["deliveryFailuresTotal"]
        .as_u64()
        .unwrap()
}

#[tokio::test]
async fn a_busy_queue_reuses_its_connection_and_sends_what_reqwest_would() {
    let (url, seen) = raw_sink(After::KeepOpen, b"ok").await;
    let s = Server::temp("").await;
    s.queue("hooks", json!({"destination": url, "concurrency": 1}))
        .await;
    for i in 0..20 {
        s.send("hooks", &format!("m{i}")).await;
    }
    delivered_all(&s, "hooks").await;
    let (heads, connections) = {
        let seen = seen.lock().unwrap();
        (seen.heads.clone(), seen.connections)
    };
    assert_eq!(heads.len(), 20);
    assert_eq!(connections, 1, "one connection for all twenty");
    let head = heads[0].to_ascii_lowercase();
    let port = url.trim_start_matches("http://127.0.0.1:");
    let port = port.trim_end_matches("/in");
    assert!(head.starts_with("post /in http/1.1\r\n"), "{head}");
    for line in [
        format!("host: 127.0.0.1:{port}\r\n"),
        format!("user-agent: spoold/{}\r\n", env!("CARGO_PKG_VERSION")),
        "accept: */*\r\n".to_owned(),
        "content-length: 2\r\n".to_owned(),
        "spooler-retry-count: 0\r\n".to_owned(),
    ] {
        assert!(head.contains(&line), "{line:?} missing from {head}");
    }
    assert_eq!(failures(&s, "hooks").await, 0);
    s.stop().await;
}

#[tokio::test]
async fn a_connection_the_destination_closed_while_idle_is_replaced_without_a_failure() {
    let idle = Duration::from_millis(50);
    let (url, seen) = raw_sink(After::CloseIdle(idle), b"ok").await;
    let s = Server::temp("").await;
    s.queue("hooks", json!({"destination": url, "concurrency": 1}))
        .await;
    for round in 0..3 {
        s.send("hooks", &format!("m{round}")).await;
        delivered_all(&s, "hooks").await;
        // The destination closes the idle connection; the queue's next
        // worker finds it closed and opens another.
        tokio::time::sleep(idle * 4).await;
    }
    assert_eq!(seen.lock().unwrap().heads.len(), 3);
    assert_eq!(seen.lock().unwrap().connections, 3);
    assert_eq!(failures(&s, "hooks").await, 0, "no attempt failed");
    s.stop().await;
}

#[tokio::test]
async fn an_answer_too_long_to_read_is_kept_in_part_and_its_connection_dropped() {
    static LONG: [u8; 100_000] = [b'x'; 100_000];
    let (url, seen) = raw_sink(After::KeepOpen, &LONG).await;
    let s = Server::temp("").await;
    s.queue("hooks", json!({"destination": url, "concurrency": 1}))
        .await;
    s.send("hooks", "one").await;
    delivered_all(&s, "hooks").await;
    s.send("hooks", "two").await;
    delivered_all(&s, "hooks").await;
    assert_eq!(seen.lock().unwrap().heads.len(), 2);
    assert_eq!(
        seen.lock().unwrap().connections,
        2,
        "not drained past 64 KiB: a new connection"
    );
    assert_eq!(failures(&s, "hooks").await, 0);
    s.stop().await;
}

#[tokio::test]
async fn a_destination_by_name_is_dialled_at_each_of_its_addresses() {
    // `localhost` may resolve to ::1 first, where nothing listens: the
    // next address (127.0.0.1) is tried, as reqwest's connector does.
    let (url, seen) = raw_sink(After::KeepOpen, b"ok").await;
    let url = url.replace("127.0.0.1", "localhost");
    let s = Server::temp("").await;
    s.queue("hooks", json!({"destination": url, "concurrency": 1}))
        .await;
    s.send("hooks", "by name").await;
    delivered_all(&s, "hooks").await;
    let head = seen.lock().unwrap().heads[0].to_ascii_lowercase();
    let port = url.trim_start_matches("http://localhost:");
    let port = port.trim_end_matches("/in");
    assert!(
        head.contains(&format!("host: localhost:{port}\r\n")),
        "{head}"
    );
    assert_eq!(failures(&s, "hooks").await, 0);
    s.stop().await;
}

#[tokio::test]
async fn idle_connections_outlive_a_quiet_spell_and_are_shared_by_origin() {
    let (url, seen) = raw_sink(After::KeepOpen, b"ok").await;
    let s = Server::temp("").await;
    s.queue("hooks", json!({"destination": url, "concurrency": 1}))
        .await;
    let dispatchers = async || {
        let metrics = s.text("/metrics").await;
        metrics
            .lines()
            .find_map(|l| l.strip_prefix("spoold_push_dispatchers "))
            .map(|v| v.trim().parse::<f64>().unwrap())
            .expect("the dispatcher gauge")
    };
    s.send("hooks", "before the quiet spell").await;
    delivered_all(&s, "hooks").await;
    // The queue's dispatcher ends some seconds after its queue empties.
    eventually(
        "the dispatcher ended",
        Duration::from_secs(30),
        async || (dispatchers().await == 0.0).then_some(()),
    )
    .await;
    s.send("hooks", "after it").await;
    delivered_all(&s, "hooks").await;
    // Another queue with the same destination shares its idle connections.
    s.queue("hooks-too", json!({"destination": url, "concurrency": 1}))
        .await;
    s.send("hooks-too", "to the same origin").await;
    delivered_all(&s, "hooks-too").await;
    assert_eq!(seen.lock().unwrap().heads.len(), 3);
    assert_eq!(
        seen.lock().unwrap().connections,
        1,
        "the next dispatchers took the idle connection"
    );
    s.stop().await;
}
