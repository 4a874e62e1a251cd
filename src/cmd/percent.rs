//! Slurm's `%` output formats, shared by `wharf queue -o` (squeue's fields) and `sinfo -o`.
//!
//! A field is `%[.|-][#|SIZE]LETTER`: at least SIZE columns, cut to SIZE where longer (as
//! squeue and sinfo do), left-justified (printf's `-` is taken as written), or
//! right-justified after a `.`; `%#LETTER` is as wide as the column's widest value and cut
//! nowhere. Other text is copied as it is, and `%%` is one `%`. Each command has its own
//! letters ([`Fields`]) and says what each shows.

use anyhow::Result;

/// A command's letters: each with its header and what it shows (for `--help` and errors).
pub(crate) type Fields = [(char, &'static str, &'static str)];

/// Widest field a format may ask for.
const MAX_SIZE: usize = 1000;

/// How wide a field is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Size {
    /// As its value is.
    Free,
    /// At least this, cut to it.
    Cut(usize),
    /// As the column's widest value (`#`).
    Widest,
}

/// One piece of a format.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Piece {
    Text(String),
    Field {
        letter: char,
        size: Size,
        right: bool,
    },
}

/// A parsed format, over one command's letters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Format {
    pieces: Vec<Piece>,
    fields: &'static Fields,
}

impl Format {
    /// Parses `text` over `fields`; an unknown letter, a size with nothing after it, or a
    /// size past 1000 is refused, naming it and `command`'s help.
    pub(crate) fn parse(text: &str, fields: &'static Fields, command: &str) -> Result<Format> {
        let mut pieces = Vec::new();
        let mut literal = String::new();
        let mut chars = text.chars().peekable();
        while let Some(c) = chars.next() {
            if c != '%' {
                literal.push(c);
                continue;
            }
            if chars.next_if_eq(&'%').is_some() {
                literal.push('%');
                continue;
            }
            let right = chars.next_if_eq(&'.').is_some();
            let left = chars.next_if_eq(&'-').is_some();
            let right = right && !left;
            let widest = chars.next_if_eq(&'#').is_some();
            let mut digits = String::new();
            while let Some(d) = chars.next_if(char::is_ascii_digit) {
                digits.push(d);
            }
            let size = match digits.as_str() {
                _ if widest => Size::Widest,
                "" => Size::Free,
                d => Size::Cut(d.parse().ok().filter(|&n| n <= MAX_SIZE).ok_or_else(|| {
                    anyhow::anyhow!("-o: a field's size is at most {MAX_SIZE}, found {d}")
                })?),
            };
            let Some(letter) = chars.next() else {
                anyhow::bail!("-o: {text:?} ends in the middle of a field (a % with no letter)");
            };
            if !fields.iter().any(|(l, _, _)| *l == letter) {
                let known: Vec<String> = fields.iter().map(|(l, _, _)| format!("%{l}")).collect();
                anyhow::bail!(
                    "-o: %{} is not a field Wharf shows; the fields are {} (see {command} --help)",
                    crate::output::clean(&letter.to_string()),
                    known.join(" ")
                );
            }
            if !literal.is_empty() {
                pieces.push(Piece::Text(std::mem::take(&mut literal)));
            }
            pieces.push(Piece::Field {
                letter,
                size,
                right,
            });
        }
        if !literal.is_empty() {
            pieces.push(Piece::Text(literal));
        }
        Ok(Format { pieces, fields })
    }

    /// Each piece's text: its field's value from `of`, cleaned for a terminal; nothing for
    /// copied text.
    pub(crate) fn values(&self, mut of: impl FnMut(char) -> String) -> Vec<String> {
        let each = self.pieces.iter().map(|p| match p {
            Piece::Text(_) => String::new(),
            Piece::Field { letter, .. } => crate::output::clean(&of(*letter)).into_owned(),
        });
        each.collect()
    }

    /// The header's values: each field's name.
    pub(crate) fn header(&self) -> Vec<String> {
        self.values(|letter| {
            (self.fields.iter().find(|(l, _, _)| *l == letter))
                .map_or_else(String::new, |(_, name, _)| name.to_string())
        })
    }

