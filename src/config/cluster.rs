//! The `[cluster]` table (docs/contract.md §9): one replica of a cluster,
//! its peers, its secret, its timing and its TLS files, and the checks
//! that hold it to what a cluster can run with.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::lines::KeyLines;
use super::units::{de_duration, format_duration_ms};
use super::{KeyError, SecretShape, secret_shape};
use crate::tls::{ClusterTls, TlsError};

/// Most replicas a cluster may have: five tolerate two failures, seven
/// three; beyond that every write waits for more fsyncs than it gains.
const CLUSTER_REPLICAS_MAX: usize = 7;
/// Shortest cluster secret accepted: a secret is the only thing that keeps
/// a stranger out of replication traffic.
const CLUSTER_SECRET_MIN_BYTES: usize = 16;

/// The `[cluster]` table: one replica of a cluster (docs/contract.md §9).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterConfig {
    /// Stable and unique, ≥ 1; never reused for another disk (a replica
    /// that lost its disk comes back under a new id: docs/operations.md).
    pub node_id: u64,
    /// Where replication traffic is accepted (not the API port).
    pub listen: String,
    /// How peers reach this node; `listen` when absent.
    pub advertise: Option<String>,
    /// What other replicas name as the primary's API.
    pub api_url: String,
    /// Every voter of the cluster's first start: id → address. A replica
    /// not named here never bootstraps: it waits to be added.
    pub peers: BTreeMap<String, String>,
    /// Shared by every replica; also `SPOOLD_CLUSTER_SECRET`.
    pub secret: Option<String>,
    #[serde(default = "default_true")]
    pub forward_to_primary: bool,
    #[serde(
        rename = "heartbeat",
        default = "default_heartbeat_ms",
        deserialize_with = "de_duration"
    )]
    pub heartbeat_ms: u64,
    #[serde(
        rename = "election_timeout",
        default = "default_election_timeout_ms",
        deserialize_with = "de_duration"
    )]
    pub election_timeout_ms: u64,
    /// TLS with mutual certificates on the cluster port (`src/tls.rs`).
    pub tls: Option<ClusterTlsConfig>,
}

/// `[cluster.tls]`: PEM files of this replica's certificate (and chain),
/// its key, and the CA that signs every replica's certificate.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterTlsConfig {
    pub cert: String,
    pub key: String,
    pub ca: String,
}

impl ClusterTlsConfig {
    /// Reads and checks the three files; the error names the key. The
    /// config check and the replica's start both load them this way, so
    /// `check-config` refuses what `run` would.
    pub(crate) fn load(&self) -> Result<ClusterTls, TlsError> {
        ClusterTls::load(&self.cert, &self.key, &self.ca)
    }
}

fn default_true() -> bool {
    true
}

fn default_heartbeat_ms() -> u64 {
    100
}

fn default_election_timeout_ms() -> u64 {
    500
}

impl ClusterConfig {
    /// The peers with their ids as numbers (validated at parse time).
    pub fn peer_ids(&self) -> BTreeMap<u64, String> {
        self.peers
            .iter()
            .filter_map(|(id, addr)| Some((id.parse().ok()?, addr.clone())))
            .collect()
    }

    /// The address peers use for this node.
    pub fn advertised(&self) -> &str {
        self.advertise.as_deref().unwrap_or(&self.listen)
    }

    /// The secret in force: the config's, else `SPOOLD_CLUSTER_SECRET`.
    pub fn secret(&self, env_secret: Option<&str>) -> Result<String, SecretError> {
        let secret = self
            .secret
            .clone()
            .or_else(|| env_secret.map(str::to_owned))
            .unwrap_or_default();
        secret_shape(&secret).map_err(SecretError::Shape)?;
        if secret.len() < CLUSTER_SECRET_MIN_BYTES {
            return Err(SecretError::Short {
                len_bytes: secret.len(),
            });
        }
        Ok(secret)
    }

    /// Checks the table; an error names the key and its line in `keys`.
    pub(super) fn validate(&self, keys: &KeyLines) -> Result<(), KeyError> {
        if self.node_id == 0 {
            return Err(keys.error(
                &["cluster", "node_id"],
                "cluster.node_id = 0: node ids start at 1".into(),
            ));
        }
        self.check_peers(keys)?;
        self.check_addresses(keys)?;
        self.check_timing(keys)?;
        self.check_secret(keys)?;
        if let Some(tls) = &self.tls {
            tls.load()
                .map_err(|e| keys.error(&["cluster", "tls"], e.to_string()))?;
        }
        Ok(())
    }

