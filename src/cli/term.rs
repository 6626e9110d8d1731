//! What the operator commands print reaches a terminal: message bodies,
//! destinations' answers and error texts come from senders and
//! destinations, and a stored `ESC [ 2 J` or `BEL` would act on the
//! operator's terminal (clear it, retitle it, fake a prompt). Unless
//! `--raw`, every control character but line feed and tab is printed as an
//! escape (`\x1b`), and so are the bidirectional overrides that reorder
//! what a line seems to say (`\u{202e}`).

use std::borrow::Cow;
use std::io::Write;

/// `text` with its control characters escaped (borrowed when it has none).
pub fn escape_controls(text: &str) -> Cow<'_, str> {
    if !text.chars().any(needs_escape) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            c if !needs_escape(c) => out.push(c),
            '\r' => out.push_str("\\r"),
            c if (c as u32) < 0x100 => out.push_str(&format!("\\x{:02x}", c as u32)),
            c => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
        }
    }
    Cow::Owned(out)
}

fn needs_escape(c: char) -> bool {
    (c.is_control() && c != '\n' && c != '\t')
        || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// A writer that escapes what passes through it (or, `raw`, passes it as
/// it is).
pub struct Terminal<W> {
    inner: W,
    raw: bool,
}

impl<W: Write> Terminal<W> {
    pub fn new(inner: W, raw: bool) -> Terminal<W> {
        Terminal { inner, raw }
    }
}

impl<W: Write> Write for Terminal<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.raw {
            return self.inner.write(buf);
        }
        // Formatted output arrives in whole `str` pieces; anything else
        // is shown with U+FFFD for what is not UTF-8.
        let text = String::from_utf8_lossy(buf);
        self.inner.write_all(escape_controls(&text).as_bytes())?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controls_are_shown_not_sent() {
        assert_eq!(escape_controls("plain\ttext\n"), "plain\ttext\n");
        assert_eq!(escape_controls("\x1b[2J\x07a\rb"), "\\x1b[2J\\x07a\\rb");
        assert_eq!(escape_controls("\u{9b}31m"), "\\x9b31m");
        assert_eq!(escape_controls("abc\u{202e}fed"), "abc\\u{202e}fed");
        let mut out = Terminal::new(Vec::new(), false);
        let stored = "\x1b]0;pwned\x07";
        writeln!(out, "id {stored}").unwrap();
        assert_eq!(out.inner, b"id \\x1b]0;pwned\\x07\n");
        let mut raw = Terminal::new(Vec::new(), true);
        write!(raw, "\x1b").unwrap();
        assert_eq!(raw.inner, b"\x1b");
    }
}
