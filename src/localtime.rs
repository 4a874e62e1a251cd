//! The user's time zone, as the CLI resolves `--begin` and time windows in it: `TZ` when set,
//! else the system's `/etc/localtime` (what `date` shows).

use anyhow::Result;
use chrono::{LocalResult, Offset, TimeZone};
use wharf_api::forms::Zone;
use wharf_api::Begin;

/// The local time zone of the process.
#[derive(Debug, Clone, Copy)]
pub struct LocalZone;

impl Zone for LocalZone {
    fn offset_at_instant(&self, utc: u64) -> i64 {
        let Ok(secs) = i64::try_from(utc) else {
            return 0;
        };
        match chrono::Local.timestamp_opt(secs, 0) {
            LocalResult::Single(t) | LocalResult::Ambiguous(t, _) => {
                i64::from(t.offset().fix().local_minus_utc())
            }
            LocalResult::None => 0,
        }
    }

    fn offset_at_wall_time(&self, local: u64) -> Result<i64, String> {
        let wall = i64::try_from(local)
            .ok()
            .and_then(|s| chrono::DateTime::from_timestamp(s, 0))
            .map(|t| t.naive_utc())
            .ok_or_else(|| format!("--begin: {local} is out of range"))?;
        match chrono::Local.from_local_datetime(&wall) {
            LocalResult::Single(t) => Ok(i64::from(t.offset().fix().local_minus_utc())),
            // A time a clock change repeats: the first of the two, as mktime(3) does by default.
            LocalResult::Ambiguous(first, _) => {
                Ok(i64::from(first.offset().fix().local_minus_utc()))
            }
            LocalResult::None => Err(format!(
                "--begin: {} does not exist in your time zone (a clock change skips it); pick \
                 another time or give a zone, e.g. {}Z",
                wall.format("%Y-%m-%dT%H:%M:%S"),
                wall.format("%Y-%m-%dT%H:%M")
            )),
        }
    }
}

/// Seconds since the epoch now.
fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The start of today in the user's time zone, seconds since the epoch (an hour a clock
/// change skips at midnight: the first that exists).
pub fn start_of_today() -> u64 {
    let today = chrono::Local::now().date_naive();
    let start = (0..24)
        .filter_map(|h| today.and_hms_opt(h, 0, 0))
        .find_map(|wall| match chrono::Local.from_local_datetime(&wall) {
            LocalResult::Single(t) | LocalResult::Ambiguous(t, _) => Some(t.timestamp()),
            LocalResult::None => None,
        });
    start.map_or(now_secs() - now_secs() % 86_400, |s| s.max(0) as u64)
}

/// `begin` with a wall-clock time resolved to an instant in the user's time zone.
pub fn localize(begin: Begin) -> Result<Begin> {
    begin
        .localize(now_secs(), &LocalZone)
        .map_err(anyhow::Error::msg)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The zone comes from TZ: Paris is UTC+1 in winter, UTC+2 in summer, and skips
    /// 02:00-03:00 on the last Sunday of March. (Set in a child process: TZ is read once.)
    #[test]
    fn wall_clock_times_follow_tz() {
        if std::env::var("WHARF_LOCALTIME_CHILD").is_ok() {
            let winter = wharf_api::forms::parse_begin("2026-12-01T08:00").unwrap();
            let summer = wharf_api::forms::parse_begin("2026-07-01T08:00").unwrap();
            let gap = wharf_api::forms::parse_begin("2026-03-29T02:30").unwrap();
            println!(
                "{:?} {:?} {}",
                localize(winter).unwrap(),
                localize(summer).unwrap(),
                localize(gap).unwrap_err()
            );
            return;
        }
        let zoneinfo = std::path::Path::new("/usr/share/zoneinfo/Europe/Paris");
        if !zoneinfo.exists() {
            assert!(
                std::env::var("WHARF_TEST_STRICT").as_deref() != Ok("1"),
                "needs the tzdata package (/usr/share/zoneinfo)"
            );
            eprintln!("SKIPPED wall_clock_times_follow_tz: no /usr/share/zoneinfo (tzdata)");
            return;
        }
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "localtime::tests::wall_clock_times_follow_tz",
                "--nocapture",
            ])
            .env("WHARF_LOCALTIME_CHILD", "1")
            .env("TZ", "Europe/Paris")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        // 2026-12-01T07:00Z and 2026-07-01T06:00Z.
        assert!(text.contains("At(1796108400) At(1782885600)"), "{text}");
        assert!(
            text.contains("2026-03-29T02:30:00 does not exist in your time zone"),
            "{text}"
        );
    }
}
