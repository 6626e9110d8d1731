//! The one place that reads frames out of bytes: replay's scan, compaction,
//! repair, `verify` and single-record reads all go through [`walk`] or
//! [`frame_at`], so a frame is judged by the same rules everywhere (length
//! within [`RECORD_BODY_MAX_BYTES`], inside the buffer, checksum, reserved
//! bytes zero).
//!
//! [`walk`] yields intact frames in order and the damaged spans between
//! them; it resynchronises after damage at the next intact frame, so one
//! flipped bit costs one span, not the rest of the file. What a span *means*
//! (a torn tail or corruption) is the caller's decision: it depends on where
//! the file sits in the journal.

use super::format::{FRAME_HEADER_BYTES, FrameHeader, RECORD_BODY_MAX_BYTES};

/// One intact frame in a buffer.
#[derive(Debug, Clone, Copy)]
pub struct Frame<'a> {
    /// Offset of the frame header in the buffer.
    pub offset: usize,
    pub header: FrameHeader,
    /// The whole frame: header and body.
    pub bytes: &'a [u8],
}

impl<'a> Frame<'a> {
    pub fn body(&self) -> &'a [u8] {
        &self.bytes[FRAME_HEADER_BYTES..]
    }

    /// Bytes of the whole frame.
    pub fn frame_len(&self) -> usize {
        self.bytes.len()
    }

    pub fn end(&self) -> usize {
        self.offset + self.bytes.len()
    }
}

/// Why there is no intact frame at an offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum FrameDamage {
    /// Fewer bytes are left than a frame header takes.
    #[error("{rest_bytes} bytes are too short for a record frame")]
    Short { rest_bytes: usize },
    /// The header's length is over what any writer writes.
    #[error("impossible record length {body_len}")]
    ImpossibleLength { body_len: usize },
    /// The frame would end past the file's end.
    #[error("record of {frame_len} bytes runs past the end of the file ({rest_bytes} left)")]
    PastEnd { frame_len: usize, rest_bytes: usize },
    /// The bytes are not the ones the checksum was made over.
    #[error("record checksum mismatch")]
    Checksum,
}

/// The intact frame at `off`, or why there is none.
pub(crate) fn frame_at(buf: &[u8], off: usize, salt: u64) -> Result<Frame<'_>, FrameDamage> {
    let rest = buf.len().saturating_sub(off);
    if rest < FRAME_HEADER_BYTES {
        return Err(FrameDamage::Short { rest_bytes: rest });
    }
    let header = FrameHeader::peek(&buf[off..]);
    let body_len = header.body_len as usize;
    if body_len > RECORD_BODY_MAX_BYTES {
        return Err(FrameDamage::ImpossibleLength { body_len });
    }
    let frame_len = FRAME_HEADER_BYTES + body_len;
    if frame_len > rest {
        return Err(FrameDamage::PastEnd {
            frame_len,
            rest_bytes: rest,
        });
    }
    let bytes = &buf[off..off + frame_len];
    if !FrameHeader::verify(bytes, salt) {
        return Err(FrameDamage::Checksum);
    }
    Ok(Frame {
        offset: off,
        header,
        bytes,
    })
}

/// The first offset at or after `from` that holds an intact frame with a
/// sequence number at or after `min_seq`.
pub(crate) fn resync(buf: &[u8], from: usize, salt: u64, min_seq: u64) -> Option<usize> {
    let last_start = buf.len().checked_sub(FRAME_HEADER_BYTES)?;
    (from..=last_start).find(|&p| {
        // Cheap checks first: most offsets fail on the length or sequence.
        let h = FrameHeader::peek(&buf[p..]);
        h.seq >= min_seq
            && h.body_len as usize <= RECORD_BODY_MAX_BYTES
            && FRAME_HEADER_BYTES + h.body_len as usize <= buf.len() - p
            && frame_at(buf, p, salt).is_ok()
    })
}

/// True when `bytes` holds only zeros: preallocated, never written.
pub(crate) fn all_zero(bytes: &[u8]) -> bool {
    // Eight bytes at a time: replay looks at every segment's tail. A frame
    // header is never zero, so at a record this stops at the first word.
    let mut words = bytes.chunks_exact(8);
    words.all(|w| u64::from_ne_bytes(w.try_into().expect("8 bytes")) == 0)
        && words.remainder().iter().all(|&b| b == 0)
}

/// What [`walk`] finds, in file order.
#[derive(Debug, Clone, Copy)]
pub enum Piece<'a> {
    Frame(Frame<'a>),
    /// `[start, end)` holds no intact frame; `end` is the next intact frame
    /// or the end of the written bytes.
    Damage {
        start: usize,
        end: usize,
        /// `true` when no intact frame follows (the damage runs to the end).
        last: bool,
    },
}

