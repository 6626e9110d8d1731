//! The cluster port (`cluster.listen`) as an adversary on the network
//! sees it: someone who can reach the port but holds no secret, someone
//! who holds only an API key, and someone who captured a peer's request.
//! Each test is a finding that was reproduced against an earlier build
//! (`SPOOLD_TEST_BIN` runs them against another binary).

use crate::common;

use std::process::Command;
use std::time::{Duration, Instant};

use crate::common::cluster::{SECRET, TestCluster};
use crate::common::process::client;
use reqwest::StatusCode;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The peak resident set of process `pid` (`VmHWM`), in MiB.
fn peak_rss_mib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kib / 1024
}

/// The headers of one replication request the primary sent to an address
/// of the test's choosing: what an API-key holder can make it send with
/// `POST /v1/cluster/members`.
async fn captured_request(cluster: &TestCluster, primary: usize) -> Vec<(String, String)> {
    let trap = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = trap.local_addr().unwrap().to_string();
    let catch = tokio::spawn(async move {
        let (mut stream, _) = trap.accept().await.unwrap();
        let mut head = Vec::new();
        let mut buf = [0u8; 4096];
        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = stream.read(&mut buf).await.unwrap();
            assert!(n > 0, "the primary closed before its headers");
            head.extend_from_slice(&buf[..n]);
        }
        let _ = stream
            .write_all(b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\n\r\n")
            .await;
        String::from_utf8_lossy(&head).into_owned()
    });
    let answer = client()
        .post(format!(
            "{}/v1/cluster/members",
            cluster.replicas[primary].base()
        ))
        .json(&json!({"nodeId": 9, "addr": addr}))
        .timeout(Duration::from_secs(10))
        .send()
        .await
        .unwrap();
    assert!(!answer.status().is_success(), "the trap is no replica");
    let head = tokio::time::timeout(Duration::from_secs(5), catch)
        .await
        .expect("the primary sent a request to the address it was given")
        .unwrap();
    head.lines()
        .skip(1)
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .filter(|(n, _)| n.starts_with("spooler-cluster"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adding_a_member_does_not_pass_on_what_an_unsigned_address_answered() {
    let mut cluster = TestCluster::new(1, "", "");
    cluster.start_all().await;
    // Any HTTP server at all: an API-key holder names it as a member.
    let trap = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = trap.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = trap.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 8192];
                let _ = stream.read(&mut buf).await;
                let _ = stream
                    .write_all(
                        b"HTTP/1.1 200 OK\r\ncontent-length: 22\r\n\r\nsecret-of-the-internal",
                    )
                    .await;
            });
        }
    });
    let answer = client()
        .post(format!("{}/v1/cluster/members", cluster.replicas[0].base()))
        .json(&json!({"nodeId": 9, "addr": addr}))
        .timeout(Duration::from_secs(10))
        .send()
        .await
        .unwrap();
    assert!(!answer.status().is_success());
    let text = answer.text().await.unwrap();
    assert!(!text.contains("secret-of-the-internal"), "{text}");
    assert!(
        text.contains("not a spoold that holds this cluster's secret"),
        "{text}"
    );
}

/// `POST http://127.0.0.1:{port}{path}` with `headers` and `body`.
async fn raw_post(
    port: u16,
    path: &str,
    headers: &[(String, String)],
    body: Vec<u8>,
) -> Option<reqwest::Response> {
    let mut request = client()
        .post(format!("http://127.0.0.1:{port}{path}"))
        .timeout(Duration::from_secs(10))
        .body(body);
    for (name, value) in headers {
        request = request.header(name, value);
    }
    request.send().await.ok()
}

