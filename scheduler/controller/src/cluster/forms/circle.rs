//! Dependencies that would wait on themselves. At submit none can (no job names one not yet
//! submitted), but `wharf update` can close a circle: 12 waits on 13 and 13 is changed to
//! wait on 12; or a rename puts a job ahead of a `singleton` job of the new name that it
//! waits on. None of them would ever start, and none would ever be found unsatisfiable, so
//! the update is refused, as Slurm refuses a circular dependency. As in Slurm, a circle
//! through one side of an any-of (`?`) dependency is refused too.

use std::collections::{BTreeMap, BTreeSet};

use wharf_api::dependency::{DepJob, Dependency};
use wharf_api::{JobId, JobRecord, JobState};

use super::super::Cluster;

/// The jobs an update changes (one job, or an array's pending tasks), as they will be.
pub(in crate::cluster) struct Ours<'a> {
    pub ids: &'a BTreeSet<JobId>,
    /// Their name, after the update.
    pub name: &'a str,
    /// Their dependency after the update, when the update gives one (`Some(None)`: cleared);
    /// `None`: each keeps its own.
    pub dep: Option<Option<&'a Dependency>>,
}

/// For each (owner, name): its pending jobs' ids, lowest first, each with whether it is a
/// singleton; `ours` under their new name.
type Named = BTreeMap<(u32, String), BTreeMap<JobId, bool>>;

/// Where a depth-first walk stands with a job.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mark {
    /// On the path being walked.
    OnPath,
    /// Walked, and no circle through it.
    Done,
}

/// What the walk works out once: the pending jobs by name, and the jobs each named job
/// stands for.
#[derive(Default)]
struct Memo {
    named: Option<Named>,
    expanded: BTreeMap<DepJob, Vec<JobId>>,
}

impl Cluster {
    /// A job on a circle of waits that passes through one of `ours` (as the update leaves
    /// them), the one just after it: `None` when there is none. A job waits on the jobs its
    /// dependency names and, for a `singleton`, on the pending jobs of its owner and name
    /// ahead of it; a job that runs or has ended waits on nothing. One depth-first walk from
    /// all of `ours`: it costs the pending jobs and their dependencies, each looked at once.
    pub(in crate::cluster) fn circle(&self, ours: &Ours<'_>) -> Option<JobId> {
        let mut memo = Memo::default();
        let mut mark: BTreeMap<JobId, Mark> = BTreeMap::new();
        for &start in ours.ids {
            if mark.contains_key(&start) {
                continue;
            }
            mark.insert(start, Mark::OnPath);
            let mut path: Vec<(JobId, Vec<JobId>, usize)> =
                vec![(start, self.waits_on(start, ours, &mut memo), 0)];
            while let Some((id, next, k)) = path.last_mut() {
                let Some(&n) = next.get(*k) else {
                    mark.insert(*id, Mark::Done);
                    path.pop();
                    continue;
                };
                *k += 1;
                match mark.get(&n) {
                    Some(Mark::Done) => {}
                    Some(Mark::OnPath) => {
                        let from = path.iter().position(|(j, ..)| *j == n).unwrap_or(0);
                        let circle: Vec<JobId> = path[from..].iter().map(|(j, ..)| *j).collect();
                        if let Some(i) = circle.iter().position(|j| ours.ids.contains(j)) {
                            return Some(circle.get(i + 1).copied().unwrap_or(n));
                        }
                    }
                    None => {
                        mark.insert(n, Mark::OnPath);
                        let after = self.waits_on(n, ours, &mut memo);
                        path.push((n, after, 0));
                    }
                }
            }
        }
        None
    }

    /// The active jobs job `id` waits on, as the update leaves `ours`.
    fn waits_on(&self, id: JobId, ours: &Ours<'_>, memo: &mut Memo) -> Vec<JobId> {
        let Some(job) = self.jobs.get(&id) else {
            return vec![];
        };
        let (dep, name) = if ours.ids.contains(&id) {
            (ours.dep.unwrap_or(job.dependency.as_ref()), ours.name)
        } else if job.state == JobState::Pending {
            (job.dependency.as_ref(), job.name.as_str())
        } else {
            return vec![];
        };
        let Some(dep) = dep else {
            return vec![];
        };
        let mut next: Vec<JobId> = Vec::new();
        for n in dep.jobs() {
            let ids = memo
                .expanded
                .entry(n)
                .or_insert_with(|| self.named_active(n));
            next.extend(ids.iter());
        }
        if dep.singleton {
            // It starts only once none of its owner's pending jobs of its name ahead of it is
            // left: it waits on each, down to the nearest singleton among them, which waits
            // on those ahead of it in turn (so the edges stay as many as the jobs).
            let index = memo.named.get_or_insert_with(|| self.pending_by_name(ours));
            let key = (job.owner.uid, name.to_string());
            for (&ahead, &singleton) in index
                .get(&key)
                .into_iter()
                .flat_map(|g| g.range(..id).rev())
            {
                next.push(ahead);
                if singleton {
                    break;
                }
            }
        }
        next
    }

    /// The pending jobs by owner and name, `ours` under their new name, each with whether it
    /// is a singleton (`ours` as the update leaves them).
    fn pending_by_name(&self, ours: &Ours<'_>) -> Named {
        let mut named = Named::new();
        let pending = self.jobs.values().filter(|j| j.state == JobState::Pending);
        for j in pending {
            let (name, dep) = if ours.ids.contains(&j.id) {
                (ours.name, ours.dep.unwrap_or(j.dependency.as_ref()))
            } else {
                (j.name.as_str(), j.dependency.as_ref())
            };
            let singleton = dep.is_some_and(|d| d.singleton);
            let key = (j.owner.uid, name.to_string());
            named.entry(key).or_default().insert(j.id, singleton);
        }
        named
    }

    /// The active jobs `named` stands for: one task, one job, or every active task of the
    /// array whose job id it is.
    fn named_active(&self, named: DepJob) -> Vec<JobId> {
        if named.task.is_some() {
            return self
                .resolve_task(named.id, named.task)
                .into_iter()
                .filter(|id| self.jobs.get(id).is_some())
                .collect();
        }
        let tasks: Vec<JobId> = self.array_tasks(named.id).map(|j| j.id).collect();
        if tasks.is_empty() {
            // A plain job (or an array whose tasks have all ended: nothing to follow).
            self.jobs.get(&named.id).map(|j| j.id).into_iter().collect()
        } else {
            tasks
        }
    }
}

/// What [`Cluster::circle`] is asked about the jobs of `ids` (`job`, as the update leaves
/// it, and the array tasks changed with it): `new_dep` when the update gives a dependency.
pub(in crate::cluster) fn ours<'a>(
    job: &'a JobRecord,
    ids: &'a BTreeSet<JobId>,
    new_dep: bool,
) -> Ours<'a> {
    Ours {
        ids,
        name: &job.name,
        dep: new_dep.then_some(job.dependency.as_ref()),
    }
}
