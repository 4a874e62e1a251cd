//! Job arrays: one submit stores one record per task, all or none; the scheduler lets
//! at most the throttle's number of an array's tasks hold resources at once.

use wharf_api::array::{ArraySpec, ArrayTask};
use wharf_api::wire::ErrorKind;
use wharf_api::{JobId, JobRecord};
use wharf_core::cycle;
use wharf_core::{PendingReason, State as SchedState};

use super::{Cluster, Failure};

impl Cluster {
    /// The number of tasks, or a refusal when a task id is at or over `max_array_size`.
    pub(super) fn check_array(&self, array: &ArraySpec) -> Result<usize, Failure> {
        let max = self.forms.max_array_size;
        match array.tasks.last() {
            None => Err(Failure::new(ErrorKind::InvalidInput, "--array names no task")),
            Some(&last) if last >= max => Err(Failure::new(
                ErrorKind::InvalidInput,
                format!(
                    "--array task id {last} is over this cluster's limit: task ids run from 0 to {} \
                     ([limits] max_array_size = {max}); split the array or renumber its tasks",
                    max.saturating_sub(1)
                ),
            )),
            Some(_) => Ok(array.tasks.len()),
        }
    }

    /// Keeps each throttled array's pending tasks in `state` to what its throttle still
    /// allows (lowest task ids first, [`cycle::throttle_arrays`]); the others wait with
    /// `JobArrayTaskLimit`. Returns them.
    pub(super) fn apply_array_throttles(&mut self, state: &mut SchedState) -> Vec<JobId> {
        let tasks = self
            .jobs
            .values()
            .filter_map(|j| j.array.map(|a| (a, j.state.holds_resources())));
        let limited = cycle::throttle_arrays(&mut state.pending, tasks, |id| {
            self.jobs.get(&id).and_then(|j| j.array)
        });
        let words = PendingReason::JobArrayTaskLimit.to_string();
        for id in &limited {
            self.jobs.edit(*id, |rec| {
                rec.reason = Some(words.clone());
                rec.priority = None;
                rec.expected_start = None;
            });
        }
        limited
    }

    /// The job `id`, or with `task` the task of array `id`.
    pub fn resolve_task(&self, id: JobId, task: Option<u32>) -> Result<JobId, Failure> {
        let Some(task) = task else {
            return Ok(id);
        };
        let active = self
            .jobs
            .range(id..)
            .find(|j| j.array.is_some_and(|a| a.job_id == id && a.task_id == task));
        if let Some(j) = active {
            return Ok(j.id);
        }
        match self
            .store
            .array_task(id, task, self.forms.max_array_size.into())?
        {
            Some(j) => Ok(j.id),
            None => Err(Failure::new(
                ErrorKind::NotFound,
                format!("no job {id}_{task}"),
            )),
        }
    }
}

impl Cluster {
    /// Cancels every active task of array `array_id` in one transaction (`wharf cancel ID`
    /// with the array job's id, as `scancel`). `None` when `array_id` is no array. Returns the
    /// first task as the caller sees it and the nodes to wake.
    pub fn cancel_array(
        &mut self,
        caller: &super::Caller,
        array_id: JobId,
        now: u64,
    ) -> Result<Option<(JobRecord, Vec<String>)>, Failure> {
        let tasks: Vec<JobRecord> = self
            .jobs
            .range(array_id..)
            .filter(|j| j.array.is_some_and(|a| a.job_id == array_id))
            .cloned()
            .collect();
        if tasks.len() < 2 && tasks.first().is_none_or(|j| j.id != array_id) {
            // One task left (or none): the plain cancel says it as well.
            return Ok(None);
        }
        if let Some(j) = tasks.iter().find(|j| !caller.may_manage(j)) {
            return Err(super::not_yours(j.id));
        }
        let mut wake = Vec::new();
        let changed: Vec<JobRecord> = tasks
            .into_iter()
            .map(|mut job| {
                if job.state == wharf_api::JobState::Pending {
                    job.state = wharf_api::JobState::Cancelled;
                    job.end_time = Some(now);
                    job.reason = Some(format!("cancelled by {}", caller.owner.user));
                } else {
                    wake.extend(job.nodes().map(str::to_string));
                    job.cancel_requested = true;
                    job.reason = Some(format!(
                        "cancel requested by {}; stopping",
                        caller.owner.user
                    ));
                }
                job
            })
            .collect();
        let first = changed[0].clone();
        self.commit(changed)?;
        wake.sort();
        wake.dedup();
        Ok(Some((crate::visibility::view(caller, first), wake)))
    }
}

/// One record per task of `array`, copies of `first`; the store numbers them.
pub(super) fn task_records(first: JobRecord, array: &ArraySpec) -> Vec<JobRecord> {
    let shape = array.shape();
    array
        .tasks
        .iter()
        .map(|&task_id| {
            let task = ArrayTask {
                job_id: 0,
                task_id,
                throttle: array.throttle,
                shape,
            };
            let mut r = first.clone();
            r.array = Some(task);
            if let Some(s) = r.spec.as_mut() {
                s.array = Some(task);
            }
            r
        })
        .collect()
}

#[cfg(test)]
mod tests;