    /// Whether a field is as wide as its column (`#`): the lines need every row first.
    fn sizes_by_column(&self) -> bool {
        (self.pieces.iter()).any(|p| {
            matches!(
                p,
                Piece::Field {
                    size: Size::Widest,
                    ..
                }
            )
        })
    }

    /// Each piece's widest value in `rows` (as [`Format::values`] gives them).
    fn widest(&self, rows: &[Vec<String>]) -> Vec<usize> {
        (0..self.pieces.len())
            .map(|k| rows.iter().map(|r| r[k].chars().count()).max().unwrap_or(0))
            .collect()
    }

    /// The line of one row's `values`, sized and justified; `widest` (from
    /// [`Format::widest`]) sizes the `#` fields, which are as wide as their value without it.
    pub(crate) fn line(&self, values: &[String], widest: &[usize]) -> String {
        let mut out = String::new();
        for (k, (p, v)) in self.pieces.iter().zip(values).enumerate() {
            match p {
                Piece::Text(t) => out.push_str(t),
                Piece::Field { size, right, .. } => {
                    let (v, n) = match *size {
                        Size::Free => (v.clone(), 0),
                        Size::Cut(n) => (v.chars().take(n).collect(), n),
                        Size::Widest => (v.clone(), widest.get(k).copied().unwrap_or(0)),
                    };
                    let pad = " ".repeat(n.saturating_sub(v.chars().count()));
                    if *right {
                        out.push_str(&pad);
                        out.push_str(&v);
                    } else {
                        out.push_str(&v);
                        out.push_str(&pad);
                    }
                }
            }
        }
        out
    }

    /// Writes the lines of `rows` (each as [`Format::values`] gives it), trailing spaces
    /// cut, to standard output as they are made, unless a `%#` field needs every row first;
    /// a closed pipe (`| head`) ends the listing.
    pub(crate) fn print(&self, rows: impl Iterator<Item = Vec<String>>) {
        use std::io::Write;
        let mut out = std::io::BufWriter::with_capacity(1 << 16, std::io::stdout().lock());
        let (rows, widest): (Box<dyn Iterator<Item = Vec<String>>>, Vec<usize>) =
            if self.sizes_by_column() {
                let all: Vec<Vec<String>> = rows.collect();
                let widest = self.widest(&all);
                (Box::new(all.into_iter()), widest)
            } else {
                (Box::new(rows), vec![])
            };
        for row in rows {
            if writeln!(out, "{}", self.line(&row, &widest).trim_end()).is_err() {
                return;
            }
        }
        let _ = out.flush();
    }

    /// The lines of `rows` (each as [`Format::values`] gives it), trailing spaces cut.
    #[cfg(test)]
    pub(crate) fn render(&self, rows: &[Vec<String>]) -> Vec<String> {
        let widest = self.widest(rows);
        let lines = rows.iter().map(|row| {
            let mut line = self.line(row, &widest);
            line.truncate(line.trim_end().len());
            line
        });
        lines.collect()
    }
}

#[cfg(test)]
mod tests {
    use super::Format;

    const FIELDS: [(char, &str, &str); 2] = [('a', "AAA", "a"), ('b', "B", "b")];

    #[test]
    fn fields_are_sized_cut_justified_and_as_wide_as_their_column() {
        let f = Format::parse("%.5a|%-3b|%#a|%%|%b", &FIELDS, "test").unwrap();
        let rows = [
            f.header(),
            f.values(|l| if l == 'a' { "x".into() } else { "long".into() }),
        ];
        assert_eq!(
            f.render(&rows),
            ["  AAA|B  |AAA|%|B", "    x|lon|x  |%|long"]
        );
        assert!(f.sizes_by_column());
        assert!(!Format::parse("%a", &FIELDS, "test")
            .unwrap()
            .sizes_by_column());
        for (bad, why) in [
            (
                "%Z",
                "%Z is not a field Wharf shows; the fields are %a %b (see test --help)",
            ),
            ("%.10", "ends in the middle of a field"),
            ("%5000a", "at most 1000"),
        ] {
            let e = Format::parse(bad, &FIELDS, "test").unwrap_err().to_string();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }
}
