//! The byte layout of everything the journal writes. `docs/journal-format.md`
//! is the prose version of this file; change both together.
//!
//! # Warning
//!
//! These layouts are on disk in users' spools. Changing a field's size, order
//! or meaning needs a new format version and a migration, not an edit. The
//! format-version log is at the end of `docs/journal-format.md`; format 1 is
//! still read, by `journal::v1`, to upgrade it.

use crc32c::{crc32c, crc32c_append};

/// Version of the segment, pack, checkpoint and frame layouts written by
/// this build.
pub(crate) const FORMAT_VERSION: u32 = 2;
/// What this build reads of format 2, as one number that grows with every
/// record flag or chunk kind an older build cannot read: 1, format 2 as
/// first released (with replicated mode); 2, events and history (kinds 18
/// to 20, chunks 70 and 71); 3, event keys with fingerprints (chunk 72,
/// event flag bit 3); 4, ordering keys (chunk 73, enqueue and event flag
/// bit 4) and secret rotation (kind 21); 5, the event catalogue (kind 22,
/// chunk 74). Replicas of different levels do not replicate to
/// each other (`cluster/level.rs`), so no replica is ever sent what it
/// cannot read. (The hop count of records is a trailing field older
/// builds skip: it needs no level.) Raising it, or [`FORMAT_VERSION`],
/// needs a spool that the new build wrote in `tests/data`: until the table
/// of `tests/engine/fixture_table.rs` has one, that test fails.
pub(crate) const READS_LEVEL: u64 = 5;

/// Version of `spool.meta`'s layout (unchanged since the first release).
pub(crate) const META_VERSION: u32 = 1;

pub(crate) const SEGMENT_MAGIC: &[u8; 8] = b"SPOOLSEG";
pub(crate) const PACK_MAGIC: &[u8; 8] = b"SPOOLPAK";
pub(crate) const CHECKPOINT_MAGIC: &[u8; 8] = b"SPOOLCKP";
pub(crate) const META_MAGIC: &[u8; 8] = b"SPOOLMET";

/// Size of every file header (segment, pack, checkpoint): frames start
/// right after it.
pub const FILE_HEADER_BYTES: usize = 64;
/// Size of a record frame header; the body follows it.
pub const FRAME_HEADER_BYTES: usize = 32;
/// Size of the spool identity file.
pub(crate) const META_BYTES: usize = 64;

/// The one bound of a record's body. The writer refuses a larger one
/// ([`check_record_body`], before anything is written) and a scan reads a
/// length beyond it as damage. Everything the engine writes stays below
/// it by construction: `server.max_body_bytes` is capped at
/// `config::BODY_BYTES_MAX`, which leaves room for the most a record holds
/// beside its payload (a compile-time assertion there ties the two);
/// purges and redrives are split into records of at most
/// `spool::command::IDS_PER_RECORD_MAX` ids; checkpoint chunks are at most
/// `spool::checkpoint::CHUNK_BYTES_MAX`.
pub(crate) const RECORD_BODY_MAX_BYTES: usize = 256 << 20;

/// A record body beyond [`RECORD_BODY_MAX_BYTES`], refused before it
/// went anywhere.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("record too large: {len_bytes} > {limit_bytes} bytes")]
pub struct RecordTooLarge {
    pub len_bytes: usize,
    pub limit_bytes: usize,
}

/// Refuses a record body beyond [`RECORD_BODY_MAX_BYTES`]: every path that
/// frames a record (the writer, replicated mode's proposer) asks this
/// before the record goes anywhere.
pub(crate) fn check_record_body(len_bytes: usize) -> Result<(), RecordTooLarge> {
    if len_bytes > RECORD_BODY_MAX_BYTES {
        return Err(RecordTooLarge {
            len_bytes,
            limit_bytes: RECORD_BODY_MAX_BYTES,
        });
    }
    Ok(())
}

/// Packs laid out by [`super::files::PackLayout`] (a rebuild's, a snapshot
/// stream's) are closed once the next record would take them past this.
/// Record offsets are 32-bit, so a pack must stay below 4 GiB; tests use
/// a small bound so that every path that lays out packs writes several.
#[cfg(not(any(test, feature = "testing")))]
pub(crate) const PACK_BYTES_MAX: u64 = 1 << 30;
#[cfg(any(test, feature = "testing"))]
pub(crate) const PACK_BYTES_MAX: u64 = 1 << 20;
const _: () = assert!(
    PACK_BYTES_MAX + (FRAME_HEADER_BYTES + RECORD_BODY_MAX_BYTES) as u64 <= u32::MAX as u64,
    "a pack's last record must start and end at a 32-bit offset"
);

