//! Which addresses a push delivery may reach: the one owner of that rule,
//! asked when a destination is set (`rules.rs`), when its name resolves
//! (`delivery/resolve.rs`), and when a plain connection is made
//! (`delivery/direct.rs`).
//!
//! Three refusals:
//!
//! - **spoold itself.** A destination at this node's API, metrics or
//!   cluster address, or at a peer's API, delivers into spoold: two push
//!   queues subscribing to each other's events at `/v1/events` made one
//!   publish into 116 155 events in 17 s. Never allowed. A listener on
//!   every address (`0.0.0.0`) is reached at any loopback address, and a
//!   connection whose two ends have the same address reaches this host.
//!   (What no address check can see, a delivery coming back through a
//!   load balancer, the hop count stops: `Spooler-Hops`, `api/hops.rs`.)
//! - **link-local addresses** (169.254.0.0/16 and fe80::/10, IPv4 ones
//!   mapped into IPv6 too) and the cloud metadata service (`fd00:ec2::254`),
//!   which hand out credentials: refused unless `server.allowed_destinations`
//!   names a range that holds them.
//! - **what `server.allowed_destinations` leaves out**, when it is set: a
//!   destination must match one of its host patterns (`*.example.com`,
//!   `hooks.example.com`, `*` for any), or its address one of its ranges
//!   (`10.0.0.0/8`): a literal address when it is set, each address its
//!   name resolves to when a delivery connects.

use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, RwLock};

use ipnet::IpNet;

/// An entry of `server.allowed_destinations`.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Allowed {
    /// `*`: any host.
    Any,
    /// `*.example.com`: any subdomain of it.
    Suffix(String),
    /// A host as written (lower case).
    Host(String),
    /// An address range (`10.0.0.0/8`, `fd00::/8`).
    Range(IpNet),
    /// One address (`127.0.0.1`): a literal host, or what a name resolves
    /// to.
    Address(IpAddr),
}

impl Allowed {
    fn parse(entry: &str) -> Result<Allowed, AllowedError> {
        let entry = entry.trim().to_ascii_lowercase();
        if entry == "*" {
            return Ok(Allowed::Any);
        }
        if let Ok(net) = entry.parse::<IpNet>() {
            return Ok(Allowed::Range(net.trunc()));
        }
        if let Ok(ip) = entry.parse::<IpAddr>() {
            return Ok(Allowed::Address(canonical(ip)));
        }
        if entry.contains('/') {
            return Err(AllowedError::NotARange { entry });
        }
        if entry.is_empty() || entry.contains(|c: char| c.is_whitespace() || c == ':') {
            return Err(AllowedError::NotAPattern { entry });
        }
        Ok(match entry.strip_prefix("*.") {
            Some(suffix) if !suffix.is_empty() => Allowed::Suffix(suffix.to_owned()),
            _ => Allowed::Host(entry),
        })
    }
}

/// Why an entry of `server.allowed_destinations` (as read: trimmed, in
/// lower case) allows nothing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum AllowedError {
    /// It has a `/` but is no CIDR range.
    #[error("{entry:?} is not an address range (10.0.0.0/8, fd00::/8)")]
    NotARange { entry: String },
    /// Empty, or with a space or a `:` (a port or an IPv6 address
    /// without its range).
    #[error("{entry:?} is not a host pattern or an address range")]
    NotAPattern { entry: String },
}

/// Checks every entry of `server.allowed_destinations` (the config loader
/// names the one that is wrong).
pub(crate) fn check_allowed_destinations(entries: &[String]) -> Result<(), AllowedError> {
    entries
        .iter()
        .try_for_each(|e| Allowed::parse(e).map(|_| ()))
}

/// Why a destination is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// This node's own API, metrics or cluster address, or a peer's API.
    #[error("{host}:{port} is {what}: a delivery there would come back into spoold")]
    Spoold {
        host: String,
        port: u16,
        what: String,
    },
    /// A link-local or metadata address no allowed range holds.
    #[error(
        "{host} is {why}; list its range in server.allowed_destinations to allow it \
         (169.254.169.254/32)"
    )]
    Forbidden { host: String, why: &'static str },
    /// `server.allowed_destinations` does not match it.
    #[error("destination host {host} is not in server.allowed_destinations")]
    NotAllowed { host: String },
}

