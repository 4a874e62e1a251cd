//! Requeue: a running job stopped by a preemption or by `wharf requeue` goes back to the
//! queue with its id, submit time and one more restart; or, preempted in cancel mode (or
//! submitted with `--no-requeue`), ends PREEMPTED.

use wharf_api::wire::ErrorKind;
use wharf_api::{JobId, JobRecord, JobState, Stop};

use super::{not_yours, Caller, Cluster, Failure};
use crate::visibility::view;

impl Cluster {
    /// Stops a running job to put it back in the queue. Returns the job as the caller sees
    /// it and its node, to wake. A pending job is left as it is, with an error that says so.
    pub fn requeue(
        &mut self,
        caller: &Caller,
        id: JobId,
    ) -> Result<(JobRecord, Option<String>), Failure> {
        let Some(job) = self.jobs.get(&id) else {
            return match self.store.job(id)? {
                Some(j) if caller.may_manage(&j) => Err(Failure::new(
                    ErrorKind::Conflict,
                    format!(
                        "job {id} has already ended ({}); only a running job can be requeued",
                        j.state
                    ),
                )),
                Some(_) => Err(not_yours(id)),
                None => Err(Failure::new(ErrorKind::NotFound, format!("no job {id}"))),
            };
        };
        if !caller.may_manage(job) {
            return Err(not_yours(id));
        }
        let refused = |why: String| Err(Failure::new(ErrorKind::Conflict, why));
        if job.state == JobState::Pending {
            return refused(format!(
                "job {id} is pending: it is in the queue already and was left as it is; only a \
                 running job can be requeued"
            ));
        }
        if job.cancel_requested || job.stop.is_some() {
            return refused(format!("job {id} is already being stopped"));
        }
        if job.spec.as_ref().is_some_and(|s| !s.requeue) {
            return Err(Failure::new(
                ErrorKind::InvalidInput,
                format!("job {id} was submitted with --no-requeue; cancel it instead"),
            ));
        }
        let mut job = job.clone();
        let stop = Stop::Requeue {
            by_user: caller.owner.user.clone(),
        };
        tracing::info!(job = id, %stop, "requeue asked");
        job.reason = Some(format!("{stop}; stopping"));
        job.stop = Some(stop);
        let wake = job.node.clone();
        self.commit(vec![job.clone()])?;
        Ok((view(caller, job), wake))
    }

    /// Requeued jobs waiting for `node` to let go of their last run.
    pub(super) fn requeued_from<'a>(
        &'a self,
        node: &'a str,
    ) -> impl Iterator<Item = &'a JobRecord> + 'a {
        self.jobs.requeued_from(node)
    }
}

/// A requeued job whose last run its node has let go of: it may start again.
pub(super) fn let_go(job: &JobRecord) -> JobRecord {
    let mut job = job.clone();
    job.requeued_from = None;
    job.reason = Some("Queued: requeued; waiting for the scheduler".into());
    job
}

/// A job that `stop` ended: back to the queue (same id and submit time, one more restart,
/// not to start again before `node` has let go of this run), or PREEMPTED.
pub(super) fn stopped(mut job: JobRecord, stop: &wharf_api::Stop, node: &str) -> JobRecord {
    if !stop.requeues() {
        job.state = JobState::Preempted;
        job.reason = Some(stop.to_string());
        return job;
    }
    tracing::info!(job = job.id, %stop, "job requeued");
    job.state = JobState::Pending;
    job.restarts += 1;
    job.reason = Some(format!(
        "Requeued ({stop}): waiting for node {node} to clean up its last run"
    ));
    job.requeued_from = Some(node.to_string());
    job.stop = None;
    job.node = None;
    job.cpu_ids.clear();
    job.gpu_ids.clear();
    job.port = None;
    job.start_time = None;
    job.end_time = None;
    job.exit = None;
    job
}
