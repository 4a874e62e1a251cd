//! How the scheduler is set up: the policy, partitions, the account tree, QoS and weights.

use crate::limits::Limits;
use crate::state::Time;

/// Which scheduling policy a pass follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Policy {
    /// Strict submit order: the first job that cannot start blocks every job behind it.
    Fcfs,
    /// Submit order with EASY backfill: the first blocked job gets a reservation; later jobs
    /// start early only when they do not delay it.
    Easy,
    /// Multifactor priority (partition tier first), reservations for the first
    /// [`Config::reservations`] blocked jobs, backfill around all of them.
    #[default]
    Multifactor,
}

/// Whether a partition takes work.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PartitionState {
    /// Jobs are accepted and started.
    #[default]
    Up,
    /// Jobs are accepted but not started.
    Down,
    /// No new jobs are accepted (admission's business); queued jobs still start.
    Drain,
    /// Neither accepted nor started.
    Inactive,
}

/// What becomes of a running job that is preempted (Slurm's PreemptMode).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub enum PreemptMode {
    /// Never preempted.
    #[default]
    Off,
    /// Stopped and put back in the queue, keeping its id and submit time.
    Requeue,
    /// Stopped for good (it ends PREEMPTED).
    Cancel,
}

impl PreemptMode {
    /// The mode's name in the config: `off`, `requeue` or `cancel`.
    pub fn as_str(self) -> &'static str {
        match self {
            PreemptMode::Off => "off",
            PreemptMode::Requeue => "requeue",
            PreemptMode::Cancel => "cancel",
        }
    }

    /// The mode as configured: `off`, `requeue` or `cancel`.
    pub fn parse(text: &str) -> Option<PreemptMode> {
        match text.to_ascii_lowercase().as_str() {
            "off" => Some(PreemptMode::Off),
            "requeue" => Some(PreemptMode::Requeue),
            "cancel" => Some(PreemptMode::Cancel),
            _ => None,
        }
    }
}

/// Billing weights: a job's billing rate is the weighted sum of what it holds, per second.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Billing {
    /// Per CPU.
    pub cpu: f64,
    /// Per GiB of memory.
    pub memory_gib: f64,
    /// Per GPU.
    pub gpu: f64,
}

impl Default for Billing {
    /// Slurm's default: CPUs only.
    fn default() -> Billing {
        Billing {
            cpu: 1.0,
            memory_gib: 0.0,
            gpu: 0.0,
        }
    }
}

/// A partition: a named set of nodes with its own limits.
#[derive(Debug, Clone, PartialEq)]
pub struct Partition {
    /// Name.
    pub name: String,
    /// Node names in it; a node may be in several partitions. Empty means every node.
    pub nodes: Vec<String>,
    /// Whether it takes work.
    pub state: PartitionState,
    /// Jobs of higher tiers are scheduled first, whatever their priority.
    pub priority_tier: u32,
    /// Longest time limit a job may have here, ms.
    pub max_time: Option<Time>,
    /// Time limit of jobs that give none, ms.
    pub default_time: Option<Time>,
    /// Most nodes one job may use here.
    pub max_nodes: Option<u32>,
    /// Memory per node of a job that asks for none and has no GPUs or no `def_mem_per_gpu`
    /// applies: this many bytes per CPU it has there (Slurm's DefMemPerCPU).
    pub def_mem_per_cpu: Option<u64>,
    /// Memory per node of a job with GPUs that asks for no memory: this many bytes per GPU it
    /// has there (Slurm's DefMemPerGPU).
    pub def_mem_per_gpu: Option<u64>,
    /// Most memory per CPU a job may have here, bytes (Slurm's MaxMemPerCPU; a job over it is
    /// refused at submit).
    pub max_mem_per_cpu: Option<u64>,
    /// Most memory per GPU a job with GPUs may have here, bytes (Slurm's MaxMemPerGPU).
    pub max_mem_per_gpu: Option<u64>,
    /// Billing weights for usage here.
    pub billing: Billing,
    /// Accounts whose jobs may run here (Slurm's AllowAccounts); empty: every account.
    /// Checked by the controller at submit.
    pub allow_accounts: Vec<String>,
    /// Unix groups whose members may run jobs here (Slurm's AllowGroups); empty: everyone.
    /// Checked by the controller at submit, which knows users' groups.
    pub allow_groups: Vec<String>,
    /// What happens to its running jobs when a job of a higher tier needs their nodes
    /// (Slurm's PreemptType=preempt/partition_prio): off (never preempted), requeue or cancel.
    pub preempt_mode: PreemptMode,
}

