//! `%` letters in output and error file names (`--output`, `--error`), as sbatch reads them.
//!
//! ```text
//! %%  a '%'                       %j  the job's id          %J  JOB.batch (JOB.STEP for a step)
//! %A  an array's id (else %j)     %a  the task id (else 4294967294, as sbatch gives it)
//! %x  the job's name              %u  its user's name       %s  the step: batch (or its number)
//! %N  the first node's short name (a step's file: its node's)
//! %n  the node's index in the job %t  the task's rank
//! %5j zero-padded to 5 digits (numbers only, at most 10)
//! ```
//!
//! Any other letter stays as it is written. A name is expanded in two stages, because who
//! knows what differs: the job's values ([`expand`], the controller's or the node's) and, last,
//! the task's rank and `%%` ([`finish`], on the node that runs the task). Between the two a
//! name keeps `%%` and `%t` as written, and every `%` of a value is written `%%`, so that no
//! value is read as a letter.

/// What a letter stands for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    /// A number, zero-padded when asked (`%5j`).
    Num(u64),
    /// Text, never padded.
    Text(String),
}

/// The widest padding (`%10j`); a wider one is this wide.
const MAX_WIDTH: usize = 10;

/// One `%` letter of `pattern` at byte `at` (which holds the `%`): the padding width, the
/// letter and the byte after it; `None` when the `%` ends the name or no letter follows the
/// digits.
fn letter(pattern: &str, at: usize) -> Option<(usize, char, usize)> {
    let rest = &pattern[at + 1..];
    let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
    let c = rest[digits..].chars().next()?;
    // Too many digits to be a number is wider than any.
    let width = (rest[..digits].parse::<usize>())
        .unwrap_or(if digits > 0 { MAX_WIDTH } else { 0 })
        .min(MAX_WIDTH);
    Some((width, c, at + 1 + digits + c.len_utf8()))
}

/// Walks `pattern`, writing each `%` letter as `write` gives it (or as written for `None`).
fn walk(pattern: &str, mut write: impl FnMut(usize, char) -> Option<String>) -> String {
    let mut out = String::with_capacity(pattern.len());
    let mut i = 0;
    while let Some(off) = pattern[i..].find('%') {
        let at = i + off;
        out.push_str(&pattern[i..at]);
        match letter(pattern, at) {
            Some((width, c, next)) => {
                match write(width, c) {
                    Some(v) => out.push_str(&v),
                    None => out.push_str(&pattern[at..next]),
                }
                i = next;
            }
            None => {
                out.push_str(&pattern[at..]);
                i = pattern.len();
            }
        }
    }
    out.push_str(&pattern[i..]);
    out
}

/// The first stage: each letter `value` knows is written out (its own `%`s doubled); `%%`,
/// `%t` and the letters it does not know stay as written, for [`finish`].
pub fn expand(pattern: &str, value: impl Fn(char) -> Option<Value>) -> String {
    walk(pattern, |width, c| {
        if c == '%' || c == 't' {
            return None;
        }
        Some(match value(c)? {
            Value::Num(n) => format!("{n:0width$}"),
            Value::Text(t) => escape(&t),
        })
    })
}

/// Text put into a name between the stages: its `%`s doubled, so [`finish`] gives them back.
pub fn escape(text: &str) -> String {
    text.replace('%', "%%")
}

/// The last stage: `%t` (padded as asked) is `rank` and `%%` a `%`; any other letter stays
/// as written. Also says whether the name had a `%t`.
pub fn finish(pattern: &str, rank: u32) -> (String, bool) {
    let mut ranked = false;
    let name = walk(pattern, |width, c| match c {
        '%' if width == 0 => Some("%".into()),
        't' => {
            ranked = true;
            Some(format!("{rank:0width$}"))
        }
        _ => None,
    });
    (name, ranked)
}

/// A node's short name: up to its first `.`, unless the name is an address.
pub fn short_name(node: &str) -> &str {
    // A node named by its address keeps it whole.
    if node.parse::<std::net::IpAddr>().is_ok() {
        return node;
    }
    node.split('.').next().unwrap_or(node)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(c: char) -> Option<Value> {
        Some(match c {
            'j' => Value::Num(195),
            'x' => Value::Text("50%t".into()),
            'u' => Value::Text("ann".into()),
            _ => return None,
        })
    }

    #[test]
    fn letters_padding_and_percent_survive_both_stages() {
        let p = expand("o_%j_%5j_%x_%u_%%_%t_%3t_%q_%", job);
        assert_eq!(p, "o_195_00195_50%%t_ann_%%_%t_%3t_%q_%");
        assert_eq!(
            finish(&p, 7),
            ("o_195_00195_50%t_ann_%_7_007_%q_%".into(), true)
        );
        assert_eq!(finish("a%%t", 3), ("a%t".into(), false));
        assert_eq!(expand("%99j", job), "0000000195");
        assert_eq!(expand("%99999999999999999999999j", job), "0000000195");
        assert_eq!(expand("%5x", job), "50%%t");
        assert_eq!(short_name("gpu01.cluster.lab"), "gpu01");
        assert_eq!(short_name("10.0.0.5"), "10.0.0.5");
    }
}
