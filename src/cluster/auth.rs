//! Who may speak on the cluster port: every replication request is signed
//! with a key derived from the cluster secret, and every answer too.
//!
//! A request carries `spooler-cluster-auth: v2 <ms> <nonce> <body> <mac>`:
//! the sender's wall-clock time in milliseconds, 16 random bytes, the
//! SHA-256 of the body (or `stream` for a snapshot, whose stream ends with
//! a MAC of its own: [`StreamMac`]), and an HMAC-SHA256 over the method,
//! the path, the sender, the target, the incarnation it is meant for and
//! those three fields. The receiver checks all of it from the headers,
//! before it reads a byte of the body, and refuses:
//!
//! - a time more than [`REPLAY_WINDOW`] away from its own clock (replicas
//!   keep their clocks in step, as with NTP);
//! - a nonce it has seen within the window (a replay);
//! - then, once the body is read, a body whose hash is not the one signed.
//!
//! The secret itself never crosses the network, and what an eavesdropper
//! or a listener posing as a new member (`POST /v1/cluster/members` lets
//! an API-key holder name any address) captures is good for one request,
//! to one node, for one path and body, within the window.
//!
//! An answer carries `spooler-cluster-auth: <mac>` over the request's
//! nonce, the status, the answering node's incarnation and API URL and
//! the body's hash: a peer's identity is taken only from an answer the
//! secret signed.

use std::collections::{HashSet, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use hmac::{Hmac, KeyInit, Mac};
use sha2::{Digest, Sha256};

/// The request's and the answer's signature.
pub(crate) const AUTH_HEADER: &str = "spooler-cluster-auth";
/// The node id a request comes from (signed).
pub(crate) const FROM_HEADER: &str = "spooler-cluster-from";
/// The node id a request is meant for (signed).
pub(crate) const TARGET_HEADER: &str = "spooler-cluster-target";
/// The incarnation a request is meant for (0: any), and the one an answer
/// comes from (both signed).
pub(crate) const INCARNATION_HEADER: &str = "spooler-cluster-incarnation";
/// The answering node's API URL (signed).
pub(crate) const API_HEADER: &str = "spooler-cluster-api";

/// How far a request's time may be from the receiver's clock: clocks of
/// replicas differ by less, and a captured request is good for no longer.
pub(crate) const REPLAY_WINDOW: Duration = Duration::from_secs(30);
/// Most nonces remembered: a flood of signed requests (only a holder of
/// the secret can send one) is refused rather than grow the set.
const NONCES_MAX: usize = 1 << 20;

/// [`NONCES_MAX`], or under the `testing` feature what
/// `SPOOLD_TEST_NONCES_MAX` says (a cap a test can reach).
fn nonces_max() -> usize {
    #[cfg(feature = "testing")]
    if let Some(max) = std::env::var("SPOOLD_TEST_NONCES_MAX")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        return max;
    }
    NONCES_MAX
}
/// The body of a request that streams (a snapshot).
const STREAM: &str = "stream";

type HmacSha256 = Hmac<Sha256>;

/// The key every replication request and answer is signed with.
#[derive(Clone)]
pub(crate) struct ClusterKey([u8; 32]);

/// What the headers of a request say, once checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Verified {
    pub nonce: [u8; 16],
    /// The SHA-256 the body must have; `None` for a stream.
    pub body_sha256: Option<[u8; 32]>,
}

/// Why a request's headers were refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub(crate) enum AuthError {
    #[error("no valid spooler-cluster-auth header")]
    Missing,
    #[error(
        "the request's time is {skew_ms} ms from this replica's clock (more than the window): \
         clock skew"
    )]
    Stale {
        skew_ms: u64,
        /// What the signature covered: the refusal is signed for it, so
        /// that the sender learns of the skew from an answer it can trust.
        verified: Verified,
    },
    #[error("the signature does not match (not signed with this cluster's secret)")]
    BadMac,
    #[error("the request was seen before (a replay)")]
    Replayed,
    #[error("too many requests within the replay window")]
    Flooded,
}

