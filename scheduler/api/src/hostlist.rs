//! Host lists as Slurm writes them: `gpu[01-04,07],login1` for gpu01, gpu02, gpu03, gpu04,
//! gpu07 and login1. Zero padding is kept (`[01-04]` is not `[1-4]`), brackets may appear
//! more than once in a name (`r[1-2]n[1-2]` is four hosts), and expanding is bounded: a list
//! that names more hosts than the caller allows is refused before anything is built.
//!
//! ```
//! use wharf_api::hostlist::{compress, expand, MAX_HOSTS};
//! let names = expand("gpu[01-03,07],cpu1", MAX_HOSTS).unwrap();
//! assert_eq!(names, ["gpu01", "gpu02", "gpu03", "gpu07", "cpu1"]);
//! assert_eq!(compress(&names), "cpu1,gpu[01-03,07]");
//! assert!(expand("n[1-1000000]", MAX_HOSTS).unwrap_err().to_string().contains("the limit is"));
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde::{Deserialize, Serialize};

/// Most hosts one list may name unless the caller says otherwise.
pub const MAX_HOSTS: usize = 65_536;

/// Longest digit run a range bound may have (larger numbers do not fit the counters).
const MAX_DIGITS: usize = 18;

/// Longest host name a list may make, bytes: a node's name is at most this long.
pub const MAX_NAME_BYTES: usize = 255;

/// Most bytes the names of one list may take once written out: far above any cluster's
/// list of its nodes (10,000 names of 20 bytes are 200 KB), far below what a short list
/// with long names and wide ranges would make.
pub const MAX_LIST_BYTES: usize = 1 << 20;

/// Why a host list was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostlistError {
    /// It is not written as a host list.
    #[error("host list {text:?}: {why}")]
    Malformed {
        /// The list (cut to a readable length).
        text: String,
        /// What is wrong.
        why: String,
    },
    /// Its names, written out, take more bytes than [`MAX_LIST_BYTES`].
    #[error("host list {text:?} makes names of {bytes} bytes in all; the limit is {max}")]
    TooLarge {
        /// The list (cut to a readable length).
        text: String,
        /// How many bytes its names take (at least; counting stops past the limit).
        bytes: u128,
        /// The limit.
        max: usize,
    },
    /// It names more hosts than allowed.
    #[error("host list {text:?} names {count} hosts; the limit is {max}")]
    TooMany {
        /// The list (cut to a readable length).
        text: String,
        /// How many it names (at least; counting stops past the limit).
        count: u128,
        /// The limit.
        max: usize,
    },
}

/// True for the characters a host name in a list may have.
pub fn is_host_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')
}

/// One piece of a host name pattern: literal text, or a bracket of ranges.
enum Piece<'a> {
    Text(&'a str),
    /// `(low, high, width)`: numbers low..=high, each zero-padded to width digits.
    Ranges(Vec<(u64, u64, usize)>),
}

/// The hosts `text` names, in the order written (duplicates kept). Refuses, without building
/// it, a list naming more than `max` hosts, a name longer than [`MAX_NAME_BYTES`], or names
/// taking more than [`MAX_LIST_BYTES`] in all (counted exactly: the same names compressed
/// otherwise count the same).
pub fn expand(text: &str, max: usize) -> Result<Vec<String>, HostlistError> {
    expand_within(text, max, true)
}

/// Bytes of every number of `lo..=hi` written with at least `w` digits, together.
fn range_bytes(lo: u64, hi: u64, w: usize) -> u128 {
    let mut total: u128 = 0;
    // Numbers of d digits: 10^(d-1) ..= 10^d - 1 (0 has one).
    let mut band_lo: u64 = 0;
    for d in 1..=20usize {
        let band_hi = if d >= 20 {
            u64::MAX
        } else {
            10u64.pow(d as u32) - 1
        };
        let (a, b) = (lo.max(band_lo), hi.min(band_hi));
        if a <= b {
            total += u128::from(b - a + 1) * d.max(w) as u128;
        }
        if band_hi >= hi {
            break;
        }
        band_lo = band_hi + 1;
    }
    total
}

