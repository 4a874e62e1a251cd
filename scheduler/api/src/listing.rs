//! The queue listing in rows: `GET /v1/jobs?brief=true&rows=true` answers
//! `{"rows": [JobRow]}`, where each job is a JSON array of what `wharf queue` shows of it and
//! nothing more. A queue of 100,000 jobs is 100,000 records: as whole records (`{"jobs":
//! [JobRecord]}`) the answer is several times larger, and both sides spend most of their time
//! copying, writing and parsing fields nobody looks at. A row borrows its text from the record
//! on the controller's side and from the answer's bytes on the client's.
//!
//! ```
//! use wharf_api::listing::{JobRow, Rows};
//! use wharf_api::{JobRecord, JobState};
//! let text = r#"{"rows":[[7,null,"train","alice","PENDING","JobHeldUser",null,null,3600,
//!     1,1073741824,0,1,"",null,null,"gpu"]]}"#;
//! let rows: Rows = serde_json::from_str(text).unwrap();
//! let row: &JobRow = &rows.rows[0];
//! assert_eq!((row.id, &*row.name, row.state), (7, "train", JobState::Pending));
//! assert_eq!(row.partition, "gpu");
//! assert_eq!(serde_json::to_string(&rows).unwrap(), text.replace("\n    ", ""));
//! ```

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::ser::{SerializeTuple, Serializer};
use serde::{Deserialize, Serialize};

use crate::job::{JobId, JobRecord, JobState};
use crate::pull::PullProgress;
use crate::resources::Resources;

/// `GET /v1/jobs?rows=true`: the jobs as rows, oldest first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rows<'a> {
    /// One per job.
    #[serde(borrow)]
    pub rows: Vec<JobRow<'a>>,
}

/// One job as a queue listing shows it. On the wire, a JSON array of its fields in the order
/// they are declared, `resources` as three elements (`cpus`, `memory`, `gpus`), `array` as
/// `[job_id, task_id]`, `pull` as `[layers_done, layers, bytes_done, bytes]`:
/// `[id, array, name, user, state, reason, start_time, end_time, time_limit, cpus, memory,
/// gpus, nodes, nodelist, expected_start, pull, partition]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobRow<'a> {
    /// Job id.
    pub id: JobId,
    /// The array job's id and this task's id, for an array task.
    pub array: Option<(JobId, u32)>,
    /// Its name.
    pub name: Cow<'a, str>,
    /// Its owner's user name.
    pub user: Cow<'a, str>,
    /// Its state.
    pub state: JobState,
    /// Why a pending job waits, as a code: its [`JobRecord::pending_reason`]'s, else its
    /// [`JobRecord::reason`] up to the first `:`
    /// (`JobHeldUser`, `Resources`), as squeue shows it. None in other states.
    pub reason: Option<Cow<'a, str>>,
    /// Start time, ms since the Unix epoch.
    pub start_time: Option<u64>,
    /// End time, ms since the Unix epoch.
    pub end_time: Option<u64>,
    /// Time limit in seconds.
    pub time_limit: u64,
    /// Resources per node.
    pub resources: Resources,
    /// Its nodes, as [`JobRecord::node_count`] counts them: those it holds, else those it
    /// asks for (1 from a record whose spec was left out).
    pub nodes: u32,
    /// The nodes it holds, as a compressed host list; empty while it holds none.
    pub nodelist: Cow<'a, str>,
    /// When the last scheduling pass expects a pending job to start, ms since the Unix epoch.
    pub expected_start: Option<u64>,
    /// While it is STARTING, the pull of its image on its node furthest behind (private to
    /// its owner and admins, as [`JobRecord::pulling`] is).
    pub pull: Option<PullCounts>,
    /// Its partition, which everyone sees (as squeue shows it); empty where the controller
    /// did not say (one older than this field, or a row made from a record without its spec
    /// that names none).
    pub partition: Cow<'a, str>,
}

