//! The real binary as a child process, for tests that kill or signal it.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use reqwest::{Client, StatusCode};
use serde_json::Value;

pub const BIN: &str = env!("CARGO_BIN_EXE_spoold");

/// A spoold process; killed if a failing test leaves it behind.
pub struct Spoold {
    pub child: Child,
    pub base: String,
}

impl Drop for Spoold {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts spoold on a free port with its spool in `dir`; returns once it is
/// ready.
pub async fn start(dir: &Path) -> Spoold {
    start_with(dir, "", "").await
}

/// Like [`start`], with more `[server]` keys and more tables (queues).
pub async fn start_with(dir: &Path, server_keys: &str, tables: &str) -> Spoold {
    let spool_keys = "segment_bytes = \"1MiB\"";
    start_config(dir, server_keys, spool_keys, tables).await
}

/// Like [`start_with`], with the `[spool]` keys (but `dir`) given too.
pub async fn start_config(dir: &Path, server_keys: &str, spool_keys: &str, tables: &str) -> Spoold {
    let config = write_config(dir, server_keys, spool_keys, tables);
    start_command(Command::new(BIN).args(["run", "--config"]).arg(&config)).await
}

/// Starts `command` (a `spoold run`, with its environment) and returns once
/// the process is ready.
pub async fn start_command(command: &mut Command) -> Spoold {
    let mut child = command
        .env("SPOOLD_LOG", "info")
        .env("NO_COLOR", "1")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Some(rest) = line.split("addr=").nth(1) {
                let addr: String = rest.chars().take_while(|c| !c.is_whitespace()).collect();
                let _ = tx.send(addr);
            }
        }
    });
    let addr = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("spoold logged its address");
    let addr = addr.trim_matches(|c: char| !(c.is_ascii_alphanumeric() || c == ':' || c == '.'));
    let spoold = Spoold {
        child,
        base: format!("http://{addr}"),
    };
    let client = client();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(r) = client.get(format!("{}/readyz", spoold.base)).send().await
            && r.status() == StatusCode::OK
        {
            return spoold;
        }
        assert!(Instant::now() < deadline, "spoold never became ready");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Writes `dir/spoold.toml` (listening on a free port, spool in
/// `dir/spool`) and returns its path.
pub fn write_config(dir: &Path, server_keys: &str, spool_keys: &str, tables: &str) -> PathBuf {
    let config = dir.join("spoold.toml");
    std::fs::write(
        &config,
        format!(
            "[server]\nlisten = \"127.0.0.1:0\"\n{server_keys}\n[spool]\ndir = \"{}\"\n{spool_keys}\n{tables}\n",
            dir.join("spool").display()
        ),
    )
    .unwrap();
    config
}

/// An HTTP client for talking to spoold (the crypto provider installed).
pub fn client() -> Client {
    spoold::delivery::client::install_crypto_provider();
    Client::new()
}

/// `GET /v1/queues/{queue}`: name, settings and stats.
pub async fn queue_json(client: &Client, base: &str, queue: &str) -> Value {
    let url = format!("{base}/v1/queues/{queue}");
    client.get(url).send().await.unwrap().json().await.unwrap()
}

/// Every message of `queue`, as peeked, oldest first (all pages).
pub async fn messages_in(client: &Client, base: &str, queue: &str) -> Vec<Value> {
    let mut all = Vec::new();
    let mut after = String::new();
    loop {
        let url = format!("{base}/v1/queues/{queue}/messages?limit=1000{after}");
        let page: Value = client.get(url).send().await.unwrap().json().await.unwrap();
        let messages = page["messages"].as_array().unwrap();
        let Some(last) = messages.last() else {
            return all;
        };
        after = format!("&after={}", last["id"].as_str().unwrap());
        all.extend(messages.iter().cloned());
    }
}

pub async fn ids_in(client: &Client, base: &str, queue: &str) -> BTreeSet<String> {
    messages_in(client, base, queue)
        .await
        .iter()
        .map(|m| m["id"].as_str().unwrap().to_string())
        .collect()
}
