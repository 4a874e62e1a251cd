//! Job dependencies, as Slurm's `--dependency` writes them.
//!
//! ```text
//! after:12:13          start once 12 and 13 have started (or ended)
//! afterok:12           start once 12 has COMPLETED; never if it ends any other way
//! afternotok:12        start once 12 has ended in any way but COMPLETED
//! afterany:12          start once 12 has ended, however
//! singleton            start when no earlier job of mine with this name is left, and none
//!                      of them runs
//! afterok:12,after:13  all of them (`,`);   afterok:12?afternotok:12   any of them (`?`)
//! afterok:12_3         task 3 of array 12 only
//! ```
//!
//! An array's job id (the id of its first task) names the whole array, as in Slurm: after
//! once no task is pending, afterany once every task has ended, afterok once every task has
//! ended COMPLETED (never if all ended and one did not), afternotok once every task has ended
//! and one did not end COMPLETED (never if all did). `ARRAYID_TASK` names one task.
//!
//! [`Dependency::check`] decides from the other jobs' states; it is pure so the controller and
//! the simulator share it.

use serde::{Deserialize, Serialize};

use crate::job::{JobId, JobState};

/// Most job ids one dependency may name.
pub const MAX_DEPENDENCY_JOBS: usize = 1000;

/// One condition of a dependency.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DepKind {
    /// The job has started (or ended).
    After,
    /// The job has ended, however.
    AfterAny,
    /// The job has COMPLETED.
    AfterOk,
    /// The job has ended in any way but COMPLETED.
    AfterNotOk,
}

impl DepKind {
    fn word(self) -> &'static str {
        match self {
            DepKind::After => "after",
            DepKind::AfterAny => "afterany",
            DepKind::AfterOk => "afterok",
            DepKind::AfterNotOk => "afternotok",
        }
    }
}

/// What a condition names: a job (an array's job id: the whole array), or one task of an
/// array (`ARRAYID_TASK`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DepJob {
    /// The job id, or the array's job id.
    pub id: JobId,
    /// One task of array `id`.
    pub task: Option<u32>,
}

impl DepJob {
    /// A job by its id.
    pub fn job(id: JobId) -> DepJob {
        DepJob { id, task: None }
    }
}

impl From<JobId> for DepJob {
    fn from(id: JobId) -> DepJob {
        DepJob::job(id)
    }
}

impl std::fmt::Display for DepJob {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.task {
            None => write!(f, "{}", self.id),
            Some(t) => write!(f, "{}_{t}", self.id),
        }
    }
}

/// A dependency: conditions joined by AND (`,`) or OR (`?`), and perhaps `singleton`. Stored
/// and sent as its text, so records written before `ARRAYID_TASK` read as they were.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Dependency {
    /// `(kind, job)` pairs in the order written.
    pub on: Vec<(DepKind, DepJob)>,
    /// Also `singleton`.
    pub singleton: bool,
    /// Joined by `?`: any one condition is enough.
    pub any: bool,
}

/// What one job's state means for a condition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Check {
    /// Met: the job may start as far as this goes.
    Met,
    /// Not yet; waiting on this job.
    Waiting(JobId),
    /// Can never be met: this job ended the wrong way.
    Never(JobId, JobState),
}

/// What the caller found for a [`DepJob`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Found {
    /// No such job (or task): ended long ago, the way Slurm's purged jobs do.
    Missing,
    /// A job, or the one task named: its id and state.
    Job(JobId, JobState),
    /// An array named by its job id, its tasks summed up.
    Array(ArrayStates),
}

/// An array's tasks, summed up for [`Dependency::check`]: a task of each kind, if any.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ArrayStates {
    /// A pending task.
    pub pending: Option<JobId>,
    /// A task that has not ended (pending or holding resources).
    pub active: Option<JobId>,
    /// A task that ended any way but COMPLETED, and how.
    pub not_ok: Option<(JobId, JobState)>,
    /// A task that ended COMPLETED.
    pub ok: Option<JobId>,
}

impl ArrayStates {
    /// Counts one task in; the first of each kind is kept.
    pub fn add(&mut self, id: JobId, state: JobState) {
        if state == JobState::Pending {
            self.pending.get_or_insert(id);
        }
        if !state.is_terminal() {
            self.active.get_or_insert(id);
        } else if state == JobState::Completed {
            self.ok.get_or_insert(id);
        } else {
            self.not_ok.get_or_insert((id, state));
        }
    }

    /// Whether no task was counted.
    pub fn is_empty(&self) -> bool {
        self.active.is_none() && self.not_ok.is_none() && self.ok.is_none()
    }
}

