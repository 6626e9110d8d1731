//! TLS for spoold: the process-wide crypto provider every rustls config
//! and reqwest client needs, the one way a TLS file (a certificate, a key,
//! a CA bundle) is read, and the cluster port's TLS.
//!
//! The cluster port (`[cluster.tls]`) has mutual certificates: every
//! replica presents a certificate its peers check against the cluster's
//! CA, both ways, on top of the signed requests of `cluster/auth.rs`.
//! Loaded when the config is checked (so `check-config` refuses what `run`
//! would) and again when the replica opens. The certificate must name the
//! address peers dial (a DNS name or an IP address in its subject
//! alternative names: `cluster.advertise` and `cluster.peers`);
//! docs/operations.md shows one way to issue them on Kubernetes.
//!
//! This module knows file paths, not the config: its callers pass the
//! paths the config names.

use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Once};
use std::time::Duration;

use rustls::RootCertStore;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;

static CRYPTO: Once = Once::new();

/// rustls needs one process-wide crypto provider; ring builds with gcc alone.
/// Any reqwest client in the process needs it, tests' clients included.
pub fn install_crypto_provider() {
    CRYPTO.call_once(|| {
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

/// Largest TLS file (a CA bundle, a certificate, a key) spoold reads.
pub(crate) const TLS_FILE_BYTES_MAX: u64 = 1 << 20;

/// Why a TLS file cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum TlsFileError {
    /// It does not exist, or cannot be opened or read.
    #[error("{}: {error}", path.display())]
    Io {
        path: PathBuf,
        error: std::io::Error,
    },
    /// A FIFO, a device or a directory: reading it could block or never
    /// end.
    #[error("{} is not a regular file", path.display())]
    NotAFile { path: PathBuf },
    #[error("{} has {len_bytes} bytes: allowed at most {TLS_FILE_BYTES_MAX}", path.display())]
    TooLarge { path: PathBuf, len_bytes: u64 },
    /// It was small enough when looked at, and then was not.
    #[error("{} grew past {TLS_FILE_BYTES_MAX} bytes", path.display())]
    Grew { path: PathBuf },
}

/// A TLS file must be a regular file (not a FIFO, a device, a directory)
/// of at most [`TLS_FILE_BYTES_MAX`].
pub(crate) fn tls_file(path: &Path) -> Result<(), TlsFileError> {
    let meta = std::fs::metadata(path).map_err(|error| io_error(path, error))?;
    if !meta.is_file() {
        return Err(TlsFileError::NotAFile {
            path: path.to_path_buf(),
        });
    }
    if meta.len() > TLS_FILE_BYTES_MAX {
        return Err(TlsFileError::TooLarge {
            path: path.to_path_buf(),
            len_bytes: meta.len(),
        });
    }
    Ok(())
}

fn io_error(path: &Path, error: std::io::Error) -> TlsFileError {
    TlsFileError::Io {
        path: path.to_path_buf(),
        error,
    }
}

/// Reads a TLS file after checking it as [`tls_file`] does, never more
/// than [`TLS_FILE_BYTES_MAX`] bytes.
pub(crate) fn read_tls_file(path: &Path) -> Result<Vec<u8>, TlsFileError> {
    tls_file(path)?;
    let file = std::fs::File::open(path).map_err(|error| io_error(path, error))?;
    let mut bytes = Vec::new();
    file.take(TLS_FILE_BYTES_MAX + 1)
        .read_to_end(&mut bytes)
        .map_err(|error| io_error(path, error))?;
    if bytes.len() as u64 > TLS_FILE_BYTES_MAX {
        return Err(TlsFileError::Grew {
            path: path.to_path_buf(),
        });
    }
    Ok(bytes)
}

/// Why `[cluster.tls]` cannot be used; each names its key (`what` is
/// `cert`, `key` or `ca`).
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cluster.tls.{what}: {error}")]
    Read {
        what: &'static str,
        error: TlsFileError,
    },
    /// The file is not PEM of what it should hold.
    #[error("cluster.tls.{what} {path}: {error}")]
    Pem {
        what: &'static str,
        path: String,
        error: rustls::pki_types::pem::Error,
    },
    #[error("cluster.tls.{what} {path}: no certificate in it")]
    NoCertificate { what: &'static str, path: String },
    /// A CA certificate rustls refuses as a root.
    #[error("cluster.tls.ca {path}: {error}")]
    BadRoot { path: String, error: rustls::Error },
    /// No client verifier can be built on the CA's roots.
    #[error("cluster.tls.ca {path}: {error}")]
    Verifier {
        path: String,
        error: rustls::server::VerifierBuilderError,
    },
    /// The certificate and the key do not make a pair rustls accepts.
    #[error("cluster.tls.cert and cluster.tls.key: {0}")]
    Pair(rustls::Error),
}

fn read(what: &'static str, path: &str) -> Result<Vec<u8>, TlsError> {
    read_tls_file(Path::new(path)).map_err(|error| TlsError::Read { what, error })
}

/// The certificates in PEM file `path` of key `what`: at least one.
fn certs(what: &'static str, path: &str) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = read(what, path)?;
    let certs: Vec<_> = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<_, _>>()
        .map_err(|error| TlsError::Pem {
            what,
            path: path.to_owned(),
            error,
        })?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate {
            what,
            path: path.to_owned(),
        });
    }
    Ok(certs)
}

/// How long an idle pooled connection to a peer is kept.
const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// The cluster's TLS, loaded once at start.
pub(crate) struct ClusterTls {
    server: Arc<rustls::ServerConfig>,
    client: rustls::ClientConfig,
}

impl ClusterTls {
    /// Reads and checks the three PEM files of `[cluster.tls]`: this
    /// replica's certificate (and chain), its key, and the CA that signs
    /// every replica's certificate; the error names the key.
    pub(crate) fn load(
        cert_file: &str,
        key_file: &str,
        ca_file: &str,
    ) -> Result<ClusterTls, TlsError> {
        install_crypto_provider();
        let chain = certs("cert", cert_file)?;
        let key_pem = read("key", key_file)?;
        let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|error| TlsError::Pem {
            what: "key",
            path: key_file.to_owned(),
            error,
        })?;
        let mut roots = RootCertStore::empty();
        for ca in certs("ca", ca_file)? {
            roots.add(ca).map_err(|error| TlsError::BadRoot {
                path: ca_file.to_owned(),
                error,
            })?;
        }
        let roots = Arc::new(roots);
        let verifier = WebPkiClientVerifier::builder(roots.clone())
            .build()
            .map_err(|error| TlsError::Verifier {
                path: ca_file.to_owned(),
                error,
            })?;
        let mut server = rustls::ServerConfig::builder()
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain.clone(), key.clone_key())
            .map_err(TlsError::Pair)?;
        server.alpn_protocols = vec![b"http/1.1".to_vec()];
        let client = rustls::ClientConfig::builder()
            .with_root_certificates(roots)
            .with_client_auth_cert(chain, key)
            .map_err(TlsError::Pair)?;
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
    install_crypto_provider();
    reqwest::Client::builder()
        .http1_only()
        .pool_idle_timeout(POOL_IDLE_TIMEOUT)
        .tcp_nodelay(true)
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("a plain HTTP client builds")
}
