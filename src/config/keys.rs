//! `server.api_keys` (docs/contract.md §4, "Keys and scopes"): each entry
//! is a bare key, which reaches every route and queue, or a table that
//! scopes one: a role, a tenant, and the queue names it may use.
//!
//! Only a key's SHA-256 is kept once the config is read ([`ApiKey`]): the
//! server never holds, compares or logs the key itself. A table may give
//! the digest alone (`sha256`), so that the file need not hold the key.

use std::fmt;

use serde::Deserialize;
use serde::de::{self, MapAccess, Visitor};
use sha2::{Digest, Sha256};

use crate::spool::event::tenant_problem;

/// What a key may do: `admin` everything, the others one kind of call
/// each (docs/contract.md §4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    #[default]
    Admin,
    /// Send, forward and publish.
    Publisher,
    /// Receive, ack, nack and renew.
    Consumer,
    /// Every read, and nothing else.
    Reader,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Admin => "admin",
            Role::Publisher => "publisher",
            Role::Consumer => "consumer",
            Role::Reader => "reader",
        }
    }
}

/// One entry of `server.api_keys`.
#[derive(Debug, Clone, PartialEq)]
pub enum ApiKeyEntry {
    /// A bare key: an admin of every queue.
    Plain(String),
    Scoped(ScopedKey),
}

/// `{ key = "…", role = "publisher", tenant = "cus_42", queues = ["cus_42-*"] }`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScopedKey {
    #[serde(default)]
    pub key: Option<String>,
    /// The key's SHA-256 in hex, instead of the key.
    #[serde(default)]
    pub sha256: Option<String>,
    #[serde(default)]
    pub role: Role,
    /// Set: only the push queues of this tenant, and its events.
    #[serde(default)]
    pub tenant: Option<String>,
    /// The queue names it may use (`*` stands for any run of characters);
    /// empty: every name.
    #[serde(default)]
    pub queues: Vec<String>,
}

impl<'de> Deserialize<'de> for ApiKeyEntry {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<ApiKeyEntry, D::Error> {
        struct Entry;
        impl<'de> Visitor<'de> for Entry {
            type Value = ApiKeyEntry;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a key, or a table {key or sha256, role, tenant, queues}")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<ApiKeyEntry, E> {
                Ok(ApiKeyEntry::Plain(v.to_owned()))
            }
            fn visit_map<M: MapAccess<'de>>(self, map: M) -> Result<ApiKeyEntry, M::Error> {
                ScopedKey::deserialize(de::value::MapAccessDeserializer::new(map))
                    .map(ApiKeyEntry::Scoped)
            }
        }
        d.deserialize_any(Entry)
    }
}

impl From<&str> for ApiKeyEntry {
    fn from(key: &str) -> ApiKeyEntry {
        ApiKeyEntry::Plain(key.to_owned())
    }
}

/// A key in force: its digest and its scope.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiKey {
    pub sha256: [u8; 32],
    pub role: Role,
    pub tenant: Option<String>,
    pub queues: Vec<String>,
}

/// The SHA-256 a key is known by.
pub fn digest(key: &str) -> [u8; 32] {
    Sha256::digest(key.as_bytes()).into()
}

/// Longest queue-name pattern, as long as the longest name.
const PATTERN_MAX_BYTES: usize = crate::spool::queue::QUEUE_NAME_MAX_BYTES;

/// Why a queue-name pattern is refused, or `None`: queue-name characters
/// and `*`.
pub fn pattern_problem(pattern: &str) -> Option<String> {
    let ok = !pattern.is_empty()
        && pattern.len() <= PATTERN_MAX_BYTES
        && pattern
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_-*".contains(&b));
    (!ok).then(|| {
        format!(
            "queue pattern {pattern:?} is not 1 to {PATTERN_MAX_BYTES} of [A-Za-z0-9_-] and `*`"
        )
    })
}