impl Dependency {
    /// Every job (or task) it names, each once, in order.
    pub fn jobs(&self) -> Vec<DepJob> {
        let mut ids: Vec<DepJob> = Vec::new();
        for (_, id) in &self.on {
            if !ids.contains(id) {
                ids.push(*id);
            }
        }
        ids
    }

    /// Decides the dependency. `found(job)` is what the named job is ([`Found::Missing`]: no
    /// such job, which counts as ended long ago the way Slurm's purged jobs do: met for after
    /// and afterany, never for afterok and afternotok). `singleton` is whether the singleton
    /// part is met (`Some(id)`: waiting on that job).
    pub fn check(&self, found: impl Fn(DepJob) -> Found, singleton: Option<JobId>) -> Check {
        let mut results: Vec<Check> = self
            .on
            .iter()
            .map(|&(kind, job)| match found(job) {
                Found::Missing => condition(kind, job.id, None),
                Found::Job(id, state) => condition(kind, id, Some(state)),
                Found::Array(tasks) if tasks.is_empty() => condition(kind, job.id, None),
                Found::Array(tasks) => array_condition(kind, tasks),
            })
            .collect();
        if self.singleton {
            results.push(match singleton {
                Some(id) => Check::Waiting(id),
                None => Check::Met,
            });
        }
        let first = |want: fn(&Check) -> bool| results.iter().copied().find(want);
        let never = |c: &Check| matches!(c, Check::Never(..));
        let waiting = |c: &Check| matches!(c, Check::Waiting(_));
        if self.any {
            if results.contains(&Check::Met) || results.is_empty() {
                Check::Met
            } else {
                first(waiting)
                    .or_else(|| first(never))
                    .unwrap_or(Check::Met)
            }
        } else {
            first(never)
                .or_else(|| first(waiting))
                .unwrap_or(Check::Met)
        }
    }
}

fn condition(kind: DepKind, id: JobId, state: Option<JobState>) -> Check {
    let Some(state) = state else {
        return match kind {
            DepKind::After | DepKind::AfterAny => Check::Met,
            DepKind::AfterOk | DepKind::AfterNotOk => Check::Never(id, JobState::Cancelled),
        };
    };
    match kind {
        DepKind::After if state != JobState::Pending => Check::Met,
        _ if !state.is_terminal() => Check::Waiting(id),
        DepKind::After | DepKind::AfterAny => Check::Met,
        DepKind::AfterOk if state == JobState::Completed => Check::Met,
        DepKind::AfterNotOk if state != JobState::Completed => Check::Met,
        _ => Check::Never(id, state),
    }
}

/// A condition on a whole array, as Slurm decides it: after once no task is pending; the
/// others once every task has ended, then by how they ended.
fn array_condition(kind: DepKind, tasks: ArrayStates) -> Check {
    if kind == DepKind::After {
        return tasks.pending.map_or(Check::Met, Check::Waiting);
    }
    if let Some(id) = tasks.active {
        return Check::Waiting(id);
    }
    match (kind, tasks.not_ok, tasks.ok) {
        (DepKind::AfterOk, Some((id, state)), _) => Check::Never(id, state),
        (DepKind::AfterNotOk, None, Some(id)) => Check::Never(id, JobState::Completed),
        _ => Check::Met,
    }
}

/// `ID` or `ARRAYID_TASK`.
fn dep_job(text: &str) -> Result<DepJob, String> {
    let id = |t: &str| t.parse::<JobId>().ok().filter(|&i| i > 0);
    let Some((array, task)) = text.split_once('_') else {
        return id(text)
            .map(DepJob::job)
            .ok_or_else(|| format!("{text:?} is not a job id"));
    };
    let Some(array) = id(array) else {
        return Err(format!(
            "{text:?} is not a job id ({array:?} before the `_` is no array job id)"
        ));
    };
    let task = Some(task)
        .filter(|t| !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|t| t.parse::<u32>().ok())
        .ok_or_else(|| {
            format!(
                "{text:?} is not an array task: {task:?} after the `_` is no task id (0 to {})",
                u32::MAX
            )
        })?;
    Ok(DepJob {
        id: array,
        task: Some(task),
    })
}