/// What this node answers on, to keep deliveries from coming back to it:
/// its listeners (as bound: a port given as 0 is known once bound), its
/// configured names (`api_url`, `advertise`) and its peers' API URLs (as
/// the membership names them). Filled at start-up and as the membership
/// changes; read at every check.
#[derive(Debug, Default, Clone)]
pub(crate) struct OwnEndpoints {
    endpoints: Arc<RwLock<Vec<Endpoint>>>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Endpoint {
    /// A host as written (lower case), or an address.
    host: String,
    port: u16,
    /// What it is, for the refusal: "this node's API", "peer 2's API".
    what: String,
}

impl PartialEq for OwnEndpoints {
    fn eq(&self, other: &OwnEndpoints) -> bool {
        *self.read() == *other.read()
    }
}

impl Eq for OwnEndpoints {}

impl OwnEndpoints {
    fn read(&self) -> std::sync::RwLockReadGuard<'_, Vec<Endpoint>> {
        self.endpoints.read().expect("own endpoints poisoned")
    }

    /// Adds `host:port` as `what` (an address, or a name).
    pub(crate) fn add(&self, host: &str, port: u16, what: &str) {
        let host = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_ascii_lowercase();
        let endpoint = Endpoint {
            host,
            port,
            what: what.to_owned(),
        };
        let mut endpoints = self.endpoints.write().expect("own endpoints poisoned");
        if !endpoints.contains(&endpoint) {
            endpoints.push(endpoint);
        }
    }

    /// Adds a `host:port` address as written in the config (`what`).
    pub(crate) fn add_addr(&self, addr: &str, what: &str) {
        if let Some((host, port)) = addr.rsplit_once(':')
            && let Ok(port) = port.parse()
        {
            self.add(host, port, what);
        }
    }

    /// Adds the host and port of a URL (`api_url`: "http://host:8787").
    pub(crate) fn add_url(&self, url: &str, what: &str) {
        if let Ok(url) = url::Url::parse(url)
            && let (Some(host), Some(port)) = (url.host_str(), url.port_or_known_default())
        {
            self.add(host, port, what);
        }
    }

    /// Drops what `what` names start with (a peer's API URL that changed).
    pub(crate) fn remove_prefixed(&self, what: &str) {
        self.endpoints
            .write()
            .expect("own endpoints poisoned")
            .retain(|e| !e.what.starts_with(what));
    }

    /// The endpoint a destination `host:port` names, as written: the same
    /// name or address, or any loopback address when the listener takes
    /// every address.
    fn named(&self, host: &str, port: u16) -> Option<Endpoint> {
        let ip = host_ip(host);
        self.read()
            .iter()
            .find(|e| {
                e.port == port
                    && (e.host == host
                        || match (host_ip(&e.host), ip) {
                            (Some(own), Some(ip)) => {
                                own == ip || (own.is_unspecified() && is_local(ip))
                            }
                            _ => false,
                        })
            })
            .cloned()
    }

    /// The endpoint a connection reaches (`peer`, from `local`): a
    /// listener's address and port, or, for a listener on every address,
    /// its port at a loopback address or at this host's own address (the
    /// connection's two ends then share it).
    fn reached(&self, peer: SocketAddr, local: IpAddr) -> Option<Endpoint> {
        let ip = canonical(peer.ip());
        self.read()
            .iter()
            .find(|e| {
                e.port == peer.port()
                    && host_ip(&e.host).is_some_and(|own| {
                        own == ip
                            || (own.is_unspecified() && (is_local(ip) || ip == canonical(local)))
                    })
            })
            .cloned()
    }
}

/// `localhost` and literal addresses, as an address: this node's own
/// names are told apart at once, whatever DNS says.
fn host_ip(host: &str) -> Option<IpAddr> {
    if host == "localhost" || host.ends_with(".localhost") {
        return Some(IpAddr::from([127, 0, 0, 1]));
    }
    literal_ip(host)
}

/// A literal address (`10.0.0.1`, `[::1]`); a name is checked by what it
/// resolves to.
fn literal_ip(host: &str) -> Option<IpAddr> {
    host.trim_start_matches('[')
        .trim_end_matches(']')
        .parse::<IpAddr>()
        .ok()
        .map(canonical)
}

