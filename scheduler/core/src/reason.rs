//! Why a job is pending: Slurm's vocabulary, each with a sentence a user can act on.

use std::fmt;

use wharf_api::resources::{format_duration, format_memory};
use wharf_api::JobId;

use crate::limits::LimitReason;
use crate::state::Time;

/// Why a job has not started. More reasons come with more policies, so match with a `_` arm.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum PendingReason {
    /// Nodes exist that could hold it, but not enough is free now.
    Resources,
    /// It spans several nodes, and every rendezvous port (`MASTER_PORT`) of the configured
    /// range is held by a running job on one of the nodes it would start on.
    RendezvousPorts {
        /// First port of the range.
        first: u16,
        /// Last port of the range.
        last: u16,
    },
    /// Jobs ahead of it in priority order hold or have reserved what it needs.
    Priority,
    /// Its partition is DOWN.
    PartitionDown {
        /// Partition.
        partition: String,
    },
    /// Its partition is INACTIVE.
    PartitionInactive {
        /// Partition.
        partition: String,
    },
    /// It names a partition that does not exist.
    InvalidPartition {
        /// Partition.
        partition: String,
    },
    /// Its time limit is over the partition's MaxTime.
    PartitionTimeLimit {
        /// Its time limit, ms.
        limit: Time,
        /// The partition's MaxTime, ms.
        max: Time,
    },
    /// It asks for more nodes than the partition's MaxNodes.
    PartitionNodeLimit {
        /// Nodes asked for.
        nodes: u32,
        /// The partition's MaxNodes, or how many of its nodes could hold the job.
        max: u32,
    },
    /// No node of its partition that could hold it is up.
    ReqNodeNotAvail,
    /// Its partition has no node at all (none registered yet).
    NoNodes,
    /// No node of its partition could ever hold it.
    TooLarge {
        /// CPUs, memory, GPUs per node asked for.
        cpus: u32,
        /// Bytes.
        memory: u64,
        /// GPUs.
        gpus: u32,
        /// GPU type, if any.
        gpu_kind: Option<String>,
    },
    /// Not before its begin time.
    BeginTime {
        /// The begin time.
        at: Time,
    },
    /// Held by its owner.
    JobHeldUser,
    /// Held by an admin.
    JobHeldAdmin,
    /// Waits for other jobs to leave the queue.
    Dependency {
        /// The first job it waits for.
        on: JobId,
    },
    /// Starting it now would take a QoS or association over a limit.
    Limit(LimitReason),
    /// Its dependency can never be met: a job it names ended the wrong way (afterok on a
    /// failed job). Decided by the caller, which knows ended jobs.
    DependencyNeverSatisfied {
        /// The job that ended the wrong way.
        on: JobId,
    },
    /// Its array already runs as many tasks as its throttle (`--array ...%N`) allows.
    /// Decided by the caller, which knows the arrays.
    JobArrayTaskLimit,
    /// No node of its partition matches its constraint, node list and excluded nodes.
    NoNodeMatches {
        /// What is missing, in words.
        what: String,
    },
    /// It preempted running jobs of lower precedence (or found jobs already being stopped)
    /// and waits for them to end; their resources are reserved for it.
    Preempting {
        /// The jobs it waits for, by id.
        victims: Vec<JobId>,
    },
}

impl PendingReason {
    /// Slurm's name for the reason (`Resources`, `Priority`, ...).
    pub fn code(&self) -> &'static str {
        match self {
            PendingReason::Resources => "Resources",
            PendingReason::Priority => "Priority",
            PendingReason::PartitionDown { .. } => "PartitionDown",
            PendingReason::PartitionInactive { .. } => "PartitionInactive",
            PendingReason::InvalidPartition { .. } => "PartitionConfig",
            PendingReason::PartitionTimeLimit { .. } => "PartitionTimeLimit",
            PendingReason::PartitionNodeLimit { .. } => "PartitionNodeLimit",
            PendingReason::ReqNodeNotAvail | PendingReason::NoNodes => "ReqNodeNotAvail",
            PendingReason::TooLarge { .. } => "BadConstraints",
            PendingReason::BeginTime { .. } => "BeginTime",
            PendingReason::JobHeldUser => "JobHeldUser",
            PendingReason::JobHeldAdmin => "JobHeldAdmin",
            PendingReason::Dependency { .. } => "Dependency",
            PendingReason::Limit(l) => l.code(),
            PendingReason::DependencyNeverSatisfied { .. } => "DependencyNeverSatisfied",
            PendingReason::JobArrayTaskLimit => "JobArrayTaskLimit",
            PendingReason::NoNodeMatches { .. } => "BadConstraints",
            // Slurm shows a preemptor waiting for its victims as waiting for resources.
            PendingReason::Preempting { .. } => "Resources",
            // Slurm has no word of its own for it: a port is a resource of the node.
            PendingReason::RendezvousPorts { .. } => "Resources",
        }
    }

    /// True when the job cannot start whatever other jobs do (only a change of the job, the
    /// configuration or the nodes helps).
    pub fn is_stuck(&self) -> bool {
        if let PendingReason::Limit(l) = self {
            return l.is_stuck();
        }
        matches!(
            self,
            PendingReason::InvalidPartition { .. }
                | PendingReason::PartitionTimeLimit { .. }
                | PendingReason::PartitionNodeLimit { .. }
                | PendingReason::TooLarge { .. }
                | PendingReason::DependencyNeverSatisfied { .. }
                | PendingReason::NoNodeMatches { .. }
        )
    }
}

