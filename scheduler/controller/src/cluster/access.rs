//! What a submit may ask of partitions and nodes: a partition's AllowAccounts and AllowGroups,
//! and a node selection (features, node list, excluded nodes) that some registered node of its
//! partition satisfies. Refused at submit, with what is allowed or what is missing.

use wharf_api::wire::ErrorKind;
use wharf_api::JobSpec;
use wharf_core::{select, Partition, PendingJob, PendingReason};

use super::sched::selection;
use super::{Caller, Cluster, Failure};

impl Cluster {
    /// Refuses a job whose account is not in the partition's AllowAccounts, or whose owner is
    /// in none of its AllowGroups (admins may use any partition, as Slurm's super users).
    pub(super) fn check_access(
        &self,
        part: &Partition,
        spec: &JobSpec,
        caller: &Caller,
    ) -> Result<(), Failure> {
        let denied = |message: String| Err(Failure::new(ErrorKind::PermissionDenied, message));
        if !part.allow_accounts.is_empty() {
            let account = self.assoc_for(Some(spec), &caller.owner.user).account;
            if !part.allow_accounts.contains(&account) {
                return denied(format!(
                    "partition {} allows jobs of accounts {} only, and this job is charged to \
                     account {account:?}; submit with --account one of those, or to another \
                     partition",
                    part.name,
                    part.allow_accounts.join(", ")
                ));
            }
        }
        if part.allow_groups.is_empty() || caller.admin {
            return Ok(());
        }
        let now = std::time::Instant::now();
        let groups = (self
            .kept_groups
            .get_or(&caller.owner.uid, now, |_| (self.groups)(&caller.owner)))
        .map_err(|e| {
            Failure::new(
                ErrorKind::Internal,
                format!(
                    "partition {} allows members of some groups only, and your groups could \
                     not be found: {e}",
                    part.name
                ),
            )
        })?;
        if groups.iter().any(|g| part.allow_groups.contains(g)) {
            return Ok(());
        }
        denied(format!(
            "partition {} allows members of groups {} only; {} is in {}; ask an admin, or \
             submit to another partition",
            part.name,
            part.allow_groups.join(", "),
            caller.owner.user,
            if groups.is_empty() {
                "no group".to_string()
            } else {
                groups.join(", ")
            }
        ))
    }

    /// What the registered nodes say of a job, worked out on one view of them (with no node
    /// registered yet nothing is known): [`NodeChecks::selection`] refuses a job whose node
    /// selection no node could match (a node list naming unknown nodes or none of its
    /// partition, features no node of its partition has, or excluded nodes that leave none);
    /// [`NodeChecks::shape`] one that too few of the nodes it may use in its partition could
    /// ever hold (`-p cpu --gpus 1`, more nodes than could hold it).
    pub(super) fn node_checks(&self, spec: &JobSpec, user: &str) -> NodeChecks {
        if self.nodes.is_empty() {
            return NodeChecks {
                selection: Ok(()),
                shape: Ok(()),
            };
        }
        let r = spec.resources;
        let mut request = wharf_core::cycle::request(r, spec.nodes);
        request.gpu_kind = spec.gpu_type.clone();
        let mut job = PendingJob::new(0, self.assoc_for(Some(spec), user), request, 0);
        job.partition = spec.partition.clone();
        job.select = selection(spec);
        let nodes = self.sched_nodes();
        let refuse = |why: Option<PendingReason>| match why {
            Some(PendingReason::NoNodeMatches { what }) => Err(Failure::new(
                ErrorKind::InvalidInput,
                format!("Requested node configuration is not available: {what}"),
            )),
            Some(other) => Err(Failure::new(
                ErrorKind::InvalidInput,
                format!("this job could never start: {other}"),
            )),
            None => Ok(()),
        };
        let checks = select::submit_checks(&self.sched, &nodes, &job);
        NodeChecks {
            selection: refuse(checks.unmatched),
            shape: refuse(checks.never),
        }
    }
}

/// See [`Cluster::node_checks`]; callers take the selection's answer before the partition's
/// checks (a node list naming no node says so before its raised node count is judged) and
/// the shape's after them.
pub(super) struct NodeChecks {
    pub selection: Result<(), Failure>,
    pub shape: Result<(), Failure>,
}

#[cfg(test)]
mod tests;