/// An IPv4 address mapped into IPv6 as the IPv4 address it is.
fn canonical(ip: IpAddr) -> IpAddr {
    ip.to_canonical()
}

/// A loopback or unspecified address: this host, whatever its interfaces.
fn is_local(ip: IpAddr) -> bool {
    ip.is_loopback() || ip.is_unspecified()
}

/// Why `ip` is refused unless an allowed range holds it.
fn forbidden(ip: IpAddr) -> Option<&'static str> {
    const METADATA_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254);
    match canonical(ip) {
        IpAddr::V4(v4) if v4.is_link_local() => {
            Some("a link-local address (169.254.0.0/16), where cloud metadata services answer")
        }
        IpAddr::V6(v6) if v6 == METADATA_V6 => Some("the cloud metadata service (fd00:ec2::254)"),
        IpAddr::V6(v6) if v6.is_unicast_link_local() => Some("a link-local address (fe80::/10)"),
        _ => None,
    }
}

/// What the server allows push destinations (`server.allowed_destinations`
/// and this node's own endpoints).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Guard {
    allowed: Option<Vec<Allowed>>,
    pub(crate) own: OwnEndpoints,
}

impl Guard {
    /// A guard for `allowed_destinations` (entries checked by the config
    /// loader; one that does not parse allows nothing).
    pub(crate) fn new(allowed: Option<&[String]>, own: OwnEndpoints) -> Guard {
        Guard {
            allowed: allowed
                .map(|list| list.iter().filter_map(|e| Allowed::parse(e).ok()).collect()),
            own,
        }
    }

    /// Whether a host pattern (not a range) of the list takes `host`; true
    /// when there is no list.
    fn host_listed(&self, host: &str) -> bool {
        self.allowed.as_ref().is_none_or(|list| {
            list.iter().any(|a| match a {
                Allowed::Any => true,
                Allowed::Host(h) => h == host,
                Allowed::Suffix(s) => {
                    host.len() > s.len() + 1 && host.ends_with(s.as_str()) && {
                        host.as_bytes()[host.len() - s.len() - 1] == b'.'
                    }
                }
                Allowed::Range(_) | Allowed::Address(_) => false,
            })
        })
    }

    /// Whether a range of the list holds `ip`.
    fn in_range(&self, ip: IpAddr) -> bool {
        let ip = canonical(ip);
        self.allowed.as_ref().is_some_and(|list| {
            list.iter().any(|a| match a {
                Allowed::Range(net) => net.contains(&ip),
                Allowed::Address(one) => *one == ip,
                _ => false,
            })
        })
    }

    /// Whether the list has a range (not a single address), which a name
    /// may resolve into.
    fn has_ranges(&self) -> bool {
        self.allowed
            .as_ref()
            .is_some_and(|list| list.iter().any(|a| matches!(a, Allowed::Range(_))))
    }

    /// A destination as it is set (`host`, as the URL standard normalises
    /// it, and its port). A name's addresses are checked again at every
    /// connection ([`Guard::check_resolved`]).
    pub(crate) fn check_destination(&self, host: &str, port: u16) -> Result<(), Refusal> {
        if let Some(own) = self.own.named(host, port) {
            return Err(Refusal::Spoold {
                host: host.to_owned(),
                port,
                what: own.what,
            });
        }
        match literal_ip(host) {
            Some(ip) => self.check_ip(host, ip),
            // A name no pattern lists may still resolve into a listed range.
            None if self.host_listed(host) || self.has_ranges() => Ok(()),
            None => Err(Refusal::NotAllowed {
                host: host.to_owned(),
            }),
        }
    }

    /// An address of `host` (a literal one, or one its name resolved to).
    fn check_ip(&self, host: &str, ip: IpAddr) -> Result<(), Refusal> {
        if self.in_range(ip) {
            return Ok(());
        }
        if let Some(why) = forbidden(ip) {
            return Err(Refusal::Forbidden {
                host: host.to_owned(),
                why,
            });
        }
        if self.host_listed(host) {
            return Ok(());
        }
        Err(Refusal::NotAllowed {
            host: host.to_owned(),
        })
    }

    /// An address `host` resolved to, as a delivery connects.
    pub(crate) fn check_resolved(&self, host: &str, ip: IpAddr) -> Result<(), Refusal> {
        self.check_ip(&host.to_ascii_lowercase(), ip)
    }

