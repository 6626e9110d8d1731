//! The client examples of `examples/clients` (Python, Node, Go: the lease
//! protocol and a forward with an idempotency key) run against a server
//! with an API key, and leave what they promise: the message acked, the
//! forward stored once. The clients generated from the OpenAPI document
//! (`examples/clients/generated`: openapi-python-client, openapi-typescript
//! with openapi-fetch) send, receive, ack and forward through the binary.
//! They need their language's tool; `.ci/run` installs them.

use crate::common;

use std::process::Command;

use crate::common::server::Server;
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

/// Generates both clients from `docs/openapi.json` (once per test run).
fn generated_clients() -> &'static std::path::Path {
    static OUT: std::sync::OnceLock<tempfile::TempDir> = std::sync::OnceLock::new();
    OUT.get_or_init(|| {
        let out = tempfile::tempdir().unwrap();
        let root = env!("CARGO_MANIFEST_DIR");
        let ran = Command::new("bash")
            .arg(format!("{root}/examples/clients/generated/generate.sh"))
            .arg(format!("{root}/docs/openapi.json"))
            .arg(out.path())
            .output()
            .unwrap();
        assert!(
            ran.status.success(),
            "generate.sh: {}{}",
            String::from_utf8_lossy(&ran.stdout),
            String::from_utf8_lossy(&ran.stderr)
        );
        out
    })
    .path()
}

/// Runs a generated client's smoke test against the binary; checks what
/// it left: its message acked, its forward delivered to the sink.
async fn run_generated(command: &mut Command, queue: &str) {
    let (sink, sink_url) = common::sink::Sink::start().await;
    let dir = tempfile::tempdir().unwrap();
    let keys = "api_keys = [\"key-0123456789abcdef\", \
                { key = \"tenant-key-0123456789\", tenant = \"cus_smoke\" }]";
    let portal = "[portal]\nsecret = \"portal-secret-0123456789\"\n";
    let spoold = common::process::start_with(dir.path(), keys, portal).await;
    let open_dir = tempfile::tempdir().unwrap();
    let open = common::process::start(open_dir.path()).await;
    let out = command
        .env("SPOOLD_URL", &spoold.base)
        .env("SPOOLD_OPEN_URL", &open.base)
        .env("SPOOLD_API_KEY", "key-0123456789abcdef")
        .env("SPOOLD_TENANT_KEY", "tenant-key-0123456789")
        .env("SPOOLD_SINK", format!("{sink_url}/in"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.starts_with("ok "),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let api = common::api::Api::new(spoold.base.clone(), Some("key-0123456789abcdef".into()));
    let stats = api.get_json(&format!("/v1/queues/{queue}")).await["stats"].clone();
    assert_eq!(
        (stats["visible"].clone(), stats["ackedTotal"].clone()),
        (0.into(), 1.into()),
        "{stats}"
    );
    // Both forwards, the keyed server's and the open one's, went to the
    // multi-segment path with its query.
    let seen = sink.wait_for(2).await;
    assert!(
        seen.iter().all(|s| s.uri == "/in/v1/charges?x=1"),
        "{seen:?}"
    );
    let forwarded = stdout.split_whitespace().nth(2).unwrap();
    let keyed = seen
        .iter()
        .find(|s| s.headers["spooler-delivery-id"] == forwarded)
        .expect("the keyed server's forward");
    assert!(String::from_utf8_lossy(&keyed.body).starts_with("from "));
    assert!(
        seen.iter()
            .any(|s| String::from_utf8_lossy(&s.body).ends_with("no key"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs openapi-python-client (PyPI) and openapi-typescript (npm); .ci/run installs them"]
async fn the_generated_python_client_sends_receives_acks_and_forwards() {
    let client = generated_clients().join("python");
    let smoke = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/clients/generated/smoke.py"
    );
    run_generated(
        Command::new("python3")
            .arg(smoke)
            .env("SPOOLD_CLIENT_DIR", client),
        "generated-py",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs openapi-python-client (PyPI) and openapi-typescript (npm); .ci/run installs them"]
async fn the_generated_typescript_client_sends_receives_acks_and_forwards() {
    let smoke = generated_clients().join("ts/smoke.js");
    run_generated(Command::new("node").arg(smoke), "generated-ts").await;
}
