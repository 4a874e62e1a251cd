//! Dependencies that would wait on themselves. At submit none can (no job names one not yet
//! submitted), but `wharf update --dependency` can close a circle: 12 waits on 13 and 13 is
//! changed to wait on 12. Neither would ever start, and neither would ever be found
//! unsatisfiable, so the update is refused, as Slurm refuses a circular dependency.

use std::collections::BTreeSet;

use wharf_api::dependency::{DepJob, Dependency};
use wharf_api::JobId;

use super::super::Cluster;

impl Cluster {
    /// The job `dep` names through which `ours` (the jobs being updated) would wait on one of
    /// themselves, following the dependencies of active jobs; `None` when there is no circle.
    /// Ended jobs wait on nothing, so only active ones are followed.
    pub(in crate::cluster) fn circle(
        &self,
        ours: &BTreeSet<JobId>,
        dep: &Dependency,
    ) -> Option<DepJob> {
        let mut seen: BTreeSet<JobId> = BTreeSet::new();
        for named in dep.jobs() {
            let mut stack = self.named_active(named);
            while let Some(id) = stack.pop() {
                if ours.contains(&id) {
                    return Some(named);
                }
                if !seen.insert(id) {
                    continue;
                }
                let Some(job) = self.jobs.get(&id) else {
                    continue;
                };
                if let Some(next) = &job.dependency {
                    for n in next.jobs() {
                        stack.extend(self.named_active(n));
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
