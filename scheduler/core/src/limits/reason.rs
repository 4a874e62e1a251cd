//! Why a limit holds a job back: Slurm's reason codes, with the limit and the numbers in words.

use std::fmt;

use wharf_api::resources::{format_duration, format_memory};

use super::budget::{format_utc, BudgetTres};
use crate::state::Time;

/// A trackable resource a limit caps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum TresKind {
    /// CPUs.
    Cpu,
    /// Memory.
    Mem,
    /// GPUs.
    Gpu,
}

impl TresKind {
    pub(super) fn amount(self, n: u64) -> String {
        match self {
            TresKind::Cpu => format!("{n} CPUs"),
            TresKind::Mem => format!("{} memory", format_memory(n)),
            TresKind::Gpu => format!("{n} GPUs"),
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
#[derive(Debug, Clone, PartialEq, Eq)]
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
                format!(
                    "{} are in use and it asks for {}; it starts when enough of them end",
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
                "{code}: QoS {qos} allows each user {limit} running jobs (max_jobs_per_user); it starts when one of them ends"
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
                "{code}: QoS {qos} allows {limit} running jobs in all (grp_jobs); it starts when one of them ends"
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
                "{code}: {assoc} allows {limit} running jobs in all (grp_jobs); it starts when one of them ends"
            ),
            AssocMaxJobs { assoc, limit } => write!(
                f,
                "{code}: {assoc} allows each user {limit} running jobs (max_jobs); it starts when one of them ends"
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
                    Some(at) => format!("until it resets at {}", format_utc(*at)),
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
                        Some(at) => format!("when the budget resets at {}", format_utc(*at)),
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
