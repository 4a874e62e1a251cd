//! Job forms that decide *when* a job may start rather than what it runs: a begin time
//! (`--begin`) and holds (`--hold`, `wharf hold`, `wharf release`).
//!
//! ```text
//! --begin now+1h                  one hour after the submit
//! --begin now                     no delay (the same as leaving it out)
//! --begin 2026-12-01T08:00[:00]   that wall-clock time in the user's time zone
//! --begin 2026-12-01              midnight of that day in the user's time zone
//! --begin 2026-12-01T08:00Z       that time, UTC (or with an offset: +01:00, -0500)
//! --begin 16:00[:00]              the next 16:00 in the user's time zone (also noon,
//!                                 teatime = 16:00, midnight, tomorrow = the next midnight)
//! ```
//!
//! A relative begin is kept relative in the request and fixed by the controller at the submit
//! time ([`Begin::at`]), so a request written once means the same thing whenever it is sent.
//! A begin without a zone is resolved by the client in the user's time zone
//! ([`Begin::localize`]) before it is sent, as Slurm reads `--begin` in the submitting
//! host's local time; a controller given one unresolved (a raw API request) takes it as UTC.

use serde::{Deserialize, Serialize};

/// When a job may start at the earliest, as the user wrote it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum Begin {
    /// This many seconds after the submit (`now+1h`; `now` is 0).
    AfterSubmit(u64),
    /// At this instant, seconds since the Unix epoch (written with a zone: `...Z`, `+01:00`).
    At(u64),
    /// A wall-clock date and time without a zone, as seconds since the epoch were it UTC; the
    /// client resolves it in the user's zone ([`Begin::localize`]).
    Local(u64),
    /// A time of day without a date, seconds after midnight: its next occurrence.
    TimeOfDay(u32),
}

/// A time zone, as the client resolving a [`Begin`] knows it.
pub trait Zone {
    /// Seconds the zone is ahead of UTC at the instant `utc` (seconds since the epoch).
    fn offset_at_instant(&self, utc: u64) -> i64;
    /// Seconds the zone is ahead of UTC for the wall-clock time `local` (seconds since the
    /// epoch were it UTC); an error naming the problem when that time does not exist there
    /// (skipped by a clock change).
    fn offset_at_wall_time(&self, local: u64) -> Result<i64, String>;
}

/// Coordinated Universal Time, the zone of a controller and of tests.
#[derive(Debug, Clone, Copy)]
pub struct Utc;

impl Zone for Utc {
    fn offset_at_instant(&self, _: u64) -> i64 {
        0
    }
    fn offset_at_wall_time(&self, _: u64) -> Result<i64, String> {
        Ok(0)
    }
}

impl Begin {
    /// The begin time in ms since the epoch for a job submitted at `submit_ms`. A begin still
    /// without a zone is taken as UTC.
    pub fn at(self, submit_ms: u64) -> u64 {
        match self.localize(submit_ms / 1000, &Utc) {
            Ok(Begin::AfterSubmit(s)) => submit_ms.saturating_add(s.saturating_mul(1000)),
            Ok(Begin::At(s) | Begin::Local(s)) => s.saturating_mul(1000),
            Ok(Begin::TimeOfDay(_)) | Err(_) => submit_ms,
        }
    }

    /// The begin time in ms since the epoch for a job submitted (or updated) at `now_ms`, as
    /// [`Begin::at`], or why it is refused: it lies more than about 100 years ahead, the bound
    /// [`parse_begin`] sets on a relative begin (a date that far is a typo too).
    pub fn checked_at(self, now_ms: u64) -> Result<u64, String> {
        let at = self.at(now_ms);
        if at.saturating_sub(now_ms) > MAX_AHEAD.saturating_mul(1000) {
            return Err(begin_error(&self.to_string(), "more than 100 years ahead"));
        }
        Ok(at)
    }

    /// This begin with a wall-clock time (a date, a date and time, or a time of day, at or
    /// after `now`, seconds since the epoch) resolved to an instant in `zone`; relative and
    /// zoned begins unchanged.
    pub fn localize(self, now: u64, zone: &dyn Zone) -> Result<Begin, String> {
        let instant = |wall: u64| -> Result<Begin, String> {
            let offset = zone.offset_at_wall_time(wall)?;
            let utc = wall as i64 - offset;
            u64::try_from(utc)
                .map(Begin::At)
                .map_err(|_| format!("--begin: {} is before 1970", format_utc(wall)))
        };
        match self {
            Begin::AfterSubmit(_) | Begin::At(_) => Ok(self),
            Begin::Local(wall) => instant(wall),
            Begin::TimeOfDay(t) => {
                let local_now = (now as i64 + zone.offset_at_instant(now)).max(0) as u64;
                let mut wall = local_now - local_now % 86400 + u64::from(t);
                if wall <= local_now {
                    wall += 86400;
                }
                instant(wall)
            }
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
            Begin::At(s) => write!(f, "{}Z", format_utc(s)),
            Begin::Local(s) => f.write_str(&format_utc(s)),
            Begin::TimeOfDay(t) => write!(f, "{:02}:{:02}:{:02}", t / 3600, t / 60 % 60, t % 60),
        }
    }
}

