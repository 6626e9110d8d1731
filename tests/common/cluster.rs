//! Replicated mode under test: replicas as child processes on loopback,
//! each with its own spool, API port and replication port.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::Value;

use super::links::Links;
use super::process::{Spoold, bin, client, spawn_command, wait_ready};
use super::wires::Wires;

pub const SECRET: &str = "cluster-secret-for-tests-0123456789";

pub struct Replica {
    pub id: u64,
    pub config: PathBuf,
    pub dir: PathBuf,
    pub api_port: u16,
    pub raft_port: u16,
    /// Where the others reach its replication listener: `raft_port`, or
    /// its proxy's port behind [`Links`].
    pub peer_port: u16,
    /// Where the others reach its API (its `api_url`, where followers
    /// relay to): `api_port`, or its proxy's port behind [`Links`].
    pub relay_port: u16,
    pub process: Option<Spoold>,
}

impl Replica {
    pub fn base(&self) -> String {
        format!("http://127.0.0.1:{}", self.api_port)
    }
}

pub struct TestCluster {
    pub replicas: Vec<Replica>,
    /// The address every replica listens on for replication (its port
    /// its own): `127.0.0.1`, or a fixture's (`from_fixture`).
    host: String,
    /// `peers = { … }` of the first start, the same in every config.
    peers: String,
    /// `[spool]` keys, `[cluster]` keys and tables of every config.
    keys: (String, String, String),
    tmp: tempfile::TempDir,
    /// A fixture's lock on its fixed addresses (`from_fixture`), held
    /// while its replicas may run: dropped after them.
    addresses: Option<std::fs::File>,
    /// Whether every start of a replica reads its wall clock's offset
    /// from its clock file (`with_clock_files`).
    clock_files: bool,
}

/// Ports the kernel calls free now (held open together, so they differ).
fn free_ports(n: usize) -> Vec<u16> {
    // Below the kernel's ephemeral range (from 32 768): a port found free
    // here is not taken by another test's outgoing connection before the
    // replica binds it, as one from `bind(0)` can be (a flake CI met).
    // Each process starts at its own place; the cursor never repeats a
    // port within it.
    use std::sync::atomic::{AtomicU32, Ordering};
    const LOW: u32 = 20_000;
    const SPAN: u32 = 12_000;
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let start = std::process::id().wrapping_mul(97) % SPAN;
    let mut ports = Vec::with_capacity(n);
    while ports.len() < n {
        let step = NEXT.fetch_add(1, Ordering::Relaxed);
        assert!(step < SPAN, "no free port left below the ephemeral range");
        let port = (LOW + (start + step) % SPAN) as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            ports.push(port);
        }
    }
    ports
}

impl TestCluster {
    /// Writes the configs of `n` replicas; `cluster_keys` are added to
    /// each `[cluster]` table, `tables` (queues) to each file.
    pub fn new(n: usize, cluster_keys: &str, tables: &str) -> TestCluster {
        TestCluster::with_spool(n, "segment_bytes = \"1MiB\"", cluster_keys, tables)
    }

    /// As [`TestCluster::new`], with `spool_keys` in each `[spool]` table.
    pub fn with_spool(n: usize, spool_keys: &str, cluster_keys: &str, tables: &str) -> TestCluster {
        let ports = free_ports(2 * n);
        let peer_ports = ports[n..].to_vec();
        let relay_ports = ports[..n].to_vec();
        TestCluster::configured(
            "127.0.0.1",
            n,
            &ports,
            (&peer_ports, &relay_ports),
            (spool_keys, cluster_keys, tables),
        )
    }

