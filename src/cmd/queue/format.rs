//! `wharf queue -o FORMAT`: squeue's `%` fields, for scripts written for `squeue -o`.
//!
//! A field is `%[.][SIZE]LETTER` (or `%#LETTER`) as `src/cmd/percent.rs` reads it: at least
//! SIZE columns, cut to SIZE where longer, as squeue does.

use anyhow::Result;
use wharf_api::listing::JobRow;

use crate::cmd::percent;
use wharf_api::resources::{format_duration, format_memory};
use wharf_api::JobState;

/// The letters a format takes: each with its header and what it shows.
pub(super) const FIELDS: [(char, &str, &str); 19] = [
    ('i', "JOBID", "job id (ARRAYID_TASK for an array's task)"),
    ('A', "JOBID", "the job's own id (an array task's)"),
    (
        'F',
        "ARRAY_JOB_ID",
        "the array's id (the job's own outside one)",
    ),
    (
        'K',
        "ARRAY_TASK_ID",
        "the array task's id (N/A outside one)",
    ),
    ('j', "NAME", "name"),
    ('u', "USER", "owner"),
    ('P', "PARTITION", "partition"),
    ('t', "ST", "state, as a code (PD, R, CD, ...)"),
    ('T', "STATE", "state"),
    ('M', "TIME", "time used"),
    ('l', "TIME_LIMIT", "time limit"),
    ('D', "NODES", "nodes"),
    ('C', "CPUS", "CPUs, on all its nodes"),
    ('m', "MIN_MEMORY", "memory per node"),
    (
        'b',
        "TRES_PER_NODE",
        "GPUs per node (gres/gpu:N), N/A without",
    ),
    ('N', "NODELIST", "its nodes"),
    ('r', "REASON", "why it waits (None when it does not)"),
    ('R', "NODELIST(REASON)", "why it waits, else its nodes"),
    (
        'S',
        "START_TIME",
        "when it started, or is expected to (N/A)",
    ),
];

/// A parsed `-o` format.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Format(percent::Format);

impl Format {
    /// Parses `text` (see [`percent::Format::parse`]).
    pub(super) fn parse(text: &str) -> Result<Format> {
        percent::Format::parse(text, &FIELDS, "wharf queue").map(Format)
    }

    /// The header line's values.
    pub(super) fn header(&self) -> Vec<String> {
        self.0.header()
    }

    /// The values of job `j`'s line at `now`.
    pub(super) fn row(&self, j: &JobRow, now: u64) -> Vec<String> {
        self.0.values(|letter| value(j, letter, now))
    }

    /// Writes the lines of `rows` (see [`percent::Format::print`]).
    pub(super) fn print(&self, rows: impl Iterator<Item = Vec<String>>) {
        self.0.print(rows)
    }

    /// The line of `values` (see [`percent::Format::line`]).
    #[cfg(test)]
    fn line(&self, values: &[String], widest: &[usize]) -> String {
        self.0.line(values, widest)
    }
}

/// Field `letter` of job `j` at `now`, as squeue writes it.
fn value(j: &JobRow, letter: char, now: u64) -> String {
    let waiting = j.state == JobState::Pending;
    let reason = || {
        j.reason
            .as_deref()
            .filter(|r| !r.is_empty())
            .unwrap_or("None")
            .to_string()
    };
    match letter {
        'i' => j
            .array
            .map_or_else(|| j.id.to_string(), |(a, t)| format!("{a}_{t}")),
        'A' => j.id.to_string(),
        'F' => j.array.map_or(j.id, |(a, _)| a).to_string(),
        'K' => j.array.map_or_else(|| "N/A".into(), |(_, t)| t.to_string()),
        'j' => j.name.to_string(),
        'u' => j.user.to_string(),
        'P' => j.partition.to_string(),
        't' => j.state.code().to_string(),
        'T' => j.state.as_str().to_string(),
        'M' => format_duration(j.elapsed_ms(now) / 1000),
        'l' => format_duration(j.time_limit),
        'D' => j.nodes.to_string(),
        'C' => (j.resources.cpus * j.nodes.max(1)).to_string(),
        'm' => format_memory(j.resources.memory),
        'b' => match j.resources.gpus {
            0 => "N/A".into(),
            n => format!("gres/gpu:{n}"),
        },
        'N' => j.nodelist.to_string(),
        'r' => {
            if waiting {
                reason()
            } else {
                "None".into()
            }
        }
        'R' => {
            if waiting {
                format!("({})", reason())
            } else {
                j.nodelist.to_string()
            }
        }
        'S' => match j.start_time.or(j.expected_start) {
            Some(t) => crate::output::time(Some(t)),
            None => "N/A".into(),
        },
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use std::borrow::Cow;

    use wharf_api::JobState;

    use super::Format;
    use crate::cmd::queue::tests::row;

    /// The line of `values`, as squeue prints it.
    fn line(f: &Format, values: Vec<String>) -> String {
        f.line(&values, &[])
    }

    #[test]
    fn squeues_fields_are_sized_cut_and_justified_as_squeue_does() {
        let f = Format::parse("%.6i|%-5j|%2t|%5u|%R|%%|%C %b %m").unwrap();
        let mut waiting = row(12, JobState::Pending);
        waiting.reason = Some(Cow::Borrowed("Priority"));
        assert_eq!(
            line(&f, f.header()),
            " JOBID|NAME |ST|USER |NODELIST(REASON)|%|CPUS TRES_PER_NODE MIN_MEMORY"
        );
        assert_eq!(
            line(&f, f.row(&waiting, 0)),
            "    12|train|PD|alice|(Priority)|%|4 gres/gpu:1 1.5G"
        );
        let mut running = row(13, JobState::Running);
        running.array = Some((10, 3));
        running.nodelist = Cow::Borrowed("gpu[1-2]");
        running.nodes = 2;
        running.start_time = Some(1_000);
        let f = Format::parse("%i %A %F %K %M %l %D %C %N %r %S %.3T").unwrap();
        assert_eq!(
            line(&f, f.row(&running, 61_000)),
            "10_3 13 10 3 00:01:00 01:00:00 2 8 gpu[1-2] None 1970-01-01T00:00:01Z RUN"
        );
        // Only what squeue would print of a job's id: a line per job, easy to cut.
        let f = Format::parse("%i").unwrap();
        assert_eq!(line(&f, f.row(&waiting, 0)), "12");
        for (bad, why) in [
            ("%Z", "%Z is not a field"),
            ("%.10", "ends in the middle of a field"),
            ("%5000i", "at most 1000"),
        ] {
            let e = Format::parse(bad).unwrap_err().to_string();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }
}
