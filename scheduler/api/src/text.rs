//! Showing untrusted text (job names, commands, paths, reasons, error messages) to a person.
//!
//! Any user chooses the text of their job, and other users (admins included) see some of it in
//! their terminals. [`printable`] is the one escaping every human output goes through: control
//! characters cannot move the cursor, change colours, set window titles or forge lines.
//! JSON output keeps the exact values.
//!
//! ```
//! use wharf_api::text::printable;
//! assert_eq!(printable("a\x1b[31mb\nState: OK"), "a\\e[31mb\\nState: OK");
//! assert_eq!(printable("plain"), "plain");
//! ```

use std::borrow::Cow;
use std::fmt::Write;

/// True for characters that must not reach a terminal raw: C0 and C1 controls, DEL, and the
/// invisible formatting characters that reorder or hide text (bidirectional marks, overrides
/// and isolates, the Arabic letter mark, zero-width characters, the byte-order mark), the line
/// and paragraph separators (terminals and editors may break lines at them) and the
/// interlinear annotation characters (which hide the text between them).
pub fn is_unsafe(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{061c}'
                | '\u{200b}'..='\u{200f}'
                | '\u{2028}'..='\u{202e}'
                | '\u{2060}'..='\u{2069}'
                | '\u{feff}'
                | '\u{fff9}'..='\u{fffb}'
        )
}

/// Most bytes of a failure or exit message (why a job could not start, an agent's words about
/// it): room for any real reason, while a report that carries the messages of many jobs stays
/// small whatever their commands were.
pub const MAX_MESSAGE: usize = 4096;

/// `text` cut to at most `max` bytes on a character boundary, ending with a marker that says
/// how many bytes were left out. Borrowed unchanged when it fits.
///
/// ```
/// use wharf_api::text::bounded;
/// assert_eq!(bounded("short", 64), "short");
/// let long = "é".repeat(100);
/// let cut = bounded(&long, 64);
/// assert!(cut.len() <= 64 && cut.ends_with("more bytes]"), "{cut}");
/// ```
pub fn bounded(text: &str, max: usize) -> Cow<'_, str> {
    if text.len() <= max {
        return Cow::Borrowed(text);
    }
    // The marker's own length depends on the count; the widest count is the whole text's.
    let marker_room = format!("... [{} more bytes]", text.len()).len();
    let mut end = max.saturating_sub(marker_room);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let marker = format!("... [{} more bytes]", text.len() - end);
    if marker.len() > max {
        // No room even for the marker: the cut text alone.
        let mut end = max;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        return Cow::Borrowed(&text[..end]);
    }
    Cow::Owned(format!("{}{marker}", &text[..end]))
}

/// `message` within [`MAX_MESSAGE`] bytes (see [`bounded`]).
pub fn bound_message(message: String) -> String {
    match bounded(&message, MAX_MESSAGE) {
        Cow::Borrowed(_) => message,
        Cow::Owned(cut) => cut,
    }
}

/// `text` with every unsafe character written as an escape: `\e` for ESC, `\n`, `\r`, `\t`,
/// `\xHH` for the other C0 characters and DEL, `\u{HHHH}` for the rest. Borrowed unchanged when
/// there is nothing to escape.
pub fn printable(text: &str) -> Cow<'_, str> {
    // Printable ASCII, most text, needs no look at each character (a listing of 100,000 jobs
    // escapes a million cells).
    if text.bytes().all(|b| b == b' ' || b.is_ascii_graphic()) || !text.chars().any(is_unsafe) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '\x1b' => out.push_str("\\e"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x80 && is_unsafe(c) => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c if is_unsafe(c) => {
                let _ = write!(out, "\\u{{{:04x}}}", c as u32);
            }
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_cut_on_a_character_boundary_with_a_marker() {
        assert!(matches!(bounded("fits", 4), Cow::Borrowed("fits")));
        for text in [
            "\u{1}".repeat(131_000),
            "é".repeat(10_000),
            "日本".repeat(3000),
        ] {
            for max in [0, 3, 10, 40, 41, 100, MAX_MESSAGE] {
                let cut = bounded(&text, max);
                assert!(cut.len() <= max, "{max}: {} bytes", cut.len());
                if max >= 40 {
                    let kept = cut.find("... [").unwrap();
                    assert!(text.starts_with(&cut[..kept]));
                    let left: usize = cut[kept + 5..].split(' ').next().unwrap().parse().unwrap();
                    assert_eq!(kept + left, text.len(), "{cut}");
                }
            }
        }
        assert_eq!(bound_message("x".repeat(MAX_MESSAGE)).len(), MAX_MESSAGE);
        assert!(bound_message("x".repeat(MAX_MESSAGE + 1)).len() <= MAX_MESSAGE);
    }

    #[test]
    fn escapes_every_control_and_keeps_the_rest() {
        assert!(matches!(printable("héllo wörld/ok"), Cow::Borrowed(_)));
        assert_eq!(printable("\x1b]0;title\x07"), "\\e]0;title\\x07");
        assert_eq!(printable("a\r\nb\tc\x7f"), "a\\r\\nb\\tc\\x7f");
        assert_eq!(printable("\u{9b}31m"), "\\u{009b}31m");
        assert_eq!(printable("x\u{202e}y"), "x\\u{202e}y");
        // Invisible or line-breaking characters outside the C0/C1 ranges.
        for (c, shown) in [
            ('\u{061c}', "\\u{061c}"),
            ('\u{2028}', "\\u{2028}"),
            ('\u{2029}', "\\u{2029}"),
            ('\u{fff9}', "\\u{fff9}"),
            ('\u{fffa}', "\\u{fffa}"),
            ('\u{fffb}', "\\u{fffb}"),
        ] {
            assert!(is_unsafe(c), "{c:?} must be escaped");
            assert_eq!(printable(&format!("a{c}b")), format!("a{shown}b"));
        }
        assert!(!is_unsafe('\u{fffc}') && !is_unsafe('\u{061b}') && !is_unsafe('\u{2027}'));
        for c in (0u32..0x11_0000).filter_map(char::from_u32) {
            let shown = printable(c.encode_utf8(&mut [0; 4])).into_owned();
            assert!(!shown.chars().any(is_unsafe), "{c:?} shown as {shown:?}");
        }
    }
}