/// [`expand`], with the name and byte bounds only when `bounded`: a list stored before
/// them loads as it was written.
fn expand_within(text: &str, max: usize, bounded: bool) -> Result<Vec<String>, HostlistError> {
    let shown = || crate::text::bounded(text, 80).into_owned();
    let bad = |why: String| HostlistError::Malformed { text: shown(), why };
    let items = split_items(text).map_err(bad)?;
    let mut patterns = Vec::with_capacity(items.len());
    let (mut count, mut bytes): (u128, u128) = (0, 0);
    for item in items {
        let pieces = pieces(item).map_err(|why| bad(format!("{item:?}: {why}")))?;
        // Per piece: how many values it has and their bytes together; a name's bytes over
        // all names are each piece's bytes times the other pieces' counts.
        let sizes: Vec<(u128, u128)> = (pieces.iter())
            .map(|p| match p {
                Piece::Text(t) => (1, t.len() as u128),
                Piece::Ranges(r) => r.iter().fold((0u128, 0u128), |(n, b), &(lo, hi, w)| {
                    (
                        n + u128::from(hi - lo) + 1,
                        b.saturating_add(range_bytes(lo, hi, w)),
                    )
                }),
            })
            .collect();
        let n = sizes.iter().fold(1u128, |n, &(k, _)| n.saturating_mul(k));
        let longest: usize = (pieces.iter())
            .map(|p| match p {
                Piece::Text(t) => t.len(),
                Piece::Ranges(r) => (r.iter())
                    .map(|&(_, hi, w)| w.max(hi.to_string().len()))
                    .max()
                    .unwrap_or(0),
            })
            .sum();
        if bounded && longest > MAX_NAME_BYTES {
            return Err(bad(format!(
                "{}: makes names of up to {longest} bytes; a host name is at most \
                 {MAX_NAME_BYTES}",
                crate::text::bounded(item, 40)
            )));
        }
        count = count.saturating_add(n);
        if count > max as u128 {
            return Err(HostlistError::TooMany {
                text: shown(),
                count,
                max,
            });
        }
        let item_bytes = (0..sizes.len()).fold(0u128, |total, i| {
            let others = (sizes.iter().enumerate())
                .filter(|&(j, _)| j != i)
                .fold(1u128, |n, (_, &(k, _))| n.saturating_mul(k));
            total.saturating_add(sizes[i].1.saturating_mul(others))
        });
        bytes = bytes.saturating_add(item_bytes);
        if bounded && bytes > MAX_LIST_BYTES as u128 {
            return Err(HostlistError::TooLarge {
                text: shown(),
                bytes,
                max: MAX_LIST_BYTES,
            });
        }
        patterns.push(pieces);
    }
    let mut out = Vec::with_capacity(count as usize);
    for pieces in &patterns {
        let mut names = vec![String::new()];
        for p in pieces {
            names = match p {
                Piece::Text(t) => names.into_iter().map(|n| n + t).collect(),
                Piece::Ranges(ranges) => names
                    .iter()
                    .flat_map(|n| {
                        ranges.iter().flat_map(move |&(lo, hi, w)| {
                            (lo..=hi).map(move |x| format!("{n}{x:0w$}"))
                        })
                    })
                    .collect(),
            };
        }
        out.extend(names);
    }
    Ok(out)
}

/// Splits at the commas outside brackets.
fn split_items(text: &str) -> Result<Vec<&str>, String> {
    let text = text.trim();
    if text.is_empty() {
        return Err("it is empty; name at least one host".into());
    }
    let mut items = Vec::new();
    let (mut depth, mut start) = (0, 0);
    for (i, c) in text.char_indices() {
        match c {
            '[' if depth == 0 => depth = 1,
            '[' => return Err("brackets may not nest".into()),
            ']' if depth == 1 => depth = 0,
            ']' => return Err("a ']' closes no '['".into()),
            ',' if depth == 0 => {
                items.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err("a '[' is never closed".into());
    }
    items.push(&text[start..]);
    if items.iter().any(|i| i.is_empty()) {
        return Err("an empty name between commas".into());
    }
    Ok(items)
}

/// Parses one comma-free item (`gpu[01-04]-ib`).
fn pieces(item: &str) -> Result<Vec<Piece<'_>>, String> {
    let mut out = Vec::new();
    let mut rest = item;
    while !rest.is_empty() {
        let open = rest.find('[').unwrap_or(rest.len());
        let (text, tail) = rest.split_at(open);
        if let Some(c) = text.chars().find(|&c| !is_host_char(c)) {
            return Err(format!(
                "{c:?} cannot be in a host name (letters, digits, '-', '_', '.')"
            ));
        }
        if !text.is_empty() {
            out.push(Piece::Text(text));
        }
        if tail.is_empty() {
            break;
        }
        let close = tail.find(']').unwrap_or(tail.len());
        out.push(Piece::Ranges(ranges(&tail[1..close])?));
        rest = &tail[(close + 1).min(tail.len())..];
    }
    Ok(out)
}

/// Parses the inside of a bracket: `01-04,07`.
fn ranges(text: &str) -> Result<Vec<(u64, u64, usize)>, String> {
    text.split(',')
        .map(|r| {
            let (lo, hi) = r.split_once('-').unwrap_or((r, r));
            let num = |s: &str| -> Result<u64, String> {
                if s.is_empty() || s.len() > MAX_DIGITS || !s.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(format!(
                        "[{text}]: {r:?} is not a number or a range like 01-04 \
                         (at most {MAX_DIGITS} digits)"
                    ));
                }
                s.parse()
                    .map_err(|_| format!("[{text}]: {s:?} is not a number"))
            };
            let (l, h) = (num(lo)?, num(hi)?);
            if l > h {
                return Err(format!("[{text}]: the range {r} runs backwards"));
            }
            Ok((l, h, lo.len()))
        })
        .collect()
}