    /// Each peer is a node id and a `host:port`, and there is an odd
    /// number of them, at most [`CLUSTER_REPLICAS_MAX`].
    fn check_peers(&self, keys: &KeyLines) -> Result<(), KeyError> {
        let mut ids = BTreeMap::new();
        for (id, addr) in &self.peers {
            // A peer's own line when `[cluster.peers]` is a table of its
            // own; else the line of `peers = { … }`.
            let at = ["cluster", "peers", id.as_str()];
            match id.parse::<u64>() {
                Ok(n) if n >= 1 => {
                    ids.insert(n, addr);
                }
                _ => {
                    return Err(keys.error_near(
                        &at,
                        format!("cluster.peers: {id:?} is not a node id (a number ≥ 1)"),
                    ));
                }
            }
            if addr
                .rsplit_once(':')
                .is_none_or(|(h, p)| h.is_empty() || p.parse::<u16>().is_err())
            {
                return Err(keys.error_near(
                    &at,
                    format!("cluster.peers.{id} = {addr:?} is not host:port"),
                ));
            }
        }
        if ids.len() > CLUSTER_REPLICAS_MAX || ids.len() % 2 == 0 {
            return Err(keys.error(
                &["cluster", "peers"],
                format!(
                    "cluster.peers names {} replicas: allowed 1, 3, 5 or 7 (an even number \
                     tolerates no more failures than one fewer)",
                    ids.len()
                ),
            ));
        }
        Ok(())
    }

    /// `listen` is an address to bind and `api_url` a URL to call.
    fn check_addresses(&self, keys: &KeyLines) -> Result<(), KeyError> {
        if self.listen.parse::<std::net::SocketAddr>().is_err() {
            return Err(keys.error(
                &["cluster", "listen"],
                format!(
                    "cluster.listen = {:?} is not an address (e.g. \"0.0.0.0:8788\")",
                    self.listen
                ),
            ));
        }
        if !(self.api_url.starts_with("http://") || self.api_url.starts_with("https://"))
            || url::Url::parse(&self.api_url).is_err()
        {
            return Err(keys.error(
                &["cluster", "api_url"],
                format!("cluster.api_url = {:?} is not an http(s) URL", self.api_url),
            ));
        }
        Ok(())
    }

    /// A heartbeat between 10 ms and 10 s, and an election timeout that a
    /// slow heartbeat never reaches.
    fn check_timing(&self, keys: &KeyLines) -> Result<(), KeyError> {
        if !(10..=10_000).contains(&self.heartbeat_ms) {
            return Err(keys.error(
                &["cluster", "heartbeat"],
                format!(
                    "cluster.heartbeat = {} is out of range: allowed 10ms to 10s",
                    format_duration_ms(self.heartbeat_ms)
                ),
            ));
        }
        if self.election_timeout_ms < 3 * self.heartbeat_ms || self.election_timeout_ms > 60_000 {
            return Err(keys.error(
                &["cluster", "election_timeout"],
                format!(
                    "cluster.election_timeout = {} is out of range: allowed 3 × heartbeat ({}) \
                     to 1m, so that a slow heartbeat never starts an election",
                    format_duration_ms(self.election_timeout_ms),
                    format_duration_ms(3 * self.heartbeat_ms)
                ),
            ));
        }
        Ok(())
    }

    /// A secret written in the file has a secret's shape and length (one
    /// from the environment is checked by [`ClusterConfig::secret`] when
    /// the replica starts).
    fn check_secret(&self, keys: &KeyLines) -> Result<(), KeyError> {
        let Some(secret) = &self.secret else {
            return Ok(());
        };
        let at = ["cluster", "secret"];
        if let Err(why) = secret_shape(secret) {
            return Err(keys.error(&at, format!("cluster.secret: {why}")));
        }
        if secret.len() < CLUSTER_SECRET_MIN_BYTES {
            return Err(keys.error(
                &at,
                format!(
                    "cluster.secret is {} bytes: set at least {CLUSTER_SECRET_MIN_BYTES}",
                    secret.len()
                ),
            ));
        }
        Ok(())
    }
}