/// Parses `--dependency` (see the module documentation).
pub fn parse_dependency(text: &str) -> Result<Dependency, String> {
    let bad = |why: String| {
        format!(
            "--dependency: {why} in {text:?}; write e.g. afterok:12, after:12:13,afterany:14, \
             afterok:12?afternotok:13, afterok:12_3 (task 3 of array 12) or singleton"
        )
    };
    let t = text.trim();
    if t.is_empty() {
        return Err(bad("nothing given".into()));
    }
    let (and, or) = (t.contains(','), t.contains('?'));
    if and && or {
        return Err(bad("`,` (all) and `?` (any) cannot be mixed".into()));
    }
    let mut dep = Dependency {
        on: Vec::new(),
        singleton: false,
        any: or,
    };
    for part in t.split([',', '?']) {
        let mut words = part.trim().split(':');
        let word = words.next().unwrap_or("").to_ascii_lowercase();
        let kind = match word.as_str() {
            "singleton" => {
                if words.next().is_some() {
                    return Err(bad("singleton takes no job ids".into()));
                }
                dep.singleton = true;
                continue;
            }
            "after" => DepKind::After,
            "afterany" => DepKind::AfterAny,
            "afterok" => DepKind::AfterOk,
            "afternotok" => DepKind::AfterNotOk,
            "aftercorr" | "afterburstbuffer" => {
                return Err(bad(format!("{word} is not supported")))
            }
            other => return Err(bad(format!("unknown kind {other:?}"))),
        };
        let mut n = 0;
        for id in words {
            dep.on.push((kind, dep_job(id.trim()).map_err(bad)?));
            n += 1;
        }
        if n == 0 {
            return Err(bad(format!("{word} needs at least one job id ({word}:ID)")));
        }
        if dep.on.len() > MAX_DEPENDENCY_JOBS {
            return Err(bad(format!("more than {MAX_DEPENDENCY_JOBS} job ids")));
        }
    }
    // One condition is the same under either join.
    dep.any = or && dep.on.len() + usize::from(dep.singleton) > 1;
    Ok(dep)
}

impl TryFrom<String> for Dependency {
    type Error = String;
    fn try_from(text: String) -> Result<Dependency, String> {
        parse_dependency(&text)
    }
}

impl From<Dependency> for String {
    fn from(d: Dependency) -> String {
        d.to_string()
    }
}

