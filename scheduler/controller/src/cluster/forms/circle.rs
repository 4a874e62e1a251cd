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
    /// Their owner.
    pub uid: u32,
    /// Their name, after the update.
    pub name: &'a str,
    /// Their dependency, after the update.
    pub dep: &'a Dependency,
}

/// For each (owner, name): its pending jobs' ids, lowest first; `ours` under their new name.
type Named = BTreeMap<(u32, String), BTreeSet<JobId>>;

impl Cluster {
    /// The job through which `ours` would wait on one of themselves, following the
    /// dependencies of pending jobs (the jobs they name, and for a `singleton` the pending
    /// job of its owner and name ahead of it, which it waits on); `None` when there is no
    /// circle. A job that runs or has ended waits on nothing, so only pending ones are
    /// followed. Each job, and each job or array a dependency names, is looked at once: the
    /// walk costs the pending jobs and their dependencies, not their paths.
    pub(in crate::cluster) fn circle(&self, ours: &Ours<'_>) -> Option<JobId> {
        let mut named: Option<Named> = None;
        let mut seen: BTreeSet<JobId> = BTreeSet::new();
        let mut expanded: BTreeSet<DepJob> = BTreeSet::new();
        // (the job on `ours`' side the path started from, the job reached)
        let mut stack: Vec<(JobId, JobId)> = Vec::new();
        let first = ours.ids.first().copied().unwrap_or_default();
        let mut waits_on = |dep: &Dependency,
                            (uid, name, id): (u32, &str, JobId),
                            expanded: &mut BTreeSet<DepJob>| {
            let mut next: Vec<JobId> = (dep.jobs().into_iter())
                .filter(|n| expanded.insert(*n))
                .flat_map(|n| self.named_active(n))
                .collect();
            if dep.singleton {
                let index = named.get_or_insert_with(|| self.pending_by_name(ours));
                let ahead = index
                    .get(&(uid, name.to_string()))
                    .and_then(|ids| ids.first());
                next.extend(ahead.filter(|&&a| a < id));
            }
            next
        };
        for id in waits_on(ours.dep, (ours.uid, ours.name, first), &mut expanded) {
            stack.push((id, id));
        }
        while let Some((root, id)) = stack.pop() {
            if ours.ids.contains(&id) {
                return Some(root);
            }
            if !seen.insert(id) {
                continue;
            }
            let Some(job) = self.jobs.get(&id).filter(|j| j.state == JobState::Pending) else {
                continue;
            };
            if let Some(dep) = &job.dependency {
                let who = (job.owner.uid, job.name.as_str(), id);
                stack.extend(
                    waits_on(dep, who, &mut expanded)
                        .into_iter()
                        .map(|n| (root, n)),
                );
            }
        }
        None
    }

    /// The pending jobs by owner and name, `ours` under their new name.
    fn pending_by_name(&self, ours: &Ours<'_>) -> Named {
        let mut named = Named::new();
        let pending = self.jobs.values().filter(|j| j.state == JobState::Pending);
        for j in pending {
            let name = if ours.ids.contains(&j.id) {
                ours.name
            } else {
                j.name.as_str()
            };
            let key = (j.owner.uid, name.to_string());
            named.entry(key).or_default().insert(j.id);
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
        let span = JobId::from(self.forms.max_array_size);
        let tasks: Vec<JobId> = (self.jobs.range(named.id..named.id.saturating_add(span)))
            .filter(|j| j.array.is_some_and(|a| a.job_id == named.id))
            .map(|j| j.id)
            .collect();
        if tasks.is_empty() {
            // A plain job (or an array whose tasks have all ended: nothing to follow).
            self.jobs.get(&named.id).map(|j| j.id).into_iter().collect()
        } else {
            tasks
        }
    }
}

/// What [`Cluster::circle`] is asked about `job`, as an update leaves it (with the other
/// jobs of `ids`, changed alike).
pub(in crate::cluster) fn ours<'a>(
    job: &'a JobRecord,
    ids: &'a BTreeSet<JobId>,
) -> Option<Ours<'a>> {
    Some(Ours {
        ids,
        uid: job.owner.uid,
        name: &job.name,
        dep: job.dependency.as_ref()?,
    })
}