/// Most seconds a begin may lie ahead (about 100 years): past it the number is a typo.
const MAX_AHEAD: u64 = 100 * 365 * 86400;

/// What is wrong (`why`) with `--begin`'s `text`, and what it takes.
fn begin_error(text: &str, why: &str) -> String {
    format!(
        "--begin: {why} in {text:?}; write now+1h, now+30m, 16:00, 2026-12-01T08:00 (your \
         time zone), 2026-12-01T08:00Z (UTC) or 2026-12-01"
    )
}

/// The seconds of Slurm's `now+COUNT[UNIT]` or `now-COUNT[UNIT]` after the sign: a whole
/// number, then s, m, h, d or w or their long names (seconds when none), up to 100 years.
pub fn now_offset(rest: &str) -> Result<u64, String> {
    let digits = rest
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(rest.len());
    let (count, unit) = rest.split_at(digits);
    let count: u64 = count
        .parse()
        .map_err(|_| "expected a whole number after now±".to_string())?;
    let scale = match unit.to_ascii_lowercase().as_str() {
        "" | "s" | "sec" | "secs" | "second" | "seconds" => 1,
        "m" | "min" | "mins" | "minute" | "minutes" => 60,
        "h" | "hour" | "hours" => 3600,
        "d" | "day" | "days" => 86400,
        "w" | "week" | "weeks" => 7 * 86400,
        _ => return Err("unknown unit (use s, m, h, d or w)".into()),
    };
    count
        .checked_mul(scale)
        .filter(|s| *s <= MAX_AHEAD)
        .ok_or_else(|| "more than 100 years".into())
}

/// Parses `--begin`: `now`, `now+COUNT[UNIT]` (unit s, m, h, d or w, or their long names;
/// seconds when none, as Slurm), `YYYY-MM-DD` or `YYYY-MM-DDTHH:MM[:SS]` with an optional zone
/// (`Z`, `+HH:MM`, `-HHMM`, `+HH`; without one, a wall-clock time in the user's zone),
/// `HH:MM[:SS]`, `midnight`, `noon`, `teatime` or `tomorrow`.
pub fn parse_begin(text: &str) -> Result<Begin, String> {
    let t = text.trim();
    let bad = |why: &str| begin_error(text, why);
    if t.eq_ignore_ascii_case("now") {
        return Ok(Begin::AfterSubmit(0));
    }
    let named = match t.to_ascii_lowercase().as_str() {
        "midnight" | "tomorrow" => Some(0),
        "noon" => Some(12 * 3600),
        "teatime" => Some(16 * 3600),
        _ => None,
    };
    if let Some(at) = named {
        return Ok(Begin::TimeOfDay(at));
    }
    if let Some(rest) = t
        .get(..4)
        .filter(|p| p.eq_ignore_ascii_case("now+"))
        .map(|_| &t[4..])
    {
        let secs = now_offset(rest)
            .map_err(|why| bad(&why.replace("now±", "now+").replace("years", "years ahead")))?;
        return Ok(Begin::AfterSubmit(secs));
    }
    if let Some(secs) = parse_clock(t) {
        return Ok(Begin::TimeOfDay(secs as u32));
    }
    let (wall, zone) = split_zone(t).ok_or_else(|| bad("not a time zone offset"))?;
    let wall = parse_utc(wall).ok_or_else(|| bad("not a time"))?;
    match zone {
        None => Ok(Begin::Local(wall)),
        Some(offset) => u64::try_from(wall as i64 - offset)
            .map(Begin::At)
            .map_err(|_| bad("before 1970")),
    }
}

