//! Job forms that decide *when* a job may start rather than what it runs: a begin time
//! (`--begin`) and holds (`--hold`, `wharf hold`, `wharf release`).
//!
//! ```text
//! --begin now+1h          one hour after the submit
//! --begin now             no delay (the same as leaving it out)
//! --begin 2026-12-01T08:00[:00]   that time, UTC
//! --begin 2026-12-01      midnight UTC of that day
//! ```
//!
//! A relative begin is kept relative in the request and fixed by the controller at the submit
//! time ([`Begin::at`]), so a request written once means the same thing whenever it is sent.

use serde::{Deserialize, Serialize};

/// When a job may start at the earliest, as the user wrote it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum Begin {
    /// This many seconds after the submit (`now+1h`; `now` is 0).
    AfterSubmit(u64),
    /// At this time, seconds since the Unix epoch (UTC).
    At(u64),
}

impl Begin {
    /// The begin time in ms since the epoch for a job submitted at `submit_ms`.
    pub fn at(self, submit_ms: u64) -> u64 {
        match self {
            Begin::AfterSubmit(s) => submit_ms.saturating_add(s.saturating_mul(1000)),
            Begin::At(s) => s.saturating_mul(1000),
        }
    }
}

impl TryFrom<String> for Begin {
    type Error = String;
    fn try_from(text: String) -> Result<Begin, String> {
        parse_begin(&text)
    }
}

impl From<Begin> for String {
    fn from(b: Begin) -> String {
        b.to_string()
    }
}

impl std::fmt::Display for Begin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            Begin::AfterSubmit(s) => write!(f, "now+{s}"),
            Begin::At(s) => f.write_str(&format_utc(s)),
        }
    }
}

/// Most seconds a relative begin may lie ahead (about 100 years): past it the number is a typo.
const MAX_AHEAD: u64 = 100 * 365 * 86400;

/// Parses `--begin`: `now`, `now+COUNT[UNIT]` (unit s, m, h, d or w, or their long names;
/// seconds when none, as Slurm), `YYYY-MM-DD` or `YYYY-MM-DDTHH:MM[:SS]` in UTC (a trailing
/// `Z` is allowed).
pub fn parse_begin(text: &str) -> Result<Begin, String> {
    let t = text.trim();
    let bad = |why: &str| {
        format!(
            "--begin: {why} in {text:?}; write now+1h, now+30m, 2026-12-01T08:00 (UTC) or \
             2026-12-01"
        )
    };
    if t.eq_ignore_ascii_case("now") {
        return Ok(Begin::AfterSubmit(0));
    }
    if let Some(rest) = t
        .get(..4)
        .filter(|p| p.eq_ignore_ascii_case("now+"))
        .map(|_| &t[4..])
    {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        let (count, unit) = rest.split_at(digits);
        let count: u64 = count
            .parse()
            .map_err(|_| bad("expected a whole number after now+"))?;
        let scale = match unit.to_ascii_lowercase().as_str() {
            "" | "s" | "sec" | "secs" | "second" | "seconds" => 1,
            "m" | "min" | "mins" | "minute" | "minutes" => 60,
            "h" | "hour" | "hours" => 3600,
            "d" | "day" | "days" => 86400,
            "w" | "week" | "weeks" => 7 * 86400,
            _ => return Err(bad("unknown unit (use s, m, h, d or w)")),
        };
        let secs = count
            .checked_mul(scale)
            .filter(|s| *s <= MAX_AHEAD)
            .ok_or_else(|| bad("more than 100 years ahead"))?;
        return Ok(Begin::AfterSubmit(secs));
    }
    parse_utc(t.strip_suffix(['Z', 'z']).unwrap_or(t))
        .map(Begin::At)
        .ok_or_else(|| bad("not a time"))
}

