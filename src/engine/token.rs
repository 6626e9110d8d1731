//! Lease tokens and message ids as the outside world sees them.
//!
//! A lease token is `base64url(version ‖ epoch ‖ message id ‖ lease serial ‖
//! MAC)`, the MAC being the first 16 bytes of HMAC-SHA256 under the spool's
//! token key. The key lives in `spool.meta`, so tokens from before a restart
//! still verify (and are then answered `409 stale_lease`, not `400`).
//!
//! A message id is 32 hex digits: the spool-local counter, then the spool's
//! salt. Two spools (say, two pods with fresh `emptyDir` volumes) never hand a
//! destination the same delivery id.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;
use subtle::ConstantTimeEq;

use crate::spool::MessageId;

const TOKEN_VERSION: u8 = 1;
const TOKEN_PLAIN_BYTES: usize = 1 + 8 + 8 + 8;
const TOKEN_MAC_BYTES: usize = 16;
const TOKEN_BYTES: usize = TOKEN_PLAIN_BYTES + TOKEN_MAC_BYTES;

/// What a genuine lease token names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseToken {
    pub epoch: u64,
    pub id: MessageId,
    pub serial: u64,
}

/// Makes and checks tokens and ids for one spool.
#[derive(Clone)]
pub struct Tokens {
    /// HMAC-SHA256 with the key already absorbed: cloning it saves two
    /// of the four compressions of every MAC.
    keyed: Hmac<Sha256>,
    salt: u64,
}

impl Tokens {
    pub fn new(key: [u8; 32], salt: u64) -> Tokens {
        let keyed = Hmac::<Sha256>::new_from_slice(&key).expect("HMAC takes any key");
        Tokens { keyed, salt }
    }

    fn mac(&self, plain: &[u8]) -> [u8; TOKEN_MAC_BYTES] {
        let mut mac = self.keyed.clone();
        mac.update(plain);
        let full = mac.finalize().into_bytes();
        let mut out = [0u8; TOKEN_MAC_BYTES];
        out.copy_from_slice(&full[..TOKEN_MAC_BYTES]);
        out
    }

    pub fn encode(&self, token: LeaseToken) -> String {
        let mut bytes = [0u8; TOKEN_BYTES];
        bytes[0] = TOKEN_VERSION;
        bytes[1..9].copy_from_slice(&token.epoch.to_le_bytes());
        bytes[9..17].copy_from_slice(&token.id.0.to_le_bytes());
        bytes[17..25].copy_from_slice(&token.serial.to_le_bytes());
        let mac = self.mac(&bytes[..TOKEN_PLAIN_BYTES]);
        bytes[TOKEN_PLAIN_BYTES..].copy_from_slice(&mac);
        URL_SAFE_NO_PAD.encode(bytes)
    }

    /// `None` for anything this spool did not issue: garbled, truncated or
    /// tampered tokens all look the same to the caller.
    pub fn decode(&self, text: &str) -> Option<LeaseToken> {
        if text.len() > 64 {
            return None;
        }
        let bytes = URL_SAFE_NO_PAD.decode(text).ok()?;
        if bytes.len() != TOKEN_BYTES || bytes[0] != TOKEN_VERSION {
            return None;
        }
        let expected = self.mac(&bytes[..TOKEN_PLAIN_BYTES]);
        // No early exit on the first differing byte.
        if !bool::from(expected.ct_eq(&bytes[TOKEN_PLAIN_BYTES..])) {
            return None;
        }
        let u64_at = |i: usize| u64::from_le_bytes(bytes[i..i + 8].try_into().expect("8 bytes"));
        Some(LeaseToken {
            epoch: u64_at(1),
            id: MessageId(u64_at(9)),
            serial: u64_at(17),
        })
    }

    /// The external form of a message id.
    pub fn format_id(&self, id: MessageId) -> String {
        // Every answer to a send carries one: no formatting machinery.
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let mut out = String::with_capacity(32);
        for n in [id.0, self.salt] {
            for shift in (0..16).rev() {
                out.push(char::from(HEX[((n >> (shift * 4)) & 0xf) as usize]));
            }
        }
        out
    }

    /// Parses an external id; `None` if malformed or from another spool.
    pub fn parse_id(&self, text: &str) -> Option<MessageId> {
        if text.len() != 32 || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        let n = u64::from_str_radix(&text[..16], 16).ok()?;
        let salt = u64::from_str_radix(&text[16..], 16).ok()?;
        (salt == self.salt).then_some(MessageId(n))
    }

    /// A dedup key's hash: keyed, so that nobody can craft collisions.
    pub fn dedup_hash(&self, queue: &str, key: &str) -> u64 {
        let mut mac = self.keyed.clone();
        mac.update(b"dedup\0");
        mac.update(queue.as_bytes());
        mac.update(b"\0");
        mac.update(key.as_bytes());
        let full = mac.finalize().into_bytes();
        u64::from_le_bytes(full[..8].try_into().expect("8 bytes"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokens() -> Tokens {
        Tokens::new([7; 32], 0xabc)
    }

    #[test]
    fn tokens_round_trip_in_the_url_safe_alphabet() {
        let t = LeaseToken {
            epoch: 3,
            id: MessageId(99),
            serial: 12,
        };
        let text = tokens().encode(t);
        assert!(
            text.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        );
        assert_eq!(tokens().decode(&text), Some(t));
    }

    #[test]
    fn garbled_truncated_tampered_or_foreign_tokens_are_rejected() {
        let text = tokens().encode(LeaseToken {
            epoch: 1,
            id: MessageId(1),
            serial: 1,
        });
        assert_eq!(tokens().decode(&text[..text.len() - 2]), None);
        assert_eq!(tokens().decode("not a token"), None);
        let mut tampered = text.clone().into_bytes();
        tampered[5] = if tampered[5] == b'A' { b'B' } else { b'A' };
        assert_eq!(
            tokens().decode(std::str::from_utf8(&tampered).unwrap()),
            None
        );
        assert_eq!(Tokens::new([8; 32], 0xabc).decode(&text), None);
    }

    #[test]
    fn ids_carry_the_spool_salt() {
        let text = tokens().format_id(MessageId(26));
        assert_eq!(text, "000000000000001a0000000000000abc");
        assert_eq!(tokens().parse_id(&text), Some(MessageId(26)));
        assert_eq!(Tokens::new([7; 32], 0xabd).parse_id(&text), None);
        assert_eq!(tokens().parse_id("xyz"), None);
        for (n, salt) in [
            (0, 0),
            (1, u64::MAX),
            (0x0123_4567_89ab_cdef, 0xfedc_ba98_7654_3210),
        ] {
            let text = Tokens::new([7; 32], salt).format_id(MessageId(n));
            assert_eq!(text, format!("{n:016x}{salt:016x}"));
        }
    }
}