/// How far one node's pull of an image has come (the counts of a [`PullProgress`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PullCounts {
    /// Layers in the store so far.
    pub layers_done: u64,
    /// Layers of the image; 0 until its manifest is resolved.
    pub layers: u64,
    /// Compressed bytes done so far.
    pub bytes_done: u64,
    /// Compressed bytes of all its layers; 0 until its manifest is resolved.
    pub bytes: u64,
}

impl PullCounts {
    /// The counts of `p`.
    pub fn of(p: &PullProgress) -> PullCounts {
        PullCounts {
            layers_done: p.layers_done,
            layers: p.layers,
            bytes_done: p.bytes_done,
            bytes: p.bytes,
        }
    }

    /// The pull furthest behind of `pulls` (fewest layers, then bytes, done).
    pub fn furthest_behind(pulls: &[PullProgress]) -> Option<PullCounts> {
        pulls
            .iter()
            .min_by_key(|p| (p.layers_done, p.bytes_done))
            .map(PullCounts::of)
    }

    /// In words, as [`PullProgress::counts`].
    pub fn counts(&self) -> String {
        PullProgress {
            layers_done: self.layers_done,
            layers: self.layers,
            bytes_done: self.bytes_done,
            bytes: self.bytes,
            ..Default::default()
        }
        .counts()
    }
}

/// The code a reason starts with: the words before its first `:`.
pub fn reason_code(reason: &str) -> &str {
    reason.split(':').next().unwrap_or("")
}

impl<'a> JobRow<'a> {
    /// The row of `job`, borrowing its text; `pulls` are its nodes' pulls of its image as
    /// the caller may see them (none for a caller who may not).
    pub fn of(job: &'a JobRecord, pulls: &[PullProgress]) -> JobRow<'a> {
        JobRow {
            id: job.id,
            array: job.array.map(|a| (a.job_id, a.task_id)),
            name: Cow::Borrowed(&job.name),
            user: Cow::Borrowed(&job.owner.user),
            state: job.state,
            reason: match (job.state, &job.pending_reason) {
                (JobState::Pending, Some(why)) => Some(Cow::Borrowed(why.code())),
                (JobState::Pending, None) => {
                    job.reason.as_deref().map(|r| Cow::Borrowed(reason_code(r)))
                }
                _ => None,
            },
            start_time: job.start_time,
            end_time: job.end_time,
            time_limit: job.time_limit,
            resources: job.resources,
            nodes: job.node_count(),
            nodelist: if job.allocs.is_empty() {
                Cow::Borrowed("")
            } else {
                Cow::Owned(job.nodelist())
            },
            expected_start: job.expected_start,
            pull: if job.state == JobState::Starting {
                PullCounts::furthest_behind(pulls)
            } else {
                None
            },
            partition: Cow::Borrowed(
                (job.spec.as_ref())
                    .and_then(|s| s.partition.as_deref())
                    .unwrap_or(""),
            ),
        }
    }

    /// How long it has run by `now` (ms since the epoch), as [`JobRecord::elapsed_ms`].
    pub fn elapsed_ms(&self, now: u64) -> u64 {
        crate::job::elapsed_ms(self.start_time, self.end_time, now)
    }
}

/// Fields of a [`JobRow`] on the wire.
const FIELDS: usize = 17;

impl Serialize for JobRow<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut t = s.serialize_tuple(FIELDS)?;
        t.serialize_element(&self.id)?;
        t.serialize_element(&self.array)?;
        t.serialize_element(&*self.name)?;
        t.serialize_element(&*self.user)?;
        t.serialize_element(&self.state)?;
        t.serialize_element(&self.reason.as_deref())?;
        t.serialize_element(&self.start_time)?;
        t.serialize_element(&self.end_time)?;
        t.serialize_element(&self.time_limit)?;
        t.serialize_element(&self.resources.cpus)?;
        t.serialize_element(&self.resources.memory)?;
        t.serialize_element(&self.resources.gpus)?;
        t.serialize_element(&self.nodes)?;
        t.serialize_element(&*self.nodelist)?;
        t.serialize_element(&self.expected_start)?;
        t.serialize_element(
            &self
                .pull
                .map(|p| [p.layers_done, p.layers, p.bytes_done, p.bytes]),
        )?;
        t.serialize_element(&*self.partition)?;
        t.end()
    }
}