fn secs(ms: Time) -> String {
    format_duration(ms / 1000)
}

impl fmt::Display for PendingReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let code = self.code();
        match self {
            PendingReason::Resources => write!(
                f,
                "{code}: waiting for CPUs, memory or GPUs to free up; it is next in line"
            ),
            PendingReason::Priority => write!(
                f,
                "{code}: jobs of higher priority are ahead of it for the resources it needs"
            ),
            PendingReason::RendezvousPorts { first, last } => write!(
                f,
                "{code}: every rendezvous port ({first}-{last}, its MASTER_PORT) is held by \
                 running jobs on the nodes it would start on; it starts when one of them ends \
                 (an admin can widen [scheduler] rendezvous_ports)"
            ),
            PendingReason::PartitionDown { partition } => write!(
                f,
                "{code}: partition {partition} is down; its jobs start when an admin brings it up"
            ),
            PendingReason::PartitionInactive { partition } => write!(
                f,
                "{code}: partition {partition} is inactive; ask an admin or choose another partition"
            ),
            PendingReason::InvalidPartition { partition } => write!(
                f,
                "{code}: there is no partition {partition}; resubmit to an existing one"
            ),
            PendingReason::PartitionTimeLimit { limit, max } => write!(
                f,
                "{code}: its time limit of {} is over the partition's maximum of {}; lower it",
                secs(*limit),
                secs(*max)
            ),
            PendingReason::PartitionNodeLimit { nodes, max } => write!(
                f,
                "{code}: it asks for {nodes} nodes and the partition allows {max}; ask for fewer"
            ),
            PendingReason::ReqNodeNotAvail => write!(
                f,
                "{code}: the nodes that could run it are down or draining; it starts when they return"
            ),
            PendingReason::NoNodes => write!(
                f,
                "{code}: no node has joined its partition yet; is `wharf agent` running on the nodes?"
            ),
            PendingReason::TooLarge {
                cpus,
                memory,
                gpus,
                gpu_kind,
            } => {
                let kind = gpu_kind.as_deref().map(|k| format!("{k} ")).unwrap_or_default();
                write!(
                    f,
                    "{code}: no node of its partition has {cpus} CPUs, {} memory and {gpus} {kind}GPUs; ask for less",
                    format_memory(*memory)
                )
            }
            PendingReason::BeginTime { .. } => {
                write!(f, "{code}: it may not start before the begin time it was given")
            }
            PendingReason::JobHeldUser => {
                write!(f, "{code}: held by its owner; release it to let it start")
            }
            PendingReason::JobHeldAdmin => {
                write!(f, "{code}: held by an admin; ask them to release it")
            }
            PendingReason::Dependency { on } => {
                write!(f, "{code}: waiting for job {on}, as its --dependency asks (to start, to end, or to end a certain way)")
            }
            PendingReason::Limit(l) => l.fmt(f),
            PendingReason::DependencyNeverSatisfied { on } => write!(
                f,
                "{code}: job {on} ended in a way its dependency rules out, so it can never start; cancel it"
            ),
            PendingReason::JobArrayTaskLimit => write!(
                f,
                "{code}: its array already runs as many tasks as its --array %N throttle allows"
            ),
            PendingReason::NoNodeMatches { what } => write!(
                f,
                "{code}: Requested node configuration is not available: {what}"
            ),
            PendingReason::Preempting { victims } => {
                let ids: Vec<String> = victims.iter().map(|v| v.to_string()).collect();
                let (s, are) = if ids.len() == 1 { ("", "is") } else { ("s", "are") };
                write!(
                    f,
                    "{code}: waiting for job{s} {}, which {are} being stopped (preempted) to \
                     make room for it, to end; what they hold is reserved for it",
                    ids.join(", ")
                )
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::PendingReason;

    #[test]
    fn a_preemptor_names_in_words_the_jobs_it_waits_for() {
        let one = PendingReason::Preempting { victims: vec![7] }.to_string();
        assert!(
            one.starts_with("Resources: waiting for job 7, which is being stopped (preempted)"),
            "{one}"
        );
        let two = PendingReason::Preempting {
            victims: vec![7, 9],
        }
        .to_string();
        assert!(
            two.contains("waiting for jobs 7, 9, which are being stopped (preempted)"),
            "{two}"
        );
    }
}
