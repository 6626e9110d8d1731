//! The real binary: start-up on embedded defaults, the lock against a second
//! process, a clean stop on SIGINT, `journal verify` exit codes, and help
//! text on every flag.

use std::path::Path;
use std::process::Command;

use crate::common::process::{BIN, Ran, Spoold, run_in, start_in};

/// A config in `cwd` that listens on a free port, so tests can run at once.
fn port_zero_config(cwd: &Path) -> std::path::PathBuf {
    let path = cwd.join("spoold.toml");
    std::fs::write(&path, "[server]\nlisten = \"127.0.0.1:0\"\n").unwrap();
    path
}

/// Starts `spoold` in `cwd` on a free port.
async fn start(cwd: &Path) -> Spoold {
    port_zero_config(cwd);
    start_in(cwd, &["run", "--config", "spoold.toml"]).await
}

/// Starts spoold in `dir` and stops it with SIGINT, which must exit 0.
async fn start_and_stop(dir: &Path) {
    let mut spoold = start(dir).await;
    spoold.signal("-INT");
    assert_eq!(spoold.wait_exit(), 0);
}

/// Asserts a run's exit code and that `stream` (its stdout or stderr)
/// holds `text`.
fn expect(ran: &Ran, code: i32, stream: &str, text: &str) {
    assert_eq!(ran.code, code, "{}{}", ran.stdout, ran.stderr);
    assert!(stream.contains(text), "{stream}");
}

#[tokio::test]
async fn runs_on_embedded_defaults_refuses_a_second_process_and_stops_on_sigint() {
    let dir = tempfile::tempdir().unwrap();
    let mut first = start(dir.path()).await;
    assert!(
        dir.path().join("spool/spool.meta").exists(),
        "spool in ./spool"
    );

    let second = run_in(dir.path(), &[]);
    expect(
        &second,
        1,
        &second.stderr,
        "in use by another spoold process",
    );

    first.signal("-INT");
    assert_eq!(first.wait_exit(), 0);

    let verify = run_in(dir.path(), &["journal", "verify", "--dir", "spool"]);
    expect(&verify, 0, &verify.stdout, "clean");
}

#[tokio::test]
async fn verify_exits_1_and_names_the_offset_of_damage() {
    let dir = tempfile::tempdir().unwrap();
    start_and_stop(dir.path()).await;
    // A second start appends a second epoch record after the first one.
    start_and_stop(dir.path()).await;

    let segment = dir.path().join("spool/0000000000000001.seg");
    let mut bytes = std::fs::read(&segment).unwrap();
    // The first record starts right after the 64-byte header.
    bytes[64 + 24] ^= 0x01;
    std::fs::write(&segment, &bytes).unwrap();

    let verify = run_in(dir.path(), &["journal", "verify", "--dir", "spool"]);
    expect(&verify, 1, &verify.stdout, "offset 64");
    let refused = run_in(dir.path(), &["run", "--config", "spoold.toml"]);
    expect(
        &refused,
        1,
        &refused.stderr,
        "0000000000000001.seg at offset 64",
    );
    let repair = run_in(dir.path(), &["journal", "repair", "--dir", "spool"]);
    expect(&repair, 0, &repair.stdout, "quarantined");
    assert!(
        dir.path()
            .join("spool/0000000000000001.seg.64.quarantine")
            .exists()
    );
    let compact = run_in(dir.path(), &["journal", "compact", "--dir", "spool"]);
    expect(&compact, 0, &compact.stdout, "");
    let verify = run_in(dir.path(), &["journal", "verify", "--dir", "spool"]);
    expect(&verify, 0, &verify.stdout, "clean");
    start_and_stop(dir.path()).await;
}

#[test]
fn verify_of_an_empty_directory_is_clean_and_bad_config_names_key_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let verify = run_in(dir.path(), &["journal", "verify", "--dir", "."]);
    expect(&verify, 0, &verify.stdout, "");

    std::fs::write(
        dir.path().join("bad.toml"),
        "[spool]\ndir = \"x\"\nsegment_bytes = \"huge\"\n",
    )
    .unwrap();
    let bad = run_in(dir.path(), &["check-config", "--config", "bad.toml"]);
    expect(&bad, 1, &bad.stderr, "line 3");
}

#[test]
fn every_shipped_config_passes_check_config() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    for file in [
        "config.example.toml",
        "deploy/kubernetes/base/spoold.toml",
        "deploy/kubernetes/statefulset/spoold.toml",
        "deploy/kubernetes/cluster/spoold-0.toml",
        "deploy/kubernetes/cluster/spoold-1.toml",
        "deploy/kubernetes/cluster/spoold-2.toml",
    ] {
        // The manifests give the pod its keys from a Secret, as
        // SPOOLD_API_KEYS: check-config checks the exposure with them.
        let out = Command::new(BIN)
            .args(["check-config", "--config"])
            .arg(root.join(file))
            .env("SPOOLD_API_KEYS", "a-key-from-the-secret")
            .env("SPOOLD_CLUSTER_SECRET", "a-cluster-secret-from-the-secret")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{file}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let printed = String::from_utf8_lossy(&out.stdout);
        assert!(
            !printed.contains("whsec_ZXhh"),
            "secrets are hidden: {file}"
        );
    }
}

/// Every flag of every command says what it does in `--help`.
#[test]
fn every_flag_has_help_text() {
    let dir = tempfile::tempdir().unwrap();
    let commands: &[&[&str]] = &[
        &[],
        &["run"],
        &["check-config"],
        &["openapi"],
        &["queues"],
        &["tail"],
        &["send"],
        &["dlq", "list"],
        &["dlq", "show"],
        &["dlq", "redrive"],
        &["dlq", "purge"],
        &["journal", "verify"],
        &["journal", "repair"],
        &["journal", "compact"],
        &["journal", "upgrade"],
    ];
    for command in commands {
        let mut args = command.to_vec();
        args.push("--help");
        let help = run_in(dir.path(), &args);
        assert_eq!(help.code, 0, "{args:?}: {}", help.stderr);
        let flags: Vec<&str> = help
            .stdout
            .lines()
            .filter(|l| l.starts_with("  -") || l.starts_with("      --"))
            .collect();
        assert!(!flags.is_empty(), "{args:?}");
        for line in flags {
            // "  -n, --lines <N>  First print …": a description after the
            // flag and its value.
            let described = line
                .trim_start()
                .split("  ")
                .filter(|part| !part.trim().is_empty())
                .count()
                >= 2;
            assert!(described, "{args:?}: no help for {line:?}");
        }
    }
}