/// Frame flag: the last record of its group-commit batch (one write, one
/// fsync). Replay uses it to tell a torn final batch from corruption.
pub const FRAME_FLAG_BATCH_END: u8 = 1;

/// Record locations name a file by a `u32`: log segments below this, packs
/// at `PACK_FILE_BASE + pack id`. At 64 MiB a segment, 2³¹ segments is far
/// beyond any disk.
pub(crate) const PACK_FILE_BASE: u32 = 1 << 31;

/// What a file id of a [`super::RecordLoc`] names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FileId {
    Segment(u64),
    Pack(u64),
}

impl FileId {
    pub fn from_loc(file: u32) -> FileId {
        if file >= PACK_FILE_BASE {
            FileId::Pack(u64::from(file - PACK_FILE_BASE))
        } else {
            FileId::Segment(u64::from(file))
        }
    }

    pub fn to_loc(self) -> u32 {
        match self {
            FileId::Segment(id) => {
                assert!(
                    id < u64::from(PACK_FILE_BASE),
                    "bug: segment id {id} overflows a record location"
                );
                id as u32
            }
            FileId::Pack(id) => {
                assert!(
                    id < u64::from(u32::MAX - PACK_FILE_BASE),
                    "bug: pack id {id} overflows a record location"
                );
                PACK_FILE_BASE + id as u32
            }
        }
    }

    pub fn file_name(self) -> String {
        match self {
            FileId::Segment(id) => segment_file_name(id),
            FileId::Pack(id) => pack_file_name(id),
        }
    }
}

/// Why a file header was rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HeaderProblem {
    Short,
    BadMagic,
    BadChecksum,
    /// Format 1 (before checkpoints): readable only to be upgraded.
    OldVersion(u32),
    UnknownVersion(u32),
    ForeignSalt,
    WrongId,
}

impl std::fmt::Display for HeaderProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HeaderProblem::Short => write!(f, "file header is truncated"),
            HeaderProblem::BadMagic => write!(f, "not a spoold file (bad magic)"),
            HeaderProblem::BadChecksum => write!(f, "file header checksum mismatch"),
            HeaderProblem::OldVersion(v) => write!(
                f,
                "written by an older spoold (format {v}); it is upgraded at start-up or by `spoold journal upgrade`"
            ),
            HeaderProblem::UnknownVersion(v) => {
                write!(f, "unknown format version {v} (written by a newer spoold?)")
            }
            HeaderProblem::ForeignSalt => write!(f, "file belongs to another spool (salt)"),
            HeaderProblem::WrongId => write!(f, "file id does not match its file name"),
        }
    }
}

/// The common shape of the three file headers: magic, version, salt, an id,
/// three numbers, a CRC.
///
/// ```text
/// 0   8  magic
/// 8   4  format version (u32 LE)
/// 12  4  reserved, zero
/// 16  8  spool salt (u64 LE)
/// 24  8  id: the segment id, pack id, or checkpoint sequence number
/// 32  8  a (u64 LE)  ┐
/// 40  8  b (u64 LE)  │ meaning per file kind, see below
/// 48  8  c (u64 LE)  ┘
/// 56  4  reserved, zero
/// 60  4  CRC32C of bytes 0..60
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct RawHeader {
    id: u64,
    a: u64,
    b: u64,
    c: u64,
}

impl RawHeader {
    fn encode(&self, magic: &[u8; 8], salt: u64) -> [u8; FILE_HEADER_BYTES] {
        let mut out = [0u8; FILE_HEADER_BYTES];
        out[0..8].copy_from_slice(magic);
        out[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
        out[16..24].copy_from_slice(&salt.to_le_bytes());
        out[24..32].copy_from_slice(&self.id.to_le_bytes());
        out[32..40].copy_from_slice(&self.a.to_le_bytes());
        out[40..48].copy_from_slice(&self.b.to_le_bytes());
        out[48..56].copy_from_slice(&self.c.to_le_bytes());
        let crc = crc32c(&out[..60]);
        out[60..64].copy_from_slice(&crc.to_le_bytes());
        out
    }

    fn decode(
        bytes: &[u8],
        magic: &[u8; 8],
        salt: u64,
        expected_id: Option<u64>,
    ) -> Result<RawHeader, HeaderProblem> {
        if bytes.len() < FILE_HEADER_BYTES {
            return Err(HeaderProblem::Short);
        }
        if &bytes[0..8] != magic {
            return Err(HeaderProblem::BadMagic);
        }
        if crc32c(&bytes[..60]) != le_u32(&bytes[60..64]) {
            return Err(HeaderProblem::BadChecksum);
        }
        match le_u32(&bytes[8..12]) {
            FORMAT_VERSION => {}
            1 => return Err(HeaderProblem::OldVersion(1)),
            v => return Err(HeaderProblem::UnknownVersion(v)),
        }
        if le_u64(&bytes[16..24]) != salt {
            return Err(HeaderProblem::ForeignSalt);
        }
        let header = RawHeader {
            id: le_u64(&bytes[24..32]),
            a: le_u64(&bytes[32..40]),
            b: le_u64(&bytes[40..48]),
            c: le_u64(&bytes[48..56]),
        };
        if expected_id.is_some_and(|id| id != header.id) {
            return Err(HeaderProblem::WrongId);
        }
        Ok(header)
    }
}

/// The header of a log segment `<id>.seg` (field `a` = the sequence number
/// of its first record; `b`, `c` zero).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SegmentHeader {
    pub segment_id: u64,
    pub first_seq: u64,
}

