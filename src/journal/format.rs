//! The byte layout of everything the journal writes. `docs/journal-format.md`
//! is the prose version of this file; change both together.
//!
//! # Warning
//!
//! These layouts are on disk in users' spools. Changing a field's size, order
//! or meaning needs a new format version and a migration, not an edit.

use crc32c::{crc32c, crc32c_append};

/// Version of the segment and record layout written by this build.
pub const FORMAT_VERSION: u32 = 1;

pub const SEGMENT_MAGIC: &[u8; 8] = b"SPOOLSEG";
pub const META_MAGIC: &[u8; 8] = b"SPOOLMET";

/// Size of a segment header; records start right after it.
pub const SEGMENT_HEADER_BYTES: usize = 64;
/// Size of a record frame header; the body follows it.
pub const FRAME_HEADER_BYTES: usize = 20;
/// Size of the spool identity file.
pub const META_BYTES: usize = 64;

/// A record body larger than this is treated as damage when scanning. It is
/// far above any body the engine writes (`max_body_bytes` is capped well
/// below it), so a length field beyond it can only be garbage.
pub const RECORD_BODY_MAX_BYTES: usize = 256 << 20;

/// Segment header flag: the segment was rewritten by compaction, so its
/// sequence numbers increase but may skip.
pub const SEGMENT_FLAG_COMPACTED: u32 = 1;

/// The first bytes of every segment file.
///
/// ```text
/// 0   8  magic "SPOOLSEG"
/// 8   4  format version (u32 LE)
/// 12  4  flags (u32 LE; bit 0 = compacted)
/// 16  8  spool salt (u64 LE)
/// 24  8  segment id (u64 LE)
/// 32  8  sequence number of the segment's first record (u64 LE)
/// 40  8  compacted through: the journal's last sequence number when
///        compaction wrote this segment; 0 if never compacted (u64 LE)
/// 48  8  message-id floor: ids below it were used, even if compaction
///        dropped every record that showed them (u64 LE)
/// 56  4  covers from: compaction merged segments `covers_from..=id` into
///        this file; 0 when it covers only itself (u32 LE)
/// 60  4  CRC32C of bytes 0..60
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SegmentHeader {
    pub flags: u32,
    pub salt: u64,
    pub segment_id: u64,
    pub first_seq: u64,
    pub compacted_through: u64,
    pub id_floor: u64,
    pub covers_from: u32,
}

impl SegmentHeader {
    /// The lowest segment id this file stands for.
    pub fn first_covered_id(&self) -> u64 {
        match self.covers_from {
            0 => self.segment_id,
            n => u64::from(n),
        }
    }

    pub fn is_compacted(&self) -> bool {
        self.flags & SEGMENT_FLAG_COMPACTED != 0
    }
}

/// Why a segment header was rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeaderProblem {
    Short,
    BadMagic,
    BadChecksum,
    UnknownVersion(u32),
    ForeignSalt,
    WrongId,
}

impl std::fmt::Display for HeaderProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HeaderProblem::Short => write!(f, "segment header is truncated"),
            HeaderProblem::BadMagic => write!(f, "not a spoold segment (bad magic)"),
            HeaderProblem::BadChecksum => write!(f, "segment header checksum mismatch"),
            HeaderProblem::UnknownVersion(v) => write!(f, "unknown segment format version {v}"),
            HeaderProblem::ForeignSalt => write!(f, "segment belongs to another spool (salt)"),
            HeaderProblem::WrongId => write!(f, "segment id does not match its file name"),
        }
    }
}

