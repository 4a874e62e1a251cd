//! Why a job is pending, as a typed value: Slurm's reason codes ([`PendingReason::code`]),
//! the numbers behind each, and a sentence a user can act on (`Display`). The scheduler
//! decides them (`wharf_core`); the controller carries them in [`crate::job::JobRecord`] so
//! that clients match on the value, not on words.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::forms::civil_from_days;
use crate::job::JobId;
use crate::resources::{format_duration, format_memory};

/// Milliseconds since the Unix epoch, or a span of them.
type Time = u64;

const DAY: Time = 86_400_000;

/// `ms` since the Unix epoch as `YYYY-MM-DD HH:MM UTC`.
pub fn format_utc_minute(ms: Time) -> String {
    let (y, m, d) = civil_from_days((ms / DAY) as i64);
    let min = (ms % DAY) / 60_000;
    format!("{y:04}-{m:02}-{d:02} {:02}:{:02} UTC", min / 60, min % 60)
}

/// A TRES a budget (GrpTRESMins) is kept for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BudgetTres {
    /// CPUs.
    Cpu,
    /// GPUs.
    Gpu,
    /// Billing units.
    Billing,
}

impl BudgetTres {
    /// Its key in a limit's configuration (`cpu`, `gpu`, `billing`).
    pub fn key(self) -> &'static str {
        match self {
            BudgetTres::Cpu => "cpu",
            BudgetTres::Gpu => "gpu",
            BudgetTres::Billing => "billing",
        }
    }

    /// Its unit in words.
    pub fn unit(self) -> &'static str {
        match self {
            BudgetTres::Cpu => "CPU-minutes",
            BudgetTres::Gpu => "GPU-minutes",
            BudgetTres::Billing => "billing-minutes",
        }
    }
}

/// A trackable resource a limit caps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TresKind {
    /// CPUs.
    Cpu,
    /// Memory.
    Mem,
    /// GPUs.
    Gpu,
}

impl TresKind {
    fn amount(self, n: u64) -> String {
        match self {
            TresKind::Cpu => counted(n, "CPU", "CPUs"),
            TresKind::Mem => format!("{} memory", format_memory(n)),
            TresKind::Gpu => counted(n, "GPU", "GPUs"),
        }
    }

    fn key(self) -> &'static str {
        match self {
            TresKind::Cpu => "cpu",
            TresKind::Mem => "mem",
            TresKind::Gpu => "gpu",
        }
    }
}

/// Which limit holds a job back, with the numbers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "rule", rename_all = "snake_case")]
#[non_exhaustive]
pub enum LimitReason {
    /// QoS MaxTRESPerUser.
    QosMaxTresPerUser {
        /// QoS.
        qos: String,
        /// The TRES.
        tres: TresKind,
        /// The cap.
        limit: u64,
        /// What the user's running jobs in the QoS hold.
        in_use: u64,
        /// What this job asks for.
        asks: u64,
    },
    /// QoS MaxJobsPerUser.
    QosMaxJobsPerUser {
        /// QoS.
        qos: String,
        /// The cap.
        limit: u64,
    },
    /// QoS MaxSubmitJobsPerUser (at submit only).
    QosMaxSubmitJobsPerUser {
        /// QoS.
        qos: String,
        /// The cap.
        limit: u64,
    },
    /// QoS MaxWall.
    QosMaxWall {
        /// QoS.
        qos: String,
        /// The job's time limit, ms.
        asks: Time,
        /// MaxWall, ms.
        limit: Time,
    },
    /// QoS GrpTRES.
    QosGrpTres {
        /// QoS.
        qos: String,
        /// The TRES.
        tres: TresKind,
        /// The cap.
        limit: u64,
        /// What all running jobs in the QoS hold.
        in_use: u64,
        /// What this job asks for.
        asks: u64,
    },
    /// QoS GrpJobs.
    QosGrpJobs {
        /// QoS.
        qos: String,
        /// The cap.
        limit: u64,
    },
    /// An association's GrpTRES.
    AssocGrpTres {
        /// "account physics" or "user ann in account physics".
        assoc: String,
        /// The TRES.
        tres: TresKind,
        /// The cap.
        limit: u64,
        /// What its running jobs hold.
        in_use: u64,
        /// What this job asks for.
        asks: u64,
    },
    /// An association's GrpJobs.
    AssocGrpJobs {
        /// As in [`LimitReason::AssocGrpTres`].
        assoc: String,
        /// The cap.
        limit: u64,
    },
    /// MaxJobs of the job's user association.
    AssocMaxJobs {
        /// As in [`LimitReason::AssocGrpTres`].
        assoc: String,
        /// The cap.
        limit: u64,
    },
    /// MaxSubmitJobs of the job's user association (at submit only).
    AssocMaxSubmitJobs {
        /// As in [`LimitReason::AssocGrpTres`].
        assoc: String,
        /// The cap.
        limit: u64,
    },
    /// MaxTRESPerJob of the job's association.
    AssocMaxTresPerJob {
        /// As in [`LimitReason::AssocGrpTres`].
        assoc: String,
        /// The TRES.
        tres: TresKind,
        /// The cap.
        limit: u64,
        /// What this job asks for.
        asks: u64,
    },
    /// An association's GrpTRESMins: what is left of its budget for the period is less than
    /// this job's whole time limit would use.
    AssocGrpTresMins {
        /// As in [`LimitReason::AssocGrpTres`].
        assoc: String,
        /// The TRES.
        tres: BudgetTres,
        /// The budget, TRES-minutes.
        limit: u64,
        /// TRES-minutes used this period (ended runs, running jobs so far) plus what running
        /// jobs may still use until their time limits.
        used: u64,
        /// What this job's whole time limit would use, TRES-minutes.
        asks: u64,
        /// When the period ends and usage starts from zero again, ms; `None`: never.
        resets: Option<Time>,
        /// Whether the association has jobs running, whose early end would give back part of
        /// what `used` holds for them.
        running: bool,
    },
}

