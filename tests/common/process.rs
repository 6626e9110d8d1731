//! The real binary as a child process, for tests that kill or signal it.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use reqwest::{Client, StatusCode};
use serde_json::Value;

pub const BIN: &str = env!("CARGO_BIN_EXE_spoold");

/// The binary under test: this build's, or another named by
/// `SPOOLD_TEST_BIN` (to show a regression test fails on an older release).
pub fn bin() -> PathBuf {
    std::env::var_os("SPOOLD_TEST_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(BIN))
}

/// A spoold process; killed if a failing test leaves it behind.
pub struct Spoold {
    pub child: Child,
    pub base: String,
    /// Everything the process wrote to stderr (its log) so far.
    pub log: Arc<Mutex<String>>,
    /// The thread that reads the log; done once the process has exited.
    reader: Option<std::thread::JoinHandle<()>>,
    api: super::api::Api,
}

impl Spoold {
    /// A client for this process (without an API key).
    pub fn api(&self) -> &super::api::Api {
        &self.api
    }

    /// The log written so far.
    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// The log once it holds `needle` (waits at most 10 s): a line the
    /// process writes after it answers, or that the reader thread has not
    /// yet copied from the pipe, is not there the moment a test looks.
    pub async fn log_with(&self, needle: &str) -> String {
        super::eventually(
            &format!("{needle:?} in the log"),
            Duration::from_secs(10),
            async || {
                let log = self.log();
                log.contains(needle).then_some(log)
            },
        )
        .await
    }

    /// Sends a signal (`"-TERM"`, `"-INT"`) to the process.
    pub fn signal(&self, sig: &str) {
        let status = Command::new("kill")
            .args([sig, &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success(), "kill {sig}");
    }

    /// Waits (at most 30 s) for the process to exit; its exit code. The
    /// whole log is in [`Spoold::log`] once this returns.
    pub fn wait_exit(&mut self) -> i32 {
        let status = super::eventually_blocking("spoold to exit", Duration::from_secs(30), || {
            self.child.try_wait().unwrap()
        });
        if let Some(reader) = self.reader.take() {
            reader.join().unwrap();
        }
        status.code().unwrap_or(-1)
    }

    /// SIGTERM, then waits for the exit; its exit code.
    pub fn stop(&mut self) -> i32 {
        self.signal("-TERM");
        self.wait_exit()
    }
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
    start_command(&mut run_command(&config)).await
}

/// `spoold run --config <config>`, to start with [`start_command`] or
/// [`spawn_command`] once the test has set its environment.
pub fn run_command(config: &Path) -> Command {
    let mut command = Command::new(bin());
    command.args(["run", "--config"]).arg(config);
    command
}

/// What a run of the binary to its end said.
pub struct Ran {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

/// Runs the binary with `args` in the working directory `cwd` to its end.
pub fn run_in(cwd: &Path, args: &[&str]) -> Ran {
    let out = Command::new(bin())
        .args(args)
        .current_dir(cwd)
        .env("NO_COLOR", "1")
        .env_remove("SPOOLD_API_KEYS")
        .output()
        .unwrap();
    Ran {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// `spoold --url BASE ARGS…` to its end (as [`run_in`], in the temporary
/// directory), off the runtime's threads.
pub async fn cli(base: &str, args: &[&str]) -> Ran {
    let mut all = vec!["--url".to_owned(), base.to_owned()];
    all.extend(args.iter().map(|a| a.to_string()));
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = all.iter().map(String::as_str).collect();
        run_in(std::env::temp_dir().as_path(), &args)
    })
    .await
    .unwrap()
}

/// Runs the binary with `args`, writing `stdin` to its standard input, to
/// its end (no `NO_COLOR`, no keys from the environment).
pub fn run_input(args: &[&str], stdin: &str) -> std::process::Output {
    let mut child = Command::new(bin())
        .args(args)
        .env_remove("SPOOLD_API_KEY")
        .env_remove("SPOOLD_API_KEYS")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), stdin.as_bytes()).unwrap();
    child.wait_with_output().unwrap()
}

/// `spoold run --config config` (without `SPOOLD_API_KEYS`): what it said
/// if it stopped within 20 s (it refused the config or the spool), None if
/// it served (then it is killed).
pub fn run_refuses(config: &Path) -> Option<Ran> {
    let mut child = Command::new(bin())
        .args(["run", "--config"])
        .arg(config)
        .current_dir(config.parent().unwrap())
        .env_remove("SPOOLD_API_KEYS")
        .env("NO_COLOR", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if child.try_wait().unwrap().is_some() {
            let out = child.wait_with_output().unwrap();
            return Some(Ran {
                code: out.status.code().unwrap_or(-1),
                stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
                stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            });
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}

/// Starts the binary with `args` in the working directory `cwd` and returns
/// once it is ready.
pub async fn start_in(cwd: &Path, args: &[&str]) -> Spoold {
    start_command(Command::new(bin()).args(args).current_dir(cwd)).await
}

/// Starts `command` (a `spoold run`, with its environment) and returns once
/// the process is ready. Logs at `info` unless the command sets
/// `SPOOLD_LOG`.
pub async fn start_command(command: &mut Command) -> Spoold {
    let spoold = spawn_command(command);
    wait_ready(&spoold).await;
    spoold
}

/// Waits (at most 60 s) until `spoold` answers `/readyz` with 200. A
/// debug build replaying, or a replica finding its primary, while seven
/// 3-replica clusters share two cores took over 30 s in CI twice.
pub async fn wait_ready(spoold: &Spoold) {
    let client = client();
    super::eventually(
        "spoold to become ready",
        Duration::from_secs(60),
        async || {
            let r = client
                .get(format!("{}/readyz", spoold.base))
                .send()
                .await
                .ok()?;
            (r.status() == StatusCode::OK).then_some(())
        },
    )
    .await
}

/// Starts `command` and returns once it logged the address it listens on
/// (before it is ready: a replica is ready only once a primary is known).
pub fn spawn_command(command: &mut Command) -> Spoold {
    if !command.get_envs().any(|(name, _)| name == "SPOOLD_LOG") {
        command.env("SPOOLD_LOG", "info");
    }
    // No NO_COLOR: the log goes to a pipe, so spoold writes no colour.
    let mut child = command
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let log = Arc::new(Mutex::new(String::new()));
    let sink = log.clone();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let mut log = sink.lock().unwrap();
            log.push_str(&line);
            log.push('\n');
            drop(log);
            if let Some(rest) = line.split("addr=").nth(1) {
                let addr: String = rest.chars().take_while(|c| !c.is_whitespace()).collect();
                let _ = tx.send(addr);
            }
        }
    });
    let addr = rx
        .recv_timeout(Duration::from_secs(30))
        .unwrap_or_else(|e| {
            // Said with what it logged: why it did not start.
            panic!(
                "spoold logged no address ({e}); its log:\n{}",
                log.lock().unwrap()
            )
        });
    let addr = addr.trim_matches(|c: char| !(c.is_ascii_alphanumeric() || c == ':' || c == '.'));
    let base = format!("http://{addr}");
    Spoold {
        child,
        api: super::api::Api::new(base.clone(), None),
        base,
        log,
        reader: Some(reader),
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
    spoold::testing::install_crypto_provider();
    Client::new()
}

/// `PUT /v1/queues/{queue}`: the status and the JSON answer (null if none).
pub async fn put(
    client: &Client,
    base: &str,
    queue: &str,
    settings: &Value,
) -> (StatusCode, Value) {
    let r = client
        .put(format!("{base}/v1/queues/{queue}"))
        .json(settings)
        .send()
        .await
        .unwrap();
    let status = r.status();
    (status, r.json().await.unwrap_or(Value::Null))
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

/// Sends `x` to `queue` of the spoold at `base`, delayed by `delay`
/// seconds (`Spooler-Delay`): the new message's id.
pub async fn send_delayed(base: &str, queue: &str, delay: u64) -> String {
    let r = client()
        .post(format!("{base}/v1/queues/{queue}/messages"))
        .header("spooler-delay", delay.to_string())
        .body("x")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    r.json::<Value>().await.unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// Leases a message of `queue` (polling up to `within`): its id.
pub async fn receive_id(base: &str, queue: &str, within: Duration) -> Option<String> {
    let started = std::time::Instant::now();
    while started.elapsed() < within {
        let r = client()
            .post(format!("{base}/v1/queues/{queue}/receive"))
            .send()
            .await
            .unwrap();
        if r.status() == StatusCode::OK {
            let id = r.headers()["spooler-message-id"].to_str().unwrap();
            return Some(id.to_owned());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    None
}

/// The newest checkpoint file in the spool directory `spool`, if any: names
/// are the checkpoint's record index in fixed-width hex, so the greatest
/// name is the newest.
pub fn newest_checkpoint(spool: &Path) -> Option<String> {
    std::fs::read_dir(spool)
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|name| name.ends_with(".ckpt"))
        .max()
}

/// Waits until compaction has written a checkpoint newer than `before`
/// (what [`newest_checkpoint`] said before the writes it should cover).
pub async fn wait_for_checkpoint(spool: &Path, before: Option<String>) {
    super::wait_until("a new checkpoint", async || {
        newest_checkpoint(spool) > before
    })
    .await
}