    /// The replicas of a cluster an earlier build wrote
    /// (`tests/data/NAME/replica-1`, …; `tests/data/README.md`), each
    /// spool copied, each replica listening for replication on `host` at
    /// port 7380 + its node id, where the fixture's stored membership
    /// names it: openraft dials members at the addresses the membership
    /// holds, so a restart cannot move them. The APIs get free ports.
    /// Another test process that runs the same fixture waits for this one
    /// (a lock on the addresses, held until the cluster is dropped).
    pub fn from_fixture(name: &str, host: &str) -> TestCluster {
        let lock = std::env::temp_dir().join(format!("spoold-fixture-{host}.lock"));
        let lock = std::fs::File::create(lock).unwrap();
        lock.lock().unwrap();
        let data = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data");
        let n = std::fs::read_dir(data.join(name)).unwrap().count();
        let api_ports = free_ports(n);
        let raft_ports: Vec<u16> = (1..=n as u16).map(|id| 7380 + id).collect();
        let ports = [api_ports.clone(), raft_ports.clone()].concat();
        let mut cluster = TestCluster::configured(
            host,
            n,
            &ports,
            (&raft_ports, &api_ports),
            ("segment_bytes = \"64KiB\"", "", ""),
        );
        for r in &cluster.replicas {
            let replica = format!("{name}/replica-{}", r.id);
            super::copy_fixture(&replica, &r.dir.join("spool"));
        }
        cluster.addresses = Some(lock);
        cluster
    }

    /// As [`TestCluster::with_spool`], each replica reached by the others
    /// through proxies of the returned [`Links`] (cut, delay, heal): one
    /// for its replication listener, one for its API (the relays of
    /// followers). Clients of the test reach each API directly, as an
    /// application beside its replica would.
    pub fn behind_links(
        n: usize,
        spool_keys: &str,
        cluster_keys: &str,
        tables: &str,
    ) -> (TestCluster, Links) {
        let (cluster, links, _) = TestCluster::linked(n, (spool_keys, cluster_keys, tables), false);
        (cluster, links)
    }

    /// As [`TestCluster::behind_links`], and each replication request
    /// that passes a link then travels the [`Wires`] (a TCP proxy per
    /// replica) to its replica: the links cut whole requests, the wires
    /// reset or blackhole the connections that carry them.
    pub fn behind_links_and_wires(
        n: usize,
        spool_keys: &str,
        cluster_keys: &str,
        tables: &str,
    ) -> (TestCluster, Links, Wires) {
        TestCluster::linked(n, (spool_keys, cluster_keys, tables), true)
    }

