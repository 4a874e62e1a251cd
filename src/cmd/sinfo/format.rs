//! `sinfo -o FORMAT`: sinfo's `%` fields, which also make its default listings.
//!
//! A field is `%[.][SIZE]LETTER` or `%#LETTER` as `src/cmd/percent.rs` reads it (the same
//! as `wharf queue -o`): `#` makes it as wide as the column's widest value.

use anyhow::Result;
use wharf_api::hostlist;

use super::lines::{Count, Line};
use super::state::State;
use crate::cmd::percent;

/// The letters a format takes: each with its header and what it shows.
pub(super) const FIELDS: [(char, &str, &str); 17] = [
    ('P', "PARTITION", "partition, `*` after the default one"),
    ('R', "PARTITION", "partition, unmarked"),
    ('a', "AVAIL", "partition state: up, down, drain, inact"),
    ('l', "TIMELIMIT", "partition's time limit"),
    ('D', "NODES", "how many nodes"),
    (
        't',
        "STATE",
        "node state: idle, mix, alloc, drng, drain, down*, ...",
    ),
    (
        'T',
        "STATE",
        "node state in long words: mixed, allocated, drained, ...",
    ),
    ('N', "NODELIST", "nodes, as a host list"),
    ('c', "CPUS", "CPUs per node (`+`: some have more)"),
    ('m', "MEMORY", "memory per node, MB"),
    ('G', "GRES", "GPUs per node (gpu:N)"),
    ('f', "AVAIL_FEATURES", "node features"),
    ('E', "REASON", "why they take no work"),
    ('U', "USER", "who said why"),
    ('H', "TIMESTAMP", "since when"),
    ('F', "NODES(A/I/O/T)", "nodes allocated/idle/other/total"),
    ('C', "CPUS(A/I/O/T)", "CPUs allocated/idle/other/total"),
];

/// A parsed `-o` format.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Format(percent::Format);

impl Format {
    /// Parses `text` (see [`percent::Format::parse`]).
    pub(super) fn parse(text: &str) -> Result<Format> {
        percent::Format::parse(text, &FIELDS, "sinfo").map(Format)
    }

    /// The rows of `lines`, after a header row when `header`.
    fn rows<'a>(
        &'a self,
        lines: &'a [Line],
        header: bool,
    ) -> impl Iterator<Item = Vec<String>> + 'a {
        let head = header.then(|| self.0.header()).into_iter();
        head.chain(lines.iter().map(|line| self.0.values(|l| value(line, l))))
    }

    /// Writes the lines of `lines` to standard output, after a header line when `header`.
    pub(super) fn print(&self, lines: &[Line], header: bool) {
        self.0.print(self.rows(lines, header));
    }

    /// The text lines of `lines`, after a header line when `header`, trailing spaces cut.
    #[cfg(test)]
    pub(super) fn render(&self, lines: &[Line], header: bool) -> Vec<String> {
        self.0.render(&self.rows(lines, header).collect::<Vec<_>>())
    }
}

/// A time limit as sinfo writes it: `infinite`, `D-HH:MM:SS`, `H:MM:SS` or `M:SS`.
pub(super) fn time_limit(secs: Option<u64>) -> String {
    let Some(secs) = secs else {
        return "infinite".into();
    };
    let (d, h, m, s) = (
        secs / 86400,
        secs % 86400 / 3600,
        secs % 3600 / 60,
        secs % 60,
    );
    match (d, h) {
        (0, 0) => format!("{m}:{s:02}"),
        (0, _) => format!("{h}:{m:02}:{s:02}"),
        _ => format!("{d}-{h:02}:{m:02}:{s:02}"),
    }
}

/// A partition's state as sinfo's AVAIL writes it (the controller's word in lower case).
pub(super) fn avail(state: &str) -> String {
    match state {
        "INACTIVE" => "inact".into(),
        s => s.to_ascii_lowercase(),
    }
}

