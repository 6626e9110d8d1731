//! The real binary: start-up on embedded defaults, the lock against a second
//! process, a clean stop on SIGINT, and `journal verify` exit codes.

mod common;

use std::path::Path;
use std::process::Command;

use common::process::{BIN, Spoold, start_in};

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

#[tokio::test]
async fn runs_on_embedded_defaults_refuses_a_second_process_and_stops_on_sigint() {
    let dir = tempfile::tempdir().unwrap();
    let mut first = start(dir.path()).await;
    assert!(
        dir.path().join("spool/spool.meta").exists(),
        "spool in ./spool"
    );

    let second = Command::new(BIN).current_dir(dir.path()).output().unwrap();
    assert_eq!(second.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert!(
        stderr.contains("in use by another spoold process"),
        "{stderr}"
    );

    first.signal("-INT");
    assert_eq!(first.wait_exit(), 0);

    let verify = Command::new(BIN)
        .args(["journal", "verify", "--dir", "spool"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&verify.stdout);
    assert_eq!(verify.status.code(), Some(0), "{out}");
    assert!(out.contains("clean"), "{out}");
}

#[tokio::test]
async fn verify_exits_1_and_names_the_offset_of_damage() {
    let dir = tempfile::tempdir().unwrap();
    let mut first = start(dir.path()).await;
    first.signal("-INT");
    first.wait_exit();
    // A second start appends a second epoch record after the first one.
    let mut again = start(dir.path()).await;
    again.signal("-INT");
    again.wait_exit();

    let segment = dir.path().join("spool/0000000000000001.seg");
    let mut bytes = std::fs::read(&segment).unwrap();
    // The first record starts right after the 64-byte header.
    bytes[64 + 24] ^= 0x01;
    std::fs::write(&segment, &bytes).unwrap();

    let verify = Command::new(BIN)
        .args(["journal", "verify", "--dir"])
        .arg(dir.path().join("spool"))
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&verify.stdout);
    assert_eq!(verify.status.code(), Some(1), "{out}");
    assert!(out.contains("offset 64"), "{out}");

    let start_again = Command::new(BIN)
        .args(["run", "--config", "spoold.toml"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&start_again.stderr);
    assert_eq!(start_again.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("0000000000000001.seg at offset 64"),
        "{stderr}"
    );

    let repair = Command::new(BIN)
        .args(["journal", "repair", "--dir", "spool"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&repair.stdout);
    assert_eq!(repair.status.code(), Some(0), "{out}");
    assert!(out.contains("quarantined"), "{out}");
    assert!(
        dir.path()
            .join("spool/0000000000000001.seg.64.quarantine")
            .exists()
    );

    let compact = Command::new(BIN)
        .args(["journal", "compact", "--dir", "spool"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert_eq!(
        compact.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&compact.stderr)
    );

    let verify = Command::new(BIN)
        .args(["journal", "verify", "--dir", "spool"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&verify.stdout);
    assert_eq!(verify.status.code(), Some(0), "{out}");
    let mut started = start(dir.path()).await;
    started.signal("-INT");
    assert_eq!(started.wait_exit(), 0);
}

#[test]
fn verify_of_an_empty_directory_is_clean_and_bad_config_names_key_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let verify = Command::new(BIN)
        .args(["journal", "verify", "--dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert_eq!(verify.status.code(), Some(0));

    let config = dir.path().join("bad.toml");
    std::fs::write(&config, "[spool]\ndir = \"x\"\nsegment_bytes = \"huge\"\n").unwrap();
    let out = Command::new(BIN)
        .args(["check-config", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("line 3"), "{stderr}");
}

#[test]
fn every_shipped_config_passes_check_config() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    for file in [
        "config.example.toml",
        "deploy/kubernetes/base/spoold.toml",
        "deploy/kubernetes/statefulset/spoold.toml",
    ] {
        // The manifests give the pod its keys from a Secret, as
        // SPOOLD_API_KEYS: check-config checks the exposure with them.
        let out = Command::new(BIN)
            .args(["check-config", "--config"])
            .arg(root.join(file))
            .env("SPOOLD_API_KEYS", "a-key-from-the-secret")
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