impl SegmentHeader {
    pub fn encode(&self, salt: u64) -> [u8; FILE_HEADER_BYTES] {
        RawHeader {
            id: self.segment_id,
            a: self.first_seq,
            b: 0,
            c: 0,
        }
        .encode(SEGMENT_MAGIC, salt)
    }

    pub(crate) fn decode(
        bytes: &[u8],
        salt: u64,
        expected_id: u64,
    ) -> Result<SegmentHeader, HeaderProblem> {
        let raw = RawHeader::decode(bytes, SEGMENT_MAGIC, salt, Some(expected_id))?;
        Ok(SegmentHeader {
            segment_id: raw.id,
            first_seq: raw.a,
        })
    }
}

/// The header of a pack `<id>.pack`: payload frames that compaction copied
/// out of older files (field `a` = the checkpoint sequence number it was
/// written for; `b`, `c` zero).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct PackHeader {
    pub pack_id: u64,
    pub checkpoint_seq: u64,
}

impl PackHeader {
    pub(crate) fn encode(&self, salt: u64) -> [u8; FILE_HEADER_BYTES] {
        RawHeader {
            id: self.pack_id,
            a: self.checkpoint_seq,
            b: 0,
            c: 0,
        }
        .encode(PACK_MAGIC, salt)
    }

    pub(crate) fn decode(
        bytes: &[u8],
        salt: u64,
        expected_id: u64,
    ) -> Result<PackHeader, HeaderProblem> {
        let raw = RawHeader::decode(bytes, PACK_MAGIC, salt, Some(expected_id))?;
        Ok(PackHeader {
            pack_id: raw.id,
            checkpoint_seq: raw.a,
        })
    }
}

/// The header of a checkpoint `<seq>.ckpt` (id = the sequence number of the
/// last record it reflects; `a` = its chunk count; `b` = the file's length;
/// `c` = the term of record `seq`, 0 outside replicated mode).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct CheckpointHeader {
    pub seq: u64,
    pub chunks: u64,
    pub file_bytes: u64,
    pub term: u64,
}

impl CheckpointHeader {
    pub(crate) fn encode(&self, salt: u64) -> [u8; FILE_HEADER_BYTES] {
        RawHeader {
            id: self.seq,
            a: self.chunks,
            b: self.file_bytes,
            c: self.term,
        }
        .encode(CHECKPOINT_MAGIC, salt)
    }

    pub(crate) fn decode(
        bytes: &[u8],
        salt: u64,
        expected_seq: u64,
    ) -> Result<CheckpointHeader, HeaderProblem> {
        let raw = RawHeader::decode(bytes, CHECKPOINT_MAGIC, salt, Some(expected_seq))?;
        Ok(CheckpointHeader {
            seq: raw.id,
            chunks: raw.a,
            file_bytes: raw.b,
            term: raw.c,
        })
    }
}

/// The frame around every record (and every checkpoint chunk).
///
/// ```text
/// 0   4  body length in bytes (u32 LE)
/// 4   4  CRC32C over: salt (u64 LE) ‖ bytes 0..4 ‖ bytes 8..32 ‖ body
/// 8   8  sequence number (u64 LE)
/// 16  8  term (u64 LE; 0 outside replicated mode)
/// 24  1  record kind
/// 25  1  flags: bit 0 = last record of its group-commit batch
/// 26  2  reserved, zero
/// 28  4  index of the record in its batch (u32 LE; 0 for the first)
/// 32  …  body
/// ```
///
/// Mixing the spool's salt into the checksum means bytes of another spool,
/// or of an older incarnation of this directory, never pass as records here.
/// The batch fields let replay tell where each group commit began and ended,
/// so damage confined to the last one (written after the last fsync that
/// returned) is a torn tail, whatever its shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    pub body_len: u32,
    pub seq: u64,
    pub term: u64,
    pub kind: u8,
    pub flags: u8,
    pub batch_index: u32,
}