/// The least of `values` with `+` when some are more, as sinfo writes a column of nodes
/// that differ; `0` for none.
fn least(values: impl Iterator<Item = u64>) -> String {
    let (mut lo, mut hi) = (None::<u64>, 0);
    for v in values {
        lo = Some(lo.map_or(v, |l| l.min(v)));
        hi = hi.max(v);
    }
    match lo {
        Some(l) if l < hi => format!("{l}+"),
        l => l.unwrap_or(0).to_string(),
    }
}

/// Field `letter` of `line`, as sinfo writes it.
fn value(line: &Line, letter: char) -> String {
    let p = line.partition;
    let records = || line.nodes.iter().filter_map(|n| n.record);
    // A line of nodes in several states (-s's) names each.
    let state = |word: fn(State) -> &'static str| {
        let words: Vec<&str> = super::lines::states(&line.nodes)
            .into_iter()
            .map(word)
            .collect();
        match words.len() {
            0 => "n/a".to_string(),
            _ => words.join("+"),
        }
    };
    let reason = || (line.reason.clone()).or_else(|| line.nodes.iter().find_map(|n| n.reason()));
    let na = || "n/a".to_string();
    match letter {
        'P' => p.map_or_else(na, |p| {
            format!("{}{}", p.name, if p.default { "*" } else { "" })
        }),
        'R' => p.map_or_else(na, |p| p.name.clone()),
        'a' => p.map_or_else(na, |p| avail(&p.state)),
        'l' => p.map_or_else(na, |p| time_limit(p.max_time_s)),
        'D' => line.nodes.len().to_string(),
        't' => state(State::short),
        'T' => state(State::long),
        'N' => hostlist::compress(&line.nodes.iter().map(|n| n.name).collect::<Vec<_>>()),
        'c' => least(records().map(|n| u64::from(n.info.cpus))),
        'm' => least(records().map(|n| n.info.memory >> 20)),
        'G' => match least(records().map(|n| u64::from(n.info.capacity().gpus))).as_str() {
            "0" => "(null)".into(),
            g => format!("gpu:{g}"),
        },
        'f' => {
            let all: std::collections::BTreeSet<&str> = records()
                .flat_map(|n| n.info.features.iter().map(String::as_str))
                .collect();
            match all.is_empty() {
                true => "(null)".into(),
                false => all.into_iter().collect::<Vec<_>>().join(","),
            }
        }
        'E' => reason().map_or_else(|| "none".into(), |r| r.text),
        'U' => reason().map_or_else(|| "Unknown".into(), |r| r.user),
        'H' => match reason().and_then(|r| r.since) {
            Some(t) => crate::output::time(Some(t)),
            None => "Unknown".into(),
        },
        'F' => {
            let count = |c| line.nodes.iter().filter(|n| n.counted_as() == c).count();
            let (used, idle) = (count(Count::Allocated), count(Count::Idle));
            let all = line.nodes.len();
            format!("{used}/{idle}/{}/{all}", all - used - idle)
        }
        'C' => {
            let (mut used, mut idle, mut other) = (0, 0, 0);
            for n in &line.nodes {
                let Some(r) = n.record else { continue };
                let (a, have) = (r.allocated.cpus, r.info.cpus);
                match n.counted_as() {
                    Count::Other => other += have,
                    // A draining node's free CPUs take no job: they are other.
                    _ if n.state == State::Draining => {
                        used += a;
                        other += have.saturating_sub(a);
                    }
                    _ => {
                        used += a;
                        idle += have.saturating_sub(a);
                    }
                }
            }
            format!("{used}/{idle}/{other}/{}", used + idle + other)
        }
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::{time_limit, Format};
    use crate::cmd::sinfo::lines::tests::cluster;
    use crate::cmd::sinfo::lines::{Cluster, Filter};

    #[test]
    fn time_limits_are_written_as_sinfo_writes_them() {
        assert_eq!(time_limit(None), "infinite");
        assert_eq!(time_limit(Some(86_400)), "1-00:00:00");
        assert_eq!(time_limit(Some(2 * 86_400 + 3_661)), "2-01:01:01");
        assert_eq!(time_limit(Some(7_200)), "2:00:00");
        assert_eq!(time_limit(Some(1_800)), "30:00");
        assert_eq!(time_limit(Some(59)), "0:59");
        assert_eq!(super::avail("INACTIVE"), "inact");
        assert_eq!(super::avail("DRAIN"), "drain");
    }

    #[test]
    fn the_default_listing_is_slurms_with_host_lists_and_the_default_starred() {
        let (mut parts, nodes) = cluster();
        parts.partitions[1].max_time_s = Some(1_800);
        parts.partitions[2].state = "INACTIVE".into();
        let c = Cluster::new(&parts, &nodes);
        let all = Filter::ALL;
        let f = Format::parse(super::super::DEFAULT).unwrap();
        assert_eq!(
            f.render(&c.by_state(&all), true),
            [
                "PARTITION AVAIL  TIMELIMIT  NODES  STATE NODELIST",
                "gpu*         up   infinite      2   idle gpu[01,07]",
                "gpu*         up   infinite      1    mix gpu02",
                "gpu*         up   infinite      1  drain gpu03",
                "gpu*         up   infinite      1  down* gpu04",
                "gpu*         up   infinite      1   unk* gpu09",
                "debug        up      30:00      1   idle gpu01",
                "debug        up      30:00      1    mix gpu02",
                "empty     inact   infinite      0    n/a",
            ]
        );
        let f = Format::parse(super::super::SUMMARY).unwrap();
        assert_eq!(
            f.render(&c.by_partition(&all), true),
            [
                "PARTITION AVAIL  TIMELIMIT   NODES(A/I/O/T) NODELIST",
                "gpu*         up   infinite          1/2/3/6 gpu[01-04,07,09]",
                "debug        up      30:00          1/1/0/2 gpu[01-02]",
                "empty     inact   infinite          0/0/0/0",
            ]
        );
        // Without a header, a `#` column is as wide as its widest value.
        assert_eq!(
            f.render(&c.by_partition(&all)[..1], false),
            ["gpu*    up   infinite          1/2/3/6 gpu[01-04,07,09]"]
        );
        let f = Format::parse(super::super::REASONS).unwrap();
        let lines = f.render(&c.by_reason(&all), true);
        assert_eq!(
            lines,
            [
                "REASON                 USER  TIMESTAMP            NODELIST",
                "Never registered       wharf Unknown              gpu09",
                "Not responding         wharf 1970-01-01T01:00:00Z gpu04",
                "bad fan                root  1970-01-02T00:00:00Z gpu03",
                "launch of job 7 failed wharf Unknown              cpu1",
            ]
        );
        let f = Format::parse("%10N|%.4D|%c|%m|%G|%f|%C|%E|%%").unwrap();
        assert_eq!(
            f.render(&c.by_state(&all)[..1], true),
            [
                "NODELIST  |NODE|CPUS|MEMORY|GRES|AVAIL_FEATURES|CPUS(A/I/O/T)|REASON|%",
                "gpu[01,07]|   2|8|16384|(null)|(null)|0/16/0/16|none|%"
            ]
        );
    }

    #[test]
    fn a_node_clearing_an_ended_jobs_processes_counts_by_what_it_holds() {
        let (parts, mut nodes) = cluster();
        // gpu01 holds nothing, gpu02 3 CPUs; both still clear an ended job's processes.
        for n in &mut nodes[..2] {
            n.reason = Some("clearing job 9".into());
        }
        let c = Cluster::new(&parts, &nodes);
        let all = Filter {
            partitions: &["debug".to_string()],
            ..Filter::ALL
        };
        let f = Format::parse("%F %C").unwrap();
        assert_eq!(
            f.render(&c.by_partition(&all), false),
            ["1/1/0/2 3/13/0/16"]
        );
    }

    #[test]
    fn a_format_names_only_the_fields_there_are() {
        for (bad, why) in [
            ("%Z", "%Z is not a field"),
            ("%.10", "ends in the middle of a field"),
            ("%5000N", "at most 1000"),
        ] {
            let e = Format::parse(bad).unwrap_err().to_string();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }
}
