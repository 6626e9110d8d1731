//! The framing of a streamed snapshot body: length-prefixed messages
//! (`u32` little-endian, then the bytes), the last of which is the
//! stream's MAC (`auth.rs`).

use axum::body::Bytes;

/// A message larger than this is not one spoold sends: a checkpoint chunk
/// or one record.
pub(crate) const MESSAGE_BYTES_MAX: usize = 64 << 20;

/// Length-prefixed messages (`u32` little-endian, then the bytes) read
/// from a stream of byte pieces.
pub(crate) struct Messages<S> {
    pieces: S,
    buf: Vec<u8>,
    /// Where the next message starts in `buf`.
    start: usize,
    done: bool,
}

impl<S, E> Messages<S>
where
    S: futures_util::Stream<Item = Result<Bytes, E>> + Unpin,
    E: std::fmt::Display,
{
    pub(crate) fn new(pieces: S) -> Self {
        Messages {
            pieces,
            buf: Vec::new(),
            start: 0,
            done: false,
        }
    }

    pub(crate) async fn next(&mut self) -> Option<std::io::Result<Vec<u8>>> {
        use futures_util::StreamExt;
        loop {
            let rest = &self.buf[self.start..];
            if rest.len() >= 4 {
                let len = u32::from_le_bytes(rest[..4].try_into().expect("4 bytes")) as usize;
                if len > MESSAGE_BYTES_MAX {
                    return Some(Err(self.fail(format!("a snapshot message of {len} bytes"))));
                }
                if rest.len() >= 4 + len {
                    let m = rest[4..4 + len].to_vec();
                    self.start += 4 + len;
                    return Some(Ok(m));
                }
            }
            if self.done {
                return (self.start < self.buf.len())
                    .then(|| Err(self.fail("the snapshot stream was cut short".into())));
            }
            // What is left of the pieces so far moves to the front once,
            // before the next piece is added.
            self.buf.drain(..self.start);
            self.start = 0;
            match self.pieces.next().await {
                Some(Ok(piece)) => self.buf.extend_from_slice(&piece),
                Some(Err(e)) => return Some(Err(self.fail(e.to_string()))),
                None => self.done = true,
            }
        }
    }

    /// Ends the stream with an error: every later call returns `None`.
    fn fail(&mut self, reason: String) -> std::io::Error {
        self.done = true;
        self.buf.clear();
        self.start = 0;
        std::io::Error::other(reason)
    }
}

/// Appends `m` with its length prefix.
pub(crate) fn put_message(out: &mut Vec<u8>, m: &[u8]) {
    out.extend_from_slice(
        &u32::try_from(m.len())
            .expect("messages stay small")
            .to_le_bytes(),
    );
    out.extend_from_slice(m);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Messages come out whole and in order however the body is cut into
    /// pieces; a body cut inside a message is an error, not a message.
    #[tokio::test]
    async fn messages_survive_any_cut_of_the_body() {
        let sent: Vec<Vec<u8>> = (0..200u32)
            .map(|i| vec![i as u8; (i as usize * 37) % 3000])
            .collect();
        let mut body = Vec::new();
        for m in &sent {
            put_message(&mut body, m);
        }
        for piece in [1, 3, 4, 5, 999, 4096, body.len()] {
            let pieces: Vec<Result<Bytes, std::io::Error>> = body
                .chunks(piece)
                .map(|c| Ok(Bytes::copy_from_slice(c)))
                .collect();
            let mut messages = Messages::new(futures_util::stream::iter(pieces));
            let mut got = Vec::new();
            while let Some(m) = messages.next().await {
                got.push(m.unwrap());
            }
            assert_eq!(got, sent, "pieces of {piece} bytes");
        }
        let cut: Vec<Result<Bytes, std::io::Error>> =
            vec![Ok(Bytes::copy_from_slice(&body[..body.len() - 1]))];
        let mut messages = Messages::new(futures_util::stream::iter(cut));
        let mut got = Vec::new();
        while let Some(m) = messages.next().await {
            got.push(m);
        }
        assert_eq!(
            got.len(),
            sent.len(),
            "the messages before the cut, then one error"
        );
        assert!(
            got.last().unwrap().is_err(),
            "a message cut short is an error"
        );
    }
}
