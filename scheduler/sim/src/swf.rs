//! The Standard Workload Format (SWF) of the Parallel Workloads Archive.
//!
//! A trace is header comments (`; Key: value`, e.g. `; MaxNodes: 256`) followed by one job per
//! line, 18 whitespace-separated fields, `-1` for unknown. Some archive traces write a few fields
//! (average CPU time, memory) with a fraction, so every field is read as a number and times are
//! rounded to whole seconds.
//!
//! ```
//! let text = "; MaxProcs: 4\n1 0 -1 60 2 -1 -1 2 120 -1 1 7 1 -1 1 -1 -1 -1\n";
//! let trace = wharf_sim::swf::parse(text).unwrap();
//! assert_eq!(trace.header.max_procs, Some(4));
//! assert_eq!(trace.jobs[0].run_time, Some(60));
//! assert_eq!(trace.jobs[0].requested_time, Some(120));
//! ```

use std::collections::BTreeMap;

/// Number of fields on a job line.
pub const FIELDS: usize = 18;

/// One job line. `None` where the trace says `-1` (unknown).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SwfJob {
    /// Field 1: job number.
    pub id: u64,
    /// Field 2: submit time, seconds from the trace's start.
    pub submit_time: u64,
    /// Field 3: wait time the original system gave it, seconds.
    pub wait_time: Option<u64>,
    /// Field 4: run time, seconds.
    pub run_time: Option<u64>,
    /// Field 5: processors allocated.
    pub allocated_procs: Option<u64>,
    /// Field 8: processors requested.
    pub requested_procs: Option<u64>,
    /// Field 9: requested time (the job's time limit), seconds.
    pub requested_time: Option<u64>,
    /// Field 10: requested memory per processor, KB.
    pub requested_memory_kb: Option<u64>,
    /// Field 11: status (1 completed, 0 failed, 5 cancelled, ...).
    pub status: Option<i64>,
    /// Field 12: user id.
    pub user: Option<u64>,
    /// Field 13: group id.
    pub group: Option<u64>,
    /// Field 15: queue number.
    pub queue: Option<u64>,
    /// Field 16: partition number.
    pub partition: Option<u64>,
}

impl SwfJob {
    /// Processors the job needs: requested if known, else allocated.
    pub fn procs(&self) -> Option<u64> {
        self.requested_procs.or(self.allocated_procs)
    }
}

/// The header comments that size the machine, and every other `Key: value` pair.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SwfHeader {
    /// `; MaxNodes:`.
    pub max_nodes: Option<u64>,
    /// `; MaxProcs:`.
    pub max_procs: Option<u64>,
    /// Every `; Key: value` line, as written.
    pub fields: BTreeMap<String, String>,
}

impl SwfHeader {
    /// Processors of the machine: MaxProcs, else MaxNodes (traces of one-processor nodes,
    /// such as the Lublin model's, give only that).
    pub fn machine_procs(&self) -> Option<u64> {
        self.max_procs.or(self.max_nodes)
    }
}

/// A whole trace.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SwfTrace {
    /// Header.
    pub header: SwfHeader,
    /// Jobs, in file order.
    pub jobs: Vec<SwfJob>,
}