impl FrameHeader {
    /// Fills in the frame header at `frame[..FRAME_HEADER_BYTES]` for the
    /// body that follows it in `frame`.
    pub fn seal(frame: &mut [u8], salt: u64, header: FrameHeader) {
        // Paired with the reader's check of a location's size
        // (`journal/reader.rs`, `read_frame_from`): every path that makes a
        // record refused a bigger body (`check_record_body`), so one here
        // is a bug, and sealing it would write a frame no reader takes.
        assert!(
            frame.len() >= FRAME_HEADER_BYTES
                && frame.len() - FRAME_HEADER_BYTES <= RECORD_BODY_MAX_BYTES,
            "bug: sealing a frame of {} bytes",
            frame.len()
        );
        let body_len = u32::try_from(frame.len() - FRAME_HEADER_BYTES)
            .expect("bug: a record body beyond 4 GiB");
        frame[0..4].copy_from_slice(&body_len.to_le_bytes());
        frame[8..16].copy_from_slice(&header.seq.to_le_bytes());
        frame[16..24].copy_from_slice(&header.term.to_le_bytes());
        frame[24] = header.kind;
        frame[25] = header.flags;
        frame[26..28].fill(0);
        frame[28..32].copy_from_slice(&header.batch_index.to_le_bytes());
        let crc = frame_crc(frame, salt);
        frame[4..8].copy_from_slice(&crc.to_le_bytes());
    }

    /// Parses the header fields without checking anything.
    pub fn peek(bytes: &[u8]) -> FrameHeader {
        FrameHeader {
            body_len: le_u32(&bytes[0..4]),
            seq: le_u64(&bytes[8..16]),
            term: le_u64(&bytes[16..24]),
            kind: bytes[24],
            flags: bytes[25],
            batch_index: le_u32(&bytes[28..32]),
        }
    }

    /// Validates a complete frame (header and body); `frame` must be exactly
    /// `FRAME_HEADER_BYTES + body_len` long.
    pub fn verify(frame: &[u8], salt: u64) -> bool {
        le_u32(&frame[4..8]) == frame_crc(frame, salt) && frame[26..28] == [0, 0]
    }

    /// The last record of its group-commit batch.
    pub fn ends_batch(&self) -> bool {
        self.flags & FRAME_FLAG_BATCH_END != 0
    }

