//! Dependencies that would wait on themselves. At submit none can (no job names one not yet
//! submitted), but `wharf update --dependency` can close a circle: 12 waits on 13 and 13 is
//! changed to wait on 12. Neither would ever start, and neither would ever be found
//! unsatisfiable, so the update is refused, as Slurm refuses a circular dependency. As in
//! Slurm, a circle through one side of an any-of (`?`) dependency is refused too.

use std::collections::BTreeSet;

use wharf_api::dependency::{DepJob, Dependency};
use wharf_api::{JobId, JobState};

use super::super::Cluster;

impl Cluster {
    /// The job `dep` names through which `ours` (the jobs being updated) would wait on one of
    /// themselves, following the dependencies of pending jobs; `None` when there is no circle.
    /// A job that runs or has ended waits on nothing, so only pending ones are followed. Each
    /// job, and each job or array a dependency names, is looked at once: the walk costs the
    /// pending jobs and their dependencies, not their paths.
    pub(in crate::cluster) fn circle(
        &self,
        ours: &BTreeSet<JobId>,
        dep: &Dependency,
    ) -> Option<DepJob> {
        let mut seen: BTreeSet<JobId> = BTreeSet::new();
        let mut expanded: BTreeSet<DepJob> = BTreeSet::new();
        for named in dep.jobs() {
            let mut stack = vec![named];
            while let Some(next) = stack.pop() {
                if !expanded.insert(next) {
                    continue;
                }
                for id in self.named_active(next) {
                    if ours.contains(&id) {
                        return Some(named);
                    }
                    if !seen.insert(id) {
                        continue;
                    }
                    let pending = self.jobs.get(&id).filter(|j| j.state == JobState::Pending);
                    if let Some(d) = pending.and_then(|j| j.dependency.as_ref()) {
                        stack.extend(d.jobs());
                    }
                }
            }
        }
        None
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