/// Why a trace could not be read. Every variant names the 1-based line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SwfError {
    /// A job line without exactly 18 fields.
    #[error("line {line}: expected {FIELDS} whitespace-separated fields, found {found}; is this a Standard Workload Format trace?")]
    FieldCount {
        /// Line number.
        line: usize,
        /// Fields found.
        found: usize,
    },
    /// A field that is not a number.
    #[error("line {line}: field {field} ({name}) is {text:?}, not a number")]
    NotANumber {
        /// Line number.
        line: usize,
        /// 1-based field number.
        field: usize,
        /// What the field means.
        name: &'static str,
        /// The text found.
        text: String,
    },
    /// A negative value other than -1 (unknown), or a fraction where a whole id is needed.
    #[error("line {line}: field {field} ({name}) is {text:?}; it must be a whole number >= 0, or -1 for unknown")]
    OutOfRange {
        /// Line number.
        line: usize,
        /// 1-based field number.
        field: usize,
        /// What the field means.
        name: &'static str,
        /// The text found.
        text: String,
    },
    /// A job whose submit time is unknown: it cannot be replayed.
    #[error("line {line}: job {job} has no submit time (field 2 is -1); a trace to replay needs one for every job")]
    NoSubmitTime {
        /// Line number.
        line: usize,
        /// Job number.
        job: u64,
    },
    /// A job number seen before: decisions are keyed by it.
    #[error("line {line}: job number {job} appears twice (first on line {first}); job numbers must be unique")]
    DuplicateJob {
        /// Line number.
        line: usize,
        /// Job number.
        job: u64,
        /// Line of its first appearance.
        first: usize,
    },
    /// A MaxNodes or MaxProcs header that is not a positive whole number (or -1, unknown).
    #[error(
        "line {line}: header {key} is {text:?}, not a positive whole number (or -1 for unknown)"
    )]
    BadHeader {
        /// Line number.
        line: usize,
        /// Header key.
        key: String,
        /// The text found.
        text: String,
    },
}

const NAMES: [&str; FIELDS] = [
    "job number",
    "submit time",
    "wait time",
    "run time",
    "allocated processors",
    "average CPU time",
    "used memory",
    "requested processors",
    "requested time",
    "requested memory",
    "status",
    "user id",
    "group id",
    "executable number",
    "queue number",
    "partition number",
    "preceding job",
    "think time",
];

/// Parses a whole trace.
pub fn parse(text: &str) -> Result<SwfTrace, SwfError> {
    let mut trace = SwfTrace::default();
    let mut seen = BTreeMap::new();
    for (i, raw) in text.lines().enumerate() {
        let line = i + 1;
        let body = raw.trim();
        if body.is_empty() {
            continue;
        }
        if let Some(comment) = body.strip_prefix(';') {
            header_line(&mut trace.header, comment, line)?;
            continue;
        }
        let job = job_line(body, line)?;
        if let Some(&first) = seen.get(&job.id) {
            return Err(SwfError::DuplicateJob {
                line,
                job: job.id,
                first,
            });
        }
        seen.insert(job.id, line);
        trace.jobs.push(job);
    }
    Ok(trace)
}

fn header_line(header: &mut SwfHeader, comment: &str, line: usize) -> Result<(), SwfError> {
    let Some((key, value)) = comment.split_once(':') else {
        return Ok(()); // free-text comment
    };
    let (key, value) = (key.trim(), value.trim());
    if key.is_empty() || key.contains(char::is_whitespace) {
        return Ok(()); // prose that happens to hold a colon
    }
    let slot = match key {
        "MaxNodes" => Some(&mut header.max_nodes),
        "MaxProcs" => Some(&mut header.max_procs),
        _ => None,
    };
    if let Some(slot) = slot {
        match value.parse::<i64>() {
            Ok(-1) => *slot = None,
            Ok(n) if n > 0 => *slot = Some(n as u64),
            _ => {
                return Err(SwfError::BadHeader {
                    line,
                    key: key.into(),
                    text: value.into(),
                })
            }
        }
    }
    header.fields.insert(key.into(), value.into());
    Ok(())
}

fn job_line(body: &str, line: usize) -> Result<SwfJob, SwfError> {
    let raw: Vec<&str> = body.split_whitespace().collect();
    if raw.len() != FIELDS {
        return Err(SwfError::FieldCount {
            line,
            found: raw.len(),
        });
    }
    let mut v = [None; FIELDS];
    for (k, text) in raw.iter().enumerate() {
        v[k] = field(text, line, k)?;
    }
    let id = v[0].ok_or_else(|| out_of_range(line, 0, raw[0]))?;
    let submit_time = v[1].ok_or(SwfError::NoSubmitTime { line, job: id })?;
    let status = match raw[10].parse::<i64>() {
        Ok(-1) => None,
        Ok(s) => Some(s),
        Err(_) => v[10].map(|s| s as i64),
    };
    Ok(SwfJob {
        id,
        submit_time,
        wait_time: v[2],
        run_time: v[3],
        allocated_procs: v[4],
        requested_procs: v[7],
        requested_time: v[8],
        requested_memory_kb: v[9],
        status,
        user: v[11],
        group: v[12],
        queue: v[14],
        partition: v[15],
    })
}