/// A replication request signed as node `from` would sign it (the
/// test holds the secret, as a peer does).
fn signed(from: u64, target: u64, path: &str, body: &[u8]) -> Vec<(String, String)> {
    spoold::testing::sign_cluster_request(SECRET, from, target, "POST", path, Some(body))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_captured_request_cannot_be_replayed_to_forge_a_vote() {
    let mut cluster = TestCluster::new(3, "", "");
    cluster.start_all().await;
    let primary = cluster.primary(Duration::from_secs(10)).await;
    let victim = (primary + 1) % 3;
    let victim_id = cluster.replicas[victim].id;

    // An API-key holder makes the primary talk to its address.
    let mut headers = captured_request(&cluster, primary).await;
    assert!(
        !headers.is_empty(),
        "the primary's request named the cluster"
    );
    for (name, value) in &mut headers {
        if name == "spooler-cluster-target" {
            *value = victim_id.to_string();
        }
    }
    // … and replays what it caught as a vote for a term no election
    // reaches.
    let forged = spoold::testing::cluster_vote_request(u64::MAX, 9);
    let answer = raw_post(
        cluster.replicas[victim].raft_port,
        "/raft/vote",
        &headers,
        forged,
    )
    .await
    .expect("the replica answers");
    assert_eq!(
        answer.status(),
        StatusCode::UNAUTHORIZED,
        "a replayed proof is refused"
    );

    // The victim still restarts and rejoins.
    cluster.kill(victim);
    cluster.start(victim);
    common::process::wait_ready(cluster.replicas[victim].process.as_ref().unwrap()).await;
    let s = cluster.status(victim).await.unwrap();
    assert_eq!(s["primary"]["nodeId"], json!(primary as u64 + 1), "{s}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vote_or_append_with_an_implausible_term_is_refused_even_with_the_secret() {
    let mut cluster = TestCluster::new(3, "", "");
    cluster.start_all().await;
    let primary = cluster.primary(Duration::from_secs(10)).await;
    let victim = (primary + 1) % 3;
    let (victim_id, port) = (
        cluster.replicas[victim].id,
        cluster.replicas[victim].raft_port,
    );
    for term in [u64::MAX, u64::MAX / 2, 1 << 40] {
        let body = spoold::testing::cluster_vote_request(term, 9);
        for path in ["/raft/vote", "/raft/pre-vote"] {
            let answer = raw_post(port, path, &signed(9, victim_id, path, &body), body.clone())
                .await
                .unwrap();
            let status = answer.status();
            let text = answer.text().await.unwrap();
            assert_eq!(
                status,
                StatusCode::BAD_REQUEST,
                "{path} term {term}: {text}"
            );
            assert!(text.contains("term"), "{text}");
        }
        let body = spoold::testing::cluster_heartbeat_request(term, 9);
        let answer = raw_post(
            port,
            "/raft/append",
            &signed(9, victim_id, "/raft/append", &body),
            body,
        )
        .await
        .unwrap();
        assert_eq!(
            answer.status(),
            StatusCode::BAD_REQUEST,
            "append term {term}"
        );
    }
    cluster.kill(victim);
    cluster.start(victim);
    common::process::wait_ready(cluster.replicas[victim].process.as_ref().unwrap()).await;
    let s = cluster.status(victim).await.unwrap();
    assert!(s["term"].as_u64().unwrap() < 1000, "{s}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poisoned_vote_on_disk_starts_the_replica_and_says_how_to_repair_it() {
    let mut cluster = TestCluster::new(3, "", "");
    cluster.start_all().await;
    let primary = cluster.primary(Duration::from_secs(10)).await;
    let victim = (primary + 1) % 3;
    let term = cluster.status(primary).await.unwrap()["term"]
        .as_u64()
        .unwrap();
    cluster.kill(victim);
    let spool = cluster.replicas[victim].dir.join("spool");
    spoold::testing::write_raft_vote(&spool, u64::MAX, 9).unwrap();

    cluster.start(victim);
    let log = common::eventually("the repair advice", Duration::from_secs(10), async || {
        let log = cluster.replicas[victim].process.as_ref().unwrap().log();
        log.contains("repair-vote").then_some(log)
    })
    .await;
    assert!(log.contains("raft.vote"), "{log}");
    let base = cluster.replicas[victim].base();
    let ready = client().get(format!("{base}/readyz")).send().await.unwrap();
    assert_eq!(ready.status(), StatusCode::SERVICE_UNAVAILABLE);
    let refused = client()
        .post(format!("{base}/v1/queues/jobs/messages"))
        .body("x")
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(refused.text().await.unwrap().contains("repair-vote"));
    assert!(
        cluster.replicas[victim]
            .process
            .as_mut()
            .unwrap()
            .child
            .try_wait()
            .unwrap()
            .is_none(),
        "the replica keeps running"
    );

    // The repair, with a term above every one the cluster used.
    cluster.kill(victim);
    let repaired = common::process::run_in(
        &cluster.replicas[victim].dir,
        &[
            "cluster",
            "repair-vote",
            "--dir",
            spool.to_str().unwrap(),
            "--term",
            &(term + 10).to_string(),
        ],
    );
    assert_eq!(repaired.code, 0, "{}{}", repaired.stdout, repaired.stderr);
    cluster.start(victim);
    common::process::wait_ready(cluster.replicas[victim].process.as_ref().unwrap()).await;
    let s = cluster.status(victim).await.unwrap();
    assert!(s["term"].as_u64().unwrap() >= term + 10, "{s}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repair_vote_refuses_a_term_below_the_last_log_entry() {
    let mut cluster = TestCluster::new(3, "", "[queues.jobs]\n");
    cluster.start_all().await;
    // A second election: every log then ends in a term above 1.
    let first = cluster.primary(Duration::from_secs(10)).await;
    cluster.kill(first);
    let primary = cluster.primary(Duration::from_secs(10)).await;
    let base = cluster.replicas[primary].base();
    let sent = client()
        .post(format!("{base}/v1/queues/jobs/messages"))
        .body("x")
        .send()
        .await
        .unwrap();
    assert_eq!(sent.status(), StatusCode::CREATED);
    let term = cluster.status(primary).await.unwrap()["term"]
        .as_u64()
        .unwrap();
    assert!(term > 1, "term {term}");
    let victim = (0..3).find(|&i| i != first && i != primary).unwrap();
    cluster.kill(victim);
    let spool = cluster.replicas[victim].dir.join("spool");
    let vote = std::fs::read(spool.join("raft.vote")).unwrap();

    let refused = common::process::run_in(
        &cluster.replicas[victim].dir,
        &[
            "cluster",
            "repair-vote",
            "--dir",
            spool.to_str().unwrap(),
            "--term",
            "1",
        ],
    );
    assert_ne!(refused.code, 0, "{}{}", refused.stdout, refused.stderr);
    assert!(
        refused.stderr.contains(&format!(
            "below term {term} of this replica's last log entry"
        )),
        "{}",
        refused.stderr
    );
    assert_eq!(std::fs::read(spool.join("raft.vote")).unwrap(), vote);
    // The last log term itself is taken.
    let repaired = common::process::run_in(
        &cluster.replicas[victim].dir,
        &[
            "cluster",
            "repair-vote",
            "--dir",
            spool.to_str().unwrap(),
            "--term",
            &term.to_string(),
        ],
    );
    assert_eq!(repaired.code, 0, "{}{}", repaired.stdout, repaired.stderr);
}

/// `n` idle connections to `port`, held by a shell (`/dev/tcp`) so that
/// the test's own descriptors are not the limit; they close when the
/// returned child is killed.
fn hold_idle(port: u16, n: usize) -> std::process::Child {
    Command::new("bash")
        .arg("-c")
        .arg(format!(
            "for i in $(seq {n}); do exec {{fd}}<>/dev/tcp/127.0.0.1/{port} || break; done; sleep 120"
        ))
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cluster_port_holds_against_idle_sockets_and_huge_bodies_without_the_secret() {
    let mut cluster = TestCluster::new(1, "", "");
    cluster.start_all().await;
    let r = &cluster.replicas[0];
    let (port, pid, base) = (
        r.raft_port,
        r.process.as_ref().unwrap().child.id(),
        r.base(),
    );

    // HTTP/2 is not spoken there.
    let mut h2 = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    h2.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        .await
        .unwrap();
    let mut answer = vec![0u8; 64];
    let n = tokio::time::timeout(Duration::from_secs(5), h2.read(&mut answer))
        .await
        .unwrap()
        .unwrap_or(0);
    assert!(
        n == 0 || answer.starts_with(b"HTTP/1.1 4"),
        "HTTP/2 was answered: {:?}",
        String::from_utf8_lossy(&answer[..n])
    );

    // 64 connections each announce 60 MiB and send as fast as they can.
    let huge: Vec<_> = (0..64)
        .map(|_| {
            tokio::spawn(async move {
                let Ok(mut s) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await else {
                    return;
                };
                let head = format!(
                    "POST /raft/append HTTP/1.1\r\nhost: x\r\nspooler-cluster-target: 1\r\n\
                     content-length: {}\r\n\r\n",
                    60 << 20
                );
                if s.write_all(head.as_bytes()).await.is_err() {
                    return;
                }
                let chunk = vec![0u8; 1 << 20];
                for _ in 0..60 {
                    if s.write_all(&chunk).await.is_err() {
                        return;
                    }
                }
                let mut rest = Vec::new();
                let _ =
                    tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut rest)).await;
            })
        })
        .collect();
    // 20 000 idle connections, from two shells of 10 000.
    let mut holders = vec![hold_idle(port, 10_000), hold_idle(port, 10_000)];

    // The API keeps answering meanwhile.
    let started = Instant::now();
    let mut answered = 0;
    while started.elapsed() < Duration::from_secs(8) {
        let r = client()
            .get(format!("{base}/healthz"))
            .timeout(Duration::from_secs(2))
            .send()
            .await;
        assert!(
            r.is_ok_and(|r| r.status() == StatusCode::OK),
            "/healthz failed {:?} into the flood",
            started.elapsed()
        );
        answered += 1;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for h in huge {
        let _ = tokio::time::timeout(Duration::from_secs(30), h).await;
    }
    let peak = peak_rss_mib(pid);
    for h in &mut holders {
        let _ = h.kill();
        let _ = h.wait();
    }
    eprintln!("cluster port flood: /healthz answered {answered} times; peak RSS {peak} MiB");
    assert!(peak < 300, "peak RSS {peak} MiB");
    // And the replica still works.
    let sent = client()
        .put(format!("{base}/v1/queues/jobs"))
        .json(&json!({}))
        .timeout(Duration::from_secs(10))
        .send()
        .await
        .unwrap();
    assert!(sent.status().is_success(), "{}", sent.status());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_raft_request_can_move_where_a_follower_relays() {
    let mut cluster = TestCluster::new(3, "", "");
    cluster.start_all().await;
    let primary = cluster.primary(Duration::from_secs(10)).await;
    let follower = (primary + 1) % 3;
    let (primary_id, follower_id) = (cluster.replicas[primary].id, cluster.replicas[follower].id);
    let f = &cluster.replicas[follower];

    // Where a hijacked relay would go.
    let trap = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let trap_url = format!("http://{}", trap.local_addr().unwrap());
    let caught = tokio::spawn(async move { trap.accept().await.is_ok() });

    // A captured request, and a properly signed one, each claiming the
    // primary's API is at the trap, sent over and over while clients call
    // through the follower (the real primary's heartbeats would set it
    // back within a heartbeat).
    let mut captured = captured_request(&cluster, primary).await;
    captured.retain(|(n, _)| n != "spooler-cluster-target" && n != "spooler-cluster-from");
    captured.push(("spooler-cluster-target".into(), follower_id.to_string()));
    let from = (
        "spooler-cluster-from".to_owned(),
        format!("{primary_id} {trap_url}"),
    );
    captured.push(from.clone());
    let port = f.raft_port;
    let hijack = tokio::spawn(async move {
        loop {
            let _ = raw_post(port, "/raft/hello", &captured, Vec::new()).await;
            let mut signed = signed(primary_id, follower_id, "/raft/hello", b"");
            signed.retain(|(n, _)| n != "spooler-cluster-from");
            signed.push(from.clone());
            let _ = raw_post(port, "/raft/hello", &signed, Vec::new()).await;
        }
    });

    // Calls through the follower still reach the real primary.
    for _ in 0..40 {
        let r = client()
            .put(format!("{}/v1/queues/jobs", f.base()))
            .json(&json!({}))
            .timeout(Duration::from_secs(10))
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success(), "{}", r.status());
        assert_eq!(
            r.headers()["spooler-primary"],
            cluster.replicas[primary].base().as_str()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    hijack.abort();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!caught.is_finished(), "a relay went to the trap");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_snapshot_upload_is_dropped_and_the_next_one_proceeds() {
    let mut cluster = TestCluster::new(3, "", "");
    cluster.start_all().await;
    let primary = cluster.primary(Duration::from_secs(10)).await;
    let follower = (primary + 1) % 3;
    let (primary_id, follower_id) = (cluster.replicas[primary].id, cluster.replicas[follower].id);
    let port = cluster.replicas[follower].raft_port;
    let term = cluster.status(primary).await.unwrap()["term"]
        .as_u64()
        .unwrap();

    // An upload that sends its head and then nothing more, ever.
    let stall = || async {
        let head = spoold::testing::cluster_snapshot_head(term, primary_id, 1, 1);
        let mut message = (head.len() as u32).to_le_bytes().to_vec();
        message.extend_from_slice(&head);
        let headers = spoold::testing::sign_cluster_request(
            SECRET,
            primary_id,
            follower_id,
            "POST",
            "/raft/snapshot",
            None,
        );
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .unwrap();
        let mut text =
            "POST /raft/snapshot HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n".to_owned();
        for (n, v) in &headers {
            text.push_str(&format!("{n}: {v}\r\n"));
        }
        text.push_str("\r\n");
        text.push_str(&format!("{:x}\r\n", message.len()));
        s.write_all(text.as_bytes()).await.unwrap();
        s.write_all(&message).await.unwrap();
        s.write_all(b"\r\n").await.unwrap();
        s
    };
    let started = Instant::now();
    let mut first = stall().await;
    let mut second = stall().await;
    // Both end within the bound on a stalled upload, the second after the
    // first (it waited for the one-at-a-time lock, or was refused): each
    // accepted as a peer's, then dropped as stalled.
    for (n, s) in [&mut first, &mut second].into_iter().enumerate() {
        let mut rest = Vec::new();
        let ended = tokio::time::timeout(Duration::from_secs(40), s.read_to_end(&mut rest)).await;
        assert!(
            ended.is_ok(),
            "a stalled upload held on for {:?}",
            started.elapsed()
        );
        let head = String::from_utf8_lossy(&rest[..rest.len().min(200)]).into_owned();
        let stalled = head.starts_with("HTTP/1.1 408");
        assert!(
            stalled || (n == 1 && head.starts_with("HTTP/1.1 503")),
            "upload {n}: {head}"
        );
    }
    eprintln!("two stalled uploads ended after {:?}", started.elapsed());
    // Replication carries on.
    let r = client()
        .put(format!(
            "{}/v1/queues/jobs",
            cluster.replicas[follower].base()
        ))
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_tls_the_replicas_replicate_and_a_peer_without_a_certificate_is_refused() {
    let files = tempfile::tempdir().unwrap();
    let (ca, cert, key) = common::certificates(&["127.0.0.1"]);
    let path = |name: &str, pem: &str| {
        let p = files.path().join(name);
        std::fs::write(&p, pem).unwrap();
        p.display().to_string()
    };
    let (ca_path, cert_path, key_path) = (
        path("ca.pem", &ca),
        path("cert.pem", &cert),
        path("key.pem", &key),
    );
    let keys =
        format!("tls = {{ cert = \"{cert_path}\", key = \"{key_path}\", ca = \"{ca_path}\" }}");
    let mut cluster = TestCluster::new(3, &keys, "[queues.jobs]\n");
    cluster.start_all().await;
    let primary = cluster.primary(Duration::from_secs(10)).await;
    let follower = (primary + 1) % 3;
    let r = client()
        .post(format!(
            "{}/v1/queues/jobs/messages",
            cluster.replicas[follower].base()
        ))
        .body("over TLS")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED, "relayed and replicated");
    common::wait_until("the replicas agree", async || {
        let (a, b, c) = (
            cluster.digest(0).await,
            cluster.digest(1).await,
            cluster.digest(2).await,
        );
        a.is_some() && a == b && b == c
    })
    .await;

    let port = cluster.replicas[follower].raft_port;
    // Plain HTTP gets no HTTP answer.
    let mut plain = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    plain
        .write_all(b"POST /raft/hello HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n\r\n")
        .await
        .unwrap();
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), plain.read_to_end(&mut answer)).await;
    assert!(!answer.starts_with(b"HTTP/"), "plain HTTP was answered");
    // TLS that trusts the cluster's CA but shows no certificate of its
    // own is refused in the handshake.
    let anonymous = reqwest::Client::builder()
        .tls_certs_merge(reqwest::Certificate::from_pem_bundle(ca.as_bytes()).unwrap())
        .build()
        .unwrap();
    let refused = anonymous
        .post(format!("https://127.0.0.1:{port}/raft/hello"))
        .timeout(Duration::from_secs(10))
        .send()
        .await;
    assert!(
        refused.is_err(),
        "a peer without a certificate was answered"
    );
}