impl std::fmt::Display for Dependency {
    /// Slurm's form: each kind once with its ids, joined by `,` or `?`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut parts: Vec<String> = Vec::new();
        for &(kind, id) in &self.on {
            match parts.last_mut() {
                // `afterok:1:2` means both: ids share a kind only under `,`.
                Some(last) if !self.any && last.starts_with(&format!("{}:", kind.word())) => {
                    last.push_str(&format!(":{id}"))
                }
                _ => parts.push(format!("{}:{id}", kind.word())),
            }
        }
        if self.singleton {
            parts.push("singleton".into());
        }
        f.write_str(&parts.join(if self.any { "?" } else { "," }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use JobState::*;

    #[test]
    fn slurm_forms_parse_and_print_back() {
        for text in [
            "afterok:12",
            "after:12:13,afterany:14",
            "afterok:12?afternotok:13",
            "singleton",
            "afterok:1,singleton",
            "afterok:12_3",
            "afterany:12_0:12:13_4294967295,after:7",
        ] {
            let d = parse_dependency(text).unwrap();
            assert_eq!(d.to_string(), text);
        }
        let d = parse_dependency("AFTEROK:5:6").unwrap();
        assert_eq!(
            d.on,
            vec![(DepKind::AfterOk, 5.into()), (DepKind::AfterOk, 6.into())]
        );
        let d = parse_dependency("afterok:12_3:12").unwrap();
        let task = DepJob {
            id: 12,
            task: Some(3),
        };
        assert_eq!(d.jobs(), vec![task, DepJob::job(12)]);
        for bad in [
            "",
            "afterok",
            "afterok:",
            "afterok:x",
            "afterok:0",
            "before:1",
            "afterok:1,afterany:2?after:3",
            "singleton:1",
            "aftercorr:1",
        ] {
            let e = parse_dependency(bad).unwrap_err();
            assert!(e.starts_with("--dependency:"), "{bad}: {e}");
        }
        // A task id that is no number, or too large, is named as the problem.
        for (bad, says) in [
            ("afterok:12_x", "\"x\" after the `_` is no task id"),
            ("afterok:12_", "\"\" after the `_` is no task id"),
            ("afterok:12_-1", "\"-1\" after the `_` is no task id"),
            ("afterok:12_+1", "\"+1\" after the `_` is no task id"),
            (
                "afterok:12_99999999999",
                "\"99999999999\" after the `_` is no task id",
            ),
            ("afterok:12_3_4", "\"3_4\" after the `_` is no task id"),
            ("afterok:_3", "\"\" before the `_` is no array job id"),
            ("afterok:0_3", "\"0\" before the `_` is no array job id"),
        ] {
            let e = parse_dependency(bad).unwrap_err();
            assert!(
                e.starts_with("--dependency:") && e.contains(says),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn conditions_follow_the_parents_state() {
        let check = |text: &str, states: &[(JobId, JobState)]| {
            parse_dependency(text).unwrap().check(
                |job| {
                    states
                        .iter()
                        .find(|(i, _)| *i == job.id)
                        .map_or(Found::Missing, |&(i, s)| Found::Job(i, s))
                },
                None,
            )
        };
        assert_eq!(check("afterok:1", &[(1, Running)]), Check::Waiting(1));
        assert_eq!(check("afterok:1", &[(1, Completed)]), Check::Met);
        assert_eq!(check("afterok:1", &[(1, Failed)]), Check::Never(1, Failed));
        assert_eq!(check("afternotok:1", &[(1, Timeout)]), Check::Met);
        assert_eq!(
            check("afternotok:1", &[(1, Completed)]),
            Check::Never(1, Completed)
        );
        assert_eq!(check("after:1", &[(1, Pending)]), Check::Waiting(1));
        assert_eq!(check("after:1", &[(1, Running)]), Check::Met);
        assert_eq!(check("afterany:1", &[(1, Running)]), Check::Waiting(1));
        assert_eq!(check("afterany:1", &[(1, Cancelled)]), Check::Met);
        // All of them: a never wins over a wait; any of them: one met is enough.
        let st = [(1, Failed), (2, Running), (3, Completed)];
        assert_eq!(check("afterok:2,afterok:1", &st), Check::Never(1, Failed));
        assert_eq!(check("afterok:1?afterok:2", &st), Check::Waiting(2));
        assert_eq!(check("afterok:1?afterok:3", &st), Check::Met);
        assert_eq!(check("afterok:1?afterok:1", &st), Check::Never(1, Failed));
        let single = parse_dependency("singleton").unwrap();
        assert_eq!(single.check(|_| Found::Missing, Some(7)), Check::Waiting(7));
        assert_eq!(single.check(|_| Found::Missing, None), Check::Met);
    }

    #[test]
    fn an_array_is_decided_over_all_its_tasks_as_slurm_does() {
        // Array 10 is tasks 10, 11 and 12 in `states`; array 20 has no task left.
        let check = |text: &str, states: &[JobState]| {
            let mut tasks = ArrayStates::default();
            for (k, s) in states.iter().enumerate() {
                tasks.add(10 + k as JobId, *s);
            }
            parse_dependency(text).unwrap().check(
                |job| match (job.id, job.task) {
                    (10, None) => Found::Array(tasks),
                    (10, Some(t)) => states
                        .get(t as usize)
                        .map_or(Found::Missing, |&s| Found::Job(10 + JobId::from(t), s)),
                    _ => Found::Array(ArrayStates::default()),
                },
                None,
            )
        };
        let all_ok = [Completed, Completed, Completed];
        let one_runs = [Completed, Running, Completed];
        let one_failed = [Failed, Running, Completed];
        let ended_one_failed = [Completed, Timeout, Completed];
        assert_eq!(check("afterok:10", &all_ok), Check::Met);
        assert_eq!(check("afterok:10", &one_runs), Check::Waiting(11));
        // Slurm waits for every task before it calls afterok never met.
        assert_eq!(check("afterok:10", &one_failed), Check::Waiting(11));
        assert_eq!(
            check("afterok:10", &ended_one_failed),
            Check::Never(11, Timeout)
        );
        assert_eq!(check("afternotok:10", &one_failed), Check::Waiting(11));
        assert_eq!(check("afternotok:10", &ended_one_failed), Check::Met);
        assert_eq!(check("afternotok:10", &all_ok), Check::Never(10, Completed));
        assert_eq!(check("afterany:10", &one_runs), Check::Waiting(11));
        assert_eq!(check("afterany:10", &ended_one_failed), Check::Met);
        assert_eq!(check("after:10", &[Running, Pending]), Check::Waiting(11));
        assert_eq!(check("after:10", &[Running, Completed]), Check::Met);
        // One task: only its state counts.
        assert_eq!(check("afterok:10_2", &one_failed), Check::Met);
        assert_eq!(check("afterok:10_0", &one_failed), Check::Never(10, Failed));
        assert_eq!(check("afterok:10_1", &one_failed), Check::Waiting(11));
        // An array with no task left is a job long gone.
        assert_eq!(check("afterany:20", &[]), Check::Met);
        assert_eq!(check("afterok:20", &[]), Check::Never(20, Cancelled));
        assert_eq!(check("afterok:10_7", &all_ok), Check::Never(10, Cancelled));
    }
}
