//! Many endpoints behind one gateway (issue 43): one origin that holds
//! requests, resets every connection and stops listening on command.
//! The bound on requests in flight to an origin
//! (`delivery.max_connections_per_host`, `src/delivery/hosts.rs`) holds
//! while the gateway flaps and comes back whole; a connect the gateway
//! refuses while this node floods it is tried again soon, without the
//! endpoint's backoff and without counting towards its breaker.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use serde_json::json;
use tokio::net::TcpSocket;
use tokio::sync::watch;
use tokio::task::AbortHandle;

use super::connections::{delivered_all, failures};
use crate::common::server::Server;
use crate::common::wait_until;

/// Every value of `delivery.plain_http_client`.
const CLIENTS: [&str; 2] = ["direct", "pooled"];

/// What the gateway saw.
#[derive(Default)]
struct Seen {
    in_flight: usize,
    /// The most requests it held at once.
    most: usize,
    /// Each answered request's `spooler-retry-count`.
    answered: Vec<String>,
    /// Each open connection's task: aborted, it resets the connection.
    connections: Vec<AbortHandle>,
}

/// A request held by the gateway; dropped (answered or reset), it is no
/// longer in flight.
struct Held(Arc<Mutex<Seen>>);

impl Drop for Held {
    fn drop(&mut self) {
        self.0.lock().unwrap().in_flight -= 1;
    }
}

struct Gateway {
    port: u16,
    seen: Arc<Mutex<Seen>>,
    /// While true, requests are held unanswered.
    hold: watch::Sender<bool>,
    listening: Mutex<Option<AbortHandle>>,
}

impl Gateway {
    async fn start() -> Gateway {
        let gateway = Gateway {
            port: 0,
            seen: Arc::default(),
            hold: watch::Sender::new(false),
            listening: Mutex::new(None),
        };
        let port = gateway.listen(0);
        Gateway { port, ..gateway }
    }

    fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}/{path}", self.port)
    }

    /// Listens on `port` (0: any) again; returns it.
    fn listen(&self, port: u16) -> u16 {
        let socket = TcpSocket::new_v4().unwrap();
        socket.set_reuseaddr(true).unwrap();
        socket.bind(([127, 0, 0, 1], port).into()).unwrap();
        let listener = socket.listen(1024).unwrap();
        let port = listener.local_addr().unwrap().port();
        let (seen, hold) = (self.seen.clone(), self.hold.clone());
        let accepting = tokio::spawn(async move {
            loop {
                let (stream, _) = listener.accept().await.unwrap();
                // Closed by an abort, the connection is reset.
                stream.set_zero_linger().unwrap();
                let task = tokio::spawn(serve(stream, seen.clone(), hold.subscribe()));
                seen.lock().unwrap().connections.push(task.abort_handle());
            }
        });
        *self.listening.lock().unwrap() = Some(accepting.abort_handle());
        port
    }

    /// Stops listening: connects are refused.
    fn close(&self) {
        if let Some(accepting) = self.listening.lock().unwrap().take() {
            accepting.abort();
        }
    }

    /// Resets every connection open to it.
    fn reset_all(&self) {
        for connection in self.seen.lock().unwrap().connections.drain(..) {
            connection.abort();
        }
    }

    fn hold(&self, hold: bool) {
        self.hold.send_replace(hold);
    }

    fn in_flight(&self) -> usize {
        self.seen.lock().unwrap().in_flight
    }
}

async fn serve(stream: tokio::net::TcpStream, seen: Arc<Mutex<Seen>>, hold: watch::Receiver<bool>) {
    let service = hyper::service::service_fn(move |request: hyper::Request<_>| {
        let (seen, mut hold) = (seen.clone(), hold.clone());
        async move {
            {
                let mut s = seen.lock().unwrap();
                s.in_flight += 1;
                s.most = s.most.max(s.in_flight);
            }
            let held = Held(seen.clone());
            hold.wait_for(|held| !*held).await.unwrap();
            let retry = request.headers()["spooler-retry-count"].to_str().unwrap();
            seen.lock().unwrap().answered.push(retry.to_owned());
            drop(held);
            Ok::<_, std::convert::Infallible>(hyper::Response::new(String::new()))
        }
    });
    let _ = hyper::server::conn::http1::Builder::new()
        .serve_connection(TokioIo::new(stream), service)
        .await;
}

async fn metric(s: &Server, name: &str) -> f64 {
    let metrics = s.text("/metrics").await;
    let line = metrics.lines().find_map(|l| l.strip_prefix(name));
    line.expect("exported").trim().parse().unwrap()
}