/// The shortest host list for `names`, sorted: names that end in a number are grouped by what
/// comes before it, and consecutive numbers become ranges (`gpu[01-04,07]`). Duplicates are
/// dropped; [`expand`] of the result gives each name once. Names are expected to be made of
/// [`is_host_char`] characters; others are written as they are.
pub fn compress<S: AsRef<str>>(names: &[S]) -> String {
    // (prefix, None) is a name without a trailing number; (prefix, Some(width)) the numbers
    // after it written with that zero padding (0: none).
    let mut groups: BTreeMap<(&str, Option<usize>), BTreeSet<u64>> = BTreeMap::new();
    let mut natural: Vec<(&str, u64, usize)> = Vec::new();
    for name in names {
        let name = name.as_ref();
        let digits = name.len() - name.trim_end_matches(|c: char| c.is_ascii_digit()).len();
        let (prefix, number) = name.split_at(name.len() - digits);
        match number.parse::<u64>() {
            Ok(x) if digits <= MAX_DIGITS && digits > 1 && number.starts_with('0') => {
                groups.entry((prefix, Some(digits))).or_default().insert(x);
            }
            Ok(x) if digits <= MAX_DIGITS => natural.push((prefix, x, digits)),
            _ => {
                groups.entry((name, None)).or_default();
            }
        }
    }
    // A number without leading zeros joins the widest padded group of its prefix that is no
    // wider than it ("10" reads the same padded to 2): gpu09 and gpu10 make gpu[09-10].
    for (prefix, x, digits) in natural {
        let padded = groups
            .range((prefix, Some(1))..=(prefix, Some(digits)))
            .next_back()
            .map(|(k, _)| *k);
        let key = padded.unwrap_or((prefix, Some(0)));
        groups.entry(key).or_default().insert(x);
    }
    let mut out = Vec::with_capacity(groups.len());
    for ((prefix, width), numbers) in groups {
        let Some(w) = width else {
            out.push(prefix.to_string());
            continue;
        };
        let mut runs: Vec<(u64, u64)> = Vec::new();
        for x in numbers {
            match runs.last_mut() {
                Some((_, hi)) if *hi + 1 == x => *hi = x,
                _ => runs.push((x, x)),
            }
        }
        if let [(lo, hi)] = runs[..] {
            if lo == hi {
                out.push(format!("{prefix}{lo:0w$}"));
                continue;
            }
        }
        let inside: Vec<String> = runs
            .iter()
            .map(|&(lo, hi)| {
                if lo == hi {
                    format!("{lo:0w$}")
                } else {
                    format!("{lo:0w$}-{hi:0w$}")
                }
            })
            .collect();
        out.push(format!("{prefix}[{}]", inside.join(",")));
    }
    out.join(",")
}

/// A set of host names, kept in [`compress`]'s order without duplicates; written (and
/// serialized) as the compressed list. Looking a name up is a binary search: the scheduler
/// asks of every node for every job that has a list.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct HostList(Vec<String>, Vec<u32>);

impl HostList {
    /// Parses a host list naming at most [`MAX_HOSTS`] hosts.
    pub fn parse(text: &str) -> Result<HostList, HostlistError> {
        Ok(HostList::from_names(&expand(text, MAX_HOSTS)?))
    }

    /// The set of `names`.
    pub fn from_names<S: AsRef<str>>(names: &[S]) -> HostList {
        let mut names: Vec<String> = names.iter().map(|n| n.as_ref().to_string()).collect();
        names.sort();
        names.dedup();
        // The compressed list's order: by prefix, then number.
        let text = compress(&names);
        let names = expand_within(&text, names.len(), false).unwrap_or(names);
        let mut by_name: Vec<u32> = (0..names.len() as u32).collect();
        by_name.sort_by(|&a, &b| names[a as usize].cmp(&names[b as usize]));
        HostList(names, by_name)
    }