/// Splits a trailing zone (`Z`, `+HH:MM`, `-HHMM`, `+HH`) off a date and time: the rest and
/// the zone's offset east of UTC in seconds, `None` when there is none; `None` as a whole when
/// the zone is malformed. A date alone (`2026-12-01`) has none: its dashes are not offsets.
fn split_zone(t: &str) -> Option<(&str, Option<i64>)> {
    if let Some(rest) = t.strip_suffix(['Z', 'z']) {
        return Some((rest, Some(0)));
    }
    let Some(time_at) = t.find(['T', 't', ' ']) else {
        return Some((t, None));
    };
    let Some(sign_at) = t[time_at..].rfind(['+', '-']).map(|i| i + time_at) else {
        return Some((t, None));
    };
    let sign = if t.as_bytes()[sign_at] == b'-' { -1 } else { 1 };
    let digits: String = t[sign_at + 1..].chars().filter(|c| *c != ':').collect();
    let colons = t[sign_at + 1..].matches(':').count();
    let ok = digits.bytes().all(|b| b.is_ascii_digit())
        && (digits.len() == 2 && colons == 0 || digits.len() == 4 && colons <= 1);
    if !ok {
        return None;
    }
    let hh: i64 = digits[..2].parse().ok()?;
    let mm: i64 = if digits.len() == 4 {
        digits[2..].parse().ok()?
    } else {
        0
    };
    if hh > 14 || mm > 59 {
        return None;
    }
    Some((&t[..sign_at], Some(sign * (hh * 3600 + mm * 60))))
}

