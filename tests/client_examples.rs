//! The client examples of `examples/clients` (Python, Node, Go: the lease
//! protocol and a forward with an idempotency key) run against a server
//! with an API key, and leave what they promise: the message acked, the
//! forward stored once. They need their language's tool; `.ci/run`
//! installs them.

mod common;

use std::process::Command;

use common::server::Server;
use serde_json::Value;

async fn run_example(program: &str, args: &[&str], dir: &str) {
    let server = Server::temp("api_keys = [\"k1\"]").await;
    let root = env!("CARGO_MANIFEST_DIR");
    let out = Command::new(program)
        .args(args)
        .current_dir(format!("{root}/{dir}"))
        .env("SPOOLD_URL", format!("http://{}", server.addr()))
        .env("SPOOLD_API_KEY", "k1")
        .env("GOFLAGS", "-mod=mod")
        .output()
        .unwrap_or_else(|e| panic!("{program}: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{program} {args:?}: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.starts_with("ok "), "{stdout}");
    let stats = server.get_json("/v1/queues/examples").await["stats"].clone();
    assert_eq!(stats["visible"], 0, "acked: {stats}");
    assert_eq!(stats["ackedTotal"], 1, "{stats}");
    assert_eq!(stats["nackedTotal"], 1, "{stats}");
    let hooks: Value = server.get_json("/v1/queues/examples-hooks").await;
    assert_eq!(hooks["stats"]["sentTotal"], 1, "stored once: {hooks}");
    assert_eq!(hooks["stats"]["deduplicatedTotal"], 1, "{hooks}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs python3 (.ci/run has it)"]
async fn the_python_example_runs() {
    run_example("python3", &["lease.py"], "examples/clients/python").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs node 18+ (.ci/run has it)"]
async fn the_node_example_runs() {
    run_example("node", &["lease.mjs"], "examples/clients/node").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs go (Debian's golang-go; .ci/run installs it)"]
async fn the_go_example_runs() {
    run_example("go", &["run", "."], "examples/clients/go").await;
}
