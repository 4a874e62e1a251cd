//! Human output: tables, times, durations. Every text shown to a person goes through
//! [`clean`] (tables do it themselves): job names, commands, paths, reasons and error messages
//! come from users, and another user's terminal must not obey their control characters. JSON
//! output keeps the exact values.

use comfy_table::{presets, ContentArrangement};

pub use wharf_api::text::printable as clean;

/// A plain, aligned table with a header row (like squeue) whose cells are escaped.
#[derive(Debug)]
pub struct Table(comfy_table::Table);

impl Table {
    /// Adds a row; control characters in the cells are escaped.
    pub fn add_row<S: AsRef<str>>(&mut self, cells: impl IntoIterator<Item = S>) {
        self.0.add_row(
            cells
                .into_iter()
                .map(|c| clean(c.as_ref()).into_owned())
                .collect::<Vec<_>>(),
        );
    }
}

/// A table with these column names.
pub fn table(header: &[&str]) -> Table {
    let mut t = comfy_table::Table::new();
    t.load_preset(presets::NOTHING)
        .set_content_arrangement(ContentArrangement::Disabled)
        .set_header(header.to_vec());
    Table(t)
}

/// Prints a table, trimming the padding comfy-table adds at line ends.
pub fn print_table(t: &Table) {
    for line in t.0.to_string().lines() {
        println!(
            "{}",
            line.trim_end().strip_prefix(' ').unwrap_or(line.trim_end())
        );
    }
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
        let shown = t.0.to_string();
        assert!(
            !shown.contains('\x1b') && shown.contains("a\\e[2J\\nState"),
            "{shown}"
        );
    }

    #[test]
    fn formats_times() {
        assert_eq!(super::time(Some(0)), "1970-01-01T00:00:00Z");
        assert_eq!(super::time(Some(1_795_646_816_000)), "2026-11-25T22:46:56Z");
        assert_eq!(super::time(None), "-");
    }
}