/// One field: `None` for -1, a whole number otherwise (fractions rounded to the nearest).
fn field(text: &str, line: usize, k: usize) -> Result<Option<u64>, SwfError> {
    if let Ok(n) = text.parse::<i64>() {
        return match n {
            -1 => Ok(None),
            n if n >= 0 => Ok(Some(n as u64)),
            _ => Err(out_of_range(line, k, text)),
        };
    }
    let x: f64 = text.parse().map_err(|_| SwfError::NotANumber {
        line,
        field: k + 1,
        name: NAMES[k],
        text: text.into(),
    })?;
    if x == -1.0 {
        Ok(None)
    } else if x.is_finite() && (0.0..1.0e18).contains(&x) {
        Ok(Some(x.round() as u64))
    } else {
        Err(out_of_range(line, k, text))
    }
}

fn out_of_range(line: usize, k: usize, text: &str) -> SwfError {
    SwfError::OutOfRange {
        line,
        field: k + 1,
        name: NAMES[k],
        text: text.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_header_and_unknowns() {
        let t = parse(
            "; Version: 2\n; MaxNodes: 256\n;free text\n\n\
             1 5094 -1 12072 16 -1 -1 -1 -1 -1 1 -1 -1 -1 0 -1 -1 -1\n",
        )
        .unwrap();
        assert_eq!(t.header.max_nodes, Some(256));
        assert_eq!(t.header.machine_procs(), Some(256));
        assert_eq!(t.header.fields["Version"], "2");
        let j = &t.jobs[0];
        assert_eq!((j.id, j.submit_time, j.run_time), (1, 5094, Some(12072)));
        assert_eq!(j.procs(), Some(16));
        assert_eq!((j.requested_time, j.user, j.status), (None, None, Some(1)));
    }

    #[test]
    fn fractions_round() {
        let t = parse("7 10 0.4 59.6 2 31.25 -1 2 3600 -1 1 3 1 -1 1 -1 -1 -1").unwrap();
        assert_eq!(t.jobs[0].run_time, Some(60));
        assert_eq!(t.jobs[0].wait_time, Some(0));
    }

    #[test]
    fn errors_name_the_line() {
        let e = parse("; MaxProcs: 4\n1 0 -1 60 2\n").unwrap_err();
        assert_eq!(e, SwfError::FieldCount { line: 2, found: 5 });
        assert!(e.to_string().starts_with("line 2:"));
        let e = parse("1 0 -1 sixty 2 -1 -1 2 -1 -1 1 -1 -1 -1 0 -1 -1 -1").unwrap_err();
        assert!(e.to_string().contains("line 1: field 4 (run time)"), "{e}");
        let e = parse("1 -1 -1 6 2 -1 -1 2 -1 -1 1 -1 -1 -1 0 -1 -1 -1").unwrap_err();
        assert!(matches!(e, SwfError::NoSubmitTime { line: 1, job: 1 }));
        let e = parse("1 0 -2 6 2 -1 -1 2 -1 -1 1 -1 -1 -1 0 -1 -1 -1").unwrap_err();
        assert!(matches!(
            e,
            SwfError::OutOfRange {
                line: 1,
                field: 3,
                ..
            }
        ));
        let e = parse(
            "1 0 -1 6 2 -1 -1 2 -1 -1 1 -1 -1 -1 0 -1 -1 -1\n\
             1 5 -1 6 2 -1 -1 2 -1 -1 1 -1 -1 -1 0 -1 -1 -1\n",
        )
        .unwrap_err();
        assert_eq!(
            e,
            SwfError::DuplicateJob {
                line: 2,
                job: 1,
                first: 1
            }
        );
        assert_eq!(parse("; MaxProcs: -1\n").unwrap().header.max_procs, None);
        let e = parse("; MaxProcs: many\n").unwrap_err();
        assert!(matches!(e, SwfError::BadHeader { line: 1, .. }));
    }
}