    /// A plain connection made to `peer` from `local`: it must not have
    /// reached this node.
    pub(crate) fn check_connected(&self, peer: SocketAddr, local: IpAddr) -> Result<(), Refusal> {
        match self.own.reached(peer, local) {
            Some(own) => Err(Refusal::Spoold {
                host: peer.ip().to_string(),
                port: peer.port(),
                what: own.what,
            }),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn guard(allowed: Option<&[&str]>) -> Guard {
        let own = OwnEndpoints::default();
        own.add("0.0.0.0", 8787, "this node's API");
        own.add("127.0.0.1", 9187, "this node's metrics");
        own.add_url("http://spoold-1.spoold:8787", "peer 2's API");
        let allowed: Option<Vec<String>> =
            allowed.map(|l| l.iter().map(|s| s.to_string()).collect());
        Guard::new(allowed.as_deref(), own)
    }

    #[test]
    fn spoold_itself_is_never_a_destination() {
        let g = guard(Some(&["*"]));
        for (host, port) in [
            ("127.0.0.1", 8787),
            ("127.0.0.7", 8787),
            ("localhost", 8787),
            ("0.0.0.0", 8787),
            ("::1", 8787),
            ("127.0.0.1", 9187),
            ("spoold-1.spoold", 8787),
        ] {
            assert!(
                matches!(g.check_destination(host, port), Err(Refusal::Spoold { .. })),
                "{host}:{port}"
            );
        }
        assert!(g.check_destination("127.0.0.1", 8080).is_ok());
        assert!(g.check_destination("127.0.0.2", 9187).is_ok());
        let me: SocketAddr = "10.1.2.3:8787".parse().unwrap();
        assert!(
            g.check_connected(me, me.ip()).is_err(),
            "this host's own address"
        );
        assert!(g.check_connected(me, "10.1.2.4".parse().unwrap()).is_ok());
    }

    #[test]
    fn link_local_and_metadata_need_a_listed_range() {
        let g = guard(None);
        for host in [
            "169.254.169.254",
            "fd00:ec2::254",
            "::ffff:a9fe:a9fe",
            "fe80::1",
        ] {
            assert!(
                matches!(
                    g.check_destination(host, 80),
                    Err(Refusal::Forbidden { .. })
                ),
                "{host}"
            );
        }
        assert!(
            g.check_resolved(
                "metadata.google.internal",
                "169.254.169.254".parse().unwrap()
            )
            .is_err()
        );
        let allowed = guard(Some(&["*", "169.254.169.254/32"]));
        assert!(allowed.check_destination("169.254.169.254", 80).is_ok());
        assert!(allowed.check_destination("169.254.169.253", 80).is_err());
    }

    #[test]
    fn patterns_take_hosts_and_ranges_take_addresses() {
        let g = guard(Some(&["*.example.com", "hooks.test", "10.0.0.0/8"]));
        assert!(g.check_destination("a.example.com", 443).is_ok());
        let exact = guard(Some(&["*.example.com", "127.0.0.1"]));
        assert!(exact.check_destination("example.com", 443).is_err());
        assert!(exact.check_destination("xexample.com", 443).is_err());
        assert!(exact.check_destination("127.0.0.1", 80).is_ok());
        assert!(exact.check_destination("::ffff:127.0.0.1", 80).is_ok());
        assert!(
            exact
                .check_resolved("example.com", "127.0.0.1".parse().unwrap())
                .is_ok()
        );
        assert!(g.check_destination("hooks.test", 443).is_ok());
        assert!(g.check_destination("10.9.8.7", 80).is_ok());
        assert!(g.check_destination("11.0.0.1", 80).is_err());
        // A name no pattern lists is checked by what it resolves to.
        assert!(g.check_destination("internal.corp", 80).is_ok());
        assert!(
            g.check_resolved("internal.corp", "10.0.0.5".parse().unwrap())
                .is_ok()
        );
        assert!(
            g.check_resolved("internal.corp", "8.8.8.8".parse().unwrap())
                .is_err()
        );
        assert!(
            g.check_resolved("a.example.com", "8.8.8.8".parse().unwrap())
                .is_ok()
        );
        for bad in ["10.0.0.0/33", "a b", ""] {
            assert!(
                check_allowed_destinations(&[bad.to_string()]).is_err(),
                "{bad}"
            );
        }
    }
}
