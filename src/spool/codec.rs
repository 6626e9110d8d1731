//! The byte helpers of every binary body the spool writes (records and
//! checkpoint chunks): little-endian integers, length-prefixed strings,
//! LEB128 varints, and a bounds-checked reader that turns a short body into
//! a [`DecodeError`] instead of a panic.

use super::command::MessageId;

/// Why a checksummed record body did not decode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct DecodeError(pub String);

pub(crate) fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}

pub(crate) fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}

pub(crate) fn put_i64(out: &mut Vec<u8>, v: i64) {
    out.extend_from_slice(&v.to_le_bytes());
}

pub(crate) fn put_str16(out: &mut Vec<u8>, s: &str) {
    let len = u16::try_from(s.len()).expect("bug: short string field over 64 KiB");
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

pub(crate) fn put_bytes32(out: &mut Vec<u8>, b: &[u8]) {
    put_u32(out, u32::try_from(b.len()).expect("bug: field over 4 GiB"));
    out.extend_from_slice(b);
}

pub(crate) struct Reader<'a> {
    pub(crate) buf: &'a [u8],
    pub(crate) pos: usize,
}

impl<'a> Reader<'a> {
    pub(crate) fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.buf.len())
            .ok_or_else(|| {
                DecodeError(format!("body ends early (need {n} bytes at {})", self.pos))
            })?;
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    pub(crate) fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take(1)?[0])
    }

    pub(crate) fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_le_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }

    pub(crate) fn u64(&mut self) -> Result<u64, DecodeError> {
        Ok(u64::from_le_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }

    /// A message id: ids count up from 1, so one with the top bit set
    /// (where the counter could overflow) is damage, not an id.
    pub(crate) fn id(&mut self) -> Result<MessageId, DecodeError> {
        match self.u64()? {
            id if id >> 63 == 0 => Ok(MessageId(id)),
            id => Err(DecodeError(format!("message id {id:#x} out of range"))),
        }
    }

    pub(crate) fn i64(&mut self) -> Result<i64, DecodeError> {
        Ok(self.u64()? as i64)
    }

    pub(crate) fn str16(&mut self) -> Result<&'a str, DecodeError> {
        let len = u16::from_le_bytes(self.take(2)?.try_into().expect("2 bytes")) as usize;
        std::str::from_utf8(self.take(len)?).map_err(|e| DecodeError(format!("string field: {e}")))
    }

    pub(crate) fn bytes32(&mut self) -> Result<&'a [u8], DecodeError> {
        let len = self.u32()? as usize;
        self.take(len)
    }

    pub(crate) fn str32(&mut self) -> Result<&'a str, DecodeError> {
        std::str::from_utf8(self.bytes32()?).map_err(|e| DecodeError(format!("string field: {e}")))
    }
}

/// Appends `v` as an unsigned LEB128 varint (1 byte below 128).
pub(crate) fn put_uvarint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Appends a signed value as a zigzag varint (small magnitudes, either
/// sign, take one byte).
pub(crate) fn put_ivarint(out: &mut Vec<u8>, v: i64) {
    put_uvarint(out, ((v << 1) ^ (v >> 63)) as u64);
}

impl Reader<'_> {
    pub(crate) fn new(buf: &[u8]) -> Reader<'_> {
        Reader { buf, pos: 0 }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.pos >= self.buf.len()
    }

    pub(crate) fn uvarint(&mut self) -> Result<u64, DecodeError> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.u8()?;
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(DecodeError("varint longer than 64 bits".into()))
    }

    pub(crate) fn ivarint(&mut self) -> Result<i64, DecodeError> {
        let z = self.uvarint()?;
        Ok(((z >> 1) as i64) ^ -((z & 1) as i64))
    }

    pub(crate) fn u16(&mut self) -> Result<u16, DecodeError> {
        Ok(u16::from_le_bytes([self.u8()?, self.u8()?]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_round_trip() {
        let mut out = Vec::new();
        let values = [0i64, 1, -1, 63, -64, 64, 1 << 40, i64::MIN, i64::MAX];
        for v in values {
            put_ivarint(&mut out, v);
        }
        put_uvarint(&mut out, u64::MAX);
        let mut r = Reader::new(&out);
        for v in values {
            assert_eq!(r.ivarint().unwrap(), v);
        }
        assert_eq!(r.uvarint().unwrap(), u64::MAX);
        assert!(r.is_empty());
        assert!(Reader::new(&[0x80]).uvarint().is_err());
    }
}