/// Text that borrows from the answer unless it had to be unescaped (serde's `Cow<str>` is
/// always owned).
struct Text<'a>(Cow<'a, str>);

impl<'de> Deserialize<'de> for Text<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Text<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Text<'de>, E> {
                Ok(Text(Cow::Borrowed(v)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Text<'de>, E> {
                Ok(Text(Cow::Owned(v.to_owned())))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<Text<'de>, E> {
                Ok(Text(Cow::Owned(v)))
            }
        }
        d.deserialize_str(V)
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for JobRow<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = JobRow<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                write!(f, "a job row: an array of {} fields", FIELDS)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<JobRow<'de>, A::Error> {
                let mut at = 0;
                macro_rules! field {
                    () => {{
                        at += 1;
                        seq.next_element()?
                            .ok_or_else(|| de::Error::invalid_length(at - 1, &self))?
                    }};
                }
                let id = field!();
                let array = field!();
                let name: Text = field!();
                let user: Text = field!();
                let state = field!();
                let reason: Option<Text> = field!();
                let start_time = field!();
                let end_time = field!();
                let time_limit = field!();
                let resources = Resources {
                    cpus: field!(),
                    memory: field!(),
                    gpus: field!(),
                };
                let nodes = field!();
                let nodelist: Text = field!();
                let expected_start = field!();
                let pull: Option<[u64; 4]> = field!();
                // Absent from a controller older than the field.
                let partition: Option<Text> = seq.next_element()?;
                // Fields a later controller adds at the end are skipped.
                while seq.next_element::<de::IgnoredAny>()?.is_some() {}
                Ok(JobRow {
                    id,
                    array,
                    name: name.0,
                    user: user.0,
                    state,
                    reason: reason.map(|r| r.0),
                    start_time,
                    end_time,
                    time_limit,
                    resources,
                    nodes,
                    nodelist: nodelist.0,
                    expected_start,
                    pull: pull.map(|[layers_done, layers, bytes_done, bytes]| PullCounts {
                        layers_done,
                        layers,
                        bytes_done,
                        bytes,
                    }),
                    partition: partition.map_or(Cow::Borrowed(""), |p| p.0),
                })
            }
        }
        d.deserialize_seq(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ROW: &str = r#"[9,[7,2],"a \"b\"\\ 日本","bob","STARTING",null,1000,null,60,2,512,1,2,"g[1-2]",null,[3,14,10,20]"#;

    #[test]
    fn rows_borrow_plain_text_and_unescape_the_rest() {
        let text = format!(r#"{ROW},"gpu"]"#);
        let row: JobRow = serde_json::from_str(&text).unwrap();
        assert!(matches!(row.name, Cow::Owned(_)) && row.name == "a \"b\"\\ 日本");
        assert!(matches!(row.user, Cow::Borrowed("bob")));
        assert!(matches!(row.partition, Cow::Borrowed("gpu")));
        assert_eq!(
            (row.array, row.elapsed_ms(4000), row.nodes),
            (Some((7, 2)), 3000, 2)
        );
        assert_eq!(
            row.pull.map(|p| p.counts()),
            Some("10 of 20 B, 3 of 14 layers".into())
        );
        assert_eq!(serde_json::to_string(&row).unwrap(), text);
    }

    #[test]
    fn fields_added_at_the_end_are_skipped_and_missing_ones_refused() {
        let text = format!(r#"{ROW},"gpu","new",{{"x":1}}]"#);
        let later: JobRow = serde_json::from_str(&text).unwrap();
        assert_eq!((later.id, &*later.partition), (9, "gpu"));
        // A controller older than the partition says none.
        let text = format!("{ROW}]");
        let older: JobRow = serde_json::from_str(&text).unwrap();
        assert_eq!((older.id, &*older.partition), (9, ""));
        let short = serde_json::from_str::<JobRow>(r#"[9,null,"a","bob","PENDING"]"#);
        assert!(short.unwrap_err().to_string().contains("invalid length 5"));
    }
}
