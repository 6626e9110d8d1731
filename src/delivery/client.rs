//! One pooled HTTP client per push queue: rustls (with the system's roots
//! plus the queue's `ca_file`), optional client certificate (mTLS), the
//! per-attempt timeout, no redirects, no retries of its own, HTTP/1.1 and
//! HTTP/2, and proxies from the standard `HTTPS_PROXY` / `NO_PROXY`
//! variables.

use std::path::Path;
use std::sync::Once;
use std::time::Duration;

use reqwest::{Certificate, Client, Identity, redirect, retry};

use crate::engine::rules::read_tls_file;
use crate::spool::QueueSettings;

/// Idle pooled connections are closed after this long.
const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(90);
const CONNECT_TIMEOUT_MAX: Duration = Duration::from_secs(10);

static CRYPTO: Once = Once::new();

/// rustls needs one process-wide crypto provider; ring builds with gcc alone.
/// Any reqwest client in the process needs it, tests' clients included.
pub fn install_crypto_provider() {
    CRYPTO.call_once(|| {
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

/// The client for a queue's settings.
pub(crate) fn build(settings: &QueueSettings) -> Result<Client, String> {
    install_crypto_provider();
    let timeout = Duration::from_millis(settings.timeout_ms.max(1));
    let mut builder = Client::builder()
        .redirect(redirect::Policy::none())
        // Every attempt is the worker's: recorded, counted and backed off.
        // (reqwest's default retries HTTP/2 refusals itself, and to be able
        // to, copies every request's headers before sending it.)
        .retry(retry::never().max_retries_per_request(0))
        .timeout(timeout)
        .connect_timeout(timeout.min(CONNECT_TIMEOUT_MAX))
        .pool_idle_timeout(POOL_IDLE_TIMEOUT)
        .user_agent(concat!("spoold/", env!("CARGO_PKG_VERSION")));
    if let Some(path) = &settings.ca_file {
        let pem = read_tls_file(Path::new(path)).map_err(|e| format!("ca_file {e}"))?;
        let certs =
            Certificate::from_pem_bundle(&pem).map_err(|e| format!("ca_file {path}: {e}"))?;
        builder = builder.tls_certs_merge(certs);
    }
    match (&settings.client_cert, &settings.client_key) {
        (Some(cert), Some(key)) => {
            let mut pem = read_tls_file(Path::new(cert)).map_err(|e| format!("client_cert {e}"))?;
            pem.push(b'\n');
            pem.extend(read_tls_file(Path::new(key)).map_err(|e| format!("client_key {e}"))?);
            let identity =
                Identity::from_pem(&pem).map_err(|e| format!("client_cert/client_key: {e}"))?;
            builder = builder.identity(identity);
        }
        (None, None) => {}
        _ => return Err("client_cert and client_key go together".into()),
    }
    builder.build().map_err(|e| format!("HTTP client: {e}"))
}
