//! Human output: tables, times, durations. Every text shown to a person goes through
//! [`clean`] (tables do it themselves): job names, commands, paths, reasons and error messages
//! come from users, and another user's terminal must not obey their control characters. JSON
//! output keeps the exact values.

use std::io::Write;

use unicode_width::UnicodeWidthStr;

pub use wharf_api::text::printable as clean;

/// A plain, aligned table with a header row (like squeue) whose cells are escaped: each column
/// as wide as its widest cell, two spaces between columns. Made here rather than with a table
/// crate because a queue of 100,000 jobs is 100,000 rows, and this is a single pass over them:
/// every cell's text goes into one buffer, with its width measured once.
#[derive(Debug, Default)]
pub struct Table {
    /// Every cell, escaped, one after the other.
    text: String,
    /// Each cell's end in `text` and its width on screen (32 bits each: a long listing has a
    /// million cells).
    cells: Vec<(u32, u32)>,
    /// Each row's end in `cells`.
    rows: Vec<usize>,
    widths: Vec<usize>,
}

impl Table {
    /// Room for `rows` more rows of `cells` cells of about `bytes` bytes each.
    pub fn reserve(&mut self, rows: usize, cells: usize, bytes: usize) {
        self.text.reserve(rows * cells * bytes);
        self.cells.reserve(rows * cells);
        self.rows.reserve(rows);
    }

    /// Adds a row; control characters in the cells are escaped.
    pub fn add_row<S: AsRef<str>>(&mut self, cells: impl IntoIterator<Item = S>) {
        for c in cells {
            self.cell(c.as_ref());
        }
        self.end_row();
    }

    /// Adds a cell to the row being made; control characters in it are escaped.
    pub fn cell(&mut self, text: &str) {
        self.text.push_str(&clean(text));
        self.close_cell();
    }

    /// Adds a cell written by `args` (`format_args!`) to the row being made, escaped as
    /// [`Table::cell`] does, without a string of its own.
    pub fn cell_fmt(&mut self, args: std::fmt::Arguments) {
        let start = self.text.len();
        // Writing to a String cannot fail.
        let _ = std::fmt::Write::write_fmt(&mut self.text, args);
        if let std::borrow::Cow::Owned(escaped) = clean(&self.text[start..]) {
            self.text.truncate(start);
            self.text.push_str(&escaped);
        }
        self.close_cell();
    }

    /// Ends the row being made.
    pub fn end_row(&mut self) {
        self.rows.push(self.cells.len());
    }

    /// Measures the cell that ends at the end of `text`.
    fn close_cell(&mut self) {
        let start = self.cells.last().map_or(0, |c| c.0 as usize);
        let cell = &self.text[start..];
        // Escaped text has no control characters: printable ASCII is one column a byte.
        let w = if cell.bytes().all(|b| b.is_ascii_graphic() || b == b' ') {
            cell.len()
        } else {
            cell.width()
        };
        let k = self.cells.len() - self.rows.last().copied().unwrap_or(0);
        match self.widths.get_mut(k) {
            Some(max) => *max = (*max).max(w),
            None => self.widths.push(w),
        }
        // Past 4 GiB of text (never, in practice) the table's lines would be wrong, not unsafe.
        self.cells.push((self.text.len() as u32, w as u32));
    }

    /// Writes the table, one line per row, without trailing spaces.
    pub fn write(&self, out: &mut impl Write) -> std::io::Result<()> {
        let mut line = String::new();
        let (mut cell, mut from) = (0, 0);
        for &row_end in &self.rows {
            line.clear();
            for (k, &(end, w)) in self.cells[cell..row_end].iter().enumerate() {
                let (end, w) = (end as usize, w as usize);
                if k > 0 {
                    line.push_str("  ");
                }
                line.push_str(&self.text[from..end]);
                line.extend(std::iter::repeat_n(' ', self.widths[k].saturating_sub(w)));
                from = end;
            }
            cell = row_end;
            line.truncate(line.trim_end().len());
            line.push('\n');
            out.write_all(line.as_bytes())?;
        }
        Ok(())
    }
}

/// A table with these column names (`Table::default()` for one without a header row).
pub fn table(header: &[&str]) -> Table {
    let mut t = Table::default();
    t.add_row(header);
    t
}

/// Prints a table to stdout in one buffered write.
pub fn print_table(t: &Table) {
    let mut out = std::io::BufWriter::with_capacity(1 << 16, std::io::stdout().lock());
    // A closed pipe (`wharf queue | head`) ends the listing; nothing more to say.
    let _ = t.write(&mut out).and_then(|_| out.flush());
}

/// Local time of a Unix ms timestamp, `YYYY-MM-DDTHH:MM:SS` (UTC).
pub fn time(ms: Option<u64>) -> String {
    let Some(ms) = ms else { return "-".into() };
    let secs = (ms / 1000) as i64;
    let days = secs.div_euclid(86400);
    let rem = secs.rem_euclid(86400);
    let (y, m, d) = wharf_api::forms::civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn table_cells_are_escaped() {
        let mut t = super::table(&["NAME"]);
        t.add_row(["a\x1b[2J\nState: COMPLETED"]);
        let mut shown = Vec::new();
        t.write(&mut shown).unwrap();
        let shown = String::from_utf8(shown).unwrap();
        assert!(
            !shown.contains('\x1b') && shown.contains("a\\e[2J\\nState"),
            "{shown}"
        );
    }

    #[test]
    fn columns_are_as_wide_as_their_widest_cell_on_screen() {
        let mut t = super::table(&["JOBID", "NAME", "USER"]);
        t.add_row(["1", "a long name", ""]);
        t.add_row(["1234_5", "日本語", "alice"]);
        let mut shown = Vec::new();
        t.write(&mut shown).unwrap();
        assert_eq!(
            String::from_utf8(shown).unwrap(),
            "JOBID   NAME         USER\n\
             1       a long name\n\
             1234_5  日本語       alice\n"
        );
    }

    #[test]
    fn formats_times() {
        assert_eq!(super::time(Some(0)), "1970-01-01T00:00:00Z");
        assert_eq!(super::time(Some(1_795_646_816_000)), "2026-11-25T22:46:56Z");
        assert_eq!(super::time(None), "-");
    }
}