impl SegmentHeader {
    pub fn encode(&self) -> [u8; SEGMENT_HEADER_BYTES] {
        let mut out = [0u8; SEGMENT_HEADER_BYTES];
        out[0..8].copy_from_slice(SEGMENT_MAGIC);
        out[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
        out[12..16].copy_from_slice(&self.flags.to_le_bytes());
        out[16..24].copy_from_slice(&self.salt.to_le_bytes());
        out[24..32].copy_from_slice(&self.segment_id.to_le_bytes());
        out[32..40].copy_from_slice(&self.first_seq.to_le_bytes());
        out[40..48].copy_from_slice(&self.compacted_through.to_le_bytes());
        out[48..56].copy_from_slice(&self.id_floor.to_le_bytes());
        out[56..60].copy_from_slice(&self.covers_from.to_le_bytes());
        let crc = crc32c(&out[..60]);
        out[60..64].copy_from_slice(&crc.to_le_bytes());
        out
    }

    pub fn decode(
        bytes: &[u8],
        salt: u64,
        expected_id: u64,
    ) -> Result<SegmentHeader, HeaderProblem> {
        if bytes.len() < SEGMENT_HEADER_BYTES {
            return Err(HeaderProblem::Short);
        }
        if &bytes[0..8] != SEGMENT_MAGIC {
            return Err(HeaderProblem::BadMagic);
        }
        if crc32c(&bytes[..60]) != le_u32(&bytes[60..64]) {
            return Err(HeaderProblem::BadChecksum);
        }
        let version = le_u32(&bytes[8..12]);
        if version != FORMAT_VERSION {
            return Err(HeaderProblem::UnknownVersion(version));
        }
        let header = SegmentHeader {
            flags: le_u32(&bytes[12..16]),
            salt: le_u64(&bytes[16..24]),
            segment_id: le_u64(&bytes[24..32]),
            first_seq: le_u64(&bytes[32..40]),
            compacted_through: le_u64(&bytes[40..48]),
            id_floor: le_u64(&bytes[48..56]),
            covers_from: le_u32(&bytes[56..60]),
        };
        if header.salt != salt {
            return Err(HeaderProblem::ForeignSalt);
        }
        if header.segment_id != expected_id {
            return Err(HeaderProblem::WrongId);
        }
        Ok(header)
    }
}

/// The frame around every record.
///
/// ```text
/// 0   4  body length in bytes (u32 LE)
/// 4   4  CRC32C over: salt (u64 LE) ‖ bytes 0..4 ‖ bytes 8..20 ‖ body
/// 8   8  sequence number (u64 LE)
/// 16  1  record kind
/// 17  3  reserved, zero
/// 20  …  body
/// ```
///
/// Mixing the spool's salt into the checksum means bytes of another spool,
/// or of an older incarnation of this directory, never pass as records here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    pub body_len: u32,
    pub seq: u64,
    pub kind: u8,
}

impl FrameHeader {
    /// Fills in the frame header at `frame[..FRAME_HEADER_BYTES]` for the
    /// body that follows it in `frame`.
    pub fn seal(frame: &mut [u8], salt: u64, seq: u64, kind: u8) {
        let body_len = (frame.len() - FRAME_HEADER_BYTES) as u32;
        frame[0..4].copy_from_slice(&body_len.to_le_bytes());
        frame[8..16].copy_from_slice(&seq.to_le_bytes());
        frame[16] = kind;
        frame[17..20].fill(0);
        let crc = frame_crc(frame, salt);
        frame[4..8].copy_from_slice(&crc.to_le_bytes());
    }

    /// Parses the header fields without checking anything.
    pub fn peek(bytes: &[u8]) -> FrameHeader {
        FrameHeader {
            body_len: le_u32(&bytes[0..4]),
            seq: le_u64(&bytes[8..16]),
            kind: bytes[16],
        }
    }

    /// Validates a complete frame (header and body); `frame` must be exactly
    /// `FRAME_HEADER_BYTES + body_len` long.
    pub fn verify(frame: &[u8], salt: u64) -> bool {
        le_u32(&frame[4..8]) == frame_crc(frame, salt) && frame[17..20] == [0, 0, 0]
    }
}

fn frame_crc(frame: &[u8], salt: u64) -> u32 {
    let crc = crc32c(&salt.to_le_bytes());
    let crc = crc32c_append(crc, &frame[0..4]);
    let crc = crc32c_append(crc, &frame[8..FRAME_HEADER_BYTES]);
    crc32c_append(crc, &frame[FRAME_HEADER_BYTES..])
}

/// The spool's identity, in `spool.meta`. Written once when the spool is
/// created (temp file, fsync, rename, directory fsync) and never changed.
///
/// ```text
/// 0   8  magic "SPOOLMET"
/// 8   4  format version (u32 LE)
/// 12  4  reserved, zero
/// 16  8  salt (u64 LE)
/// 24 32  token key (lease-token MAC and dedup-key hashing)
/// 56  4  reserved, zero
/// 60  4  CRC32C of bytes 0..60
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct SpoolIdentity {
    pub salt: u64,
    pub token_key: [u8; 32],
}

impl std::fmt::Debug for SpoolIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The token key is a secret: never print it.
        f.debug_struct("SpoolIdentity")
            .field("salt", &format_args!("{:016x}", self.salt))
            .finish_non_exhaustive()
    }
}

impl SpoolIdentity {
    pub fn generate() -> SpoolIdentity {
        let mut token_key = [0u8; 32];
        rand::fill(&mut token_key);
        SpoolIdentity {
            // Zero is avoided so that a zeroed region can never carry a
            // valid salt by accident.
            salt: rand::random::<u64>() | 1,
            token_key,
        }
    }

