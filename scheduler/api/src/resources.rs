//! Resource quantities (CPUs, memory, GPUs) and the human forms they are written in.

use serde::{Deserialize, Serialize};

/// What a job asks for on one node, or what a node offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Resources {
    /// Logical CPUs.
    pub cpus: u32,
    /// Memory in bytes.
    pub memory: u64,
    /// Whole GPUs.
    pub gpus: u32,
}

impl Resources {
    /// True when `self` fits inside `avail` on every axis.
    pub fn fits_in(&self, avail: &Resources) -> bool {
        self.cpus <= avail.cpus && self.memory <= avail.memory && self.gpus <= avail.gpus
    }
}

/// Parses a memory size such as `512M`, `4G`, `1.5GiB`, `2048` (plain numbers are MiB, as in
/// Slurm's `--mem`). Units are binary (K = 1024).
pub fn parse_memory(text: &str) -> Result<u64, String> {
    let t = text.trim();
    if t.is_empty() {
        return Err("empty memory size; write e.g. \"4G\" or \"512M\"".into());
    }
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let value: f64 = num
        .parse()
        .map_err(|_| format!("invalid memory size {text:?}; write e.g. \"4G\" or \"512M\""))?;
    let mult: u64 = match unit.trim().to_ascii_uppercase().as_str() {
        "" | "M" | "MB" | "MIB" => 1 << 20,
        "B" => 1,
        "K" | "KB" | "KIB" => 1 << 10,
        "G" | "GB" | "GIB" => 1 << 30,
        "T" | "TB" | "TIB" => 1 << 40,
        other => {
            return Err(format!(
                "unknown memory unit {other:?} in {text:?}; use K, M, G or T"
            ))
        }
    };
    let bytes = value * mult as f64;
    if !bytes.is_finite() || bytes < 1.0 || bytes > u64::MAX as f64 / 2.0 {
        return Err(format!("memory size {text:?} is out of range"));
    }
    Ok(bytes as u64)
}

/// [`parse_memory`], but zero (`0`, `0G`, ...) is taken too, as 0: a job's `--mem=0`, all of
/// each node's memory, as in Slurm.
pub fn parse_memory_or_whole(text: &str) -> Result<u64, String> {
    let number = text
        .trim()
        .trim_end_matches(|c: char| c.is_ascii_alphabetic());
    if !number.is_empty() && number.bytes().all(|b| b == b'0' || b == b'.') && number != "." {
        return Ok(0);
    }
    parse_memory(text)
}

/// Formats bytes the way `parse_memory` reads them back (e.g. `4G`, `512M`).
pub fn format_memory(bytes: u64) -> String {
    const UNITS: [(u64, &str); 4] = [
        (1 << 40, "T"),
        (1 << 30, "G"),
        (1 << 20, "M"),
        (1 << 10, "K"),
    ];
    for (size, unit) in UNITS {
        if bytes >= size {
            let v = bytes as f64 / size as f64;
            return if bytes % size == 0 {
                format!("{}{unit}", bytes / size)
            } else {
                format!("{v:.1}{unit}")
            };
        }
    }
    format!("{bytes}B")
}

/// [`parse_duration`], but zero (`0`, `0s`, `0m`, ...) is taken too, as 0: for settings
/// where zero turns something off (or on at once).
pub fn parse_duration_or_zero(text: &str) -> Result<u64, String> {
    let number = text
        .trim()
        .trim_end_matches(|c: char| c.is_ascii_alphabetic());
    if !number.is_empty() && number.bytes().all(|b| b == b'0') {
        return Ok(0);
    }
    parse_duration(text)
}

/// A job's time limit of `UNLIMITED` (or `infinite`), as Slurm writes it: the most its
/// partition allows.
pub const UNLIMITED_TIME: u64 = u64::MAX;

/// Parses a job's time limit: [`parse_duration`]'s forms, or `UNLIMITED` / `infinite`
/// ([`UNLIMITED_TIME`]), which a job's partition turns into its maximum. A zero in Slurm's
/// forms (`0`, `00:00:00`, `0-0`) is the same: Slurm's `-t 0` imposes no time limit.
pub fn parse_time_limit(text: &str) -> Result<u64, String> {
    let word = text.trim();
    let zero = is_slurm_zero(word);
    if zero
        || ["unlimited", "infinite", "infinity"]
            .iter()
            .any(|w| word.eq_ignore_ascii_case(w))
    {
        return Ok(UNLIMITED_TIME);
    }
    parse_duration(text).map_err(|e| format!("{e}, or \"UNLIMITED\" for the partition's maximum"))
}

/// Whether `word` is a zero in one of Slurm's time forms (`0`, `0:0`, `00:00:00`, `0-0`,
/// `0-0:0`, `0-00:00:00`): each field zeros, a day only before `-`, at most three fields
/// after it.
fn is_slurm_zero(word: &str) -> bool {
    let zeros = |f: &str| !f.is_empty() && f.bytes().all(|b| b == b'0');
    let (day, rest) = match word.split_once('-') {
        Some((d, r)) => (Some(d), r),
        None => (None, word),
    };
    let fields: Vec<&str> = rest.split(':').collect();
    day.is_none_or(zeros) && fields.len() <= 3 && fields.iter().all(|f| zeros(f))
}

