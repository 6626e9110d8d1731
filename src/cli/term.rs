//! What the operator commands print reaches a terminal: message bodies,
//! destinations' answers and error texts come from senders and
//! destinations, and a stored `ESC [ 2 J` or `BEL` would act on the
//! operator's terminal (clear it, retitle it, fake a prompt). Unless
//! `--raw`, every control character but line feed and tab is printed as an
//! escape, and so are the bidirectional overrides that reorder what a line
//! seems to say, the way JSON writes them (`\u001b`, `\r`, `\u202e`), so
//! that `--json` lines stay valid JSON.

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
            c => out.push_str(&format!("\\u{:04x}", c as u32)),
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

    /// `text` as it will reach the terminal: escaped unless `raw`. For
    /// layouts that measure text before writing it (tables), so that an
    /// escape widens its column instead of pushing a row out of line; what
    /// is escaped already passes through the writer unchanged.
    pub fn shown<'a>(&self, text: &'a str) -> Cow<'a, str> {
        if self.raw {
            Cow::Borrowed(text)
        } else {
            escape_controls(text)
        }
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
        assert_eq!(
            escape_controls("\x1b[2J\x07a\rb\x7f"),
            "\\u001b[2J\\u0007a\\rb\\u007f"
        );
        assert_eq!(escape_controls("\u{9b}31m"), "\\u009b31m");
        assert_eq!(escape_controls("abc\u{202e}fed"), "abc\\u202efed");
        // In a JSON line, the escape is JSON's own: it still parses.
        let line = serde_json::json!({"body": "a\u{202e}b\u{9b}"}).to_string();
        let shown = escape_controls(&line);
        let back: serde_json::Value = serde_json::from_str(&shown).unwrap();
        assert_eq!(back["body"], "a\u{202e}b\u{9b}");
        let mut out = Terminal::new(Vec::new(), false);
        let stored = "\x1b]0;pwned\x07";
        writeln!(out, "id {stored}").unwrap();
        assert_eq!(out.inner, b"id \\u001b]0;pwned\\u0007\n");
        let mut raw = Terminal::new(Vec::new(), true);
        write!(raw, "\x1b").unwrap();
        assert_eq!(raw.inner, b"\x1b");
        // A table escapes its cells before it measures them; the writer
        // then leaves them as they are.
        assert_eq!(out.shown("a\x1bb"), "a\\u001bb");
        assert_eq!(raw.shown("a\x1bb"), "a\x1bb");
        let shown = out.shown("a\x1bb").into_owned();
        assert_eq!(escape_controls(&shown), shown);
    }
}