/// `HH:MM[:SS]` as seconds after midnight; `None` when it is not one.
fn parse_clock(t: &str) -> Option<u64> {
    let mut p = t.split(':');
    let num = |s: Option<&str>| -> Option<u64> {
        let s = s?;
        (s.len() == 2 && s.bytes().all(|b| b.is_ascii_digit()))
            .then(|| s.parse().ok())
            .flatten()
    };
    let hh = num(p.next())?;
    let mm = num(p.next())?;
    let ss = match p.next() {
        Some(s) => num(Some(s))?,
        None => 0,
    };
    (p.next().is_none() && hh <= 23 && mm <= 59 && ss <= 59).then_some(hh * 3600 + mm * 60 + ss)
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
    // y ≥ 1970, so the day count is not negative.
    let days = days_from_civil(y as i64, m as u32, day as u32) as u64;
    Some(days * 86400 + hh * 3600 + mm * 60 + ss)
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

/// Days since 1970-01-01 of a proleptic Gregorian date, negative before it (H. Hinnant's
/// algorithm; [`civil_from_days`] is its inverse).
pub fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let m = i64::from(m);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
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

    /// A date more than 100 years ahead is refused as a relative begin that far is, with the
    /// same words; before, `9999-12-31T00:00Z` was taken.
    #[test]
    fn a_begin_more_than_100_years_ahead_is_refused_absolute_or_relative() {
        let now = 1_800_000_000_000;
        let far = parse_begin("9999-12-31T00:00Z").unwrap();
        let e = far.checked_at(now).unwrap_err();
        assert!(
            e.starts_with("--begin: more than 100 years ahead in \"9999-12-31T00:00:00Z\""),
            "{e}"
        );
        let relative = parse_begin("now+36501d").unwrap_err();
        assert!(
            relative.starts_with("--begin: more than 100 years ahead in "),
            "{relative}"
        );
        let edge = Begin::At(now / 1000 + MAX_AHEAD);
        assert_eq!(edge.checked_at(now), Ok(now + MAX_AHEAD * 1000));
        assert!(Begin::At(now / 1000 + MAX_AHEAD + 1)
            .checked_at(now)
            .is_err());
        let max = Begin::AfterSubmit(MAX_AHEAD);
        assert_eq!(max.checked_at(now), Ok(now + MAX_AHEAD * 1000));
        // The past, today's time of day and `now` are as they were.
        assert_eq!(Begin::At(0).checked_at(now), Ok(0));
        assert_eq!(Begin::AfterSubmit(0).checked_at(now), Ok(now));
    }

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
        for bad in [
            "now+",
            "now+h",
            "now+1y",
            "now-1h",
            "now+99999999999999w",
            "now+36501d",
        ] {
            let e = parse_begin(bad).unwrap_err();
            assert!(
                e.starts_with("--begin:") && e.contains("now+1h"),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn absolute_begins_are_wall_clock_times_unless_zoned() {
        assert_eq!(parse_begin("1970-01-02"), Ok(Begin::Local(86400)));
        assert_eq!(
            parse_begin("2026-11-26T12:30:05Z"),
            Ok(Begin::At(1_795_696_205))
        );
        assert_eq!(
            parse_begin("2026-11-26T13:30:05+01:00"),
            Ok(Begin::At(1_795_696_205))
        );
        assert_eq!(
            parse_begin("2026-11-26T07:30:05-0500"),
            Ok(Begin::At(1_795_696_205))
        );
        assert_eq!(
            parse_begin("2026-11-26 14:30:05+02"),
            Ok(Begin::At(1_795_696_205))
        );
        assert_eq!(
            parse_begin("2024-02-29T00:00"),
            Ok(Begin::Local(1_709_164_800))
        );
        for bad in [
            "2023-02-29",
            "2026-13-01",
            "2026-1-01",
            "1969-12-31",
            "1970-01-01T00:30+01:00",
            "2026-11-26T24:00",
            "2026-11-26T12:60",
            "2026-11-26T12:00:00:00",
            "2026-11-26T12:00+1",
            "2026-11-26T12:00+15:00",
            "2026-11-26T12:00+01:00:00",
            "2026-11-26T12:00+ab",
            "24:00",
            "9:00",
            "yesterday",
            "",
        ] {
            let e = parse_begin(bad).unwrap_err();
            assert!(
                e.starts_with("--begin:") && e.contains("16:00"),
                "{bad}: {e}"
            );
        }
        for s in [0, 86399, 951_782_400, 1_795_696_205, 4_102_444_799] {
            assert_eq!(parse_begin(&format_utc(s)), Ok(Begin::Local(s)), "{s}");
            assert_eq!(
                parse_begin(&Begin::At(s).to_string()),
                Ok(Begin::At(s)),
                "{s}"
            );
        }
    }

    /// A zone `offset` seconds east of UTC, with the hour from `gap` (a wall-clock time, as
    /// seconds were it UTC) skipped, as a clock change skips it.
    struct Fixed {
        offset: i64,
        gap: Option<u64>,
    }

    impl Zone for Fixed {
        fn offset_at_instant(&self, _: u64) -> i64 {
            self.offset
        }
        fn offset_at_wall_time(&self, local: u64) -> Result<i64, String> {
            match self.gap {
                Some(g) if (g..g + 3600).contains(&local) => Err("skipped".into()),
                _ => Ok(self.offset),
            }
        }
    }

    #[test]
    fn wall_clock_begins_are_resolved_in_the_users_zone() {
        let paris = Fixed {
            offset: 3600,
            gap: None,
        };
        let wall = parse_begin("2026-11-26T13:30:05").unwrap();
        assert_eq!(wall.localize(0, &paris), Ok(Begin::At(1_795_696_205)));
        // Unresolved, a controller takes it as UTC.
        assert_eq!(wall.at(0), 1_795_699_805_000);
        // Zoned and relative begins are what they say whatever the zone.
        for b in [Begin::At(5), Begin::AfterSubmit(60)] {
            assert_eq!(b.localize(0, &paris), Ok(b));
        }
        let gap = Fixed {
            offset: 3600,
            gap: Some(1_795_699_800),
        };
        assert_eq!(wall.localize(0, &gap), Err("skipped".into()));
        assert!(Begin::Local(100).localize(0, &paris).is_err());
    }

    #[test]
    fn a_time_of_day_is_its_next_occurrence_in_the_users_zone() {
        let tokyo = Fixed {
            offset: 9 * 3600,
            gap: None,
        };
        // 2026-11-26T12:30:05Z is 21:30:05 in Tokyo.
        let now = 1_795_696_205;
        assert_eq!(parse_begin("16:00"), Ok(Begin::TimeOfDay(16 * 3600)));
        assert_eq!(parse_begin("teatime"), Ok(Begin::TimeOfDay(16 * 3600)));
        assert_eq!(parse_begin("NOON"), Ok(Begin::TimeOfDay(12 * 3600)));
        assert_eq!(parse_begin("tomorrow"), Ok(Begin::TimeOfDay(0)));
        assert_eq!(parse_begin("22:00:30"), Ok(Begin::TimeOfDay(79_230)));
        // 22:00:30 Tokyo is later today: 13:00:30Z.
        assert_eq!(
            Begin::TimeOfDay(79_230).localize(now, &tokyo),
            Ok(Begin::At(1_795_698_030))
        );
        // 16:00 Tokyo has passed: tomorrow's, 07:00Z on the 27th.
        assert_eq!(
            Begin::TimeOfDay(16 * 3600).localize(now, &tokyo),
            Ok(Begin::At(1_795_762_800))
        );
        // Midnight is the next one, never now.
        assert_eq!(
            Begin::TimeOfDay(0).localize(86400, &Utc),
            Ok(Begin::At(2 * 86400))
        );
        // Unresolved, a controller takes the next occurrence after the submit in UTC.
        assert_eq!(
            Begin::TimeOfDay(16 * 3600).at(now * 1000),
            1_795_708_800_000
        );
        for b in [Begin::TimeOfDay(0), Begin::TimeOfDay(79_230)] {
            assert_eq!(parse_begin(&b.to_string()), Ok(b));
        }
    }
}