impl LimitReason {
    /// Slurm's reason code.
    pub fn code(&self) -> &'static str {
        use LimitReason::*;
        use TresKind::*;
        match self {
            QosMaxTresPerUser { tres: Cpu, .. } => "QOSMaxCpuPerUserLimit",
            QosMaxTresPerUser { tres: Mem, .. } => "QOSMaxMemoryPerUser",
            QosMaxTresPerUser { tres: Gpu, .. } => "QOSMaxGRESPerUser",
            QosMaxJobsPerUser { .. } => "QOSMaxJobsPerUserLimit",
            QosMaxSubmitJobsPerUser { .. } => "QOSMaxSubmitJobPerUserLimit",
            QosMaxWall { .. } => "QOSMaxWallDurationPerJobLimit",
            QosGrpTres { tres: Cpu, .. } => "QOSGrpCpuLimit",
            QosGrpTres { tres: Mem, .. } => "QOSGrpMemLimit",
            QosGrpTres { tres: Gpu, .. } => "QOSGrpGRES",
            QosGrpJobs { .. } => "QOSGrpJobsLimit",
            AssocGrpTres { tres: Cpu, .. } => "AssocGrpCpuLimit",
            AssocGrpTres { tres: Mem, .. } => "AssocGrpMemLimit",
            AssocGrpTres { tres: Gpu, .. } => "AssocGrpGRES",
            AssocGrpJobs { .. } => "AssocGrpJobsLimit",
            AssocMaxJobs { .. } => "AssocMaxJobsLimit",
            AssocMaxSubmitJobs { .. } => "AssocMaxSubmitJobLimit",
            AssocMaxTresPerJob { tres: Cpu, .. } => "AssocMaxCpuPerJobLimit",
            AssocMaxTresPerJob { tres: Mem, .. } => "AssocMaxMemPerJob",
            AssocMaxTresPerJob { tres: Gpu, .. } => "AssocMaxGRESPerJob",
            AssocGrpTresMins { tres, .. } => match tres {
                BudgetTres::Cpu => "AssocGrpCPUMinutes",
                BudgetTres::Gpu => "AssocGrpGRESMinutes",
                BudgetTres::Billing => "AssocGrpBillingMinutes",
            },
        }
    }

    /// True when the job could never start under this limit, whatever else runs: it is over
    /// it on its own.
    pub fn is_stuck(&self) -> bool {
        use LimitReason::*;
        match self {
            QosMaxTresPerUser { limit, asks, .. }
            | QosGrpTres { limit, asks, .. }
            | AssocGrpTres { limit, asks, .. }
            | AssocGrpTresMins { limit, asks, .. } => asks > limit,
            QosMaxJobsPerUser { limit, .. }
            | QosGrpJobs { limit, .. }
            | AssocGrpJobs { limit, .. }
            | AssocMaxJobs { limit, .. } => *limit == 0,
            QosMaxWall { .. } | AssocMaxTresPerJob { .. } => true,
            QosMaxSubmitJobsPerUser { .. } | AssocMaxSubmitJobs { .. } => false,
        }
    }
}

