//! Helpers shared by the integration tests.
#![allow(dead_code)]

pub mod api;
pub mod cluster;
pub mod links;
pub mod mount;
pub mod otlp;
pub mod process;
pub mod raw;
pub mod server;
pub mod sink;
pub mod wires;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use spoold::engine::{Engine, EngineOptions, SendRequest};
use spoold::spool::QueueSettings;
use spoold::testing::JournalError;
use spoold::testing::SimStorage;
use spoold::time::ManualClock;

pub const START_MS: i64 = 1_800_000_000_000;

/// A minute after `tests/data/v2-level5` was written (its last record is
/// of 2026-12-06 18:47:28 UTC): the clock its tests run on, so that its
/// delay, dedup windows, history and secrets' overlaps are as they were
/// then, whatever today's date.
pub const V2_LEVEL5_NOW_MS: i64 = 1_796_582_910_000;

pub fn sim_dir() -> PathBuf {
    PathBuf::from("/spool")
}

pub fn sim_options(sim: &SimStorage, clock: &ManualClock) -> EngineOptions {
    EngineOptions {
        dir: sim_dir(),
        segment_bytes: 64 << 20,
        fsync: true,
        storage: Arc::new(sim.clone()),
        clock: Arc::new(clock.clone()),
        lock: false,
        // Most tests keep files small; the ones about preallocation turn it
        // on with small segments.
        preallocate: false,
        max_bytes: u64::MAX,
        max_memory: u64::MAX,
        quarantine_corruption: false,
        policy: Default::default(),
        replicated: None,
        identity: None,
    }
}

/// Copies `tests/data/NAME` (a spool an earlier build wrote, or a
/// directory of them: `tests/data/README.md`) to `to`: a test opens the
/// copy, since opening a spool changes it.
pub fn copy_fixture(name: &str, to: &Path) {
    copy_dir(
        &Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/data")
            .join(name),
        to,
    );
}

/// Copies directory `from` (a spool, or a directory of them) into `to`,
/// which it creates.
pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

pub async fn open(sim: &SimStorage, clock: &ManualClock) -> Result<Engine, JournalError> {
    Engine::open(sim_options(sim, clock)).await.map(|(e, _)| e)
}

pub fn body(text: &str) -> SendRequest {
    spoold::testing::text_message(text.to_owned())
}

pub async fn make_queue(engine: &Engine, name: &str, settings: QueueSettings) {
    engine
        .upsert_queue(name, settings, spoold::engine::Origin::Api)
        .await
        .expect("create queue");
}

/// Polls `check` until it gives a value (every 20 ms, at most `timeout`):
/// how a test waits for something to happen instead of sleeping.
pub async fn eventually<T>(
    what: &str,
    timeout: std::time::Duration,
    mut check: impl AsyncFnMut() -> Option<T>,
) -> T {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// [`eventually`] for code that is not async: polls `check` every 20 ms
/// (blocking the thread in between), at most `timeout`.
pub fn eventually_blocking<T>(
    what: &str,
    timeout: std::time::Duration,
    mut check: impl FnMut() -> Option<T>,
) -> T {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        if let Some(value) = check() {
            return value;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Waits (at most 30 s) until `check` holds.
pub async fn wait_until(what: &str, mut check: impl AsyncFnMut() -> bool) {
    eventually(what, std::time::Duration::from_secs(30), async || {
        check().await.then_some(())
    })
    .await
}

/// HMAC-SHA256 (RFC 2104), written out: what a Standard Webhooks
/// receiver computes to check a `webhook-signature`.
pub fn hmac_sha256(key: &[u8], message: &[u8]) -> Vec<u8> {
    use sha2::{Digest, Sha256};
    let mut k = [0u8; 64];
    if key.len() > 64 {
        k[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        k[..key.len()].copy_from_slice(key);
    }
    let inner: Vec<u8> = k.iter().map(|b| b ^ 0x36).collect();
    let outer: Vec<u8> = k.iter().map(|b| b ^ 0x5c).collect();
    let mut h = Sha256::new();
    h.update(&inner);
    h.update(message);
    let inner_hash = h.finalize();
    let mut h = Sha256::new();
    h.update(&outer);
    h.update(inner_hash);
    h.finalize().to_vec()
}

/// The secrets among `secrets` that signed `seen`, by position.
pub fn signed_by(seen: &sink::Seen, secrets: &[&str]) -> Vec<usize> {
    let header = |name: &str| seen.headers[name].to_str().unwrap().to_owned();
    let signed = format!(
        "{}.{}.{}",
        header("webhook-id"),
        header("webhook-timestamp"),
        String::from_utf8_lossy(&seen.body)
    );
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD;
    let signatures = header("webhook-signature");
    let mut by = Vec::new();
    for signature in signatures.split(' ') {
        let value = signature.strip_prefix("v1,").unwrap();
        let i = secrets.iter().position(|s| {
            let key = b64.decode(s.strip_prefix("whsec_").unwrap()).unwrap();
            b64.encode(hmac_sha256(&key, signed.as_bytes())) == value
        });
        by.push(i.unwrap_or_else(|| panic!("{signature} is no secret's")));
    }
    by.sort_unstable();
    by
}

/// A CA and a certificate it signed for `names`, for server and client
/// use (mutual TLS): (ca, cert, key) as PEM.
pub fn certificates(names: &[&str]) -> (String, String, String) {
    use rcgen::{
        BasicConstraints, CertificateParams, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    };
    let ca_key = KeyPair::generate().unwrap();
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca, ca_key);
    let key = KeyPair::generate().unwrap();
    let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
    let mut node = CertificateParams::new(names).unwrap();
    node.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    let cert = node.signed_by(&key, &issuer).unwrap();
    (ca_cert.pem(), cert.pem(), key.serialize_pem())
}