/// A flap with the origin's slots all held: every request in flight is
/// reset and connects are refused for a while. The bound is never passed,
/// every message arrives, and after it the bound is whole again (no slot
/// lost with a reset request).
#[tokio::test]
async fn the_origin_bound_holds_through_a_flap_and_comes_back_whole_both_ways() {
    for client in CLIENTS {
        let gateway = Gateway::start().await;
        gateway.hold(true);
        let s = Server::temp(&format!(
            "[delivery]\nplain_http_client = \"{client}\"\nmax_connections_per_host = 2\n"
        ))
        .await;
        let backoff =
            json!({"initialSeconds": 0.05, "multiplier": 1, "maxSeconds": 1, "jitter": 0});
        let queues = ["gw-a", "gw-b", "gw-c"];
        for queue in queues {
            let settings = json!({"destination": gateway.url(queue), "concurrency": 4,
                "backoff": backoff, "breakerFailures": 1000, "maxRetries": 1000});
            s.queue(queue, settings).await;
            for n in 0..4 {
                s.send(queue, &format!("{queue} {n}")).await;
            }
        }
        wait_until("the origin's slots all held", async || {
            gateway.in_flight() == 2
        })
        .await;
        wait_until("the others waiting", async || {
            metric(&s, "spoold_delivery_host_slot_waits_total").await > 0.0
        })
        .await;
        gateway.close();
        gateway.reset_all();
        tokio::time::sleep(Duration::from_millis(300)).await;
        gateway.listen(gateway.port);
        gateway.hold(false);
        let mut retried = 0;
        for queue in queues {
            delivered_all(&s, queue).await;
            retried += failures(&s, queue).await;
        }
        assert!(retried > 0, "{client}: the flap failed attempts");
        assert_eq!(gateway.seen.lock().unwrap().answered.len(), 12, "{client}");
        // Whole again: two requests in flight at once, no fewer.
        gateway.hold(true);
        for n in 0..4 {
            s.send("gw-a", &format!("after {n}")).await;
        }
        wait_until("both slots held again", async || gateway.in_flight() == 2).await;
        gateway.hold(false);
        delivered_all(&s, "gw-a").await;
        let most = gateway.seen.lock().unwrap().most;
        assert_eq!(most, 2, "{client}: never more than the bound");
        s.stop().await;
    }
}

/// Issue 43: a thousand endpoints on one gateway overflowed its accept
/// queue, and the connects it refused waited out the first backoff while
/// both sides sat idle. A connect refused while this node has other
/// requests in flight to the origin and it answered lately is tried again
/// soon: the message arrives on its first attempt, with a backoff of ten
/// minutes and a breaker that one failure would open.
#[tokio::test]
async fn a_connect_refused_while_this_node_floods_the_origin_is_tried_again_soon_both_ways() {
    for client in CLIENTS {
        let gateway = Gateway::start().await;
        let s = Server::temp(&format!("[delivery]\nplain_http_client = \"{client}\"\n")).await;
        let backoff =
            json!({"initialSeconds": 600, "multiplier": 1, "maxSeconds": 600, "jitter": 0});
        let settings = json!({"destination": gateway.url("hooks"), "concurrency": 8,
            "backoff": backoff, "breakerFailures": 1});
        s.queue("hooks", settings).await;
        s.send("hooks", "answered").await;
        wait_until("one answer", async || {
            gateway.seen.lock().unwrap().answered.len() == 1
        })
        .await;
        gateway.hold(true);
        for n in 0..3 {
            s.send("hooks", &format!("held {n}")).await;
        }
        wait_until("three in flight", async || gateway.in_flight() == 3).await;
        gateway.close();
        for n in 0..2 {
            s.send("hooks", &format!("refused {n}")).await;
        }
        wait_until("a refused connect tried again", async || {
            metric(&s, "spoold_delivery_flood_retries_total").await >= 2.0
        })
        .await;
        gateway.listen(gateway.port);
        wait_until("five in flight", async || gateway.in_flight() == 5).await;
        gateway.hold(false);
        delivered_all(&s, "hooks").await;
        let answered = gateway.seen.lock().unwrap().answered.clone();
        assert_eq!(answered, ["0"; 6], "{client}: each on its first attempt");
        assert_eq!(failures(&s, "hooks").await, 0, "{client}");
        let stats = s.get_json("/v1/queues/hooks").await["stats"].clone();
        assert_eq!(stats["breakerOpen"], false, "{client}: {stats}");
        s.stop().await;
    }
}

/// Issue 43: a queue waiting for work held its origin's slots while it
/// waited (five seconds before it sleeps), so that ten thousand endpoints
/// of one gateway, each idle between events, kept the slots from the ones
/// with work: 1 700 deliveries a second instead of 10 000. With one slot
/// and two queues that just delivered and now wait for work, a third
/// queue's message goes through before either of them sleeps.
#[tokio::test]
async fn queues_waiting_for_work_hold_no_slot_of_their_origin() {
    let gateway = Gateway::start().await;
    let s = Server::temp("[delivery]\nmax_connections_per_host = 1\n").await;
    for queue in ["idle-a", "idle-b", "busy"] {
        s.queue(queue, json!({"destination": gateway.url(queue)}))
            .await;
    }
    for queue in ["idle-a", "idle-b"] {
        s.send(queue, "first").await;
        delivered_all(&s, queue).await;
    }
    s.send("busy", "then").await;
    delivered_all(&s, "busy").await;
    let awake = metric(&s, "spoold_push_dispatchers").await;
    assert_eq!(
        awake, 3.0,
        "delivered while the idle queues were still awake"
    );
    assert_eq!(gateway.seen.lock().unwrap().answered.len(), 3);
    s.stop().await;
}