/// `YYYY-MM-DD[THH:MM[:SS]]` as seconds since the epoch, UTC; `None` when malformed or before
/// 1970.
fn parse_utc(t: &str) -> Option<u64> {
    let (date, time) = match t.split_once(['T', 't', ' ']) {
        Some((d, tm)) => (d, Some(tm)),
        None => (t, None),
    };
    let num = |s: &str, len: usize| -> Option<u64> {
        (s.len() == len && s.bytes().all(|b| b.is_ascii_digit()))
            .then(|| s.parse().ok())
            .flatten()
    };
    let mut d = date.split('-');
    let (y, m, day) = (num(d.next()?, 4)?, num(d.next()?, 2)?, num(d.next()?, 2)?);
    if d.next().is_some() || y < 1970 || !(1..=12).contains(&m) {
        return None;
    }
    if day < 1 || day > days_in_month(y, m) {
        return None;
    }
    let (hh, mm, ss) = match time {
        None => (0, 0, 0),
        Some(tm) => {
            let mut p = tm.split(':');
            let hh = num(p.next()?, 2)?;
            let mm = num(p.next()?, 2)?;
            let ss = match p.next() {
                Some(s) => num(s, 2)?,
                None => 0,
            };
            if p.next().is_some() || hh > 23 || mm > 59 || ss > 59 {
                return None;
            }
            (hh, mm, ss)
        }
    };
    Some(days_from_civil(y, m, day) * 86400 + hh * 3600 + mm * 60 + ss)
}

fn is_leap(y: u64) -> bool {
    (y % 4 == 0 && y % 100 != 0) || y % 400 == 0
}

fn days_in_month(y: u64, m: u64) -> u64 {
    match m {
        2 if is_leap(y) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days since 1970-01-01 of a date on or after it.
fn days_from_civil(y: u64, m: u64, d: u64) -> u64 {
    let before_year: u64 = (1970..y)
        .map(|yy| if is_leap(yy) { 366 } else { 365 })
        .sum();
    let before_month: u64 = (1..m).map(|mm| days_in_month(y, mm)).sum();
    before_year + before_month + d - 1
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian (H. Hinnant's algorithm).
pub fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// Seconds since the epoch as `YYYY-MM-DDTHH:MM:SS` (UTC).
pub fn format_utc(secs: u64) -> String {
    let (y, m, d) = civil_from_days((secs / 86400) as i64);
    let rest = secs % 86400;
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}",
        rest / 3600,
        rest / 60 % 60,
        rest % 60
    )
}

/// Who holds a pending job back. An admin's hold can be released only by an admin.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Hold {
    /// Its owner (`--hold`, or `wharf hold` by the owner): the owner may release it.
    User,
    /// An admin (`wharf hold` by an admin): only an admin may release it.
    Admin,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_begins_count_from_the_submit() {
        assert_eq!(parse_begin("now"), Ok(Begin::AfterSubmit(0)));
        assert_eq!(parse_begin("now+1h"), Ok(Begin::AfterSubmit(3600)));
        assert_eq!(parse_begin("NOW+90"), Ok(Begin::AfterSubmit(90)));
        assert_eq!(parse_begin("now+2days"), Ok(Begin::AfterSubmit(172_800)));
        assert_eq!(
            parse_begin("now+1w").unwrap().at(5_000),
            5_000 + 604_800_000
        );
        for bad in ["now+", "now+h", "now+1y", "now-1h", "now+99999999999999w"] {
            let e = parse_begin(bad).unwrap_err();
            assert!(
                e.starts_with("--begin:") && e.contains("now+1h"),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn absolute_begins_are_utc() {
        assert_eq!(parse_begin("1970-01-02"), Ok(Begin::At(86400)));
        assert_eq!(
            parse_begin("2026-11-26T12:30:05Z"),
            Ok(Begin::At(1_795_696_205))
        );
        assert_eq!(
            parse_begin("2024-02-29T00:00"),
            Ok(Begin::At(1_709_164_800))
        );
        for bad in [
            "2023-02-29",
            "2026-13-01",
            "2026-1-01",
            "1969-12-31",
            "2026-11-26T24:00",
            "2026-11-26T12:60",
            "2026-11-26T12:00:00:00",
            "tomorrow",
            "",
        ] {
            assert!(parse_begin(bad).is_err(), "{bad}");
        }
        for s in [0, 86399, 951_782_400, 1_795_696_205, 4_102_444_799] {
            assert_eq!(parse_begin(&format_utc(s)), Ok(Begin::At(s)), "{s}");
        }
    }
}