impl Partition {
    /// An up partition over `nodes` (empty: all), tier 0, no limits.
    pub fn new(name: &str, nodes: &[&str]) -> Partition {
        Partition {
            name: name.into(),
            nodes: nodes.iter().map(|n| n.to_string()).collect(),
            state: PartitionState::Up,
            priority_tier: 0,
            max_time: None,
            default_time: None,
            max_nodes: None,
            def_mem_per_cpu: None,
            def_mem_per_gpu: None,
            max_mem_per_cpu: None,
            max_mem_per_gpu: None,
            billing: Billing::default(),
            allow_accounts: Vec::new(),
            allow_groups: Vec::new(),
            preempt_mode: PreemptMode::Off,
        }
    }
}

/// An account in the fair-share tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Account {
    /// Name, unique.
    pub name: String,
    /// Parent account; `None` hangs it under the root.
    pub parent: Option<String>,
    /// Shares against its siblings.
    pub shares: u32,
}

/// A user's shares in one account.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserShares {
    /// User name.
    pub user: String,
    /// Account.
    pub account: String,
    /// Shares against the other users of that account.
    pub shares: u32,
}

/// A quality of service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Qos {
    /// Name.
    pub name: String,
    /// Priority; normalised against the largest of all QoS.
    pub priority: u32,
}

/// Integer weights of the multifactor priority (Slurm's `PriorityWeight*`). Each factor is in
/// [0, 1]; the priority is the weighted sum, minus nice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Weights {
    /// Time waiting, capped at `max_age`.
    pub age: u32,
    /// Fair share (Fair Tree).
    pub fairshare: u32,
    /// Job size against the partition.
    pub job_size: u32,
    /// Width: the cube of the job's share of its partition, how much of it must be drained
    /// for the job (docs/scheduling.md).
    pub width: u32,
    /// Partition tier against the highest tier.
    pub partition: u32,
    /// QoS priority against the highest QoS priority.
    pub qos: u32,
}

impl Default for Weights {
    fn default() -> Weights {
        Weights {
            age: 1_000,
            fairshare: 10_000,
            job_size: 4_000,
            width: 6_000,
            partition: 1_000,
            qos: 2_000,
        }
    }
}

/// The scheduler's configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// FCFS, EASY or multifactor.
    pub policy: Policy,
    /// Reservations the multifactor policy makes per pass (Slurm's backfill reserves for the
    /// first jobs it cannot start); EASY makes 1, FCFS none.
    pub reservations: usize,
    /// Past the first [`Config::reservations`], the first blocked job of each association
    /// that holds none yet gets a reservation too, up to this many more per pass (multifactor
    /// only; 0: none). Without it, a large job that is never among the first blocked jobs
    /// waits while its own association's later, smaller jobs backfill ahead of it.
    pub assoc_reservations: usize,
    /// A job that has waited this long (ms, from its submit or begin time) keeps the
    /// reservation it holds: it comes before every job of its partition tier that holds none,
    /// in the order the reservations were made, and gets one whatever the limits above
    /// (multifactor only; 0: at once). Below it, a job of higher priority that comes later
    /// takes the reservation over, as in Slurm.
    pub keep_reservations_after: Time,
    /// How many reservations may be kept: of the jobs holding one from the last pass that
    /// have waited [`Config::keep_reservations_after`], the first this many in the order the
    /// reservations were made, across every partition (multifactor only; 1, the default;
    /// `usize::MAX`: all). The others are placed by priority again, however long they have
    /// waited. Fewer kept reservations give fair share more say over the order large jobs
    /// start in; with the width term ([`Weights::width`]) one costs no utilization
    /// (docs/scheduling.md); from 1 up, the first always holds.
    pub keep_reservations: usize,
    /// How many waiting jobs past those holding reservations get an estimated start, in
    /// scheduling order: each is placed where its shape first fits after the reservations
    /// and the estimates before it, once the pass has decided everything; nothing is held
    /// back for it (0: only jobs with reservations show one).
    pub start_estimates: usize,
    /// Most pending jobs one pass looks at, in priority order (Slurm's `bf_max_job_test`);
    /// the rest wait with reason `Priority`.
    pub max_job_test: usize,
    /// Multifactor weights.
    pub weights: Weights,
    /// Age at which the age factor reaches 1, ms.
    pub max_age: Time,
    /// Job size factor favours small jobs instead of large ones.
    pub favor_small: bool,
    /// Half-life of usage decay, ms (used by [`crate::UsageLedger`]).
    pub half_life: Time,
    /// Partitions. Empty: every node is in one partition named `default`.
    pub partitions: Vec<Partition>,
    /// Partition of jobs that name none; `None`: the first one.
    pub default_partition: Option<String>,
    /// Time limit of jobs that give none and whose partition has no DefaultTime, ms.
    pub default_time: Time,
    /// The account tree. Accounts jobs name that are not here hang under the root with 1
    /// share; users not in [`Config::users`] have 1 share in their account.
    pub accounts: Vec<Account>,
    /// Users' shares in accounts.
    pub users: Vec<UserShares>,
    /// QoS definitions.
    pub qos: Vec<Qos>,
    /// QoS and association limits (empty: none).
    pub limits: Limits,
    /// When budgets (GrpTRESMins) start over; the caller works out the period's bounds
    /// with [`crate::BudgetPeriod::bounds`] when it fills [`crate::State::budget`].
    pub budget_period: crate::limits::BudgetPeriod,
    /// Ports handed to starting jobs for their rendezvous (`MASTER_PORT`), one per job on
    /// each of its nodes.
    pub rendezvous_ports: std::ops::RangeInclusive<u16>,
}