/// Parses a time limit. Accepts Slurm's forms (`MM`, `MM:SS`, `HH:MM:SS`, `D-HH`, `D-HH:MM`,
/// `D-HH:MM:SS`) and suffixed forms (`90s`, `30m`, `2h`, `1d`). Returns seconds.
pub fn parse_duration(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let bad = || {
        format!("invalid time limit {text:?}; write e.g. \"30m\", \"2h\", \"1:30:00\" or \"1-00:00:00\"")
    };
    if t.is_empty() {
        return Err(bad());
    }
    if t.starts_with(['+', '-']) {
        return Err(format!(
            "time limit {text:?} has a sign: a time limit is a length (wharf update takes +30 \
             or -10 to move one a job has)"
        ));
    }
    if let Some(last) = t.chars().last().filter(|c| c.is_ascii_alphabetic()) {
        let n: u64 = t[..t.len() - 1].trim().parse().map_err(|_| bad())?;
        let mult = match last.to_ascii_lowercase() {
            's' => 1,
            'm' => 60,
            'h' => 3600,
            'd' => 86400,
            _ => return Err(bad()),
        };
        return positive(n.checked_mul(mult).ok_or_else(bad)?, text);
    }
    let (days, rest) = match t.split_once('-') {
        Some((d, r)) => (d.parse::<u64>().map_err(|_| bad())?, r),
        None => (0, t),
    };
    let parts: Vec<u64> = rest
        .split(':')
        .map(|p| p.parse::<u64>())
        .collect::<Result<_, _>>()
        .map_err(|_| bad())?;
    // Checked: a huge value must be an error, not a panic or a wrapped small limit.
    let hms = |h: u64, m: u64, s: u64| {
        h.checked_mul(3600)?
            .checked_add(m.checked_mul(60)?)?
            .checked_add(s)?
            .checked_add(days.checked_mul(86400)?)
    };
    let secs = match (t.contains('-'), parts.as_slice()) {
        (false, [m]) => hms(0, *m, 0),
        (false, [m, s]) => hms(0, *m, *s),
        (false, [h, m, s]) => hms(*h, *m, *s),
        (true, [h]) => hms(*h, 0, 0),
        (true, [h, m]) => hms(*h, *m, 0),
        (true, [h, m, s]) => hms(*h, *m, *s),
        _ => return Err(bad()),
    };
    positive(
        secs.ok_or_else(|| format!("time limit {text:?} is out of range"))?,
        text,
    )
}

fn positive(secs: u64, text: &str) -> Result<u64, String> {
    if secs == 0 {
        Err(format!("time limit {text:?} must be longer than zero"))
    } else {
        Ok(secs)
    }
}

/// Formats seconds as `[D-]HH:MM:SS`, as Slurm prints time limits.
pub fn format_duration(secs: u64) -> String {
    let (d, rem) = (secs / 86400, secs % 86400);
    let (h, m, s) = (rem / 3600, rem % 3600 / 60, rem % 60);
    if d > 0 {
        format!("{d}-{h:02}:{m:02}:{s:02}")
    } else {
        format!("{h:02}:{m:02}:{s:02}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_sizes() {
        assert_eq!(parse_memory("512M"), Ok(512 << 20));
        assert_eq!(parse_memory("4G"), Ok(4 << 30));
        assert_eq!(parse_memory("1.5GiB"), Ok(3 << 29));
        assert_eq!(parse_memory("2048"), Ok(2048 << 20));
        assert!(parse_memory("12XB")
            .unwrap_err()
            .contains("unknown memory unit"));
        assert!(parse_memory("").is_err());
        assert!(parse_memory("0").is_err());
        assert_eq!(format_memory(4 << 30), "4G");
        assert_eq!(format_memory(3 << 29), "1.5G");
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("30"), Ok(1800));
        assert_eq!(parse_duration("1:30"), Ok(90));
        assert_eq!(parse_duration("1:00:00"), Ok(3600));
        assert_eq!(parse_duration("1-02"), Ok(93600));
        assert_eq!(parse_duration("2h"), Ok(7200));
        assert_eq!(parse_duration("45s"), Ok(45));
        assert!(parse_duration("0").is_err());
        assert!(parse_duration("abc").is_err());
        assert!(parse_duration("1:2:3:4").is_err());
        let huge = parse_duration("18446744073709551615").unwrap_err();
        assert!(huge.contains("out of range"), "{huge}");
        assert!(parse_duration("213503982334602-00").is_err());
        assert_eq!(format_duration(93600), "1-02:00:00");
        assert_eq!(format_duration(59), "00:00:59");
    }

    #[test]
    fn a_time_limit_may_be_unlimited_and_a_duration_may_not() {
        for word in ["UNLIMITED", "unlimited", " infinite", "Infinity"] {
            assert_eq!(parse_time_limit(word), Ok(UNLIMITED_TIME), "{word}");
            assert!(parse_duration(word).is_err(), "{word}");
        }
        assert_eq!(parse_time_limit("2h"), Ok(7200));
        // Slurm's `-t 0`: no limit (the partition's maximum); a zero length elsewhere is not.
        for zero in ["0", "00:00:00", "0-0", " 0:00 "] {
            assert_eq!(parse_time_limit(zero), Ok(UNLIMITED_TIME), "{zero}");
        }
        assert!(parse_time_limit("0s").is_err() && parse_time_limit("0h").is_err());
        for junk in ["0:", "0--", "0-:-", "-0", "0:0:0:0", "0-0-0", ":0"] {
            assert_ne!(parse_time_limit(junk), Ok(UNLIMITED_TIME), "{junk}");
        }
        // A sign is a move of a limit (wharf update's), not a limit: `+5` was 5 minutes.
        for signed in ["+5", "-5", " +1:00:00"] {
            let err = parse_time_limit(signed).unwrap_err();
            assert!(err.contains("has a sign"), "{signed}: {err}");
        }
        let err = parse_time_limit("forever").unwrap_err();
        assert!(err.contains("UNLIMITED"), "{err}");
    }
}
