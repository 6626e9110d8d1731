//! Push delivery's two ways to a destination (`delivery.plain_http_client`):
//! `direct`, a worker's own HTTP/1.1 connection to a plain-HTTP
//! destination (`src/delivery/direct.rs`), and `pooled`, reqwest's client
//! for everything (`src/delivery/client.rs`). One matrix runs over both:
//! the same request on the wire, a connection the destination closed while
//! idle replaced without a failed attempt, redirects refused, and an
//! HTTP/2 destination that asks for a client certificate. (Proxies come
//! from the process's environment: `tests/process/refusals_and_secrets.rs`
//! runs the binary behind one, both ways.)

use std::sync::{Arc, Mutex};
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::json;

use super::connections::{After, failures, raw_sink};
use crate::common::server::Server;
use crate::common::sink::Sink;
use crate::common::wait_until;

/// Every value of `delivery.plain_http_client`.
const CLIENTS: [&str; 2] = ["direct", "pooled"];

async fn server(client: &str) -> Server {
    Server::temp(&format!("[delivery]\nplain_http_client = \"{client}\"\n")).await
}

fn fast_backoff() -> serde_json::Value {
    json!({"initialSeconds": 0.02, "multiplier": 1, "maxSeconds": 1, "jitter": 0})
}

/// A request head with the values that differ from one delivery to the
/// next (its id, its trace) left out, its lines in order.
fn comparable(head: &str) -> Vec<String> {
    let mut lines: Vec<String> = head
        .to_ascii_lowercase()
        .lines()
        .map(|line| match line.split_once(':') {
            Some((name, _)) if ["spooler-delivery-id", "traceparent"].contains(&name) => {
                name.to_owned()
            }
            _ => line.to_owned(),
        })
        .filter(|line| !line.is_empty())
        .collect();
    lines.sort();
    lines
}

#[tokio::test]
async fn both_clients_put_the_same_request_on_the_wire() {
    let mut heads = Vec::new();
    for client in CLIENTS {
        let (url, seen) = raw_sink(After::KeepOpen, b"ok").await;
        let s = server(client).await;
        s.queue("hooks", json!({"destination": url, "concurrency": 1}))
            .await;
        for i in 0..5 {
            s.send("hooks", &format!("m{i}")).await;
        }
        let seen = super::connections::delivered(&s, "hooks", &seen, 5).await;
        if client == "direct" {
            // The worker keeps its connection; reqwest's pool may open a
            // second while the first is on its way back to the pool.
            assert_eq!(seen.connections, 1, "one connection for five");
        }
        assert_eq!(failures(&s, "hooks").await, 0, "{client}");
        let port = url.trim_start_matches("http://127.0.0.1:");
        let head = seen.heads[0].replace(port.trim_end_matches("/in"), "PORT");
        heads.push(comparable(&head));
        s.stop().await;
    }
    assert_eq!(heads[0], heads[1], "direct and pooled send the same head");
}

#[tokio::test]
async fn a_connection_closed_while_idle_is_replaced_without_a_failure_both_ways() {
    for client in CLIENTS {
        let idle = Duration::from_millis(50);
        let (url, seen) = raw_sink(After::CloseIdle(idle), b"ok").await;
        let s = server(client).await;
        s.queue("hooks", json!({"destination": url, "concurrency": 1}))
            .await;
        for round in 0..3 {
            s.send("hooks", &format!("m{round}")).await;
            super::connections::delivered(&s, "hooks", &seen, round + 1).await;
            // The destination closes the idle connection; the next
            // delivery finds it closed and opens another.
            wait_until("the destination to close", async || {
                seen.lock().unwrap().closed == round + 1
            })
            .await;
        }
        assert_eq!(seen.lock().unwrap().connections, 3, "{client}");
        assert_eq!(failures(&s, "hooks").await, 0, "{client}: none failed");
        s.stop().await;
    }
}

#[tokio::test]
async fn a_redirect_is_an_answer_not_followed_both_ways() {
    for client in CLIENTS {
        let (sink, url) = Sink::start().await;
        sink.script([
            (302, vec![("location", format!("{url}/elsewhere"))]),
            (200, vec![]),
        ]);
        let s = server(client).await;
        s.queue(
            "hooks",
            json!({"destination": format!("{url}/in"), "backoff": fast_backoff()}),
        )
        .await;
        s.send("hooks", "x").await;
        let seen = sink.wait_for(2).await;
        let paths: Vec<&str> = seen.iter().map(|r| r.uri.as_str()).collect();
        assert_eq!(paths, ["/in", "/in"], "{client}: the 302 was retried");
        assert_eq!(failures(&s, "hooks").await, 1, "{client}");
        s.stop().await;
    }
}

/// What a TLS destination saw of each request: its HTTP version and
/// whether the client showed a certificate.
type TlsSeen = Arc<Mutex<Vec<(hyper::Version, bool)>>>;