/// Why the cluster secret in force (the config's, else
/// `SPOOLD_CLUSTER_SECRET`) cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretError {
    /// Blank, padded or with a control character (or neither the file
    /// nor the environment gives one).
    #[error("cluster.secret: {0}")]
    Shape(SecretShape),
    /// Fewer than [`CLUSTER_SECRET_MIN_BYTES`].
    #[error(
        "cluster.secret: {len_bytes} bytes is too short: set at least \
         {CLUSTER_SECRET_MIN_BYTES} bytes in the config or SPOOLD_CLUSTER_SECRET (the same \
         on every replica)"
    )]
    Short { len_bytes: usize },
}

#[cfg(test)]
mod tests {
    use crate::config::Config;

    const CLUSTER: &str = "[cluster]\nnode_id = 2\nlisten = \"0.0.0.0:8788\"\n\
        api_url = \"http://spoold-1.spoold:8787\"\n\
        peers = { 1 = \"a:8788\", 2 = \"b:8788\", 3 = \"c:8788\" }\n\
        secret = \"0123456789abcdef\"\n";

    #[test]
    fn a_cluster_table_takes_the_contract_defaults() {
        let c = Config::parse(CLUSTER).unwrap().cluster.unwrap();
        assert_eq!(c.node_id, 2);
        assert_eq!((c.heartbeat_ms, c.election_timeout_ms), (100, 500));
        assert!(c.forward_to_primary);
        assert_eq!(c.advertised(), "0.0.0.0:8788");
        assert_eq!(c.peer_ids().len(), 3);
        assert_eq!(c.secret(None).unwrap(), "0123456789abcdef");
        // The effective config never prints the secret, and parses back.
        let printed = Config::parse(CLUSTER).unwrap().effective_toml();
        assert!(!printed.contains("0123456789abcdef"), "{printed}");
        let back = Config::parse(&printed).unwrap().cluster.unwrap();
        assert_eq!(back.peers, c.peers);
    }

    #[test]
    fn cluster_mistakes_name_the_key_and_line() {
        let cases = [
            ("node_id = 2", "node_id = 0", "node_id", 2),
            (", 3 = \"c:8788\"", "", "allowed 1, 3, 5 or 7", 5),
            ("c:8788", "c", "not host:port", 5),
            ("0.0.0.0:8788", "localhost", "cluster.listen", 3),
            ("http://spoold-1", "spoold-1", "cluster.api_url", 4),
            ("0123456789abcdef", "short", "cluster.secret", 6),
        ];
        for (from, to, says, line) in cases {
            let text = CLUSTER.replacen(from, to, 1);
            let err = Config::parse(&text).unwrap_err().to_string();
            assert!(err.contains(says), "{text}: {err}");
            assert!(err.contains(&format!("line {line}")), "{text}: {err}");
        }
        let timing = format!("{CLUSTER}heartbeat = \"200ms\"\n");
        let err = Config::parse(&timing).unwrap_err().to_string();
        assert!(
            err.contains("election_timeout") && err.contains("3 × heartbeat"),
            "{err}"
        );
        let unknown = format!("{CLUSTER}voters = 3\n");
        let err = Config::parse(&unknown).unwrap_err().to_string();
        assert!(err.contains("voters") && err.contains("line 7"), "{err}");
        let no_secret = CLUSTER.replace("secret = \"0123456789abcdef\"\n", "");
        let c = Config::parse(&no_secret).unwrap().cluster.unwrap();
        assert!(c.secret(None).is_err());
        assert_eq!(
            c.secret(Some("from-the-environment")).unwrap(),
            "from-the-environment"
        );
    }

    #[test]
    fn a_peer_in_a_table_of_its_own_is_named_on_its_line() {
        let text = "[cluster]\nnode_id = 1\nlisten = \"0.0.0.0:8788\"\n\
            api_url = \"http://a:8787\"\nsecret = \"0123456789abcdef\"\n\
            [cluster.peers]\n1 = \"a:8788\"\n2 = \"b\"\n3 = \"c:8788\"\n";
        let err = Config::parse(text).unwrap_err().to_string();
        assert!(err.starts_with("line 8: cluster.peers.2"), "{err}");
    }
}