impl Config {
    /// The given policy with defaults for everything else.
    pub fn with_policy(policy: Policy) -> Config {
        Config {
            policy,
            ..Config::default()
        }
    }

    /// Billing weights of partition `name` (the default partition for `None`; the default
    /// weights for a partition not configured, as fair share's accrual charges it): multiply [`Billing::rate`] by seconds held to get the usage to record in
    /// a [`crate::UsageLedger`].
    pub fn billing_for(&self, name: Option<&str>) -> Billing {
        let name = name.unwrap_or_else(|| self.default_partition_name());
        self.partitions
            .iter()
            .find(|p| p.name == name)
            .map(|p| p.billing)
            .unwrap_or_default()
    }

    /// The configured partitions, or, when none is, the one [`crate::DEFAULT_PARTITION`] over
    /// every node (a partition naming no node holds every node).
    pub fn partitions_or_default(&self) -> std::borrow::Cow<'_, [Partition]> {
        if self.partitions.is_empty() {
            std::borrow::Cow::Owned(vec![Partition::new(crate::DEFAULT_PARTITION, &[])])
        } else {
            std::borrow::Cow::Borrowed(&self.partitions)
        }
    }

    /// The partition of jobs that name none: [`Config::default_partition`] when it names a
    /// configured one, else the first configured, else [`crate::DEFAULT_PARTITION`] (every
    /// node's, when none is configured).
    pub fn default_partition_name(&self) -> &str {
        let named = self.default_partition.as_deref();
        named
            .filter(|d| self.partitions.iter().any(|p| p.name == *d))
            .or(self.partitions.first().map(|p| p.name.as_str()))
            .unwrap_or(crate::DEFAULT_PARTITION)
    }

    /// How many reservations a pass makes, past [`Config::reservation_limit`], for the first
    /// blocked job of associations that hold none.
    pub fn assoc_reservation_limit(&self) -> usize {
        match self.policy {
            Policy::Fcfs | Policy::Easy => 0,
            Policy::Multifactor => self.assoc_reservations,
        }
    }

    /// How many reservations a pass makes under this policy.
    pub fn reservation_limit(&self) -> usize {
        match self.policy {
            Policy::Fcfs => 0,
            Policy::Easy => 1,
            Policy::Multifactor => self.reservations,
        }
    }
}

impl Default for Config {
    fn default() -> Config {
        Config {
            policy: Policy::Multifactor,
            reservations: 4,
            assoc_reservations: 32,
            keep_reservations_after: 24 * 3600 * 1000,
            keep_reservations: 1,
            start_estimates: 32,
            max_job_test: 100_000,
            weights: Weights::default(),
            max_age: 7 * 24 * 3600 * 1000,
            favor_small: false,
            half_life: 7 * 24 * 3600 * 1000,
            partitions: Vec::new(),
            default_partition: None,
            default_time: 3600 * 1000,
            accounts: Vec::new(),
            users: Vec::new(),
            qos: Vec::new(),
            limits: Limits::default(),
            budget_period: crate::limits::BudgetPeriod::default(),
            rendezvous_ports: DEFAULT_RENDEZVOUS_PORTS,
        }
    }
}

/// The rendezvous ports of a default config: 29500 is PyTorch's own default `MASTER_PORT`.
pub const DEFAULT_RENDEZVOUS_PORTS: std::ops::RangeInclusive<u16> = 29500..=29999;