/// An HTTPS destination that speaks HTTP/2 only and asks every client for
/// a certificate signed by `ca` (PEM); it serves `cert` and `key`.
async fn h2_mtls_sink(ca: &str, cert: &str, key: &str) -> (String, TlsSeen) {
    spoold::testing::install_crypto_provider();
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(ca.as_bytes()).unwrap())
        .unwrap();
    let verifier = rustls::server::WebPkiClientVerifier::builder(Arc::new(roots))
        .allow_unauthenticated()
        .build()
        .unwrap();
    let mut config = rustls::ServerConfig::builder()
        .with_client_cert_verifier(verifier)
        .with_single_cert(
            vec![CertificateDer::from_pem_slice(cert.as_bytes()).unwrap()],
            PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap(),
        )
        .unwrap();
    config.alpn_protocols = vec![b"h2".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = TlsSeen::default();
    let recorded = seen.clone();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let (acceptor, recorded) = (acceptor.clone(), recorded.clone());
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let shown = tls.get_ref().1.peer_certificates().is_some();
                let service = hyper::service::service_fn(move |req: hyper::Request<_>| {
                    recorded.lock().unwrap().push((req.version(), shown));
                    async { Ok::<_, std::convert::Infallible>(hyper::Response::new(String::new())) }
                });
                let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(tls), service)
                    .await;
            });
        }
    });
    (format!("https://localhost:{port}/in"), seen)
}

#[tokio::test]
async fn an_http2_destination_gets_the_queues_client_certificate_both_ways() {
    let (ca, cert, key) = crate::common::certificates(&["localhost"]);
    let (url, seen) = h2_mtls_sink(&ca, &cert, &key).await;
    let dir = tempfile::tempdir().unwrap();
    let file = |name: &str, pem: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, pem).unwrap();
        path.display().to_string()
    };
    let (ca_file, cert_file, key_file) = (
        file("ca.pem", &ca),
        file("c.pem", &cert),
        file("k.pem", &key),
    );
    for (n, client) in CLIENTS.into_iter().enumerate() {
        // TLS files are named in the config file only.
        let s = Server::start(
            &dir.path().join(client),
            &format!(
                "[delivery]\nplain_http_client = \"{client}\"\n[queues.secure]\ndestination = \"{url}\"\n\
                 ca_file = \"{ca_file}\"\nclient_cert = \"{cert_file}\"\n\
                 client_key = \"{key_file}\"\n"
            ),
        )
        .await;
        s.send("secure", "x").await;
        wait_until("delivered over HTTP/2", async || {
            seen.lock().unwrap().len() == n + 1
        })
        .await;
        assert_eq!(
            seen.lock().unwrap()[n],
            (hyper::Version::HTTP_2, true),
            "{client}: HTTP/2 with the client's certificate"
        );
        assert_eq!(failures(&s, "secure").await, 0, "{client}");
        s.stop().await;
    }
}

/// A destination that answers after `delay` and counts the requests it
/// holds at once: (its URL, the most it held).
async fn counting_sink(delay: Duration) -> (String, Arc<Mutex<(usize, usize)>>) {
    let held: Arc<Mutex<(usize, usize)>> = Arc::default();
    let counter = held.clone();
    let app = axum::Router::new().fallback(move || {
        let counter = counter.clone();
        async move {
            {
                let mut c = counter.lock().unwrap();
                c.0 += 1;
                c.1 = c.1.max(c.0);
            }
            tokio::time::sleep(delay).await;
            counter.lock().unwrap().0 -= 1;
            "ok"
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{addr}"), held)
}

/// Issue 43: a thousand endpoints behind one gateway opened thousands of
/// connections to it at once. Four queues of concurrency 8 to one origin,
/// bounded to 2 there (`delivery.max_connections_per_host`,
/// `src/delivery/hosts.rs`): never more than 2 requests at once, every
/// message delivered, no queue starved, and the waits counted.
#[tokio::test]
async fn requests_in_flight_to_one_origin_stay_within_its_bound_both_ways() {
    for client in CLIENTS {
        let (url, held) = counting_sink(Duration::from_millis(20)).await;
        let s = Server::temp(&format!(
            "[delivery]\nplain_http_client = \"{client}\"\nmax_connections_per_host = 2\n"
        ))
        .await;
        let queues = ["gw-a", "gw-b", "gw-c", "gw-d"];
        for queue in queues {
            let destination = format!("{url}/{queue}");
            s.queue(queue, json!({"destination": destination, "concurrency": 8}))
                .await;
        }
        for n in 0..10 {
            for queue in queues {
                s.send(queue, &format!("{queue} {n}")).await;
            }
        }
        for queue in queues {
            super::connections::delivered_all(&s, queue).await;
            assert_eq!(failures(&s, queue).await, 0, "{client} {queue}");
        }
        let most = held.lock().unwrap().1;
        assert!(most <= 2, "{client}: {most} requests at once to one origin");
        assert!(most >= 1, "{client}");
        let metrics = s.text("/metrics").await;
        let waits: f64 = metrics
            .lines()
            .find_map(|l| l.strip_prefix("spoold_delivery_host_slot_waits_total "))
            .expect("the waits are exported")
            .parse()
            .unwrap();
        assert!(waits > 0.0, "{client}: the dispatchers waited for slots");
        s.stop().await;
    }
}