    fn linked(n: usize, keys: (&str, &str, &str), wired: bool) -> (TestCluster, Links, Wires) {
        let ports = free_ports(2 * n);
        let listeners: Vec<std::net::TcpListener> = (0..2 * n)
            .map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap())
            .collect();
        let proxy_ports: Vec<u16> = listeners
            .iter()
            .map(|l| l.local_addr().unwrap().port())
            .collect();
        let cluster = TestCluster::configured(
            "127.0.0.1",
            n,
            &ports,
            (&proxy_ports[..n], &proxy_ports[n..]),
            keys,
        );
        let (links, wires) = (Links::default(), Wires::default());
        for (i, listener) in listeners.into_iter().enumerate() {
            let r = &cluster.replicas[i % n];
            if i >= n {
                links.api_proxy(r.id, listener, format!("127.0.0.1:{}", r.api_port));
            } else if wired {
                let wire = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
                let at = wire.local_addr().unwrap();
                wires.proxy(r.id, wire, format!("127.0.0.1:{}", r.raft_port));
                links.proxy(r.id, listener, at.to_string());
            } else {
                links.proxy(r.id, listener, format!("127.0.0.1:{}", r.raft_port));
            }
        }
        (cluster, links, wires)
    }

    /// As [`TestCluster::with_spool`], each replica's replication
    /// listener reached by the others through a TCP proxy of the returned
    /// [`Wires`] (each direction up, reset or a blackhole); relays and
    /// clients reach each API directly.
    pub fn behind_wires(
        n: usize,
        spool_keys: &str,
        cluster_keys: &str,
        tables: &str,
    ) -> (TestCluster, Wires) {
        let ports = free_ports(2 * n);
        let listeners: Vec<std::net::TcpListener> = (0..n)
            .map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap())
            .collect();
        let proxy_ports: Vec<u16> = listeners
            .iter()
            .map(|l| l.local_addr().unwrap().port())
            .collect();
        let cluster = TestCluster::configured(
            "127.0.0.1",
            n,
            &ports,
            (&proxy_ports, &ports[..n]),
            (spool_keys, cluster_keys, tables),
        );
        let wires = Wires::default();
        for (r, listener) in cluster.replicas.iter().zip(listeners) {
            wires.proxy(r.id, listener, format!("127.0.0.1:{}", r.raft_port));
        }
        (cluster, wires)
    }

    /// `ports`: API ports then replication ports; `peer_ports` and
    /// `relay_ports`: where the others reach each replica's replication
    /// listener and API.
    fn configured(
        host: &str,
        n: usize,
        ports: &[u16],
        (peer_ports, relay_ports): (&[u16], &[u16]),
        (spool_keys, cluster_keys, tables): (&str, &str, &str),
    ) -> TestCluster {
        let peers: Vec<String> = (0..n)
            .map(|i| format!("{} = \"{host}:{}\"", i + 1, peer_ports[i]))
            .collect();
        let mut cluster = TestCluster {
            replicas: Vec::new(),
            host: host.into(),
            peers: peers.join(", "),
            keys: (spool_keys.into(), cluster_keys.into(), tables.into()),
            tmp: tempfile::tempdir().unwrap(),
            addresses: None,
            clock_files: false,
        };
        for i in 0..n {
            let replica = cluster.replica(
                i as u64 + 1,
                (ports[i], ports[n + i], peer_ports[i], relay_ports[i]),
            );
            cluster.replicas.push(replica);
        }
        cluster
    }

    /// A replica's directory and config (node `id`, on `ports`: API,
    /// replication, and where the others reach each); its `peers` are the
    /// first start's.
    fn replica(
        &self,
        id: u64,
        (api_port, raft_port, peer_port, relay_port): (u16, u16, u16, u16),
    ) -> Replica {
        let dir = self.tmp.path().join(format!("replica-{id}"));
        std::fs::create_dir_all(&dir).unwrap();
        let config = dir.join("spoold.toml");
        let (spool_keys, cluster_keys, tables) = &self.keys;
        std::fs::write(
            &config,
            format!(
                "[server]\nlisten = \"127.0.0.1:{api_port}\"\n\
                 [spool]\ndir = \"{}\"\n{spool_keys}\n\
                 [cluster]\nnode_id = {id}\nlisten = \"{host}:{raft_port}\"\n\
                 advertise = \"{host}:{peer_port}\"\n\
                 api_url = \"http://127.0.0.1:{relay_port}\"\nsecret = \"{SECRET}\"\n\
                 peers = {{ {} }}\n{cluster_keys}\n{tables}\n",
                dir.join("spool").display(),
                self.peers,
                host = self.host,
            ),
        )
        .unwrap();
        Replica {
            id,
            config,
            dir,
            api_port,
            raft_port,
            peer_port,
            relay_port,
            process: None,
        }
    }

    /// A new replica (not started, not a member) with the next node id.
    pub fn spare(&mut self) -> usize {
        let ports = free_ports(2);
        let id = self.replicas.iter().map(|r| r.id).max().unwrap_or(0) + 1;
        let replica = self.replica(id, (ports[0], ports[1], ports[1], ports[0]));
        self.replicas.push(replica);
        self.replicas.len() - 1
    }

    /// Replica `i`'s disk lost: killed, its spool directory deleted.
    pub fn wipe(&mut self, i: usize) {
        self.kill(i);
        std::fs::remove_dir_all(self.replicas[i].dir.join("spool")).unwrap();
    }

    /// Replica `i` comes back on its ports under the next node id (its
    /// config rewritten), as a replica that lost its disk must: not
    /// started, not a member.
    pub fn renumber(&mut self, i: usize) {
        assert!(self.replicas[i].process.is_none());
        let id = self.replicas.iter().map(|r| r.id).max().unwrap_or(0) + 1;
        let r = &self.replicas[i];
        let ports = (r.api_port, r.raft_port, r.peer_port, r.relay_port);
        self.replicas[i] = self.replica(id, ports);
    }

    /// The replication address of replica `i`.
    pub fn raft_addr(&self, i: usize) -> String {
        format!("{}:{}", self.host, self.replicas[i].peer_port)
    }

    /// Every start of a replica from now on reads its wall clock's offset
    /// from its clock file (the `testing` feature's clock offset,
    /// `src/time.rs`), each set to 0 here: step them with
    /// [`TestCluster::step_clocks`].
    pub fn with_clock_files(&mut self) {
        self.clock_files = true;
        self.step_clocks(&(0..self.replicas.len()).collect::<Vec<_>>(), 0);
    }

    fn clock_file(&self, i: usize) -> PathBuf {
        self.replicas[i].dir.join("clock-offset")
    }

    /// Sets the wall clocks of `replicas` `ms` from the host's (a running
    /// process reads its file again every 10 ms; this waits for that).
    pub fn step_clocks(&self, replicas: &[usize], ms: i64) {
        for &i in replicas {
            std::fs::write(self.clock_file(i), ms.to_string()).unwrap();
        }
        std::thread::sleep(Duration::from_millis(50));
    }

    /// Starts replica `i` (without waiting for it to be ready).
    pub fn start(&mut self, i: usize) {
        self.start_with_env(i, &[]);
    }

    /// Starts replica `i` with more environment variables.
    pub fn start_with_env(&mut self, i: usize, env: &[(&str, &str)]) {
        self.start_bin(i, &bin(), env);
    }

    /// Starts replica `i` as build `binary` (another build side by side),
    /// with more environment variables.
    pub fn start_bin(&mut self, i: usize, binary: &std::path::Path, env: &[(&str, &str)]) {
        let clock_file = self.clock_file(i);
        let r = &mut self.replicas[i];
        assert!(r.process.is_none(), "replica {} already runs", r.id);
        let mut command = Command::new(binary);
        command.args(["run", "--config"]).arg(&r.config);
        if self.clock_files {
            command.env("SPOOLD_TEST_CLOCK_FILE", clock_file);
        }
        command.envs(env.iter().copied());
        r.process = Some(spawn_command(&mut command));
    }

    /// Starts every replica and waits until each is ready (knows a primary).
    pub async fn start_all(&mut self) {
        for i in 0..self.replicas.len() {
            self.start(i);
        }
        for r in &self.replicas {
            wait_ready(r.process.as_ref().unwrap()).await;
        }
    }

    /// `kill -9` of replica `i`.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut p) = self.replicas[i].process.take() {
            p.signal("-KILL");
            p.wait_exit();
        }
    }

    /// Waits for replica `i` to exit on its own (a fail point ended it):
    /// its exit code and its log.
    pub fn wait_exited(&mut self, i: usize) -> (i32, String) {
        let mut p = self.replicas[i]
            .process
            .take()
            .expect("the replica was running");
        let code = p.wait_exit();
        (code, p.log())
    }

    /// The last lines of every running replica's log (for a failure).
    pub fn dump_logs(&self, lines: usize) {
        for r in &self.replicas {
            if let Some(p) = &r.process {
                let log = p.log();
                let all: Vec<&str> = log.lines().filter(|l| !l.contains(" openraft::")).collect();
                eprintln!("---- node {} ----", r.id);
                for l in &all[all.len().saturating_sub(lines)..] {
                    eprintln!("{l}");
                }
            }
        }
    }

    pub fn running(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.replicas.len()).filter(|&i| self.replicas[i].process.is_some())
    }

    /// `GET /v1/cluster` of replica `i`.
    pub async fn status(&self, i: usize) -> Option<Value> {
        let r = client()
            .get(format!("{}/v1/cluster", self.replicas[i].base()))
            .timeout(Duration::from_secs(2))
            .send()
            .await
            .ok()?;
        (r.status() == StatusCode::OK).then_some(())?;
        r.json().await.ok()
    }

    /// The running replica that says it is the primary and serves (its
    /// `/readyz` is 200 and a follower names it), waiting up to `within`.
    pub async fn primary(&self, within: Duration) -> usize {
        super::eventually("a primary that serves", within, async || {
            for i in self.running() {
                if let Some(s) = self.status(i).await
                    && s["role"] == "primary"
                {
                    let probe = client()
                        .get(format!("{}/v1/queues", self.replicas[i].base()))
                        .timeout(Duration::from_secs(2))
                        .send()
                        .await;
                    if probe.is_ok_and(|r| r.status() == StatusCode::OK) {
                        return Some(i);
                    }
                }
            }
            None
        })
        .await
    }

    /// `GET /v1/cluster?digest=true` of replica `i`: its applied index and
    /// the digest of its state (every message, queue and dedup key).
    pub async fn digest(&self, i: usize) -> Option<(u64, String)> {
        let r = client()
            .get(format!(
                "{}/v1/cluster?digest=true",
                self.replicas[i].base()
            ))
            .timeout(Duration::from_secs(5))
            .send()
            .await
            .ok()?;
        let v: Value = r.json().await.ok()?;
        let d = &v["stateDigest"];
        Some((
            d["appliedIndex"].as_u64()?,
            d["sha256"].as_str()?.to_owned(),
        ))
    }
}