/// Whether `name` fits the glob `pattern` (`*`: any run, empty too).
pub fn pattern_matches(pattern: &str, name: &str) -> bool {
    let mut parts = pattern.split('*');
    let first = parts.next().unwrap_or("");
    let Some(mut rest) = name.strip_prefix(first) else {
        return false;
    };
    let parts: Vec<&str> = parts.collect();
    let Some((last, middle)) = parts.split_last() else {
        return rest.is_empty();
    };
    for part in middle {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

impl ApiKeyEntry {
    /// Why the entry is refused, or `None`.
    pub fn problem(&self) -> Option<String> {
        let scoped = match self {
            ApiKeyEntry::Plain(key) => {
                return super::secret_shape(key).err().map(|e| e.to_string());
            }
            ApiKeyEntry::Scoped(scoped) => scoped,
        };
        match (&scoped.key, &scoped.sha256) {
            (Some(key), None) => super::secret_shape(key).err().map(|e| e.to_string()),
            (None, Some(hex)) => hex_digest(hex)
                .is_none()
                .then(|| format!("sha256 = {hex:?} is not 64 hex digits")),
            _ => Some("give exactly one of key and sha256".into()),
        }
        .or_else(|| scoped.tenant.as_deref().and_then(tenant_problem))
        .or_else(|| scoped.queues.iter().find_map(|p| pattern_problem(p)))
    }

    /// The key as the server holds it. Call on an entry without a
    /// [`problem`](Self::problem).
    pub fn resolve(&self) -> ApiKey {
        match self {
            ApiKeyEntry::Plain(key) => ApiKey {
                sha256: digest(key),
                role: Role::Admin,
                tenant: None,
                queues: Vec::new(),
            },
            ApiKeyEntry::Scoped(s) => ApiKey {
                sha256: match (&s.key, &s.sha256) {
                    (Some(key), _) => digest(key),
                    (None, Some(hex)) => hex_digest(hex).unwrap_or_default(),
                    (None, None) => [0; 32],
                },
                role: s.role,
                tenant: s.tenant.clone(),
                queues: s.queues.clone(),
            },
        }
    }
}

impl super::Config {
    /// The same config with each key replaced by its digest (a table
    /// with `sha256`): what a running server keeps, so that no key stays
    /// in its memory in the clear once it is read.
    pub fn with_keys_hashed(mut self) -> super::Config {
        for entry in &mut self.server.api_keys {
            let key = entry.resolve();
            let hex: String = key.sha256.iter().map(|b| format!("{b:02x}")).collect();
            *entry = ApiKeyEntry::Scoped(ScopedKey {
                key: None,
                sha256: Some(hex),
                role: key.role,
                tenant: key.tenant,
                queues: key.queues,
            });
        }
        self
    }
}

/// 64 hex digits as 32 bytes.
fn hex_digest(hex: &str) -> Option<[u8; 32]> {
    if hex.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_are_globs() {
        assert!(pattern_matches("cus_42-*", "cus_42-orders"));
        assert!(pattern_matches("cus_42-*", "cus_42-"));
        assert!(!pattern_matches("cus_42-*", "cus_421-orders"));
        assert!(pattern_matches("*-hooks", "a-hooks"));
        assert!(pattern_matches("a*b*c", "abc"));
        assert!(pattern_matches("a*b*c", "axxbyyc"));
        assert!(!pattern_matches("a*b*c", "axxbyy"));
        assert!(!pattern_matches("a*bc", "abc-"));
        assert!(pattern_matches("exact", "exact"));
        assert!(!pattern_matches("exact", "exact2"));
        assert!(pattern_matches("*", "anything"));
        assert!(!pattern_matches("ab*ba", "aba"));
    }

    #[test]
    fn entries_are_checked() {
        let scoped = |key: Option<&str>, sha: Option<&str>| {
            ApiKeyEntry::Scoped(ScopedKey {
                key: key.map(str::to_owned),
                sha256: sha.map(str::to_owned),
                role: Role::Reader,
                tenant: Some("cus_42".into()),
                queues: vec!["cus_42-*".into()],
            })
        };
        assert_eq!(scoped(Some("k-123456"), None).problem(), None);
        assert!(
            scoped(None, None)
                .problem()
                .unwrap()
                .contains("exactly one")
        );
        assert!(scoped(Some("a"), Some("b")).problem().is_some());
        assert!(
            scoped(None, Some("abc"))
                .problem()
                .unwrap()
                .contains("64 hex")
        );
        let hex = "ab".repeat(32);
        assert_eq!(scoped(None, Some(&hex)).resolve().sha256, [0xab; 32]);
        assert_eq!(
            scoped(Some("k-123456"), None).resolve().sha256,
            digest("k-123456")
        );
        assert!(pattern_problem("a.b").is_some());
        let mut config = super::super::Config::default();
        config.server.api_keys = vec![
            ApiKeyEntry::from("plain-key-0123456789"),
            scoped(Some("k-123456"), None),
        ];
        let before: Vec<ApiKey> = config
            .server
            .api_keys
            .iter()
            .map(ApiKeyEntry::resolve)
            .collect();
        let hashed = config.with_keys_hashed();
        let after: Vec<ApiKey> = hashed
            .server
            .api_keys
            .iter()
            .map(ApiKeyEntry::resolve)
            .collect();
        assert_eq!(before, after);
        assert!(
            !format!("{hashed:?}").contains("plain-key")
                && !format!("{hashed:?}").contains("k-123456")
        );
        assert!(pattern_problem("").is_some());
    }
}
