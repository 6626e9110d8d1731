//! The pooled HTTP clients of push delivery, one per TLS configuration
//! (every push queue with the same `ca_file`, `client_cert` and
//! `client_key` shares one, with its connection pool: a client and its
//! root store cost about 100 KiB, too much for each of 100 000 endpoints):
//! rustls (with the system's roots plus the queue's `ca_file`), optional
//! client certificate (mTLS), no redirects, no retries of its own,
//! HTTP/1.1 and HTTP/2, and proxies from the standard `HTTPS_PROXY` /
//! `NO_PROXY` variables. The per-attempt timeout is each request's. A
//! plain-HTTP destination without a proxy goes the direct way instead
//! (`direct.rs`).

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use reqwest::{Certificate, Client, Identity, redirect, retry};

use super::resolve::GuardedResolver;
use crate::engine::guard::Guard;
use crate::spool::QueueSettings;
use crate::tls::{TlsFileError, install_crypto_provider, read_tls_file};

/// Idle pooled connections are closed after this long.
pub(super) const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(90);
pub(super) const CONNECT_TIMEOUT_MAX: Duration = Duration::from_secs(10);
/// The `User-Agent` of every delivery that has none of its own.
pub(super) const USER_AGENT_VALUE: &str = concat!("spoold/", env!("CARGO_PKG_VERSION"));

/// What sets two push queues' clients apart.
type TlsKey = (Option<String>, Option<String>, Option<String>);

/// The clients built so far, by TLS configuration.
pub(crate) struct Clients {
    built: HashMap<TlsKey, Client>,
    /// What a destination may reach: every name is resolved through it.
    guard: Guard,
}

impl Clients {
    pub(crate) fn new(guard: Guard) -> Clients {
        Clients {
            built: HashMap::new(),
            guard,
        }
    }

    /// The client for a queue's settings: shared with every queue of the
    /// same TLS configuration (a reqwest client is a handle on its pool).
    pub(crate) fn for_settings(&mut self, settings: &QueueSettings) -> Result<Client, ClientError> {
        let key = (
            settings.ca_file.clone(),
            settings.client_cert.clone(),
            settings.client_key.clone(),
        );
        if let Some(client) = self.built.get(&key) {
            return Ok(client.clone());
        }
        let client = build(settings, &self.guard)?;
        self.built.insert(key, client.clone());
        Ok(client)
    }
}

/// Why a queue's delivery client cannot be built; each names the setting.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ClientError {
    /// `ca_file`, `client_cert` or `client_key` cannot be read.
    #[error("{setting} {error}")]
    File {
        setting: &'static str,
        error: TlsFileError,
    },
    /// `ca_file` holds no PEM certificates reqwest takes.
    #[error("ca_file {path}: {error}")]
    CaBundle { path: String, error: reqwest::Error },
    /// The certificate and the key do not make an identity.
    #[error("client_cert/client_key: {0}")]
    Identity(reqwest::Error),
    /// One of `client_cert` and `client_key` without the other.
    #[error("client_cert and client_key go together")]
    Unpaired,
    #[error("HTTP client: {0}")]
    Build(reqwest::Error),
}

/// Reads the TLS file of `setting` at `path`.
fn tls_file(setting: &'static str, path: &str) -> Result<Vec<u8>, ClientError> {
    read_tls_file(Path::new(path)).map_err(|error| ClientError::File { setting, error })
}

/// A client for a queue's TLS settings, resolving names through `guard`.
pub(crate) fn build(settings: &QueueSettings, guard: &Guard) -> Result<Client, ClientError> {
    install_crypto_provider();
    let mut builder = Client::builder()
        .dns_resolver(GuardedResolver::new(guard.clone()))
        .redirect(redirect::Policy::none())
        // Every attempt is the worker's: recorded, counted and backed off.
        // (reqwest's default retries HTTP/2 refusals itself, and to be able
        // to, copies every request's headers before sending it.)
        .retry(retry::never().max_retries_per_request(0))
        .connect_timeout(CONNECT_TIMEOUT_MAX)
        .pool_idle_timeout(POOL_IDLE_TIMEOUT)
        .user_agent(USER_AGENT_VALUE);
    if let Some(path) = &settings.ca_file {
        let pem = tls_file("ca_file", path)?;
        let certs = Certificate::from_pem_bundle(&pem).map_err(|error| ClientError::CaBundle {
            path: path.clone(),
            error,
        })?;
        builder = builder.tls_certs_merge(certs);
    }
    match (&settings.client_cert, &settings.client_key) {
        (Some(cert), Some(key)) => {
            let mut pem = tls_file("client_cert", cert)?;
            pem.push(b'\n');
            pem.extend(tls_file("client_key", key)?);
            let identity = Identity::from_pem(&pem).map_err(ClientError::Identity)?;
            builder = builder.identity(identity);
        }
        (None, None) => {}
        _ => return Err(ClientError::Unpaired),
    }
    builder.build().map_err(ClientError::Build)
}