impl TestCluster {
    /// Waits (at most `within`) until replicas `of` report the same
    /// applied index and digest; their logs and status if they do not.
    pub async fn same_state(&self, of: &[usize], within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            let mut digests = Vec::new();
            for &i in of {
                digests.push(self.digest(i).await);
            }
            if digests[0].is_some() && digests.iter().all(|d| *d == digests[0]) {
                return;
            }
            if Instant::now() > deadline {
                self.dump_logs(30);
                for &i in of {
                    eprintln!("status of {i}: {:?}", self.status(i).await);
                }
                panic!("replicas {of:?} differ: {digests:?}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// Every message id of `queue`, as the replica at `base` serves them
/// (pages of up to 1 000, each from the `next` of the one before). A page
/// refused (`503` while a primary settles) is asked for again.
pub async fn all_ids(base: &str, queue: &str) -> std::collections::BTreeSet<String> {
    let mut ids = std::collections::BTreeSet::new();
    let mut after: Option<String> = None;
    loop {
        let mut url = format!("{base}/v1/queues/{queue}/messages?limit=1000");
        if let Some(a) = &after {
            url.push_str(&format!("&after={a}"));
        }
        let page: Value =
            super::eventually("a page of messages", Duration::from_secs(20), async || {
                let page: Value = client().get(&url).send().await.ok()?.json().await.ok()?;
                page["messages"].is_array().then_some(page)
            })
            .await;
        let messages = page["messages"].as_array().expect("checked");
        for m in messages {
            ids.insert(m["id"].as_str().unwrap().to_owned());
        }
        // A page ends at 1 000 messages or 4 MiB; `next` continues it.
        match page["next"].as_str() {
            Some(next) => after = Some(next.to_owned()),
            None => return ids,
        }
    }
}

/// Holds `n` connections to `port` that each sent one byte and say no
/// more, as someone without the cluster's secret can: one that is closed
/// is opened again at once, until `stop`.
pub fn hold_one_byte(port: u16, n: usize, stop: std::sync::Arc<std::sync::atomic::AtomicBool>) {
    use std::sync::atomic::Ordering;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    for _ in 0..n {
        let stop = stop.clone();
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let Ok(mut s) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await else {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                };
                if s.write_all(b"P").await.is_ok() {
                    let mut rest = [0u8; 256];
                    // Until the listener closes it, or the flood stops.
                    while !stop.load(Ordering::Relaxed) {
                        match tokio::time::timeout(Duration::from_millis(500), s.read(&mut rest))
                            .await
                        {
                            Err(_) | Ok(Ok(1..)) => {}
                            Ok(_) => break,
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        });
    }
}