    /// The sequence number of the first record of this record's batch.
    pub fn batch_first_seq(&self) -> u64 {
        self.seq.saturating_sub(u64::from(self.batch_index))
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
/// 8   4  meta version (u32 LE, 1)
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
        out[8..12].copy_from_slice(&META_VERSION.to_le_bytes());
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
            || le_u32(&bytes[8..12]) != META_VERSION
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

pub(crate) fn le_u32(b: &[u8]) -> u32 {
    u32::from_le_bytes(b[..4].try_into().expect("bug: slice shorter than 4"))
}

pub(crate) fn le_u64(b: &[u8]) -> u64 {
    u64::from_le_bytes(b[..8].try_into().expect("bug: slice shorter than 8"))
}

/// File name of segment `id`: sorts in id order.
pub fn segment_file_name(id: u64) -> String {
    format!("{id:016x}.seg")
}

/// File name of pack `id`.
pub(crate) fn pack_file_name(id: u64) -> String {
    format!("{id:016x}.pack")
}

/// File name of the checkpoint at sequence number `seq`.
pub(crate) fn checkpoint_file_name(seq: u64) -> String {
    format!("{seq:016x}.ckpt")
}

fn parse_hex_name(name: &str, suffix: &str) -> Option<u64> {
    let hex = name.strip_suffix(suffix)?;
    if hex.len() != 16 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u64::from_str_radix(hex, 16).ok()
}

/// The id of a segment file name, or `None` for other files.
pub(crate) fn parse_segment_file_name(name: &str) -> Option<u64> {
    parse_hex_name(name, ".seg")
}

pub(crate) fn parse_pack_file_name(name: &str) -> Option<u64> {
    parse_hex_name(name, ".pack")
}

pub(crate) fn parse_checkpoint_file_name(name: &str) -> Option<u64> {
    parse_hex_name(name, ".ckpt")
}

pub(crate) const META_FILE_NAME: &str = "spool.meta";
pub(crate) const LOCK_FILE_NAME: &str = "spool.lock";

#[cfg(test)]
mod tests {
    use super::*;

    fn header(seq: u64) -> FrameHeader {
        FrameHeader {
            body_len: 0,
            seq,
            term: 1,
            kind: 1,
            flags: FRAME_FLAG_BATCH_END,
            batch_index: 0,
        }
    }

    #[test]
    fn a_sealed_frame_verifies_with_its_salt_only() {
        let mut frame = vec![7u8; FRAME_HEADER_BYTES + 10];
        FrameHeader::seal(&mut frame, 5, header(3));
        let read = crate::journal::frames::frame_at(&frame, 0, 5).expect("a sealed frame verifies");
        assert_eq!(read.frame_len(), frame.len());
        assert!(crate::journal::frames::frame_at(&frame, 0, 6).is_err());
    }

    /// The paired assertion of the writer's seal: a body beyond
    /// [`RECORD_BODY_MAX_BYTES`] never reaches the disk as a frame. (The
    /// buffer is zeroed lazily: the assertion trips before a page is
    /// touched.)
    #[test]
    #[should_panic(expected = "bug: sealing a frame of")]
    fn a_record_too_big_for_its_frame_trips_the_seal() {
        let mut frame = vec![0u8; FRAME_HEADER_BYTES + RECORD_BODY_MAX_BYTES + 1];
        FrameHeader::seal(&mut frame, 5, header(3));
    }

    #[test]
    #[should_panic(expected = "bug: sealing a frame of")]
    fn a_frame_shorter_than_its_header_trips_the_seal() {
        let mut frame = vec![0u8; FRAME_HEADER_BYTES - 1];
        FrameHeader::seal(&mut frame, 5, header(3));
    }

    #[test]
    fn file_headers_round_trip_and_reject_damage() {
        let h = SegmentHeader {
            segment_id: 3,
            first_seq: 99,
        };
        let bytes = h.encode(7);
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
        assert_eq!(
            PackHeader::decode(&bytes, 7, 3),
            Err(HeaderProblem::BadMagic),
            "a segment is not a pack"
        );
        let mut flipped = bytes;
        flipped[33] ^= 1;
        assert_eq!(
            SegmentHeader::decode(&flipped, 7, 3),
            Err(HeaderProblem::BadChecksum)
        );
        let c = CheckpointHeader {
            seq: 40,
            chunks: 3,
            file_bytes: 999,
            term: 2,
        };
        assert_eq!(CheckpointHeader::decode(&c.encode(7), 7, 40), Ok(c));
    }

    #[test]
    fn frame_checksum_covers_salt_header_and_body() {
        let mut frame = vec![0u8; FRAME_HEADER_BYTES];
        frame.extend_from_slice(b"body");
        let header = FrameHeader {
            body_len: 4,
            seq: 5,
            term: 9,
            kind: 4,
            flags: FRAME_FLAG_BATCH_END,
            batch_index: 2,
        };
        FrameHeader::seal(&mut frame, 42, header);
        assert!(FrameHeader::verify(&frame, 42));
        assert!(!FrameHeader::verify(&frame, 43), "another spool's salt");
        let h = FrameHeader::peek(&frame);
        assert_eq!(h, header);
        assert!(h.ends_batch());
        assert_eq!(h.batch_first_seq(), 3);
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
    fn file_names_sort_and_parse() {
        assert_eq!(segment_file_name(26), "000000000000001a.seg");
        assert_eq!(parse_segment_file_name("000000000000001a.seg"), Some(26));
        assert_eq!(parse_segment_file_name("1a.seg"), None);
        assert_eq!(parse_segment_file_name("spool.meta"), None);
        assert_eq!(parse_pack_file_name(&pack_file_name(7)), Some(7));
        assert_eq!(
            parse_checkpoint_file_name(&checkpoint_file_name(1 << 40)),
            Some(1 << 40)
        );
        assert_eq!(parse_checkpoint_file_name("000000000000001a.seg"), None);
    }

    #[test]
    fn file_ids_share_one_u32_space() {
        assert_eq!(
            FileId::from_loc(FileId::Segment(5).to_loc()),
            FileId::Segment(5)
        );
        assert_eq!(FileId::from_loc(FileId::Pack(5).to_loc()), FileId::Pack(5));
        assert_ne!(FileId::Segment(5).to_loc(), FileId::Pack(5).to_loc());
    }
}

/// Where a record lives on disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RecordLoc {
    /// The file: a log segment or a pack ([`FileId::from_loc`]).
    pub file: u32,
    /// Offset of the record's frame in the segment.
    pub offset: u32,
    /// Length of the frame (header and body).
    pub len: u32,
}