/// The skew a refusal's text names (`AuthError::Stale`'s), read back by
/// the sender from a signed answer.
pub(crate) fn skew_in(text: &str) -> Option<u64> {
    let (_, rest) = text.split_once("the request's time is ")?;
    rest.split_once(" ms from")?.0.parse().ok()
}

/// Lower-case hex, without an allocation per byte (it runs several times
/// for every replication request).
fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(2 * bytes.len());
    for b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 15)]));
    }
    out
}

fn unhex<const N: usize>(text: &str) -> Option<[u8; N]> {
    if text.len() != 2 * N {
        return None;
    }
    let mut out = [0u8; N];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(text.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// The wall clock: a request's time is compared with the receiver's.
fn now_ms() -> u64 {
    u64::try_from(crate::time::wall_ms()).unwrap_or(0)
}

/// What a request's MAC covers besides its own fields.
pub(crate) struct RequestLine<'a> {
    pub method: &'a str,
    pub path: &'a str,
    pub from: u64,
    pub target: u64,
    pub incarnation: u64,
}

impl ClusterKey {
    pub(crate) fn new(secret: &str) -> ClusterKey {
        let mut mac = HmacSha256::new_from_slice(secret.as_bytes()).expect("HMAC takes any key");
        mac.update(b"spoold cluster auth v2");
        ClusterKey(mac.finalize().into_bytes().into())
    }

    fn mac(&self) -> HmacSha256 {
        HmacSha256::new_from_slice(&self.0).expect("HMAC takes any key")
    }

    fn request_mac(
        &self,
        line: &RequestLine<'_>,
        ms: u64,
        nonce: &[u8; 16],
        body: &str,
    ) -> HmacSha256 {
        let mut mac = self.mac();
        mac.update(
            format!(
                "spoold-cluster-request-v2\n{}\n{}\n{}\n{}\n{}\n{ms}\n{}\n{body}",
                line.method,
                line.path,
                line.from,
                line.target,
                line.incarnation,
                hex(nonce)
            )
            .as_bytes(),
        );
        mac
    }

    /// The `spooler-cluster-auth` value of a request (`body`: `None` for
    /// a stream), and its nonce (to check the answer with).
    pub(crate) fn sign(&self, line: &RequestLine<'_>, body: Option<&[u8]>) -> (String, [u8; 16]) {
        self.sign_at(line, body, now_ms())
    }

    /// As [`ClusterKey::sign`], with the time `ms` in the signature.
    pub(crate) fn sign_at(
        &self,
        line: &RequestLine<'_>,
        body: Option<&[u8]>,
        ms: u64,
    ) -> (String, [u8; 16]) {
        let nonce: [u8; 16] = rand::random();
        let body = body.map_or_else(|| STREAM.to_owned(), |b| hex(&Sha256::digest(b)));
        let mac = self
            .request_mac(line, ms, &nonce, &body)
            .finalize()
            .into_bytes();
        (
            format!("v2 {ms} {} {body} {}", hex(&nonce), hex(&mac)),
            nonce,
        )
    }

    /// Checks a request's `spooler-cluster-auth` value (constant-time),
    /// without its body.
    pub(crate) fn verify(
        &self,
        line: &RequestLine<'_>,
        value: &str,
        nonces: &Nonces,
    ) -> Result<Verified, AuthError> {
        let (ms, verified) = self.signed(line, value)?;
        let skew_ms = now_ms().abs_diff(ms);
        if skew_ms > REPLAY_WINDOW.as_millis() as u64 {
            return Err(AuthError::Stale { skew_ms, verified });
        }
        nonces.first_time(u128::from_le_bytes(verified.nonce))?;
        Ok(verified)
    }

    /// The sender a first request's head names, if the cluster's secret
    /// signed it (its time and nonce are checked later, with the request):
    /// the replication listener serves nobody else, and counts slots per
    /// sender (`src/listen.rs`).
    pub(crate) fn sender_of(&self, head: &[u8]) -> Result<u64, AuthError> {
        let mut headers = [httparse::EMPTY_HEADER; crate::listen::HEADERS_MAX];
        let mut request = httparse::Request::new(&mut headers);
        match request.parse(head) {
            Ok(httparse::Status::Complete(_)) => {}
            _ => return Err(AuthError::Missing),
        }
        let header = |name: &str| {
            request
                .headers
                .iter()
                .find(|h| h.name.eq_ignore_ascii_case(name))
                .and_then(|h| std::str::from_utf8(h.value).ok())
        };
        let number = |name: &str| header(name).and_then(|v| v.trim().parse::<u64>().ok());
        let (Some(method), Some(target), Some(value)) =
            (request.method, request.path, header(AUTH_HEADER))
        else {
            return Err(AuthError::Missing);
        };
        let from = number(FROM_HEADER).unwrap_or(0);
        let line = RequestLine {
            method,
            path: target.split('?').next().unwrap_or(target),
            from,
            target: number(TARGET_HEADER).unwrap_or(0),
            incarnation: number(INCARNATION_HEADER).unwrap_or(0),
        };
        self.signed(&line, value.trim())?;
        Ok(from)
    }

    /// Whether `value` is a signature of `line` by the cluster's secret
    /// (constant-time): the time it says, and its nonce and body hash.
    fn signed(&self, line: &RequestLine<'_>, value: &str) -> Result<(u64, Verified), AuthError> {
        let mut fields = value.split(' ');
        let (Some("v2"), Some(ms), Some(nonce), Some(body), Some(mac), None) = (
            fields.next(),
            fields.next(),
            fields.next(),
            fields.next(),
            fields.next(),
            fields.next(),
        ) else {
            return Err(AuthError::Missing);
        };
        let ms: u64 = ms.parse().map_err(|_| AuthError::Missing)?;
        let nonce_bytes = unhex::<16>(nonce).ok_or(AuthError::Missing)?;
        let mac_bytes = unhex::<32>(mac).ok_or(AuthError::Missing)?;
        let body_sha256 = match body {
            STREAM => None,
            hash => Some(unhex::<32>(hash).ok_or(AuthError::Missing)?),
        };
        self.request_mac(line, ms, &nonce_bytes, body)
            .verify_slice(&mac_bytes)
            .map_err(|_| AuthError::BadMac)?;
        Ok((
            ms,
            Verified {
                nonce: nonce_bytes,
                body_sha256,
            },
        ))
    }

    fn answer_mac(
        &self,
        nonce: &[u8; 16],
        status: u16,
        incarnation: u64,
        api_url: &str,
        body: &[u8],
    ) -> HmacSha256 {
        let mut mac = self.mac();
        mac.update(
            format!(
                "spoold-cluster-answer-v2\n{}\n{status}\n{incarnation}\n{api_url}\n{}",
                hex(nonce),
                hex(&Sha256::digest(body))
            )
            .as_bytes(),
        );
        mac
    }

    /// The `spooler-cluster-auth` value of an answer.
    pub(crate) fn sign_answer(
        &self,
        nonce: &[u8; 16],
        status: u16,
        incarnation: u64,
        api_url: &str,
        body: &[u8],
    ) -> String {
        hex(&self
            .answer_mac(nonce, status, incarnation, api_url, body)
            .finalize()
            .into_bytes())
    }

    /// Whether an answer's signature holds (constant-time).
    pub(crate) fn verify_answer(
        &self,
        nonce: &[u8; 16],
        status: u16,
        (incarnation, api_url): (u64, &str),
        body: &[u8],
        value: &str,
    ) -> bool {
        unhex::<32>(value).is_some_and(|mac| {
            self.answer_mac(nonce, status, incarnation, api_url, body)
                .verify_slice(&mac)
                .is_ok()
        })
    }

    /// The MAC that ends a streamed body, over its nonce and everything
    /// before it.
    pub(crate) fn stream_mac(&self, nonce: &[u8; 16]) -> StreamMac {
        let mut mac = self.mac();
        mac.update(b"spoold-cluster-stream-v2\n");
        mac.update(nonce);
        StreamMac(mac)
    }
}

/// The identity every replica of a cluster shares (docs/replication.md):
/// the salt of message ids and the key of lease tokens, so that ids and
/// tokens mean the same on every primary. Derived from the secret.
pub(crate) fn cluster_identity(secret: &str) -> crate::journal::SpoolIdentity {
    let derive = |label: &[u8]| {
        let mut mac = HmacSha256::new_from_slice(secret.as_bytes()).expect("HMAC takes any key");
        mac.update(label);
        let bytes: [u8; 32] = mac.finalize().into_bytes().into();
        bytes
    };
    let salt = derive(b"spoold cluster salt v1");
    crate::journal::SpoolIdentity {
        // Never zero, as for a single node's (journal/format.rs).
        salt: u64::from_le_bytes(salt[..8].try_into().expect("8 bytes")) | 1,
        token_key: derive(b"spoold cluster token key v1"),
    }
}

/// The running MAC of a streamed body: fed every message in order; its
/// final value is the stream's last message.
pub(crate) struct StreamMac(HmacSha256);

impl StreamMac {
    pub(crate) fn update(&mut self, message: &[u8]) {
        self.0.update(&(message.len() as u64).to_le_bytes());
        self.0.update(message);
    }

    pub(crate) fn finish(self) -> Vec<u8> {
        self.0.finalize().into_bytes().to_vec()
    }

    /// Whether `last` is this stream's MAC (constant-time).
    pub(crate) fn verify(self, last: &[u8]) -> bool {
        self.0.verify_slice(last).is_ok()
    }
}

/// The nonces seen within the replay window, oldest first, each with the
/// monotonic instant it came: a nonce is forgotten twice the window after
/// it came, whatever the wall clock does meanwhile. (By the wall clock,
/// a clock stepped back by S kept every nonce for S longer, and a replica
/// taking 580 requests a second filled the set in half an hour; then every
/// request was refused.)
///
/// The risk this accepts: a request captured at wall time T is refused
/// as stale once the receiver's clock is past T + window, and as a replay
/// until its nonce is forgotten, twice the window after it came. If the
/// receiver's wall clock then steps back by more than the window, a
/// captured request can be replayed once, to the one node and path it
/// was signed for, within the window (docs/replication.md).
#[derive(Default)]
pub(crate) struct Nonces(Mutex<NonceSet>);

#[derive(Default)]
struct NonceSet {
    seen: HashSet<u128>,
    order: VecDeque<(Instant, u128)>,
}

impl Nonces {
    fn first_time(&self, nonce: u128) -> Result<(), AuthError> {
        let now = Instant::now();
        let mut set = self.0.lock().expect("bug: nonce lock poisoned");
        // A nonce older than twice the window cannot come with a time
        // inside it any more (unless the clock stepped back: above).
        let keep = 2 * REPLAY_WINDOW;
        while set
            .order
            .front()
            .is_some_and(|(at, _)| now.saturating_duration_since(*at) > keep)
        {
            let (_, old) = set.order.pop_front().expect("checked");
            set.seen.remove(&old);
        }
        if set.seen.contains(&nonce) {
            return Err(AuthError::Replayed);
        }
        if set.seen.len() >= nonces_max() {
            return Err(AuthError::Flooded);
        }
        set.seen.insert(nonce);
        set.order.push_back((now, nonce));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(path: &str) -> RequestLine<'_> {
        RequestLine {
            method: "POST",
            path,
            from: 1,
            target: 2,
            incarnation: 7,
        }
    }

    #[test]
    fn a_request_verifies_once_and_only_as_signed() {
        let key = ClusterKey::new("secret");
        let nonces = Nonces::default();
        let (value, nonce) = key.sign(&line("/raft/vote"), Some(b"body"));
        let v = key.verify(&line("/raft/vote"), &value, &nonces).unwrap();
        assert_eq!(v.nonce, nonce);
        assert_eq!(v.body_sha256, Some(Sha256::digest(b"body").into()));
        assert_eq!(
            key.verify(&line("/raft/vote"), &value, &nonces)
                .unwrap_err(),
            AuthError::Replayed
        );

        let (value, _) = key.sign(&line("/raft/vote"), Some(b"body"));
        for other in [
            RequestLine {
                path: "/raft/append",
                ..line("")
            },
            RequestLine {
                target: 3,
                ..line("/raft/vote")
            },
            RequestLine {
                from: 3,
                ..line("/raft/vote")
            },
            RequestLine {
                incarnation: 8,
                ..line("/raft/vote")
            },
        ] {
            assert_eq!(
                key.verify(&other, &value, &nonces).unwrap_err(),
                AuthError::BadMac
            );
        }
        let stranger = ClusterKey::new("another secret");
        assert_eq!(
            stranger
                .verify(&line("/raft/vote"), &value, &nonces)
                .unwrap_err(),
            AuthError::BadMac
        );
        assert_eq!(
            key.verify(&line("/raft/vote"), "spoold cluster v1", &nonces)
                .unwrap_err(),
            AuthError::Missing
        );
    }

    #[test]
    fn a_request_signed_outside_the_window_is_stale() {
        let key = ClusterKey::new("secret");
        let nonce = [3u8; 16];
        let ms = now_ms() - 2 * REPLAY_WINDOW.as_millis() as u64;
        let mac = key
            .request_mac(&line("/raft/vote"), ms, &nonce, STREAM)
            .finalize()
            .into_bytes();
        let value = format!("v2 {ms} {} {STREAM} {}", hex(&nonce), hex(&mac));
        assert!(matches!(
            key.verify(&line("/raft/vote"), &value, &Nonces::default()),
            Err(AuthError::Stale { .. })
        ));
    }

    #[test]
    fn an_answer_verifies_only_for_its_request_and_contents() {
        let key = ClusterKey::new("secret");
        let nonce = [1u8; 16];
        let mac = key.sign_answer(&nonce, 200, 5, "http://a", b"ok");
        assert!(key.verify_answer(&nonce, 200, (5, "http://a"), b"ok", &mac));
        assert!(!key.verify_answer(&[2u8; 16], 200, (5, "http://a"), b"ok", &mac));
        assert!(!key.verify_answer(&nonce, 200, (5, "http://b"), b"ok", &mac));
        assert!(!key.verify_answer(&nonce, 200, (6, "http://a"), b"ok", &mac));
        assert!(!key.verify_answer(&nonce, 200, (5, "http://a"), b"no", &mac));
    }

    #[test]
    fn a_stream_verifies_only_whole_and_in_order() {
        let key = ClusterKey::new("secret");
        let nonce = [9u8; 16];
        let mut sent = key.stream_mac(&nonce);
        for m in [&b"a"[..], b"bc", b""] {
            sent.update(m);
        }
        let last = sent.finish();
        let mut whole = key.stream_mac(&nonce);
        for m in [&b"a"[..], b"bc", b""] {
            whole.update(m);
        }
        assert!(whole.verify(&last));
        let mut cut = key.stream_mac(&nonce);
        cut.update(b"a");
        assert!(!cut.verify(&last));
        let mut moved = key.stream_mac(&nonce);
        for m in [&b"ab"[..], b"c", b""] {
            moved.update(m);
        }
        assert!(!moved.verify(&last));
    }
}
