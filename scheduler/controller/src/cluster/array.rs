//! Job arrays: one submit stores one record per task, all or none; the scheduler lets
//! at most the throttle's number of an array's tasks hold resources at once.

use wharf_api::array::{ArraySpec, ArrayTask};
use wharf_api::wire::ErrorKind;
use wharf_api::{JobId, JobRecord, JobState};
use wharf_core::cycle;
use wharf_core::{PendingReason, State as SchedState};

use super::{forms, requeue, Cluster, Failure};

/// Most bytes one array's task records may take together: each task stores a copy of the
/// job, so a job of the largest size a request may carry times thousands of tasks would
/// otherwise be gigabytes from one submit.
pub const MAX_ARRAY_BYTES: usize = 256 << 20;

impl Cluster {
    /// The number of tasks, or a refusal when a task id is at or over `max_array_size`, or
    /// when the tasks' copies of a job of `spec_bytes` would take over [`MAX_ARRAY_BYTES`].
    pub(super) fn check_array(
        &self,
        array: &ArraySpec,
        spec_bytes: usize,
    ) -> Result<usize, Failure> {
        let max = self.forms.max_array_size;
        let tasks = array.tasks.len();
        if tasks.saturating_mul(spec_bytes) > MAX_ARRAY_BYTES {
            return Err(Failure::new(
                ErrorKind::InvalidInput,
                format!(
                    "--array of {tasks} tasks would store {} MiB, a copy of this {} KiB job for \
                     each; the limit is {} MiB: make the job smaller (its environment, command \
                     or mounts) or split the array",
                    tasks.saturating_mul(spec_bytes) >> 20,
                    spec_bytes >> 10,
                    MAX_ARRAY_BYTES >> 20
                ),
            ));
        }
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
    pub(super) fn apply_array_throttles(&mut self, state: &mut SchedState, now: u64) -> Vec<JobId> {
        let tasks = self
            .jobs
            .values()
            .filter_map(|j| j.array.map(|a| (a, j.state.holds_resources())));
        let limited = cycle::throttle_arrays(
            &mut state.pending,
            tasks,
            |id| self.jobs.get(&id).and_then(|j| j.array),
            now,
        );
        for id in &limited {
            self.hold_back(*id, PendingReason::JobArrayTaskLimit);
        }
        limited
    }

    /// The job `id`, or with `task` the task of array `id`.
    pub fn resolve_task(&self, id: JobId, task: Option<u32>) -> Result<JobId, Failure> {
        match task {
            None => Ok(id),
            Some(task) => self.find_task(id, task).map(|(job, _)| job),
        }
    }

    /// An action on `ID` or `ID_TASK` as a command names a job: an array's job id alone is the
    /// whole array (`whole` answers `None` when `id` is none), anything else the one job it
    /// resolves to (`one`).
    pub fn on_target<T>(
        &mut self,
        id: JobId,
        task: Option<u32>,
        whole: impl FnOnce(&mut Self) -> Result<Option<T>, Failure>,
        one: impl FnOnce(&mut Self, JobId) -> Result<T, Failure>,
    ) -> Result<T, Failure> {
        if task.is_none() {
            if let Some(done) = whole(self)? {
                return Ok(done);
            }
        }
        let job = self.resolve_task(id, task)?;
        one(self, job)
    }

    /// Task `task` of array `id`: its job id and state, from memory while it is active, else
    /// from the store.
    pub(super) fn find_task(&self, id: JobId, task: u32) -> Result<(JobId, JobState), Failure> {
        let span = JobId::from(self.forms.max_array_size);
        let is_it = |j: &JobRecord| j.array.is_some_and(|a| a.job_id == id && a.task_id == task);
        // The store numbers an array's tasks in order from its id, so in an evenly spaced
        // array (the usual `0-99`, `0-15:4`) task `t` is job `id + (t - min) / step`: looked
        // up, not searched for among up to `max_array_size` jobs.
        let shape = (self.jobs.range(id..id.saturating_add(span)).next())
            .and_then(|j| j.array.filter(|a| a.job_id == id))
            .map(|a| a.shape);
        if let Some(place) = shape.and_then(|s| s.place(task)) {
            let at = id.saturating_add(JobId::from(place));
            if let Some(j) = self.jobs.get(&at).filter(|j| is_it(j)) {
                return Ok((j.id, j.state));
            }
        }
        let active = self
            .jobs
            .range(id..id.saturating_add(span))
            .find(|j| is_it(j));
        if let Some(j) = active {
            return Ok((j.id, j.state));
        }
        match self.store.array_task(id, task)? {
            Some(j) => Ok((j.id, j.state)),
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
        let Some(tasks) = self.active_tasks(caller, array_id)? else {
            return Ok(None);
        };
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
        let first = self.commit_tasks(caller, changed)?;
        wake.sort();
        wake.dedup();
        Ok(Some((first, wake)))
    }
}

/// `wharf hold|release|update|requeue ARRAYID`, as `scontrol` does them with an array's job
/// id: on every active task of the array that the command applies to, in one transaction.
/// Each returns `None` when `array_id` names no array with an active task (the caller then
/// acts on the job `array_id` alone), else the first task changed as the caller sees it. A
/// refusal for any task it applies to changes none.
impl Cluster {
    /// The active tasks of array `array_id`, lowest id first; `None` when there are none.
    pub(super) fn active_tasks(
        &self,
        caller: &super::Caller,
        array_id: JobId,
    ) -> Result<Option<Vec<JobRecord>>, Failure> {
        let tasks: Vec<JobRecord> = self.array_tasks(array_id).cloned().collect();
        if tasks.is_empty() {
            return Ok(None);
        }
        if let Some(j) = tasks.iter().find(|j| !caller.may_manage(j)) {
            return Err(super::not_yours(j.id));
        }
        Ok(Some(tasks))
    }

    /// The active tasks of array `array_id`, lowest id first (none when it is no array). An
    /// array's tasks hold consecutive ids from its own (ended ones gone from memory): the
    /// first job past them ends the look, so a job that is no array costs one.
    pub(super) fn array_tasks(&self, array_id: JobId) -> impl Iterator<Item = &JobRecord> + '_ {
        let span = JobId::from(self.forms.max_array_size);
        (self.jobs.range(array_id..array_id.saturating_add(span)))
            .take_while(move |j| j.array.is_some_and(|a| a.job_id == array_id))
    }

    /// The nodes the active tasks of array `array_id` hold (none when it is no array): to be
    /// told at once of what changed for them.
    pub fn array_nodes(&self, array_id: JobId) -> Vec<String> {
        let mut nodes: Vec<String> = (self.array_tasks(array_id))
            .flat_map(|j| j.nodes().map(str::to_string))
            .collect();
        nodes.sort();
        nodes.dedup();
        nodes
    }

    /// The pending tasks of array `array_id` (see [`Cluster::active_tasks`]), or a refusal
    /// when none is pending.
    fn pending_tasks(
        &self,
        caller: &super::Caller,
        array_id: JobId,
        what: &str,
    ) -> Result<Option<Vec<JobRecord>>, Failure> {
        let Some(tasks) = self.active_tasks(caller, array_id)? else {
            return Ok(None);
        };
        let pending: Vec<JobRecord> = tasks
            .into_iter()
            .filter(|j| j.state == JobState::Pending)
            .collect();
        if pending.is_empty() {
            return Err(Failure::new(
                ErrorKind::Conflict,
                format!(
                    "array job {array_id} has no pending task; only pending jobs can be {what}"
                ),
            ));
        }
        Ok(Some(pending))
    }

    /// Commits `changed` and returns the first as `caller` sees it.
    pub(super) fn commit_tasks(
        &mut self,
        caller: &super::Caller,
        changed: Vec<JobRecord>,
    ) -> Result<JobRecord, Failure> {
        let first = changed[0].clone();
        self.commit(changed)?;
        Ok(crate::visibility::view(caller, first))
    }

    /// Holds every pending task of array `array_id`.
    pub fn hold_array(
        &mut self,
        caller: &super::Caller,
        array_id: JobId,
    ) -> Result<Option<JobRecord>, Failure> {
        let Some(tasks) = self.pending_tasks(caller, array_id, "held")? else {
            return Ok(None);
        };
        let changed = tasks.into_iter().map(|j| forms::held(caller, j)).collect();
        self.commit_tasks(caller, changed).map(Some)
    }

    /// Releases every held task of array `array_id`; none if an admin holds one of them and
    /// the caller is no admin.
    pub fn release_array(
        &mut self,
        caller: &super::Caller,
        array_id: JobId,
    ) -> Result<Option<JobRecord>, Failure> {
        let Some(tasks) = self.pending_tasks(caller, array_id, "released")? else {
            return Ok(None);
        };
        let held: Vec<JobRecord> = tasks.into_iter().filter(|j| j.hold.is_some()).collect();
        if held.is_empty() {
            return Err(Failure::new(
                ErrorKind::Conflict,
                format!("array job {array_id} has no held task"),
            ));
        }
        let changed = held
            .into_iter()
            .map(|j| forms::released(caller, j))
            .collect::<Result<Vec<_>, _>>()?;
        self.commit_tasks(caller, changed).map(Some)
    }

    /// Changes every pending task of array `array_id` as [`Cluster::update`] does one job.
    pub fn update_array(
        &mut self,
        caller: &super::Caller,
        array_id: JobId,
        req: &wharf_api::wire::UpdateRequest,
        now: u64,
    ) -> Result<Option<JobRecord>, Failure> {
        let Some(active) = self.active_tasks(caller, array_id)? else {
            return Ok(None);
        };
        // A change of the time limit alone reaches the running tasks too, as Slurm's
        // `scontrol update JobId=ARRAY TimeLimit=` does (a stopping one keeps its own).
        let (tasks, running): (Vec<JobRecord>, Vec<JobRecord>) = active
            .into_iter()
            .partition(|j| j.state == JobState::Pending);
        let running: Vec<JobRecord> = (running.into_iter())
            .filter(|j| req.only_time() && !j.cancel_requested && j.stop.is_none())
            .collect();
        if tasks.is_empty() && running.is_empty() {
            let what = if req.only_time() {
                "no pending or running task to update"
            } else {
                "no pending task; only pending jobs can be updated (a running one's time limit \
                 alone)"
            };
            return Err(Failure::new(
                ErrorKind::Conflict,
                format!("array job {array_id} has {what}"),
            ));
        }
        let mut changed = Vec::with_capacity(tasks.len() + running.len());
        let mut moved = Vec::new();
        // The caps count every task as changed, once for the whole array: as if it had been
        // submitted again as it will be.
        let batch = super::forms::Batch {
            ids: tasks.iter().map(|j| j.id).collect(),
        };
        for job in tasks {
            let (job, away) = self.updated(caller, job, req, now, &batch)?;
            if away {
                moved.push(job.id);
            }
            changed.push(job);
        }
        self.check_batch_caps(&batch, &changed)?;
        for job in &running {
            changed.push(self.limit_changed(caller, job, req)?);
        }
        changed.sort_by_key(|j| j.id);
        let first = self.commit_tasks(caller, changed)?;
        for id in moved {
            self.reserved.remove(&id);
        }
        Ok(Some(first))
    }

    /// Stops every running task of array `array_id` to put it back in the queue (pending
    /// tasks are in it already; tasks being stopped are left so). Returns the nodes to wake.
    pub fn requeue_array(
        &mut self,
        caller: &super::Caller,
        array_id: JobId,
    ) -> Result<Option<(JobRecord, Vec<String>)>, Failure> {
        let Some(tasks) = self.active_tasks(caller, array_id)? else {
            return Ok(None);
        };
        let running: Vec<&JobRecord> = tasks
            .iter()
            .filter(|j| j.state != JobState::Pending && !j.cancel_requested && j.stop.is_none())
            .collect();
        if running.is_empty() {
            return Err(Failure::new(
                ErrorKind::Conflict,
                format!(
                    "array job {array_id} has no running task to requeue (pending tasks are in \
                     the queue already and were left as they are)"
                ),
            ));
        }
        let mut changed = Vec::with_capacity(running.len());
        let mut wake = Vec::new();
        for job in running {
            let (job, nodes) = requeue::to_requeue(caller, job)?;
            wake.extend(nodes);
            changed.push(job);
        }
        wake.sort();
        wake.dedup();
        Ok(Some((self.commit_tasks(caller, changed)?, wake)))
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