impl fmt::Display for LimitReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use LimitReason::*;
        let code = self.code();
        let held = |tres: &TresKind, limit: &u64, in_use: &u64, asks: &u64| {
            if asks > limit {
                format!(
                    "it asks for {} on its own; ask for less",
                    tres.amount(*asks)
                )
            } else {
                // Memory is one amount ("is"); one CPU or GPU is one too.
                let verb = if *in_use == 1 || *tres == TresKind::Mem {
                    "is"
                } else {
                    "are"
                };
                format!(
                    "{} {verb} in use and it asks for {}; it starts when enough of them end",
                    tres.amount(*in_use),
                    tres.amount(*asks)
                )
            }
        };
        match self {
            QosMaxTresPerUser { qos, tres, limit, in_use, asks } => write!(
                f,
                "{code}: QoS {qos} allows each user {} at once (max_tres_per_user {}); {}",
                tres.amount(*limit),
                tres.key(),
                held(tres, limit, in_use, asks)
            ),
            QosMaxJobsPerUser { qos, limit } => write!(
                f,
                "{code}: QoS {qos} allows each user {} (max_jobs_per_user); {}",
                counted(*limit, "running job", "running jobs"),
                when_one_ends(limit)
            ),
            QosMaxSubmitJobsPerUser { qos, limit } => write!(
                f,
                "{code}: QoS {qos} allows each user {limit} pending and running jobs (max_submit_jobs_per_user); wait for some to end or cancel some"
            ),
            QosMaxWall { qos, asks, limit } => write!(
                f,
                "{code}: its time limit of {} is over QoS {qos}'s max_wall of {}; lower it",
                format_duration(asks / 1000),
                format_duration(limit / 1000)
            ),
            QosGrpTres { qos, tres, limit, in_use, asks } => write!(
                f,
                "{code}: QoS {qos} allows {} for all its jobs together (grp_tres {}); {}",
                tres.amount(*limit),
                tres.key(),
                held(tres, limit, in_use, asks)
            ),
            QosGrpJobs { qos, limit } => write!(
                f,
                "{code}: QoS {qos} allows {} in all (grp_jobs); {}",
                counted(*limit, "running job", "running jobs"),
                when_one_ends(limit)
            ),
            AssocGrpTres { assoc, tres, limit, in_use, asks } => write!(
                f,
                "{code}: {assoc} allows {} for all its jobs together (grp_tres {}); {}",
                tres.amount(*limit),
                tres.key(),
                held(tres, limit, in_use, asks)
            ),
            AssocGrpJobs { assoc, limit } => write!(
                f,
                "{code}: {assoc} allows {} in all (grp_jobs); {}",
                counted(*limit, "running job", "running jobs"),
                when_one_ends(limit)
            ),
            AssocMaxJobs { assoc, limit } => write!(
                f,
                "{code}: {assoc} allows each user {} (max_jobs); {}",
                counted(*limit, "running job", "running jobs"),
                when_one_ends(limit)
            ),
            AssocMaxSubmitJobs { assoc, limit } => write!(
                f,
                "{code}: {assoc} allows each user {limit} pending and running jobs (max_submit_jobs); wait for some to end or cancel some"
            ),
            AssocMaxTresPerJob { assoc, tres, limit, asks } => write!(
                f,
                "{code}: {assoc} allows one job {} (max_tres_per_job {}); it asks for {}; ask for less",
                tres.amount(*limit),
                tres.key(),
                tres.amount(*asks)
            ),
            AssocGrpTresMins {
                assoc,
                tres,
                limit,
                used,
                asks,
                resets,
                running,
            } => {
                let (unit, key) = (tres.unit(), tres.key());
                let period = match resets {
                    Some(at) => format!("until it resets at {}", format_utc_minute(*at)),
                    None => "and it never resets".to_string(),
                };
                if asks > limit {
                    write!(
                        f,
                        "{code}: {assoc} has a budget of {limit} {unit} (grp_tres_mins {key}); \
                         this job's time limit would use {asks} on its own, more than the whole \
                         budget; ask for less or a shorter time limit"
                    )
                } else {
                    let when = match resets {
                        Some(at) => format!("when the budget resets at {}", format_utc_minute(*at)),
                        None => "when an admin raises the budget".to_string(),
                    };
                    let (whose, sooner) = if *running {
                        (
                            "are used or held by running jobs' time limits",
                            ", or sooner if running jobs end early",
                        )
                    } else {
                        ("are used", "")
                    };
                    write!(
                        f,
                        "{code}: {assoc} has a budget of {limit} {unit} (grp_tres_mins {key}) \
                         {period}; {used} {whose} and this job's time limit would use {asks}; \
                         it starts {when}{sooner}"
                    )
                }
            }
        }
    }
}