/// Why the frame at a damaged span's start is bad, for messages.
pub(crate) fn damage_reason(buf: &[u8], start: usize, salt: u64) -> String {
    frame_at(buf, start, salt)
        .err()
        .map(|damage| damage.to_string())
        .unwrap_or_default()
}

/// Walks `buf[start..]`: intact frames and damaged spans, until the end or
/// until only zeros remain (preallocated space no write reached). After
/// damage it resumes at the next intact frame whose sequence number is at
/// least `min_seq` (records never go back in sequence).
pub fn walk(buf: &[u8], start: usize, salt: u64, min_seq: u64) -> Walk<'_> {
    Walk {
        buf,
        off: start,
        salt,
        min_seq,
        done: false,
    }
}

pub struct Walk<'a> {
    buf: &'a [u8],
    off: usize,
    salt: u64,
    min_seq: u64,
    done: bool,
}

// Only part of what `testing` exports: nothing in the crate calls it.
#[cfg(any(test, feature = "testing"))]
impl Walk<'_> {
    /// Where the walk stopped: the end of the last intact frame or damaged
    /// span (the free space of a preallocated file starts here).
    pub fn offset(&self) -> usize {
        self.off
    }
}

impl<'a> Iterator for Walk<'a> {
    type Item = Piece<'a>;

    fn next(&mut self) -> Option<Piece<'a>> {
        if self.done || self.off >= self.buf.len() || all_zero(&self.buf[self.off..]) {
            self.done = true;
            return None;
        }
        match frame_at(self.buf, self.off, self.salt) {
            Ok(frame) => {
                self.off = frame.end();
                self.min_seq = self.min_seq.max(frame.header.seq);
                Some(Piece::Frame(frame))
            }
            Err(_) => {
                let start = self.off;
                match resync(self.buf, start + 1, self.salt, self.min_seq) {
                    Some(next) => {
                        self.off = next;
                        Some(Piece::Damage {
                            start,
                            end: next,
                            last: false,
                        })
                    }
                    None => {
                        // Zeros after the damage are free space.
                        let end = self
                            .buf
                            .iter()
                            .rposition(|&b| b != 0)
                            .map_or(start, |p| p + 1)
                            .max(start + 1);
                        self.off = end;
                        self.done = true;
                        Some(Piece::Damage {
                            start,
                            end,
                            last: true,
                        })
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(seq: u64, body: &[u8]) -> Vec<u8> {
        let mut f = vec![0u8; FRAME_HEADER_BYTES];
        f.extend_from_slice(body);
        FrameHeader::seal(
            &mut f,
            9,
            FrameHeader {
                body_len: 0,
                seq,
                term: 0,
                kind: 4,
                flags: 0,
                batch_index: 0,
            },
        );
        f
    }

    #[test]
    fn walks_frames_damage_and_free_space() {
        let mut buf = Vec::new();
        buf.extend(frame(1, b"one"));
        let damaged_at = buf.len();
        let mut two = frame(2, b"two");
        two[FRAME_HEADER_BYTES] ^= 1;
        buf.extend(two);
        let three_at = buf.len();
        buf.extend(frame(3, b"three"));
        buf.extend([0u8; 100]);
        let pieces: Vec<_> = walk(&buf, 0, 9, 0).collect();
        assert_eq!(pieces.len(), 3);
        assert!(matches!(pieces[0], Piece::Frame(f) if f.header.seq == 1 && f.body() == b"one"));
        assert!(matches!(
            pieces[1],
            Piece::Damage { start, end, last: false } if start == damaged_at && end == three_at
        ));
        assert!(matches!(pieces[2], Piece::Frame(f) if f.header.seq == 3));
    }

    #[test]
    fn damage_at_the_end_runs_to_the_last_written_byte() {
        let mut buf = frame(1, b"one");
        let torn_at = buf.len();
        buf.extend(&frame(2, b"two")[..20]);
        // The last byte written that is not zero (a torn write that ends in
        // zeros looks like free space there).
        let written = buf.iter().rposition(|&b| b != 0).unwrap() + 1;
        buf.extend([0u8; 64]);
        let pieces: Vec<_> = walk(&buf, 0, 9, 0).collect();
        assert_eq!(pieces.len(), 2);
        assert!(matches!(
            pieces[1],
            Piece::Damage { start, end, last: true } if start == torn_at && end == written
        ));
    }
}
