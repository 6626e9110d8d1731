//! The real binary: start-up on embedded defaults, the lock against a second
//! process, a clean stop on SIGINT, and `journal verify` exit codes.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_spoold");

/// A config in `cwd` that listens on a free port, so tests can run at once.
fn port_zero_config(cwd: &Path) -> std::path::PathBuf {
    let path = cwd.join("spoold.toml");
    std::fs::write(&path, "[server]\nlisten = \"127.0.0.1:0\"\n").unwrap();
    path
}

/// Starts `spoold` in `cwd` (with `args`) and waits (bounded) for its
/// "ready" log.
fn start_with(cwd: &Path, args: &[&str]) -> Spoold {
    let mut child = Spoold(
        Command::new(BIN)
            .args(args)
            .current_dir(cwd)
            .env("SPOOLD_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if line.contains(" ready") {
                let _ = tx.send(());
            }
        }
    });
    rx.recv_timeout(Duration::from_secs(30))
        .expect("spoold logged `ready`");
    child
}

/// Starts `spoold` in `cwd` on a free port.
fn start(cwd: &Path) -> Spoold {
    port_zero_config(cwd);
    start_with(cwd, &["run", "--config", "spoold.toml"])
}

/// A running spoold that a failing test cannot leave behind.
struct Spoold(Child);

impl std::ops::Deref for Spoold {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.0
    }
}

impl std::ops::DerefMut for Spoold {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}

impl Drop for Spoold {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn signal(child: &Child, sig: &str) {
    let status = Command::new("kill")
        .args([sig, &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

fn wait_exit(child: &mut Child) -> i32 {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status.code().unwrap_or(-1);
        }
        assert!(Instant::now() < deadline, "spoold did not exit");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn runs_on_embedded_defaults_refuses_a_second_process_and_stops_on_sigint() {
    let dir = tempfile::tempdir().unwrap();
    let mut first = start(dir.path());
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

    signal(&first, "-INT");
    assert_eq!(wait_exit(&mut first), 0);

    let verify = Command::new(BIN)
        .args(["journal", "verify", "--dir", "spool"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&verify.stdout);
    assert_eq!(verify.status.code(), Some(0), "{out}");
    assert!(out.contains("clean"), "{out}");
}

#[test]
fn verify_exits_1_and_names_the_offset_of_damage() {
    let dir = tempfile::tempdir().unwrap();
    let mut first = start(dir.path());
    signal(&first, "-INT");
    wait_exit(&mut first);
    // A second start appends a second epoch record after the first one.
    let mut again = start(dir.path());
    signal(&again, "-INT");
    wait_exit(&mut again);

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
    let mut started = start(dir.path());
    signal(&started, "-INT");
    assert_eq!(wait_exit(&mut started), 0);
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
        let out = Command::new(BIN)
            .args(["check-config", "--config"])
            .arg(root.join(file))
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
