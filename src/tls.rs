//! TLS with mutual certificates on the cluster port (`[cluster.tls]`):
//! every replica presents a certificate its peers check against the
//! cluster's CA, both ways, on top of the signed requests of
//! `cluster/auth.rs`. Loaded when the config is checked (so `check-config`
//! refuses what `run` would) and again when the replica opens.
//! The certificate must name the address peers dial (a DNS name or an IP
//! address in its subject alternative names: `cluster.advertise` and
//! `cluster.peers`); docs/operations.md shows one way to issue them on
//! Kubernetes.

use std::sync::Arc;
use std::time::Duration;

use rustls::RootCertStore;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;

use crate::config::ClusterTlsConfig;
use crate::engine::rules::read_tls_file;

/// How long an idle pooled connection to a peer is kept.
const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// The cluster's TLS, loaded once at start.
pub(crate) struct ClusterTls {
    server: Arc<rustls::ServerConfig>,
    client: rustls::ClientConfig,
}

fn read(what: &str, path: &str) -> Result<Vec<u8>, String> {
    read_tls_file(std::path::Path::new(path)).map_err(|e| format!("cluster.tls.{what}: {e}"))
}

impl ClusterTls {
    /// Reads and checks the three files; the error names the key.
    pub(crate) fn load(config: &ClusterTlsConfig) -> Result<ClusterTls, String> {
        crate::delivery::client::install_crypto_provider();
        let certs = |what: &str, path: &str| -> Result<Vec<CertificateDer<'static>>, String> {
            let pem = read(what, path)?;
            let certs: Vec<_> = CertificateDer::pem_slice_iter(&pem)
                .collect::<Result<_, _>>()
                .map_err(|e| format!("cluster.tls.{what} {path}: {e}"))?;
            if certs.is_empty() {
                return Err(format!("cluster.tls.{what} {path}: no certificate in it"));
            }
            Ok(certs)
        };
        let chain = certs("cert", &config.cert)?;
        let key_pem = read("key", &config.key)?;
        let key = PrivateKeyDer::from_pem_slice(&key_pem)
            .map_err(|e| format!("cluster.tls.key {}: {e}", config.key))?;
        let mut roots = RootCertStore::empty();
        for ca in certs("ca", &config.ca)? {
            roots
                .add(ca)
                .map_err(|e| format!("cluster.tls.ca {}: {e}", config.ca))?;
        }
        let roots = Arc::new(roots);
        let verifier = WebPkiClientVerifier::builder(roots.clone())
            .build()
            .map_err(|e| format!("cluster.tls.ca {}: {e}", config.ca))?;
        let mut server = rustls::ServerConfig::builder()
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain.clone(), key.clone_key())
            .map_err(|e| format!("cluster.tls.cert and cluster.tls.key: {e}"))?;
        server.alpn_protocols = vec![b"http/1.1".to_vec()];
        let client = rustls::ClientConfig::builder()
            .with_root_certificates(roots)
            .with_client_auth_cert(chain, key)
            .map_err(|e| format!("cluster.tls.cert and cluster.tls.key: {e}"))?;
        Ok(ClusterTls {
            server: Arc::new(server),
            client,
        })
    }

    /// What the replication listener accepts with.
    pub(crate) fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        tokio_rustls::TlsAcceptor::from(self.server.clone())
    }

    /// The client replication requests go out with.
    pub(crate) fn client(&self) -> reqwest::Client {
        reqwest::Client::builder()
            .use_preconfigured_tls(self.client.clone())
            .http1_only()
            .pool_idle_timeout(POOL_IDLE_TIMEOUT)
            .tcp_nodelay(true)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .expect("an HTTPS client with a rustls config builds")
    }
}

/// The client replication requests go out with, without TLS.
pub(crate) fn plain_client() -> reqwest::Client {
    crate::delivery::client::install_crypto_provider();
    reqwest::Client::builder()
        .http1_only()
        .pool_idle_timeout(POOL_IDLE_TIMEOUT)
        .tcp_nodelay(true)
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("a plain HTTP client builds")
}