    /// The names, each once.
    pub fn names(&self) -> &[String] {
        &self.0
    }

    /// True when `name` is in the list.
    pub fn contains(&self, name: &str) -> bool {
        (self.1)
            .binary_search_by(|&i| self.0[i as usize].as_str().cmp(name))
            .is_ok()
    }

    /// Number of hosts.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// True when it names no host.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Display for HostList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&compress(&self.0))
    }
}

/// A stored list: a record kept before the name and byte bounds loads as it was written.
impl TryFrom<String> for HostList {
    type Error = HostlistError;
    fn try_from(text: String) -> Result<HostList, HostlistError> {
        if text.is_empty() {
            return Ok(HostList::default());
        }
        Ok(HostList::from_names(&expand_within(
            &text, MAX_HOSTS, false,
        )?))
    }
}

impl From<HostList> for String {
    fn from(list: HostList) -> String {
        list.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slurm_forms_expand() {
        let e = |t: &str| expand(t, MAX_HOSTS).unwrap();
        assert_eq!(e("n1"), ["n1"]);
        assert_eq!(e(" n[1-3] "), ["n1", "n2", "n3"]);
        assert_eq!(e("n[08-10]"), ["n08", "n09", "n10"]);
        assert_eq!(e("n[8-10]"), ["n8", "n9", "n10"]);
        assert_eq!(e("r[1-2]n[1,3]"), ["r1n1", "r1n3", "r2n1", "r2n3"]);
        assert_eq!(e("gpu[1-2]-ib,login"), ["gpu1-ib", "gpu2-ib", "login"]);
        assert_eq!(e("[7-8]"), ["7", "8"]);
    }

    #[test]
    fn bad_lists_say_what_is_wrong() {
        for (text, why) in [
            ("", "empty"),
            ("a,,b", "empty name"),
            ("n[1-3", "never closed"),
            ("n1-3]", "closes no"),
            ("n[[1]]", "nest"),
            ("n[3-1]", "runs backwards"),
            ("n[a-b]", "is not a number"),
            ("n[]", "is not a number"),
            ("n 1", "cannot be in a host name"),
            ("n/1", "cannot be in a host name"),
            ("n[1234567890123456789]", "at most 18 digits"),
        ] {
            let err = expand(text, MAX_HOSTS).unwrap_err().to_string();
            assert!(err.contains(why), "{text}: {err}");
        }
    }

    #[test]
    fn large_lists_are_refused_before_they_are_built() {
        let err = expand("n[0-999999999999999999]x[0-999999999999999999]", 10).unwrap_err();
        assert!(
            matches!(err, HostlistError::TooMany { max: 10, .. }),
            "{err}"
        );
        assert!(err.to_string().contains("the limit is 10"), "{err}");
        assert_eq!(expand("n[1-5],m[1-5]", 10).unwrap().len(), 10);
        assert!(expand("n[1-5],m[1-6]", 10).is_err());
    }

    #[test]
    fn compress_keeps_padding_and_groups_by_prefix() {
        let c = |names: &[&str]| compress(names);
        assert_eq!(
            c(&["gpu01", "gpu02", "gpu03", "gpu04", "gpu07", "cpu1"]),
            "cpu1,gpu[01-04,07]"
        );
        assert_eq!(c(&["n9", "n10", "n11"]), "n[9-11]");
        assert_eq!(c(&["n09", "n10", "n11"]), "n[09-11]");
        assert_eq!(c(&["n1", "n01"]), "n1,n01");
        assert_eq!(c(&["login", "n2", "n1", "n2"]), "login,n[1-2]");
        assert_eq!(c(&["a1b", "a2b"]), "a1b,a2b");
        assert_eq!(compress::<&str>(&[]), "");
    }

    #[test]
    fn a_host_list_is_a_set_written_compressed() {
        let l = HostList::parse("n[3,1-2],n2,login").unwrap();
        assert_eq!(l.names(), ["login", "n1", "n2", "n3"]);
        assert!(l.contains("n3") && !l.contains("n4"));
        assert_eq!(l.to_string(), "login,n[1-3]");
        let json = serde_json::to_string(&l).unwrap();
        assert_eq!(json, "\"login,n[1-3]\"");
        assert_eq!(serde_json::from_str::<HostList>(&json).unwrap(), l);
        assert!(serde_json::from_str::<HostList>("\"n[1-\"").is_err());
    }
}
