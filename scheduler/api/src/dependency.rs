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
//! ```
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

/// A dependency: conditions joined by AND (`,`) or OR (`?`), and perhaps `singleton`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Dependency {
    /// `(kind, job)` pairs in the order written.
    pub on: Vec<(DepKind, JobId)>,
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

impl Dependency {
    /// Every job id it names, each once, in order.
    pub fn jobs(&self) -> Vec<JobId> {
        let mut ids: Vec<JobId> = Vec::new();
        for (_, id) in &self.on {
            if !ids.contains(id) {
                ids.push(*id);
            }
        }
        ids
    }

    /// Decides the dependency. `state_of(id)` is the named job's state (`None`: no such job,
    /// which counts as ended long ago the way Slurm's purged jobs do: met for after and
    /// afterany, never for afterok and afternotok). `singleton` is whether the singleton part
    /// is met (`Some(id)`: waiting on that job).
    pub fn check(
        &self,
        state_of: impl Fn(JobId) -> Option<JobState>,
        singleton: Option<JobId>,
    ) -> Check {
        let mut results: Vec<Check> = self
            .on
            .iter()
            .map(|&(kind, id)| condition(kind, id, state_of(id)))
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

/// Parses `--dependency` (see the module documentation).
pub fn parse_dependency(text: &str) -> Result<Dependency, String> {
    let bad = |why: String| {
        format!(
            "--dependency: {why} in {text:?}; write e.g. afterok:12, after:12:13,afterany:14, \
             afterok:12?afternotok:13 or singleton"
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
            let id: JobId = id
                .trim()
                .parse()
                .ok()
                .filter(|&i| i > 0)
                .ok_or_else(|| bad(format!("{id:?} is not a job id")))?;
            dep.on.push((kind, id));
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
        ] {
            let d = parse_dependency(text).unwrap();
            assert_eq!(d.to_string(), text);
        }
        let d = parse_dependency("AFTEROK:5:6").unwrap();
        assert_eq!(d.on, vec![(DepKind::AfterOk, 5), (DepKind::AfterOk, 6)]);
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
    }

    #[test]
    fn conditions_follow_the_parents_state() {
        let check = |text: &str, states: &[(JobId, JobState)]| {
            parse_dependency(text).unwrap().check(
                |id| states.iter().find(|(i, _)| *i == id).map(|(_, s)| *s),
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
        assert_eq!(single.check(|_| None, Some(7)), Check::Waiting(7));
        assert_eq!(single.check(|_| None, None), Check::Met);
    }
}
