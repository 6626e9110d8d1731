//! Tables for people: a header line, then columns aligned two spaces
//! apart, without borders and without blanks at the ends of lines, so that
//! `grep`, `awk '{print $1}'` and a pager read them as plain text. Laid out
//! by comfy-table and never wrapped: a pipe gets whole lines.
//!
//! Each cell is escaped (`cli/term.rs`) before it is measured, so that an
//! escaped control character widens its column instead of pushing the
//! rest of its row out of line; the terminal then finds nothing left to
//! escape.

use std::io::Write;

use comfy_table::presets::NOTHING;
use comfy_table::{ContentArrangement, Table};

use super::client::OpsError;
use crate::cli::term::Terminal;

/// Spaces between two columns.
const COLUMN_GAP: u16 = 2;

/// Writes `rows` under `header`, every cell as `out` will show it.
pub(super) fn write<W: Write>(
    out: &mut Terminal<W>,
    header: &[&str],
    rows: &[Vec<String>],
) -> Result<(), OpsError> {
    let shown = rows.iter().map(|row| {
        row.iter()
            .map(|cell| out.shown(cell).into_owned())
            .collect::<Vec<String>>()
    });
    let text = render(header, shown);
    out.write_all(text.as_bytes())?;
    Ok(())
}

/// The table as text, each line ending in a newline.
fn render(header: &[&str], rows: impl IntoIterator<Item = Vec<String>>) -> String {
    let mut table = Table::new();
    table
        .load_style(NOTHING)
        .set_content_arrangement(ContentArrangement::Disabled)
        .set_header(header.to_vec())
        .add_rows(rows);
    let last = header.len().saturating_sub(1);
    for column in table.column_iter_mut() {
        let gap = if column.index == last { 0 } else { COLUMN_GAP };
        column.set_padding((0, gap));
    }
    let mut text = table.trim_fmt();
    text.push('\n');
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cells(row: &[&str]) -> Vec<String> {
        row.iter().map(|c| c.to_string()).collect()
    }

    #[test]
    fn columns_align_two_spaces_apart() {
        let t = render(
            &["A", "LONGER"],
            [cells(&["xxxx", "1"]), cells(&["y", "22"])],
        );
        assert_eq!(t, "A     LONGER\nxxxx  1\ny     22\n");
        let none: Vec<Vec<String>> = Vec::new();
        assert_eq!(render(&["ID", "REASON"], none), "ID  REASON\n");
    }
}
