//! Requeue: a running job stopped by a preemption or by `wharf requeue` goes back to the
//! queue with its id, submit time and one more restart; or, preempted in cancel mode (or
//! submitted with `--no-requeue`, or a `wharf run` job), ends PREEMPTED.

use wharf_api::wire::ErrorKind;
use wharf_api::{JobId, JobRecord, JobState, Stop};

use super::{not_yours, Caller, Cluster, Failure};
use crate::visibility::view;

/// Why a job may not go back to the queue, in the words its reason and refusals use.
pub(super) const NOT_REQUEUEABLE: &str =
    "it was submitted with --no-requeue, or run by wharf run without --requeue";

impl Cluster {
    /// Stops a running job to put it back in the queue. Returns the job as the caller sees
    /// it and its nodes, to wake. A pending job is left as it is, with an error that says so.
    pub fn requeue(
        &mut self,
        caller: &Caller,
        id: JobId,
    ) -> Result<(JobRecord, Vec<String>), Failure> {
        let Some(job) = self.jobs.get(&id) else {
            return match self.store.job(id)? {
                Some(j) if caller.may_manage(&j) => Err(Failure::new(
                    ErrorKind::Conflict,
                    format!(
                        "job {} has already ended ({}); only a running job can be requeued",
                        j.label(),
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
        if job.state == JobState::Pending {
            return Err(Failure::new(
                ErrorKind::Conflict,
                format!(
                    "job {id} is pending: it is in the queue already and was left as it is; only \
                     a running job can be requeued"
                ),
            ));
        }
        let (job, wake) = to_requeue(caller, job)?;
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

/// `job` (holding resources, the caller's to manage) asked to stop and go back to the queue,
/// and its nodes to wake; or why not: it is being stopped already, or may not be requeued.
pub(super) fn to_requeue(
    caller: &Caller,
    job: &JobRecord,
) -> Result<(JobRecord, Vec<String>), Failure> {
    let id = job.id;
    if job.cancel_requested || job.stop.is_some() {
        return Err(Failure::new(
            ErrorKind::Conflict,
            format!("job {id} is already being stopped"),
        ));
    }
    if job.spec.as_ref().is_some_and(|s| !s.requeue) {
        return Err(Failure::new(
            ErrorKind::InvalidInput,
            format!("job {id} may not be requeued: {NOT_REQUEUEABLE}; cancel it instead"),
        ));
    }
    let mut job = job.clone();
    let stop = Stop::Requeue {
        by_user: caller.owner.user.clone(),
    };
    tracing::info!(job = id, %stop, "requeue asked");
    job.reason = Some(format!("{stop}; stopping"));
    job.stop = Some(stop);
    let wake = job.nodes().map(str::to_string).collect();
    Ok((job, wake))
}

/// A requeued job whose last run `node` has let go of (or that is down, and cleans nothing
/// up): it may start again once every node of that run has.
pub(super) fn let_go(job: &JobRecord, node: &str) -> JobRecord {
    let mut job = job.clone();
    job.requeued_from.retain(|n| n != node);
    // Words of the requeue's own replace the scheduler's until the next pass.
    job.pending_reason = None;
    let words = job
        .requeued_after
        .as_ref()
        .map_or_else(|| "requeued".to_string(), Stop::requeue_words);
    job.reason = Some(if job.requeued_from.is_empty() {
        format!("Queued: {words}; waiting for the scheduler")
    } else {
        format!("{words}: {}", waiting_for(&job.requeued_from))
    });
    job
}

/// A requeued job whose last run `node` still has (a node taken for lost that came back): it
/// does not start again before that node has let go of it.
pub(super) fn still_held(job: &JobRecord, node: &str) -> JobRecord {
    let mut job = job.clone();
    job.requeued_from.push(node.to_string());
    job.pending_reason = None;
    job.reason = Some(format!("Requeued: {}", waiting_for(&job.requeued_from)));
    job
}

fn waiting_for(nodes: &[String]) -> String {
    match nodes {
        [one] => format!("waiting for node {one} to clean up its last run"),
        _ => format!(
            "waiting for nodes {} to clean up its last run",
            wharf_api::hostlist::compress(nodes)
        ),
    }
}

/// A job that `stop` ended: back to the queue (same id and submit time, one more restart,
/// not to start again before each of `nodes` has let go of this run), or PREEMPTED.
pub(super) fn stopped(mut job: JobRecord, stop: &Stop, nodes: Vec<String>) -> JobRecord {
    if !stop.requeues() {
        job.state = JobState::Preempted;
        job.reason = Some(stop.to_string());
        return job;
    }
    tracing::info!(job = job.id, %stop, "job requeued");
    // Said until it starts again: the scheduler's pending reason carries it.
    job.requeued_message = match stop {
        Stop::LaunchFault { .. } => job.exit.as_ref().and_then(|e| e.message.clone()),
        _ => None,
    };
    job.requeued_after = Some(stop.clone());
    job.state = JobState::Pending;
    job.pending_reason = None;
    job.restarts += 1;
    let words = stop.requeue_words();
    job.reason = Some(if nodes.is_empty() {
        format!("Queued: {words}; waiting for the scheduler")
    } else {
        format!("{words}: {}", waiting_for(&nodes))
    });
    job.requeued_from = nodes;
    // What it asked for again: an exclusive run held its first nodes whole, and the next may
    // land on other ones.
    if let Some(s) = &job.spec {
        job.resources = s.resources;
    }
    job.stop = None;
    job.allocs.clear();
    job.port = None;
    // A new run starts its steps from 0; the last run's are in its ledger row.
    job.steps.clear();
    job.start_time = None;
    job.end_time = None;
    job.exit = None;
    job
}