/// Why a job has not started. More reasons come with more policies, so match with a `_` arm.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
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
    /// Its QoS is no longer one its association may name (an admin took it out of the
    /// association's `qos` list), and no admin set it. Decided by the caller.
    InvalidQos {
        /// The QoS.
        qos: String,
    },
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
            PendingReason::InvalidQos { .. } => "InvalidQOS",
            PendingReason::NoNodeMatches { .. } => "BadConstraints",
            // Slurm shows a preemptor waiting for its victims as waiting for resources.
            PendingReason::Preempting { .. } => "Resources",
            // Slurm has no word of its own for it: a port is a resource of the node.
            PendingReason::RendezvousPorts { .. } => "Resources",
        }
    }

    /// True when it is about the job's dependency (waiting on a job, or never to be met).
    pub fn is_dependency(&self) -> bool {
        matches!(
            self,
            PendingReason::Dependency { .. } | PendingReason::DependencyNeverSatisfied { .. }
        )
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

/// `n` and the noun, singular for one.
fn counted(n: u64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// What lets a job held by a running-jobs limit of `limit` start.
fn when_one_ends(limit: &u64) -> &'static str {
    if *limit == 0 {
        "no job may run under it until an admin raises it"
    } else {
        "it starts when one of them ends"
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
                "{code}: waiting for the CPUs, memory or GPUs it needs to free up"
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
            PendingReason::InvalidQos { qos } => write!(
                f,
                "{code}: QoS {qos} is no longer one its account lets it use; an admin grants \
                 it again (`wharf admin account modify ACCOUNT --qos ...`), or move the job to \
                 another QoS (`wharf update JOB --qos QOS`)"
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
    use super::{LimitReason, PendingReason, TresKind};
    use crate::job::{JobRecord, Owner};
    use crate::resources::Resources;

    /// One is singular, and a limit of 0 does not promise a start when jobs end.
    #[test]
    fn counts_read_as_words() {
        let jobs = |limit| {
            LimitReason::AssocMaxJobs {
                assoc: "account lab".into(),
                limit,
            }
            .to_string()
        };
        assert!(
            jobs(1).contains(
                "allows each user 1 running job (max_jobs); it starts when one of them ends"
            ),
            "{}",
            jobs(1)
        );
        assert!(jobs(2).contains("2 running jobs"), "{}", jobs(2));
        assert!(
            jobs(0).contains(
                "0 running jobs (max_jobs); no job may run under it until an admin raises it"
            ),
            "{}",
            jobs(0)
        );
        let cpus = LimitReason::AssocGrpTres {
            assoc: "account lab".into(),
            tres: TresKind::Cpu,
            limit: 2,
            in_use: 1,
            asks: 1,
        }
        .to_string();
        assert!(cpus.contains("allows 2 CPUs for all its jobs together (grp_tres cpu); 1 CPU is in use and it asks for 1 CPU"), "{cpus}");
    }

    #[test]
    fn a_reason_travels_as_a_tagged_value_with_its_numbers() {
        let why = PendingReason::Limit(LimitReason::QosMaxTresPerUser {
            qos: "normal".into(),
            tres: TresKind::Gpu,
            limit: 4,
            in_use: 4,
            asks: 2,
        });
        let json = serde_json::to_value(&why).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"kind": "limit", "rule": "qos_max_tres_per_user", "qos": "normal",
                "tres": "gpu", "limit": 4, "in_use": 4, "asks": 2})
        );
        assert_eq!(serde_json::from_value::<PendingReason>(json).unwrap(), why);
        assert_eq!(why.code(), "QOSMaxGRESPerUser");
        let plain = serde_json::to_value(PendingReason::Resources).unwrap();
        assert_eq!(plain, serde_json::json!({"kind": "resources"}));
    }

    #[test]
    fn a_job_whose_reason_this_build_does_not_know_still_reads() {
        let mut job = JobRecord::pending(
            Owner {
                uid: 1000,
                gid: 1000,
                user: "ann".into(),
            },
            "train".into(),
            Resources::default(),
            60,
            1,
        );
        job.pending_reason = Some(PendingReason::BeginTime { at: 5 });
        let mut json = serde_json::to_value(&job).unwrap();
        let back: JobRecord = serde_json::from_value(json.clone()).unwrap();
        assert_eq!(back, job);
        json["pending_reason"] = serde_json::json!({"kind": "some_later_reason", "x": 1});
        let back: JobRecord = serde_json::from_value(json.clone()).unwrap();
        assert_eq!(back.pending_reason, None);
        json.as_object_mut().unwrap().remove("pending_reason");
        let back: JobRecord = serde_json::from_value(json).unwrap();
        assert_eq!(back.pending_reason, None, "records from before the field");
    }

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
