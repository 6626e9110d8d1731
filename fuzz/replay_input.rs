//! How a `replay` fuzz input becomes the bytes of segment 1. Shared by
//! `fuzz/fuzz_targets/replay.rs` and `tests/engine/fuzz.rs` (which replays every
//! input that once crashed), so both build exactly the same file.
//!
//! The first input byte picks how the rest becomes segment 1:
//! - 0: the whole file, header included;
//! - 1: a valid header, then the bytes as they are;
//! - 2: a valid header, then the bytes cut into records (kind, 2-byte
//!   length, body) sealed with valid checksums and sequence numbers, so the
//!   record decoder and the state machine see arbitrary bodies; whatever is
//!   left over becomes a torn tail.

use spoold::testing::{FRAME_FLAG_BATCH_END, FRAME_HEADER_BYTES, FrameHeader, SegmentHeader};

/// The salt of the spool identity the input is replayed under.
pub const SALT: u64 = 0x5eed_5eed_5eed_5eed;

pub fn segment(data: &[u8]) -> Vec<u8> {
    let Some((&mode, data)) = data.split_first() else {
        return Vec::new();
    };
    if mode % 3 == 0 {
        return data.to_vec();
    }
    let header = SegmentHeader {
        segment_id: 1,
        first_seq: 1,
    };
    let mut out = header.encode(SALT).to_vec();
    if mode % 3 == 1 {
        out.extend_from_slice(data);
        return out;
    }
    let mut rest = data;
    let mut seq = 1;
    while rest.len() >= 3 {
        let len = usize::from(u16::from_le_bytes([rest[1], rest[2]]));
        if rest.len() < 3 + len {
            break;
        }
        let mut frame = vec![0u8; FRAME_HEADER_BYTES + len];
        frame[FRAME_HEADER_BYTES..].copy_from_slice(&rest[3..3 + len]);
        // Each record a group commit of its own.
        FrameHeader::seal(
            &mut frame,
            SALT,
            FrameHeader {
                body_len: 0,
                seq,
                term: 0,
                kind: rest[0],
                flags: FRAME_FLAG_BATCH_END,
                batch_index: 0,
            },
        );
        out.extend_from_slice(&frame);
        seq += 1;
        rest = &rest[3 + len..];
    }
    out.extend_from_slice(rest);
    out
}
