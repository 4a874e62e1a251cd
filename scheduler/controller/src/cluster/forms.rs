//! Holding and releasing pending jobs (Slurm's `scontrol hold` / `release`).
//!
//! ```text
//!   owner:  wharf hold J    -> held by user   (the owner or an admin may release)
//!   admin:  wharf hold J    -> held by admin  (only an admin may release)
//! ```
//!
//! A hold never lowers an admin hold to a user hold. The change is committed before the
//! answer, like every other.

use wharf_api::wire::ErrorKind;
use wharf_api::{Hold, JobId, JobRecord, JobState};
use wharf_core::PendingReason;

use super::{not_yours, Caller, Cluster, Failure};
use crate::visibility::view;

impl Cluster {
    /// Holds a pending job: by its owner a user hold, by an admin an admin hold. Returns the
    /// job as the caller sees it.
    pub fn hold(&mut self, caller: &Caller, id: JobId) -> Result<JobRecord, Failure> {
        let mut job = self.pending_for(caller, id, "held")?;
        let hold = if caller.admin {
            Hold::Admin
        } else {
            job.hold.unwrap_or(Hold::User)
        };
        job.hold = Some(hold);
        job.reason = Some(held_reason(hold));
        job.expected_start = None;
        tracing::info!(job = id, by = %caller.owner.user, ?hold, "job held");
        self.commit(vec![job.clone()])?;
        Ok(view(caller, job))
    }

    /// Releases a held job. Only an admin releases an admin hold.
    pub fn release(&mut self, caller: &Caller, id: JobId) -> Result<JobRecord, Failure> {
        let mut job = self.pending_for(caller, id, "released")?;
        match job.hold {
            None => {
                return Err(Failure::new(
                    ErrorKind::Conflict,
                    format!("job {id} is not held"),
                ))
            }
            Some(Hold::Admin) if !caller.admin => {
                return Err(Failure::new(
                    ErrorKind::PermissionDenied,
                    format!("job {id} is held by an admin; only an admin may release it"),
                ))
            }
            Some(_) => {}
        }
        job.hold = None;
        job.reason = Some("Queued: released; waiting for the scheduler".into());
        tracing::info!(job = id, by = %caller.owner.user, "job released");
        self.commit(vec![job.clone()])?;
        Ok(view(caller, job))
    }

    /// The pending job `id` if `caller` may manage it, else the error that says why not.
    fn pending_for(&self, caller: &Caller, id: JobId, what: &str) -> Result<JobRecord, Failure> {
        let job = match self.jobs.get(&id) {
            Some(j) => j.clone(),
            None => match self.store.job(id)? {
                Some(j) if caller.may_manage(&j) => j,
                Some(_) => return Err(not_yours(id)),
                None => return Err(Failure::new(ErrorKind::NotFound, format!("no job {id}"))),
            },
        };
        if !caller.may_manage(&job) {
            return Err(not_yours(id));
        }
        if job.state != JobState::Pending {
            return Err(Failure::new(
                ErrorKind::Conflict,
                format!("job {id} is {}; only pending jobs can be {what}", job.state),
            ));
        }
        Ok(job)
    }
}

/// The scheduler's sentence for a hold, so the job shows it before the next pass.
fn held_reason(hold: Hold) -> String {
    match hold {
        Hold::User => PendingReason::JobHeldUser,
        Hold::Admin => PendingReason::JobHeldAdmin,
    }
    .to_string()
}

#[cfg(test)]
mod tests;