    pub fn encode(&self) -> [u8; META_BYTES] {
        let mut out = [0u8; META_BYTES];
        out[0..8].copy_from_slice(META_MAGIC);
        out[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
        out[16..24].copy_from_slice(&self.salt.to_le_bytes());
        out[24..56].copy_from_slice(&self.token_key);
        let crc = crc32c(&out[..60]);
        out[60..64].copy_from_slice(&crc.to_le_bytes());
        out
    }

    pub fn decode(bytes: &[u8]) -> Option<SpoolIdentity> {
        if bytes.len() != META_BYTES
            || &bytes[0..8] != META_MAGIC
            || crc32c(&bytes[..60]) != le_u32(&bytes[60..64])
            || le_u32(&bytes[8..12]) != FORMAT_VERSION
        {
            return None;
        }
        let mut token_key = [0u8; 32];
        token_key.copy_from_slice(&bytes[24..56]);
        Some(SpoolIdentity {
            salt: le_u64(&bytes[16..24]),
            token_key,
        })
    }
}

pub fn le_u32(b: &[u8]) -> u32 {
    u32::from_le_bytes(b[..4].try_into().expect("bug: slice shorter than 4"))
}

pub fn le_u64(b: &[u8]) -> u64 {
    u64::from_le_bytes(b[..8].try_into().expect("bug: slice shorter than 8"))
}

/// File name of segment `id`: sorts in id order.
pub fn segment_file_name(id: u64) -> String {
    format!("{id:016x}.seg")
}

/// The id of a segment file name, or `None` for other files.
pub fn parse_segment_file_name(name: &str) -> Option<u64> {
    let hex = name.strip_suffix(".seg")?;
    if hex.len() != 16 {
        return None;
    }
    u64::from_str_radix(hex, 16).ok()
}

pub const META_FILE_NAME: &str = "spool.meta";
pub const LOCK_FILE_NAME: &str = "spool.lock";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segment_header_round_trips_and_rejects_damage() {
        let h = SegmentHeader {
            flags: 0,
            salt: 7,
            segment_id: 3,
            first_seq: 99,
            compacted_through: 120,
            id_floor: 42,
            covers_from: 2,
        };
        let bytes = h.encode();
        assert_eq!(SegmentHeader::decode(&bytes, 7, 3), Ok(h));
        assert_eq!(
            SegmentHeader::decode(&bytes, 8, 3),
            Err(HeaderProblem::ForeignSalt)
        );
        assert_eq!(
            SegmentHeader::decode(&bytes, 7, 4),
            Err(HeaderProblem::WrongId)
        );
        assert_eq!(
            SegmentHeader::decode(&bytes[..10], 7, 3),
            Err(HeaderProblem::Short)
        );
        let mut flipped = bytes;
        flipped[33] ^= 1;
        assert_eq!(
            SegmentHeader::decode(&flipped, 7, 3),
            Err(HeaderProblem::BadChecksum)
        );
    }

    #[test]
    fn frame_checksum_covers_salt_header_and_body() {
        let mut frame = vec![0u8; FRAME_HEADER_BYTES];
        frame.extend_from_slice(b"body");
        FrameHeader::seal(&mut frame, 42, 5, 4);
        assert!(FrameHeader::verify(&frame, 42));
        assert!(!FrameHeader::verify(&frame, 43), "another spool's salt");
        let h = FrameHeader::peek(&frame);
        assert_eq!((h.body_len, h.seq, h.kind), (4, 5, 4));
        for i in 0..frame.len() {
            if (4..8).contains(&i) {
                continue;
            }
            let mut bad = frame.clone();
            bad[i] ^= 0x10;
            assert!(
                !FrameHeader::verify(&bad, 42),
                "flip at byte {i} went unnoticed"
            );
        }
    }

    #[test]
    fn identity_round_trips() {
        let id = SpoolIdentity::generate();
        assert_eq!(SpoolIdentity::decode(&id.encode()), Some(id.clone()));
        let mut bad = id.encode();
        bad[30] ^= 1;
        assert_eq!(SpoolIdentity::decode(&bad), None);
        assert!(!format!("{id:?}").contains("token_key"));
    }

    #[test]
    fn segment_names_sort_and_parse() {
        assert_eq!(segment_file_name(26), "000000000000001a.seg");
        assert_eq!(parse_segment_file_name("000000000000001a.seg"), Some(26));
        assert_eq!(parse_segment_file_name("1a.seg"), None);
        assert_eq!(parse_segment_file_name("spool.meta"), None);
    }
}
