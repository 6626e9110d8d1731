//! Where each key of a config file is written, so that every error names
//! its line. The lines come from the spans `toml` gives each key as it
//! parses, never from searching the text: a search finds a key's name in
//! a comment, in another table or inside a longer key.

use toml::de::{DeTable, DeValue};

use super::KeyError;

/// Every key of a config file: its path from the root and its line.
pub(super) struct KeyLines {
    keys: Vec<Key>,
    /// The byte offsets of the file's line breaks, in order: the line of an
    /// offset is one more than the breaks before it.
    breaks: Vec<usize>,
}

struct Key {
    /// The key and the tables it is in, outermost first
    /// (`["queues", "orders", "backoff", "initial"]`).
    path: Vec<String>,
    /// Where the key's name starts in the file.
    offset: usize,
    line: usize,
}

impl KeyLines {
    /// The keys of `root`, the document parsed from `text`.
    pub(super) fn new(text: &str, root: &DeTable<'_>) -> KeyLines {
        let breaks = text.match_indices('\n').map(|(i, _)| i).collect();
        let mut lines = KeyLines {
            keys: Vec::new(),
            breaks,
        };
        lines.note_keys(root, &mut Vec::new());
        lines
    }

    fn note_keys(&mut self, table: &DeTable<'_>, path: &mut Vec<String>) {
        for (key, value) in table.iter() {
            path.push(key.get_ref().to_string());
            let offset = key.span().start;
            let line = self.line_at(offset);
            self.keys.push(Key {
                path: path.clone(),
                offset,
                line,
            });
            if let DeValue::Table(inner) = value.get_ref() {
                self.note_keys(inner, path);
            }
            path.pop();
        }
    }

    /// The 1-based line of byte `offset`.
    fn line_at(&self, offset: usize) -> usize {
        self.breaks.partition_point(|&b| b < offset) + 1
    }

    /// The line of the key at `path` (`["events", "dedup_window"]`), if
    /// the file writes it.
    pub(super) fn line(&self, path: &[&str]) -> Option<usize> {
        self.keys.iter().find(|k| k.path == path).map(|k| k.line)
    }

    /// The line of the innermost key along `path` that the file writes: a
    /// queue's `backoff.max` is on the line of `backoff = { … }` when the
    /// table leaves `max` out, and on its `[queues.NAME]` line when it
    /// leaves out `backoff`.
    pub(super) fn nearest_line(&self, path: &[&str]) -> Option<usize> {
        (1..=path.len()).rev().find_map(|n| self.line(&path[..n]))
    }

    /// The mistake `message` about the key at `path`, on that key's line
    /// (none when the file does not write it: the value is a default).
    pub(super) fn error(&self, path: &[&str], message: String) -> KeyError {
        KeyError {
            line: self.line(path),
            message,
        }
    }

    /// The mistake `message` about the key at `path`, on the line of the
    /// innermost key along it that the file writes ([`Self::nearest_line`]).
    pub(super) fn error_near(&self, path: &[&str], message: String) -> KeyError {
        KeyError {
            line: self.nearest_line(path),
            message,
        }
    }

    /// An error of `toml` as spoold says it: the line, the key it is about
    /// (the innermost key written on that line before the error: a
    /// value's own key, or the unknown key itself), and what is wrong.
    pub(super) fn describe(&self, e: &toml::de::Error) -> KeyError {
        let Some(span) = e.span() else {
            return KeyError {
                line: None,
                message: e.message().to_string(),
            };
        };
        let line = self.line_at(span.start);
        let key = self
            .keys
            .iter()
            .filter(|k| k.line == line && k.offset <= span.start)
            .max_by_key(|k| k.offset);
        let message = match key {
            Some(key) => format!("{}: {}", key.path.join("."), e.message()),
            None => e.message().to_string(),
        };
        KeyError {
            line: Some(line),
            message,
        }
    }
}

/// `"line N: "` to put before a message, or nothing for an unknown line.
pub(super) fn at_line(line: Option<usize>) -> String {
    line.map_or(String::new(), |l| format!("line {l}: "))
}
